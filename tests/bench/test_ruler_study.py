"""#28 through the benchmark: the issue's smoke command, the RULER arm and study as a user types
them (checkpoint keys, training rows), and the eval section's bad values."""

from __future__ import annotations

import pandas as pd
import pytest

from bench.schema import JobConfig
from bench.tasks.ruler import default_ruler_tasks
from bench.train.cache import weights_key
from bench.train.config import TrainConfig

from fixtures.jobs import compose_job

RULER_TASKS = default_ruler_tasks()  # RULER's suite: the tasks these rows have


def study_job(*overrides: str) -> JobConfig:
    return compose_job("+experiment=ruler", *overrides)


def test_smoke_with_ruler_lands_rows_for_every_task(in_tmp, quiet_training, capsys):
    """The issue's command (one cell of it: rope, raw): ruler rows for every task at both
    lengths and effective_length rows for every task and the mean."""
    from bench.cli import main

    argv = ["+experiment=smoke", "train.length=256", "eval.ruler.enabled=true", "position=rope",
            "scaling=none", f"paths.cache={in_tmp / 'cache'}",
            "hydra.callbacks.report.enabled=false"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    df = pd.concat(pd.read_parquet(f) for f in (in_tmp / "results" / "smoke").glob("*.parquet"))
    tasks = df[df["task"].notna() & (df["metric"] != "effective_length")]
    assert set(tasks["metric"]) == set(RULER_TASKS)
    assert set(tasks["eval_length"]) == {256, 512}
    scores = tasks[tasks["axis"] == "score"]
    assert scores.groupby("metric")["axis_value"].apply(set).to_dict() == {
        t: {"exact", "match"} for t in RULER_TASKS
    }
    eff = df[df["metric"] == "effective_length"]
    assert set(eff["task"]) == {*RULER_TASKS, "average"}
    assert set(eff["axis"]) == {"relative_threshold"}  # no absolute threshold by default


def test_ruler_arm_trains_on_the_task_mixture():
    job = study_job("arm=ruler", "seed=4")
    assert set(job.train.ruler_tasks) == {"passkey", *RULER_TASKS}
    assert job.train.passkey_fraction == 0.9 and job.train.length == 256
    assert job.eval.ruler.enabled and job.eval.nll.enabled
    # the task mixture is in the checkpoint key; a model trained without it keeps its old key
    retrieval = study_job("arm=retrieval", "seed=4")
    assert weights_key(job, corpus=None) != weights_key(retrieval, corpus=None)
    from bench.core.checks import weights_dict

    assert "ruler_tasks" not in weights_dict(TrainConfig())
    assert weights_dict(TrainConfig(ruler_tasks=["vt"]))["ruler_tasks"] == ["vt"]


def test_ruler_stages_from_the_command_line_key_the_model_not_its_fine_tunes():
    """The arm's curriculum, and another typed as a user would: each is in the base model's key,
    and a fine-tune (which trains far fewer updates) reads the mixture, not the stages."""
    from bench.core.checks import weights_dict
    from bench.train.extend import finetune_recipe

    arm = study_job("arm=ruler", "seed=4")
    assert arm.train.ruler_stages == [
        {"steps": 8000, "tasks": ["niah_single", "niah_multikey", "niah_multikey"]},
        {"steps": 6000, "tasks": ["cwe", "fwe", "niah_multikey"]},
    ]
    assert arm.train.steps == 24000
    other = study_job("arm=ruler", "seed=4", "train.ruler_stages=[{steps:6000,tasks:[vt]}]")
    assert other.train.ruler_stages == [{"steps": 6000, "tasks": ["vt"]}]
    none = study_job("arm=ruler", "seed=4", "train.ruler_stages=[]")
    keys = {weights_key(job, corpus=None) for job in (arm, other, none)}
    assert len(keys) == 3
    assert "ruler_stages" not in weights_dict(none.train)  # keys of models trained before hold
    tuned = study_job("arm=ruler", "seed=4", "extend=pi")
    assert finetune_recipe(tuned).ruler_stages == [] and tuned.train.ruler_stages
    # negative control: the stages' own check still runs on the base recipe
    with pytest.raises(ValueError, match="train.ruler_stages take 30000 updates"):
        study_job("arm=ruler", "train.ruler_stages=[{steps:30000,tasks:[vt]}]")


def test_ruler_section_bad_values_are_named():
    with pytest.raises(ValueError, match="eval.ruler.score"):
        study_job("eval.ruler.score=best")
    with pytest.raises(ValueError, match="eval.ruler.threshold"):
        study_job("eval.ruler.threshold=2")
