"""Typed configuration: one dataclass per config group, registered in Hydra's ConfigStore.

Hydra checks types while it composes; ranges and rules spanning sections are checked in
``__post_init__`` (a one-sentence ValueError naming key, value and what is allowed). A job parses
its composed config once (:meth:`JobConfig.from_hydra`) and hands the typed sections down. Field
metadata declares what enters the checkpoint key (``weights``), which data kinds a field belongs
to (``kinds``) and which position families use it (``families``).
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

from bench.corpora import CORPUS_KINDS, DEFAULT_SPLIT_FRACTIONS, SPLITS, _normalize_fractions
from bench.metrics import EvalConfig, as_eval_config
from bench.metrics.checks import boolean, choice, integer, number
from bench.metrics.lengths import parse_length
from bench.passkey import PASSKEY_TEMPLATES, min_passkey_length
from bench.pretrained.source import PretrainedConfig
from bench.recipe import WEIGHT_DECAY_SCOPES, ExtendConfig, TrainConfig
from bench.schema_fields import (
    FAMILIES,
    KINDS,
    WEIGHTS,
    _default,
    _only,
    weight_fields,
    weights_dict,
)
from models.positions import PositionConfig
from models.scaling import SCALING_METHODS
from models.scaling_config import ScalingConfig
from models.transformer import ModelConfig

__all__ = [
    "SCHEMA_NAME",
    "ArmConfig",
    "WEIGHT_DECAY_SCOPES",
    "DataConfig",
    "ExtendConfig",
    "JobConfig",
    "ModelSchema",
    "PathsConfig",
    "PositionSchema",
    "ScalingSchema",
    "TrainConfig",
    "config_error",
    "weight_fields",
    "weights_dict",
]

SCHEMA_NAME = "lenbench_schema"  # the first entry of conf/config.yaml's defaults list

# --------------------------------------------------------------------------- groups


@dataclass
class ModelSchema(ModelConfig):
    """The ``model`` group: :class:`models.transformer.ModelConfig` with its checks."""

    def __post_init__(self) -> None:
        for key in ("vocab_size", "n_layers", "d_model", "n_heads"):
            setattr(self, key, integer(f"model.{key}", getattr(self, key), 1))
        self.n_kv_heads = integer("model.n_kv_heads", self.n_kv_heads, 1, optional=True)
        self.d_ff = integer("model.d_ff", self.d_ff, 1, optional=True)
        self.dropout = number("model.dropout", self.dropout, 0.0, 1.0, interval="[)")
        self.tie_embeddings = boolean("model.tie_embeddings", self.tie_embeddings)
        try:
            self.validate()  # divisibility, mlp and norm; its messages start with the field name
        except ValueError as exc:
            raise ValueError(f"model.{exc}") from None


@dataclass
class PositionSchema(PositionConfig):
    """The ``position`` group: :class:`models.positions.PositionConfig`, with field metadata.

    Its checks need the model's head size, so :class:`JobConfig` runs them (``validate``).
    """

    base: float = field(default=PositionConfig.base, metadata={FAMILIES: ("rope", "sinusoidal")})
    layout: str = field(default=PositionConfig.layout, metadata={FAMILIES: ("rope",)})
    rotary_fraction: float = field(
        default=PositionConfig.rotary_fraction, metadata={FAMILIES: ("rope",)}
    )
    max_positions: int = field(
        default=PositionConfig.max_positions, metadata={FAMILIES: ("learned",)}
    )
    # only read past the table's end, so it never changes the weights
    out_of_range: str = field(
        default=PositionConfig.out_of_range, metadata={FAMILIES: ("learned",), WEIGHTS: False}
    )

    def params(self) -> dict[str, Any]:
        """The parameters the family uses (the ``position_params`` column; kind is its own)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if self.kind in f.metadata.get(FAMILIES, ())
        }


@dataclass
class ScalingSchema(ScalingConfig):
    """The ``scaling`` group: :class:`models.scaling_config.ScalingConfig` with its checks.

    ``target_length`` may be tokens or ``"<m>x"``; :class:`JobConfig` turns it into tokens.
    """

    params: dict[str, Any] = field(default_factory=dict)
    # the length a static factor "auto" is set for; null = the run's longest eval length
    target_length: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"scaling.name must be a non-empty label, got {self.name!r}.")
        choice("scaling.method", self.method, tuple(SCALING_METHODS))
        if not isinstance(self.params, Mapping):
            raise ValueError(
                f"scaling.params must be a mapping of parameters, got {self.params!r}."
            )
        self.params = dict(self.params)
        self.logn = boolean("scaling.logn", self.logn)
        self.oracle = boolean("scaling.oracle", self.oracle)
        if self.target_length is not None:
            parse_length(self.target_length, 1, "scaling.target_length")
            if self.oracle:
                raise ValueError(
                    "scaling.oracle=true sets the factor for each eval length and "
                    f"scaling.target_length={self.target_length} sets one for the run; set one "
                    "of them (the other false or null)."
                )


@dataclass
class DataConfig:
    """The ``data`` group: where text comes from (``name``: pycorpus, text or hf).

    Caps (``max_files``/``max_bytes``) are deterministic; a field marked with kinds belongs to
    those kinds only and must keep its default under another.
    """

    name: str = "pycorpus"
    split_fractions: dict[str, float] = field(
        default_factory=lambda: dict(DEFAULT_SPLIT_FRACTIONS),
        metadata={WEIGHTS: lambda data: list(_normalize_fractions(data.split_fractions))},
    )
    max_files: int | None = None
    max_bytes: int | None = None
    include_tests: bool = _only("pycorpus", default=False)  # the stdlib's test suites too
    paths: Any = _only("text", default=None)  # files, directories or glob patterns
    suffixes: Any = _only("text", default_factory=lambda: [".txt"])  # taken from directories
    root: str | None = _only("text", default=None)  # ids are relative to it (None: common parent)
    path: str | None = _only("hf", default=None)  # dataset name, or a saved copy's directory
    config_name: str | None = _only("hf", default=None)
    data_files: Any = _only("hf", default=None)
    # one HF split, divided by hash (None: "train" unless splits is set) ...
    split: str | None = field(
        default=None,
        metadata={KINDS: ("hf",), WEIGHTS: lambda data: data.hf_split},
    )
    splits: dict[str, str] | None = _only("hf", default=None)  # ... or ours -> HF split names
    text_field: str = _only("hf", default="text")
    load_from_disk: bool = _only("hf", default=False)
    cache_dir: str | None = _only("hf", default=None)
    revision: str | None = _only("hf", default=None)
    load_kwargs: dict[str, Any] = _only("hf", default_factory=dict)

    def __post_init__(self) -> None:
        choice("data.name", self.name, CORPUS_KINDS)
        for f in fields(self):
            kinds = f.metadata.get(KINDS)
            value = getattr(self, f.name)
            if kinds and self.name not in kinds and value != _default(f):
                raise ValueError(
                    f"data.{f.name} is a setting of data={'/'.join(kinds)}, not of "
                    f"data={self.name}, got {value!r}."
                )
        self.max_files = integer("data.max_files", self.max_files, 1, optional=True)
        self.max_bytes = integer("data.max_bytes", self.max_bytes, 1, optional=True)
        self.include_tests = boolean("data.include_tests", self.include_tests)
        _normalize_fractions(self.split_fractions)
        if self.name == "text":
            if self.paths in (None, "", "???", []):
                raise ValueError(
                    "data.paths is required for data=text; give files, directories or glob patterns."
                )
            self.paths = [self.paths] if isinstance(self.paths, str) else list(self.paths)
            self.suffixes = (
                [self.suffixes] if isinstance(self.suffixes, str) else list(self.suffixes)
            )
        if self.name == "hf":
            self._check_hf()

    def _check_hf(self) -> None:
        if self.path in (None, "", "???"):
            raise ValueError(
                "data.path is required for data=hf; give a dataset name or a local path."
            )
        if self.split is not None and self.splits is not None:
            raise ValueError(
                "data.split and data.splits are both set for data=hf; set split (one HF split, "
                "divided by hash) or splits (a train/validation/test -> HF split mapping), not both."
            )
        if self.splits is not None:
            splits = self.splits
            if not isinstance(splits, Mapping) or not splits or not set(splits) <= set(SPLITS):
                raise ValueError(
                    f"data.splits must map some of {', '.join(SPLITS)} to HF split names, "
                    f"got {splits!r}."
                )
            self.splits = dict(splits)

    @property
    def hf_split(self) -> str | None:
        """The one HF split to divide by hash: ``split``, or "train" when no ``splits`` mapping."""
        return self.split if self.split is not None or self.splits is not None else "train"

    def as_dict(self) -> dict[str, Any]:
        """This kind's settings as plain values (every one of them changes the corpus)."""
        return weights_dict(self)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> DataConfig:
        """The config from plain data (or a DictConfig), checked as Hydra checks the group."""
        return _parse(cls, values, "data")


@dataclass
class ArmConfig:
    """The ``arm`` group: which sweep cells a study arm runs (the arm's file also sets the model,
    train and eval values it needs). An experiment can sweep ``arm=lm,retrieval`` next to
    position and scaling: a cell outside its arm is skipped (not applicable), like a scaling
    that means nothing for a family. ``None`` lists allow every value."""

    name: str = "all"  # the ``arm`` column of every result row
    positions: list[str] | None = None  # position kinds the arm trains
    scalings: list[str] | None = None  # scaling names (conf/scaling/*.yaml) it evaluates
    extends: list[str] | None = None  # extend names (conf/extend/*.yaml) it fine-tunes with

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip() or "/" in self.name:
            raise ValueError(f"arm.name must be a non-empty name without '/', got {self.name!r}.")
        for key in ("positions", "scalings", "extends"):
            values = getattr(self, key)
            if values is not None and not values:
                raise ValueError(
                    f"arm.{key} is empty, so the arm runs nothing; allowed: a non-empty list of "
                    "names or null (every value)."
                )
            setattr(self, key, None if values is None else [str(v) for v in values])

    def excluded(self, position: str, scaling: str, extend: str) -> str | None:
        """Why the cell (position, scaling, extend) is not part of this arm, or None if it is."""
        for what, value, allowed in (
            ("position", position, self.positions),
            ("scaling", scaling, self.scalings),
            ("extend", extend, self.extends),
        ):
            if allowed is not None and value not in allowed:
                return (
                    f"{what} {value} is not part of arm {self.name} ({what}: {', '.join(allowed)})"
                )
        return None


@dataclass
class PathsConfig:
    """Output roots; relative paths are relative to where lenbench was started."""

    results: str = "results"  # <results>/<experiment_name>/<run_id>.parquet
    reports: str = "reports"  # <reports>/<experiment_name>/report.md
    cache: str | None = None  # checkpoints; None = $LENBENCH_CACHE or ~/.cache/lenbench/checkpoints


@dataclass
class JobConfig:
    """One job's whole config: the primary config's keys and one typed section per group."""

    experiment_name: str = "default"  # results and report go to <paths.*>/<experiment_name>
    seed: int = 0  # weight init and training batches (in the checkpoint key), eval sampling
    device: str = "auto"  # cpu | cuda | cuda:<i> | mps | auto
    threads: int | None = (
        None  # torch intra-op threads; None = per core, minus busy ones (bench.job)
    )
    paths: PathsConfig = field(default_factory=PathsConfig)
    model: ModelSchema = field(default_factory=ModelSchema)
    position: PositionSchema = field(default_factory=PositionSchema)
    scaling: ScalingSchema = field(default_factory=ScalingSchema)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # a transformers model evaluated instead of a trained one (null = train as usual)
    pretrained: PretrainedConfig | None = None
    extend: ExtendConfig = field(default_factory=ExtendConfig)
    arm: ArmConfig = field(default_factory=ArmConfig)

    def __post_init__(self) -> None:
        name = self.experiment_name
        if not isinstance(name, str) or not name.strip() or "/" in name:
            raise ValueError(f"experiment_name must be a non-empty name without '/', got {name!r}.")
        self.seed = integer("seed", self.seed, 0)
        self.threads = integer("threads", self.threads, 1, optional=True)
        self.eval = as_eval_config(self.eval)
        if self.scaling.target_length is not None:
            what = "scaling.target_length"
            tokens = parse_length(self.scaling.target_length, self.train.length, what)
            self.scaling.target_length = integer(what, tokens, 1)
        self.position.validate(self.model.head_dim, self.model.d_model)
        length = self.train.length
        rows = self.position.max_positions
        if self.position.kind == "learned" and 0 < rows < length:
            raise ValueError(
                f"position.max_positions {rows} is smaller than train.length {length}; "
                f"allowed: 0 (= train.length) or at least {length}."
            )
        if self.extend.active:
            ext, what = self.extend, "extend.length"
            ext.length = integer(what, parse_length(ext.length, length, what), length)
            ext.batch_size = ext.batch_size or self.train.batch_size
            if ext.passkey_fraction is None:
                ext.passkey_fraction = self.train.passkey_fraction
        fraction, template = self.train.passkey_fraction, self.train.passkey_template
        needed = min_passkey_length(template=template) + len(PASSKEY_TEMPLATES[template].end)
        if fraction > 0 and length + 1 < needed:
            raise ValueError(
                f"train.length {length} is too short for passkey training examples "
                f"(train.passkey_fraction={fraction:g}, template {template!r}); allowed: "
                f"train.length >= {needed - 1} or train.passkey_fraction=0."
            )

    @classmethod
    def from_hydra(cls, cfg: DictConfig | Mapping[str, Any]) -> JobConfig:
        """The typed config of a composed Hydra config (or of nested plain data, checked alike).

        Raises ValueError with one sentence for a wrong type, an unknown key, a missing or an
        out-of-range value.
        """
        if isinstance(cfg, DictConfig) and "hydra" in cfg:
            cfg = cfg.copy()
            with open_dict(cfg):
                del cfg["hydra"]
        return _parse(cls, cfg)


def _parse(schema: type, values: Any, key: str | None = None) -> Any:
    """``values`` merged into ``schema`` (at config key ``key``) and instantiated, so that types,
    unknown keys and missing values are checked as Hydra checks them; OmegaConf's errors become
    one-sentence ValueErrors."""
    try:
        typed = isinstance(values, DictConfig) and OmegaConf.get_type(values) is schema
        node = values if typed else OmegaConf.structured(schema)
        root = node if key is None else OmegaConf.create({key: node})  # errors name full keys
        if not typed:
            root = OmegaConf.merge(root, values if key is None else {key: values})
        _check_keys(root, "")  # keys added with +key=... are not rejected by Hydra
        obj = OmegaConf.to_object(root)
        return obj if key is None else obj[key]
    except OmegaConfBaseException as exc:
        raise ValueError(config_error(exc) or _first_line(exc)) from None


def _check_keys(node: DictConfig, where: str) -> None:
    """Raise for a key that is not a field of its section's dataclass (at any depth)."""
    schema = OmegaConf.get_type(node)
    if is_dataclass(schema):
        allowed = [f.name for f in fields(schema)]
        for key in node.keys():
            if key not in allowed:
                raise ValueError(
                    f"{where + '.' if where else ''}{key} is an unknown key; allowed keys: "
                    f"{', '.join(allowed)}."
                )
    for key, child in node.items_ex(resolve=False):
        if isinstance(child, DictConfig) and not (child._is_none() or child._is_missing()):
            _check_keys(child, f"{where}.{key}" if where else str(key))


ConfigStore.instance().store(name=SCHEMA_NAME, node=JobConfig)


# --------------------------------------------------------------------------- errors


def config_error(exc: BaseException) -> str | None:
    """One sentence for an OmegaConf error (or a Hydra error caused by one) about a config key
    or value: a wrong type, an unknown key or a missing value; None for anything else."""
    err = _omegaconf_cause(exc)
    if err is None or not err.full_key:
        return None
    key = str(err.full_key)
    name = str(err.key) if err.key is not None else key.rpartition(".")[2]
    schema = err.object_type if is_dataclass(err.object_type) else None
    if isinstance(err, MissingMandatoryValue):
        return f"{key} is required; set it, e.g. {key}=<value>."
    if isinstance(err, (ConfigKeyError, ConfigAttributeError)) and schema is not None:
        allowed = ", ".join(f.name for f in fields(schema))
        return f"{key} is an unknown key; allowed keys: {allowed}."
    if isinstance(err, ValidationError) and schema is not None:
        hint = _type_hints(schema).get(name)
        if hint is not None:
            return f"{key} must be {_describe(hint)}, got {err.value!r}."
    return None


def _omegaconf_cause(exc: BaseException | None) -> OmegaConfBaseException | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OmegaConfBaseException):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


@functools.cache
def _type_hints(schema: type) -> dict[str, Any]:
    return typing.get_type_hints(schema)


def _describe(hint: Any) -> str:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return f"{_describe(inner[0])} or null" if len(inner) == 1 else "a value of another type"
    origin = typing.get_origin(hint) or hint
    names = {
        bool: "true or false",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }
    if origin in names:
        return names[origin]
    return "a mapping of keys" if is_dataclass(origin) else "a value of another type"


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
