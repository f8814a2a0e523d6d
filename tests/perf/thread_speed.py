"""Training step time by thread count and OpenMP wait policy, on an idle machine and under load.

Each setting runs in a fresh subprocess (OpenMP reads ``OMP_WAIT_POLICY`` once, when torch
loads it). "Under load" starts one busy competitor process first (a single-threaded fp32 matmul
loop, as another job on the same cores would be). The step is the quickstart LM arm's: DecoderLM
2 layers, width 128, 4 heads, L=64, batch 32, fp32 AdamW. Prints a table and writes
results/perf/thread_speed.json (measured figures: tests/perf/README.md)::

    python tests/perf/thread_speed.py
    python tests/perf/thread_speed.py --steps 40 --width 64 --seq 256 --batch 16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path("results") / "perf"
SETTINGS = {  # name -> environment (libgomp: unset = spin 300k iterations, then sleep)
    "1 thread": {"OMP_NUM_THREADS": "1"},
    "2 threads, libgomp default": {"OMP_NUM_THREADS": "2"},
    "2 threads, OMP_WAIT_POLICY=ACTIVE": {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "ACTIVE"},
    "2 threads, OMP_WAIT_POLICY=PASSIVE": {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"},
    "2 threads, GOMP_SPINCOUNT=10000": {"OMP_NUM_THREADS": "2", "GOMP_SPINCOUNT": "10000"},
}

WORKER = """
import statistics, sys, time, torch, torch.nn.functional as F
from models.positions import PositionConfig
from models.transformer import DecoderLM, ModelConfig
width, seq, batch, steps = (int(a) for a in sys.argv[1:5])
torch.manual_seed(0)
model = DecoderLM(ModelConfig(n_layers=2, d_model=width, n_heads=max(1, width // 32)),
                  PositionConfig(kind="rope"), seq)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
tokens = torch.randint(0, 256, (batch, seq + 1))
times = []
for i in range(steps + 3):
    start = time.perf_counter()
    logits = model(tokens[:, :-1]).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    if i >= 3:
        times.append(time.perf_counter() - start)
print(statistics.median(times))
"""

LOAD = """
import torch
torch.set_num_threads(1)
a = torch.randn(512, 512)
while True:
    a = (a @ a).tanh_()
"""


def run(env: dict[str, str], args: argparse.Namespace) -> float:
    inherited = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
    }
    full = {**inherited, **env}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            WORKER,
            str(args.width),
            str(args.seq),
            str(args.batch),
            str(args.steps),
        ],
        capture_output=True,
        text=True,
        env=full,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3, help="runs per setting (median)")
    parser.add_argument("--out", type=Path, default=RESULTS / "thread_speed.json")
    args = parser.parse_args()
    sys.path.insert(0, str(Path.cwd()))
    from bench.core.runtime import machine_line, machine_summary

    results = []
    for load in (False, True):
        competitor = None
        if load:
            competitor = subprocess.Popen([sys.executable, "-c", LOAD])
            time.sleep(1.0)
        try:
            runs: dict[str, list[float]] = {name: [] for name in SETTINGS}
            for _ in range(args.repeats):  # interleaved, so drifting load hits every setting
                for name, env in SETTINGS.items():
                    runs[name].append(run(env, args))
            for name, times in runs.items():
                seconds = statistics.median(times)
                results.append(
                    {"setting": name, "under_load": load, "step_s": seconds, "runs_s": times}
                )
                print(
                    f"{'under load' if load else 'idle':>10}  {name:<42} {seconds * 1000:8.1f} ms/step",
                    flush=True,
                )
        finally:
            if competitor is not None:
                competitor.kill()
                competitor.wait()
    machine = machine_summary()
    print(f"machine: {machine_line(machine)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "thread_speed",
                "config": vars(args) | {"out": str(args.out)},
                "machine": machine,
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
