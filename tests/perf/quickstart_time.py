"""The quickstart's wall time from an empty cache, beside the former preset, in one run (issue 53).

Runs the bare quickstart (``lenbench +experiment=quickstart``, as ``lenbench`` with no arguments
runs it) and the same sweep with the studies' arms (``arm=lm,retrieval``: 800 LM updates instead
of ``lm_quick``'s 500, a 500-update retrieval decay instead of 250), alternating ``--rounds`` times, each from its own empty cache, results and
sweep folder, nothing else changed; prints each wall time, the medians and the machine, and writes
results/perf/quickstart_time.json (figures: tests/perf/README.md)::

    python tests/perf/quickstart_time.py
    python tests/perf/quickstart_time.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path("results") / "perf"
PRESETS = {
    "quickstart (arm=lm_quick,retrieval_quick)": [],
    "former preset (arm=lm,retrieval)": ["hydra.sweeper.params.arm='lm,retrieval'"],
}


def run_once(lenbench: str, extra: list[str], root: Path) -> float:
    paths = [
        f"paths.cache={root}/cache",
        f"paths.results={root}/results",
        f"paths.reports={root}/reports",
        f"hydra.sweep.dir={root}/sweep",
    ]
    start = time.perf_counter()
    done = subprocess.run(
        [lenbench, "+experiment=quickstart", *extra, *paths], capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"the quickstart failed ({' '.join(extra)}):\n{done.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    lenbench = shutil.which("lenbench") or sys.exit("lenbench is not installed (pip install -e .)")
    times: dict[str, list[float]] = {label: [] for label in PRESETS}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for i, (label, extra) in enumerate(PRESETS.items()):
                seconds = run_once(lenbench, extra, Path(tmp) / f"{round_}-{i}")
                times[label].append(seconds)
                print(f"round {round_ + 1}: {label}: {seconds:.1f} s", flush=True)
    from bench.core.runtime import machine_line, machine_summary

    machine = machine_summary()
    print(f"machine: {machine_line(machine)}")
    for label, values in times.items():
        print(f"{label:40s} median {statistics.median(values):7.1f} s  ({len(values)} runs)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "quickstart_time.json"
    out.write_text(json.dumps({"machine": machine, "seconds": times}, indent=1) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
