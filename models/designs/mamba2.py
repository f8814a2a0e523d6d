"""``model.mixer=mamba2``: Mamba-2 (Dao & Gu, ICML 2024) in place of attention
(``models.mixers.Mamba2``: expand 2, heads of D / model.n_heads channels, state 64, one B/C group,
a short causal conv, the gated RMSNorm)."""

from __future__ import annotations

from models.designs.registry import Design, register_design


@register_design
class Mamba2Mixer(Design):
    name, switch, label = "mamba2", "mixer", " +Mamba-2"
    hooks = ("mixer",)
    reference = (
        "transformers `Mamba2Mixer` torch path (`mamba2_chunk_scan`, no CUDA kernels), our weights"
    )
    test = (
        "tests/models/test_mixers_mamba2.py::"
        "test_mamba2_equals_transformers_mamba2_mixer_on_the_same_weights"
    )

    def build(self, cfg, layer):
        from models.mixers import Mamba2

        return Mamba2(cfg.d_model, head_dim=cfg.d_model // cfg.n_heads)
