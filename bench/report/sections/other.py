"""The catch-all table for metrics that no dedicated section shows (any name outside
:data:`bench.core.rows.ROW_METRICS`), so a new metric appears in the report before it has a figure."""

from __future__ import annotations

import pandas as pd

from bench.core.rows import ROW_METRICS
from bench.report.frame import GROUP_KEYS, aggregate, sort_series
from bench.report.markdown import ReportDir, write_table


def other_section(rep: ReportDir, df: pd.DataFrame) -> str:
    rows = df[~df["metric"].isin(ROW_METRICS)]
    if "task" in rows.columns:  # RULER rows have their own section
        rows = rows[rows["task"].isna()]
    if rows.empty:
        return ""
    keys = [
        *GROUP_KEYS,
        "metric",
        "eval_length",
        "axis",
        "axis_value",
        "layer",
        "bucket_lo",
        "bucket_hi",
    ]
    t = sort_series(aggregate(rows, keys), ["metric", "eval_length"])
    shown = t[
        [
            "metric",
            "series",
            "eval_length",
            "axis",
            "axis_value",
            "layer",
            "bucket_lo",
            "bucket_hi",
            "value",
            "n_rows",
        ]
    ]
    md = write_table(rep, "other_metrics", t, shown, index=False)
    return (
        "## Other metrics\n\nMetrics without a dedicated figure. Source: `tables/other_metrics.csv`.\n\n"
        + md
    )
