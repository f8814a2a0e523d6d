"""``model.attn_scale=ssmax`` (issue 54 item 5): Scalable-Softmax (Nakanishi 2025), each query times
s_h ln n with n the real keys it sees and s_h learned per head and layer, in training and
evaluation. Reference: a float64 transcription of softmax(s_h ln(n_i) q_i.k_j / sqrt(d)); controls:
without SSMax, and with n counted over padding, the numbers differ. A left-padded row equals the
unpadded one; every family trains and decodes with the KV cache as a full pass does."""

from __future__ import annotations

import math

import pytest
import torch

from bench.core.checks import weights_dict
from bench.schema import JobConfig
from models.designs.ssmax import SSMAX_INIT
from models.positions import PositionConfig, families
from models.transformer import DecoderLM, ModelConfig

from fixtures.decoding import assert_trains_and_decodes, attention_output

WIDTH, HEADS = 32, 2


def _model(attn_scale: str = "ssmax") -> DecoderLM:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=1, d_model=WIDTH, n_heads=HEADS, attn_scale=attn_scale)
    model = DecoderLM(cfg, PositionConfig(kind="nope"), 16).eval()
    with torch.no_grad():  # logits of order 1 (at init they are tiny), so that scales show
        model.blocks[0].attn.q_proj.weight.normal_(0.0, 0.5)
        model.blocks[0].attn.kv_proj.weight.normal_(0.0, 0.5)
    if attn_scale == "ssmax":
        with torch.no_grad():
            model.blocks[0].attn.ssmax.copy_(torch.tensor([0.43, 0.9]))  # a different s per head
    return model


def _reference(model: DecoderLM, x: torch.Tensor, valid: torch.Tensor, count_padding: bool):
    """float64 softmax(s_h ln(n_i) q_i.k_j / sqrt(d)) V over the real causal keys (NoPE)."""
    attn = model.blocks[0].attn
    d = WIDTH // HEADS
    x64 = x.double()
    q = (x64 @ attn.q_proj.weight.double().T).view(*x.shape[:2], HEADS, d).transpose(1, 2)
    kv = (x64 @ attn.kv_proj.weight.double().T).view(*x.shape[:2], 2, HEADS, d)
    k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
    length = x.shape[1]
    seen = (
        torch.arange(1, length + 1).expand(x.shape[0], length) if count_padding else valid.cumsum(1)
    )
    factor = attn.ssmax.double()[None, :, None] * seen.clamp(min=1).double().log()[:, None, :]
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(d) * factor[..., None]
    allowed = torch.ones(length, length, dtype=torch.bool).tril()[None, None] & valid[:, None, None]
    probs = logits.masked_fill(~allowed, float("-inf")).softmax(-1)
    out = (probs @ v).transpose(1, 2).reshape(*x.shape[:2], WIDTH)
    return out @ attn.o_proj.weight.double().T


def test_ssmax_equals_its_formula_and_counts_only_real_keys():
    x = torch.randn(2, 12, WIDTH, generator=torch.Generator().manual_seed(5))
    valid = torch.ones(2, 12, dtype=torch.bool)
    valid[1, :3] = False  # row 1 left-padded by 3
    model = _model()
    ours = attention_output(model, x, valid=valid).double()
    expected = _reference(model, x, valid, count_padding=False)
    real = valid[:, :, None].expand_as(ours)
    torch.testing.assert_close(ours[real], expected[real], atol=1e-5, rtol=1e-4)
    # controls: n counted over the padding, and no SSMax at all, give other numbers
    miscounted = _reference(model, x, valid, count_padding=True)
    assert (ours[1, 3:] - miscounted[1, 3:]).abs().max() > 1e-3
    plain = attention_output(_model("none"), x, valid=valid).double()
    assert (plain[real] - ours[real]).abs().max() > 1e-3


def test_a_left_padded_row_equals_the_unpadded_one():
    model = _model()
    tokens = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(2))
    padded = torch.cat((torch.zeros(1, 3, dtype=torch.long), tokens), dim=1)
    mask = torch.cat((torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 10, dtype=torch.long)), 1)
    with torch.no_grad():
        alone = model(tokens).logits
        within = model(padded, attention_mask=mask).logits[:, 3:]
    torch.testing.assert_close(alone, within, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", sorted(families()))
def test_every_family_trains_and_decodes_with_ssmax(kind):
    model = assert_trains_and_decodes(kind, lambda attn: [attn.ssmax], attn_scale="ssmax")
    assert torch.equal(model.blocks[0].attn.ssmax.detach(), torch.full((2,), SSMAX_INIT))


def test_attn_scale_in_the_key_only_when_set_and_an_unknown_one_refused():
    assert "attn_scale" not in weights_dict(ModelConfig())
    assert weights_dict(ModelConfig(attn_scale="ssmax"))["attn_scale"] == "ssmax"
    with pytest.raises(
        ValueError, match=r"^model\.attn_scale 'bogus' is unknown; allowed: none, ssmax, llama4\.$"
    ):
        JobConfig.from_hydra({"model": {"attn_scale": "bogus"}})


# ----------------------------------------------------------- issue 76 item 2: the keys attended


def _one_layer(kind: str, attn_scale: str = "ssmax", **position) -> DecoderLM:
    """One layer of ``kind`` (its fields ``position``), weights large enough that n shows."""
    torch.manual_seed(3)
    cfg = ModelConfig(vocab_size=40, n_layers=1, d_model=32, n_heads=4, attn_scale=attn_scale)
    model = DecoderLM(cfg, PositionConfig(kind=kind, **position), 32).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(4.0)
        if attn_scale == "ssmax":
            model.blocks[0].attn.ssmax.copy_(torch.tensor([0.43, 0.9, 0.6, 1.2]))
    return model


IDS = torch.randint(0, 40, (2, 40), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("kind", ["rope", "nope", "alibi"])
def test_ssmax_under_streaming_counts_the_cache_a_dense_model_reads(kind):
    """StreamingLLM keeps 3 sinks + a window of 9: the last of 40 tokens under SSMax equals the
    dense model reading only those 12 tokens (n = 12, not the 40 keys seen), in a prefill and
    token by token. Control: the same comparison without SSMax holds too, and n = 40 (the old
    count: every key seen) gives other logits."""
    from models.scaling_config import ScalingConfig

    from fixtures.decoding import scaled_decoded, scaled_logits

    sinks, window, length = 3, 9, IDS.shape[1]
    scaling = ScalingConfig("streaming", "streaming", {"sink_tokens": sinks, "window": window})
    kept = list(range(sinks)) + list(range(length - window, length))
    for attn_scale in ("ssmax", "none"):
        model = _one_layer(kind, attn_scale)
        with torch.no_grad():
            last = scaled_logits(model, IDS, scaling)[:, -1]
            decoded = scaled_decoded(model, IDS, scaling, prefill=5)[:, -1]
            dense = model(IDS[:, kept]).logits[:, -1]
        torch.testing.assert_close(last, dense, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(decoded, dense, atol=1e-4, rtol=1e-4)
    model = _one_layer(kind)
    with torch.no_grad():  # s_h ln 40 in place of s_h ln 12: what the old count gave
        model.blocks[0].attn.ssmax.mul_(math.log(length) / math.log(sinks + window))
        miscounted = model(IDS[:, kept]).logits[:, -1]
    assert (miscounted - last).abs().max() > 1e-2


@pytest.mark.parametrize(
    ("kind", "span", "first"),
    [("rnope_swa", {"window": 8}, 32), ("irope", {"chunk": 8}, 32)],
    ids=["window", "chunk"],
)
def test_ssmax_on_a_windowed_or_chunked_layer_counts_the_keys_in_its_span(kind, span, first):
    """A sliding-window (rnope_swa) or chunked (irope) layer under SSMax: the last of 40 tokens
    (position 39: window 32..39, chunk 32..39) equals the same weights with full causal attention
    (layer kind rope) reading only the span's 8 tokens; the KV cache decodes the same. Control:
    the full-attention layer on all 40 tokens differs (it sees more keys and counts them)."""
    spanned = _one_layer(kind, layers=["swa" if kind == "rnope_swa" else "chunked"], **span)
    full = _one_layer(kind, layers=["rope"], **span)
    full.load_state_dict(spanned.state_dict())
    with torch.no_grad():
        last = spanned(IDS).logits[:, -1]
        dense = full(IDS[:, first:]).logits[:, -1]
        out = spanned(IDS[:, :30], use_cache=True)
        past = out.past
        for t in range(30, IDS.shape[1]):
            out = spanned(IDS[:, t : t + 1], past=past, use_cache=True)
            past = out.past
        everything = full(IDS).logits[:, -1]
    torch.testing.assert_close(last, dense, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.logits[:, -1], dense, atol=1e-4, rtol=1e-4)
    assert (everything - dense).abs().max() > 1e-2
