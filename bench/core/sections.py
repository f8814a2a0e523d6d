"""The ``model``, ``position`` and ``scaling`` sections' typed schemas: the model's own configs
(``models``) with their checks. Every stage reads them (the checkpoint cache, the harness, the job
schema ``bench.schema`` that registers them in Hydra's ConfigStore).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.core.checks import (
    boolean,
    choice,
    integer,
    number,
    parse_length,
    parse_section,
    weights_dict,
)
from models.designs.registry import SWITCHES
from models.model_config import ModelConfig
from models.positions import LEGACY_KEYED, PositionConfig, family, refuse_foreign_fields
from models.scaling import SCALING_METHODS
from models.scaling_config import ScalingConfig


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
        for name, switch in SWITCHES.items():  # a boolean switch (qk_norm, output_gate)
            if switch.type is bool:
                setattr(self, name, boolean(f"model.{name}", getattr(self, name)))
        try:
            self.validate()  # divisibility, mlp and norm; its messages start with the field name
        except ValueError as exc:
            raise ValueError(f"model.{exc}") from None


#: The ``position`` group is :class:`models.positions.PositionConfig`: each family's own dataclass
#: (``Family.config``; its fields are the ``position_params`` column). Its checks need the model's
#: head size, so :class:`bench.schema.JobConfig` runs them (``validate``).
PositionSchema = PositionConfig


def position_weights(cfg: PositionConfig) -> dict[str, Any]:
    """The position section as it enters the checkpoint key: the family's fields (their
    ``weights`` metadata applied) and, for a family without them, the fields every key held
    while the section was one flat dataclass (``models.positions.LEGACY_KEYED``)."""
    return {**LEGACY_KEYED, **weights_dict(cfg)}


def position_section(values: Any) -> PositionConfig:
    """The ``position`` section from plain data or a Hydra node: its family's dataclass, checked
    as Hydra checks a section (types, unknown keys: one sentence naming what the family accepts)."""
    if isinstance(values, PositionConfig):
        return values
    kind = values.get("kind", "rope") if hasattr(values, "get") else None
    if not isinstance(kind, str):
        raise ValueError(f"position.kind {kind!r} is invalid; allowed: a family name.")
    refuse_foreign_fields(kind, values)
    return parse_section(family(kind).config, values, key="position")


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
