"""Running lm-eval tasks on a lenbench model, and lm-eval's results as lenbench result rows.

The job runner calls both when ``eval.harness.tasks`` is set, so harness numbers land in the same
result tables as the native metrics.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from bench.harness.args import parse_scaling
from bench.harness.model import LenbenchLM
from bench.harness.tasks import TASKS_DIR, split_tasks, task_names, training_template
from models.transformer import DecoderLM


def run_harness(
    model_ref: Any,
    tasks: str | Sequence[str],
    *,
    scaling: Any = None,
    limit: int | float | None = None,
    batch_size: int | str = 8,
    cache_root: str | Path | None = None,
    device: str = "cpu",
    max_length: int | None = None,
    eval_length: int | None = None,
    metadata: Mapping | None = None,
    model_args: Mapping | None = None,
    log_samples: bool = False,
) -> dict:
    """Run lm-eval tasks on a lenbench checkpoint; returns lm-eval's results dict.

    ``model_ref``: a cache key, checkpoint path or DecoderLM; ``scaling``: as in
    :func:`parse_scaling` (None, a method name, a ScalingConfig or a mapping); ``metadata`` reaches
    every task's dataset builder (e.g. ``{"data": {...}}`` for the perplexity corpus);
    ``model_args`` are extra ``LenbenchLM`` arguments (``prefix_token``, ``precision``, ...).
    Uses ``bootstrap_iters=0`` (no stderr). lm-eval's own (slow to index) tasks are indexed only
    when a requested task is not one of ours.
    """
    import lm_eval
    from lm_eval.tasks import TaskManager

    names = split_tasks(tasks)
    if not names:
        raise ValueError(
            "run_harness needs at least one task name; ours: " + ", ".join(task_names()) + "."
        )
    scaling_cfg = parse_scaling(scaling)
    # a caller's own model gets its previous scaling back on exit
    restoring = (
        model_ref.scaled(scaling_cfg, eval_length or model_ref.train_length)
        if isinstance(model_ref, DecoderLM)
        else contextlib.nullcontext()
    )
    with restoring:
        lm = LenbenchLM(
            pretrained=model_ref,
            cache_root=None if cache_root is None else str(cache_root),
            scaling=scaling_cfg,
            eval_length=eval_length,
            max_length=max_length,
            batch_size=batch_size,
            device=device,
            **dict(model_args or {}),
        )
        metadata = dict(metadata or {})
        # passkey tasks use the template the checkpoint trained with, as the native metric does
        template = training_template(lm.meta)
        if template is not None:
            metadata.setdefault("template", template)
        task_manager = TaskManager(
            include_path=str(TASKS_DIR),
            include_defaults=not set(names) <= set(task_names()),
            metadata=OmegaConf.to_container(OmegaConf.create(metadata), resolve=True),
        )
        results = lm_eval.simple_evaluate(
            model=lm,
            tasks=names,
            limit=limit,
            bootstrap_iters=0,
            task_manager=task_manager,
            log_samples=log_samples,
        )
    if results is None:  # only a non-zero rank of a distributed run gets None
        return {}
    return dict(results)


_LENGTH_SUFFIX = re.compile(r"^lenbench_\w+?_(\d+)$")
#: A per-length metric of a task that spans lengths (``acc_1024``; ``n_1024`` counts its documents).
_PER_LENGTH = re.compile(r"^(\w+?)_(\d+)$")


def _task_length(task: str, config: Mapping | None) -> int | None:
    meta = (config or {}).get("metadata") or {}
    length = meta.get("length") if isinstance(meta, Mapping) else None
    if isinstance(length, (int, np.integer)) and not isinstance(length, bool):
        return int(length)
    match = _LENGTH_SUFFIX.match(task)
    return int(match.group(1)) if match else None


def harness_rows(results: Mapping) -> list[dict]:
    """lenbench result rows (measured part only) from lm-eval's results dict.

    One row per task (or group) and numeric metric: ``metric = "harness/<task>/<metric>"`` (a
    filter other than ``none`` is appended: ``.../<metric>/<filter>``), ``value``, ``n`` (documents
    evaluated; for a group the sum over its tasks), ``eval_length`` (the task's length for lenbench
    tasks, else None), and ``ci_lo``/``ci_hi`` (value -+ 1.96 stderr) when lm-eval computed a stderr.
    The job runner adds the identity columns, as for ``bench.eval.evaluate`` rows.
    """
    per_task = results.get("results") or {}
    n_samples = results.get("n-samples") or {}
    configs = results.get("configs") or {}
    group_subtasks = results.get("group_subtasks") or {}

    def count(task: str) -> int | None:
        info = n_samples.get(task)
        if isinstance(info, Mapping):
            return int(info.get("effective", info.get("original", 0)))
        subtasks = group_subtasks.get(task)
        if subtasks:
            counts = [count(t) for t in subtasks]
            return int(sum(c for c in counts if c is not None))
        return None

    def count_at(task: str, length: int) -> int | None:
        """Documents of ``task`` (summed over a group's tasks) scored at ``length``; None where
        the task does not count per length (then ``acc_<L>`` is not a per-length metric)."""
        value = (per_task.get(task) or {}).get(f"n_{length},none")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value)
        counts = [count_at(t, length) for t in group_subtasks.get(task) or ()]
        counts = [c for c in counts if c is not None]
        return int(sum(counts)) if counts else None

    rows = []
    for task, metrics in per_task.items():
        length = _task_length(task, configs.get(task))
        n = count(task)
        for key, value in metrics.items():
            if "," not in key or "_stderr," in key or key.startswith("n_"):
                continue
            if isinstance(value, bool) or not isinstance(
                value, (int, float, np.floating, np.integer)
            ):
                continue
            metric, _, filter_name = key.partition(",")
            row_length, row_n, base = length, n, metric
            per_length = _PER_LENGTH.match(metric)
            if per_length and count_at(task, int(per_length.group(2))) is not None:
                base, row_length = per_length.group(1), int(per_length.group(2))
                row_n = count_at(task, row_length)
            name = f"harness/{task}/{base}" + (
                f"/{filter_name}" if filter_name not in ("", "none") else ""
            )
            row = {"metric": name, "value": float(value), "n": row_n, "eval_length": row_length}
            stderr = metrics.get(f"{metric}_stderr,{filter_name}")
            if (
                isinstance(stderr, (int, float))
                and not isinstance(stderr, bool)
                and math.isfinite(stderr)
            ):
                row["ci_lo"] = float(value) - 1.96 * float(stderr)
                row["ci_hi"] = float(value) + 1.96 * float(stderr)
            rows.append(row)
    return rows
