"""The estimates findings make from result rows: per-seed NLL differences and perplexity ratios
with their intervals (seed t-interval, widened to a seed x document bootstrap), the ratio of two
series' perplexity ratios, and a passkey accuracy with its Wilson interval. Built from
:mod:`bench.findings.rows` (which rows) and :mod:`bench.core.stats` (the intervals)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from bench.core.series import series_labels
from bench.core.stats import (
    ACC_CI,
    Estimate,
    seed_doc_interval,
    summarise,
    t_half_width,
    widened,
    wilson,
)
from bench.findings.rows import (
    by_series,
    doc_sums,
    named,
    per_seed,
    trials,
    window_nll,
)

#: Eval length (multiple of the training length L) at which degradation is judged.
FAR = 4


def nll_difference(a: pd.DataFrame, b: pd.DataFrame, multiple_a: float, multiple_b: float):
    """Per-seed NLL(a at multiple_a x L) - NLL(b at multiple_b x L), paired on seeds (``a`` and
    ``b`` are rows of one series each); and ses."""
    ra, rb = per_seed(window_nll(a), multiple_a), per_seed(window_nll(b), multiple_b)
    m = ra.merge(rb, on="seed", suffixes=("_a", "_b"))
    return (m["value_a"] - m["value_b"]).to_numpy(), np.hypot(m["se_a"], m["se_b"]).to_numpy()


def seed_doc_bootstrap(
    a: pd.DataFrame, b: pd.DataFrame, multiple_a: float, multiple_b: float
) -> tuple[float, float] | None:
    """Percentile interval of the seed-mean NLL difference (a at multiple_a x L minus b at
    multiple_b x L) under a two-level bootstrap: seeds with replacement, then each drawn seed's
    documents with replacement (one draw for both sides: the documents pair). None when the rows
    carry no per-document sums, or the two sides' documents differ."""
    return seed_doc_bootstrap_terms([(a, multiple_a, b, multiple_b, 1.0)])


#: One paired term of :func:`seed_doc_bootstrap_terms`: (rows a, multiple a, rows b, multiple b,
#: sign): sign x (NLL of a at multiple a x L - NLL of b at multiple b x L).
Term = tuple[pd.DataFrame, float, pd.DataFrame, float, float]


def seed_doc_bootstrap_terms(terms: list[Term]) -> tuple[float, float] | None:
    """:func:`seed_doc_bootstrap` of a signed sum of paired differences: one seed draw shared by
    every term (seeds pair across terms), one document draw per term shared by its two sides
    (its documents pair). None when any term lacks per-document sums or its sides' documents
    differ."""
    sides, seeds = [], None
    for a, multiple_a, b, multiple_b, sign in terms:
        da, db = doc_sums(a, multiple_a), doc_sums(b, multiple_b)
        common = set(da) & set(db)
        seeds = common if seeds is None else seeds & common
        sides.append((da, db, sign))
    return seed_doc_interval(sides, sorted(seeds or ()))


def difference_estimate(
    name: str,
    a: pd.DataFrame,
    b: pd.DataFrame,
    multiple_a: float,
    multiple_b: float,
    transform=None,
) -> Estimate:
    """NLL(a at multiple_a x L) - NLL(b at multiple_b x L) of one series each, paired on seeds:
    the seed mean with its interval (t-interval across seeds, or one seed's stored CIs), widened
    to the seed x document bootstrap (:func:`seed_doc_bootstrap`) where that is wider, so the
    interval covers which documents were drawn as well as which seeds."""
    diff, se = nll_difference(a, b, multiple_a, multiple_b)
    e = summarise(name, diff, se)
    boot = seed_doc_bootstrap(a, b, multiple_a, multiple_b) if len(diff) else None
    return widened(e, boot, transform)


def ppl_ratio(rows: pd.DataFrame, name: str, multiple: float = FAR) -> Estimate:
    """Perplexity at ``multiple`` x L over perplexity at L of one series' rows: exp of the
    per-seed NLL difference, so with several seeds the geometric mean of the per-seed ratios, and
    the interval of :func:`difference_estimate` on log scale.

    Without per-document sums and with one seed, the CI treats the two lengths' stored CIs as
    independent; they share documents, so it is wider than a paired interval (conservative)."""
    return difference_estimate(name, rows, rows, multiple, 1, transform=math.exp)


def ppl_ratios(rows: pd.DataFrame, name: str, multiple: float = FAR) -> list[tuple[str, Estimate]]:
    """:func:`ppl_ratio` per series of ``rows`` with whole-window NLL at L and ``multiple`` x L
    (series key, estimate); names carry the series label where there are several."""
    measured = [(k, g) for k, g in by_series(window_nll(rows))]
    labels = series_labels([k for k, _ in measured])
    out = []
    for key, g in measured:
        e = ppl_ratio(g, named(name, key, labels), multiple)
        if not math.isnan(e.value):
            out.append((key, e))
    return out


def log_ratio_per_seed(rows: pd.DataFrame, multiple: float = FAR) -> pd.DataFrame:
    """Per seed of one series: NLL(multiple x L) - NLL(L), the log of its perplexity ratio, with
    an se from the stored CIs (columns seed, value, se)."""
    far, near = (per_seed(window_nll(rows), m) for m in (multiple, 1))
    m = far.merge(near, on="seed", suffixes=("_far", "_near"))
    return pd.DataFrame(
        {
            "seed": m["seed"],
            "value": m["value_far"] - m["value_near"],
            "se": np.hypot(m["se_far"], m["se_near"]),
        }
    )


def ratio_of_ratios(
    name: str,
    b: pd.DataFrame,
    o: pd.DataFrame,
    multiple: float = FAR,
    per_seed: tuple[pd.DataFrame, pd.DataFrame] | None = None,
) -> Estimate:
    """[ppl_b(multiple x L) / ppl_b(L)] / [ppl_o(multiple x L) / ppl_o(L)] of one series each,
    paired on seeds: exp of the seed mean of the per-seed log differences, with the seed
    t-interval (or one seed's stored CIs) widened to a seed x document bootstrap where that is
    wider. ``per_seed``: the two series' :func:`log_ratio_per_seed`, if computed already."""
    lb, lo_ = per_seed or (log_ratio_per_seed(b, multiple), log_ratio_per_seed(o, multiple))
    m = lb.merge(lo_, on="seed", suffixes=("_b", "_o"))
    if m.empty:
        return Estimate(name, math.nan)
    e = summarise(name, m["value_b"] - m["value_o"], np.hypot(m["se_b"], m["se_o"]))
    boot = seed_doc_bootstrap_terms([(b, multiple, o, multiple, 1.0), (b, 1, o, 1, -1.0)])
    return widened(e, boot, math.exp)


def accuracy_estimate(rows: pd.DataFrame, name: str) -> Estimate:
    """Passkey accuracy of one series at one length: the pooled rate with the Wilson interval of
    all trials; with several seeds the interval is widened to the t-interval of the per-seed
    accuracies where that is wider (seeds differ more than their trials say: README, Protocol).
    """
    t = trials(rows)
    if t.empty or t["n"].sum() <= 0:
        return Estimate(name, math.nan)
    k, n = float(t["k"].sum()), float(t["n"].sum())
    lo, hi = wilson(k, n)
    if len(t) >= 2:
        acc = t["acc"].to_numpy(dtype=float)
        half = t_half_width(acc)
        lo, hi = min(lo, max(0.0, acc.mean() - half)), max(hi, min(1.0, acc.mean() + half))
    return Estimate(name, k / n, lo, hi, len(t), ACC_CI)
