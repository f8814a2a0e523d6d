"""``position=pope`` (issue 54 item 2): polar coordinate positions (Gopalakrishnan et al. 2025).
Oracle: x-transformers' ``PolarEmbedding`` + ``apply_polar_pos_emb`` with our phase bias, and
softmax attention written out in float64 over the 2d-wide products. Controls: without the phase
bias, and as RoPE, the numbers differ. Decoding with the KV cache equals full passes; the
frequency methods rewrite its d frequencies; a pair method is refused."""

from __future__ import annotations

import math

import pytest
import torch

from models.positions import PositionConfig
from models.scaling import applicable_methods
from models.transformer import DecoderLM, ModelConfig

from fixtures.decoding import assert_trains_and_decodes, attention_output

x_transformers = pytest.importorskip("x_transformers.x_transformers")

WIDTH, HEADS = 32, 2
D = WIDTH // HEADS


def _model(kind: str = "pope", seed: int = 0) -> DecoderLM:
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layers=1, d_model=WIDTH, n_heads=HEADS)
    model = DecoderLM(cfg, PositionConfig(kind=kind, base=100.0), 16).eval()
    with torch.no_grad():
        model.blocks[0].attn.q_proj.weight.normal_(0.0, 0.5)
        model.blocks[0].attn.kv_proj.weight.normal_(0.0, 0.5)
        if kind == "pope":  # a bias per head and component, some of it beyond the clamp
            model.pope_bias.uniform_(-8.0, 1.0)
    return model


def _reference(model: DecoderLM, x: torch.Tensor, with_bias: bool = True) -> torch.Tensor:
    attn = model.blocks[0].attn
    polar = x_transformers.PolarEmbedding(D, HEADS, base=100.0)
    with torch.no_grad():
        polar.learned_bias.copy_(
            model.pope_bias[:, None, :] if with_bias else 0 * polar.learned_bias
        )
    length = x.shape[1]
    freqs, bias = polar(torch.arange(length))
    x64 = x.double()
    q = (x64 @ attn.q_proj.weight.double().T).view(*x.shape[:2], HEADS, D).transpose(1, 2)
    kv = (x64 @ attn.kv_proj.weight.double().T).view(*x.shape[:2], 2, HEADS, D)
    k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
    q2 = x_transformers.apply_polar_pos_emb(q, freqs).double()
    k2 = x_transformers.apply_polar_pos_emb(k, freqs + bias).double()  # [N, H, L, 2d]
    logits = q2 @ k2.transpose(-1, -2) / math.sqrt(D)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    probs = logits.masked_fill(~causal, float("-inf")).softmax(-1)
    out = (probs @ v).transpose(1, 2).reshape(*x.shape[:2], WIDTH)
    return out @ attn.o_proj.weight.double().T


def test_pope_equals_x_transformers_polar_embedding():
    x = torch.randn(2, 14, WIDTH, generator=torch.Generator().manual_seed(3))
    model = _model()
    ours = attention_output(model, x).double()
    torch.testing.assert_close(ours, _reference(model, x), atol=1e-5, rtol=1e-4)
    # controls: the phase bias matters, and RoPE with the same weights is another model
    assert (ours - _reference(model, x, with_bias=False)).abs().max() > 1e-3
    rope = _model("rope")
    assert (ours - attention_output(rope, x).double()).abs().max() > 1e-3


def test_pope_trains_and_decodes_with_the_cache():
    model = assert_trains_and_decodes("pope", lambda attn: [attn.q_proj.weight])
    assert model.pope_bias.grad is not None and model.pope_bias.grad.abs().sum() > 0


def test_pi_divides_pope_positions_and_pair_methods_are_refused():
    """Linear interpolation by 2 at position 2p equals the raw model at position p (the phases
    read p theta only); Self-Extend, which moves pairs by a RoPE rotation, does not apply."""
    from models.scaling_config import ScalingConfig

    model = _model()
    tokens = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        raw = model(tokens, position_ids=torch.arange(8)[None]).logits
        model.set_scaling(ScalingConfig(name="linear", method="linear", params={"factor": 2.0}))
        scaled = model(tokens, position_ids=2 * torch.arange(8)[None]).logits
    torch.testing.assert_close(scaled, raw, atol=1e-4, rtol=1e-4)
    methods = applicable_methods("pope")
    assert {"linear", "ntk", "yarn", "llama3", "longrope"} <= set(methods)
    assert not {"self_extend", "rerope", "streaming"} & set(methods)
