"""Issue 76 item 6: ``eval.shard=i/N`` splits a job by (length, documents) units, dealt out by
estimated cost, so the longest length is no longer one shard's whole share. The merge is the
unsharded job's rows byte for byte for N = 1, 2 and 7 (more shards than eval lengths); a plan
dealt with a unit dropped or duplicated is refused in one sentence; ``eval.shard=plan/N``
prints the plan and measures nothing."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

import bench.eval.evaluate as evaluate_module
from bench.cli import main
from bench.core.shards import Unit, assign

pytestmark = pytest.mark.usefixtures("one_thread")

JOB = [
    "+experiment=smoke",
    "hydra.mode=RUN",
    "position=rope",
    "scaling=none",
    "hydra.callbacks.report.enabled=false",
    "eval.lengths=[1x,2x,4x]",
    "eval.passkey.lengths=[1x,2x,4x]",  # passkey's context row is computed from every length
    "eval.nll.max_docs=6",
    "eval.batch_size=2",  # nll at 4x: 3 units of 2 documents each
    "paths.cache=cache",
]


def merged_rows(results) -> tuple[list[dict], object]:
    """The rows of the experiment's one result file, in file order, without the write time."""
    (path,) = results.glob("*.parquet")
    table = pq.read_table(path).drop(["written_at"])
    return table.to_pylist(), table.schema


def run_shards(results: str, count: int) -> None:
    for index in range(count):
        assert main([*JOB, f"paths.results={results}", f"eval.shard={index}/{count}"]) == 0
    assert main([*JOB, f"paths.results={results}"]) == 0  # the merge


def test_merged_units_equal_the_unsharded_rows_byte_for_byte(in_tmp, capsys):
    assert main([*JOB, "paths.results=whole"]) == 0
    whole, schema = merged_rows(in_tmp / "whole" / "smoke")
    capsys.readouterr()
    assert main([*JOB, "paths.results=plan", "eval.shard=plan/7"]) == 0
    plan = capsys.readouterr().out + capsys.readouterr().err
    assert "nll@256#0/3" in plan and "nll@256#2/3" in plan  # the longest length is split
    assert not list((in_tmp / "plan").rglob("*.parquet"))  # a plan measures nothing
    for count in (1, 2, 7):
        run_shards(f"sharded{count}", count)
        rows, got_schema = merged_rows(in_tmp / f"sharded{count}" / "smoke")
        assert got_schema == schema, count
        assert rows == whole, count  # every value equal, in the unsharded job's order
    assert {r["metric"] for r in whole} >= {"nll", "passkey_acc", "passkey_context"}


@pytest.mark.parametrize("fault", ["drop", "duplicate"])
def test_a_plan_that_drops_or_duplicates_a_unit_is_refused(in_tmp, capsys, monkeypatch, fault):
    """Negative control of the coverage check: shards dealt with one unit left out, or given to
    two shards, do not merge (one sentence); the same shards dealt correctly do."""

    def faulty(units, count):
        shards = assign(units, count)
        if fault == "drop":
            shards[0] = shards[0][1:]
        else:
            shards[1] = shards[1] + shards[0][:1]
        return shards

    monkeypatch.setattr(evaluate_module, "assign", faulty)
    for index in range(2):
        assert main([*JOB, "paths.results=r", f"eval.shard={index}/2"]) == 0
    capsys.readouterr()
    assert main([*JOB, "paths.results=r"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    said = "measured by no shard" if fault == "drop" else "measured by two shards"
    assert len(err) == 1 and said in err[0] and "do not cover its plan" in err[0]
    assert not list((in_tmp / "r" / "smoke").glob("*.parquet"))  # nothing merged
    monkeypatch.setattr(evaluate_module, "assign", assign)
    for index in range(2):  # control: dealt correctly, they merge
        (shard,) = (in_tmp / "r" / "smoke").rglob(f"{index}-of-2.parquet")
        shard.unlink()
        assert main([*JOB, "paths.results=r", f"eval.shard={index}/2"]) == 0
    assert main([*JOB, "paths.results=r"]) == 0


def long_plan() -> list[Unit]:
    """A 2K..32K evaluation: nll on 64 documents, one per unit at 32K (max_batch_tokens)."""
    lengths = [2048, 4096, 8192, 16384, 32768]
    units = []
    for length in lengths:
        per = max(1, 32768 // length)
        parts = 64 // per
        units += [Unit(length, "nll", i, parts, per) for i in range(parts)]
    return units


def test_units_deal_a_long_evaluation_evenly():
    units = long_plan()
    total = sum(u.cost for u in units)
    for count in (2, 4, 7):
        loads = [sum(u.cost for u in own) for own in assign(units, count)]
        assert sorted(u.key for own in assign(units, count) for u in own) == sorted(
            u.key for u in units
        )  # every unit once
        assert max(loads) <= total / count + max(u.cost for u in units)  # the LPT bound
        assert max(loads) / (total / count) < 1.05
    # negative control: split by eval length (the former rule), 4 shards cannot balance it: the
    # shard holding 32K has more than half of the whole job
    by_length = [sum(u.cost for u in units if u.length == n) for n in (2048, 32768)]
    assert by_length[1] / total > 0.5 and by_length[0] / total < 0.01
