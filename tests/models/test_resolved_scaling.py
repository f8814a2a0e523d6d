"""A scaling is resolved once, when it is set (models/resolved_scaling.py), and every family reads
its facts, never a method's name.

A renamed copy of ``linear`` changes every family that offers methods acting on positions exactly
as ``linear`` does (negative control: before the resolved position transform, the score-bias
families, the learned table and CoPE read a factor set only for the name ``linear`` and gave the
raw logits); the families are the registry's, so a family that declares ``positions`` and ignores
the factor fails it (issue #75; control: such a family registered here). A method that changes
nothing is refused where it is registered or set, one sentence each; a method is offered only to
families that can honour it. The per-forward rebuilds (pair
spec, Sandwich table, factor tensor, xPos scale) are cached without changing a number.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from models.families.rotary import xpos_scale
from models.families.zoo import sandwich_table
from models.positions import (
    FAMILIES,
    Family,
    PositionConfig,
    ScoreBias,
    families,
    register_family,
)
from models.resolved_scaling import PROBE_ROTARY_DIM
from models.scaling import (
    SCALING_METHODS,
    RopeGeometry,
    applicable_methods,
    default_inv_freq,
    register_scaling,
    scaling_method,
)
from models.transformer import DecoderLM, ModelConfig, ScalingConfig, resolved_scaling


def positions_families() -> tuple[str, ...]:
    """The registered families that offer methods acting on positions: every family of
    models/families/ whose ``capabilities`` hold ``positions`` (no hand list to keep)."""
    return tuple(k for k, f in families().items() if "positions" in f.capabilities)


POSITION_FAMILIES = positions_families()
MODEL = ModelConfig(n_layers=2, d_model=32, n_heads=4)


@contextlib.contextmanager
def registered(name: str, fn, **facts) -> Iterator[None]:
    """``fn`` registered as scaling method ``name`` through the public decorator, removed after."""
    register_scaling(name, **facts)(fn)
    try:
        yield
    finally:
        SCALING_METHODS.pop(name, None)


def linear_copy(name: str = "my_linear"):
    """``linear`` under another name: its function and every fact it declares."""
    linear = SCALING_METHODS["linear"]
    return registered(
        name,
        linear.fn,
        applies_to=linear.applies_to,
        length_dependent=linear.length_dependent,
        auto_keys=linear.auto_keys,
        list_params=linear.list_params,
        pair_method=linear.pair_method,
        auto_rule=linear.auto_rule,
    )


def model_of(kind: str, train_length: int = 16) -> DecoderLM:
    """A model of ``kind`` whose zero-initialised parameters are drawn at random: CoPE's table
    (any family's zero-initialised position parameters) starts at zero, where no position can
    matter yet and every scaling gives the raw logits."""
    torch.manual_seed(0)
    model = DecoderLM(MODEL, PositionConfig(kind=kind), train_length).eval()
    with torch.no_grad():
        for param in model.parameters():
            if not param.any():
                param.normal_()
    return model


def logits(model: DecoderLM, scaling: ScalingConfig | None, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), model.scaled(scaling):
        return model(ids).logits


def test_the_families_that_offer_positions_methods():
    offering = set(POSITION_FAMILIES)  # the registry's, so every such family is tested below
    assert {"rope", "sinusoidal", "learned", "t5", "fire", "cope", "irope"} <= offering
    assert not offering & {"alibi", "nope", "fox"}  # control: families without position methods
    with linear_copy():
        assert {k for k in families() if "my_linear" in applicable_methods(k)} == offering
    assert "my_linear" not in SCALING_METHODS  # removed again


def assert_linear_acts(kind: str) -> None:
    """``linear`` at factor 4 changes ``kind``'s logits, exactly as a renamed copy of it does,
    and the family reads the factor it was given (from its frequencies or as its position
    transform): a family that declares ``positions`` but ignores the factor fails here."""
    model = model_of(kind)
    ids = torch.randint(0, 250, (2, 12), generator=torch.Generator().manual_seed(1))
    raw = logits(model, None, ids)
    linear = logits(model, ScalingConfig("linear", "linear", {"factor": 4.0}), ids)
    with linear_copy():
        renamed = logits(model, ScalingConfig("my_linear", "my_linear", {"factor": 4.0}), ids)
        resolved = resolved_scaling(
            ScalingConfig("my_linear", "my_linear", {"factor": 4.0}),
            MODEL,
            model.position_cfg,
            16,
        )
    torch.testing.assert_close(renamed, linear, rtol=0, atol=0)
    change = float((linear - raw).abs().max())
    assert change > 1e-5, (
        f"position={kind} declares 'positions' but linear (factor 4) leaves its logits as they "
        f"are (max difference {change:g}): it ignores the position transform, so its rows "
        f"labelled linear would be the raw ones; read model.resolved_scaling.position_factor "
        f"(or its frequencies), or drop 'positions' from its capabilities."
    )
    if resolved.has_frequencies:  # the rotary families and sinusoidal read the frequencies
        assert resolved.position_factor is None
    else:
        assert resolved.position_factor == 4.0


@pytest.mark.parametrize("kind", POSITION_FAMILIES)
def test_a_renamed_linear_acts_as_linear_on_every_family(kind):
    assert_linear_acts(kind)


def _distance_bias(head, q_pos, k_pos, factor):
    return -0.5 * ((q_pos - k_pos).clamp(min=0).float() / factor)


class _DistanceBias(Family):
    """A score-bias family that declares ``positions``; ``reads_factor`` False: it ignores the
    position transform (the issue-75 trap), True: it divides its distances by it."""

    name, acts_on, capabilities, reads_factor = "", "scores", ("positions", "pairs"), True

    def score_bias(self, model, length):
        factor = model.resolved_scaling.position_factor if self.reads_factor else None
        return ScoreBias(_distance_bias, (float(factor or 1.0),))


def test_a_family_whose_linear_is_a_no_op_fails_the_check():
    """Negative control of the check above (issue #75): a family that declares ``positions`` but
    ignores ``position_factor`` is caught, in one sentence; the same family reading the factor
    passes (control). A family registered in models/families/ is on the derived list."""
    deaf = type("Deaf", (_DistanceBias,), {"name": "deaf_positions", "reads_factor": False})
    hearing = type("Hearing", (_DistanceBias,), {"name": "hearing_positions"})
    try:
        for family in (deaf, hearing):
            register_family(family)
        assert {"deaf_positions", "hearing_positions"} <= set(positions_families())
        with pytest.raises(AssertionError, match=r"position=deaf_positions declares 'positions'"):
            assert_linear_acts("deaf_positions")
        assert_linear_acts("hearing_positions")
    finally:
        for family in (deaf, hearing):
            FAMILIES.pop(family.name, None)


@pytest.mark.parametrize("factor", [1.0, 4.0, 6.0, 1000 / 300, 3.90625])
def test_the_position_transform_is_the_number_given(factor):
    """The factor read from the method's frequencies is the one it was given, to the bit (a
    family reads what ``linear``'s config says)."""
    for kind in ("t5", "learned", "cope"):
        cfg = PositionConfig(kind=kind)
        with linear_copy():
            for name in ("linear", "my_linear"):
                scaling = ScalingConfig(name, name, {"factor": factor})
                assert resolved_scaling(scaling, MODEL, cfg, 16).position_factor == factor
    raw = resolved_scaling(None, MODEL, PositionConfig(kind="learned"), 16)
    assert raw.position_factor is None  # no transform: the interpolate policy stretches


def _default(geometry: RopeGeometry, **_) -> tuple[torch.Tensor, float]:
    return default_inv_freq(geometry.rotary_dim, geometry.base), 1.0


def test_a_method_that_changes_nothing_is_refused_at_its_first_lookup():
    def unchanged(geometry: RopeGeometry, *, factor: float) -> tuple[torch.Tensor, float]:
        return _default(geometry)

    for fn, facts in [
        (lambda geometry: _default(geometry), {"applies_to": ("positions",)}),
        (unchanged, {"applies_to": ("positions",), "auto_keys": ("factor",)}),
        (unchanged, {"applies_to": ("rotary",), "auto_keys": ("factor",)}),
    ]:
        register_scaling("noop", **facts)(fn)
        with pytest.raises(ValueError, match=r"'noop' changes nothing: .* the raw model's\.$"):
            scaling_method("noop")  # its first lookup probes it
        assert "noop" not in SCALING_METHODS
    with linear_copy():  # control: the same probe passes a method that changes something
        assert scaling_method("my_linear").fn is SCALING_METHODS["linear"].fn


def test_a_method_that_changes_nothing_is_refused_when_set():
    """A required parameter without "auto" cannot be probed at registration: the method is probed
    where it is set, for the family it is set on."""

    def ignores(geometry: RopeGeometry, *, strength: float) -> tuple[torch.Tensor, float]:
        return _default(geometry)

    with registered("ignores", ignores, applies_to=("positions",)):
        for kind in ("t5", "rope", "learned", "sinusoidal", "cope"):
            model = model_of(kind)
            with pytest.raises(
                ValueError,
                match=rf"'ignores' changes nothing for position={kind}: .* equal the raw ones\.$",
            ):
                model.set_scaling(ScalingConfig("ignores", "ignores", {"strength": 2.0}))
            assert model.scaling.method == "default"  # unchanged
    # control: a factor 1 (auto at the training length) is linear's identity point, not refused
    model = model_of("t5")
    model.set_scaling(ScalingConfig("linear", "linear", {"factor": "auto"}), eval_length=8)
    assert model.scaling.params == {"factor": 1.0}


def test_a_positions_method_a_family_without_frequencies_cannot_take_is_refused():
    def bent(geometry: RopeGeometry, *, factor: float) -> tuple[torch.Tensor, float]:
        theta = default_inv_freq(geometry.rotary_dim, geometry.base)
        half = geometry.rotary_dim // 4
        return torch.cat((theta[:half], theta[half:] / factor)), 1.0

    def warm(geometry: RopeGeometry, *, factor: float) -> tuple[torch.Tensor, float]:
        return default_inv_freq(geometry.rotary_dim, geometry.base) / factor, 1.1

    with registered("bent", bent, applies_to=("positions",), auto_keys=("factor",)):
        bent_cfg = ScalingConfig("bent", "bent", {"factor": 4.0})
        with pytest.raises(ValueError, match=r"not the default ones divided by one factor"):
            resolved_scaling(bent_cfg, MODEL, PositionConfig(kind="t5"), 16)
        resolved_scaling(bent_cfg, MODEL, PositionConfig(kind="rope"), 16)  # frequencies: fine
    with registered("warm", warm, applies_to=("positions",), auto_keys=("factor",)):
        warm_cfg = ScalingConfig("warm", "warm", {"factor": 4.0})
        with pytest.raises(ValueError, match=r"scales the attention by 1\.1 .* position=learned"):
            resolved_scaling(warm_cfg, MODEL, PositionConfig(kind="learned"), 16)
    assert PROBE_ROTARY_DIM % 2 == 0


def test_a_length_dependent_positions_method_is_offered_only_where_frequencies_follow_length():
    def dynamic_pi(geometry: RopeGeometry, *, factor: float) -> tuple[torch.Tensor, float]:
        s = max(1.0, factor * geometry.seq_len / geometry.original_length - (factor - 1))
        return default_inv_freq(geometry.rotary_dim, geometry.base) / s, 1.0

    facts = {"applies_to": ("positions",), "length_dependent": True, "auto_keys": ("factor",)}
    with registered("dynamic_pi", dynamic_pi, **facts):
        assert "dynamic_pi" in applicable_methods("rope")
        assert "dynamic_pi" in applicable_methods("sinusoidal")
        for kind in ("learned", "t5", "sandwich", "cope"):  # one factor per run: not offered
            assert "dynamic_pi" not in applicable_methods(kind)
            assert "linear" in applicable_methods(kind)  # control


def test_per_forward_rebuilds_are_cached_with_the_same_numbers():
    # the pair spec is checked once, when the scaling is set
    model = model_of("t5")
    streaming = ScalingConfig("streaming", "streaming", {"window": 8, "sink_tokens": 2})
    model.set_scaling(streaming)
    spec = model.resolved_scaling.pairs
    assert spec is not None and spec.window == 8
    model(torch.randint(0, 250, (1, 20)))
    assert model.resolved_scaling.pairs is spec
    # the factor tensor, once per scaling set
    model.set_scaling(ScalingConfig("linear", "linear", {"factor": 2.0}))
    first = model.family.score_bias(model, 20).args[1]
    assert model.family.score_bias(model, 20).args[1] is first and float(first) == 2.0
    # Sandwich's table: built once, grown when a longer forward needs it, same numbers
    model = model_of("sandwich")
    model.set_scaling(ScalingConfig("linear", "linear", {"factor": 3.0}))
    table = model.family.score_bias(model, 20).args[0]
    assert model.family.score_bias(model, 12).args[0] is table
    longer = model.family.score_bias(model, 50).args[0]
    assert longer.shape[0] >= 50 and longer is not table
    direct = sandwich_table(longer.shape[0], MODEL.d_model, 3.0)
    torch.testing.assert_close(longer, direct, rtol=0, atol=0)
    torch.testing.assert_close(longer[:20], table[:20], rtol=0, atol=0)
    # xPos's per-pair decay base, once per scaling set
    model = model_of("xpos")
    ids = torch.randint(0, 250, (1, 10))
    model(ids)
    (scale,) = [v for k, v in model.resolved_scaling.cache.items() if k[0] == "xpos_scale"]
    torch.testing.assert_close(scale, xpos_scale(MODEL.head_dim), rtol=0, atol=0)
    model(ids)
    assert [v for k, v in model.resolved_scaling.cache.items() if k[0] == "xpos_scale"] == [scale]
    # set anew, rebuilt: nothing outlives the scaling it was made for
    model.set_scaling(None)
    assert not model.resolved_scaling.cache
