"""The findings' registry: what a finding is (:class:`Finding`: id, claim, source, thresholds,
scope and check, declared once by :func:`register_finding`), what a check says
(:class:`FindingResult` and the status constants), which findings a results table is about
(:class:`Scope`, :func:`check_findings`, :func:`out_of_scope`), and the registry as Markdown
(:func:`findings_markdown`, the page ``reports/FINDINGS.md``).

The findings themselves live one module per study in this package; :func:`findings` imports
every module of the package (a scan of the folder, no list), and each study module's ``ORDER``
places its findings in a report.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pandas as pd

from bench.core.series import SWITCH_COLUMNS
from bench.core.stats import UNDECIDED, Check, Estimate
from bench.findings.rows import col, with_series
from models.discovery import import_package

HOLDS, FAILS, NOT_MEASURED = "holds", "does not hold", "not measured"
NOT_DECIDED = "not decided"


@dataclass
class FindingResult:
    """What checking one finding on a results table gave. A check function leaves ``key``,
    ``claim`` and ``source`` empty: its registration (:class:`Finding`) fills them in, unless the
    check set a claim of its own (one that names what the rows hold, as R2's score)."""

    key: str = ""
    claim: str = ""
    status: str = NOT_MEASURED
    source: str = ""
    estimates: list[Estimate] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # observations beside the claim

    @property
    def numbers(self) -> str:
        parts = [e.text() for e in self.estimates] + list(self.notes)
        if self.missing:
            parts.append("not measured: " + ", ".join(self.missing))
        return "; ".join(parts)


def status(checks: list[Check]) -> str:
    """Any check false -> does not hold; else any unmeasured (None) -> not measured; else any
    undecided -> not decided; else holds."""
    if any(c is False for c in checks):
        return FAILS
    if not checks or any(c is None for c in checks):
        return NOT_MEASURED
    if any(c == UNDECIDED for c in checks):
        return NOT_DECIDED
    return HOLDS


def all_of(checks: list[Check]) -> Check:
    """One check from several that must all hold (same precedence as :func:`status`)."""
    return {HOLDS: True, FAILS: False, NOT_DECIDED: UNDECIDED}.get(status(checks))


# --------------------------------------------------------------------------- scope

#: the value a row without the column has (an older table, or a setting left at its default)
SCOPE_DEFAULTS = {
    "position_sampling": "contiguous",
    "attention_sink": "none",
    "finetune_method": "none",
}
CONTIGUOUS = ("contiguous",)
NO_SINK = ("none",)
#: a row's model source: "pretrained" where its recipe column says so (bench.pretrained.source
#: writes "pretrained:<model id>"), else "trained" (a model lenbench trained, or an older row)
PRETRAINED_RECIPE = "pretrained:"
TRAINED, PRETRAINED = ("trained",), ("pretrained",)


def model_source(df: pd.DataFrame) -> pd.Series:
    """Per row: "pretrained" (a pretrained model's row, by its recipe) or "trained"."""
    recipe = col(df, "recipe").astype(object)
    pretrained = recipe.map(lambda r: isinstance(r, str) and r.startswith(PRETRAINED_RECIPE))
    return pretrained.map({True: "pretrained", False: "trained"})


@dataclass(frozen=True)
class Scope:
    """What a finding is about, declared once with it: the series it checks (``positions``,
    ``scalings``, ``metrics``, ``finetunes``, ``samplings``, ``sinks``, ``switches``, ``arms``;
    None = any) and the rows it reads (those, plus the comparison series it needs: ``also_samplings``,
    ``also_sinks``, ``also_switches``). A report checks a finding only where one of its series is
    present, and the finding reads only its rows: F1 is not computed on a PoSE-trained sinusoidal
    model, nor L3's sinks counted against F3. ``sources`` (:func:`model_source`: models lenbench
    trained, or pretrained ones) and ``experiments`` (the ``experiment`` column; None = any)
    restrict both: the toy-model findings read no pretrained model's rows (T1's RoPE is not
    SmolLM2's), and the SmolLM2 study's findings read only that study's rows."""

    positions: tuple[str, ...] | None = None
    scalings: tuple[str, ...] | None = None
    metrics: tuple[str, ...] | None = None
    finetunes: tuple[str, ...] | None = None  # "none": the zero-shot models
    samplings: tuple[str, ...] = CONTIGUOUS
    sinks: tuple[str, ...] = NO_SINK
    switches: tuple[str, ...] = ()  # model switches whose models it reads (bench.core.series)
    arms: tuple[str, ...] | None = None
    also_samplings: tuple[str, ...] = ()
    also_sinks: tuple[str, ...] = ()
    also_switches: tuple[str, ...] = ()  # switched models it reads beside the others (not only)
    sources: tuple[str, ...] = TRAINED  # "trained" (lenbench's models) and/or "pretrained"
    experiments: tuple[str, ...] | None = None  # the experiment column's values (None = any)

    @staticmethod
    def _values(df: pd.DataFrame, column: str) -> pd.Series:
        return (
            col(df, column)
            .astype(object)
            .where(col(df, column).notna(), SCOPE_DEFAULTS.get(column))
        )

    def _keep(self, df: pd.DataFrame, column: str, allowed) -> pd.Series:
        if allowed is None:
            return pd.Series(True, index=df.index)
        return self._values(df, column).isin(list(allowed))

    def _without_other_switches(self, df: pd.DataFrame) -> pd.Series:
        """Rows of models with no model switch on other than ``switches`` and ``also_switches``
        (``qk_norm``, ...)."""
        keep = pd.Series(True, index=df.index)
        allowed = (*self.switches, *self.also_switches)
        for column in SWITCH_COLUMNS:
            if column not in allowed and column in df.columns:
                keep &= df[column].isna()
        return keep

    def rows(self, df: pd.DataFrame) -> pd.DataFrame:
        """The rows the finding reads."""
        keep = self._keep(df, "position_sampling", (*self.samplings, *self.also_samplings))
        keep &= self._keep(df, "attention_sink", (*self.sinks, *self.also_sinks))
        keep &= self._without_other_switches(df)
        keep &= self._keep(df, "arm", self.arms) if "arm" in df.columns else True
        keep &= self._origin(df)
        return df[keep]

    def _origin(self, df: pd.DataFrame) -> pd.Series:
        """Rows of the model sources and experiments the finding is about."""
        keep = model_source(df).isin(list(self.sources))
        return keep & self._keep(df, "experiment", self.experiments)

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
        keep &= self._without_other_switches(df)
        if self.switches:  # a finding about a model switch is about the models with it on
            on = pd.Series(False, index=df.index)
            for column in self.switches:
                on |= col(df, column).notna()
            keep &= on
        if self.arms is not None and "arm" in df.columns:
            keep &= self._keep(df, "arm", self.arms)
        return df[keep & self._origin(df)]

    def _other_switches(self) -> tuple[str, ...]:
        return (
            (f"none or any of {', '.join(self.also_switches)}",)
            if self.also_switches
            else ("none",)
        )

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
                ("model switches", self.switches or self._other_switches()),
                # the default (lenbench's trained models, any experiment) goes unsaid
                ("models", None if self.sources == TRAINED else self.sources),
                ("experiments", self.experiments),
            )
            if values is not None
        ]
        return "; ".join(parts)


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Finding:
    """One registered finding, declared once: its key, claim, source, thresholds (name ->
    value, fixed before the run), :class:`Scope` and check function ``fn(df) ->
    FindingResult``. Calling it (or :meth:`check`) checks ``df`` and fills in key, claim and
    source."""

    key: str
    claim: str
    source: str
    scope: Scope
    fn: Callable[[pd.DataFrame], FindingResult]
    thresholds: Mapping[str, float] = field(default_factory=dict)

    def check(self, df: pd.DataFrame) -> FindingResult:
        result = self.fn(df)
        result.key = self.key
        result.claim = result.claim or self.claim
        result.source = self.source
        return result

    __call__ = check

    @property
    def module(self) -> str:
        return self.fn.__module__


FINDINGS: dict[str, Finding] = {}
"""Registered findings by key, in registration order (complete once :func:`findings` has run)."""


def register_finding(
    key: str,
    scope: Scope,
    claim: str = "",
    source: str = "",
    thresholds: Mapping[str, float] | None = None,
) -> Callable[[Callable[[pd.DataFrame], FindingResult]], Finding]:
    """Decorator: register ``fn(df) -> FindingResult`` as the finding ``key`` with its
    :class:`Scope`, claim, source and thresholds (refused if the key is taken); the decorated
    name becomes the :class:`Finding` (called like the function, it returns the full result)."""

    def register(fn: Callable[[pd.DataFrame], FindingResult]) -> Finding:
        if key in FINDINGS:
            raise ValueError(f"finding {key!r} is already registered.")
        if not isinstance(scope, Scope):
            raise TypeError(f"finding {key!r}: scope must be a Scope, got {scope!r}.")
        finding = Finding(key, claim, source, scope, fn, dict(thresholds or {}))
        FINDINGS[key] = finding
        return finding

    return register


def study_modules() -> list[str]:
    """The modules of this package that may register findings (every one whose name does not
    start with an underscore), imported, in their ``ORDER`` (then by name)."""
    modules = import_package("bench.findings")  # the one discovery rule (models.discovery)
    modules.sort(key=lambda m: (getattr(m, "ORDER", float("inf")), m.__name__))
    return [m.__name__ for m in modules]


def findings() -> dict[str, Finding]:
    """Every registered finding (:data:`FINDINGS` once every module of this package is
    imported): by study module (``ORDER``), then in registration order; findings registered
    elsewhere last."""
    modules = study_modules()

    def rank(item: tuple[int, tuple[str, Finding]]) -> tuple[int, int]:
        index, (_, finding) = item
        module = finding.module
        return (modules.index(module) if module in modules else len(modules), index)

    return {key: f for _, (key, f) in sorted(enumerate(FINDINGS.items()), key=rank)}


def in_scope(df: pd.DataFrame) -> dict[str, bool]:
    """Per registered finding: whether ``df`` holds a series it is about (:class:`Scope`)."""
    return {key: not f.scope.subject(f.scope.rows(df)).empty for key, f in findings().items()}


def check_findings(df: pd.DataFrame) -> list[FindingResult]:
    """The registered findings that ``df`` holds a series of (:func:`in_scope`), each checked on
    the rows its scope reads; the others are not about these rows (:func:`out_of_scope`)."""
    df = with_series(df)
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


# --------------------------------------------------------------------------- the page

#: Where :func:`findings_markdown` is committed (``python -m bench.findings`` writes it).
FINDINGS_PAGE = "reports/FINDINGS.md"


def _threshold(value: float) -> str:
    return f"{value:g}"


def findings_markdown() -> str:
    """The registry as Markdown: per finding its key, claim, thresholds, scope, source and the
    study module that declares it (the page :data:`FINDINGS_PAGE`)."""
    lines = [
        "# Findings",
        "",
        "Generated from the findings' registry (`bench/findings/`) by `python -m bench.findings`;",
        "do not edit by hand (tests/bench/findings/test_findings_page.py checks it is current). What each",
        "status means and how a report checks a finding: README.md, section Findings.",
        "",
    ]
    for key, f in findings().items():
        path = f.module.replace(".", "/") + ".py"
        lines += [f"## {key}", "", f"**Claim.** {f.claim}", ""]
        if f.thresholds:
            values = ", ".join(f"`{n}` = {_threshold(v)}" for n, v in f.thresholds.items())
            lines += [f"**Thresholds** (fixed before the run): {values}.", ""]
        doc = inspect.getdoc(f.fn)
        if doc:
            lines += [f"**How it is checked.** {' '.join(doc.split())}", ""]
        lines += [
            f"**Scope.** {f.scope.describe() or 'any series'}.",
            "",
            f"**Source.** {f.source}.",
            "",
            f"Declared in `{path}`.",
            "",
        ]
    return "\n".join(lines)
