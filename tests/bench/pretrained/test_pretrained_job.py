"""Pretrained transformers models as lenbench jobs: rows, statuses, the report and the config.

Every model is built locally (``tests/fixtures/hf.py``): nothing is downloaded.
"""

from __future__ import annotations

import json

import pytest

from bench.data.corpora import stdlib_root
from bench.pretrained.config import PretrainedConfig, model_id

from fixtures import ROOT
from fixtures.hf import one_sentence, small_eval

pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- jobs and the report


def _job(model_path, tmp_path, scaling="none", **pretrained):
    import yaml

    from bench.schema import JobConfig

    conf = ROOT / "conf" / "scaling"
    files = [
        "textwrap.py",
        "shlex.py",
        "bisect.py",
        "heapq.py",
        "string.py",
        "glob.py",
        "fnmatch.py",
    ]
    return JobConfig.from_hydra(
        {
            "experiment_name": "pretrained_test",
            "paths": {"results": str(tmp_path / "results"), "reports": str(tmp_path / "reports")},
            "device": "cpu",
            "pretrained": {"path": str(model_path), **pretrained},
            "scaling": yaml.safe_load((conf / f"{scaling}.yaml").read_text()),
            "data": {
                "name": "text",
                "paths": [str(stdlib_root() / f) for f in files],
                "split_fractions": {"train": 0.01, "validation": 0.01, "test": 0.98},
            },
            "eval": small_eval(
                ["4x"],
                **{
                    m: {"enabled": False}
                    for m in ("order_dnll", "context_nll", "position_probe_r2")
                },
            ),
        }
    )


def test_job_writes_rows_that_the_report_draws(hf_model_dirs, tmp_path):
    import pandas as pd

    from bench.job import run_job
    from bench.report import generate_report

    done = run_job(_job(hf_model_dirs["llama"], tmp_path))
    assert done["status"] == "done", done
    rows = pd.read_parquet(done["results_path"])
    assert set(rows["position"]) == {"rope"} and set(rows["train_length"]) == {64}
    assert set(rows["model_id"]) == {model_id(PretrainedConfig(path=str(hf_model_dirs["llama"])))}
    assert set(rows["corpus"]) == {"text"} and set(rows["scaling"]) == {"none"}
    assert '"pretrained":"llama"' in rows["position_params"].iloc[0]
    assert {"nll", "passkey_acc", "shift_dnll", "attn_entropy"} <= set(rows["metric"])
    assert run_job(_job(hf_model_dirs["llama"], tmp_path))["status"] == "cached"  # the dedup rule
    yarn = run_job(_job(hf_model_dirs["llama"], tmp_path, "yarn"))
    assert yarn["status"] == "done" and yarn["run_id"] != done["run_id"]
    params = json.loads(pd.read_parquet(yarn["results_path"])["scaling_params"].iloc[0])
    assert params["params"]["factor"] == 4.0  # one factor per run: 256 / 64
    gpt2 = run_job(_job(hf_model_dirs["gpt2"], tmp_path, train_length=16))  # 4x = its 64 rows
    assert gpt2["status"] == "done", gpt2
    report = generate_report([tmp_path / "results" / "pretrained_test"], tmp_path / "report")
    text = report.read_text()
    assert "llama" in text and "gpt2" in text  # each model is its own series
    assert any((tmp_path / "report" / "plots").glob("ppl_vs_length*.png"))
    # the leaderboard ranks a pretrained model's methods against each other only (its own recipe)
    from bench.core.results import load_results
    from bench.report.leaderboard import leaderboard_table

    table = leaderboard_table(load_results([tmp_path / "results" / "pretrained_test"]))
    llama = f"pretrained:{model_id(PretrainedConfig(path=str(hf_model_dirs['llama'])))}"
    assert set(table.loc[table["recipe"] == llama, "method"]) == {"none", "yarn"}
    assert table["recipe"].nunique() == 2  # control: gpt2 is another recipe, never ranked with it


def test_job_statuses_for_bad_input_and_inapplicable_scaling(hf_model_dirs, tmp_path):
    from bench.job import run_job

    for arch, scaling, status, words in [
        ("bloom", "logn", "not_applicable", "AttentionInterface"),  # its own attention code
        ("gpt2", "ntk", "not_applicable", "does not apply to position learned"),
        ("gpt2", "yarn", "not_applicable", "does not apply to position learned"),
        ("bloom", "linear", "not_applicable", "does not apply to position alibi"),
    ]:
        summary = run_job(_job(hf_model_dirs[arch], tmp_path, scaling))
        assert summary["status"] == status and words in summary["message"], summary
    # 4x of 32 is beyond gpt2's 64-row table: refused before the weights load (once skipped
    # after loading, with a warning and an exit status 0); control: 4x of 16 fits (test above)
    beyond = run_job(_job(hf_model_dirs["gpt2"], tmp_path, train_length=32))
    assert beyond["status"] == "invalid", beyond
    assert (
        "eval lengths [128] are beyond this gpt2 model's learned position table (64"
        in (beyond["message"])
    )
    one_sentence(beyond["message"])
    missing = run_job(_job(tmp_path / "no-model", tmp_path))
    assert missing["status"] == "invalid" and "does not exist" in missing["message"]
    one_sentence(missing["message"])
    assert not (tmp_path / "results").exists()  # nothing written for any of them


def test_experiment_config_composes(hf_model_dirs):
    from bench.schema import JobConfig

    from fixtures.jobs import compose_config

    path = f"pretrained.path={hf_model_dirs['llama']}"
    cfg = compose_config("+experiment=pretrained", path, hydra=True)
    without = compose_config("+experiment=pretrained")
    assert str(cfg.hydra.sweeper.params.scaling) == "none,linear,yarn"
    job = JobConfig.from_hydra(cfg)
    assert (
        job.pretrained.path == str(hf_model_dirs["llama"]) and job.experiment_name == "pretrained"
    )
    with pytest.raises(ValueError, match="pretrained.path is required"):
        JobConfig.from_hydra(without)


def test_longppl_on_a_pretrained_model_with_a_pretrained_evaluator(hf_model_dirs, tmp_path):
    """eval.longppl on a pretrained model: a named transformers evaluator with the same tokenizer
    chooses the key tokens (rows name it); without one, or with a lenbench evaluator setting,
    one sentence before work; an evaluator too short for the length is refused by name."""
    import pandas as pd

    from bench.job import run_job, validate_job

    longppl = {"enabled": True, "alpha": 0.0, "beta": -100.0, "max_docs": 2}
    from dataclasses import replace

    from bench.eval.metrics import as_eval_config

    base = _job(hf_model_dirs["llama"], tmp_path)
    evaluator = str(hf_model_dirs["neox"])
    with_eval = replace(base, eval=as_eval_config({**small_eval(["4x"]), "longppl": {
        **longppl, "evaluator_pretrained": evaluator}}))  # fmt: skip
    done = run_job(with_eval)
    assert done["status"] == "done", done
    rows = pd.read_parquet(done["results_path"])
    long = rows[rows["metric"] == "longppl"]
    assert set(long["eval_length"]) == {128, 256} and (long["n"] > 0).all()
    assert {json.loads(p)["evaluator"] for p in long["task_params"]} == {f"hf:{evaluator}"}
    without = replace(base, eval=as_eval_config({**small_eval(["4x"]), "longppl": longppl}))
    with pytest.raises(ValueError, match="needs eval.longppl.evaluator_pretrained") as err:
        validate_job(without)
    one_sentence(str(err.value))
    short = replace(base, eval=as_eval_config({**small_eval(["4x"]), "longppl": {
        **longppl, "evaluator_pretrained": str(hf_model_dirs["gpt2"])}}))  # fmt: skip
    summary = run_job(short)
    assert summary["status"] == "invalid" and "cannot score length 256" in summary["message"]
