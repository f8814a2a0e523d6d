"""``models.mixers.KimiDeltaAttention`` equals transformers' ``KimiLinearDeltaAttention`` (Kimi
Linear's KDA layer, its torch path ``chunk_kimi_delta_attention``) on the same weights, at lengths
inside one chunk, at a chunk's length and across chunk boundaries (not a multiple of 16 or 64), with
our chunk at 8 (the default), 16 and 64 (theirs); the per-channel chunked rule also equals transformers'
``recurrent_kimi_delta_attention`` (token by token). Negative controls: a perturbed forget gate, a
perturbed write strength, the conv dropped, the per-channel decay replaced by its per-head mean
(Gated DeltaNet's scalar decay), each differs by far more than the tolerance."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from models.mixers import KimiDeltaAttention
from models.mixers.recurrence import chunked_recurrence

kimi = pytest.importorskip(
    "transformers.models.kimi_linear.modeling_kimi_linear", reason="transformers lacks Kimi Linear"
)

WIDTH, HEADS, HEAD_DIM, EPS = 32, 4, 8, 1e-6
LENGTHS = (1, 16, 37, 130)
#: max |ours - theirs| / max |theirs|: float32 round-off of a different summation order
TOL = 1e-5


def _relative_diff(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return ((ours - theirs).abs().max() / theirs.abs().max()).item()


def _ours(chunk_size: int = 8) -> KimiDeltaAttention:
    torch.manual_seed(0)
    mixer = KimiDeltaAttention(WIDTH, HEADS, chunk_size=chunk_size, norm_eps=EPS).eval()
    with torch.no_grad():  # non-trivial norm weights and conv taps, so a mix-up shows
        for p in mixer.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.3)
        mixer.norm_weight.uniform_(0.5, 1.5)
    return mixer


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


def _inputs(length: int) -> torch.Tensor:
    return torch.randn(2, length, WIDTH, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("chunk_size", [8, 16, 64])
@pytest.mark.parametrize("length", LENGTHS)
def test_kda_equals_kimi_linear_on_the_same_weights(length, chunk_size):
    ours = _ours(chunk_size)
    theirs = _theirs(ours)
    x = _inputs(length)
    with torch.no_grad():
        diff = _relative_diff(ours(x), theirs(x))
    assert diff < TOL, f"L={length}, chunk {chunk_size}: relative max |ours - Kimi| = {diff:.2e}"


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
    assert _relative_diff(ours, ref) < TOL


def _perturbed(name: str):
    def perturb(mixer: KimiDeltaAttention) -> KimiDeltaAttention:
        with torch.no_grad():
            weight = getattr(mixer, name).weight
            weight.add_(0.2 * torch.randn_like(weight))
        return mixer

    return perturb


def _without_conv(mixer: KimiDeltaAttention) -> KimiDeltaAttention:
    mixer.conv.forward = F.silu  # the SiLU kept, the short convolution dropped
    return mixer


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
    theirs = _theirs(ours)
    x = _inputs(length)
    with torch.no_grad():
        return ours(x), theirs(x), _per_head_decay(copy.deepcopy(ours))(x)


@pytest.mark.parametrize(
    "variant",
    [_perturbed("f_b_proj"), _perturbed("b_proj"), _without_conv, _per_head_decay],
    ids=["forget_gate_perturbed", "beta_perturbed", "conv_dropped", "per_head_decay"],
)
def test_negative_control_a_changed_kda_differs_from_kimi_linear(variant):
    ours = _ours()
    theirs = _theirs(ours)
    x = _inputs(130)
    with torch.no_grad():
        diff = _relative_diff(variant(copy.deepcopy(ours))(x), theirs(x))
    assert diff > 100 * TOL, f"the changed layer still matches (relative max diff {diff:.2e})"
