"""The ``model``, ``position`` and ``scaling`` sections' typed schemas: the model's own configs
(``models``) with their checks. Every stage reads them (the checkpoint cache, the harness, the job
schema ``bench.schema`` that registers them in Hydra's ConfigStore).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.core.checks import boolean, choice, integer, number, parse_length
from models.model_config import ModelConfig
from models.positions import PositionConfig
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
        self.qk_norm = boolean("model.qk_norm", self.qk_norm)
        self.output_gate = boolean("model.output_gate", self.output_gate)
        try:
            self.validate()  # divisibility, mlp and norm; its messages start with the field name
        except ValueError as exc:
            raise ValueError(f"model.{exc}") from None


#: The ``position`` group is :class:`models.positions.PositionConfig` itself: each family declares
#: the fields it reads (``Family.fields``, the ``position_params`` column) and the fields carry
#: their checkpoint-key metadata. Its checks need the model's head size, so :class:`JobConfig`
#: runs them (``validate``).
PositionSchema = PositionConfig


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
