"""Markdown and CSV output: the report folder, table rendering and traceable table files.

Every summary table is written twice: ``tables/<name>.csv`` in long form with ``n_rows`` and
``row_ids`` (the ``source_rows.csv`` rows it came from) and ``tables/<name>.md``, the pivot shown
in report.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class ReportDir:
    """The output folder: ``report.md``, ``tables/`` and ``plots/``."""

    out_dir: Path

    @property
    def tables_dir(self) -> Path:
        return self.out_dir / "tables"

    @property
    def plots_dir(self) -> Path:
        return self.out_dir / "plots"

    def prepare(self) -> None:
        """Create the folders and remove the tables and plots of an earlier report."""
        for directory, suffixes in (
            (self.tables_dir, (".csv", ".md")),
            (self.plots_dir, (".png", ".svg")),
        ):
            directory.mkdir(parents=True, exist_ok=True)
            for f in directory.iterdir():
                if f.is_file() and f.suffix in suffixes:
                    f.unlink()

    def write_report(self, sections: Sequence[str]) -> Path:
        """Write report.md from its (non-empty) sections; return its path."""
        report = self.out_dir / "report.md"
        report.write_text("\n\n".join(s for s in sections if s) + "\n", encoding="utf-8")
        return report


def _fmt(v: object) -> str:
    if v is None or v is pd.NA:
        return "–"
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        x = float(v)
        if math.isnan(x):
            return "–"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        if x.is_integer() and abs(x) < 1e6:
            return str(int(x))
        return f"{x:.3e}" if abs(x) >= 1e4 or abs(x) < 1e-3 else f"{x:.4g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(df: pd.DataFrame, index: bool = False) -> str:
    """Render ``df`` as a GitHub-flavoured Markdown table (numbers right-aligned)."""
    if index:
        df = df.reset_index()
    cols = [str(c) for c in df.columns]
    numeric = [pd.api.types.is_numeric_dtype(df[c]) for c in df.columns]
    lines = [
        "| " + " | ".join(c.replace("|", "\\|") for c in cols) + " |",
        "|" + "|".join("---:" if n else ":---" for n in numeric) + "|",
    ]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_fmt(v) for v in row) + " |")
    return "\n".join(lines)


def write_table(
    rep: ReportDir, name: str, long: pd.DataFrame, shown: pd.DataFrame, index: bool
) -> str:
    """Write tables/<name>.csv (long, traceable) and tables/<name>.md; return the Markdown."""
    drop = [c for c in ("series_rank",) if c in long.columns]
    long.drop(columns=drop).to_csv(rep.tables_dir / f"{name}.csv", index=False)
    md = markdown_table(shown, index=index)
    (rep.tables_dir / f"{name}.md").write_text(md + "\n", encoding="utf-8")
    return md


def figure_md(name: str, caption: str) -> str:
    """A figure (PNG, with a link to its SVG) and its caption."""
    return f"![{name}](plots/{name}.png)\n\n*{caption}* ([SVG](plots/{name}.svg))"


def note(metric: str, consequence: str) -> str:
    """The line shown instead of a table or figure whose metric has no rows."""
    return f"> Note: no `{metric}` rows in these results, so {consequence}."
