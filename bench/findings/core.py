"""The findings reference's findings F1-F6 (``+experiment=findings``: the LM and retrieval arms):
absolute encodings degrade, ALiBi does not, NTK-aware and YaRN beat raw RoPE and PI, fine-tuning
recovers retrieval, RoPE retrieves at L, and the shift probe separates relative from absolute
encodings. Thresholds are the named constants below, fixed in advance.

A finding is evaluated per **series** (``bench.core.series``: the full model identity minus the seed,
under one scaling): seeds are the only replicate axis. Where several series match a finding,
each is reported on its own line and each is checked; one that does not hold makes the finding
not hold. Every decision is on an interval: a claim holds when its interval lies on the claimed
side of the threshold, does not hold when it lies on the other side, and is not decided otherwise.
Passkey accuracies carry a Wilson interval of their trials (:func:`accuracy_estimate`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from bench.core.series import SERIES_COLUMNS, columns_key, series_labels
from bench.core.stats import (
    CURVE_CI,
    SEED_ACC_CI,
    UNDECIDED,
    Check,
    Estimate,
    decide,
    wilson,
)
from bench.findings.estimates import (
    FAR,
    accuracy_estimate,
    difference_estimate,
    ppl_ratio,
    ppl_ratios,
)
from bench.findings.registry import FindingResult, Scope, all_of, register_finding, status
from bench.findings.rows import (
    at,
    by_series,
    col,
    named,
    passkey,
    passkey_labels,
    passkey_series,
    select,
    template,
    trials,
    window_nll,
)
from bench.findings.shift import SHIFT_ZERO_TOL, shift_invariant_checks, shift_sensitive_checks

#: Where a report lists this module's findings: first.
ORDER = 0

#: F2: ALiBi "does not degrade" (a non-inferiority claim): the CI's upper end of the perplexity
#: ratio to L at 2L and 4L at most this.
ALIBI_MAX_RATIO = 1.02
#: F4: passkey accuracy that counts as "retrieves" (YaRN's passkey threshold).
RETRIEVAL_MIN_ACC = 0.8
#: F4: raw RoPE accuracy beyond L that counts as "near 0".
NEAR_ZERO_ACC = 0.1
#: F5: RoPE passkey accuracy at L on every seed run.
IN_DISTRIBUTION_MIN_ACC = 0.9
#: F4 reads a seed only where its parent model (raw RoPE, not fine-tuned) is not decidedly below
#: RETRIEVAL_MIN_ACC at L (its Wilson upper end >= that): PI's and YaRN's claims are about
#: extending a model that retrieves in its window; a seed whose retrieval circuit never formed
#: has nothing to recover (F5 counts it). Settled 2026-12-02, before the run on seeds 10-15.
PARENT_MIN_ACC = RETRIEVAL_MIN_ACC

PRESS = "Press et al. 2022, Train Short, Test Long (ALiBi), Fig. 1"


@register_finding(
    "F1",
    Scope(
        positions=("sinusoidal", "learned"),
        scalings=("none",),
        metrics=("nll",),
        finetunes=("none",),
    ),
    claim=f"absolute encodings (sinusoidal, learned) degrade past L: ppl ratio {FAR}L/L, CI > 1",
    source=PRESS
    + " (sinusoidal); Kazemnejad et al. 2023, The Impact of Positional Encoding on Length Generalization (learned absolute)",
    thresholds={"FAR": FAR},
)
def f1_absolute_degrade(df: pd.DataFrame) -> FindingResult:
    est, checks, missing = [], [], []
    for pos in ("sinusoidal", "learned"):
        ratios = ppl_ratios(select(df, pos), f"{pos} ppl({FAR}L)/ppl(L)")
        if not ratios:
            missing.append(pos)
            checks.append(None)
        for _, e in ratios:
            est.append(e)
            checks.append(decide(e, 1.0, "above"))
    return FindingResult(status=status(checks), estimates=est, missing=missing)


@register_finding(
    "F2",
    Scope(positions=("alibi",), scalings=("none",), metrics=("nll",), finetunes=("none",)),
    claim=f"ALiBi does not degrade up to {FAR}L: ppl ratio to L <= {ALIBI_MAX_RATIO} at 2L and "
    f"{FAR}L (CI upper end)",
    source=PRESS,
    thresholds={"FAR": FAR, "ALIBI_MAX_RATIO": ALIBI_MAX_RATIO},
)
def f2_alibi_flat(df: pd.DataFrame) -> FindingResult:
    est, checks, missing = [], [], []
    series = by_series(window_nll(select(df, "alibi")))
    labels = series_labels([k for k, _ in series])
    for key, rows in series:
        ratios = [
            ppl_ratio(rows, named(f"alibi ppl({k}L)/ppl(L)", key, labels), k) for k in (2, FAR)
        ]
        if math.isnan(ratios[0].value) and math.isnan(ratios[1].value):
            continue  # a series without rows beyond L
        for k, e in zip((2, FAR), ratios, strict=True):
            if math.isnan(e.value):  # "up to 4L" needs every length it names
                missing.append(named(f"alibi at {k}L", key, labels))
                checks.append(None)
            else:
                est.append(e)
                # non-inferiority: holds only when the whole CI is within the tolerance
                checks.append(decide(e, ALIBI_MAX_RATIO, "at_most"))
    if not checks:
        missing.append(f"alibi at 2L and {FAR}L")
        checks.append(None)
    return FindingResult(status=status(checks), estimates=est, missing=missing)


@register_finding(
    "F3",
    Scope(positions=("rope",), scalings=("ntk", "yarn"), metrics=("nll",), finetunes=("none",)),
    claim=f"raw RoPE degrades past ~2L; zero-shot NTK-aware and YaRN beat raw RoPE and PI at {FAR}L "
    "(NLL difference CI < 0)",
    source=PRESS
    + " (rotary); Peng et al. 2024, YaRN, long-sequence perplexity experiments; bloc97 "
    "2023, NTK-aware scaled RoPE (Reddit post)",
    thresholds={"FAR": FAR},
)
def f3_rope_scaling(df: pd.DataFrame) -> FindingResult:
    est, checks, missing = [], [], []
    raw = ppl_ratios(select(df, "rope"), f"rope ppl({FAR}L)/ppl(L)")
    if not raw:
        missing.append(f"rope ppl({FAR}L)/ppl(L)")
        checks.append(None)
    for _, e in raw:
        est.append(e)
        checks.append(decide(e, 1.0, "above"))
    for method in ("ntk", "yarn"):
        for other, label in (("none", "raw"), ("linear", "PI")):
            a_series = by_series(window_nll(select(df, "rope", method)))
            b_series = by_series(window_nll(select(df, "rope", other)))
            # pairs of series of one trained model (same model series key): the seeds pair up
            pairs = [
                (ka, a, kb, b)
                for ka, a in a_series
                for kb, b in b_series
                if a["_model"].iloc[0] == b["_model"].iloc[0]
            ]
            # labels among the method's series and among the other's (what differs within each)
            labels_a = series_labels([ka for ka, *_ in pairs])
            labels_b = series_labels([kb for *_, kb, _ in pairs])
            found = False
            for ka, a, kb, b in pairs:
                parts = [x for x in (labels_a.get(ka, ""), labels_b.get(kb, "")) if x]
                name = f"NLL({FAR}L) {method} - {label}"
                name += f" [{' vs '.join(dict.fromkeys(parts))}]" if parts else ""
                d = difference_estimate(name, a, b, FAR, FAR)
                if math.isnan(d.value):
                    continue
                found = True
                est.append(d)
                checks.append(decide(d, 0.0, "below"))
            if not found:
                missing.append(f"NLL({FAR}L) {method} - {label}")
                checks.append(None)
    return FindingResult(status=status(checks), estimates=est, missing=missing)


#: F4's fine-tuning methods: the PI paper's two (PI, direct fine-tuning with the raw rotary) and
#: YaRN's.
F4_METHODS = ("pi", "direct", "yarn")


#: What a PI curve and a direct (or YaRN) curve must share to be compared: one parent model
#: configuration, fine-tuned at one length, measured with one template.
PAIR_COLUMNS = [
    "experiment",
    "arm",
    "position",
    "position_params",
    "train_length",
    "corpus_fingerprint",
    "finetune_length",
    "template",
]


@dataclass
class Curve:
    """One recovery curve: update count -> whether retrieval over L..4L is recovered."""

    method: str
    key: str  # the curve (one fine-tune recipe of one model configuration, any update count)
    pair: str  # what curves of other methods must share to be compared (PAIR_COLUMNS)
    points: dict[int, Check]
    n_seeds: int

    def first_recovered(self) -> tuple[int | None, bool]:
        """(the fewest updates at which retrieval is recovered, whether every smaller count is
        decidedly not); (None, decided) when no count recovers it: decided when none could."""
        for steps in sorted(self.points):
            if self.points[steps] is True:
                return steps, all(self.points[k] is False for k in self.points if k < steps)
        return None, all(c is False for c in self.points.values())


def parents_left_out(df: pd.DataFrame) -> dict[tuple[str, str], Estimate]:
    """The raw RoPE models (not fine-tuned) that F4 leaves out, by (model id, template): their
    passkey accuracy at L is decidedly below PARENT_MIN_ACC (Wilson upper end below it); the
    value is that accuracy with its interval, named by seed."""
    p = passkey(at(select(df, "rope"), 1))
    out = {}
    for (model, kind, seed), rows in p.groupby(
        [p["model_id"], template(p).map(str), p["seed"]], sort=True
    ):
        t = trials(rows)
        k, n = float(t["k"].sum()), float(t["n"].sum())
        lo, hi = wilson(k, n)
        if hi < PARENT_MIN_ACC:
            name = f"left out: seed {seed}, its raw RoPE parent's acc at L"
            out[(str(model), kind)] = Estimate(name, k / n, lo, hi, 1, SEED_ACC_CI)
    return out


def without_parents(p: pd.DataFrame, left_out: dict | None, id_column: str) -> pd.DataFrame:
    """Passkey rows ``p`` minus those of models (``id_column``: the model or its parent) in
    ``left_out`` (:func:`parents_left_out`; None: none)."""
    if not left_out:
        return p
    keys = pd.Series(list(zip(col(p, id_column).map(str), template(p).map(str), strict=True)))
    return p[~keys.isin(list(left_out)).to_numpy()]


def recovery_curves(df: pd.DataFrame, left_out: dict | None = None) -> list[Curve]:
    """The recovery curves of the fine-tunes at FAR x L of the F4 methods: at each update count,
    whether every length L..FAR L has accuracy >= RETRIEVAL_MIN_ACC on its interval (None where
    a length is missing). Fine-tunes of a parent in ``left_out`` (:func:`parents_left_out`) are
    not read."""
    out = []
    for method in F4_METHODS:
        tuned = select(df, "rope", None, tuned=method)
        at_far = col(tuned, "finetune_length") == tuned["train_length"] * FAR
        p = without_parents(
            passkey(tuned[at_far.fillna(False).astype(bool)]), left_out, "parent_model_id"
        )
        if p.empty:
            continue
        curve_id = col(p, "finetune_curve_id")
        p = p.assign(
            template=template(p),
            # every update count of one recipe: one curve
            model_config_id=curve_id.where(curve_id.notna(), col(p, "model_config_id")),
        )
        columns = [c for c in SERIES_COLUMNS if c != "finetune_steps"]
        p = p.assign(
            _curve=columns_key(p, [*columns, "template"]), _pair=columns_key(p, PAIR_COLUMNS)
        )
        for key, rows in p.groupby("_curve", sort=True):
            points = {}
            for steps, rows_at in rows.groupby("finetune_steps", sort=True):
                accs = [accuracy_estimate(at(rows_at, k), "") for k in (1, 2, FAR)]
                measured = not any(math.isnan(e.value) for e in accs)
                points[int(steps)] = (
                    all_of([decide(e, RETRIEVAL_MIN_ACC, "at_least") for e in accs])
                    if measured
                    else None
                )
            out.append(
                Curve(method, str(key), rows["_pair"].iloc[0], points, rows["seed"].nunique())
            )
    return out


def _recovered_before(first: Curve, other: Curve) -> Check:
    """``first`` recovers retrieval with fewer updates than ``other``: True where ``first`` has
    recovered at a count where ``other`` decidedly has not, at that count or any smaller one;
    False where ``other`` has recovered by that count; None when ``other`` was not measured at
    ``first``'s count. ``first`` recovers within its grid."""
    k, _ = first.first_recovered()
    at_k = other.points.get(k)
    if at_k is None:
        return None
    earlier = [c for j, c in other.points.items() if j <= k]
    if any(c is True for c in earlier):
        return False
    return True if all(c is False for c in earlier) else UNDECIDED


def _overtaken(first: Curve, other: Curve) -> bool:
    """``other`` has recovered retrieval at an update count by which ``first`` decidedly has not
    (False at that count and at every smaller one): the claim "first is faster" is refuted."""
    for k, recovered in sorted(other.points.items()):
        if recovered is True and k in first.points:
            if all(c is False for j, c in first.points.items() if j <= k):
                return True
    return False


@register_finding(
    "F4",
    Scope(positions=("rope",), metrics=("passkey_acc",), finetunes=F4_METHODS),
    claim=f"fine-tuning at {FAR}L (passkey over L..{FAR}L, acc >= {RETRIEVAL_MIN_ACC} on its "
    "interval, after k updates): PI recovers within the grid where direct fine-tuning has "
    "not; YaRN recovers with fewer updates than PI; raw RoPE <= "
    f"{NEAR_ZERO_ACC} beyond L (CI upper end); on the seeds whose raw RoPE model is not "
    f"decidedly below {PARENT_MIN_ACC} at L",
    source="Chen et al. 2023, Position Interpolation, Sec. 3.2 passkey retrieval (PI vs direct "
    "fine-tuning); Peng et al. 2024, YaRN, Sec. 4 (fewer training steps than PI)",
    thresholds={
        "FAR": FAR,
        "RETRIEVAL_MIN_ACC": RETRIEVAL_MIN_ACC,
        "NEAR_ZERO_ACC": NEAR_ZERO_ACC,
        "PARENT_MIN_ACC": PARENT_MIN_ACC,
    },
)
def f4_finetune_retrieval(df: pd.DataFrame) -> FindingResult:
    """The papers' contrasts on recovery curves (retrieval over L..4L after k fine-tuning updates
    at 4L, k on the run's grid): PI recovers within the grid while direct fine-tuning (the raw
    rotary at 4L) has not at that count (Chen et al.); YaRN recovers with fewer updates than PI
    (Peng et al.); and raw RoPE retrieves <= 0.1 beyond L without fine-tuning. A contrast fails
    where the other method recovered at an update count by which the first decidedly had not (or
    the first never recovers decidedly within the grid); it is not decided while either curve's
    interval straddles. Only seeds whose raw RoPE model retrieves at L are read (not decidedly
    below 0.8: a seed whose retrieval circuit never formed has nothing to recover); a seed left
    out is named in the numbers, and F5 still counts it."""
    checks: list[Check] = []
    missing: list[str] = []
    left_out = parents_left_out(df)
    curves = recovery_curves(df, left_out)
    est = _curve_estimates(curves)
    _check_curve_contrasts(curves, checks, missing)
    est.extend(check_raw_rope_beyond(df, checks, missing, left_out))
    est.extend(left_out.values())
    return FindingResult(status=status(checks), estimates=est, missing=missing)


def _curve_estimates(curves: list[Curve]) -> list[Estimate]:
    """Per recovery curve, the fewest updates that recover retrieval (inf if none on its grid)."""
    est = []
    labels: dict[str, str] = {}  # what tells a method's curves apart, where it has several
    for method in F4_METHODS:
        keys = [c.key for c in curves if c.method == method]
        labels.update(series_labels(keys, [*SERIES_COLUMNS[:-1], "template"]))
    for curve in curves:
        k, _ = curve.first_recovered()
        grid = "/".join(str(x) for x in sorted(curve.points))
        name = named(
            f"{curve.method} ft@{FAR}x updates to retrieve over L..{FAR}L", curve.key, labels
        )
        value = math.inf if k is None else float(k)
        est.append(
            Estimate(f"{name} (grid {grid})", value, n_seeds=curve.n_seeds, ci=CURVE_CI, digits=0)
        )
    return est


def _check_curve_contrasts(curves: list[Curve], checks: list[Check], missing: list[str]) -> None:
    """Append to ``checks`` / ``missing`` the F4 contrasts between methods' recovery curves."""
    by_method = {m: [c for c in curves if c.method == m] for m in F4_METHODS}
    for method in F4_METHODS:
        if not by_method[method]:
            missing.append(f"{method} ft@{FAR}x")
    # Chen et al.: PI recovers where direct fine-tuning has not; Peng et al.: YaRN before PI
    for curve in curves:
        absent = [k for k, c in sorted(curve.points.items()) if c is None]
        if absent:  # the claim names every length L..4L at every update count
            where = "/".join(str(k) for k in absent)
            missing.append(f"{curve.method} ft@{FAR}x: L..{FAR}L at {where} updates")
            checks.append(None)
    for earlier, later in (("pi", "direct"), ("yarn", "pi")):
        if not by_method[earlier]:
            checks.append(None)
        for a in by_method[earlier]:
            k, decided = a.first_recovered()
            others = [b for b in by_method[later] if b.pair == a.pair]
            if k is None:  # it does not recover within its grid: the claim fails on its own,
                # or where the other method decidedly recovered first
                refuted = decided or any(_overtaken(a, b) for b in others)
                checks.append(False if refuted else UNDECIDED)
                continue
            if not others:
                missing.append(f"{later} ft@{FAR}x next to {earlier}")
                checks.append(None)
            for b in others:
                check = _recovered_before(a, b)
                if check is None:
                    missing.append(f"{later} ft@{FAR}x at {k} updates")
                checks.append(check)


def check_raw_rope_beyond(
    df: pd.DataFrame, checks: list[Check], missing: list[str], left_out: dict | None = None
) -> list[Estimate]:
    """Append to ``checks`` / ``missing`` whether raw RoPE stays <= NEAR_ZERO_ACC at 2L..FAR L
    without fine-tuning (models in ``left_out`` not read); return each series' best accuracy
    there."""
    est = []
    raw = passkey_series(without_parents(passkey(select(df, "rope")), left_out, "model_id"))
    raw_labels = passkey_labels([k for k, _ in raw])
    raw_checked = False
    for key, rows in raw:
        accs = {k: accuracy_estimate(at(rows, k), "") for k in (2, FAR)}
        if all(math.isnan(e.value) for e in accs.values()):
            continue  # no rows beyond L in this series
        raw_checked = True
        absent = [k for k, e in accs.items() if math.isnan(e.value)]
        if absent:
            missing.append(named(f"raw rope at {absent[0]}L", key, raw_labels))
            checks.append(None)
            continue
        best_k = max(accs, key=lambda k: (accs[k].value, accs[k].hi))
        best = accs[best_k]
        best.name = named(f"raw rope max acc over 2L..{FAR}L (at {best_k}L)", key, raw_labels)
        est.append(best)
        checks.append(all_of([decide(e, NEAR_ZERO_ACC, "at_most") for e in accs.values()]))
    if not raw_checked:
        missing.append("raw rope beyond L")
        checks.append(None)
    return est


@register_finding(
    "F5",
    Scope(positions=("rope",), scalings=("none",), metrics=("passkey_acc",), finetunes=("none",)),
    claim=f"RoPE passkey accuracy at L >= {IN_DISTRIBUTION_MIN_ACC} on every seed run (the lower "
    "end of each seed's Wilson interval)",
    source="Mohtashami & Jaggi 2023, Landmark Attention, passkey retrieval task",
    thresholds={"IN_DISTRIBUTION_MIN_ACC": IN_DISTRIBUTION_MIN_ACC},
)
def f5_rope_passkey_at_l(df: pd.DataFrame) -> FindingResult:
    """The retrieval arm trains until it retrieves on its own check examples, so F5 asks whether
    that carries to the evaluation's examples after the decay; it fails for a seed that ran its
    update budget without the retrieval circuit forming."""
    est, checks = [], []
    series = passkey_series(select(df, "rope"))
    labels = passkey_labels([k for k, _ in series])
    for key, rows in series:
        t = trials(at(rows, 1))
        if t.empty:
            continue
        by_seed = []
        for _, r in t.iterrows():
            lo, hi = wilson(r["k"], r["n"])
            by_seed.append(Estimate("", float(r["acc"]), lo, hi, 1, SEED_ACC_CI))
        worst = min(by_seed, key=lambda e: (e.lo, e.value))
        worst.name = named("rope acc at L, worst seed", key, labels)
        worst.n_seeds = len(by_seed)
        est.append(worst)
        checks.append(all_of([decide(e, IN_DISTRIBUTION_MIN_ACC, "at_least") for e in by_seed]))
    return FindingResult(
        status=status(checks or [None]),
        estimates=est,
        missing=[] if checks else ["rope passkey at L"],
    )


@register_finding(
    "F6",
    Scope(
        positions=("rope", "alibi", "nope", "sinusoidal", "learned"),
        scalings=("none",),
        metrics=("shift_dnll",),
        finetunes=("none",),
    ),
    claim=f"shift probe: |dNLL| <= {SHIFT_ZERO_TOL} for RoPE, ALiBi, NoPE; CI > 0 at the largest "
    "delta for sinusoidal and learned",
    source="Su et al. 2021, RoFormer (relative by construction); Vaswani et al. 2017, Sec. 3.5 (absolute)",
    thresholds={"SHIFT_ZERO_TOL": SHIFT_ZERO_TOL},
)
def f6_shift_probe(df: pd.DataFrame) -> FindingResult:
    est, checks, missing = shift_invariant_checks(df, ("rope", "alibi", "nope"))
    for part, out in zip(
        shift_sensitive_checks(df, ("sinusoidal", "learned")), (est, checks, missing), strict=True
    ):
        out.extend(part)
    return FindingResult(status=status(checks), estimates=est, missing=missing)
