"""Sharded evaluation (issue 53 item 2, issue 76 item 6): ``eval.shard=i/N`` splits one job's
(length, documents) units over N processes; the same command without it merges them. The merged
rows equal an unsharded run's byte for byte (N = 1, 2, 7); a missing, duplicated or mixed-N
shard, or a unit measured twice or not at all, is refused in one sentence; a shard killed
mid-way computes its share again when rerun, and the shards already written are kept."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

import bench.eval.metrics.nll as nll_module
from bench.cli import main
from bench.core.results import load_results
from bench.core.shards import SHARD_DIR, Shard, parse_shard

from fixtures.jobs import Killed

pytestmark = pytest.mark.usefixtures("one_thread")

JOB = [
    "+experiment=smoke",
    "hydra.mode=RUN",
    "position=rope",
    "scaling=none",
    "hydra.callbacks.report.enabled=false",
    "eval.lengths=[1x,2x,4x]",
    "eval.passkey.lengths=[1x,2x,4x]",  # passkey's context row is computed from every length
    "paths.cache=cache",
]


def rows(directory) -> pd.DataFrame:
    frame = load_results(directory).drop(columns=["written_at", "source_file"])
    frame = frame.astype(str)  # NaN, None and lists compare as text
    return frame.sort_values(list(frame.columns)).reset_index(drop=True)


def shard_files(results):
    return sorted(p.name for p in results.rglob("*-of-*.parquet"))


def test_merged_shards_equal_the_unsharded_run(in_tmp, monkeypatch, capsys):
    assert main([*JOB, "paths.results=whole"]) == 0
    sharded = [*JOB, "paths.results=sharded"]
    results = in_tmp / "sharded" / "smoke"

    assert main([*sharded, "eval.shard=0/2"]) == 0
    assert shard_files(results) == ["0-of-2.parquet"]
    assert not list(results.glob("*.parquet"))  # no result a report would read yet

    # a merge with a shard missing: one sentence, nothing merged
    capsys.readouterr()
    assert main(sharded) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert (
        len(err) == 1
        and "has 1 of its 2 shards" in err[0]
        and "eval.shard=1/2 is missing" in err[0]
    )

    # shard 1 killed mid-way (during its nll): nothing of it written, shard 0 kept
    original = nll_module._measure_windows

    def killed(*args, **kwargs):
        raise Killed

    monkeypatch.setattr(nll_module, "_measure_windows", killed)
    with pytest.raises(Killed):
        main([*sharded, "eval.shard=1/2"])
    assert shard_files(results) == ["0-of-2.parquet"]
    monkeypatch.setattr(nll_module, "_measure_windows", original)
    assert main([*sharded, "eval.shard=1/2"]) == 0  # the rerun computes its share
    assert shard_files(results) == ["0-of-2.parquet", "1-of-2.parquet"]

    assert main(sharded) == 0  # the merge
    assert shard_files(results) == [] and not (results / SHARD_DIR).exists()
    whole, merged = rows(in_tmp / "whole" / "smoke"), rows(results)
    assert "passkey_context" in set(merged["metric"])  # the row computed from every length
    assert set(merged["eval_length"]) == {"0", "64", "128", "256"}  # 0: the context row
    pd.testing.assert_frame_equal(whole, merged)
    # a shard of a merged job has nothing to do
    assert main([*sharded, "eval.shard=1/2"]) == 0
    assert shard_files(results) == []


def test_shards_of_two_counts_are_refused(in_tmp, capsys):
    sharded = [*JOB, "paths.results=sharded"]
    results = in_tmp / "sharded" / "smoke"
    for shard in ("0/2", "1/2", "0/3"):
        assert main([*sharded, f"eval.shard={shard}"]) == 0
    capsys.readouterr()
    assert main(sharded) == 2
    err = capsys.readouterr().err
    assert "different shard counts" in err and "0-of-3.parquet" in err
    (only,) = {p.parent for p in results.rglob("0-of-3.parquet")}
    (only / "0-of-3.parquet").unlink()
    assert main(sharded) == 0  # control: one N merges


def test_a_shard_file_of_another_run_is_refused(in_tmp, capsys):
    """A shard file copied in from another run (same name, other rows) is not merged."""
    sharded = [*JOB, "paths.results=sharded"]
    results = in_tmp / "sharded" / "smoke"
    assert main([*sharded, "eval.shard=0/2"]) == 0
    assert main([*sharded, "eval.shard=1/2", "seed=1"]) == 0  # another run id
    (zero,) = results.rglob("0-of-2.parquet")
    (one,) = results.rglob("1-of-2.parquet")
    shutil.copy(one, zero.parent / "1-of-2.parquet")
    capsys.readouterr()
    assert main(sharded) == 2
    assert "holds rows of other runs" in capsys.readouterr().err


@pytest.mark.parametrize("stray", ["01-of-2.parquet", "1-of-02.parquet", "notes.txt"])
def test_a_file_that_is_not_a_shard_is_refused_not_deleted(in_tmp, capsys, stray):
    """The audit's case: 01-of-2 (a copy of shard 0) beside 1-of-2 once read as the same shard,
    was ignored, and the merge then deleted it with the folder. Any file not named as
    eval.shard=i/N names it is refused in one sentence and kept; control: without it, the merge
    runs."""
    sharded = [*JOB, "paths.results=sharded"]
    results = in_tmp / "sharded" / "smoke"
    for shard in ("0/2", "1/2"):
        assert main([*sharded, f"eval.shard={shard}"]) == 0
    (zero,) = results.rglob("0-of-2.parquet")
    extra = zero.parent / stray
    shutil.copy(zero, extra)
    capsys.readouterr()
    assert main(sharded) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and f"{stray} is not a shard file" in err[0] and extra.exists()
    extra.unlink()
    assert main(sharded) == 0 and shard_files(results) == []


@pytest.mark.parametrize(
    ("value", "sentence"),
    [
        ("2/2", "names shard 2 of 2; allowed: 0 <= i < N"),
        ("3/2", "names shard 3 of 2; allowed: 0 <= i < N"),
        ("1/0", "names shard 1 of 0; allowed: 0 <= i < N with N >= 1"),
        ("plan/0", "names shard plan of 0"),
        ("x", "eval.shard must be 'i/N'"),
        ("-1/2", "eval.shard must be 'i/N'"),
        ("1", "eval.shard must be 'i/N'"),
    ],
)
def test_a_bad_shard_is_one_sentence(value, sentence):
    with pytest.raises(ValueError, match=sentence):
        parse_shard(value)


@pytest.mark.parametrize("value", ["2/2", "3/2", "1/0", "x"])
def test_a_bad_shard_exits_2_before_any_work(in_tmp, capsys, value):
    assert main([*JOB, f"eval.shard={value}", "paths.results=r"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "eval.shard" in err[0] and repr(value) in err[0]
    assert not (in_tmp / "cache").exists() and not (in_tmp / "r").exists()


def test_good_shards_parse():  # control for the refusals above
    assert parse_shard("0/2") == Shard(0, 2) and parse_shard("6/7") == Shard(6, 7)
    assert parse_shard("plan/3") == Shard(None, 3) and parse_shard(None) is None
