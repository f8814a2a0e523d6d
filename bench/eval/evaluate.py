"""Evaluate one model at several lengths with every registered metric (``bench.eval.metrics``).

The scaling is fixed once per run (``models.scaling_config.run_scaling``): a static ``factor: auto`` is
set for ``scaling.target_length`` or the longest eval length and used at every length; only an
oracle scaling gets each length's own factor. For each eval length, :func:`evaluate_model` applies
it (``model.scaled(scaling, length)``), skips a length the model cannot embed, and runs each
enabled metric whose ``lengths`` include it, in registry order; after the last length each
metric adds its once-per-run rows. The metrics of one length share forward passes
(``EvalContext.reuse_forwards``): a window that several metrics read with the same position ids
(the nll window of a document is the shift, order and context base and the position probe's
input) runs once. Every metric reads one document set per run, chosen once
before the first length: the test documents long enough for the longest length at which a
metric that reads documents runs (``bench.eval.metrics.context.run_documents``), so numbers at
different lengths are on the same documents. Rows hold only the measured part
(``bench.eval.metrics.context``); the job runner adds the identity columns.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from bench.core.checks import parse_length
from bench.core.progress import progress_bar
from bench.core.shards import (
    METRIC_COLUMN,
    PAYLOAD_COLUMN,
    PLAN_COLUMN,
    PLAN_METRIC,
    UNIT_COLUMN,
    UNIT_METRIC,
    Unit,
    assign,
    encode_payload,
)
from bench.data.corpora import Document
from bench.data.pretrained_documents import window_bos
from bench.eval.metrics import (
    METRICS,
    EvalConfigBase,
    EvalContext,
    MetricConfig,
    ResolvedEval,
    as_eval_config,
)
from bench.eval.metrics.context import run_documents
from models.scaling_config import ScalingConfig, run_scaling

__all__ = ["evaluate_model", "parse_length", "plan_units", "shard_plan"]

logger = logging.getLogger(__name__)


def evaluate_model(
    model: nn.Module,
    eval_cfg: EvalConfigBase | ResolvedEval | Mapping | None,
    test_docs: list[Document],
    *,
    train_length: int,
    scaling: ScalingConfig | None = None,
    device: str | torch.device = "cpu",
    seed: int = 0,
    progress: bool = True,
    tokenizer: object = None,
    evaluator: object = None,
) -> list[dict]:
    """Measure every enabled metric at every eval length; return result rows (module doc).

    ``eval_cfg``: an ``EvalConfig``, a mapping of eval keys (missing ones take the dataclasses'
    defaults, ``bench.eval.metrics``), None for the defaults, or an already resolved config.
    ``scaling`` (None = the raw model; its factor fixed for the run, module doc) needs a model with
    ``scaled()``. ``tokenizer``: a transformers tokenizer for a pretrained model
    (``bench.pretrained``): passkey prompts are then built as text in its tokens; None = byte
    tokens. ``evaluator``: eval.longppl's (``bench.eval.metrics.longppl.Evaluator``). Runs under
    ``torch.no_grad`` in eval mode; the model's scaling and train/eval mode are restored afterwards.
    Raises ValueError before any work when no test document is long enough (module doc).
    """
    if isinstance(eval_cfg, ResolvedEval):
        cfg = eval_cfg
        if cfg.train_length != train_length:
            raise ValueError(
                f"the eval config was resolved for train_length {cfg.train_length}, "
                f"not {train_length}."
            )
    else:
        cfg = as_eval_config(eval_cfg).resolve(train_length)
    docs = _run_documents(cfg, test_docs)
    ctx = EvalContext(
        model,
        device=device,
        precision=cfg.precision,
        batch_size=cfg.batch_size,
        max_batch_tokens=cfg.max_batch_tokens,
        progress=progress,
        train_length=cfg.train_length,
        seed=seed,
        tokenizer=tokenizer,
        window_bos=None if tokenizer is None else window_bos(tokenizer),
        evaluator=evaluator,
    )
    scaled = getattr(model, "scaled", None)
    if scaling is not None and scaled is None:
        raise ValueError(f"scaling {scaling!r} was given but the model has no scaled() method.")
    if scaling is not None:
        scaling = run_scaling(scaling, train_length=cfg.train_length, lengths=cfg.lengths)
    was_training = model.training
    model.to(device)
    model.eval()
    rows: list[dict] = []
    by_metric: dict[str, list[dict]] = {name: [] for name in cfg.metrics}
    try:
        with torch.no_grad():
            if cfg.shard is not None:  # the merge adds the rows computed from every length
                return _measure_shard(ctx, cfg, docs, scaling if scaled else None)
            for length in progress_bar(
                cfg.lengths, desc="eval lengths", unit="len", disable=not progress
            ):
                with scaled(scaling, length) if scaled else contextlib.nullcontext():
                    rows += _measure_length(ctx, cfg, docs, length, by_metric)
        for name, section in cfg.metrics.items():
            finish = METRICS[name].finish
            if finish is not None and section.enabled:
                rows += finish(section, by_metric[name])
    finally:
        model.train(was_training)
    return rows


def _run_documents(cfg: ResolvedEval, test_docs: Sequence[Document]) -> list[Document]:
    """The run's document set: long enough for the longest length a document-reading metric
    runs at (module doc); none where no metric reads documents."""
    reading = [s.lengths for s in cfg.metrics.values() if s.enabled and s.reads_documents]
    longest = max((max(lengths) for lengths in reading if lengths), default=None)
    return [] if longest is None else run_documents(list(test_docs), longest)


def _running(cfg: ResolvedEval, length: int) -> list[tuple[str, MetricConfig]]:
    """(name, section) of every enabled metric that runs at ``length``, in registry order."""
    return [
        (name, section)
        for name, section in cfg.metrics.items()
        if section.enabled and length in section.lengths
    ]


def shard_plan(ctx: EvalContext, cfg: ResolvedEval, docs: Sequence[Document]) -> list[Unit]:
    """The job's units in run order (``bench.core.shards``): at each eval length, each metric
    running there, one unit per part where it splits (``Split``), else one (its ``max_docs``
    as the estimated windows)."""
    units = []
    for length in cfg.lengths:
        for name, section in _running(cfg, length):
            split = METRICS[name].split
            if split is None:
                units.append(Unit(length, name, 0, 1, int(getattr(section, "max_docs", 1) or 1)))
                continue
            parts = split.parts(ctx, section, docs, length)
            weight = int(split.weight(section))
            units += [
                Unit(length, name, i, len(parts), len(p) * weight) for i, p in enumerate(parts)
            ]
    return units


def plan_units(
    eval_cfg: ResolvedEval, test_docs: Sequence[Document], tokenizer: object = None
) -> list[Unit]:
    """:func:`shard_plan` before any model is at hand (``eval.shard=plan/N``): the plan reads
    only the documents and the batch sizes."""
    ctx = EvalContext(
        None,
        batch_size=eval_cfg.batch_size,
        max_batch_tokens=eval_cfg.max_batch_tokens,
        progress=False,
        train_length=eval_cfg.train_length,
        tokenizer=tokenizer,
    )
    return shard_plan(ctx, eval_cfg, _run_documents(eval_cfg, test_docs))


def _measure_shard(
    ctx: EvalContext, cfg: ResolvedEval, docs: list[Document], scaling: ScalingConfig | None
) -> list[dict]:
    """The rows of this process's shard of the job's units (``cfg.shard``), after one row that
    records the whole plan (the merge checks that the shards cover it once)."""
    units = shard_plan(ctx, cfg, docs)
    rows = [
        {"metric": PLAN_METRIC, "value": 0.0, "n": len(units), "eval_length": 0,
         METRIC_COLUMN: PLAN_METRIC, PLAN_COLUMN: json.dumps([u.key for u in units])}
    ]  # fmt: skip
    own = assign(units, cfg.shard.count)[cfg.shard.index]
    lengths = [length for length in cfg.lengths if any(u.length == length for u in own)]
    scaled = ctx.model.scaled if scaling is not None else None
    for length in progress_bar(lengths, desc="eval lengths", unit="len", disable=not ctx.progress):
        with scaled(scaling, length) if scaled else contextlib.nullcontext():
            rows += _measure_units(ctx, cfg, docs, length, [u for u in own if u.length == length])
    return rows


def _measure_units(
    ctx: EvalContext, cfg: ResolvedEval, docs: list[Document], length: int, units: list[Unit]
) -> list[dict]:
    """The rows of ``units`` (all at ``length``): a whole metric's rows, a split part's payload,
    and one bookkeeping row per unit. Every metric running at the length is prepared, as in the
    unsharded job, so that the forward batches are the same."""
    problem = ctx.position_range_error(length - 1, length)
    if problem is not None:
        logger.warning("eval length %d skipped for every metric: %s", length, problem)
    rows: list[dict] = []
    with ctx.reuse_forwards():
        for name, section in _running(cfg, length) if problem is None else ():
            if METRICS[name].prepare is not None:
                METRICS[name].prepare(ctx, section, docs, length)
        for unit in units:
            metric, section = METRICS[unit.metric], cfg.metrics[unit.metric]
            marker = {"metric": UNIT_METRIC, "value": 0.0, "n": unit.items, "eval_length": length,
                      METRIC_COLUMN: unit.metric, UNIT_COLUMN: unit.key}  # fmt: skip
            if metric.split is None:
                new = [] if problem else metric.fn(ctx, section, docs, length)
                rows += [{**row, METRIC_COLUMN: unit.metric} for row in new]
            else:
                part = metric.split.parts(ctx, section, docs, length)[unit.part]
                payload = (
                    None if problem else metric.split.measure(ctx, section, docs, length, part)
                )
                marker[PAYLOAD_COLUMN] = encode_payload(payload)
            rows.append(marker)
    return rows


def _measure_length(
    ctx: EvalContext,
    cfg: ResolvedEval,
    docs: list[Document],
    length: int,
    by_metric: dict[str, list[dict]],
) -> list[dict]:
    """The rows of every enabled metric that runs at ``length`` (also added to ``by_metric``);
    none when the model cannot embed the length."""
    problem = ctx.position_range_error(length - 1, length)
    if problem is not None:
        logger.warning("eval length %d skipped for every metric: %s", length, problem)
        return []
    running = _running(cfg, length)
    rows: list[dict] = []
    # metrics share forward passes at this length (bench.eval.metrics.context)
    with ctx.reuse_forwards():
        for name, section in running:
            if METRICS[name].prepare is not None:
                METRICS[name].prepare(ctx, section, docs, length)
        for name, section in running:
            started = time.perf_counter()
            new = METRICS[name].fn(ctx, section, docs, length)
            logger.info(
                "%s at eval length %d: %d rows in %.2f s",
                name,
                length,
                len(new),
                time.perf_counter() - started,
            )
            by_metric[name] += new
            rows += new
    return rows
