"""The SmolLM2-135M study's findings (issue #74), listed after every toy-model study's.

S1-S6 restate the field's claims about real pretrained RoPE models as checks on the rows of
``lenbench +experiment=smollm2`` (SmolLM2-135M-Instruct, trained at L = 8192; every method at one
static factor, 4 = the longest eval length / L). Thresholds are fixed here before any row of the
study exists (committed before the pilot rows: reports/smollm2/README.md names the commit).

Every method runs on the same weights, one eval seed: perplexities are paired over documents
(:func:`paired_ratio`: the whole-window rows' per-document NLL sums, one document draw shared by
both sides, ``bench.findings.estimates.seed_doc_bootstrap``), and the nll metric scores the same
tokens at every length (each document's first 4L tokens, ``eval.nll.max_windows: fill``), so a
ratio of two lengths measures the window, not the text. Unlike the toy studies' one-seed ratios
(``difference_estimate``), the interval is not widened to the two lengths' stored CIs: those are
each length's spread over documents, unpaired, and with documents whose NLL differs by 0.5 nats
they would leave no margin of 1.1x decidable; what varies between the two sides of a ratio here
is the method or the length, on the same documents. Passkey accuracies carry the Wilson interval of
their trials (every method reads the same prompts: one seed, one grid); rows hold per-depth
counts, not per-trial verdicts, so retrieval claims are absolute (a bar on one method's
interval), not paired differences. The leaderboard's comparisons (``bench.findings.comparisons``)
need seed-level replicates and compare nothing at one seed, so they are not used here.

- **S1** raw RoPE's perplexity rises beyond L: ppl(kL) / ppl(L), CI > 1, k = 2, 4 (Press et al.
  2022, rotary; Chen et al. 2023, PI, Fig. 1/Table 1: Llama beyond 2048 without interpolation).
- **S2** zero-shot PI degrades it at L and beyond: ppl_PI(kL) / ppl_raw(L), CI > 1, k = 1, 1.5,
  2, 4 (Chen et al. 2023 report PI without fine-tuning raising perplexity; Peng et al. 2024, YaRN,
  Sec. 3.1: "PI ... without fine-tuning" loses high frequencies).
- **S3** NTK-aware, dynamic NTK and YaRN keep it within :data:`FLAT_MARGIN` (1.1x) of raw RoPE's
  ppl at L up to 2L: ppl_m(kL) / ppl_raw(L), CI <= 1.1, k = 1.5, 2 (Peng et al. 2024, YaRN,
  Tables 1-2, Llama 2; bloc97 2023 for NTK-aware, emozilla 2023 for dynamic NTK). Our reading of
  "within 1.1x-2x": within 1.1x of the perplexity at L, at lengths up to 2L.
- **S4** Self-Extend keeps passkey retrieval at 1.5L and 2L: accuracy >= ``RETRIEVAL_MIN_ACC``
  (0.8) on its interval (Jin et al. 2024, LLM Maybe LongLM, Tables 2-3). The study's passkey grid
  ends at 2L, so "and beyond" is not measured.
- **S5** StreamingLLM keeps perplexity flat, ppl(kL) / ppl(L) CI <= ``ALIBI_MAX_RATIO`` (1.02,
  F2's bar) at k = 2, 4, but cannot retrieve a passkey outside its window: accuracy at 1.5L and
  2L over depths <= :data:`OUTSIDE_DEPTH`, CI <= ``NEAR_ZERO_ACC`` (0.1) (Xiao et al. 2024,
  Sec. 4 and the FAQ of mit-han-lab/streaming-llm). Geometry: window L - 4 = 8188 tokens; at
  depth d the needle stands about (1 - d) x (length - template) tokens before the question, so
  depth 0.25 is >= 0.75 x (12288 - 300) = 8991 > 8188 tokens back at 1.5L (12,000+ at 2L), depth
  0.5 is not at 1.5L (tests/bench/findings/test_findings_smollm2.py checks it on the prompts).
  Every needle is within the mask's reach (30 layers x 8187 tokens), so losing it is the model's
  doing, not the mask's (unlike T3's shallowest depths).
- **S6** Dual Chunk Attention retrieves the passkey beyond L: accuracy >= 0.8 at 1.5L and 2L
  (An et al. 2024, ChunkLlama, passkey retrieval of Llama 2 far beyond 4K).
"""

from __future__ import annotations

import math

import pandas as pd

from bench.core.series import series_labels
from bench.core.stats import Estimate, decide
from bench.findings.core import ALIBI_MAX_RATIO, NEAR_ZERO_ACC, RETRIEVAL_MIN_ACC
from bench.findings.estimates import accuracy_estimate, nll_difference, seed_doc_bootstrap
from bench.findings.registry import PRETRAINED, FindingResult, Scope, register_finding, status
from bench.findings.rows import (
    at,
    by_series,
    col,
    named,
    passkey,
    passkey_labels,
    passkey_series,
    select,
    window_nll,
)
from bench.findings.training_free import FLAT_MARGIN

#: Where a report lists this module's findings: after every toy-model study's.
ORDER = 7
#: the study these findings read (``experiment_name`` of conf/experiment/smollm2.yaml)
EXPERIMENT = "smollm2"
#: S1 / S5: the multiples of L at which perplexity is compared with that at L
BEYOND = (2, 4)
#: S2: PI's lengths, from L on
PI_LENGTHS = (1, 1.5, 2, 4)
#: S3: the lengths up to 2L beyond L
NEAR = (1.5, 2)
#: S3: the frequency methods it checks
S3_METHODS = ("ntk", "dynamic", "yarn")
#: S4 / S5 / S6: the passkey lengths beyond L (the study's passkey grid: 1x, 1.5x, 2x)
PASSKEY_BEYOND = (1.5, 2)
#: S5: the deepest passkey depth whose needle is outside StreamingLLM's window at 1.5L and 2L
OUTSIDE_DEPTH = 0.25


#: how :func:`paired_ratio`'s interval is made
PAIRED_DOC_CI = (
    "one model, one eval seed: percentile bootstrap over documents, paired (the same documents "
    "and tokens on both sides)"
)


def paired_ratio(name: str, a, b, multiple_a: float, multiple_b: float) -> Estimate:
    """ppl(a at multiple_a x L) / ppl(b at multiple_b x L) of one series each (exp of the seed
    mean NLL difference), with the percentile interval of the document bootstrap paired across
    the two sides (seeds too, where there are several); no interval (a check then reads "not
    measured") where the rows carry no per-document sums or the two sides' documents differ."""
    diff, _ = nll_difference(a, b, multiple_a, multiple_b)
    if not len(diff):
        return Estimate(name, math.nan)
    value = math.exp(float(diff.mean()))
    boot = seed_doc_bootstrap(a, b, multiple_a, multiple_b)
    if boot is None:
        return Estimate(name, value, n_seeds=len(diff), ci="no per-document sums: no interval")
    lo, hi = (math.exp(x) for x in boot)
    return Estimate(name, value, lo, hi, len(diff), PAIRED_DOC_CI, log_scale=True)


def _scope(scalings: tuple[str, ...], metrics: tuple[str, ...]) -> Scope:
    return Scope(
        positions=("rope",),
        scalings=scalings,
        metrics=metrics,
        finetunes=("none",),
        sources=PRETRAINED,
        experiments=(EXPERIMENT,),
    )


def _k(multiple: float) -> str:
    return f"{multiple:g}L" if multiple != 1 else "L"


def _ratio_checks(df, method, multiples, base, claim, threshold, out) -> None:
    """ppl of ``method`` at k x L over ppl of ``base`` at L, per pair of their series on one
    model, paired over documents; each decided against ``threshold``."""
    est, checks, missing = out
    a_series = by_series(window_nll(select(df, "rope", method)))
    b_series = [] if base == method else by_series(window_nll(select(df, "rope", base)))
    if base == method:  # a ratio within each series
        pairs = [(ka, a, a) for ka, a in a_series]
    else:  # each series of the method against the base on the same model (paired documents)
        pairs = [
            (ka, a, b) for ka, a in a_series for _, b in b_series
            if a["_model"].iloc[0] == b["_model"].iloc[0]
        ]  # fmt: skip
    labels = series_labels([ka for ka, *_ in pairs])
    for k in multiples:
        found = False
        for ka, a, b in pairs:
            name = f"rope {method} ppl({_k(k)})/" + (
                f"{base} ppl(L)" if base != method else "ppl(L)"
            )
            name += f" [{labels[ka]}]" if labels.get(ka) else ""
            e = paired_ratio(name, a, b, k, 1)
            if math.isnan(e.value):
                continue
            found = True
            est.append(e)
            checks.append(decide(e, threshold, claim))
        if not found:
            missing.append(f"rope {method} nll at {_k(k)} (and {base} at L)")
            checks.append(None)


@register_finding(
    "S1",
    _scope(("none",), ("nll",)),
    thresholds={"BEYOND": max(BEYOND)},
    claim="SmolLM2-135M: raw RoPE's perplexity rises beyond its training length L = 8192: "
    "ppl(kL)/ppl(L) CI > 1 at k = 2 and 4",
    source="Press et al. 2022, Train Short, Test Long (rotary beyond L); Chen et al. 2023, Position "
    "Interpolation, Fig. 1 and Table 1 (Llama without interpolation beyond 2048)",
)
def s1_raw_rises(df: pd.DataFrame) -> FindingResult:
    out = ([], [], [])
    _ratio_checks(df, "none", BEYOND, "none", "above", 1.0, out)
    return FindingResult(status=status(out[1]), estimates=out[0], missing=out[2])


@register_finding(
    "S2",
    _scope(("linear",), ("nll",)),
    thresholds={"PI_FROM": min(PI_LENGTHS), "PI_TO": max(PI_LENGTHS)},
    claim="SmolLM2-135M: zero-shot PI (linear, factor 4) degrades perplexity at L and beyond: "
    "ppl_PI(kL)/ppl_raw(L) CI > 1 at k = 1, 1.5, 2, 4",
    source="Chen et al. 2023, Position Interpolation, Sec. 3 (interpolated models before "
    "fine-tuning); Peng et al. 2024, YaRN, Sec. 3.1 (PI loses high-frequency information)",
)
def s2_pi_degrades(df: pd.DataFrame) -> FindingResult:
    out = ([], [], [])
    _ratio_checks(df, "linear", PI_LENGTHS, "none", "above", 1.0, out)
    return FindingResult(status=status(out[1]), estimates=out[0], missing=out[2])


@register_finding(
    "S3",
    _scope(S3_METHODS, ("nll",)),
    thresholds={"FLAT_MARGIN": FLAT_MARGIN, "NEAR_TO": max(NEAR)},
    claim=f"SmolLM2-135M: NTK-aware, dynamic NTK and YaRN keep perplexity within {FLAT_MARGIN:g}x "
    f"of raw RoPE's at L up to 2L: ppl_m(kL)/ppl_raw(L) CI <= {FLAT_MARGIN:g} at k = 1.5, 2",
    source="Peng et al. 2024, YaRN, Tables 1-2 (Llama 2 7B/13B); bloc97 2023, NTK-aware scaled "
    "RoPE; emozilla 2023, dynamically scaled RoPE (Reddit posts)",
)
def s3_frequency_methods_flat(df: pd.DataFrame) -> FindingResult:
    out = ([], [], [])
    for method in S3_METHODS:
        _ratio_checks(df, method, NEAR, "none", "at_most", FLAT_MARGIN, out)
    return FindingResult(status=status(out[1]), estimates=out[0], missing=out[2])


def _accuracy_checks(rows, label, multiples, threshold, claim, out) -> None:
    """Accuracy of ``rows`` (passkey rows of one method) at each multiple of L, decided."""
    est, checks, missing = out
    for k in multiples:
        e = accuracy_estimate(at(rows, k), f"{label} at {_k(k)}")
        if math.isnan(e.value):
            missing.append(f"{label} at {_k(k)}")
            checks.append(None)
            continue
        est.append(e)
        checks.append(decide(e, threshold, claim))


def _retrieves(df: pd.DataFrame, method: str) -> FindingResult:
    """Per passkey series of ``method`` (and template): accuracy >= RETRIEVAL_MIN_ACC beyond L."""
    out = ([], [], [])
    series = passkey_series(select(df, "rope", method))
    labels = passkey_labels([key for key, _ in series])
    for key, rows in series:
        label = named(f"rope {method} passkey acc", key, labels)
        _accuracy_checks(rows, label, PASSKEY_BEYOND, RETRIEVAL_MIN_ACC, "at_least", out)
    if not series:
        out[2].append(f"rope {method} passkey beyond L")
        out[1].append(None)
    raw = passkey(select(df, "rope", "none"))
    notes = [
        f"raw RoPE passkey acc at {_k(k)}: {e.value:.3f} [{e.lo:.3f}, {e.hi:.3f}]"
        for k in PASSKEY_BEYOND
        if not math.isnan((e := accuracy_estimate(at(raw, k), "")).value)
    ]
    return FindingResult(status=status(out[1]), estimates=out[0], missing=out[2], notes=notes)


@register_finding(
    "S4",
    _scope(("self_extend",), ("passkey_acc",)),
    thresholds={"RETRIEVAL_MIN_ACC": RETRIEVAL_MIN_ACC, "PASSKEY_TO": max(PASSKEY_BEYOND)},
    claim=f"SmolLM2-135M: Self-Extend retrieves the passkey at 1.5L and 2L (accuracy >= "
    f"{RETRIEVAL_MIN_ACC} on its interval; the grid ends at 2L)",
    source="Jin et al. 2024, LLM Maybe LongLM: Self-Extend LLM Context Window Without Tuning, "
    "Tables 2-3 (passkey retrieval beyond the pretraining window)",
)
def s4_self_extend_retrieves(df: pd.DataFrame) -> FindingResult:
    return _retrieves(df, "self_extend")


def _outside_window(rows: pd.DataFrame, multiple: float) -> pd.DataFrame:
    """Per-depth passkey rows at ``multiple`` x L with depth <= :data:`OUTSIDE_DEPTH`."""
    p = rows[(rows["metric"] == "passkey_acc") & (col(rows, "axis") == "depth")]
    depth = pd.to_numeric(col(p, "axis_value"), errors="coerce")
    return at(p[depth <= OUTSIDE_DEPTH], multiple)


@register_finding(
    "S5",
    _scope(("streaming",), ("nll", "passkey_acc")),
    thresholds={
        "ALIBI_MAX_RATIO": ALIBI_MAX_RATIO,
        "OUTSIDE_DEPTH": OUTSIDE_DEPTH,
        "NEAR_ZERO_ACC": NEAR_ZERO_ACC,
    },
    claim=f"SmolLM2-135M: StreamingLLM keeps perplexity flat (ppl(kL)/ppl(L) CI <= "
    f"{ALIBI_MAX_RATIO:g} at k = 2, 4) but cannot retrieve a passkey outside its window "
    f"(accuracy at 1.5L and 2L over depths <= {OUTSIDE_DEPTH:g}, CI <= {NEAR_ZERO_ACC})",
    source="Xiao et al. 2024, Efficient Streaming Language Models with Attention Sinks, Sec. 4 "
    "(perplexity on long texts) and the FAQ of mit-han-lab/streaming-llm (no retrieval beyond "
    "the cache)",
)
def s5_streaming_flat_but_forgetful(df: pd.DataFrame) -> FindingResult:
    out = ([], [], [])
    _ratio_checks(df, "streaming", BEYOND, "streaming", "at_most", ALIBI_MAX_RATIO, out)
    streaming = select(df, "rope", "streaming")
    series = by_series(streaming[streaming["metric"] == "passkey_acc"]) or [("", streaming)]
    labels = series_labels([key for key, _ in series])
    est, checks, missing = out
    for key, rows in series:
        for k in PASSKEY_BEYOND:
            label = f"rope streaming passkey acc at {_k(k)}, depths <= {OUTSIDE_DEPTH:g}"
            label = named(label, key, labels)
            e = accuracy_estimate(_outside_window(rows, k), label)
            if math.isnan(e.value):
                missing.append(label)
                checks.append(None)
            else:
                est.append(e)
                checks.append(decide(e, NEAR_ZERO_ACC, "at_most"))
    return FindingResult(status=status(checks), estimates=est, missing=missing)


@register_finding(
    "S6",
    _scope(("dca",), ("passkey_acc",)),
    thresholds={"RETRIEVAL_MIN_ACC": RETRIEVAL_MIN_ACC, "PASSKEY_TO": max(PASSKEY_BEYOND)},
    claim=f"SmolLM2-135M: Dual Chunk Attention retrieves the passkey beyond L (accuracy >= "
    f"{RETRIEVAL_MIN_ACC} on its interval at 1.5L and 2L)",
    source="An et al. 2024, Training-Free Long-Context Scaling of Large Language Models "
    "(ChunkLlama, DCA), passkey retrieval of Llama 2 beyond its 4K window",
)
def s6_dca_retrieves(df: pd.DataFrame) -> FindingResult:
    return _retrieves(df, "dca")


__all__ = [
    "BEYOND", "EXPERIMENT", "NEAR", "OUTSIDE_DEPTH", "PAIRED_DOC_CI", "PASSKEY_BEYOND",
    "PI_LENGTHS", "S3_METHODS", "paired_ratio",
]  # fmt: skip
