"""xPos (models/zoo.py) against rotary-embedding-torch's ``use_xpos`` (a test-only dependency),
its fields and scalings (KV cache, left padding and shift invariance, with a strong decay:
tests/models/test_zoo.py)."""

from __future__ import annotations

import pytest
import torch

from models.positions import PositionConfig, rotate
from models.scaling import applicable_methods
from models.transformer import DecoderLM, ModelConfig


def xpos_model(scale_base: float = 512.0, layout: str = "interleaved") -> DecoderLM:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=2)
    position = PositionConfig(kind="xpos", layout=layout, xpos_scale_base=scale_base)
    return DecoderLM(cfg, position, train_length=16).eval()


def our_logits(model: DecoderLM, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q.k logits [B, H, L, L] after our xPos rotation of q and k [B, H, L, d] at 0..L-1."""
    positions = torch.arange(q.shape[2])[None]
    q_cos, q_sin, k_cos, k_sin = (t[:, None] for t in model.family.rotary(model, positions, 16))
    layout = model.position_cfg.layout
    return rotate(q, q_cos, q_sin, layout) @ rotate(k, k_cos, k_sin, layout).transpose(-1, -2)


@pytest.mark.parametrize("scale_base", [512.0, 16.0])
def test_xpos_logits_equal_rotary_embedding_torch(scale_base):
    from rotary_embedding_torch import RotaryEmbedding

    model = xpos_model(scale_base)
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(2, 2, 40, 16, generator=gen) for _ in range(2))
    theirs = RotaryEmbedding(dim=16, use_xpos=True, xpos_scale_base=scale_base)
    rq, rk = theirs.rotate_queries_and_keys(q, k)  # centred exponents: the same logits
    torch.testing.assert_close(
        our_logits(model, q, k), rq @ rk.transpose(-1, -2), rtol=1e-5, atol=1e-5
    )
    # controls: another decay base, and RoPE without decay, give other logits
    other = RotaryEmbedding(dim=16, use_xpos=True, xpos_scale_base=scale_base * 2)
    oq, ok = other.rotate_queries_and_keys(q, k)
    assert (our_logits(model, q, k) - oq @ ok.transpose(-1, -2)).abs().max() > 1e-3
    plain = RotaryEmbedding(dim=16)
    pq, pk = plain.rotate_queries_or_keys(q), plain.rotate_queries_or_keys(k)
    assert (our_logits(model, q, k) - pq @ pk.transpose(-1, -2)).abs().max() > 1e-3


def test_xpos_fields_and_scalings():
    assert PositionConfig(kind="xpos").params() == {
        "base": 10000.0,
        "layout": "half",
        "xpos_scale_base": 512.0,
    }
    # every frequency method; no training-free pair method (a key's decay follows its own position)
    pair_methods = {"self_extend", "rerope", "leaky_rerope", "streaming"}
    assert set(applicable_methods("xpos")) == set(applicable_methods("rope")) - pair_methods
    with pytest.raises(ValueError, match="xpos_scale_base must be > 0"):
        xpos_model(scale_base=0.0)
