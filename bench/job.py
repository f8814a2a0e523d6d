"""One benchmark job: typed config -> checks -> corpus -> model -> evaluation -> parquet.

:func:`run_job` is what every ``lenbench`` Hydra job runs, one pipeline over a model source
(``bench.eval.source``): it parses the composed config once (``JobConfig.from_hydra``), asks the source
whether the scaling applies and checks everything cheap before anything expensive
(:func:`prepare_job`), skips work already done (the result file is named by a hash of the job's
identity, which holds the source's model id), gets the model from the source, evaluates it and
writes the rows atomically. Expected problems come back as a status with one sentence; unexpected
exceptions propagate. The source is :class:`TrainedSource` (the checkpoint cache: trains only when
it has no model for the weights key; ``extend`` fine-tunes), or, for a job with a ``pretrained``
section (``+experiment=pretrained``), ``bench.pretrained.source.PretrainedSource`` (a transformers
model, loaded instead of trained).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from bench.core.checks import NotApplicable, first_line
from bench.core.runtime import busy_cores, resolve_device
from bench.data.corpora import Corpus
from bench.eval.metrics import ResolvedEval
from bench.eval.source import ModelSource, SourceModel
from bench.job_rows import ROW_IDENTITY, results_target, shard_step, summary, write_job_rows
from bench.schema import JobConfig
from bench.train.extend import base_job
from bench.trained_source import TrainedSource, longppl_evaluator
from models.lazy import torch
from models.scaling_config import ScalingConfig

log = logging.getLogger("lenbench")

__all__ = [
    "JobSpec",
    "NotApplicable",
    "TrainedSource",
    "model_source",
    "prepare_job",
    "run_job",
    "validate_job",
]

# done: evaluated and written; cached: the result file exists already; not_applicable: the
# scaling means nothing for the position family (a skipped sweep cell); invalid: a config error;
# failed: training diverged or ran out of memory (nothing written).
STATUSES = ("done", "cached", "not_applicable", "invalid", "failed")


@dataclass
class JobSpec:
    """A checked job: its typed config plus what was resolved for this machine and length."""

    job: JobConfig
    eval: ResolvedEval  # every length in tokens for job.train.length
    scaling: ScalingConfig  # job.scaling as applied at every length: factor "auto" fixed per run
    device: str
    results_dir: Path  # <paths.results>/<experiment_name>
    cache_root: Path | None  # None: bench.train.checkpoints.default_cache_root()
    source: ModelSource  # where the model comes from


# --------------------------------------------------------------------------- paths


def base_dir() -> Path:
    """Where lenbench was started: Hydra's original cwd inside a Hydra job, else the cwd."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return Path(HydraConfig.get().runtime.cwd)
    except (ImportError, ValueError):  # pragma: no cover - no Hydra context
        pass
    return Path.cwd()


def resolve_path(value: Any, what: str) -> Path:
    """``~``-expanded absolute path; relative paths are relative to where lenbench was started."""
    if value is None or str(value).strip() in ("", "???"):
        raise ValueError(f"{what} is not set; give a directory.")
    path = Path(os.path.expandvars(os.path.expanduser(str(value))))
    return path if path.is_absolute() else base_dir() / path


# --------------------------------------------------------------------------- validation


def model_source(job: JobConfig) -> ModelSource:
    """The job's model source: the ``pretrained`` section's model, else a lenbench model."""
    if job.pretrained is None:
        return TrainedSource(job)
    from bench.pretrained.source import PretrainedSource  # transformers: only when asked for

    return PretrainedSource(job)


def validate_job(job: JobConfig) -> JobSpec:
    """Check what the schema cannot see alone; return the job's resolved form or raise ValueError
    (one sentence). Raises :class:`NotApplicable` (a ValueError) when the scaling method does not
    apply to the model (the source says). Cheap: no corpus is read and nothing is trained."""
    source = model_source(job)
    source.check_scaling(job.scaling)
    resolved, scaling = source.plan()
    if resolved.shard is not None:
        _check_shardable(job, resolved)
    cache = job.paths.cache if source.caches else None
    cache_root = None if cache is None else resolve_path(cache, "paths.cache")
    _check_longppl(job, resolved, cache_root)
    _check_harness_tasks(resolved)
    return JobSpec(
        job=job,
        eval=resolved,
        scaling=scaling,
        device=resolve_device(job.device),
        results_dir=resolve_path(job.paths.results, "paths.results") / job.experiment_name,
        cache_root=cache_root,
        source=source,
    )


def _check_longppl(job: JobConfig, resolved: ResolvedEval, cache_root: Path | None) -> None:
    """LongPPL's evaluator reads the judged model's tokens: a pretrained model needs a pretrained
    evaluator (its tokenizer is checked where it loads), a lenbench model a lenbench one; a named
    evaluator checkpoint must be in the cache and score the longest length before any training."""
    cfg = resolved.metrics.get("longppl")
    if cfg is None or not cfg.enabled or not cfg.lengths:
        return
    named = cfg.evaluator_pretrained is not None
    if job.pretrained is not None and not named:
        raise ValueError(
            "eval.longppl on a pretrained model needs eval.longppl.evaluator_pretrained: a "
            "transformers model with the same tokenizer that chooses the key tokens."
        )
    if job.pretrained is None and named:
        raise ValueError(
            f"eval.longppl.evaluator_pretrained {cfg.evaluator_pretrained!r} is for pretrained "
            "models; allowed for a lenbench model: eval.longppl.evaluator (auto or a checkpoint key)."
        )
    if job.pretrained is not None:
        return
    from bench.eval.metrics.longppl import AUTO

    if cfg.evaluator == AUTO:
        _check_auto_evaluator(job, max(cfg.lengths), cfg.evaluator_seed)
    else:
        _check_named_evaluator(cfg.evaluator, max(cfg.lengths), cache_root)


def _check_auto_evaluator(job: JobConfig, longest: int, seed: int) -> None:
    from bench.train.cache import weights_key
    from bench.trained_source import evaluator_job

    # one corpus for both: its fingerprint cannot tell them apart, so the keys leave it out
    if weights_key(evaluator_job(job, longest, seed)) == weights_key(job):
        raise ValueError(
            f"eval.longppl's auto evaluator (the recipe with RoPE at {longest} tokens, seed {seed}) "
            "would be the judged model itself; allowed: another eval.longppl.evaluator_seed or "
            "an evaluator checkpoint key (the evaluator never judges itself)."
        )


def _check_named_evaluator(key: str, longest: int, cache_root: Path | None) -> None:
    from bench.train.checkpoints import finished_train_length, resolve_cache_root

    length = finished_train_length(key, cache_root)
    if length is None:
        raise ValueError(
            f"eval.longppl.evaluator {key!r} is not a finished checkpoint under "
            f"{resolve_cache_root(cache_root)}; allowed: auto or the key of a trained checkpoint "
            "in paths.cache."
        )
    if length < longest:
        raise ValueError(
            f"eval.longppl.evaluator {key!r} was trained at {length} tokens and cannot score "
            f"LongPPL length {longest}; allowed: an evaluator trained at {longest} tokens or longer."
        )


def _check_harness_tasks(resolved: ResolvedEval) -> None:
    """Every ``eval.harness.tasks`` name is lenbench's or lm-eval's, before any training (else
    lm-eval refuses it after the native evaluation). lm-eval's own tasks, slow to index, are
    indexed only for a name that is not lenbench's."""
    names = list(resolved.harness.tasks)
    if not names:
        return
    from bench.harness.tasks import task_names

    ours = set(task_names())
    others = [name for name in names if name not in ours]
    if not others:
        return
    unknown = [name for name in others if name not in _lm_eval_tasks()]
    if unknown:
        families = sorted({re.sub(r"_\d+$", "_<length>", name) for name in ours})
        raise ValueError(
            f"eval.harness.tasks names {', '.join(map(repr, unknown))}, neither a lenbench task "
            f"({', '.join(families)}) nor one of lm-eval's; allowed: their names."
        )


@functools.cache
def _lm_eval_tasks() -> frozenset[str]:
    """lm-eval's task names, indexed once per process (about 9 s; a sweep checks every cell)."""
    from lm_eval.tasks import TaskManager

    return frozenset(TaskManager(include_defaults=True).all_tasks)  # as named, whatever patched it


def _check_shardable(job: JobConfig, resolved: ResolvedEval) -> None:
    """A shard is a share of one model's eval lengths: refuse what it cannot split."""
    if resolved.harness.tasks:
        raise ValueError(
            f"eval.shard={job.eval.shard} cannot split lm-evaluation-harness tasks "
            f"(eval.harness.tasks={list(resolved.harness.tasks)}); allowed: eval.shard=null, or "
            "the harness tasks in a job of their own."
        )
    if job.extend.active and job.extend.curve:
        raise ValueError(
            f"eval.shard={job.eval.shard} cannot split a fine-tune's recovery curve "
            f"(extend.curve={list(job.extend.curve)}: several models); allowed: eval.shard=null "
            "or extend.curve=[]."
        )


def prepare_job(cfg: DictConfig | JobConfig) -> JobSpec:
    """The checked job of a composed config (parsed once here); raises ValueError/NotApplicable."""
    return validate_job(cfg if isinstance(cfg, JobConfig) else JobConfig.from_hydra(cfg))


def not_applicable(cfg: DictConfig) -> dict[str, Any] | None:
    """The summary :func:`run_job` gives a cell that does not apply, without running it (the
    sweeper launches no such cell: ``hydra_plugins.lenbench_sweeper``); None for any other cell, a broken one
    included (its job reports it)."""
    try:
        prepare_job(cfg)
    except NotApplicable as exc:
        return summary("not_applicable", f"{exc}; skipped.", **_labels(cfg))
    except Exception:  # noqa: BLE001 - whatever else is wrong, the launched job says it
        return None
    return None


# --------------------------------------------------------------------------- running


@functools.cache
def default_threads() -> int:
    """torch's intra-op thread count before any job set it (one per core by default)."""
    return torch.get_num_threads()


#: Other processes busy on at least this many cores at job start make the job use fewer threads.
BUSY_THRESHOLD = 0.5


def configure_threads(threads: int | None) -> int:
    """Set and return torch's intra-op threads for a job.

    ``threads`` if set; under the joblib launcher cpu_count / n_jobs; else torch's default (one
    per core), minus the cores other processes keep busy at job start. Why: with OpenMP's
    spin-waiting, two threads on two cores next to one busy process ran a training step 2.1x
    slower than one thread (tests/perf/thread_speed.py, tests/perf/README.md), while on an idle
    machine two threads are 1.9x faster than one.
    """
    if threads is None:
        try:
            from hydra.core.hydra_config import HydraConfig

            if HydraConfig.initialized():
                launcher = HydraConfig.get().launcher
                if "joblib" in str(launcher.get("_target_", "")).lower():
                    cpus = os.cpu_count() or 1
                    n_jobs = int(launcher.get("n_jobs", 1) or 1)
                    threads = max(1, cpus // (cpus if n_jobs < 1 else n_jobs))
        except (ImportError, ValueError):  # pragma: no cover
            threads = None
    if threads is None:
        threads = default_threads()
        busy = busy_cores()
        if busy is not None and busy >= BUSY_THRESHOLD and default_threads() > 1:
            threads = max(1, default_threads() - math.ceil(busy - BUSY_THRESHOLD))
            log.info(
                "lenbench: %.1f of %d cores are busy with other processes: using %d torch "
                "thread(s) (set threads=N to choose).",
                busy,
                os.cpu_count() or 1,
                threads,
            )
    torch.set_num_threads(threads)
    return threads


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
    )


def empty_test_split(corpus: Any) -> str | None:
    """The sentence for a corpus whose test split is empty (nothing to evaluate on), else None."""
    if corpus.split("test"):
        return None
    n_docs = sum(len(corpus.split(name)) for name in ("train", "validation", "test"))
    if n_docs < 3:  # the real cause: too few documents for three splits
        return (
            f"corpus {corpus.name} ({corpus.fingerprint}) has {n_docs} document(s), so its test "
            "split is empty: a corpus needs at least one document per split (train, validation, "
            "test); give data.paths more files."
        )
    return (
        f"the test split of corpus {corpus.name} ({corpus.fingerprint}) is empty, so there is "
        "nothing to evaluate on; give data.split_fractions a larger test share or raise "
        "data.max_files / data.max_bytes."
    )


def _labels(cfg: DictConfig | JobConfig) -> dict[str, Any]:
    """experiment / position / scaling / extend labels of a job, also when its config does not
    parse."""
    if isinstance(cfg, JobConfig):
        return {
            "experiment": cfg.experiment_name,
            "position": cfg.position.kind,
            "scaling": cfg.scaling.label,
            "extend": cfg.extend.name,
        }
    keys = {
        "experiment": "experiment_name",
        "position": "position.kind",
        "scaling": "scaling.name",
        "extend": "extend.name",
    }
    out = {}
    for label, key in keys.items():
        try:
            out[label] = OmegaConf.select(cfg, key, default=None)
        except Exception:  # noqa: BLE001 - a label of a broken config: report without it
            out[label] = None
    return out


def run_job(cfg: DictConfig | JobConfig, failed_models: Any = None) -> dict[str, Any]:
    """Run one job (module doc); return a summary dict with ``status`` and ``message``. Expected
    problems never raise: a bad config gives status ``invalid`` (message = one sentence),
    a scaling that does not apply gives ``not_applicable``, divergence or out-of-memory ``failed``.
    In all three nothing is trained after the problem and nothing is written.

    ``failed_models`` (a sweep's, ``bench.cli.FailedModels``): ``earlier(keys)`` is the sentence
    for a model that already failed to train in this sweep (the job fails without training it
    again), ``record(key)`` notes that this job failed to obtain it, for the cells after it.
    """
    from bench.data.corpora import load_corpus

    started = time.perf_counter()
    base = _labels(cfg)
    try:
        spec = prepare_job(cfg)
    except NotApplicable as exc:
        return summary("not_applicable", f"{exc}; skipped.", **base)
    except ValueError as exc:
        return summary("invalid", str(exc), **base)
    job, source = spec.job, spec.source
    try:
        corpus = load_corpus(job.data)  # cached per process; a model id may need its fingerprint
        problem = empty_test_split(corpus)
        model_id = source.model_id(corpus) if problem is None else ""
    except ValueError as exc:
        return summary("invalid", str(exc), **base)
    if problem is not None:
        return summary("invalid", problem, **base)
    base.update(_harness_key(spec, model_id))
    out_path, cached = results_target(spec, model_id, base)
    if cached is not None:
        return cached
    shard_summary = shard_step(spec, corpus, out_path, base)  # plan/N, or a merge of shards
    if shard_summary is not None:
        return shard_summary
    earlier = failed_models and failed_models.earlier(_model_keys(spec, corpus, model_id))
    if earlier is not None:
        return summary("failed", earlier, **base)
    configure_threads(job.threads)  # only jobs with work to do sample the machine's load
    from bench.train.guards import TrainingDiverged

    try:
        model = source.model(corpus, spec)
    except TrainingDiverged as exc:
        if failed_models is not None:
            failed_models.record(model_id)
        # the message names the failure itself ("training diverged at step ...", "training
        # ended no better than a uniform guess ...")
        return summary("failed", str(exc), trained=True, **base)
    except (RuntimeError, MemoryError) as exc:
        if not _is_oom(exc):
            raise
        if failed_models is not None:
            failed_models.record(model_id)
        message = f"out of memory while {source.obtains}: {first_line(exc)}"
        return summary("failed", message, **base)
    except ValueError as exc:
        return summary("invalid", str(exc), **base)
    base.update(model.labels)  # e.g. the sweep summary counts trainings resumed from a state
    try:
        rows = measure(source, model, corpus, spec)
    except (RuntimeError, MemoryError) as exc:
        if not _is_oom(exc):
            raise
        message = f"out of memory while evaluating: {first_line(exc)}"
        return summary("failed", message, trained=model.trained, **base)
    except ValueError as exc:
        return summary("invalid", str(exc), trained=model.trained, **base)
    rows += source.extra_rows(model, spec)
    columns = source.columns(model, corpus)
    return write_job_rows(spec, rows, corpus, columns, out_path, started, base, model.trained)


def _harness_key(spec: JobSpec, model_id: str) -> dict[str, str]:
    """A cached model's checkpoint key and cache root, as lenbench-harness loads it (a run's
    last line names them: ``bench.job_rows.checkpoint_line``); nothing for a pretrained model."""
    if not spec.source.caches:
        return {}
    from bench.train.checkpoints import resolve_cache_root

    return {"checkpoint": model_id, "cache_root": str(resolve_cache_root(spec.cache_root))}


def _model_keys(spec: JobSpec, corpus: Corpus, model_id: str) -> list[str]:
    """The checkpoint keys a job's model needs: its own and, for a fine-tune, its parent's."""
    if not (isinstance(spec.source, TrainedSource) and spec.job.extend.active):
        return [model_id]
    from bench.train.cache import weights_key

    return [model_id, weights_key(base_job(spec.job), corpus)]


def measure(
    source: ModelSource, model: SourceModel, corpus: Corpus, spec: JobSpec
) -> list[dict[str, Any]]:
    """The metrics' rows of every model the job measures (a fine-tune's recovery curve has
    several), on the test documents in the model's tokens."""
    from bench.eval.evaluate import evaluate_model

    docs = source.test_docs(corpus, model)
    evaluator = longppl_evaluator(spec, corpus, model.tokenizer)
    rows: list[dict[str, Any]] = []
    for module, identity in source.measured(model, corpus, spec):
        point_rows = evaluate_model(
            module,
            spec.eval,
            docs,
            train_length=spec.eval.train_length,
            scaling=spec.scaling,
            device=spec.device,
            seed=spec.job.seed,
            tokenizer=model.tokenizer,
            evaluator=evaluator,
        )
        if identity is not None:  # rows of another model than the job's: its own identity
            point_rows = [{**row, ROW_IDENTITY: identity} for row in point_rows]
        rows += point_rows
    return rows
