"""RULER section: task x length scores per model and method (RULER's layout), a figure per model,
the effective lengths, and the passkey accuracy of the same models beside them.

Scores are the seed mean of each run's ``match`` (RULER's string match) and ``exact`` rows; the
effective lengths are the ones each run stored (``effective_length`` rows, computed once by the
evaluation), shown as the median over seeds with the smallest and largest.
"""

from __future__ import annotations

import functools
import json
import math
import random

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from bench.core.results import effective_length_score
from bench.data.tokenizer import ByteTokenizer
from bench.report.figures import line_colors, save_figure
from bench.report.frame import GROUP_KEYS, aggregate, sort_series
from bench.report.markdown import ReportDir, figure_md, note, write_table
from bench.tasks.ruler import RULER_TASKS, RulerParams, make_ruler_example, min_ruler_length
from bench.tasks.ruler_tasks.qa import QA_TASKS, chance_places, guesses

#: panels of the per-model figure at most (the table has every series)
MAX_PANELS = 12
#: generated examples per reasoning task behind the heuristic baselines (fixed seeds)
BASELINE_EXAMPLES = 1000


def ruler_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of the ``ruler`` metric (a ``task`` column set), ``effective_length`` included."""
    if "task" not in df.columns:
        return df.iloc[:0]
    return df[df["task"].notna()]


def score_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per series, task and eval length: the seed mean of ``match`` and ``exact``, seeds and row
    ids; the tasks' mean as task ``average`` (lengths where every task ran)."""
    scores = rows[(rows["metric"] != "effective_length") & (rows["axis"] == "score")]
    per_seed = aggregate(scores, [*GROUP_KEYS, "task", "axis_value", "eval_length", "seed"])
    keys = [*GROUP_KEYS, "task", "eval_length"]
    t = (
        per_seed.groupby([*keys, "axis_value"], dropna=False)
        .agg(value=("value", "mean"), n_seeds=("seed", "nunique"), row_ids=("row_ids", ";".join))
        .reset_index()
    )
    # unstack keeps the observed key combinations only; pivot_table(dropna=False) would build
    # every combination of the ~20 keys' values (out of memory on a committed 13-series run)
    wide = t.set_index([*keys, "axis_value"])["value"].unstack("axis_value")
    wide = wide.reindex(columns=["match", "exact"]).reset_index()
    meta = t.groupby(keys, dropna=False).agg(
        n_seeds=("n_seeds", "max"), row_ids=("row_ids", ";".join)
    )
    wide = wide.merge(meta.reset_index(), on=keys)
    tasks = wide.groupby([*GROUP_KEYS, "eval_length"], dropna=False)["task"].transform("nunique")
    full = tasks == wide.groupby(GROUP_KEYS, dropna=False)["task"].transform("nunique")
    mean = (
        wide[full]
        .groupby([*GROUP_KEYS, "eval_length"], dropna=False)
        .agg(match=("match", "mean"), exact=("exact", "mean"), n_seeds=("n_seeds", "min"),
             row_ids=("row_ids", ";".join))
        .reset_index()
        .assign(task="average")
    )  # fmt: skip
    out = pd.concat([wide, mean], ignore_index=True)
    out["_task"] = out["task"].map(task_rank)
    return sort_series(out, ["_task", "eval_length"]).drop(columns=["_task"])


def task_rank(task: str) -> int:
    """RULER's task order, then the mean (``average``), then any other name."""
    order = [*RULER_TASKS, "average"]
    return order.index(task) if task in order else len(order)


def effective_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per series, score, task and threshold kind: the stored effective length's median over
    seeds, its smallest and largest, seeds and row ids."""
    eff = rows[rows["metric"] == "effective_length"]
    if eff.empty:
        return pd.DataFrame()
    eff = eff.assign(score=[effective_length_score(p) for p in eff["task_params"]])
    keys = [*GROUP_KEYS, "score", "task", "axis", "axis_value"]
    t = (
        eff.groupby(keys, dropna=False)
        .agg(
            median=("value", "median"),
            seed_min=("value", "min"),
            seed_max=("value", "max"),
            n_seeds=("seed", "nunique"),
            row_ids=("row_id", lambda s: ";".join(map(str, s))),
        )
        .reset_index()
    )
    t["_task"] = t["task"].map(task_rank)
    t["_score"] = t["score"].map({"exact": 0, "match": 1})
    return sort_series(t, ["_score", "_task", "axis"]).drop(columns=["_task", "_score"])


def ruler_figure(t: pd.DataFrame, threshold: float | None) -> Figure:
    """One panel per series (at most :data:`MAX_PANELS`): exact score (the headline) vs eval
    length, one line per task, the tasks' mean in black."""
    series = list(dict.fromkeys(t["series"]))[:MAX_PANELS]
    cols = min(3, len(series))
    rows_n = math.ceil(len(series) / cols)
    fig = Figure(figsize=(3.4 * cols + 0.8, 2.8 * rows_n), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows_n, cols, sharey=True, squeeze=False)).ravel()
    tasks = [x for x in dict.fromkeys(t["task"]) if x != "average"]
    for ax, name in zip(axes, series, strict=False):
        s = t[t["series"] == name]
        for task, color in zip(
            [*tasks, "average"], [*line_colors(len(tasks)), "black"], strict=True
        ):
            c = s[s["task"] == task].sort_values("eval_length")
            if c.empty:
                continue
            style = {"color": "black", "lw": 2.0} if task == "average" else {"color": color}
            ax.plot(c["eval_length"], c["exact"], "o-", ms=3, label=task, **style)
        if threshold is not None:
            ax.axhline(threshold, color="grey", ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.04, 1.06)
        ax.set_title(name, fontsize=8)
        ax.set_xlabel("eval length")
    for ax in axes[len(series) :]:
        ax.set_visible(False)
    axes[0].set_ylabel("exact score")
    axes[0].legend(fontsize=6, frameon=False, loc="lower left")
    fig.suptitle("RULER-style tasks vs length", fontsize=10)
    return fig


def _cell(match: float, exact: float) -> str:
    return "" if pd.isna(match) else f"{match:.2f} / {exact:.2f}"


def ruler_section(rep: ReportDir, df: pd.DataFrame) -> str:
    head = "## RULER-style tasks"
    rows = ruler_rows(df)
    if rows.empty:
        return ""  # the section exists only for runs with eval.ruler enabled
    t = score_table(rows)
    if t.empty:
        return head + "\n\n" + note("ruler", "the RULER tables and figures are omitted")
    t["cell"] = [_cell(m, e) for m, e in zip(t["match"], t["exact"], strict=True)]
    shown = t.set_index(["series", "task", "eval_length"])["cell"].unstack("eval_length")
    shown = shown.reindex(list(dict.fromkeys(zip(t["series"], t["task"], strict=True))))
    md = write_table(rep, "ruler_scores", t.drop(columns=["cell"]), shown, index=True)
    eff_rows = rows[rows["metric"] == "effective_length"]
    threshold = None
    absolute = eff_rows[eff_rows["axis"] == "threshold"]["axis_value"]
    if not absolute.empty:
        threshold = float(absolute.iloc[0])
    save_figure(ruler_figure(t, threshold), rep.plots_dir, "ruler_scores")
    parts = [
        head,
        "Each task's score per model and method: RULER's string match (the fraction of expected "
        "strings in the greedy output) / the exact verdict (the whole answer, then no letter or "
        "digit; teacher-forced on byte tokens), seed means; `average` is the tasks' mean. "
        "Source: `tables/ruler_scores.csv`.",
        md,
        figure_md(
            "ruler_scores",
            "Exact score vs eval length, one panel per model and method, one line per task, the "
            "tasks' mean in black; dotted: the absolute effective-length threshold, where a run "
            "set one.",
        ),
    ]
    e = effective_table(rows)
    if not e.empty:
        e["cell"] = [
            f"{int(m)}" if lo == hi else f"{m:g} ({int(lo)}-{int(hi)})"
            for m, lo, hi in zip(e["median"], e["seed_min"], e["seed_max"], strict=True)
        ]
        e["threshold"] = [
            f"{score}: >= {float(v):g}"
            if a == "threshold"
            else f"{score}: >= {float(v):g} x {score} at reference"
            for score, a, v in zip(e["score"], e["axis"], e["axis_value"], strict=True)
        ]
        shown_e = e.set_index(["series", "threshold", "task"])["cell"].unstack("task")
        shown_e = shown_e.reindex(
            list(dict.fromkeys(zip(e["series"], e["threshold"], strict=True)))
        )
        shown_e = shown_e[sorted(shown_e.columns, key=task_rank)]
        md_e = write_table(rep, "ruler_effective_length", e.drop(columns=["cell"]), shown_e, True)
        parts += [
            "### Effective length",
            "The largest evaluated length at which the score named in each row (`exact`: the "
            "exact verdict, the headline; `match`: RULER's string match) passes the threshold, "
            "every shorter evaluated length passing too; not interpolated between lengths; 0 "
            "when the shortest fails. The relative threshold is a fraction of the same model's "
            "own score at the reference length (L), so it says how far a model keeps what it "
            "can do at L, not how much it can do. Median over seeds (smallest-largest). Source: "
            "`tables/ruler_effective_length.csv`.",
            md_e,
        ]
    parts += _filler_share(rep, rows)
    parts += _depth_curve(rep, rows, "kv_middle")
    parts += _passkey_beside(rep, df, set(t["series"]))
    parts += _heuristic_baselines(rep)
    return "\n\n".join(parts)


def depth_table(rows: pd.DataFrame, task: str) -> pd.DataFrame:
    """Per series, eval length and depth of the asked item: the exact accuracy of ``task``
    (trials of all seeds pooled: weights ``n``)."""
    d = rows[(rows["task"] == task) & (rows["axis"] == "depth")].copy()
    if d.empty:
        return d
    d["depth"] = d["axis_value"].astype(float)
    t = aggregate(d, [*GROUP_KEYS, "eval_length", "depth"])
    return sort_series(t, ["eval_length", "depth"])


def _depth_curve(rep: ReportDir, rows: pd.DataFrame, task: str) -> list[str]:
    """Accuracy by the asked item's depth (lost in the middle: a U where the middle is read
    worse than the ends), one panel per series, a line per length."""
    t = depth_table(rows, task)
    if t.empty:
        return []
    series = list(dict.fromkeys(t["series"]))[:MAX_PANELS]
    fig = Figure(figsize=(3.2 * min(len(series), 4), 2.8 * math.ceil(len(series) / 4)),
                 layout="constrained")  # fmt: skip
    axes = fig.subplots(math.ceil(len(series) / 4), min(len(series), 4), squeeze=False).ravel()
    for ax, name in zip(axes, series, strict=False):
        s = t[t["series"] == name]
        for i, (length, g) in enumerate(s.groupby("eval_length")):
            ax.plot(g["depth"], g["value"], "o-", color=f"C{i}", label=f"{int(length)}")
        ax.set(title=str(name), xlabel="depth of the asked pair", ylim=(-0.05, 1.05))
        ax.legend(title="length", fontsize=7)
    axes[0].set_ylabel("exact accuracy")
    for ax in axes[len(series) :]:
        ax.set_visible(False)
    name = f"{task}_by_depth"
    save_figure(fig, rep.plots_dir, name)
    shown = t.assign(accuracy=t["value"].map(lambda v: f"{v:.2f}"))
    shown = shown.pivot_table(index=["series", "eval_length"], columns="depth",
                              values="accuracy", aggfunc="first")  # fmt: skip
    md = write_table(rep, name, t, shown, index=True)
    caption = (
        f"{task}: exact accuracy by the depth of the asked pair in the list (0: first, 1: last), "
        "a line per evaluation length; a U (the middle read worse than the ends) is the "
        "lost-in-the-middle effect. Trials of all seeds pooled."
    )
    return [f"### {task} by depth", figure_md(name, caption), f"Source: `tables/{name}.csv`.", md]


def filler_share_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per task and eval length: the share of the window that is filler (the word list of cwe
    and fwe), 1 - ``fixed_length`` / length, ``fixed_length`` being the task's head, statements,
    question and answer in tokens (``task_params``; rows written before it was recorded carry
    ``min_length``, the fewest tokens the task fits, which counts the word lists' shortest list
    too and so understates their share)."""
    scores = rows[(rows["metric"] != "effective_length") & (rows["axis"] == "score")]
    t = pd.DataFrame(
        {
            "task": scores["task"],
            "eval_length": scores["eval_length"].astype(int),
            "fixed_length": [_fixed_length(p) for p in scores["task_params"]],
            "row_id": scores["row_id"].astype(str) if "row_id" in scores else "",
        }
    ).dropna(subset=["fixed_length"])
    t = (
        t.groupby(["task", "eval_length", "fixed_length"])
        .agg(row_ids=("row_id", ";".join))
        .reset_index()
    )
    t["filler_share"] = 1 - t["fixed_length"] / t["eval_length"]
    if t.empty:
        return t
    t["_task"] = t["task"].map(task_rank)
    return t.sort_values(["_task", "eval_length"]).drop(columns=["_task"]).reset_index(drop=True)


def _fixed_length(task_params: str | None) -> float | None:
    params = json.loads(task_params or "{}")
    return params.get("fixed_length", params.get("min_length"))


def _filler_share(rep: ReportDir, rows: pd.DataFrame) -> list[str]:
    t = filler_share_table(rows)
    if t.empty:
        return []
    shown = t.set_index(["task", "eval_length"])["filler_share"].unstack("eval_length")
    shown = shown.reindex(list(dict.fromkeys(t["task"])))
    shown = shown.map(lambda v: "" if pd.isna(v) else f"{v:.0%}")
    md = write_table(rep, "ruler_filler_share", t, shown, index=True)
    below = t[t["filler_share"] < 0.5]
    text = (
        "The share of each window that is filler (1 - the task's fixed text and answer, "
        "`fixed_length`, over the length). The protocol asks for at least half; "
    )
    if below.empty:
        text += "every task and length here meets it."
    else:
        cells = ", ".join(f"{r.task} at {r.eval_length}" for r in below.itertuples())
        text += f"below half: {cells}, so there the task is mostly its fixed text."
    return ["### Filler share", text + " Source: `tables/ruler_filler_share.csv`.", md]


def _passkey_beside(rep: ReportDir, df: pd.DataFrame, series: set) -> list[str]:
    acc = df[
        (df["metric"] == "passkey_acc") & (df["axis"] == "template") & df["series"].isin(series)
    ]
    if acc.empty:
        return []
    per_seed = aggregate(acc, [*GROUP_KEYS, "eval_length", "seed"])
    t = (
        per_seed.groupby([*GROUP_KEYS, "eval_length"], dropna=False)
        .agg(passkey_acc=("value", "mean"), n_seeds=("seed", "nunique"),
             row_ids=("row_ids", ";".join))
        .reset_index()
    )  # fmt: skip
    t = sort_series(t, ["eval_length"])
    shown = t.set_index(["series", "eval_length"])["passkey_acc"].unstack("eval_length").round(2)
    md = write_table(rep, "ruler_passkey", t, shown, index=True)
    return [
        "### Passkey beside them",
        "Passkey accuracy of the same models and methods (seed mean). "
        "Source: `tables/ruler_passkey.csv`.",
        md,
    ]


@functools.cache
def _baselines(n: int, params: RulerParams) -> tuple[tuple, ...]:
    tok = ByteTokenizer()
    out = []
    for task in QA_TASKS:
        length = max(256, min_ruler_length(task, params))
        hits = {"last": 0.0, "first": 0.0, "random": 0.0, "before_asked": 0.0}
        for i in range(n):
            rng = random.Random(f"lenbench-qa-baseline:{task}:{i}")
            e = make_ruler_example(task, length, 0.5, rng=rng, params=params)
            g = guesses(tok.decode(e.prompt_ids))
            for name in ("last", "first", "before_asked"):
                hits[name] += g[name] == e.answer_text
            hits["random"] += (e.answer_text in g["random"]) / len(g["random"])
        k = chance_places(task, params)
        out.append((task, k, 1 / k, *(hits[h] / n for h in hits), n, length))
    return tuple(out)


def heuristic_baselines(n: int = BASELINE_EXAMPLES, params: RulerParams | None = None):
    """Per reasoning task (qa1-qa3, ``bench.tasks.ruler_tasks.qa``): ``k`` (the places a guess
    chooses among), chance ``1/k``, and the accuracy over ``n`` generated examples (fixed seeds,
    length 256) of answering the last, the first, a uniformly random one of the ``k`` places
    mentioned (its expected accuracy) and qa3's "the place moved from just before the asked
    one" (``guesses``)."""
    columns = ["task", "k", "chance", "last", "first", "random", "before_asked", "n", "length"]
    t = pd.DataFrame(list(_baselines(n, params or RulerParams())), columns=columns)
    t.loc[t["task"] != "qa3", "before_asked"] = math.nan
    return t


def _heuristic_baselines(rep: ReportDir) -> list[str]:
    t = heuristic_baselines()
    shown = t.set_index("task")[["k", "chance", "last", "first", "random", "before_asked"]]
    shown = shown.astype(object).map(
        lambda v: "" if pd.isna(v) else (f"{v:d}" if isinstance(v, int) else f"{v:.3f}")
    )
    shown.columns = [
        "k",
        "chance 1/k",
        "last place mentioned",
        "first place mentioned",
        "random mentioned place",
        "place before the asked one",
    ]
    md = write_table(rep, "ruler_heuristic_baselines", t, shown, index=True)
    p = RulerParams()
    text = (
        "What the reasoning tasks (qa1-qa3; in these rows only where `eval.ruler.tasks` selects "
        "them) give to a guess that reads the places and no names: accuracy over "
        f"{BASELINE_EXAMPLES} generated examples per task (fixed seeds, length 256, the default "
        f"params: {p.people} people, {p.moves} moves, {p.objects} object) of answering the last, "
        "the first or a uniformly random one (its expected accuracy) of the k places the move "
        "statements name (qa3: less the one its question names). Each is at chance 1/k by "
        "construction (`bench/tasks/ruler_tasks/qa.py`). Not at chance: on qa3, the place of the "
        "move just before the asked one (adjacent whenever no other move falls between the "
        "holder's last two). Source: `tables/ruler_heuristic_baselines.csv`."
    )
    return ["### Heuristic baselines of the reasoning tasks", text, md]
