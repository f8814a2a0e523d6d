"""``train.until_retrieves``: training that ends ``decay_steps`` updates after the first retrieval
check at L that reaches the threshold (bench.train.trainer; the check in bench.train.guards). The
checks' verdicts are scripted here (a tiny model forms no circuit in a test's budget); what is
tested is what the trainer does with them: where the run ends, its schedule, the stored checks,
resuming, the examples it scores, the row column and the config's sentences."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import pytest

import bench.train.guards as guards_mod
from bench.data.corpora import Corpus, load_corpus
from bench.schema import DataConfig, JobConfig
from bench.tasks.passkey import passkey_grid
from bench.train.cache import get_or_train, weights_key
from bench.train.guards import CHECK_DEPTHS, CHECK_TRIALS, retrieval_check_examples
from bench.train.optim import lr_at
from bench.train.resume import ResumeFile
from bench.train.trainer import train_model

from fixtures.jobs import Killed, same_weights

pytestmark = pytest.mark.usefixtures("one_thread")

LENGTH = 80  # the short template needs 73 tokens
STEPS, DECAY, EVERY = 40, 5, 10


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Distinct documents (chunks of two stdlib modules), so every split has some."""
    import json as json_module
    import textwrap

    root = tmp_path_factory.mktemp("corpus")
    source = "".join(Path(m.__file__).read_text("utf-8") for m in (textwrap, json_module))
    for i in range(40):
        start = (i * 1200) % (len(source) - 1200)
        (root / f"doc{i:03d}.txt").write_text(source[start : start + 1200], "utf-8")
    return root


@pytest.fixture(scope="module")
def corpus(corpus_dir: Path) -> Corpus:
    return load_corpus(DataConfig(name="text", paths=[str(corpus_dir)]))


def raw(corpus_dir: Path | str = "docs", **train: object) -> dict:
    return {
        "model": {"n_layers": 1, "d_model": 16, "n_heads": 2},
        "position": {"kind": "rope"},
        "data": {"name": "text", "paths": [str(corpus_dir)]},
        "train": {
            "length": LENGTH,
            "steps": STEPS,
            "batch_size": 2,
            "warmup_steps": 3,
            "decay_steps": DECAY,
            "eval_batches": 0,
            "log_every": 1,
            "passkey_fraction": 0.5,
            "passkey_template": "short",
            "passkey_loss": "answer",
            "until_retrieves": 0.9,
            "retrieval_check_every": EVERY,
            **train,
        },
        "seed": 0,
    }


def job(corpus_dir: Path | str = "docs", **train: object) -> JobConfig:
    return JobConfig.from_hydra(raw(corpus_dir, **train))


def script_checks(monkeypatch: pytest.MonkeyPatch, accuracies: list[float]) -> list[int]:
    """Make the i-th retrieval check score accuracies[i] (the last one repeats); return the
    list of example counts the checks were given."""
    seen: list[int] = []

    def verdicts(model, examples, batch_size, device="cpu", **kwargs):
        acc = accuracies[min(len(seen), len(accuracies) - 1)]
        seen.append(len(examples))
        hits = round(acc * len(examples))
        return [True] * hits + [False] * (len(examples) - hits)

    monkeypatch.setattr(guards_mod, "passkey_verdicts", verdicts)
    return seen


def test_run_ends_decay_steps_after_the_first_passing_check(corpus, monkeypatch) -> None:
    """Checks at 10 (0.5) and 20 (78 of 80: Wilson lower end 0.913 >= 0.9): the run ends at 25,
    the lr decaying over 21..25, with the weights of a plain 25-update run whose decay is its
    last 5 updates."""
    seen = script_checks(monkeypatch, [0.5, 78 / 80])
    model, stats = train_model(job(), corpus, progress=False)
    assert stats.steps == 20 + DECAY and stats.tokens == 25 * 2 * LENGTH
    assert stats.retrieval_checks == {10: 0.5, 20: 78 / 80}
    assert seen == [CHECK_DEPTHS * CHECK_TRIALS] * 2
    assert stats.as_dict()["retrieval_checks"] == {10: 0.5, 20: 78 / 80}
    assert set(stats.train_losses) == set(range(1, 26))
    plain_job = job(until_retrieves=None, steps=25)
    plain, plain_stats = train_model(plain_job, corpus, progress=False)
    assert same_weights(model, plain) and plain_stats.retrieval_checks is None
    # the schedule the early end implies: full lr through update 20, min lr at update 25
    spec = plain_job.train
    assert lr_at(19, spec) == spec.lr and lr_at(24, spec) == pytest.approx(spec.final_lr)
    # negative control: without the check the 40-update run's weights differ
    full, full_stats = train_model(job(until_retrieves=None), corpus, progress=False)
    assert full_stats.steps == STEPS and not same_weights(model, full)


def test_no_decided_check_runs_every_update(corpus, monkeypatch, caplog) -> None:
    """Never decidedly >= 0.9 (76 of 80 = 0.95, but its Wilson lower end is 0.878): checks at 10,
    20, 30 (not in the final decay), all 40 updates, the same weights as without the check; each
    check that does not pass says so in the log."""
    script_checks(monkeypatch, [76 / 80])
    with caplog.at_level(logging.INFO, logger="lenbench"):
        model, stats = train_model(job(), corpus, progress=False)
    assert stats.steps == STEPS and stats.retrieval_checks == {10: 0.95, 20: 0.95, 30: 0.95}
    for done in (10, 20, 30):
        assert (
            f"passkey at L 76/80 (Wilson lower end 0.878 < train.until_retrieves 0.9) after {done}"
            f" updates: training on (at most {STEPS})." in caplog.text
        )
    assert "decaying the lr" not in caplog.text  # control: no check passed
    plain, _ = train_model(job(until_retrieves=None), corpus, progress=False)
    assert same_weights(model, plain)


def test_killed_run_resumes_to_the_same_early_end(tmp_path, corpus, corpus_dir, monkeypatch):
    """Killed after the state of update 22 (the end already brought forward to 25): the resumed
    run ends at 25 with the uninterrupted run's weights and checks."""
    script_checks(monkeypatch, [0.0, 1.0])
    cfg = job(corpus_dir, save_every=2, save_every_minutes=0.0)
    reference, ref_meta, _ = get_or_train(cfg, corpus, tmp_path / "a", progress=False)
    assert ref_meta["train_stats"]["steps"] == 25

    original = ResumeFile.save

    def save(self: ResumeFile, state: dict) -> None:
        original(self, state)
        if state["step"] == 22:
            assert state["end"] == 25 and state["retrieval_checks"] == {10: 0.0, 20: 1.0}
            raise Killed(22)

    script_checks(monkeypatch, [0.0, 1.0])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ResumeFile, "save", save)
        with pytest.raises(Killed):
            get_or_train(cfg, corpus, tmp_path / "b", progress=False)
    script_checks(monkeypatch, [0.0])  # a resumed run past its checks must not check again
    resumed, meta, trained = get_or_train(cfg, corpus, tmp_path / "b", progress=False)
    stats = meta["train_stats"]
    assert trained and stats["resumed_from"] == 22 and stats["steps"] == 25
    assert stats["retrieval_checks"] == ref_meta["train_stats"]["retrieval_checks"]
    assert same_weights(resumed, reference)


def test_check_examples_are_not_the_evaluation_examples(corpus) -> None:
    spec = job().train
    checks = retrieval_check_examples(spec, 0, corpus)
    depths = [i / (CHECK_DEPTHS - 1) for i in range(CHECK_DEPTHS)]
    evaluation = passkey_grid([LENGTH], depths, CHECK_TRIALS, 0, template="short")
    assert len(checks) == len(evaluation) == 80
    assert all(e.length == LENGTH for e in checks)
    assert not {tuple(e.input_ids) for e in checks} & {tuple(e.input_ids) for e in evaluation}
    # negative control: the evaluation's purpose draws the evaluation's examples
    same = passkey_grid([LENGTH], depths, CHECK_TRIALS, 0, template="short", purpose="eval")
    assert [e.input_ids for e in same] == [e.input_ids for e in evaluation]


def test_the_check_is_in_the_weights_key_only_when_set() -> None:
    on, off = job(), job(until_retrieves=None)
    assert weights_key(on, "fp") != weights_key(off, "fp")
    assert weights_key(off, "fp") == weights_key(
        job(until_retrieves=None, retrieval_check_every=7), "fp"
    )
    assert weights_key(on, "fp") != weights_key(job(retrieval_check_every=7), "fp")


def test_finetunes_run_their_updates() -> None:
    from bench.train.extend import finetune_recipe

    cfg = JobConfig.from_hydra(
        {**raw(), "extend": {"method": "linear", "length": 160, "steps": 4, "warmup_steps": 1}}
    )
    assert cfg.train.until_retrieves == 0.9 and finetune_recipe(cfg).until_retrieves is None


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"until_retrieves": 0.0}, r"train.until_retrieves must be a number in \(0, 1\], got 0.0"),
        ({"until_retrieves": 1.5}, r"train.until_retrieves must be a number in \(0, 1\], got 1.5"),
        ({"passkey_fraction": 0.0}, r"train.until_retrieves needs passkey rows to learn from"),
        (
            {"ruler_tasks": ["vt"], "length": 256},
            r"train.until_retrieves needs passkey rows to learn",
        ),
        ({"decay_steps": None}, r"train.until_retrieves needs train.decay_steps"),
        ({"length": 64}, r"passkey at train.length = 64, shorter than the short template's 73"),
        ({"retrieval_check_every": 0}, r"train.retrieval_check_every must be an integer >= 1"),
    ],
)
def test_bad_until_retrieves_is_one_sentence(patch: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        job(**patch)
    job()  # negative control


def test_rows_of_a_checked_model_carry_train_steps(tmp_path, monkeypatch) -> None:
    """A job's rows say how many updates its training ran; a model trained for train.steps has
    no such column."""
    from bench.job import run_job

    from fixtures.jobs import compose_config

    script_checks(monkeypatch, [1.0])

    def rows_of(*train: str) -> pd.DataFrame:
        overrides = [
            "+experiment=smoke",
            "position=rope",
            "scaling=none",
            f"paths.results={tmp_path / 'r'}",
            f"paths.cache={tmp_path / 'c'}",
            "train.length=80",
            "train.steps=14",
            "train.decay_steps=3",
            "train.passkey_fraction=0.5",
            "train.passkey_template=short",
            "train.retrieval_check_every=5",
            "eval.lengths=[1x]",
            "eval.passkey.lengths=[1x]",
            *train,
        ]
        summary = run_job(compose_config(*overrides))
        assert summary["status"] == "done", summary
        return pd.read_parquet(summary["results_path"])

    checked = rows_of("train.until_retrieves=0.9")
    assert set(checked["train_steps"]) == {5 + 3}
    plain = rows_of()
    assert "train_steps" not in plain.columns
