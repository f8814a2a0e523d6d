"""CoPE (models/families/cope.py, ``position=cope``) against x-transformers' CoPE module and a direct,
entry-by-entry evaluation of the paper's formula; tiling, the contextual path, gradients through
the gates, position interpolation and its fields. Cache, padding, shift invariance and every metric:
tests/models/test_zoo.py (CoPE is one of its families).
"""

from __future__ import annotations

import math

import pytest
import torch

import models.flex as flex
import models.tiled_attention as tiled_attention
from models.attention_inputs import AttentionInputs, fused_plain
from models.families.cope import _cope, cope_positions
from models.flex import use_flex
from models.positions import PositionConfig
from models.scaling import applicable_methods
from models.tiled_attention import attend_tiled
from models.transformer import DecoderLM, ModelConfig, ScalingConfig

N, H, T, D = 2, 3, 9, 8
SCALE = 1 / math.sqrt(D)


def causal_logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """[N, H, T, T] scaled q . k with -inf above the diagonal."""
    logits = torch.einsum("nhtd,nhsd->nhts", q, k) * SCALE
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    return logits.masked_fill(future, float("-inf"))


def random_qk(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, H, T, D, generator=g) * 2, torch.randn(N, H, T, D, generator=g) * 2


@pytest.mark.parametrize("npos_max", [4, 16])
def test_cope_term_equals_x_transformers(npos_max):
    """x-transformers' CoPE adds q . e[p] to its logits; ours adds scale q . e[p] as the paper's
    reference code does (its logits are (q . k + q . e) / sqrt(d)), so its query is scale q.
    npos_max 4 caps the counts (rows of 9 keys), 16 does not."""
    from x_transformers.x_transformers import CoPE

    q, k = random_qk()
    logits = causal_logits(q, k)
    emb = torch.randn(2, npos_max, D)  # [layers, npos_max, d]
    oracle = CoPE(dim=D, heads=H, max_pos=npos_max)
    with torch.no_grad():
        oracle.pos_emb.copy_(emb[1])
        expected = oracle(q * SCALE, logits)
        got = _cope(1, q, logits, SCALE, emb, 1.0, npos_max)
    visible = torch.isfinite(logits)
    torch.testing.assert_close(got[visible], expected[visible], atol=1e-6, rtol=1e-6)
    # negative controls: another layer's table, a perturbed entry of this one
    assert not torch.allclose(
        _cope(0, q, logits, SCALE, emb, 1.0, npos_max)[visible], expected[visible]
    )
    emb[1, 1] += 0.5
    assert not torch.allclose(
        _cope(1, q, logits, SCALE, emb, 1.0, npos_max)[visible], expected[visible]
    )


def direct_cope_attention(q, k, v, emb, npos_max):
    """softmax_j(scale (q_i . k_j + q_i . e[p_ij])) v_j with p_ij = min(sum_{t=j..i} sigma(scale
    q_i . k_t), npos_max - 1), e interpolated linearly: entry by entry, in float64."""
    q, k, v, emb = (t.double() for t in (q, k, v, emb))
    out = torch.zeros_like(q)
    for n in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                gates = [torch.sigmoid(SCALE * q[n, h, i] @ k[n, h, t]) for t in range(i + 1)]
                logits = []
                for j in range(i + 1):
                    p = min(float(sum(gates[j : i + 1])), npos_max - 1)
                    lo, w = math.floor(p), p - math.floor(p)
                    e = (1 - w) * emb[lo] + w * emb[math.ceil(p)]
                    logits.append(SCALE * (q[n, h, i] @ k[n, h, j] + q[n, h, i] @ e))
                probs = torch.softmax(torch.stack(logits), dim=0)
                out[n, h, i] = probs @ v[n, h, : i + 1]
    return out.float()


def _inputs(contextual) -> AttentionInputs:
    pos = torch.arange(T).expand(N, T)
    return AttentionInputs(
        cos=None, sin=None, layout="half", score_bias=None, q_scale=None, q_pos=pos, k_pos=pos,
        k_valid=None, past_len=0, scale=SCALE, want_entropy=False, contextual_bias=contextual,
    )  # fmt: skip


@pytest.mark.parametrize(
    "tile_elements", [1 << 24, N * H * T * 2 * tiled_attention.CONTEXTUAL_TEMPORARIES]
)
def test_tiled_attention_equals_the_entry_by_entry_formula(monkeypatch, tile_elements):
    """The whole contextual path (gates, counts, interpolation, softmax) in one query tile and in
    tiles of 2 queries; control: without the CoPE term the output differs."""
    monkeypatch.setattr(tiled_attention, "ATTENTION_TILE_ELEMENTS", tile_elements)
    model = DecoderLM(
        ModelConfig(n_layers=2, d_model=H * D, n_heads=H),
        PositionConfig(kind="cope", cope_npos_max=6),
        T,
    )
    with torch.no_grad():
        model.cope_emb.copy_(torch.randn_like(model.cope_emb))
    q, k = random_qk(1)
    v = torch.randn(N, H, T, D)
    contextual = model.family.contextual_bias(model)
    with torch.no_grad():
        got, _ = attend_tiled(q, k, v, _inputs(contextual), layer=1)
        plain, _ = attend_tiled(q, k, v, _inputs(None), layer=1)
    expected = direct_cope_attention(q, k, v, model.cope_emb[1], 6)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert (plain - expected).abs().max() > 1e-2


def test_cope_never_takes_a_fused_or_flex_kernel(monkeypatch):
    monkeypatch.setattr(flex, "FLEX_ATTENTION", "always")
    q = torch.randn(1, H, T, 16)
    contextual = DecoderLM(
        ModelConfig(n_layers=1, d_model=H * 16, n_heads=H), PositionConfig(kind="cope"), T
    )
    inputs = _inputs(contextual.family.contextual_bias(contextual))
    assert not fused_plain(T, T, inputs) and not use_flex(q, inputs)
    # control: a score bias alone does take flex when it is forced
    biased = _inputs(None)
    biased.score_bias = contextual.family.score_bias(contextual, T) or object()
    assert use_flex(q, biased)


def test_gradients_reach_the_embeddings_and_through_the_gates():
    """The gates get a gradient through the interpolation weight: nonzero when the embedding
    varies between integer positions; control: an embedding equal at every position gives the
    gates none (only floor and ceil move, which have no gradient)."""
    q, k = random_qk(2)
    for emb, gate_grad in ((torch.randn(1, 8, D), True), (torch.ones(1, 8, D), False)):
        logits = causal_logits(q, k).requires_grad_(True)
        emb = emb.requires_grad_(True)
        _cope(0, q, logits, SCALE, emb, 1.0, 8).sum().backward()
        assert bool(emb.grad.abs().sum() > 0)
        finite = torch.isfinite(logits.detach())
        assert bool(logits.grad[finite].abs().sum() > 1e-6) is gate_grad
    model = DecoderLM(
        ModelConfig(n_layers=2, d_model=32, n_heads=4), PositionConfig(kind="cope"), 16
    )
    model(torch.randint(0, 250, (2, 12))).logits.logsumexp(-1).mean().backward()
    assert bool(model.cope_emb.grad.abs().sum() > 0)  # zero-initialised, still learns


def test_position_interpolation_divides_the_counted_positions():
    q, k = random_qk(3)
    logits = causal_logits(q, k)
    raw = cope_positions(logits, 1.0, 1000)
    torch.testing.assert_close(cope_positions(logits, 4.0, 1000), raw / 4)
    assert (cope_positions(logits, 1.0, 3) <= 2).all() and (raw > 2).any()  # the cap, and control
    # p_ii is the query's own gate; the count grows toward the start of the row
    diag = torch.sigmoid(torch.diagonal(logits, dim1=-2, dim2=-1))
    torch.testing.assert_close(torch.diagonal(raw, dim1=-2, dim2=-1), diag)
    assert bool((raw[..., :-1, :-1].diff(dim=-1) <= 1e-6).all())
    model = DecoderLM(
        ModelConfig(n_layers=1, d_model=32, n_heads=4), PositionConfig(kind="cope"), 16
    )
    with model.scaled(ScalingConfig(name="linear", method="linear", params={"factor": 4.0})):
        assert model.family.contextual_bias(model).args[1] == 4.0
    assert model.family.contextual_bias(model).args[1] == 1.0


def test_position_interpolation_changes_a_trained_copes_logits(monkeypatch):
    """Issue #75: ``position=cope scaling=linear`` is CoPE with its counted positions divided by
    the factor, not raw CoPE: once the table has learned (ten steps), linear at 4x its
    training length gives other logits than raw, the logits raw CoPE gives with its counts
    divided by 4. Control: at initialisation the table is zero, no position can matter yet, and
    every scaling gives the raw logits (the difference 0.0 the issue saw)."""
    import models.families.cope as cope

    torch.manual_seed(0)
    model = DecoderLM(
        ModelConfig(n_layers=2, d_model=32, n_heads=4), PositionConfig(kind="cope"), 16
    )
    ids = torch.randint(0, 250, (2, 64), generator=torch.Generator().manual_seed(1))
    linear = ScalingConfig(name="linear", method="linear", params={"factor": 4.0})

    def both() -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            raw = model(ids).logits
            with model.scaled(linear):
                return raw, model(ids).logits

    raw, scaled = both()
    assert not model.cope_emb.any() and torch.equal(raw, scaled)  # control: nothing learned yet
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(10):
        batch = torch.randint(0, 250, (4, 17), generator=torch.Generator().manual_seed(10 + step))
        logits = model(batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    raw, scaled = both()
    assert model.cope_emb.abs().max() > 1e-3
    assert float((scaled - raw).abs().max()) > 1e-4  # rows labelled linear are not raw CoPE
    counted = cope.cope_positions
    monkeypatch.setattr(
        cope, "cope_positions", lambda logits, factor, npos: counted(logits, factor * 4.0, npos)
    )
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, scaled)  # raw with counts / 4 is linear


def test_cope_fields_methods_and_bad_values():
    from bench.core.checks import weights_dict

    assert PositionConfig(kind="cope").params() == {"cope_npos_max": 64}
    assert "cope_npos_max" in weights_dict(PositionConfig(kind="cope"))
    assert "cope_npos_max" not in weights_dict(PositionConfig(kind="t5"))
    assert applicable_methods("cope") == ("default", "linear")
    with pytest.raises(ValueError, match=r"position.cope_npos_max must be >= 2, got 1\."):
        DecoderLM(
            ModelConfig(n_layers=1, d_model=32, n_heads=4),
            PositionConfig(kind="cope", cope_npos_max=1),
            16,
        )
