"""Recurrent-state decoding of the token mixers (issue #75 Part B follow-up): a mixer of
``models.mixers`` continues from its state (``step``: its conv's last inputs and the recurrence's
state), and a model's KV cache keeps that state for a mixer layer instead of the layer's inputs.

Checked: the training path is bit for bit what it was before the state (the recurrence and the
mixers of commit ``BEFORE``, read from git); for each mixer a prefill and single-token steps, and
a prefill in chunks of odd sizes, equal the full pass; in the model (each mixer on every layer,
and the 1 : 1 hybrid with RoPE) cached decoding equals the full pass, left-padded rows equal the
unpadded ones (prefill, steps, ``generate_greedy``), a pad in a later step is skipped; the cache
entry of a mixer layer does not grow with the prefix (control: the recompute path's does)."""

from __future__ import annotations

import subprocess

import pytest
import test_mixers_common as common
import torch

from models.mixers import recurrence
from models.positions import PositionConfig
from models.transformer import DecoderLM, ModelConfig

from fixtures import ROOT
from fixtures.decoding import full_pass_greedy

#: the last commit whose mixers had no state: their training path must be bit for bit today's
BEFORE = "cab4d88"
MIXERS = ("gated_deltanet", "kda", "mamba2")
#: (mixer, hybrid_every, position): each mixer alone, and 1 : 1 with RoPE attention
MODELS = [(m, 0, "nope") for m in MIXERS] + [(m, 2, "rope") for m in MIXERS]


def _before(path: str, names: dict) -> dict:
    """The namespace of ``path`` as it was at BEFORE, run with ``names`` in place of its import
    of the old recurrence; skipped where the history is not here (an sdist, a shallow clone)."""
    try:
        shown = ["git", "show", f"{BEFORE}:{path}"]
        source = subprocess.run(shown, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"git history with {BEFORE} is not available")
    lines = [ln for ln in source.splitlines() if not ln.startswith("from models.mixers.recur")]
    namespace = {"__name__": f"before_{path.replace('/', '_')}", **names}
    exec(compile("\n".join(lines), path, "exec"), namespace)  # noqa: S102 - our own history
    return namespace


def test_the_training_path_is_bit_for_bit_the_recurrence_before_the_state():
    old = _before("models/mixers/recurrence.py", {})["chunked_recurrence"]
    gen = torch.Generator().manual_seed(3)
    for per_channel, delta, length, chunk in [
        (False, False, 37, 16), (False, True, 130, 64), (True, True, 45, 8), (False, True, 1, 64),
    ]:  # fmt: skip
        q, k = torch.randn(2, 2, 3, length, 8, generator=gen)
        v = torch.randn(2, 3, length, 6, generator=gen)
        decay = -3 * torch.rand(2, 3, length, *((8,) if per_channel else ()), generator=gen)
        beta = torch.rand(2, 3, length, generator=gen) if delta else None
        args = (q, k, v, decay, beta, chunk)
        assert torch.equal(recurrence.chunked_recurrence(*args), old(*args))
    # control: from another state the outputs move
    state = torch.randn(2, 3, 8, 6, generator=gen)
    assert not torch.equal(recurrence.chunked_recurrence(*args, initial_state=state), old(*args))


@pytest.mark.parametrize(
    ("name", "path", "cls"),
    [
        ("gated_deltanet", "models/mixers/gated_deltanet.py", "GatedDeltaNet"),
        ("kda", "models/mixers/kda.py", "KimiDeltaAttention"),
        ("mamba2", "models/mixers/mamba2.py", "Mamba2"),
    ],
)
def test_each_mixer_s_training_path_is_bit_for_bit_the_mixer_before_the_state(name, path, cls):
    """The same seed builds the same parameters (names, order and values: what a seed draws is
    unchanged), and outputs and gradients are equal to the bit."""
    old_recurrence = _before("models/mixers/recurrence.py", {})
    names = {n: old_recurrence[n] for n in ("ShortConv", "chunked_recurrence", "l2_normalize")}
    old_cls = _before(path, names)[cls]
    args = {"head_dim": 8, "d_state": 16} if name == "mamba2" else {"n_heads": common.HEADS}
    torch.manual_seed(0)
    old = old_cls(common.WIDTH, **args).state_dict()
    torch.manual_seed(0)
    new = common.BUILDERS[name]().state_dict()
    assert list(old) == list(new)
    assert all(torch.equal(old[key], new[key]) for key in old)
    new = common.randomized(common.BUILDERS[name])
    old = old_cls(common.WIDTH, **args)
    old.load_state_dict(new.state_dict())
    x = common.inputs(70).requires_grad_()
    outputs = {"new": new(x), "old": old(x)}
    assert torch.equal(outputs["new"], outputs["old"])
    grads = {
        key: torch.autograd.grad(outputs[key].square().mean(), [x, *mixer.parameters()])
        for key, mixer in (("new", new), ("old", old))
    }
    assert all(torch.equal(a, b) for a, b in zip(grads["new"], grads["old"], strict=True))


def _stepped(mixer, x: torch.Tensor, sizes, valid: torch.Tensor | None = None) -> torch.Tensor:
    """The mixer over x [N, L, D] in pieces of ``sizes`` tokens, each from the last's state."""
    outs, state, start = [], None, 0
    for size in sizes:
        part = None if valid is None else valid[:, start : start + size]
        y, state = mixer.step(x[:, start : start + size], state, part)
        outs.append(y)
        start += size
    assert start == x.shape[1]
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("name", MIXERS)
def test_a_prefill_then_single_token_steps_and_odd_chunks_equal_the_full_pass(name):
    """Prefill across chunk boundaries (130 > 2 x 64 tokens), then single tokens; or odd chunks
    throughout; a left-padded row equals the unpadded one (control: its padding read as tokens
    does not)."""
    mixer = common.randomized(common.BUILDERS[name])
    x = common.inputs(150)
    with torch.no_grad():
        full = mixer(x)
        for sizes in ([130] + [1] * 10 + [7, 3], [7, 1, 5, 13, 3, 11, 1, 9, 33, 67]):
            assert common.relative_diff(_stepped(mixer, x, sizes), full) < common.TOL, sizes
        padded = torch.cat((torch.randn(2, 6, common.WIDTH), x[:, :40]), dim=1)  # [2, 46, D]
        valid = torch.ones(2, 46, dtype=torch.bool)
        valid[0, :6] = False  # row 0: 6 pads, then x[0, :40]
        left = _stepped(mixer, padded, [19, 1, 1, 25], valid)
        assert common.relative_diff(left[0, 6:], full[0, :40]) < common.TOL
        assert common.relative_diff(left[1], mixer(padded[1:])[0]) < common.TOL
        read = _stepped(mixer, padded, [19, 1, 1, 25])[0, 6:]
        assert common.relative_diff(read, full[0, :40]) > 1e-3


def _model(name: str, every: int, position: str) -> DecoderLM:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, mixer=name, hybrid_every=every)
    return DecoderLM(cfg, PositionConfig(kind=position), 32).eval()


@pytest.mark.parametrize(("name", "every", "position"), MODELS)
def test_cached_decoding_equals_the_full_pass_and_padded_rows_the_unpadded(name, every, position):
    model = _model(name, every, position)
    ids = torch.randint(0, 259, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids).logits  # [N, L, V]
        for sizes in ([25] + [1] * 15, [7, 5, 1, 13, 3, 11]):
            out, logits, start = None, [], 0
            for size in sizes:
                past = None if out is None else out.past
                out = model(ids[:, start : start + size], past=past, use_cache=True)
                logits.append(out.logits)
                start += size
            torch.testing.assert_close(torch.cat(logits, dim=1), full, atol=1e-5, rtol=1e-5)
        # rows left-padded by 5 and 2: the real tokens' logits are each row's alone
        padded = torch.cat((torch.zeros(2, 5, dtype=torch.long), ids[:, :30]), dim=1)
        mask = torch.ones_like(padded, dtype=torch.bool)
        mask[0, :5] = False
        mask[1, :2] = False
        out = model(padded[:, :20], attention_mask=mask[:, :20], use_cache=True)
        logits = [out.logits]
        for t in range(20, 35):
            out = model(padded[:, t : t + 1], past=out.past, use_cache=True)
            logits.append(out.logits)
        logits = torch.cat(logits, dim=1)
        torch.testing.assert_close(logits[0, 5:], full[0, :30], atol=1e-5, rtol=1e-5)
        alone = model(padded[1:, 2:]).logits[0]
        torch.testing.assert_close(logits[1, 2:], alone, atol=1e-5, rtol=1e-5)
        generated = model.generate_greedy(padded, 6, attention_mask=mask)
        assert torch.equal(generated[:1], full_pass_greedy(model, ids[:1, :30], 6))
        assert torch.equal(generated[1:], full_pass_greedy(model, padded[1:, 2:], 6))


@pytest.mark.parametrize(("name", "every", "position"), MODELS[:3])
def test_a_pad_in_a_later_step_is_skipped(name, every, position):
    """Padding after a prefill (a step of 4 whose middle two are pads in row 0): row 0 then
    equals the sequence without those two tokens, row 1 the full pass."""
    model = _model(name, every, position)
    ids = torch.randint(0, 259, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model(ids[:, :10], use_cache=True)
        mask = torch.tensor([[True, False, False, True], [True] * 4])
        out = model(ids[:, 10:14], past=out.past, use_cache=True, attention_mask=mask)
        out = model(ids[:, 14:], past=out.past, use_cache=True)
        without = torch.cat((ids[:1, :11], ids[:1, 13:]), dim=1)
        expected = torch.stack((model(without).logits[0, -6:], model(ids).logits[1, -6:]))
        torch.testing.assert_close(out.logits, expected, atol=1e-5, rtol=1e-5)


def _mixer_cache_numel(model: DecoderLM, length: int) -> int:
    ids = torch.randint(0, 259, (2, length), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        past = model(ids, use_cache=True).past
    mixer_layers = [i for i, block in enumerate(model.blocks) if block.mixer is not None]
    return sum(t.numel() for i in mixer_layers for t in past.layers[i])


@pytest.mark.parametrize(("name", "every", "position"), MODELS)
def test_a_mixer_layer_s_cache_does_not_grow_with_the_prefix(name, every, position):
    """The same size after 12 and after 60 tokens; control: the recompute path (the layer's
    inputs [N, S, D], what the cache kept before the state) grows by N x 48 x D per layer."""
    model = _model(name, every, position)
    assert _mixer_cache_numel(model, 12) == _mixer_cache_numel(model, 60)
    mixer_layers = sum(block.mixer is not None for block in model.blocks)
    for block in model.blocks:
        block.stateful = False
    grown = _mixer_cache_numel(model, 60) - _mixer_cache_numel(model, 12)
    assert grown == mixer_layers * 2 * 48 * 32
