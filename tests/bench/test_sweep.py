"""End-to-end sweeps through the ``lenbench`` CLI (in-process, CPU, seconds).

The smoke experiment sweeps position rope,alibi x scaling none,linear: rope/none trains, rope/linear
must reuse rope's checkpoint, alibi/none trains, alibi/linear is not applicable and is skipped.
Results, cache, reports and Hydra's multirun dirs all live in a tmp dir.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import bench.job as job_module
import bench.train.cache as cache_module
from bench.cli import STATUS_FILE, main
from bench.core.results import load_results
from bench.core.rows import REQUIRED_COLUMNS
from bench.train.guards import TrainingDiverged
from bench.train.trainer import train_model


class TrainCounter:
    """Wraps bench.train.cache.get_or_train so that every real training is counted (and can fail)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail_for: str | None = None):
        self.calls: list[str] = []
        self.fail_for = fail_for
        original = cache_module.get_or_train

        def train_fn(job, corpus, **kwargs):
            kind = job.position.kind
            self.calls.append(kind)
            if kind == self.fail_for:
                raise TrainingDiverged(
                    "training diverged at step 3 of 8: the loss is nan", 3, float("nan")
                )
            return train_model(job, corpus, **kwargs)

        def counting_get_or_train(job, corpus, cache_root=None, **kwargs):
            kwargs["train_fn"] = train_fn
            kwargs["progress"] = False
            return original(job, corpus, cache_root, **kwargs)

        monkeypatch.setattr(cache_module, "get_or_train", counting_get_or_train)


def smoke_args(root: Path, *extra: str) -> list[str]:
    return [
        "+experiment=smoke",
        f"paths.results={root / 'results'}",
        f"paths.reports={root / 'reports'}",
        f"paths.cache={root / 'cache'}",
        *extra,
    ]


def run_sweep(root: Path, monkeypatch: pytest.MonkeyPatch, *extra: str, fail_for=None):
    """Run the smoke sweep in ``root``; return (exit code, train calls, statuses by cell)."""
    monkeypatch.chdir(root)
    counter = TrainCounter(monkeypatch, fail_for)
    sweep_dir = root / "multirun" / f"sweep{len(list(root.glob('multirun/*')))}"
    code = main(smoke_args(root, *extra, f"hydra.sweep.dir={sweep_dir}"))
    statuses = {}
    for path in sweep_dir.glob(f"*/{STATUS_FILE}"):
        st = json.loads(path.read_text())
        statuses[(st["position"], st["scaling"])] = st
    return code, counter.calls, statuses


def result_files(root: Path) -> dict[str, float]:
    return {p.name: p.stat().st_mtime_ns for p in (root / "results" / "smoke").glob("*.parquet")}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One smoke sweep shared by the tests below (they only read it or work on copies)."""
    root = tmp_path_factory.mktemp("smoke")
    with pytest.MonkeyPatch.context() as mp:
        code, calls, statuses = run_sweep(root, mp)
    return root, code, calls, statuses


def test_smoke_sweep_trains_each_checkpoint_once_and_writes_results(smoke, capsys):
    root, code, calls, statuses = smoke
    assert code == 0
    # rope/linear and rope/none share one checkpoint: two trainings (rope, alibi), not three.
    assert sorted(calls) == ["alibi", "rope"]
    assert set(statuses) == {
        ("rope", "none"),
        ("rope", "linear"),
        ("alibi", "none"),
        ("alibi", "linear"),
    }
    assert statuses[("rope", "none")]["status"] == "done" and statuses[("rope", "none")]["trained"]
    assert statuses[("rope", "linear")]["status"] == "done"
    assert statuses[("rope", "linear")]["trained"] is False
    assert statuses[("alibi", "linear")]["status"] == "not_applicable"
    assert "does not apply to position alibi" in statuses[("alibi", "linear")]["message"]
    # changing the scaling changes the run, not the model
    assert statuses[("rope", "none")]["model_id"] == statuses[("rope", "linear")]["model_id"]
    assert statuses[("rope", "none")]["run_id"] != statuses[("rope", "linear")]["run_id"]
    assert statuses[("rope", "none")]["model_id"] != statuses[("alibi", "none")]["model_id"]
    assert len(list((root / "cache").glob("*/DONE"))) == 2

    files = sorted((root / "results" / "smoke").glob("*.parquet"))
    assert len(files) == 3
    for f in files:
        df = pd.read_parquet(f)
        assert set(REQUIRED_COLUMNS) <= set(df.columns)
        assert df["run_id"].nunique() == 1 and f.stem == df["run_id"].iloc[0]
        assert (df["experiment"] == "smoke").all() and (df["train_length"] == 64).all()
        assert (df["arm"] == "all").all()  # no study arm chosen
        assert df["code_version"].iloc[0].startswith("0.1.0+")
        assert set(df["metric"]) >= {"nll"}
    df = load_results(root / "results" / "smoke")
    assert set(zip(df["position"], df["scaling"], strict=True)) == {
        ("rope", "none"),
        ("rope", "linear"),
        ("alibi", "none"),
    }
    linear = df[df["scaling"] == "linear"]["scaling_params"].iloc[0]
    assert json.loads(linear) == {
        "logn": False,
        "method": "linear",
        "params": {"factor": 2},
    }  # L=64, longest 2x
    assert (root / "reports" / "smoke" / "report.md").is_file()


def test_rerun_of_finished_sweep_trains_nothing_and_adds_no_rows(smoke, monkeypatch, capsys):
    root, *_ = smoke
    files_before = result_files(root)
    rows_before = len(load_results(root / "results" / "smoke", dedup=False))
    code, calls, statuses = run_sweep(root, monkeypatch)
    assert code == 0
    assert calls == []  # (this run also writes the report again: its path is printed)
    assert sorted(st["status"] for st in statuses.values()) == [
        "cached",
        "cached",
        "cached",
        "not_applicable",
    ]
    assert result_files(root) == files_before  # not even rewritten
    assert len(load_results(root / "results" / "smoke", dedup=False)) == rows_before
    out = capsys.readouterr().out
    assert "3 already had results" in out and "report written to" in out


def test_summary_counts_only_this_sweeps_jobs_in_a_reused_sweep_dir(
    smoke, tmp_path, monkeypatch, capsys
):
    """A sweep dir that an earlier, larger sweep used keeps that sweep's job dirs; the summary and
    the exit code are this sweep's (4 jobs, 0 failed), not the stale failure's."""
    root, *_ = smoke
    for name in ("results", "cache"):
        shutil.copytree(root / name, tmp_path / name)
    sweep_dir = tmp_path / "multirun" / "sweep0"
    stale = sweep_dir / "9" / STATUS_FILE
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"status": "failed", "position": "x", "scaling": "y",
                                 "message": "from an earlier sweep"}))  # fmt: skip
    monkeypatch.chdir(tmp_path)
    counter = TrainCounter(monkeypatch)
    code = main(smoke_args(tmp_path, f"hydra.sweep.dir={sweep_dir}"))
    out = capsys.readouterr().out
    assert code == 0 and counter.calls == []
    assert "lenbench: 4 jobs: 0 evaluated" in out and "0 failed" in out
    assert "from an earlier sweep" not in out
    # negative control: read without the sweep's start, the stale file is counted as a failure
    from bench.cli import _read_statuses, summarize

    line, failures = summarize(_read_statuses(sweep_dir))
    assert line.startswith("lenbench: 5 jobs") and "1 failed" in line and len(failures) == 1


def test_killed_sweep_resumes_without_retraining_finished_checkpoints(smoke, tmp_path, monkeypatch):
    """State of a sweep killed while training alibi: rope done, alibi checkpoint and rows missing."""
    root, *_ = smoke
    for name in ("results", "cache"):
        shutil.copytree(root / name, tmp_path / name)
    alibi_id = next(
        st["model_id"]
        for st in smoke[3].values()
        if st["position"] == "alibi" and st.get("model_id")
    )
    (tmp_path / "cache" / alibi_id / "DONE").unlink()  # the kill hit before the checkpoint was done
    alibi_rows = [
        p
        for p in (tmp_path / "results" / "smoke").glob("*.parquet")
        if "alibi" in set(pd.read_parquet(p)["position"])
    ]
    assert len(alibi_rows) == 1
    alibi_rows[0].unlink()
    rope_files = result_files(tmp_path)

    code, calls, statuses = run_sweep(tmp_path, monkeypatch, "hydra.callbacks.report.enabled=false")
    assert code == 0
    assert calls == ["alibi"]  # rope's checkpoint is reused, only the unfinished one trains
    assert statuses[("rope", "none")]["status"] == "cached"
    assert statuses[("rope", "linear")]["status"] == "cached"
    assert statuses[("alibi", "none")]["status"] == "done"
    after = result_files(tmp_path)
    assert {k: v for k, v in after.items() if k in rope_files} == rope_files
    fresh = load_results(tmp_path / "results" / "smoke", dedup=False)
    original = load_results(root / "results" / "smoke", dedup=False)
    assert len(fresh) == len(original)
    assert sorted(fresh["run_id"].unique()) == sorted(original["run_id"].unique())


def test_failing_jobs_are_recorded_and_the_sweep_continues(tmp_path, monkeypatch, capsys):
    # rope's training diverges; passkey_fraction 0.5 needs train.length >= 252 (smoke: 64), so
    # those cells are invalid and must fail before training; alibi at 0.0 must still run.
    code, calls, statuses = run_sweep(
        tmp_path,
        monkeypatch,
        "scaling=none",
        "train.passkey_fraction=0.0,0.5",
        "hydra.callbacks.report.enabled=false",
        fail_for="rope",
    )
    assert code == 1  # the sweep reports the failures in its exit status ...
    by_status = {}
    for path in (tmp_path / "multirun").glob(f"*/*/{STATUS_FILE}"):
        st = json.loads(path.read_text())
        by_status.setdefault(st["status"], []).append(st)
    assert sorted(by_status) == ["done", "failed", "invalid"]
    (failed,) = by_status["failed"]
    assert failed["position"] == "rope" and "training diverged" in failed["message"]
    assert failed["message"].count("training diverged") == 1  # said once, not prefixed twice
    assert len(by_status["invalid"]) == 2
    assert all(
        "train.length 64 is too short for passkey training examples" in st["message"]
        for st in by_status["invalid"]
    )
    (done,) = by_status["done"]  # ... but went on after them
    assert done["position"] == "alibi"
    assert sorted(calls) == ["alibi", "rope"]  # the invalid cells never reached training
    df = load_results(tmp_path / "results" / "smoke")
    assert set(df["position"]) == {"alibi"}  # nothing written for the failed job
    assert len(list((tmp_path / "cache").glob("*/DONE"))) == 1  # only alibi's checkpoint
    out = capsys.readouterr().out
    assert "3 failed" in out and "rope/none" in out and "training diverged" in out
    assert "lenbench: error: train.length 64 is too short" in out  # the job's own log line


def test_sweep_in_which_nothing_ran_writes_no_report(smoke, tmp_path, monkeypatch, capsys):
    """Every cell not applicable: the jobs are skipped and no report is written, although the
    experiment has results from an earlier sweep (which a report would cover)."""
    root, *_ = smoke
    shutil.copytree(root / "results", tmp_path / "results")
    code, calls, statuses = run_sweep(tmp_path, monkeypatch, "position=alibi", "scaling=linear")
    assert code == 0 and calls == []
    assert [st["status"] for st in statuses.values()] == ["not_applicable"]
    out = capsys.readouterr().out
    assert "no job of this sweep ran; no report written" in out and "report written to" not in out
    assert not (tmp_path / "reports").exists()
    # negative control: a sweep that reuses those results does write the report
    code, calls, statuses = run_sweep(tmp_path, monkeypatch, "position=rope", "scaling=none")
    assert code == 0 and [st["status"] for st in statuses.values()] == ["cached"]
    assert (tmp_path / "reports" / "smoke" / "report.md").is_file()


def test_run_job_validates_before_touching_the_cache(monkeypatch, tmp_path):
    """run_job on a bad config returns 'invalid' without loading data or training."""
    from fixtures.jobs import compose_config

    def boom(*args, **kwargs):
        raise AssertionError("must not be reached")

    monkeypatch.setattr(cache_module, "get_or_train", boom)
    monkeypatch.setattr("bench.data.corpora.load_corpus", boom)
    cfg = compose_config("position=rope", "model.n_heads=3", f"paths.cache={tmp_path}")
    summary = job_module.run_job(cfg)
    assert summary["status"] == "invalid"
    assert "not divisible by n_heads 3" in summary["message"]


def test_run_job_with_an_empty_test_split_is_invalid_before_training(monkeypatch, tmp_path):
    """A corpus with nothing in its test split would train a model and then evaluate nothing."""
    from fixtures.jobs import compose_config

    def boom(*args, **kwargs):
        raise AssertionError("must not be reached")

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(6):
        (docs / f"doc{i}.txt").write_text(f"document {i} " * 200)
    monkeypatch.setattr(cache_module, "get_or_train", boom)
    overrides = [
        "position=rope",
        "data=text",
        f"data.paths=[{docs}]",
        "data.split_fractions={train: 0.9, validation: 0.1, test: 0.0}",
        f"paths.cache={tmp_path / 'cache'}",
        f"paths.results={tmp_path / 'results'}",
    ]
    summary = job_module.run_job(compose_config(*overrides))
    assert summary["status"] == "invalid"
    assert "test split of corpus" in summary["message"] and "is empty" in summary["message"]
    # negative control: with a test share the same corpus gets past this check (to training)
    overrides[3] = "data.split_fractions={train: 0.0, validation: 0.0, test: 1.0}"
    with pytest.raises(AssertionError, match="must not be reached"):
        job_module.run_job(compose_config(*overrides))


def test_a_model_that_failed_is_not_trained_again_in_the_same_sweep(tmp_path, monkeypatch, capsys):
    """rope/none's training diverges; rope/linear needs the same checkpoint: it reports the
    failure in one sentence instead of training the model again (issue 51)."""
    args = ("position=rope", "hydra.callbacks.report.enabled=false")
    code, calls, statuses = run_sweep(tmp_path, monkeypatch, *args, fail_for="rope")
    assert code == 1 and calls == ["rope"]  # trained once, not once per cell
    first, second = statuses[("rope", "none")], statuses[("rope", "linear")]
    assert first["status"] == second["status"] == "failed"
    assert "training diverged" in first["message"] and first["model_id"] == second["model_id"]
    assert second["message"] == (
        f"model {first['model_id']} already failed to train earlier in this sweep (job "
        f"[{first['job']}]), so it is not trained again; that job's error says why."
    )
    # controls: the next sweep trains it again, also in the same sweep dir (a sweep remembers
    # only its own failures), and a model that trains is reused as before
    sweep_dir = next((tmp_path / "multirun").iterdir())
    monkeypatch.undo()  # the first sweep's training counter
    monkeypatch.chdir(tmp_path)
    counter = TrainCounter(monkeypatch, "rope")
    assert main(smoke_args(tmp_path, *args, f"hydra.sweep.dir={sweep_dir}")) == 1
    assert counter.calls == ["rope"]
    monkeypatch.undo()
    code, calls, statuses = run_sweep(tmp_path, monkeypatch, *args)
    assert code == 0 and calls == ["rope"] and statuses[("rope", "linear")]["status"] == "done"
