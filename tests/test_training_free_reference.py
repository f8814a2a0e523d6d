"""The training-free study's committed reference (results/training_free, reports/training_free).

As tests/test_zoo_reference.py does for the zoo: the Findings computed from the committed rows
equal the committed table, reports/training_free/README.md states each status, its per-method
perplexity ratios and passkey accuracies are the ones the rows give (to the digits printed; a
changed digit fails), and regenerating the report reproduces every committed table.
"""

from __future__ import annotations

import pytest

from bench import findings as F
from bench.findings import NOT_MEASURED

from fixtures import ROOT
from fixtures.markdown import agrees, markdown_table
from fixtures.reports import (
    ESTIMATE,
    assert_committed_findings,
    assert_ratio_cells,
    assert_report_regenerates,
    committed_rows,
)

RESULTS = ROOT / "results" / "training_free"
REPORT = ROOT / "reports" / "training_free"
NUMBERS = REPORT / "README.md"
#: every scaling of +experiment=training_free
METHODS = ("none", "linear", "ntk", "yarn", "self_extend", "rerope", "leaky_rerope", "streaming")

pytestmark = pytest.mark.skipif(
    not any(RESULTS.glob("*.parquet")), reason="no committed training-free reference results"
)


def test_the_committed_findings_are_what_the_rows_give():
    df = committed_rows(RESULTS)
    status = assert_committed_findings(df, REPORT, ("T1", "T2", "T3", "F3", "F5"))
    assert all(status[k] != NOT_MEASURED for k in ("T1", "T2", "T3")), status
    assert set(df["scaling"]) >= set(METHODS)


def test_per_method_ratios_in_the_readme_are_the_rows():
    """ "| method | params | 2L | 4L | 8L | 4L per seed |": each "value [lo, hi]" is the findings'
    ppl ratio of that scaling's LM-arm series, each per-seed value exp(NLL(4L) - NLL(L))."""
    df = committed_rows(RESULTS)
    table = markdown_table(NUMBERS.read_text(encoding="utf-8"), "| method | params | 2L |")
    assert set(table) == set(METHODS)
    checked = 0
    for method, cells in table.items():
        ((_, rows),) = F.by_series(F.window_nll(F.select(df, "rope", method)))
        checked += assert_ratio_cells(rows, method, cells[1:])
    assert checked == len(METHODS) * (9 + 3)


def test_passkey_accuracies_in_the_readme_are_the_rows():
    """ "| method | L | 2L | 4L |": the pooled accuracy over the seeds with its interval, per
    zero-shot scaling of the retrieval arm and for the YaRN fine-tune after its last update."""
    df = committed_rows(RESULTS)
    table = markdown_table(NUMBERS.read_text(encoding="utf-8"), "| method | L | 2L | 4L |")
    assert set(table) == {*METHODS, "yarn fine-tuned"}
    for method, cells in table.items():
        if method == "yarn fine-tuned":
            rows = F.select(df, "rope", None, tuned="yarn")
            rows = rows[rows["finetune_steps"] == rows["finetune_steps"].max()]
        else:
            rows = F.select(df, "rope", method)
        passkey = F.passkey(rows)
        for k, cell in zip((1, 2, 4), cells, strict=True):
            e = F.accuracy_estimate(F.at(passkey, k), method)
            ((value, lo, hi),) = ESTIMATE.findall(cell)
            for printed, v in ((value, e.value), (lo, e.lo), (hi, e.hi)):
                assert agrees(printed, v), (method, k, printed, v)


def test_regenerating_the_report_reproduces_every_committed_table(tmp_path, monkeypatch):
    assert_report_regenerates("training_free", tmp_path, monkeypatch)
