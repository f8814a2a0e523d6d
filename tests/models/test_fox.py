"""``position=fox`` (issue 54 item 1): the Forgetting Transformer (Lin et al., ICLR 2025). Oracle:
x-transformers' ``DataDependentAlibi`` (its forget-gate bias F_i - F_j from the same gate weights),
with softmax attention written out in float64. Controls: with the gate forgetting nothing (a huge
bias) FoX is NoPE; with a gate that forgets, the output differs from NoPE's. A left-padded row
equals the unpadded one; decoding with the KV cache equals full passes."""

from __future__ import annotations

import math

import pytest
import torch

from bench.core.checks import weights_dict
from bench.schema import JobConfig
from models.designs.forget_gate import forget_decay
from models.positions import PositionConfig
from models.scaling import SCALING_METHODS, applicable_methods
from models.transformer import DecoderLM, ModelConfig

from fixtures.decoding import assert_trains_and_decodes, attention_output

x_transformers = pytest.importorskip("x_transformers.x_transformers")

WIDTH, HEADS = 32, 2


def _model(kind: str = "fox", gate_bias: float = 0.0, seed: int = 0) -> DecoderLM:
    """One layer whose logits are of order 1 and whose gate forgets (bias 0: f about 0.5)."""
    torch.manual_seed(seed)
    position = PositionConfig(kind=kind, fox_gate_bias=gate_bias) if kind == "fox" else None
    cfg = ModelConfig(n_layers=1, d_model=WIDTH, n_heads=HEADS)
    model = DecoderLM(cfg, position or PositionConfig(kind=kind), 16).eval()
    with torch.no_grad():
        model.blocks[0].attn.q_proj.weight.normal_(0.0, 0.5)
        model.blocks[0].attn.kv_proj.weight.normal_(0.0, 0.5)
        if hasattr(model.blocks[0].attn, "fgate"):  # the forget gate design attached it
            model.blocks[0].attn.fgate.weight.normal_(0.0, 0.5)
    return model


def _oracle_bias(model: DecoderLM, x: torch.Tensor) -> torch.Tensor:
    """x-transformers' DataDependentAlibi with our layer's gate weights: [N, H, L, L] float64."""
    gate = model.blocks[0].attn.fgate
    alibi = x_transformers.DataDependentAlibi(WIDTH, HEADS, causal=True).double()
    with torch.no_grad():
        alibi.to_forget_gates[0].weight.copy_(gate.weight)
        alibi.to_forget_gates[0].bias.copy_(gate.bias)
        return alibi(x.double())


def _reference(model: DecoderLM, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """float64 softmax(q.k / sqrt(d) + bias) V over the causal keys, then the output projection."""
    attn = model.blocks[0].attn
    d = WIDTH // HEADS
    x64 = x.double()
    q = (x64 @ attn.q_proj.weight.double().T).view(*x.shape[:2], HEADS, d).transpose(1, 2)
    kv = (x64 @ attn.kv_proj.weight.double().T).view(*x.shape[:2], 2, HEADS, d)
    k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
    length = x.shape[1]
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(d) + bias
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    probs = logits.masked_fill(~causal, float("-inf")).softmax(-1)
    out = (probs @ v).transpose(1, 2).reshape(*x.shape[:2], WIDTH)
    return out @ attn.o_proj.weight.double().T


def test_fox_equals_x_transformers_data_dependent_alibi():
    x = torch.randn(2, 24, WIDTH, generator=torch.Generator().manual_seed(3))
    model = _model()
    bias = _oracle_bias(model, x)
    # the decay itself: F_i - F_j of our running sums equals the oracle's bias below the diagonal
    inputs = model._attention_inputs(model._positions(x[..., 0].long(), None, None, None), False)
    with torch.no_grad():
        running = forget_decay(model.blocks[0].attn, x, inputs, None).double()  # [N, H, L]
    ours_bias = running[..., :, None] - running[..., None, :]
    causal = torch.ones(24, 24, dtype=torch.bool).tril()
    torch.testing.assert_close(ours_bias[..., causal], bias[..., causal], atol=1e-5, rtol=1e-5)
    assert bias[..., causal].min() < -5  # the gate forgets: far pairs are pushed well down
    torch.testing.assert_close(
        attention_output(model, x).double(), _reference(model, x, bias), atol=1e-5, rtol=1e-4
    )


def test_a_gate_that_forgets_nothing_is_nope_and_one_that_forgets_is_not():
    """Controls: the same weights as a NoPE layer, with the gate bias at 50 (log f about -2e-22)
    the outputs agree; at 0 (f about 0.5) they differ."""
    x = torch.randn(1, 20, WIDTH, generator=torch.Generator().manual_seed(4))
    nope = _model("nope", seed=7)
    for bias, same in ((50.0, True), (0.0, False)):
        fox = _model("fox", gate_bias=bias, seed=7)
        fox.load_state_dict(nope.state_dict(), strict=False)  # the gate keeps its own init
        gap = (attention_output(fox, x) - attention_output(nope, x)).abs().max()
        assert (gap < 1e-5) == same, (bias, float(gap))


def test_gate_bias_starts_where_the_config_says_and_enters_only_fox_keys():
    model = DecoderLM(
        ModelConfig(n_layers=2, d_model=WIDTH, n_heads=HEADS), PositionConfig(kind="fox"), 16
    )
    for block in model.blocks:
        assert torch.equal(block.attn.fgate.bias.detach(), torch.full((HEADS,), 5.0))
    assert weights_dict(PositionConfig(kind="fox"))["fox_gate_bias"] == 5.0
    assert "fox_gate_bias" not in weights_dict(PositionConfig(kind="nope"))
    rope = DecoderLM(ModelConfig(n_layers=1, d_model=WIDTH, n_heads=HEADS), PositionConfig(), 16)
    assert not hasattr(rope.blocks[0].attn, "fgate")


def test_a_left_padded_row_equals_the_unpadded_one():
    model = _model()
    tokens = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(2))
    padded = torch.cat((torch.zeros(1, 3, dtype=torch.long), tokens), dim=1)
    mask = torch.cat((torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 10, dtype=torch.long)), 1)
    with torch.no_grad():
        alone = model(tokens).logits
        within = model(padded, attention_mask=mask).logits[:, 3:]
    torch.testing.assert_close(alone, within, atol=1e-5, rtol=1e-4)


def test_fox_trains_and_decodes_with_the_cache():
    model = assert_trains_and_decodes("fox", lambda attn: [attn.fgate.weight, attn.fgate.bias])
    tokens = torch.randint(0, 256, (2, 14), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        full = model(tokens).logits
        out = model(tokens[:, :9], use_cache=True)
        steps = [out.logits]
        for t in range(9, 14):
            out = model(tokens[:, t : t + 1], past=out.past, use_cache=True)
            steps.append(out.logits)
    assert out.past.layers[0][2].shape == (2, 2, 14)  # the keys' F beside k and v
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)


def test_fox_offers_only_the_methods_nope_does_and_checks_its_bias():
    assert set(applicable_methods("fox")) == set(applicable_methods("nope"))
    assert set(applicable_methods("fox")) < set(SCALING_METHODS)
    with pytest.raises(
        ValueError, match=r"^position\.fox_gate_bias must be a finite number, got inf\.$"
    ):
        PositionConfig(kind="fox", fox_gate_bias=float("inf")).validate(16, 32)
    with pytest.raises(
        ValueError, match=r"position\.fox_gate_bias=1\.0 means nothing for position=rope"
    ):
        JobConfig.from_hydra({"position": {"kind": "rope", "fox_gate_bias": 1.0}})
