"""Analysis probes: how a model uses position and context, beyond its loss.

* ``shift_dnll``   NLL change when every position id is offset by delta (axis="delta");
* ``order_dnll``   NLL change on the final block when the context farther than d tokens back is
  shuffled in blocks (axis="distance");
* ``context_nll``  NLL of a fixed final block given c tokens of visible context (axis="context");
* ``attn_entropy`` mean attention entropy per layer and query-position bucket (layer + bucket).

Each probe reads the first tokens of up to ``max_docs`` documents of the run's document set
(``bench.eval.evaluate``), the same documents at every eval length. Everything is batched over windows
(no per-token Python loops); the fused attention path is used everywhere except attention
entropy, which asks the model for tile-computed entropies. Unmodified windows (the shift and
order base, the whole-window context) are the nll metric's first windows, so inside
``EvalContext.reuse_forwards`` (``bench.eval.evaluate``) they are not run again.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.data.corpora import Document
from bench.eval.metrics.context import (
    EvalContext,
    bootstrap_ratio_ci,
    bucket_edges,
    bucket_index,
    ci_bounds,
    first_windows,
    make_row,
    select_documents,
    warn_no_docs,
)
from bench.eval.metrics.probes_config import (
    AttentionProbeConfig,
    AttnEntropyConfig,
    ContextNllConfig,
    OrderDnllConfig,
    ShiftDnllConfig,
    context_top,
    grid_within,
    order_budget,
)
from bench.eval.metrics.registry import register_metric
from models.lazy import torch

__all__ = [
    "AttnEntropyConfig",
    "ContextNllConfig",
    "OrderDnllConfig",
    "ShiftDnllConfig",
    "attn_entropy_rows",
    "context_nll_rows",
    "order_dnll_rows",
    "shift_dnll_rows",
    "shuffle_far_context",
]

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- registered metrics


@register_metric("shift_dnll", config=ShiftDnllConfig)
def shift_dnll_metric(ctx: EvalContext, cfg: ShiftDnllConfig, docs, length: int) -> list[dict]:
    return shift_dnll_rows(
        ctx,
        docs,
        length,
        cfg.deltas or [],
        max_docs=cfg.max_docs,
        bootstrap=cfg.bootstrap,
        ci=cfg.ci,
        seed=ctx.seed,
    )


@register_metric("order_dnll", config=OrderDnllConfig)
def order_dnll_metric(ctx: EvalContext, cfg: OrderDnllConfig, docs, length: int) -> list[dict]:
    return order_dnll_rows(
        ctx,
        docs,
        length,
        cfg.distances,
        block=cfg.block,
        shuffle_block=cfg.shuffle_block,
        max_docs=cfg.max_docs,
        bootstrap=cfg.bootstrap,
        ci=cfg.ci,
        seed=ctx.seed,
    )


@register_metric("context_nll", config=ContextNllConfig)
def context_nll_metric(ctx: EvalContext, cfg: ContextNllConfig, docs, length: int) -> list[dict]:
    return context_nll_rows(
        ctx,
        docs,
        length,
        cfg.contexts,
        block=cfg.block,
        max_docs=cfg.max_docs,
        bootstrap=cfg.bootstrap,
        ci=cfg.ci,
        seed=ctx.seed,
    )


@register_metric("attn_entropy", config=AttnEntropyConfig)
def attn_entropy_metric(ctx: EvalContext, cfg: AttnEntropyConfig, docs, length: int) -> list[dict]:
    return attn_entropy_rows(
        ctx, docs, length, ctx.train_length, edges=cfg.buckets, max_docs=cfg.max_docs
    )


@dataclass
class AttnFirstMassConfig(AttentionProbeConfig):
    """``eval.attn_first_mass``: mean attention on the window's first token (the attention sink's
    usual place) per layer and query-position bucket; off unless a study asks for it."""

    enabled: bool = False
    lengths: Any = field(default_factory=lambda: ["1x", "4x"])  # eval lengths to run at


@register_metric("attn_first_mass", config=AttnFirstMassConfig)
def attn_first_mass_metric(
    ctx: EvalContext, cfg: AttnFirstMassConfig, docs, length: int
) -> list[dict]:
    return attn_entropy_rows(
        ctx,
        docs,
        length,
        ctx.train_length,
        edges=cfg.buckets,
        max_docs=cfg.max_docs,
        metric="attn_first_mass",
    )


# --------------------------------------------------------------------------- shared


def _diff_rows(
    metric: str,
    axis: str,
    eval_length: int,
    base: torch.Tensor,
    variants: dict[int, torch.Tensor],
    bootstrap: int,
    level: float,
    rng: np.random.Generator,
) -> list[dict]:
    """Rows of mean NLL(variant) - mean NLL(base) over the same tokens, with a paired doc bootstrap.

    base: [D, T] per-token NLL; variants: axis value -> [D, T] on the same tokens.
    """
    rows = []
    base_sum = base.double().sum(dim=1).numpy()
    counts = np.full((base.shape[0], 1), float(base.shape[1]))
    for value, nll in variants.items():
        diff = (nll.double().sum(dim=1).numpy() - base_sum)[:, None]
        lo, hi = bootstrap_ratio_ci(diff, counts, bootstrap, level, rng)
        rows.append(
            make_row(
                metric,
                diff.sum() / counts.sum(),
                base.numel(),
                eval_length,
                axis=axis,
                axis_value=int(value),
                **ci_bounds(lo[0], hi[0]),
            )
        )
    return rows


# --------------------------------------------------------------------------- shift


def shift_dnll_rows(
    ctx: EvalContext,
    docs: Sequence[Document],
    length: int,
    deltas: Sequence[int],
    *,
    max_docs: int,
    bootstrap: int = 0,
    ci: float = 0.95,
    seed: int = 0,
) -> list[dict]:
    """``shift_dnll``: mean NLL with position ids ``delta + arange(L)`` minus with ``arange(L)``.

    Same tokens (the first L+1 of each document), same windows; relative encodings (rope, alibi,
    nope) give 0 up to float error. A delta the model cannot embed (a learned table with
    ``out_of_range: error``) is skipped with a logged warning and gives no row; a model that
    takes no position ids (its ``position_ids_error``) gives no rows.
    """
    problem = ctx.position_ids_error()
    if problem is not None:  # e.g. a pretrained ALiBi model, which computes positions itself
        logger.warning("shift_dnll at eval length %d not applicable: %s.", length, problem)
        return []
    selected, _ = select_documents(docs, length + 1, max_docs)
    if not selected:
        warn_no_docs("shift_dnll", length, length + 1, len(docs))
        return []
    windows = first_windows(selected, length + 1)
    base = ctx.window_nll(windows, 0, desc=f"shift_dnll L={length} base")
    variants = {}
    for delta in sorted({int(d) for d in deltas if int(d) > 0}):
        problem = ctx.position_range_error(delta + length - 1, delta + length)
        if problem is not None:
            logger.warning(
                "shift_dnll delta=%d at eval length %d skipped: %s", delta, length, problem
            )
            continue
        variants[delta] = ctx.window_nll(
            windows, delta, desc=f"shift_dnll L={length} delta={delta}", remember=False
        )
    rng = np.random.default_rng([int(seed), int(length), 3])
    return _diff_rows("shift_dnll", "delta", length, base, variants, bootstrap, ci, rng)


# --------------------------------------------------------------------------- order


def shuffle_far_context(
    window: torch.Tensor, far_end: int, block: int, rng: np.random.Generator
) -> torch.Tensor:
    """Copy of ``window`` with ``window[:far_end]`` cut into blocks of ``block`` tokens, reordered.

    The last block may be shorter. The permutation is never the identity (reversed if drawn so),
    so the result differs from the input whenever there are two distinct blocks.
    """
    n_blocks = math.ceil(far_end / block)
    order = rng.permutation(n_blocks)
    if n_blocks > 1 and bool((order == np.arange(n_blocks)).all()):
        order = order[::-1].copy()
    index = torch.arange(far_end).split(block)
    perm = torch.cat([index[i] for i in order.tolist()])
    out = window.clone()
    out[:far_end] = window[perm]
    return out


def order_dnll_rows(
    ctx: EvalContext,
    docs: Sequence[Document],
    length: int,
    distances: Sequence[int] | None,
    *,
    block: int,
    shuffle_block: int | None = None,
    max_docs: int,
    bootstrap: int = 0,
    ci: float = 0.95,
    seed: int = 0,
) -> list[dict]:
    """``order_dnll``: NLL change on the final ``block`` tokens when the far context is shuffled.

    For distance d the window positions [0, L - block - d) (the context farther than d tokens
    before the final block) are cut into ``shuffle_block`` blocks and put in a seeded random order;
    the final block and the d tokens before it are untouched. ``distances=None`` means 0 plus
    powers of two from ``block``; distances that leave fewer than two blocks to shuffle are dropped.
    """
    shuffle_block = int(shuffle_block or block)
    budget = order_budget(length, block, shuffle_block)
    if budget < 0:
        logger.info("order_dnll at eval length %d skipped: too short for block %d.", length, block)
        return []
    if distances is None:
        distances = [0] + [2**k for k in range(budget.bit_length() + 1) if 2**k >= block]
    grid = grid_within(distances, budget)
    if not grid:
        return []
    selected, _ = select_documents(docs, length + 1, max_docs)
    if not selected:
        warn_no_docs("order_dnll", length, length + 1, len(docs))
        return []
    windows = first_windows(selected, length + 1)
    rng = np.random.default_rng([int(seed), int(length), 4])
    variants_in = {
        d: torch.stack(
            [shuffle_far_context(w, length - block - d, shuffle_block, rng) for w in windows]
        )
        for d in grid
    }
    score_from = length - block
    # the base windows are the nll metric's first windows: served from the reuse memo if it ran
    base = ctx.window_nll(windows, desc=f"order_dnll L={length} base", score_from=score_from)
    variants = {
        d: ctx.window_nll(
            v, desc=f"order_dnll L={length} d={d}", score_from=score_from, remember=False
        )
        for d, v in variants_in.items()
    }
    return _diff_rows("order_dnll", "distance", length, base, variants, bootstrap, ci, rng)


# --------------------------------------------------------------------------- context


def context_nll_rows(
    ctx: EvalContext,
    docs: Sequence[Document],
    length: int,
    contexts: Sequence[int] | None,
    *,
    block: int,
    max_docs: int,
    bootstrap: int = 0,
    ci: float = 0.95,
    seed: int = 0,
) -> list[dict]:
    """``context_nll``: NLL of the final ``block`` tokens of each window given c tokens before it.

    The scored block is fixed (targets L-block+1..L of the document); the model reads the c tokens
    before the block plus the block, as a fresh sequence from position 0. ``contexts=None`` means
    0, the powers of two below L - block, and L - block (the whole window).

    Scaling follows one rule for every method, as in the other metrics: the model is scaled as
    deployed and reads c + block tokens. A static method keeps the run's factor (set for the run's
    target length, not for L), and one that reads the current sequence (dynamic NTK, LongRoPE's
    short/long switch, log-n) sees the c + block tokens it reads, at positions 0..c+block-1. So
    the same c and block tokens give the same value at every eval length L; only an oracle
    scaling (a factor per L) differs.
    """
    top = context_top(length, block)
    if top < 0:
        logger.info("context_nll at eval length %d skipped: shorter than block %d.", length, block)
        return []
    if contexts is None:
        contexts = [0, top] + [2**k for k in range(max(1, top.bit_length()))]
    grid = grid_within(contexts, top)
    selected, _ = select_documents(docs, length + 1, max_docs)
    if not selected:
        warn_no_docs("context_nll", length, length + 1, len(docs))
        return []
    windows = first_windows(selected, length + 1)
    rng = np.random.default_rng([int(seed), int(length), 6])
    sums, counts = [], []
    for c in grid:
        nll = ctx.window_nll(  # c = top: the whole window, as read by nll (reuse memo)
            windows[:, top - c :],
            desc=f"context_nll L={length} c={c}",
            score_from=c,
            remember=c == top,
        )
        sums.append(nll.double().sum(dim=1).numpy())
        counts.append(np.full(nll.shape[0], float(nll.shape[1])))
    sums_arr, counts_arr = np.stack(sums, axis=1), np.stack(counts, axis=1)  # [D, C]
    lo, hi = bootstrap_ratio_ci(sums_arr, counts_arr, bootstrap, ci, rng)
    rows = []
    for j, c in enumerate(grid):
        rows.append(
            make_row(
                "context_nll",
                sums_arr[:, j].sum() / counts_arr[:, j].sum(),
                int(counts_arr[:, j].sum()),
                length,
                axis="context",
                axis_value=c,
                **ci_bounds(lo[j], hi[j]),
            )
        )
    return rows


# --------------------------------------------------------------------------- attention entropy


def attn_entropy_rows(
    ctx: EvalContext,
    docs: Sequence[Document],
    length: int,
    train_length: int,
    *,
    edges: Sequence[int] | None,
    max_docs: int,
    metric: str = "attn_entropy",
) -> list[dict]:
    """``attn_entropy``: mean attention entropy (nats) per layer and query-position bucket; or
    ``attn_first_mass``: mean attention on the window's first token (the first query's is 1: it
    sees only itself), from the same forward pass.

    Uses ``model(..., output_attn_entropy=True)``, which computes entropies in query tiles (never
    an L x L matrix). The mean is over documents, heads and the query positions in the bucket;
    ``n`` counts (document, query position) pairs. ``layer`` is the 0-based block index.
    """
    selected, _ = select_documents(docs, length, max_docs)
    if not selected:
        warn_no_docs(metric, length, length, len(docs))
        return []
    windows = first_windows(selected, length)
    bucket_edges_ = bucket_edges(edges, length, train_length)
    n_buckets = len(bucket_edges_) - 1
    buckets = torch.from_numpy(bucket_index(bucket_edges_, length))
    sums: torch.Tensor | None = None  # [layers, buckets] float64
    step = ctx.rows_per_batch(length)
    with ctx.bar(len(selected), f"{metric} L={length}", unit="doc") as bar:
        for start in range(0, windows.shape[0], step):
            chunk = windows[start : start + step]
            out = ctx.forward(chunk, logits=False, output_attn_entropy=True)
            entropies = out.attn_entropy if metric == "attn_entropy" else out.attn_first_mass
            if entropies is None:  # a model that does not report it (a pretrained one)
                logging.getLogger(__name__).warning(
                    "%s: this model does not report it; no rows at L=%d.", metric, length
                )
                return []
            per_position = torch.stack([e.float().mean(dim=1).sum(dim=0) for e in entropies])
            per_position = per_position.double().cpu()  # [layers, L]: head mean, doc sum
            part = torch.zeros(per_position.shape[0], n_buckets, dtype=torch.float64)
            part.index_add_(1, buckets, per_position)
            sums = part if sums is None else sums + part
            bar.update(chunk.shape[0])
    counts = np.bincount(buckets.numpy(), minlength=n_buckets) * len(selected)
    rows = []
    for layer in range(sums.shape[0]):
        for b in range(n_buckets):
            rows.append(
                make_row(
                    metric,
                    float(sums[layer, b]) / counts[b],
                    int(counts[b]),
                    length,
                    bucket_lo=int(bucket_edges_[b]),
                    bucket_hi=int(bucket_edges_[b + 1]),
                    layer=layer,
                )
            )
    return rows
