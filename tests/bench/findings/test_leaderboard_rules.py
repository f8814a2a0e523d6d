"""The leaderboard's rules (issue #56 items 2 and 6) on hand-built values, each with a changed-
cell control."""

from __future__ import annotations

import math

import pytest

from bench.findings.leaderboard import (
    BELOW_L,
    effective_length,
    overall_ranks,
    passkey_rule,
    ranks,
    ratio_rule,
    relative_rule,
    summarise_seeds,
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


def test_seed_summary_is_log2_of_the_ratio_to_l_with_a_t_interval():
    s = summarise_seeds([512, 512, 1024], 256)  # log2 ratios 1, 1, 2: mean 4/3, sd 0.577
    assert s.mean == pytest.approx(4 / 3)
    half = 4.302653 * (1 / math.sqrt(3)) / math.sqrt(3)  # t(0.975, 2) x sd / sqrt(n)
    assert s.hi - s.mean == pytest.approx(half, rel=1e-5)
    assert summarise_seeds([0], 256).mean == BELOW_L  # fails at L: one halving below


def test_ranks_tie_where_intervals_overlap_and_overall_is_the_mean():
    a = summarise_seeds([1024, 1024, 1024], 256)  # 2, no spread
    b = summarise_seeds([512, 1024, 512], 256)  # overlaps neither a nor c? mean 1.33, wide
    c = summarise_seeds([256, 256, 256], 256)  # 0
    r = ranks({"a": a, "b": b, "c": c})
    assert r["a"] == 1 and r["c"] == 2  # only a lies entirely above c
    assert r["b"] == 1  # b's interval overlaps a's: tied with it
    # changed cell: b's seeds agree, so a is entirely above b
    r2 = ranks({"a": a, "b": summarise_seeds([512, 512, 512], 256), "c": c})
    assert r2 == {"a": 1, "b": 2, "c": 3}
    assert overall_ranks({"ppl": r2, "ruler": {"a": 3, "b": 1}}) == {"a": 2.0, "b": 1.5, "c": 3.0}


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
