"""The position-encoding zoo's findings (issue #25), registered beside F1-F6.

Z1 and Z2 restate published claims about the zoo's families (``models.zoo``) as checks on a
results table, with thresholds fixed before the zoo's reference run:

- **Z1**, shift probe: a relative family's logits depend on i - j only (or, for CoPE, on no
  position id at all), so offsetting every position id changes nothing; FIRE normalises by the
  query position, so it is not shift invariant by design, nor are sinusoidal and learned.
- **Z2**, extrapolation ordering: each bias family degrades less from L to 4L than sinusoidal
  and than raw RoPE, the ordering its paper reports. Compared per seed (the same seed draws the
  same data for every family), as the ratio of the two families' perplexity ratios
  ppl_b(4L)/ppl_b(L) / (ppl_o(4L)/ppl_o(L)) with the seed t-interval widened to a seed x
  document bootstrap; the claim holds when the interval lies below 1.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from bench.findings import (
    FAR,
    SHIFT_ZERO_TOL,
    Estimate,
    FindingResult,
    Scope,
    _all,
    _named,
    _per_seed,
    _status,
    _summarise,
    _window_nll,
    by_series,
    decide,
    register_finding,
    seed_doc_bootstrap_terms,
    select,
    shift_invariant_checks,
    shift_sensitive_checks,
    widened,
)
from bench.series import series_labels

#: Z1: families whose logits do not depend on absolute position ids.
RELATIVE_FAMILIES = ("t5", "kerple_log", "kerple_power", "sandwich", "xpos", "p_rope", "cope")
#: Z1: families whose logits do (FIRE through its query-position normaliser).
POSITION_DEPENDENT_FAMILIES = ("fire", "sinusoidal", "learned")
#: Z2: the bias families and the encodings their papers report them extrapolating better than.
BIAS_FAMILIES = ("t5", "kerple_log", "kerple_power", "fire", "sandwich")
BASELINES = ("sinusoidal", "rope")


@register_finding(
    "Z1",
    Scope(
        positions=(*RELATIVE_FAMILIES, "fire"),
        scalings=("none",),
        metrics=("shift_dnll",),
        finetunes=("none",),
    ),
)
def z1_zoo_shift_probe(df: pd.DataFrame) -> FindingResult:
    est, checks, missing = shift_invariant_checks(df, RELATIVE_FAMILIES)
    parts = shift_sensitive_checks(df, POSITION_DEPENDENT_FAMILIES)
    for part, out in zip(parts, (est, checks, missing), strict=True):
        out.extend(part)
    return FindingResult(
        "Z1",
        f"zoo shift probe: |dNLL| <= {SHIFT_ZERO_TOL} for {', '.join(RELATIVE_FAMILIES)}; CI > 0 "
        f"at the largest delta for {', '.join(POSITION_DEPENDENT_FAMILIES)}",
        _status(checks),
        "relative by construction: Raffel et al. 2020 (T5), Chi et al. 2022 (KERPLE), Chi et al. "
        "2023 (Sandwich), Sun et al. 2023 (xPos), Barbero et al. 2025 (p-RoPE), Golovneva et al. "
        "2024 (CoPE: no position ids); Li et al. 2024, FIRE (normalised by the query "
        "position: position-dependent by design)",
        est,
        missing,
    )


def log_ratio_per_seed(rows: pd.DataFrame, multiple: float = FAR) -> pd.DataFrame:
    """Per seed of one series: NLL(multiple x L) - NLL(L), the log of its perplexity ratio, with
    an se from the stored CIs (columns seed, value, se)."""
    far, near = (_per_seed(_window_nll(rows), m) for m in (multiple, 1))
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
    e = _summarise(name, m["value_b"] - m["value_o"], np.hypot(m["se_b"], m["se_o"]))
    boot = seed_doc_bootstrap_terms([(b, multiple, o, multiple, 1.0), (b, 1, o, 1, -1.0)])
    return widened(e, boot, math.exp)


def _series_of(df: pd.DataFrame, position: str) -> list[tuple[str, pd.DataFrame, pd.DataFrame]]:
    """(series key, whole-window nll rows, log ratio per seed) per raw series of ``position``."""
    return [(k, g, log_ratio_per_seed(g)) for k, g in by_series(_window_nll(select(df, position)))]


@register_finding(
    "Z2", Scope(positions=BIAS_FAMILIES, scalings=("none",), metrics=("nll",), finetunes=("none",))
)
def z2_bias_extrapolation_order(df: pd.DataFrame) -> FindingResult:
    est, checks, missing = [], [], []
    baselines = {o: _series_of(df, o) for o in BASELINES}
    for family in BIAS_FAMILIES:
        b_series = _series_of(df, family)
        family_checks = []
        for baseline, o_series in baselines.items():
            # labels among each side's series (what differs within a family)
            labels_b = series_labels([k for k, *_ in b_series])
            labels_o = series_labels([k for k, *_ in o_series])
            found = False
            for kb, b, per_b in b_series:
                for ko, o, per_o in o_series:
                    name = f"{family}/{baseline} ppl ratio {FAR}L/L"
                    name = _named(_named(name, kb, labels_b), ko, labels_o)
                    e = ratio_of_ratios(name, b, o, per_seed=(per_b, per_o))
                    if math.isnan(e.value):
                        continue
                    found = True
                    est.append(e)
                    family_checks.append(decide(e, 1.0, "below"))
            if not found:
                missing.append(f"{family} vs {baseline} at L and {FAR}L")
                family_checks.append(None)
        checks.append(_all(family_checks))
    return FindingResult(
        "Z2",
        f"each bias family ({', '.join(BIAS_FAMILIES)}) degrades less from L to {FAR}L than "
        f"sinusoidal and raw RoPE: ratio of the perplexity ratios {FAR}L/L, CI < 1",
        _status(checks),
        "Press et al. 2022, Fig. 1 and Tables 2-3 (T5 bias vs sinusoidal and rotary, "
        "WikiText-103); Chi et al. 2022, KERPLE, Table 3 (log and power vs rotary and sinusoidal "
        "at 4x, three corpora); Chi et al. 2023, Sandwich (ACL 2023) and Li et al. 2024, FIRE "
        "(ICLR 2024): length extrapolation vs sinusoidal / RoPE (their table numbers not "
        "verified offline)",
        est,
        missing,
    )
