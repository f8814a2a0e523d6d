"""The zoo's committed reference (results/zoo, reports/zoo): ``lenbench +experiment=zoo``.

As tests/test_reference.py does for the findings experiment: the Findings computed from the
committed rows equal the committed table (statuses and numbers), reports/zoo/README.md states
each status and its per-family perplexity ratios are the ones the rows give (to the digits
printed; a changed digit fails), and regenerating the report reproduces every committed table.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pandas as pd
import pytest

from bench.findings import NOT_MEASURED, check_findings, findings_table
from bench.results import load_results

from fixtures import ROOT
from fixtures.markdown import agrees, markdown_table
from fixtures.reports import assert_report_regenerates

RESULTS = ROOT / "results" / "zoo"
REPORT = ROOT / "reports" / "zoo"
NUMBERS = REPORT / "README.md"
#: every family of +experiment=zoo
FAMILIES = (
    "sinusoidal", "learned", "rope", "alibi", "nope", "t5", "kerple_log", "kerple_power",
    "fire", "sandwich", "p_rope", "xpos", "cope",
)  # fmt: skip
NUMBER = r"-?\d+\.\d+"

pytestmark = pytest.mark.skipif(
    not any(RESULTS.glob("*.parquet")), reason="no committed zoo reference results"
)


@functools.cache
def _rows():
    from bench import findings as F

    return F, F._with_series(load_results(RESULTS))


def test_the_committed_zoo_findings_are_what_the_rows_give():
    _, df = _rows()
    computed = findings_table(check_findings(df))
    committed = pd.read_csv(REPORT / "tables" / "findings.csv")
    for column in ("finding", "status", "numbers"):
        assert list(computed[column]) == list(committed[column]), column
    status = dict(zip(committed["finding"], committed["status"], strict=True))
    # every family ran: the zoo's findings are measured
    assert status["Z1"] != NOT_MEASURED and status["Z2"] != NOT_MEASURED, status
    assert set(df["position"]) == set(FAMILIES)
    text = NUMBERS.read_text(encoding="utf-8")
    for key in ("Z1", "Z2", "F1", "F2", "F6"):
        assert f"| {key} | {status[key]} |" in text, key


def test_per_family_ratios_in_the_readme_are_the_rows():
    """ "| family | 2L | 4L | 8L | 4L per seed |": each "value [lo, hi]" is the findings' ppl
    ratio of the raw series, each per-seed value exp(NLL(4L) - NLL(L)) of that seed; negative
    control: a changed digit does not agree."""
    F, df = _rows()
    table = markdown_table(NUMBERS.read_text(encoding="utf-8"), "| family | 2L | 4L | 8L |")
    assert set(table) == set(FAMILIES)
    pattern = re.compile(rf"({NUMBER}) \[({NUMBER}), ({NUMBER})\]")
    checked = 0
    for family, cells in table.items():
        ((_, rows),) = F.by_series(F._window_nll(F.select(df, family)))
        for k, cell in zip((2, 4, 8), cells[:3], strict=True):
            e = F.ppl_ratio(rows, family, k)
            ((value, lo, hi),) = pattern.findall(cell)
            for printed, v in ((value, e.value), (lo, e.lo), (hi, e.hi)):
                assert agrees(printed, v), (family, k, printed, v)
                checked += 1
        m = F._per_seed(rows, 4).merge(F._per_seed(rows, 1), on="seed")
        per_seed = np.exp(m["value_x"] - m["value_y"])
        for printed, v in zip(cells[3].split(" / "), per_seed, strict=True):
            assert agrees(printed, v), (family, printed, v)
            changed = printed[:-1] + str((int(printed[-1]) + 3) % 10)
            assert not agrees(changed, v)
            checked += 1
    assert checked == len(FAMILIES) * (9 + 3)


def test_regenerating_the_zoo_report_reproduces_every_committed_table(tmp_path, monkeypatch):
    assert_report_regenerates("zoo", tmp_path, monkeypatch)
