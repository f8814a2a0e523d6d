"""Decided comparisons between series (issue #73): what the leaderboard's ranks are made of.

Each series of a block has, per metric, one value per seed (the seed's statistic on all its
documents or trials) and ``B`` within-seed replicates (the same statistic on the seed's
documents or trials resampled with replacement). A **two-level bootstrap** replicate of a
series' mean draws the seeds with replacement and, inside each drawn seed, takes that seed's
replicate of the same index. Series of one **model group** (one trained model per seed:
eval-time methods on the same weights) share the seed draws, and their document replicates
share the document draws, so their difference is **paired** over seeds and documents; series of
different groups draw independently (**unpaired**).

A comparison of A and B: the difference of their means over seeds, its standard error from the
bootstrap replicates of the difference with the seed level's small-sample correction
(variance x n / (n - 1): the bootstrap variance of a mean of n values is (n - 1) / n of the
unbiased one), and a Student t test (df n - 1 paired; Welch-Satterthwaite unpaired). With one
seed a series compares with nothing (no seed-level variance). The p-values of a block's pairs are
adjusted by **Benjamini-Hochberg** at :data:`FDR` and a comparison is **decided** where its
adjusted p is at most :data:`FDR`. Why BH and not Holm: a block holds up to ~150 series, about
11 000 pairs per metric, and the leaderboard states many comparisons at once; BH bounds the
expected fraction of stated comparisons that are wrong at 5% (and, when no series differs from
any other, the chance of stating any comparison at all), where Holm, which bounds the chance of
any wrong one, would need each pair at p < 5e-6 and state almost nothing at three seeds.

Decided comparisons are closed transitively (A > C and C > B decided: A > B, as both statements
being true makes it true; the closure never reverses a mean order, since a decided comparison
follows its means). A series' **rank interval** is [1 + the series decidedly better, N - the
series decidedly worse]: every order consistent with the decided comparisons puts it there, and
two series whose intervals do not overlap have a decided comparison. **Bootstrap ranks** (as
LMArena publishes) are shown beside: the 2.5% and 97.5% points of each series' rank among the
replicate means.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

#: the false discovery rate of a block's stated comparisons (Benjamini-Hochberg)
FDR = 0.05
#: two-level bootstrap replicates per series
REPLICATES = 2000
#: power of the "seeds to decide" estimate
POWER = 0.8


@dataclass
class Sample:
    """One series' statistic on one metric: per seed its value and its within-seed replicates
    (``replicates[seed]``: :data:`REPLICATES` values; absent where the seed's documents or trials
    are not stored, which counts as no within-seed noise). ``group``: series with equal groups
    share their trained model on every seed (paired); ``None`` is a group of its own."""

    values: dict[int, float]
    replicates: dict[int, np.ndarray] = field(default_factory=dict)
    group: Hashable | None = None

    @property
    def seeds(self) -> tuple[int, ...]:
        return tuple(sorted(self.values))

    @property
    def mean(self) -> float:
        return float(np.mean(list(self.values.values())))


def _seed_draws(n: int, rng: np.random.Generator, size: int) -> np.ndarray:
    return rng.integers(0, n, size=(size, n))  # [B, n]: drawn seed positions per replicate


def replicate_means(
    samples: Mapping[str, Sample], seed: int = 0, size: int = REPLICATES
) -> dict[str, np.ndarray]:
    """Per series: ``size`` two-level bootstrap replicates of its mean over seeds. Series of one
    group share the seed draws (their seeds must be equal: checked)."""
    rng = np.random.default_rng(seed)
    draws: dict[Hashable, tuple[tuple[int, ...], np.ndarray]] = {}
    out = {}
    for name in sorted(samples):
        s = samples[name]
        key = ("_alone", name) if s.group is None else s.group
        seeds = s.seeds
        if key not in draws:
            draws[key] = (seeds, _seed_draws(len(seeds), rng, size))
        elif draws[key][0] != seeds:
            raise ValueError(
                f"series {name} shares model group {key!r} with series of seeds "
                f"{draws[key][0]}, but has seeds {seeds}; a group's series are paired per seed."
            )
        within = np.stack(
            [s.replicates.get(x, np.full(size, s.values[x]))[:size].astype(float) for x in seeds]
        )  # [n, B]
        d = draws[key][1]  # [B, n]
        out[name] = within[d, np.arange(size)[:, None]].mean(axis=1)
    return out


def bh_adjust(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (step-up; monotone; capped at 1)."""
    p = np.asarray(p, dtype=float)
    m = len(p)
    if m == 0:
        return p
    order = np.argsort(p)
    ranked = p[order] * m / np.arange(1, m + 1)
    adjusted = np.minimum.accumulate(ranked[::-1])[::-1]
    out = np.empty(m)
    out[order] = np.minimum(adjusted, 1.0)
    return out


def _t_test(diff: float, var: float, df: float) -> float:
    """Two-sided p of ``diff`` with variance ``var`` and ``df`` degrees of freedom."""
    if not np.isfinite(df) or df <= 0:
        return 1.0
    if var <= 0:
        return 0.0 if diff != 0 else 1.0
    return float(2 * stats.t.sf(abs(diff) / math.sqrt(var), df))


def _pair_stats(
    sa: Sample, sb: Sample, ra: np.ndarray, rb: np.ndarray
) -> tuple[float, float, bool]:
    """Variance and degrees of freedom of mean(a) - mean(b) from their replicate means, and
    whether the pair is paired (NaN variance where a side has one seed)."""
    na, nb = len(sa.values), len(sb.values)
    paired = sa.group is not None and sa.group == sb.group
    if paired:
        if na < 2:
            return math.nan, math.nan, True
        return float(np.var(ra - rb)) * na / (na - 1), na - 1.0, True
    if na < 2 or nb < 2:
        return math.nan, math.nan, False
    va, vb = float(np.var(ra)) * na / (na - 1), float(np.var(rb)) * nb / (nb - 1)
    den = va**2 / (na - 1) + vb**2 / (nb - 1)
    df = (va + vb) ** 2 / den if den > 0 else float(min(na, nb) - 1)
    return va + vb, df, False


def compare(
    samples: Mapping[str, Sample], higher_is_better: bool = True, seed: int = 0,
    fdr: float = FDR, size: int = REPLICATES,
) -> pd.DataFrame:  # fmt: skip
    """Every unordered pair of ``samples``: ``a``, ``b`` (a's mean the better), ``diff`` (better
    minus worse, >= 0, on the better-is-higher scale), ``se``, ``df``, ``paired``, ``p``,
    ``p_adj`` (BH over the pairs), ``decided`` (p_adj <= fdr: a better than b)."""
    sign = 1.0 if higher_is_better else -1.0
    names = sorted(samples)
    reps = replicate_means(samples, seed=seed, size=size)
    means = {k: sign * samples[k].mean for k in names}
    rows = []
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            a, b = (second, first) if means[second] > means[first] else (first, second)
            diff = means[a] - means[b]
            var, df, paired = _pair_stats(samples[a], samples[b], reps[a], reps[b])
            p = _t_test(diff, var, df) if np.isfinite(var) else 1.0
            rows.append(
                (a, b, diff, math.sqrt(var) if np.isfinite(var) else math.nan, df, paired, p)
            )
    out = pd.DataFrame(rows, columns=["a", "b", "diff", "se", "df", "paired", "p"])
    out["p_adj"] = bh_adjust(out["p"].to_numpy()) if len(out) else []
    out["decided"] = out["p_adj"] <= fdr
    return out


def decidedly_above(
    samples: Mapping[str, Sample], reference: str, margin: float, seed: int = 0,
    fdr: float = FDR, size: int = REPLICATES,
) -> dict[str, bool]:  # fmt: skip
    """Per series other than ``reference``: its mean exceeds the reference's by more than
    ``margin``, decided by a one-sided t test of (mean - reference - margin) > 0, BH-adjusted
    over the series at ``fdr``. The reference itself: False."""
    reps = replicate_means(samples, seed=seed, size=size)
    names = [k for k in sorted(samples) if k != reference]
    ref = samples[reference]
    p = []
    for k in names:
        var, df, _ = _pair_stats(samples[k], ref, reps[k], reps[reference])
        excess = samples[k].mean - ref.mean - margin
        if not np.isfinite(var) or not np.isfinite(df) or df <= 0:
            p.append(1.0)
        elif var <= 0:
            p.append(0.0 if excess > 0 else 1.0)
        else:
            p.append(float(stats.t.sf(excess / math.sqrt(var), df)))
    adjusted = bh_adjust(np.array(p)) if p else np.array([])
    out = {k: bool(q <= fdr) for k, q in zip(names, adjusted, strict=True)}
    out[reference] = False
    return out


def decided_pairs(comparisons: pd.DataFrame) -> set[tuple[str, str]]:
    """The decided "a better than b" pairs, closed transitively."""
    better: dict[str, set[str]] = {}
    for a, b in comparisons.loc[comparisons["decided"], ["a", "b"]].itertuples(index=False):
        better.setdefault(a, set()).add(b)
    closed: dict[str, set[str]] = {}

    def below(x: str) -> set[str]:
        if x not in closed:
            closed[x] = set()  # the decided relation follows the means: no cycle
            for y in better.get(x, ()):
                closed[x] |= {y} | below(y)
        return closed[x]

    return {(a, b) for a in list(better) for b in below(a)}


def rank_intervals(
    names: Sequence[str], decided: set[tuple[str, str]]
) -> dict[str, tuple[int, int]]:
    """Per series: [1 + #decidedly better, N - #decidedly worse] among ``names``."""
    pool = set(names)
    n = len(pool)
    return {
        x: (
            1 + sum((y, x) in decided for y in pool if y != x),
            n - sum((x, y) in decided for y in pool if y != x),
        )
        for x in names
    }


def bootstrap_ranks(
    samples: Mapping[str, Sample], higher_is_better: bool = True, seed: int = 0,
    size: int = REPLICATES,
) -> dict[str, tuple[int, int]]:  # fmt: skip
    """Per series: the 2.5% and 97.5% points of its rank (1 = best) over the replicate means."""
    names = sorted(samples)
    if not names:
        return {}
    reps = replicate_means(samples, seed=seed, size=size)
    m = np.stack([reps[k] for k in names]) * (1.0 if higher_is_better else -1.0)  # [N, B]
    ranked = (-m).argsort(axis=0).argsort(axis=0) + 1  # [N, B]: 1 = highest
    lo, hi = np.percentile(ranked, [2.5, 97.5], axis=1, method="nearest")
    return {k: (int(lo[i]), int(hi[i])) for i, k in enumerate(names)}


def seeds_to_decide(
    diff: float, per_seed_sd: float, level: float, power: float = POWER, cap: int = 1000
) -> int | None:
    """The seeds per series at which a two-sided t test at ``level`` detects ``diff`` with
    ``power``, for a per-seed standard deviation of the difference ``per_seed_sd`` (paired: of
    the per-seed differences; unpaired: sqrt(var_a + var_b)); None above ``cap``."""
    if diff == 0 or not np.isfinite(per_seed_sd):
        return None
    if per_seed_sd == 0:
        return 2
    for n in range(2, cap + 1):
        t_crit = stats.t.ppf(1 - level / 2, n - 1)
        noncentral = abs(diff) / (per_seed_sd / math.sqrt(n))
        if stats.nct.sf(t_crit, n - 1, noncentral) >= power:
            return n
    return None
