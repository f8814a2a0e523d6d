"""The field's known qualitative findings, checked against a results table.

Each finding is one function ``(df) -> FindingResult`` in :data:`FINDINGS` (the zoo's are in
:mod:`bench.findings_zoo`): status ``holds`` /
``does not hold`` / ``not decided`` (an interval straddles the threshold) / ``not measured``
(its rows are absent: never ``holds``), the numbers and CIs it used, and its source. Thresholds
are the named constants below, fixed in advance.

A finding is evaluated per **series** (``bench.series``: the full model identity minus the seed,
under one scaling): seeds are the only replicate axis. Where several series match a finding,
each is reported on its own line and each is checked; one that does not hold makes the finding
not hold. Every decision is on an interval: a claim holds when its interval lies on the claimed
side of the threshold, does not hold when it lies on the other side, and is not decided otherwise.
Passkey accuracies carry a Wilson interval of their trials (:func:`accuracy_estimate`).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from bench.series import SERIES_COLUMNS, columns_key, model_series_key, series_key, series_labels

HOLDS, FAILS, NOT_MEASURED = "holds", "does not hold", "not measured"
NOT_DECIDED = "not decided"
#: A check whose interval straddles its threshold (a value of a check list, beside True / False /
#: None = not measured).
UNDECIDED = "undecided"

#: Eval length (multiple of the training length L) at which degradation is judged.
FAR = 4
#: Confidence level of every interval used here (per-run stored CIs are read as 95% intervals).
LEVEL = 0.95
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
#: F6: |shift ΔNLL| (nats) at every delta > 0 that counts as "≈ 0" for relative encodings.
SHIFT_ZERO_TOL = 0.01

SEED_CI = "mean ± t-interval across seeds"
RUN_CI = "one seed: normal approximation from the run's stored bootstrap CIs"
NO_CI = "one seed without stored CIs: no CI, so a check that needs one is not measured"
ACC_CI = (
    "accuracy: Wilson interval of the trials (all seeds pooled), widened to the t-interval "
    "across seeds where that is wider"
)
SEED_ACC_CI = "accuracy per seed: Wilson interval of that seed's trials"
SEED_DOC_CI = (
    "mean ± t-interval across seeds, widened to a seed x document bootstrap where that is wider"
)
DOC_CI = (
    "one seed: document bootstrap (paired across lengths), widened to the run's stored CIs "
    "where those are wider"
)
CURVE_CI = (
    "updates to retrieve: the fewest on the fine-tune's grid whose accuracy at every length has "
    "its interval's lower end >= the threshold (inf: none)"
)


@dataclass
class Estimate:
    """One number a finding used: its value, CI (NaN when none) and how the CI was made."""

    name: str
    value: float
    lo: float = math.nan
    hi: float = math.nan
    n_seeds: int = 0
    ci: str = ""
    digits: int = 3
    # per-seed mean and spread on the scale the interval was made on (log for ratios), where
    # the interval is a seed t-interval: what :func:`seeds_to_decide` reads
    seed_mean: float = math.nan
    seed_sd: float = math.nan
    log_scale: bool = False
    seeds_needed: int | None = None  # set by decide() where the interval straddles

    def text(self, digits: int | None = None) -> str:
        digits = self.digits if digits is None else digits
        if math.isnan(self.value):
            return f"{self.name} n/a"
        ci = "" if math.isnan(self.lo) else f" [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"
        ci = " [no CI]" if self.ci == NO_CI else ci
        seeds = f" ({self.n_seeds} seed{'s' * (self.n_seeds != 1)})" if self.n_seeds else ""
        if self.seeds_needed is not None:
            if self.seeds_needed <= self.n_seeds:
                more = "the seeds' interval alone decides; the document bootstrap keeps it open"
            elif self.seeds_needed > MAX_SEEDS_TO_DECIDE:
                more = f"more than {MAX_SEEDS_TO_DECIDE} seeds to decide at this spread"
            else:
                more = f"at least {self.seeds_needed} seeds to decide at this spread"
            seeds = seeds[:-1] + f"; {more})" if seeds else seeds
        return f"{self.name} {self.value:.{digits}f}{ci}{seeds}"


#: seeds_to_decide searches up to this count
MAX_SEEDS_TO_DECIDE = 1000


def seeds_to_decide(e: Estimate, threshold: float) -> int | None:
    """The fewest seeds whose t-interval, at the observed per-seed mean and spread of ``e``,
    would lie on one side of ``threshold`` (``MAX_SEEDS_TO_DECIDE`` + 1 if none up to it; None
    without a seed spread). A lower estimate where the interval was also widened to a document
    bootstrap, which more seeds narrow less."""
    if e.n_seeds < 2 or not math.isfinite(e.seed_sd):
        return None
    bar = math.log(threshold) if e.log_scale else threshold
    gap = abs(e.seed_mean - bar)
    if e.seed_sd == 0:
        return e.n_seeds if gap > 0 else MAX_SEEDS_TO_DECIDE + 1
    for n in range(2, MAX_SEEDS_TO_DECIDE + 1):
        if stats.t.ppf(0.5 + LEVEL / 2, n - 1) * e.seed_sd / math.sqrt(n) < gap:
            return n
    return MAX_SEEDS_TO_DECIDE + 1


@dataclass
class FindingResult:
    key: str
    claim: str
    status: str
    source: str
    estimates: list[Estimate] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # observations beside the claim

    @property
    def numbers(self) -> str:
        parts = [e.text() for e in self.estimates] + list(self.notes)
        if self.missing:
            parts.append("not measured: " + ", ".join(self.missing))
        return "; ".join(parts)


Check = bool | str | None  # True, False, UNDECIDED, or None (not measured)


def _status(checks: list[Check]) -> str:
    """Any check false -> does not hold; else any unmeasured (None) -> not measured; else any
    undecided -> not decided; else holds."""
    if any(c is False for c in checks):
        return FAILS
    if not checks or any(c is None for c in checks):
        return NOT_MEASURED
    if any(c == UNDECIDED for c in checks):
        return NOT_DECIDED
    return HOLDS


def decide(e: Estimate, threshold: float, claim: str) -> Check:
    """The check of "value <claim> threshold" on ``e``'s interval: True when the whole interval
    satisfies it, False when none of it does, :data:`UNDECIDED` when it straddles, None when
    there is no interval. ``claim``: "above" (>), "below" (<), "at_most" (<=), "at_least" (>=).
    """
    if math.isnan(e.value) or math.isnan(e.lo) or math.isnan(e.hi):
        return None
    lo, hi = e.lo, e.hi
    holds, fails = {
        "above": (lo > threshold, hi <= threshold),
        "below": (hi < threshold, lo >= threshold),
        "at_most": (hi <= threshold, lo > threshold),
        "at_least": (lo >= threshold, hi < threshold),
    }[claim]
    if holds or fails:
        return bool(holds)
    needed = seeds_to_decide(e, threshold)
    if needed is not None:
        e.seeds_needed = max(needed, e.seeds_needed or 0)
    return UNDECIDED


def _all(checks: list[Check]) -> Check:
    """One check from several that must all hold (same precedence as :func:`_status`)."""
    status = _status(checks)
    return {HOLDS: True, FAILS: False, NOT_DECIDED: UNDECIDED}.get(status)


# --------------------------------------------------------------------------- scope and registry

#: the value a row without the column has (an older table, or a setting left at its default)
SCOPE_DEFAULTS = {
    "position_sampling": "contiguous",
    "attention_sink": "none",
    "finetune_method": "none",
}
CONTIGUOUS = ("contiguous",)
NO_SINK = ("none",)


@dataclass(frozen=True)
class Scope:
    """What a finding is about, declared once with it: the series it checks (``positions``,
    ``scalings``, ``metrics``, ``finetunes``, ``samplings``, ``sinks``, ``arms``; None = any) and
    the rows it reads (those, plus the comparison series it needs: ``also_samplings``,
    ``also_sinks``). A report checks a finding only where one of its series is present, and the
    finding reads only its rows: F1 is not computed on a PoSE-trained sinusoidal model, nor L3's
    sinks counted against F3."""

    positions: tuple[str, ...] | None = None
    scalings: tuple[str, ...] | None = None
    metrics: tuple[str, ...] | None = None
    finetunes: tuple[str, ...] | None = None  # "none": the zero-shot models
    samplings: tuple[str, ...] = CONTIGUOUS
    sinks: tuple[str, ...] = NO_SINK
    arms: tuple[str, ...] | None = None
    also_samplings: tuple[str, ...] = ()
    also_sinks: tuple[str, ...] = ()

    @staticmethod
    def _values(df: pd.DataFrame, column: str) -> pd.Series:
        return (
            _col(df, column)
            .astype(object)
            .where(_col(df, column).notna(), SCOPE_DEFAULTS.get(column))
        )

    def _keep(self, df: pd.DataFrame, column: str, allowed) -> pd.Series:
        if allowed is None:
            return pd.Series(True, index=df.index)
        return self._values(df, column).isin(list(allowed))

    def rows(self, df: pd.DataFrame) -> pd.DataFrame:
        """The rows the finding reads."""
        keep = self._keep(df, "position_sampling", (*self.samplings, *self.also_samplings))
        keep &= self._keep(df, "attention_sink", (*self.sinks, *self.also_sinks))
        keep &= self._keep(df, "arm", self.arms) if "arm" in df.columns else True
        return df[keep]

    def subject(self, df: pd.DataFrame) -> pd.DataFrame:
        """The rows of the series the finding is about (empty: out of scope)."""
        keep = pd.Series(True, index=df.index)
        for column, allowed in (
            ("position", self.positions),
            ("scaling", self.scalings),
            ("metric", self.metrics),
            ("finetune_method", self.finetunes),
            ("position_sampling", self.samplings),
            ("attention_sink", self.sinks),
        ):
            keep &= self._keep(df, column, allowed)
        if self.arms is not None and "arm" in df.columns:
            keep &= self._keep(df, "arm", self.arms)
        return df[keep]

    def describe(self) -> str:
        parts = [
            f"{name} {', '.join(values)}"
            for name, values in (
                ("positions", self.positions),
                ("scalings", self.scalings),
                ("fine-tunes", self.finetunes),
                ("arms", self.arms),
                ("metrics", self.metrics),
                ("position sampling", self.samplings),
                ("attention sink", self.sinks),
            )
            if values is not None
        ]
        return "; ".join(parts)


@dataclass(frozen=True)
class Finding:
    """One registered finding: its key, check function ``fn(df) -> FindingResult`` and scope."""

    key: str
    check: Callable[[pd.DataFrame], FindingResult]
    scope: Scope


FINDINGS: dict[str, Finding] = {}
"""Registered findings by key, in registration order (complete once :func:`findings` has run)."""

#: Modules whose import registers more findings (loaded on first use, by name: they import this
#: module's helpers).
FINDING_MODULES = (
    "bench.findings_zoo",
    "bench.findings_training_free",
    "bench.findings_train",
    "bench.findings_ruler",
)


def register_finding(key: str, scope: Scope) -> Callable:
    """Decorator: register ``fn(df) -> FindingResult`` under ``key`` with its :class:`Scope`
    (refused if the key is taken)."""

    def register(fn: Callable[[pd.DataFrame], FindingResult]):
        if key in FINDINGS:
            raise ValueError(f"finding {key!r} is already registered.")
        if not isinstance(scope, Scope):
            raise TypeError(f"finding {key!r}: scope must be a Scope, got {scope!r}.")
        FINDINGS[key] = Finding(key, fn, scope)
        return fn

    return register


# --------------------------------------------------------------------------- row selection


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    return df[name] if name in df.columns else pd.Series(np.nan, index=df.index)


def _with_series(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with ``_series`` / ``_model`` keys (``bench.series``), computed once."""
    if "_series" in df.columns:
        return df
    return df.assign(_series=series_key(df), _model=model_series_key(df))


def select(df: pd.DataFrame, position: str, scaling: str | None = "none", tuned: str | None = None):
    """Rows of one position x scaling (any when None); zero-shot (no ``finetune_method``) unless
    ``tuned`` names the fine-tune method (a fine-tune's scaling label is its own, e.g. "pi")."""
    df = _with_series(df)
    method = _col(df, "finetune_method")
    keep = df["position"] == position
    if scaling is not None:
        keep &= df["scaling"] == scaling
    keep &= method.isna() if tuned is None else (method == tuned)
    return df[keep]


def by_series(rows: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(series key, its rows) per series in ``rows``, in key order."""
    rows = _with_series(rows)
    return [(str(k), g) for k, g in rows.groupby("_series", sort=True)]


def _named(name: str, key: str, labels: dict[str, str]) -> str:
    """``name``, with the series' distinguishing label where several series matched."""
    label = labels.get(key, "")
    return f"{name} [{label}]" if label else name


def _window_nll(df: pd.DataFrame) -> pd.DataFrame:
    """Whole-window ``nll`` rows (no bucket columns) with tokens and a finite value."""
    keep = (df["metric"] == "nll") & _col(df, "bucket_lo").isna() & _col(df, "bucket_hi").isna()
    keep &= (df["n"] > 0) & np.isfinite(df["value"])
    return df[keep]


def _at(rows: pd.DataFrame, multiple: float | None) -> pd.DataFrame:
    if multiple is None:
        return rows
    return rows[rows["eval_length"] == (rows["train_length"] * multiple).round().astype(int)]


def _per_seed(rows: pd.DataFrame, multiple: float | None) -> pd.DataFrame:
    """Per seed of one series: token-weighted value, with an se from the stored CI, at eval
    length = ``multiple`` x L (any eval length when None). Rows of one series and seed come from
    one model, so nothing of different models is averaged."""
    rows = _at(rows, multiple)
    if rows.empty:
        return pd.DataFrame(columns=["seed", "value", "se"])
    se = (_col(rows, "ci_hi") - _col(rows, "ci_lo")) / (2 * stats.norm.ppf(0.5 + LEVEL / 2))
    w = rows.assign(_w=rows["n"].astype(float), _se=se)
    return (
        w.groupby("seed")
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
    return Estimate(name, t(mean), t(mean - half), t(mean + half), len(values), SEED_CI,
                    seed_mean=mean, seed_sd=float(values.std(ddof=1)),
                    log_scale=transform is math.exp)  # fmt: skip


def nll_difference(a: pd.DataFrame, b: pd.DataFrame, multiple_a: float, multiple_b: float):
    """Per-seed NLL(a at multiple_a x L) - NLL(b at multiple_b x L), paired on seeds (``a`` and
    ``b`` are rows of one series each); and ses."""
    ra, rb = _per_seed(_window_nll(a), multiple_a), _per_seed(_window_nll(b), multiple_b)
    m = ra.merge(rb, on="seed", suffixes=("_a", "_b"))
    return (m["value_a"] - m["value_b"]).to_numpy(), np.hypot(m["se_a"], m["se_b"]).to_numpy()


#: Resamples of the seed x document bootstrap.
BOOTSTRAP = 2000


def _doc_sums(rows: pd.DataFrame, multiple: float) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per seed: the whole-window row's per-document NLL sums and tokens at ``multiple`` x L;
    empty when any seed's row lacks them (rows written before they were stored)."""
    rows = _at(_window_nll(rows), multiple)
    out = {}
    for seed, g in rows.groupby("seed"):
        sums, tokens = _col(g, "doc_nll_sums").iloc[0], _col(g, "doc_tokens").iloc[0]
        if len(g) != 1 or not isinstance(sums, (list, np.ndarray)):
            return {}
        out[int(seed)] = (np.asarray(sums, dtype=float), np.asarray(tokens, dtype=float))
    return out


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
        da, db = _doc_sums(a, multiple_a), _doc_sums(b, multiple_b)
        common = set(da) & set(db)
        seeds = common if seeds is None else seeds & common
        sides.append((da, db, sign))
    seeds = sorted(seeds or ())
    if not seeds or any(len(da[s][0]) != len(db[s][0]) for da, db, _ in sides for s in seeds):
        return None
    rng = np.random.default_rng(0)
    n_seeds = len(seeds)
    pick = rng.integers(0, n_seeds, size=(BOOTSTRAP, n_seeds))  # [B, S]
    seed_of = pick[:, :, None]
    total = np.zeros((BOOTSTRAP, n_seeds))
    for da, db, sign in sides:
        sa, ca = (np.stack([da[s][i] for s in seeds]) for i in (0, 1))  # [S, D]
        sb, cb = (np.stack([db[s][i] for s in seeds]) for i in (0, 1))
        docs = rng.integers(0, sa.shape[1], size=(BOOTSTRAP, n_seeds, sa.shape[1]))  # [B, S, D]
        nll_a = sa[seed_of, docs].sum(-1) / ca[seed_of, docs].sum(-1)  # [B, S]
        nll_b = sb[seed_of, docs].sum(-1) / cb[seed_of, docs].sum(-1)
        total += sign * (nll_a - nll_b)
    lo, hi = np.quantile(total.mean(axis=1), [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(lo), float(hi)


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
    e = _summarise(name, diff, se)
    boot = seed_doc_bootstrap(a, b, multiple_a, multiple_b) if len(diff) else None
    return widened(e, boot, transform)


def widened(e: Estimate, boot: tuple[float, float] | None, transform=None) -> Estimate:
    """``e`` (a seed interval of NLL differences) widened to the bootstrap interval ``boot``
    where that is wider, then ``transform`` (e.g. exp) applied to value and ends."""
    if boot is not None and not math.isnan(e.value):
        lo, hi = boot if math.isnan(e.lo) else (min(e.lo, boot[0]), max(e.hi, boot[1]))
        e.lo, e.hi, e.ci = lo, hi, (SEED_DOC_CI if e.n_seeds > 1 else DOC_CI)
    if transform is not None:
        e.value, e.lo, e.hi = (
            transform(x) if not math.isnan(x) else x for x in (e.value, e.lo, e.hi)
        )
        e.log_scale = transform is math.exp
    return e


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
    measured = [(k, g) for k, g in by_series(_window_nll(rows))]
    labels = series_labels([k for k, _ in measured])
    out = []
    for key, g in measured:
        e = ppl_ratio(g, _named(name, key, labels), multiple)
        if not math.isnan(e.value):
            out.append((key, e))
    return out


def wilson(successes: float, trials: float, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (NaN, NaN when there are no trials)."""
    if trials <= 0:
        return math.nan, math.nan
    z = stats.norm.ppf(0.5 + level / 2)
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _passkey(rows: pd.DataFrame) -> pd.DataFrame:
    """Per-length ``passkey_acc`` rows: axis="template" (or no axis, as older rows have it)."""
    axis = _col(rows, "axis")
    return rows[(rows["metric"] == "passkey_acc") & ((axis == "template") | axis.isna())]


def _template(p: pd.DataFrame) -> pd.Series:
    """The template of per-length passkey rows (older rows have it only as the axis value)."""
    template = _col(p, "template").astype(object)
    return template.where(template.notna(), _col(p, "axis_value").astype(object))


def _passkey_series(rows: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Per-length passkey rows per series and template (two templates are two measurements)."""
    p = _passkey(_with_series(rows))
    if p.empty:
        return []
    template = _template(p)
    p = p.assign(_series=p["_series"] + "\x1f" + template.where(template.notna(), "").map(str))
    return by_series(p)


def _trials(rows: pd.DataFrame) -> pd.DataFrame:
    """Per seed: successes, trials (from value x n) and accuracy."""
    n = rows["n"].astype(float)
    k = (rows["value"].astype(float) * n).round()
    t = rows.assign(_k=k, _n=n).groupby("seed")[["_k", "_n"]].sum()
    return pd.DataFrame({"k": t["_k"], "n": t["_n"], "acc": t["_k"] / t["_n"]}).reset_index()


def accuracy_estimate(rows: pd.DataFrame, name: str) -> Estimate:
    """Passkey accuracy of one series at one length: the pooled rate with the Wilson interval of
    all trials; with several seeds the interval is widened to the t-interval of the per-seed
    accuracies where that is wider (seeds differ more than their trials say: README, Protocol).
    """
    t = _trials(rows)
    if t.empty or t["n"].sum() <= 0:
        return Estimate(name, math.nan)
    k, n = float(t["k"].sum()), float(t["n"].sum())
    lo, hi = wilson(k, n)
    if len(t) >= 2:
        acc = t["acc"].to_numpy(dtype=float)
        half = stats.t.ppf(0.5 + LEVEL / 2, len(acc) - 1) * acc.std(ddof=1) / math.sqrt(len(acc))
        lo, hi = min(lo, max(0.0, acc.mean() - half)), max(hi, min(1.0, acc.mean() + half))
    return Estimate(name, k / n, lo, hi, len(t), ACC_CI)


# --------------------------------------------------------------------------- the findings

PRESS = "Press et al. 2022, Train Short, Test Long (ALiBi), Fig. 1"


@register_finding(
    "F1",
    Scope(
        positions=("sinusoidal", "learned"),
        scalings=("none",),
        metrics=("nll",),
        finetunes=("none",),
    ),
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
    return FindingResult(
        "F1",
        f"absolute encodings (sinusoidal, learned) degrade past L: ppl ratio {FAR}L/L, CI > 1",
        _status(checks),
        PRESS
        + " (sinusoidal); Kazemnejad et al. 2023, The Impact of Positional Encoding on Length Generalization (learned absolute)",
        est,
        missing,
    )


@register_finding(
    "F2", Scope(positions=("alibi",), scalings=("none",), metrics=("nll",), finetunes=("none",))
)
def f2_alibi_flat(df: pd.DataFrame) -> FindingResult:
    est, checks, missing = [], [], []
    series = by_series(_window_nll(select(df, "alibi")))
    labels = series_labels([k for k, _ in series])
    for key, rows in series:
        ratios = [
            ppl_ratio(rows, _named(f"alibi ppl({k}L)/ppl(L)", key, labels), k) for k in (2, FAR)
        ]
        if math.isnan(ratios[0].value) and math.isnan(ratios[1].value):
            continue  # a series without rows beyond L
        for k, e in zip((2, FAR), ratios, strict=True):
            if math.isnan(e.value):  # "up to 4L" needs every length it names
                missing.append(_named(f"alibi at {k}L", key, labels))
                checks.append(None)
            else:
                est.append(e)
                # non-inferiority: holds only when the whole CI is within the tolerance
                checks.append(decide(e, ALIBI_MAX_RATIO, "at_most"))
    if not checks:
        missing.append(f"alibi at 2L and {FAR}L")
        checks.append(None)
    return FindingResult(
        "F2",
        f"ALiBi does not degrade up to {FAR}L: ppl ratio to L <= {ALIBI_MAX_RATIO} at 2L and "
        f"{FAR}L (CI upper end)",
        _status(checks),
        PRESS,
        est,
        missing,
    )


@register_finding(
    "F3",
    Scope(positions=("rope",), scalings=("ntk", "yarn"), metrics=("nll",), finetunes=("none",)),
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
            a_series = by_series(_window_nll(select(df, "rope", method)))
            b_series = by_series(_window_nll(select(df, "rope", other)))
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
    return FindingResult(
        "F3",
        f"raw RoPE degrades past ~2L; zero-shot NTK-aware and YaRN beat raw RoPE and PI at {FAR}L "
        "(NLL difference CI < 0)",
        _status(checks),
        PRESS + " (rotary); Peng et al. 2024, YaRN, long-sequence perplexity experiments; bloc97 "
        "2023, NTK-aware scaled RoPE (Reddit post)",
        est,
        missing,
    )


def _passkey_labels(keys: list[str]) -> dict[str, str]:
    return series_labels(keys, [*SERIES_COLUMNS, "template"])


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
    p = _passkey(_at(select(df, "rope"), 1))
    out = {}
    for (model, template, seed), rows in p.groupby(
        [p["model_id"], _template(p).map(str), p["seed"]], sort=True
    ):
        t = _trials(rows)
        k, n = float(t["k"].sum()), float(t["n"].sum())
        lo, hi = wilson(k, n)
        if hi < PARENT_MIN_ACC:
            name = f"left out: seed {seed}, its raw RoPE parent's acc at L"
            out[(str(model), template)] = Estimate(name, k / n, lo, hi, 1, SEED_ACC_CI)
    return out


def _without_parents(p: pd.DataFrame, left_out: dict | None, id_column: str) -> pd.DataFrame:
    """Passkey rows ``p`` minus those of models (``id_column``: the model or its parent) in
    ``left_out`` (:func:`parents_left_out`; None: none)."""
    if not left_out:
        return p
    keys = pd.Series(list(zip(_col(p, id_column).map(str), _template(p).map(str), strict=True)))
    return p[~keys.isin(list(left_out)).to_numpy()]


def recovery_curves(df: pd.DataFrame, left_out: dict | None = None) -> list[Curve]:
    """The recovery curves of the fine-tunes at FAR x L of the F4 methods: at each update count,
    whether every length L..FAR L has accuracy >= RETRIEVAL_MIN_ACC on its interval (None where
    a length is missing). Fine-tunes of a parent in ``left_out`` (:func:`parents_left_out`) are
    not read."""
    out = []
    for method in F4_METHODS:
        tuned = select(df, "rope", None, tuned=method)
        at_far = _col(tuned, "finetune_length") == tuned["train_length"] * FAR
        p = _without_parents(
            _passkey(tuned[at_far.fillna(False).astype(bool)]), left_out, "parent_model_id"
        )
        if p.empty:
            continue
        curve_id = _col(p, "finetune_curve_id")
        p = p.assign(
            template=_template(p),
            # every update count of one recipe: one curve
            model_config_id=curve_id.where(curve_id.notna(), _col(p, "model_config_id")),
        )
        columns = [c for c in SERIES_COLUMNS if c != "finetune_steps"]
        p = p.assign(
            _curve=columns_key(p, [*columns, "template"]), _pair=columns_key(p, PAIR_COLUMNS)
        )
        for key, rows in p.groupby("_curve", sort=True):
            points = {}
            for steps, at in rows.groupby("finetune_steps", sort=True):
                accs = [accuracy_estimate(_at(at, k), "") for k in (1, 2, FAR)]
                measured = not any(math.isnan(e.value) for e in accs)
                points[int(steps)] = (
                    _all([decide(e, RETRIEVAL_MIN_ACC, "at_least") for e in accs])
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
    at = other.points.get(k)
    if at is None:
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


@register_finding("F4", Scope(positions=("rope",), metrics=("passkey_acc",), finetunes=F4_METHODS))
def f4_finetune_retrieval(df: pd.DataFrame) -> FindingResult:
    """The papers' contrasts on recovery curves (retrieval over L..4L after k fine-tuning updates
    at 4L, k on the run's grid): PI recovers within the grid while direct fine-tuning (the raw
    rotary at 4L) has not at that count (Chen et al.); YaRN recovers with fewer updates than PI
    (Peng et al.); and raw RoPE retrieves <= 0.1 beyond L without fine-tuning."""
    checks: list[Check] = []
    missing: list[str] = []
    left_out = parents_left_out(df)
    curves = recovery_curves(df, left_out)
    est = _curve_estimates(curves)
    _check_curve_contrasts(curves, checks, missing)
    est.extend(_check_raw_rope_beyond(df, checks, missing, left_out))
    est.extend(left_out.values())
    return FindingResult(
        "F4",
        f"fine-tuning at {FAR}L (passkey over L..{FAR}L, acc >= {RETRIEVAL_MIN_ACC} on its "
        "interval, after k updates): PI recovers within the grid where direct fine-tuning has "
        "not; YaRN recovers with fewer updates than PI; raw RoPE <= "
        f"{NEAR_ZERO_ACC} beyond L (CI upper end); on the seeds whose raw RoPE model is not "
        f"decidedly below {PARENT_MIN_ACC} at L",
        _status(checks),
        "Chen et al. 2023, Position Interpolation, Sec. 3.2 passkey retrieval (PI vs direct "
        "fine-tuning); Peng et al. 2024, YaRN, Sec. 4 (fewer training steps than PI)",
        est,
        missing,
    )


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
        name = _named(
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


def _check_raw_rope_beyond(
    df: pd.DataFrame, checks: list[Check], missing: list[str], left_out: dict | None = None
) -> list[Estimate]:
    """Append to ``checks`` / ``missing`` whether raw RoPE stays <= NEAR_ZERO_ACC at 2L..FAR L
    without fine-tuning (models in ``left_out`` not read); return each series' best accuracy
    there."""
    est = []
    raw = _passkey_series(_without_parents(_passkey(select(df, "rope")), left_out, "model_id"))
    raw_labels = _passkey_labels([k for k, _ in raw])
    raw_checked = False
    for key, rows in raw:
        accs = {k: accuracy_estimate(_at(rows, k), "") for k in (2, FAR)}
        if all(math.isnan(e.value) for e in accs.values()):
            continue  # no rows beyond L in this series
        raw_checked = True
        absent = [k for k, e in accs.items() if math.isnan(e.value)]
        if absent:
            missing.append(_named(f"raw rope at {absent[0]}L", key, raw_labels))
            checks.append(None)
            continue
        best_k = max(accs, key=lambda k: (accs[k].value, accs[k].hi))
        best = accs[best_k]
        best.name = _named(f"raw rope max acc over 2L..{FAR}L (at {best_k}L)", key, raw_labels)
        est.append(best)
        checks.append(_all([decide(e, NEAR_ZERO_ACC, "at_most") for e in accs.values()]))
    if not raw_checked:
        missing.append("raw rope beyond L")
        checks.append(None)
    return est


@register_finding(
    "F5",
    Scope(positions=("rope",), scalings=("none",), metrics=("passkey_acc",), finetunes=("none",)),
)
def f5_rope_passkey_at_l(df: pd.DataFrame) -> FindingResult:
    est, checks = [], []
    series = _passkey_series(select(df, "rope"))
    labels = _passkey_labels([k for k, _ in series])
    for key, rows in series:
        t = _trials(_at(rows, 1))
        if t.empty:
            continue
        per_seed = []
        for _, r in t.iterrows():
            lo, hi = wilson(r["k"], r["n"])
            per_seed.append(Estimate("", float(r["acc"]), lo, hi, 1, SEED_ACC_CI))
        worst = min(per_seed, key=lambda e: (e.lo, e.value))
        worst.name = _named("rope acc at L, worst seed", key, labels)
        worst.n_seeds = len(per_seed)
        est.append(worst)
        checks.append(_all([decide(e, IN_DISTRIBUTION_MIN_ACC, "at_least") for e in per_seed]))
    return FindingResult(
        "F5",
        f"RoPE passkey accuracy at L >= {IN_DISTRIBUTION_MIN_ACC} on every seed run (the lower "
        "end of each seed's Wilson interval)",
        _status(checks or [None]),
        "Mohtashami & Jaggi 2023, Landmark Attention, passkey retrieval task",
        est,
        [] if checks else ["rope passkey at L"],
    )


def _shift(df: pd.DataFrame, position: str) -> pd.DataFrame:
    rows = select(df, position)
    rows = rows[(rows["metric"] == "shift_dnll") & (_col(rows, "axis") == "delta")]
    return rows.assign(delta=pd.to_numeric(rows["axis_value"], errors="coerce")).query("delta > 0")


def shift_invariant_checks(df: pd.DataFrame, positions: tuple[str, ...]):
    """(estimates, checks, missing): per series of each relative family, the largest |shift
    ΔNLL| over every delta > 0, checked against :data:`SHIFT_ZERO_TOL` (a tolerance on a value,
    not on an interval: relative encodings give 0 up to rounding)."""
    est, checks, missing = [], [], []
    for pos in positions:
        series = by_series(_shift(df, pos))
        if not series:
            missing.append(pos)
            checks.append(None)
        labels = series_labels([k for k, _ in series])
        for key, rows in series:
            worst = float(rows["value"].abs().max())
            name = _named(f"{pos} max |dNLL|", key, labels)
            est.append(Estimate(name, worst, n_seeds=rows["seed"].nunique()))
            checks.append(worst <= SHIFT_ZERO_TOL)
    return est, checks, missing


def shift_sensitive_checks(df: pd.DataFrame, positions: tuple[str, ...]):
    """(estimates, checks, missing): per series of each position-dependent family, shift ΔNLL at
    the largest delta, checked for CI > 0."""
    est, checks, missing = [], [], []
    for pos in positions:
        series = by_series(_shift(df, pos))
        if not series:
            missing.append(pos)
            checks.append(None)
        labels = series_labels([k for k, _ in series])
        for key, rows in series:
            top = rows[rows["delta"] == rows["delta"].max()]
            r = _per_seed(top, None)
            name = _named(f"{pos} dNLL at delta={int(top['delta'].iloc[0])}", key, labels)
            e = _summarise(name, r["value"], r["se"])
            est.append(e)
            checks.append(decide(e, 0.0, "above"))
    return est, checks, missing


@register_finding(
    "F6",
    Scope(
        positions=("rope", "alibi", "nope", "sinusoidal", "learned"),
        scalings=("none",),
        metrics=("shift_dnll",),
        finetunes=("none",),
    ),
)
def f6_shift_probe(df: pd.DataFrame) -> FindingResult:
    est, checks, missing = shift_invariant_checks(df, ("rope", "alibi", "nope"))
    for part, out in zip(
        shift_sensitive_checks(df, ("sinusoidal", "learned")), (est, checks, missing), strict=True
    ):
        out.extend(part)
    return FindingResult(
        "F6",
        f"shift probe: |dNLL| <= {SHIFT_ZERO_TOL} for RoPE, ALiBi, NoPE; CI > 0 at the largest "
        "delta for sinusoidal and learned",
        _status(checks),
        "Su et al. 2021, RoFormer (relative by construction); Vaswani et al. 2017, Sec. 3.5 (absolute)",
        est,
        missing,
    )


def findings() -> dict[str, Finding]:
    """Every registered finding (:data:`FINDINGS` after importing :data:`FINDING_MODULES`), this
    module's first, then each module's in :data:`FINDING_MODULES` order (whichever was imported
    first), then any other module's."""
    for name in FINDING_MODULES:
        importlib.import_module(name)
    modules = [__name__, *FINDING_MODULES]

    def rank(item: tuple[int, tuple[str, Finding]]) -> tuple[int, int]:
        index, (_, finding) = item
        module = finding.check.__module__
        return (modules.index(module) if module in modules else len(modules), index)

    return {key: f for _, (key, f) in sorted(enumerate(FINDINGS.items()), key=rank)}


def in_scope(df: pd.DataFrame) -> dict[str, bool]:
    """Per registered finding: whether ``df`` holds a series it is about (:class:`Scope`)."""
    return {key: not f.scope.subject(f.scope.rows(df)).empty for key, f in findings().items()}


def check_findings(df: pd.DataFrame) -> list[FindingResult]:
    """The registered findings that ``df`` holds a series of (:func:`in_scope`), each checked on
    the rows its scope reads; the others are not about these rows (:func:`out_of_scope`)."""
    df = _with_series(df)
    scoped = in_scope(df)
    return [f.check(f.scope.rows(df)) for key, f in findings().items() if scoped[key]]


def out_of_scope(df: pd.DataFrame) -> list[str]:
    """The keys of the registered findings that ``df`` holds no series of."""
    return [key for key, inside in in_scope(df).items() if not inside]


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
