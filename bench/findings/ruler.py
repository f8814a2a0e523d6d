"""RULER findings (issue #28), listed after F1-F6, Z1-Z2, T1-T3 and L1-L3.

R1-R2 restate RULER's claims (Hsieh et al. 2024) as checks on a results table, with thresholds
fixed before the study's reference run (``+experiment=ruler``; reports/ruler/README.md):

- **R1**: multi-key and multi-value needle retrieval are harder than single-needle retrieval at
  every evaluated length beyond L. Per model and method (series) and length > L: the exact
  accuracy of ``niah_single`` minus that of ``niah_multikey`` (and of ``niah_multivalue``),
  trials of all seeds pooled, with Newcombe's interval for a difference of two proportions (from
  the two Wilson intervals), widened to the t-interval of the per-seed differences where that is
  wider; each difference must be above 0.
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
DEGRADATION_CI = (
    "difference of two drops in pooled accuracy: the four Wilson intervals combined (MOVER), "
    "widened to the t-interval of the per-seed differences where wider"
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


def degradation_difference(
    single_at_l: pd.DataFrame,
    single_far: pd.DataFrame,
    other_at_l: pd.DataFrame,
    other_far: pd.DataFrame,
    name: str,
) -> Estimate:
    """How much more ``other`` drops from L to a longer length than ``single`` does:
    (acc_other(L) - acc_other(kL)) - (acc_single(L) - acc_single(kL)), trials of the seeds
    present in all four pooled; the interval combines the four Wilson intervals (MOVER, as
    Newcombe's does for two) and is widened to the t-interval of the per-seed differences."""
    parts = (other_at_l, other_far, single_at_l, single_far)
    seeds = parts[0].index
    for part in parts[1:]:
        seeds = seeds.intersection(part.index)
    if len(seeds) == 0:
        return Estimate(name, math.nan)
    sums = [(p.loc[seeds, "k"].sum(), p.loc[seeds, "n"].sum()) for p in parts]
    acc = [k / n for k, n in sums]
    ci = [wilson(k, n) for k, n in sums]
    signs = (1, -1, -1, 1)
    d = sum(s * a for s, a in zip(signs, acc, strict=True))
    down = up = 0.0
    for sign, a, (lo, hi) in zip(signs, acc, ci, strict=True):
        below, above = a - lo, hi - a
        down += (below if sign > 0 else above) ** 2
        up += (above if sign > 0 else below) ** 2
    lo, hi = d - math.sqrt(down), d + math.sqrt(up)
    if len(seeds) >= 2:
        per_seed = sum(
            s * (p.loc[seeds, "k"] / p.loc[seeds, "n"]).to_numpy(dtype=float)
            for s, p in zip(signs, parts, strict=True)
        )
        half = t_half_width(per_seed)
        lo, hi = min(lo, per_seed.mean() - half), max(hi, per_seed.mean() + half)
    return Estimate(name, d, lo, hi, len(seeds), DEGRADATION_CI)


def _fails_at_l(accuracy: Estimate) -> bool:
    """A task the model does not do even at L: its accuracy's CI upper end <= NEAR_ZERO_ACC."""
    return decide(accuracy, NEAR_ZERO_ACC, "at_most") is True


@register_finding(
    "R1",
    Scope(metrics=("niah_single", *R1_HARDER)),
    claim="multi-key and multi-value needle retrieval degrade more from L to every evaluated "
    "length beyond L than single-needle retrieval does (difference of the drops in exact "
    "accuracy, CI > 0; a task that fails at L is an observation of its own, not R1's case)",
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
                name = f"{task} drop - niah_single drop, L to {x}L{suffix}"
                if single.empty or other.empty:
                    missing.append(name)
                    checks.append(None)
                    continue
                e = degradation_difference(single_l, single, other_l, other, name)
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
