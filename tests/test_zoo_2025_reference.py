"""The 2025 zoo's committed reference (results/zoo_2025, reports/zoo_2025): ``lenbench
+experiment=zoo_2025`` and its switch invocations.

As tests/test_zoo_reference.py does for the zoo: the Findings computed from the committed rows
equal the committed table (statuses and numbers), reports/zoo_2025/README.md states each of N1-N6's
statuses and its per-series perplexity ratios are the ones the rows give (to the digits printed; a
changed digit fails), and regenerating the report reproduces every committed table.
"""

from __future__ import annotations

import pytest

from bench import findings as F
from bench.findings import NOT_MEASURED

from fixtures import ROOT
from fixtures.markdown import markdown_table
from fixtures.reports import (
    assert_committed_findings,
    assert_ratio_cells,
    assert_report_regenerates,
    committed_rows,
)

RESULTS = ROOT / "results" / "zoo_2025"
REPORT = ROOT / "reports" / "zoo_2025"
#: the README's series: label -> (position, the model switch on or None, its value)
SERIES = {
    "rope": ("rope", None, None),
    "nope": ("nope", None, None),
    "fox": ("fox", None, None),
    "pope": ("pope", None, None),
    "rope +SSMax": ("rope", "attn_scale", "ssmax"),
    "rope +output gate": ("rope", "output_gate", "sigmoid"),
    "rope +QK-norm": ("rope", "qk_norm", "rms"),
    "nope +stick-breaking": ("nope", "attention", "stick_breaking"),
}
SWITCHES = ("attn_scale", "output_gate", "qk_norm", "attention")

pytestmark = pytest.mark.skipif(
    not any(RESULTS.glob("*.parquet")), reason="no committed zoo_2025 reference results"
)


def _rows(df, position, switch, value):
    rows = F.select(df, position)
    for column in SWITCHES:
        if column in rows.columns:
            on = rows[column]
            rows = rows[on == value] if column == switch else rows[on.isna()]
    return rows


def test_the_committed_zoo_2025_findings_are_what_the_rows_give():
    df = committed_rows(RESULTS)
    keys = tuple(f"N{i}" for i in range(1, 7))
    status = assert_committed_findings(df, REPORT, keys)
    assert all(status[k] != NOT_MEASURED for k in keys), status


def test_per_series_ratios_in_the_readme_are_the_rows():
    """ "| series | 2L | 4L | 8L | 4L per seed |": each "value [lo, hi]" is the ppl ratio of the
    raw series, each per-seed value exp(NLL(4L) - NLL(L)); a changed digit does not agree."""
    df = committed_rows(RESULTS)
    text = (REPORT / "README.md").read_text(encoding="utf-8")
    table = markdown_table(text, "| series | 2L | 4L | 8L |")
    assert set(table) == set(SERIES)
    checked = 0
    for label, (position, switch, value) in SERIES.items():
        ((_, rows),) = F.by_series(F.window_nll(_rows(df, position, switch, value)))
        checked += assert_ratio_cells(rows, label, table[label])
    assert checked == len(SERIES) * (9 + 3)


def test_regenerating_the_zoo_2025_report_reproduces_every_committed_table(tmp_path, monkeypatch):
    assert_report_regenerates("zoo_2025", tmp_path, monkeypatch)
