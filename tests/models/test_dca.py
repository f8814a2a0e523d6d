"""Dual Chunk Attention (``scaling=dca``, issue #54 item 9) against a transcription of its reference
code (HKUNLP/ChunkLlama ``chunkllama_attn_replace.py``: ``ChunkLlamaRotaryEmbedding`` and the
prefill branch of ``forward``, flash attention written out as a softmax with its log-sum-exp, and
``merge_attn_outputs``), in float64 on a copy of our model; with negative controls."""

from __future__ import annotations

import pytest
import torch

from models.positions import PositionConfig
from models.scaling import default_inv_freq, pair_positions
from models.scaling_config import ScalingConfig
from models.transformer import DecoderLM, ModelConfig

from fixtures.decoding import logits_with_attention, scaled_decoded, scaled_logits

TRAIN = 32
IDS = torch.randint(0, 40, (2, 90), generator=torch.Generator().manual_seed(3))


def _model(seed: int = 0) -> DecoderLM:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=40, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2)
    model = DecoderLM(cfg, PositionConfig(kind="rope"), TRAIN).eval()
    for param in model.parameters():  # larger weights: position differences show in the logits
        param.data.mul_(4.0)
    return model


def _rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2 :], x[..., : x.shape[-1] // 2]), dim=-1)


def _rope(x, positions, inv_freq):
    """transformers' apply_rotary_pos_emb at ``positions`` (float64), rotate_half layout."""
    angles = positions[:, None] * inv_freq[None]  # [L, d/2]
    emb = torch.cat((angles, angles), dim=-1)
    return x * emb.cos() + _rotate_half(x) * emb.sin()


def _flash(q, k, v, causal):
    """flash_attn_func(..., causal, return_attn_probs=True)'s output and softmax_lse."""
    logits = torch.einsum("hid,hjd->hij", q, k) / q.shape[-1] ** 0.5
    if causal:
        mask = torch.ones(logits.shape[-2:], dtype=torch.bool).tril()
        logits = logits.masked_fill(~mask, float("-inf"))
    return torch.einsum("hij,hjd->hid", logits.softmax(-1), v), logits.logsumexp(-1)


def _merge(results):
    """merge_attn_outputs: each chunk's partial outputs weighted by softmax over their lse."""
    outputs = [results[0][0]]
    for per_chunk in results[1:]:
        out = torch.stack([o for o, _ in per_chunk])
        weights = torch.stack([lse for _, lse in per_chunk]).softmax(dim=0)
        outputs.append((out * weights[..., None]).sum(dim=0))
    return torch.cat(outputs, dim=1)


def chunkllama_attention(q, k, v, chunk_size, local_window, inv_freq):
    """The reference's prefill: q, k, v [H, L, d] unrotated; its rotary tables with scaling
    factor 1 and mscale 1 (the repo scales cos and sin by YaRN's mscale past L; lenbench does not)."""
    chunk_len = chunk_size - local_window
    length = q.shape[1]
    idx = torch.arange(length, dtype=torch.float64)
    q_t = idx % chunk_len  # q_cos[position_ids % chunk_len]
    qc_t = (idx % chunk_len + chunk_len).clamp(max=chunk_size)
    inter_t = torch.full_like(idx, min(chunk_len - 1 + chunk_len, chunk_size))  # qc_t[chunk_len-1]
    k = _rope(k, idx % chunk_len, inv_freq)
    results = [_flash(_rope(q[:, :chunk_len], q_t[:chunk_len], inv_freq), k[:, :chunk_len],
                      v[:, :chunk_len], True)]  # fmt: skip
    k_prev, v_prev = k[:, :chunk_len], v[:, :chunk_len]
    remain = length - chunk_len
    while remain > 0:
        begin = length - remain
        end = begin + min(chunk_len, remain)
        q_here = q[:, begin:end]
        per_chunk = [
            _flash(_rope(q_here, q_t[begin:end], inv_freq), k[:, begin:end], v[:, begin:end], True),
            _flash(_rope(q_here, qc_t[begin:end], inv_freq), k_prev, v_prev, False),
        ]
        if begin - k_prev.shape[1] > 0:
            inter = _rope(q_here, inter_t[begin:end], inv_freq)
            far = begin - k_prev.shape[1]
            per_chunk.append(_flash(inter, k[:, :far], v[:, :far], False))
        results.append(per_chunk)
        k_prev, v_prev = k[:, begin:end], v[:, begin:end]
        remain -= chunk_len
    return _merge(results)


def reference_logits(model: DecoderLM, ids, chunk_size, local_window):
    """Our model's logits with every attention replaced by the reference's, in float64."""
    inv_freq = default_inv_freq(model.model_cfg.head_dim, model.position_cfg.base).double()

    def attention(q, k, v):  # each [N, L, H, d]; the reference runs one row at a time
        rows = [
            chunkllama_attention(
                q[i].transpose(0, 1), k[i].transpose(0, 1), v[i].transpose(0, 1),
                chunk_size, local_window, inv_freq,
            ).transpose(0, 1)  # [L, H, d]
            for i in range(q.shape[0])
        ]  # fmt: skip
        return torch.stack(rows)

    return logits_with_attention(model, ids, attention)


def dca(chunk_size, local_window) -> ScalingConfig:
    return ScalingConfig("dca", "dca", {"chunk_size": chunk_size, "local_window": local_window})


@pytest.mark.parametrize(("chunk_size", "local_window"), [(24, 4), (20, 8), (12, 0)])
def test_dca_equals_chunkllamas_reference(chunk_size, local_window):
    """90 tokens at L = 32: chunks of 20, 12 and 12 positions, so every regime (intra, successive,
    inter) is used; the prefill and a token-by-token KV-cache decode both equal the reference."""
    model = _model()
    expected = reference_logits(model, IDS, chunk_size, local_window)
    ours = scaled_logits(model, IDS, dca(chunk_size, local_window))
    assert torch.allclose(ours, expected, atol=2e-3, rtol=1e-3)
    decoded = scaled_decoded(model, IDS, dca(chunk_size, local_window), prefill=30)
    assert torch.allclose(decoded, expected, atol=2e-3, rtol=1e-3)
    # negative controls: another chunk, another window, and the raw model differ
    for other in ((chunk_size + 2, local_window), (chunk_size, local_window + 2)):
        assert not torch.allclose(ours, reference_logits(model, IDS, *other), atol=2e-3, rtol=1e-3)
    with torch.no_grad():
        raw = model(IDS).logits
    assert (ours - raw).abs().max() > 1e-2


def test_dca_auto_is_the_references_and_its_relative_positions_by_hand():
    """auto: chunk_size 3L/4 and local_window L/8 (replace_with_chunkllama); L = 64: c = 40, cap 48.
    Hand-computed: i = 45, j = 41 (same chunk): 4; j = 30 (chunk before): min(5 + 40, 48) - 30 = 15;
    i = 85, j = 10 (two chunks back): min(79, 48) - 10 = 38; no relative position exceeds 48."""
    from models.scaling_config import resolve_params

    auto = dca("auto", "auto")
    params = resolve_params(auto, train_length=64, eval_length=256, rotary_pairs=8)
    assert params == {"chunk_size": 48, "local_window": 8}
    spec = pair_positions("dca", train_length=64, **params)
    q, k = torch.tensor([45.0, 45.0, 85.0]), torch.tensor([41.0, 30.0, 10.0])
    assert spec.relative(q, k).tolist() == [4.0, 15.0, 38.0]
    assert spec.region(q, k).tolist() == [0, 1, 2]
    i, j = torch.arange(400.0)[:, None], torch.arange(400.0)[None]
    rel = spec.relative(i, j)[j <= i]
    assert rel.max() == 48 and rel.min() == 0
    # control: the raw distances reach 399
    assert (i - j)[j <= i].max() == 399


@pytest.mark.parametrize(
    ("params", "sentence"),
    [
        (
            {"chunk_size": 32, "local_window": 4},
            "chunk_size 32 must be below the training length 32",
        ),
        ({"chunk_size": 16, "local_window": 16}, "local_window 16 must be below chunk_size 16"),
        ({"chunk_size": 16, "local_window": -1}, "local_window must be an integer >= 0"),
        ({"chunk_size": 1.5, "local_window": 0}, "chunk_size must be an integer >= 0"),
    ],
)
def test_dca_bad_values_are_one_sentence(params, sentence):
    with pytest.raises(ValueError, match=sentence):
        pair_positions("dca", train_length=TRAIN, **params)
