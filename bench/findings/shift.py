"""The shift probe's checks, shared by F6 (the findings reference) and Z1 (the zoo): offsetting
every position id changes nothing for an encoding whose logits read only i - j, and changes the
NLL of one whose logits read absolute positions."""

from __future__ import annotations

import pandas as pd

from bench.core.series import series_labels
from bench.core.stats import Estimate, decide, summarise
from bench.findings.rows import by_series, named, per_seed, shift_rows

#: F6, Z1: |shift ΔNLL| (nats) at every delta > 0 that counts as "≈ 0" for relative encodings.
SHIFT_ZERO_TOL = 0.01


def _per_series(df: pd.DataFrame, positions: tuple[str, ...], check):
    """(estimates, checks, missing) of ``check(pos, name_of, rows) -> (Estimate, Check)`` on each
    series of shift rows of each family in ``positions`` (a family without rows: missing)."""
    est, checks, missing = [], [], []
    for pos in positions:
        series = by_series(shift_rows(df, pos))
        if not series:
            missing.append(pos)
            checks.append(None)
        labels = series_labels([k for k, _ in series])
        for key, rows in series:
            e, ok = check(pos, lambda name, k=key, ls=labels: named(name, k, ls), rows)
            est.append(e)
            checks.append(ok)
    return est, checks, missing


def shift_invariant_checks(df: pd.DataFrame, positions: tuple[str, ...]):
    """(estimates, checks, missing): per series of each relative family, the largest |shift
    ΔNLL| over every delta > 0, checked against :data:`SHIFT_ZERO_TOL` (a tolerance on a value,
    not on an interval: relative encodings give 0 up to rounding)."""

    def check(pos, name_of, rows):
        worst = float(rows["value"].abs().max())
        e = Estimate(name_of(f"{pos} max |dNLL|"), worst, n_seeds=rows["seed"].nunique())
        return e, worst <= SHIFT_ZERO_TOL

    return _per_series(df, positions, check)


def shift_sensitive_checks(df: pd.DataFrame, positions: tuple[str, ...]):
    """(estimates, checks, missing): per series of each position-dependent family, shift ΔNLL at
    the largest delta, checked for CI > 0."""

    def check(pos, name_of, rows):
        top = rows[rows["delta"] == rows["delta"].max()]
        r = per_seed(top, None)
        e = summarise(name_of(f"{pos} dNLL at delta={int(top['delta'].iloc[0])}"), r["value"],
                      r["se"])  # fmt: skip
        return e, decide(e, 0.0, "above")

    return _per_series(df, positions, check)
