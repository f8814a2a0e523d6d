"""Findings R1 and R2 on synthetic rows: each holds, fails, is not decided or not measured when
the rows say so (every check has its negative)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from scipy import stats

from bench.findings import FAILS, HOLDS, NOT_DECIDED, NOT_MEASURED, check_findings, findings, wilson
from bench.findings_ruler import (
    difference_of_accuracies,
    flat_length,
    r1_multi_needle_harder,
    r2_effective_below_flat,
)
from bench.results import normalize_results

from fixtures.rows import row

L = 256
SEEDS = (4, 5, 6)


def task_row(task: str, length: int, acc: float, seed: int, n: int = 40, **over) -> dict:
    return row(experiment="ruler", run_id=f"r{seed}", model_id=f"m{seed}", train_length=L,
               eval_length=length, metric=task, value=acc, n=n, seed=seed, axis="score",
               axis_value="exact", task=task, task_params="{}", **over)  # fmt: skip


def r1_rows(single: float, multikey: float, multivalue: float) -> pd.DataFrame:
    rows = []
    for seed in SEEDS:
        for length in (L, 2 * L, 4 * L):
            for task, acc in (("niah_single", single), ("niah_multikey", multikey),
                              ("niah_multivalue", multivalue)):  # fmt: skip
                rows.append(task_row(task, length, acc, seed))
    return normalize_results(rows)


def test_r1_holds_fails_and_is_undecided_as_the_rows_say():
    assert r1_multi_needle_harder(r1_rows(0.9, 0.3, 0.2)).status == HOLDS
    assert r1_multi_needle_harder(r1_rows(0.3, 0.9, 0.9)).status == FAILS
    assert r1_multi_needle_harder(r1_rows(0.5, 0.45, 0.45)).status == NOT_DECIDED
    # a missing task at a length: not measured
    df = r1_rows(0.9, 0.3, 0.2)
    df = df[~((df["metric"] == "niah_multivalue") & (df["eval_length"] == 4 * L))]
    assert r1_multi_needle_harder(df).status == NOT_MEASURED
    assert r1_multi_needle_harder(normalize_results([row()])).status == NOT_MEASURED


def test_newcombe_interval_by_hand():
    """One seed: Newcombe's hybrid interval from the two Wilson intervals, hand-computed."""
    a = pd.DataFrame({"k": [30.0], "n": [40.0]}, index=[0])
    b = pd.DataFrame({"k": [10.0], "n": [40.0]}, index=[0])
    e = difference_of_accuracies(a, b, "d")
    (la, ua), (lb, ub) = wilson(30, 40), wilson(10, 40)
    assert e.value == pytest.approx(0.5)
    assert e.lo == pytest.approx(0.5 - math.sqrt((0.75 - la) ** 2 + (ub - 0.25) ** 2))
    assert e.hi == pytest.approx(0.5 + math.sqrt((ua - 0.75) ** 2 + (0.25 - lb) ** 2))
    # three seeds that disagree: the seeds' t-interval is wider and is used
    a3 = pd.DataFrame({"k": [40.0, 0.0, 40.0], "n": [40.0] * 3})
    b3 = pd.DataFrame({"k": [0.0, 40.0, 0.0], "n": [40.0] * 3})
    e3 = difference_of_accuracies(a3, b3, "d")
    d = pd.Series([1.0, -1.0, 1.0])
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
    assert e3.lo == pytest.approx(d.mean() - half) and e3.hi == pytest.approx(d.mean() + half)


def r2_rows(effective: dict[int, int], nll: dict[int, float], scaling: str = "yarn") -> list:
    rows = []
    for seed in SEEDS:
        common = dict(run_id=f"r{seed}-{scaling}", model_id=f"m{seed}", seed=seed, train_length=L,
                      scaling=scaling, experiment="ruler")  # fmt: skip
        value = effective[seed]
        rows.append(row(metric="effective_length", value=value, eval_length=value, n=3,
                        axis="relative_threshold", axis_value=0.85, task="average",
                        task_params="{}", **common))  # fmt: skip
        for length, v in nll.items():
            rows.append(row(metric="nll", value=v, eval_length=length, n=1000, **common))
    return rows


def test_r2_holds_fails_and_is_undecided_as_the_rows_say():
    flat = {L: 2.0, 2 * L: 2.01, 4 * L: 2.015}  # ppl ratio 1.015 at 4L: flat to 4L
    below = r2_rows(dict.fromkeys(SEEDS, 2 * L), flat)
    assert r2_effective_below_flat(normalize_results(below)).status == HOLDS
    equal = r2_rows(dict.fromkeys(SEEDS, 4 * L), flat)
    assert r2_effective_below_flat(normalize_results(equal)).status == FAILS
    mixed = r2_rows({4: 2 * L, 5: 4 * L, 6: 4 * L}, flat)
    assert r2_effective_below_flat(normalize_results(mixed)).status == NOT_DECIDED
    # perplexity not flat beyond L: the claim cannot show there, so nothing is checked
    steep = r2_rows(dict.fromkeys(SEEDS, 0), {L: 2.0, 2 * L: 2.5, 4 * L: 3.0}, scaling="none")
    assert r2_effective_below_flat(normalize_results(steep)).status == NOT_MEASURED
    both = normalize_results(steep + below)
    result = r2_effective_below_flat(both)
    assert result.status == HOLDS and len(result.estimates) == 4  # both series reported


def test_flat_length():
    rows = pd.DataFrame({"eval_length": [L, 2 * L, 4 * L], "value": [2.0, 2.01, 2.1],
                         "train_length": L})  # fmt: skip
    assert flat_length(rows) == 2 * L  # exp(0.1) = 1.105 > 1.02 at 4L
    assert flat_length(rows[rows["eval_length"] > L]) is None


def test_r1_r2_are_registered():
    keys = {r.key for r in check_findings(r1_rows(0.9, 0.3, 0.2))}
    assert "R1" in keys  # R2 reads effective_length rows, which these rows lack
    assert {"R1", "R2"} <= set(findings())
