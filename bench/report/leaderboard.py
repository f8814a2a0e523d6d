"""The leaderboard (issue #56): every series of one training recipe ranked by how far past its
training length L it keeps working, per metric, by the rules of :mod:`bench.findings.leaderboard`
(fixed before any leaderboard row).

A series is a design (position family and attention switches) x method (eval-time scaling or
training-free method) x fine-tune, within one **recipe** (the ``recipe`` column,
``bench.train.cache.recipe_id``; rows written before it existed count as the recipe
``study:<experiment>/<arm>/L=<L>``, so that studies are never ranked together on a guess). Rows of different
recipes are never ranked together: the table has one block per recipe.

Per series and seed, an effective length per metric (``ppl``, ``longppl``, ``passkey``,
``ruler``); across seeds a mean of log2(eff / L) with a t-interval; a rank per metric (ties where
intervals overlap) and the overall rank (mean rank over the metrics the series has), beside its
perplexity at L. :func:`leaderboard_table` is the one table every output (report.md, the
heatmaps, index.html) is written from.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from bench.core.series import SWITCH_COLUMNS
from bench.findings.leaderboard import (
    AT_L,
    METRICS,
    PASSKEY_MIN,
    PPL_FLAT,
    RULER_RELATIVE,
    SeedSummary,
    overall_ranks,
    passkey_rule,
    ranks,
    ratio_rule,
    relative_rule,
    summarise_ppl_at_l,
    summarise_seeds,
)
from bench.findings.rows import col, passkey, window_nll, with_series

__all__ = ["METRIC_TITLES", "RULES", "leaderboard_table", "recipe_of"]

METRIC_TITLES = {"ppl": "perplexity", "longppl": "LongPPL", "passkey": "passkey", "ruler": "RULER"}
#: each metric's rule in one line (report.md and the page say it beside the numbers)
RULES = {
    "ppl": f"largest length with perplexity <= {PPL_FLAT} x its value at L (every shorter too)",
    "longppl": f"the same rule on LongPPL: <= {PPL_FLAT} x its LongPPL at L (none without one at L)",
    "passkey": f"largest length whose accuracy's Wilson 95% lower end is >= {PASSKEY_MIN}",
    "ruler": f"largest length whose RULER tasks' exact mean is >= {RULER_RELATIVE} x its mean at L",
}
KEY_COLUMNS = ["recipe", "design", "method", "finetune"]


def recipe_of(df: pd.DataFrame) -> pd.Series:
    """Each row's recipe: its ``recipe`` column, else ``study:<experiment>/<arm>/L=<L>``."""
    study = "study:" + df["experiment"].astype(str) + "/" + col(df, "arm").fillna("-").astype(str)
    return col(df, "recipe").astype(object).fillna(study + "/L=" + df["train_length"].astype(str))


def recipe_label(recipe: str, rows: pd.DataFrame) -> str:
    """A recipe as a reader names it: a study fallback or pretrained id as it is; a recipe id as
    its experiments, arms and L, with the id's first 8 characters."""
    if recipe.startswith(("study:", "pretrained:")):
        return recipe
    experiments = "+".join(sorted(rows["experiment"].astype(str).unique()))
    arms = "+".join(sorted(col(rows, "arm").dropna().astype(str).unique())) or "-"
    return f"{experiments}/{arms}/L={int(rows['train_length'].iloc[0])} ({recipe[:8]})"


def _design(df: pd.DataFrame) -> pd.Series:
    """Position family plus the attention switches that are on (``rope+attention=differential``)."""
    out = df["position"].astype(str)
    for name in [*SWITCH_COLUMNS, "attention_sink", "position_sampling"]:
        values = col(df, name)
        on = values.notna() & (values.astype(str) != "")
        out = out.where(~on, out + "+" + name + "=" + values.astype(str))
    return out


def _finetune(df: pd.DataFrame) -> pd.Series:
    method, length = col(df, "finetune_method"), col(df, "finetune_length")
    label = method.astype(str) + "@" + length.astype("Int64").astype(str)
    return label.where(method.notna(), "none")


def labelled(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with the leaderboard's key columns and its series keys; a fine-tune's recovery
    curve (``extend.curve``: its checkpoints after 0, 50, ... updates) keeps its final checkpoint,
    the model the fine-tune label names. Each key then holds one series (checked)."""
    df = with_series(df)
    df = df.assign(
        recipe=recipe_of(df), design=_design(df), method=df["scaling"].astype(str),
        finetune=_finetune(df),
    )  # fmt: skip
    steps = pd.to_numeric(col(df, "finetune_steps"), errors="coerce")
    final = steps.groupby([df[k] for k in [*KEY_COLUMNS, "seed"]]).transform("max")
    df = df[steps.isna() | (steps == final)]
    pooled = df.groupby(KEY_COLUMNS)["_series"].nunique()
    if (pooled > 1).any():
        key = pooled[pooled > 1].index[0]
        raise ValueError(
            f"leaderboard series {' / '.join(map(str, key))} holds {int(pooled.max())} different "
            "series (their rows would be pooled); its key needs the column that tells them apart."
        )
    return df


# --------------------------------------------------------------------------- per seed, per metric


def _ppl_lengths(rows: pd.DataFrame, train_length: int) -> dict[int, int]:
    """Per seed: the perplexity rule's effective length (none where the seed has no row at L)."""
    nll = window_nll(rows)
    out: dict[int, int] = {}
    for seed, g in nll.groupby("seed"):
        by_length = g.groupby("eval_length").apply(
            lambda x: np.average(x["value"], weights=x["n"]), include_groups=False
        )
        if train_length not in by_length.index:
            continue
        ppl = {int(x): math.exp(v) for x, v in by_length.items()}
        out[int(seed)] = ratio_rule(ppl, ppl[train_length], PPL_FLAT)
    return out


def _longppl_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """LongPPL rows with key tokens (a length without any has no value to read)."""
    return rows[(rows["metric"] == "longppl") & (rows["n"] > 0)]


def _longppl_lengths(rows: pd.DataFrame, train_length: int) -> dict[int, int]:
    """Per seed: the LongPPL rule's effective length against LongPPL at L (none where the seed
    has no LongPPL at L: a later length is no baseline, the series may fail before it)."""
    lp = _longppl_rows(rows)
    out = {}
    for seed, g in lp.groupby("seed"):
        values = {int(x): float(v) for x, v in zip(g["eval_length"], g["value"], strict=True)}
        if train_length in values:
            out[int(seed)] = ratio_rule(values, values[train_length], PPL_FLAT)
    return out


def _longppl_at_longest(rows: pd.DataFrame) -> float:
    """LongPPL at the longest length every seed has it, geometric mean over seeds (described
    beside the rule, never ranked: the rule reads the ratio to L)."""
    lp = _longppl_rows(rows)
    if lp.empty:
        return math.nan
    longest = lp.groupby("seed")["eval_length"].max().min()
    at = lp[lp["eval_length"] == longest]
    return math.exp(float(np.log(at["value"]).mean()))


def _passkey_lengths(rows: pd.DataFrame) -> dict[int, int]:
    keys = passkey(rows)
    keys = keys[keys["eval_length"] > 0]
    out = {}
    for seed, g in keys.groupby("seed"):
        trials: dict[int, tuple[int, int]] = {}
        for length, x in g.groupby("eval_length"):
            k, n = float((x["value"] * x["n"]).sum()), int(x["n"].sum())
            trials[int(length)] = (round(k), n)
        out[int(seed)] = passkey_rule(trials)
    return out


def _ruler_lengths(rows: pd.DataFrame, train_length: int) -> dict[int, int]:
    task = col(rows, "task")
    exact = rows[
        task.notna() & (rows["metric"] != "effective_length") & (col(rows, "axis") == "score")
        & (col(rows, "axis_value") == "exact")
    ]  # fmt: skip
    out = {}
    for seed, g in exact.groupby("seed"):
        means = g.groupby("eval_length")["value"].mean()
        if train_length not in means.index:
            continue
        values = {int(x): float(v) for x, v in means.items()}
        out[int(seed)] = relative_rule(values, values[train_length], RULER_RELATIVE)
    return out


def longest_lengths(rows: pd.DataFrame) -> dict[str, int]:
    """Per metric: the longest length evaluated (an effective length equal to it means "at
    least": the series passes wherever it was measured)."""
    task = col(rows, "task")
    sources = {
        "ppl": window_nll(rows),
        "longppl": rows[rows["metric"] == "longppl"],
        "passkey": passkey(rows),
        "ruler": rows[task.notna() & (rows["metric"] != "effective_length")],
    }
    return {m: int(r["eval_length"].max()) for m, r in sources.items() if not r.empty}


def seed_lengths(rows: pd.DataFrame, train_length: int) -> dict[str, dict[int, int]]:
    """Per metric (those the series has): each seed's effective length in tokens."""
    found = {
        "ppl": _ppl_lengths(rows, train_length),
        "longppl": _longppl_lengths(rows, train_length),
        "passkey": _passkey_lengths(rows),
        "ruler": _ruler_lengths(rows, train_length),
    }
    return {metric: lengths for metric, lengths in found.items() if lengths}


def _nll_at_l(rows: pd.DataFrame, train_length: int) -> dict[int, float]:
    """Per seed: the mean NLL per token at L (its log perplexity)."""
    nll = window_nll(rows)
    nll = nll[nll["eval_length"] == train_length]
    return {
        int(seed): float(np.average(g["value"], weights=g["n"]))
        for seed, g in nll.groupby("seed", sort=True)
    }


# --------------------------------------------------------------------------- the table


def _series_row(key: tuple, rows: pd.DataFrame) -> tuple[dict, dict[str, SeedSummary]]:
    train_length = int(rows["train_length"].iloc[0])
    summaries = {
        metric: summarise_seeds([lengths[s] for s in sorted(lengths)], train_length)
        for metric, lengths in seed_lengths(rows, train_length).items()
    }
    row = dict(zip(KEY_COLUMNS, key, strict=True))
    row.update(
        train_length=train_length,
        seeds=",".join(str(int(s)) for s in sorted(rows["seed"].unique())),
        ppl_at_L=math.nan,
        series=str(rows["_series"].iloc[0]),
    )
    row["longppl_at_longest"] = _longppl_at_longest(rows)
    at_l = _nll_at_l(rows, train_length)
    if at_l and summaries:  # ranked beside the effective lengths (lower is better)
        s = summaries[AT_L] = summarise_ppl_at_l(list(at_l.values()))
        row.update(
            ppl_at_L=math.exp(-s.mean), ppl_at_L_lo=math.exp(-s.hi), ppl_at_L_hi=math.exp(-s.lo)
        )
    longest = longest_lengths(rows)
    for metric, s in summaries.items():
        if metric == AT_L:
            continue
        row[f"{metric}_max"] = longest[metric]
        row[f"{metric}_eff"] = train_length * 2.0**s.mean
        row[f"{metric}_lo"] = train_length * 2.0**s.lo
        row[f"{metric}_hi"] = train_length * 2.0**s.hi
        row[f"{metric}_seeds"] = ",".join(str(x) for x in s.lengths)
    return row, summaries


def leaderboard_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per series (recipe x design x method x fine-tune): effective lengths in tokens per
    metric (``<metric>_eff``: 2 to the mean log2 over seeds, times L; ``_lo``/``_hi`` its
    interval; ``_seeds`` the per-seed lengths; ``_max`` the longest length evaluated),
    ``<metric>_rank``, ``overall_rank``, ``ppl_at_L``; sorted by recipe, overall rank, then
    design and method. ``df`` may already be :func:`labelled` (it is labelled once)."""
    if df.empty:
        return pd.DataFrame(columns=KEY_COLUMNS)
    if "design" not in df.columns:  # raw result rows
        df = labelled(df)
    out = []
    for recipe, block in df.groupby("recipe", sort=True):
        label = recipe_label(str(recipe), block)
        rows, summaries = [], {}
        for key, g in block.groupby(KEY_COLUMNS, sort=True):
            row, summary = _series_row(key, g)
            if summary:
                row["recipe_label"] = label
                rows.append(row)
                summaries[row["series"]] = summary
        per_metric = {
            m: ranks({k: s[m] for k, s in summaries.items() if m in s})
            for m in (*METRICS, AT_L)
            if any(m in s for s in summaries.values())
        }
        overall = overall_ranks(per_metric)
        for row in rows:
            for m, r in per_metric.items():
                row[f"{m}_rank"] = r.get(row["series"], math.nan)
            row["overall_rank"] = overall[row["series"]]
        out.extend(rows)
    table = pd.DataFrame(out)
    order = ["recipe", "overall_rank", "design", "method", "finetune"]
    return table.sort_values(order, kind="stable").reset_index(drop=True)
