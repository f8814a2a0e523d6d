"""The configuration section: what the report was computed from (experiments, files, models,
corpus fingerprints, code versions, row counts per metric)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from bench.report.frame import params_text
from bench.report.markdown import markdown_table


def config_section(df: pd.DataFrame, paths: Sequence[str | Path]) -> str:
    def distinct(cols: list[str], fmt: Callable[[tuple], str]) -> str:
        vals = df[cols].drop_duplicates().itertuples(index=False, name=None)
        return "; ".join(sorted(fmt(v) for v in vals))

    def named(v: tuple) -> str:
        text = params_text(v[1])
        return f"{v[0]} ({text})" if text else str(v[0])

    metrics = df.groupby("metric").size()
    rows = [
        ("experiment(s)", ", ".join(sorted(df["experiment"].unique()))),
        ("results paths", ", ".join(f"`{p}`" for p in paths)),
        (
            "rows / files",
            f"{len(df)} rows (after dedup) from {df['source_file'].nunique()} file(s)",
        ),
        (
            "written",
            f"{df['written_at'].min():%Y-%m-%d %H:%M:%S} to {df['written_at'].max():%Y-%m-%d %H:%M:%S} UTC",
        ),
        ("positions", distinct(["position", "position_params"], named)),
        ("scalings", distinct(["scaling", "scaling_params"], named)),
        ("train lengths", ", ".join(str(v) for v in sorted(df["train_length"].unique()))),
        # rows measured at no length (passkey_context, harness scores) carry eval_length 0
        ("eval lengths", ", ".join(str(v) for v in sorted(df["eval_length"].unique()) if v > 0)),
        ("seeds", ", ".join(str(v) for v in sorted(df["seed"].unique()))),
        ("models", f"{df['model_id'].nunique()} distinct model_id"),
        ("code versions", ", ".join(sorted(df["code_version"].unique()))),
        (
            "corpus (fingerprint)",
            distinct(["corpus", "corpus_fingerprint"], lambda v: f"{v[0]} (`{v[1]}`)"),
        ),
        ("metrics (rows)", ", ".join(f"{m} ({c})" for m, c in metrics.items())),
    ]
    table = pd.DataFrame(rows, columns=["setting", "values"])
    return "## Configuration\n\n" + markdown_table(table)
