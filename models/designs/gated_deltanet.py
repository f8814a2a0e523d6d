"""``model.mixer=gated_deltanet``: Gated DeltaNet (Yang, Kautz, Hatamizadeh, ICLR 2025), the linear
layer of Qwen3-Next, Qwen3.5 and Olmo Hybrid, in place of attention (``models.mixers.GatedDeltaNet``:
H = model.n_heads heads of D / H channels, a short causal conv, the gated delta rule, a gated
RMSNorm); with ``model.hybrid_every=4`` Qwen3-Next's 3 : 1 interleave."""

from __future__ import annotations

from models.designs.registry import Design, register_design


@register_design
class GatedDeltaNetMixer(Design):
    name, switch, label = "gated_deltanet", "mixer", " +Gated DeltaNet"
    hooks = ("mixer",)
    reference = (
        "transformers `Qwen3NextGatedDeltaNet` (torch path `torch_chunk_gated_delta_rule`) and "
        "`OlmoHybridGatedDeltaNet`, our weights"
    )
    test = (
        "tests/models/test_mixers_gated_deltanet.py::"
        "test_gated_deltanet_equals_qwen3_next_on_the_same_weights"
    )

    def build(self, cfg, layer):
        from models.mixers import GatedDeltaNet

        return GatedDeltaNet(cfg.d_model, cfg.n_heads)
