"""The leaderboard's rules (issue #56 item 2), fixed and committed before the rows they rank.

Per series (family x method x fine-tune) and seed, an **effective length** per metric: the
largest evaluated length at which the metric passes, every shorter evaluated length passing too
(not interpolated; 0 when the shortest fails):

- ``ppl``: perplexity at most :data:`PPL_FLAT` x its perplexity at the training length L;
- ``longppl``: the same rule on LongPPL against its LongPPL at L; a seed without LongPPL at L
  has none (rule as first committed: against the shortest LongPPL length, which on the
  leaderboard's first trial was 8L, so every series passed up to 8L by construction);
- ``passkey``: accuracy whose Wilson 95% interval's lower end is at least :data:`PASSKEY_MIN`;
- ``ruler``: the RULER tasks' exact mean at least :data:`RULER_RELATIVE` x its mean at L; 0
  (fails at L) where its mean at L is 0, as the ``effective_length`` rows have it (rule as first
  committed: 0 >= 0.85 x 0 passed every length, and zero-shot linear PI, 0 on every task and
  seed, ranked first on RULER).

Across seeds each effective length is summarised on the log2 scale of its ratio to L (0 maps to
one halving below L: it fails at L), as a mean with a t-interval (:func:`summarise_seeds`).
**Ranks** per metric: a series' rank is one plus the number of series whose interval lies
entirely above its own (ties where intervals overlap); the **overall rank** is the mean of a
series' ranks over the metrics it has.

The in-distribution perplexity at L is ranked too (:data:`AT_L`: lower is better, its seeds
summarised on the log scale by :func:`summarise_ppl_at_l`, the same tie rule) and counts in the
overall rank, so that no method wins by being bad at L. Rule as first committed: reported beside
the ranks only; with the LM arm's seeds 4 and 5 in, series such as irope under PI's zero-shot
scaling (perplexity 26 at L, the recipe's best 5.6) ranked first overall on their flat curves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from bench.core.stats import t_half_width, wilson

PPL_FLAT = 1.1
PASSKEY_MIN = 0.8
RULER_RELATIVE = 0.85
#: the log2 ratio an effective length of 0 (fails at the shortest length) counts as
BELOW_L = -1.0
METRICS = ("ppl", "longppl", "passkey", "ruler")
#: the in-distribution perplexity at L, ranked beside the effective lengths
AT_L = "ppl_at_L"


def effective_length(passes: Mapping[int, bool]) -> int:
    """The largest length with it and every shorter one passing; 0 when the shortest fails."""
    best = 0
    for length in sorted(passes):
        if not passes[length]:
            break
        best = int(length)
    return best


def ratio_rule(values: Mapping[int, float], reference: float, bar: float) -> int:
    """Effective length where ``value / reference <= bar`` (perplexity, LongPPL)."""
    return effective_length({x: v / reference <= bar for x, v in values.items()})


def passkey_rule(trials: Mapping[int, tuple[int, int]], bar: float = PASSKEY_MIN) -> int:
    """Effective length where the Wilson lower end of (successes, trials) is >= ``bar``."""
    return effective_length({x: wilson(k, n)[0] >= bar for x, (k, n) in trials.items()})


def relative_rule(values: Mapping[int, float], reference: float, bar: float) -> int:
    """Effective length where ``value >= bar x reference`` (the RULER tasks' exact mean); 0 when
    the reference is 0: a series that does none of the tasks at L keeps nothing beyond it."""
    if reference <= 0:
        return 0
    return effective_length({x: v >= bar * reference for x, v in values.items()})


@dataclass(frozen=True)
class SeedSummary:
    """An effective length over seeds: ``log2`` mean of eff / L with its t-interval
    (``lo``/``hi``; equal to the mean with one seed) and the per-seed lengths."""

    mean: float
    lo: float
    hi: float
    lengths: tuple[int, ...]

    @property
    def length(self) -> float:
        """The mean as a length in units of L (2 ** mean)."""
        return 2.0**self.mean


def _log_ratio(length: int, train_length: int) -> float:
    return BELOW_L if length <= 0 else math.log2(length / train_length)


def _summary(values: np.ndarray, lengths: tuple[int, ...] = ()) -> SeedSummary:
    mean = float(values.mean())
    half = float(t_half_width(values)) if len(values) >= 2 else 0.0
    return SeedSummary(mean, mean - half, mean + half, lengths)


def summarise_seeds(lengths: list[int], train_length: int) -> SeedSummary:
    logs = np.array([_log_ratio(x, train_length) for x in lengths], dtype=float)
    return _summary(logs, tuple(int(x) for x in lengths))


def summarise_ppl_at_l(nll_at_l: list[float]) -> SeedSummary:
    """Per-seed mean NLL at L (log perplexity) as a summary that :func:`ranks` reads higher-is-
    better: the negated log perplexity's mean and t-interval."""
    return _summary(-np.array(nll_at_l, dtype=float))


def ranks(summaries: Mapping[str, SeedSummary]) -> dict[str, int]:
    """Rank 1 = best (longest); a series' rank is 1 + the number of series whose interval lies
    entirely above its own, so series with overlapping intervals can share a rank."""
    return {
        name: 1 + sum(other.lo > s.hi for other in summaries.values())
        for name, s in summaries.items()
    }


def overall_ranks(per_metric: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
    """Per series: the mean of its ranks over the metrics that rank it."""
    names = {name for metric in per_metric.values() for name in metric}
    return {
        name: float(np.mean([m[name] for m in per_metric.values() if name in m]))
        for name in sorted(names)
    }
