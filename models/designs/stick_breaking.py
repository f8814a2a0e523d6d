"""``model.attention=stick_breaking`` (Tan et al., ICLR 2025): no softmax,
A_ij = beta_ij prod_{j<k<i} (1 - beta_ik) with beta = sigmoid(q.k / sqrt d), the keys before the
query only (flash-linear-attention's default), the leftover stick dropped; with position=nope
(``models.tiled_attention.stick_breaking_weights``)."""

from __future__ import annotations

from models.designs.registry import Design, register_design


@register_design
class StickBreaking(Design):
    name, switch, label = "stick_breaking", "attention", " +stick-breaking"
    hooks = ("kernel",)
    reference = (
        "the definition A_ij = beta_ij prod_{j<k<i} (1 - beta_ik) as explicit products, float64"
    )
    test = "tests/conformance.py (attention design stick_breaking)"

    def check(self, model_cfg, position_cfg):
        if position_cfg.kind != "nope":
            return (
                f"model.attention=stick_breaking does not combine with position={position_cfg.kind}: "
                "stick-breaking attention orders keys by itself and takes no position encoding; "
                "allowed: position=nope."
            )
        return None

    def kernel(self, attn, x, inputs, cached, queries):
        return {"stick_breaking": True}
