"""``model.attention_sink``: where attention may put the mass it owes no key.

learned (gpt-oss): one logit per head and layer in every softmax's denominator, attached to no
value; token (StreamingLLM's pre-training recipe): a learned first token that every sequence
starts with, at the position of the row's first token (``models.transformer``).
"""

from __future__ import annotations

from models.designs.registry import Design, register_design
from models.lazy import nn, torch


@register_design
class LearnedSink(Design):
    name, switch, label = "learned", "attention_sink", " +learned sink"
    yaml = "learned_sink"
    hooks = ("kernel",)
    order = 0
    reference = "the definition: softmax over [logits, sink], the sink's column dropped"
    test = "tests/models/test_hybrid.py::test_learned_sink_joins_every_softmax_denominator"

    def check(self, model_cfg, position_cfg):
        if model_cfg.attention != "softmax":
            return (
                f"model.attention={model_cfg.attention} does not combine with "
                "model.attention_sink=learned (a sink logit joins one softmax's denominator); "
                "allowed: attention_sink none or token."
            )
        if position_cfg.acts_on == "contextual":
            return (
                f"model.attention_sink=learned does not combine with position={position_cfg.kind} "
                "(its positions are counted over the logits row, which a sink would join); "
                "allowed: attention_sink none or token."
            )
        return None

    def attach(self, attn, model_cfg, position_cfg, layer):
        attn.sink = nn.Parameter(torch.zeros(attn.n_heads))  # [H]

    def kernel(self, attn, x, inputs, cached, queries):
        return {"sink": attn.sink}


@register_design
class TokenSink(Design):
    name, switch, label = "token", "attention_sink", " +token sink"
    yaml = "token_sink"
    hooks = ("model",)
    reference = "StreamingLLM's pre-training recipe (a learned first token)"
    test = "tests/models/test_hybrid.py::test_sink_token_is_a_first_token_at_the_first_position"

    def init_model(self, model):
        # the sink token's input vector; the forward pass puts it before every new sequence
        model.sink_embedding = nn.Parameter(torch.randn(model.model_cfg.d_model) * 0.02)
