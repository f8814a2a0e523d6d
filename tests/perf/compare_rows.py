"""Do two ways of running an experiment give the same result rows?

Runs ``lenbench`` twice, each in a fresh results/cache/reports directory, and compares the rows
cell by cell (bench.core.results.CELL_COLUMNS minus the ids that name code or run): the largest
absolute and relative difference of ``value`` (and of the CIs), per metric. Side A is this
checkout with ``--a`` overrides, or the code of git ref ``--ref`` (a temporary worktree) with
the same overrides; side B is this checkout with ``--b`` overrides. Exit status 1 if a value
differs by more than ``--atol`` + ``--rtol`` * |value|, or if the two sides measured different
cells. Examples::

    python tests/perf/compare_rows.py --common "+experiment=smoke" --b "train.compile=true"
    python tests/perf/compare_rows.py --common "+experiment=smoke" --ref HEAD~3
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

# Identity columns that differ between two runs of the same measurement by construction.
IGNORED = {"run_id", "model_id", "parent_model_id", "code_version", "written_at"}


def run_side(code_dir: Path, work: Path, overrides: list[str], threads: int) -> pd.DataFrame:
    command = [
        sys.executable,
        "-c",
        "import sys; from bench.cli import main; sys.exit(main(sys.argv[1:]))",
        *overrides,
        f"threads={threads}",
        f"paths.results={work / 'results'}",
        f"paths.reports={work / 'reports'}",
        f"paths.cache={work / 'cache'}",
        f"hydra.sweep.dir={work / 'multirun'}",
        f"hydra.run.dir={work / 'run'}",
    ]
    print(f"[{work.name}] {shlex.join(command[3:])} (code: {code_dir})", flush=True)
    subprocess.run(command, cwd=code_dir, check=True, stdout=subprocess.DEVNULL)
    files = sorted((work / "results").rglob("*.parquet"))
    if not files:
        sys.exit(f"side {work.name} wrote no result rows")
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def compare(a: pd.DataFrame, b: pd.DataFrame, atol: float, rtol: float) -> int:
    from bench.core.results import CELL_COLUMNS

    keys = [c for c in CELL_COLUMNS if c not in IGNORED and c in a.columns and c in b.columns]
    merged = a.merge(b, on=keys, how="outer", suffixes=("_a", "_b"), indicator=True)
    only = merged[merged["_merge"] != "both"]
    both = merged[merged["_merge"] == "both"].copy()
    status = 0
    if len(only):
        status = 1
        print(f"{len(only)} cells measured by one side only, e.g.:")
        print(only[[*keys[:8], "_merge"]].head(10).to_string())
    both["abs_diff"] = (both["value_a"] - both["value_b"]).abs()
    both["rel_diff"] = both["abs_diff"] / both["value_a"].abs().clip(lower=1e-12)
    both["bad"] = both["abs_diff"] > atol + rtol * both["value_a"].abs()
    nan_a, nan_b = both["value_a"].isna(), both["value_b"].isna()
    both.loc[nan_a & nan_b, ["abs_diff", "rel_diff", "bad"]] = [0.0, 0.0, False]
    both.loc[nan_a ^ nan_b, "bad"] = True
    table = both.groupby("metric").agg(
        cells=("value_a", "size"),
        identical=("abs_diff", lambda d: int((d == 0).sum())),
        max_abs_diff=("abs_diff", "max"),
        max_rel_diff=("rel_diff", "max"),
        over_tolerance=("bad", "sum"),
    )
    for side in ("a", "b"):
        if f"ci_lo_{side}" in both:
            both[f"ci_{side}"] = both[f"ci_hi_{side}"] - both[f"ci_lo_{side}"]
    if "ci_a" in both:
        ci_diff = (both["ci_a"] - both["ci_b"]).abs()
        table["max_ci_width_diff"] = ci_diff.groupby(both["metric"]).max()
    print(table.to_string())
    print(
        f"{len(both)} common cells: {int((both['abs_diff'] == 0).sum())} identical, "
        f"max |diff| {np.nanmax(both['abs_diff']):.3g}, {int(both['bad'].sum())} over the "
        f"tolerance (atol {atol:g} + rtol {rtol:g} * |value|)"
    )
    return 1 if status or both["bad"].any() else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--common", default="+experiment=smoke", help="overrides of both sides")
    parser.add_argument("--a", default="", help="overrides of side A")
    parser.add_argument("--b", default="", help="overrides of side B")
    parser.add_argument("--ref", default=None, help="git ref whose code runs side A")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of both sides")
    parser.add_argument("--atol", type=float, default=1e-4)
    parser.add_argument("--rtol", type=float, default=1e-4)
    args = parser.parse_args()
    repo = Path.cwd()
    common = shlex.split(args.common)
    with tempfile.TemporaryDirectory(prefix="compare_rows_") as tmp:
        tmp_path = Path(tmp)
        code_a = repo
        if args.ref:
            code_a = tmp_path / "ref"
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(code_a), args.ref], check=True
            )
        try:
            a = run_side(code_a, tmp_path / "a", [*common, *shlex.split(args.a)], args.threads)
            b = run_side(repo, tmp_path / "b", [*common, *shlex.split(args.b)], args.threads)
        finally:
            if args.ref:
                subprocess.run(["git", "worktree", "remove", "--force", str(code_a)], check=False)
        sys.exit(compare(a, b, args.atol, args.rtol))


if __name__ == "__main__":
    main()
