"""Training loop: learning, determinism, divergence detection, schedule, optimizer groups, config."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import bench.core.runtime as runtime_mod
import bench.train.trainer as train_mod
from bench.data.corpora import Corpus, load_corpus
from bench.schema import (
    DataConfig,
    JobConfig,
    ModelSchema,
    PositionSchema,
    TrainConfig,
    weights_dict,
)
from bench.train.guards import TrainingDiverged
from bench.train.optim import lr_at, param_groups
from bench.train.trainer import make_model, train_model

from fixtures import ROOT

LENGTH = 32


def write_text_corpus(root: Path, n_files: int = 40) -> Path:
    """Small deterministic text files cut from a few stdlib modules (learnable, not random)."""
    import json as json_module
    import textwrap

    source = "".join(Path(m.__file__).read_text(encoding="utf-8") for m in (textwrap, json_module))
    root.mkdir(parents=True, exist_ok=True)
    chunk = 1200
    for i in range(n_files):
        start = (i * chunk) % max(1, len(source) - chunk)
        (root / f"doc{i:03d}.txt").write_text(source[start : start + chunk], encoding="utf-8")
    return root


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_text_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def corpus(corpus_root: Path) -> Corpus:
    data = load_corpus(DataConfig(name="text", paths=[str(corpus_root)]))
    assert data.stats()["validation_docs"] > 0 and data.stats()["train_docs"] > 10
    return data


def tiny_dict(**train: object) -> dict:
    """A job config as plain data (what Hydra composes), with a tiny model and short training
    (a warmup of 3 updates, fewer where the run has 3 or fewer: it must be below the steps)."""
    steps = train.get("steps", 30)
    warmup = min(3, steps - 1) if isinstance(steps, int) and steps >= 1 else 0
    return {
        "model": {"n_layers": 1, "d_model": 32, "n_heads": 2},
        "position": {"kind": "rope"},
        "data": {"name": "text", "paths": ["unused-in-train"]},
        "train": {
            "length": LENGTH,
            "steps": 30,
            "batch_size": 8,
            "lr": 1e-2,
            "warmup_steps": warmup,
            "eval_every": 15,
            "eval_batches": 2,
            "log_every": 1,
            **train,
        },
        "seed": 0,
    }


def tiny_cfg(**train: object) -> JobConfig:
    return JobConfig.from_hydra(tiny_dict(**train))


def state_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_loss_decreases_and_stats(corpus: Corpus) -> None:
    model, stats = train_model(tiny_cfg(), corpus, progress=False)
    losses = [stats.train_losses[s] for s in sorted(stats.train_losses)]
    assert len(losses) == 30 and all(math.isfinite(x) for x in losses)
    assert losses[0] == pytest.approx(math.log(259), abs=0.3)  # uniform over the vocabulary at init
    assert sum(losses[-5:]) / 5 < losses[0] - 1.0
    assert set(stats.val_losses) == {15, 30}
    assert stats.val_losses[30] < stats.val_losses[15] + 0.1
    assert stats.final_val_loss == stats.val_losses[30]
    assert stats.final_train_loss == pytest.approx(
        losses[-1]
    )  # log_every=1: last window = last step
    assert stats.steps == 30 and stats.tokens == 30 * 8 * LENGTH
    assert stats.tokens_per_s > 0 and stats.wall_time_s >= stats.train_time_s > 0
    assert stats.n_params == model.num_parameters()
    assert not model.training and model.train_length == LENGTH

    # Negative control: with lr = 0 nothing is learned, so the check above is not vacuous.
    _, frozen = train_model(tiny_cfg(lr=0.0, steps=6, eval_batches=0), corpus, progress=False)
    first, last = frozen.train_losses[1], frozen.train_losses[6]
    assert abs(last - first) < 0.2 and frozen.val_losses == {}


def test_train_stats_as_dict_is_the_stored_dict(corpus: Corpus) -> None:
    """as_dict() is what a checkpoint stores: these keys in this order; a zero-update fine-tune
    (resumed_from None: it runs no loop) stores no resumed_from."""
    _, stats = train_model(tiny_cfg(steps=2, eval_batches=0), corpus, progress=False)
    stored = stats.as_dict()
    assert list(stored) == [
        "steps",
        "tokens",
        "tokens_per_s",
        "train_time_s",
        "wall_time_s",
        "final_train_loss",
        "train_losses",
        "val_losses",
        "final_val_loss",
        "n_params",
        "precision",
        "device",
        "num_processes",
        "resumed_from",
    ]
    assert stored["resumed_from"] == 0 and set(stored["train_losses"]) == {1, 2}
    assert stored["final_val_loss"] is None and stored["device"] == "cpu"
    assert list(replace(stats, resumed_from=None).as_dict()) == list(stored)[:-1]


def test_same_seed_same_weights_other_seed_differs(corpus: Corpus) -> None:
    cfg = tiny_cfg(steps=5, eval_batches=0, passkey_fraction=0.0)
    a, stats_a = train_model(cfg, corpus, progress=False)
    b, stats_b = train_model(cfg, corpus, progress=False)
    sa, sb = state_of(a), state_of(b)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert stats_a.train_losses == stats_b.train_losses
    c, _ = train_model(replace(cfg, seed=1), corpus, progress=False)
    sc = state_of(c)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)  # negative control


def test_nan_loss_raises_training_diverged_naming_the_step(
    corpus: Corpus, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = train_mod.lm_loss
    calls = {"n": 0}

    def poisoned(logits, targets, mask):
        calls["n"] += 1
        loss = real(logits, targets, mask)
        return loss * float("nan") if calls["n"] == 4 else loss

    monkeypatch.setattr(train_mod, "lm_loss", poisoned)
    with pytest.raises(TrainingDiverged, match=r"step 4 of 10: the loss is nan") as info:
        train_model(tiny_cfg(steps=10, log_every=5, eval_batches=0), corpus, progress=False)
    assert isinstance(info.value, ValueError)  # the job runner catches ValueError subclasses
    assert info.value.step == 4 and math.isnan(info.value.loss)
    # the check runs at the log interval, yet names the first bad update, not step 5
    assert calls["n"] == 5


def test_huge_learning_rate_diverges_for_real(corpus: Corpus) -> None:
    cfg = tiny_cfg(lr=1e6, warmup_steps=0, grad_clip=0.0, steps=8, log_every=8, eval_batches=0)
    with pytest.raises(TrainingDiverged, match=r"training diverged at step \d+ of 8"):
        train_model(cfg, corpus, progress=False)


@pytest.mark.filterwarnings("ignore:.*runs emulated")
def test_bf16_autocast_trains_with_float32_weights(corpus: Corpus) -> None:
    model, stats = train_model(
        tiny_cfg(precision="bf16", steps=3, eval_batches=1), corpus, progress=False
    )
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert math.isfinite(stats.final_train_loss) and math.isfinite(stats.final_val_loss)
    assert stats.precision == "bf16"


@pytest.mark.parametrize(
    ("native", "precision", "warns"),
    [(False, "bf16", True), (True, "bf16", False), (None, "bf16", False), (False, "fp32", False)],
)
def test_emulated_bf16_on_cpu_warns_once(corpus, monkeypatch, native, precision, warns) -> None:
    import warnings

    monkeypatch.setattr(runtime_mod, "cpu_has_native_bf16", lambda: native)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_model(tiny_cfg(precision=precision, steps=1, eval_batches=0), corpus, progress=False)
    emulated = [w for w in caught if "runs emulated" in str(w.message)]
    assert len(emulated) == (1 if warns else 0)


def test_cpu_bf16_flags_are_read_from_cpuinfo(monkeypatch, tmp_path) -> None:
    real_read_text = Path.read_text

    def fake_cpuinfo(flags: str | None):
        text = "processor\t: 0\n" + (f"flags\t\t: {flags}\n" if flags is not None else "")
        monkeypatch.setattr(
            Path,
            "read_text",
            lambda self, *a, **k: (
                text if str(self) == "/proc/cpuinfo" else real_read_text(self, *a, **k)
            ),
        )

    fake_cpuinfo("fpu avx2 fma")
    assert runtime_mod.cpu_has_native_bf16() is False
    fake_cpuinfo("fpu avx512f avx512_bf16")
    assert runtime_mod.cpu_has_native_bf16() is True
    fake_cpuinfo("fpu amx_bf16 amx_tile")
    assert runtime_mod.cpu_has_native_bf16() is True
    fake_cpuinfo("fpu avx512_bf16x")  # a flag that merely starts with the name does not count
    assert runtime_mod.cpu_has_native_bf16() is False
    fake_cpuinfo(None)
    assert runtime_mod.cpu_has_native_bf16() is None


def test_passkey_rows_and_answer_loss_train(corpus: Corpus) -> None:
    cfg = tiny_cfg(
        length=256,
        batch_size=2,
        steps=2,
        passkey_fraction=0.5,
        passkey_loss="answer",
        eval_batches=0,
    )
    _, stats = train_model(cfg, corpus, progress=False)
    assert math.isfinite(stats.final_train_loss)


def test_lr_schedule_warmup_cosine_and_min_lr_forms() -> None:
    spec = TrainConfig(lr=1.0, min_lr_ratio=0.1, warmup_steps=4, steps=14)
    lrs = [lr_at(s, spec) for s in range(14)]
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lrs[4] == pytest.approx(1.0) and lrs[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:], strict=False))  # monotone decay
    assert lrs[9] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 5 / 9)))
    same = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=4, steps=14)
    assert weights_dict(same) == weights_dict(spec)  # one recipe, one checkpoint key
    assert [lr_at(s, same) for s in range(14)] == pytest.approx(lrs)
    assert lr_at(0, TrainConfig(lr=2.0, warmup_steps=0, steps=1)) == 2.0


def test_lr_schedule_warmup_stable_decay() -> None:
    spec = TrainConfig(lr=1.0, min_lr_ratio=0.1, warmup_steps=4, steps=14, decay_steps=4)
    lrs = [lr_at(s, spec) for s in range(14)]
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lrs[4:10] == pytest.approx([1.0] * 6)  # stable until the last 4 updates
    assert lrs[10:] == pytest.approx(
        [0.1 + 0.45 * (1 + math.cos(math.pi * k / 4)) for k in (1, 2, 3, 4)]
    )
    # decay_steps = steps - warmup - 1 is the cosine schedule itself (control)
    full = TrainConfig(lr=1.0, min_lr_ratio=0.1, warmup_steps=4, steps=14, decay_steps=9)
    cosine = TrainConfig(lr=1.0, min_lr_ratio=0.1, warmup_steps=4, steps=14)
    assert [lr_at(s, full) for s in range(14)] == pytest.approx(
        [lr_at(s, cosine) for s in range(14)]
    )
    assert weights_dict(spec) != weights_dict(cosine)  # a different recipe, another checkpoint
    with pytest.raises(ValueError, match=r"train.decay_steps must be at most .* got 10"):
        TrainConfig(warmup_steps=4, steps=14, decay_steps=10)


def test_weight_decay_only_on_projection_matrices() -> None:
    cfg = replace(tiny_cfg(), position=PositionSchema(kind="learned"))
    model = make_model(cfg)
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    kept = {names[id(p)] for p in no_decay["params"]}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert "tok_emb.weight" in kept and "pos_table" in kept  # the tied head is the embedding
    assert any("norm" in n for n in kept) and not any("norm" in n for n in decayed)
    assert decayed and all(n.endswith("proj.weight") or ".mlp." in n for n in decayed)
    assert len(decayed) + len(kept) == len(list(model.parameters()))


def test_untied_head_is_decayed() -> None:
    cfg = tiny_cfg()
    cfg = replace(cfg, model=replace(cfg.model, tie_embeddings=False))
    model = make_model(cfg)
    decay, _ = param_groups(model, 0.1)
    assert any(p is model.lm_head.weight for p in decay["params"])
    assert not any(p is model.tok_emb.weight for p in decay["params"])


def test_weight_decay_scope_all_decays_every_parameter_once() -> None:
    cfg = replace(tiny_cfg(), position=PositionSchema(kind="learned"))
    model = make_model(cfg)
    decay, no_decay = param_groups(model, 0.1, "all")
    assert not no_decay["params"]
    assert {id(p) for p in decay["params"]} == {id(p) for p in model.parameters()}
    assert len(decay["params"]) == len(list(model.parameters()))  # tied head counted once
    # negative control: the default scope leaves the embedding out
    matrices, _ = param_groups(model, 0.1)
    assert not any(p is model.tok_emb.weight for p in matrices["params"])
    with pytest.raises(ValueError, match="'embeddings'.*matrices, all"):
        param_groups(model, 0.1, "embeddings")


def test_weight_decay_scope_reaches_the_optimizer(corpus: Corpus, monkeypatch) -> None:
    """train_model must pass the configured scope on (a dropped key would silently use matrices)."""
    seen = []
    real = train_mod.param_groups

    def spy(model, weight_decay, scope="matrices"):
        seen.append(scope)
        return real(model, weight_decay, scope)

    monkeypatch.setattr(train_mod, "param_groups", spy)
    train_model(tiny_cfg(steps=1, eval_batches=0, weight_decay_scope="all"), corpus, progress=False)
    assert seen == ["all"]


@pytest.mark.parametrize(
    ("section", "patch", "message"),
    [
        (
            "train",
            {"precision": "fp16"},
            r"train.precision must be one of fp32, bf16, got 'fp16'",
        ),
        ("train", {"stepz": 3}, r"train.stepz is an unknown key; allowed keys: length, steps"),
        ("train", {"steps": 0}, r"train.steps must be an integer >= 1, got 0"),
        ("train", {"steps": "abc"}, r"train.steps must be an integer, got 'abc'"),
        ("train", {"steps": 10.0}, r"train.steps must be an integer, got 10.0"),
        ("train", {"betas": [0.9]}, r"train.betas must be two numbers in \[0, 1\)"),
        (
            "train",
            {"passkey_filler": "lorem"},
            r"train.passkey_filler must be one of standard, corpus, got 'lorem'",
        ),
        (
            "train",
            {"weight_decay_scope": "norms"},
            r"train.weight_decay_scope must be one of matrices, all, got 'norms'",
        ),
        ("train", {"name": "quick"}, r"train.name is an unknown key"),  # no ignored labels
        ("model", {"widht": 3}, r"model.widht is an unknown key; allowed keys: vocab_size"),
    ],
)
def test_bad_config_is_one_clear_value_error(section: str, patch: dict, message: str) -> None:
    cfg = tiny_dict()
    cfg[section] = {**cfg[section], **patch}
    with pytest.raises(ValueError, match=message):
        JobConfig.from_hydra(cfg)  # the one place a config is checked, before any training
    JobConfig.from_hydra(tiny_dict())  # negative control


def test_schema_defaults_and_min_lr() -> None:
    spec = TrainConfig()
    assert spec.steps == 300 and spec.final_lr == pytest.approx(spec.lr * spec.min_lr_ratio)
    assert "min_lr_ratio" not in weights_dict(spec)  # folded into min_lr
    assert weights_dict(spec)["min_lr"] == spec.final_lr
    assert TrainConfig(lr=1.0, min_lr_ratio=0.5).final_lr == 0.5
    assert TrainConfig(lr=1.0, min_lr=0.2, min_lr_ratio=0.5).final_lr == 0.2  # min_lr wins
    # a copy with another lr recomputes the final lr (nothing stale is stored)
    assert replace(TrainConfig(lr=1.0), lr=0.5).final_lr == pytest.approx(0.05)
    with pytest.raises(ValueError, match=r"train.min_lr must be a number in \[0, 1\], got 2"):
        TrainConfig(lr=1.0, min_lr=2)


def test_omegaconf_config_is_accepted(corpus: Corpus) -> None:
    from omegaconf import OmegaConf

    cfg = JobConfig.from_hydra(OmegaConf.create(tiny_dict(steps=2, eval_batches=0)))
    model, stats = train_model(cfg, corpus, progress=False)
    assert stats.steps == 2 and model.model_cfg.d_model == 32
    assert isinstance(cfg.model, ModelSchema)


DDP_JOB = """
import hashlib, json, os, sys
import torch
torch.set_num_threads(1)
from bench.train.cache import get_or_train
from bench.data.corpora import load_corpus
from bench.schema import JobConfig
job = JobConfig.from_hydra(json.loads(sys.argv[1]))
corpus = load_corpus(job.data)
model, meta, trained = get_or_train(job, corpus, sys.argv[2], progress=False)
digest = hashlib.sha256(b"".join(
    t.numpy().tobytes() for _, t in sorted(model.state_dict().items()))).hexdigest()
stats = meta["train_stats"]
with open(os.path.join(sys.argv[3], f"rank{os.environ.get('RANK', '0')}.json"), "w") as f:
    json.dump({"world": stats["num_processes"], "trained": trained, "digest": digest,
               "loss": stats["final_train_loss"], "val": stats["final_val_loss"]}, f)
"""


@pytest.mark.slow
def test_ddp_on_two_cpu_processes_matches_one_process(
    tmp_path: Path, corpus: Corpus, corpus_root: Path
) -> None:
    """torchrun x2 (gloo): both ranks train one global batch together; rank 0 writes the cache."""
    import json
    import os
    import subprocess
    import sys

    from bench.train.cache import weights_key

    raw = tiny_dict(steps=6, log_every=3, eval_every=3, eval_batches=2)
    raw["data"] = {"name": "text", "paths": [str(corpus_root)]}
    cfg = JobConfig.from_hydra(raw)
    script = tmp_path / "job.py"
    script.write_text(DDP_JOB)
    out = tmp_path / "out"
    out.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
    ]
    run = subprocess.run(
        [*command, str(script), json.dumps(raw), str(tmp_path / "cache"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2] and all(r["trained"] for r in ranks)
    assert ranks[0]["digest"] == ranks[1]["digest"]  # DDP kept the replicas identical
    assert list((tmp_path / "cache").glob("*/DONE")) == [
        tmp_path / "cache" / weights_key(cfg, corpus) / "DONE"
    ]
    # Same global batch and schedule as one process: the same losses up to reduction order.
    _, single = train_model(cfg, corpus, progress=False)
    assert single.num_processes == 1
    assert ranks[0]["loss"] == pytest.approx(single.final_train_loss, abs=1e-4)
    assert ranks[0]["val"] == pytest.approx(single.final_val_loss, abs=1e-4)
    assert ranks[0]["loss"] < math.log(259) - 0.5  # and it did learn (not vacuous)


def test_a_warmup_as_long_as_the_run_is_refused_before_anything_trains() -> None:
    """Issue 76 item 5: train.warmup_steps >= train.steps (and extend.warmup_steps >=
    extend.steps, the issue's extend.steps=8 with the fine-tunes' warmup 20) is refused in one
    sentence naming both values and what is allowed, not shortened: a warmup as long as the run
    never decays, a longer one never reaches the peak (lr_at: the last update's lr below lr).
    Controls: a warmup one update shorter than the run, and a fine-tune of 0 updates (the parent
    with the scaling, whatever its warmup), are accepted."""
    longer = TrainConfig(lr=1.0, warmup_steps=20, steps=8)  # the dataclass alone: what it would do
    assert lr_at(7, longer) == pytest.approx(8 / 20)  # the peak never reached
    with pytest.raises(ValueError) as refused:
        tiny_cfg(steps=8, warmup_steps=20)
    assert str(refused.value) == (
        "train.warmup_steps 20 is not below train.steps 8, so the learning rate would never reach "
        "its peak; allowed: train.warmup_steps at most 7 (or raise train.steps)."
    )
    with pytest.raises(ValueError, match=r"^train.warmup_steps 8 is not below train.steps 8, so "
                       r"the learning rate would never decay; allowed: train.warmup_steps at most "
                       r"7 \(or raise train.steps\)\.$"):  # fmt: skip
        tiny_cfg(steps=8, warmup_steps=8)
    extend = {"name": "pi", "method": "linear", "params": {"factor": "auto"}, "length": "2x"}
    with pytest.raises(ValueError) as refused:
        JobConfig.from_hydra({**tiny_dict(), "extend": {**extend, "steps": 8}})  # warmup 20
    assert str(refused.value) == (
        "extend.warmup_steps 20 is not below extend.steps 8, so the learning rate would never "
        "reach its peak; allowed: extend.warmup_steps at most 7 (or raise extend.steps)."
    )
    # controls
    assert tiny_cfg(steps=8, warmup_steps=7).train.warmup_steps == 7
    assert JobConfig.from_hydra({**tiny_dict(), "extend": {**extend, "steps": 0}}).extend.steps == 0
    tuned = JobConfig.from_hydra(
        {**tiny_dict(), "extend": {**extend, "steps": 8, "warmup_steps": 7}}
    )
    assert tuned.extend.warmup_steps == 7
