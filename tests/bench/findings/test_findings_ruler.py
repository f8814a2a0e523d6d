"""Findings R1 and R2 on synthetic rows: each holds, fails, is not decided or not measured when
the rows say so (every check has its negative)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from bench.core.rows import normalize_results
from bench.findings import FAILS, HOLDS, NOT_DECIDED, NOT_MEASURED, check_findings, findings, wilson
from bench.findings.ruler import (
    JEFFREYS_DRAWS,
    difference_of_accuracies,
    exact_trials,
    flat_length,
    r1_multi_needle_harder,
    r2_effective_below_flat,
    relative_drop_difference,
)

from fixtures.rows import row

L = 256
SEEDS = (4, 5, 6)


def task_row(task: str, length: int, acc: float, seed: int, n: int = 40, **over) -> dict:
    return row(experiment="ruler", run_id=f"r{seed}", model_id=f"m{seed}", train_length=L,
               eval_length=length, metric=task, value=acc, n=n, seed=seed, axis="score",
               axis_value="exact", task=task, task_params="{}", **over)  # fmt: skip


def r1_rows(at_l: tuple[float, float, float], beyond: tuple[float, float, float]) -> pd.DataFrame:
    """niah_single, niah_multikey, niah_multivalue: exact accuracy at L, and at 2L and 4L."""
    rows = []
    for seed in SEEDS:
        for length in (L, 2 * L, 4 * L):
            accs = at_l if length == L else beyond
            for task, acc in zip(("niah_single", "niah_multikey", "niah_multivalue"), accs,
                                 strict=True):  # fmt: skip
                rows.append(task_row(task, length, acc, seed))
    return normalize_results(rows)


def test_r1_holds_fails_and_is_undecided_as_the_rows_say():
    # multi-needle drops 0.7, single 0.1: a length effect
    assert r1_multi_needle_harder(r1_rows((1.0, 0.9, 0.9), (0.9, 0.2, 0.2))).status == HOLDS
    # single drops, the multi-needle tasks hold: the opposite
    assert r1_multi_needle_harder(r1_rows((1.0, 0.9, 0.9), (0.1, 0.85, 0.85))).status == FAILS
    # equal drops
    undecided = r1_rows((1.0, 0.9, 0.9), (0.5, 0.4, 0.4))
    assert r1_multi_needle_harder(undecided).status == NOT_DECIDED
    # a missing task at a length: not measured
    df = r1_rows((1.0, 0.9, 0.9), (0.9, 0.2, 0.2))
    df = df[~((df["metric"] == "niah_multivalue") & (df["eval_length"] == 4 * L))]
    assert r1_multi_needle_harder(df).status == NOT_MEASURED
    assert r1_multi_needle_harder(normalize_results([row()])).status == NOT_MEASURED


def test_r1_reads_a_failure_at_l_as_its_own_observation():
    """The audit's case: multi-value scores 0 at L and beyond (a method that breaks ordered
    multi-item answers at any length). The old R1 (single minus multi-value at each length
    beyond L) read it as "harder beyond L"; a difference of drops does not compare it, and the
    result names it as failing at L. Multi-key drops like single: not decided."""
    df = r1_rows((1.0, 0.9, 0.0), (0.6, 0.5, 0.0))
    result = r1_multi_needle_harder(df)
    assert result.status == NOT_DECIDED
    assert "fails at L" in result.numbers and "niah_multivalue" in result.numbers
    assert not any("niah_multivalue drop" in e.name for e in result.estimates)
    assert any(e.name.startswith("niah_multivalue acc at L") for e in result.estimates)
    # negative control, the old reading: single minus multi-value beyond L is decidedly above 0
    at = df[df["eval_length"] == 2 * L]
    old = difference_of_accuracies(
        exact_trials(at, "niah_single"), exact_trials(at, "niah_multivalue"), "d"
    )
    assert old.lo > 0
    # only failures at L: nothing R1 can compare
    assert r1_multi_needle_harder(r1_rows((1.0, 0.0, 0.0), (0.0, 0.0, 0.0))).status == NOT_MEASURED


def test_r1_accuracy_at_l_is_widened_where_seeds_disagree():
    """The at-L accuracies carry ACC_CI's interval: pooled Wilson widened to the seeds'
    t-interval. Seeds at 0.9, 0.1, 0.9 on multi-key: the pooled Wilson interval (about
    [0.49, 0.76]) would hide that they disagree; the t-interval reaches 0 and 1. Control: seeds
    that agree keep the Wilson interval."""
    rows = []
    for seed, multikey in zip(SEEDS, (0.9, 0.1, 0.9), strict=True):
        for length in (L, 2 * L):
            rows += [task_row("niah_single", length, 1.0, seed),
                     task_row("niah_multikey", length, multikey, seed),
                     task_row("niah_multivalue", length, 0.9, seed)]  # fmt: skip
    got = {e.name.split(" acc at L")[0]: e for e in r1_multi_needle_harder(normalize_results(rows))
           .estimates if " acc at L" in e.name}  # fmt: skip
    k = 0.9 * 40 * 2 + 0.1 * 40
    pooled = wilson(k, 120)
    assert got["niah_multikey"].value == pytest.approx(k / 120)
    assert got["niah_multikey"].lo < pooled[0] - 0.3 and got["niah_multikey"].hi == 1.0
    assert (got["niah_multivalue"].lo, got["niah_multivalue"].hi) == pytest.approx(wilson(108, 120))


def counts(*ks: float, n: float = 40.0) -> pd.DataFrame:
    """Per-seed successes and trials (seeds 0, 1, ...)."""
    return pd.DataFrame({"k": list(ks), "n": [n] * len(ks)})


def test_relative_drop_difference_by_hand():
    """One seed: s_kL / s_L - o_kL / o_L; its interval holds the value and is the Jeffreys
    draws' percentiles (a second computation from the same draws agrees). Three seeds that
    disagree: the seeds' t-interval is wider and is used."""
    s_l, s_k, o_l, o_k = (counts(k) for k in (38.0, 30.0, 36.0, 8.0))
    e = relative_drop_difference(s_l, s_k, o_l, o_k, "d")
    assert e.value == pytest.approx((30 / 38) - (8 / 36))
    rng = np.random.default_rng(0)
    k, n = np.array([30.0, 38.0, 8.0, 36.0]), 40.0
    draws = rng.beta(k + 0.5, n - k + 0.5, (JEFFREYS_DRAWS, 4))
    stat = draws[:, 0] / draws[:, 1] - draws[:, 2] / draws[:, 3]
    assert (e.lo, e.hi) == pytest.approx(tuple(np.quantile(stat, [0.025, 0.975])))
    assert e.lo < e.value < e.hi
    full, swing = counts(40.0, 40.0, 40.0), counts(40.0, 0.0, 40.0)
    e3 = relative_drop_difference(full, full, full, swing, "d")  # other keeps 1, 0, 1
    d = pd.Series([0.0, 1.0, 0.0])
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
    assert e3.lo == pytest.approx(d.mean() - half) and e3.hi == pytest.approx(d.mean() + half)


def test_r1_is_not_capped_by_the_level_at_l():
    """The audit's case: every task falls to 0 beyond L, single starting highest. Each task loses
    all it had: the relative drops are equal and R1 is not decided. Negative control, the old
    statistic (difference of absolute drops) reads multi-key as decidedly "degrading less", which
    is the level at L, not length: (0.5 - 0) - (1.0 - 0) = -0.5."""
    df = r1_rows((1.0, 0.5, 0.5), (0.0, 0.0, 0.0))
    result = r1_multi_needle_harder(df)
    assert result.status == NOT_DECIDED
    drops = [e for e in result.estimates if "relative drop" in e.name]
    assert drops and all(e.value == pytest.approx(0.0) for e in drops)
    assert all(e.lo < 0 < e.hi for e in drops)
    s_l, s_k = counts(120.0, n=120.0), counts(0.0, n=120.0)
    o_l, o_k = counts(60.0, n=120.0), counts(0.0, n=120.0)
    # the old interval's upper end (MOVER): o_L's upper, s_L's lower and s_kL's upper margins
    old = (0.5 - 0.0) - (1.0 - 0.0)
    old_hi = old + math.sqrt(
        (wilson(60, 120)[1] - 0.5) ** 2 + (1.0 - wilson(120, 120)[0]) ** 2 + wilson(0, 120)[1] ** 2
    )
    assert old_hi < 0  # the capped statistic "decides" the wrong way
    assert relative_drop_difference(s_l, s_k, o_l, o_k, "d").value == pytest.approx(0.0)


def test_r1_false_statement_rate_when_relative_drops_are_equal():
    """Synthetic truth: single 0.9 -> 0.6, multi-key 0.6 -> 0.4 (both keep 2/3), 3 seeds of 40
    trials. Over 200 repetitions "harder" is decided at most 5% of the time; control: with
    multi-key falling to 0.15 (keeps 1/4) it is decided in most repetitions."""
    rng = np.random.default_rng(1)

    def decided(p_other_far: float) -> float:
        hits = 0
        for _ in range(200):
            ks = [rng.binomial(40, p, 3).astype(float) for p in (0.9, 0.6, 0.6, p_other_far)]
            e = relative_drop_difference(*(counts(*k) for k in (ks[0], ks[1], ks[2], ks[3])), "d")
            hits += e.lo > 0
        return hits / 200

    assert decided(0.4) <= 0.05
    assert decided(0.15) > 0.5


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


def r2_rows(
    effective: dict[int, int], nll: dict[int, float], scaling: str = "yarn", params: str = "{}"
) -> list:
    rows = []
    for seed in SEEDS:
        common = dict(run_id=f"r{seed}-{scaling}", model_id=f"m{seed}", seed=seed, train_length=L,
                      scaling=scaling, experiment="ruler")  # fmt: skip
        value = effective[seed]
        rows.append(row(metric="effective_length", value=value, eval_length=value, n=3,
                        axis="relative_threshold", axis_value=0.85, task="average",
                        task_params=params, **common))  # fmt: skip
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
    assert result.status == HOLDS and len(result.estimates) == 6  # both series reported


def test_r2_leaves_out_a_seed_that_does_none_of_the_tasks_at_l():
    """Zero-shot linear PI's case: its tasks' mean is 0 at L, so its effective-length rows say 0
    ("fails at L"), which is below any flat length. That is no effective length to compare: the
    seed is left out, with a note, and R2 is not decided on it alone. Control: the same rows with a
    mean of 0.5 at L count as below and R2 holds."""
    flat = {L: 2.0, 2 * L: 2.01, 4 * L: 2.015}
    idle = r2_rows(dict.fromkeys(SEEDS, 0), flat, params='{"reference_score": 0.0}')
    result = r2_effective_below_flat(normalize_results(idle))
    assert result.status == NOT_MEASURED
    assert any("mean 0 at L (no effective length)" in n and "3 of 3 seeds" in n
               for n in result.notes)  # fmt: skip
    working = r2_rows(dict.fromkeys(SEEDS, 0), flat, params='{"reference_score": 0.5}')
    assert r2_effective_below_flat(normalize_results(working)).status == HOLDS


def test_r2_is_decided_on_the_headline_score_and_reports_the_other():
    """Effective lengths of both scores (task_params' score, headline): the exact rows decide;
    the match reading is printed beside. Negative control: the same rows with match as the
    headline give match's status."""
    flat = {L: 2.0, 2 * L: 2.01, 4 * L: 2.015}
    exact = '{"headline":true,"score":"exact"}'
    match = '{"headline":false,"score":"match"}'
    rows = r2_rows(dict.fromkeys(SEEDS, 2 * L), flat, params=exact)
    rows += [r for r in r2_rows(dict.fromkeys(SEEDS, 4 * L), flat, params=match)
             if r["metric"] == "effective_length"]  # fmt: skip
    result = r2_effective_below_flat(normalize_results(rows))
    assert result.status == HOLDS
    assert "exact score" in result.claim
    assert any("(relative, match)" in e.name for e in result.estimates)
    assert result.notes == ["on the match score (not the headline) R2 would be: does not hold"]
    swapped = [
        {**r, "task_params": {exact: exact.replace("true", "false"),
                              match: match.replace("false", "true")}[r["task_params"]]}
        if r["metric"] == "effective_length" else r
        for r in rows
    ]  # fmt: skip
    assert r2_effective_below_flat(normalize_results(swapped)).status == FAILS


def test_flat_length():
    rows = pd.DataFrame({"eval_length": [L, 2 * L, 4 * L], "value": [2.0, 2.01, 2.1],
                         "train_length": L})  # fmt: skip
    assert flat_length(rows) == 2 * L  # exp(0.1) = 1.105 > 1.02 at 4L
    assert flat_length(rows[rows["eval_length"] > L]) is None


def test_r1_r2_are_registered():
    keys = {r.key for r in check_findings(r1_rows((1.0, 0.9, 0.9), (0.9, 0.2, 0.2)))}
    assert "R1" in keys  # R2 reads effective_length rows, which these rows lack
    assert {"R1", "R2"} <= set(findings())
