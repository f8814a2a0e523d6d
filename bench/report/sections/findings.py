"""The Findings section, first in the report: which of the field's known results these rows
reproduce (:mod:`bench.findings`), as a table, ``tables/findings.csv`` and a small figure of the
perplexity ratio at 4L vs L per position family (raw, zero-shot), the number behind F1-F3.
"""

from __future__ import annotations

import math

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from bench.findings import (
    ALIBI_MAX_RATIO,
    FAILS,
    FAR,
    HOLDS,
    NOT_DECIDED,
    NOT_MEASURED,
    check_findings,
    findings_table,
    out_of_scope,
    ppl_ratios,
    select,
)
from bench.report.family_panels import family_order
from bench.report.figures import save_figure
from bench.report.markdown import ReportDir, figure_md, markdown_table


def _ratio_figure(rep: ReportDir, df: pd.DataFrame) -> bool:
    """Plot ppl(4L)/ppl(L) with its CI per position and series (raw); False (nothing written) if
    none."""
    positions = family_order(df["position"]) if "position" in df.columns else []
    estimates = [e for pos in positions for _, e in ppl_ratios(select(df, pos), pos)]
    if not estimates:
        return False
    # wider with more families (the zoo has 13), so that every label stays readable
    fig = Figure(figsize=(max(5.5, 0.6 * len(estimates) + 1.5), 3.2), layout="constrained")
    ax = fig.add_subplot()
    for i, e in enumerate(estimates):
        if not math.isnan(e.lo):
            ax.plot([i, i], [e.lo, e.hi], color="0.3", linewidth=2)
        ax.plot([i], [e.value], "o", color="C0")
    ax.axhline(1.0, color="0.5", linewidth=1, label="1 = no degradation")
    ax.axhline(
        ALIBI_MAX_RATIO,
        color="0.5",
        linewidth=1,
        linestyle=":",
        label=f"F2 tolerance {ALIBI_MAX_RATIO}",
    )
    values = [v for e in estimates for v in (e.value, e.lo, e.hi) if v > 0 and not math.isnan(v)]
    if values and max(values) / min(values) > 10:  # one family far off must not flatten the rest
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _p: f"{y:g}"))
        ax.set_ylabel(f"perplexity at {FAR}L / at L (log scale)")
    else:
        ax.set_ylabel(f"perplexity at {FAR}L / at L")
    ax.legend(fontsize=7, loc="best", frameon=False)
    many = len(estimates) > 8  # the zoo: slanted labels, or neighbours overlap
    ax.set_xticks(
        range(len(estimates)),
        [f"{e.name}\n({e.n_seeds} seed{'s' * (e.n_seeds != 1)})" for e in estimates],
        rotation=30 if many else 0,
        ha="right" if many else "center",
        fontsize=8 if many else None,
    )
    ax.set_xlim(-0.5, len(estimates) - 0.5)
    ax.set_title(f"Raw extrapolation to {FAR}x the training length")
    save_figure(fig, rep.plots_dir, "findings")
    return True


def findings_section(rep: ReportDir, df: pd.DataFrame) -> str:
    results = check_findings(df)
    outside = out_of_scope(df)
    table = findings_table(results)
    table.to_csv(rep.tables_dir / "findings.csv", index=False)
    counts = table["status"].value_counts()
    summary = "; ".join(
        f"{s}: {counts.get(s, 0)}" for s in (HOLDS, FAILS, NOT_DECIDED, NOT_MEASURED)
    )
    text = [
        "## Findings",
        f"The field's known qualitative results checked on these rows ({summary}); "
        "`lenbench-report --check` prints this table and exits 1 if a measured finding does not "
        "hold. A finding whose rows are absent is not measured; one whose interval straddles its "
        "threshold is not decided. Each series (one model configuration under one scaling; "
        "seeds are its replicates) is checked and reported on its own. Numbers: point estimate "
        "[95% CI] (seeds); ratios and NLLs use whole-window `nll` rows of models that were not "
        "fine-tuned (raw = scaling none), CIs across seeds (mean ± t-interval), a ratio's "
        "widened to its seed x document bootstrap where that is wider, or, with one seed, from "
        "the run's stored bootstrap CIs; passkey accuracies carry Wilson intervals of their "
        "trials, widened to the seeds' t-interval where wider (each estimate's interval rule: "
        "column `ci` of `tables/findings.csv`). Thresholds are fixed constants in each study module of `bench/findings/` (listed in `reports/FINDINGS.md`). "
        "Each finding is checked only on the series it is about (its declared scope: "
        "`bench.findings.Scope`). Source: `tables/findings.csv`.",
        markdown_table(table.drop(columns=["ci"])),
    ]
    if outside:
        text.append(f"Not about these rows (none of their series here): {', '.join(outside)}.")
    if _ratio_figure(rep, df):
        text.append(
            figure_md(
                "findings",
                f"Perplexity at {FAR}x the training length divided by perplexity at the training "
                "length, per position family without scaling (dot: estimate; bar: 95% CI). Above "
                f"the solid line at 1 = degrades (F1, F3); the dotted line is F2's tolerance "
                f"({ALIBI_MAX_RATIO}) for ALiBi.",
            )
        )
    return "\n\n".join(text)
