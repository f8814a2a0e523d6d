"""Flex attention (the CUDA path for ALiBi, padding and chunked cache prefill) equals the tiled path.

Run on CPU: eager flex for the semantics (score_mod and mask_mod), compiled flex (inductor) with
small blocks for the block mask, and a whole ALiBi model with flex forced on. Each comparison has a
negative control that must differ. Skips with the reason when flex attention does not run here.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch

import models.attention as attention_module
import models.flex as flex_module
from models.attention_inputs import AttentionInputs
from models.flex import (
    _dense_to_kv_blocks,
    _flex_mode,
    attend_flex,
    flex_attention_unavailable,
    flex_block_mask,
    flex_mask_mod,
    flex_score_mod,
    use_flex,
)
from models.positions import (
    ScoreBias,
    alibi_bias,
    alibi_slopes,
)
from models.tiled_attention import attend_tiled
from models.transformer import ModelConfig

from fixtures.attention import attention_case, block_matrix, dense_reference

pytestmark = pytest.mark.usefixtures("one_thread")

ATOL = 1e-5


@functools.cache
def _flex_on_cpu_failure() -> str | None:
    """Why flex attention cannot run on CPU in this torch (None if it can)."""
    reason = flex_attention_unavailable()
    if reason is not None:
        return reason
    q, k, v, inputs = make_case(n=1, h=2, g=2, length=3, past=0, d=4)
    try:
        attend_flex(q, k, v, inputs, compiled=False)
    except Exception as error:  # noqa: BLE001 - the reason string names whatever failed
        return f"flex attention fails on CPU in torch {torch.__version__}: {type(error).__name__}: {error}"
    return None


@pytest.fixture
def flex_cpu():
    reason = _flex_on_cpu_failure()
    if reason is not None:
        pytest.skip(reason)


def _bucketed(head, q_pos, k_pos, table):
    return table[head, (q_pos - k_pos).clamp(0, table.shape[1] - 1)]


def bucket_bias(h: int, buckets: int = 6, seed: int = 1) -> ScoreBias:
    """A score bias unlike ALiBi's: a random per-head value per clipped distance bucket (T5-like),
    gathered by index, so a kernel that only handles linear biases would get it wrong."""
    return ScoreBias(
        _bucketed, (torch.randn(h, buckets, generator=torch.Generator().manual_seed(seed)),)
    )


def make_case(
    n=2, h=4, g=4, length=7, past=0, d=8, alibi=True, pad=None, seed=0, shift=0, spread=1, bias=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, AttentionInputs]:
    """:func:`fixtures.attention.attention_case` with ALiBi's bias by default (ALiBi is
    shift-invariant, so only a ``spread`` tells position ids from indices)."""
    bias = bias or (alibi_bias(alibi_slopes(h)) if alibi else None)
    return attention_case(n, h, g, length, past, d, pad, seed, shift, spread, score_bias=bias)


def tiled(q, k, v, inputs):
    return attend_tiled(q, k, v, inputs)[0]


CASES = {
    # name: make_case keyword arguments
    "alibi-causal": dict(length=9),
    "alibi-shifted-positions": dict(length=9, shift=5),
    "alibi-spread-positions": dict(length=9, spread=3, pad=[2, 0]),
    "alibi-spread-positions-cache": dict(length=3, past=6, spread=2, pad=[0, 4]),
    "alibi-left-padding": dict(length=9, pad=[3, 0]),
    "padding-without-alibi": dict(length=9, pad=[0, 4], alibi=False),
    "alibi-cache-decode-1": dict(length=1, past=8, pad=[2, 0]),
    "alibi-cache-decode-1-unpadded": dict(length=1, past=8),
    "alibi-cache-decode-3": dict(length=3, past=6, pad=[0, 5]),
    "cache-chunk-without-alibi": dict(length=4, past=5, alibi=False),
    "alibi-gqa": dict(h=4, g=2, length=9, pad=[1, 0]),
    "alibi-gqa-cache": dict(h=4, g=1, length=2, past=7),
    "bucket-bias-padded-cache": dict(length=3, past=6, spread=2, pad=[0, 4], bias=bucket_bias(4)),
    "bucket-bias-gqa": dict(h=4, g=2, length=9, pad=[1, 0], spread=2, bias=bucket_bias(4)),
}


# ------------------------------------------------------------------ eager flex: the semantics


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_eager_flex_equals_the_tiled_path(flex_cpu, case):
    q, k, v, inputs = make_case(**case)
    reference = tiled(q, k, v, inputs)
    out = attend_flex(q, k, v, inputs, compiled=False)
    assert out.shape == reference.shape
    torch.testing.assert_close(out, reference, atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize(
    "case", ["alibi-causal", "alibi-left-padding", "alibi-cache-decode-3", "alibi-gqa"]
)
def test_negative_controls_wrong_slope_sign_or_no_mask_differ(flex_cpu, case):
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v, inputs = make_case(**CASES[case])
    reference = tiled(q, k, v, inputs)
    gqa = q.shape[1] != k.shape[1]
    # the ALiBi bias with its sign flipped: near keys are penalised instead of far ones
    flipped_bias = alibi_bias(-alibi_slopes(q.shape[1]))
    flipped = AttentionInputs(**{**vars(inputs), "score_bias": flipped_bias, "flex_cache": {}})
    wrong_sign = attend_flex(q, k, v, flipped, compiled=False)
    assert (wrong_sign - reference).abs().max() > 0.1
    # the ALiBi score_mod without the causal/padding mask: future (and padding) keys are seen
    unmasked = flex_attention(
        q, k, v, score_mod=flex_score_mod(inputs, q.device), scale=inputs.scale, enable_gqa=gqa
    )
    assert (unmasked - reference).abs().max() > 0.1


def test_negative_control_mask_without_the_cache_offset_differs(flex_cpu):
    # causality by the index within the new tokens (forgetting past_len) hides most of the cache
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v, inputs = make_case(**CASES["alibi-cache-decode-3"])
    forgetful = AttentionInputs(**{**vars(inputs), "past_len": 0, "flex_cache": {}})
    n, _, length, _ = q.shape
    block_mask = flex_block_mask(forgetful, n, length, k.shape[2], q.device)
    score_mod = flex_score_mod(inputs, q.device)
    out = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=inputs.scale)
    reference = tiled(q, k, v, inputs)
    torch.testing.assert_close(attend_flex(q, k, v, inputs, compiled=False), reference)
    assert (out - reference).abs().max() > 0.1


def test_entropy_requests_are_refused(flex_cpu):
    q, k, v, inputs = make_case()
    inputs.want_entropy = True
    with pytest.raises(ValueError, match="entropy"):
        attend_flex(q, k, v, inputs, compiled=False)


# ------------------------------------------------------------------ the block mask


BLOCK_CASES = {
    "causal": dict(length=21),
    "causal-cache": dict(length=13, past=11),
    "decode-1": dict(length=1, past=20),
    "padded": dict(length=21, pad=[9, 0, 17]),
    "padded-cache": dict(length=6, past=19, pad=[0, 12, 25]),
    "padded-decode-1": dict(length=1, past=20, pad=[16, 3, 0]),
    "padding-inside-a-block": dict(length=16, pad=[1, 0, 7]),
}


@pytest.mark.parametrize("block_size", [2, 4, 8])
@pytest.mark.parametrize("case", BLOCK_CASES.values(), ids=BLOCK_CASES.keys())
def test_block_mask_equals_create_block_mask(flex_cpu, case, block_size):
    # the index arithmetic against flex's own construction, which evaluates every entry
    from torch.nn.attention.flex_attention import create_block_mask

    n = 3 if "pad" in case else 1
    q, k, v, inputs = make_case(n=n, **case)
    length, s = q.shape[2], k.shape[2]
    ours = flex_block_mask(inputs, n, length, s, torch.device("cpu"), block_size)
    theirs = create_block_mask(
        flex_mask_mod(inputs, q.device),
        n,
        None,
        length,
        s,
        device="cpu",
        BLOCK_SIZE=block_size,
    )
    assert ours.seq_lengths == theirs.seq_lengths == (length, s)
    assert ours.BLOCK_SIZE == theirs.BLOCK_SIZE
    partial = block_matrix(ours.kv_num_blocks, ours.kv_indices)
    full = block_matrix(ours.full_kv_num_blocks, ours.full_kv_indices)
    assert torch.equal(partial, block_matrix(theirs.kv_num_blocks, theirs.kv_indices))
    assert torch.equal(full, block_matrix(theirs.full_kv_num_blocks, theirs.full_kv_indices))
    if case.get("past", 0) == 0 and length > block_size:
        assert full.any() and partial.any()  # both kinds occur, so the comparison means something


# ------------------------------------------------------------------ compiled flex (inductor, CPU)

# blocks of 2: several query and key blocks even in a 3-token chunk, so that the compiled tests
# share one compilation for several new tokens and one for a single one
BLOCK = 2
COMPILED_CASE = dict(n=2, h=4, g=2, length=13, past=10, d=8, pad=[0, 14])


@functools.cache
def _compiled_flex_on_cpu_failure() -> str | None:
    """Why compiled flex attention cannot run on CPU here (None if it can): a compiler failure
    (no C++ toolchain, say) skips; any other error fails the test that asked."""
    before = flex_module.FLEX_BLOCK_SIZE
    flex_module.FLEX_BLOCK_SIZE = BLOCK
    try:
        with torch.no_grad():  # the compilation the tests below then reuse
            attend_flex(*make_case(**COMPILED_CASE))
    except torch._dynamo.exc.BackendCompilerFailed as error:
        return f"compiled flex attention fails on CPU: {type(error).__name__}: {error}"[:500]
    finally:
        flex_module.FLEX_BLOCK_SIZE = before
    return None


@pytest.fixture
def compiled_flex_cpu(flex_cpu):
    reason = _compiled_flex_on_cpu_failure()
    if reason is not None:
        pytest.skip(reason)


@torch.no_grad()  # as in evaluation (and the model test below: one compilation for both)
def test_compiled_flex_with_block_sparsity_equals_the_tiled_path(compiled_flex_cpu, monkeypatch):
    # blocks of 2 over 13 queries x 23 keys: skipped, partial and full blocks all occur
    from torch.nn.attention.flex_attention import BlockMask

    monkeypatch.setattr(flex_module, "FLEX_BLOCK_SIZE", BLOCK)
    q, k, v, inputs = make_case(**COMPILED_CASE)
    reference = tiled(q, k, v, inputs)
    torch.testing.assert_close(attend_flex(q, k, v, inputs), reference, atol=ATOL, rtol=ATOL)
    # negative control: the compiled kernel trusts the block mask; calling every visible block
    # full skips the mask inside blocks, so future and padding keys leak in
    good = flex_block_mask(inputs, 2, 13, 23, q.device, BLOCK)
    partial = block_matrix(good.kv_num_blocks, good.kv_indices)
    full = block_matrix(good.full_kv_num_blocks, good.full_kv_indices)
    assert partial.any()
    leaky = BlockMask.from_kv_blocks(
        *_dense_to_kv_blocks(torch.zeros_like(partial)),
        *_dense_to_kv_blocks(partial | full),
        BLOCK_SIZE=BLOCK,
        mask_mod=good.mask_mod,
        seq_lengths=(13, 23),
    )
    out = flex_module._flex_kernel(True)(
        q,
        k,
        v,
        score_mod=flex_score_mod(inputs, q.device),
        block_mask=leaky,
        scale=inputs.scale,
        enable_gqa=True,
    )
    assert (out - reference).abs().max() > 0.1


# ------------------------------------------------------------------ the whole model


def test_alibi_model_with_flex_forced_equals_the_default_path(
    compiled_flex_cpu, tiny_model, monkeypatch
):
    # padded batch, prefill + decode through the KV cache, greedy generation: flex on vs off
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2)
    model = tiny_model("alibi", model_cfg=cfg)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (2, 12), generator=gen)
    mask = torch.ones(2, 12)
    mask[1, :5] = 0  # row 1 is left-padded

    @torch.no_grad()  # flex has no backward on CPU (with a gradient, CPU stays tiled)
    def run():
        full = model(ids, attention_mask=mask).logits
        out = model(ids[:, :7], attention_mask=mask[:, :7], use_cache=True)
        pieces = [out.logits]
        out = model(ids[:, 7:10], past=out.past, use_cache=True)  # a chunk of 3 after the cache
        pieces.append(out.logits)
        for t in (10, 11):
            out = model(ids[:, t : t + 1], past=out.past, use_cache=True)
            pieces.append(out.logits)
        generated = model.generate_greedy(ids, max_new_tokens=3, attention_mask=mask)
        return full, torch.cat(pieces, dim=1), generated

    monkeypatch.setattr(flex_module, "FLEX_BLOCK_SIZE", BLOCK)  # several blocks, as on GPU
    calls = []
    monkeypatch.setattr(
        attention_module,  # where attend looks attend_flex up
        "attend_flex",
        lambda *args, **kwargs: calls.append(1) or attend_flex(*args, **kwargs),
    )
    monkeypatch.setattr(flex_module, "FLEX_ATTENTION", "off")
    tiled_full, tiled_steps, tiled_generated = run()
    assert not calls
    monkeypatch.setattr(flex_module, "FLEX_ATTENTION", "always")
    flex_full, flex_steps, flex_generated = run()
    assert calls  # flex really ran
    real = mask.bool()
    torch.testing.assert_close(flex_full[real], tiled_full[real], atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(flex_steps[real], tiled_steps[real], atol=ATOL, rtol=ATOL)
    # and the cache is consistent: prefill + chunk + decode equals the full forward
    torch.testing.assert_close(flex_full[real], flex_steps[real], atol=1e-4, rtol=1e-4)
    assert torch.equal(flex_generated, tiled_generated)


@torch.no_grad()
def test_flex_logits_from_equals_the_full_pass_suffix(compiled_flex_cpu, tiny_model, monkeypatch):
    # the last layer's queries start at logits_from: the block mask must be offset like a cache's
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2)
    model = tiny_model("alibi", model_cfg=cfg)
    ids = torch.randint(0, 256, (2, 15), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 15)
    mask[0, :4] = 0  # row 0 is left-padded
    monkeypatch.setattr(flex_module, "FLEX_BLOCK_SIZE", BLOCK)
    monkeypatch.setattr(flex_module, "FLEX_ATTENTION", "off")
    tiled = model(ids, attention_mask=mask).logits
    monkeypatch.setattr(flex_module, "FLEX_ATTENTION", "always")
    calls = []
    monkeypatch.setattr(
        attention_module,  # where attend looks attend_flex up
        "attend_flex",
        lambda *args, **kwargs: calls.append(args[0].shape[2]) or attend_flex(*args, **kwargs),
    )
    suffix = model(ids, attention_mask=mask, logits_from=9).logits
    assert calls == [15, 6]  # both layers ran flex, the last one with the 6 suffix queries
    torch.testing.assert_close(suffix, tiled[:, 9:], atol=ATOL, rtol=ATOL)


def test_cpu_default_never_takes_the_flex_path(tiny_model, monkeypatch):
    monkeypatch.setattr(flex_module, "FLEX_ATTENTION", "auto")

    def refuse(*args, **kwargs):
        raise AssertionError("flex attention on CPU")

    monkeypatch.setattr(attention_module, "attend_flex", refuse)  # where attend looks it up
    model = tiny_model("alibi")
    ids = torch.randint(0, 256, (2, 6))
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    assert model.generate_greedy(ids, 2, attention_mask=mask).shape == (2, 2)


# ------------------------------------------------------------------ path selection


def fake_query(device="cuda", d=32, length=5):
    return SimpleNamespace(
        shape=(2, 4, length, d), device=SimpleNamespace(type=device), requires_grad=False
    )


@pytest.mark.parametrize(
    ("mode", "device", "case", "d", "expected"),
    [
        ("auto", "cuda", dict(length=5), 32, True),  # ALiBi
        ("auto", "cuda", dict(length=5, alibi=False, pad=[2, 0]), 32, True),  # padding
        ("auto", "cuda", dict(length=3, past=4, alibi=False), 32, True),  # chunk after a cache
        ("auto", "cuda", dict(length=1, past=4), 32, True),  # ALiBi decode
        ("auto", "cuda", dict(length=5, alibi=False), 32, False),  # plain causal: SDPA
        ("auto", "cuda", dict(length=1, past=4, alibi=False), 32, False),  # plain decode: SDPA
        ("auto", "cuda", dict(length=5), 8, False),  # head dim below the CUDA kernel's 16
        ("auto", "cpu", dict(length=5), 32, False),  # CPU stays tiled
        ("off", "cuda", dict(length=5), 32, False),
        ("always", "cpu", dict(length=5), 8, True),
        ("always", "cpu", dict(length=5, alibi=False), 8, False),  # plain stays SDPA
    ],
)
def test_use_flex_selects_the_path(monkeypatch, mode, device, case, d, expected):
    monkeypatch.setattr(flex_module, "FLEX_ATTENTION", mode)
    _, _, _, inputs = make_case(**case)
    query = fake_query(device, d, case["length"])
    assert use_flex(query, inputs) is (expected and flex_attention_unavailable() is None)
    inputs.want_entropy = True  # entropy needs probabilities: never flex
    assert use_flex(query, inputs) is False


def test_flex_mode_reads_the_environment_spellings():
    assert [_flex_mode(v) for v in ("auto", "1", "ON", "0", "off", "always")] == [
        "auto",
        "auto",
        "auto",
        "off",
        "off",
        "always",
    ]
    with pytest.raises(ValueError, match="LENBENCH_FLEX_ATTENTION"):
        _flex_mode("sometimes")


# ------------------------------------------------------------------ the score hook, by hand


@pytest.mark.parametrize(
    "case", ["bucket-bias-padded-cache", "bucket-bias-gqa", "alibi-spread-positions"]
)
def test_tiled_path_adds_the_score_bias_at_position_ids(case):
    q, k, v, inputs = make_case(**CASES[case])
    torch.testing.assert_close(tiled(q, k, v, inputs), dense_reference(q, k, v, inputs))
    # negative control: the same bias read at key indices instead of position ids differs
    s = k.shape[2]
    by_index = AttentionInputs(
        **{
            **vars(inputs),
            "k_pos": torch.arange(s).expand(q.shape[0], s),
            "q_pos": torch.arange(inputs.past_len, s).expand(q.shape[0], -1),
        }
    )
    assert (dense_reference(q, k, v, by_index) - tiled(q, k, v, inputs)).abs().max() > 1e-3
