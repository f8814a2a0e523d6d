"""The leaderboard's rules (issue #56 items 2 and 6, issue #73) on hand-built values, each with a
changed-cell control; the arrays the leaderboard applies them to (one column per resample) agree
with the one-column forms column by column. The ranks across seeds are
tests/bench/findings/test_comparisons.py's."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.findings.leaderboard import (
    effective_length,
    effective_lengths,
    passkey_passes,
    passkey_rule,
    ratio_rule,
    relative_rule,
)


def test_effective_length_needs_every_shorter_length():
    assert effective_length({64: True, 128: True, 256: False, 512: True}) == 128
    assert effective_length({64: False, 128: True}) == 0
    assert effective_length({256: True, 64: True, 128: True}) == 256  # order of the mapping


def test_perplexity_rule_is_a_ratio_to_l():
    ppl = {64: 10.0, 128: 10.9, 256: 11.2, 512: 30.0}
    assert ratio_rule(ppl, 10.0, 1.1) == 128
    assert ratio_rule({**ppl, 256: 11.0}, 10.0, 1.1) == 256  # changed cell: 1.1 x passes


def test_passkey_rule_reads_the_wilson_lower_end():
    # 40/40: lower end 0.912; 36/40 (0.9): lower end 0.769 < 0.8 although the rate is above
    assert passkey_rule({256: (40, 40), 512: (36, 40)}) == 256
    assert passkey_rule({256: (40, 40), 512: (39, 40)}) == 512  # 39/40: lower end 0.871


def test_ruler_rule_is_relative_to_l():
    assert relative_rule({256: 0.8, 512: 0.7, 1024: 0.6}, 0.8, 0.85) == 512  # 0.68 is the bar
    assert relative_rule({256: 0.8, 512: 0.67, 1024: 0.6}, 0.8, 0.85) == 256
    # nothing done at L keeps nothing beyond it (0 >= 0.85 x 0 would pass every length)
    assert relative_rule({256: 0.0, 512: 0.0, 1024: 0.0}, 0.0, 0.85) == 0
    assert relative_rule({256: 0.1, 512: 0.1, 1024: 0.1}, 0.1, 0.85) == 1024  # control


def _leading_length(lengths: list[int], column: list[bool]) -> int:
    """The rule written out as a loop, independently of the module's cumulative product."""
    best = 0
    for length, ok in zip(lengths, column, strict=True):
        if not ok:
            break
        best = length
    return best


def _wilson_lower(k: float, n: float) -> float:
    """Wilson's lower end from its formula (z = 1.959964), independently of bench.core.stats."""
    z, p = 1.959964, k / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - half) / (1 + z * z / n))


def test_the_rules_on_resampled_columns_equal_the_rule_written_out():
    """Per column (a resample): the effective length of 40 random pass patterns equals the rule
    as a loop, and the passkey rule's Wilson lower end on 40 random (k, n) equals the formula's
    (ties at the bar excluded). Control: a pattern whose shortest length fails gives 0."""
    rng = np.random.default_rng(0)
    lengths = [64, 128, 256, 512]
    passes = rng.random((4, 40)) < 0.7  # [n_lengths, R]
    got = effective_lengths(lengths, passes)
    assert got.tolist() == [_leading_length(lengths, passes[:, r].tolist()) for r in range(40)]
    assert effective_lengths(lengths, np.array([[False], [True], [True], [True]]))[0] == 0
    n = rng.integers(1, 100, 40).astype(float)
    k = np.floor(rng.random(40) * (n + 1))
    lower = [_wilson_lower(a, b) for a, b in zip(k, n, strict=True)]
    clear = [abs(x - 0.5) > 1e-4 for x in lower]
    assert (passkey_passes(k, n, 0.5)[clear] == (np.array(lower) >= 0.5)[clear]).all()
    assert passkey_passes(np.array([40.0]), np.array([40.0]))[0]  # 40/40: 0.912 >= 0.8


def test_retention_auc_is_the_normalised_area_over_log2_length():
    """Hand values: 1, 0.5, 0 at L, 2L, 4L -> (0.75 + 0.25) / 2 = 0.5; flat at 1 -> 1; lengths
    below L do not count; control: without a score at L there is no area."""
    from bench.findings.leaderboard import retention_auc

    assert retention_auc({64: 1.0, 128: 0.5, 256: 0.0}, 64) == pytest.approx(0.5)
    assert retention_auc({64: 1.0, 128: 1.0, 256: 1.0, 512: 1.0}, 64) == pytest.approx(1.0)
    assert retention_auc({32: 0.0, 64: 1.0, 128: 1.0}, 64) == pytest.approx(1.0)
    # unequal spacing on the log scale: L, 2L, 8L -> (1 x 1 + 0.5 x 2) / 3
    assert retention_auc({64: 1.0, 128: 1.0, 512: 0.0}, 64) == pytest.approx((1.0 + 1.0) / 3)
    assert math.isnan(retention_auc({128: 1.0, 256: 1.0}, 64))
