"""Train-for-length findings (issue #27), listed after F1-F6, Z1-Z2 and T1-T3.

L1-L3 restate published claims as checks on a results table, with thresholds fixed before the
study's reference run (``+experiment=train_for_length``; reports/train_for_length/README.md).
Every comparison pairs two series of one arm (same experiment, arm, training length and corpus:
the same model size and data, seeds paired), as the ratio of the two perplexity ratios
ppl_a(4L)/ppl_a(L) / (ppl_b(4L)/ppl_b(L)) (:func:`bench.findings.estimates.ratio_of_ratios`):

- **L1** (Ruoss et al. 2023, randomized positional encodings; their claim is for algorithmic
  tasks, here it is checked for language modelling): a model trained on randomized positions
  degrades less from L to 4L than the same family trained on contiguous positions, for
  learned, sinusoidal and RoPE (the ratio's interval below 1). PoSE's and NoPE's ratios are
  reported beside them (NoPE reads no position: its ratio is the study's noise control), and so
  is each pair's perplexity at 4L (added after the first seed of the reference run showed
  randomized models flat from a much worse perplexity at L; the check is unchanged).
- **L2** (Yang et al. 2025, RNoPE-SWA; Llama 4's iRoPE): a hybrid NoPE/RoPE model degrades less
  from L to 4L than all-RoPE of the same size (interval below 1), for rnope_swa and irope.
- **L3** (Xiao et al. 2024, StreamingLLM's pre-training with a sink token, 160M: 18.01 vs 18.05;
  gpt-oss's learned sink logits): an attention sink leaves in-distribution perplexity unchanged:
  ppl_sink(L) / ppl_none(L) inside [1 / :data:`SINK_MARGIN`, :data:`SINK_MARGIN`] (the whole
  interval), for the learned sink and the sink token.
"""

from __future__ import annotations

import math

import pandas as pd

from bench.core.stats import Check, decide
from bench.findings.core import ALIBI_MAX_RATIO
from bench.findings.estimates import FAR, difference_estimate, ratio_of_ratios
from bench.findings.registry import FindingResult, Scope, all_of, register_finding, status
from bench.findings.rows import col, select

#: L1: the families whose extrapolation randomized positions should improve (Ruoss et al.).
L1_FAMILIES = ("learned", "sinusoidal", "rope")
#: L1: reported beside them, not checked (PoSE targets a fine-tune; NoPE is the noise control).
L1_REPORTED = (
    ("pose", "learned"),
    ("pose", "sinusoidal"),
    ("pose", "rope"),
    ("randomized", "nope"),
)
#: L2: the hybrid families compared with all-RoPE of the same size.
L2_FAMILIES = ("rnope_swa", "irope")
#: L3: the sinks checked.
L3_SINKS = ("learned", "token")
#: L3: "unchanged" = the ratio of in-distribution perplexities within this factor of 1 (F2's
#: bar for "flat", fixed before the run; StreamingLLM's difference was 0.2%).
SINK_MARGIN = ALIBI_MAX_RATIO
#: Where a report lists this module's findings: after the training-free study's.
ORDER = 3

#: What makes two series comparable: the same study cell apart from what is compared.
_SAME_SETTING = ("experiment", "arm", "train_length", "corpus_fingerprint")


def _training(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its training's position sampling and attention sink spelled out (rows that
    predate the columns, or did not set them, were contiguous and sink-free)."""
    return df.assign(
        # object first: a column absent from the rows is float NaN, which pandas will not fill with text
        _sampling=col(df, "position_sampling").astype(object).fillna("contiguous"),
        _sink=col(df, "attention_sink").astype(object).fillna("none"),
    )


def _paired(
    df: pd.DataFrame, a: tuple[str, str, str], b: tuple[str, str, str]
) -> list[tuple[str, pd.DataFrame, pd.DataFrame]]:
    """(setting label, rows of a, rows of b) per setting (:data:`_SAME_SETTING`) that has both;
    a and b are (position, sampling, sink), raw scaling, zero-shot."""
    picked = []
    for position, sampling, sink in (a, b):
        rows = _training(select(df, position))
        picked.append(rows[(rows["_sampling"] == sampling) & (rows["_sink"] == sink)])
    out = []
    keys = [c for c in _SAME_SETTING if c in df.columns]
    if not keys:
        return [("", *picked)] if all(len(p) for p in picked) else []
    for setting, rows_a in picked[0].groupby(keys, dropna=False):
        setting = setting if isinstance(setting, tuple) else (setting,)
        match = pd.Series(True, index=picked[1].index)
        for column, value in zip(keys, setting, strict=True):
            match &= picked[1][column].astype(str) == str(value)
        rows_b = picked[1][match]
        if not rows_b.empty and rows_b["_series"].nunique() == rows_a["_series"].nunique() == 1:
            arm = dict(zip(keys, setting, strict=True)).get("arm", "")
            out.append((f"arm {arm}" if arm else "", rows_a, rows_b))
    return out


def _name(text: str, setting: str) -> str:
    return f"{text} [{setting}]" if setting else text


def _ratio_of_ratios_checks(df, pairs, est, checks, missing) -> None:
    """For each (label, a, b, checked): ratio of ratios a vs b at 4L per setting; decided below
    1 where ``checked``. Beside it (reported, never checked): a's perplexity at 4L over b's, since
    degrading less from a worse start need not mean a lower perplexity at 4L."""
    for label, a, b, checked in pairs:
        found = _paired(df, a, b)
        if not found:
            if checked:
                missing.append(label)
                checks.append(None)
            continue
        for setting, rows_a, rows_b in found:
            e = ratio_of_ratios(_name(f"{label} ppl ratio {FAR}L/L", setting), rows_a, rows_b)
            if math.isnan(e.value):
                continue
            est.append(e)
            if checked:
                checks.append(decide(e, 1.0, "below"))
            name = _name(f"{label} ppl({FAR}L) (reported)", setting)
            est.append(difference_estimate(name, rows_a, rows_b, FAR, FAR, transform=math.exp))


@register_finding(
    "L1",
    Scope(
        positions=L1_FAMILIES,
        scalings=("none",),
        metrics=("nll",),
        finetunes=("none",),
        samplings=("randomized",),
        also_samplings=("contiguous", "pose"),
    ),
    thresholds={"FAR": FAR},
    claim=f"randomized training positions: {', '.join(L1_FAMILIES)} each degrade less from L to "
    f"{FAR}L than when trained on contiguous positions (ratio of the perplexity ratios, CI < 1; "
    "checked for language modelling, the paper's claim is for algorithmic tasks)",
    source="Ruoss et al. 2023, Randomized Positional Encodings Boost Length Generalization of "
    "Transformers (ACL 2023), Table 1 (algorithmic tasks); PoSE: Zhu et al. 2024 (reported)",
)
def l1_randomized_positions(df: pd.DataFrame) -> FindingResult:
    est, checks, missing = [], [], []
    pairs = [
        (f"{f} randomized/contiguous", (f, "randomized", "none"), (f, "contiguous", "none"), True)
        for f in L1_FAMILIES
    ]
    pairs += [
        (f"{f} {s}/contiguous", (f, s, "none"), (f, "contiguous", "none"), False)
        for s, f in L1_REPORTED
    ]
    _ratio_of_ratios_checks(df, pairs, est, checks, missing)
    return FindingResult(status=status(checks), estimates=est, missing=missing)


@register_finding(
    "L2",
    Scope(positions=L2_FAMILIES, scalings=("none",), metrics=("nll",), finetunes=("none",)),
    thresholds={"FAR": FAR},
    claim=f"hybrid NoPE/RoPE layers ({', '.join(L2_FAMILIES)}) degrade less from L to {FAR}L than "
    "all-RoPE of the same size (ratio of the perplexity ratios, CI < 1)",
    source="Yang et al. 2025, Rope to Nope and Back Again: A New Hybrid Attention Strategy "
    "(RNoPE-SWA); Meta 2025, Llama 4 (iRoPE: interleaved NoPE layers, chunked attention, "
    "query temperature)",
)
def l2_hybrid_layers(df: pd.DataFrame) -> FindingResult:
    est, checks, missing = [], [], []
    pairs = [
        (f"{f}/rope", (f, "contiguous", "none"), ("rope", "contiguous", "none"), True)
        for f in L2_FAMILIES
    ]
    _ratio_of_ratios_checks(df, pairs, est, checks, missing)
    return FindingResult(status=status(checks), estimates=est, missing=missing)


@register_finding(
    "L3",
    Scope(
        positions=("rope",),
        scalings=("none",),
        metrics=("nll",),
        finetunes=("none",),
        sinks=L3_SINKS,
        also_sinks=("none",),
    ),
    thresholds={"SINK_MARGIN": SINK_MARGIN},
    claim=f"an attention sink (learned logits, sink token) leaves in-distribution perplexity "
    f"unchanged: ppl_sink(L)/ppl(L) within [1/{SINK_MARGIN}, {SINK_MARGIN}] (whole CI)",
    source="Xiao et al. 2024, StreamingLLM (ICLR 2024), Table 3: 160M models pre-trained without and "
    "with a sink token, 18.05 vs 18.01; OpenAI 2025, gpt-oss model card (learned sinks)",
)
def l3_sink_in_distribution(df: pd.DataFrame) -> FindingResult:
    est, checks, missing = [], [], []
    for sink in L3_SINKS:
        label = f"rope {sink} sink/no sink"
        found = _paired(df, ("rope", "contiguous", sink), ("rope", "contiguous", "none"))
        if not found:
            missing.append(label)
            checks.append(None)
        for setting, rows_a, rows_b in found:
            e = difference_estimate(
                _name(f"{label} ppl(L)", setting), rows_a, rows_b, 1, 1, transform=math.exp
            )
            if math.isnan(e.value):
                continue
            est.append(e)
            inside: list[Check] = [
                decide(e, SINK_MARGIN, "at_most"),
                decide(e, 1 / SINK_MARGIN, "at_least"),
            ]
            checks.append(all_of(inside))
    return FindingResult(status=status(checks), estimates=est, missing=missing)
