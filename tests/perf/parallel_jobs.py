"""A sweep's wall time with its jobs one at a time against several at once (issue 53, item 3).

Runs the same sweep twice, each from an empty cache and results folder, in a fresh ``lenbench``
process: with the basic launcher (jobs one after another, each using every core's thread) and with
``hydra/launcher=joblib`` (``--jobs`` worker processes, each job setting torch to
cpu_count // n_jobs threads, ``bench.job.configure_threads``). Prints both wall times, the speedup
and the machine, checks that both sweeps wrote the same number of result rows, and writes
results/perf/parallel_jobs.json (figures: tests/perf/README.md)::

    python tests/perf/parallel_jobs.py
    python tests/perf/parallel_jobs.py --jobs 4 -- +experiment=smoke train.steps=400 position=rope,alibi,nope,sinusoidal
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path("results") / "perf"
#: four small trainings of equal cost: enough work per job that worker start-up is not all
DEFAULT_SWEEP = [
    "+experiment=smoke",
    "position=rope,alibi,nope,sinusoidal",
    "scaling=none",
    "model.n_layers=2",
    "model.d_model=128",
    "model.n_heads=4",
    "train.batch_size=16",
    "train.steps=300",
    "hydra.callbacks.report.enabled=false",
]


def run_sweep(
    lenbench: str, sweep: list[str], launcher: list[str], root: Path
) -> tuple[float, int]:
    """(wall seconds, result rows) of one sweep in ``root``."""
    paths = [
        f"paths.results={root}/results",
        f"paths.cache={root}/cache",
        f"hydra.sweep.dir={root}/sweep",
    ]
    start = time.perf_counter()
    done = subprocess.run(
        [lenbench, "-m", *sweep, *launcher, *paths], capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"the sweep failed ({' '.join(launcher) or 'basic'}):\n{done.stderr[-2000:]}")
    import pyarrow.parquet as pq

    rows = sum(pq.read_metadata(f).num_rows for f in (root / "results").rglob("*.parquet"))
    return seconds, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="joblib workers (default 2)")
    parser.add_argument("sweep", nargs="*", help="the sweep's overrides (after --)")
    args = parser.parse_args()
    sweep = args.sweep or DEFAULT_SWEEP
    lenbench = shutil.which("lenbench") or sys.exit("lenbench is not installed (pip install -e .)")
    settings = {
        "one job at a time (basic launcher)": [],
        f"{args.jobs} jobs at once (joblib)": [
            "hydra/launcher=joblib",
            f"hydra.launcher.n_jobs={args.jobs}",
        ],
    }
    measured = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, launcher in settings.items():
            root = Path(tmp) / str(len(measured))
            measured[label] = run_sweep(lenbench, sweep, launcher, root)
    rows = {n for _, n in measured.values()}
    if len(rows) != 1:
        sys.exit(f"the two sweeps wrote different numbers of rows: {measured}")
    from bench.core.runtime import machine_line, machine_summary

    machine = machine_summary()
    (basic, _), (parallel, _) = measured.values()
    print(f"machine: {machine_line(machine)} ({os.cpu_count()} cores)")
    print(f"sweep: lenbench -m {' '.join(sweep)}")
    for label, (seconds, n) in measured.items():
        print(f"{label:40s} {seconds:8.1f} s  ({n} rows)")
    print(f"speedup: {basic / parallel:.2f}x")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "parallel_jobs.json"
    payload = {
        "machine": machine,
        "sweep": sweep,
        "seconds": {k: v[0] for k, v in measured.items()},
    }
    out.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
