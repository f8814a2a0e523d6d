"""The typed eval config: its top-level keys plus one section per registered metric.

``EvalConfig`` is a dataclass built from the registry (:func:`eval_config_class`), so registering
a metric adds its section; it works as a Hydra/OmegaConf structured config, checks every value in
``__post_init__`` (one-sentence ValueError), and :meth:`EvalConfigBase.from_mapping` builds it
from plain data, rejecting unknown keys. ``resolve(train_length)`` gives the
:class:`ResolvedEval` a job runs, with every length in tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass, make_dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from bench.core.checks import integer, number, resolve_grid
from bench.core.shards import Shard, parse_shard
from bench.eval.metrics.registry import (
    DEFAULT_LENGTHS,
    METRICS,
    EvalKeys,
    MetricConfig,
    top_level_keys,
)

__all__ = [
    "EvalConfigBase",
    "HarnessConfig",
    "ResolvedEval",
    "as_eval_config",
    "eval_config_class",
    "top_level_keys",
]


@dataclass
class HarnessConfig:
    """``eval.harness``: lm-evaluation-harness tasks the job runs after the native metrics, in
    the same job; their rows get metric ``harness/<task>/<metric>``."""

    # task names (bench/harness tasks), e.g. [lenbench_passkey_1024, lenbench_ppl_1024]
    tasks: list[str] = field(default_factory=list)
    limit: Any = None  # documents per task (a number > 0); null = all

    def __post_init__(self) -> None:
        tasks = self.tasks
        if not isinstance(tasks, (list, tuple)) or not all(isinstance(t, str) for t in tasks):
            raise ValueError(f"eval.harness.tasks must be a list of task names, got {tasks!r}.")
        self.tasks = list(tasks)
        if self.limit is not None:
            number("eval.harness.limit", self.limit, 0.0, interval="(]")


@dataclass
class EvalConfigBase(EvalKeys):
    """The top-level eval keys; :func:`eval_config_class` adds one field per metric and harness."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for f in fields(self):  # sections: the metrics' and harness (real types, not strings)
            if not (isinstance(f.type, type) and is_dataclass(f.type)):
                continue
            value = getattr(self, f.name)
            if isinstance(value, Mapping):
                value = _section(f.type, value, f"eval.{f.name}")
                setattr(self, f.name, value)
            if not isinstance(value, f.type):
                raise ValueError(f"eval.{f.name} must be a mapping of keys, got {value!r}.")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> EvalConfigBase:
        """The config from plain data; missing keys take their defaults, unknown keys are errors."""
        known = {f.name: f for f in fields(cls)}
        unknown = [k for k in values if k not in known]
        if unknown:
            raise ValueError(
                f"eval.{unknown[0]} is an unknown key; allowed keys: {', '.join(known)}."
            )
        return cls(**values)

    def section(self, name: str) -> MetricConfig:
        """Metric ``name``'s section; its defaults if this config predates the metric."""
        value = getattr(self, name, None)
        return METRICS[name].config() if value is None else value

    def resolve(self, train_length: int) -> ResolvedEval:
        """Every length in tokens for this training length (see :class:`ResolvedEval`)."""
        train_length = integer("train_length", train_length, 2)
        given = DEFAULT_LENGTHS if self.lengths is None else self.lengths
        lengths = resolve_grid(given, train_length, "eval.lengths")
        if not lengths or lengths[0] < 2:
            raise ValueError(
                f"eval.lengths must hold at least one length of >= 2 tokens, got {self.lengths!r}."
            )
        shard = parse_shard(self.shard)
        return ResolvedEval(
            train_length=train_length,
            lengths=lengths,
            precision=self.precision,
            batch_size=self.batch_size,
            max_batch_tokens=self.max_batch_tokens,
            metrics={name: self.section(name).resolve(train_length, lengths) for name in METRICS},
            harness=getattr(self, "harness", None) or HarnessConfig(),
            shard=shard,
        )


def _section(cls: type, values: Mapping[str, Any], where: str) -> Any:
    known = [f.name for f in fields(cls)]
    unknown = [k for k in values if k not in known]
    if unknown:
        raise ValueError(
            f"{where}.{unknown[0]} is an unknown key; allowed keys: {', '.join(known)}."
        )
    return cls(**values)


@dataclass(frozen=True)
class ResolvedEval:
    """An eval config for one training length: what :func:`bench.eval.evaluate.evaluate_model` runs.

    ``lengths`` are the sorted eval lengths in tokens; ``metrics`` holds each registered metric's
    resolved section in run order (its ``lengths`` = the eval lengths it runs at, grids in tokens,
    None for "auto"). ``shard``: the share of the job's units this process measures
    (``bench.core.shards``), not part of the job's identity.
    """

    train_length: int
    lengths: list[int]
    precision: str
    batch_size: int
    max_batch_tokens: int | None
    metrics: dict[str, MetricConfig]
    harness: HarnessConfig
    shard: Shard | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the job's identity: the top-level keys, one mapping per metric, harness."""
        return {
            "lengths": list(self.lengths),
            "precision": self.precision,
            "batch_size": self.batch_size,
            "max_batch_tokens": self.max_batch_tokens,
            **{name: asdict(section) for name, section in self.metrics.items()},
            "harness": asdict(self.harness),
        }


_built: tuple[tuple, type] | None = None


def eval_config_class() -> type[EvalConfigBase]:
    """``EvalConfig``: the top-level keys, one field per registered metric (typed with its config
    dataclass, in registry order) and ``harness``. Rebuilt when the registry changes."""
    global _built
    key = tuple((name, metric.config) for name, metric in METRICS.items())
    if _built is None or _built[0] != key:
        cls = make_dataclass(
            "EvalConfig",
            [
                (name, metric.config, field(default_factory=metric.config))
                for name, metric in METRICS.items()
            ]
            + [("harness", HarnessConfig, field(default_factory=HarnessConfig))],
            bases=(EvalConfigBase,),
        )
        cls.__module__ = __name__
        cls.__doc__ = "The eval config: top-level keys, one section per registered metric, harness."
        _built = (key, cls)
    return _built[1]


def as_eval_config(value: EvalConfigBase | Mapping[str, Any] | None) -> EvalConfigBase:
    """An EvalConfig from an EvalConfig, a (possibly OmegaConf) mapping, or None (defaults)."""
    if isinstance(value, EvalConfigBase):
        return value
    cls = eval_config_class()
    if value is None:
        return cls()
    if isinstance(value, DictConfig):
        value = OmegaConf.to_object(value)  # a structured config gives its dataclass
        if isinstance(value, EvalConfigBase):
            return value
    if not isinstance(value, Mapping):
        raise ValueError(f"the eval config must be a mapping of keys, got {value!r}.")
    return cls.from_mapping(value)
