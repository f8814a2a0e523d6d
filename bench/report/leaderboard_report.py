"""``lenbench-report --leaderboard``: report.md, one heatmap per metric, tables/leaderboard.csv
and index.html (:mod:`bench.report.leaderboard_page`), all from one table
(:func:`bench.report.leaderboard.leaderboard_table`), so the page shows the numbers report.md
shows (the same :func:`cell_text`)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from bench.findings.leaderboard import AT_L, METRICS, PPL_FLAT
from bench.report.leaderboard import METRIC_TITLES, RULES, labelled, leaderboard_table
from bench.report.markdown import markdown_table

__all__ = ["cell_text", "display_table", "write_leaderboard"]

#: marks a series whose perplexity at L exceeds PPL_FLAT x its recipe's best: its effective lengths
#: are measured against a value that is already bad
BAD_AT_L = "†"
#: marks a series whose design's raw model (no method, no fine-tune) already fails at L on the
#: metric: it never did the task at L under the recipe's training, so the cell says little of the
#: method applied to it
RAW_FAILS_AT_L = "‡"


def cell_text(row: pd.Series, metric: str, raw_fails: bool = False) -> str:
    """One metric's cell: effective length in tokens (its interval over seeds) and its rank;
    ``raw_fails`` adds :data:`RAW_FAILS_AT_L`."""
    eff = row.get(f"{metric}_eff", math.nan)
    if eff is None or not np.isfinite(eff):
        return "–"
    lo, hi, rank = row[f"{metric}_lo"], row[f"{metric}_hi"], row[f"{metric}_rank"]
    mark = RAW_FAILS_AT_L if raw_fails else ""
    if _fails_at_l(row, metric):
        return f"fails at L{mark} #{int(rank)}"
    span = "" if round(lo) == round(hi) else f" ({lo:.0f}–{hi:.0f})"
    # every seed passes at the longest length measured: at least that long
    at_least = "≥" if round(lo) == round(hi) == row[f"{metric}_max"] else ""
    return f"{at_least}{eff:.0f}{span}{mark} #{int(rank)}"


def _at_l_text(row: pd.Series, bad: bool) -> str:
    """Perplexity at L (geometric mean over seeds), the bad-at-L mark and its rank."""
    value = row.get("ppl_at_L", math.nan)
    if value is None or not np.isfinite(value):
        return "–"
    return f"{value:.2f}{BAD_AT_L if bad else ''} #{int(row[f'{AT_L}_rank'])}"


def _fails_at_l(row: pd.Series, metric: str) -> bool:
    """Every seed's effective length is 0 (it fails at the shortest length, L)."""
    return all(int(x) == 0 for x in str(row[f"{metric}_seeds"]).split(","))


def _length_text(row: pd.Series, metric: str) -> str:
    if _fails_at_l(row, metric):
        return "fails at L"
    eff, length = row[f"{metric}_eff"], row["train_length"]
    return f"{eff:.0f} tokens ({eff / length:.1f} L)"


def _raw_fails_at_l(table: pd.DataFrame, metric: str) -> pd.Series:
    """Per series: the raw series of its recipe and design (method and fine-tune none) has the
    metric and fails at L on it."""
    raw = table[(table["method"] == "none") & (table["finetune"] == "none")]
    raw = raw[np.isfinite(raw[f"{metric}_eff"])]
    failing = {(r["recipe"], r["design"]) for _, r in raw.iterrows() if _fails_at_l(r, metric)}
    return pd.Series(
        [key in failing for key in zip(table["recipe"], table["design"], strict=True)],
        index=table.index,
    )


def _bad_at_l(table: pd.DataFrame) -> pd.Series:
    best = table.groupby("recipe")["ppl_at_L"].transform("min")
    return table["ppl_at_L"] > PPL_FLAT * best


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    """The ranked table as text, one column per metric present (what report.md and the page show)."""
    metrics = [m for m in METRICS if f"{m}_eff" in table]
    bad = _bad_at_l(table)
    out = pd.DataFrame(
        {
            "recipe": table["recipe_label"],
            "overall": table["overall_rank"].map(lambda r: f"{r:.2f}"),
            "design": table["design"],
            "method": table["method"],
            "fine-tune": table["finetune"],
            "seeds": table["seeds"],
            "ppl at L": [
                _at_l_text(row, b) for (_, row), b in zip(table.iterrows(), bad, strict=True)
            ],
        }
    )
    for m in metrics:
        raw_fails = _raw_fails_at_l(table, m)
        out[METRIC_TITLES[m]] = [cell_text(row, m, raw_fails[i]) for i, row in table.iterrows()]
    return out


def _paragraph(table: pd.DataFrame, metric: str) -> str:
    """What the metric shows, per recipe: the longest and shortest effective lengths and who."""
    lines = [f"**{METRIC_TITLES[metric]}** ({RULES[metric]})."]
    if f"{metric}_eff" not in table:
        return lines[0] + " No series of these rows has it."
    for _, block in table.groupby("recipe", sort=True):
        recipe = block["recipe_label"].iloc[0]
        block = block[np.isfinite(block[f"{metric}_eff"])]
        if block.empty:
            continue
        best = block[block[f"{metric}_rank"] == 1]
        worst = block[block[f"{metric}_eff"] == block[f"{metric}_eff"].min()].iloc[0]
        top = block.loc[best[f"{metric}_eff"].idxmax()]
        length = int(block["train_length"].iloc[0])
        names = ", ".join(f"{r.design} {r.method}" + (f" ({r.finetune})" if r.finetune != "none" else "")
                          for r in best.itertuples())  # fmt: skip
        lines.append(
            f"In `{recipe}` (L = {length}), {len(block)} series: rank 1 ({len(best)} tied, "
            f"intervals overlapping) is {names}, up to {_length_text(top, metric)}; the shortest "
            f"is {worst['design']} {worst['method']}: {_length_text(worst, metric)}."
        )
        if metric == "longppl":
            lines.append(_longppl_values(block))
        lines.append(_raw_failures(block, metric))
    return " ".join(line for line in lines if line)


def _raw_failures(block: pd.DataFrame, metric: str) -> str:
    """The designs whose raw model fails at L: their series are marked, not explained by a method."""
    failing = sorted(set(block.loc[_raw_fails_at_l(block, metric), "design"]))
    if not failing:
        return ""
    return (
        f"Raw models that fail at L ({RAW_FAILS_AT_L} on every series built on them: the model "
        "did not do the task at L after the recipe's training, so those cells say little of the "
        f"method applied): {', '.join(failing)}."
    )


def _longppl_values(block: pd.DataFrame) -> str:
    """What the ratio rule does not read: LongPPL itself at the longest length (not ranked)."""
    at = block.dropna(subset=["longppl_at_longest"]).sort_values("longppl_at_longest")
    named = [f"{r.design} {r.method}" + (f" ({r.finetune})" if r.finetune != "none" else "")
             + f" {r.longppl_at_longest:.1f}" for r in at.itertuples()]  # fmt: skip
    return (
        "Its value at the longest length, which the rule does not read (not ranked; geometric "
        f"mean over seeds): lowest {', '.join(named[:3])}; highest {named[-1]}."
    )


def heatmap(table: pd.DataFrame, metric: str, path: Path) -> bool:
    """Design (with recipe and fine-tune) x method, colour = log2(effective length / L); False when
    no series has the metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if f"{metric}_eff" not in table:
        return False
    t = table[np.isfinite(table[f"{metric}_eff"])]
    if t.empty:
        return False
    rows = t["design"] + " · " + t["finetune"] + " · " + t["recipe_label"]
    values = np.log2(t[f"{metric}_eff"] / t["train_length"])
    grid = pd.DataFrame({"row": rows, "method": t["method"], "v": values}).pivot_table(
        index="row", columns="method", values="v", aggfunc="first"
    )
    fig, ax = plt.subplots(figsize=(2 + 0.9 * grid.shape[1], 1 + 0.35 * grid.shape[0]))
    image = ax.imshow(grid.to_numpy(dtype=float), cmap="viridis", aspect="auto")
    ax.set_xticks(range(grid.shape[1]), grid.columns, rotation=45, ha="right")
    ax.set_yticks(range(grid.shape[0]), grid.index, fontsize=7)
    for (i, j), v in np.ndenumerate(grid.to_numpy(dtype=float)):
        if np.isfinite(v):
            ax.text(j, i, f"{v:.1f}", ha="center", va="center", color="w", fontsize=7)
    fig.colorbar(image, ax=ax, label="log2(effective length / L)")
    ax.set_title(f"{METRIC_TITLES[metric]}: effective length ({RULES[metric][:60]}...)", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, bbox_inches="tight")  # the long row labels whole
    plt.close(fig)
    return True


def _report_md(table: pd.DataFrame, shown: pd.DataFrame, maps: list[str], sources: str) -> str:
    parts = [
        "# Leaderboard: which design and method keeps working past the training length",
        "",
        f"Generated by `lenbench-report --leaderboard` from {sources} (do not edit). One block per "
        "training recipe: rows of different recipes are never ranked together. Each metric's "
        "cell: the effective length in tokens (2 to the mean over seeds of log2(eff / L), times "
        "L; ≥ where every seed passes at the longest length measured), its 95% t-interval over "
        "seeds, and its rank (1 + the series whose interval lies "
        "entirely above; ties where intervals overlap; an effective length of 0, failing at the "
        "shortest length, counts as L / 2). Ppl at L: the perplexity at the training length "
        "(geometric mean over seeds) and its rank (lower is better, the same tie rule on the "
        "log perplexity's t-interval), so that no method wins by being bad at L. Overall: the "
        "mean rank over the metrics a series has, ppl at L included. "
        f"{BAD_AT_L}: perplexity at L above {PPL_FLAT} x its recipe's best, so its flat "
        "perplexity past L is measured from an already bad value (`bench/findings/leaderboard.py`). "
        f"{RAW_FAILS_AT_L}: the raw model of its recipe and design (no method, no fine-tune) fails "
        "at L on that metric, so the cell reflects the model's training more than the method.",
        "",
        "## Rules",
        "",
        *[f"- {METRIC_TITLES[m]}: {RULES[m]}." for m in METRICS],
        "",
        "## Ranked",
        "",
        markdown_table(shown),
        "",
        "## What each metric shows",
        "",
    ]
    parts += [_paragraph(table, m) + "\n" for m in METRICS]
    parts += ["## Heatmaps", ""] + [f"![{m}](heatmaps/{m}.png)" for m in maps]
    return "\n".join(parts) + "\n"


def write_leaderboard(df: pd.DataFrame, out: Path, sources: str) -> pd.DataFrame:
    """Write ``out``/report.md, heatmaps/<metric>.png, tables/leaderboard.csv and index.html from
    the result rows ``df``; return the leaderboard table."""
    from bench.report.leaderboard_page import write_page

    rows = labelled(df)  # once: the table and the page's rows read the same keys
    table = leaderboard_table(rows)
    if table.empty:
        raise ValueError("no series with a leaderboard metric (nll, longppl, passkey, RULER) here.")
    out.mkdir(parents=True, exist_ok=True)
    maps = [m for m in METRICS if heatmap(table, m, out / "heatmaps" / f"{m}.png")]
    shown = display_table(table)
    (out / "tables").mkdir(exist_ok=True)
    table.drop(columns=["series"]).to_csv(out / "tables" / "leaderboard.csv", index=False)
    (out / "report.md").write_text(_report_md(table, shown, maps, sources))
    write_page(out / "index.html", table, shown, rows, maps, out / "heatmaps")
    return table


# --------------------------------------------------------------------------- the README's block

README_START = (
    "<!-- leaderboard: generated by lenbench-report --leaderboard --readme; do not edit -->"
)
README_END = "<!-- leaderboard: end -->"
#: how many rank-1 series a README line names before "+k more"
README_NAMES = 4


def readme_block(table: pd.DataFrame, page: str = "reports/leaderboard") -> str:
    """What lenbench found, for the README's top: per metric and recipe, the rank-1 series (those
    good at L first; the rest as a count) and how far they reach; a link to the report and page."""
    bad = _bad_at_l(table)
    lines = [
        README_START,
        f"Rank 1 per metric in [the leaderboard]({page}/report.md) ([page]({page}/index.html)); "
        f"each recipe ranked on its own, ties where seed intervals overlap; {BAD_AT_L}: perplexity "
        f"at L above {PPL_FLAT} x the recipe's best.",
        "",
        "| metric | recipe (L) | rank 1 | reaches |",
        "|---|---|---|---|",
    ]
    for metric in METRICS:
        if f"{metric}_rank" not in table:
            continue
        for _, block in table.groupby("recipe", sort=True):
            recipe = block["recipe_label"].iloc[0]
            top = block[block[f"{metric}_rank"] == 1]
            if top.empty:
                continue
            good, poor = top[~bad[top.index]], top[bad[top.index]]
            names = [f"{r.design} {r.method}" + ("" if r.finetune == "none" else f" ({r.finetune})")
                     for r in good.itertuples()]  # fmt: skip
            shown = ", ".join(names[:README_NAMES])
            if len(names) > README_NAMES:
                shown += f" +{len(names) - README_NAMES} more"
            if not poor.empty:
                shown += f"{'; ' if shown else ''}+{len(poor)} worse at L{BAD_AT_L}"
            # how far the series named reach; the bad-at-L ones' only where none is named
            reached = good if not good.empty else poor
            best = reached.loc[reached[f"{metric}_eff"].idxmax()]
            reach = cell_text(best, metric).rsplit(" #", 1)[0] + (
                "" if reached is good else BAD_AT_L
            )
            lines.append(
                f"| {METRIC_TITLES[metric]} | `{recipe}` ({int(block['train_length'].iloc[0])}) | "
                f"{shown} | {reach} |"
            )
    return "\n".join([*lines, README_END])


def readme_text(path: Path) -> str:
    """``path``'s text, checked to hold the leaderboard block (one sentence otherwise)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--readme {str(path)!r} is not a file; allowed: a README with the block.")
    text = path.read_text()
    if README_START not in text or README_END not in text:
        raise ValueError(
            f"{path} has no leaderboard block; add the lines {README_START!r} and {README_END!r} "
            "where it goes."
        )
    return text


def update_readme(path: Path, block: str) -> None:
    """Replace the block between :data:`README_START` and :data:`README_END` in ``path``."""
    text = readme_text(path)
    head, rest = text.split(README_START, 1)
    tail = rest.split(README_END, 1)[1]
    path.write_text(head + block + tail)
