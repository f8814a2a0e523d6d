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
import logging
import time
from collections.abc import Mapping

import torch
from torch import nn

from bench.core.checks import parse_length
from bench.core.progress import progress_bar
from bench.core.shards import METRIC_COLUMN
from bench.data.corpora import Document
from bench.data.pretrained_documents import window_bos
from bench.eval.metrics import (
    METRICS,
    EvalConfigBase,
    EvalContext,
    ResolvedEval,
    as_eval_config,
)
from bench.eval.metrics.context import run_documents
from models.scaling_config import ScalingConfig, run_scaling

__all__ = ["evaluate_model", "parse_length"]

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
    reading = [s.lengths for s in cfg.metrics.values() if s.enabled and s.reads_documents]
    longest = max((max(lengths) for lengths in reading if lengths), default=None)
    docs = [] if longest is None else run_documents(list(test_docs), longest)
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
            for length in progress_bar(
                cfg.measured_lengths, desc="eval lengths", unit="len", disable=not progress
            ):
                with scaled(scaling, length) if scaled else contextlib.nullcontext():
                    rows += _measure_length(ctx, cfg, docs, length, by_metric)
        if cfg.shard is not None:  # the merge adds the rows computed from every length
            return [{**row, METRIC_COLUMN: name} for name in by_metric for row in by_metric[name]]
        for name, section in cfg.metrics.items():
            finish = METRICS[name].finish
            if finish is not None and section.enabled:
                rows += finish(section, by_metric[name])
    finally:
        model.train(was_training)
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
    running = [
        (name, section)
        for name, section in cfg.metrics.items()
        if section.enabled and length in section.lengths
    ]
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
