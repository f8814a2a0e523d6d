"""Checkpoint cache: key stability/sensitivity, reuse, locking across processes, kill-and-retrain,
resumable training states (kill-and-resume to identical weights), tamper detection, and
load_model references."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import bench.core.rows
import bench.train.cache as cache
import bench.train.checkpoints as checkpoints
from bench.data.corpora import Corpus, load_corpus
from bench.schema import JobConfig, PositionSchema, ScalingSchema
from bench.tasks.passkey import PASSKEY_TEMPLATES
from bench.train.cache import CODE_SALT, get_or_train, weights_config, weights_key
from bench.train.checkpoints import (
    CheckpointError,
    file_sha256,
    key_of,
    load_model,
    save_checkpoint,
)
from bench.train.resume import ResumeFile
from bench.train.stats import TrainStats
from bench.train.trainer import make_model

from fixtures import ROOT
from fixtures.jobs import (
    CountingTrainer,
    Killed,
    make_cfg,
    raw_cfg,
    same_weights,
)

pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- keys


def test_key_is_stable_across_order_spelling_defaults_and_omegaconf() -> None:
    from omegaconf import OmegaConf

    raw = raw_cfg()
    key = weights_key(make_cfg())
    assert len(key) == 16 and int(key, 16) >= 0
    reordered = {
        k: dict(reversed(list(v.items()))) if isinstance(v, dict) else v for k, v in raw.items()
    }
    reordered = dict(reversed(list(reordered.items())))
    assert list(reordered) != list(raw) and weights_key(JobConfig.from_hydra(reordered)) == key
    spelled = raw_cfg()
    spelled["position"]["base"] = 10000.0  # a float key given as an int or a float
    spelled["model"]["vocab_size"] = 259  # a default, spelled out
    spelled["train"]["min_lr_ratio"] = 0.1  # default ratio = default min_lr
    assert weights_key(JobConfig.from_hydra(spelled)) == key
    assert weights_key(JobConfig.from_hydra(OmegaConf.create(raw))) == key
    assert 3e-3 * 0.1 != 3e-4  # float noise ...
    assert weights_key(make_cfg(min_lr=3e-4)) == key  # ... but lr * ratio and the literal agree
    # an integer key spelled as a float is a type error, as on the command line
    with pytest.raises(ValueError, match=r"train.length must be an integer, got 16.0"):
        make_cfg(length=16.0)


def test_key_ignores_eval_time_settings() -> None:
    job = make_cfg()
    key = weights_key(job)
    eval_time = replace(
        job,
        scaling=ScalingSchema(name="yarn", method="yarn", params={"factor": 4}),
        eval={"lengths": [16, 32]},
        experiment_name="x",
        device="cpu",
        paths=replace(job.paths, results="/tmp/x"),
        train=replace(job.train, eval_every=7, eval_batches=9, log_every=3, compile=True),
    )
    assert weights_key(eval_time) == key
    # the learned table's out_of_range policy is read at evaluation only (another family's
    # field is refused before it could reach a key: tests/bench/core/test_checks.py)
    learned = replace(job, position=PositionSchema(kind="learned"))
    clamp = replace(learned, position=replace(learned.position, out_of_range="clamp"))
    assert weights_key(clamp) == weights_key(learned)


def test_weights_fields_are_declared_on_the_schema() -> None:
    from bench.core.sections import position_weights
    from bench.schema import TrainConfig, weight_fields
    from models.positions import families

    # every key held these while the section was one flat dataclass (keys of cached models hold)
    legacy = {"kind", "base", "layout", "rotary_fraction", "max_positions"}
    for kind, family in families().items():  # each family's own fields, but out_of_range
        keyed = legacy | (set(family.fields) - {"out_of_range"})
        assert set(position_weights(PositionSchema(kind=kind))) == keyed, kind
    assert set(position_weights(PositionSchema(kind="t5"))) == legacy | {
        "num_buckets",
        "max_distance",
    }
    # control: the learned table's eval-time policy is its field but not in its key
    assert "out_of_range" in families()["learned"].fields
    assert set(position_weights(PositionSchema(kind="learned"))) == legacy
    train = {f.name for f in dataclasses.fields(TrainConfig)} - set(weight_fields(TrainConfig))
    assert train == {
        "min_lr_ratio",
        "eval_every",
        "eval_batches",
        "log_every",
        "save_every",
        "save_every_minutes",
        "compile",  # same math, another kernel schedule
    }
    # a data kind keys on its own settings only (no hf or pycorpus keys for a text corpus)
    data = {"name", "split_fractions", "max_files", "max_bytes", "paths", "suffixes", "root"}
    assert set(weights_config(make_cfg())["data"]) == data


def test_irope_keys_carry_qk_norm() -> None:
    """Llama 4's QK-norm joined irope (issue 50): irope's key holds position.qk_norm, so an irope
    checkpoint cached before (no such entry, no norm) is not reused, and norm on and off are two
    keys. Control: rope, which does not read the field, keys without it (its key is as before)."""
    cfg = make_cfg()
    irope = replace(cfg, position=PositionSchema(kind="irope"))
    config = weights_config(irope)
    assert config["position"]["qk_norm"] is True
    before = {**config, "position": {k: v for k, v in config["position"].items() if k != "qk_norm"}}
    assert key_of(before) != weights_key(irope)
    off = replace(cfg, position=PositionSchema(kind="irope", qk_norm=False))
    assert weights_key(off) != weights_key(irope)
    assert "qk_norm" not in weights_config(cfg)["position"]


def test_checkpoint_keys_and_result_params_share_one_canonical_json() -> None:
    assert checkpoints.canonical_json is bench.core.rows.canonical_json


@pytest.mark.parametrize(
    ("section", "field", "value"),
    [
        ("train", "steps", 4),
        ("train", "lr", 1e-3),
        ("train", "precision", "bf16"),
        ("train", "passkey_fraction", 0.25),
        ("model", "d_model", 32),
        ("position", "kind", "alibi"),
        ("position", "base", 500000),
        ("data", "max_files", 5),
    ],
)
def test_key_changes_with_what_changes_the_weights(section: str, field: str, value: object) -> None:
    raw = raw_cfg(length=256)  # long enough for passkey rows (checked with the config)
    changed = json.loads(json.dumps(raw))
    changed[section][field] = value
    if (section, field) == ("position", "kind"):
        changed["position"] = {"kind": value}  # another family: its own fields only
    assert weights_key(JobConfig.from_hydra(changed)) != weights_key(JobConfig.from_hydra(raw))


def test_key_changes_with_the_passkey_template_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """Editing a template's text retrains the models trained on it, and only those."""
    raw = raw_cfg(length=256)
    raw["train"].update(passkey_fraction=0.5, passkey_template="short")
    passkey_model, plain_model = JobConfig.from_hydra(raw), make_cfg()
    before = weights_key(passkey_model), weights_key(plain_model)
    edited = replace(PASSKEY_TEMPLATES["short"], needle="pass key: {key}.")
    monkeypatch.setitem(PASSKEY_TEMPLATES, "short", edited)
    assert weights_key(passkey_model) != before[0]
    assert weights_key(plain_model) == before[1]  # control: no passkey rows, no template in the key
    # passkey_length changes the key where there are passkey rows, and only there
    raw["train"]["passkey_length"] = "uniform"
    assert weights_key(JobConfig.from_hydra(raw)) != weights_key(passkey_model)
    plain = raw_cfg(length=256)
    uniform = json.loads(json.dumps(plain))
    uniform["train"]["passkey_length"] = "uniform"
    assert weights_key(JobConfig.from_hydra(uniform)) == weights_key(JobConfig.from_hydra(plain))


def test_key_changes_with_the_ruler_task_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """Editing a RULER-style task's text retrains the models trained on the tasks, and only
    those (the compact text of issue #50 item 4 must not reuse the old text's weights)."""
    from bench.tasks.ruler import ruler_task

    raw = raw_cfg(length=256)
    raw["train"].update(passkey_fraction=0.5, ruler_tasks=["niah_single", "vt"])
    ruler_model, plain_model = JobConfig.from_hydra(raw), make_cfg()
    before = weights_key(ruler_model), weights_key(plain_model)
    monkeypatch.setitem(ruler_task("niah_single").text, "needle", "value of {key}:{value}.")
    assert weights_key(ruler_model) != before[0]
    assert weights_key(plain_model) == before[1]  # control: no task rows, no task text in the key


def test_key_changes_with_seed_corpus_and_salt(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_cfg()
    assert weights_key(replace(cfg, seed=1)) != weights_key(cfg)
    assert weights_key(cfg, "aaaa") != weights_key(cfg, "bbbb") != weights_key(cfg)
    config = weights_config(cfg, "aaaa")
    assert config["corpus_fingerprint"] == "aaaa" and config["code_salt"] == CODE_SALT
    assert set(config) == {
        "code_salt",
        "model",
        "position",
        "data",
        "train",
        "seed",
        "corpus_fingerprint",
    }
    before = weights_key(cfg)
    monkeypatch.setattr(cache, "CODE_SALT", CODE_SALT + "-bumped")
    assert weights_key(cfg) != before


def test_a_family_revision_changes_only_that_familys_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Family.weights_revision (models.positions) enters the key when > 0: KERPLE's and FIRE's
    initialisation and learning changed (issue 50), so their cached checkpoints are retrained;
    every other family's key (xPos: centring changes no logit) is as before. Negative control:
    with the revision back at 0 the key is the old one (no revision entry)."""
    from models.positions import family

    cfg = make_cfg()
    for kind in ("rope", "t5", "xpos", "kerple_log", "kerple_power", "fire"):
        job = replace(cfg, position=PositionSchema(kind=kind))
        revised = kind in ("kerple_log", "kerple_power", "fire")
        config = weights_config(job)
        assert config.get("position_revision") == (1 if revised else None), kind
        key = weights_key(job)
        with monkeypatch.context() as patch:
            patch.setattr(type(family(kind)), "weights_revision", 0)
            assert "position_revision" not in weights_config(job)
            assert (weights_key(job) != key) == revised, kind


def test_ssmax_on_a_hybrid_family_changes_only_its_keys() -> None:
    """Issue 76 item 2: SSMax's n on a windowed or chunked layer is now its span's keys, so
    rnope_swa and irope with model.attn_scale=ssmax get new keys; the same families without SSMax
    and RoPE with SSMax (every layer full: n unchanged) keep theirs (no entry)."""
    cfg = make_cfg()
    for kind in ("rnope_swa", "irope", "rope"):
        for attn_scale in ("ssmax", "none"):
            job = replace(
                cfg,
                position=PositionSchema(kind=kind),
                model=replace(cfg.model, attn_scale=attn_scale),
            )
            marked = kind != "rope" and attn_scale == "ssmax"
            assert weights_config(job).get("ssmax_keys") == ("attended" if marked else None)


# --------------------------------------------------------------------------- get_or_train


def test_second_call_loads_without_training(
    tmp_path: Path, corpus: Corpus, corpus_dir: Path
) -> None:
    trainer = CountingTrainer()
    cfg = make_cfg(corpus_dir)
    first, meta, trained = get_or_train(cfg, corpus, tmp_path, train_fn=trainer, progress=False)
    assert trained and trainer.calls == 1
    assert meta["key"] == weights_key(cfg, corpus) and (tmp_path / meta["key"] / "DONE").exists()
    eval_only = replace(cfg, scaling=ScalingSchema(name="linear"), eval={"lengths": [32]})
    second, meta2, trained2 = get_or_train(eval_only, corpus, tmp_path, train_fn=trainer)
    assert not trained2 and trainer.calls == 1
    assert same_weights(first, second) and meta2["key"] == meta["key"]
    assert meta2["train_stats"] == meta["train_stats"] == {"steps": 3, "val_losses": {"3": 1.5}}
    assert meta2["weights_config"] == weights_config(cfg, corpus)
    # Negative control: a weight-changing setting trains again.
    _, meta3, trained3 = get_or_train(
        make_cfg(corpus_dir, steps=4), corpus, tmp_path, train_fn=trainer
    )
    assert trained3 and trainer.calls == 2 and meta3["key"] != meta["key"]


def test_train_stats_are_stored_as_their_dict(
    tmp_path: Path, corpus: Corpus, corpus_dir: Path
) -> None:
    """A train_fn's TrainStats go to the checkpoint as ``as_dict()`` through JSON (int update keys
    become strings), in field order, and load back equal."""
    stats = TrainStats(
        steps=3,
        tokens=96,
        tokens_per_s=32.0,
        train_time_s=3.0,
        wall_time_s=4.0,
        final_train_loss=4.5,
        train_losses={3: 4.5},
        val_losses={3: 4.75},
        final_val_loss=4.75,
        n_params=10,
        precision="fp32",
        device="cpu",
        num_processes=1,
        resumed_from=0,
    )

    def train_fn(job, corpus, **kwargs):
        torch.manual_seed(job.seed)
        return make_model(job), stats

    cfg = make_cfg(corpus_dir)
    _, meta, trained = get_or_train(cfg, corpus, tmp_path, train_fn=train_fn)
    _, loaded, trained_again = get_or_train(cfg, corpus, tmp_path, train_fn=train_fn)
    expected = json.loads(json.dumps(stats.as_dict()))
    assert trained and not trained_again
    assert meta["train_stats"] == loaded["train_stats"] == expected
    assert list(loaded["train_stats"]) == list(expected) and expected["train_losses"] == {"3": 4.5}


def test_real_training_round_trips_through_the_cache(
    tmp_path: Path, corpus: Corpus, corpus_dir: Path
) -> None:
    cfg = make_cfg(corpus_dir, steps=2, eval_batches=0)
    cfg = replace(cfg, position=PositionSchema(kind="learned", out_of_range="error"))
    model, meta, trained = get_or_train(cfg, corpus, tmp_path, progress=False)
    assert trained and meta["train_stats"]["steps"] == 2
    cfg = replace(cfg, position=PositionSchema(kind="learned", out_of_range="clamp"))  # eval-time
    loaded, meta2, trained2 = get_or_train(cfg, corpus, tmp_path, progress=False)
    assert not trained2 and same_weights(model, loaded)
    assert loaded.position_cfg.out_of_range == "clamp" and not loaded.training
    x = torch.randint(0, 256, (1, 16))
    assert torch.equal(model(x).logits, loaded(x).logits)


def test_load_model_by_key_dir_file_and_env(
    tmp_path: Path, corpus: Corpus, corpus_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, meta, _ = get_or_train(
        make_cfg(corpus_dir), corpus, tmp_path, train_fn=CountingTrainer()
    )
    key = meta["key"]
    for ref in (key, tmp_path / key, str(tmp_path / key / "model.pt")):
        loaded, got = load_model(ref, cache_root=tmp_path)
        assert same_weights(model, loaded) and got["key"] == key and got["train_length"] == 16
    monkeypatch.setenv("LENBENCH_CACHE", str(tmp_path))
    assert load_model(key)[1]["key"] == key
    with pytest.raises(CheckpointError, match="0123456789abcdef.*was not found"):
        load_model("0123456789abcdef", cache_root=tmp_path / "elsewhere")


def test_save_checkpoint_refuses_wrong_key_or_architecture(tmp_path: Path) -> None:
    cfg = make_cfg()
    config = weights_config(cfg, "fp")
    model = make_model(cfg)
    with pytest.raises(CheckpointError, match="is not the key"):
        save_checkpoint(model, "0" * 16, config, tmp_path)
    other = make_model(make_cfg(length=8))
    with pytest.raises(CheckpointError, match="does not match its weights config"):
        save_checkpoint(other, key_of(config), config, tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written
    path = save_checkpoint(model, key_of(config), config, tmp_path)
    assert sorted(p.name for p in path.iterdir()) == ["DONE", "model.pt"]  # no temp files left


# --------------------------------------------------------------------------- tampering


def _stored(tmp_path: Path, corpus: Corpus, corpus_dir: Path) -> Path:
    _, meta, _ = get_or_train(make_cfg(corpus_dir), corpus, tmp_path, train_fn=CountingTrainer())
    return Path(meta["path"])


def test_edited_done_marker_is_refused(tmp_path: Path, corpus: Corpus, corpus_dir: Path) -> None:
    directory = _stored(tmp_path, corpus, corpus_dir)
    done = json.loads((directory / "DONE").read_text())
    done["weights_config"]["train"]["steps"] = 999
    (directory / "DONE").write_text(json.dumps(done))
    trainer = CountingTrainer()
    with pytest.raises(CheckpointError, match=f"checkpoint {directory} is inconsistent"):
        get_or_train(make_cfg(corpus_dir), corpus, tmp_path, train_fn=trainer)
    assert trainer.calls == 0  # refused, not silently retrained


def test_edited_model_weights_config_is_refused(
    tmp_path: Path, corpus: Corpus, corpus_dir: Path
) -> None:
    directory = _stored(tmp_path, corpus, corpus_dir)
    load_model(directory)  # negative control: the untouched checkpoint loads
    payload = torch.load(directory / "model.pt", weights_only=True)
    payload["weights_config"]["train"]["steps"] = 999
    torch.save(payload, directory / "model.pt")
    # a deliberate edit that also updates the recorded digest (else the digest refuses it first)
    done = json.loads((directory / "DONE").read_text())
    (directory / "DONE").write_text(
        json.dumps({**done, "sha256": file_sha256(directory / "model.pt")})
    )
    with pytest.raises(
        CheckpointError, match=r"model\.pt is inconsistent: its stored weights config hashes to"
    ):
        load_model(directory)
    # Consistently re-keyed (key and DONE edited too): still not what this config asks for.
    payload["key"] = key_of(payload["weights_config"])
    torch.save(payload, directory / "model.pt")
    (directory / "DONE").write_text(
        json.dumps({"key": payload["key"], "weights_config": payload["weights_config"]})
    )
    with pytest.raises(CheckpointError, match="inconsistent"):
        get_or_train(make_cfg(corpus_dir), corpus, tmp_path, train_fn=CountingTrainer())


def test_request_mismatch_is_refused(tmp_path: Path, corpus: Corpus, corpus_dir: Path) -> None:
    directory = _stored(tmp_path, corpus, corpus_dir)
    other = weights_config(make_cfg(corpus_dir, steps=5), corpus)
    with pytest.raises(CheckpointError, match="does not hold the requested weights config"):
        load_model(directory, expected_config=other)


# --------------------------------------------------------------------------- processes

WORKER = textwrap.dedent(
    """
    import os, sys, time, hashlib
    import torch
    torch.set_num_threads(1)
    from bench.train.cache import get_or_train
    from bench.data.corpora import load_corpus
    from bench.schema import JobConfig
    from bench.train.trainer import make_model

    cache_root, corpus_dir, markers, seed, mode = sys.argv[1:6]
    seed = int(seed)

    def train_fn(job, corpus, **kwargs):
        open(os.path.join(markers, f"train-{os.getpid()}"), "w").close()
        if mode == "hang":
            time.sleep(120)
        time.sleep(1.5)  # long enough that a concurrent caller surely finds the lock held
        torch.manual_seed(job.seed)
        return make_model(job), {"steps": 3}

    cfg = JobConfig.from_hydra({
        "model": {"n_layers": 1, "d_model": 16, "n_heads": 2},
        "position": {"kind": "rope", "base": 10000},
        "data": {"name": "text", "paths": [corpus_dir]},
        "train": {"length": 16, "steps": 3, "batch_size": 2, "warmup_steps": 2},
        "seed": seed,
    })
    corpus = load_corpus(cfg.data)
    open(os.path.join(markers, f"ready-{os.getpid()}"), "w").close()
    while not os.path.exists(os.path.join(markers, "go")):
        time.sleep(0.02)
    model, meta, trained = get_or_train(cfg, corpus, cache_root, train_fn=train_fn, progress=False)
    digest = hashlib.sha256(b"".join(
        t.numpy().tobytes() for _, t in sorted(model.state_dict().items()))).hexdigest()
    print(meta["key"], digest, int(trained))
    """
)


def _start(tmp_path: Path, corpus_dir: Path, seed: int, mode: str = "normal") -> subprocess.Popen:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    args = [str(tmp_path / "cache"), str(corpus_dir), str(tmp_path / "markers"), str(seed), mode]
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(markers: Path, prefix: str, count: int, procs: list, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while len(list(markers.glob(f"{prefix}*"))) < count:
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"worker exited early: {proc.communicate()[1][-2000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {count} {prefix} markers"
        time.sleep(0.05)


def _run_pair(tmp_path: Path, corpus_dir: Path, seeds: tuple[int, int]) -> list[list[str]]:
    (tmp_path / "markers").mkdir()
    procs = [_start(tmp_path, corpus_dir, seed) for seed in seeds]
    _wait_for(tmp_path / "markers", "ready-", 2, procs)
    (tmp_path / "markers" / "go").touch()  # release both at once
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        outputs.append(out.split())
    return outputs


def test_two_processes_same_key_train_once(tmp_path: Path, corpus_dir: Path) -> None:
    (a_key, a_hash, a_trained), (b_key, b_hash, b_trained) = _run_pair(tmp_path, corpus_dir, (0, 0))
    assert len(list((tmp_path / "markers").glob("train-*"))) == 1  # exactly one trained
    assert a_key == b_key and a_hash == b_hash and sorted([a_trained, b_trained]) == ["0", "1"]


def test_two_processes_different_keys_both_train(tmp_path: Path, corpus_dir: Path) -> None:
    # Negative control for the test above: the markers do count concurrent trainings.
    (a_key, a_hash, a_trained), (b_key, b_hash, b_trained) = _run_pair(tmp_path, corpus_dir, (0, 1))
    assert len(list((tmp_path / "markers").glob("train-*"))) == 2
    assert a_key != b_key and a_hash != b_hash and a_trained == b_trained == "1"


def test_killed_training_leaves_nothing_and_rerun_trains_once(
    tmp_path: Path, corpus_dir: Path
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    (markers / "go").touch()
    proc = _start(tmp_path, corpus_dir, 0, mode="hang")
    _wait_for(markers, "train-", 1, [proc])
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    corpus = load_corpus({"name": "text", "paths": [str(corpus_dir)]})
    cfg = make_cfg(corpus_dir)
    key = weights_key(cfg, corpus)
    directory = tmp_path / "cache" / key
    assert not (directory / "DONE").exists() and not (directory / "model.pt").exists()
    # What a writer killed between its writes could leave: a temp file and a DONE-less model.pt.
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ".tmp-model.pt.abc123").write_bytes(b"partial")
    (directory / "model.pt").write_bytes(b"not a checkpoint")
    trainer = CountingTrainer()
    _, meta, trained = get_or_train(cfg, corpus, tmp_path / "cache", train_fn=trainer)
    assert (
        trained and trainer.calls == 1 and meta["key"] == key
    )  # the dead lock holder blocks nothing
    assert sorted(p.name for p in directory.iterdir()) == ["DONE", "model.pt"]
    _, _, trained_again = get_or_train(cfg, corpus, tmp_path / "cache", train_fn=trainer)
    assert not trained_again and trainer.calls == 1  # a finished checkpoint is not retrained


def test_incomplete_checkpoint_is_reported_by_load_model(tmp_path: Path) -> None:
    directory = tmp_path / ("a" * 16)
    directory.mkdir()
    (directory / "model.pt").write_bytes(b"half")
    with pytest.raises(CheckpointError, match=f"checkpoint {directory} is incomplete"):
        load_model("a" * 16, cache_root=tmp_path)
    # a directory that never was a checkpoint is not "interrupted"
    other = tmp_path / "notes"
    other.mkdir()
    with pytest.raises(CheckpointError, match=f"{other} is not a lenbench checkpoint"):
        load_model(str(other))


# --------------------------------------------------------------------------- resumable training


def kill_after_save(monkeypatch: pytest.MonkeyPatch, at_step: int) -> None:
    """Make the training die right after it wrote the resumable state of update ``at_step``."""
    original = ResumeFile.save

    def save(self: ResumeFile, state: dict) -> None:
        original(self, state)
        if state["step"] == at_step:
            raise Killed(at_step)

    monkeypatch.setattr(ResumeFile, "save", save)


@pytest.mark.parametrize(("save_every", "minutes"), [(2, 0.0), (0, 1e-9)])
def test_killed_training_resumes_to_identical_weights(
    tmp_path: Path,
    corpus: Corpus,
    corpus_dir: Path,
    save_every: int,
    minutes: float,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Kill after the state of update 4 of 8, rerun: the weights equal the uninterrupted run's,
    and only updates 5..8 ran again. States every 2 updates, or every update by the clock."""
    cfg = make_cfg(
        corpus_dir,
        steps=8,
        warmup_steps=2,
        eval_batches=0,
        log_every=1,
        save_every=save_every,
        save_every_minutes=minutes,
    )
    reference, ref_meta, _ = get_or_train(cfg, corpus, tmp_path / "a", progress=False)
    # saving states does not change the run: the same job without them
    quiet = replace(cfg, train=replace(cfg.train, save_every=0, save_every_minutes=0.0))
    plain, _, _ = get_or_train(quiet, corpus, tmp_path / "plain", progress=False)
    assert same_weights(reference, plain)

    with pytest.MonkeyPatch.context() as patch:
        kill_after_save(patch, 4)
        with pytest.raises(Killed):
            get_or_train(cfg, corpus, tmp_path / "b", progress=False)
    directory = tmp_path / "b" / ref_meta["key"]
    assert not (directory / "DONE").exists() and (directory / "resume.pt").exists()
    with caplog.at_level(logging.INFO, logger="lenbench"):
        resumed, meta, trained = get_or_train(cfg, corpus, tmp_path / "b", progress=False)
    assert trained and meta["train_stats"]["resumed_from"] == 4
    assert "resuming the training from update 4 of 8" in caplog.text  # the log says so
    assert ref_meta["train_stats"]["resumed_from"] == 0
    assert same_weights(resumed, reference)
    assert meta["train_stats"]["train_losses"] == ref_meta["train_stats"]["train_losses"]
    assert sorted(p.name for p in directory.iterdir()) == ["DONE", "model.pt"]  # state deleted


def test_resuming_from_a_perturbed_optimizer_state_changes_the_weights(
    tmp_path: Path, corpus: Corpus, corpus_dir: Path
) -> None:
    """Negative control for the test above: the resumed run does use the stored optimizer state."""
    cfg = make_cfg(corpus_dir, steps=8, warmup_steps=2, eval_batches=0, save_every=2)
    reference, meta, _ = get_or_train(cfg, corpus, tmp_path / "a", progress=False)
    with pytest.MonkeyPatch.context() as patch:
        kill_after_save(patch, 4)
        with pytest.raises(Killed):
            get_or_train(cfg, corpus, tmp_path / "b", progress=False)
    path = tmp_path / "b" / meta["key"] / "resume.pt"
    stored = ResumeFile(path, meta["key"], weights_config(cfg, corpus))
    state = stored.load()
    for moments in state["optimizer"]["state"].values():
        moments["exp_avg_sq"].mul_(4.0)
    stored.save(state)  # with its SHA-256: a state changed behind its back is dropped instead
    resumed, meta_b, _ = get_or_train(cfg, corpus, tmp_path / "b", progress=False)
    assert meta_b["train_stats"]["resumed_from"] == 4
    assert not same_weights(resumed, reference)


def test_resume_state_of_another_config_is_ignored(
    tmp_path: Path, corpus: Corpus, corpus_dir: Path
) -> None:
    cfg = make_cfg(corpus_dir, steps=6, eval_batches=0, save_every=2)
    key = weights_key(cfg, corpus)
    with pytest.MonkeyPatch.context() as patch:
        kill_after_save(patch, 2)
        with pytest.raises(Killed):
            get_or_train(cfg, corpus, tmp_path, progress=False)
    path = tmp_path / key / "resume.pt"
    assert ResumeFile(path, key, weights_config(cfg, corpus)).load()["step"] == 2
    other = weights_config(make_cfg(corpus_dir, steps=7), corpus)
    with pytest.warns(UserWarning, match="belongs to another weights config"):
        assert ResumeFile(path, key, other).load() is None
    path.write_bytes(b"torn")
    with pytest.warns(UserWarning, match="cannot be read"):
        _, meta, trained = get_or_train(cfg, corpus, tmp_path, progress=False)
    assert trained and meta["train_stats"]["resumed_from"] == 0  # started over


def test_done_checkpoint_is_final_whatever_resume_state_is_left(
    tmp_path: Path, corpus: Corpus, corpus_dir: Path
) -> None:
    trainer = CountingTrainer()
    cfg = make_cfg(corpus_dir)
    _, meta, _ = get_or_train(cfg, corpus, tmp_path, train_fn=trainer)
    (tmp_path / meta["key"] / "resume.pt").write_bytes(b"stale")  # killed before deleting it
    _, _, trained = get_or_train(cfg, corpus, tmp_path, train_fn=trainer)
    assert not trained and trainer.calls == 1
