"""The decoder's shape (:class:`ModelConfig`) and the model switches' checks: no torch, so that a
config is checked before any tensor library loads (``models.lazy``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from models.positions import PositionConfig

__all__ = [
    "ATTENTIONS",
    "ATTENTION_SINKS",
    "ATTN_SCALES",
    "SSMAX_INIT",
    "ModelConfig",
    "check_combination",
    "differential_lambda_init",
]


#: ``model.attention_sink``: none; learned = one logit per head and layer in every softmax's
#: denominator (gpt-oss); token = a learned first token that every sequence starts with
#: (StreamingLLM's pre-training recipe), at the position of the row's first token.
ATTENTION_SINKS = ("none", "learned", "token")
#: ``model.attn_scale``: none; ssmax = Scalable-Softmax (Nakanishi 2025), each query times
#: s_h log n, n the keys it sees and s_h learned per head and layer, in training and evaluation;
#: llama4 = Llama 4's query temperature log1p(floor((p + 1) / attn_floor)) * attn_temperature + 1
#: at every layer, for any family (transformers' ``attn_temperature_tuning``; iRoPE has it on
#: its NoPE layers already), in training and evaluation.
ATTN_SCALES = ("none", "ssmax", "llama4")
#: ``model.attention``: softmax; stick_breaking (Tan et al., ICLR 2025): no softmax,
#: A_ij = beta_ij prod_{j<k<i} (1 - beta_ik) with beta = sigmoid(q.k / sqrt d), the keys before the
#: query only (flash-linear-attention's default), the leftover stick dropped; with position=nope;
#: differential (Ye et al., ICLR 2025): (softmax(Q1 K1) - lambda softmax(Q2 K2)) V per pair of heads,
#: a head-wise RMSNorm times (1 - lambda_init).
ATTENTIONS = ("softmax", "stick_breaking", "differential")


def differential_lambda_init(layer: int) -> float:
    """The Differential Transformer's lambda_init of block ``layer`` (0-based; the paper's l - 1):
    0.8 - 0.6 exp(-0.3 layer)."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


#: SSMax's initial s_h (the unofficial reference implementation's; the paper states none)
SSMAX_INIT = 0.43


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
    # ATTENTION_SINKS; in the checkpoint key only when set (keys of earlier models hold)
    attention_sink: str = field(default="none", metadata={"weights": "if_set"})
    # RMS QK-norm (Qwen3, OLMo 2): a learned per-channel RMSNorm over each head's query and key,
    # before the position rotation; every family. In the checkpoint key only when set.
    qk_norm: bool = field(default=False, metadata={"weights": "if_set"})
    # gated attention (Qiu et al. 2025, Qwen3-Next): each head's output times an elementwise
    # sigmoid gate computed from the layer's (normed) input, before the output projection
    output_gate: bool = field(default=False, metadata={"weights": "if_set"})
    # ATTN_SCALES; in the checkpoint key only when set
    attn_scale: str = field(default="none", metadata={"weights": "if_set"})
    # attn_scale=llama4: the floor (Llama 4: 8192; null = the training length) and the scale
    # (Llama 4: 0.1) of its query temperature; in the checkpoint key only when set
    attn_floor: int | None = field(default=None, metadata={"weights": "if_set"})
    attn_temperature: float = field(default=0.1, metadata={"weights": "if_set"})
    # ATTENTIONS; in the checkpoint key only when set
    attention: str = field(default="softmax", metadata={"weights": "if_set"})

    def switches(self) -> dict[str, str]:
        """The model switches that are on, each as the variant its result column names
        (``bench.core.series.SWITCH_COLUMNS``): qk_norm rms, output_gate sigmoid, attn_scale's and
        attention's values."""
        on = {
            "qk_norm": "rms" if self.qk_norm else None,
            "output_gate": "sigmoid" if self.output_gate else None,
            "attn_scale": None if self.attn_scale == "none" else self.attn_scale,
            "attention": None if self.attention == "softmax" else self.attention,
        }
        return {name: variant for name, variant in on.items() if variant is not None}

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
        if self.attn_scale not in ATTN_SCALES:
            raise ValueError(
                f"attn_scale {self.attn_scale!r} is unknown; allowed: {', '.join(ATTN_SCALES)}."
            )
        if self.attn_floor is not None and (
            isinstance(self.attn_floor, bool) or not isinstance(self.attn_floor, int)
            or self.attn_floor < 1
        ):  # fmt: skip
            raise ValueError(
                f"attn_floor {self.attn_floor!r} is invalid; allowed: an integer >= 1 or null."
            )
        if isinstance(self.attn_temperature, bool) or not isinstance(
            self.attn_temperature, int | float
        ) or not self.attn_temperature > 0:  # fmt: skip
            raise ValueError(
                f"attn_temperature {self.attn_temperature!r} is invalid; allowed: a number > 0."
            )
        if self.attention not in ATTENTIONS:
            raise ValueError(
                f"attention {self.attention!r} is unknown; allowed: {', '.join(ATTENTIONS)}."
            )
        if self.attention == "differential" and (self.n_heads % 2 or self.kv_heads != self.n_heads):
            raise ValueError(
                f"attention differential pairs heads and their values: n_heads {self.n_heads} must "
                f"be even and n_kv_heads ({self.kv_heads}) equal to it."
            )
        if self.attention_sink not in ATTENTION_SINKS:
            raise ValueError(
                f"attention_sink {self.attention_sink!r} is unknown; allowed: "
                f"{', '.join(ATTENTION_SINKS)}."
            )


def check_combination(model_cfg: ModelConfig, position_cfg: PositionConfig) -> None:
    """Raise ValueError (one sentence) for model switches that do not combine with the position
    family; needs no model, so a job checks it before anything trains."""
    if model_cfg.attn_scale == "llama4" and position_cfg.kind == "irope":
        raise ValueError(
            "model.attn_scale=llama4 does not combine with position=irope, which applies Llama "
            "4's query temperature on its NoPE layers itself (position.temperature_scale); "
            "allowed: attn_scale none or ssmax."
        )
    if model_cfg.attention == "stick_breaking" and position_cfg.kind != "nope":
        raise ValueError(
            f"model.attention=stick_breaking does not combine with position={position_cfg.kind}: "
            "stick-breaking attention orders keys by itself and takes no position encoding; "
            "allowed: position=nope."
        )
    if model_cfg.attention != "softmax" and model_cfg.attention_sink == "learned":
        raise ValueError(
            f"model.attention={model_cfg.attention} does not combine with "
            "model.attention_sink=learned (a sink logit joins one softmax's denominator); "
            "allowed: attention_sink none or token."
        )
    if model_cfg.attention_sink == "learned" and position_cfg.acts_on == "contextual":
        raise ValueError(
            f"model.attention_sink=learned does not combine with position={position_cfg.kind} "
            "(its positions are counted over the logits row, which a sink would join); "
            "allowed: attention_sink none or token."
        )
