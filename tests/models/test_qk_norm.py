"""``model.qk_norm`` (issue 54 item 6): a learned RMSNorm over each head's query and key channels,
before the position rotation, for every family. Oracle: transformers' Qwen3Attention (its
``q_norm``/``k_norm``) with the same weights; negative controls: the model without the switch
differs from Qwen3's, and the norm's learned scale changes the output. Every family builds and
decodes with it (KV cache = prefill), and the switch enters the checkpoint key only when set."""

from __future__ import annotations

import pytest
import torch

from bench.core.checks import weights_dict
from models.positions import PositionConfig, families
from models.transformer import DecoderLM, ModelConfig

from fixtures.decoding import (
    assert_trains_and_decodes,
    causal_mask,
    copy_attention_weights,
    layer_inputs,
)


def _qwen3_pair(qk_norm: bool, length: int = 20, scale_shift: float = 0.0):
    """(ours, theirs): layer 0 of a RoPE DecoderLM with ``model.qk_norm`` = ``qk_norm`` and
    transformers' Qwen3Attention (always normed) with the same weights, on one input."""
    modeling = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
    from transformers import Qwen3Config

    config = Qwen3Config(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_hidden_layers=1,
        rms_norm_eps=torch.finfo(torch.float32).eps,  # torch.nn.RMSNorm's default
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=4, n_kv_heads=2, qk_norm=qk_norm)
    model = DecoderLM(cfg, PositionConfig(kind="rope", layout="half"), 32).eval()
    ours_attn = model.blocks[0].attn
    theirs = modeling.Qwen3Attention(config, layer_idx=0).eval()
    copy_attention_weights(ours_attn, theirs)
    with torch.no_grad():
        scales = torch.linspace(0.5, 1.5, 8)  # a learned scale that is not all ones
        theirs.q_norm.weight.copy_(scales)
        theirs.k_norm.weight.copy_(scales.flip(0))
        if qk_norm:
            ours_attn.q_norm.weight.copy_(scales + scale_shift)
            ours_attn.k_norm.weight.copy_(scales.flip(0))
    x = torch.randn(1, length, 32, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        rotary = modeling.Qwen3RotaryEmbedding(config)(x, torch.arange(length)[None])
        expected = theirs(x, position_embeddings=rotary, attention_mask=causal_mask(length))[0]
        ours = ours_attn(x, layer_inputs(model, x)[0], None)[0]
    return ours, expected


def test_qk_norm_equals_qwen3_attention():
    ours, theirs = _qwen3_pair(qk_norm=True)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def test_controls_no_norm_and_another_scale_differ_from_qwen3():
    plain, theirs = _qwen3_pair(qk_norm=False)
    assert (plain - theirs).abs().max() > 1e-3
    shifted, theirs = _qwen3_pair(qk_norm=True, scale_shift=0.25)
    assert (shifted - theirs).abs().max() > 1e-4


@pytest.mark.parametrize("kind", sorted(families()))
def test_every_family_trains_and_decodes_with_qk_norm(kind):
    """Each family with the norm: a gradient reaches the norms' scales, and greedy decoding with
    the KV cache gives the tokens a full forward pass picks (no cache)."""
    assert_trains_and_decodes(kind, lambda a: [a.q_norm.weight, a.k_norm.weight], qk_norm=True)


def test_qk_norm_enters_the_checkpoint_key_only_when_set():
    off, on = ModelConfig(), ModelConfig(qk_norm=True)
    assert "qk_norm" not in weights_dict(off)
    assert weights_dict(on)["qk_norm"] is True
    params = {name for name, _ in DecoderLM(on, PositionConfig(), 16).named_parameters()}
    assert {"blocks.0.attn.q_norm.weight", "blocks.0.attn.k_norm.weight"} <= params
    plain = {name for name, _ in DecoderLM(off, PositionConfig(), 16).named_parameters()}
    assert not any("q_norm" in name for name in plain)


def test_qk_norm_rows_are_their_own_series_and_out_of_every_finding_s_default_scope():
    """A model trained with the norm is another series (its rows carry ``qk_norm``), and a
    finding reads it only where its scope names it; control: the same rows without the column
    are read."""
    import pandas as pd

    from bench.core.series import series_key
    from bench.findings.registry import Scope

    base = {"experiment": "e", "position": "rope", "scaling": "none", "metric": "ppl"}
    rows = pd.DataFrame([{**base, "qk_norm": None}, {**base, "qk_norm": "rms"}])
    assert series_key(rows).nunique() == 2
    assert len(Scope().rows(rows)) == 1 and Scope().rows(rows)["qk_norm"].isna().all()
    assert len(Scope(switches=("qk_norm",)).rows(rows)) == 2
    assert len(Scope().rows(rows.drop(columns=["qk_norm"]))) == 2


def test_each_switch_names_its_variant_and_only_when_on():
    """ModelConfig.switches() gives the result columns of bench.core.series.SWITCH_COLUMNS."""
    from bench.core.series import SWITCH_COLUMNS

    assert ModelConfig().switches() == {}
    on = ModelConfig(
        qk_norm=True, output_gate=True, attn_scale="ssmax", attention="differential"
    ).switches()
    assert on == {
        "qk_norm": "rms",
        "output_gate": "sigmoid",
        "attn_scale": "ssmax",
        "attention": "differential",
    }
    # every attention switch's column; the mixer's two are tests/models/test_designs.py's
    assert set(on) == set(SWITCH_COLUMNS) - {"mixer", "hybrid_every"}
