"""The statistics every finding reads: :class:`Estimate` (a number, its interval and how it was
made), intervals (Wilson, seed t-interval, normal from stored CIs), the seed x document
bootstrap's resampling, and :func:`decide` (a claim checked on an interval). Pure numbers: no
result rows (those are :mod:`bench.findings.rows` and :mod:`bench.findings.estimates`).
Imports nothing of ``bench``, so a metric may use :func:`wilson` without the findings' registry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

#: Confidence level of every interval used here (per-run stored CIs are read as 95% intervals).
LEVEL = 0.95
#: A check whose interval straddles its threshold (a value of a check list, beside True / False /
#: None = not measured).
UNDECIDED = "undecided"

Check = bool | str | None  # True, False, UNDECIDED, or None (not measured)

SEED_CI = "mean ± t-interval across seeds"
RUN_CI = "one seed: normal approximation from the run's stored bootstrap CIs"
NO_CI = "one seed without stored CIs: no CI, so a check that needs one is not measured"
ACC_CI = (
    "accuracy: Wilson interval of the trials (all seeds pooled), widened to the t-interval "
    "across seeds where that is wider"
)
SEED_ACC_CI = "accuracy per seed: Wilson interval of that seed's trials"
SEED_DOC_CI = (
    "mean ± t-interval across seeds, widened to a seed x document bootstrap where that is wider"
)
DOC_CI = (
    "one seed: document bootstrap (paired across lengths), widened to the run's stored CIs "
    "where those are wider"
)
CURVE_CI = (
    "updates to retrieve: the fewest on the fine-tune's grid whose accuracy at every length has "
    "its interval's lower end >= the threshold (inf: none)"
)

#: seeds_to_decide searches up to this count
MAX_SEEDS_TO_DECIDE = 1000
#: Resamples of the seed x document bootstrap.
BOOTSTRAP = 2000


@dataclass
class Estimate:
    """One number a finding used: its value, CI (NaN when none) and how the CI was made."""

    name: str
    value: float
    lo: float = math.nan
    hi: float = math.nan
    n_seeds: int = 0
    ci: str = ""
    digits: int = 3
    # per-seed mean and spread on the scale the interval was made on (log for ratios), where
    # the interval is a seed t-interval: what :func:`seeds_to_decide` reads
    seed_mean: float = math.nan
    seed_sd: float = math.nan
    log_scale: bool = False
    seeds_needed: int | None = None  # set by decide() where the interval straddles

    def text(self, digits: int | None = None) -> str:
        digits = self.digits if digits is None else digits
        if math.isnan(self.value):
            return f"{self.name} n/a"
        ci = "" if math.isnan(self.lo) else f" [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"
        ci = " [no CI]" if self.ci == NO_CI else ci
        seeds = f" ({self.n_seeds} seed{'s' * (self.n_seeds != 1)})" if self.n_seeds else ""
        if self.seeds_needed is not None:
            if self.seeds_needed <= self.n_seeds:
                more = "the seeds' interval alone decides; the document bootstrap keeps it open"
            elif self.seeds_needed > MAX_SEEDS_TO_DECIDE:
                more = f"more than {MAX_SEEDS_TO_DECIDE} seeds to decide at this spread"
            else:
                more = f"at least {self.seeds_needed} seeds to decide at this spread"
            seeds = seeds[:-1] + f"; {more})" if seeds else seeds
        return f"{self.name} {self.value:.{digits}f}{ci}{seeds}"


def seeds_to_decide(e: Estimate, threshold: float) -> int | None:
    """The fewest seeds whose t-interval, at the observed per-seed mean and spread of ``e``,
    would lie on one side of ``threshold`` (``MAX_SEEDS_TO_DECIDE`` + 1 if none up to it; None
    without a seed spread). A lower estimate where the interval was also widened to a document
    bootstrap, which more seeds narrow less."""
    if e.n_seeds < 2 or not math.isfinite(e.seed_sd):
        return None
    bar = math.log(threshold) if e.log_scale else threshold
    gap = abs(e.seed_mean - bar)
    if e.seed_sd == 0:
        return e.n_seeds if gap > 0 else MAX_SEEDS_TO_DECIDE + 1
    for n in range(2, MAX_SEEDS_TO_DECIDE + 1):
        if stats.t.ppf(0.5 + LEVEL / 2, n - 1) * e.seed_sd / math.sqrt(n) < gap:
            return n
    return MAX_SEEDS_TO_DECIDE + 1


def decide(e: Estimate, threshold: float, claim: str) -> Check:
    """The check of "value <claim> threshold" on ``e``'s interval: True when the whole interval
    satisfies it, False when none of it does, :data:`UNDECIDED` when it straddles, None when
    there is no interval. ``claim``: "above" (>), "below" (<), "at_most" (<=), "at_least" (>=).
    """
    if math.isnan(e.value) or math.isnan(e.lo) or math.isnan(e.hi):
        return None
    lo, hi = e.lo, e.hi
    holds, fails = {
        "above": (lo > threshold, hi <= threshold),
        "below": (hi < threshold, lo >= threshold),
        "at_most": (hi <= threshold, lo > threshold),
        "at_least": (lo >= threshold, hi < threshold),
    }[claim]
    if holds or fails:
        return bool(holds)
    needed = seeds_to_decide(e, threshold)
    if needed is not None:
        e.seeds_needed = max(needed, e.seeds_needed or 0)
    return UNDECIDED


def wilson_bounds(successes, trials, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval of binomial proportions, elementwise over arrays of successes and
    trials (trials > 0; the leaderboard reads it on resampled trials)."""
    z = stats.norm.ppf(0.5 + level / 2)
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * np.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return np.maximum(0.0, centre - half), np.minimum(1.0, centre + half)


def wilson(successes: float, trials: float, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (NaN, NaN when there are no trials)."""
    if trials <= 0:
        return math.nan, math.nan
    lo, hi = wilson_bounds(np.float64(successes), np.float64(trials), level)
    return float(lo), float(hi)


def t_half_width(values: np.ndarray) -> float:
    """Half-width of the :data:`LEVEL` t-interval of the mean of ``values`` (two or more)."""
    return (
        stats.t.ppf(0.5 + LEVEL / 2, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    )


def normal_half_width(se: float) -> float:
    """Half-width of the :data:`LEVEL` normal interval of a value with standard error ``se``."""
    return stats.norm.ppf(0.5 + LEVEL / 2) * se


def se_from_ci(width):
    """Standard error of a stored :data:`LEVEL` normal interval of width ``hi - lo``."""
    return width / (2 * stats.norm.ppf(0.5 + LEVEL / 2))


def summarise(name: str, values: np.ndarray, ses: np.ndarray, transform=None) -> Estimate:
    """Mean and CI of per-seed values (t-interval), or with one seed value ± z·se."""
    transform = transform or (lambda x: x)
    values = np.asarray(values, dtype=float)
    if len(values) == 0:
        return Estimate(name, math.nan)
    if len(values) == 1:
        v, se = float(values[0]), float(ses[0])
        if math.isnan(se):  # no stored CI: a CI-based check is not measured
            return Estimate(name, transform(v), n_seeds=1, ci=NO_CI)
        half = normal_half_width(se)
        return Estimate(name, transform(v), transform(v - half), transform(v + half), 1, RUN_CI)
    mean = float(values.mean())
    half = t_half_width(values)
    t = transform
    return Estimate(name, t(mean), t(mean - half), t(mean + half), len(values), SEED_CI,
                    seed_mean=mean, seed_sd=float(values.std(ddof=1)),
                    log_scale=transform is math.exp)  # fmt: skip


def widened(e: Estimate, boot: tuple[float, float] | None, transform=None) -> Estimate:
    """``e`` (a seed interval of NLL differences) widened to the bootstrap interval ``boot``
    where that is wider, then ``transform`` (e.g. exp) applied to value and ends."""
    if boot is not None and not math.isnan(e.value):
        lo, hi = boot if math.isnan(e.lo) else (min(e.lo, boot[0]), max(e.hi, boot[1]))
        e.lo, e.hi, e.ci = lo, hi, (SEED_DOC_CI if e.n_seeds > 1 else DOC_CI)
    if transform is not None:
        e.value, e.lo, e.hi = (
            transform(x) if not math.isnan(x) else x for x in (e.value, e.lo, e.hi)
        )
        e.log_scale = transform is math.exp
    return e


#: Per seed, one side's per-document NLL sums and token counts.
DocSums = dict[int, tuple[np.ndarray, np.ndarray]]


def seed_doc_interval(
    sides: list[tuple[DocSums, DocSums, float]], seeds: list[int]
) -> tuple[float, float] | None:
    """Percentile interval of the seed mean of sum(sign x (NLL a - NLL b)) over ``sides`` under a
    two-level bootstrap: ``seeds`` with replacement (one draw shared by every side), then each
    drawn seed's documents with replacement (one draw per side, shared by its a and b: the
    documents pair). None without seeds or where a side's a and b hold different documents."""
    if not seeds or any(len(da[s][0]) != len(db[s][0]) for da, db, _ in sides for s in seeds):
        return None
    rng = np.random.default_rng(0)
    n_seeds = len(seeds)
    pick = rng.integers(0, n_seeds, size=(BOOTSTRAP, n_seeds))  # [B, S]
    seed_of = pick[:, :, None]
    total = np.zeros((BOOTSTRAP, n_seeds))
    for da, db, sign in sides:
        sa, ca = (np.stack([da[s][i] for s in seeds]) for i in (0, 1))  # [S, D]
        sb, cb = (np.stack([db[s][i] for s in seeds]) for i in (0, 1))
        docs = rng.integers(0, sa.shape[1], size=(BOOTSTRAP, n_seeds, sa.shape[1]))  # [B, S, D]
        nll_a = sa[seed_of, docs].sum(-1) / ca[seed_of, docs].sum(-1)  # [B, S]
        nll_b = sb[seed_of, docs].sum(-1) / cb[seed_of, docs].sum(-1)
        total += sign * (nll_a - nll_b)
    lo, hi = np.quantile(total.mean(axis=1), [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(lo), float(hi)
