"""Sharded evaluation: one job's work split over N independent processes, then merged.

The work of a job is a list of **units** (:func:`bench.eval.evaluate.shard_plan`, in run order):
at each eval length, each enabled metric is one unit, except a metric that splits
(``bench.eval.metrics.registry.Split``: nll by its windows of consecutive documents, passkey and
RULER by their trials), which gives one unit per forward batch of its items. A unit's estimated
cost is its items times the length squared: a long evaluation, the one worth splitting, is
attention-bound (at 32K tokens a 135M model's attention costs about 10x its MLP per token), and
at short lengths the estimate only moves cheap units. ``eval.shard=i/N`` measures shard ``i``'s
units, dealt out by cost (:func:`assign`: the costliest unit first, each to the least-loaded
shard), and writes their rows to ``<results>/<experiment>/.shards/<run_id>/<i>-of-<N>.parquet``,
a folder that reports do not read; ``eval.shard=plan/N`` prints the plan and measures nothing.
Everything else is the unsharded job's: the model (trained once, through the shared cache), the
run's scaling factor and document set (both fixed by the whole job's lengths), the run id.

A split unit writes what its items measured (``PAYLOAD_COLUMN``: per-token NLL of its windows,
verdicts of its trials) instead of rows; the merge gives every part's payload, in order, to the
metric's ``combine``, which is what the unsharded metric runs on the same batches, so the merged
rows are the unsharded ones, byte for byte. The same command without ``eval.shard`` merges: it
checks that the N files are there, once each, of one N and one plan, that every unit of the plan
is in exactly one of them, adds the rows a metric computes from all its lengths (the effective
lengths of RULER and passkey), writes ``<run_id>.parquet`` as the unsharded job would and
removes the shards. A missing, duplicated or unreadable shard or unit is one sentence, and
nothing is merged. A shard is the unit of resumption: a shard killed mid-way computes its units
again when rerun (its model comes from the cache); the shards already written are kept.

Shard files carry private columns that the merged file drops: ``_metric`` (the registered metric
that wrote the row), ``_identity`` (the job's identity columns as JSON, given to the rows the
merge adds), and on the bookkeeping rows (metric ``_plan``: the plan's unit keys, one row per
shard; ``_unit``: one row per unit measured) ``_unit``, ``_plan`` and ``_payload``.
"""

from __future__ import annotations

import heapq
import io
import json
import math
import re
import shutil
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "IDENTITY_COLUMN",
    "METRIC_COLUMN",
    "PAYLOAD_COLUMN",
    "PLAN_COLUMN",
    "PLAN_METRIC",
    "SHARD_DIR",
    "UNIT_COLUMN",
    "UNIT_METRIC",
    "Shard",
    "Unit",
    "assign",
    "decode_payload",
    "encode_payload",
    "merge_shards",
    "parse_shard",
    "plan_text",
    "shard_dir",
    "shard_path",
]

SHARD_DIR = ".shards"
METRIC_COLUMN = "_metric"
IDENTITY_COLUMN = "_identity"
UNIT_COLUMN = "_unit"  # a bookkeeping row's unit key
PLAN_COLUMN = "_plan"  # the plan row's unit keys (JSON list, run order)
PAYLOAD_COLUMN = "_payload"  # a split unit's measured items (encode_payload)
PLAN_METRIC, UNIT_METRIC = "_plan", "_unit"  # the bookkeeping rows' metric names
_PRIVATE = (METRIC_COLUMN, IDENTITY_COLUMN, UNIT_COLUMN, PLAN_COLUMN, PAYLOAD_COLUMN)
_NAME = re.compile(r"^(\d+)-of-(\d+)\.parquet$")


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (0-based) of ``count``; ``index`` None: print the plan only (plan/N)."""

    index: int | None
    count: int

    @property
    def plan_only(self) -> bool:
        return self.index is None

    def __str__(self) -> str:
        return f"{'plan' if self.index is None else self.index}/{self.count}"


def parse_shard(value: Any) -> Shard | None:
    """``eval.shard``: null, "plan/N", or "i/N" with integers 0 <= i < N (one sentence otherwise)."""
    if value is None:
        return None
    pattern = r"\s*(\d+|plan)\s*/\s*(\d+)\s*"
    match = re.fullmatch(pattern, value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(
            f"eval.shard must be 'i/N' (shard i of N, 0 <= i < N), 'plan/N' (print the plan of N "
            f"shards) or null, got {value!r}."
        )
    index = None if match.group(1) == "plan" else int(match.group(1))
    count = int(match.group(2))
    if count < 1 or (index is not None and index >= count):
        raise ValueError(
            f"eval.shard {value!r} names shard {match.group(1)} of {count}; allowed: 0 <= i < N "
            "with N >= 1 (shards are numbered from 0)."
        )
    return Shard(index, count)


@dataclass(frozen=True)
class Unit:
    """One piece of a job's work: ``metric`` at eval length ``length``, part ``part`` of
    ``parts`` (a metric that does not split is part 0 of 1), holding ``items`` windows or trials
    (for a metric that does not split: its documents, an estimate); ``cost`` is estimated as
    items x length^2 (module doc)."""

    length: int
    metric: str
    part: int
    parts: int
    items: int

    @property
    def cost(self) -> float:
        return float(max(self.items, 1)) * float(self.length) ** 2

    @property
    def key(self) -> str:
        return f"{self.metric}@{self.length}#{self.part}/{self.parts}"


def assign(units: Sequence[Unit], count: int) -> list[list[Unit]]:
    """The units of each of ``count`` shards: the costliest unit first, each to the shard with
    the least cost so far (the lowest index on a tie); each shard's units in plan order. The
    longest-processing-time rule: no shard ends more than the largest unit above the mean."""
    heap = [(0.0, i) for i in range(count)]
    owner: dict[int, int] = {}
    for u in sorted(range(len(units)), key=lambda u: -units[u].cost):  # a stable sort
        load, shard = heapq.heappop(heap)
        owner[u] = shard
        heapq.heappush(heap, (load + units[u].cost, shard))
    return [[units[u] for u in range(len(units)) if owner[u] == s] for s in range(count)]


def plan_text(units: Sequence[Unit], count: int) -> str:
    """The plan of ``count`` shards as lines a user reads before running them."""
    total = sum(u.cost for u in units) or 1.0
    lines = [
        f"{len(units)} units, estimated cost = items x length^2 (the whole job = 100%); "
        f"run each line's shard with eval.shard=i/{count}, then the same command without it:"
    ]
    for i, own in enumerate(assign(units, count)):
        share = 100.0 * sum(u.cost for u in own) / total
        keys = ", ".join(f"{u.key} ({u.items})" for u in own) or "nothing"
        lines.append(f"  shard {i}/{count}: {share:5.1f}%  {len(own)} units: {keys}")
    return "\n".join(lines)


def encode_payload(arrays: dict[str, Any] | None) -> bytes:
    """A split unit's measured items as bytes (numpy's npz, no pickles); None (nothing measured,
    e.g. a length the model cannot embed) as no bytes."""
    if arrays is None:
        return b""
    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, **{k: np.asarray(v) for k, v in arrays.items()})
    return buffer.getvalue()


def decode_payload(data: bytes | None) -> dict[str, Any] | None:
    if not data:
        return None
    import numpy as np

    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


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
    results_dir: Path, run_id: str, metrics: dict[str, Any], unreadable: Any
) -> list[dict[str, Any]] | None:
    """The job's full rows from its shards, or None when it has none.

    ``metrics``: metric name -> (its resolved section, its ``finish`` or None, its
    ``combine(section, length, payloads)`` or None), in run order; ``unreadable(path, run_id)``
    says why a result file is not this job's finished rows (None if it is). Raises ValueError
    (one sentence) for a missing, duplicated or unreadable shard, or a unit of the plan that is
    in no shard or in two.
    """
    directory = shard_dir(results_dir, run_id)
    present = _present(directory) if directory.is_dir() else {}
    if not present:
        return None
    count = _one_count(present, run_id, directory)
    import pyarrow.parquet as pq

    by_shard: dict[int, list[dict[str, Any]]] = {}
    for (index, _), path in sorted(present.items()):
        problem = unreadable(path, run_id)
        if problem is not None:
            raise ValueError(
                f"shard {index}/{count} of run {run_id} ({path}) {problem}; delete it and run "
                f"eval.shard={index}/{count} again."
            )
        by_shard[index] = pq.read_table(path).to_pylist()
    payloads = _check_units(by_shard, run_id, count)
    identity = json.loads(by_shard[0][0][IDENTITY_COLUMN])
    cells: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for rows in by_shard.values():  # whole units' rows: each (length, metric) in one shard
        for row in rows:
            if row["metric"] not in (PLAN_METRIC, UNIT_METRIC):
                cells.setdefault((row["eval_length"], row[METRIC_COLUMN]), []).append(row)
    merged: list[dict[str, Any]] = []
    by_metric: dict[str, list[dict[str, Any]]] = {name: [] for name in metrics}
    for length in sorted({length for length, _ in payloads} | {length for length, _ in cells}):
        for name, (section, _, combine) in metrics.items():  # the unsharded job's row order
            rows = [_measured(row) for row in cells.get((length, name), [])]
            parts = payloads.get((length, name))
            if combine is not None and parts and any(p is not None for p in parts):
                rows += [{**row, **identity} for row in combine(section, length, parts)]
            by_metric[name] += rows
            merged += rows
    for name, (section, finish, _) in metrics.items():
        if finish is not None and section.enabled:
            merged += [{**row, **identity} for row in finish(section, by_metric[name])]
    return merged


def _one_count(present: dict[tuple[int, int], Path], run_id: str, directory: Path) -> int:
    """The shard count N of the folder, once every shard 0..N-1 is there (else one sentence)."""
    counts = sorted({count for _, count in present})
    if len(counts) > 1:
        names = ", ".join(p.name for p in present.values())
        raise ValueError(
            f"the shards of run {run_id} in {directory} were made with different shard counts "
            f"({names}), so some units would be merged twice; keep the files of one N and "
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
    return count


def _check_units(
    by_shard: dict[int, list[dict[str, Any]]], run_id: str, count: int
) -> dict[tuple[int, str], list[dict[str, Any] | None]]:
    """Every unit of the shards' one plan measured by exactly one shard (else one sentence);
    returns the split units' payloads by (length, metric), in part order."""
    plans = {
        index: next((r[PLAN_COLUMN] for r in rows if r["metric"] == PLAN_METRIC), None)
        for index, rows in by_shard.items()
    }
    if None in plans.values() or len(set(plans.values())) != 1:
        raise ValueError(
            f"the shards of run {run_id} were not made from one plan of its units (shard(s) "
            f"{', '.join(f'{i}/{count}' for i in plans if plans[i] != plans[0])} differ from "
            f"shard 0/{count}, or carry none); delete the shards and run them again."
        )
    plan = json.loads(plans[0])
    done = Counter(
        row[UNIT_COLUMN]
        for rows in by_shard.values()
        for row in rows
        if row["metric"] == UNIT_METRIC
    )
    twice = [key for key, n in done.items() if n > 1]
    missing = [key for key in plan if key not in done]
    stray = [key for key in done if key not in plan]
    if twice or missing or stray:
        what = (f"unit(s) {', '.join(twice)} measured by two shards" if twice else
                f"unit(s) {', '.join(missing)} measured by no shard" if missing else
                f"unit(s) {', '.join(stray)} not in the plan")  # fmt: skip
        raise ValueError(
            f"the shards of run {run_id} do not cover its plan of {len(plan)} units once each: "
            f"{what}; delete the shards and run them again."
        )
    payloads: dict[tuple[int, str], dict[int, Any]] = {}
    for rows in by_shard.values():
        for row in rows:
            if row["metric"] == UNIT_METRIC and row.get(PAYLOAD_COLUMN) is not None:
                part = int(row[UNIT_COLUMN].rsplit("#", 1)[1].split("/")[0])
                cell = payloads.setdefault((row["eval_length"], row[METRIC_COLUMN]), {})
                cell[part] = decode_payload(row[PAYLOAD_COLUMN])
    return {cell: [parts[p] for p in sorted(parts)] for cell, parts in payloads.items()}


def _measured(row: dict[str, Any]) -> dict[str, Any]:
    """A shard row as the job wrote it: without the private columns and the empty ones that a
    table's common schema added (None, or NaN in a float column)."""
    return {
        key: value
        for key, value in row.items()
        if key not in _PRIVATE
        and value is not None
        and not (isinstance(value, float) and math.isnan(value))
    }


def remove_shards(results_dir: Path, run_id: str) -> None:
    """Delete a run's shards once its merged file is written (it holds every row of them)."""
    shutil.rmtree(shard_dir(results_dir, run_id), ignore_errors=True)
    parent = Path(results_dir) / SHARD_DIR
    if parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()
