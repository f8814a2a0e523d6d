"""Hybrid NoPE/RoPE layer patterns (rnope_swa, irope) and attention sinks (#27 items 2-3).

Oracles: a dense per-entry reference of the sliding-window and chunked masks and of a softmax
with one more logit (the sink), written from the definitions; transformers' Llama 4 attention for
the query temperature; the plain RoPE and NoPE models for the layers a pattern is built from.
Each with a negative control.
"""

from __future__ import annotations

import math

import pytest
import torch

import models.flex as flex
import models.tiled_attention as tiled_attention
from models.attention import attend
from models.attention_inputs import AttentionInputs, span_mask
from models.families.hybrid import layer_pattern, llama4_query_temperature
from models.flex import attend_flex
from models.positions import PositionConfig
from models.tiled_attention import attend_tiled
from models.transformer import DecoderLM, ModelConfig

from fixtures.attention import attention_case, visited_blocks
from fixtures.decoding import causal_mask, copy_attention_weights, layer_inputs


def make_case(n=2, h=2, length=13, past=0, d=8, pad=(), window=None, chunk=None, seed=0):
    """Random q, k, v and AttentionInputs with ``pad[i]`` left-padding keys in row i."""
    return attention_case(n, h, None, length, past, d, pad, seed, window=window, chunk=chunk)


def dense_reference(q, k, v, inputs, sink=None):
    """Entry by entry from the definitions: key index s is visible to new query t when
    s <= past + t, the key is real (or is the query itself), and the key's position is in the
    query's window (i - j < W) or chunk (i // C == j // C); a sink is one more logit per head."""
    n, h, length, _ = q.shape
    s = k.shape[2]
    out = torch.zeros_like(q)
    valid = inputs.k_valid if inputs.k_valid is not None else torch.ones(n, s, dtype=torch.bool)
    for b in range(n):
        for t in range(length):
            i = int(inputs.q_pos[b, t])
            query = inputs.past_len + t
            seen = []
            for j_index in range(s):
                j = int(inputs.k_pos[b, j_index])
                ok = j_index <= query and (bool(valid[b, j_index]) or j_index == query)
                if inputs.window is not None:
                    ok = ok and (i - j < inputs.window or j_index == query)
                if inputs.chunk is not None:
                    ok = ok and (i // inputs.chunk == j // inputs.chunk or j_index == query)
                if ok:
                    seen.append(j_index)
            for head in range(h):
                logits = torch.stack([q[b, head, t] @ k[b, head, j] for j in seen]) * inputs.scale
                if sink is not None:
                    logits = torch.cat((logits, sink[head].reshape(1)))
                probs = logits.softmax(0)[: len(seen)]
                out[b, head, t] = (probs[:, None] * v[b, head, seen]).sum(0)
    return out


SPAN_CASES = {
    "window": dict(window=4),
    "window-padded": dict(window=3, pad=(4, 0)),
    "window-cache": dict(window=5, past=9, length=4, pad=(0, 3)),
    "window-decode": dict(window=3, past=12, length=1),
    "chunk": dict(chunk=4),
    "chunk-padded-cache": dict(chunk=3, past=8, length=5, pad=(2, 0)),
    "window-and-chunk": dict(window=3, chunk=5),
}


@pytest.mark.parametrize("case", SPAN_CASES.values(), ids=SPAN_CASES.keys())
def test_span_masks_equal_the_dense_reference(case):
    q, k, v, inputs = make_case(**case)
    reference = dense_reference(q, k, v, inputs)
    torch.testing.assert_close(attend(q, k, v, inputs)[0], reference, atol=1e-5, rtol=1e-5)
    # negative control: without the span the same case attends to more keys
    full = AttentionInputs(**{**vars(inputs), "window": None, "chunk": None, "flex_cache": {}})
    assert (attend(q, k, v, full)[0] - reference).abs().max() > 1e-2


@pytest.mark.parametrize("case", SPAN_CASES.values(), ids=SPAN_CASES.keys())
def test_span_masks_in_small_tiles_skip_only_keys_outside_every_span(monkeypatch, case):
    """Tiles of 1-2 queries leave out the keys before the tile's span: the same outputs."""
    q, k, v, inputs = make_case(**case)
    reference = dense_reference(q, k, v, inputs)
    n, h, s = q.shape[0], q.shape[1], k.shape[2]
    monkeypatch.setattr(tiled_attention, "ATTENTION_TILE_ELEMENTS", n * h * s * 2)
    torch.testing.assert_close(attend_tiled(q, k, v, inputs)[0], reference, atol=1e-5, rtol=1e-5)


def test_first_key_in_span_leaves_out_keys_and_a_wrong_bound_would_show():
    q, k, v, inputs = make_case(n=1, length=32, window=4)
    # the last query at position 31 sees 28..31: keys 0..27 are skipped for a one-query tile
    assert tiled_attention._first_key_in_span(inputs, 31, 32, 32) == 28
    chunked = AttentionInputs(**{**vars(inputs), "window": None, "chunk": 8, "flex_cache": {}})
    assert tiled_attention._first_key_in_span(chunked, 30, 32, 32) == 24
    # negative control: a tile that started one key too late would drop a visible key
    dropped = attend_tiled(q[:, :, -1:], k[:, :, 29:], v[:, :, 29:], _last_query(inputs, 29))[0]
    reference = dense_reference(q, k, v, inputs)[:, :, -1:]
    assert (dropped - reference).abs().max() > 1e-3


def _last_query(inputs, first_key):
    return AttentionInputs(
        **{
            **vars(inputs),
            "q_pos": inputs.q_pos[:, -1:],
            "k_pos": inputs.k_pos[:, first_key:],
            "past_len": inputs.k_pos.shape[1] - first_key - 1,
            "flex_cache": {},
        }
    )


def test_span_mask_definitions_and_control():
    i = torch.arange(10)[:, None]
    j = torch.arange(10)[None, :]
    window = span_mask(i, j, 3, None) & (j <= i)
    assert window.sum(1).tolist() == [1, 2, 3, 3, 3, 3, 3, 3, 3, 3]
    chunk = span_mask(i, j, None, 4) & (j <= i)
    assert chunk.sum(1).tolist() == [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    assert bool(span_mask(i, j, None, None).all())


@pytest.mark.parametrize("case", ["window-cache", "chunk-padded-cache", "window-padded"])
def test_eager_flex_honours_the_span(case):
    if flex.flex_attention_unavailable() is not None:
        pytest.skip(flex.flex_attention_unavailable())
    q, k, v, inputs = make_case(**SPAN_CASES[case], d=16)
    try:
        out = attend_flex(q, k, v, inputs, compiled=False)
    except Exception as error:  # pragma: no cover - an eager flex that does not run here
        pytest.skip(f"eager flex attention fails on CPU: {type(error).__name__}")
    torch.testing.assert_close(out, dense_reference(q, k, v, inputs), atol=1e-5, rtol=1e-5)
    block = flex.flex_block_mask(inputs, q.shape[0], q.shape[2], k.shape[2], q.device)
    assert int(block.full_kv_num_blocks.sum()) == 0  # a span never leaves a block unmasked


# ------------------------------------------------------------------ learned sink


@pytest.mark.parametrize("entropy", [False, True], ids=["sdpa-tiles", "explicit-probs"])
def test_learned_sink_joins_every_softmax_denominator(entropy):
    q, k, v, inputs = make_case(pad=(3, 0), window=None)
    inputs = AttentionInputs(**{**vars(inputs), "want_entropy": entropy, "flex_cache": {}})
    sink = torch.tensor([0.7, -1.3])
    out = attend(q, k, v, inputs, sink=sink)[0]
    torch.testing.assert_close(out, dense_reference(q, k, v, inputs, sink), atol=1e-5, rtol=1e-5)
    # negative control: a sink of -inf is no sink; a sink of 0.7 is not
    no_sink = attend(q, k, v, inputs, sink=torch.full((2,), -math.inf))[0]
    torch.testing.assert_close(no_sink, dense_reference(q, k, v, inputs), atol=1e-5, rtol=1e-5)
    assert (out - no_sink).abs().max() > 1e-2


def test_learned_sink_gets_a_gradient_and_sits_in_every_layer():
    model = DecoderLM(
        ModelConfig(n_layers=2, d_model=32, n_heads=2, attention_sink="learned"),
        PositionConfig(kind="rope"),
        32,
    )
    sinks = [block.attn.sink for block in model.blocks]
    assert all(s is not None and s.shape == (2,) for s in sinks)
    x = torch.randint(0, 259, (2, 20))
    model(x[:, :-1], targets=x[:, 1:]).token_nll.mean().backward()
    assert all(float(s.grad.abs().sum()) > 0 for s in sinks)


def _copy_of(model: DecoderLM, **model_changes) -> DecoderLM:
    cfg = ModelConfig(**{**vars(model.model_cfg), **model_changes})
    other = DecoderLM(cfg, model.position_cfg, model.train_length)
    other.load_state_dict(model.state_dict(), strict=False)
    return other


def test_sink_token_is_a_first_token_at_the_first_position():
    """attention_sink=token equals the model without it fed one more first token whose embedding
    is the sink's, at the first token's position; every output is the real tokens' only."""
    torch.manual_seed(0)
    model = DecoderLM(
        ModelConfig(n_layers=2, d_model=32, n_heads=2, attention_sink="token"),
        PositionConfig(kind="rope"),
        32,
    ).eval()
    plain = _copy_of(model, attention_sink="none").eval()
    spare = 258
    with torch.no_grad():
        plain.tok_emb.weight[spare] = model.sink_embedding
    x = torch.randint(0, 250, (2, 16))
    positions = torch.arange(16).expand(2, 16) + torch.tensor([[0], [5]])  # row 1 shifted
    out = model(x, position_ids=positions, output_hidden_states=True, output_attn_entropy=True)
    with_token = torch.cat((torch.full((2, 1), spare), x), dim=1)
    sink_positions = torch.cat((positions[:, :1], positions), dim=1)
    reference = plain(with_token, position_ids=sink_positions, output_hidden_states=True)
    # the spare token's row is also its (tied) output row: compare the other logits
    torch.testing.assert_close(
        out.logits[..., :spare], reference.logits[:, 1:, :spare], atol=1e-5, rtol=1e-5
    )
    assert out.logits.shape == (2, 16, 259)
    assert all(h.shape == (2, 16, 32) for h in out.hidden_states)
    assert all(e.shape == (2, 2, 16) for e in out.attn_entropy)
    # the suffix, the scored targets and the cache continue the same sequence
    tail = model(x, position_ids=positions, logits_from=10).logits
    torch.testing.assert_close(tail, out.logits[:, 10:], atol=1e-5, rtol=1e-5)
    nll = model(x[:, :-1], position_ids=positions[:, :-1], targets=x[:, 1:]).token_nll
    expected = torch.nn.functional.cross_entropy(
        out.logits[:, :-1].transpose(1, 2), x[:, 1:], reduction="none"
    )
    torch.testing.assert_close(nll, expected, atol=1e-5, rtol=1e-5)
    first = model(x[:, :9], position_ids=positions[:, :9], use_cache=True)
    rest = model(x[:, 9:], position_ids=positions[:, 9:], past=first.past)
    torch.testing.assert_close(rest.logits, out.logits[:, 9:], atol=1e-5, rtol=1e-5)
    # negative control: without the sink token the same weights give other logits
    without = plain(x, position_ids=positions).logits
    assert (without - out.logits).abs().max() > 1e-3


def test_sink_token_with_left_padding_matches_the_unpadded_row():
    torch.manual_seed(1)
    model = DecoderLM(
        ModelConfig(n_layers=2, d_model=32, n_heads=2, attention_sink="token"),
        PositionConfig(kind="alibi"),
        32,
    ).eval()
    x = torch.randint(0, 250, (1, 12))
    padded = torch.cat((torch.zeros(1, 3, dtype=torch.long), x), dim=1)
    mask = torch.cat((torch.zeros(1, 3), torch.ones(1, 12)), dim=1)
    out = model(padded, attention_mask=mask).logits[:, 3:]
    torch.testing.assert_close(out, model(x).logits, atol=1e-5, rtol=1e-5)


def test_sink_choices_are_checked():
    with pytest.raises(ValueError, match="attention_sink 'yes' is unknown; allowed: none"):
        ModelConfig(attention_sink="yes").validate()
    with pytest.raises(ValueError, match="does not combine with position=cope"):
        DecoderLM(ModelConfig(attention_sink="learned"), PositionConfig(kind="cope"), 32)


# ------------------------------------------------------------------ hybrid layer patterns


def _model(kind, layers=None, n_layers=4, train_length=32, **position):
    torch.manual_seed(0)
    cfg = PositionConfig(kind=kind, **position)
    if layers is not None:
        cfg.layers = list(layers)
    return DecoderLM(ModelConfig(n_layers=n_layers, d_model=32, n_heads=2), cfg, train_length)


def test_patterns_repeat_over_the_depth_and_default_to_every_fourth_layer_nope():
    cfg = PositionConfig(kind="rnope_swa")
    assert layer_pattern(cfg, ("swa", "swa", "swa", "nope"), 6) == ["swa"] * 3 + [
        "nope",
        "swa",
        "swa",
    ]
    model = _model("irope", n_layers=8, temperature_scale=0.1)
    x = torch.randint(0, 259, (1, 20))
    positions = model._positions(x, None, None, None)
    per_layer = model.family.layer_inputs(model, model._attention_inputs(positions, False))
    assert [inp.cos is None for inp in per_layer] == [False, False, False, True] * 2
    assert [inp.chunk for inp in per_layer] == [8, 8, 8, None] * 2  # L / 4 of 32
    assert per_layer[3].q_scale is not None and per_layer[0].q_scale is None
    assert per_layer[0] is per_layer[1]  # one AttentionInputs per kind: shared masks
    swa = _model("rnope_swa", window=5)
    per_layer = swa.family.layer_inputs(swa, swa._attention_inputs(positions, False))
    assert [inp.window for inp in per_layer] == [5, 5, 5, None]


def test_a_rope_pattern_is_the_rope_model_and_a_nope_pattern_the_nope_model():
    x = torch.randint(0, 259, (2, 24))
    rope, nope = _model("rope"), _model("nope")
    as_rope, as_nope = _model("rnope_swa", ["rope"]), _model("irope", ["nope"])
    as_rope.load_state_dict(rope.state_dict())
    as_nope.load_state_dict(nope.state_dict())
    torch.testing.assert_close(as_rope(x).logits, rope(x).logits)
    torch.testing.assert_close(as_nope(x).logits, nope(x).logits)
    # a window that covers the sequence is full attention; a shorter one is not (control)
    wide, narrow = _model("rnope_swa", ["swa"], window=64), _model("rnope_swa", ["swa"], window=4)
    for m in (wide, narrow):
        m.load_state_dict(rope.state_dict())
    torch.testing.assert_close(wide(x).logits, rope(x).logits)
    assert (narrow(x).logits - rope(x).logits).abs().max() > 1e-4


def test_nope_layers_ignore_positions_and_rope_layers_do_not():
    x = torch.randint(0, 259, (1, 24))
    shifted = torch.arange(24)[None] + 7
    nope_only = _model("rnope_swa", ["nope"])
    torch.testing.assert_close(nope_only(x, position_ids=shifted).logits, nope_only(x).logits)
    chunked = _model("irope", ["chunked", "nope"], chunk=8)  # chunks counted from position 0
    assert (chunked(x, position_ids=shifted).logits - chunked(x).logits).abs().max() > 1e-4


@pytest.mark.parametrize("kind", ["rnope_swa", "irope"])
def test_the_cache_honours_windows_and_chunks(kind):
    """Decoding token by token with the KV cache gives the full pass's logits (the span masks
    the cached keys by position), also where the sequence is many windows long."""
    span = {"chunk": 6, "temperature_scale": 0.1} if kind == "irope" else {"window": 5}
    model = _model(kind, **span)
    model.eval()
    x = torch.randint(0, 259, (2, 30))
    full = model(x).logits
    out = model(x[:, :7], use_cache=True)
    logits = [out.logits]
    for t in range(7, 30):
        out = model(x[:, t : t + 1], past=out.past, use_cache=True)
        logits.append(out.logits)
    torch.testing.assert_close(torch.cat(logits, dim=1), full, atol=1e-5, rtol=1e-5)


def test_llama4_temperature_equals_transformers():
    """The NoPE layers' query factor against transformers' Llama4TextAttention: its query states
    (captured at the attention function) over ours for unit queries."""
    modeling = pytest.importorskip("transformers.models.llama4.modeling_llama4")
    from transformers import Llama4TextConfig

    config = Llama4TextConfig(
        hidden_size=8,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=8,
        num_hidden_layers=4,
        floor_scale=4,
        attn_scale=0.25,
        attn_temperature_tuning=True,
        use_qk_norm=False,
    )
    config._attn_implementation = "eager"
    layer = modeling.Llama4TextAttention(config, layer_idx=3)  # (3 + 1) % 4 == 0: a NoPE layer
    assert not layer.use_rope
    with torch.no_grad():
        layer.q_proj.weight.copy_(torch.eye(8))
    captured = {}

    def capture(module, query, key, value, attention_mask, **kwargs):
        captured["query"] = query  # [N, H, L, d]
        return torch.zeros(query.shape[0], query.shape[2], 1, 8), None

    original = modeling.eager_attention_forward
    modeling.eager_attention_forward = capture
    try:
        hidden = torch.ones(1, 30, 8)
        layer(
            hidden,
            position_embeddings=torch.ones(1, 30, 4, dtype=torch.complex64),
            attention_mask=None,
        )
    finally:
        modeling.eager_attention_forward = original
    theirs = captured["query"][0, 0, :, 0]  # the unit query scaled by its factor
    ours = llama4_query_temperature(torch.arange(30), floor=4, scale=0.25)
    torch.testing.assert_close(ours, theirs)
    assert float(ours[2]) == 1.0 and float(ours[3]) > 1.0  # (3 + 1) / 4 reaches the first step
    # negative control: another floor is another factor
    assert (
        llama4_query_temperature(torch.arange(30), floor=8, scale=0.25) - theirs
    ).abs().max() > 0.05


def _llama4_attention_pair(qk_norm: bool, layer: int, length: int = 24):
    """Layer ``layer`` of an irope DecoderLM (4 layers: three chunked RoPE, one NoPE; interleaved
    pairs as Llama 4's complex rotation; chunks longer than the input) and transformers'
    Llama4TextAttention with the same weights and ``use_qk_norm`` = ``qk_norm``: (ours, theirs)
    outputs [1, L, D] of the same normed input, and whether their layer rotates."""
    modeling = pytest.importorskip("transformers.models.llama4.modeling_llama4")
    from transformers import Llama4TextConfig

    config = Llama4TextConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_hidden_layers=4,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        floor_scale=4,
        attn_scale=0.25,
        attn_temperature_tuning=True,
        use_qk_norm=qk_norm,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    position = PositionConfig(
        kind="irope",
        chunk=64,
        layout="interleaved",
        temperature_scale=0.25,
        temperature_floor=4,
        qk_norm=qk_norm,
    )
    cfg = ModelConfig(n_layers=4, d_model=32, n_heads=4, n_kv_heads=2)
    model = DecoderLM(cfg, position, 32).eval()
    ours_attn = model.blocks[layer].attn
    theirs = modeling.Llama4TextAttention(config, layer_idx=layer).eval()
    copy_attention_weights(ours_attn, theirs)
    x = torch.randn(1, length, 32, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        freqs_cis = modeling.Llama4TextRotaryEmbedding(config)(x, torch.arange(length)[None])
        expected = theirs(x, position_embeddings=freqs_cis, attention_mask=causal_mask(length))[0]
        ours = ours_attn(x, layer_inputs(model, x)[layer], None)[0]
    return ours, expected, theirs.use_rope


@pytest.mark.parametrize("layer", [0, 3], ids=["rope_layer", "nope_layer"])
def test_irope_qk_norm_equals_llama4_attention(layer):
    """One RoPE layer (chunked, QK-norm after the rotation) and one NoPE layer (temperature, no
    norm) against transformers' Llama4TextAttention (``use_qk_norm``: Llama4TextWeightlessRMSNorm
    with ``rms_norm_eps`` 1e-5), with the norm on (irope's default) and off. Negative control:
    ours without the norm differs from theirs with it on the RoPE layer; on the NoPE layer, where
    neither applies it, the two settings agree."""
    for qk_norm in (True, False):
        ours, theirs, rotates = _llama4_attention_pair(qk_norm, layer)
        assert rotates == (layer != 3)
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
    normed = _llama4_attention_pair(True, layer)[1]
    plain = _llama4_attention_pair(False, layer)[0]
    if layer == 3:
        torch.testing.assert_close(plain, normed, atol=1e-5, rtol=1e-4)
    else:
        assert (plain - normed).abs().max() > 1e-3


def test_qk_norm_is_irope_s_default_and_in_its_checkpoint_key():
    """irope reads position.qk_norm (default on, as the Hydra preset); rnope_swa and rope do not:
    it stays out of their parameters (and checkpoint keys)."""
    assert PositionConfig(kind="irope").params()["qk_norm"] is True
    assert "qk_norm" not in PositionConfig(kind="rnope_swa").params()
    assert "qk_norm" not in PositionConfig(kind="rope").params()
    model = _model("irope", n_layers=4)
    per_layer = model.family.layer_inputs(
        model,
        model._attention_inputs(
            model._positions(torch.zeros(1, 8).long(), None, None, None), False
        ),
    )
    assert [inp.qk_norm for inp in per_layer] == [1e-5, 1e-5, 1e-5, None]
    off = _model("irope", n_layers=4, qk_norm=False)
    per_layer = off.family.layer_inputs(
        off,
        off._attention_inputs(off._positions(torch.zeros(1, 8).long(), None, None, None), False),
    )
    assert [inp.qk_norm for inp in per_layer] == [None] * 4


def test_hybrid_fields_are_checked():
    with pytest.raises(
        ValueError, match="position.layers has 'chunked'; allowed per layer of position=rnope_swa"
    ):
        _model("rnope_swa", ["swa", "chunked"])
    with pytest.raises(ValueError, match="position.window must be an integer >= 0"):
        _model("rnope_swa", window=-1)
    with pytest.raises(ValueError, match="position.temperature_scale must be >= 0"):
        _model("irope", temperature_scale=-0.5)
    # rnope_swa does not read the chunk, so it does not enter its parameters (or checkpoint key)
    assert "chunk" not in PositionConfig(kind="rnope_swa").params()
    assert "window" not in PositionConfig(kind="irope").params()


@pytest.mark.parametrize(
    "case",
    [
        dict(window=4, length=32),
        dict(chunk=8, length=32),
        dict(window=5, length=20, past=12, pad=(0, 6)),
        dict(chunk=6, length=9, past=23, pad=(3, 0)),
    ],
    ids=["window", "chunk", "window-padded-cache", "chunk-padded-cache"],
)
def test_flex_block_mask_skips_blocks_outside_the_span(case):
    """The block mask visits every block flex's own create_block_mask (which evaluates each
    entry of the mask_mod) finds an entry in, and without padding no other: blocks outside the
    window or chunk are skipped; none is full (a span is applied entry by entry)."""
    if flex.flex_attention_unavailable() is not None:
        pytest.skip(flex.flex_attention_unavailable())
    from torch.nn.attention.flex_attention import create_block_mask

    q, k, v, inputs = make_case(n=2, **case)
    length, s = q.shape[2], k.shape[2]
    ours = flex.flex_block_mask(inputs, 2, length, s, q.device, block_size=4)
    try:
        theirs = create_block_mask(
            flex.flex_mask_mod(inputs, q.device),
            2,
            None,
            length,
            s,
            device="cpu",
            BLOCK_SIZE=4,
        )
    except Exception as error:  # pragma: no cover - a torch whose create_block_mask fails here
        pytest.skip(f"create_block_mask fails on CPU: {type(error).__name__}")
    visited, needed = visited_blocks(ours), visited_blocks(theirs)
    assert bool((visited | ~needed).all())  # never skips a block with a visible entry
    if "pad" not in case:
        assert torch.equal(visited, needed)
    assert int(ours.full_kv_num_blocks.sum()) == 0
    # negative control: the causal block mask alone visits blocks the span leaves out
    causal = AttentionInputs(**{**vars(inputs), "window": None, "chunk": None, "flex_cache": {}})
    plain = flex.flex_block_mask(causal, 2, length, s, q.device, block_size=4)
    assert int(visited_blocks(plain).sum()) > int(visited.sum())
