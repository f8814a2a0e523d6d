"""``model.output_gate`` (issue 54 item 7): gated attention (Qiu et al. 2025), each head's output
times an elementwise sigmoid gate computed from the layer's normed input, before the output
projection. Oracle: transformers' Qwen3NextAttention (its q_proj emits the query and the gate per
head; it always applies its zero-centred QK-norm, so ours runs with ``model.qk_norm`` too and its
norm weights are ours minus 1). Negative control: ours without the gate differs. Every family
trains and decodes with it; the switch is in the checkpoint key only when set."""

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


def _qwen3_next_pair(output_gate: bool, length: int = 20):
    modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    from transformers import Qwen3NextConfig

    heads, kv_heads, head_dim, width = 4, 2, 8, 32
    config = Qwen3NextConfig(
        hidden_size=width,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        num_hidden_layers=1,
        rms_norm_eps=torch.finfo(torch.float32).eps,  # torch.nn.RMSNorm's default
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 1.0,
        },
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    cfg = ModelConfig(
        n_layers=1, d_model=width, n_heads=heads, n_kv_heads=kv_heads, qk_norm=True,
        output_gate=output_gate,
    )  # fmt: skip
    model = DecoderLM(cfg, PositionConfig(kind="rope", layout="half"), 32).eval()
    ours_attn = model.blocks[0].attn
    theirs = modeling.Qwen3NextAttention(config, layer_idx=0).eval()
    gate_weight = (
        ours_attn.gate_proj.weight
        if output_gate
        else torch.randn(heads * head_dim, width, generator=torch.Generator().manual_seed(3))
    )
    # their q_proj: per head, the head's query rows then its gate rows
    q_rows = ours_attn.q_proj.weight.view(heads, head_dim, width)
    g_rows = gate_weight.view(heads, head_dim, width)
    interleaved = torch.cat((q_rows, g_rows), dim=1).reshape(-1, width)
    copy_attention_weights(ours_attn, theirs, q_weight=interleaved)
    with torch.no_grad():
        scales = torch.linspace(0.5, 1.5, head_dim)
        ours_attn.q_norm.weight.copy_(scales)
        ours_attn.k_norm.weight.copy_(scales.flip(0))
        theirs.q_norm.weight.copy_(scales - 1.0)  # Qwen3-Next's RMSNorm multiplies by 1 + w
        theirs.k_norm.weight.copy_(scales.flip(0) - 1.0)
    x = torch.randn(1, length, width, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        rotary = modeling.Qwen3NextRotaryEmbedding(config)(x, torch.arange(length)[None])
        expected = theirs(x, position_embeddings=rotary, attention_mask=causal_mask(length))[0]
        ours = ours_attn(x, layer_inputs(model, x)[0], None)[0]
    return ours, expected


def test_output_gate_equals_qwen3_next_attention():
    ours, theirs = _qwen3_next_pair(output_gate=True)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def test_control_without_the_gate_differs_from_qwen3_next():
    plain, theirs = _qwen3_next_pair(output_gate=False)
    assert (plain - theirs).abs().max() > 1e-3


@pytest.mark.parametrize("kind", sorted(families()))
def test_every_family_trains_and_decodes_with_the_output_gate(kind):
    assert_trains_and_decodes(kind, lambda attn: [attn.gate_proj.weight], output_gate=True)


def test_output_gate_enters_the_checkpoint_key_only_when_set():
    assert "output_gate" not in weights_dict(ModelConfig())
    assert weights_dict(ModelConfig(output_gate=True))["output_gate"] is True
