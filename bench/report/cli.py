"""``lenbench-report [RESULTS_DIR ...] [--out DIR] [--check] [--leaderboard]``: arguments, default
paths, one-line errors.

``--leaderboard`` writes the leaderboard of the given rows instead (``reports/leaderboard/`` by
default: report.md, heatmaps, index.html; :mod:`bench.report.leaderboard_report`).

With no RESULTS_DIR it reports on the most recently modified experiment under ``results/`` and
writes to ``reports/<experiment>/``. ``--check`` writes nothing: it prints the findings table
(:mod:`bench.findings`) and exits 1 if a measured finding does not hold, 3 if no finding could
be checked at all (every one not measured: nothing was checked, which is not a success), else 0.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from bench.core.results import load_results
from bench.findings import NOT_MEASURED, any_failed, check_findings, findings_table
from bench.report.markdown import markdown_table
from bench.report.render import render
from models.discovery import load_extensions

#: ``--check``'s exit status when no finding could be measured (1 = a finding does not hold).
NOTHING_CHECKED = 3


def latest_experiment_dir(results_root: str | Path = "results") -> Path:
    """The experiment directory under ``results_root`` holding the most recently modified
    result file (or, failing that, the most recently modified directory)."""
    root = Path(results_root)
    if not root.is_dir():
        raise ValueError(
            f"results directory {str(root)!r} does not exist (working directory {os.getcwd()!r}); "
            "pass RESULTS_DIR explicitly"
        )
    best: tuple[float, str] | None = None
    best_dir: Path | None = None
    for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        files = [f for f in d.rglob("*.parquet") if not f.name.startswith(".")]
        if not files:
            continue
        mtime = max([d.stat().st_mtime, *(f.stat().st_mtime for f in files)])
        if best is None or (mtime, d.name) > best:
            best, best_dir = (mtime, d.name), d
    if best_dir is None:
        raise ValueError(
            f"no experiment directory with .parquet results under {str(root)!r}; pass RESULTS_DIR explicitly"
        )
    return best_dir


def _experiment_name(df: pd.DataFrame) -> str:
    names = sorted(df["experiment"].unique())
    name = names[0] if len(names) == 1 else "+".join(names)
    return name.replace(os.sep, "_").replace("/", "_") or "report"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lenbench-report",
        description="Regenerate tables, plots and report.md from stored lenbench result tables.",
    )
    parser.add_argument(
        "results",
        nargs="*",
        metavar="RESULTS_DIR",
        help="result directories (searched recursively for *.parquet) or parquet files; default: "
        "the most recently modified experiment directory under --results-root",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="output directory (default: reports/<experiment>)"
    )
    parser.add_argument(
        "--results-root",
        type=Path,
        default=Path("results"),
        help="where to look for the default (default: results)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; print the findings table and exit 1 if a measured finding does not "
        f"hold, {NOTHING_CHECKED} if no finding could be measured, else 0",
    )
    parser.add_argument(
        "--leaderboard",
        action="store_true",
        help="write the leaderboard of these rows (every series ranked per recipe; default --out "
        "reports/leaderboard) instead of a study report",
    )
    parser.add_argument(
        "--readme",
        type=Path,
        default=None,
        metavar="PATH",
        help="with --leaderboard: also rewrite the leaderboard block of this README",
    )
    parser.add_argument(
        "--extension",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module or package of your own to import first (its findings, metrics); repeatable, "
        "as the run's extensions: [...]",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``lenbench-report [RESULTS_DIR ...] [--out DIR] [--check] [--leaderboard
    [--readme PATH]] [--extension M]``."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.check and args.leaderboard:
        parser.error("--leaderboard writes a page and --check writes nothing; choose one.")
    if args.readme is not None and not args.leaderboard:
        parser.error(f"--readme {str(args.readme)!r} is written by --leaderboard only; add it.")
    if args.check and args.out is not None:
        parser.error(
            f"--out {str(args.out)!r} has no use with --check, which writes nothing; run "
            "lenbench-report --out DIR for the report, and --check alone for the findings' verdict."
        )
    try:
        if args.readme is not None:  # before anything is written
            from bench.report.leaderboard_readme import readme_text

            readme_text(args.readme)
        load_extensions(args.extension)
        paths: list[str | Path] = list(args.results) or [latest_experiment_dir(args.results_root)]
        df = load_results(paths)
        if args.check:
            results = check_findings(df)
            print(markdown_table(findings_table(results)))
            if any_failed(results):
                return 1
            if not results:
                print("No registered finding is about these rows (none of their series here).")
            return NOTHING_CHECKED if all(r.status == NOT_MEASURED for r in results) else 0
        if args.leaderboard:
            from bench.report.leaderboard_report import write_leaderboard

            out = args.out if args.out is not None else Path("reports") / "leaderboard"
            sources = ", ".join(f"`{p}`" for p in paths)
            board = write_leaderboard(df, out, sources)
            if args.readme is not None:
                from bench.report.leaderboard_readme import readme_block, update_readme

                update_readme(args.readme, readme_block(board, out.as_posix()))
            report = out / "report.md"
        else:
            out = args.out if args.out is not None else Path("reports") / _experiment_name(df)
            report = render(df, paths, out)
    except ValueError as exc:
        parser.error(str(exc))
    except OSError as exc:  # an output directory that cannot be written, a full disk
        where = exc.filename or (args.out if args.out is not None else "reports/")
        parser.error(f"cannot write the report to {str(where)!r}: {exc.strerror or exc}.")
    print(f"wrote {report}")
    return 0
