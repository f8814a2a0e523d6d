"""Training-free extension (Self-Extend, ReRoPE, Leaky ReRoPE, StreamingLLM) against a dense reference.

The oracle re-runs a model's own weights with attention written out per query-key pair in float64:
the relative position each method assigns to a pair comes from the method's published rule,
written out again here (not from ``models.scaling.PairPositions``), and RoPE is the complex
number exp(i theta p_ij) per pair, never a rotation of q or k. StreamingLLM's reference is its
repo's procedure instead: per query, the cache of sinks + recent tokens with positions counted in
that cache. Each comparison has a negative control (another group size, window or sink count).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from models.positions import PositionConfig, alibi_slopes, families
from models.scaling import default_inv_freq, pair_positions, scaling_method
from models.scaling_config import ScalingConfig, run_scaling
from models.transformer import DecoderLM, ModelConfig

from fixtures.decoding import logits_with_attention, scaled_decoded, scaled_logits

TRAIN = 32


def _model(kind="rope", layout="half", kv_heads=2, seed=0) -> DecoderLM:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=40, n_layers=2, d_model=32, n_heads=4, n_kv_heads=kv_heads)
    own = {"layout": layout} if "layout" in families()[kind].fields else {}
    model = DecoderLM(cfg, PositionConfig(kind=kind, **own), TRAIN).eval()
    for param in model.parameters():  # larger weights: position differences show in the logits
        param.data.mul_(4.0)
    return model


# ----------------------------------------------------------------------------- the methods' rules


def self_extend_relative(i: int, j: int, group: int, window: int) -> float:
    """LongLM: neighbours keep i - j; others (i // G + W - W // G) - j // G."""
    if i - j < window:
        return i - j
    return (i // group + window - window // group) - j // group


def leaky_rerope_relative(i: int, j: int, window: int, slope: float) -> float:
    """bojone/rerope: i - j inside the window, W + (i - j - W) / k beyond (slope 1/k; 0: ReRoPE)."""
    return i - j if i - j < window else window + (i - j - window) * slope


def streaming_cache(i: int, sinks: int, window: int) -> list[int]:
    """StreamingLLM's StartRecentKVCache for the token at i: the first ``sinks`` tokens and the
    ``window`` most recent ones (i included), in cache order."""
    recent = list(range(max(0, i - window + 1), i + 1))
    return sorted(set(range(min(sinks, i + 1))) | set(recent))


def reference_logits(model: DecoderLM, ids: torch.Tensor, relative, visible) -> torch.Tensor:
    """The model's logits with attention per pair in float64: logit(i, j) = Re(sum_c q_c conj(k_c)
    exp(i theta_c relative(i, j))) / sqrt(d) (+ ALiBi's -m_h relative(i, j)), pairs with
    visible(i, j) False or j > i masked."""
    length = ids.shape[1]
    cfg, position = model.model_cfg, model.position_cfg
    h, d = cfg.n_heads, cfg.head_dim
    rel = torch.tensor(
        [[float(relative(i, j)) if j <= i else 0.0 for j in range(length)] for i in range(length)],
        dtype=torch.float64,
    )  # [L, L]
    seen = torch.tensor([[j <= i and visible(i, j) for j in range(length)] for i in range(length)])

    def attention(q, k, v):  # each [N, L, H, d]
        if position.kind == "rope":
            if position.layout == "half":
                qc = torch.complex(q[..., : d // 2], q[..., d // 2 :])
                kc = torch.complex(k[..., : d // 2], k[..., d // 2 :])
            else:
                qc = torch.complex(q[..., 0::2], q[..., 1::2])
                kc = torch.complex(k[..., 0::2], k[..., 1::2])
            phase = torch.exp(1j * rel[..., None] * default_inv_freq(d, position.base))
            logits = torch.einsum("nihc,njhc,ijc->nhij", qc, kc.conj(), phase).real
        else:
            logits = torch.einsum("nihc,njhc->nhij", q, k)
        logits = logits / d**0.5
        if position.kind == "alibi":
            logits = logits - alibi_slopes(h).double()[:, None, None] * rel
        probs = logits.masked_fill(~seen, float("-inf")).softmax(-1)  # [N, H, L, L]
        return torch.einsum("nhij,njhd->nihd", probs, v)

    return logits_with_attention(model, ids, attention)


IDS = torch.randint(0, 40, (2, 72), generator=torch.Generator().manual_seed(1))
ALWAYS = lambda i, j: True  # noqa: E731


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(("group", "window"), [(3, 8), (5, 12)])
def test_self_extend_equals_the_dense_reference(layout, group, window):
    model = _model(layout=layout)
    scaling = ScalingConfig("self_extend", "self_extend", {"group_size": group, "window": window})
    ours = scaled_logits(model, IDS, scaling)
    expected = reference_logits(
        model, IDS, lambda i, j: self_extend_relative(i, j, group, window), ALWAYS
    )
    assert torch.allclose(ours, expected, atol=2e-3, rtol=1e-3)
    decoded = scaled_decoded(model, IDS, scaling, prefill=20)
    assert torch.allclose(decoded, expected, atol=2e-3, rtol=1e-3)
    for wrong in ((group + 1, window), (group, window + 1)):  # negative controls
        other = reference_logits(
            model, IDS, lambda i, j, wrong=wrong: self_extend_relative(i, j, *wrong), ALWAYS
        )
        assert not torch.allclose(ours, other, atol=1e-2)


@pytest.mark.parametrize(
    ("method", "window", "slope"), [("rerope", 10, 0.0), ("leaky_rerope", 10, 0.25)]
)
def test_rerope_equals_the_dense_reference(method, window, slope):
    model = _model()
    params = {"window": window} if method == "rerope" else {"window": window, "slope": slope}
    scaling = ScalingConfig(method, method, params)
    ours = scaled_logits(model, IDS, scaling)
    expected = reference_logits(
        model, IDS, lambda i, j: leaky_rerope_relative(i, j, window, slope), ALWAYS
    )
    assert torch.allclose(ours, expected, atol=2e-3, rtol=1e-3)
    assert torch.allclose(
        scaled_decoded(model, IDS, scaling, prefill=9), expected, atol=2e-3, rtol=1e-3
    )
    other = reference_logits(
        model, IDS, lambda i, j: leaky_rerope_relative(i, j, window + 1, slope), ALWAYS
    )
    assert not torch.allclose(ours, other, atol=1e-2)


@pytest.mark.parametrize("kind", ["rope", "alibi", "nope"])
@pytest.mark.parametrize(("sinks", "window"), [(4, 16), (0, 16), (2, 7)])
def test_streaming_equals_the_repo_procedure(kind, sinks, window):
    """Per query, the sinks + recent-window cache with positions counted in the cache."""
    model = _model(kind=kind)
    scaling = ScalingConfig("streaming", "streaming", {"sink_tokens": sinks, "window": window})

    def cache_relative(i, j):
        cache = streaming_cache(i, sinks, window)
        return cache.index(i) - cache.index(j) if j in cache else 0.0

    def in_cache(i, j):
        return j in streaming_cache(i, sinks, window)

    ours = scaled_logits(model, IDS, scaling)
    expected = reference_logits(model, IDS, cache_relative, in_cache)
    assert torch.allclose(ours, expected, atol=2e-3, rtol=1e-3)
    assert torch.allclose(
        scaled_decoded(model, IDS, scaling, prefill=5), expected, atol=2e-3, rtol=1e-3
    )
    other_sinks = sinks + 1
    other = reference_logits(
        model, IDS, cache_relative, lambda i, j: j in streaming_cache(i, other_sinks, window)
    )
    assert not torch.allclose(ours, other, atol=1e-3)


@pytest.mark.parametrize(
    "scaling",
    [
        ScalingConfig("se", "self_extend", {"group_size": 4, "window": 72}),
        ScalingConfig("re", "rerope", {"window": 72}),
        ScalingConfig("lr", "leaky_rerope", {"window": 72, "slope": 0.1}),
        ScalingConfig("lr1", "leaky_rerope", {"window": 4, "slope": 1.0}),
        ScalingConfig("se1", "self_extend", {"group_size": 1, "window": 4}),
        ScalingConfig("st", "streaming", {"sink_tokens": 4, "window": 72}),
    ],
    ids=lambda s: s.name,
)
def test_exact_where_every_pair_keeps_its_positions(scaling):
    """A window as long as the input (or group 1, slope 1) is the raw model, to float32 rounding."""
    model = _model()
    raw = model(IDS).logits
    assert torch.allclose(scaled_logits(model, IDS, scaling), raw, atol=1e-5)
    shorter = ScalingConfig("re", "rerope", {"window": 40})  # negative control
    assert not torch.allclose(scaled_logits(model, IDS, shorter), raw, atol=1e-3)


def test_left_padding_and_entropy():
    model = _model()
    scaling = ScalingConfig("se", "self_extend", {"group_size": 3, "window": 8})
    plain = scaled_logits(model, IDS[:1, 6:], scaling)
    padded = torch.cat((torch.zeros(1, 6, dtype=torch.long), IDS[:1, 6:]), dim=1)
    mask = torch.ones_like(padded)
    mask[:, :6] = 0
    out = scaled_logits(model, padded, scaling, attention_mask=mask)
    assert torch.allclose(out[:, 6:], plain, atol=1e-5)
    with model.scaled(scaling, IDS.shape[1]):
        traced = model(IDS, output_attn_entropy=True)
    assert torch.allclose(traced.logits, scaled_logits(model, IDS, scaling), atol=1e-5)
    assert all(e.shape == (2, 4, 72) and bool(e.isfinite().all()) for e in traced.attn_entropy)


def test_auto_parameters_fit_the_trained_range():
    """Auto group size / slope: the farthest pair of the target length lands inside L, and one
    step further would not (so the rule picks the least compression that fits)."""
    target = 8 * TRAIN
    for name, params in (
        ("self_extend", {"group_size": "auto", "window": "auto"}),
        ("leaky_rerope", {"window": "auto", "slope": "auto"}),
        ("rerope", {"window": "auto"}),
        ("streaming", {"window": "auto"}),
    ):
        run = run_scaling(ScalingConfig(name, name, params), train_length=TRAIN, lengths=[target])
        spec = pair_positions(name, train_length=TRAIN, **run.params)
        farthest = float(spec.relative(torch.tensor(target - 1), torch.tensor(0)))
        assert farthest <= TRAIN - 1 + 1e-9, (name, run.params, farthest)
        if name == "self_extend":
            g, w = run.params["group_size"], run.params["window"]
            assert w == TRAIN // 4 and self_extend_relative(target - 1, 0, g - 1, w) > TRAIN - 1
        if name == "leaky_rerope":
            looser = run.params["slope"] * 1.01
            assert leaky_rerope_relative(target - 1, 0, run.params["window"], looser) > TRAIN - 1
        if name == "streaming":
            assert run.params["window"] == TRAIN - 4


def test_applicability_and_bad_values():
    from models.scaling import applicable_methods

    assert {"self_extend", "rerope", "leaky_rerope", "streaming"} <= set(applicable_methods("rope"))
    assert {"self_extend", "rerope", "leaky_rerope", "streaming"} <= set(
        applicable_methods("p_rope")
    )
    for kind in ("alibi", "nope", "t5", "fire"):
        methods = applicable_methods(kind)
        assert "streaming" in methods and "self_extend" not in methods and "rerope" not in methods
    for kind in ("xpos", "cope", "sinusoidal", "learned"):
        assert not set(applicable_methods(kind)) & {"self_extend", "rerope", "streaming"}
    assert scaling_method("self_extend").pair_method and not scaling_method("yarn").pair_method
    model = _model()
    for params, words in (
        ({"group_size": 0, "window": 8}, "group_size must be a positive integer, got 0"),
        ({"group_size": 2, "window": 1.5}, "window must be a positive integer (tokens), got 1.5"),
        ({"group_size": 2, "window": 8, "extra": 1}, "unknown parameter(s) ['extra']"),
    ):
        with pytest.raises(ValueError, match=None) as error:
            model.set_scaling(ScalingConfig("se", "self_extend", params))
        assert words in str(error.value)
    with pytest.raises(ValueError, match=r"slope must be in \[0, 1\], got 2"):
        model.set_scaling(ScalingConfig("lr", "leaky_rerope", {"window": 4, "slope": 2}))
    with pytest.raises(ValueError, match="sink_tokens must be an integer >= 0, got -1"):
        model.set_scaling(ScalingConfig("st", "streaming", {"window": 4, "sink_tokens": -1}))
    alibi = _model(kind="alibi")
    with pytest.raises(ValueError, match="does not apply to position family 'alibi'"):
        alibi.set_scaling(ScalingConfig("se", "self_extend", {"group_size": 2, "window": 4}))


@pytest.mark.parametrize("kind", ["rope", "alibi", "nope", "t5", "kerple_log", "fire", "sandwich"])
def test_streaming_last_token_equals_the_raw_model_on_its_evicted_cache(kind):
    """One layer: the last token under StreamingLLM equals the raw model reading only the tokens
    its cache keeps (sinks, then the recent window), at positions 0.. in that cache; a cache
    without the sinks (the negative control) differs."""
    torch.manual_seed(3)
    cfg = ModelConfig(vocab_size=40, n_layers=1, d_model=32, n_heads=4)
    model = DecoderLM(cfg, PositionConfig(kind=kind), TRAIN).eval()
    for param in model.parameters():
        param.data.mul_(4.0)
    sinks, window, length = 3, 9, 40
    ids = IDS[:, :length]
    scaling = ScalingConfig("streaming", "streaming", {"sink_tokens": sinks, "window": window})
    last = scaled_logits(model, ids, scaling)[:, -1]
    kept = streaming_cache(length - 1, sinks, window)
    assert len(kept) == sinks + window
    assert torch.allclose(last, model(ids[:, kept]).logits[:, -1], atol=1e-4)
    recent = model(ids[:, kept[sinks:]]).logits[:, -1]
    assert not torch.allclose(last, recent, atol=1e-3)


def test_streaming_counts_from_the_first_token_whatever_its_position_id():
    """StreamingLLM re-positions its cache from 0, so offsetting every position id (the shift
    probe) changes nothing, and a left-padded row keeps its first real tokens as the sinks;
    Self-Extend groups the ids it is given (LongLM's patch), so the offset moves its logits."""
    model = _model()
    streaming = ScalingConfig("st", "streaming", {"sink_tokens": 3, "window": 10})
    positions = torch.arange(IDS.shape[1])[None]
    here = scaled_logits(model, IDS, streaming, position_ids=positions)
    assert torch.allclose(
        scaled_logits(model, IDS, streaming, position_ids=positions + 13), here, atol=1e-5
    )
    grouped = ScalingConfig("se", "self_extend", {"group_size": 3, "window": 8})
    moved = scaled_logits(model, IDS, grouped, position_ids=positions + 13)
    assert not torch.allclose(
        moved, scaled_logits(model, IDS, grouped, position_ids=positions), atol=1e-4
    )
    padded = torch.cat((torch.zeros(1, 5, dtype=torch.long), IDS[:1]), dim=1)
    mask = torch.ones_like(padded)
    mask[:, :5] = 0
    out = scaled_logits(
        model, padded, streaming, attention_mask=mask, position_ids=torch.arange(77)[None]
    )
    assert torch.allclose(out[:, 5:], here[:1], atol=1e-5)


# ----------------------------------------------------------------------------- StreamingLLM pos_shift


def streaming_pos_shift_reference(
    model: DecoderLM, ids: torch.Tensor, sinks: int, window: int, logn: bool, mixed: bool = False
) -> torch.Tensor:
    """mit-han-lab/streaming-llm with ``enable_streaming_llm`` and pos_shift, transcribed, in float64:
    one token at a time; every layer caches its keys before any position enters (RoPE) and its
    values; after each step ``StartRecentKVCache(start_size=sinks, recent_size=window - 1)`` keeps
    the first ``sinks`` and the last window - 1 entries; the query stands at its position in the
    cache (``position_ids`` = the cache's length before it, "query pos is min(cache_size, idx)"),
    the keys at ``arange(kv_seq_len)``. Every term that reads a position reads those: RoPE, a score
    bias b_h(query, key) (FIRE's normaliser psi(max(L_thr, query))), and log-n's factor
    max(1, ln(query + 1) / ln L) on the query (lenbench's addition; the repo has none).

    ``mixed=True`` is the negative control, the positions lenbench used before: a pair whose key
    is in the recent window scored with the query at its own position id and the key at its own
    (the same distance), only the sink pairs at cache positions, and log-n at the position id."""
    m = copy.deepcopy(model).double()
    cfg, base = m.model_cfg, getattr(m.position_cfg, "base", 10000.0)  # probe base if none
    h, g, d = cfg.n_heads, cfg.kv_heads, cfg.head_dim
    n, length = ids.shape
    bias = m.family.score_bias(m, length) if m.position_cfg.acts_on == "scores" else None
    inv_freq = default_inv_freq(d, base).double()  # [d/2]
    caches: list[list[tuple[int, torch.Tensor, torch.Tensor]]] = [[] for _ in m.blocks]
    logits = []
    for t in range(length):
        x = m.tok_emb(ids[:, t])  # [N, D]
        for layer, block in enumerate(m.blocks):
            a, cache = block.attn, caches[layer]
            hidden = block.attn_norm(x)
            q = a.q_proj(hidden).view(n, h, d)
            k, v = a.kv_proj(hidden).view(n, 2, g, d).unbind(1)  # [N, G, d] each
            query_at = len(cache)  # the cache's length before this token
            cache.append((t, k, v))
            pairs = []  # (query position, key position) each key is scored at
            for c, (j, _, _) in enumerate(cache):
                recent = t - j < window
                pairs.append((t, j) if mixed and recent else (query_at, c))
            factor = 1.0
            if logn:
                own = t if mixed else query_at
                factor = max(1.0, math.log(own + 1) / math.log(m.train_length))
            pq, pk = torch.tensor(pairs).T  # [C] each
            qc = q * factor  # [N, H, d]
            keys = torch.stack([entry[1] for entry in cache], 2).repeat_interleave(h // g, 1)
            values = torch.stack([entry[2] for entry in cache], 2).repeat_interleave(h // g, 1)
            if m.position_cfg.kind == "rope":  # "half" layout: channel c with c + d/2
                phase = torch.exp(1j * (pq - pk)[:, None] * inv_freq)  # [C, d/2]
                qz = torch.complex(qc[..., : d // 2], qc[..., d // 2 :])[:, :, None]
                kz = torch.complex(keys[..., : d // 2], keys[..., d // 2 :])  # [N, H, C, d/2]
                scores = (qz * kz.conj() * phase).real.sum(-1) / d**0.5  # [N, H, C]
            else:
                scores = torch.einsum("nhd,nhcd->nhc", qc, keys) / d**0.5
            if bias is not None:  # b_h(query position, key position) of every head and key
                heads = torch.arange(h)[None, :, None, None]
                scores = scores + bias(heads, pq[None, None, None], pk[None, None, None])[:, :, 0]
            probs = scores.softmax(-1)  # [N, H, C]
            out = torch.einsum("nhc,nhcd->nhd", probs, values).reshape(n, -1)
            x = x + a.o_proj(out)
            x = x + block.mlp(block.mlp_norm(x))
            if len(cache) > sinks + window - 1:  # StartRecentKVCache evicts after the step
                cache[:] = cache[:sinks] + cache[len(cache) - (window - 1) :]
        logits.append(m.lm_head(m.final_norm(x)).float())
    return torch.stack(logits, 1)  # [N, L, V]


@pytest.mark.parametrize(
    ("kind", "logn"), [("fire", False), ("fire", True), ("rope", True)], ids=str
)
def test_streaming_puts_every_query_term_at_its_cache_position(kind, logn):
    """StreamingLLM against its repo's pos_shift procedure on a family whose bias reads the query
    position (FIRE with threshold 8: cache positions 0..12 straddle it, position ids reach 63) and
    with log-n (L = 32: factor 1 at every cache position, up to 1.2 at the position ids): a prefill
    and token-by-token decoding equal the transcription. Negative control: the old mixed positions
    (own position ids for recent pairs and for log-n) differ from it, and from ours."""
    torch.manual_seed(5)
    cfg = ModelConfig(vocab_size=40, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2)
    position = PositionConfig(kind=kind, fire_threshold=8) if kind == "fire" else PositionConfig()
    model = DecoderLM(cfg, position, TRAIN).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.startswith("fire_"):  # FIRE keeps its threshold and c
                param.mul_(4.0)
    sinks, window = 3, 10  # cache positions 0..12, position ids up to 71
    scaling = ScalingConfig(
        "streaming", "streaming", {"sink_tokens": sinks, "window": window}, logn=logn
    )
    ids = IDS[:, :64]
    expected = streaming_pos_shift_reference(model, ids, sinks, window, logn)
    ours = scaled_logits(model, ids, scaling)
    assert torch.allclose(ours, expected, atol=2e-3, rtol=1e-3)
    assert torch.allclose(
        scaled_decoded(model, ids, scaling, prefill=6), expected, atol=2e-3, rtol=1e-3
    )
    # the repo's positions are the cache's: position ids offset by 13 change nothing
    offset = torch.arange(ids.shape[1])[None] + 13
    assert torch.allclose(scaled_logits(model, ids, scaling, position_ids=offset), ours, atol=1e-4)
    mixed = streaming_pos_shift_reference(model, ids, sinks, window, logn, mixed=True)
    assert (mixed - expected).abs().max() > 0.05  # the control sees the difference
    assert not torch.allclose(ours, mixed, atol=1e-2)


def test_streaming_log_n_factor_at_the_cache_position_hand_computed():
    """Issue 50's case: L = 32, 4 sinks, window auto (28): the query at position id 199 stands at
    cache position 31, whose log-n factor is max(1, ln 32 / ln 32) = 1; its position id's would
    be ln 200 / ln 32 = 1.529 (the old factor, the control)."""
    from models.attention import logn_query_scale

    model = _model()
    streaming = ScalingConfig("st", "streaming", {"window": "auto"}, logn=True)
    model.set_scaling(run_scaling(streaming, train_length=TRAIN, lengths=[256]))
    positions = model._positions(torch.zeros(1, 200, dtype=torch.long), None, None, None)
    inputs = model._attention_inputs(positions, False)
    assert model.scaling.params["window"] == 28 and int(inputs.pairs.q_far[0, 199]) == 31
    assert float(inputs.q_scale[0, 0, 199, 0]) == 1.0
    old = float(logn_query_scale(torch.tensor(199), TRAIN))
    assert old == pytest.approx(math.log(200) / math.log(32)) and round(old, 3) == 1.529


def test_streaming_evicts_a_needle_only_beyond_layers_times_window():
    """Is "StreamingLLM loses a needle outside its window" (T3) true by construction of the mask?
    Only for a needle more than n_layers x window tokens back: such tokens change none of the last
    query's logits. A needle evicted for the last query but within n_layers x window does change
    them: a recent token attended to it in an earlier layer (as in the repo's cache, whose recent
    keys were computed while the needle was still cached). So at the reference's depths (4L,
    3 layers, window L - 4) whether the needle is lost is the trained model's doing, and T3
    checks it. Negative control: the raw model sees the far needle."""
    model = _model()  # 2 layers
    sinks, window = 2, 10
    streaming = ScalingConfig("st", "streaming", {"sink_tokens": sinks, "window": window})
    length = IDS.shape[1]
    last = scaled_logits(model, IDS, streaming)[:, -1]

    def changed_at(where: slice) -> torch.Tensor:
        ids = IDS.clone()
        ids[:, where] = (IDS[:, where] + 7) % 40
        return ids

    far = changed_at(slice(sinks + 3, length - 2 * window - 3))  # beyond 2 layers x window
    assert torch.equal(scaled_logits(model, far, streaming)[:, -1], last)
    assert not torch.allclose(model(far).logits[:, -1], model(IDS).logits[:, -1], atol=1e-3)
    relayed = changed_at(slice(length - 2 * window + 2, length - window - 2))  # one hop away
    assert not torch.allclose(scaled_logits(model, relayed, streaming)[:, -1], last, atol=1e-4)
