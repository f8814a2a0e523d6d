"""``nll``: length-bucketed per-token NLL of whole windows, the "train short, test long" metric.

Rows at each eval length: one per position bucket [bucket_lo, bucket_hi) of the window (value =
mean NLL in nats, n = scored tokens, ci = bootstrap over documents), plus one whole-window row
without bucket columns, ``axis="docs"``, ``axis_value`` = documents used and each document's
NLL sum and scored tokens (``doc_nll_sums``, ``doc_tokens``, in the run's document order). ``docs`` is the
run's document set (``bench.eval.evaluate``), so every length reads the same documents (up to
``max_docs``).

With ``max_windows: fill`` (the default) the whole-window row scores exactly the same tokens at
every length: each document's first S tokens (S = the longest length nll runs at, recorded in the
``span`` column), read as consecutive windows of the length (the ALiBi paper's nonoverlapping
evaluation); where the length does not divide S, the last window ends at S and scores only the
tokens the previous windows left, so a ratio between two lengths measures the window, not which
text was scored. ``max_windows: N`` scores each document's first N windows (1 = the first only).

With a pretrained model whose tokenizer starts texts with a BOS, every window starts with that
BOS as its (unscored) first input, as the document's first window does (``EvalContext.
window_bos``), so no length gets more BOS-less window starts than another.

Bucket rows come from each document's **first window** only: bucket [lo, hi) then holds the same
tokens (document positions lo..hi) at every length that reaches hi, so the bucket table can put
lengths side by side. With one window per document the buckets' ``n`` add up to the whole-window
row's. Called directly with a document too short, it skips it; with none long enough, the
whole-window row is still written with value NaN, n=0 and axis_value=0, and a warning is logged
(never padding).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.core.checks import choice, integer
from bench.data.corpora import Document
from bench.eval.metrics.context import (
    EvalContext,
    bootstrap_ratio_ci,
    bucket_edges,
    bucket_index,
    ci_bounds,
    make_row,
    select_documents,
    windows_setting,
)
from bench.eval.metrics.registry import (
    METRICS,
    BootstrapConfig,
    Split,
    grid_field,
    register_metric,
    split_rows,
)
from models.lazy import torch

__all__ = ["NLL_PROTOCOLS", "NllConfig", "nll_rows", "nll_windows"]

logger = logging.getLogger(__name__)

NLL_PROTOCOLS = ("nonoverlapping", "sliding")


@dataclass
class NllConfig(BootstrapConfig):
    """``eval.nll``: per-token NLL (nats) by position bucket in the window, plus a whole-window row."""

    max_docs: int = 64
    # nonoverlapping | sliding (score only the tokens the previous window did not)
    protocol: str = "nonoverlapping"
    stride: int = 256  # sliding stride in tokens (capped at the eval length)
    # consecutive windows per document: "fill" = as many as fit in the longest nll length (tile
    # it), so every length scores the same tokens; N = at most N from the start (1 = the first)
    max_windows: Any = "fill"
    # bucket edges: auto = powers of two + the training length, or a list
    buckets: Any = grid_field("auto")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.protocol = choice(self.key("protocol"), self.protocol, NLL_PROTOCOLS)
        self.stride = integer(self.key("stride"), self.stride, 1)
        self.max_windows = windows_setting(self.key("max_windows"), self.max_windows)

    def span_at(self, length: int) -> int | None:
        """Under ``fill``: S, the tokens of each document scored at every length (the longest
        length nll runs at, ``lengths`` resolved to tokens); None for ``max_windows: N``."""
        if self.max_windows != "fill":
            return None
        return max(self.lengths or [length])


def _settings(cfg: NllConfig, length: int) -> dict[str, Any]:
    """:func:`nll_rows`' keyword arguments for the section ``cfg`` at ``length``."""
    return dict(
        protocol=cfg.protocol,
        stride=cfg.stride,
        max_docs=cfg.max_docs,
        max_windows=cfg.max_windows if cfg.max_windows != "fill" else None,
        span=cfg.span_at(length),
        buckets=cfg.buckets,
        bootstrap=cfg.bootstrap,
        ci=cfg.ci,
    )


def _items(ctx: EvalContext, cfg: NllConfig, docs: Sequence[Document], length: int) -> int:
    return len(_selection(ctx, docs, length, **_settings(cfg, length))[1])


def _measure(
    ctx: EvalContext, cfg: NllConfig, docs: Sequence[Document], length: int, items: range
) -> dict:
    selected, windows = _selection(ctx, docs, length, **_settings(cfg, length))
    payload = _measure_windows(ctx, selected, windows[items.start : items.stop], length)
    return {**payload, "train_length": ctx.train_length, "seed": ctx.seed}


def _combine(cfg: NllConfig, length: int, payloads: list[dict | None]) -> list[dict]:
    first = payloads[0]
    kw = _settings(cfg, length)
    return _rows_from(payloads, length, int(first["train_length"]), seed=int(first["seed"]), **kw)


@register_metric(
    "nll",
    config=NllConfig,
    split=Split(_items, _measure, _combine),  # a part: one batch of windows
)
def nll_metric(
    ctx: EvalContext, cfg: NllConfig, docs: Sequence[Document], length: int
) -> list[dict]:
    return split_rows(METRICS["nll"].split, ctx, cfg, docs, length, desc=f"nll L={length}")


def nll_windows(
    doc_len: int,
    length: int,
    max_windows: int | None,
    protocol: str,
    stride: int,
    span: int | None = None,
) -> list[tuple[int, int]]:
    """(start, score_from) of each window of one document; a window reads tokens[start:start+length+1].

    The scored span is the first ``span`` targets (``fill``; the document needs ``span + 1``
    tokens, else there are no windows), or with ``span`` None the first ``n * length`` targets,
    n = min(max_windows, (doc_len-1) // length). ``nonoverlapping`` windows start every
    ``length`` tokens, and where ``length`` does not divide the span a last window ends exactly
    at the span's end; ``sliding`` starts windows every ``stride`` tokens (the last one ends at
    the span's end). Each window scores only the targets the windows before it left, so every
    target of the span is scored exactly once, and ``stride == length`` is the nonoverlapping
    protocol.
    """
    length, doc_len = int(length), int(doc_len)
    if span is None:
        span = min(int(max_windows), (doc_len - 1) // length) * length
    elif doc_len - 1 < int(span):
        return []
    span = int(span)
    if span < length:
        return []
    step = length if protocol == "nonoverlapping" else min(int(stride), length)
    starts = list(range(0, span - length + 1, step))
    if starts[-1] != span - length:
        starts.append(span - length)
    out, scored_until = [], 0
    for start in starts:
        out.append((start, scored_until - start))
        scored_until = start + length
    return out


def nll_rows(
    ctx: EvalContext,
    docs: Sequence[Document],
    length: int,
    train_length: int,
    *,
    protocol: str = "nonoverlapping",
    stride: int | None = None,
    max_docs: int = 64,
    max_windows: int | None = 1,
    span: int | None = None,
    buckets: Sequence[int] | None = None,
    bootstrap: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
) -> list[dict]:
    """``nll`` rows at one eval length (see the module doc for the rows). ``span``: score each
    document's first ``span`` tokens (``fill``), else its first ``max_windows`` windows."""
    choice = dict(protocol=protocol, stride=stride, max_docs=max_docs, max_windows=max_windows)
    selected, windows = _selection(ctx, docs, length, span=span, **choice)
    step = ctx.rows_per_batch(length)  # one payload per forward batch, as a shard measures them
    payloads = []
    with ctx.bar(len(windows), f"nll L={length}") as bar:
        for begin in range(0, len(windows), step):
            payloads.append(_measure_windows(ctx, selected, windows[begin : begin + step], length))
            bar.update(len(payloads[-1]["doc"]))
    payloads = payloads or [_measure_windows(ctx, selected, [], length)]
    return _rows_from(
        payloads, length, train_length, span=span, buckets=buckets, bootstrap=bootstrap, ci=ci,
        seed=seed,
    )  # fmt: skip


def _selection(
    ctx: EvalContext,
    docs: Sequence[Document],
    length: int,
    *,
    protocol: str,
    stride: int | None,
    max_docs: int,
    max_windows: int | None,
    span: int | None,
    **_: Any,
) -> tuple[list[Document], list[tuple[int, int, int]]]:
    """(documents read, their windows (document index, start, score_from) in run order) at
    ``length``, derived once per context."""
    if span is not None and int(span) < length:
        raise ValueError(f"nll span {span} is shorter than the eval length {length}.")

    def build() -> tuple[list[Document], list[tuple[int, int, int]]]:
        selected = _long_enough_documents(docs, length, span, max_docs)
        windows = [
            (d, start, score_from)
            for d, doc in enumerate(selected)
            for start, score_from in nll_windows(
                len(doc), length, max_windows, protocol, stride or length, span
            )
        ]
        return selected, windows

    key = ("nll", id(docs), len(docs), length, protocol, stride, max_docs, max_windows, span)
    return ctx.cached(key, build)


def _rows_from(
    payloads: list[dict | None],
    length: int,
    train_length: int,
    *,
    span: int | None,
    buckets: Sequence[int] | None,
    bootstrap: int,
    ci: float,
    seed: int,
    **_: Any,
) -> list[dict]:
    """The rows from every batch's payload (:func:`_measure_windows`), in run order."""
    n_docs = int(payloads[0]["docs"])
    if not n_docs:
        return [make_row("nll", float("nan"), 0, length, axis="docs", axis_value=0)]
    edges = bucket_edges(buckets, length, train_length)
    all_sums, all_counts = _window_sums(payloads, n_docs, length, edges)  # [D, K + 1]
    rng = np.random.default_rng([int(seed), int(length), 1])
    # the whole window is one more column, so its CI comes from the same resamples
    lo, hi = bootstrap_ratio_ci(all_sums, all_counts, bootstrap, ci, rng)
    return _bucket_rows(all_sums, all_counts, lo, hi, edges, length, span)


def _long_enough_documents(
    docs: Sequence[Document], length: int, span: int | None, max_docs: int
) -> list[Document]:
    """Up to ``max_docs`` documents that hold the scored span plus one token, logging the rest."""
    need = (int(span) if span is not None else length) + 1
    selected, n_eligible = select_documents(docs, need, max_docs)
    if n_eligible < len(docs):
        logger.info(
            "nll at eval length %d: %d of %d test documents are shorter than %d tokens and are skipped.",
            length,
            len(docs) - n_eligible,
            len(docs),
            need,
        )
    if not selected:
        logger.warning(
            "nll at eval length %d: no test document has the %d tokens needed; writing an empty "
            "(NaN, n=0) whole-window row.",
            length,
            need,
        )
    return selected


def _measure_windows(
    ctx: EvalContext,
    selected: Sequence[Document],
    windows: Sequence[tuple[int, int, int]],
    length: int,
) -> dict[str, Any]:
    """Per-token NLL of ``windows`` (one forward batch, or none): what :func:`_window_sums`
    adds up, as arrays (a shard's payload, ``bench.core.shards``)."""
    if not windows:
        empty = np.zeros(0, dtype=np.int64)
        return {"docs": len(selected), "doc": empty, "score_from": empty, "first": empty,
                "nll": np.zeros((0, length), dtype=np.float32)}  # fmt: skip
    tokens = torch.stack([selected[d].tensor(s, s + length + 1) for d, s, _ in windows])
    if ctx.window_bos is not None:
        # every window starts as a document does: BOS, then the window's targets (the
        # replaced token is input only, scored by the window before)
        tokens[:, 0] = ctx.window_bos
    # a document's first window is what the probes read too: remember it for them
    first = [s == 0 for _, s, _ in windows]
    # sliding windows after a document's first score only their last tokens
    low = min(f for _, _, f in windows)
    nll = ctx.window_nll(tokens, desc=None, remember=first, score_from=low)  # [B, L - low]
    return {
        "docs": len(selected),
        "doc": np.array([d for d, _, _ in windows], dtype=np.int64),
        "score_from": np.array([f for _, _, f in windows], dtype=np.int64),
        "first": np.array(first, dtype=bool),
        "nll": nll.numpy(),  # float32
    }


def _window_sums(
    payloads: Sequence[dict[str, Any]], n_docs: int, length: int, edges: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Summed NLL and scored tokens per document, [D, K + 1] each: K position buckets of the
    document's first window, then every scored token of every window (the whole-window column);
    added up batch by batch in run order, so that a shard's payloads give the same sums."""
    n_buckets = len(edges) - 1
    bucket_of = torch.from_numpy(bucket_index(edges, length))  # [L]
    # buckets: first windows only (the same tokens at every length); whole: every window
    sums = torch.zeros(n_docs * n_buckets, dtype=torch.float64)
    counts = torch.zeros(n_docs * n_buckets, dtype=torch.float64)
    doc_sums = torch.zeros(n_docs, dtype=torch.float64)
    doc_counts = torch.zeros(n_docs, dtype=torch.float64)
    positions = torch.arange(length)
    for batch in payloads:
        if not len(batch["doc"]):
            continue
        nll = torch.from_numpy(np.asarray(batch["nll"], dtype=np.float32)).double()
        low = length - nll.shape[1]
        doc_ids = torch.from_numpy(np.asarray(batch["doc"], dtype=np.int64))
        score_from = torch.from_numpy(np.asarray(batch["score_from"], dtype=np.int64))
        scored = positions[None, low:] >= score_from[:, None]  # [B, L - low]
        docs_of = doc_ids[:, None].expand_as(scored)  # [B, L - low]
        doc_sums.index_add_(0, docs_of[scored], nll[scored])
        doc_counts.index_add_(0, docs_of[scored], torch.ones_like(nll[scored]))
        in_first = scored & torch.from_numpy(np.asarray(batch["first"], dtype=bool))[:, None]
        cell = doc_ids[:, None] * n_buckets + bucket_of[None, low:]  # [B, L - low]
        sums.index_add_(0, cell[in_first], nll[in_first])
        counts.index_add_(0, cell[in_first], torch.ones_like(nll[in_first]))
    sums_arr = sums.view(n_docs, n_buckets).numpy()  # [D, K]
    counts_arr = counts.view(n_docs, n_buckets).numpy()  # [D, K]
    all_sums = np.concatenate([sums_arr, doc_sums.numpy()[:, None]], axis=1)
    all_counts = np.concatenate([counts_arr, doc_counts.numpy()[:, None]], axis=1)
    return all_sums, all_counts


def _bucket_rows(
    all_sums: np.ndarray,
    all_counts: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    edges: np.ndarray,
    length: int,
    span: int | None,
) -> list[dict]:
    """One row per scored bucket, then the whole-window row (``all_*``: [D, K + 1])."""
    totals, token_counts = all_sums.sum(0), all_counts.sum(0)  # [K + 1]
    rows = []
    for b in range(len(edges) - 1):
        if token_counts[b] == 0:
            continue  # sliding windows leave early buckets of later windows unscored
        rows.append(
            make_row(
                "nll",
                totals[b] / token_counts[b],
                token_counts[b],
                length,
                bucket_lo=int(edges[b]),
                bucket_hi=int(edges[b + 1]),
                span=span,
                **ci_bounds(lo[b], hi[b]),
            )
        )
    rows.append(
        make_row(
            "nll",
            totals[-1] / token_counts[-1],
            token_counts[-1],
            length,
            axis="docs",
            axis_value=len(all_sums),
            span=span,
            # per document, in the run's document order: what a seed x document bootstrap resamples
            doc_nll_sums=[float(x) for x in all_sums[:, -1]],
            doc_tokens=[float(x) for x in all_counts[:, -1]],
            **ci_bounds(lo[-1], hi[-1]),
        )
    )
    return rows
