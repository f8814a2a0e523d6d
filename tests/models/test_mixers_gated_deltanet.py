"""``models.mixers.GatedDeltaNet`` equals transformers' Gated DeltaNet layers on the same weights:
``Qwen3NextGatedDeltaNet`` (fused q/k/v/z and b/a projections, mapped row by row) and
``OlmoHybridGatedDeltaNet`` (separate projections, ``linear_allow_neg_eigval=False``), at lengths
inside one chunk, at a chunk's length and across chunk boundaries (not a multiple of 64), with our
chunk at 64 (theirs) and at 16. The core recurrence also equals transformers'
``torch_recurrent_gated_delta_rule`` (token by token, an independent form). Negative controls: a
perturbed decay, a perturbed write strength, the conv dropped, the output gate dropped, each
differs by far more than the tolerance."""

from __future__ import annotations

import pytest
import test_mixers_common as common
import torch
import torch.nn.functional as F

from models.mixers import GatedDeltaNet
from models.mixers.recurrence import chunked_recurrence

qwen3_next = pytest.importorskip(
    "transformers.models.qwen3_next.modeling_qwen3_next", reason="transformers lacks Qwen3-Next"
)

WIDTH, HEADS, HEAD_DIM, EPS = 32, 4, 8, 1e-6
LENGTHS = (1, 37, 64, 130)
# TOL (test_mixers_common): our chunk of 16 against their 64 gives ~6e-6 at L = 130; the same
# chunk ~1e-7


def _ours(chunk_size: int = 64, seed: int = 0) -> GatedDeltaNet:
    build = lambda: GatedDeltaNet(WIDTH, HEADS, chunk_size=chunk_size, norm_eps=EPS)  # noqa: E731
    mixer = common.randomized(build, seed)
    with torch.no_grad():  # a non-trivial time step bias too, so a mix-up shows
        mixer.dt_bias.normal_(0, 1)
    return mixer


def _qwen3_next(ours: GatedDeltaNet):
    from transformers import Qwen3NextConfig

    config = Qwen3NextConfig(
        hidden_size=WIDTH, num_hidden_layers=1, layer_types=["linear_attention"],
        linear_num_key_heads=HEADS, linear_num_value_heads=HEADS,
        linear_key_head_dim=HEAD_DIM, linear_value_head_dim=HEAD_DIM,
        linear_conv_kernel_dim=4, rms_norm_eps=EPS,
    )  # fmt: skip
    theirs = qwen3_next.Qwen3NextGatedDeltaNet(config, layer_idx=0).eval()
    rows = lambda lin: lin.weight.view(HEADS, -1, WIDTH)  # noqa: E731 [H, rows per head, D]
    with torch.no_grad():
        # their fused rows, per key head: its q, k, v, z rows; then per head its b, a rows
        qkvz = (rows(ours.q_proj), rows(ours.k_proj), rows(ours.v_proj), rows(ours.z_proj))
        theirs.in_proj_qkvz.weight.copy_(torch.cat(qkvz, dim=1).reshape(-1, WIDTH))
        ba = torch.cat((rows(ours.b_proj), rows(ours.a_proj)), dim=1)
        theirs.in_proj_ba.weight.copy_(ba.reshape(-1, WIDTH))
        theirs.conv1d.weight.copy_(ours.conv.conv1d.weight)
        theirs.A_log.copy_(ours.A_log)
        theirs.dt_bias.copy_(ours.dt_bias)
        theirs.norm.weight.copy_(ours.norm_weight)
        theirs.out_proj.weight.copy_(ours.o_proj.weight)
    return theirs


def _olmo_hybrid(ours: GatedDeltaNet):
    modeling = pytest.importorskip("transformers.models.olmo_hybrid.modeling_olmo_hybrid")
    from transformers import OlmoHybridConfig

    config = OlmoHybridConfig(
        hidden_size=WIDTH, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
        linear_num_key_heads=HEADS, linear_num_value_heads=HEADS,
        linear_key_head_dim=HEAD_DIM, linear_value_head_dim=HEAD_DIM,
        linear_conv_kernel_dim=4, linear_allow_neg_eigval=False,
    )  # fmt: skip
    theirs = modeling.OlmoHybridGatedDeltaNet(config, layer_idx=0).eval()
    pairs = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "a_proj": "a_proj",
             "b_proj": "b_proj", "g_proj": "z_proj", "o_proj": "o_proj"}  # fmt: skip
    with torch.no_grad():
        for their_name, our_name in pairs.items():
            getattr(theirs, their_name).weight.copy_(getattr(ours, our_name).weight)
        theirs.conv1d.weight.copy_(ours.conv.conv1d.weight)
        theirs.A_log.copy_(ours.A_log)
        theirs.dt_bias.copy_(ours.dt_bias)
        theirs.o_norm.weight.copy_(ours.norm_weight)
    return theirs


@pytest.mark.parametrize("chunk_size", [64, 16])
@pytest.mark.parametrize("length", LENGTHS)
def test_gated_deltanet_equals_qwen3_next_on_the_same_weights(length, chunk_size):
    ours = _ours(chunk_size)
    theirs = _qwen3_next(ours)
    diff = common.gap(ours, theirs, length)
    assert diff < common.TOL, (
        f"L={length}, chunk {chunk_size}: relative max |ours - Qwen3-Next| = {diff:.2e}"
    )


@pytest.mark.parametrize("length", (37, 130))
def test_gated_deltanet_equals_olmo_hybrid_on_the_same_weights(length):
    ours = GatedDeltaNet(WIDTH, HEADS, norm_eps=1e-5).eval()  # Olmo Hybrid's fixed o_norm eps
    ours.load_state_dict(_ours().state_dict())
    theirs = _olmo_hybrid(ours)
    diff = common.gap(ours, theirs, length)
    assert diff < common.TOL, f"L={length}: relative max |ours - Olmo Hybrid| = {diff:.2e}"


@pytest.mark.parametrize("length", (5, 70))
def test_the_chunked_delta_rule_equals_transformers_token_by_token_recurrence(length):
    gen = torch.Generator().manual_seed(2)
    n, h, dk, dv = 2, 3, 8, 6
    q, k = (
        torch.randn(n, length, h, dk, generator=gen),
        torch.randn(n, length, h, dk, generator=gen),
    )
    v = torch.randn(n, length, h, dv, generator=gen)
    g = -3 * torch.rand(n, length, h, generator=gen)
    beta = torch.rand(n, length, h, generator=gen)
    ref, _ = qwen3_next.torch_recurrent_gated_delta_rule(q, k, v, g, beta)
    t = lambda x: x.transpose(1, 2)  # noqa: E731 [N, L, H, .] <-> [N, H, L, .]
    ours = t(chunked_recurrence(t(q) * dk**-0.5, t(k), t(v), t(g), t(beta), chunk_size=16))
    assert common.relative_diff(ours, ref) < common.TOL


def _without_gate(mixer: GatedDeltaNet) -> GatedDeltaNet:
    # the gate's input fixed at c with SiLU(c) = 1: the gate passes every channel unchanged
    c = 1.2784645427610738
    assert abs(F.silu(torch.tensor(c)).item() - 1) < 1e-6
    mixer.z_proj.forward = lambda x: torch.full((*x.shape[:-1], WIDTH), c)
    return mixer


def conformance_outputs(length: int = 130) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ours, Qwen3-Next's, ours with the conv dropped) on the same weights and inputs, for a
    measured row of docs/conformance.md."""
    ours = _ours()
    return common.conformance_triple(ours, _qwen3_next(ours), common.without_conv, length)


@pytest.mark.parametrize(
    "variant",
    [common.perturbed("a_proj"), common.perturbed("b_proj"), common.without_conv, _without_gate],
    ids=["decay_perturbed", "beta_perturbed", "conv_dropped", "gate_dropped"],
)
def test_negative_control_a_changed_gated_deltanet_differs_from_qwen3_next(variant):
    ours = _ours()
    diff = common.changed_diff(ours, _qwen3_next(ours), variant)
    assert diff > 100 * common.TOL, (
        f"the changed layer still matches (relative max diff {diff:.2e})"
    )
