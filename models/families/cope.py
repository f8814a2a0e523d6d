"""The zoo's contextual family (``acts_on == "contextual"``):

- ``cope`` (Golovneva et al. 2024): positions counted by gates sigma(q_i . k_t) over the keys
  from j to i, a learned embedding interpolated at that count and dotted with the query; it
  reads no position id at all.

Tested against x-transformers' CoPE (tests/models/test_cope.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from models.lazy import nn, torch
from models.positions import ContextualBias, Family, PositionConfig, register_family


@dataclass
class CopeConfig(PositionConfig):
    """CoPE's field: how many positions its table holds (counts are capped below it)."""

    kind: str = "cope"
    cope_npos_max: int = 64


# --------------------------------------------------------------------------- CoPE


def cope_positions(logits: torch.Tensor, factor: float, npos_max: int) -> torch.Tensor:
    """p_ij = sum_{t = j..i} sigma(logit_it) / factor, at most npos_max - 1: [N, H, T, S] float32
    from the scaled logits (-inf where masked, so masked keys count 0: the sum over t >= j of
    the whole row is the sum from j to i)."""
    gates = torch.sigmoid(logits)
    counted = gates.flip(-1).cumsum(dim=-1).flip(-1) / factor
    return counted.clamp(max=npos_max - 1)  # CoPE's own cap (p_max), not an input check


def _cope(layer, q, logits, scale, embeddings, factor, npos_max):
    pos = cope_positions(logits, factor, npos_max)  # [N, H, T, S]
    at_integer = scale * (q @ embeddings[layer].T)  # [N, H, T, npos_max]: scale q . e[p]
    floor = pos.floor()
    weight = pos - floor  # the gradient reaches the gates through the interpolation weight
    below = at_integer.gather(-1, floor.long())
    above = at_integer.gather(-1, pos.ceil().long())
    return above * weight + below * (1 - weight)


@register_family
class CoPE(Family):
    """CoPE: logits_ij += scale q_i . e[p_ij], e [npos_max, d] learned per layer (shared by the
    heads, zero-initialised), interpolated linearly between integer positions, with p_ij the
    count of gates sigma(scale q_i . k_t) for t = j..i, capped at npos_max - 1. As the paper's
    reference code (facebookresearch/RAM ``projects/cope``): gates on the scaled logits, the
    position term scaled like q . k. Needs each logits row whole, so it runs on the tiled path
    (no flex or fused kernel)."""

    name, acts_on = "cope", "contextual"
    config = CopeConfig
    capabilities = ("positions",)  # a position transform divides the counted positions
    reads_position_ids = False  # positions are counted over the content

    def check(self, cfg: PositionConfig, head_dim: int, d_model: int) -> None:
        if cfg.cope_npos_max < 2:
            raise ValueError(f"position.cope_npos_max must be >= 2, got {cfg.cope_npos_max}.")

    def init(self, model: Any) -> None:
        shape = (
            model.model_cfg.n_layers,
            model.position_cfg.cope_npos_max,
            model.model_cfg.head_dim,
        )
        model.cope_emb = nn.Parameter(torch.zeros(shape))  # [layers, npos_max, d]

    def contextual_bias(self, model: Any) -> ContextualBias:
        factor = float(model.resolved_scaling.position_factor or 1.0)
        return ContextualBias(_cope, (model.cope_emb, factor, model.position_cfg.cope_npos_max))
