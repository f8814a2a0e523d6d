"""LongPPL finding (issue #55 item 4), written and committed with its thresholds before any row it
judges exists (no model has LongPPL rows at commit time; the rule below is fixed here).

- **P1** (Fang et al. 2025: LongPPL correlates with long-context benchmark scores where perplexity
  does not): across the series of a study that have both, LongPPL's Spearman rank correlation
  with the RULER effective length is stronger (more negative: lower LongPPL, longer effective
  length) than perplexity's. Per series (family x method x fine-tune): the RULER effective length
  of the tasks' mean (headline score, relative threshold; median over seeds), and LongPPL and
  perplexity at the **comparison length**, the longest eval length at which every such series
  has both (each pooled over seeds: LongPPL by key tokens, perplexity by tokens). The statistic
  is rho(perplexity) - rho(LongPPL), with a percentile bootstrap interval over series
  (:data:`BOOTSTRAP` resamples, seed 0); holds when the interval is above 0, fails when it is wholly below
  0; one that ends at exactly 0 (ties) is not decided (:func:`gap_check`, amended 2026-12-07).
  Needs at least :data:`MIN_SERIES` series, each with at least :data:`MIN_KEY_TOKENS` key tokens
  at the comparison length (pooled over seeds). That floor was added after the first RULER run
  (results/ruler_longppl) chose one key token per length: a LongPPL of one token is that token's
  perplexity, not a measurement (reports/ruler_longppl/README.md). Every series counts, models
  with a switch on too (stick-breaking attention is a zoo_2025 family): the scope's default of
  leaving switched models out was corrected after the 13-series run, before its P1 was read.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from bench.core.series import SWITCH_COLUMNS
from bench.core.stats import UNDECIDED, Check, Estimate, decide
from bench.findings.registry import NOT_MEASURED, FindingResult, Scope, register_finding, status
from bench.findings.rows import col, window_nll, with_series

#: Where a report lists this module's findings: after the RULER study's.
ORDER = 5
MIN_SERIES = 5  # fewer cannot rank anything
BOOTSTRAP = 2000  # resamples of the series for the interval
# a series' log-LongPPL has a standard error of about sd(NLL) / sqrt(n), sd ~2-3 nats on key
# tokens: 100 of them resolve about 0.5 nats between two series
MIN_KEY_TOKENS = 100
LEVEL = 0.95
P1_CI = f"percentile bootstrap over series ({BOOTSTRAP} resamples)"
TABLE_COLUMNS = ["eff", "longppl", "ppl", "length", "key_tokens"]  # series_table's


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN when a side is constant."""
    rx = pd.Series(x).rank().to_numpy(dtype=float)
    ry = pd.Series(y).rank().to_numpy(dtype=float)
    if np.std(rx) == 0 or np.std(ry) == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def series_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per series: effective length (median over seeds), LongPPL and perplexity at the
    comparison length (module doc); columns ``eff``, ``longppl``, ``ppl``, ``length`` and
    ``key_tokens`` (LongPPL's key tokens there, summed over seeds)."""
    df = with_series(df)
    eff = df[
        (df["metric"] == "effective_length")
        & (col(df, "task") == "average")
        & (col(df, "axis") == "relative_threshold")
    ]
    if "task_params" in eff.columns:
        headline = ['"headline":false' not in str(p).replace(" ", "") for p in eff["task_params"]]
        eff = eff[pd.Series(headline, index=eff.index, dtype=bool)]
    effective = eff.groupby("_series")["value"].median()
    long = df[(df["metric"] == "longppl") & (df["n"] > 0)]
    nll = window_nll(df)
    both = set(effective.index) & set(long["_series"]) & set(nll["_series"])
    if not both:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    lengths = None
    for series in both:
        have = set(long.loc[long["_series"] == series, "eval_length"])
        have &= set(nll.loc[nll["_series"] == series, "eval_length"])
        lengths = have if lengths is None else lengths & have
    if not lengths:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    length = max(lengths)
    out = []
    for series in sorted(both):
        lp = long[(long["_series"] == series) & (long["eval_length"] == length)]
        pp = nll[(nll["_series"] == series) & (nll["eval_length"] == length)]
        log_lp = float(np.average(np.log(lp["value"].astype(float)), weights=lp["n"]))
        mean_nll = float(np.average(pp["value"].astype(float), weights=pp["n"]))
        out.append({"series": series, "eff": float(effective[series]),
                    "longppl": math.exp(log_lp), "ppl": math.exp(mean_nll), "length": length,
                    "key_tokens": int(lp["n"].sum())})  # fmt: skip
    return pd.DataFrame(out).set_index("series")


def correlation_gap(t: pd.DataFrame) -> Estimate:
    """rho(perplexity, eff) - rho(LongPPL, eff) with its bootstrap interval over series."""
    eff, lp, pp = (t[c].to_numpy(dtype=float) for c in ("eff", "longppl", "ppl"))
    gap = spearman(pp, eff) - spearman(lp, eff)
    rng = np.random.default_rng(0)
    boots = []
    for _ in range(BOOTSTRAP):
        i = rng.integers(0, len(t), len(t))
        b = spearman(pp[i], eff[i]) - spearman(lp[i], eff[i])
        if math.isfinite(b):
            boots.append(b)
    if not math.isfinite(gap) or len(boots) < BOOTSTRAP // 2:
        return Estimate("rho(ppl) - rho(LongPPL)", gap)
    lo, hi = np.quantile(boots, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return Estimate("rho(ppl) - rho(LongPPL)", gap, float(lo), float(hi), 0, P1_CI)


def gap_check(gap: Estimate) -> Check:
    """Holds when the gap's interval is above 0, fails when it is wholly below 0; an interval
    that ends at exactly 0 is not decided. With a handful of series many resamples rank them
    identically under both measures, so the gap is exactly 0 in them: an upper end of 0 is a tie,
    not a measured negative (the audit of issue #73, on ruler_longppl_k16's [-0.629, 0.000];
    until 2026-12-07 that read "does not hold")."""
    check = decide(gap, 0.0, "above")
    if check is False and not gap.hi < 0:
        return UNDECIDED
    return check


@register_finding(
    "P1",
    Scope(metrics=("longppl",), also_switches=tuple(SWITCH_COLUMNS)),  # every series of a study
    claim="across a study's series, LongPPL's Spearman correlation with the RULER effective "
    "length is stronger (more negative) than perplexity's, at the longest length where every "
    "series has both, each on at least MIN_KEY_TOKENS key tokens there (a floor added after the "
    "first RULER run, whose evaluator chose one key token per length)",
    source="Fang et al. 2025, What is Wrong with Perplexity for Long-context Language Modeling? "
    "(ICLR 2025), Section 4",
    thresholds={
        "MIN_SERIES": MIN_SERIES,
        "MIN_KEY_TOKENS": MIN_KEY_TOKENS,
        "BOOTSTRAP": BOOTSTRAP,
        "LEVEL": LEVEL,
    },
)
def p1_longppl_tracks_effective_length(df: pd.DataFrame) -> FindingResult:
    t = series_table(df)
    if len(t) < MIN_SERIES:
        return FindingResult(
            status=NOT_MEASURED,
            missing=[
                f"{MIN_SERIES} series with RULER effective lengths, LongPPL and perplexity "
                f"at one length (found {len(t)})"
            ],  # fmt: skip
        )
    few = t[t["key_tokens"] < MIN_KEY_TOKENS]
    if len(few):
        counts = ", ".join(map(str, sorted(set(few["key_tokens"]))))
        return FindingResult(
            status=NOT_MEASURED,
            missing=[
                f"LongPPL on at least {MIN_KEY_TOKENS} key tokens per series at length "
                f"{int(t['length'].iloc[0])} ({len(few)} of {len(t)} series have {counts})"
            ],
        )
    gap = correlation_gap(t)
    rho_lp = spearman(t["longppl"].to_numpy(float), t["eff"].to_numpy(float))
    rho_pp = spearman(t["ppl"].to_numpy(float), t["eff"].to_numpy(float))
    result = FindingResult(status=status([gap_check(gap)]), estimates=[gap])
    result.notes.append(
        f"{len(t)} series at length {int(t['length'].iloc[0])}: rho(LongPPL) {rho_lp:.3f}, "
        f"rho(perplexity) {rho_pp:.3f}"
    )
    return result
