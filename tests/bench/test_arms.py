"""Study arms (conf/arm/*.yaml): which cells an arm runs, and that its presets reach the job."""

from __future__ import annotations

import pytest

from bench.job import NotApplicable, validate_job
from bench.schema import ArmConfig, JobConfig

from fixtures.jobs import compose_job


def quickstart_job(*overrides: str) -> JobConfig:
    return compose_job("+experiment=quickstart", *overrides)


def test_each_quickstart_arm_gets_its_own_presets():
    lm = quickstart_job("arm=lm", "position=alibi")
    retrieval = quickstart_job("arm=retrieval", "position=rope")
    assert (lm.arm.name, lm.train.length, lm.model.d_model, lm.train.passkey_fraction) == (
        "lm",
        64,
        128,
        0.0,
    )
    assert not lm.eval.passkey.enabled and lm.eval.nll.enabled and lm.eval.shift_dnll.enabled
    assert (retrieval.arm.name, retrieval.train.length, retrieval.model.d_model) == (
        "retrieval",
        256,
        64,
    )
    assert (retrieval.model.n_layers, retrieval.train.passkey_fraction) == (3, 0.9)
    assert (retrieval.train.passkey_template, retrieval.train.passkey_length) == (
        "short",
        "uniform",
    )
    assert retrieval.eval.passkey.enabled and not retrieval.eval.nll.enabled
    # it trains until it retrieves at L (at most train.steps), then decays and stops
    assert (retrieval.train.until_retrieves, retrieval.train.decay_steps) == (0.9, 500)
    assert lm.train.until_retrieves is None  # the LM arm runs its updates
    # the two arms train different models: their checkpoint-relevant values differ
    assert lm.train.length != retrieval.train.length


def test_a_cell_outside_its_arm_is_not_applicable_with_the_reason():
    job = quickstart_job("arm=retrieval", "position=alibi")
    with pytest.raises(
        NotApplicable, match=r"position alibi is not part of arm retrieval \(position: rope\)"
    ):
        validate_job(job)
    job = quickstart_job("arm=retrieval", "position=rope", "scaling=llama3")
    with pytest.raises(NotApplicable, match="scaling llama3 is not part of arm retrieval"):
        validate_job(job)
    job = quickstart_job("arm=lm", "position=rope", "extend=pi")
    with pytest.raises(NotApplicable, match="extend pi is not part of arm lm"):
        validate_job(job)
    # control: the same cells inside an arm (or with no arm) validate
    validate_job(quickstart_job("arm=retrieval", "position=rope", "scaling=yarn"))
    validate_job(quickstart_job("arm=lm", "position=alibi"))
    validate_job(quickstart_job("arm=all", "position=alibi", "train.passkey_fraction=0"))


def test_arm_lists_are_checked():
    assert ArmConfig().excluded("alibi", "yarn", "pi") is None
    rotary = ArmConfig(name="a", finetune_positions=["rope"])
    assert rotary.excluded("alibi", "none", "pi") == (
        "extend pi for position alibi is not part of arm a (it fine-tunes only: rope)"
    )
    # control: the listed family is fine-tuned, and the other still runs without a fine-tune
    assert rotary.excluded("rope", "none", "pi") is None
    assert rotary.excluded("alibi", "yarn", "none") is None
    with pytest.raises(ValueError, match="arm.finetune_positions is empty"):
        ArmConfig(finetune_positions=[])
    with pytest.raises(ValueError, match="arm.positions is empty"):
        ArmConfig(positions=[])
    with pytest.raises(ValueError, match="arm.name must be a non-empty name"):
        ArmConfig(name="a/b")
