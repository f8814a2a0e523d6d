"""``model.mixer=kda``: Kimi Delta Attention (Kimi Linear, Moonshot AI 2025) in place of attention
(``models.mixers.KimiDeltaAttention``: Gated DeltaNet with a decay per key channel and low-rank
gates; H = model.n_heads heads of D / H channels)."""

from __future__ import annotations

from models.designs.registry import Design, register_design


@register_design
class KimiDeltaAttentionMixer(Design):
    name, switch, label = "kda", "mixer", " +KDA"
    hooks = ("mixer",)
    reference = "transformers `KimiLinearDeltaAttention` (torch path `chunk_kimi_delta_attention`), our weights"
    test = "tests/models/test_mixers_kda.py::test_kda_equals_kimi_linear_on_the_same_weights"

    def build(self, cfg, layer):
        from models.mixers import KimiDeltaAttention

        return KimiDeltaAttention(cfg.d_model, cfg.n_heads)
