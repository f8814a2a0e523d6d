"""One report from a results table: number and label the rows, run every section, write report.md.

Sections run in report order, Findings (:mod:`bench.findings`) first; each writes its own
tables and figures and returns its Markdown.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from bench.core.results import load_results
from bench.core.rows import DOC_COLUMNS
from bench.report.figures import Style
from bench.report.frame import add_labels
from bench.report.markdown import ReportDir
from bench.report.sections.config import config_section
from bench.report.sections.findings import findings_section
from bench.report.sections.longppl import longppl_section
from bench.report.sections.nll import bucket_section, perplexity_section
from bench.report.sections.other import other_section
from bench.report.sections.passkey import passkey_section
from bench.report.sections.probes import probe_section
from bench.report.sections.ruler import ruler_section


def render(df: pd.DataFrame, results_paths: Sequence[str | Path], out_dir: str | Path) -> Path:
    """Write tables, plots and report.md for the (loaded, deduplicated) rows ``df`` under
    ``out_dir``, replacing an earlier report's tables and plots; return the path of report.md."""
    rep = ReportDir(Path(out_dir))
    rep.prepare()
    df = labelled_rows(df)
    style = Style(df)
    # per-document lists stay in the parquet rows: the table lists the rows, not their documents
    source = df.drop(columns=["series_rank", *[c for c in DOC_COLUMNS if c in df.columns]])
    source.to_csv(rep.tables_dir / "source_rows.csv", index=False)
    experiments = sorted(df["experiment"].unique())
    return rep.write_report(
        [
            f"# lenbench report: {', '.join(experiments)}",
            "Regenerated from stored result tables by `lenbench-report`. Every table below is also "
            "in `tables/` as CSV; each CSV row lists in `row_ids` the `row_id`s of "
            "`tables/source_rows.csv` it was computed from (`n_rows` of them). Aggregates are "
            "token-weighted means (weights `n`), seeds pooled.",
            findings_section(rep, df),
            config_section(df.drop(columns=["row_id"]), results_paths),
            perplexity_section(rep, df, style),
            longppl_section(rep, df),
            bucket_section(rep, df, style),
            passkey_section(rep, df, style),
            ruler_section(rep, df),
            probe_section(rep, df, style),
            other_section(rep, df),
        ]
    )


def labelled_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Loaded rows numbered (``row_id``) and labelled (:func:`add_labels`): what every section
    and figure reads."""
    df = df.reset_index(drop=True)
    df.insert(0, "row_id", np.arange(len(df)))
    return add_labels(df)


def generate_report(results_paths: str | Path | Sequence[str | Path], out_dir: str | Path) -> Path:
    """Load results from ``results_paths`` (dirs and/or parquet files), write tables, plots and
    report.md under ``out_dir``; return the path of report.md."""
    if isinstance(results_paths, (str, Path)):
        results_paths = [results_paths]
    df = load_results(results_paths)
    return render(df, list(results_paths), out_dir)
