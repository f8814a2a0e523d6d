"""One lenbench job on a pretrained model: checks, corpus in the model's tokens, evaluation, rows.

The same steps as ``bench.job.run_job`` with the training replaced by loading: the job's eval
config runs on the model at lengths relative to its training length, the scaling is applied
through its own rope parameters (``bench.pretrained.adapter``), and the rows carry the usual
identity columns (``model_id`` from ``bench.pretrained.source``, ``position`` = the detected
family, ``position_params`` naming the model) so that reports and the dedup rule work unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

from bench.job import (
    JobSpec,
    _first_line,
    _is_oom,
    _summary,
    configure_threads,
    empty_test_split,
    resolve_path,
    results_target,
    write_job_rows,
)
from bench.pretrained.source import (
    load_config,
    model_id,
    position_family,
    position_params,
    rope_geometry,
    train_length_of,
)
from bench.results import canonical_json
from bench.runtime import resolve_device
from bench.schema import JobConfig
from models.scaling_config import run_scaling

__all__ = ["run_pretrained_job", "validate_pretrained_job"]

log = logging.getLogger("lenbench")


def validate_pretrained_job(job: JobConfig) -> JobSpec:
    """The checked job of a pretrained model: reads only its config (no weights). Raises a
    one-sentence ValueError, or NotApplicable when the scaling does not apply to its family."""
    from bench.pretrained.adapter import check_pretrained_scaling, rope_for

    config = load_config(job.pretrained)
    family = position_family(config)
    check_pretrained_scaling(family, job.scaling)
    train_length = train_length_of(config, job.pretrained.train_length)
    resolved = job.eval.resolve(train_length)
    scaling = run_scaling(job.scaling, train_length=train_length, lengths=resolved.lengths)
    if family == "rope" and scaling.method != "default":
        rope_geometry(config)  # a rope model without head geometry fails here, in one sentence
        for length in resolved.lengths:
            try:
                rope_for(config, train_length, scaling, length)
            except ValueError as exc:
                raise ValueError(
                    f"scaling {job.scaling.name} is invalid at eval length {length}: {exc}"
                ) from None
    return JobSpec(
        job=job,
        eval=resolved,
        scaling=scaling,
        device=resolve_device(job.device),
        results_dir=resolve_path(job.paths.results, "paths.results") / job.experiment_name,
        cache_root=None,
    )


def run_pretrained_job(spec: JobSpec, base: dict[str, Any], started: float) -> dict[str, Any]:
    """Evaluate the pretrained model of ``spec`` and write its rows; a summary as ``run_job``'s."""
    from bench.corpora import load_corpus
    from bench.evaluate import evaluate_model
    from bench.pretrained.adapter import PretrainedLM
    from bench.pretrained.documents import retokenize
    from bench.pretrained.source import load_pretrained

    job, pretrained = spec.job, spec.job.pretrained
    train_length = spec.eval.train_length
    try:
        corpus = load_corpus(job.data)
        mid = model_id(pretrained)
    except ValueError as exc:
        return _summary("invalid", str(exc), **base)
    problem = empty_test_split(corpus)
    if problem is not None:
        return _summary("invalid", problem, **base)
    out_path, cached = results_target(spec, mid, base)
    if cached is not None:
        return cached
    configure_threads(job.threads)
    try:
        model, tokenizer = load_pretrained(pretrained, spec.device)
        lm = PretrainedLM(model, tokenizer, train_length)
        base["position"] = lm.family
        docs = retokenize(corpus.split("test"), tokenizer)
        rows = evaluate_model(
            lm,
            spec.eval,
            docs,
            train_length=train_length,
            scaling=spec.scaling,
            device=spec.device,
            seed=job.seed,
            tokenizer=tokenizer,
        )
    except (RuntimeError, MemoryError) as exc:
        if not _is_oom(exc):
            raise
        return _summary("failed", f"out of memory while evaluating: {_first_line(exc)}", **base)
    except ValueError as exc:
        return _summary("invalid", str(exc), **base)
    if spec.eval.harness.tasks:
        log.warning(
            "eval.harness.tasks are not run on a pretrained model; run lm-eval's own hf model "
            "(lm_eval --model hf --model_args pretrained=%s) for them.",
            pretrained.path,
        )
    model_columns = {
        "position": lm.family,
        "position_params": canonical_json(position_params(pretrained, model.config, lm.family)),
        "train_length": train_length,
        "model_config_id": mid,  # one pretrained model = one configuration; seeds sample the eval
    }
    return write_job_rows(spec, rows, corpus, model_columns, out_path, started, base, False)
