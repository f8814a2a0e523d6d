"""``position=hope`` (issue 54 item 3): RoPE keeping only the pairs whose period fits the training
length. Checked by hand-computed cuts, against p-RoPE with the same kept count (p-RoPE is tested
against its definition in test_zoo.py) with a control one pair off, against a complex-number
rotation, and under linear PI (the cut stays where L put it)."""

from __future__ import annotations

import math

import pytest
import torch

from models.families.rotary import hope_kept_pairs
from models.positions import PositionConfig
from models.scaling_config import ScalingConfig
from models.transformer import DecoderLM, ModelConfig

CFG = dict(n_layers=1, d_model=64, n_heads=2)  # head_dim 32: 16 rotary pairs


def test_the_cut_by_hand():
    # periods 2 pi 10000^(i/16): 6.3, 11.2, 19.9, 35.3, 62.8, 111.7, 198.7, 353.3, ...
    assert hope_kept_pairs(16, 10000.0, 64) == 5
    assert hope_kept_pairs(16, 10000.0, 256) == 7
    assert hope_kept_pairs(16, 10000.0, 6) == 0  # even the fastest pair's period exceeds L
    assert hope_kept_pairs(16, 500.0, 64) == 6  # 2 pi 500^(5/16) = 43.8 <= 64 < 64.7 (i = 6)
    periods = [2 * math.pi * 500 ** (i / 16) for i in range(16)]
    assert sum(p <= 64 for p in periods) == 6


def _logits(position: PositionConfig, scaling: ScalingConfig | None = None, length: int = 64):
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(**CFG), position, 64).eval()
    tokens = torch.randint(0, 256, (2, length), generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), model.scaled(scaling, length) if scaling else torch.no_grad():
        return model(tokens).logits, model


def test_hope_is_p_rope_with_the_same_kept_pairs_and_not_one_off():
    hope, model = _logits(PositionConfig(kind="hope"))
    same, _ = _logits(PositionConfig(kind="p_rope", frequency_fraction=5 / 16))
    other, _ = _logits(PositionConfig(kind="p_rope", frequency_fraction=6 / 16))
    torch.testing.assert_close(hope, same)
    assert (hope - other).abs().max() > 1e-4
    inv_freq = model.frequencies(64)[0]
    assert bool((inv_freq[:5] > 0).all()) and bool((inv_freq[5:] == 0).all())


def test_kept_pairs_rotate_as_a_complex_rope_and_the_others_not_at_all():
    """q rotated at position p by HoPE's table equals q_c x exp(i p theta_c) for kept pairs and
    q_c itself for the others (complex-number RoPE, half layout: pairs (c, c + r/2))."""
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(**CFG), PositionConfig(kind="hope"), 64)
    from models.positions import rotate

    table = model.rotary_table(64)
    positions = torch.tensor([[0, 3, 40, 200]])
    cos, sin = table(positions)
    q = torch.randn(1, 1, 4, 32, dtype=torch.float32)
    ours = rotate(q, cos[:, None], sin[:, None], "half")
    theta = 10000.0 ** (-torch.arange(16, dtype=torch.float64) / 16)
    theta[5:] = 0.0
    z = torch.complex(q[..., :16].double(), q[..., 16:].double())
    turned = z * torch.exp(1j * positions[..., None].double() * theta)
    expected = torch.cat((turned.real, turned.imag), dim=-1).float()
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=1e-4)


def test_linear_pi_rescales_the_kept_pairs_and_keeps_the_cut():
    scaling = ScalingConfig(name="linear", method="linear", params={"factor": 4.0})
    hope, model = _logits(PositionConfig(kind="hope"), scaling, length=128)
    same, _ = _logits(PositionConfig(kind="p_rope", frequency_fraction=5 / 16), scaling, 128)
    torch.testing.assert_close(hope, same)
    with model.scaled(scaling, 128):
        inv_freq = model.frequencies(128)[0]
    assert bool((inv_freq[5:] == 0).all()) and bool((inv_freq[:5] > 0).all())


def test_hope_refuses_a_rotary_fraction():
    with pytest.raises(
        ValueError,
        match=r"^position\.rotary_fraction=0\.5 means nothing for position=hope .*"
        r"accepts: position\.base, position\.layout\.$",
    ):
        DecoderLM(ModelConfig(**CFG), PositionConfig(kind="hope", rotary_fraction=0.5), 64)
