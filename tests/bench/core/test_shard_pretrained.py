"""Issue 76 item 6 on a pretrained model (the path issue 74 shards): a tiny local Llama with a
subword tokenizer, every metric including passkey's and RULER's text verdicts; the plan of 3
shards splits nll and RULER, and the 3 shards merge to the unsharded rows byte for byte."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from bench.data.corpora import stdlib_root

from fixtures.hf import small_eval

pytestmark = pytest.mark.usefixtures("one_thread")

FILES = ["textwrap.py", "shlex.py", "bisect.py", "heapq.py", "string.py", "glob.py"]


def job(model_path, results, shard=None):
    from bench.schema import JobConfig

    return JobConfig.from_hydra(
        {
            "experiment_name": "shards",
            "paths": {"results": str(results), "reports": str(results / "reports")},
            "device": "cpu",
            "pretrained": {"path": str(model_path)},
            "data": {
                "name": "text",
                "paths": [str(stdlib_root() / f) for f in FILES],
                "split_fractions": {"train": 0.01, "validation": 0.01, "test": 0.98},
            },
            "eval": {**small_eval(["4x"]), "shard": shard},
        }
    )


def rows(results) -> list[dict]:
    (path,) = (results / "shards").glob("*.parquet")
    return pq.read_table(path).drop(["written_at"]).to_pylist()


def test_a_pretrained_models_shards_merge_to_its_unsharded_rows(hf_model_dirs, tmp_path):
    from bench.job import run_job

    model = hf_model_dirs["llama"]
    assert run_job(job(model, tmp_path / "whole"))["status"] == "done"
    plan = run_job(job(model, tmp_path / "sharded", "plan/3"))
    assert plan["status"] == "planned", plan
    assert "nll@256#0/" in plan["message"] and "ruler@256#1/2" in plan["message"]
    assert not list((tmp_path / "sharded").rglob("*.parquet"))  # the plan measured nothing
    for index in range(3):
        assert run_job(job(model, tmp_path / "sharded", f"{index}/3"))["status"] == "done"
    merged = run_job(job(model, tmp_path / "sharded"))
    assert merged["status"] == "done" and "merged from shards" in merged["message"]
    whole = rows(tmp_path / "whole")
    assert {r["metric"] for r in whole} >= {"nll", "passkey_acc", "niah_single", "cwe"}
    assert rows(tmp_path / "sharded") == whole
