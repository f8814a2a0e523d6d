"""Re-derive the rows a run computes from its own stored rows, under the current code.

Some rows are pure functions of other rows of the same run: the ``effective_length`` rows of the
RULER-style tasks (``bench.eval.metrics.ruler.effective_length_rows``) read only that run's task
scores. When their rule changes, stored results need not be recomputed from the models:

    python -m bench.eval.rederive results/ruler [results/ruler_finetune_long ...]

replaces each run's ``effective_length`` rows (per ``run_id`` and ``model_id``: a recovery curve
stores one evaluation per update count) by those the current rule gives from its task rows with
the metric's default settings (``eval.ruler``: relative threshold 0.85 of the score at the
training length), each new row taking its identity columns from the run's own rows. Files are
rewritten atomically; every other row is left as it was.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from bench.core.results import read_result_table, write_results
from bench.core.rows import normalize_results
from bench.eval.metrics.ruler import RulerConfig, effective_length_rows

#: columns a derived row takes from its own make_row (everything else: from the run's rows)
DERIVED = ("metric", "value", "n", "eval_length", "axis", "axis_value", "task", "task_params",
           "ci_lo", "ci_hi", "bucket_lo", "bucket_hi", "layer")  # fmt: skip


def rederived_effective_lengths(
    frame: pd.DataFrame, cfg: RulerConfig | None = None
) -> pd.DataFrame:
    """``frame`` with every run's ``effective_length`` rows replaced by the current rule's,
    computed from that run's task score rows (``cfg``: the ruler settings, default ones)."""
    cfg = cfg or RulerConfig(enabled=True)
    if "task" not in frame.columns:
        return frame
    is_task = frame["task"].notna() & (frame["metric"] != "effective_length")
    keep = frame[frame["metric"] != "effective_length"]
    derived = []
    for _, run in frame[is_task].groupby(["run_id", "model_id"], sort=True):
        run_cfg = cfg.resolve(int(run["train_length"].iloc[0]), sorted(run["eval_length"].unique()))
        identity = run.iloc[0].drop(labels=[c for c in DERIVED if c in run.columns])
        for row in effective_length_rows(run.to_dict("records"), run_cfg):
            derived.append({**identity.to_dict(), **row})
    if not derived:
        return keep
    return normalize_results(pd.concat([keep, pd.DataFrame(derived)], ignore_index=True))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.eval.rederive",
        description="Re-derive the effective_length rows of stored RULER results in place.",
    )
    parser.add_argument("results", nargs="+", type=Path, help="result directories or files")
    args = parser.parse_args(argv)
    files = []
    for path in args.results:
        if not path.exists():
            parser.error(f"no such results path: {path}.")
        found = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
        if not found:  # e.g. the results root, whose files are one folder down
            parser.error(
                f"{path} holds no result file (*.parquet); allowed: an experiment's folder "
                "(results/<experiment>) or result files."
            )
        files += found
    changed = 0
    for file in files:
        frame = read_result_table(file).to_pandas()
        new = rederived_effective_lengths(frame)
        if new is frame:
            continue
        write_results(new, file)
        changed += 1
    print(f"re-derived effective_length rows in {changed} of {len(files)} file(s).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
