"""DroPE (2025): drop every position encoding of a trained model, then recalibrate it briefly at
its training length (``extend=drope``), or drop it with no recalibration (``scaling=drope``, the
zero-shot control). For a family whose rotation is its whole position signal (``rotation_only``:
RoPE, p-RoPE, HoPE, PoPE) every inverse frequency becomes 0, so queries and keys keep their
channels at every position and the model reads positions no more than NoPE does
(tests/models/test_drope.py compares it with NoPE carrying the same weights)."""

from __future__ import annotations

from models.lazy import torch
from models.scaling.registry import RopeGeometry, default_inv_freq, register_scaling


@register_scaling("drope", applies_to=("rotation_only",))
def _drope(geometry: RopeGeometry) -> tuple[torch.Tensor, float]:
    """theta_i = 0 for every pair: cos 1, sin 0, no rotation; attention factor 1."""
    return torch.zeros_like(default_inv_freq(geometry.rotary_dim, geometry.base)), 1.0
