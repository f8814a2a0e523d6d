"""What every recurrent mixer in ``models.mixers`` must do, checked on each: causality (the output
at t does not move when the input after t changes; negative control: the same check on the mixer
run over the reversed sequence fails), gradients reach every parameter and the input, a bf16
input under autocast gives a bf16 output close to float32's on average, a width the heads do
not divide is refused in one sentence, and the parameter names and shapes (checkpoint keys) stay
as trained checkpoints have them.

Also the set-up the reference tests share (test_mixers_gated_deltanet.py, _kda.py, _mamba2.py):
the tolerance, non-trivial weights, inputs and the changed layers of the negative controls."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from models.mixers import GatedDeltaNet, KimiDeltaAttention, Mamba2

WIDTH, HEADS = 32, 4
BUILDERS = {
    "gated_deltanet": lambda: GatedDeltaNet(WIDTH, HEADS),
    "kda": lambda: KimiDeltaAttention(WIDTH, HEADS),
    "mamba2": lambda: Mamba2(WIDTH, head_dim=WIDTH // HEADS, d_state=16),
}
#: max |ours - theirs| / max |theirs|: float32 round-off of a different summation order
TOL = 1e-5


def relative_diff(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return ((ours - theirs).abs().max() / theirs.abs().max()).item()


def randomized(build: Callable[[], torch.nn.Module], seed: int = 0, norm: bool = True):
    """``build()`` under ``seed`` with non-trivial weights, so that a mix-up shows: every matrix
    and conv tap drawn from N(0, 0.3), and (``norm``) the output norm's weights from U(0.5, 1.5)."""
    torch.manual_seed(seed)
    mixer = build().eval()
    with torch.no_grad():
        for p in mixer.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.3)
        if norm:
            mixer.norm_weight.uniform_(0.5, 1.5)
    return mixer


def inputs(length: int, seed: int = 1) -> torch.Tensor:
    """[2, L, WIDTH] standard normal inputs."""
    return torch.randn(2, length, WIDTH, generator=torch.Generator().manual_seed(seed))


def without_conv(mixer: torch.nn.Module) -> torch.nn.Module:
    mixer.conv.forward = F.silu  # the SiLU kept, the short convolution dropped
    return mixer


def perturbed(name: str) -> Callable[[torch.nn.Module], torch.nn.Module]:
    """A change of the mixer: its projection ``name``'s weights moved by N(0, 0.2)."""

    def perturb(mixer: torch.nn.Module) -> torch.nn.Module:
        with torch.no_grad():
            weight = getattr(mixer, name).weight
            weight.add_(0.2 * torch.randn_like(weight))
        return mixer

    return perturb


def gap(ours, theirs, length: int = 130) -> float:
    """relative_diff of ours against theirs on inputs(length)."""
    x = inputs(length)
    with torch.no_grad():
        return relative_diff(ours(x), theirs(x))


def changed_diff(ours, theirs, variant, length: int = 130) -> float:
    """The gap of ``variant`` (a change) of a copy of ours to theirs: a negative control's."""
    return gap(variant(copy.deepcopy(ours)), theirs, length)


def conformance_triple(ours, theirs, control, length: int = 130):
    """(ours, theirs, ``control`` of a copy of ours) on inputs(length), for a measured row of
    docs/conformance.md."""
    x = inputs(length)
    with torch.no_grad():
        return ours(x), theirs(x), control(copy.deepcopy(ours))(x)


def _mixer(name: str) -> torch.nn.Module:
    return randomized(BUILDERS[name], norm=False)


def _future_leak(fn, length: int = 70, cut: int = 33) -> float:
    """Largest change of fn's outputs at t <= cut when every input after cut is redrawn."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, length, WIDTH, generator=gen)
    y = x.clone()
    y[:, cut + 1 :] = torch.randn(2, length - cut - 1, WIDTH, generator=gen)
    with torch.no_grad():
        return (fn(x)[:, : cut + 1] - fn(y)[:, : cut + 1]).abs().max().item()


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_a_mixer_is_causal(name):
    mixer = _mixer(name)
    assert _future_leak(mixer) == 0.0


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_negative_control_the_causality_check_catches_a_mixer_reading_the_future(name):
    mixer = _mixer(name)
    assert _future_leak(lambda x: mixer(x.flip(1)).flip(1)) > 1e-3


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_gradients_reach_every_parameter_and_the_input(name):
    mixer = _mixer(name)
    x = torch.randn(2, 37, WIDTH, requires_grad=True)
    out = mixer(x)
    assert out.shape == x.shape
    out.square().mean().backward()
    missing = [n for n, p in mixer.named_parameters() if p.grad is None or not p.grad.any()]
    assert not missing, f"no gradient for {missing}"
    assert torch.isfinite(x.grad).all() and x.grad[:, 0].abs().sum() > 0


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_a_bf16_input_gives_a_bf16_output_near_float32s(name):
    mixer = _mixer(name)
    x = torch.randn(2, 37, WIDTH)
    with torch.no_grad():
        full = mixer(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = mixer(x.bfloat16())
    assert half.dtype == torch.bfloat16
    # the mean, not the max: the output RMSNorm rescales a head whose output is near zero, so
    # one rounded input moves such a head a lot (Gated DeltaNet: 14% at the max from rounding
    # the input alone, 3% on average)
    assert ((half.float() - full).abs().mean() / full.abs().mean()).item() < 0.05


def test_a_width_the_heads_do_not_divide_is_refused_in_one_sentence():
    with pytest.raises(ValueError, match="d_model 30 must be a multiple of n_heads 4"):
        GatedDeltaNet(30, 4)
    with pytest.raises(ValueError, match="d_model 30 must be a multiple of n_heads 4"):
        KimiDeltaAttention(30, 4)
    with pytest.raises(ValueError, match="must be a multiple of head_dim 7"):
        Mamba2(32, head_dim=7)


CLASSES = {"gated_deltanet": GatedDeltaNet, "kda": KimiDeltaAttention, "mamba2": Mamba2}


@pytest.mark.parametrize("name", sorted(CLASSES))
@pytest.mark.parametrize(("hybrid_every", "position"), [(0, "nope"), (4, "rope")])
def test_model_mixer_builds_the_mixer_on_its_layers_and_the_model_stays_causal(
    name, hybrid_every, position
):
    """``model.mixer=<name>`` (the design in models/designs/<name>.py) puts the mixer on every
    layer, ``model.hybrid_every=4`` on layers 0-2 with RoPE attention on layer 3; the whole model
    is causal (control: the same check on the sequence reversed fails) and decodes with the KV
    cache as full passes do."""
    from models.positions import PositionConfig
    from models.transformer import DecoderLM, ModelConfig

    torch.manual_seed(0)
    cfg = ModelConfig(
        n_layers=4, d_model=WIDTH, n_heads=HEADS, mixer=name, hybrid_every=hybrid_every
    )
    model = DecoderLM(cfg, PositionConfig(kind=position), 32).eval()
    kinds = [type(b.mixer) if b.mixer is not None else "attention" for b in model.blocks]
    expected = [CLASSES[name]] * 4 if not hybrid_every else [CLASSES[name]] * 3 + ["attention"]
    assert kinds == expected
    ids = torch.randint(0, 259, (2, 40), generator=torch.Generator().manual_seed(1))

    def leak(fn) -> float:  # how much the first 25 outputs move when the 15 tokens after go
        with torch.no_grad():
            return (fn(ids)[:, :25] - fn(ids[:, :25])).abs().max().item()

    with torch.no_grad():
        logits = model(ids).logits  # [N, L, V]
    assert logits.shape == (2, 40, 259) and torch.isfinite(logits).all()
    assert leak(lambda t: model(t).logits) < 1e-4
    assert leak(lambda t: model(t.flip(1)).logits.flip(1)) > 1e-3
    # greedy decoding with the KV cache picks the tokens full passes pick
    from fixtures.decoding import full_pass_greedy

    with torch.no_grad():
        generated = model.generate_greedy(ids[:, :20], max_new_tokens=5)
        assert torch.equal(generated, full_pass_greedy(model, ids[:, :20], 5))


#: every mixer's parameter names and shapes at width 32, 4 heads (Mamba-2: head dim 8, state 16)
#: as trained checkpoints hold them; a rename or a reshape would leave those unloadable
STATE_DICT = {
    "gated_deltanet": {
        "A_log": (4,), "dt_bias": (4,), "norm_weight": (8,), "q_proj.weight": (32, 32),
        "k_proj.weight": (32, 32), "v_proj.weight": (32, 32), "a_proj.weight": (4, 32),
        "b_proj.weight": (4, 32), "z_proj.weight": (32, 32), "conv.conv1d.weight": (96, 1, 4),
        "o_proj.weight": (32, 32),
    },
    "kda": {
        "A_log": (4,), "dt_bias": (32,), "norm_weight": (8,), "q_proj.weight": (32, 32),
        "k_proj.weight": (32, 32), "v_proj.weight": (32, 32), "conv.conv1d.weight": (96, 1, 4),
        "f_a_proj.weight": (8, 32), "f_b_proj.weight": (32, 8), "b_proj.weight": (4, 32),
        "g_a_proj.weight": (8, 32), "g_b_proj.weight": (32, 8), "o_proj.weight": (32, 32),
    },
    "mamba2": {
        "A_log": (8,), "D": (8,), "dt_bias": (8,), "norm_weight": (64,),
        "in_proj.weight": (168, 32), "conv.conv1d.weight": (96, 1, 4), "conv.conv1d.bias": (96,),
        "o_proj.weight": (32, 64),
    },
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_the_checkpoint_keys_and_shapes_of_every_mixer_are_unchanged(name):
    """The state_dict's names, shapes and order (the order of construction also fixes what a seed
    draws for each parameter) are those trained checkpoints were saved with, and such a
    checkpoint loads strictly; control: one with a parameter renamed does not."""
    mixer = BUILDERS[name]()
    held = [(key, tuple(value.shape)) for key, value in mixer.state_dict().items()]
    assert held == list(STATE_DICT[name].items())
    checkpoint = {key: torch.zeros(shape) for key, shape in STATE_DICT[name].items()}
    mixer.load_state_dict(checkpoint)
    checkpoint["renamed"] = checkpoint.pop("o_proj.weight")
    with pytest.raises(RuntimeError, match="o_proj.weight"):
        mixer.load_state_dict(checkpoint)
