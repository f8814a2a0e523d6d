"""tests/perf/gpu_speed.py, the script a lent GPU runs first (issue 53, item 4), runs on a CPU at
toy sizes and writes what it promises: our rows beside transformers' Llama at the same
dimensions (equal parameter counts: a Llama built at other dimensions fails), and the 16L
evaluation through the chunked head with a finite NLL near a random model's log(vocabulary).
Speed is not checked here (tests/perf/README.md holds measured figures)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "perf" / "gpu_speed.py"
SEQ, MULTIPLE = 32, 4


def test_gpu_speed_runs_on_cpu_with_llama_rows_and_the_long_eval(tmp_path: Path) -> None:
    out = tmp_path / "gpu_speed.json"
    done = subprocess.run(
        [
            sys.executable, str(SCRIPT), "--device", "cpu", "--presets", "tiny",
            "--positions", "rope,alibi", "--seq", str(SEQ), "--batch", "2", "--steps", "1",
            "--warmup", "1", "--eval-multiple", str(MULTIPLE), "--skip-length", "--out", str(out),
        ],
        capture_output=True, text=True, timeout=300, cwd=SCRIPT.parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    training = {row["position"]: row for row in result["training"]}
    assert list(training) == ["rope", "alibi", "llama"]
    assert training["llama"]["params"] == training["rope"]["params"]  # equal dimensions
    for row in training.values():
        assert row["tokens_per_s"] > 0 and row["vs_llama"] > 0 and row["peak_gib"] is None
    assert training["llama"]["vs_llama"] == 1.0
    evals = {row["position"]: row for row in result["eval"]}
    assert list(evals) == ["rope", "alibi"]
    for row in evals.values():
        assert row["length"] == MULTIPLE * SEQ
        assert abs(row["mean_nll"] - math.log(259)) < 1.0  # a random model: near uniform
    assert result["lengths"] == []
    assert "llama" in done.stdout and f"eval at {MULTIPLE * SEQ:,} tokens" in done.stdout
