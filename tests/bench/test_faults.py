"""Faults injected where results could silently be wrong: a checkpoint whose bytes changed on
disk, a truncated result file, a training that ends no better than a uniform guess. Each with a
healthy control that must go on as before.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from bench.cli import main
from bench.core.results import load_results
from bench.train.cache import get_or_train
from bench.train.checkpoints import CheckpointCorrupt
from bench.train.guards import MIN_STEPS_FOR_PROGRESS, TrainingDiverged, check_progress
from bench.train.trainer import train_model

from fixtures.jobs import CountingTrainer, make_cfg, same_weights

pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- checkpoints


def _flip(path: Path, n_bytes: int = 64) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    for i in range(middle, middle + n_bytes):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_bit_flipped_checkpoint_is_retrained_with_a_warning(tmp_path, corpus, corpus_dir, caplog):
    trainer = CountingTrainer()
    cfg = make_cfg(corpus_dir)
    first, meta, _ = get_or_train(cfg, corpus, tmp_path, train_fn=trainer, progress=False)
    # healthy control: an untouched checkpoint loads, nothing trains
    again, _, trained = get_or_train(cfg, corpus, tmp_path, train_fn=trainer)
    assert not trained and trainer.calls == 1 and same_weights(first, again)
    model_file = Path(meta["path"]) / "model.pt"
    _flip(model_file)
    with caplog.at_level(logging.WARNING, logger="bench.train.cache"):
        retrained, _, trained = get_or_train(cfg, corpus, tmp_path, train_fn=trainer)
    assert trained and trainer.calls == 2 and same_weights(first, retrained)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(model_file) in warnings[0] and "SHA-256" in warnings[0]
    # after the retrain it loads again without training
    assert not get_or_train(cfg, corpus, tmp_path, train_fn=trainer)[2] and trainer.calls == 2


def test_a_bit_flipped_checkpoint_stops_when_asked_not_to_retrain(tmp_path, corpus, corpus_dir):
    trainer = CountingTrainer()
    cfg = make_cfg(corpus_dir)
    _, meta, _ = get_or_train(cfg, corpus, tmp_path, train_fn=trainer, progress=False)
    _flip(Path(meta["path"]) / "model.pt")
    with pytest.raises(CheckpointCorrupt, match="does not match the SHA-256") as info:
        get_or_train(cfg, corpus, tmp_path, train_fn=trainer, retrain_corrupt=False)
    assert "\n" not in str(info.value) and trainer.calls == 1


# --------------------------------------------------------------------------- result files


SMOKE = [
    "+experiment=smoke",
    "hydra.mode=RUN",
    "position=rope",
    "scaling=none",
    "hydra.callbacks.report.enabled=false",
]


def test_a_truncated_result_file_is_moved_aside_and_recomputed(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = [*SMOKE, f"paths.cache={tmp_path / 'cache'}"]
    assert main(args) == 0, capsys.readouterr().err
    results = tmp_path / "results" / "smoke"
    (path,) = results.glob("*.parquet")
    good = pd.read_parquet(path)
    # healthy control: a finished, readable file is not recomputed
    stamp = path.stat().st_mtime_ns
    assert main(args) == 0 and path.stat().st_mtime_ns == stamp
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError):
        load_results(results)  # what the truncated file did to every reader
    assert main(args) == 0, capsys.readouterr().err
    (aside,) = results.glob("*.parquet.unreadable-*")
    assert aside.stat().st_size < path.stat().st_size
    again = pd.read_parquet(path)
    assert len(again) == len(good) and again["value"].tolist() == good["value"].tolist()
    assert len(load_results(results)) == len(good)


# --------------------------------------------------------------------------- training


def test_progress_check_on_loss_traces():
    uniform = math.log(259)
    with pytest.raises(TrainingDiverged, match=r"no better than a uniform guess"):
        check_progress(uniform, MIN_STEPS_FOR_PROGRESS, 259)  # the audit's lr=1e3 run
    check_progress(3.2, MIN_STEPS_FOR_PROGRESS, 259)  # healthy control
    check_progress(uniform, MIN_STEPS_FOR_PROGRESS - 1, 259)  # too short to judge: no check


def test_a_training_that_learns_nothing_fails_and_a_healthy_one_does_not(corpus, corpus_dir):
    """lr 0 for 100 updates leaves the model at its initialisation (a uniform guess): the job
    fails with the reason; the same run at a working lr is kept."""
    stuck = make_cfg(corpus_dir, steps=MIN_STEPS_FOR_PROGRESS, lr=0.0, warmup_steps=0)
    with pytest.raises(TrainingDiverged, match="no better than a uniform guess") as info:
        train_model(stuck, corpus, progress=False)
    assert "\n" not in str(info.value)
    healthy = make_cfg(corpus_dir, steps=MIN_STEPS_FOR_PROGRESS, lr=3e-3, warmup_steps=5)
    model, stats = train_model(healthy, corpus, progress=False)
    assert stats.final_train_loss < math.log(259) - 1.0
    assert isinstance(model, torch.nn.Module)


def test_a_job_whose_training_ends_at_a_uniform_guess_is_recorded_as_failed(
    tmp_path, monkeypatch, capsys
):
    """The audit's case (a run that ends predicting every byte uniformly, loss = ln 259): the
    model's output layer is zeroed and lr is 0, so it stays uniform for 100 updates. The job
    fails with the reason and writes no rows; the same job at its normal lr is kept (control)."""
    import bench.train.trainer as train_module

    original = train_module.make_model

    def uniform_output(job):
        model = original(job)
        with torch.no_grad():
            model.lm_head.weight.zero_()  # tied to the embedding: every logit is 0
        return model

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train_module, "make_model", uniform_output)
    args = [*SMOKE, f"paths.cache={tmp_path / 'cache'}", f"train.steps={MIN_STEPS_FOR_PROGRESS}"]
    assert main([*args, "train.lr=0", "train.warmup_steps=0"]) == 1
    err = capsys.readouterr().err
    assert "no better than a uniform guess" in err
    assert not list((tmp_path / "results").rglob("*.parquet"))  # no result recorded
    monkeypatch.setattr(train_module, "make_model", original)
    assert main(args) == 0, capsys.readouterr().err  # control: a run that learns is kept
    assert len(list((tmp_path / "results").rglob("*.parquet"))) == 1


# --------------------------------------------------------------------------- file modes


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_checkpoints_and_results_follow_the_umask(tmp_path, corpus, corpus_dir, umask, mode):
    """Before: 0o600 whatever the umask (mkstemp), so a shared cache was private to its writer."""
    import os

    from bench.core.results import write_results

    from fixtures.rows import row

    old = os.umask(umask)
    try:
        _, meta, _ = get_or_train(
            make_cfg(corpus_dir), corpus, tmp_path, train_fn=CountingTrainer()
        )
        path = write_results([row()], tmp_path / "r.parquet")
    finally:
        os.umask(old)
    for f in (Path(meta["path"]) / "model.pt", Path(meta["path"]) / "DONE", path):
        assert f.stat().st_mode & 0o777 == mode, f


# --------------------------------------------------------------------------- I/O errors


@pytest.mark.parametrize(
    "where, override",
    [
        ("results", "paths.results={blocker}/results"),
        ("cache", "paths.cache={blocker}/cache"),
        ("reports", "paths.reports={blocker}/reports"),
    ],
)
def test_an_unusable_directory_is_one_sentence_and_a_failure(
    tmp_path, monkeypatch, capsys, where, override
):
    """A results, cache or reports path below a file (unwritable even for root): one sentence
    naming the path and the errno, exit 1, nothing half-written (before: tracebacks, and exit 0
    when only the report failed)."""
    monkeypatch.chdir(tmp_path)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    smoke = [a for a in SMOKE if where != "reports" or "report.enabled" not in a]
    args = [*smoke, f"paths.cache={tmp_path / 'cache'}", override.format(blocker=blocker)]
    assert main(args) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if "lenbench: error:" in line]
    assert len(err) == 1 and str(blocker) in err[0] and "errno 20" in err[0], err
    assert "Traceback" not in err[0]
    assert not list(tmp_path.rglob("*.tmp")) and not list(tmp_path.rglob(".*.parquet.*"))


# --------------------------------------------------------------------------- data errors


@pytest.mark.parametrize(
    "make, overrides, message",
    [
        (lambda d: (d / "empty.txt").write_text(""), ["data=text", "data.paths=[{d}/empty.txt]"],
         "every file it matches is empty"),
        (lambda d: (d / "one.bin").write_bytes(bytes(range(256)) * 12),
         ["data=text", "data.paths=[{d}/one.bin]"], "has 1 document(s), so its test split is empty"),
        (lambda d: None, ["data=hf", "data.path=nosuch/dataset"],
         "data.path 'nosuch/dataset' (split 'train') could not be loaded"),
    ],
)  # fmt: skip
def test_a_data_source_that_cannot_work_is_one_sentence_before_any_job(
    tmp_path, monkeypatch, capsys, make, overrides, message
):
    """Checked once for the sweep (before: once per job, exit 1, tracebacks for data=hf, an
    empty file blamed on the caps, a one-file corpus on split_fractions)."""
    import datasets

    def offline(path, *args, **kwargs):  # what datasets raises without network, deterministically
        raise ConnectionError(f"Couldn't reach '{path}' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(datasets, "load_dataset", offline)
    make(tmp_path)
    import bench.job as job_module

    monkeypatch.setattr(job_module, "run_job", _fail_if_a_job_runs)
    args = ["+experiment=smoke", "position=rope,alibi", "scaling=none",
            f"paths.cache={tmp_path / 'cache'}", *[o.format(d=tmp_path) for o in overrides]]  # fmt: skip
    assert main(["-m", *args]) == 2
    err = capsys.readouterr().err.splitlines()
    errors = [line for line in err if line.startswith("lenbench: error: ")]
    assert len(errors) == 1 and message in errors[0], err
    assert not any("Traceback" in line for line in err), err


def _fail_if_a_job_runs(*args, **kwargs):
    raise AssertionError("no job may start")
