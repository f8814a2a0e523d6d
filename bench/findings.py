"""The field's known qualitative findings, checked against a results table.

Each finding is one function ``(df) -> FindingResult`` in :data:`FINDINGS`: status ``holds`` /
``does not hold`` / ``not measured`` (its rows are absent: never ``holds``), the numbers and CIs
it used, and its source. Thresholds are the named constants below, fixed in advance.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

HOLDS, FAILS, NOT_MEASURED = "holds", "does not hold", "not measured"

#: Eval length (multiple of the training length L) at which degradation is judged.
FAR = 4
#: Confidence level of every interval used here (per-run stored CIs are read as 95% intervals).
LEVEL = 0.95
#: F2: ALiBi "does not degrade": perplexity ratio to L at every length in (L, 4L] at most this.
ALIBI_MAX_RATIO = 1.02
#: F4: passkey accuracy that counts as "retrieves" (YaRN's passkey threshold).
RETRIEVAL_MIN_ACC = 0.8
#: F4: raw RoPE accuracy beyond L that counts as "near 0".
NEAR_ZERO_ACC = 0.1
#: F5: RoPE passkey accuracy at L on every seed run.
IN_DISTRIBUTION_MIN_ACC = 0.9
#: F6: |shift ΔNLL| (nats) at every delta > 0 that counts as "≈ 0" for relative encodings.
SHIFT_ZERO_TOL = 0.01

SEED_CI = "mean ± t-interval across seeds"
RUN_CI = "one seed: normal approximation from the run's stored bootstrap CIs"
NO_CI = "one seed without stored CIs: no CI, so a check that needs one is not measured"


@dataclass
class Estimate:
    """One number a finding used: its value, CI (NaN when none) and how the CI was made."""

    name: str
    value: float
    lo: float = math.nan
    hi: float = math.nan
    n_seeds: int = 0
    ci: str = ""

    def text(self, digits: int = 3) -> str:
        if math.isnan(self.value):
            return f"{self.name} n/a"
        ci = "" if math.isnan(self.lo) else f" [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"
        ci = " [no CI]" if self.ci == NO_CI else ci
        return f"{self.name} {self.value:.{digits}f}{ci} ({self.n_seeds} seed{'s' * (self.n_seeds != 1)})"


@dataclass
class FindingResult:
    key: str
    claim: str
    status: str
    source: str
    estimates: list[Estimate] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def numbers(self) -> str:
        parts = [e.text() for e in self.estimates]
        if self.missing:
            parts.append("not measured: " + ", ".join(self.missing))
        return "; ".join(parts)


def _status(checks: list[bool | None]) -> str:
    """Any measured check false -> does not hold; else any unmeasured (None) -> not measured."""
    if any(c is not None and not c for c in checks):
        return FAILS
    if not checks or any(c is None for c in checks):
        return NOT_MEASURED
    return HOLDS


# --------------------------------------------------------------------------- row selection


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    return df[name] if name in df.columns else pd.Series(np.nan, index=df.index)


def select(df: pd.DataFrame, position: str, scaling: str | None = "none", tuned: str | None = None):
    """Rows of one position x scaling (any when None); zero-shot (no ``finetune_method``) unless
    ``tuned`` names the fine-tune method (a fine-tune's scaling label is its own, e.g. "pi")."""
    method = _col(df, "finetune_method")
    keep = df["position"] == position
    if scaling is not None:
        keep &= df["scaling"] == scaling
    keep &= method.isna() if tuned is None else (method == tuned)
    return df[keep]


def _window_nll(df: pd.DataFrame) -> pd.DataFrame:
    """Whole-window ``nll`` rows (no bucket columns) with tokens and a finite value."""
    keep = (df["metric"] == "nll") & _col(df, "bucket_lo").isna() & _col(df, "bucket_hi").isna()
    keep &= (df["n"] > 0) & np.isfinite(df["value"])
    return df[keep]


#: One trained model's run: rows of different arms (or lengths, or seeds) are never pooled.
RUN = ["experiment", "arm", "train_length", "seed"]


def _per_run(rows: pd.DataFrame, multiple: float | None) -> pd.DataFrame:
    """Per run (experiment, L, seed): token-weighted value, with an se from the stored CI, at
    eval length = ``multiple`` x L (any eval length when None)."""
    if multiple is not None:
        rows = rows[rows["eval_length"] == (rows["train_length"] * multiple).round().astype(int)]
    if rows.empty:
        return pd.DataFrame(columns=[*RUN, "value", "se"])
    se = (_col(rows, "ci_hi") - _col(rows, "ci_lo")) / (2 * stats.norm.ppf(0.5 + LEVEL / 2))
    arm = _col(rows, "arm").astype(object).where(_col(rows, "arm").notna(), "all")  # older rows
    w = rows.assign(_w=rows["n"].astype(float), _se=se, arm=arm)
    return (
        w.groupby(RUN)
        .apply(
            lambda g: pd.Series(
                {
                    "value": np.average(g["value"], weights=g["_w"]),
                    "se": math.sqrt(np.average(g["_se"] ** 2, weights=g["_w"])),
                }
            ),
            include_groups=False,
        )
        .reset_index()
    )


def _summarise(name: str, values: np.ndarray, ses: np.ndarray, transform=None) -> Estimate:
    """Mean and CI of per-seed values (t-interval), or with one seed value ± z·se."""
    transform = transform or (lambda x: x)
    values = np.asarray(values, dtype=float)
    if len(values) == 0:
        return Estimate(name, math.nan)
    if len(values) == 1:
        v, se = float(values[0]), float(ses[0])
        if math.isnan(se):  # no stored CI: a CI-based check is not measured
            return Estimate(name, transform(v), n_seeds=1, ci=NO_CI)
        half = stats.norm.ppf(0.5 + LEVEL / 2) * se
        return Estimate(name, transform(v), transform(v - half), transform(v + half), 1, RUN_CI)
    mean = float(values.mean())
    half = (
        stats.t.ppf(0.5 + LEVEL / 2, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    )
    t = transform
    return Estimate(name, t(mean), t(mean - half), t(mean + half), len(values), SEED_CI)


def nll_difference(a: pd.DataFrame, b: pd.DataFrame, multiple_a: float, multiple_b: float):
    """Per-run NLL(a at multiple_a x L) - NLL(b at multiple_b x L), paired on runs; and ses."""
    ra, rb = _per_run(_window_nll(a), multiple_a), _per_run(_window_nll(b), multiple_b)
    m = ra.merge(rb, on=RUN, suffixes=("_a", "_b"))
    return (m["value_a"] - m["value_b"]).to_numpy(), np.hypot(m["se_a"], m["se_b"]).to_numpy()


def ppl_ratio(rows: pd.DataFrame, name: str, multiple: float = FAR) -> Estimate:
    """Perplexity at ``multiple`` x L over perplexity at L: exp of the per-seed NLL difference,
    so with several seeds the geometric mean of the per-seed ratios and a t-interval on log scale.

    With one seed the CI treats the two lengths' stored CIs as independent; they share
    documents, so it is wider than a paired interval would be (conservative)."""
    diff, se = nll_difference(rows, rows, multiple, 1)
    return _summarise(name, diff, se, transform=math.exp)


def _excludes(e: Estimate, value: float, above: bool) -> bool | None:
    if math.isnan(e.value) or math.isnan(e.lo):
        return None
    return bool(e.lo > value) if above else bool(e.hi < value)


def _passkey(rows: pd.DataFrame) -> pd.DataFrame:
    """Per-length ``passkey_acc`` rows: axis="template" (or no axis, as older rows have it)."""
    axis = _col(rows, "axis")
    return rows[(rows["metric"] == "passkey_acc") & ((axis == "template") | axis.isna())]


def _per_seed_acc(rows: pd.DataFrame, multiple: float) -> np.ndarray:
    r = _per_run(_passkey(rows), multiple)
    return r["value"].to_numpy()


# --------------------------------------------------------------------------- the findings

PRESS = "Press et al. 2022, Train Short, Test Long (ALiBi), Fig. 1"


def f1_absolute_degrade(df: pd.DataFrame) -> FindingResult:
    est, checks, missing = [], [], []
    for pos in ("sinusoidal", "learned"):
        e = ppl_ratio(select(df, pos), f"{pos} ppl({FAR}L)/ppl(L)")
        (est.append(e) if not math.isnan(e.value) else missing.append(pos))
        checks.append(_excludes(e, 1.0, above=True))
    return FindingResult(
        "F1",
        f"absolute encodings (sinusoidal, learned) degrade past L: ppl ratio {FAR}L/L, CI > 1",
        _status(checks),
        PRESS
        + " (sinusoidal); Kazemnejad et al. 2023, The Impact of Positional Encoding on Length Generalization (learned absolute)",
        est,
        missing,
    )


def f2_alibi_flat(df: pd.DataFrame) -> FindingResult:
    rows = select(df, "alibi")
    ratios = [ppl_ratio(rows, f"alibi ppl({k}L)/ppl(L)", k) for k in (2, FAR)]
    est = [e for e in ratios if not math.isnan(e.value)]
    checks: list[bool | None] = [e.value <= ALIBI_MAX_RATIO for e in est]
    far_missing = math.isnan(ratios[-1].value)
    if far_missing:  # "up to 4L" needs 4L; 2L is checked where measured
        checks.append(None)
    return FindingResult(
        "F2",
        f"ALiBi does not degrade up to {FAR}L: ppl ratio to L <= {ALIBI_MAX_RATIO} at 2L and {FAR}L",
        _status(checks),
        PRESS,
        est,
        [f"alibi at {FAR}L"] if far_missing else [],
    )


def f3_rope_scaling(df: pd.DataFrame) -> FindingResult:
    raw = select(df, "rope")
    e = ppl_ratio(raw, f"rope ppl({FAR}L)/ppl(L)")
    est, missing = [e], []
    checks = [_excludes(e, 1.0, above=True)]
    for method in ("ntk", "yarn"):
        for other, label in (("none", "raw"), ("linear", "PI")):
            diff, se = nll_difference(
                select(df, "rope", method), select(df, "rope", other), FAR, FAR
            )
            d = _summarise(f"NLL({FAR}L) {method} - {label}", diff, se)
            est.append(d)
            checks.append(_excludes(d, 0.0, above=False))
    for x in est:
        if math.isnan(x.value):
            missing.append(x.name)
    return FindingResult(
        "F3",
        f"raw RoPE degrades past ~2L; zero-shot NTK-aware and YaRN beat raw RoPE and PI at {FAR}L "
        "(NLL difference CI < 0)",
        _status(checks),
        PRESS + " (rotary); Peng et al. 2024, YaRN, long-sequence perplexity experiments; bloc97 "
        "2023, NTK-aware scaled RoPE (Reddit post)",
        [x for x in est if not math.isnan(x.value)],
        missing,
    )


def f4_finetune_retrieval(df: pd.DataFrame) -> FindingResult:
    est, checks, missing = [], [], []
    for method in ("pi", "yarn"):
        rows = _passkey(select(df, "rope", None, tuned=method))
        at_far = _col(rows, "finetune_length") == rows["train_length"] * FAR
        rows = rows[at_far.fillna(False).astype(bool)]
        accs = [_per_seed_acc(rows, k) for k in (1, 2, FAR)]
        if len(accs[-1]) == 0:
            missing.append(f"{method} ft@{FAR}x")
            checks.append(None)
            continue
        worst = min(float(np.mean(a)) for a in accs if len(a))  # seed mean, worst length
        est.append(Estimate(f"{method} ft@{FAR}x min acc L..{FAR}L", worst, n_seeds=len(accs[-1])))
        checks.append(worst >= RETRIEVAL_MIN_ACC)
    beyond = [_per_seed_acc(select(df, "rope"), k) for k in (2, FAR)]
    beyond = [a for a in beyond if len(a)]
    if beyond:
        best = max(float(np.mean(a)) for a in beyond)
        est.append(Estimate(f"raw rope max acc over 2L..{FAR}L", best, n_seeds=len(beyond[0])))
        checks.append(best <= NEAR_ZERO_ACC)
    else:
        missing.append("raw rope beyond L")
        checks.append(None)
    return FindingResult(
        "F4",
        f"after a fine-tune at {FAR}L, PI and YaRN retrieve the passkey over L..{FAR}L "
        f"(acc >= {RETRIEVAL_MIN_ACC}); raw RoPE <= {NEAR_ZERO_ACC} beyond L",
        _status(checks),
        "Chen et al. 2023, Position Interpolation, passkey retrieval after fine-tuning; Peng et al. "
        "2024, YaRN, passkey retrieval",
        est,
        missing,
    )


def f5_rope_passkey_at_l(df: pd.DataFrame) -> FindingResult:
    accs = _per_seed_acc(select(df, "rope"), 1)
    e = Estimate("rope acc at L, worst seed", float(accs.min()) if len(accs) else math.nan)
    e.n_seeds = len(accs)
    return FindingResult(
        "F5",
        f"RoPE passkey accuracy at L >= {IN_DISTRIBUTION_MIN_ACC} on every seed run",
        _status([None if len(accs) == 0 else bool(accs.min() >= IN_DISTRIBUTION_MIN_ACC)]),
        "Mohtashami & Jaggi 2023, Landmark Attention, passkey retrieval task",
        [e] if len(accs) else [],
        [] if len(accs) else ["rope passkey at L"],
    )


def _shift(df: pd.DataFrame, position: str) -> pd.DataFrame:
    rows = select(df, position)
    rows = rows[(rows["metric"] == "shift_dnll") & (_col(rows, "axis") == "delta")]
    return rows.assign(delta=pd.to_numeric(rows["axis_value"], errors="coerce")).query("delta > 0")


def f6_shift_probe(df: pd.DataFrame) -> FindingResult:
    est, checks, missing = [], [], []
    for pos in ("rope", "alibi", "nope"):
        rows = _shift(df, pos)
        if rows.empty:
            missing.append(pos)
            checks.append(None)
            continue
        worst = float(rows["value"].abs().max())
        est.append(Estimate(f"{pos} max |dNLL|", worst, n_seeds=rows["seed"].nunique()))
        checks.append(worst <= SHIFT_ZERO_TOL)
    for pos in ("sinusoidal", "learned"):
        rows = _shift(df, pos)
        if rows.empty:
            missing.append(pos)
            checks.append(None)
            continue
        top = rows[rows["delta"] == rows["delta"].max()]
        r = _per_run(top, None)
        e = _summarise(f"{pos} dNLL at delta={int(top['delta'].iloc[0])}", r["value"], r["se"])
        est.append(e)
        checks.append(_excludes(e, 0.0, above=True))
    return FindingResult(
        "F6",
        f"shift probe: |dNLL| <= {SHIFT_ZERO_TOL} for RoPE, ALiBi, NoPE; CI > 0 at the largest "
        "delta for sinusoidal and learned",
        _status(checks),
        "Su et al. 2021, RoFormer (relative by construction); Vaswani et al. 2017, Sec. 3.5 (absolute)",
        est,
        missing,
    )


FINDINGS: dict[str, Callable[[pd.DataFrame], FindingResult]] = {
    "F1": f1_absolute_degrade,
    "F2": f2_alibi_flat,
    "F3": f3_rope_scaling,
    "F4": f4_finetune_retrieval,
    "F5": f5_rope_passkey_at_l,
    "F6": f6_shift_probe,
}


def check_findings(df: pd.DataFrame) -> list[FindingResult]:
    """Every registered finding on the results rows ``df``."""
    return [fn(df) for fn in FINDINGS.values()]


def findings_table(results: list[FindingResult]) -> pd.DataFrame:
    """One row per finding: finding, claim, status, numbers, ci, source."""
    return pd.DataFrame(
        [
            {
                "finding": r.key,
                "claim": r.claim,
                "status": r.status,
                "numbers": r.numbers,
                "ci": "; ".join(sorted({e.ci for e in r.estimates if e.ci})),
                "source": r.source,
            }
            for r in results
        ],
        columns=["finding", "claim", "status", "numbers", "ci", "source"],
    )


def any_failed(results: list[FindingResult]) -> bool:
    return any(r.status == FAILS for r in results)
