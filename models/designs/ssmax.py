"""``model.attn_scale=ssmax``: Scalable-Softmax (Nakanishi 2025), each query times s_h ln n, n the
keys it attends (its layer's window or chunk, the cache StreamingLLM keeps) and s_h learned per
head and layer, in training and evaluation."""

from __future__ import annotations

from dataclasses import replace

from models.designs.registry import Design, register_design
from models.lazy import nn, torch

#: SSMax's initial s_h (the unofficial reference implementation's; the paper states none)
SSMAX_INIT = 0.43


@register_design
class SSMax(Design):
    name, switch, label = "ssmax", "attn_scale", " +SSMax"
    hooks = ("model", "query")
    order = 3
    reference = "softmax(s_h ln(n_i) q_i.k_j / sqrt(d)) over the real causal keys, float64"
    test = "tests/models/test_ssmax.py::test_ssmax_equals_its_formula_and_counts_only_real_keys"

    def attention_inputs(self, model, inputs, at):
        from models.attention_inputs import ssmax_log_keys

        return replace(inputs, log_keys=ssmax_log_keys(inputs))  # the real keys each query sees

    def layer_inputs(self, model, layer_inputs):
        from models.attention_inputs import span_log_keys

        return span_log_keys(layer_inputs)  # a layer's window or chunks: the keys in it

    def attach(self, attn, model_cfg, position_cfg, layer):
        attn.ssmax = nn.Parameter(torch.full((attn.n_heads,), SSMAX_INIT))  # [H]

    def query(self, attn, q, inputs, query_from):
        factor = attn.ssmax[None, :, None, None] * inputs.log_keys[:, :, query_from:]
        return (q.float() * factor).to(q.dtype)
