"""``models.mixers.Mamba2`` equals transformers' ``Mamba2Mixer`` on its torch path
(``mamba2_chunk_scan``; no mamba_ssm / causal_conv1d kernels here) on the same weights, at lengths
inside one chunk, at a chunk's length and across chunk boundaries (not a multiple of the chunk),
with our chunk equal to theirs (16) and different (64); and the chunked scan equals a token-by-token
recurrence h_t = exp(dt A) h_{t-1} + B_t (dt x_t)^T, y_t = h_t^T C_t written out here. Negative
controls: a perturbed time step, D dropped, the conv dropped, the gate dropped, each differs by far more than the tolerance."""

from __future__ import annotations

import pytest
import test_mixers_common as common
import torch

from models.mixers import Mamba2
from models.mixers.recurrence import chunked_recurrence

mamba2 = pytest.importorskip(
    "transformers.models.mamba2.modeling_mamba2", reason="transformers lacks Mamba-2"
)

WIDTH, HEAD_DIM, STATE, EXPAND, EPS = 32, 8, 16, 2, 1e-5
LENGTHS = (1, 16, 37, 130)


def _ours(chunk_size: int = 16) -> Mamba2:
    mixer = common.randomized(
        lambda: Mamba2(WIDTH, HEAD_DIM, d_state=STATE, expand=EXPAND, chunk_size=chunk_size)
    )
    with torch.no_grad():  # a non-trivial skip and conv bias too, so a mix-up shows
        mixer.D.uniform_(0.5, 1.5)
        mixer.conv.conv1d.bias.normal_(0, 0.3)
    return mixer


def _theirs(ours: Mamba2):
    from transformers import Mamba2Config

    config = Mamba2Config(
        hidden_size=WIDTH, num_heads=EXPAND * WIDTH // HEAD_DIM, head_dim=HEAD_DIM,
        state_size=STATE, expand=EXPAND, n_groups=1, conv_kernel=4, chunk_size=16,
        use_bias=False, use_conv_bias=True, layer_norm_epsilon=EPS, num_hidden_layers=1,
    )  # fmt: skip
    theirs = mamba2.Mamba2Mixer(config, layer_idx=0).eval()
    with torch.no_grad():
        theirs.in_proj.weight.copy_(ours.in_proj.weight)  # the same [z, x B C, dt] layout
        theirs.conv1d.weight.copy_(ours.conv.conv1d.weight)
        theirs.conv1d.bias.copy_(ours.conv.conv1d.bias)
        theirs.dt_bias.copy_(ours.dt_bias)
        theirs.A_log.copy_(ours.A_log)
        theirs.D.copy_(ours.D)
        theirs.norm.weight.copy_(ours.norm_weight)
        theirs.out_proj.weight.copy_(ours.o_proj.weight)
    return theirs


@pytest.mark.parametrize("chunk_size", [16, 64])
@pytest.mark.parametrize("length", LENGTHS)
def test_mamba2_equals_transformers_mamba2_mixer_on_the_same_weights(length, chunk_size):
    ours = _ours(chunk_size)
    theirs = _theirs(ours)
    diff = common.gap(ours, theirs, length)
    assert diff < common.TOL, (
        f"L={length}, chunk {chunk_size}: relative max |ours - Mamba2Mixer| = {diff:.2e}"
    )


def test_the_chunked_scan_equals_a_token_by_token_state_space_recurrence():
    gen = torch.Generator().manual_seed(2)
    n, h, length, state, p = 2, 3, 45, 5, 4
    B = torch.randn(n, h, length, state, generator=gen)
    C = torch.randn(n, h, length, state, generator=gen)
    x = torch.randn(n, h, length, p, generator=gen)
    dt = torch.rand(n, h, length, generator=gen)
    A = -torch.rand(h, 1, generator=gen) * 4  # [H, 1] per head
    hidden = torch.zeros(n, h, state, p, dtype=torch.float64)
    ref = []
    for t in range(length):
        a = (dt[:, :, t] * A.squeeze(-1)).exp().double()[..., None, None]
        write = (
            B[:, :, t, :, None].double() * (dt[:, :, t, None, None] * x[:, :, t, None, :]).double()
        )
        hidden = a * hidden + write
        ref.append((hidden * C[:, :, t, :, None].double()).sum(-2))  # [N, H, p]
    ref = torch.stack(ref, dim=2)
    ours = chunked_recurrence(C, B, x * dt[..., None], dt * A, None, chunk_size=16)
    assert common.relative_diff(ours.double(), ref) < common.TOL


def _perturbed_time_step(mixer: Mamba2) -> Mamba2:
    with torch.no_grad():
        mixer.dt_bias.add_(0.5)
    return mixer


def _without_skip(mixer: Mamba2) -> Mamba2:
    with torch.no_grad():
        mixer.D.zero_()
    return mixer


def _without_gate(mixer: Mamba2) -> Mamba2:
    # z fixed at c with SiLU(c) = 1: the gate before the norm passes every channel unchanged
    project, c = mixer.in_proj.forward, 1.2784645427610738

    def constant_gate(x: torch.Tensor) -> torch.Tensor:
        z, rest = project(x).split([mixer.inner, mixer.in_proj.out_features - mixer.inner], dim=-1)
        return torch.cat((torch.full_like(z, c), rest), dim=-1)

    mixer.in_proj.forward = constant_gate
    return mixer


def conformance_outputs(length: int = 130) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ours, transformers' Mamba2Mixer's, ours with D dropped) on the same weights and inputs,
    for a measured row of docs/conformance.md."""
    ours = _ours()
    return common.conformance_triple(ours, _theirs(ours), _without_skip, length)


@pytest.mark.parametrize(
    "variant",
    [_perturbed_time_step, _without_skip, common.without_conv, _without_gate],
    ids=["time_step_perturbed", "skip_dropped", "conv_dropped", "gate_dropped"],
)
def test_negative_control_a_changed_mamba2_differs_from_transformers(variant):
    ours = _ours()
    diff = common.changed_diff(ours, _theirs(ours), variant)
    assert diff > 100 * common.TOL, (
        f"the changed layer still matches (relative max diff {diff:.2e})"
    )
