"""How long ``lenbench`` takes to answer a bad setting and ``--help`` (issue 51: at most 3 s on a
2-core machine), beside the import cost the config check path avoids (torch, pandas, scipy).

Each case is a fresh ``lenbench`` process (the console script), timed ``--repeats`` times after one
warm-up run (so the file cache is warm, as for a user's second try); the table gives the median and
the slowest wall time, and writes results/perf/fast_errors.json (figures: tests/perf/README.md)::

    python tests/perf/fast_errors.py
    python tests/perf/fast_errors.py --repeats 10
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
#: (label, argv): one bad setting per check stage, a sweep, and --help
CASES = [
    ("unknown option (composition)", ["position=bogus"]),
    ("out-of-range value (schema)", ["train.lr=-1"]),
    ("another family's field (schema)", ["position=kerple_log", "position.layout=bogus"]),
    ("switches that do not combine", ["position=cope", "model.attention_sink=learned"]),
    ("scaling that does not apply (job check)", ["position=alibi", "scaling=yarn"]),
    ("RULER tasks that fit no length", ["+experiment=smoke", "eval.ruler.enabled=true"]),
    ("sweep, every cell invalid", ["-m", "position=rope,alibi", "train.lr=-1"]),
    (
        "scaling parameter at the model's geometry (loads torch)",
        ["scaling=yarn", "scaling.params.beta_fast=-1"],
    ),
    ("--help", ["--help"]),
]
#: the imports the config check path avoids, timed alone for comparison
REFERENCE = ("import torch", "import torch, pandas, scipy.stats")


def timed(argv: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    return time.perf_counter() - start, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    lenbench = shutil.which("lenbench") or sys.exit("lenbench is not installed (pip install -e .)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = [f"paths.results={tmp}/results", f"paths.cache={tmp}/cache"]
        runs = [
            (label, [lenbench, *argv, *([] if argv == ["--help"] else paths)])
            for label, argv in CASES
        ]
        runs += [(f"python -c '{code}'", [sys.executable, "-c", code]) for code in REFERENCE]
        for label, argv in runs:
            timed(argv)  # warm-up
            times, codes = zip(*(timed(argv) for _ in range(args.repeats)), strict=True)
            rows.append(
                {
                    "case": label,
                    "median_s": statistics.median(times),
                    "max_s": max(times),
                    "exit": sorted(set(codes)),
                }
            )
    from bench.core.runtime import machine_line, machine_summary

    machine = machine_summary()
    print(f"machine: {machine_line(machine)}")
    print(f"{'case':58s} {'median s':>9s} {'max s':>7s}  exit")
    for row in rows:
        print(f"{row['case']:58s} {row['median_s']:9.2f} {row['max_s']:7.2f}  {row['exit']}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "fast_errors.json"
    out.write_text(
        json.dumps({"machine": machine, "repeats": args.repeats, "rows": rows}, indent=1) + "\n"
    )
    print(f"written: {out}")


if __name__ == "__main__":
    main()
