"""Fine-tuning at the target length (``extend``): keys, the fine-tune itself, kill-and-resume of a
fine-tune, and a sweep killed during a fine-tune. Tiny models on a small text corpus, CPU, seconds.
"""

from __future__ import annotations

import json
import shutil
import sysconfig
from contextlib import nullcontext
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bench.data.corpora import Corpus, load_corpus
from bench.schema import ExtendConfig, JobConfig, ScalingSchema
from bench.train.batches import validation_batches
from bench.train.cache import get_or_train, weights_config, weights_key
from bench.train.extend import base_job, finetune_columns, finetune_scaling
from bench.train.resume import ResumeFile
from bench.train.trainer import train_model
from models.scaling import default_inv_freq, rope_parameters
from models.transformer import ScalingConfig

from fixtures import ROOT
from fixtures.jobs import Killed, same_weights

pytestmark = pytest.mark.usefixtures("one_thread")

L = 32  # base training length; the fine-tunes run at 4x = 128


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real text with long-range structure: 40 modules of this Python's standard library."""
    root = tmp_path_factory.mktemp("stdlib")
    sources = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("[a-s]*.py"))
    sources = [p for p in sources if 8_000 < p.stat().st_size < 60_000][:40]
    for path in sources:
        shutil.copyfile(path, root / f"{path.stem}.txt")
    return root


@pytest.fixture(scope="module")
def corpus(corpus_dir: Path) -> Corpus:
    return load_corpus({"name": "text", "paths": [str(corpus_dir)]})


def raw_cfg(corpus_dir: Path | str = "docs", extend: dict | None = None, **train: object) -> dict:
    return {
        "model": {"n_layers": 1, "d_model": 32, "n_heads": 2},
        "position": {"kind": "rope"},
        "data": {"name": "text", "paths": [str(corpus_dir)]},
        "train": {
            "length": L,
            "steps": 300,
            "batch_size": 8,
            "warmup_steps": 10,
            "eval_batches": 0,
            **train,
        },
        "extend": extend or {"name": "none", "method": "none"},
        "seed": 0,
    }


def pi(**fields: object) -> dict:
    """extend=pi at 4x with a short recipe (conf/extend/pi.yaml's shape)."""
    return {"name": "pi", "method": "linear", "params": {"factor": "auto"}, "length": "4x",
            "steps": 80, "lr": 2e-3, "warmup_steps": 4, **fields}  # fmt: skip


def make_cfg(corpus_dir: Path | str = "docs", extend: dict | None = None, **train) -> JobConfig:
    return JobConfig.from_hydra(raw_cfg(corpus_dir, extend, **train))


# --------------------------------------------------------------------------- config and keys


def test_extend_none_leaves_the_key_as_it_was() -> None:
    job = make_cfg()
    assert not job.extend.active and "extend" not in weights_config(job)
    no_group = raw_cfg()
    del no_group["extend"]  # the schema default is "none" too
    assert weights_key(JobConfig.from_hydra(no_group)) == weights_key(job)
    # negative control: an active extend is another checkpoint
    assert weights_key(make_cfg(extend=pi())) != weights_key(job)


def test_finetune_key_is_parent_key_plus_extend_fields() -> None:
    job = make_cfg(extend=pi())
    config = weights_config(job, "fp")
    assert set(config) == {"code_salt", "parent_key", "parent", "extend"}
    assert config["parent"] == weights_config(base_job(job), "fp")
    assert config["parent_key"] == weights_key(base_job(job), "fp")
    assert config["extend"]["length"] == 4 * L
    assert config["extend"]["scaling"] == {
        "method": "linear",
        "params": {"factor": 4},
        "logn": False,
    }
    assert "name" not in config["extend"]


# A changed value for every extend field but the label (each must change the key).
FINETUNE_CHANGES = {
    "method": {"method": "yarn", "params": {"factor": "auto"}},
    "params": {"params": {"factor": 2.0}},
    "length": {"length": "2x"},
    "steps": {"steps": 81},
    "lr": {"lr": 1e-3},
    "min_lr_ratio": {"min_lr_ratio": 0.5},
    "warmup_steps": {"warmup_steps": 5},
    "decay_steps": {"decay_steps": 10},
    "batch_size": {"batch_size": 4},
    "passkey_fraction": {"passkey_fraction": 0.5},
}


def test_every_finetune_field_is_covered_by_the_key_test() -> None:
    names = {f.name for f in fields(ExtendConfig)}
    # label and curve: not in the key (tested below); base_factor: tested below
    assert names - set(FINETUNE_CHANGES) == {"name", "base_factor", "curve"}


@pytest.mark.parametrize("field", sorted(FINETUNE_CHANGES))
def test_key_changes_with_every_finetune_field(field: str) -> None:
    extend = pi(**FINETUNE_CHANGES[field])
    cfg = raw_cfg(extend=extend, length=256) if field == "passkey_fraction" else None
    base = raw_cfg(extend=pi(), length=256) if cfg else raw_cfg(extend=pi())
    cfg = cfg or raw_cfg(extend=extend)
    assert weights_key(JobConfig.from_hydra(cfg)) != weights_key(JobConfig.from_hydra(base))


def test_key_changes_with_the_base_factor_and_the_parent() -> None:
    abf = {"name": "abf", "method": "ntk", "params": {}, "base_factor": 50.0}
    key = weights_key(make_cfg(extend=pi(**abf)))
    assert weights_key(make_cfg(extend=pi(**{**abf, "base_factor": 100.0}))) != key
    # the base factor is an alpha of static NTK: the same alpha spelled out is the same model
    r = 32 // 2  # head_dim = d_model / n_heads, fully rotary
    alpha = {"name": "abf", "method": "ntk", "params": {"alpha": 50.0 ** ((r - 2) / r)}}
    assert weights_key(make_cfg(extend=pi(**alpha))) == key
    assert weights_key(make_cfg(extend=pi(), steps=301)) != weights_key(make_cfg(extend=pi()))


def test_key_ignores_eval_only_fields_and_the_label() -> None:
    job = make_cfg(extend=pi())
    key = weights_key(job)
    same = replace(
        job,
        scaling=ScalingSchema(name="yarn", method="yarn", params={"factor": 4}),
        eval={"lengths": [32, 256]},
        experiment_name="other",
        train=replace(job.train, eval_every=3, log_every=2, save_every=5, save_every_minutes=1.0),
        extend=replace(job.extend, name="my-pi"),
    )
    assert weights_key(same) == key
    tokens = make_cfg(extend=pi(length=4 * L, params={"factor": 4}))  # "4x" and auto, spelled out
    assert weights_key(tokens) == key


def test_abf_multiplies_the_rope_base_exactly() -> None:
    job = make_cfg(extend=pi(name="abf", method="ntk", params={}, base_factor=50.0))
    scaling = finetune_scaling(job)
    inv_freq, factor = rope_parameters(
        "ntk", head_dim=16, base=10000.0, original_length=L, seq_len=4 * L, **scaling.params
    )
    expected = default_inv_freq(16, 10000.0 * 50.0).float()  # ABF: plain RoPE with base 5e5
    assert torch.allclose(inv_freq, expected, rtol=1e-6) and factor == 1.0
    # control: NTK with alpha = 50 is another (larger) base change
    other, _ = rope_parameters(
        "ntk", head_dim=16, base=1e4, original_length=L, seq_len=4 * L, alpha=50.0
    )
    assert not torch.allclose(other, expected, rtol=1e-3)


def test_extend_config_errors_are_one_sentence() -> None:
    with pytest.raises(
        ValueError, match=r"extend.method must be one of none, default, .* got 'pii'"
    ):
        make_cfg(extend=pi(method="pii"))
    with pytest.raises(ValueError, match=r"extend.length must be an integer >= 32, got 16"):
        make_cfg(extend=pi(length=16))
    with pytest.raises(
        ValueError, match=r"extend.base_factor multiplies the RoPE base through method ntk"
    ):
        make_cfg(extend=pi(base_factor=10.0))
    with pytest.raises(ValueError, match=r"extend.steps must be an integer >= 0, got -1"):
        make_cfg(extend=pi(steps=-1))


def test_result_columns_of_a_finetune() -> None:
    assert finetune_columns(make_cfg(), None) == dict.fromkeys(
        ["finetune_method", "finetune_length", "finetune_steps", "parent_model_id"]
    )
    assert finetune_columns(make_cfg(extend=pi()), "ab" * 8) == {
        "finetune_method": "pi",
        "finetune_length": 4 * L,
        "finetune_steps": 80,
        "parent_model_id": "ab" * 8,
    }


# --------------------------------------------------------------------------- the fine-tune


class Counter:
    """train_fn that records which jobs really train (base or fine-tune) and their resume points."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def __call__(self, job, corpus, **kwargs):
        model, stats = train_model(job, corpus, **kwargs)
        self.calls.append((job.extend.name, stats.resumed_from or 0))
        return model, stats


def window_nll(model: torch.nn.Module, windows: torch.Tensor, scaling=None) -> float:
    """Mean next-token NLL of fixed windows [N, 4L+1], with ``scaling`` set for the pass."""
    with torch.no_grad(), model.scaled(scaling, windows.shape[1] - 1) if scaling else nullcontext():
        logits = model(windows[:, :-1]).logits
    return float(F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()))


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def test_pi_finetune_at_4x_lowers_nll_at_4x_vs_pi_zero_shot(
    corpus: Corpus, corpus_dir: Path, cache_root: Path
) -> None:
    """Base: 300 updates at L=32. PI fine-tune: 80 updates at 128. NLL at 128 on the same fixed
    test windows: fine-tuned (with its factor-4 PI) < PI zero-shot on the parent by > 0.1 nats.
    Control: a 0-step fine-tune is the parent with PI, so its NLL equals the zero-shot one."""
    counter = Counter()
    job = make_cfg(corpus_dir, extend=pi())
    tuned, meta, trained = get_or_train(job, corpus, cache_root, counter, progress=False)
    assert trained and counter.calls == [
        ("none", 0),
        ("pi", 0),
    ]  # the parent first, then the fine-tune
    parent, parent_meta, parent_trained = get_or_train(base_job(job), corpus, cache_root, counter)
    assert not parent_trained and meta["weights_config"]["parent_key"] == parent_meta["key"]
    assert meta["train_stats"]["steps"] == 80 and tuned.train_length == L
    assert tuned.scaling.method == "linear" and tuned.scaling.params == {"factor": 4.0}

    windows = torch.cat(validation_batches(corpus.split("test"), 4 * L, 2, 8))  # [16, 129]
    zero_shot = ScalingConfig(name="linear", method="linear", params={"factor": 4.0})
    nll_zero_shot = window_nll(parent, windows, zero_shot)
    nll_tuned = window_nll(tuned, windows)
    assert nll_tuned < nll_zero_shot - 0.1, (nll_tuned, nll_zero_shot)

    # a reload from the cache brings the scaling back with the weights
    loaded, loaded_meta, again = get_or_train(job, corpus, cache_root, counter)
    assert not again and loaded_meta["scaling"]["params"] == {"factor": 4.0}
    assert window_nll(loaded, windows) == nll_tuned

    none, _, _ = get_or_train(make_cfg(corpus_dir, extend=pi(steps=0)), corpus, cache_root, counter)
    assert same_weights(none, parent) and window_nll(none, windows) == nll_zero_shot
    assert counter.calls[-1] == ("pi", 0) and len(counter.calls) == 3  # the parent was reused


def kill_during(monkeypatch: pytest.MonkeyPatch, key: str, at_step: int) -> None:
    """Die right after the resumable state of update ``at_step`` of checkpoint ``key`` is written."""
    original = ResumeFile.save

    def save(self: ResumeFile, state: dict) -> None:
        original(self, state)
        if self.key == key and state["step"] == at_step:
            raise Killed(at_step)

    monkeypatch.setattr(ResumeFile, "save", save)


def test_killed_finetune_resumes_to_identical_weights_without_retraining_the_parent(
    corpus: Corpus, corpus_dir: Path, cache_root: Path, tmp_path: Path
) -> None:
    job = make_cfg(corpus_dir, extend=pi(steps=12), save_every=4)
    reference, _, _ = get_or_train(job, corpus, cache_root, Counter(), progress=False)
    root = tmp_path / "cache"
    shutil.copytree(
        cache_root / weights_key(base_job(job), corpus), root / weights_key(base_job(job), corpus)
    )
    counter = Counter()
    key = weights_key(job, corpus)
    with pytest.MonkeyPatch.context() as patch:
        kill_during(patch, key, 8)
        with pytest.raises(Killed):
            get_or_train(job, corpus, root, counter, progress=False)
    assert counter.calls == [] and (root / key / "resume.pt").exists()  # died inside the fine-tune
    resumed, meta, trained = get_or_train(job, corpus, root, counter, progress=False)
    assert trained and counter.calls == [("pi", 8)]  # no parent training; the fine-tune from 8
    assert same_weights(resumed, reference)
    assert not (root / key / "resume.pt").exists()


def test_finetune_of_a_family_the_method_does_not_fit_is_refused() -> None:
    job = JobConfig.from_hydra(
        {**raw_cfg(extend=pi(name="yarn", method="yarn")), "position": {"kind": "alibi"}}
    )
    with pytest.raises(ValueError, match="does not apply to position family 'alibi'"):
        finetune_scaling(job)
    assert json.loads(json.dumps(finetune_columns(job, None)))["finetune_method"] == "yarn"


def test_finetune_columns_are_typed_optional_and_part_of_the_cell() -> None:
    from bench.core.results import dedup_results
    from bench.core.rows import FINETUNE_COLUMNS, REQUIRED_COLUMNS, normalize_results

    base = {c: "x" for c in REQUIRED_COLUMNS}
    base.update(train_length=32, eval_length=128, n=10, seed=0, value=2.0)
    base.update(position_params="{}", scaling_params="{}", metric="nll")
    tuned = {**base, **finetune_columns(make_cfg(extend=pi()), "ab" * 8)}
    df = normalize_results([base, tuned])
    assert list(df.columns[-5:-1]) == FINETUNE_COLUMNS
    assert (
        str(df["finetune_length"].dtype) == "Int64" and str(df["finetune_steps"].dtype) == "Int64"
    )
    assert df["finetune_method"].tolist() == [None, "pi"] and df["finetune_length"].iloc[1] == 4 * L
    assert df["parent_model_id"].isna().iloc[0] and df["finetune_steps"].isna().iloc[0]
    other_steps = {**tuned, "finetune_steps": 81}
    assert len(dedup_results(normalize_results([base, tuned, other_steps]))) == 3
    assert len(dedup_results(normalize_results([base, tuned, dict(tuned)]))) == 2  # control
    with pytest.raises(ValueError, match="column 'finetune_steps' must hold integers"):
        normalize_results([{**tuned, "finetune_steps": "many"}])


def test_report_labels_finetuned_series_next_to_zero_shot_ones() -> None:
    import pandas as pd

    from bench.report.frame import add_labels

    def rows(scaling: str, params: str, **finetune: object) -> dict:
        cols = {"finetune_method": None, "finetune_length": None, "finetune_steps": None}
        return {"experiment": "e", "position": "rope", "position_params": "{}", "scaling": scaling,
                "scaling_params": params, "train_length": 256, **cols, **finetune}  # fmt: skip

    linear4 = '{"method":"linear","params":{"factor":4}}'
    frame = pd.DataFrame(
        [
            rows("none", "{}"),
            rows("linear", '{"method":"linear","params":{"factor":8}}'),
            rows("pi", linear4, finetune_method="pi", finetune_length=1024, finetune_steps=200),
            rows("yarn", "{}", finetune_method="yarn", finetune_length=512, finetune_steps=200),
        ]
    )
    labels = add_labels(frame)["series"].tolist()
    assert labels == [
        "rope / none",
        "rope / linear (zero-shot)",
        "rope / pi ft@4x",
        "rope / yarn ft@2x",
    ]
    more = pd.concat([frame, frame.iloc[[2]].assign(finetune_steps=400)], ignore_index=True)
    assert add_labels(more)["series"].tolist()[2:] == [
        "rope / pi ft@4x, 200 steps",
        "rope / yarn ft@2x",
        "rope / pi ft@4x, 400 steps",
    ]
    # control: without fine-tuned rows the labels are today's
    plain = add_labels(frame.iloc[:2])["series"].tolist()
    assert plain == ["rope / none", "rope / linear"]


@pytest.mark.parametrize("option", ["pi", "yarn", "ntk", "abf", "longrope", "direct"])
def test_every_shipped_extend_option_fine_tunes_and_reloads(
    option: str, corpus: Corpus, corpus_dir: Path, tmp_path: Path
) -> None:
    """conf/extend/<option>.yaml, 2 updates on an untrained 1-layer model, through the cache."""
    import yaml

    extend = yaml.safe_load((ROOT / "conf/extend" / f"{option}.yaml").read_text())
    job = make_cfg(
        corpus_dir, extend={**extend, "steps": 2, "warmup_steps": 1}, steps=2, warmup_steps=1
    )
    model, meta, trained = get_or_train(job, corpus, tmp_path, progress=False)
    loaded, meta2, again = get_or_train(job, corpus, tmp_path, progress=False)
    assert trained and not again and meta2["scaling"] == meta["scaling"]
    assert loaded.scaling == model.scaling == finetune_scaling(job)
    x = torch.randint(0, 256, (1, 4 * L))
    assert torch.equal(model(x).logits, loaded(x).logits)
    parent, _, _ = get_or_train(base_job(job), corpus, tmp_path, progress=False)
    assert not same_weights(model, parent)  # it trained


# --------------------------------------------------------------------------- sweeps


def test_sweep_killed_during_a_finetune_retrains_only_it_from_its_last_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lenbench -m position=rope scaling=none extend=none,pi`` on the smoke preset (base: 8
    updates at 64, PI fine-tune: 6 at 256, states every 2). Killed after the fine-tune's state of
    update 4; the rerun reuses the finished cell and the base checkpoint and trains only the
    fine-tune, from update 4. Rows and report record the fine-tune."""
    import pandas as pd
    from hydra.core.global_hydra import GlobalHydra

    import bench.train.cache as cache_module
    from bench.cli import STATUS_FILE, main
    from bench.core.results import load_results

    calls: list[tuple[str, int]] = []
    kill = {"armed": True, "in_finetune": False}
    original_get, original_save = cache_module.get_or_train, ResumeFile.save

    def train_fn(job, corpus, **kwargs):
        kill["in_finetune"] = job.extend.active
        model, stats = train_model(job, corpus, **kwargs)
        calls.append((job.extend.name, stats.resumed_from))
        return model, stats

    def counting_get_or_train(job, corpus, cache_root=None, **kwargs):
        return original_get(job, corpus, cache_root, **{**kwargs, "train_fn": train_fn})

    def save(self: ResumeFile, state: dict) -> None:
        original_save(self, state)
        if kill["armed"] and kill["in_finetune"] and state["step"] == 4:
            raise Killed(4)

    monkeypatch.setattr(cache_module, "get_or_train", counting_get_or_train)
    monkeypatch.setattr(ResumeFile, "save", save)
    monkeypatch.chdir(tmp_path)
    args = [
        "+experiment=smoke",
        f"paths.results={tmp_path / 'results'}",
        f"paths.reports={tmp_path / 'reports'}",
        f"paths.cache={tmp_path / 'cache'}",
        "position=rope",
        "scaling=none",
        "extend=none,pi",
        "extend.steps=6",
        "extend.warmup_steps=1",
        "train.save_every=2",
    ]
    with pytest.raises(Killed):
        main([*args, f"hydra.sweep.dir={tmp_path / 'sweep0'}"])
    GlobalHydra.instance().clear()
    assert calls == [("none", 0)]  # the base trained; the fine-tune died at update 4
    assert len(list((tmp_path / "cache").glob("*/resume.pt"))) == 1

    kill["armed"] = False
    calls.clear()
    assert main([*args, f"hydra.sweep.dir={tmp_path / 'sweep1'}"]) == 0
    assert calls == [("pi", 4)]  # only the fine-tune, resumed from its last state
    assert not list((tmp_path / "cache").glob("*/resume.pt"))
    statuses = [json.loads(p.read_text()) for p in (tmp_path / "sweep1").glob(f"*/{STATUS_FILE}")]
    assert sorted(s["status"] for s in statuses) == ["cached", "done"]

    df = load_results(tmp_path / "results" / "smoke")
    base_id = df.loc[df["finetune_method"].isna(), "model_id"].unique().tolist()
    tuned = df[df["finetune_method"] == "pi"]
    assert len(base_id) == 1 and len(tuned) > 0 and base_id[0] not in set(tuned["model_id"])
    assert set(tuned["parent_model_id"]) == set(base_id)
    assert set(tuned["finetune_length"]) == {256} and set(tuned["finetune_steps"]) == {6}
    assert set(tuned["train_length"]) == {64}  # lengths stay relative to the base training
    assert json.loads(tuned["scaling_params"].iloc[0])["params"] == {"factor": 4}
    assert pd.Series(df["scaling"]).isin(["none", "pi"]).all()
    report = (tmp_path / "reports" / "smoke" / "report.md").read_text()
    assert "pi ft@4x" in report


def test_a_finetuned_model_is_evaluated_with_its_own_scaling_only() -> None:
    from bench.job import NotApplicable, validate_job

    job = make_cfg(extend=pi())
    spec = validate_job(job)
    assert spec.scaling == finetune_scaling(job) and spec.scaling.label == "pi"
    assert spec.eval.train_length == L  # eval lengths stay multiples of the base training length
    yarn = ScalingSchema(name="yarn", method="yarn", params={"factor": "auto"})
    with pytest.raises(NotApplicable, match="only scaling=none applies"):
        validate_job(replace(job, scaling=yarn))
    with pytest.raises(NotApplicable, match="only scaling=none applies"):
        validate_job(replace(job, scaling=ScalingSchema(name="logn", logn=True)))
    alibi = JobConfig.from_hydra({**raw_cfg(extend=pi()), "position": {"kind": "alibi"}})
    with pytest.raises(
        NotApplicable, match="extend pi .method linear. does not apply to position alibi"
    ):
        validate_job(alibi)
    # control: the same eval-time scaling on the model that was not fine-tuned runs zero-shot
    assert validate_job(replace(make_cfg(), scaling=yarn)).scaling.params["factor"] > 1


def test_train_model_needs_the_parent_of_a_finetune(corpus: Corpus, corpus_dir: Path) -> None:
    with pytest.raises(
        ValueError, match="fine-tunes a trained model; pass its parent model as init="
    ):
        train_model(make_cfg(corpus_dir, extend=pi()), corpus, progress=False)


def test_harness_evaluates_a_finetuned_checkpoint_with_its_trained_scaling(
    corpus: Corpus, corpus_dir: Path, tmp_path: Path
) -> None:
    from bench.harness import LenbenchLM
    from bench.train.cache import weights_key

    job = make_cfg(corpus_dir, extend=pi(steps=2, warmup_steps=1), steps=2, warmup_steps=1)
    get_or_train(job, corpus, tmp_path, progress=False)
    key = weights_key(job, corpus)
    lm = LenbenchLM(pretrained=key, cache_root=str(tmp_path), device="cpu")
    assert lm.scaling == finetune_scaling(job) and lm.model.scaling == finetune_scaling(job)
    # control: asking for another scaling on a fine-tuned checkpoint is one clear error
    with pytest.raises(ValueError, match="was fine-tuned with scaling"):
        LenbenchLM(pretrained=key, cache_root=str(tmp_path), device="cpu", scaling="yarn")


# --------------------------------------------------------------------------- recovery curves


def curve_cfg(corpus_dir: Path, **fields: object) -> JobConfig:
    extend = pi(steps=6, warmup_steps=2, min_lr_ratio=1.0, curve=[0, 2, 4], **fields)
    return make_cfg(corpus_dir, extend=extend, steps=20)


def test_a_curve_point_is_the_finetune_of_that_many_updates(
    corpus: Corpus, corpus_dir: Path, tmp_path: Path
) -> None:
    """One 6-update run with curve [0, 2, 4] stores the states after 2 and 4 updates under the
    keys of the 2- and 4-update fine-tunes; a separate 4-update run in another cache gives
    bit-identical weights (the learning rate does not depend on steps), and reading the curve
    trains nothing more."""
    from bench.train.cache import curve_job

    job = curve_cfg(corpus_dir)
    counter = Counter()
    final, _, _ = get_or_train(job, corpus, tmp_path / "a", counter, progress=False)
    assert [name for name, _ in counter.calls] == ["none", "pi"]  # parent, one fine-tune run
    for k in (2, 4):
        assert (tmp_path / "a" / weights_key(curve_job(job, k), corpus) / "DONE").exists()
    stored, _, trained = get_or_train(curve_job(job, 4), corpus, tmp_path / "a", counter)
    assert not trained and len(counter.calls) == 2
    separate, _, _ = get_or_train(curve_job(job, 4), corpus, tmp_path / "b", progress=False)
    assert same_weights(stored, separate)
    assert not same_weights(stored, final)  # control: 4 and 6 updates differ


def test_a_curve_needs_a_learning_rate_that_does_not_depend_on_steps() -> None:
    """With a decay to 0.1 lr, update 3 of a 6-update run has another lr than update 3 of a
    4-update run (so a saved state would not be the 4-update fine-tune): refused."""
    from bench.train.extend import finetune_recipe
    from bench.train.optim import lr_at

    def lr(steps: int, ratio: float) -> float:
        job = make_cfg(extend=pi(steps=steps, warmup_steps=2, min_lr_ratio=ratio))
        return lr_at(3, finetune_recipe(job))

    assert lr(6, 1.0) == lr(4, 1.0)
    assert lr(6, 0.1) != lr(4, 0.1)
    with pytest.raises(ValueError, match="min_lr_ratio 1.0") as info:
        make_cfg(extend=pi(steps=6, curve=[2]))
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="below extend.steps = 6"):
        make_cfg(extend=pi(steps=6, min_lr_ratio=1.0, curve=[6]))


def test_the_curve_is_not_part_of_the_key() -> None:
    a = make_cfg(extend=pi(steps=6, min_lr_ratio=1.0))
    b = make_cfg(extend=pi(steps=6, min_lr_ratio=1.0, curve=[0, 2, 4]))
    assert weights_key(a) == weights_key(b)
