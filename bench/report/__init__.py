"""``lenbench-report``: summary tables, plots and ``report.md`` from stored result tables.

Reads result parquet files (see :mod:`bench.core.results`), never a model: regenerating a report needs
no torch and no recomputation. Stage 6 of ``bench``: may import ``core``, ``tasks`` (task facts
for captions) and ``findings``.

Output layout (``out_dir``)::

    report.md               figures with captions, summary tables, configuration summary
    tables/<name>.csv       long summary tables; each row has ``n_rows`` and ``row_ids``
    tables/<name>.md        the same table as a Markdown pivot (as shown in report.md)
    tables/source_rows.csv  every (deduplicated) input row with its ``row_id``
    plots/<name>.png|.svg   figures

Traceability: the ``row_ids`` column of every CSV table lists (``;``-separated) the ``row_id``s in
``source_rows.csv`` that the row was computed from; ``n_rows`` is their count. Aggregated values
are token-weighted means (weights ``n``) over those rows, pooling seeds.
"""

from bench.report.cli import latest_experiment_dir, main
from bench.report.markdown import markdown_table
from bench.report.render import generate_report, render

__all__ = ["generate_report", "latest_experiment_dir", "main", "markdown_table", "render"]
