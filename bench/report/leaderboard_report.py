"""``lenbench-report --leaderboard``: report.md, a heatmap per statistic, tables/leaderboard.csv,
tables/comparisons.csv (every decided comparison), tables/power.csv and index.html
(:mod:`bench.report.leaderboard_page`), all from one :class:`bench.report.leaderboard.Leaderboard`,
so the page shows the numbers report.md shows (the same :func:`cell_text`); the README's block is
:mod:`bench.report.leaderboard_readme`."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from bench.findings.comparisons import FDR
from bench.findings.leaderboard import AT_L, PPL_FLAT, RULER_RELATIVE_RULE, STATISTICS
from bench.report.leaderboard import (
    TOP,
    Leaderboard,
    labelled,
    leaderboard,
)
from bench.report.markdown import markdown_table

__all__ = ["cell_text", "display_table", "write_leaderboard"]

#: marks a series bad at L: its perplexity at L decidedly above PPL_FLAT x its recipe's best; it
#: ranks below every series that is not, on the perplexity statistics and overall
BAD_AT_L = "†"
#: marks a series whose design's raw model (no method, no fine-tune) fails at L on the statistic
#: on some seed: the cell reflects the recipe's training more than the method applied
RAW_FAILS_AT_L = "‡"
#: how many top-group series a README line names before "+k more"
README_NAMES = 4


def _has(row: pd.Series, key: str) -> bool:
    value = row.get(key, math.nan)
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def rank_text(row: pd.Series, stat: str) -> str:
    """``#lo–hi`` (``#k`` where the interval is one rank); empty where the statistic is not ranked."""
    if not _has(row, f"{stat}_rank_lo"):
        return ""
    lo, hi = int(row[f"{stat}_rank_lo"]), int(row[f"{stat}_rank_hi"])
    return f"#{lo}" if lo == hi else f"#{lo}–{hi}"


def _seed_count(row: pd.Series, stat: str) -> int:
    return len(str(row[f"{stat}_seeds"]).split(","))


def cell_text(row: pd.Series, stat: str, raw_fails: bool = False) -> str:
    """One statistic's cell. A length: its mean in tokens ("≥" where every seed passes at the
    longest length measured), the per-seed lengths and the rank interval. An AUC: its mean, 95%
    interval and rank interval. A series failing at L on some seed of a gated statistic: "fails
    at L on k/n" with the seeds' values, no rank. ``raw_fails`` adds :data:`RAW_FAILS_AT_L`."""
    if not _has(row, f"{stat}_mean"):
        return "–"
    mark = RAW_FAILS_AT_L if raw_fails else ""
    seeds = str(row[f"{stat}_seeds"])
    fails = int(row.get(f"{stat}_fails", 0) or 0) if _has(row, f"{stat}_fails") else 0
    if STATISTICS[stat].length:
        values = [int(x) for x in seeds.split(",")]
        at_least = "≥" if all(v == row[f"{stat}_max"] for v in values) else ""
        value = f"{at_least}{row[f'{stat}_mean']:.0f} ({seeds})"
    else:
        lo, hi = row[f"{stat}_lo"], row[f"{stat}_hi"]
        value = f"{row[f'{stat}_mean']:.3f} ({lo:.3f}–{hi:.3f})"
    if fails:
        return f"fails at L on {fails}/{_seed_count(row, stat)}{mark} ({seeds})"
    return f"{value}{mark} {rank_text(row, stat)}".rstrip()


def _at_l_text(row: pd.Series) -> str:
    """Perplexity at L (geometric mean over seeds), † where bad at L, and its rank interval."""
    if not _has(row, "ppl_at_L"):
        return "–"
    mark = BAD_AT_L if row["bad_at_L"] else ""
    return f"{row['ppl_at_L']:.2f}{mark} {rank_text(row, AT_L)}".rstrip()


def overall_text(row: pd.Series) -> str:
    """The overall rank interval (the block's primary statistic), or why the series has none."""
    if _has(row, "overall_rank_lo"):
        lo, hi = int(row["overall_rank_lo"]), int(row["overall_rank_hi"])
        return f"#{lo}" if lo == hi else f"#{lo}–{hi}"
    primary = row.get("primary")
    if primary and _has(row, f"{primary}_fails") and row[f"{primary}_fails"]:
        return (
            f"not ranked: fails at L on {int(row[f'{primary}_fails'])}/{_seed_count(row, primary)}"
        )
    return "not ranked"


def _raw_fails_at_l(table: pd.DataFrame, stat: str) -> pd.Series:
    """Per series: the raw series of its recipe and design (method and fine-tune none) fails at L
    on the gated statistic on some seed."""
    if f"{stat}_fails" not in table:
        return pd.Series(False, index=table.index)
    raw = table[(table["method"] == "none") & (table["finetune"] == "none")]
    failing = {
        (r["recipe"], r["design"]) for _, r in raw.iterrows()
        if _has(r, f"{stat}_fails") and r[f"{stat}_fails"] > 0
    }  # fmt: skip
    return pd.Series(
        [key in failing for key in zip(table["recipe"], table["design"], strict=True)],
        index=table.index,
    )


def shown_statistics(table: pd.DataFrame) -> list[str]:
    """The statistics with a column in the shown table (present in ``table``; ppl at L apart)."""
    return [m for m in STATISTICS if m != AT_L and f"{m}_mean" in table]


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    """The ranked table as text, one column per statistic present (what report.md and the page
    show)."""
    out = pd.DataFrame(
        {
            "recipe": table["recipe_label"],
            "overall": [overall_text(r) for _, r in table.iterrows()],
            "design": table["design"],
            "method": table["method"],
            "fine-tune": table["finetune"],
            "seeds": table["seeds"],
            "ppl at L": [_at_l_text(r) for _, r in table.iterrows()],
        }
    )
    for m in shown_statistics(table):
        raw_fails = _raw_fails_at_l(table, m)
        out[STATISTICS[m].title] = [cell_text(r, m, raw_fails[i]) for i, r in table.iterrows()]
    if "ruler_rel_seeds" in table:
        out["RULER length (relative)"] = table["ruler_rel_seeds"].fillna("–")
    return out


# --------------------------------------------------------------------------- what a block shows


def series_name(row) -> str:
    tune = "" if row.finetune == "none" else f" ({row.finetune})"
    return f"{row.design} {row.method}{tune}"


def top_group(block: pd.DataFrame) -> pd.DataFrame:
    """The series no series is decidedly better than on the block's primary statistic (overall
    rank interval starting at 1), the most decided first (narrowest interval), then by mean: a
    series whose seeds disagree can rarely be excluded from first place at three seeds, and its
    wide interval says so."""
    top = block[block["overall_rank_lo"] == 1]
    return top.assign(_order=np.arange(len(top))).sort_values(
        ["overall_rank_hi", "_order"], kind="stable"
    ).drop(columns="_order")  # fmt: skip


def reach(rows: pd.DataFrame, stat: str) -> int | None:
    """What every series of ``rows`` reaches on every seed on the length statistic ``stat``:
    the smallest per-seed effective length among them (None without it)."""
    if f"{stat}_seeds" not in rows or rows[f"{stat}_seeds"].isna().any():
        return None
    return min(int(x) for s in rows[f"{stat}_seeds"] for x in str(s).split(","))


def length_statistic(primary: str) -> str:
    """The effective-length statistic of the primary statistic's metric family."""
    family = STATISTICS[primary].family
    return next(s for s, x in STATISTICS.items() if x.length and x.family == family)


def versus_raw(block: pd.DataFrame, comparisons: pd.DataFrame, named: pd.DataFrame) -> list[str]:
    """For each named series with a method or fine-tune: its decided comparison with its
    design's raw series on the primary statistic (better or worse), where there is one."""
    out = []
    if comparisons.empty:
        return out
    primary = block["primary"].iloc[0]
    c = comparisons[(comparisons["recipe"] == block["recipe"].iloc[0])
                    & (comparisons["statistic"] == primary)]  # fmt: skip
    raw = block[(block["method"] == "none") & (block["finetune"] == "none")].set_index("design")
    for row in named.itertuples():
        if (row.method == "none" and row.finetune == "none") or row.design not in raw.index:
            continue
        base = raw.loc[row.design]
        for a, b, word in ((row.series, base["series"], "better"),
                           (base["series"], row.series, "worse")):  # fmt: skip
            hit = c[(c["a"] == a) & (c["b"] == b)]
            if not hit.empty:
                p = hit["p_adj"].iloc[0]
                p_text = f"p_adj = {p:.2g}" if np.isfinite(p) else "implied by decided pairs"
                out.append(f"{series_name(row)} {word} than raw {row.design} ({p_text})")
    return out


def _block_paragraph(block: pd.DataFrame, lb: Leaderboard) -> str:
    recipe, label = block["recipe"].iloc[0], block["recipe_label"].iloc[0]
    primary = block["primary"].iloc[0]
    length = int(block["train_length"].iloc[0])
    if primary is None or not isinstance(primary, str):
        return f"`{label}`: no ranked statistic."
    ranked = block[block["overall_rank_lo"].notna()]
    top = top_group(block)
    names = ", ".join(
        f"{series_name(r)} [{overall_text(r)}]" for _, r in top.head(README_NAMES).iterrows()
    )
    more = f" and {len(top) - README_NAMES} more" if len(top) > README_NAMES else ""
    length_stat = length_statistic(primary)
    reached = reach(top, length_stat)
    lines = [
        f"`{label}` (L = {length}), {len(block)} series, ranked by {STATISTICS[primary].title}: "
        f"{len(ranked)} ranked, {len(block) - len(ranked)} not (failing at L on some seed). "
        f"Top group (no series decidedly better): {names}{more}"
        + (f"; on every seed each reaches {reached} tokens ({reached / length:g} L) on "
           f"{STATISTICS[length_stat].title}." if reached
           else f"; some fail at L on {STATISTICS[length_stat].title} on some seed."
           if reached == 0 else ".")
    ]  # fmt: skip
    power = lb.power[lb.power["recipe"] == recipe].set_index("statistic")
    for stat in power.index:
        p = power.loc[stat]
        lines.append(
            f"{STATISTICS[stat].title}: {int(p['pairs_decided'])} of {int(p['pairs_compared'])} "
            f"pairs decided, {int(p['adjacent_decided'])} of {int(p['adjacent_pairs'])} adjacent."
        )
    versus = versus_raw(block, lb.comparisons, top)
    if versus:
        lines.append("Decided against the raw model: " + "; ".join(versus[:3]) + ".")
    failing = sorted(set(block.loc[_raw_fails_at_l(block, primary), "design"]))
    if failing:
        lines.append(
            f"Raw models failing at L on some seed ({RAW_FAILS_AT_L}: their series say more of "
            f"the training than of the method): {', '.join(failing)}."
        )
    return " ".join(lines)


def _seeds_text(value: object) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "–"
    return f"{float(value):.0f}"


def power_table(lb: Leaderboard, table: pd.DataFrame) -> pd.DataFrame:
    """Per block and statistic: pairs decided, adjacent pairs decided, the top-10 adjacent pairs
    decided and the seeds a series that would decide the undecided ones (at 80% power)."""
    labels = table.drop_duplicates("recipe").set_index("recipe")["recipe_label"]
    p = lb.power

    def of(part: str, whole: str) -> list[str]:
        return [f"{int(a)} / {int(b)}" for a, b in zip(p[part], p[whole], strict=True)]

    return pd.DataFrame(
        {
            "recipe": p["recipe"].map(labels),
            "statistic": p["statistic"].map(lambda m: STATISTICS[m].title),
            "series ranked": p["series"],
            "pairs decided": of("pairs_decided", "pairs_compared"),
            "adjacent decided": of("adjacent_decided", "adjacent_pairs"),
            f"top-{TOP} adjacent decided": of("top_decided", "top_pairs"),
            "seeds to decide the rest (median / max)": [
                f"{_seeds_text(m)} / {_seeds_text(x)}"
                + (f" ({int(c)} beyond 1000 or without a difference)" if c else "")
                for m, x, c in zip(p["top_undecided_seeds_median"], p["top_undecided_seeds_max"],
                                   p["top_undecided_beyond_cap"], strict=True)
            ],
        }
    )  # fmt: skip


def heatmap(table: pd.DataFrame, stat: str, path: Path) -> bool:
    """Design (with recipe and fine-tune) x method, colour = the statistic's mean over seeds
    (lengths as log2(eff / L)); False when no series has it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if f"{stat}_mean" not in table:
        return False
    t = table[np.isfinite(table[f"{stat}_mean"].astype(float))]
    if t.empty:
        return False
    rows = t["design"] + " · " + t["finetune"] + " · " + t["recipe_label"]
    values = t[f"{stat}_mean"].astype(float)
    label = STATISTICS[stat].title
    if STATISTICS[stat].length:
        values = np.log2(np.maximum(values, 1e-9) / t["train_length"])
        label = f"log2({label} / L)"
    grid = pd.DataFrame({"row": rows, "method": t["method"], "v": values}).pivot_table(
        index="row", columns="method", values="v", aggfunc="first"
    )
    fig, ax = plt.subplots(figsize=(2 + 0.9 * grid.shape[1], 1 + 0.35 * grid.shape[0]))
    image = ax.imshow(grid.to_numpy(dtype=float), cmap="viridis", aspect="auto")
    ax.set_xticks(range(grid.shape[1]), grid.columns, rotation=45, ha="right")
    ax.set_yticks(range(grid.shape[0]), grid.index, fontsize=7)
    for (i, j), v in np.ndenumerate(grid.to_numpy(dtype=float)):
        if np.isfinite(v):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="w", fontsize=6)
    fig.colorbar(image, ax=ax, label=label)
    ax.set_title(f"{STATISTICS[stat].title}: {STATISTICS[stat].rule[:70]}...", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, bbox_inches="tight")  # the long row labels whole
    plt.close(fig)
    return True


PREAMBLE = (
    "One block per training recipe: rows of different recipes are never ranked together. Within "
    "a block every pair of series is compared on each statistic: paired over seeds and documents "
    "where the two share a trained model (eval-time methods on one seed's weights), unpaired "
    "otherwise; a two-level bootstrap (seeds, then each seed's documents or trials) gives the "
    "standard error of the difference, a t test (seed-level n/(n-1) correction) its p, and "
    f"Benjamini-Hochberg at {FDR:.0%} over the block's pairs decides it "
    "(`bench/findings/comparisons.py`). A rank interval #a–b is [1 + the series decidedly "
    "better, N - the series decidedly worse] (decided comparisons closed transitively): two "
    "series whose intervals do not overlap have a decided comparison; series whose intervals "
    "overlap are not ordered. Lengths: the mean over seeds of log2(eff / L) as tokens, with "
    "the per-seed lengths; AUCs: the mean with its 95% interval. A series failing at L on some "
    "seed (passkey, RULER absolute: effective length 0) is not ranked on that statistic and "
    "shows its count. Overall: the rank interval of the block's primary statistic (the first "
    "of RULER AUC, passkey AUC, perplexity AUC it has), fixed before the ranks were computed. "
    f"{BAD_AT_L}: perplexity at L decidedly above {PPL_FLAT} x the block's best; such a series "
    "ranks below every series that is not, on the perplexity statistics and overall. "
    f"{RAW_FAILS_AT_L}: the raw model of its design fails at L on some seed. LongPPL is not "
    "ranked (its key tokens differ per window length; `bench/findings/leaderboard.py`)."
)


def _report_md(
    lb: Leaderboard, shown: pd.DataFrame, power: pd.DataFrame, maps: list[str], sources: str
) -> str:
    table = lb.table
    stats = shown_statistics(table)
    parts = [
        "# Leaderboard: which design and method keeps working past the training length",
        "",
        f"Generated by `lenbench-report --leaderboard` from {sources} (do not edit). " + PREAMBLE,
        "",
        "## Rules",
        "",
        *[f"- {STATISTICS[m].title}: {STATISTICS[m].rule}." for m in [*stats, AT_L]],
        *(
            [f"- RULER length (relative, shown, not ranked): {RULER_RELATIVE_RULE}."]
            if "ruler_rel_seeds" in table
            else []
        ),  # fmt: skip
        "",
        "## Ranked",
        "",
        markdown_table(shown),
        "",
        "## What each block shows",
        "",
    ]
    parts += [_block_paragraph(b, lb) + "\n" for _, b in table.groupby("recipe", sort=True)]
    parts += [
        "## Power",
        "",
        f"Per block and statistic: how many pairs and adjacent pairs (in the order of the means, "
        f"within a tier) are decided, the top {TOP} adjacent pairs among them, and for those "
        "undecided the seeds per series at which a t test at BH's next bar would decide them "
        "with 80% power, from the measured per-seed spread (tables/power.csv).",
        "",
        markdown_table(power),
        "",
        "## Heatmaps",
        "",
    ]
    parts += [f"![{m}](heatmaps/{m}.png)" for m in maps]
    return "\n".join(parts) + "\n"


def write_leaderboard(df: pd.DataFrame, out: Path, sources: str) -> Leaderboard:
    """Write ``out``/report.md, heatmaps/<statistic>.png, tables/leaderboard.csv,
    tables/comparisons.csv, tables/power.csv and index.html from the result rows ``df``; return
    the leaderboard (its table, comparisons and power)."""
    from bench.report.leaderboard_page import write_page

    rows = labelled(df)  # once: the table and the page's rows read the same keys
    lb = leaderboard(rows)
    table = lb.table
    if table.empty:
        raise ValueError("no series with a leaderboard metric (nll, passkey, RULER) here.")
    out.mkdir(parents=True, exist_ok=True)
    maps = [m for m in shown_statistics(table) if heatmap(table, m, out / "heatmaps" / f"{m}.png")]
    shown = display_table(table)
    power = power_table(lb, table)
    (out / "tables").mkdir(exist_ok=True)
    table.drop(columns=["series"]).to_csv(out / "tables" / "leaderboard.csv", index=False)
    _named_comparisons(lb, table).to_csv(
        out / "tables" / "comparisons.csv", index=False, float_format="%.4g"
    )
    power.to_csv(out / "tables" / "power.csv", index=False)
    (out / "report.md").write_text(_report_md(lb, shown, power, maps, sources))
    summary = [_block_paragraph(b, lb) for _, b in table.groupby("recipe", sort=True)]
    write_page(out / "index.html", table, shown, rows, maps, out / "heatmaps", summary, power)
    return lb


def _named_comparisons(lb: Leaderboard, table: pd.DataFrame) -> pd.DataFrame:
    """The comparisons decided directly (the closure's implied ones follow from them), the series
    as readers name them (design, method, fine-tune)."""
    if lb.comparisons.empty:
        return lb.comparisons
    names = {r.series: series_name(r) for r in table.itertuples()}
    labels = table.drop_duplicates("recipe").set_index("recipe")["recipe_label"]
    direct = lb.comparisons[lb.comparisons["direct"]]
    c = direct.assign(
        recipe=direct["recipe"].map(labels),
        better=direct["a"].map(names), worse=direct["b"].map(names),
    )  # fmt: skip
    cols = ["recipe", "statistic", "better", "worse", "diff", "se", "df", "paired", "p",
            "p_adj"]  # fmt: skip
    return c[cols].sort_values(["recipe", "statistic", "better", "worse"], kind="stable")
