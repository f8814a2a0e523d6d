"""Sharded evaluation: one job's eval lengths split over N independent processes, then merged.

``eval.shard=i/N`` evaluates the job's ``i``-th share of its eval lengths (every N-th, starting
at the i-th: lengths[i::N], so long and short lengths spread over the shards) and writes its rows
to ``<results>/<experiment>/.shards/<run_id>/<i>-of-<N>.parquet``, a folder that reports do not
read. Everything else is the unsharded job's: the model (trained once, through the shared cache),
the run's scaling factor and the document set (both fixed by the longest eval length of the whole
job), the run id. The same command without ``eval.shard`` then merges: it checks that the N files
are there, once each, of one N, adds the rows a metric computes from all its lengths (the
effective lengths of RULER and passkey), writes ``<run_id>.parquet`` as the unsharded job would
and removes the shards. A missing, duplicated or unreadable shard is one sentence, and nothing is
merged. A shard is the unit of resumption: a shard killed mid-way computes its share again when
rerun (its model comes from the cache); the shards already written are kept.

Shard files carry two private columns that the merged file drops: ``_metric`` (the registered
metric that wrote the row, whose ``finish`` the merge calls) and ``_identity`` (the job's identity
columns as JSON, given to the rows the merge adds).
"""

from __future__ import annotations

import json
import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "IDENTITY_COLUMN",
    "METRIC_COLUMN",
    "SHARD_DIR",
    "Shard",
    "merge_shards",
    "parse_shard",
    "shard_dir",
    "shard_path",
]

SHARD_DIR = ".shards"
METRIC_COLUMN = "_metric"
IDENTITY_COLUMN = "_identity"
_NAME = re.compile(r"^(\d+)-of-(\d+)\.parquet$")


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (0-based) of ``count``."""

    index: int
    count: int

    def lengths(self, lengths: list[int]) -> list[int]:
        """This shard's eval lengths: every count-th, from the index-th."""
        return list(lengths)[self.index :: self.count]

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(value: Any) -> Shard | None:
    """``eval.shard``: null, or "i/N" with integers 0 <= i < N (one sentence otherwise)."""
    if value is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(value)) if isinstance(value, str) else None
    if match is None:
        raise ValueError(
            f"eval.shard must be 'i/N' (shard i of N, 0 <= i < N) or null, got {value!r}."
        )
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or index >= count:
        raise ValueError(
            f"eval.shard {value!r} names shard {index} of {count}; allowed: 0 <= i < N with N >= 1."
        )
    return Shard(index, count)


def shard_dir(results_dir: Path, run_id: str) -> Path:
    return Path(results_dir) / SHARD_DIR / run_id


def shard_path(results_dir: Path, run_id: str, shard: Shard) -> Path:
    return shard_dir(results_dir, run_id) / f"{shard.index}-of-{shard.count}.parquet"


def _present(directory: Path) -> dict[tuple[int, int], Path]:
    """(i, N) -> the shard file. Every file of the folder is a shard named as
    :func:`shard_path` names it: the merge deletes the folder, so nothing else may hide there, and
    ``01-of-2`` beside ``1-of-2`` would be a second file of one shard."""
    found: dict[tuple[int, int], Path] = {}
    for path in sorted(directory.iterdir()):
        match = _NAME.match(path.name)
        if match is None or path.name != f"{int(match.group(1))}-of-{int(match.group(2))}.parquet":
            raise ValueError(
                f"{path} is not a shard file of this folder (allowed names: i-of-N.parquet, as "
                "eval.shard=i/N writes them); move it out, then merge again."
            )
        found[(int(match.group(1)), int(match.group(2)))] = path
    return found


def merge_shards(
    results_dir: Path, run_id: str, finishers: dict[str, Any], unreadable: Any
) -> list[dict[str, Any]] | None:
    """The job's full rows from its shards, or None when it has none.

    ``finishers``: metric name -> (its resolved section, its ``finish`` function or None);
    ``unreadable(path, run_id)`` says why a result file is not this job's finished rows (None if
    it is). Raises ValueError (one sentence) for a missing, duplicated or unreadable shard.
    """
    directory = shard_dir(results_dir, run_id)
    present = _present(directory) if directory.is_dir() else {}
    if not present:
        return None
    counts = sorted({count for _, count in present})
    if len(counts) > 1:
        names = ", ".join(p.name for p in present.values())
        raise ValueError(
            f"the shards of run {run_id} in {directory} were made with different shard counts "
            f"({names}), so some lengths would be merged twice; keep the files of one N and "
            "delete the others."
        )
    count = counts[0]
    missing = [f"{i}/{count}" for i in range(count) if (i, count) not in present]
    if missing:
        raise ValueError(
            f"run {run_id} has {len(present)} of its {count} shards in {directory}: "
            f"eval.shard={', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing; "
            "run them with the same command, then merge again."
        )
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    seen: dict[tuple[Any, ...], str] = {}
    for (index, _), path in sorted(present.items()):
        problem = unreadable(path, run_id)
        if problem is not None:
            raise ValueError(
                f"shard {index}/{count} of run {run_id} ({path}) {problem}; delete it and run "
                f"eval.shard={index}/{count} again."
            )
        for row in pq.read_table(path).to_pylist():
            key = (row.get(METRIC_COLUMN), row.get("eval_length"))
            if key in seen and seen[key] != path.name:
                raise ValueError(
                    f"eval length {key[1]} of metric {key[0]} is in two shards of run {run_id} "
                    f"({seen[key]} and {path.name}); delete the shards and run them again."
                )
            seen[key] = path.name
            rows.append(row)
    identity = json.loads(rows[0][IDENTITY_COLUMN])
    order = {name: i for i, name in enumerate(finishers)}  # the unsharded job's row order:
    rows.sort(key=lambda row: (row["eval_length"], order.get(row.get(METRIC_COLUMN), len(order))))
    merged = [_measured(row) for row in rows]  # by length, then metric (a stable sort)
    for name, (section, finish) in finishers.items():
        if finish is None or not section.enabled:
            continue
        inputs = [_measured(row) for row in rows if row.get(METRIC_COLUMN) == name]
        merged += [{**row, **identity} for row in finish(section, inputs)]
    return merged


def _measured(row: dict[str, Any]) -> dict[str, Any]:
    """A shard row as the job wrote it: without the private columns and the empty ones that a
    table's common schema added (None, or NaN in a float column)."""
    return {
        key: value
        for key, value in row.items()
        if key not in (METRIC_COLUMN, IDENTITY_COLUMN)
        and value is not None
        and not (isinstance(value, float) and math.isnan(value))
    }


def remove_shards(results_dir: Path, run_id: str) -> None:
    """Delete a run's shards once its merged file is written (it holds every row of them)."""
    shutil.rmtree(shard_dir(results_dir, run_id), ignore_errors=True)
    parent = Path(results_dir) / SHARD_DIR
    if parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()
