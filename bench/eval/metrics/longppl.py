"""``longppl``: perplexity on the tokens that need long context (LongPPL, Fang et al., ICLR 2025).

Per test window of ``length`` tokens, a fixed **evaluator** model scores every token twice: with
the whole window before it (full) and with a short context (the window cut to start ``K`` tokens
before a block of ``W`` targets, so each target sees between K and K + W - 1 tokens: the
reference's ``trunc_len`` and ``sliding_window``). A token is **key** when its full-context
log-probability exceeds the short one by more than ``alpha`` (LSD) and is above ``beta`` (LCL):
``nll_short - nll_full > alpha`` and ``nll_full < -beta``, as the reference's ``find_key_token``
(tested against the ``longppl`` package). The judged model's LongPPL at that length is
``exp(mean NLL over the key tokens)`` of every selected document, pooled (tokens, not documents,
weigh alike, as perplexity does). With ``max_windows: fill`` (the default, as ``nll``'s) each
document's first S tokens (S the longest LongPPL length) are read as consecutive windows of the
length, so every length judges the same text and a ratio between two lengths measures the
window, not which tokens were scored (where the length does not divide S, the last window ends
at S and counts only the targets the windows before it left); ``max_windows: 1`` reads each
document's first window only.

With ``key_set: longest`` (issue #73 item 5; default ``per_length``, as above) the key tokens are
chosen once per document, by the evaluator at the longest LongPPL length, and the same tokens are
scored at every length (those every length judges: a window's first token is no target), so a
ratio between two lengths measures the judged model's window alone; it needs ``max_windows: fill``.
Per length, the key tokens of a longer window are other tokens, those whose prediction needs the
context the shorter window lacks, so per-length LongPPL rises with the window even where
perplexity stays flat.

The key tokens are chosen once per document, length and evaluator, so every series of a study is
scored on the same tokens: the evaluator is one model for all of them (``evaluator: auto``: the
job's recipe with RoPE, no scaling and no fine-tune, seed ``evaluator_seed``, trained at the
longest LongPPL length, from the checkpoint cache; or the key of a checkpoint in the cache), and
never a series it judges; for a pretrained model, ``evaluator_pretrained`` names a transformers
model with the same tokenizer, whose maximum length must cover the LongPPL lengths. Defaults: alpha 2, beta -2 (the paper's), K the training length (the
paper: 4K of 32K), W = K / 4 (the paper: 1024 of 4096). Rows: ``value`` the LongPPL, ``n`` the
key tokens, ``task_params`` the evaluator's checkpoint key, alpha, beta, K, W, the windows and the
targets judged; a length with no key token writes no row (a warning says so).
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from bench.core.checks import integer, number, parse_length
from bench.core.rows import canonical_json
from bench.data.corpora import Document
from bench.eval.metrics.context import EvalContext, make_row, select_documents, windows_setting
from bench.eval.metrics.nll import nll_windows
from bench.eval.metrics.registry import MetricConfig, register_metric
from models.lazy import torch

__all__ = [
    "Evaluator", "LongPPLConfig", "fixed_key_mask", "key_token_mask", "longppl_value",
    "tiled_windows", "window_positions",
]  # fmt: skip

logger = logging.getLogger(__name__)
AUTO = "auto"
#: which tokens are key: chosen at each length, or once at the longest length (module doc)
KEY_SETS = ("per_length", "longest")
_KEY = re.compile(r"[0-9a-f]{16}")


@dataclass
class LongPPLConfig(MetricConfig):
    """``eval.longppl``: LongPPL at each of its lengths (off by default:
    ``eval.longppl.enabled=true``); lengths default to the eval lengths above ``short_context``."""

    enabled: bool = False
    max_docs: int = 4  # test documents per length
    # consecutive windows per document: "fill" = as many as fit in the longest LongPPL length (the
    # same text at every length, as nll's); N = at most N from the start (1 = the first window)
    max_windows: Any = "fill"
    alpha: float = 2.0  # LSD threshold: nll_short - nll_full > alpha (nats)
    beta: float = -2.0  # LCL threshold: full-context log-probability > beta
    short_context: Any = "1x"  # K: tokens the short read keeps (tokens or "<m>x" of L)
    window: Any = None  # W: targets sharing one short read; null = K // 4
    evaluator: str = AUTO  # auto (the recipe at the longest length, RoPE) or a checkpoint key
    evaluator_seed: int = 0  # the auto evaluator's seed (one evaluator for every seed's series)
    # a pretrained model's evaluator: a transformers model (directory or hub id) with the same
    # tokenizer; required for a pretrained job, refused for a lenbench one (byte tokens)
    evaluator_pretrained: str | None = None
    key_set: str = "per_length"  # per_length or longest: the same key tokens at every length

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.key_set not in KEY_SETS:
            raise ValueError(
                f"{self.key('key_set')} {self.key_set!r} is invalid; allowed: "
                f"{', '.join(KEY_SETS)}."
            )
        self.max_docs = integer(self.key("max_docs"), self.max_docs, 1)
        self.alpha = number(self.key("alpha"), self.alpha, 0.0)  # nats the long context gains
        self.beta = number(self.key("beta"), self.beta, -math.inf, 0.0)  # a log-probability
        self.evaluator_seed = integer(self.key("evaluator_seed"), self.evaluator_seed, 0)
        self.max_windows = windows_setting(self.key("max_windows"), self.max_windows)
        if self.key_set == "longest" and self.max_windows != "fill":
            raise ValueError(
                f"{self.key('key_set')} longest scores the same tokens at every length, which "
                f"needs {self.key('max_windows')} fill (the same text at every length), not "
                f"{self.max_windows!r}."
            )
        if not isinstance(self.evaluator, str) or not (
            self.evaluator == AUTO or _KEY.fullmatch(self.evaluator)
        ):
            raise ValueError(
                f"{self.key('evaluator')} {self.evaluator!r} is invalid; allowed: auto or the "
                "16-hex-character key of a checkpoint in paths.cache."
            )

    def resolve(self, train_length: int, eval_lengths: Sequence[int]) -> LongPPLConfig:
        short = integer(
            self.key("short_context"),
            parse_length(self.short_context, train_length, self.key("short_context")),
            1,
        )
        window = max(1, short // 4) if self.window is None else self.window
        window = integer(self.key("window"), window, 1)
        above = [x for x in eval_lengths if x > short]
        if self.enabled and self.lengths is None and not above:  # else no row, and no word
            raise ValueError(
                f"{self.key('short_context')} {short} (K) is at or above every eval length "
                f"{list(eval_lengths)}, so LongPPL has no length to score; allowed: a K below "
                f"{max(eval_lengths)}."
            )
        out = super().resolve(train_length, eval_lengths if self.lengths is not None else above)
        at_or_below = [x for x in out.lengths if x <= short]
        if self.enabled and at_or_below:
            raise ValueError(
                f"{self.key('lengths')} has {at_or_below[0]} at or below "
                f"{self.key('short_context')} {short} (K, the short read's context): no token "
                f"there has more context than K; allowed: lengths above {short}."
            )
        return replace(out, short_context=short, window=window)

    def span_at(self, length: int) -> int:
        """The tokens of each document read at ``length``: S (the longest LongPPL length) under
        ``fill``, else ``max_windows`` windows of the length."""
        if self.max_windows == "fill":
            return max(self.lengths or [length])
        return int(self.max_windows) * int(length)


@dataclass(frozen=True)
class Evaluator:
    """The model that chooses the key tokens: ``identity`` (its checkpoint key) names it in rows;
    ``train_length`` is the longest window it scores."""

    model: Any
    identity: str
    train_length: int


def key_token_mask(
    score: Callable[[torch.Tensor], torch.Tensor],
    windows: torch.Tensor,  # [N, T] token ids
    short: int,
    window: int,
    alpha: float,
    beta: float,
) -> torch.Tensor:
    """Which targets of ``windows`` are key tokens ([N, T - 1] bool; column j is token j + 1).

    ``score(ids [N, n])`` returns the evaluator's NLL of tokens 1..n-1 ([N, n - 1]). The full
    read scores the whole window; short reads start every ``window`` tokens and hold ``short``
    tokens of context before their ``window`` targets (the last block is cut at the window's
    end), as the reference's ``find_key_token``.
    """
    full = score(windows)  # [N, T - 1]
    mask = torch.zeros_like(full, dtype=torch.bool)
    total = windows.shape[1]
    for start in range(0, total - short, window):
        width = min(window, total - start - short)
        nll_short = score(windows[:, start : start + short + width])[:, short - 1 :]  # [N, width]
        cols = slice(start + short - 1, start + short + width - 1)
        nll_full = full[:, cols]
        mask[:, cols] = (nll_short - nll_full > alpha) & (nll_full < -beta)
    return mask


def longppl_value(nll: torch.Tensor, mask: torch.Tensor) -> tuple[float, int]:
    """(exp of the mean NLL over the key tokens, their count); (nan, 0) without key tokens."""
    count = int(mask.sum())
    if count == 0:
        return math.nan, 0
    return math.exp(float(nll[mask].double().mean())), count


def tiled_windows(
    docs: Sequence[Document], length: int, span: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each document's first ``span`` tokens as consecutive windows of ``length`` (the last one
    ending at ``span`` where ``length`` does not divide it). Returns the windows [N, length] and
    which of their targets count [N, length - 1] (column j is token j + 1; False where an earlier
    window of the document already judged that token)."""
    # nll's nonoverlapping tiling of a span: each window's start and the window position from
    # which its targets are new (the windows before it left them); it reads span + 1 tokens
    tiling = nll_windows(span + 1, length, None, "nonoverlapping", length, span)
    windows, counted = [], []
    for doc in docs:
        for start, score_from in tiling:
            windows.append(doc.tensor(start, start + length))
            target = torch.arange(1, length)  # [length - 1]: each target's position in the window
            counted.append(target >= max(score_from, 1))
    if not windows:
        empty = torch.empty(0, length, dtype=torch.long)  # [0, length]
        return empty, empty[:, 1:].bool()
    return torch.stack(windows), torch.stack(counted)


def window_positions(length: int, span: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per window of :func:`tiled_windows`' tiling of one document at ``length``: each target
    column's position in the document and whether it counts ([n_windows, length - 1] each)."""
    tiling = nll_windows(span + 1, length, None, "nonoverlapping", length, span)
    target = torch.arange(1, length)  # [length - 1]
    positions = torch.stack([start + target for start, _ in tiling])
    counted = torch.stack([target >= max(score_from, 1) for _, score_from in tiling])
    return positions, counted


def fixed_key_mask(
    key_at_longest: torch.Tensor, docs: int, lengths: Sequence[int], span: int, length: int
) -> torch.Tensor:
    """``key_set: longest``: the key tokens chosen at the longest of ``lengths``
    (``key_at_longest``: [docs x its windows, longest - 1], key and counted) as the mask at
    ``length`` ([docs x windows, length - 1]), keeping only the positions every one of
    ``lengths`` judges, so that each length scores the same tokens."""
    longest = max(lengths)
    pos_long, _ = window_positions(longest, span)  # [W_long, longest - 1]
    key = torch.zeros(docs, span + 1, dtype=torch.bool)  # [D, span + 1] by document position
    per_doc = key_at_longest.reshape(docs, -1, longest - 1)  # [D, W_long, longest - 1]
    for d in range(docs):
        key[d, pos_long[per_doc[d]]] = True
    judged_everywhere = torch.ones(span + 1, dtype=torch.bool)
    for x in lengths:
        pos, counted = window_positions(x, span)
        judged = torch.zeros(span + 1, dtype=torch.bool)
        judged[pos[counted]] = True
        judged_everywhere &= judged
    key &= judged_everywhere
    pos, counted = window_positions(length, span)  # [W, length - 1]
    return (key[:, pos] & counted).reshape(docs * pos.shape[0], length - 1)


_MASKS: dict[tuple, torch.Tensor] = {}  # key tokens per evaluator, windows and rule


def _batched(ctx: EvalContext, length: int) -> Callable[[torch.Tensor], torch.Tensor]:
    rows = max(1, ctx.rows_per_batch(length))

    def score(ids: torch.Tensor) -> torch.Tensor:
        return torch.cat([ctx.token_nll(ids[i : i + rows]) for i in range(0, len(ids), rows)])

    return score


def _key_tokens(ctx: EvalContext, windows: torch.Tensor, cfg: LongPPLConfig) -> torch.Tensor:
    evaluator: Evaluator = ctx.evaluator
    digest = hashlib.sha256(windows.numpy().tobytes()).hexdigest()
    # the shape too: tiled windows of two lengths hold the same tokens in the same order
    memo = (evaluator.identity, digest, tuple(windows.shape), cfg.short_context, cfg.window,
            cfg.alpha, cfg.beta)  # fmt: skip
    if memo not in _MASKS:
        ev_ctx = replace(ctx, model=evaluator.model, evaluator=None)
        evaluator.model.eval()
        _MASKS[memo] = key_token_mask(
            _batched(ev_ctx, windows.shape[1]),
            windows,
            cfg.short_context,
            cfg.window,
            cfg.alpha,
            cfg.beta,
        )
    return _MASKS[memo]


@register_metric("longppl", config=LongPPLConfig)
def longppl_metric(
    ctx: EvalContext, cfg: LongPPLConfig, docs: Sequence[Document], length: int
) -> list[dict]:
    if ctx.evaluator is None:
        raise ValueError("eval.longppl needs an evaluator model (the job builds it).")
    if length > ctx.evaluator.train_length:
        raise ValueError(
            f"eval.longppl.evaluator {ctx.evaluator.identity} was trained at "
            f"{ctx.evaluator.train_length} tokens and cannot score length {length}; allowed: "
            "an evaluator trained at the longest LongPPL length or longer (evaluator: auto)."
        )
    span = cfg.span_at(length)
    selected, _ = select_documents(docs, span, cfg.max_docs)
    if not selected:
        return []
    windows, counted = tiled_windows(selected, length, span)  # [N, length], [N, length - 1]
    if cfg.key_set == "longest":  # the longest length's key tokens, the same at every length
        longest = max(cfg.lengths or [length])
        at_longest, counted_longest = tiled_windows(selected, longest, span)
        chosen = _key_tokens(ctx, at_longest, cfg) & counted_longest
        mask = fixed_key_mask(chosen, len(selected), cfg.lengths or [length], span, length)
    else:
        mask = _key_tokens(ctx, windows, cfg) & counted
    nll = _batched(ctx, length)(windows)  # [D, length - 1], the judged model
    value, count = longppl_value(nll, mask)
    if count == 0:
        logger.warning("eval longppl: no key token at length %d; no row written.", length)
        return []
    params = {
        "evaluator": ctx.evaluator.identity,
        "alpha": cfg.alpha,
        "beta": cfg.beta,
        "short_context": cfg.short_context,
        "window": cfg.window,
        "windows": int(windows.shape[0]),
        "targets": int(counted.sum()),
    }
    if cfg.key_set != "per_length":  # rows of the default keep their former task_params
        params["key_set"] = cfg.key_set
    return [make_row("longppl", value, count, length, task_params=canonical_json(params))]
