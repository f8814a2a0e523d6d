"""``model.output_gate`` (gated attention, Qiu et al. 2025; Qwen3-Next): each head's output times
an elementwise sigmoid gate computed from the layer's (normed) input, before ``o_proj``."""

from __future__ import annotations

from models.designs.registry import Design, register_design
from models.lazy import nn, torch


@register_design
class OutputGate(Design):
    name, switch, variant, label = "output_gate", "output_gate", "sigmoid", " +output gate"
    hooks = ("output",)
    order = 2
    reference = "transformers Qwen3NextAttention (its gate rows of q_proj) with our weights"
    test = "tests/models/test_output_gate.py::test_output_gate_equals_qwen3_next_attention"

    def attach(self, attn, model_cfg, position_cfg, layer):
        width = attn.n_heads * attn.head_dim
        attn.gate_proj = nn.Linear(model_cfg.d_model, width, bias=False)

    def output(self, attn, out, x, query_from):
        # elementwise, per head and channel: out [N, L - query_from, H d]
        return out * torch.sigmoid(attn.gate_proj(x[:, query_from:]))
