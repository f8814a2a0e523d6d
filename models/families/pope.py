"""PoPE, polar coordinate position embeddings (Gopalakrishnan, Csordas, Schmidhuber, Mozer 2025,
arXiv 2509.10534): magnitudes from content, phases from position only. Each of a head's d query
and key components c becomes a magnitude mu = softplus(x_c) at phase p theta_c (theta_c =
base^(-c/d): d frequencies, not d/2 pairs), the key's phase shifted by a learned bias delta_h,c
clamped to [-2 pi, 0]; q'.k' = sum_c mu_q,c mu_k,c cos((i - j) theta_c - delta_c). The product
is 2d wide; the values stay d wide. Tested against x-transformers' ``PolarEmbedding`` and
``apply_polar_pos_emb`` (tests/models/test_pope.py).
"""

from __future__ import annotations

import math
from typing import Any

from models.lazy import nn, torch
from models.positions import Family, FrequencyConfig, PositionConfig, register_family


@register_family
class PoPE(Family):
    """PoPE: the scaling methods rewrite its d frequencies as RoPE's of a 2d-wide head (the same
    base^(-c/d)); the key phase bias (one per key head and component, shared by the layers as
    x-transformers' ``PolarEmbedding`` keeps it) starts at 0."""

    name, acts_on = "pope", "qk"
    config = FrequencyConfig
    # its phases are RoPE's table (attention factor included): every frequency method applies;
    # a pair method would rotate pairs as RoPE's, which PoPE's phases are not: no "pairs"
    capabilities = ("positions", "frequencies", "rotary", "rotation_only")
    qk_layout = "polar"  # models.positions.rotate: magnitudes times phases, twice as wide

    def check(self, cfg: PositionConfig, head_dim: int, d_model: int) -> None:
        if head_dim < 1:
            raise ValueError(f"PoPE needs a head dimension of at least 1, got {head_dim}.")

    def frequency_dims(self, cfg: PositionConfig, head_dim: int, d_model: int) -> tuple[int, float]:
        return 2 * head_dim, 1.0  # base^(-2c / 2d) = base^(-c / d), c = 0 .. d - 1

    def length_dependent(self, cfg: PositionConfig, scaling: Any) -> bool:
        return bool(scaling.method.length_dependent)

    def init(self, model: Any) -> None:
        heads, dim = model.model_cfg.kv_heads, model.model_cfg.head_dim
        model.pope_bias = nn.Parameter(torch.zeros(heads, dim))  # [G, d], clamped when used

    def rotary(self, model: Any, position_ids: torch.Tensor, seq_len: int):
        cos, sin = model.rotary_table(seq_len)(position_ids)  # [N, L, d] each
        bias = model.pope_bias.float().clamp(-2 * math.pi, 0.0)[None, :, None, :]  # [1, G, 1, d]
        cos_b, sin_b = torch.cos(bias), torch.sin(bias)
        k_cos = cos[:, None] * cos_b - sin[:, None] * sin_b  # cos(p theta + delta), [N, G, L, d]
        k_sin = sin[:, None] * cos_b + cos[:, None] * sin_b
        return cos, sin, k_cos, k_sin
