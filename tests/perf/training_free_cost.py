"""Cost per token of the training-free methods against raw RoPE, side by side in one run.

Model: rope, width 128, 4 layers, 4 heads, train_length 256, random weights (the cost does not
depend on what the weights learned), fp32, batch 1. For each method and length, in a fresh
subprocess (so peak memory is its own):

- **prefill**: one forward pass over ``length`` tokens, seconds per token (median of 3 after a
  warm-up) and peak RSS growth over the RSS before it (MiB; ``/proc/self/clear_refs`` resets
  the peak on Linux);
- **decode**: 32 single-token steps with the KV cache after a ``length``-token prefill, seconds
  per generated token (median of 3 rounds).

Raw RoPE's plain prefill goes through the fused SDPA kernel; a training-free method scores each
pair twice (its own and its far positions) in query tiles (``models.tiled_attention.attend_tiled``),
so memory stays linear in length; the ratio column is each method over raw (``none``) at the same
length in the same run. YaRN (a frequency method: the same kernel as raw) is the control. Run
from the repository root after ``pip install -e .``; writes
results/perf/training_free_cost.json (measured figures: tests/perf/README.md)::

    python tests/perf/training_free_cost.py
    python tests/perf/training_free_cost.py --lengths 1024,4096 --methods none,self_extend
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path("results") / "perf"
TRAIN_LENGTH = 256
METHODS = {
    "none": ("default", {}),
    "yarn": ("yarn", {"factor": "auto"}),
    "self_extend": ("self_extend", {"group_size": "auto", "window": "auto"}),
    "rerope": ("rerope", {"window": "auto"}),
    "leaky_rerope": ("leaky_rerope", {"window": "auto", "slope": "auto"}),
    "streaming": ("streaming", {"sink_tokens": 4, "window": "auto"}),
    "dca": ("dca", {"chunk_size": "auto", "local_window": "auto"}),
}
DECODE_STEPS = 32


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def worker(method: str, length: int, threads: int) -> dict:
    import torch

    from models.positions import PositionConfig
    from models.scaling_config import ScalingConfig
    from models.transformer import DecoderLM, ModelConfig

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=259, n_layers=4, d_model=128, n_heads=4)
    model = DecoderLM(cfg, PositionConfig(kind="rope"), TRAIN_LENGTH).eval()
    name, params = METHODS[method]
    model.set_scaling(ScalingConfig(method, name, params), eval_length=length)
    ids = torch.randint(0, 259, (1, length))
    with torch.no_grad():
        model(ids)  # warm-up at the full length (allocator, rotary tables)
        _reset_peak()
        before = _status_mib("VmRSS")
        prefill = []
        for _ in range(3):
            start = time.perf_counter()
            out = model(ids, use_cache=True)
            prefill.append(time.perf_counter() - start)
        peak = _status_mib("VmHWM") - before
        decode = []
        for _ in range(3):
            past = out.past
            token = out.logits[:, -1:].argmax(-1)
            start = time.perf_counter()
            for _ in range(DECODE_STEPS):
                step = model(token, past=past, use_cache=True)
                past, token = step.past, step.logits[:, -1:].argmax(-1)
            decode.append((time.perf_counter() - start) / DECODE_STEPS)
    from flops import causal_keys, forward_flops_per_token, matmul_params

    # model FLOPs of the prefill (tests/perf/flops.py): a method's second score per pair is its
    # own cost, not counted, so its GFLOP/s falls as it slows down
    flops = length * forward_flops_per_token(matmul_params(model), 4, 128, causal_keys(length))
    return {
        "method": method,
        "length": length,
        "params": model.scaling.params,
        "prefill_gflops": flops / statistics.median(prefill) / 1e9,
        "prefill_s_per_token": statistics.median(prefill) / length,
        "prefill_peak_mib": peak,
        "decode_s_per_token": statistics.median(decode),
        "threads": torch.get_num_threads(),
    }


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1024,4096", help="eval lengths in tokens")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    parser.add_argument("--out", default=str(RESULTS / "training_free_cost.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--method", default="none", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.method, args.length, args.threads)))
        return
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        parser.error(f"--methods {unknown} unknown; allowed: {', '.join(METHODS)}.")
    lengths = [int(x) for x in args.lengths.split(",")]
    results = []
    for length in lengths:
        for method in methods:
            cmd = [sys.executable, __file__, "--worker", f"--method={method}", f"--length={length}"]
            cmd.append(f"--threads={args.threads}")
            done = subprocess.run(cmd, check=True, capture_output=True, text=True)
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"  {method} at {length}: done", file=sys.stderr)
    raw = {r["length"]: r for r in results if r["method"] == "none"}
    from flops import gemm_peak_gflops

    from bench.core.runtime import machine_line, machine_summary

    peak = gemm_peak_gflops("fp32", args.threads or None)
    print(f"machine: {machine_line(machine_summary())}; model rope 4x128, L={TRAIN_LENGTH}")
    print(f"fp32 GEMM peak {peak:.1f} GFLOP/s (tests/perf/flops.py)")
    print(
        "| method | length | params | prefill ms/token (x raw) | prefill GFLOP/s (% peak) | "
        "prefill peak MiB | decode ms/token (x raw) |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        base = raw.get(r["length"])
        pre = r["prefill_s_per_token"] * 1e3
        dec = r["decode_s_per_token"] * 1e3
        ratio_pre = (
            f" ({r['prefill_s_per_token'] / base['prefill_s_per_token']:.2f}x)" if base else ""
        )
        ratio_dec = (
            f" ({r['decode_s_per_token'] / base['decode_s_per_token']:.2f}x)" if base else ""
        )
        params = ", ".join(
            f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in r["params"].items()
        )
        print(
            f"| {r['method']} | {r['length']} | {params} | {pre:.3f}{ratio_pre} | "
            f"{r['prefill_gflops']:.1f} ({r['prefill_gflops'] / peak:.0%}) | "
            f"{r['prefill_peak_mib']:.0f} | {dec:.2f}{ratio_dec} |"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"machine": _cpu(), "gemm_peak_gflops": peak, "results": results}, indent=1)
    )


if __name__ == "__main__":
    main()
