"""RULER findings (issue #28), listed after F1-F6, Z1-Z2, T1-T3 and L1-L3.

R1-R2 restate RULER's claims (Hsieh et al. 2024) as checks on a results table, with thresholds
fixed before the study's reference run (``+experiment=ruler``; reports/ruler/README.md):

- **R1**: multi-key and multi-value needle retrieval degrade with length faster than
  single-needle retrieval. Per series, task (``niah_multikey``, ``niah_multivalue``) and length
  kL > L: the task's relative drop in exact accuracy from L, 1 - acc(kL) / acc(L), minus
  ``niah_single``'s, trials of all seeds pooled (:func:`relative_drop_difference`); each
  difference must be above 0. A task that fails at L is an observation of its own. Amended on
  2026-12-07 after the audit of issue #73: R1 compared absolute drops, which the level at L caps
  (a task at 0.4 at L can drop at most 0.4), so a harder task read "degrades less" whenever every
  task fell to 0; the relative drop removes that cap. Before 2026-12-06 R1 compared the
  accuracies at each length beyond L, which read a failure at L as "harder beyond L".
- **R2** (RULER's "perplexity does not show it", in the spirit of LongPPL): a method's effective
  length is below the length up to which its perplexity stays flat. Per series and seed: the
  effective length of the tasks' mean at the relative threshold (``effective_length`` rows,
  task ``average``, axis ``relative_threshold``) against the largest evaluated length with
  ppl(x) / ppl(L) <= :data:`FLAT_RATIO` (F2's bar) at it and every shorter length. Checked for
  the series whose perplexity stays flat beyond L on every seed (where the claim can show);
  holds when the effective length is below on every seed, fails when it is below on none. A seed
  whose tasks' mean at L is 0 has no effective length (the rows' 0 there means "fails at L") and
  is left out, with a note (until 2026-12-06 it counted as "below").
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from bench.core.results import effective_length_score
from bench.core.series import series_labels
from bench.core.stats import UNDECIDED, Check, Estimate, decide, t_half_width, wilson
from bench.findings.core import ALIBI_MAX_RATIO, NEAR_ZERO_ACC
from bench.findings.estimates import accuracy_estimate
from bench.findings.registry import (
    NOT_MEASURED,
    FindingResult,
    Scope,
    register_finding,
    status,
)
from bench.findings.rows import col, trials, window_nll, with_series

#: R1: the tasks compared with niah_single.
R1_HARDER = ("niah_multikey", "niah_multivalue")
#: Where a report lists this module's findings: after the train-for-length study's.
ORDER = 4
#: R2: "flat" = ppl(x) / ppl(L) at most this (F2's bar, fixed before the run).
FLAT_RATIO = ALIBI_MAX_RATIO
#: R1's interval: Jeffreys-posterior draws of the four pooled accuracies (and their seed)
JEFFREYS_DRAWS = 20_000
LEVEL = 0.95
RELATIVE_DROP_CI = (
    "difference of two relative drops in pooled accuracy: percentiles over Jeffreys-posterior "
    "draws of the four accuracies, widened to the t-interval of the per-seed differences where wider"
)
NEWCOMBE_CI = (
    "difference of pooled accuracies: Newcombe's interval from the two Wilson intervals, widened "
    "to the t-interval of the per-seed differences where wider"
)


def _task_rows(df: pd.DataFrame) -> pd.DataFrame:
    task = col(df, "task")
    return with_series(df[task.notna() & (df["metric"] != "effective_length")])


def exact_rows(rows: pd.DataFrame, task: str) -> pd.DataFrame:
    """``task``'s exact-score rows."""
    return rows[
        (rows["task"] == task) & (rows["axis"] == "score") & (rows["axis_value"] == "exact")
    ]


def exact_trials(rows: pd.DataFrame, task: str) -> pd.DataFrame:
    """Per seed: successes and trials of ``task``'s exact score."""
    return trials(exact_rows(rows, task)).set_index("seed")[["k", "n"]]


def difference_of_accuracies(a: pd.DataFrame, b: pd.DataFrame, name: str) -> Estimate:
    """Accuracy of ``a`` minus ``b`` (per-seed successes/trials, seeds paired) with Newcombe's
    interval, widened by the seeds' t-interval (module doc)."""
    seeds = a.index.intersection(b.index)
    if len(seeds) == 0:
        return Estimate(name, math.nan)
    a, b = a.loc[seeds], b.loc[seeds]
    ka, na, kb, nb = a["k"].sum(), a["n"].sum(), b["k"].sum(), b["n"].sum()
    pa, pb = ka / na, kb / nb
    (la, ua), (lb, ub) = wilson(ka, na), wilson(kb, nb)
    d = pa - pb
    lo = d - math.sqrt((pa - la) ** 2 + (ub - pb) ** 2)
    hi = d + math.sqrt((ua - pa) ** 2 + (pb - lb) ** 2)
    if len(seeds) >= 2:
        per_seed = (a["k"] / a["n"] - b["k"] / b["n"]).to_numpy(dtype=float)
        half = t_half_width(per_seed)
        lo, hi = min(lo, per_seed.mean() - half), max(hi, per_seed.mean() + half)
    return Estimate(name, d, lo, hi, len(seeds), NEWCOMBE_CI)


def relative_drop_difference(
    single_at_l: pd.DataFrame,
    single_far: pd.DataFrame,
    other_at_l: pd.DataFrame,
    other_far: pd.DataFrame,
    name: str,
) -> Estimate:
    """How much more of its accuracy at L ``other`` loses at a longer length than ``single``
    does: (1 - o_kL / o_L) - (1 - s_kL / s_L) = s_kL / s_L - o_kL / o_L, trials of the seeds
    present in all four pooled. Relative, because an absolute drop is capped by the level at L
    (a task at 0.4 at L can lose at most 0.4, one at 0.9 up to 0.9). The interval: the 2.5 and
    97.5 percentiles of the statistic over :data:`JEFFREYS_DRAWS` draws of the four accuracies
    from their Jeffreys posteriors Beta(k + 1/2, n - k + 1/2) (the Jeffreys interval's own
    distribution, which keeps width at 0 and 1 where a binomial bootstrap collapses), widened to
    the t-interval of the per-seed statistics where wider."""
    parts = (single_far, single_at_l, other_far, other_at_l)
    seeds = parts[0].index
    for part in parts[1:]:
        seeds = seeds.intersection(part.index)
    if len(seeds) == 0:
        return Estimate(name, math.nan)
    sums = np.array([(p.loc[seeds, "k"].sum(), p.loc[seeds, "n"].sum()) for p in parts])
    if sums[1, 0] == 0 or sums[3, 0] == 0:  # no success at L on these seeds: no share to lose
        return Estimate(name, math.nan)
    sf, sl, of, ol = sums[:, 0] / sums[:, 1]
    d = sf / sl - of / ol
    rng = np.random.default_rng(0)
    draws = rng.beta(sums[:, 0] + 0.5, sums[:, 1] - sums[:, 0] + 0.5, (JEFFREYS_DRAWS, 4))
    stat = draws[:, 0] / draws[:, 1] - draws[:, 2] / draws[:, 3]
    lo, hi = (float(q) for q in np.quantile(stat, [(1 - LEVEL) / 2, (1 + LEVEL) / 2]))
    if len(seeds) >= 2:
        acc = [(p.loc[seeds, "k"] / p.loc[seeds, "n"]).to_numpy(dtype=float) for p in parts]
        with np.errstate(divide="ignore", invalid="ignore"):
            per_seed = acc[0] / acc[1] - acc[2] / acc[3]
        per_seed = per_seed[np.isfinite(per_seed)]  # a seed at 0 at L has no ratio
        if len(per_seed) >= 2:
            half = t_half_width(per_seed)
            lo, hi = min(lo, per_seed.mean() - half), max(hi, per_seed.mean() + half)
    return Estimate(name, float(d), lo, hi, len(seeds), RELATIVE_DROP_CI)


def _fails_at_l(accuracy: Estimate) -> bool:
    """A task the model does not do even at L: its accuracy's CI upper end <= NEAR_ZERO_ACC."""
    return decide(accuracy, NEAR_ZERO_ACC, "at_most") is True


@register_finding(
    "R1",
    Scope(metrics=("niah_single", *R1_HARDER)),
    claim="multi-key and multi-value needle retrieval lose a larger share of their exact "
    "accuracy at L, at every evaluated length beyond L, than single-needle retrieval does "
    "(difference of the relative drops 1 - acc(kL)/acc(L), CI > 0; a task that fails at L is an "
    "observation of its own, not R1's case)",
    source="Hsieh et al. 2024, RULER: What's the Real Context Size of Your Long-Context Language "
    "Models?, Section 5 / Figure 2 (multi-key NIAH and multi-value degrade first)",
    thresholds={"NEAR_ZERO_ACC": NEAR_ZERO_ACC},
)
def r1_multi_needle_harder(df: pd.DataFrame) -> FindingResult:
    rows = _task_rows(df)
    est, checks, missing, at_l_failures = [], [], [], []
    labels = series_labels(sorted(rows["_series"].unique())) if not rows.empty else {}
    for key, g in rows.groupby("_series", sort=True):
        label = labels.get(key, "")
        suffix = f" [{label}]" if label else ""
        train = int(g["train_length"].iloc[0])
        at_l = g[g["eval_length"] == train]
        single_l = exact_trials(at_l, "niah_single")
        if single_l.empty:
            missing.append(f"niah_single acc at L{suffix}")
            checks.append(None)
            continue
        beyond = sorted(int(x) for x in g["eval_length"].unique() if x > train)
        accuracy = {}  # at L, pooled Wilson widened to the seeds' t-interval (ACC_CI)
        for task in ("niah_single", *R1_HARDER):
            task_at_l = exact_rows(at_l, task)
            if not task_at_l.empty:
                accuracy[task] = accuracy_estimate(task_at_l, f"{task} acc at L{suffix}")
                est.append(accuracy[task])
        if _fails_at_l(accuracy["niah_single"]):
            at_l_failures.append(f"niah_single{suffix}")
            continue
        for task in R1_HARDER:
            other_l = exact_trials(at_l, task)
            if other_l.empty:
                missing.append(f"{task} acc at L{suffix}")
                checks.append(None)
                continue
            if _fails_at_l(accuracy[task]):  # nothing to lose beyond L: an observation, not R1's
                at_l_failures.append(f"{task}{suffix}")
                continue
            for length in beyond:
                at = g[g["eval_length"] == length]
                single, other = exact_trials(at, "niah_single"), exact_trials(at, task)
                x = length // train
                name = f"{task} relative drop - niah_single relative drop, L to {x}L{suffix}"
                if single.empty or other.empty:
                    missing.append(name)
                    checks.append(None)
                    continue
                e = relative_drop_difference(single_l, single, other_l, other, name)
                if math.isnan(e.value):  # 0 at L on the seeds present at this length too
                    at_l_failures.append(f"{task} or niah_single at L, seeds present at {x}L{suffix}")
                    continue
                est.append(e)
                checks.append(decide(e, 0.0, "above"))
    if rows.empty:
        missing.append("ruler rows")
        checks.append(None)
    elif not checks:
        missing.append("a series whose needle tasks work at L")
        checks.append(None)
    result = FindingResult(status=status(checks), estimates=est, missing=missing)
    if at_l_failures:
        result.notes.append(
            f"fails at L (exact accuracy's upper end <= {NEAR_ZERO_ACC}; no drop to compare): "
            + ", ".join(at_l_failures)
        )
    return result


def flat_length(nll: pd.DataFrame) -> int | None:
    """The largest evaluated length with ppl(x)/ppl(L) <= :data:`FLAT_RATIO` at it and every
    shorter one (one seed's whole-window rows); None without a row at L."""
    by_length = nll.groupby("eval_length")["value"].mean()
    train = int(nll["train_length"].iloc[0])
    if train not in by_length.index:
        return None
    best = train
    for length in sorted(x for x in by_length.index if x > train):
        if math.exp(by_length[length] - by_length[train]) > FLAT_RATIO:
            break
        best = int(length)
    return best


def _params(task_params) -> dict:
    return json.loads(task_params) if isinstance(task_params, str) and task_params else {}


def _r2_checks(eff: pd.DataFrame, nll: pd.DataFrame, score: str):
    """R2's estimates, checks and missing series on one score's effective-length rows."""
    est, checks, missing, none_at_l = [], [], [], []
    labels = series_labels(sorted(eff["_series"].unique())) if not eff.empty else {}
    for key, g in eff.groupby("_series", sort=True):
        label = labels.get(key, "")
        pairs, idle = [], 0
        for seed, e in g.groupby("seed"):
            if _params(e["task_params"].iloc[0]).get("reference_score", 1.0) <= 0:
                idle += 1  # does none of the tasks at L: no effective length to compare
                continue
            rows = nll[(nll["_series"] == key) & (nll["seed"] == seed)]
            flat = flat_length(rows) if not rows.empty else None
            if flat is not None:
                pairs.append((int(e["value"].iloc[0]), flat))
        name = f"effective length (relative, {score}) vs ppl-flat length" + (
            f" [{label}]" if label else ""
        )
        if idle:
            none_at_l.append(f"{label or 'the series'} ({idle} of {g['seed'].nunique()} seeds)")
        if not pairs:
            if not idle:
                missing.append(name)
            continue
        effective, flat = np.array(pairs).T
        below = int((effective < flat).sum())
        est.append(Estimate(f"{name}: effective median", float(np.median(effective)),
                            n_seeds=len(pairs), digits=0))  # fmt: skip
        est.append(Estimate(f"{name}: flat median", float(np.median(flat)), n_seeds=len(pairs),
                            digits=0))  # fmt: skip
        est.append(Estimate(f"{name}: seeds below", float(below), n_seeds=len(pairs), digits=0))
        train = int(g["train_length"].iloc[0])
        if (flat > train).all():  # perplexity flat beyond L on every seed: the claim can show
            check: Check = True if below == len(pairs) else (False if below == 0 else UNDECIDED)
            checks.append(check)
    return est, checks, missing, none_at_l


#: R2's claim, naming the headline score its rows were decided on.
R2_CLAIM = (
    "a method's effective length (tasks' mean of the {score} score, >= 0.85 x its score "
    "at L) is below the length up to which its perplexity stays flat (ppl(x)/ppl(L) <= "
    f"{FLAT_RATIO}), on every seed, for the series whose perplexity stays flat beyond L"
)


@register_finding(
    "R2",
    Scope(metrics=("effective_length",)),
    claim=R2_CLAIM.format(score="exact"),
    source="Hsieh et al. 2024, RULER, Section 1 (perplexity and passkey do not show the effective "
    "context); Fang et al. 2025, What is Wrong with Perplexity for Long-context Language "
    "Modeling? (LongPPL)",
    thresholds={"FLAT_RATIO": FLAT_RATIO},
)
def r2_effective_below_flat(df: pd.DataFrame) -> FindingResult:
    """Decided on the headline score's effective lengths (``eval.ruler.score``, exact by
    default; rows written before both scores were stored have one, their own); the other score's
    reading is reported beside it."""
    df = with_series(df)
    eff = df[
        (df["metric"] == "effective_length")
        & (col(df, "task") == "average")
        & (col(df, "axis") == "relative_threshold")
    ]
    params = col(eff, "task_params")
    eff = eff.assign(
        _score=[effective_length_score(p) for p in params],
        _headline=[bool(_params(p).get("headline", True)) for p in params],
    )
    nll = window_nll(df)
    is_headline = eff["_headline"].astype(bool)
    headline = eff.loc[is_headline]
    score = str(headline["_score"].iloc[0]) if not headline.empty else "exact"
    est, checks, missing, none_at_l = _r2_checks(headline, nll, score)
    notes = []
    if none_at_l:
        notes.append(
            f"left out, the tasks' {score} mean 0 at L (no effective length): "
            + ", ".join(none_at_l)
        )
    for other, rows in eff.loc[~is_headline].groupby("_score", sort=True):
        o_est, o_checks, _, _ = _r2_checks(rows, nll, str(other))
        est += o_est
        other_status = status(o_checks) if o_checks else NOT_MEASURED
        notes.append(f"on the {other} score (not the headline) R2 would be: {other_status}")
    if not checks:
        missing.append("a series whose perplexity stays flat beyond L on every seed")
        checks.append(None)
    result = FindingResult(
        claim=R2_CLAIM.format(score=score),
        status=status(checks),
        estimates=est,
        missing=missing,
    )
    result.notes += notes
    return result
