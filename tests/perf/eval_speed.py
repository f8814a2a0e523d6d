"""Wall time and peak memory of ``evaluate_model`` per eval length and per metric (1x..16x).

Model: rope, width 128, 4 layers, 4 heads, train_length 256, random weights (cost does not depend
on what the weights learned); documents: random bytes. Each (length, metric) runs in a fresh
subprocess. Inside it every metric is timed on its own, and its peak memory is measured on its
own too: CPU memory is the process's peak RSS, reset before each metric by writing 5 to
``/proc/self/clear_refs`` (Linux; elsewhere the running ``ru_maxrss``, which never goes down),
CUDA memory ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``. "growth" is
a peak minus the RSS (or CUDA allocation) when the metric started. "CPU s" is the process's CPU
time (every thread): on a shared machine it moves less with the load than the wall seconds. Times include the metric's
``prepare`` hook; metrics of one length share forward passes (``EvalContext.reuse_forwards``),
so in an ``all`` run a metric that reuses the nll windows is cheaper than alone. "GFLOP/s" are
the model FLOPs of every forward pass of the run (tests/perf/flops.py, counted by a hook on the
model) over its wall seconds, with their share of this machine's fp32 GEMM peak: what the whole
evaluation (bootstraps and data preparation included) makes of the machine.

The table shows seconds and peak memory per length and metric, the slowest metric per length,
and the machine (CPU model, avx512_bf16/AMX flags, torch threads, torch version, load average
before and after, since a shared machine skews the seconds). Run from the repository root after
``pip install -e .`` (pytest does not collect the scripts in tests/perf/: none is named
test_*.py); writes results/perf/eval_speed_<device>.json (measured figures: tests/perf/README.md)::

    python tests/perf/eval_speed.py                          # all metrics, then each alone
    python tests/perf/eval_speed.py --metrics all --multiples 16
    python tests/perf/eval_speed.py --metrics all,nll --multiples 1,4,16 --device cuda
"""

from __future__ import annotations

import argparse
import json
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


def _proc_status_mib(field: str) -> float | None:
    """``VmHWM`` (peak RSS since the last reset) or ``VmRSS`` from /proc/self/status, in MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM, also what ru_maxrss reports), after handing memory
    the allocator kept back to the OS; False where the kernel does not allow the reset."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc: freed memory would hide a metric's peak
    except (OSError, AttributeError):
        pass
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return _proc_status_mib("VmHWM") is not None


class _MetricMeter:
    """Seconds and peak memory of each metric call (and its prepare hook), wrapped around
    ``bench.eval.metrics.METRICS`` in the worker process."""

    def __init__(self, device: str) -> None:
        import torch

        self.torch = torch
        self.cuda = device.startswith("cuda")
        self.resettable = _reset_peak_rss()
        self.seconds: dict[str, float] = {}
        self.cpu_seconds: dict[str, float] = {}  # process CPU time, all threads: less load-bound
        self.peak: dict[str, float] = {}
        self.growth: dict[str, float] = {}
        self.cuda_peak: dict[str, float] = {}

    def _start(self) -> tuple[float, float, float, float]:
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()
        if self.resettable:
            _reset_peak_rss()
            rss = _proc_status_mib("VmRSS") or 0.0
        else:
            rss = _peak_rss_mib()
        cuda = self.torch.cuda.memory_allocated() / 2**20 if self.cuda else 0.0
        return time.perf_counter(), rss, cuda, time.process_time()

    def _stop(self, name: str, started: tuple[float, float, float, float]) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()
        seconds = time.perf_counter() - started[0]
        cpu = time.process_time() - started[3]
        self.cpu_seconds[name] = round(self.cpu_seconds.get(name, 0.0) + cpu, 3)
        peak = (_proc_status_mib("VmHWM") if self.resettable else None) or _peak_rss_mib()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + seconds, 3)
        self.peak[name] = round(max(self.peak.get(name, 0.0), peak), 1)
        self.growth[name] = round(max(self.growth.get(name, 0.0), peak - started[1]), 1)
        if self.cuda:
            cuda_peak = self.torch.cuda.max_memory_allocated() / 2**20
            self.cuda_peak[name] = round(max(self.cuda_peak.get(name, 0.0), cuda_peak), 1)

    def wrap(self, name: str, fn):
        def measured(*args, **kwargs):
            started = self._start()
            try:
                return fn(*args, **kwargs)
            finally:
                self._stop(name, started)

        return measured

    def install(self) -> None:
        """Measure every registered metric (its function and its prepare hook, if any)."""
        import dataclasses

        from bench.eval.metrics import METRICS as registry

        for name, metric in list(registry.items()):
            changes = {"fn": self.wrap(name, metric.fn)}
            if getattr(metric, "prepare", None) is not None:
                changes["prepare"] = self.wrap(name, metric.prepare)
            registry[name] = dataclasses.replace(metric, **changes)


def _in_order(per_metric: dict) -> dict:
    """``per_metric`` in run order (a prepare hook may have made a later metric come first)."""
    from bench.eval.metrics import METRICS as registry

    return {name: per_metric[name] for name in registry if name in per_metric}


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in __import__("os").getloadavg()]
    except OSError:
        return None


def worker(length: int, metric: str, device: str, threads: int) -> dict:
    """One measurement in this (fresh) process."""
    import numpy as np
    import torch

    from bench.data.corpora import Document
    from bench.eval.evaluate import evaluate_model
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
    with torch.no_grad():  # one-time initialisation (thread pools, kernels), not the first metric's
        model.eval()(torch.zeros(1, 64, dtype=torch.long, device=device))
    # model FLOPs of every forward pass (tests/perf/flops.py), for the run's achieved GFLOP/s
    from flops import causal_keys, forward_flops_per_token, matmul_params

    n_matmul, forward_flops = matmul_params(model), [0.0]

    def count_flops(module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        past = kwargs.get("past")
        keys = causal_keys(ids.shape[1], past.length if past is not None else 0)
        per_token = forward_flops_per_token(n_matmul, 4, 128, keys)
        forward_flops[0] += ids.numel() * per_token

    model.register_forward_pre_hook(count_flops, with_kwargs=True)
    meter = _MetricMeter(device)
    meter.install()
    before = _peak_rss_mib()
    started, cpu_started = time.perf_counter(), time.process_time()
    rows = evaluate_model(
        model, cfg, docs, train_length=TRAIN_LENGTH, scaling=None, device=device, progress=False
    )
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    # the per-metric resets also reset ru_maxrss: the run's peak is the largest metric peak
    after = max([_peak_rss_mib(), *meter.peak.values()])
    nll_tokens = sum(r["n"] for r in rows if r["metric"] == "nll" and "bucket_lo" not in r)
    result = {
        "length": length,
        "multiple": length / TRAIN_LENGTH,
        "metric": metric,
        "seconds": round(seconds, 3),
        "cpu_seconds": round(cpu_seconds, 3),
        "rows": len(rows),
        "peak_rss_mib": round(after, 1),
        "peak_rss_growth_mib": round(after - before, 1),
        "nll_tokens": nll_tokens,
        "model_gflop": round(forward_flops[0] / 1e9, 3),
        "gflops": round(forward_flops[0] / 1e9 / seconds, 2),
        "metric_seconds": _in_order(meter.seconds),
        "metric_cpu_seconds": _in_order(meter.cpu_seconds),
        # per metric, measured on its own (peak RSS reset before it) where the kernel allows
        "metric_peak_rss_mib": _in_order(meter.peak),
        "metric_peak_rss_growth_mib": _in_order(meter.growth),
        "metric_peak_rss_reset": meter.resettable,
        "threads": torch.get_num_threads(),
    }
    if device.startswith("cuda"):
        result["cuda_peak_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        result["metric_cuda_peak_allocated_mib"] = _in_order(meter.cuda_peak)
    return result


def print_table(results: list[dict], info: dict, load: dict) -> None:
    """Seconds and peak memory per length and metric; the slowest metric per length."""
    from bench.core.runtime import machine_line

    print(f"\nmachine: {machine_line(info)}")
    print(f"load average (1, 5, 15 min): before {load['before']}, after {load['after']}")
    memory = (
        "CUDA peak" if any("metric_cuda_peak_allocated_mib" in r for r in results) else "peak RSS"
    )
    header = (
        f"{'run':>18} {'length':>12} {'metric':>18} {'seconds':>9} {'CPU s':>8} "
        f"{memory + ' MiB':>15} {'growth MiB':>11}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        where = f"{r['length']} ({r['multiple']:g}x)"
        for name, seconds in r["metric_seconds"].items():
            cpu = r.get("metric_cpu_seconds", {}).get(name, float("nan"))
            peak = r.get("metric_cuda_peak_allocated_mib", r["metric_peak_rss_mib"]).get(name)
            growth = r.get("metric_peak_rss_growth_mib", {}).get(name)
            print(
                f"{r['metric']:>18} {where:>12} {name:>18} {seconds:>9.2f} {cpu:>8.2f} "
                f"{peak or 0:>15.1f} {growth if growth is not None else float('nan'):>11.1f}"
            )
        peak = r.get("cuda_peak_allocated_mib", r["peak_rss_mib"])
        print(
            f"{r['metric']:>18} {where:>12} {'(total)':>18} {r['seconds']:>9.2f} "
            f"{r.get('cpu_seconds', float('nan')):>8.2f} {peak:>15.1f}   "
            f"{r['gflops']:.1f} GFLOP/s = {r['share_of_peak']:.0%} of the fp32 GEMM peak"
        )
    print("\nslowest metric per length (runs with every metric):")
    for r in results:
        if r["metric"] != "all" or not r["metric_seconds"]:
            continue
        name, seconds = max(r["metric_seconds"].items(), key=lambda item: item[1])
        print(
            f"  {r['length']:>6} ({r['multiple']:g}x): {name} {seconds:.2f} s of {r['seconds']:.2f} s "
            f"({100 * seconds / max(r['seconds'], 1e-9):.0f}%)"
        )


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
    load = {"before": _loadavg()}
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
    load["after"] = _loadavg()
    from flops import gemm_peak_gflops

    from bench.core.runtime import machine_summary

    peak = gemm_peak_gflops(("cuda:" if args.device.startswith("cuda") else "") + "fp32")
    for result in results:
        result["gemm_peak_gflops"] = round(peak, 1)
        result["share_of_peak"] = result["gflops"] / peak

    info = machine_summary()
    if args.threads:
        info["torch_threads"] = args.threads
    print_table(results, info, load)

    report = {
        "benchmark": "eval_speed",
        "model": {"position": "rope", "d_model": 128, "n_layers": 4, "n_heads": 4},
        "train_length": TRAIN_LENGTH,
        "eval_config": BENCH_EVAL,
        "device": args.device,
        "threads": info["torch_threads"],
        "torch": info["torch"],
        "python": info["python"],
        "machine": platform.machine(),
        "machine_info": info,
        "load_average": load,
        "memory_measure": "CPU: per metric, peak RSS (VmHWM) after resetting it through "
        "/proc/self/clear_refs before the metric, growth = over the RSS when it started (where the "
        "reset is unavailable, the running ru_maxrss); per run, ru_maxrss of a fresh subprocess; "
        "CUDA: torch.cuda.max_memory_allocated after reset_peak_memory_stats",
        "results": results,
    }
    path = Path(args.out) if args.out else RESULTS / f"eval_speed_{args.device}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
