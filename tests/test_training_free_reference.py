"""The training-free study's committed reference (results/training_free, reports/training_free).

As tests/test_zoo_reference.py does for the zoo: the Findings computed from the committed rows
equal the committed table, reports/training_free/README.md states each status, its per-method
perplexity ratios and passkey accuracies are the ones the rows give (to the digits printed; a
changed digit fails), and regenerating the report reproduces every committed table.
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

RESULTS = ROOT / "results" / "training_free"
REPORT = ROOT / "reports" / "training_free"
NUMBERS = REPORT / "README.md"
#: every scaling of +experiment=training_free
METHODS = ("none", "linear", "ntk", "yarn", "self_extend", "rerope", "leaky_rerope", "streaming")
NUMBER = r"-?\d+\.\d+"

pytestmark = pytest.mark.skipif(
    not any(RESULTS.glob("*.parquet")), reason="no committed training-free reference results"
)


@functools.cache
def _rows():
    from bench import findings as F

    return F, F._with_series(load_results(RESULTS))


def _changed(printed: str) -> str:
    return printed[:-1] + str((int(printed[-1]) + 3) % 10)


def test_the_committed_findings_are_what_the_rows_give():
    _, df = _rows()
    computed = findings_table(check_findings(df))
    committed = pd.read_csv(REPORT / "tables" / "findings.csv")
    for column in ("finding", "status", "numbers"):
        assert list(computed[column]) == list(committed[column]), column
    status = dict(zip(committed["finding"], committed["status"], strict=True))
    assert all(status[k] != NOT_MEASURED for k in ("T1", "T2", "T3")), status
    assert set(df["scaling"]) >= set(METHODS)
    text = NUMBERS.read_text(encoding="utf-8")
    for key in ("T1", "T2", "T3", "F3", "F5"):
        assert f"| {key} | {status[key]} |" in text, key


def test_per_method_ratios_in_the_readme_are_the_rows():
    """ "| method | params | 2L | 4L | 8L | 4L per seed |": each "value [lo, hi]" is the findings'
    ppl ratio of that scaling's LM-arm series, each per-seed value exp(NLL(4L) - NLL(L))."""
    F, df = _rows()
    table = markdown_table(NUMBERS.read_text(encoding="utf-8"), "| method | params | 2L |")
    assert set(table) == set(METHODS)
    pattern = re.compile(rf"({NUMBER}) \[({NUMBER}), ({NUMBER})\]")
    checked = 0
    for method, cells in table.items():
        ((_, rows),) = F.by_series(F._window_nll(F.select(df, "rope", method)))
        for k, cell in zip((2, 4, 8), cells[1:4], strict=True):
            e = F.ppl_ratio(rows, method, k)
            ((value, lo, hi),) = pattern.findall(cell)
            for printed, v in ((value, e.value), (lo, e.lo), (hi, e.hi)):
                assert agrees(printed, v), (method, k, printed, v)
                checked += 1
        m = F._per_seed(rows, 4).merge(F._per_seed(rows, 1), on="seed")
        per_seed = np.exp(m["value_x"] - m["value_y"])
        for printed, v in zip(cells[4].split(" / "), per_seed, strict=True):
            assert agrees(printed, v) and not agrees(_changed(printed), v), (method, printed, v)
            checked += 1
    assert checked == len(METHODS) * (9 + 3)


def test_passkey_accuracies_in_the_readme_are_the_rows():
    """ "| method | L | 2L | 4L |": the pooled accuracy over the seeds with its interval, per
    zero-shot scaling of the retrieval arm and for the YaRN fine-tune after its last update."""
    F, df = _rows()
    table = markdown_table(NUMBERS.read_text(encoding="utf-8"), "| method | L | 2L | 4L |")
    assert set(table) == {*METHODS, "yarn fine-tuned"}
    pattern = re.compile(rf"({NUMBER}) \[({NUMBER}), ({NUMBER})\]")
    for method, cells in table.items():
        if method == "yarn fine-tuned":
            rows = F.select(df, "rope", None, tuned="yarn")
            rows = rows[rows["finetune_steps"] == rows["finetune_steps"].max()]
        else:
            rows = F.select(df, "rope", method)
        passkey = F._passkey(rows)
        for k, cell in zip((1, 2, 4), cells, strict=True):
            e = F.accuracy_estimate(F._at(passkey, k), method)
            ((value, lo, hi),) = pattern.findall(cell)
            for printed, v in ((value, e.value), (lo, e.lo), (hi, e.hi)):
                assert agrees(printed, v), (method, k, printed, v)


def test_regenerating_the_report_reproduces_every_committed_table(tmp_path, monkeypatch):
    assert_report_regenerates("training_free", tmp_path, monkeypatch)
