"""Wall time and peak memory of ``evaluate_model`` per eval length (1x..16x the training length).

Model: rope, width 128, 4 layers, 4 heads, train_length 256, random weights (cost does not depend
on what the weights learned); documents: random bytes. Each (length, metric) runs in a fresh
subprocess, because torch's CPU allocations are invisible to tracemalloc and a process's peak RSS
never goes down: CPU memory is ``ru_maxrss`` (and its growth during ``evaluate_model``), CUDA
memory ``torch.cuda.max_memory_allocated``. The "all" run also records per-metric seconds and
the running peak RSS after each metric; ``--metrics nll`` gives one metric's own peak.

Run from the repository root after ``pip install -e .`` (pytest does not collect bench_*.py);
prints a table and writes results/perf/bench_eval_<device>.json::

    python tests/perf/bench_eval.py                          # all metrics, then each alone
    python tests/perf/bench_eval.py --metrics all,nll --multiples 1,4,16 --device cuda
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

#: Output directory, relative to the working directory (like lenbench's paths.results).
RESULTS = Path("results") / "perf"
TRAIN_LENGTH = 256
METRICS = (
    "nll",
    "passkey",
    "shift_dnll",
    "order_dnll",
    "context_nll",
    "attn_entropy",
    "position_probe_r2",
)
#: The eval config benchmarked: the standard protocol's structure with fewer documents/trials,
#: every metric at every length (so its cost can be read per length).
BENCH_EVAL = {
    "precision": "fp32",
    "batch_size": 8,
    "max_batch_tokens": 32768,
    "nll": {"lengths": None, "max_docs": 8, "bootstrap": 1000},
    "passkey": {"lengths": None, "depths": 5, "trials": 2},
    "shift_dnll": {"lengths": None, "deltas": ["1x", "16x"], "max_docs": 2},
    "order_dnll": {"lengths": None, "max_docs": 2},
    "context_nll": {"lengths": None, "max_docs": 2},
    "attn_entropy": {"lengths": None, "max_docs": 1},
    "position_probe_r2": {"lengths": None, "fit_docs": 2, "test_docs": 2},
}


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


class _MetricTimes(logging.Handler):
    """Collects evaluate_model's per-metric timing log records, and the peak RSS after each."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seconds: dict[str, float] = {}
        self.peak_rss: dict[str, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("%s at eval length %d: %d rows in"):
            name, _length, _rows, seconds = record.args
            self.seconds[name] = round(float(seconds), 3)
            self.peak_rss[name] = round(_peak_rss_mib(), 1)


def worker(length: int, metric: str, device: str, threads: int) -> dict:
    """One measurement in this (fresh) process."""
    import numpy as np
    import torch

    from bench.corpora import Document
    from bench.evaluate import evaluate_model
    from models.positions import PositionConfig
    from models.transformer import DecoderLM, ModelConfig

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = DecoderLM(
        ModelConfig(n_layers=4, d_model=128, n_heads=4), PositionConfig(kind="rope"), TRAIN_LENGTH
    ).to(device)
    rng = np.random.default_rng(0)
    docs = [
        Document(f"doc{i}", rng.integers(0, 256, size=length + 65).astype(np.int16))
        for i in range(8)
    ]
    cfg = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BENCH_EVAL.items()}
    cfg["lengths"] = [length]
    for name in METRICS:
        cfg[name]["enabled"] = metric in ("all", name)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    per_metric = _MetricTimes()
    logging.getLogger("bench.evaluate").addHandler(per_metric)
    logging.getLogger("bench.evaluate").setLevel(logging.INFO)
    before = _peak_rss_mib()
    started = time.perf_counter()
    rows = evaluate_model(
        model, cfg, docs, train_length=TRAIN_LENGTH, scaling=None, device=device, progress=False
    )
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    after = _peak_rss_mib()
    nll_tokens = sum(r["n"] for r in rows if r["metric"] == "nll" and "bucket_lo" not in r)
    result = {
        "length": length,
        "multiple": length / TRAIN_LENGTH,
        "metric": metric,
        "seconds": round(seconds, 3),
        "rows": len(rows),
        "peak_rss_mib": round(after, 1),
        "peak_rss_growth_mib": round(after - before, 1),
        "nll_tokens": nll_tokens,
        "metric_seconds": per_metric.seconds,
        "metric_peak_rss_mib": per_metric.peak_rss,
    }
    if device.startswith("cuda"):
        result["cuda_peak_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--multiples", default="1,2,4,8,16", help="eval lengths as multiples of 256"
    )
    parser.add_argument(
        "--metrics", default="all," + ",".join(METRICS), help="'all' and/or metric sections"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    parser.add_argument("--out", default=None, help=f"JSON path (default {RESULTS}/...)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--metric", default="all", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.length, args.metric, args.device, args.threads)))
        return

    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    unknown = [m for m in metrics if m not in ("all", *METRICS)]
    if unknown:
        parser.error(f"metric {unknown[0]!r} is unknown; allowed: all, {', '.join(METRICS)}")
    lengths = [int(float(m) * TRAIN_LENGTH) for m in args.multiples.split(",")]
    results = []
    for metric in metrics:
        for length in lengths:
            command = [
                sys.executable,
                __file__,
                "--worker",
                f"--length={length}",
                f"--metric={metric}",
                f"--device={args.device}",
                f"--threads={args.threads}",
            ]
            out = subprocess.run(command, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                sys.exit(f"worker {metric} at length {length} failed:\n{out.stderr[-3000:]}")
            result = json.loads(out.stdout.strip().splitlines()[-1])
            results.append(result)
            print(
                f"{metric:>18} L={length:>5} ({result['multiple']:>4g}x): {result['seconds']:>7.2f} s, "
                f"peak RSS {result['peak_rss_mib']:>7.1f} MiB (+{result['peak_rss_growth_mib']:.1f})"
                + (
                    f", CUDA peak {result['cuda_peak_allocated_mib']:.1f} MiB"
                    if "cuda_peak_allocated_mib" in result
                    else ""
                ),
                flush=True,
            )
    import torch

    report = {
        "benchmark": "bench_eval",
        "model": {"position": "rope", "d_model": 128, "n_layers": 4, "n_heads": 4},
        "train_length": TRAIN_LENGTH,
        "eval_config": BENCH_EVAL,
        "device": args.device,
        "threads": args.threads or torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "memory_measure": "CPU: ru_maxrss per fresh subprocess (growth = over the peak before "
        "evaluate_model); CUDA: torch.cuda.max_memory_allocated",
        "results": results,
    }
    path = Path(args.out) if args.out else RESULTS / f"bench_eval_{args.device}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
