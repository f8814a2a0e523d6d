"""The metric registry: a metric is one registered function plus the dataclass of its YAML section.

Shaped like ``models.scaling``: ``@register_metric("name", config=NameConfig)`` adds
``fn(ctx, cfg, docs, length) -> rows`` to :data:`METRICS`, and ``NameConfig`` (a
:class:`MetricConfig`) declares the keys of the ``eval.name`` section with their defaults and
checks, so the eval config gains the section without further edits. Metrics run at each eval
length in registration order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from typing import Any, ClassVar

from bench.core.checks import boolean, check_grid, choice, integer, number, resolve_grid
from bench.core.runtime import PRECISIONS
from bench.core.shards import parse_shard
from bench.data.corpora import Document
from bench.eval.metrics.context import EvalContext

__all__ = [
    "DEFAULT_LENGTHS",
    "METRICS",
    "BootstrapConfig",
    "EvalKeys",
    "Metric",
    "MetricConfig",
    "MetricFn",
    "Split",
    "grid_field",
    "register_metric",
    "split_rows",
    "top_level_keys",
]

logger = logging.getLogger(__name__)

_GRID = {"grid": True}
DEFAULT_LENGTHS = ("1x", "2x", "4x", "8x", "16x")


@dataclass
class EvalKeys:
    """The eval config's top-level keys, which are not metric sections: no metric may take their
    names (nor ``harness``). :class:`bench.eval.metrics.config.EvalConfigBase` adds the sections.

    These defaults are the standard protocol (``conf/eval/standard.yaml`` holds only changes to
    them; ``lenbench --cfg job`` prints the composed values). Lengths and grids take token counts
    (256) or multiples of the training length ("4x", "0.25x").
    """

    # eval lengths (window sizes); a static scaling factor "auto" is set for the longest; null = these
    lengths: Any = field(default_factory=lambda: list(DEFAULT_LENGTHS))
    # fp32 | bf16 (autocast; angles and softmax statistics stay fp32)
    precision: str = "fp32"
    batch_size: int = 8  # windows per forward pass ...
    # ... capped at this many tokens per pass (null = no cap); a window longer than the cap still
    # runs, one per pass (a window is never split; chunked scoring bounds its memory)
    max_batch_tokens: int | None = 32768
    # "i/N": measure only shard i of N of the job's (length, documents) units, then merge with
    # the same command without it; "plan/N": print the N shards' units (bench.core.shards)
    shard: str | None = None

    def __post_init__(self) -> None:
        if self.lengths == "auto":
            raise ValueError("eval.lengths must be a length or a list of lengths, got 'auto'.")
        check_grid(self.lengths, "eval.lengths")
        self.precision = choice("eval.precision", self.precision, PRECISIONS)
        self.batch_size = integer("eval.batch_size", self.batch_size, 1)
        self.max_batch_tokens = integer(
            "eval.max_batch_tokens", self.max_batch_tokens, 1, optional=True
        )
        parse_shard(self.shard)


def top_level_keys() -> tuple[str, ...]:
    """The eval keys that are not metric sections (no metric may take these names)."""
    return (*(f.name for f in fields(EvalKeys)), "harness")


def grid_field(default: Any) -> Any:
    """A section field holding 'auto'/null or lengths (tokens or "<m>x"), resolved to tokens."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=_GRID)
    return field(default=default, metadata=_GRID)


#: warnings already given in this process (a sweep resolves every section once per job)
_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        logger.warning(message)


@dataclass
class MetricConfig:
    """The keys every metric section has; a metric's config dataclass adds its own after them.

    A section's defaults are the standard protocol (``conf/eval/*.yaml`` hold only changes).
    Subclasses check their fields in ``__post_init__`` (calling this one first) with the helpers
    of ``bench.core.checks``, naming keys with :meth:`key`.
    """

    enabled: bool = True  # run this metric at all
    lengths: Any = None  # the eval lengths it runs at (tokens or "<m>x"); null = every eval length

    section: ClassVar[str] = ""  # the YAML section name, set by register_metric

    @property
    def reads_documents(self) -> bool:
        """Whether the metric reads test documents (they must be long enough for its lengths)."""
        return True

    def __post_init__(self) -> None:
        self.enabled = boolean(self.key("enabled"), self.enabled)
        check_grid(self.lengths, self.key("lengths"))

    @classmethod
    def key(cls, name: str) -> str:
        """The full config key of field ``name``, e.g. ``eval.nll.max_docs``."""
        return f"eval.{cls.section or cls.__name__}.{name}"

    def resolve(self, train_length: int, eval_lengths: Sequence[int]) -> MetricConfig:
        """A copy for one job: ``lengths`` = the eval lengths it runs at, grid fields in tokens."""
        wanted = resolve_grid(self.lengths, train_length, self.key("lengths"))
        lengths = list(eval_lengths) if wanted is None else [x for x in eval_lengths if x in wanted]
        dropped = sorted(set(wanted or ()) - set(lengths))
        # a section's default lengths mean "where evaluated"; a list someone set, what they want
        chosen = self.lengths != self._default_lengths()
        if self.enabled and dropped and (not lengths or chosen):
            _warn_once(
                f"eval metric {self.section} is enabled but "
                + (f"none of its lengths {sorted(set(wanted))} is" if not lengths
                   else f"its lengths {dropped} are not")
                + f" an eval length {list(eval_lengths)}; it will not run"
                + (" there." if lengths else ".")
            )  # fmt: skip
        grids = {
            f.name: resolve_grid(getattr(self, f.name), train_length, self.key(f.name))
            for f in fields(self)
            if f.metadata.get("grid")
        }
        out = replace(self, lengths=lengths, **grids)
        if out.enabled and out.lengths:
            out.check_resolved()
        return out

    @classmethod
    def _default_lengths(cls) -> Any:
        f = next(f for f in fields(cls) if f.name == "lengths")
        return f.default_factory() if f.default_factory is not MISSING else f.default

    def check_resolved(self) -> None:
        """Raise ValueError (one sentence) where the resolved section (grids in tokens) would
        measure nothing at one of its lengths although it runs there; none by default."""


@dataclass
class BootstrapConfig(MetricConfig):
    """A metric over a sample of test documents with a bootstrap CI over documents."""

    # test documents taken from the run's set (long enough for its longest length), spread evenly
    max_docs: int = 16
    bootstrap: int = 1000  # bootstrap resamples over documents for ci_lo/ci_hi (0 = no CI)
    ci: float = 0.95  # CI level

    def __post_init__(self) -> None:
        super().__post_init__()
        self.max_docs = integer(self.key("max_docs"), self.max_docs, 1)
        self.bootstrap = integer(self.key("bootstrap"), self.bootstrap, 0)
        self.ci = number(self.key("ci"), self.ci, 0.0, 1.0, interval="()")


MetricFn = Callable[[EvalContext, Any, Sequence[Document], int], list[dict]]
"""``fn(ctx, cfg, docs, length) -> rows``: cfg is the metric's resolved section."""


@dataclass(frozen=True)
class Split:
    """How a metric's work at one eval length divides into parts that separate processes can
    measure (``eval.shard``, ``bench.core.shards``): its items (windows, trials, tasks) in run
    order, ``per_part`` of them per part (None: one forward batch, ``ctx.rows_per_batch``).

    ``items(ctx, cfg, docs, length)``: how many items there are; ``measure(ctx, cfg, docs,
    length, items)``: a payload (name -> numpy array; None = nothing measured) of the items in
    the range ``items``; ``combine(cfg, length, payloads)``: the metric's rows at the length
    from every part's payload, in order. The metric's own function must return exactly
    :func:`split_rows` (it may call it), so that merged shards equal an unsharded run.
    ``weight``: windows of about the eval length per item, for the cost estimate.
    """

    items: Callable[[EvalContext, Any, Sequence[Document], int], int]
    measure: Callable[[EvalContext, Any, Sequence[Document], int, range], dict | None]
    combine: Callable[[Any, int, list[dict | None]], list[dict]]
    per_part: int | None = None
    weight: Callable[[Any], int] = lambda cfg: 1

    def parts(
        self, ctx: EvalContext, cfg: Any, docs: Sequence[Document], length: int
    ) -> list[range]:
        """The item ranges of the parts at ``length``; one empty part where there are no items
        (its combine still gives the rows of "nothing measured")."""
        n = int(self.items(ctx, cfg, docs, length))
        step = self.per_part or ctx.rows_per_batch(length)
        return [range(b, min(b + step, n)) for b in range(0, n, step)] or [range(0)]


def split_rows(
    split: Split, ctx: EvalContext, cfg: Any, docs: Sequence[Document], length: int, desc: str
) -> list[dict]:
    """A split metric's rows at one length: every part measured here, then combined."""
    parts = split.parts(ctx, cfg, docs, length)
    payloads = []
    with ctx.bar(sum(len(p) for p in parts), desc, unit="item") as bar:
        for part in parts:
            payloads.append(split.measure(ctx, cfg, docs, length, part))
            bar.update(len(part))
    return split.combine(cfg, length, payloads)


@dataclass(frozen=True)
class Metric:
    name: str
    fn: MetricFn
    config: type[MetricConfig]
    # rows computed once per run from this metric's rows at every length (e.g. passkey_context)
    finish: Callable[[Any, list[dict]], list[dict]] | None = None
    # ``prepare(ctx, cfg, docs, length)``: called at each eval length before any metric runs there,
    # to announce what it will read from forward passes that other metrics make anyway
    # (``EvalContext.want_hidden``); results must not depend on whether it was called
    prepare: Callable[[EvalContext, Any, Sequence[Document], int], None] | None = None
    # how its work at one length divides into parts for eval.shard (None: one unit per length)
    split: Split | None = None


METRICS: dict[str, Metric] = {}
"""Registered metrics by section name, in the order they run at each eval length."""


def register_metric(
    name: str,
    *,
    config: type[MetricConfig],
    finish: Callable[[Any, list[dict]], list[dict]] | None = None,
    prepare: Callable[[EvalContext, Any, Sequence[Document], int], None] | None = None,
    split: Split | None = None,
) -> Callable[[MetricFn], MetricFn]:
    """Register ``fn(ctx, cfg, docs, length) -> rows`` as metric ``name`` with section ``config``.

    ``finish(cfg, rows)``, if given, receives the metric's rows from every length after the last
    one and returns extra rows. ``prepare(ctx, cfg, docs, length)``, if given, runs at each of the
    metric's eval lengths before the first metric there (see :class:`Metric`). ``split``: how
    its work at one length divides for ``eval.shard`` (:class:`Split`).
    """

    def decorator(fn: MetricFn) -> MetricFn:
        if name in METRICS:
            raise ValueError(f"metric {name!r} is already registered.")
        if not name.isidentifier() or name in top_level_keys():
            raise ValueError(
                f"metric name {name!r} is invalid; allowed: a Python identifier other than "
                f"{', '.join(top_level_keys())}."
            )
        if not (is_dataclass(config) and issubclass(config, MetricConfig)):
            raise ValueError(
                f"metric {name!r}: config must be a dataclass subclassing MetricConfig, got {config!r}."
            )
        if config.section and config.section != name:
            raise ValueError(
                f"metric {name!r}: config {config.__name__} already belongs to metric {config.section!r}."
            )
        config.section = name
        METRICS[name] = Metric(name, fn, config, finish, prepare, split)
        return fn

    return decorator
