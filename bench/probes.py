"""Measurement primitives and the analysis probes of an evaluation.

Primitives shared by every metric: :class:`EvalContext` (model, device, precision, batching,
progress bars, batched per-token NLL), position buckets, document selection and a bootstrap over
documents. Probes, each returning result rows (see ``bench.evaluate`` for the row format):

* :func:`shift_dnll_rows`   NLL change when every position id is offset by ``delta``;
* :func:`order_dnll_rows`   NLL change on the final block when the context farther than ``d``
  tokens back is shuffled in blocks;
* :func:`context_nll_rows`  NLL of a fixed final block given ``c`` tokens of visible context;
* :func:`attn_entropy_rows` mean attention entropy per layer and query-position bucket;
* :func:`position_probe_rows` R^2 of a ridge probe decoding absolute position from hidden states.

Everything is batched over windows (no per-token Python loops); the fused attention path is used
everywhere except :func:`attn_entropy_rows`, which asks the model for tile-computed entropies.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from bench.corpora import Document

__all__ = [
    "EvalContext",
    "attn_entropy_rows",
    "bootstrap_ratio_ci",
    "bucket_edges",
    "bucket_index",
    "context_nll_rows",
    "order_dnll_rows",
    "position_probe_rows",
    "position_range_error",
    "r2_score",
    "ridge_fit",
    "ridge_predict",
    "select_documents",
    "shift_dnll_rows",
    "shuffle_far_context",
]

logger = logging.getLogger(__name__)

from bench.runtime import PRECISIONS  # noqa: E402  (re-exported for callers)

# --------------------------------------------------------------------------- context


@dataclass
class EvalContext:
    """What every metric needs to run the model: device, precision, batch sizing, progress bars."""

    model: nn.Module
    device: str | torch.device = "cpu"
    precision: str = "fp32"
    batch_size: int = 8
    max_batch_tokens: int | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"eval precision {self.precision!r} is unknown; allowed: {', '.join(PRECISIONS)}."
            )

    def rows_per_batch(self, length: int) -> int:
        """Windows of ``length`` tokens per forward pass: batch_size, capped by max_batch_tokens."""
        rows = int(self.batch_size)
        if self.max_batch_tokens:
            rows = min(rows, int(self.max_batch_tokens) // max(int(length), 1))
        return max(1, rows)

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast when asked for (the model keeps angles and softmax statistics in fp32)."""
        if self.precision == "bf16":
            return torch.autocast(device_type=torch.device(self.device).type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def bar(self, total: int, desc: str, unit: str = "win") -> tqdm:
        return tqdm(total=total, desc=desc, unit=unit, leave=False, disable=not self.progress)

    def forward(self, input_ids: torch.Tensor, **kwargs):
        """The model's output for ``input_ids`` moved to the device, without autograd."""
        with torch.no_grad(), self.autocast():
            return self.model(input_ids.to(self.device), **kwargs)

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


def position_range_error(model: nn.Module, max_position: int, seq_len: int) -> str | None:
    """Why ``model`` cannot embed position ``max_position`` in a ``seq_len`` sequence, or None.

    Only a learned table with ``out_of_range: error`` (or a stretch that still leaves the table)
    refuses positions; asking its embedding lookup for the one position is cheap and follows the
    model's own policy exactly (linear scaling, interpolation), so no rule is duplicated here.
    """
    cfg = getattr(model, "position_cfg", None)
    if cfg is None or getattr(cfg, "kind", None) != "learned":
        return None
    try:
        device = model.pos_table.device
        model._absolute_positions(torch.tensor([[int(max_position)]], device=device), int(seq_len))
    except ValueError as err:
        return str(err)
    return None


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


def select_documents(
    docs: Sequence[Document], min_tokens: int, count: int
) -> tuple[list[Document], int]:
    """Up to ``count`` documents with at least ``min_tokens`` tokens, spread evenly over the list.

    Returns (selected, number eligible). Evenly spaced picks (not the first ``count``) span the
    whole corpus order, and are deterministic without a seed.
    """
    eligible = [d for d in docs if len(d) >= int(min_tokens)]
    n = len(eligible)
    if count is None or int(count) >= n:
        return eligible, n
    count = int(count)
    return [eligible[(i * n) // count] for i in range(count)], n


def _first_windows(docs: Sequence[Document], width: int) -> torch.Tensor:
    """The first ``width`` tokens of each document, stacked [D, width] (LongTensor)."""
    if not docs:
        return torch.empty(0, width, dtype=torch.long)
    return torch.stack([d.tensor(0, width) for d in docs])


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


def _row(metric: str, value: float, n: int, eval_length: int, **optional) -> dict:
    row = {"metric": metric, "value": float(value), "n": int(n), "eval_length": int(eval_length)}
    row.update({k: v for k, v in optional.items() if v is not None})
    return row


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
            _row(
                metric,
                diff.sum() / counts.sum(),
                base.numel(),
                eval_length,
                axis=axis,
                axis_value=int(value),
                ci_lo=None if math.isnan(lo[0]) else float(lo[0]),
                ci_hi=None if math.isnan(hi[0]) else float(hi[0]),
            )
        )
    return rows


def _no_docs(metric: str, length: int, min_tokens: int, n_docs: int) -> None:
    logger.warning(
        "%s at eval length %d skipped: none of the %d test documents has the %d tokens needed.",
        metric,
        length,
        n_docs,
        min_tokens,
    )


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
    ``out_of_range: error``) is skipped with a logged warning and gives no row.
    """
    selected, _ = select_documents(docs, length + 1, max_docs)
    if not selected:
        _no_docs("shift_dnll", length, length + 1, len(docs))
        return []
    windows = _first_windows(selected, length + 1)
    base = ctx.window_nll(windows, 0, desc=f"shift_dnll L={length} base")
    variants = {}
    for delta in sorted({int(d) for d in deltas if int(d) > 0}):
        problem = position_range_error(ctx.model, delta + length - 1, length)
        if problem is not None:
            logger.warning(
                "shift_dnll delta=%d at eval length %d skipped: %s", delta, length, problem
            )
            continue
        variants[delta] = ctx.window_nll(
            windows, delta, desc=f"shift_dnll L={length} delta={delta}"
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
    budget = length - block - 2 * shuffle_block  # largest d that still shuffles two blocks
    if budget < 0:
        logger.info("order_dnll at eval length %d skipped: too short for block %d.", length, block)
        return []
    if distances is None:
        distances = [0] + [2**k for k in range(budget.bit_length() + 1) if 2**k >= block]
    grid = sorted({int(d) for d in distances if 0 <= int(d) <= budget})
    if not grid:
        return []
    selected, _ = select_documents(docs, length + 1, max_docs)
    if not selected:
        _no_docs("order_dnll", length, length + 1, len(docs))
        return []
    windows = _first_windows(selected, length + 1)
    rng = np.random.default_rng([int(seed), int(length), 4])
    variants_in = {
        d: torch.stack(
            [shuffle_far_context(w, length - block - d, shuffle_block, rng) for w in windows]
        )
        for d in grid
    }
    score_from = length - block
    base = ctx.window_nll(windows, desc=f"order_dnll L={length} base", score_from=score_from)
    variants = {
        d: ctx.window_nll(v, desc=f"order_dnll L={length} d={d}", score_from=score_from)
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
    """
    top = length - block
    if top < 0:
        logger.info("context_nll at eval length %d skipped: shorter than block %d.", length, block)
        return []
    if contexts is None:
        contexts = [0, top] + [2**k for k in range(max(1, top.bit_length()))]
    grid = sorted({int(c) for c in contexts if 0 <= int(c) <= top})
    selected, _ = select_documents(docs, length + 1, max_docs)
    if not selected:
        _no_docs("context_nll", length, length + 1, len(docs))
        return []
    windows = _first_windows(selected, length + 1)
    rng = np.random.default_rng([int(seed), int(length), 6])
    sums, counts = [], []
    for c in grid:
        nll = ctx.window_nll(
            windows[:, top - c :], desc=f"context_nll L={length} c={c}", score_from=c
        )
        sums.append(nll.double().sum(dim=1).numpy())
        counts.append(np.full(nll.shape[0], float(nll.shape[1])))
    sums_arr, counts_arr = np.stack(sums, axis=1), np.stack(counts, axis=1)  # [D, C]
    lo, hi = bootstrap_ratio_ci(sums_arr, counts_arr, bootstrap, ci, rng)
    rows = []
    for j, c in enumerate(grid):
        rows.append(
            _row(
                "context_nll",
                sums_arr[:, j].sum() / counts_arr[:, j].sum(),
                int(counts_arr[:, j].sum()),
                length,
                axis="context",
                axis_value=c,
                ci_lo=None if math.isnan(lo[j]) else float(lo[j]),
                ci_hi=None if math.isnan(hi[j]) else float(hi[j]),
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
) -> list[dict]:
    """``attn_entropy``: mean attention entropy (nats) per layer and query-position bucket.

    Uses ``model(..., output_attn_entropy=True)``, which computes entropies in query tiles (never
    an L x L matrix). The mean is over documents, heads and the query positions in the bucket;
    ``n`` counts (document, query position) pairs. ``layer`` is the 0-based block index.
    """
    selected, _ = select_documents(docs, length, max_docs)
    if not selected:
        _no_docs("attn_entropy", length, length, len(docs))
        return []
    windows = _first_windows(selected, length)
    bucket_edges_ = bucket_edges(edges, length, train_length)
    n_buckets = len(bucket_edges_) - 1
    buckets = torch.from_numpy(bucket_index(bucket_edges_, length))
    sums: torch.Tensor | None = None  # [layers, buckets] float64
    step = ctx.rows_per_batch(length)
    with ctx.bar(len(selected), f"attn_entropy L={length}", unit="doc") as bar:
        for start in range(0, windows.shape[0], step):
            chunk = windows[start : start + step]
            entropies = ctx.forward(chunk, output_attn_entropy=True).attn_entropy
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
                _row(
                    "attn_entropy",
                    float(sums[layer, b]) / counts[b],
                    int(counts[b]),
                    length,
                    bucket_lo=int(bucket_edges_[b]),
                    bucket_hi=int(bucket_edges_[b + 1]),
                    layer=layer,
                )
            )
    return rows


# --------------------------------------------------------------------------- position probe


def ridge_fit(x: np.ndarray, y: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Closed-form ridge regression y ~ x: returns (weights [D], feature mean [D], target mean).

    The penalty is ``alpha * trace(X'X) / D`` on centred features, so ``alpha`` does not depend
    on the scale of the hidden states; the intercept is not penalised.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    x_mean, y_mean = x.mean(axis=0), float(y.mean())
    xc = x - x_mean
    gram = xc.T @ xc
    dim = gram.shape[0]
    penalty = float(alpha) * (np.trace(gram) / dim if np.trace(gram) > 0 else 1.0)
    weights = np.linalg.solve(gram + penalty * np.eye(dim), xc.T @ (y - y_mean))
    return weights, x_mean, y_mean


def ridge_predict(model: tuple[np.ndarray, np.ndarray, float], x: np.ndarray) -> np.ndarray:
    weights, x_mean, y_mean = model
    return (np.asarray(x, dtype=np.float64) - x_mean) @ weights + y_mean


def r2_score(y: np.ndarray, prediction: np.ndarray) -> float:
    """1 - SSE / SST around the mean of ``y`` itself (NaN if y is constant)."""
    y = np.asarray(y, dtype=np.float64)
    sst = float(((y - y.mean()) ** 2).sum())
    if sst == 0:
        return float("nan")
    return 1.0 - float(((y - prediction) ** 2).sum()) / sst


def _spread_positions(lo: int, hi: int, count: int) -> np.ndarray:
    """Up to ``count`` evenly spaced integer positions in [lo, hi)."""
    if hi <= lo:
        return np.empty(0, dtype=np.int64)
    if hi - lo <= count:
        return np.arange(lo, hi)
    return np.unique(np.linspace(lo, hi - 1, count).round().astype(np.int64))


def _hidden_at(
    ctx: EvalContext, windows: torch.Tensor, layer: int, positions: np.ndarray, desc: str
) -> np.ndarray:
    """Hidden states of ``layer`` at ``positions`` for every window: [D * P, width] float64."""
    index = torch.from_numpy(positions)
    step = ctx.rows_per_batch(windows.shape[1])
    parts = []
    with ctx.bar(windows.shape[0], desc, unit="doc") as bar:
        for start in range(0, windows.shape[0], step):
            chunk = windows[start : start + step]
            hidden = ctx.forward(chunk, output_hidden_states=True).hidden_states[layer]
            parts.append(hidden[:, index.to(hidden.device)].double().cpu())  # [B, P, width]
            bar.update(chunk.shape[0])
    return torch.cat(parts).reshape(-1, parts[0].shape[-1]).numpy()


def position_probe_rows(
    ctx: EvalContext,
    docs: Sequence[Document],
    length: int,
    train_length: int,
    *,
    layer: int | None,
    fit_docs: int,
    test_docs: int,
    positions_per_doc: int,
    ridge: float,
) -> list[dict]:
    """``position_probe_r2``: R^2 of a ridge probe from one layer's hidden states to position.

    The probe is fitted on positions inside the training length of ``fit_docs`` documents and
    scored on other documents at positions inside (axis_value "inside") and, when
    length > train_length, beyond it ("beyond"). R^2 is computed around each region's own mean.
    ``layer`` indexes ``hidden_states`` (0 = embeddings output, i = after block i; None = middle).
    """
    n_layers = int(ctx.model.model_cfg.n_layers)
    layer = n_layers // 2 if layer is None else int(layer)
    if not 0 <= layer <= n_layers:
        raise ValueError(
            f"position probe layer {layer} is out of range; allowed: 0..{n_layers} (0 = embeddings)."
        )
    selected, _ = select_documents(docs, length, int(fit_docs) + int(test_docs))
    if len(selected) < 2:
        logger.warning(
            "position_probe_r2 at eval length %d skipped: needs two documents with %d tokens, found %d.",
            length,
            length,
            len(selected),
        )
        return []
    n_fit = min(len(selected) - 1, max(1, round(len(selected) * fit_docs / (fit_docs + test_docs))))
    windows = _first_windows(selected, length)
    inside = _spread_positions(0, min(train_length, length), positions_per_doc)
    beyond = _spread_positions(train_length, length, positions_per_doc)
    x_fit = _hidden_at(ctx, windows[:n_fit], layer, inside, f"probe fit L={length}")
    y_fit = np.tile(inside, n_fit).astype(np.float64)
    probe = ridge_fit(x_fit, y_fit, ridge)
    n_test = windows.shape[0] - n_fit
    both = np.concatenate([inside, beyond])
    x_test = _hidden_at(ctx, windows[n_fit:], layer, both, f"probe test L={length}")
    x_test = x_test.reshape(n_test, both.size, -1)
    rows = []
    for region, part in (("inside", slice(0, inside.size)), ("beyond", slice(inside.size, None))):
        positions = both[part]
        if positions.size < 2:
            continue
        x = x_test[:, part].reshape(-1, x_test.shape[-1])
        y = np.tile(positions, n_test).astype(np.float64)
        rows.append(
            _row(
                "position_probe_r2",
                r2_score(y, ridge_predict(probe, x)),
                y.size,
                length,
                axis="region",
                axis_value=region,
                layer=layer,
            )
        )
    return rows
