"""``model.qk_norm`` (Qwen3, OLMo 2): a learned per-channel RMSNorm over each head's query and
key, before the position rotation; every family."""

from __future__ import annotations

from models.designs.registry import Design, register_design
from models.lazy import nn


@register_design
class QKNorm(Design):
    name, switch, variant, label = "qk_norm", "qk_norm", "rms", " +QK-norm"
    hooks = ("qk",)
    order = 1
    reference = "transformers Qwen3Attention (its q_norm / k_norm) with our weights"
    test = "tests/models/test_qk_norm.py::test_qk_norm_equals_qwen3_attention"

    def attach(self, attn, model_cfg, position_cfg, layer):
        attn.q_norm = nn.RMSNorm(attn.head_dim)  # a learned scale over each head's d channels
        attn.k_norm = nn.RMSNorm(attn.head_dim)

    def qk(self, attn, q, k):
        return attn.q_norm(q), attn.k_norm(k)  # per head, before any rotation (Qwen3)
