"""P1 (issue #55 item 4) on hand-built rows: holds where LongPPL ranks the series by effective
length and perplexity does not, fails in the mirror case, not measured below MIN_SERIES or
MIN_KEY_TOKENS."""

from __future__ import annotations

import math

import pandas as pd

from bench.core.stats import UNDECIDED, Estimate
from bench.findings.longppl import (
    MIN_KEY_TOKENS,
    MIN_SERIES,
    gap_check,
    p1_longppl_tracks_effective_length,
    spearman,
)

from fixtures.rows import row

EFF = [256, 512, 512, 1024, 1024, 2048, 2048, 4096]
UNRELATED = [40.0, 12.0, 55.0, 9.0, 70.0, 20.0, 33.0, 60.0]


def rows(longppl: list[float], ppl: list[float], key_tokens: int = 50) -> pd.DataFrame:
    """Two seeds per series; ``key_tokens`` per LongPPL row (the default pools to the floor)."""
    out = []
    for i, (eff, lp, pp) in enumerate(zip(EFF, longppl, ppl, strict=False)):
        for seed in (0, 1):
            common = dict(scaling=f"m{i}", run_id=f"r{i}{seed}", model_id=f"m{i}{seed}", seed=seed,
                          train_length=256)  # fmt: skip
            out += [
                row(metric="effective_length", value=eff, eval_length=eff, n=2, task="average",
                    axis="relative_threshold", axis_value=0.85,
                    task_params='{"score":"exact","headline":true}', **common),
                row(metric="longppl", value=lp, n=key_tokens, eval_length=1024, **common),
                row(metric="nll", value=math.log(pp), n=4000, eval_length=1024, **common),
                row(metric="nll", value=math.log(pp), n=4000, eval_length=512, **common),
            ]  # fmt: skip
    return pd.DataFrame(out)


def test_p1_holds_when_longppl_tracks_the_effective_length():
    longppl = [1000.0 / e for e in EFF]  # lower LongPPL, longer effective length
    result = p1_longppl_tracks_effective_length(rows(longppl, UNRELATED))
    assert result.status == "holds", result.numbers
    assert "8 series at length 1024" in result.numbers  # the longest length with both


def test_p1_fails_in_the_mirror_case_and_needs_enough_series():
    ppl = [1000.0 / e for e in EFF]
    result = p1_longppl_tracks_effective_length(rows(UNRELATED, ppl))
    assert result.status == "does not hold", result.numbers
    few = rows(UNRELATED[: MIN_SERIES - 1], ppl[: MIN_SERIES - 1])
    assert p1_longppl_tracks_effective_length(few).status == "not measured"


def test_a_gap_interval_ending_at_exactly_zero_is_a_tie_not_a_failure():
    """ruler_longppl_k16's case: rho(ppl) - rho(LongPPL) -0.111 [-0.629, 0.000], the upper end 0
    because many resamples rank the series identically under both. That is not decided; control:
    an upper end just below 0 fails, a lower end above 0 holds."""
    assert gap_check(Estimate("gap", -0.111, -0.629, 0.0)) == UNDECIDED
    assert gap_check(Estimate("gap", -0.111, -0.629, -1e-9)) is False
    assert gap_check(Estimate("gap", 0.2, 1e-9, 0.5)) is True
    assert gap_check(Estimate("gap", 0.0, -0.3, 0.4)) == UNDECIDED


def test_spearman_against_a_hand_computed_value():
    # ranks x 1,2,3,4; y 2,1,4,3: d = 1,1,1,1; rho = 1 - 6*4/(4*15) = 0.6
    assert math.isclose(spearman([10, 20, 30, 40], [5, 1, 9, 7]), 0.6)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_p1_is_not_measured_on_too_few_key_tokens():
    """A LongPPL of one key token is that token's perplexity: below MIN_KEY_TOKENS (pooled over
    seeds) the case that holds above is not measured, and says why. Control: at the floor, holds."""
    longppl = [1000.0 / e for e in EFF]
    assert 2 * 50 == MIN_KEY_TOKENS
    result = p1_longppl_tracks_effective_length(rows(longppl, UNRELATED, key_tokens=1))
    assert result.status == "not measured"
    assert "at least 100 key tokens per series at length 1024 (8 of 8 series have 2)" in str(
        result.missing
    )
    assert p1_longppl_tracks_effective_length(rows(longppl, UNRELATED, key_tokens=50)).status == (
        "holds"
    )


def test_p1_reads_every_series_of_the_study_switched_models_too():
    """P1 is about all of a study's series: a model with a switch on (stick-breaking attention, a
    zoo_2025 family) is one of them. Control: without it, one series fewer."""
    from bench.findings import check_findings

    def p1(df: pd.DataFrame) -> str:
        return next(r for r in check_findings(df) if r.key == "P1").numbers

    df = rows([1000.0 / e for e in EFF], UNRELATED)
    switched = df[df["scaling"] == "m7"].assign(scaling="m8", attention="stick_breaking")
    switched = switched.assign(
        model_id=switched["model_id"] + "sb", run_id=switched["run_id"] + "sb"
    )
    assert "9 series at length 1024" in p1(pd.concat([df, switched], ignore_index=True))
    assert "8 series at length 1024" in p1(df)
