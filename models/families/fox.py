"""The Forgetting Transformer's family (Lin et al., ICLR 2025, arXiv 2503.02130): no position
encoding; every layer's attention has a data-dependent forget gate per head,
f_t = sigmoid(w_h . x_t + b_h) from the layer's (normed) input, and the logit of query i and key j
gains sum_{t=j+1..i} log f_t = F_i - F_j (F the running sum of log f over the tokens, in their
order: indices, never position ids). The gate and its decay live in :class:`models.attention.Attention`;
the family only declares it. Tested against x-transformers' ``DataDependentAlibi``
(tests/models/test_fox.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from models.positions import Family, PositionConfig, register_family


@dataclass
class FoxConfig(PositionConfig):
    """FoX's field: the forget gate's initial bias."""

    kind: str = "fox"
    fox_gate_bias: float = 5.0


@register_family
class FoX(Family):
    """FoX: NoPE plus a forget gate per layer and head. The gate bias starts at
    ``position.fox_gate_bias`` (5: f = 0.993, nearly NoPE at initialisation, as x-transformers'
    ``DataDependentAlibi``; the official code zero-initialises it, f = 0.5). Its decay is added on
    the tiled attention path (no fused or flex kernel)."""

    name, acts_on = "fox", "none"
    config = FoxConfig
    capabilities = ("pairs",)  # as NoPE: nothing to re-position, a windowed method only masks
    reads_position_ids = False  # the decay counts tokens, not position ids
    forget_gate = True

    def check(self, cfg: PositionConfig, head_dim: int, d_model: int) -> None:
        value = cfg.fox_gate_bias
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ValueError(f"position.fox_gate_bias must be a finite number, got {value!r}.")

    def gate_bias(self, cfg: PositionConfig) -> float:
        return float(cfg.fox_gate_bias)
