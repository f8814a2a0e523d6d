"""The recurrent and hybrid token mixers' findings (issue #75 Part B), fixed with their thresholds
before any mixer row exists. A mixer model has the result column ``mixer`` (gated_deltanet, mamba2,
kda: ``model.mixer``); a hybrid also ``hybrid_every`` (its k as text, "4" for 3 : 1); a pure mixer
model has no attention and takes position=nope, a hybrid's attention layers any family:

- **M1** (Stuffed Mamba, Chen et al. 2024, reports the opposite): a pure recurrent model's
  perplexity stays flat from L to 4L where raw RoPE's does not: its ppl(4L)/ppl(L), CI below
  :data:`FLAT_MAX_RATIO`, and the ratio of its ratio to raw RoPE's on the same recipe (seeds
  paired), CI below 1. A ratio whose interval lies above the bar is the state collapse that Stuffed
  Mamba reports (a note says so).
- **M2** (Jelassi et al. 2024, "Repeat After Me"; Arora et al. 2024, Zoology/Based): recurrent
  layers alone fail passkey retrieval beyond L: at every evaluated length above L the accuracy's
  CI upper end is at most :data:`~bench.findings.core.NEAR_ZERO_ACC`. A model that does not
  retrieve at L either (CI upper end below
  :data:`~bench.findings.core.IN_DISTRIBUTION_MIN_ACC`) has nothing to lose beyond L: not decided,
  with a note.
- **M3** (Qwen3-Next, Olmo Hybrid and Kimi Linear interleave 3 : 1; Waleffe et al. 2024, "An
  Empirical Study of Mamba-based Language Models"): a 3 : 1 hybrid retrieves where the pure
  recurrent model does not: at every evaluated length (L and beyond) where the pure model of the
  same mixer and recipe does not retrieve (CI upper end <= NEAR_ZERO_ACC), the hybrid's accuracy
  has CI lower end >= :data:`~bench.findings.core.RETRIEVAL_MIN_ACC`. Where the pure model
  retrieves at every length measured, there is nothing to show: not decided, with a note.
"""

from __future__ import annotations

import math

import pandas as pd

from bench.core.stats import UNDECIDED, Check, Estimate, decide
from bench.findings.core import IN_DISTRIBUTION_MIN_ACC, NEAR_ZERO_ACC, RETRIEVAL_MIN_ACC
from bench.findings.estimates import FAR, accuracy_estimate, ppl_ratio, ratio_of_ratios
from bench.findings.registry import FindingResult, Scope, all_of, register_finding, status
from bench.findings.rows import at, by_series, col, passkey_series, select, window_nll

#: M1: "flat" = perplexity at 4L within 1.1x of L (N3's bar for stick-breaking, fixed before).
FLAT_MAX_RATIO = 1.1
#: M3: the 3 : 1 interleave of Qwen3-Next and Olmo Hybrid (``model.hybrid_every=4``).
HYBRID_EVERY = "4"
#: the columns that make two series the same recipe (trained alike on the same data, same arm)
RECIPE = ("experiment", "arm", "train_length", "corpus_fingerprint")
STUFFED_MAMBA = "Chen et al. 2024, 'Stuffed Mamba' (arXiv 2410.07145)"
#: Where a report lists this module's findings: last, after the SmolLM2 study's.
ORDER = 8


def _recipe(rows: pd.DataFrame) -> tuple:
    first = rows.iloc[0]
    return tuple(None if pd.isna(first.get(c, math.nan)) else first[c] for c in RECIPE)


def pure(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of models with a recurrent mixer on every layer (``mixer`` set, no ``hybrid_every``)."""
    return df[col(df, "mixer").notna() & col(df, "hybrid_every").isna()]


def hybrid(df: pd.DataFrame, every: str = HYBRID_EVERY) -> pd.DataFrame:
    """Rows of hybrids: a recurrent mixer, full attention every ``every``-th layer."""
    return df[col(df, "mixer").notna() & (col(df, "hybrid_every").astype(object) == every)]


def _zero_shot(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["scaling"] == "none") & col(df, "finetune_method").isna()]


def _mixer(rows: pd.DataFrame) -> str:
    return str(rows["mixer"].iloc[0])


@register_finding(
    "M1",
    Scope(scalings=("none",), metrics=("nll",), finetunes=("none",), switches=("mixer",)),
    thresholds={"FLAT_MAX_RATIO": FLAT_MAX_RATIO, "FAR": FAR},
    claim=f"a pure recurrent model's perplexity stays flat from L to {FAR}L where raw RoPE's does "
    f"not: its ppl({FAR}L)/ppl(L), CI < {FLAT_MAX_RATIO}, and its ratio over raw RoPE's on the "
    "same recipe (seeds paired), CI < 1",
    source="the field's claim for linear attention / state space layers (Qwen3-Next, Kimi Linear, "
    f"Mamba-2); {STUFFED_MAMBA} reports state collapse beyond the training length instead "
    "(not verified offline)",
)
def m1_recurrent_ppl_flat(df: pd.DataFrame) -> FindingResult:
    """Per pure mixer series (every mixer must hold): the ratio against the bar, and against each
    raw RoPE series of the same recipe (experiment, arm, L, corpus), seeds paired."""
    rope = select(df[col(df, "mixer").isna()], "rope")
    est, checks, missing, notes = [], [], [], []
    for _, t in by_series(window_nll(_zero_shot(pure(df)))):
        name = _mixer(t)
        flat = ppl_ratio(t, f"{name} ppl ratio {FAR}L/L")
        if math.isnan(flat.value):
            missing.append(f"{name}: whole-window nll at L and {FAR}L")
            checks.append(None)
            continue
        est.append(flat)
        check = decide(flat, FLAT_MAX_RATIO, "below")
        if check is False:
            notes.append(f"{name} rises beyond L (state collapse, as {STUFFED_MAMBA} reports)")
        baselines = [o for _, o in by_series(window_nll(rope)) if _recipe(o) == _recipe(t)]
        if not baselines:
            missing.append(f"raw RoPE on {name}'s recipe")
        for o in baselines:
            e = ratio_of_ratios(f"{name}/rope ppl ratio {FAR}L/L", t, o)
            if not math.isnan(e.value):
                est.append(e)
                check = all_of([check, decide(e, 1.0, "below")])
        checks.append(check if baselines else None)
    if not checks:
        missing.append("a pure recurrent model's whole-window nll")
        checks.append(None)
    return FindingResult(
        status=status([all_of(checks)]), estimates=est, missing=missing, notes=notes
    )


def _accuracies(rows: pd.DataFrame, name: str) -> dict[int, Estimate]:
    """Passkey accuracy of one series per evaluated eval length (pooled over seeds)."""
    return {
        int(length): accuracy_estimate(g, f"{name} acc at {int(length)}")
        for length, g in rows.groupby("eval_length")
    }


@register_finding(
    "M2",
    Scope(scalings=("none",), metrics=("passkey_acc",), finetunes=("none",), switches=("mixer",)),
    thresholds={"NEAR_ZERO_ACC": NEAR_ZERO_ACC, "IN_DISTRIBUTION_MIN_ACC": IN_DISTRIBUTION_MIN_ACC},
    claim="recurrent layers alone fail passkey retrieval beyond L: a pure recurrent model's "
    f"accuracy at every evaluated length above L has CI upper end <= {NEAR_ZERO_ACC} (not decided "
    f"where it does not retrieve at L either: CI upper end < {IN_DISTRIBUTION_MIN_ACC})",
    source="Jelassi et al. 2024, 'Repeat After Me' (arXiv 2402.01032): fixed-size state models "
    "fail to copy and retrieve from long contexts; Arora et al. 2024 (Zoology, Based): recall "
    "bounded by the state size (not verified offline)",
)
def m2_recurrent_fails_passkey(df: pd.DataFrame) -> FindingResult:
    """Per pure mixer series (every one must hold): the accuracies beyond L, each against the
    floor; the accuracy at L against the in-distribution bar decides whether the claim applies."""
    est, checks, missing, notes = [], [], [], []
    for _, rows in passkey_series(_zero_shot(pure(df))):
        name = _mixer(rows)
        in_dist = accuracy_estimate(at(rows, 1), f"{name} acc at L")
        beyond = rows[rows["eval_length"] > rows["train_length"]]
        accs = _accuracies(beyond, name)
        if math.isnan(in_dist.value) or not accs:
            missing.append(f"{name}: passkey at L and beyond")
            checks.append(None)
            continue
        est += [in_dist, *accs.values()]
        if decide(in_dist, IN_DISTRIBUTION_MIN_ACC, "at_least") is False:
            notes.append(f"{name} does not retrieve at L: nothing to lose beyond L")
            checks.append(UNDECIDED)
            continue
        checks.append(all_of([decide(e, NEAR_ZERO_ACC, "at_most") for e in accs.values()]))
    if not checks:
        missing.append("a pure recurrent model's passkey rows")
        checks.append(None)
    return FindingResult(
        status=status([all_of(checks)]), estimates=est, missing=missing, notes=notes
    )


def _hybrid_where_pure_fails(h: pd.DataFrame, p: pd.DataFrame, name: str) -> tuple[list, list]:
    """(estimates, checks) of the hybrid at each length where the pure model fails (undecided
    where the pure model's own verdict is)."""
    est, checks = [], []
    hybrid_accs = _accuracies(h, f"{name} 3:1 hybrid")
    for length, e_pure in _accuracies(p, f"{name} pure").items():
        fails = decide(e_pure, NEAR_ZERO_ACC, "at_most")
        if fails is False or length not in hybrid_accs:
            continue  # the pure model retrieves here (or the hybrid was not evaluated)
        e_hybrid = hybrid_accs[length]
        est += [e_pure, e_hybrid]
        check: Check = decide(e_hybrid, RETRIEVAL_MIN_ACC, "at_least")
        if fails is not True and check is False:
            check = UNDECIDED  # the pure model may retrieve here: a failing hybrid shows nothing
        checks.append(check)
    return est, checks


@register_finding(
    "M3",
    Scope(
        scalings=("none",),
        metrics=("passkey_acc",),
        finetunes=("none",),
        switches=("hybrid_every",),
        also_switches=("mixer",),
    ),
    thresholds={"NEAR_ZERO_ACC": NEAR_ZERO_ACC, "RETRIEVAL_MIN_ACC": RETRIEVAL_MIN_ACC},
    claim="a 3 : 1 hybrid (full attention every 4th layer) retrieves where the pure recurrent "
    f"model does not: at every evaluated length where the pure model of the same mixer and recipe "
    f"has accuracy CI upper end <= {NEAR_ZERO_ACC}, the hybrid's CI lower end >= "
    f"{RETRIEVAL_MIN_ACC} (not decided where the pure model retrieves at every length measured)",
    source="Qwen3-Next, Olmo Hybrid, Kimi Linear (3 : 1 linear : full attention); Waleffe et al. "
    "2024 (arXiv 2406.07887): Mamba-2-Hybrid closes pure Mamba-2's gap on phonebook / "
    "needle retrieval (not verified offline)",
)
def m3_hybrid_retrieves(df: pd.DataFrame) -> FindingResult:
    """Per hybrid series: each pure series of its mixer and recipe, at the lengths both have."""
    est, checks, missing, notes = [], [], [], []
    pure_series = passkey_series(_zero_shot(pure(df)))
    for _, h in passkey_series(_zero_shot(hybrid(df))):
        name = _mixer(h)
        partners = [p for _, p in pure_series if _mixer(p) == name and _recipe(p) == _recipe(h)]
        if not partners:
            missing.append(f"pure {name} passkey on the hybrid's recipe")
            checks.append(None)
        for p in partners:
            e, c = _hybrid_where_pure_fails(h, p, name)
            est += e
            if not c:
                notes.append(f"pure {name} retrieves at every length measured: nothing to show")
                c = [UNDECIDED]
            checks.append(all_of(c))
    if not checks:
        missing.append("a 3 : 1 hybrid's passkey rows")
        checks.append(None)
    return FindingResult(
        status=status([all_of(checks)]), estimates=est, missing=missing, notes=notes
    )
