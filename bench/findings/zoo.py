"""The position-encoding zoo's findings (issue #25), listed after F1-F6.

Z1 and Z2 restate published claims about the zoo's families (``models.families.zoo``) as checks on a
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

import pandas as pd

from bench.core.series import series_labels
from bench.core.stats import decide
from bench.findings.estimates import FAR, log_ratio_per_seed, ratio_of_ratios
from bench.findings.registry import FindingResult, Scope, all_of, register_finding, status
from bench.findings.rows import by_series, named, select, window_nll
from bench.findings.shift import SHIFT_ZERO_TOL, shift_invariant_checks, shift_sensitive_checks

#: Z1: families whose logits do not depend on absolute position ids.
RELATIVE_FAMILIES = ("t5", "kerple_log", "kerple_power", "sandwich", "xpos", "p_rope", "cope")
#: Z1: families whose logits do (FIRE through its query-position normaliser).
POSITION_DEPENDENT_FAMILIES = ("fire", "sinusoidal", "learned")
#: Z2: the bias families and the encodings their papers report them extrapolating better than.
BIAS_FAMILIES = ("t5", "kerple_log", "kerple_power", "fire", "sandwich")
BASELINES = ("sinusoidal", "rope")
#: Where a report lists this module's findings: after F1-F6's.
ORDER = 1


@register_finding(
    "Z1",
    Scope(
        positions=(*RELATIVE_FAMILIES, "fire"),
        scalings=("none",),
        metrics=("shift_dnll",),
        finetunes=("none",),
    ),
    thresholds={"SHIFT_ZERO_TOL": SHIFT_ZERO_TOL},
    claim=f"zoo shift probe: |dNLL| <= {SHIFT_ZERO_TOL} for {', '.join(RELATIVE_FAMILIES)}; CI > 0 "
    f"at the largest delta for {', '.join(POSITION_DEPENDENT_FAMILIES)}",
    source="relative by construction: Raffel et al. 2020 (T5), Chi et al. 2022 (KERPLE), Chi et al. "
    "2023 (Sandwich), Sun et al. 2023 (xPos), Barbero et al. 2025 (p-RoPE), Golovneva et al. "
    "2024 (CoPE: no position ids); Li et al. 2024, FIRE (normalised by the query "
    "position: position-dependent by design)",
)
def z1_zoo_shift_probe(df: pd.DataFrame) -> FindingResult:
    est, checks, missing = shift_invariant_checks(df, RELATIVE_FAMILIES)
    parts = shift_sensitive_checks(df, POSITION_DEPENDENT_FAMILIES)
    for part, out in zip(parts, (est, checks, missing), strict=True):
        out.extend(part)
    return FindingResult(status=status(checks), estimates=est, missing=missing)


def _series_of(df: pd.DataFrame, position: str) -> list[tuple[str, pd.DataFrame, pd.DataFrame]]:
    """(series key, whole-window nll rows, log ratio per seed) per raw series of ``position``."""
    return [(k, g, log_ratio_per_seed(g)) for k, g in by_series(window_nll(select(df, position)))]


@register_finding(
    "Z2",
    Scope(positions=BIAS_FAMILIES, scalings=("none",), metrics=("nll",), finetunes=("none",)),
    thresholds={"FAR": FAR},
    claim=f"each bias family ({', '.join(BIAS_FAMILIES)}) degrades less from L to {FAR}L than "
    f"sinusoidal and raw RoPE: ratio of the perplexity ratios {FAR}L/L, CI < 1",
    source="Press et al. 2022, Fig. 1 and Tables 2-3 (T5 bias vs sinusoidal and rotary, "
    "WikiText-103); Chi et al. 2022, KERPLE, Table 3 (log and power vs rotary and sinusoidal "
    "at 4x, three corpora); Chi et al. 2023, Sandwich (ACL 2023) and Li et al. 2024, FIRE "
    "(ICLR 2024): length extrapolation vs sinusoidal / RoPE (their table numbers not "
    "verified offline)",
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
                    name = named(named(name, kb, labels_b), ko, labels_o)
                    e = ratio_of_ratios(name, b, o, per_seed=(per_b, per_o))
                    if math.isnan(e.value):
                        continue
                    found = True
                    est.append(e)
                    family_checks.append(decide(e, 1.0, "below"))
            if not found:
                missing.append(f"{family} vs {baseline} at L and {FAR}L")
                family_checks.append(None)
        checks.append(all_of(family_checks))
    return FindingResult(status=status(checks), estimates=est, missing=missing)
