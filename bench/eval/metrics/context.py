"""What every metric shares: the evaluation context and the measurement primitives.

:class:`EvalContext` runs the model (device, precision, batch sizing, progress bars, batched
per-token NLL, forward passes shared by the metrics of one eval length); the helpers pick the
run's document set (one for every eval length, so numbers at different lengths are on the same
documents), cut windows into position buckets, bootstrap over documents and build result rows
``{"metric", "value", "n", "eval_length"}`` + optional
``{"bucket_lo", "bucket_hi", "axis", "axis_value", "layer", "ci_lo", "ci_hi"}``.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.core.checks import integer
from bench.core.progress import progress_bar
from bench.core.runtime import autocast, forward_takes
from bench.data.corpora import Document
from models.lazy import F, nn, torch

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
    "windows_setting",
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
    # the token every scored window starts with (unscored), where the tokenizer starts each text
    # with one (a pretrained model's BOS): every window then has the form of a document's first
    # (bench.data.pretrained_documents.window_bos); None = windows start with the text
    window_bos: int | None = None
    # per-token NLL from hidden states with the LM head applied in chunks of positions (memory
    # independent of the vocabulary) where the model's forward takes ``targets``; False = from
    # the full [N, L, V] logits (the reference the chunked path is tested against)
    chunked_scoring: bool = True
    evaluator: Any = None  # eval.longppl's evaluator (bench.eval.metrics.longppl.Evaluator)
    # reuse of forward passes (reuse_forwards): per-token NLL by (window digest, position offset),
    # None outside a reuse block; wanted and kept hidden states by input digest
    _memo: dict | None = field(default=None, init=False, repr=False)
    _wanted: dict = field(default_factory=dict, init=False, repr=False)
    _hidden: dict = field(default_factory=dict, init=False, repr=False)
    # what a metric derives once per run and length (its documents, windows, trials): cached()
    _derived: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.autocast()  # an unknown precision fails here, not at the first forward pass

    def cached(self, key: tuple, build: Any) -> Any:
        """``build()``, once per key for this context (a metric's documents, windows or trials
        at one length, which each part of a split metric reads again)."""
        if key not in self._derived:
            self._derived[key] = build()
        return self._derived[key]

    def rows_per_batch(self, length: int) -> int:
        """Windows of ``length`` tokens per forward pass: batch_size, capped by max_batch_tokens."""
        rows = int(self.batch_size)
        if self.max_batch_tokens:
            rows = min(rows, int(self.max_batch_tokens) // max(int(length), 1))
        return max(1, rows)

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.device, self.precision)

    def bar(self, total: int, desc: str, unit: str = "win") -> Any:
        """A progress bar (:func:`bench.core.progress.progress_bar`: plain lines in a log)."""
        return progress_bar(
            total=total, desc=desc, unit=unit, leave=False, disable=not self.progress
        )

    def forward(self, input_ids: torch.Tensor, logits_from: int = 0, logits: bool = True, **kwargs):
        """The model's output for ``input_ids`` moved to the device, without autograd.

        ``logits_from`` = f: only the logits of tokens f..L-1 are wanted ([N, L - f, V]); a model
        whose forward takes ``logits_from`` skips the work for the others, for any other model
        the full logits are sliced. ``logits=False``: no logits are wanted (hidden states,
        attention entropy); a model whose forward takes ``return_logits`` then skips its LM head.
        """
        if not logits and forward_takes(type(self.model), "return_logits"):
            kwargs["return_logits"] = False
        with torch.no_grad(), self.autocast():
            if not logits_from:
                return self.model(input_ids.to(self.device), **kwargs)
            if forward_takes(type(self.model), "logits_from"):  # lenbench's models do
                return self.model(input_ids.to(self.device), logits_from=logits_from, **kwargs)
            out = copy.copy(self.model(input_ids.to(self.device), **kwargs))
            out.logits = out.logits[:, logits_from:]
            return out

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
        ``position_offset + arange(L)`` (the model's default when the offset is 0). One forward
        pass, never served from the reuse memo (:meth:`window_nll` is).
        """
        return self._forward_nll(tokens, position_offset, hidden_for={})

    def _forward_nll(
        self,
        tokens: torch.Tensor,
        position_offset: int,
        hidden_for: dict[bytes, int],
        score_from: int = 0,
    ) -> torch.Tensor:
        """:meth:`token_nll` of the targets from ``score_from`` on ([N, L - score_from]); also keeps
        the hidden states wanted (:meth:`want_hidden`) of the rows ``hidden_for`` (input digest ->
        row index in ``tokens``) from the same forward pass (which then scores every target)."""
        n, width = tokens.shape
        length = width - 1
        kwargs = {}
        if position_offset:
            kwargs["position_ids"] = torch.arange(length, device=self.device) + int(position_offset)
        if hidden_for:
            kwargs["output_hidden_states"] = True
            score_from = 0
        targets = tokens[:, 1 + score_from :]  # [N, L - score_from]
        if self.chunked_scoring and forward_takes(type(self.model), "targets"):
            out = self.forward(tokens[:, :-1], logits_from=score_from, targets=targets, **kwargs)
            nll = out.token_nll
        else:
            out = self.forward(tokens[:, :-1], logits_from=score_from, **kwargs)
            logits = out.logits  # [N, L - score_from, V]
            nll = F.cross_entropy(
                logits.float().reshape(targets.numel(), -1),
                targets.to(logits.device).reshape(-1),
                reduction="none",
            )
        for digest, row in hidden_for.items():
            layer, positions = self._wanted.pop(digest)
            index = torch.from_numpy(positions).to(out.hidden_states[layer].device)
            self._hidden[(digest, layer)] = (positions, out.hidden_states[layer][row, index].cpu())
        return nll.view(n, length - score_from).cpu()

    def window_nll(
        self,
        windows: torch.Tensor,
        position_offset: int = 0,
        desc: str | None = "",
        score_from: int = 0,
        remember: bool | Sequence[bool] = True,
    ) -> torch.Tensor:
        """Per-token NLL [M, L - score_from] of many windows [M, L+1], batched; keeps positions >= score_from.

        Inside :meth:`reuse_forwards`, a window already measured at the same position offset (by
        any metric at this eval length) is taken from the memo instead of being run again, and
        each window run here is added to it where ``remember`` (one flag, or one per window) says
        so. Outside it, every window is run. ``desc=None``: no progress bar of its own.
        """
        m, width = windows.shape
        out = torch.empty(m, width - 1)
        flags = [bool(remember)] * m if isinstance(remember, bool) else [bool(r) for r in remember]
        memo = self._memo
        keys: list[tuple | None] = [None] * m
        todo = list(range(m))
        if memo is not None:
            keys = [(_digest(row), int(position_offset)) for row in windows]
            todo = []
            for i, key in enumerate(keys):
                if key in memo:
                    out[i] = memo[key]
                else:
                    todo.append(i)
        step = self.rows_per_batch(width - 1)
        bar = self.bar(m, desc) if desc is not None else progress_bar(disable=True)
        with bar:
            bar.update(m - len(todo))
            for begin in range(0, len(todo), step):
                chunk = todo[begin : begin + step]
                wanted: dict[int, bytes] = {}  # window -> input digest, hidden states wanted
                if self._wanted and not position_offset:
                    for i in chunk:
                        digest = _digest(windows[i, :-1])
                        if digest in self._wanted:
                            wanted[i] = digest
                # the windows whose hidden states are kept run apart, so that only they hold
                # every layer's output: the peak memory stays that of a batch without them
                groups = [[i for i in chunk if i in wanted], [i for i in chunk if i not in wanted]]
                for rows in (g for g in groups if g):
                    hidden_for = {}  # input digest -> row in this batch
                    for j, i in enumerate(rows):
                        if i in wanted:
                            hidden_for.setdefault(wanted[i], j)
                    # the memo keeps whole rows; a pass whose rows are all forgotten scores only
                    # the positions asked for (the model then skips the rest of its last layer)
                    kept = memo is not None and any(flags[i] for i in rows)
                    first = 0 if kept or hidden_for else score_from
                    nll = self._forward_nll(windows[rows], int(position_offset), hidden_for, first)
                    out[rows, first:] = nll
                    if kept:
                        for j, i in enumerate(rows):
                            if flags[i]:
                                memo[keys[i]] = nll[j].clone()
                bar.update(len(chunk))
        return out[:, score_from:] if score_from else out

    # ------------------------------------------------------------------ reuse within one length

    @contextlib.contextmanager
    def reuse_forwards(self) -> Iterator[EvalContext]:
        """``with ctx.reuse_forwards():`` metrics share forward passes until the block ends.

        Inside the block, :meth:`window_nll` serves a window (same tokens, same position offset)
        from a memo of per-token NLL rows ([L] float32 each, so memory grows linearly with the
        length), and hidden states announced with :meth:`want_hidden` are kept from whichever
        forward pass reads those tokens first. The model, its scaling and the precision must not
        change inside the block: :func:`bench.eval.evaluate.evaluate_model` opens one per eval length.
        """
        if self._memo is not None:
            yield self  # nested: the outer block owns the memo
            return
        self._memo, self._wanted, self._hidden = {}, {}, {}
        try:
            yield self
        finally:
            self._memo, self._wanted, self._hidden = None, {}, {}

    def want_hidden(self, windows: torch.Tensor, layer: int, positions: np.ndarray) -> None:
        """Announce that :meth:`hidden_at` will ask for ``layer``'s hidden states of ``windows``
        [M, L] (the model's inputs) at ``positions``: a forward pass of :meth:`window_nll` at
        position offset 0 whose inputs are one of these windows keeps them. Only inside
        :meth:`reuse_forwards`; elsewhere it does nothing."""
        if self._memo is None:
            return
        positions = np.unique(np.asarray(positions, dtype=np.int64))  # sorted, for hidden_at
        for row in windows:
            self._wanted[_digest(row)] = (int(layer), positions)

    def hidden_at(
        self, windows: torch.Tensor, layer: int, positions: np.ndarray, desc: str = ""
    ) -> torch.Tensor:
        """Hidden states of ``layer`` at ``positions`` for every window [M, L]: [M, P, width] on
        the CPU in the model's dtype; kept ones (:meth:`want_hidden`) are not recomputed."""
        positions = np.asarray(positions, dtype=np.int64)
        if windows.shape[0] == 0:
            return torch.empty(0, positions.size, 0)
        parts: list[torch.Tensor | None] = [None] * windows.shape[0]
        todo = []
        for i, row in enumerate(windows):
            kept = self._hidden.get((_digest(row), int(layer))) if self._hidden else None
            if kept is not None:
                stored, states = kept  # stored: sorted positions
                index = np.searchsorted(stored, positions).clip(max=max(stored.size - 1, 0))
                if stored.size and (stored[index] == positions).all():
                    parts[i] = states[torch.from_numpy(index)]
                    continue
            todo.append(i)
        index = torch.from_numpy(positions)
        step = self.rows_per_batch(windows.shape[1])
        with self.bar(windows.shape[0], desc, unit="doc") as bar:
            bar.update(windows.shape[0] - len(todo))
            for begin in range(0, len(todo), step):
                rows = todo[begin : begin + step]
                out = self.forward(windows[rows], logits=False, output_hidden_states=True)
                hidden = out.hidden_states[layer]  # [B, L, width]
                states = hidden[:, index.to(hidden.device)].cpu()  # [B, P, width]
                for j, i in enumerate(rows):
                    parts[i] = states[j]
                bar.update(len(rows))
        return torch.stack(parts)  # type: ignore[arg-type]


def _digest(row: torch.Tensor) -> bytes:
    """A key for one row of token ids (its length and values)."""
    data = row.detach().to("cpu", torch.int64).contiguous().numpy().tobytes()
    return hashlib.blake2b(data, digest_size=16).digest()


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


def windows_setting(key: str, value: Any) -> str | int:
    """A ``max_windows`` field: "fill" (consecutive windows over the longest length's tokens, the
    same text at every length) or an integer N >= 1 (each document's first N windows)."""
    if value == "fill":
        return value
    if isinstance(value, str):
        raise ValueError(f"{key} must be 'fill' or an integer >= 1, got {value!r}.")
    return integer(key, value, 1)


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
