"""The zoo's committed reference (results/zoo, reports/zoo): ``lenbench +experiment=zoo``.

As tests/test_reference.py does for the findings experiment: the Findings computed from the
committed rows equal the committed table (statuses and numbers), reports/zoo/README.md states
each status and its per-family perplexity ratios are the ones the rows give (to the digits
printed; a changed digit fails), and regenerating the report reproduces every committed table.
"""

from __future__ import annotations

import pytest

from bench import findings as F
from bench.findings import NOT_MEASURED

from fixtures import ROOT
from fixtures.markdown import markdown_table
from fixtures.reports import (
    CONFIRM,
    assert_committed_findings,
    assert_outcome_paragraph,
    assert_ratio_cells,
    assert_report_regenerates,
    committed_rows,
)

RESULTS = ROOT / "results" / "zoo"
REPORT = ROOT / "reports" / "zoo"
#: every family of +experiment=zoo
FAMILIES = (
    "sinusoidal", "learned", "rope", "alibi", "nope", "t5", "kerple_log", "kerple_power",
    "fire", "sandwich", "p_rope", "xpos", "cope",
)  # fmt: skip

pytestmark = pytest.mark.skipif(
    not any(RESULTS.glob("*.parquet")), reason="no committed zoo reference results"
)


def test_the_committed_zoo_findings_are_what_the_rows_give():
    df = committed_rows(RESULTS)
    status = assert_committed_findings(df, REPORT, ("Z1", "Z2", "F1", "F2", "F6"))
    # every family ran: the zoo's findings are measured
    assert status["Z1"] != NOT_MEASURED and status["Z2"] != NOT_MEASURED, status
    assert set(df["position"]) == set(FAMILIES)


def test_per_family_ratios_in_the_readme_are_the_rows():
    """ "| family | 2L | 4L | 8L | 4L per seed |": each "value [lo, hi]" is the findings' ppl
    ratio of the raw series, each per-seed value exp(NLL(4L) - NLL(L)) of that seed; negative
    control: a changed digit does not agree."""
    df = committed_rows(RESULTS)
    text = (REPORT / "README.md").read_text(encoding="utf-8")
    table = markdown_table(text, "| family | 2L | 4L | 8L |")
    assert set(table) == set(FAMILIES)
    checked = 0
    for family, cells in table.items():
        ((_, rows),) = F.by_series(F.window_nll(F.select(df, family)))
        checked += assert_ratio_cells(rows, family, cells)
    assert checked == len(FAMILIES) * (9 + 3)


def test_regenerating_the_zoo_report_reproduces_every_committed_table(tmp_path, monkeypatch):
    assert_report_regenerates("zoo", tmp_path, monkeypatch)


@pytest.mark.skipif(not any(CONFIRM.glob("*.parquet")), reason="no committed confirmation rows")
def test_the_confirmation_outcome_is_its_rows():
    """Z2's undecided contrast (T5 against raw RoPE) on the 12 new seeds of results/confirm:
    the printed ratio of ratios is the rows' (Z2 as a whole is not measured there: no
    sinusoidal or other bias families), and its interval lies below 1."""
    text = (REPORT / "README.md").read_text(encoding="utf-8")
    assert assert_outcome_paragraph(text, CONFIRM, "Z2", NOT_MEASURED, least=1) == 1
    (result,) = [r for r in F.check_findings(committed_rows(CONFIRM)) if r.key == "Z2"]
    (t5,) = [e for e in result.estimates if e.name.startswith("t5/rope")]
    assert t5.n_seeds == 12 and t5.hi < 1
