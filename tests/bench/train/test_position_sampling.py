"""train.position_sampling: randomized (Ruoss et al. 2023) and PoSE (Zhu et al. 2024) position
ids for training windows, from their published definitions; each property with a negative
control (contiguous positions, or a PoSE without skips, fail it)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bench.data.corpora import Document
from bench.schema import JobConfig
from bench.train.batches import TrainingStream, pose_positions, randomized_positions
from bench.train.cache import weights_key
from bench.train.config import TrainConfig
from bench.train.trainer import train_model

pytestmark = pytest.mark.usefixtures("one_thread")


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def sorted_distinct_in_range(pos: torch.Tensor, max_position: int) -> bool:
    return bool((pos[:, 1:] > pos[:, :-1]).all() and pos.min() >= 0 and pos.max() < max_position)


def test_randomized_positions_are_sorted_distinct_and_uniform():
    pos = randomized_positions(4000, 16, 64, gen())
    assert pos.shape == (4000, 16) and pos.dtype == torch.long
    assert sorted_distinct_in_range(pos, 64)
    # uniform without replacement: every position is drawn with probability 16/64
    freq = np.bincount(pos.flatten().numpy(), minlength=64) / 4000
    assert np.abs(freq - 0.25).max() < 0.03  # binomial sd 0.0068: > 4 sd
    # the k-th smallest of 16 from 64 has mean (k + 1) * 65 / 17 - 1 (order statistics)
    expected = (np.arange(1, 17) * 65 / 17) - 1
    assert np.abs(pos.double().mean(0).numpy() - expected).max() < 0.5
    assert torch.equal(
        pos, randomized_positions(4000, 16, 64, gen())
    )  # a pure function of the seed
    # negative control: contiguous positions are sorted and distinct but not uniform over 0..63
    contiguous = torch.arange(16).expand(4000, 16)
    freq = np.bincount(contiguous.flatten().numpy(), minlength=64) / 4000
    assert np.abs(freq - 0.25).max() > 0.5
    with pytest.raises(ValueError, match="length 65 must be in"):
        randomized_positions(2, 65, 64, gen())


def test_pose_positions_are_two_shifted_chunks_covering_the_target_range():
    length, target = 16, 64
    pos = pose_positions(4000, length, target, gen())
    assert pos.shape == (4000, length) and sorted_distinct_in_range(pos, target)
    steps = pos[:, 1:] - pos[:, :-1]  # [rows, length - 1]
    jumps = (steps != 1).sum(dim=1)
    assert int(jumps.max()) <= 1  # at most one skip: two chunks of consecutive positions
    first = torch.where(steps != 1, torch.arange(1, length), length).min(dim=1).values
    first = torch.where(jumps == 0, torch.full_like(first, 1), first)
    assert int(first.max()) <= (length + 1) // 2  # the first chunk is at most half the window
    assert (pos[:, 0] == 0).all()  # the first chunk is not shifted (the reference code's lt = 0)
    # coverage of [0, target): every position occurs, the first and the last included
    seen = np.bincount(pos.flatten().numpy(), minlength=target)
    assert (seen > 0).all() and pos.min() == 0 and pos.max() == target - 1
    # negative control: chunks without skips cover only [0, length)
    unskipped = pose_positions(4000, length, length, gen())
    assert torch.equal(unskipped, torch.arange(length).expand(4000, length))
    assert (np.bincount(unskipped.flatten().numpy(), minlength=target)[length:] == 0).all()


def _stream(sampling: str, max_position: int | None = None) -> TrainingStream:
    rng = np.random.default_rng(0)
    docs = [Document(f"d{i}", rng.integers(0, 256, 500).astype(np.int16)) for i in range(4)]
    return TrainingStream(
        docs, 32, 8, seed=3, position_sampling=sampling, max_position=max_position
    )


def test_the_stream_adds_positions_without_changing_the_tokens():
    plain, randomized, pose = (
        _stream("contiguous"),
        _stream("randomized", 256),
        _stream("pose", 256),
    )
    a, b, c = plain.batch(5), randomized.batch(5), pose.batch(5)
    assert a.position_ids is None
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.tokens, c.tokens)
    assert b.position_ids.shape == (8, 32) and sorted_distinct_in_range(b.position_ids, 256)
    assert torch.equal(b.position_ids, randomized.batch(5).position_ids)  # resumable
    assert not torch.equal(b.position_ids, randomized.batch(6).position_ids)  # per step
    with pytest.raises(ValueError, match="max_position 16 must be an integer >= seq_len 32"):
        _stream("pose", 16)


def test_sampling_enters_the_checkpoint_key_only_when_it_is_used(tmp_path):
    def key(**train):
        raw = {"data": {"name": "text", "paths": [str(tmp_path)]}, "train": {"length": 32, **train}}
        return weights_key(JobConfig.from_hydra(raw), corpus=None)

    plain = key()
    assert key(position_sampling="contiguous", max_position=512) == plain  # old keys hold
    assert key(position_sampling="randomized") != plain
    assert key(position_sampling="randomized") == key(
        position_sampling="randomized", max_position=256
    )
    assert key(position_sampling="randomized") != key(position_sampling="pose")
    assert key(position_sampling="pose", max_position=512) != key(position_sampling="pose")
    with pytest.raises(ValueError, match="train.position_sampling must be one of"):
        TrainConfig(position_sampling="shuffled")
    with pytest.raises(ValueError, match=r"train.max_position must be an integer >= 32"):
        TrainConfig(length=32, max_position=16)


def test_a_learned_table_gets_the_rows_the_sampling_reaches(tmp_path):
    def job(**position):
        raw = {
            "position": {"kind": "learned", **position},
            "train": {"length": 32, "position_sampling": "randomized", "max_position": 128},
        }
        return JobConfig.from_hydra(raw)

    assert job().position.max_positions == 128
    assert job(max_positions=256).position.max_positions == 256
    with pytest.raises(ValueError, match="position.max_positions 64 is smaller than the 128"):
        job(max_positions=64)
    contiguous = JobConfig.from_hydra({"position": {"kind": "learned"}, "train": {"length": 32}})
    assert contiguous.position.max_positions == 0  # control: the training length, as before


@pytest.mark.parametrize("sampling", ["randomized", "pose"])
def test_training_reads_the_sampled_positions(sampling, tmp_path):
    """A learned table trained with sampled positions updates rows beyond the window; trained on
    contiguous windows it never touches them (the negative control)."""
    from bench.data.corpora import load_corpus

    root = tmp_path / "docs"
    root.mkdir()
    for i in range(12):
        (root / f"f{i}.txt").write_text(f"line {i} " * 400)
    corpus = load_corpus({"name": "text", "paths": [str(root)]})

    def trained(**train):
        raw = {
            "model": {"n_layers": 1, "d_model": 32, "n_heads": 2},
            "position": {"kind": "learned", "max_positions": 128},
            "data": {"name": "text", "paths": [str(root)]},
            "train": {
                "length": 32,
                "steps": 3,
                "warmup_steps": 2,
                "batch_size": 4,
                "eval_batches": 0,
                "weight_decay": 0.0,  # rows without gradient stay exactly as initialised
                **train,
            },
        }
        model, _ = train_model(JobConfig.from_hydra(raw), corpus, progress=False)
        return model.pos_table.detach().clone()

    initial = trained(lr=0.0)  # the same seed: the same initial table
    contiguous = trained()
    sampled = trained(position_sampling=sampling, max_position=128)
    inside, beyond = slice(0, 32), slice(32, 128)
    assert not torch.equal(contiguous[inside], initial[inside])  # it trained
    assert torch.equal(contiguous[beyond], initial[beyond])  # control: rows past L untouched
    assert not torch.equal(sampled[beyond], initial[beyond])


def test_smoke_with_sampled_positions_lands_rows_for_every_metric(in_tmp, quiet_training, capsys):
    """The issue's command: smoke's rope and learned models trained with randomized and PoSE
    positions, evaluated on contiguous positions, every metric's rows for each."""
    import pandas as pd

    from bench.cli import main

    argv = [
        "+experiment=smoke",
        "position=rope,learned",
        "train.position_sampling=randomized,pose",
        f"paths.cache={in_tmp / 'cache'}",
        "hydra.callbacks.report.enabled=false",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    df = pd.concat(pd.read_parquet(f) for f in (in_tmp / "results" / "smoke").glob("*.parquet"))
    assert set(df["position_sampling"]) == {"randomized", "pose"}
    cells = df.groupby(["position", "position_sampling"])["metric"].apply(set).to_dict()
    assert set(cells) == {(p, s) for p in ("rope", "learned") for s in ("randomized", "pose")}
    every = {"nll", "passkey_acc", "shift_dnll", "attn_entropy", "position_probe_r2"}
    assert all(every <= metrics for metrics in cells.values()), cells
    learned = df[df["position"] == "learned"]
    assert {json.loads(p)["max_positions"] for p in learned["position_params"]} == {512}
    assert df.groupby("position_sampling")["model_config_id"].nunique().min() == 2
    from bench.report.frame import add_labels

    labels = set(add_labels(df.assign(experiment="smoke"))["position_label"])
    assert {"rope (randomized)", "learned (pose)"} <= labels, labels
    plain = add_labels(df.drop(columns="position_sampling").assign(experiment="smoke"))
    assert "rope" in set(plain["position_label"])  # control: without the column, no mark
