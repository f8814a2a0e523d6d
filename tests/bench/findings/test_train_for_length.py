"""#27 items 2-3 through the benchmark: the hybrid presets and attention sinks as a user types them
(Hydra presets, checkpoint keys, rows, report labels), the study's arms, and the issue's smoke
command end to end."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest

from bench.core.checks import config_error
from bench.job import NotApplicable, validate_job
from bench.schema import JobConfig, ModelSchema, weights_dict
from bench.train.cache import weights_key

from fixtures.jobs import compose_job


def study_job(*overrides: str) -> JobConfig:
    return compose_job("+experiment=train_for_length", *overrides)


def test_hybrid_presets_reach_the_job():
    swa = study_job("arm=lm_hybrid", "position=rnope_swa")
    assert list(swa.position.layers) == ["swa", "swa", "swa", "nope"]
    assert (swa.position.window, swa.model.n_layers, swa.train.length) == (0, 4, 64)
    irope = study_job("arm=lm_hybrid", "position=irope", "position.chunk=8")
    assert list(irope.position.layers) == ["chunked", "chunked", "chunked", "nope"]
    assert (irope.position.chunk, irope.position.temperature_scale) == (8, 0.1)
    custom = study_job("arm=lm_hybrid", "position=rnope_swa", "position.layers=[swa,nope]")
    assert list(custom.position.layers) == ["swa", "nope"]
    with pytest.raises(ValueError, match="position.layers has 'chunked'"):
        study_job("arm=lm_hybrid", "position=rnope_swa", "position.layers=[chunked,nope]")


def test_the_study_arms_run_their_cells_only():
    validate_job(study_job("arm=lm_sampling", "position=learned", "train.position_sampling=pose"))
    validate_job(study_job("arm=lm_sinks", "position=rope", "model.attention_sink=token"))
    validate_job(study_job("arm=lm_hybrid", "position=irope"))
    with pytest.raises(NotApplicable, match="model.attention_sink learned is not part of arm"):
        validate_job(study_job("arm=lm_sampling", "position=rope", "model.attention_sink=learned"))
    with pytest.raises(NotApplicable, match="train.position_sampling pose is not part of arm"):
        validate_job(study_job("arm=lm_hybrid", "position=rope", "train.position_sampling=pose"))
    with pytest.raises(NotApplicable, match="position rnope_swa is not part of arm lm_sinks"):
        validate_job(study_job("arm=lm_sinks", "position=rnope_swa"))


def test_sinks_and_spans_enter_the_checkpoint_key_only_when_used(tmp_path):
    def key(*overrides: str) -> str:
        return weights_key(study_job("arm=lm_hybrid", *overrides), corpus=None)

    plain = key("position=rope")
    assert "attention_sink" not in weights_dict(ModelSchema())  # keys of earlier models hold
    assert weights_dict(ModelSchema(attention_sink="token"))["attention_sink"] == "token"
    assert key("position=rope", "model.attention_sink=none") == plain
    assert key("position=rope", "model.attention_sink=learned") != plain
    assert key("position=rnope_swa", "position.window=8") != key("position=rnope_swa")
    # another family's field is refused while Hydra composes (each family's own dataclass) ...
    for overrides, sentence in [
        (("position=rope", "position.window=8"), "position.window means nothing for position=rope"),
        (
            ("position=rnope_swa", "position.chunk=8"),
            "position.chunk means nothing for position=rnope_swa",
        ),
    ]:
        with pytest.raises(Exception) as err:
            key(*overrides)
        assert sentence in config_error(err.value)
    # ... so it cannot enter a key: the family's config has no such field
    swa = study_job("arm=lm_hybrid", "position=rnope_swa").position
    assert not hasattr(swa, "chunk")
    assert weights_dict(swa) != weights_dict(dataclasses.replace(swa, window=8))
    with pytest.raises(ValueError, match="model.attention_sink 'on' is unknown"):
        study_job("model.attention_sink=on")


def test_smoke_with_hybrid_layers_and_a_learned_sink_lands_rows_for_every_metric(
    in_tmp, quiet_training, capsys
):
    """The issue's command: smoke's model as rnope_swa and irope with learned sink logits."""
    from bench.cli import main
    from bench.report.frame import add_labels

    argv = [
        "+experiment=smoke",
        "position=rnope_swa,irope",
        "model.attention_sink=learned",
        f"paths.cache={in_tmp / 'cache'}",
        "hydra.callbacks.report.enabled=false",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    df = pd.concat(pd.read_parquet(f) for f in (in_tmp / "results" / "smoke").glob("*.parquet"))
    assert set(df["attention_sink"]) == {"learned"}
    raw = df[df["scaling"] == "none"]
    cells = raw.groupby("position")["metric"].apply(set).to_dict()
    every = {"nll", "passkey_acc", "shift_dnll", "attn_entropy", "position_probe_r2"}
    assert set(cells) == {"rnope_swa", "irope"}
    assert all(every <= metrics for metrics in cells.values()), cells
    params = {json.loads(p)["layers"][-1] for p in df["position_params"]}
    assert params == {"nope"}
    labels = set(add_labels(df.assign(experiment="smoke"))["position_label"])
    assert any(label.startswith("irope") and label.endswith("+learned sink") for label in labels)
    plain = add_labels(df.drop(columns="attention_sink").assign(experiment="smoke"))
    assert not any("sink" in label for label in plain["position_label"])  # control


def test_two_arms_holding_one_model_get_their_own_rows():
    """rope without a sink is in arm lm_sampling and arm lm_sinks: the same checkpoint, but each
    arm's rows (whose ``arm`` column differs) have their own run id, so neither arm finds the
    other's results and skips its own."""
    from bench.job_rows import make_run_id

    sampling = validate_job(study_job("arm=lm_sampling", "position=rope"))
    sinks = validate_job(study_job("arm=lm_sinks", "position=rope"))
    assert weights_key(sampling.job, corpus=None) == weights_key(sinks.job, corpus=None)
    assert make_run_id("m", sampling) != make_run_id("m", sinks)
    # control: the same arm and cell twice is the same run
    again = validate_job(study_job("arm=lm_sampling", "position=rope"))
    assert make_run_id("m", sampling) == make_run_id("m", again)
