"""The decoder LM: KV cache, padding, position families, eval-time scaling; each with a negative control."""

import copy
import math

import pytest
import torch

import models.attention as attention_module
import models.tiled_attention as tiled_attention
from models.positions import PositionConfig, rotate
from models.scaling import logn_factor
from models.transformer import (
    DecoderLM,
    ModelConfig,
    ScalingConfig,
    logn_query_scale,
    resolve_scaling,
    resolved_scaling,
)

from fixtures.decoding import full_pass_greedy

TINY = ModelConfig(n_layers=2, d_model=32, n_heads=4, mlp="swiglu")


def tiny_model(kind="rope", train_length=16, model_cfg=TINY, seed=0, **position_kwargs):
    torch.manual_seed(seed)
    model = DecoderLM(model_cfg, PositionConfig(kind=kind, **position_kwargs), train_length)
    with torch.no_grad():  # sharper attention than at init, so position bugs show up clearly
        for block in model.blocks:
            block.attn.q_proj.weight.mul_(6.0)
            block.attn.kv_proj.weight.mul_(6.0)
    return model.eval()


def random_tokens(n, length, seed=0):
    return torch.randint(0, 256, (n, length), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- KV cache


def incremental_logits(model, tokens, prefill):
    """Prefill `prefill` tokens, then decode one token at a time; logits for every position."""
    out = model(tokens[:, :prefill], use_cache=True)
    pieces = [out.logits]
    for t in range(prefill, tokens.shape[1]):
        out = model(tokens[:, t : t + 1], past=out.past, use_cache=True)
        pieces.append(out.logits)
    return torch.cat(pieces, dim=1)


@pytest.mark.parametrize("kind", ["rope", "sinusoidal", "learned", "alibi", "nope"])
def test_full_forward_equals_prefill_plus_decode(kind):
    model = tiny_model(kind, train_length=24)
    tokens = random_tokens(2, 20)
    full = model(tokens).logits
    incremental = incremental_logits(model, tokens, prefill=5)
    max_error = (full - incremental).abs().max().item()
    print(f"{kind}: max |full - prefill+decode| = {max_error:.2e}")
    assert max_error < 1e-4


def test_decode_that_restarts_positions_at_zero_is_detected():
    model = tiny_model("rope")
    tokens = random_tokens(1, 12)
    full = model(tokens).logits
    out = model(tokens[:, :4], use_cache=True)
    pieces = [out.logits]
    for t in range(4, 12):  # the bug: every decode step believes it is at position 0
        out = model(
            tokens[:, t : t + 1], past=out.past, use_cache=True, position_ids=torch.zeros(1, 1)
        )
        pieces.append(out.logits)
    assert (full - torch.cat(pieces, dim=1)).abs().max() > 1e-2


class ReRotatingAttention(attention_module.Attention):
    """The seed's bug: rotate the whole cached history again with the current step's angle."""

    def forward(self, x, inputs, cached, query_from=0):
        if cached is not None and inputs.cos is not None:
            cached = (rotate(cached[0], inputs.cos, inputs.sin, inputs.layout), cached[1])
        return super().forward(x, inputs, cached, query_from)


def test_decode_that_re_rotates_cached_keys_is_detected():
    model = tiny_model("rope")
    tokens = random_tokens(1, 12)
    full = model(tokens).logits
    for block in model.blocks:
        block.attn.__class__ = ReRotatingAttention
    assert (full - incremental_logits(model, tokens, prefill=4)).abs().max() > 1e-2


def test_greedy_generation_continues_positions():
    model = tiny_model("rope")
    prompt = random_tokens(2, 7)
    generated = model.generate_greedy(prompt, max_new_tokens=5)
    assert torch.equal(generated, full_pass_greedy(model, prompt, 5))  # a full pass per step


# ---------------------------------------------------------------- padding


@pytest.mark.parametrize("kind", ["rope", "sinusoidal", "learned", "alibi", "nope"])
def test_left_and_right_padding_agree_on_real_tokens(kind):
    model = tiny_model(kind)
    real = random_tokens(1, 9)[0]
    pad = 258
    left = torch.cat((torch.full((4,), pad), real))[None]
    right = torch.cat((real, torch.full((4,), pad)))[None]
    left_mask = torch.cat((torch.zeros(4), torch.ones(9)))[None]
    right_mask = torch.cat((torch.ones(9), torch.zeros(4)))[None]
    left_out = model(left, attention_mask=left_mask).logits[0, 4:]
    right_out = model(right, attention_mask=right_mask).logits[0, :9]
    unpadded = model(real[None]).logits[0]
    torch.testing.assert_close(left_out, unpadded, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(right_out, unpadded, atol=1e-4, rtol=1e-4)
    # negative control: without the mask the pads are attended to
    assert not torch.allclose(model(left).logits[0, 4:], unpadded, atol=1e-3)
    if kind in ("sinusoidal", "learned"):
        # negative control: left padding with a shared arange(L) shifts the real tokens' positions
        # (harmless only for the relative families, whose scores see position differences)
        shared = model(left, attention_mask=left_mask, position_ids=torch.arange(13)).logits[0, 4:]
        assert not torch.allclose(shared, unpadded, atol=1e-3)


# ---------------------------------------------------------------- position families


def test_nope_attention_without_mask_is_permutation_equivariant():
    torch.manual_seed(0)
    attention = tiny_model("nope").blocks[0].attn
    x = torch.randn(1, 10, 32)
    perm = torch.randperm(10)

    def unmasked(x, rope=False):
        q = attention.q_proj(x).view(1, 10, 4, 8).transpose(1, 2)
        k, v = attention.kv_proj(x).view(1, 10, 2, 4, 8).permute(2, 0, 3, 1, 4)
        if rope:
            from models.positions import apply_rope

            inv_freq = 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8)
            q, k = (
                apply_rope(q, torch.arange(10), inv_freq),
                apply_rope(k, torch.arange(10), inv_freq),
            )
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return out.transpose(1, 2).reshape(1, 10, 32)

    torch.testing.assert_close(unmasked(x[:, perm]), unmasked(x)[:, perm])
    # negative controls: a position signal (RoPE) or the causal mask breaks equivariance
    assert not torch.allclose(
        unmasked(x[:, perm], rope=True), unmasked(x, rope=True)[:, perm], atol=1e-4
    )
    model = tiny_model("nope")
    tokens = random_tokens(1, 10)
    assert not torch.allclose(
        model(tokens[:, perm]).logits, model(tokens).logits[:, perm], atol=1e-4
    )


@pytest.mark.parametrize(
    "kind, relative",
    [("rope", True), ("alibi", True), ("nope", True), ("sinusoidal", False), ("learned", False)],
)
def test_shifting_all_positions_changes_only_absolute_models(kind, relative):
    model = tiny_model(kind, train_length=64)
    tokens = random_tokens(2, 16)
    base = model(tokens).logits
    shifted = model(tokens, position_ids=torch.arange(16) + 37).logits
    assert torch.allclose(base, shifted, atol=1e-4) == relative


def test_learned_positions_work_at_max_and_fail_one_beyond():
    model = tiny_model("learned", train_length=16)
    model(random_tokens(1, 16))
    with pytest.raises(ValueError, match="max_positions=16"):
        model(random_tokens(1, 17))
    clamp = tiny_model("learned", train_length=16, out_of_range="clamp")
    assert clamp(random_tokens(1, 17)).logits.shape == (1, 17, 259)
    interpolate = tiny_model("learned", train_length=16, out_of_range="interpolate")
    assert interpolate(random_tokens(1, 40)).logits.isfinite().all()


def test_grouped_query_attention_and_layernorm_gelu_run_and_cache():
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, mlp="gelu", norm="layer")
    model = tiny_model("rope", model_cfg=cfg)
    tokens = random_tokens(2, 10)
    full = model(tokens).logits
    torch.testing.assert_close(incremental_logits(model, tokens, 3), full, atol=1e-4, rtol=1e-4)
    assert model.blocks[0].attn.kv_proj.out_features == 2 * 2 * 8


@pytest.mark.parametrize("kind", ["rope", "alibi", "nope"])
def test_tiled_attention_path_matches_fused_kernel(kind, monkeypatch):
    model = tiny_model(kind)
    tokens = random_tokens(2, 24)
    fused = model(tokens).logits
    monkeypatch.setattr(tiled_attention, "ATTENTION_TILE_ELEMENTS", 2 * 4 * 24 * 5)  # 5-query tiles
    out = model(tokens, output_attn_entropy=True, output_hidden_states=True)
    torch.testing.assert_close(out.logits, fused, atol=1e-4, rtol=1e-4)
    assert len(out.attn_entropy) == 2 and out.attn_entropy[0].shape == (2, 4, 24)
    assert len(out.hidden_states) == 3
    # the first query sees one key: zero entropy; no row exceeds log(#visible keys)
    assert out.attn_entropy[0][:, :, 0].abs().max() < 1e-5
    limit = torch.log(torch.arange(1, 25).float())
    assert bool((out.attn_entropy[1] <= limit + 1e-4).all())


# ---------------------------------------------------------------- eval-time scaling


def test_scaling_applies_where_meaningful_and_errors_otherwise():
    rope = tiny_model("rope", train_length=16)
    tokens = random_tokens(1, 64)
    raw = rope(tokens).logits
    rope.set_scaling(ScalingConfig("linear", "linear", {"factor": "auto"}), eval_length=64)
    assert rope.scaling.params["factor"] == 4.0
    assert not torch.allclose(rope(tokens).logits, raw, atol=1e-4)
    rope.set_scaling(None)
    torch.testing.assert_close(rope(tokens).logits, raw)

    learned = tiny_model("learned", train_length=16)
    learned.set_scaling(ScalingConfig("linear", "linear", {"factor": "auto"}), eval_length=64)
    assert learned(tokens).logits.isfinite().all()
    with pytest.raises(ValueError, match="'yarn' does not apply to position family 'learned'"):
        learned.set_scaling(ScalingConfig("yarn", "yarn", {"factor": 4.0}))
    with pytest.raises(ValueError, match="'teleport' is unknown"):
        learned.set_scaling(ScalingConfig("x", "teleport"))
    with pytest.raises(ValueError, match="'auto' needs an eval"):
        rope.set_scaling(ScalingConfig("yarn", "yarn", {"factor": "auto"}))


def test_logn_changes_logits_only_beyond_training_length():
    model = tiny_model("alibi", train_length=16)
    short, long = random_tokens(1, 16), random_tokens(1, 48)
    raw_short, raw_long = model(short).logits, model(long).logits
    model.set_scaling(ScalingConfig("logn", "default", {}, logn=True))
    torch.testing.assert_close(model(short).logits, raw_short)
    assert not torch.allclose(model(long).logits, raw_long, atol=1e-4)


# ---------------------------------------------------------------- log-n per query (issue 11, item 1)

LOGN = ScalingConfig("logn", "default", {}, logn=True)


def test_logn_query_scale_is_qwens_logn_list():
    # Qwen-7B: logn_list = [math.log(i, seq_length) if i > seq_length else 1 for i in range(1, ...)],
    # indexed by the query's position j (i = j + 1)
    for length in (16, 256):
        qwen = [math.log(i, length) if i > length else 1 for i in range(1, 20 * length)]
        ours = logn_query_scale(torch.arange(20 * length - 1), length)
        torch.testing.assert_close(ours, torch.tensor(qwen), rtol=1e-7, atol=0)
        assert bool((ours[:length] == 1).all()) and bool((ours[length:] > 1).all())
        assert ours[5 * length - 1].item() == pytest.approx(logn_factor(5 * length, length))


@pytest.mark.parametrize("kind", ["rope", "alibi"])
def test_logn_leaves_positions_before_the_training_length_alone(kind):
    # causal: what position p < L predicts does not depend on how many tokens follow it
    model = tiny_model(kind, train_length=16)
    tokens = random_tokens(1, 16 * 16)
    raw = model(tokens).logits
    model.set_scaling(LOGN)
    window_l, window_16l = model(tokens[:, :16]).logits, model(tokens).logits
    torch.testing.assert_close(window_16l[:, :16], window_l, atol=1e-5, rtol=0)
    torch.testing.assert_close(window_16l[:, :16], raw[:, :16], atol=1e-5, rtol=0)
    # control: from position L on, log-n does change the logits
    assert not torch.allclose(window_16l[:, 16:], raw[:, 16:], atol=1e-3)


@pytest.mark.parametrize("kind", ["rope", "alibi"])
def test_logn_scales_the_query_at_position_j_by_log_base_l_of_j_plus_1(kind):
    length, p = 16, 40
    model = tiny_model(kind, train_length=length)
    tokens = random_tokens(1, length + 1)
    prefix = model(tokens[:, :length], use_cache=True).past  # queries < L: log-n leaves them alone
    at_p = torch.tensor([[p]])  # one query at position p, explicit (a gap after the prefix)
    model.set_scaling(LOGN)
    out = model(tokens[:, length:], past=prefix, position_ids=at_p).logits
    model.set_scaling(None)

    def raw_with(query_factor, bias_factor=1.0):
        """The raw model with every query (and optionally the ALiBi bias) multiplied by a factor."""
        scaled = copy.deepcopy(model)
        with torch.no_grad():
            for block in scaled.blocks:
                block.attn.q_proj.weight.mul_(query_factor)
            if kind == "alibi":
                scaled.slopes.mul_(bias_factor)
        return scaled(tokens[:, length:], past=prefix, position_ids=at_p).logits

    torch.testing.assert_close(out, raw_with(math.log(p + 1) / math.log(length)))
    # controls: the off-by-one log(p)/log(L), and no scaling at all, are told apart
    assert not torch.allclose(out, raw_with(math.log(p) / math.log(length)), atol=1e-4)
    assert not torch.allclose(out, raw_with(1.0), atol=1e-4)
    if kind == "alibi":  # log-n scales q.k only, never the ALiBi distance bias
        factor = math.log(p + 1) / math.log(length)
        assert not torch.allclose(out, raw_with(factor, bias_factor=factor), atol=1e-4)


@pytest.mark.parametrize("kind", ["rope", "alibi"])
def test_logn_with_kv_cache_equals_the_full_forward(kind):
    model = tiny_model(kind, train_length=8)
    model.set_scaling(LOGN)
    tokens = random_tokens(2, 40)
    full = model(tokens).logits
    assert (full - incremental_logits(model, tokens, prefill=5)).abs().max().item() < 1e-4
    # control: the decoded positions 8..39 are really scaled
    model.set_scaling(None)
    assert not torch.allclose(model(tokens).logits[:, 8:], full[:, 8:], atol=1e-3)


# ---------------------------------------------------------------- padding x length-dependent scaling (item 3)

DYNAMIC = ScalingConfig("dynamic", "dynamic", {"factor": 2.0})
LONGROPE = ScalingConfig(
    "longrope", "longrope", {"factor": "auto", "short_factor": 1.0, "long_factor": "ramp"}
)


def left_pad(rows, pad=258):
    """Rows of different lengths, left-padded to the longest -> (ids [N, W], attention_mask [N, W])."""
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.cat((torch.full((width - len(r),), pad), r)) for r in rows])
    mask = torch.stack([torch.cat((torch.zeros(width - len(r)), torch.ones(len(r)))) for r in rows])
    return ids, mask


@pytest.mark.parametrize(
    ("kind", "scaling"),
    [
        ("rope", None),  # control: the raw model never depended on the padded width
        ("rope", DYNAMIC),
        ("rope", LONGROPE),
        ("rope", LOGN),
        ("alibi", LOGN),
        ("sinusoidal", DYNAMIC),
    ],
    ids=[
        "rope-raw",
        "rope-dynamic",
        "rope-longrope",
        "rope-logn",
        "alibi-logn",
        "sinusoidal-dynamic",
    ],
)
def test_a_left_padded_row_equals_the_same_row_alone(kind, scaling):
    # each row's length-dependent scaling follows its own length, never its batch neighbours'
    model = tiny_model(kind, train_length=16)
    model.set_scaling(scaling, eval_length=64)
    rows = [random_tokens(1, n, seed=n)[0] for n in (64, 24, 12)]
    ids, mask = left_pad(rows)
    batched = model(ids, attention_mask=mask).logits
    for i, row in enumerate(rows):
        alone = model(row[None]).logits[0]
        torch.testing.assert_close(batched[i, 64 - len(row) :], alone, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("scaling", [DYNAMIC, LOGN], ids=["dynamic", "logn"])
def test_greedy_generation_of_a_left_padded_batch_equals_each_row_alone(scaling):
    model = tiny_model("rope", train_length=16)
    model.set_scaling(scaling)
    rows = [random_tokens(1, n, seed=n)[0] for n in (30, 20, 9)]
    ids, mask = left_pad(rows)
    generated = model.generate_greedy(ids, max_new_tokens=6, attention_mask=mask)
    for i, row in enumerate(rows):
        assert torch.equal(generated[i], model.generate_greedy(row[None], max_new_tokens=6)[0])


@pytest.mark.parametrize("kind", ["rope", "sinusoidal"])
def test_linear_scaling_equals_halving_positions(kind):
    # PI divides positions by the factor: factor 2 at positions 0, 2, 4, ... equals raw at 0, 1, 2, ...
    model = tiny_model(kind, train_length=16)
    tokens = random_tokens(1, 32)
    raw = model(tokens).logits
    model.set_scaling(ScalingConfig("linear", "linear", {"factor": 2.0}))
    torch.testing.assert_close(model(tokens, position_ids=2 * torch.arange(32)).logits, raw)
    # negative control: the same scaled model at unscaled positions 0, 1, 2, ... differs
    assert not torch.allclose(model(tokens).logits, raw, atol=1e-4)


def test_bad_model_configs_raise_clear_errors():
    with pytest.raises(ValueError, match="even rotary dimension"):
        DecoderLM(ModelConfig(d_model=36, n_heads=4), PositionConfig(kind="rope"), 16)
    with pytest.raises(ValueError, match="not divisible by n_heads"):
        DecoderLM(ModelConfig(d_model=30, n_heads=4), PositionConfig(kind="nope"), 16)
    with pytest.raises(ValueError, match="position ids must be >= 0"):
        tiny_model("rope")(random_tokens(1, 4), position_ids=torch.tensor([-1, 0, 1, 2]))


def test_longrope_shorthands_expand_to_per_dimension_lists():
    model = tiny_model("rope", train_length=16)  # head_dim 8 -> 4 rotary pairs
    model.set_scaling(
        ScalingConfig(
            "longrope", "longrope", {"factor": "auto", "short_factor": 1.0, "long_factor": "ramp"}
        ),
        eval_length=64,
    )
    assert model.scaling.params["short_factor"] == [1.0] * 4
    assert model.scaling.params["long_factor"] == pytest.approx(
        [1.0, 4 ** (1 / 3), 4 ** (2 / 3), 4.0]
    )
    long_logits = model(random_tokens(1, 64)).logits  # long factors: seq_len 64 > 16
    assert long_logits.isfinite().all()
    with pytest.raises(ValueError, match="long_factor"):
        model.set_scaling(
            ScalingConfig(
                "longrope", "longrope", {"factor": 4.0, "short_factor": 1.0, "long_factor": "steep"}
            )
        )


def test_scaled_restores_the_previous_scaling_also_on_exceptions():
    model = tiny_model("rope", train_length=16)
    tokens = random_tokens(1, 64)
    raw = model(tokens).logits
    yarn = ScalingConfig("yarn", "yarn", {"factor": "auto"})
    with model.scaled(yarn, 64):
        assert model.scaling.method == "yarn" and model.scaling.params["factor"] == 4.0
        scaled_logits = model(tokens).logits
    assert model.scaling.method == "default"
    torch.testing.assert_close(model(tokens).logits, raw)
    with pytest.raises(RuntimeError, match="boom"), model.scaled(yarn, 64):
        raise RuntimeError("boom")
    assert model.scaling.method == "default"
    torch.testing.assert_close(model(tokens).logits, raw)
    # a scaling set before the block comes back too, with its own resolved factor
    model.set_scaling(ScalingConfig("linear", "linear", {"factor": 2.0}))
    with model.scaled(yarn, 64):
        pass
    assert model.scaling.method == "linear" and model.scaling.params["factor"] == 2.0
    # negative control: the scaling inside the block was really different from the raw model
    assert not torch.allclose(scaled_logits, raw, atol=1e-4)
    # and set_scaling without scaled() does not restore anything
    model.set_scaling(yarn, 64)
    assert model.scaling.method == "yarn"


def test_position_range_error_matches_the_forward_pass_and_needs_no_model():
    cfg = PositionConfig(kind="learned")
    model = tiny_model("learned", train_length=16)
    assert model.position_range_error(15, 16) is None
    problem = model.position_range_error(16, 17)
    assert "max_positions=16" in problem
    with pytest.raises(ValueError) as error:  # the forward pass refuses with the same sentence
        model(random_tokens(1, 17))
    assert str(error.value) == problem
    assert cfg.range_error(16, 17, train_length=16) == problem  # config level, no model
    # linear interpolation at factor 2 stretches the table to 32 positions, but not to 33
    linear = ScalingConfig("linear", "linear", {"factor": "auto"})
    with model.scaled(linear, 32):
        assert model.position_range_error(31, 32) is None
        model(random_tokens(1, 32))
        assert model.position_range_error(32, 33) is not None
    resolved = resolved_scaling(linear, model.model_cfg, cfg, 16, 32)
    assert resolved.position_factor == 2.0
    assert cfg.range_error(31, 32, 16, resolved.position_factor) is None
    assert cfg.range_error(32, 33, 16, resolved.position_factor) is not None
    # clamp and interpolate accept every position; relative families never refuse
    for policy in ("clamp", "interpolate"):
        assert PositionConfig(kind="learned", out_of_range=policy).range_error(99, 100, 16) is None
    assert tiny_model("rope", train_length=16).position_range_error(10**6, 10**6 + 1) is None


def test_resolve_scaling_checks_a_scaling_without_a_model():
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=4)
    yarn = ScalingConfig("yarn", "yarn", {"factor": "auto"})
    out = resolve_scaling(yarn, cfg, PositionConfig(kind="rope"), 16, 64)
    assert out.params["factor"] == 4.0 and yarn.params["factor"] == "auto"  # a copy
    with pytest.raises(ValueError, match="'yarn' does not apply to position family 'learned'"):
        resolve_scaling(yarn, cfg, PositionConfig(kind="learned"), 16, 64)
    with pytest.raises(ValueError, match="beta_fast must be >= beta_slow"):
        resolve_scaling(
            ScalingConfig("yarn", "yarn", {"factor": 2.0, "beta_fast": 1, "beta_slow": 4}),
            cfg,
            PositionConfig(kind="rope"),
            16,
        )
    # the model's set_scaling is the same check
    model = tiny_model("rope", train_length=16)
    model.set_scaling(yarn, 64)
    assert model.scaling == out


# ---------------------------------------------------------------- logits for a suffix only


@pytest.mark.parametrize(
    ("kind", "scaling", "padded", "cached"),
    [
        ("rope", None, False, False),
        ("rope", DYNAMIC, True, False),
        ("rope", LOGN, False, False),
        ("rope", None, False, True),
        ("alibi", None, True, False),
        ("alibi", LOGN, False, True),
        ("learned", None, False, False),
        ("sinusoidal", DYNAMIC, True, False),
        ("nope", None, False, False),
    ],
    ids=[
        "rope",
        "rope-dynamic-padded",
        "rope-logn",
        "rope-after-cache",
        "alibi-padded",
        "alibi-logn-after-cache",
        "learned",
        "sinusoidal-dynamic-padded",
        "nope",
    ],
)
def test_logits_from_equals_the_full_pass_suffix(kind, scaling, padded, cached):
    model = tiny_model(
        kind,
        train_length=40 if kind == "learned" else 16,  # a learned table has no position 40
        model_cfg=ModelConfig(n_layers=3, d_model=32, n_heads=4),
    )
    model.set_scaling(scaling, eval_length=40)
    ids = random_tokens(2, 40)
    mask = torch.ones(2, 40)
    if padded:
        mask[1, :9] = 0  # row 1 is left-padded
    past = None
    if cached:  # 10 tokens in the cache, 30 new ones
        past = model(ids[:, :10], attention_mask=mask[:, :10], use_cache=True).past
        ids, mask = ids[:, 10:], mask[:, 10:]
    full = model(ids, attention_mask=mask, past=past).logits
    suffix = model(ids, attention_mask=mask, past=past, logits_from=22).logits
    assert suffix.shape == (2, ids.shape[1] - 22, full.shape[-1])
    torch.testing.assert_close(suffix, full[:, 22:], atol=1e-5, rtol=1e-5)
    # negative control: the suffix's logits depend on the tokens before it
    alone = model(ids[:, 22:], attention_mask=mask[:, 22:]).logits
    assert (alone - full[:, 22:]).abs().max() > 1e-2


def test_logits_from_skips_the_last_layers_work_on_earlier_tokens():
    from torch.utils.flop_counter import FlopCounterMode

    model = tiny_model("rope", model_cfg=ModelConfig(n_layers=2, d_model=64, n_heads=4))
    ids = random_tokens(2, 64)

    def flops(**kwargs):
        with FlopCounterMode(display=False) as counter:
            model(ids, **kwargs)
        return counter.get_total_flops()

    full, suffix = flops(), flops(logits_from=48)
    print(f"FLOPs: full {full:,}, logits_from=48 of 64 {suffix:,} ({suffix / full:.2f})")
    # the last of 2 layers keeps only its key/value projections for 48 of 64 tokens
    assert suffix < 0.8 * full
    # control: logits_from=0 is the full pass
    assert flops(logits_from=0) == full


def test_logits_from_refuses_bad_values_with_one_sentence():
    model = tiny_model("rope")
    ids = random_tokens(1, 8)
    for bad in (-1, 8, 9):
        with pytest.raises(
            ValueError, match=rf"logits_from must be in \[0, 8\) for 8 tokens, got {bad}\.$"
        ):
            model(ids, logits_from=bad)
    for flag in ("output_hidden_states", "output_attn_entropy"):
        with pytest.raises(ValueError, match="cannot be combined with output_hidden_states"):
            model(ids, logits_from=2, **{flag: True})
