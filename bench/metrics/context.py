"""What every metric shares: the evaluation context and the measurement primitives.

:class:`EvalContext` runs the model (device, precision, batch sizing, progress bars, batched
per-token NLL); the helpers pick the run's document set (one for every eval length, so numbers at
different lengths are on the same documents), cut windows into position buckets, bootstrap over
documents and build result rows ``{"metric", "value", "n", "eval_length"}`` + optional
``{"bucket_lo", "bucket_hi", "axis", "axis_value", "layer", "ci_lo", "ci_hi"}``.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from bench.corpora import Document
from bench.runtime import autocast

__all__ = [
    "EvalContext",
    "bootstrap_ratio_ci",
    "bucket_edges",
    "bucket_index",
    "ci_bounds",
    "first_windows",
    "make_row",
    "run_documents",
    "select_documents",
    "warn_no_docs",
]

logger = logging.getLogger(__name__)


@dataclass
class EvalContext:
    """What every metric needs to run the model, plus the run's training length and seed."""

    model: nn.Module
    device: str | torch.device = "cpu"
    precision: str = "fp32"
    batch_size: int = 8
    max_batch_tokens: int | None = None
    progress: bool = True
    train_length: int | None = None
    seed: int = 0
    # a transformers tokenizer for a pretrained model (passkey prompts are then built as text);
    # None = lenbench's byte tokens
    tokenizer: Any = None

    def __post_init__(self) -> None:
        self.autocast()  # an unknown precision fails here, not at the first forward pass

    def rows_per_batch(self, length: int) -> int:
        """Windows of ``length`` tokens per forward pass: batch_size, capped by max_batch_tokens."""
        rows = int(self.batch_size)
        if self.max_batch_tokens:
            rows = min(rows, int(self.max_batch_tokens) // max(int(length), 1))
        return max(1, rows)

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.device, self.precision)

    def bar(self, total: int, desc: str, unit: str = "win") -> tqdm:
        return tqdm(total=total, desc=desc, unit=unit, leave=False, disable=not self.progress)

    def forward(self, input_ids: torch.Tensor, **kwargs):
        """The model's output for ``input_ids`` moved to the device, without autograd."""
        with torch.no_grad(), self.autocast():
            return self.model(input_ids.to(self.device), **kwargs)

    def position_range_error(self, max_position: int, seq_len: int) -> str | None:
        """Why the model cannot embed positions up to ``max_position`` (its own hook), or None."""
        hook = getattr(self.model, "position_range_error", None)
        return None if hook is None else hook(int(max_position), int(seq_len))

    def position_ids_error(self) -> str | None:
        """Why the model cannot take explicit position ids (its own hook), or None."""
        hook = getattr(self.model, "position_ids_error", None)
        return None if hook is None else hook()

    def token_nll(self, tokens: torch.Tensor, position_offset: int = 0) -> torch.Tensor:
        """Per-token NLL (nats, float32, CPU) of windows ``tokens`` [N, L+1] -> [N, L].

        Inputs are ``tokens[:, :-1]``, targets ``tokens[:, 1:]``; position ids are
        ``position_offset + arange(L)`` (the model's default when the offset is 0).
        """
        n, width = tokens.shape
        length = width - 1
        kwargs = {}
        if position_offset:
            kwargs["position_ids"] = torch.arange(length, device=self.device) + int(position_offset)
        logits = self.forward(tokens[:, :-1], **kwargs).logits  # [N, L, V]
        targets = tokens[:, 1:].to(logits.device)
        nll = F.cross_entropy(
            logits.float().reshape(n * length, -1), targets.reshape(-1), reduction="none"
        )
        return nll.view(n, length).cpu()

    def window_nll(
        self, windows: torch.Tensor, position_offset: int = 0, desc: str = "", score_from: int = 0
    ) -> torch.Tensor:
        """Per-token NLL [M, L - score_from] of many windows [M, L+1], batched; keeps positions >= score_from."""
        m, width = windows.shape
        step = self.rows_per_batch(width - 1)
        out = []
        with self.bar(m, desc) as bar:
            for start in range(0, m, step):
                chunk = windows[start : start + step]
                out.append(self.token_nll(chunk, position_offset)[:, score_from:])
                bar.update(chunk.shape[0])
        return torch.cat(out) if out else torch.empty(0, width - 1 - score_from)


# --------------------------------------------------------------------------- buckets and docs


def bucket_edges(edges: Sequence[int] | None, length: int, train_length: int) -> np.ndarray:
    """Bucket edges 0 = e_0 < e_1 < ... < e_k = length over window positions.

    ``edges=None`` (the config's ``auto``): powers of two below ``length`` plus the training length,
    so one bucket ends exactly where the trained positions end. Explicit edges outside (0, length)
    are dropped; 0 and ``length`` are always added.
    """
    length = int(length)
    if edges is None:
        inner = {2**k for k in range(max(1, length.bit_length()))} | {int(train_length)}
    else:
        inner = {int(e) for e in edges}
    inner = {e for e in inner if 0 < e < length}
    return np.array(sorted(inner | {0, length}), dtype=np.int64)


def bucket_index(edges: np.ndarray, length: int) -> np.ndarray:
    """Bucket of every position 0..length-1 (position p is in bucket b iff edges[b] <= p < edges[b+1])."""
    return np.searchsorted(edges, np.arange(length), side="right") - 1


def run_documents(docs: Sequence[Document], longest_length: int) -> list[Document]:
    """The run's document set: the documents with a window of ``longest_length`` tokens plus its
    last target (``longest_length + 1`` tokens), in their given order.

    Every metric reads only these, at every eval length, each truncated to that length. Raises a
    one-sentence ValueError if there is none.
    """
    need = int(longest_length) + 1
    selected = [d for d in docs if len(d) >= need]
    if not selected:
        raise ValueError(
            f"none of the {len(docs)} test documents has the {need} tokens needed for the longest "
            f"eval length {int(longest_length)} (the longest has "
            f"{max((len(d) for d in docs), default=0)} tokens); lower eval.lengths or use longer "
            "documents."
        )
    if len(selected) < len(docs):
        logger.info(
            "%d of %d test documents have the %d tokens of the longest eval length %d; every "
            "metric reads only these, at every eval length.",
            len(selected),
            len(docs),
            need,
            int(longest_length),
        )
    return selected


def select_documents(
    docs: Sequence[Document], min_tokens: int, count: int
) -> tuple[list[Document], int]:
    """Up to ``count`` documents with at least ``min_tokens`` tokens, spread evenly over the list.

    Returns (selected, number eligible). Evenly spaced picks (not the first ``count``) span the
    whole corpus order, and are deterministic without a seed. Given the run's document set
    (:func:`run_documents`), every document is eligible at every eval length of the run, so a
    metric reads the same documents at each of them.
    """
    eligible = [d for d in docs if len(d) >= int(min_tokens)]
    n = len(eligible)
    if count is None or int(count) >= n:
        return eligible, n
    count = int(count)
    return [eligible[(i * n) // count] for i in range(count)], n


def first_windows(docs: Sequence[Document], width: int) -> torch.Tensor:
    """The first ``width`` tokens of each document, stacked [D, width] (LongTensor)."""
    if not docs:
        return torch.empty(0, width, dtype=torch.long)
    return torch.stack([d.tensor(0, width) for d in docs])


def warn_no_docs(metric: str, length: int, min_tokens: int, n_docs: int) -> None:
    logger.warning(
        "%s at eval length %d skipped: none of the %d test documents has the %d tokens needed.",
        metric,
        length,
        n_docs,
        min_tokens,
    )


# --------------------------------------------------------------------------- statistics and rows


def bootstrap_ratio_ci(
    sums: np.ndarray,
    counts: np.ndarray,
    resamples: int,
    level: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap CI over documents of ratio means sum(sums)/sum(counts), per column.

    sums, counts: [D, K] per-document totals. Resampling documents (not tokens) respects the
    correlation of tokens within a document. Returns (lo [K], hi [K]); NaN when resamples == 0.
    """
    sums = np.atleast_2d(np.asarray(sums, dtype=np.float64))
    counts = np.atleast_2d(np.asarray(counts, dtype=np.float64))
    n_docs, k = sums.shape
    if resamples <= 0 or n_docs == 0:
        return np.full(k, np.nan), np.full(k, np.nan)
    weights = rng.multinomial(n_docs, np.full(n_docs, 1.0 / n_docs), size=int(resamples))
    weights = weights.astype(np.float64)  # [B, D]: how often each document was drawn
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = (weights @ sums) / (weights @ counts)  # [B, K]
    alpha = (1.0 - float(level)) / 2.0
    lo, hi = np.full(k, np.nan), np.full(k, np.nan)
    finite = np.isfinite(ratios).any(axis=0)
    if finite.any():
        lo[finite] = np.nanquantile(ratios[:, finite], alpha, axis=0)
        hi[finite] = np.nanquantile(ratios[:, finite], 1.0 - alpha, axis=0)
    return lo, hi


def ci_bounds(lo: float, hi: float) -> dict:
    """``ci_lo``/``ci_hi`` keyword arguments of :func:`make_row`; None (left out) where NaN."""
    return {
        "ci_lo": None if math.isnan(lo) else float(lo),
        "ci_hi": None if math.isnan(hi) else float(hi),
    }


def make_row(metric: str, value: float, n: int, eval_length: int, **optional) -> dict:
    """One result row; optional columns given as None are left out."""
    row = {"metric": metric, "value": float(value), "n": int(n), "eval_length": int(eval_length)}
    row.update({k: v for k, v in optional.items() if v is not None})
    return row
