"""Settings that mean nothing, and checks that depend only on the config, are refused before
anything trains (issue 51 items 3-5): another family's position field, a training position
sampling for a family that reads no position ids, StreamingLLM sinks covering the trained range,
model switches that do not combine with the family, RULER tasks that fit no eval length; and the
advice a diverged training gets. The CLI's one-line errors for the same settings are in
tests/bench/test_cli.py (``BAD_OVERRIDES``), the sweep's memory of failed models in
tests/bench/test_sweep.py."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from bench.core.checks import NotApplicable
from bench.eval.metrics.ruler import RulerConfig
from bench.job import validate_job
from bench.schema import JobConfig
from bench.tasks.ruler import RULER_TASKS
from bench.train.guards import divergence_advice
from models.positions import PositionConfig, families
from models.scaling import pair_positions
from models.transformer import DecoderLM, ModelConfig

from fixtures.jobs import compose_job

pytestmark = pytest.mark.usefixtures("one_thread")

#: a non-default value of every field of every family's config
OTHER_VALUES = {
    "base": 500.0,
    "layout": "interleaved",
    "rotary_fraction": 0.5,
    "max_positions": 512,
    "num_buckets": 16,
    "max_distance": 64,
    "frequency_fraction": 0.5,
    "fire_width": 8,
    "fire_c": 0.5,
    "fire_threshold": 8,
    "xpos_scale_base": 64.0,
    "cope_npos_max": 8,
    "fox_gate_bias": 1.0,
    "layers": ["swa", "nope"],
    "window": 8,
    "chunk": 8,
    "temperature_scale": 0.2,
    "temperature_floor": 8,
    "out_of_range": "clamp",
    "qk_norm": False,
}

#: every family's config fields (but kind) and their defaults
ALL_FIELDS = {
    f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
    for fam in families().values()
    for f in dataclasses.fields(fam.config)
    if f.name != "kind"
}


def job(**sections) -> JobConfig:
    base = {"model": {"n_layers": 2, "d_model": 32, "n_heads": 2}, "train": {"length": 64}}
    return JobConfig.from_hydra({**base, **sections})


def other_value(name: str):
    """A value of field ``name`` other than its default."""
    return OTHER_VALUES[name]


def test_every_field_has_another_value_here():
    assert set(OTHER_VALUES) == set(ALL_FIELDS)
    for name, default in ALL_FIELDS.items():
        assert other_value(name) != default, name


def test_each_family_owns_a_dataclass_whose_fields_are_its_position_params():
    for kind, fam in families().items():
        cfg = PositionConfig(kind=kind)
        assert type(cfg) is fam.config and cfg.kind == kind
        assert tuple(cfg.params()) == fam.fields
        assert [f.name for f in dataclasses.fields(cfg)] == ["kind", *fam.fields]
    # control: the flat section is gone; rope's dataclass holds no other family's field
    assert not hasattr(PositionConfig(kind="rope"), "num_buckets")


@pytest.mark.parametrize("kind", sorted(families()))
def test_another_familys_field_is_refused_naming_field_family_and_accepted_fields(kind):
    family = families()[kind]
    for name in ALL_FIELDS:
        if name in family.fields:
            continue  # its own field: checked by the family (the controls below)
        for value in (other_value(name), ALL_FIELDS[name]):  # at its default too: not a field
            with pytest.raises(ValueError) as err:
                PositionConfig(kind=kind, **{name: value})
            message = str(err.value)
            assert message.startswith(f"position.{name}=") and f"position={kind}" in message
            accepted = ", ".join(f"position.{f}" for f in family.fields)
            assert (accepted if family.fields else "accepts no position.* field") in message
    # controls: the defaults and each of the family's own fields are accepted
    assert PositionConfig(kind=kind).kind == kind
    for name in family.fields:
        assert getattr(PositionConfig(kind=kind, **{name: other_value(name)}), name) == other_value(
            name
        )


def tiny_job(overrides: list[str]) -> JobConfig:
    return compose_job("model.n_layers=2", "model.d_model=32", "model.n_heads=2", *overrides)


def test_a_kind_overridden_onto_another_familys_fields_is_refused():
    """position=irope position.kind=rope would label rope a model built from iRoPE's fields
    (IropeConfig subclasses RopeConfig): refused; control: irope itself passes."""
    with pytest.raises(
        ValueError, match="position.kind 'rope' does not match the fields of IropeConfig"
    ):
        tiny_job(["position=irope", "position.kind=rope"])
    assert type(tiny_job(["position=irope"]).position).__name__ == "IropeConfig"


def test_the_issues_examples_are_refused_and_their_own_fields_accepted():
    with pytest.raises(ValueError, match="position.layout='bogus' means nothing"):
        job(position={"kind": "kerple_log", "layout": "bogus"})
    with pytest.raises(ValueError, match="position.num_buckets=0 means nothing"):
        job(position={"kind": "sandwich", "num_buckets": 0})
    with pytest.raises(ValueError, match="position.chunk=16 means nothing for position=rnope_swa"):
        job(position={"kind": "rnope_swa", "chunk": 16})
    # controls: the same fields where the family reads them
    assert job(position={"kind": "irope", "chunk": 16}).position.chunk == 16
    assert job(position={"kind": "rnope_swa", "window": 16}).position.window == 16
    assert job(position={"kind": "t5", "num_buckets": 16}).position.num_buckets == 16


def test_a_model_is_still_built_from_a_stored_config_with_another_familys_field():
    """A checkpoint written while the section was flat (alibi's stored config holds every
    family's fields, base=500 among them: the same key as alibi's) still loads: the fields
    alibi does not own are dropped, never read."""
    flat = {"kind": "alibi", **ALL_FIELDS, "base": 500.0}
    stored = PositionConfig.from_stored(flat)
    assert dataclasses.asdict(stored) == {"kind": "alibi"}
    DecoderLM(ModelConfig(n_layers=1, d_model=32, n_heads=2), stored, 16)
    rope = PositionConfig.from_stored({**flat, "kind": "rope"})  # control: rope keeps its base
    assert rope.base == 500.0 and not hasattr(rope, "num_buckets")
    with pytest.raises(ValueError, match="position.base=500.0 means nothing for position=alibi"):
        job(position={"kind": "alibi", "base": 500.0})  # a job's config: refused


# --------------------------------------------------------------------------- position ids


def _logits(kind: str, position_ids: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(0)
    extra = {"max_positions": 256} if kind == "learned" else {}
    model = DecoderLM(
        ModelConfig(n_layers=4, d_model=32, n_heads=2), PositionConfig(kind=kind, **extra), 16
    ).eval()
    with torch.no_grad():  # random parameters: zero-initialised tables must not hide positions
        for param in model.parameters():
            param.copy_(torch.randn_like(param) * 0.5)
        x = torch.randint(0, 259, (1, 24))
        return model(x, position_ids=position_ids[None]).logits


@pytest.mark.parametrize("kind", sorted(families()))
def test_a_familys_reads_position_ids_declaration_is_what_its_model_does(kind):
    """Sorted random position ids (randomized training) against contiguous ones: a family that
    declares it reads no position ids gives the same logits bit for bit, every other family
    different ones (the negative control of the declaration)."""
    contiguous = torch.arange(24)
    sampled = torch.sort(torch.randperm(200, generator=torch.Generator().manual_seed(1))[:24])[0]
    same = torch.equal(_logits(kind, contiguous), _logits(kind, sampled))
    assert same == (not families()[kind].reads_position_ids)


def test_position_sampling_for_a_family_without_position_ids_is_not_applicable():
    for kind in ("nope", "cope"):
        for sampling in ("randomized", "pose"):
            cell = job(position={"kind": kind}, train={"length": 64, "position_sampling": sampling})
            with pytest.raises(NotApplicable, match=f"position_sampling={sampling} means nothing"):
                validate_job(cell)
        validate_job(job(position={"kind": kind}))  # control: contiguous
    validate_job(job(train={"length": 64, "position_sampling": "randomized"}))  # control: rope


# --------------------------------------------------------------------------- cross-field


def test_model_switches_that_do_not_combine_fail_with_the_config_not_the_model():
    with pytest.raises(ValueError, match="model.attention_sink=learned does not combine"):
        job(position={"kind": "cope"}, model={"n_layers": 1, "attention_sink": "learned"})
    job(position={"kind": "cope"}, model={"n_layers": 1, "attention_sink": "token"})  # control
    job(model={"n_layers": 1, "attention_sink": "learned"})  # control: rope


def test_a_probe_layer_the_model_does_not_have_fails_with_the_config():
    probe = {"position_probe_r2": {"layer": 3}}
    with pytest.raises(ValueError, match="position_probe_r2.layer 3 is out of range for model"):
        job(eval=probe)
    job(eval={"position_probe_r2": {"layer": 2}})  # controls: the last layer, the probe off
    job(eval={"position_probe_r2": {"layer": 3, "enabled": False}})


def test_ruler_training_tasks_must_fit_the_training_length():
    train = {
        "length": 128,
        "passkey_fraction": 0.2,
        "passkey_template": "short",
        "ruler_tasks": ["fwe"],
    }
    with pytest.raises(ValueError, match="train.length 128 is too short for ruler task 'fwe'"):
        job(train=train)
    job(train={**train, "length": 221})  # control: fwe needs 221 tokens and its end
    job(train={**train, "passkey_fraction": 0.0})  # control: no task rows


def test_streaming_sinks_must_leave_a_window_inside_the_trained_range():
    with pytest.raises(ValueError, match="sink_tokens 64 must be below the training length 64"):
        pair_positions("streaming", train_length=64, window=1, sink_tokens=64)
    with pytest.raises(ValueError, match="window 1 must be at least 2"):
        pair_positions("streaming", train_length=64, window=1, sink_tokens=63)
    with pytest.raises(ValueError, match="window 1 must be at least 2"):
        pair_positions("streaming", train_length=64, window=1, sink_tokens=4)
    assert pair_positions("streaming", train_length=64, window=2, sink_tokens=62).window == 2
    assert pair_positions("streaming", train_length=64, window=60, sink_tokens=4).sinks == 4


# --------------------------------------------------------------------------- RULER lengths


def ruler(tasks, lengths) -> RulerConfig:
    return dataclasses.replace(RulerConfig(enabled=True, tasks=tasks), lengths=lengths)


def test_ruler_tasks_that_fit_no_eval_length_are_an_error():
    with pytest.raises(ValueError, match=r"fit none of the ruler eval lengths \[64, 100\]") as err:
        ruler(["niah_single", "vt", "fwe"], [64, 100]).check_fit()
    assert "vt 115, fwe 221" in str(err.value) and "niah_single" not in str(err.value)
    # partly: one warning naming where each is skipped; controls: all fit, or ruler off
    warning = ruler(["niah_single", "vt"], [100, 256]).check_fit()
    assert "niah_single below" not in warning and "vt below 115 tokens" in warning
    assert ruler(["niah_single", "vt"], [512, 1024]).check_fit() is None
    assert dataclasses.replace(ruler(["fwe"], [64]), enabled=False).check_fit() is None


def test_ruler_windows_mostly_fixed_text_warn_before_training():
    """The protocol's filler share (issue #50): vt's fixed text and answer take 115 tokens, 57%
    of a 200-token window; the warning names it with its filler share. Control: at 256 (the
    RULER arm's L) and 512 every task's filler is at least half, niah_single's (54 tokens) at 200
    too."""
    warning = ruler(["niah_single", "vt"], [200, 512]).check_fit()
    assert warning is not None and "vt at 200 (43%)" in warning
    assert "niah_single" not in warning and "vt at 512" not in warning
    assert ruler(["niah_single"], [200]).check_fit() is None
    assert ruler(list(RULER_TASKS), [256, 512]).check_fit() is None


def test_ruler_tasks_that_fit_some_lengths_warn_once_before_training(caplog):
    eval_cfg = {
        "lengths": ["1x", "2x"],
        "ruler": {"enabled": True, "tasks": ["niah_single", "vt"]},
        "passkey": {"enabled": False},  # its template fits neither length (refused on its own)
    }
    cell = job(train={"length": 100}, eval=eval_cfg)
    with caplog.at_level(logging.WARNING):
        validate_job(cell)  # what a job runs before it trains
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "vt below 115 tokens" in warnings[0], warnings
    with pytest.raises(ValueError, match="fit none of the ruler eval lengths"):
        validate_job(job(train={"length": 50}, eval=eval_cfg))


# --------------------------------------------------------------------------- divergence


def test_divergence_advice_fits_the_cause():
    xpos = job(position={"kind": "xpos", "xpos_scale_base": 0.001})
    first = divergence_advice(xpos, 1, 3e-4)
    # update 1: the initial model's loss, before any update: not the lr, not the precision
    assert "before any update" in first and "position.xpos_scale_base=0.001" in first
    assert "precision" not in first and "lower train.lr" not in first
    later = divergence_advice(xpos, 5, 3e-4)
    assert "lower train.lr" in later and "position.xpos_scale_base=0.001" in later
    assert "precision=fp32" not in later  # already fp32
    bf16 = job(train={"length": 64, "precision": "bf16"})
    assert "train.precision=fp32" in divergence_advice(bf16, 5, 3e-4)
    assert "train.precision=fp32 (now bf16)" in divergence_advice(bf16, 1, 3e-4)
    # a family whose parameters are all defaults is named with all of them
    assert "position=rope (position.base=10000.0" in divergence_advice(job(), 5, 3e-4)
