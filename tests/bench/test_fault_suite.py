"""The fault suite of issue 51 (item 10): each fault is detected, reported in one sentence, loses
nothing that was finished, and a plain rerun heals it. Each test names its fault and the sentence
it expects; a healthy control shows that the fault, not the setup, made the difference.

Faults covered elsewhere (not repeated here): a bit-flipped model.pt (tests/bench/test_faults.py),
a truncated or bit-flipped result parquet (test_faults.py, test_integrity.py), a bit-flipped
resume.pt (test_integrity.py), a training killed by SIGKILL while it holds the lock
(test_cache.py) and a simulated kill during a training or a fine-tune (test_cache.py,
test_extend.py, test_sweep.py). Here: a damaged DONE marker, a truncated model.pt and resume.pt, a
disk that fills while a checkpoint file, a resumable state or a result file is written, a real
``kill -9`` of a ``lenbench`` process during training, fine-tuning, evaluation and the result
write, and two sweeps on one cache at once.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

import bench.train.cache as cache_module
from bench.cli import STATUS_FILE, main
from bench.core.results import load_results
from bench.train.cache import get_or_train, weights_key
from bench.train.checkpoints import CheckpointCorrupt, load_model
from bench.train.resume import ResumeFile
from bench.train.trainer import train_model

from fixtures import ROOT
from fixtures.jobs import CountingTrainer, Killed, make_cfg, same_weights

pytestmark = pytest.mark.usefixtures("one_thread")

NO_SPACE = "No space left on device (errno 28)"

SMOKE = [
    "+experiment=smoke",
    "hydra.mode=RUN",
    "position=rope",
    "scaling=none",
    "hydra.callbacks.report.enabled=false",
    "train.save_every=2",  # 8 updates: states after 2, 4 and 6
]


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "lenbench: error:" in line]


def leftovers(root: Path) -> list[Path]:
    """Temp files of writers (cache: ``.tmp-*``; results: ``.<name>.parquet.*.tmp``)."""
    return [p for p in root.rglob(".*") if p.is_file() and p.name != ".gitignore"]


class Trainings:
    """Counts the trainings of in-process runs: (extend name, update it resumed from)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, int]] = []
        original = cache_module.get_or_train

        def train_fn(job, corpus, **kwargs):
            model, stats = train_model(job, corpus, **kwargs)
            self.calls.append((job.extend.name, stats.resumed_from or 0))
            return model, stats

        def counting(job, corpus, cache_root=None, **kwargs):
            return original(job, corpus, cache_root, **{**kwargs, "train_fn": train_fn})

        monkeypatch.setattr(cache_module, "get_or_train", counting)


# --------------------------------------------------------------------------- damaged cache files


def _flip_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_recorded_digest(path: Path) -> None:
    """One bit of the SHA-256 recorded in DONE: the file is still valid JSON."""
    text = path.read_text()
    digest = json.loads(text)["sha256"]
    at = text.index(digest) + 5
    path.write_text(text[:at] + chr(ord(text[at]) ^ 0x01) + text[at + 1 :])
    assert json.loads(path.read_text())["sha256"] != digest


@pytest.mark.parametrize(
    "name, damage, named, sentence",
    [
        ("DONE", _flip_middle, "DONE", "is not the JSON written when it was completed"),
        ("DONE", _truncate, "DONE", "is not the JSON written when it was completed"),
        # the recorded digest and model.pt disagree: the sentence names the file it checks
        ("DONE", _flip_recorded_digest, "model.pt", "does not match the SHA-256 recorded"),
        ("model.pt", _truncate, "model.pt", "does not match the SHA-256 recorded"),
    ],
    ids=["DONE-bit-flip", "DONE-truncated", "DONE-digest-bit-flip", "model.pt-truncated"],
)
def test_a_damaged_checkpoint_file_is_retrained_with_one_warning(
    tmp_path, corpus, corpus_dir, caplog, name, damage, named, sentence
):
    """Fault: a bit flip or a truncation of a finished checkpoint's DONE marker or model.pt.
    Expected: one warning sentence naming the file ("checkpoint marker <DONE> is not the JSON
    written when it was completed (its bytes changed on disk ...); it is retrained" or "checkpoint
    file <model.pt> does not match the SHA-256 recorded when it was written ..."), the checkpoint
    is retrained once, another checkpoint in the same cache is untouched, and the next run loads.
    Before, a damaged DONE stopped every rerun with "cannot be read ...; delete it to retrain"."""
    trainer = CountingTrainer()
    cfg, other = make_cfg(corpus_dir), make_cfg(corpus_dir, steps=4)
    first, meta, _ = get_or_train(cfg, corpus, tmp_path, train_fn=trainer)
    _, other_meta, _ = get_or_train(other, corpus, tmp_path, train_fn=trainer)
    other_files = {p: p.stat().st_mtime_ns for p in Path(other_meta["path"]).iterdir()}
    # healthy control: the untouched checkpoint loads, nothing trains
    assert not get_or_train(cfg, corpus, tmp_path, train_fn=trainer)[2] and trainer.calls == 2
    damage(Path(meta["path"]) / name)
    path = Path(meta["path"]) / named
    with pytest.raises(CheckpointCorrupt, match=sentence) as info:
        load_model(meta["path"])
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    caplog.clear()
    retrained, _, trained = get_or_train(cfg, corpus, tmp_path, train_fn=trainer)
    assert trained and trainer.calls == 3 and same_weights(first, retrained)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= 30]
    assert len(warnings) == 1 and sentence in warnings[0] and str(path) in warnings[0], warnings
    assert "\n" not in warnings[0]
    # healed: loads without training; nothing else in the cache was touched
    assert not get_or_train(cfg, corpus, tmp_path, train_fn=trainer)[2] and trainer.calls == 3
    assert {p: p.stat().st_mtime_ns for p in Path(other_meta["path"]).iterdir()} == other_files
    assert not get_or_train(other, corpus, tmp_path, train_fn=trainer)[2]


def test_a_done_marker_edited_into_other_valid_json_is_still_refused(tmp_path, corpus, corpus_dir):
    """Control for the test above: a DONE that is valid JSON but disagrees with model.pt is an
    edit, not disk damage: refused in one sentence ("... is inconsistent ..."), never retrained
    behind the user's back (tests/bench/train/test_cache.py::test_edited_done_marker_is_refused)."""
    trainer = CountingTrainer()
    cfg = make_cfg(corpus_dir)
    _, meta, _ = get_or_train(cfg, corpus, tmp_path, train_fn=trainer)
    done = Path(meta["path"]) / "DONE"
    record = json.loads(done.read_text())
    record["weights_config"]["seed"] = 7
    done.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="is inconsistent") as info:
        get_or_train(cfg, corpus, tmp_path, train_fn=trainer)
    assert "\n" not in str(info.value) and trainer.calls == 1


@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_a_truncated_resume_state_is_dropped_and_training_restarts(
    tmp_path, corpus, corpus_dir, damage
):
    """Fault: resume.pt cut short (half its bytes, or none). Expected: one warning sentence
    "resume state <path> cannot be read (...); training from scratch.", the rerun trains from
    update 0 to the weights of an uninterrupted run, and no state is left. Control: the intact
    state of the same interrupted run is resumed from (update 4)."""
    cfg = make_cfg(corpus_dir, steps=8, warmup_steps=2, eval_batches=0, save_every=2)
    reference, _, _ = get_or_train(cfg, corpus, tmp_path / "a", progress=False)
    key = weights_key(cfg, corpus)

    def interrupted(root: Path) -> Path:
        original = ResumeFile.save

        def save(self, state):
            original(self, state)
            if state["step"] == 4:
                raise Killed(4)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ResumeFile, "save", save)
            with pytest.raises(Killed):
                get_or_train(cfg, corpus, root, progress=False)
        return root / key / "resume.pt"

    intact = interrupted(tmp_path / "control")
    _, meta, _ = get_or_train(cfg, corpus, tmp_path / "control", progress=False)
    assert meta["train_stats"]["resumed_from"] == 4  # control: an intact state is used

    path = interrupted(tmp_path / "b")
    assert intact.name == path.name
    path.write_bytes(b"" if damage == "empty" else path.read_bytes()[: path.stat().st_size // 2])
    with pytest.warns(UserWarning, match="cannot be read") as caught:
        model, meta, trained = get_or_train(cfg, corpus, tmp_path / "b", progress=False)
    (warning,) = [str(w.message) for w in caught if "cannot be read" in str(w.message)]
    assert str(path) in warning and warning.endswith("training from scratch.")
    assert "\n" not in warning
    assert trained and meta["train_stats"]["resumed_from"] == 0
    assert same_weights(model, reference) and not path.exists()


# --------------------------------------------------------------------------- a full disk


class _FullFile:
    """A file object on a disk that fills after ``room`` bytes: the write that passes it writes
    what fits and raises OSError(ENOSPC), as write(2) does."""

    def __init__(self, handle, room: int) -> None:
        self.handle, self.room = handle, room

    def write(self, data) -> int:
        data = bytes(data)
        if len(data) > self.room:
            self.handle.write(data[: self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.handle.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.handle.close()

    def __getattr__(self, name: str):
        return getattr(self.handle, name)


def fill_disk_on(patch: pytest.MonkeyPatch, name: str, nth: int = 1, room: int = 64) -> dict:
    """The ``nth`` temp file written for a cache file called ``name`` (``bench.train.resume.
    atomic_write``: model.pt, DONE, resume.pt) runs out of space after ``room`` bytes; the
    returned dict records the temp files that were written."""
    real = os.fdopen
    seen: dict = {"tmp": []}

    def fdopen(fd, *args, **kwargs):
        handle = real(fd, *args, **kwargs)
        target = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if not target.name.startswith(f".tmp-{name}."):
            return handle
        seen["tmp"].append(target)
        return _FullFile(handle, room) if len(seen["tmp"]) == nth else handle

    patch.setattr(os, "fdopen", fdopen)
    return seen


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd (Linux)")
@pytest.mark.parametrize(
    "name, nth, resumed_from",
    [("model.pt", 1, 6), ("DONE", 1, 6), ("resume.pt", 2, 2)],
    ids=["model.pt", "DONE", "resume.pt"],
)
def test_a_disk_that_fills_while_a_cache_file_is_written(
    tmp_path, monkeypatch, capsys, name, nth, resumed_from
):
    """Fault: the disk fills while model.pt, DONE or (mid-training) resume.pt is written.
    Expected: exit 1 with one sentence "lenbench: error: cannot write '<that file>': No space left
    on device (errno 28); check ... that the disk has space.", no temp file, no DONE and no rows
    left as if complete, the last resumable state kept (nothing finished lost), and the rerun
    resumes from it and finishes. Before: torch.save turned ENOSPC into "RuntimeError: [enforce
    fail at inline_container.cc] unexpected pos ..." (a traceback naming neither file nor cause).
    """
    monkeypatch.chdir(tmp_path)
    args = [*SMOKE, f"paths.cache={tmp_path / 'cache'}"]
    with monkeypatch.context() as patch:
        seen = fill_disk_on(patch, name, nth)
        assert main(args) == 1
    lines = error_lines(capsys.readouterr().err)
    (directory,) = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    assert len(lines) == 1 and NO_SPACE in lines[0] and "Traceback" not in lines[0], lines
    assert f"cannot write '{directory / name}'" in lines[0]
    assert len(seen["tmp"]) == nth and not seen["tmp"][-1].exists()  # the half-written temp file
    assert not leftovers(tmp_path / "cache") and not (directory / "DONE").exists()
    assert not list((tmp_path / "results").rglob("*.parquet"))
    assert (directory / "resume.pt").exists()  # the updates before the fault are kept
    trainings = Trainings(monkeypatch)
    assert main(args) == 0, capsys.readouterr().err  # the rerun heals it
    assert trainings.calls == [("none", resumed_from)]
    assert sorted(p.name for p in directory.iterdir()) == ["DONE", "model.pt"]
    load_model(directory)
    assert len(list((tmp_path / "results" / "smoke").glob("*.parquet"))) == 1


def test_a_disk_that_fills_while_the_results_are_written(tmp_path, monkeypatch, capsys):
    """Fault: the disk fills while the job's result parquet is written (half of it reaches the
    disk). Expected: exit 1 with one sentence "lenbench: error: cannot write '<result file>': No
    space left on device (errno 28); ...", no *.parquet and no temp file left, the trained
    checkpoint kept; the rerun trains nothing and writes the rows. Control: the rerun's file
    reads and verifies. Before: the sentence was "[Errno 28] No space left on device." without
    the file's name."""
    import pyarrow.parquet as pq

    real = pq.write_table

    def full(table, where, *args, **kwargs):
        real(table, where, *args, **kwargs)
        Path(where).write_bytes(Path(where).read_bytes()[:100])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.chdir(tmp_path)
    args = [*SMOKE, f"paths.cache={tmp_path / 'cache'}"]
    with monkeypatch.context() as patch:
        patch.setattr(pq, "write_table", full)
        assert main(args) == 1
    lines = error_lines(capsys.readouterr().err)
    results = tmp_path / "results" / "smoke"
    assert len(lines) == 1 and NO_SPACE in lines[0] and "Traceback" not in lines[0], lines
    assert f"cannot write '{results}/" in lines[0] and ".parquet'" in lines[0]
    assert not list(results.glob("*.parquet")) and not leftovers(tmp_path / "results")
    assert len(list((tmp_path / "cache").glob("*/DONE"))) == 1  # the trained model is kept
    trainings = Trainings(monkeypatch)
    assert main(args) == 0, capsys.readouterr().err
    assert trainings.calls == []  # nothing trained again
    (path,) = results.glob("*.parquet")
    assert path.name in lines[0] and len(load_results(path)) > 0


# --------------------------------------------------------------------------- kill -9

KILLED_JOB = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path

    phase, marker, *args = sys.argv[1:]

    def hang():
        Path(marker).write_text(phase)
        time.sleep(300)

    if phase in ("train", "finetune"):
        from bench.train.resume import ResumeFile

        original_save = ResumeFile.save

        def save(self, state):
            original_save(self, state)
            if state["step"] == 4 and ('"parent_key"' in self.config) == (phase == "finetune"):
                hang()

        ResumeFile.save = save
    elif phase == "evaluate":
        import dataclasses

        from bench.eval.metrics.registry import METRICS

        original_nll = METRICS["nll"].fn
        calls = []

        def nll_rows(*a, **k):
            calls.append(1)
            if len(calls) == 2:  # the second eval length: mid-evaluation
                hang()
            return original_nll(*a, **k)

        METRICS["nll"] = dataclasses.replace(METRICS["nll"], fn=nll_rows)
    elif phase == "write":
        import pyarrow.parquet as pq

        original_write = pq.write_table

        def write_table(table, where, *a, **k):
            original_write(table, where, *a, **k)
            Path(where).write_bytes(Path(where).read_bytes()[:100])  # half on disk
            hang()

        pq.write_table = write_table

    from bench.cli import main

    sys.exit(main(args))
    """
)


def kill_minus_9(tmp_path: Path, phase: str, args: list[str]) -> None:
    """Run ``lenbench <args>`` in a subprocess until it reaches ``phase``, then SIGKILL it."""
    script, marker = tmp_path / "killed_job.py", tmp_path / f"reached-{phase}"
    script.write_text(KILLED_JOB)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(script), phase, str(marker), *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the job ended before {phase}: {proc.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, f"the job did not reach {phase} in time"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL (POSIX)")
@pytest.mark.parametrize(
    "phase, extend, cached, rerun_trains",
    [
        ("train", False, 0, [("none", 4)]),
        ("finetune", True, 1, [("pi", 4)]),
        ("evaluate", False, 1, []),
        ("write", False, 1, []),
    ],
    ids=["train", "finetune", "evaluate", "write"],
)
def test_kill_9_then_a_rerun_heals(
    tmp_path, monkeypatch, capsys, phase, extend, cached, rerun_trains
):
    """Fault: ``kill -9`` of a ``lenbench`` job mid-training (after its state of update 4 of 8),
    mid-fine-tune (a PI fine-tune, after its state of update 4 of 6; the base model is finished),
    mid-evaluation (during the second eval length) and in the middle of the result write (half
    the temp file on disk). Expected: no sentence (the process is gone), but nothing is left as
    if complete: no DONE for the unfinished checkpoint, no *.parquet; every finished checkpoint
    stays; the rerun exits 0, trains only what was unfinished, from its last state ("resuming
    ... from update 4"), and writes the rows once."""
    monkeypatch.chdir(tmp_path)
    args = [*SMOKE, f"paths.cache={tmp_path / 'cache'}"]
    if extend:
        args += ["extend=pi", "extend.steps=6", "extend.warmup_steps=1"]
    kill_minus_9(tmp_path, phase, args)
    cache = tmp_path / "cache"
    done = sorted(cache.glob("*/DONE"))
    assert len(done) == cached  # finished checkpoints stay; the unfinished one has no DONE
    stamps = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    assert not list(tmp_path.rglob("*.parquet"))  # no rows as if complete
    if phase in ("train", "finetune"):
        assert len(list(cache.glob("*/resume.pt"))) == 1
    half = list((tmp_path / "results").rglob(".*.parquet.*.tmp"))
    assert len(half) == (phase == "write")  # a killed writer's temp file is never a result
    trainings = Trainings(monkeypatch)
    assert main(args) == 0, capsys.readouterr().err
    assert trainings.calls == rerun_trains  # only the unfinished work, from its last state
    for path in done:  # nothing finished was redone or touched
        assert path.stat().st_mtime_ns == stamps[path]
        assert (path.parent / "model.pt").stat().st_mtime_ns == stamps[path.parent / "model.pt"]
    assert not list(cache.glob("*/resume.pt")) and len(list(cache.glob("*/DONE"))) == 1 + extend
    (path,) = (tmp_path / "results" / "smoke").glob("*.parquet")
    rows = load_results(tmp_path / "results", dedup=False)
    assert len(rows) > 0 and len(rows) == len(load_results(path))  # the rows, once
    assert set(rows["run_id"]) == {path.stem}


# --------------------------------------------------------------------------- two sweeps, one cache


def _sweep(tmp_path: Path, name: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    args = [
        "+experiment=smoke",
        f"paths.results={tmp_path / 'results'}",
        f"paths.cache={tmp_path / 'cache'}",
        f"hydra.sweep.dir={tmp_path / name}",
        "hydra.callbacks.report.enabled=false",
    ]
    code = "import sys; from bench.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_sweeps_on_one_cache_train_each_model_once(tmp_path):
    """Fault: two ``lenbench -m +experiment=smoke`` sweeps started together on one cache and one
    results folder. Expected: both exit 0; each checkpoint is trained by exactly one of them (the
    other waits on its lock and loads it); each job's rows are in one file, once (no duplicate
    rows, no temp files), equal to what either sweep reports; no DONE-less checkpoint."""
    procs = [_sweep(tmp_path, "sweep_a"), _sweep(tmp_path, "sweep_b")]
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, (out + err)[-3000:]
    statuses = [json.loads(p.read_text()) for p in tmp_path.glob(f"sweep_*/*/{STATUS_FILE}")]
    assert len(statuses) == 8
    ran = [s for s in statuses if s["status"] in ("done", "cached")]
    trained: dict[str, int] = {}
    for s in ran:
        trained[s["model_id"]] = trained.get(s["model_id"], 0) + int(bool(s.get("trained")))
    assert sorted(trained.values()) == [1, 1], statuses  # rope and alibi: once each
    cache = tmp_path / "cache"
    assert len(list(cache.glob("*/DONE"))) == 2 and not list(cache.glob("*/resume.pt"))
    assert not leftovers(cache) and not leftovers(tmp_path / "results")
    results = tmp_path / "results" / "smoke"
    files = sorted(results.glob("*.parquet"))
    assert len(files) == 3 == len({s["run_id"] for s in ran})
    everything = load_results(results, dedup=False)
    assert len(everything) == len(load_results(results))  # no duplicate rows
    assert sorted(everything["run_id"].unique()) == sorted({s["run_id"] for s in ran})
    assert all(len(pd.read_parquet(f)) > 0 for f in files)
