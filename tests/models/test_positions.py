"""RoPE, ALiBi, sinusoidal and learned positions checked against independent forms and the seeds' hand math.

Every property test has a negative control: the deliberately wrong variant the same check rejects.
"""

import math

import pytest
import torch

from models.families.classic import learned_lookup, sinusoidal_embedding, sinusoidal_inv_freq
from models.positions import (
    PositionConfig,
    alibi_slopes,
    apply_rope,
    position_ids_from_attention_mask,
    rope_cos_sin,
)


def default_inv_freq(dim: int, base: float = 10000.0) -> torch.Tensor:
    return 1.0 / base ** (torch.arange(0, dim, 2).float() / dim)


def rope_score(q, k, p, s, inv_freq, layout="interleaved", rotate_k=True):
    """q.k after rotating q at position p and k at position s (vectors [d])."""
    qr = apply_rope(q.view(1, 1, 1, -1), torch.tensor([p]), inv_freq, layout)
    kr = apply_rope(k.view(1, 1, 1, -1), torch.tensor([s]), inv_freq, layout) if rotate_k else k
    return float((qr.flatten() * kr.flatten()).sum())


# ---------------------------------------------------------------- seeds' hand computations


def test_seed_hand_example_90_degrees_gives_score_2():
    # seed 004, section 5: q=[1,2], k=[3,4], 90 degrees per step, m=1, n=2 -> 2, and shifting by 10 keeps 2
    q, k, quarter_turn = (
        torch.tensor([1.0, 2.0]),
        torch.tensor([3.0, 4.0]),
        torch.tensor([math.pi / 2]),
    )
    assert rope_score(q, k, 1, 2, quarter_turn) == pytest.approx(2.0, abs=1e-4)
    assert rope_score(q, k, 11, 12, quarter_turn) == pytest.approx(2.0, abs=1e-4)
    # negative control: rotating only q gives a different number (R(90)q . k = -2*3 + 1*4 = -2)
    assert rope_score(q, k, 1, 2, quarter_turn, rotate_k=False) == pytest.approx(-2.0, abs=1e-4)


def test_seed_hand_example_relative_form_minus_one():
    # seed 000, section 08: q=k=[1,0], theta=pi/2, p=1, s=3 -> -1; shifted to (5, 7) -> still -1
    q = k = torch.tensor([1.0, 0.0])
    theta = torch.tensor([math.pi / 2])
    assert rope_score(q, k, 1, 3, theta) == pytest.approx(-1.0, abs=1e-4)
    assert rope_score(q, k, 5, 7, theta) == pytest.approx(-1.0, abs=1e-4)
    # seed 000, exercise 17: theta = pi/3, (1,2) == (5,6) but (5,7) differs
    q, k, theta = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0]), torch.tensor([math.pi / 3])
    assert rope_score(q, k, 1, 2, theta) == pytest.approx(rope_score(q, k, 5, 6, theta), abs=1e-4)
    assert abs(rope_score(q, k, 5, 7, theta) - rope_score(q, k, 5, 6, theta)) > 0.5


def test_seed_two_token_attention_output():
    # seed 004, section 6: q0=q1=k0=k1=[1,0], v0=[10,0], v1=[0,20], 90 degrees per step
    qk = torch.tensor([[1.0, 0.0], [1.0, 0.0]]).view(1, 1, 2, 2)
    v = torch.tensor([[10.0, 0.0], [0.0, 20.0]]).view(1, 1, 2, 2)
    theta = torch.tensor([math.pi / 2])
    q_rot = apply_rope(qk, torch.arange(2), theta)
    k_rot = apply_rope(qk, torch.arange(2), theta)
    out = torch.nn.functional.scaled_dot_product_attention(q_rot, k_rot, v, is_causal=True)
    assert out[0, 0, 1].tolist() == pytest.approx([3.3024, 13.3952], abs=1e-3)
    # negative control: rotating V as well (not standard RoPE) changes the answer
    v_rot = apply_rope(v, torch.arange(2), theta)
    wrong = torch.nn.functional.scaled_dot_product_attention(q_rot, k_rot, v_rot, is_causal=True)
    assert not torch.allclose(wrong[0, 0, 1], out[0, 0, 1], atol=1e-2)


# ---------------------------------------------------------------- independent implementations


def test_half_layout_matches_transformers_apply_rotary_pos_emb():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(0)
    n, h, length, d = 2, 3, 17, 16
    q, k = torch.randn(n, h, length, d), torch.randn(n, h, length, d)
    positions = torch.randint(0, 5000, (n, length))
    inv_freq = default_inv_freq(d)
    freqs = positions.float()[..., None] * inv_freq  # [N, L, d/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
    torch.testing.assert_close(apply_rope(q, positions, inv_freq, "half"), q_ref)
    torch.testing.assert_close(apply_rope(k, positions, inv_freq, "half"), k_ref)
    # negative control: the interleaved layout is a different rotation on the same weights
    assert not torch.allclose(apply_rope(q, positions, inv_freq, "interleaved"), q_ref, atol=1e-3)


def test_interleaved_layout_matches_complex_multiplication():
    torch.manual_seed(1)
    n, h, length, d = 2, 2, 11, 8
    x = torch.randn(n, h, length, d, dtype=torch.float64).float()
    positions = torch.arange(length)
    inv_freq = default_inv_freq(d)
    rotors = torch.polar(torch.ones(length, d // 2), positions[:, None].float() * inv_freq)
    x_complex = torch.view_as_complex(x.reshape(n, h, length, d // 2, 2))
    expected = torch.view_as_real(x_complex * rotors).flatten(-2)
    torch.testing.assert_close(apply_rope(x, positions, inv_freq, "interleaved"), expected)
    assert not torch.allclose(apply_rope(x, positions, inv_freq, "half"), expected, atol=1e-3)


def test_partial_rope_passes_the_remaining_channels_through():
    x = torch.randn(1, 2, 5, 16)
    inv_freq = default_inv_freq(8)  # rotary dim 8 of 16
    out = apply_rope(x, torch.arange(5) + 3, inv_freq, "half")
    torch.testing.assert_close(out[..., 8:], x[..., 8:])
    assert not torch.allclose(out[..., :8], x[..., :8])


# ---------------------------------------------------------------- seeds' debugging path


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rotation_preserves_norm_and_position_zero_is_identity(layout):
    x = torch.randn(2, 2, 9, 32)
    inv_freq = default_inv_freq(32)
    rotated = apply_rope(x, torch.arange(100, 109), inv_freq, layout)
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(apply_rope(x, torch.zeros(9, dtype=torch.long), inv_freq, layout), x)
    # negative control: a scaled rotation (attention_factor != 1) does not preserve the norm
    assert not torch.allclose(
        apply_rope(x, torch.arange(9), inv_freq, layout, attention_factor=1.1).norm(dim=-1),
        x.norm(dim=-1),
    )


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_common_shift_keeps_scores_and_key_move_changes_them(layout):
    torch.manual_seed(2)
    q, k = torch.randn(64), torch.randn(64)
    inv_freq = default_inv_freq(64)
    base = rope_score(q, k, 7, 3, inv_freq, layout)
    for delta in (1, 100, 4096):
        assert rope_score(q, k, 7 + delta, 3 + delta, inv_freq, layout) == pytest.approx(
            base, abs=1e-3
        )
    assert (
        abs(rope_score(q, k, 7, 4, inv_freq, layout) - base) > 1e-2
    )  # moving only the key matters
    # negative control: rotating only Q breaks the common-shift invariance
    only_q = rope_score(q, k, 7, 3, inv_freq, layout, rotate_k=False)
    assert abs(rope_score(q, k, 107, 103, inv_freq, layout, rotate_k=False) - only_q) > 1e-2


def test_long_position_angles_stay_accurate_in_bf16():
    inv_freq = default_inv_freq(64)
    positions = torch.arange(60000, 60016)
    x = torch.randn(1, 1, 16, 64, dtype=torch.float64)
    exact_angles = positions.double()[:, None] * inv_freq.double()
    exact = torch.view_as_real(
        torch.view_as_complex(x.reshape(1, 1, 16, 32, 2).contiguous())
        * torch.polar(torch.ones_like(exact_angles), exact_angles)
    ).flatten(-2)
    ours = apply_rope(x.to(torch.bfloat16), positions, inv_freq, "interleaved").double()
    ours_error = (ours - exact).abs().max().item()
    assert ours_error < 0.05  # bf16 storage of the output is the only rounding left
    # negative control: angles formed from bf16 positions are badly wrong at long positions
    assert torch.tensor(1995.0, dtype=torch.bfloat16).item() == 1992.0  # spacing 8 above 1024
    bad_cos, bad_sin = rope_cos_sin(positions.to(torch.bfloat16), inv_freq)
    good_cos, _ = rope_cos_sin(positions, inv_freq)
    assert (bad_cos - good_cos).abs().max() > 0.5


# ---------------------------------------------------------------- ALiBi, sinusoidal, learned, padding


def paper_alibi_slopes(n):
    """The recursive form from the ALiBi authors' code, as an independent oracle."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_alibi_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("n_heads", [1, 2, 3, 4, 5, 6, 8, 12, 16, 24])
def test_alibi_slopes_match_the_papers_code(n_heads):
    torch.testing.assert_close(alibi_slopes(n_heads), torch.tensor(paper_alibi_slopes(n_heads)))


def test_alibi_slopes_for_eight_heads_are_halvings():
    assert alibi_slopes(8).tolist() == pytest.approx([2.0 ** -(i + 1) for i in range(8)])
    # negative control: the power-of-two formula naively applied to 6 heads differs from the paper's rule
    naive = torch.tensor([2 ** (-8 / 6) ** 1] + [(2 ** (-8 / 6)) ** (i + 1) for i in range(1, 6)])
    assert not torch.allclose(alibi_slopes(6), naive)


def test_sinusoidal_layout_even_sin_odd_cos():
    table = sinusoidal_embedding(torch.arange(5), sinusoidal_inv_freq(8, 10000.0))  # [5, 8]
    p, i = 3, 1
    w = 10000.0 ** (-2 * i / 8)
    assert table[p, 2 * i].item() == pytest.approx(math.sin(p * w), abs=1e-6)
    assert table[p, 2 * i + 1].item() == pytest.approx(math.cos(p * w), abs=1e-6)
    assert table[0, 0::2].abs().max() == 0 and torch.all(table[0, 1::2] == 1)


def test_learned_lookup_boundary_and_policies():
    table = torch.randn(8, 4)
    torch.testing.assert_close(learned_lookup(table, torch.arange(8), "error"), table)
    with pytest.raises(ValueError, match="max_positions=8"):
        learned_lookup(table, torch.arange(9), "error")
    torch.testing.assert_close(learned_lookup(table, torch.tensor([12]), "clamp")[0], table[7])
    midway = learned_lookup(table, torch.tensor([2.5]), "error")[0]
    torch.testing.assert_close(midway, (table[2] + table[3]) / 2)


def test_position_ids_from_attention_mask_left_and_right_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    assert position_ids_from_attention_mask(mask).tolist() == [
        [0, 0, 0, 1, 2],
        [0, 1, 2, 0, 0],
        [0, 1, 2, 3, 4],
    ]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kind": "fourier"}, "'fourier' is unknown"),
        ({"kind": "rope", "layout": "diagonal"}, "'diagonal' is unknown"),
        ({"kind": "rope", "rotary_fraction": 0.3}, "even rotary dimension"),
        ({"kind": "learned", "out_of_range": "modulo"}, "'modulo' is unknown"),
    ],
)
def test_position_config_errors_name_the_bad_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PositionConfig(**kwargs).validate(head_dim=10, d_model=40)
