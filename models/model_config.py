"""The decoder's shape (:class:`ModelConfig`): its width and depth, and the fields of the model
switches, each declared and checked by its design (``models.designs``). No torch, so that a
config is checked before any tensor library loads (``models.lazy``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from models.designs.registry import check_designs, check_model, design_columns, switch_values

__all__ = [
    "ATTENTIONS",
    "ATTENTION_SINKS",
    "ATTN_SCALES",
    "ModelConfig",
    "check_combination",
]


#: the values each switch allows (built-in designs; ``models.designs.registry.switch_values``
#: gives those of designs registered later too)
ATTENTION_SINKS = switch_values("attention_sink", load=False)
ATTN_SCALES = switch_values("attn_scale", load=False)
ATTENTIONS = switch_values("attention", load=False)
#: the switches' checks on the position family (``models.designs.registry.check_designs``)
check_combination = check_designs


@dataclass
class ModelConfig:
    vocab_size: int = 259
    n_layers: int = 4
    d_model: int = 128
    n_heads: int = 4
    n_kv_heads: int | None = None  # grouped-query attention; None = n_heads
    d_ff: int | None = None  # None: 4 * D for GELU, ~8/3 * D (multiple of 32) for SwiGLU
    mlp: str = "swiglu"
    norm: str = "rms"
    dropout: float = 0.0
    tie_embeddings: bool = True
    # The model switches (``models.designs.registry.SWITCHES``) and their designs' fields, each
    # in the checkpoint key only when set (keys of earlier models hold); what each value means:
    # its design's module in models/designs/ (tests/models/test_designs.py checks these fields
    # against the declarations).
    attention_sink: str = field(default="none", metadata={"weights": "if_set"})
    qk_norm: bool = field(default=False, metadata={"weights": "if_set"})
    output_gate: bool = field(default=False, metadata={"weights": "if_set"})
    attn_scale: str = field(default="none", metadata={"weights": "if_set"})
    attn_floor: int | None = field(default=None, metadata={"weights": "if_set"})
    attn_temperature: float = field(default=0.1, metadata={"weights": "if_set"})
    attention: str = field(default="softmax", metadata={"weights": "if_set"})
    mixer: str = field(default="attention", metadata={"weights": "if_set"})
    hybrid_every: int = field(default=0, metadata={"weights": "if_set"})

    def switches(self) -> dict[str, str]:
        """The result columns of the model switches that are on (``bench.core.series``), each
        holding its design's variant: qk_norm rms, output_gate sigmoid, attn_scale's, attention's
        and mixer's values, hybrid_every's k; the attention sink's is
        :func:`models.designs.registry.design_columns`'s ``attention_sink``."""
        columns = design_columns(self)
        columns.pop("attention_sink", None)
        return columns

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def ff_width(self) -> int:
        if self.d_ff:
            return self.d_ff
        if self.mlp == "gelu":
            return 4 * self.d_model
        return 32 * math.ceil(8 * self.d_model / 3 / 32)

    def validate(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}.")
        if self.n_heads % self.kv_heads:
            raise ValueError(
                f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.kv_heads}."
            )
        if self.mlp not in ("swiglu", "gelu"):
            raise ValueError(f"mlp {self.mlp!r} is unknown; allowed: swiglu, gelu.")
        if self.norm not in ("rms", "layer"):
            raise ValueError(f"norm {self.norm!r} is unknown; allowed: rms, layer.")
        check_model(self)  # each switch's values and its designs' fields
