"""``models.mixers.KimiDeltaAttention`` equals transformers' ``KimiLinearDeltaAttention`` (Kimi
Linear's KDA layer, its torch path ``chunk_kimi_delta_attention``) on the same weights, at lengths
inside one chunk, at a chunk's length and across chunk boundaries (not a multiple of 16 or 64), with
our chunk at 8 (the default), 16 and 64 (theirs); the per-channel chunked rule also equals transformers'
``recurrent_kimi_delta_attention`` (token by token). Negative controls: a perturbed forget gate, a
perturbed write strength, the conv dropped, the per-channel decay replaced by its per-head mean
(Gated DeltaNet's scalar decay), each differs by far more than the tolerance."""

from __future__ import annotations

import pytest
import test_mixers_common as common
import torch

from models.mixers import KimiDeltaAttention
from models.mixers.recurrence import chunked_recurrence

kimi = pytest.importorskip(
    "transformers.models.kimi_linear.modeling_kimi_linear", reason="transformers lacks Kimi Linear"
)

WIDTH, HEADS, HEAD_DIM, EPS = 32, 4, 8, 1e-6
LENGTHS = (1, 16, 37, 130)


def _ours(chunk_size: int = 8) -> KimiDeltaAttention:
    return common.randomized(
        lambda: KimiDeltaAttention(WIDTH, HEADS, chunk_size=chunk_size, norm_eps=EPS)
    )


def _theirs(ours: KimiDeltaAttention):
    from transformers import KimiLinearConfig

    config = KimiLinearConfig(
        hidden_size=WIDTH, num_hidden_layers=1, layer_types=["linear_attention"],
        linear_attn_config={"head_dim": HEAD_DIM, "num_heads": HEADS, "short_conv_kernel_size": 4},
        rms_norm_eps=EPS,
    )  # fmt: skip
    theirs = kimi.KimiLinearDeltaAttention(config, layer_idx=0).eval()
    same = ("q_proj", "k_proj", "v_proj", "b_proj", "g_a_proj", "g_b_proj", "o_proj")
    with torch.no_grad():
        for name in same:
            getattr(theirs, name).weight.copy_(getattr(ours, name).weight)
        theirs.conv1d.weight.copy_(ours.conv.conv1d.weight)
        theirs.forget_gate.f_a_proj.weight.copy_(ours.f_a_proj.weight)
        theirs.forget_gate.f_b_proj.weight.copy_(ours.f_b_proj.weight)
        theirs.forget_gate.dt_bias.copy_(ours.dt_bias)
        theirs.forget_gate.A_log.copy_(ours.A_log.view(1, 1, HEADS, 1))
        theirs.o_norm.weight.copy_(ours.norm_weight)
    return theirs


@pytest.mark.parametrize("chunk_size", [8, 16, 64])
@pytest.mark.parametrize("length", LENGTHS)
def test_kda_equals_kimi_linear_on_the_same_weights(length, chunk_size):
    ours = _ours(chunk_size)
    theirs = _theirs(ours)
    diff = common.gap(ours, theirs, length)
    assert diff < common.TOL, (
        f"L={length}, chunk {chunk_size}: relative max |ours - Kimi| = {diff:.2e}"
    )


@pytest.mark.parametrize("length", (5, 40))
def test_the_per_channel_chunked_rule_equals_transformers_token_by_token_kda(length):
    gen = torch.Generator().manual_seed(2)
    n, h, dk, dv = 2, 3, 8, 6
    q = torch.randn(n, length, h, dk, generator=gen)
    k = torch.randn(n, length, h, dk, generator=gen)
    v = torch.randn(n, length, h, dv, generator=gen)
    g = -3 * torch.rand(n, length, h, dk, generator=gen)  # a decay per key channel
    beta = torch.rand(n, length, h, generator=gen)
    ref, _ = kimi.recurrent_kimi_delta_attention(q, k, v, g, beta, None, False)
    t = lambda x: x.transpose(1, 2)  # noqa: E731 [N, L, H, .] <-> [N, H, L, .]
    ours = t(chunked_recurrence(t(q) * dk**-0.5, t(k), t(v), t(g), t(beta), chunk_size=16))
    assert common.relative_diff(ours, ref) < common.TOL


def _per_head_decay(mixer: KimiDeltaAttention) -> KimiDeltaAttention:
    # the forget gate's step averaged over each head's channels: one decay per head
    project = mixer.f_b_proj.forward

    def averaged(r: torch.Tensor) -> torch.Tensor:
        step = (project(r) + mixer.dt_bias).unflatten(-1, (HEADS, HEAD_DIM))  # [N, L, H, d]
        return step.mean(-1, keepdim=True).expand_as(step).flatten(-2) - mixer.dt_bias

    mixer.f_b_proj.forward = averaged
    return mixer


def conformance_outputs(length: int = 130) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ours, Kimi Linear's, ours with the decay per head instead of per channel) on the same
    weights and inputs, for a measured row of docs/conformance.md."""
    ours = _ours()
    return common.conformance_triple(ours, _theirs(ours), _per_head_decay, length)


@pytest.mark.parametrize(
    "variant",
    [
        common.perturbed("f_b_proj"),
        common.perturbed("b_proj"),
        common.without_conv,
        _per_head_decay,
    ],
    ids=["forget_gate_perturbed", "beta_perturbed", "conv_dropped", "per_head_decay"],
)
def test_negative_control_a_changed_kda_differs_from_kimi_linear(variant):
    ours = _ours()
    diff = common.changed_diff(ours, _theirs(ours), variant)
    assert diff > 100 * common.TOL, (
        f"the changed layer still matches (relative max diff {diff:.2e})"
    )
