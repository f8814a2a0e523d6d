"""The rows of one job (:func:`bench.job.run_job`): their identity (run id, scaling and code
version columns), the result file they go to, and the checked, atomic write; the job's summary
and the line naming the checkpoint keys a run's jobs read."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.core.checks import first_line
from bench.core.result_digest import digest_problem
from bench.core.results import write_results
from bench.core.rows import canonical_json, describe_row, non_finite_row
from bench.core.shards import IDENTITY_COLUMN, merge_shards, plan_text, remove_shards, shard_path
from models.scaling_config import ScalingConfig

log = logging.getLogger("lenbench")

__all__ = [
    "ROW_IDENTITY",
    "checkpoint_line",
    "code_version",
    "make_run_id",
    "results_target",
    "scaling_params_json",
    "shard_plan_summary",
    "shard_step",
    "summary",
    "unreadable_results",
    "write_job_rows",
]

_RUN_ID_CHARS = 16

# ``spec`` below is the job's ``bench.job.JobSpec`` (typed Any: bench.job imports this module).


def summary(status: str, message: str = "", **extra: Any) -> dict[str, Any]:
    """A job's summary: what :func:`bench.job.run_job` returns."""
    return {"status": status, "message": message, **extra}


def checkpoint_line(statuses: Sequence[dict[str, Any]]) -> str | None:
    """The checkpoint keys of the lenbench models the evaluated jobs read, as
    ``lenbench-harness --model lenbench`` takes them (``pretrained=<key>``, with their cache root),
    one per model in job order, labelled position (+ fine-tune); None without any."""
    keys: dict[tuple[str, str], str] = {}
    for st in statuses:
        key, root = st.get("checkpoint"), st.get("cache_root")
        if st.get("status") not in ("done", "cached") or not key or not root:
            continue
        extend = st.get("extend")
        label = str(st.get("position")) + (f"+{extend}" if extend not in (None, "none") else "")
        keys.setdefault((root, key), label)
    if not keys:
        return None
    roots = sorted({root for root, _ in keys})
    models = ", ".join(f"{label} {key}" for (_, key), label in keys.items())
    where = roots[0] if len(roots) == 1 else "<its cache root>"
    return (
        f"lenbench: checkpoint keys for lenbench-harness --model lenbench --model_args "
        f"pretrained=<key>,cache_root={where}: {models}."
    )


def code_version() -> str:
    """Package version + the models' code salt (the salt also enters every checkpoint key)."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        pkg = version("lenbench")
    except PackageNotFoundError:  # pragma: no cover - running from a plain checkout
        pkg = "0+unknown"
    salt = _code_salt()
    return f"{pkg}+{salt}" if salt else pkg


def _code_salt() -> str:
    for module in ("models", "bench.train.cache"):
        try:
            salt = getattr(__import__(module, fromlist=["CODE_SALT"]), "CODE_SALT", None)
        except ImportError:  # pragma: no cover
            salt = None
        if salt:
            return str(salt)
    return ""


def scaling_params_json(scaling: ScalingConfig) -> str:
    """The ``scaling_params`` column: method, parameters as applied (a run's factor as a number;
    "auto" only with ``"oracle": true``, the factor then being each eval length's own) and logn."""
    params = scaling.identity
    return canonical_json({**params, "oracle": True} if scaling.per_length else params)


def make_run_id(model_id: str, spec: Any) -> str:
    """Hash of everything that identifies the job's rows: weights, scaling, eval protocol,
    experiment and the study arm (two arms may hold the same model; each gets its own rows)."""
    job = spec.job
    identity = {
        "model_id": model_id,
        "scaling": {"name": spec.scaling.label, "params": scaling_params_json(spec.scaling)},
        "eval": spec.eval.to_dict(),
        "experiment": job.experiment_name,
        "seed": job.seed,
        "arm": job.arm.name,
    }
    return hashlib.sha256(canonical_json(identity).encode("utf-8")).hexdigest()[:_RUN_ID_CHARS]


def results_target(
    spec: Any, model_id: str, base: dict[str, Any]
) -> tuple[Path, dict[str, Any] | None]:
    """(result file, the "cached" summary if it exists already); sets run_id/model_id in ``base``."""
    run_id = make_run_id(model_id, spec)
    merged = spec.results_dir / f"{run_id}.parquet"
    shard = spec.eval.shard
    if shard is not None and shard.plan_only:  # measures and writes nothing (shard_step)
        base.update(run_id=run_id, model_id=model_id)
        return merged, None
    if shard is not None and merged.exists() and unreadable_results(merged, run_id) is None:
        message = f"results already exist at {merged} (merged from shards); nothing to do."
        base.update(run_id=run_id, model_id=model_id, results_path=str(merged))
        return merged, summary("cached", message, trained=False, **base)
    out_path = merged if shard is None else shard_path(spec.results_dir, run_id, shard)
    base.update(run_id=run_id, model_id=model_id, results_path=str(out_path))
    if not out_path.exists():
        return out_path, None
    problem = unreadable_results(out_path, run_id)
    if problem is not None:  # "already done" means a readable file of this job's rows
        aside = out_path.with_name(f"{out_path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(out_path, aside)
        log.warning(
            "lenbench: %s: %s; moved it to %s and computing the job again.",
            out_path,
            problem,
            aside,
        )
        return out_path, None
    cached = summary(
        "cached", f"results already exist at {out_path}; nothing to do.", trained=False, **base
    )
    return out_path, cached


#: A row's own identity columns (``model_id``, ...) where a job measured several models (a
#: fine-tune's recovery curve); they override the job's.
ROW_IDENTITY = "_identity"


def unreadable_results(path: Path, run_id: str) -> str | None:
    """Why the result file at ``path`` is not this job's finished rows (None if it is): it cannot
    be read, its rows do not match the SHA-256 recorded in it, it holds rows of another job, or a
    measured value in it is NaN or infinite."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:  # truncated, not parquet, unreadable
        return f"cannot be read ({type(err).__name__}: {first_line(err)})"
    problem = digest_problem(table)  # still readable, but a byte changed since it was written
    if problem is not None:
        return problem
    if table.num_rows == 0:
        return "has no rows"
    if "run_id" not in table.column_names or set(table.column("run_id").to_pylist()) != {run_id}:
        return f"holds rows of other runs than {run_id}"
    if {"value", "n"} <= set(table.column_names):
        rows = table.select(["value", "n"]).to_pylist()
        bad = non_finite_row(rows)
        if bad is not None:  # written before such rows were refused
            return f"holds a non-finite value ({rows[bad]['value']}), which is never a result"
    return None


def write_job_rows(
    spec: Any,
    rows: list[dict[str, Any]],
    corpus: Any,
    model_columns: dict[str, Any],
    out_path: Path,
    started: float,
    base: dict[str, Any],
    trained: bool,
) -> dict[str, Any]:
    """Add the identity columns to the measured rows, write them atomically, summarise the job;
    a job with a measured value that is NaN or infinite fails and writes nothing.

    ``model_columns`` are the columns that say which model was measured: ``position``,
    ``position_params``, ``train_length`` (and the fine-tune columns where there are some).
    """
    if not rows:
        return summary(
            "failed",
            "the evaluation produced no rows; check the eval config.",
            trained=trained,
            **base,
        )
    identity = {
        "experiment": spec.job.experiment_name,
        "run_id": base["run_id"],
        "model_id": base["model_id"],
        **model_columns,
        "scaling": spec.scaling.label,
        "scaling_params": scaling_params_json(spec.scaling),
        "arm": spec.job.arm.name,
        "seed": spec.job.seed,
        "corpus": corpus.name,
        "corpus_fingerprint": corpus.fingerprint,
        "code_version": code_version(),
    }
    full = [
        {
            **{k: v for k, v in row.items() if k != ROW_IDENTITY},
            **identity,
            **row.get(ROW_IDENTITY, {}),
        }
        for row in rows
    ]
    if spec.eval.shard is not None:  # what the merge gives the rows it computes (bench.core.shards)
        own = canonical_json(identity)
        full = [{**row, IDENTITY_COLUMN: own} for row in full]
    bad = non_finite_row(full)
    if bad is not None:  # DESIGN.md: a non-finite metric value is a failed job, never a row
        return summary(
            "failed",
            f"the evaluation gave {full[bad]['value']} for {describe_row(full[bad])}; a "
            "non-finite value is never a result, so this job wrote no rows.",
            trained=trained,
            **base,
        )
    write_results(full, out_path)
    seconds = time.perf_counter() - started
    return summary(
        "done",
        f"{len(rows)} rows written to {out_path} in {seconds:.1f} s.",
        trained=trained,
        rows=len(rows),
        seconds=round(seconds, 2),
        **base,
    )


def shard_step(spec: Any, corpus: Any, out_path: Path, base: dict[str, Any]) -> dict | None:
    """The job's summary where sharding decides it, else None (the job measures):
    ``eval.shard=plan/N`` prints the plan; without ``eval.shard``, a job with shards merges them
    into ``out_path`` (``bench.core.shards``)."""
    shard, run_id = spec.eval.shard, base["run_id"]
    if shard is not None and shard.plan_only:
        return shard_plan_summary(spec, corpus, base)
    if shard is not None:
        return None
    from bench.eval.metrics import METRICS

    metrics = {
        name: (section, METRICS[name].finish, METRICS[name].split and METRICS[name].split.combine)
        for name, section in spec.eval.metrics.items()
    }
    try:
        merged = merge_shards(spec.results_dir, run_id, metrics, unreadable_results)
    except ValueError as exc:
        return summary("invalid", str(exc), **base)
    if merged is None:
        return None
    write_results(merged, out_path)
    remove_shards(spec.results_dir, run_id)
    message = f"{len(merged)} rows merged from shards into {out_path}."
    return summary("done", message, trained=False, rows=len(merged), **base)


def shard_plan_summary(spec: Any, corpus: Any, base: dict[str, Any]) -> dict[str, Any]:
    """``eval.shard=plan/N``: the job's units dealt to N shards, as the summary's message; nothing
    is measured. A lenbench model reads the corpus in byte tokens, so no model is needed; a
    pretrained model is loaded for its tokenizer (seconds; nothing runs on it)."""
    from bench.eval.evaluate import plan_units
    from bench.eval.source import SourceModel

    source = spec.source
    model = source.model(corpus, spec) if not source.caches else SourceModel(module=None)
    units = plan_units(spec.eval, source.test_docs(corpus, model), model.tokenizer)
    text = plan_text(units, spec.eval.shard.count)
    return summary("planned", f"eval.shard={spec.eval.shard}: {text}", trained=False, **base)
