"""``model.attention`` (issue 54 items 4 and 8): stick-breaking attention (Tan et al., ICLR 2025)
and the Differential Transformer (Ye et al., ICLR 2025). Oracles: float64 transcriptions, the
stick-breaking weights as explicit products beta_ij prod_{j<k<i} (1 - beta_ik) (no log space, no
cumulative sums), the differential layer as the official ``MultiheadDiffAttn`` forward (microsoft/
unilm Diff-Transformer) with our weights. Controls: a softmax model, and stick-breaking with the
query's own key taking part, give other numbers. Both decode with the KV cache as full passes do."""

from __future__ import annotations

import math

import pytest
import torch

from bench.core.checks import weights_dict
from bench.schema import JobConfig
from models.designs.differential import differential_lambda_init
from models.positions import PositionConfig
from models.tiled_attention import stick_breaking_weights
from models.transformer import DecoderLM, ModelConfig

from fixtures.decoding import assert_trains_and_decodes, attention_output

WIDTH, HEADS = 32, 4
D = WIDTH // HEADS


def _model(attention: str, layers: int = 1, seed: int = 0) -> DecoderLM:
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layers=layers, d_model=WIDTH, n_heads=HEADS, attention=attention)
    model = DecoderLM(cfg, PositionConfig(kind="nope"), 16).eval()
    with torch.no_grad():  # logits of order 1, so that the maps are far from uniform
        for block in model.blocks:
            block.attn.q_proj.weight.normal_(0.0, 0.5)
            block.attn.kv_proj.weight.normal_(0.0, 0.5)
    return model


def _projections(attn, x: torch.Tensor):
    """q, k [N, H, L, d] and v [N, L, H * d] in float64, as the layer projects them."""
    x64 = x.double()
    q = (x64 @ attn.q_proj.weight.double().T).view(*x.shape[:2], HEADS, D).transpose(1, 2)
    kv = (x64 @ attn.kv_proj.weight.double().T).view(*x.shape[:2], 2, HEADS * D)
    k = kv[:, :, 0].view(*x.shape[:2], HEADS, D).transpose(1, 2)
    return q, k, kv[:, :, 1]


# --------------------------------------------------------------------------- stick-breaking


def _stick_breaking_reference(z: torch.Tensor, attend_current: bool) -> torch.Tensor:
    """A [N, H, L, L] from logits z by explicit products, float64."""
    n, h, length, _ = z.shape
    beta = torch.sigmoid(z)
    out = torch.zeros_like(z)
    for i in range(length):
        last = i if attend_current else i - 1
        for j in range(last + 1):
            rest = torch.ones(n, h, dtype=z.dtype)
            for k in range(j + 1, last + 1):
                rest = rest * (1 - beta[:, :, i, k])
            out[:, :, i, j] = beta[:, :, i, j] * rest
    return out


def test_stick_breaking_equals_its_products_and_leaves_the_query_out():
    x = torch.randn(2, 10, WIDTH, generator=torch.Generator().manual_seed(3))
    model = _model("stick_breaking")
    attn = model.blocks[0].attn
    q, k, v = _projections(attn, x)
    z = q @ k.transpose(-1, -2) / math.sqrt(D)
    values = v.view(*x.shape[:2], HEADS, D).transpose(1, 2)

    def output(weights):
        out = (weights @ values).transpose(1, 2).reshape(*x.shape[:2], WIDTH)
        return out @ attn.o_proj.weight.double().T

    expected = output(_stick_breaking_reference(z, attend_current=False))
    ours = attention_output(model, x).double()
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-4)
    # controls: the query's own key taking part, and a softmax over the same logits, differ
    with_self = output(_stick_breaking_reference(z, attend_current=True))
    assert (ours - with_self).abs().max() > 1e-3
    softmax = output(z.masked_fill(torch.ones(10, 10).triu(1).bool(), -math.inf).softmax(-1))
    assert (ours - softmax).abs().max() > 1e-3


def test_the_weights_and_the_leftover_stick_sum_to_one():
    z = torch.randn(1, 2, 5, 7, dtype=torch.float64)
    z[..., 5:] = -math.inf  # masked keys break nothing
    weights, leftover = stick_breaking_weights(z)
    torch.testing.assert_close(
        weights.sum(-1, keepdim=True) + leftover, torch.ones(1, 2, 5, 1, dtype=torch.float64)
    )
    assert torch.equal(weights[..., 5:], torch.zeros(1, 2, 5, 2, dtype=torch.float64))


def test_stick_breaking_trains_decodes_and_is_nope_only():
    torch.manual_seed(0)
    assert_trains_and_decodes("nope", lambda attn: [attn.q_proj.weight], attention="stick_breaking")
    with pytest.raises(
        ValueError, match=r"^model\.attention=stick_breaking does not combine with position=rope"
    ):
        JobConfig.from_hydra({"model": {"attention": "stick_breaking"}})


# --------------------------------------------------------------------------- differential


def _differential_reference(attn, x: torch.Tensor, layer: int) -> torch.Tensor:
    """The official MultiheadDiffAttn forward (NoPE, no cache) in float64 with our weights:
    H / 2 heads, each two maps over d-dim queries and keys and one 2d-dim value."""
    n, length, _ = x.shape
    half = HEADS // 2
    q, k, v = _projections(attn, x)  # q, k: [N, 2 * half, L, d]
    v = v.view(n, length, half, 2 * D).transpose(1, 2)  # [N, half, L, 2d]
    scores = q @ k.transpose(-1, -2) * D**-0.5
    scores = scores.masked_fill(torch.ones(length, length).triu(1).bool(), -math.inf)
    maps = scores.softmax(-1).view(n, half, 2, length, length)
    lq1, lk1, lq2, lk2 = attn.lambdas.double()
    lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer)
    lam = torch.exp((lq1 * lk1).sum()) - torch.exp((lq2 * lk2).sum()) + lambda_init
    out = (maps[:, :, 0] - lam * maps[:, :, 1]) @ v  # [N, half, L, 2d]
    out = (
        out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + 1e-5) * attn.sub_norm.weight.double()
    )
    out = (out * (1 - lambda_init)).transpose(1, 2).reshape(n, length, WIDTH)
    return out @ attn.o_proj.weight.double().T


@pytest.mark.parametrize("layer", [0, 2])
def test_differential_equals_the_official_forward(layer):
    x = torch.randn(2, 12, WIDTH, generator=torch.Generator().manual_seed(4))
    model = _model("differential", layers=3)
    attn = model.blocks[layer].attn
    with torch.no_grad():
        attn.sub_norm.weight.uniform_(0.5, 1.5)  # a norm weight that is not all ones
    assert attn.lambda_init == pytest.approx(differential_lambda_init(layer))
    ours = attention_output(model, x, layer).double()
    torch.testing.assert_close(ours, _differential_reference(attn, x, layer), atol=1e-5, rtol=1e-4)
    # control: the wrong layer's lambda_init changes the output
    assert (ours - _differential_reference(attn, x, layer + 1)).abs().max() > 1e-4


def test_differential_trains_decodes_and_needs_paired_heads():
    torch.manual_seed(0)
    model = assert_trains_and_decodes(
        "rope", lambda attn: [attn.lambdas, attn.sub_norm.weight], attention="differential"
    )
    assert model.blocks[1].attn.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3))
    with pytest.raises(ValueError, match=r"^model\.attention differential pairs heads"):
        JobConfig.from_hydra({"model": {"attention": "differential", "n_heads": 3, "d_model": 48}})


def test_attention_enters_the_key_only_when_set_and_an_unknown_one_is_refused():
    assert "attention" not in weights_dict(ModelConfig())
    assert weights_dict(ModelConfig(attention="differential"))["attention"] == "differential"
    assert ModelConfig(attention="stick_breaking").switches() == {"attention": "stick_breaking"}
    with pytest.raises(
        ValueError,
        match=r"^model\.attention 'sparse' is unknown; allowed: softmax, stick_breaking, differential\.$",
    ):
        JobConfig.from_hydra({"model": {"attention": "sparse"}})
