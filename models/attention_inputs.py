"""What every layer's attention needs, computed once per forward pass (:class:`AttentionInputs`,
a training-free method's :class:`PairInputs`), and what every kernel path reads from it: whether
SDPA alone will do (:func:`fused_plain`) and the layer's span (:func:`span_mask`).

Shapes: N batch, L new tokens, S keys (cached + new), H query heads, r rotary dims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from models.positions import ContextualBias, ScoreBias, rope_cos_sin
from models.scaling import PairPositions

__all__ = [
    "AttentionInputs",
    "PairInputs",
    "attended_keys",
    "fused_plain",
    "pair_inputs",
    "span_log_keys",
    "span_mask",
    "ssmax_log_keys",
]

#: at most this many query-key entries per tile when counting the keys each query attends
#: (:func:`attended_keys`, for a span or a training-free method's sinks): bounds the [N, T, S] mask
ATTENDED_COUNT_ELEMENTS = 1 << 24


@dataclass
class PairInputs:
    """A training-free method's per-pair positions (``models.scaling.PairPositions``) for one
    forward pass, shared by all layers: a pair with q_pos - k_pos < ``window`` is scored as usual,
    a farther one with the query at ``q_far`` and the key at ``k_far`` (RoPE: the rotation from
    each token's own position to its far one; a score bias: its function at the far positions);
    with ``sink_end`` set, far pairs whose key position is not below it are masked.

    ``anchored`` (StreamingLLM): q_far and k_far are positions in the cache, counted from each
    row's first real token, and the query stands at q_far for every pair, as the repo's pos_shift
    puts it: a near pair is scored with the key at the same distance from there, and whatever
    reads the query's position (a score bias's i, log-n) reads q_far (:meth:`query_positions`).

    ``regions`` (Dual Chunk Attention): each pair's regime from its positions, 0 own positions,
    1 the query at q_far, r >= 2 at ``more[r - 2]`` = (q_far, q_cos, q_sin); None: the window's."""

    window: int
    sink_end: torch.Tensor | None  # [N, 1, 1, 1] the first position id after each row's sinks
    q_far: torch.Tensor  # [N, L] far position of each query (int64 where whole, else float32)
    k_far: torch.Tensor  # [N, S] far position of each key
    anchored: bool = False
    q_cos: torch.Tensor | None = None  # [N, 1, L, r/2] float32: rotation by q_far - q_pos
    q_sin: torch.Tensor | None = None
    k_cos: torch.Tensor | None = None  # [N, 1, S, r/2] float32: rotation by k_far - k_pos
    k_sin: torch.Tensor | None = None
    regions: Any = None  # Callable[[q_pos, k_pos], int64 regime] | None
    more: tuple[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None], ...] = ()

    def region(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Each pair's regime (int64, broadcast): 0 its own positions, r >= 1 the r-th far query."""
        if self.regions is None:
            return (q_pos - k_pos >= self.window).long()
        return self.regions(q_pos, k_pos).long()

    def queries_from(self, start: int) -> PairInputs:
        """The same pairs for the queries ``start``.. only (the keys unchanged)."""
        rotated = self.q_cos is not None
        return replace(
            self,
            q_far=self.q_far[:, start:],
            q_cos=self.q_cos[:, :, start:] if rotated else None,
            q_sin=self.q_sin[:, :, start:] if rotated else None,
            more=tuple(
                (
                    q[:, start:],
                    c[:, :, start:] if rotated else None,
                    s[:, :, start:] if rotated else None,
                )
                for q, c, s in self.more
            ),
        )

    def query_positions(self, q_pos: torch.Tensor) -> torch.Tensor:
        """Where each query [N, L] stands for every term that reads its position: q_far for an
        anchored method (its cache position), else its own position id ``q_pos``."""
        return self.q_far if self.anchored else q_pos


def _whole_or_float(positions: torch.Tensor) -> torch.Tensor:
    """float64 positions as int64 where every one is whole (a score bias may bucket integers)."""
    if bool((positions == positions.round()).all()):
        return positions.long()
    return positions.float()


def pair_inputs(
    spec: PairPositions,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    inv_freq: torch.Tensor | None = None,
    k_valid: torch.Tensor | None = None,
) -> PairInputs:
    """:class:`PairInputs` of ``spec`` for queries at q_pos [N, L] and keys at k_pos [N, S]
    (``k_valid`` [N, S]: False for padding; an anchored method counts from each row's first real
    key; its far positions are cache positions, counted from there); ``inv_freq`` [r/2] (RoPE's,
    as the model rotates) adds the rotations from own to far positions."""
    q64, k64 = q_pos.to(torch.float64), k_pos.to(torch.float64)
    start = torch.zeros(k64.shape[0], 1, dtype=torch.float64, device=k64.device)  # [N, 1]
    if spec.anchored:
        real = k64 if k_valid is None else torch.where(k_valid, k64, math.inf)
        start = real.min(dim=1, keepdim=True).values
    offset = 0.0 if spec.anchored else start  # an anchored method's stay in the cache
    q_fars = [query(q64 - start) + offset for query in spec.far_queries()]  # each [N, L]
    k_far = spec.far_key(k64 - start) + offset  # [N, S]
    sink_end = None if spec.sinks is None else (start + spec.sinks)[:, :, None, None]
    rotations: list[tuple[torch.Tensor | None, torch.Tensor | None]] = [(None, None)] * len(q_fars)
    k_cos = k_sin = None
    if inv_freq is not None:  # RoPE: the rotation from each own position to each far one
        freq = inv_freq.to(q_pos.device)
        rotations = [tuple(t[:, None] for t in rope_cos_sin(q - q_pos, freq)) for q in q_fars]
        k_cos, k_sin = (t[:, None] for t in rope_cos_sin(k_far - k_pos, freq))  # [N, 1, S, r/2]
    (q_cos, q_sin), more = rotations[0], rotations[1:]  # each [N, 1, L, r/2]
    return PairInputs(
        spec.window,
        sink_end,
        _whole_or_float(q_fars[0]),
        _whole_or_float(k_far),
        spec.anchored,
        q_cos,
        q_sin,
        k_cos,
        k_sin,
        regions=spec.regions,
        more=tuple((_whole_or_float(q), c, s) for q, (c, s) in zip(q_fars[1:], more, strict=True)),
    )


@dataclass
class AttentionInputs:
    """What every layer's attention needs, computed once per forward pass."""

    cos: torch.Tensor | None  # [N, 1, L, r/2] float32, the queries' rotation (and the keys')
    sin: torch.Tensor | None
    layout: str
    score_bias: ScoreBias | None  # the family's additive logit bias b_h(i, j); None = none
    q_scale: torch.Tensor | None  # [N, 1, L, 1] float32 log-n factor per query; None = 1
    q_pos: torch.Tensor  # [N, L]
    k_pos: torch.Tensor  # [N, S]
    k_valid: torch.Tensor | None  # [N, S] bool; None when every key is real
    past_len: int
    scale: float
    want_entropy: bool
    # the keys' rotation where it differs from the queries' (xPos scales them apart); None = cos/sin
    k_cos: torch.Tensor | None = None  # [N, 1, L, r/2] float32
    k_sin: torch.Tensor | None = None
    # the family's logit term computed from each layer's logits row (CoPE); None = none
    contextual_bias: ContextualBias | None = None
    # a training-free method's per-pair positions (Self-Extend, ReRoPE, StreamingLLM); None = none
    pairs: PairInputs | None = None
    # the layer's attention span (models.families.hybrid): key position j is visible to query position i
    # only if i - j < window (sliding window), only if i // chunk == j // chunk (chunked); None = all
    window: int | None = None
    chunk: int | None = None
    # the eps of a weightless RMS norm of the layer's queries and keys after the rotation (Llama
    # 4's QK-norm on iRoPE's RoPE layers, models.families.hybrid); None = none
    qk_norm: float | None = None
    # SSMax (model.attn_scale=ssmax): ln of the number of real keys each query attends, [N, 1, L, 1]
    # float32 (cached and new, padding not counted; only those inside the layer's window or chunk
    # and a training-free method's sinks + window: :func:`ssmax_log_keys`); None = no SSMax
    log_keys: torch.Tensor | None = None
    # per forward pass: the flex block mask, shared by all layers (built on first use)
    flex_cache: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)


def fused_plain(length: int, s: int, inputs: AttentionInputs) -> bool:
    """Whether SDPA needs neither a mask nor a bias: no padding, no score bias or contextual term,
    no entropy, and the causal pattern is SDPA's own (full length) or absent (one query that sees
    every key)."""
    plain = inputs.score_bias is None and inputs.k_valid is None and not inputs.want_entropy
    plain = plain and inputs.contextual_bias is None and inputs.pairs is None
    plain = plain and inputs.window is None and inputs.chunk is None
    return plain and (length == s or length == 1)


def span_mask(
    q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None, chunk: int | None
) -> torch.Tensor:
    """Whether key position k_pos is inside the attention span of query position q_pos
    (broadcasting): i - j < window for a sliding window, i // chunk == j // chunk for chunked
    attention (Llama 4's chunks, counted from position 0); True everywhere without either."""
    inside = torch.ones((), dtype=torch.bool, device=q_pos.device)
    if window is not None:
        inside = inside & (q_pos - k_pos < window)
    if chunk is not None:
        inside = inside & (
            torch.div(q_pos, chunk, rounding_mode="floor")
            == torch.div(k_pos, chunk, rounding_mode="floor")
        )
    return inside


def attended_keys(inputs: AttentionInputs) -> torch.Tensor:
    """How many real keys each new query attends, [N, L] int64 (at least 1): the causal keys up to
    it, padding left out, and where the layer has a window or chunks (``window``, ``chunk``) or a
    training-free method masks far pairs past its sinks (StreamingLLM), only those it leaves
    visible: the same pairs as the kernels' mask (``models.tiled_attention``), so the count is
    the size of the cache or span the query reads, not every key seen."""
    n, length = inputs.q_pos.shape
    s = inputs.k_pos.shape[1]
    device = inputs.k_pos.device
    valid = inputs.k_valid
    if valid is None:
        valid = torch.ones(n, s, dtype=torch.bool, device=device)
    pairs = inputs.pairs
    sink_end = pairs.sink_end if pairs is not None else None
    if inputs.window is None and inputs.chunk is None and sink_end is None:  # every causal key
        return valid.cumsum(dim=1)[:, s - length :].clamp(min=1)
    k_index = torch.arange(s, device=device)
    k_pos = inputs.k_pos[:, None, :]  # [N, 1, S]
    tile = max(1, ATTENDED_COUNT_ELEMENTS // max(1, n * s))
    counts = []
    for start in range(0, length, tile):
        stop = min(length, start + tile)
        q_index = inputs.past_len + torch.arange(start, stop, device=device)
        q_pos = inputs.q_pos[:, start:stop, None]  # [N, T, 1]
        seen = (k_index[None, :] <= q_index[:, None])[None] & valid[:, None, :]  # [N, T, S]
        seen = seen & span_mask(q_pos, k_pos, inputs.window, inputs.chunk)
        if sink_end is not None:  # far pairs attend only to the sinks
            near = pairs.region(q_pos, k_pos) == 0
            seen = seen & (near | (k_pos < sink_end[:, 0]))
        counts.append(seen.sum(dim=-1))
    return torch.cat(counts, dim=1).clamp(min=1)


def ssmax_log_keys(inputs: AttentionInputs) -> torch.Tensor:
    """SSMax's ln n per query, [N, 1, L, 1] float32, n = :func:`attended_keys`."""
    return attended_keys(inputs).to(torch.float32).log()[:, None, :, None]


def span_log_keys(layer_inputs: list[AttentionInputs]) -> list[AttentionInputs]:
    """Each layer's inputs with SSMax's ln n counted over the keys its window or chunks leave it
    (a hybrid family's layers share the model's inputs otherwise), once per distinct span."""
    by_span: dict[int, AttentionInputs] = {}
    out = []
    for inputs in layer_inputs:
        if inputs.window is None and inputs.chunk is None:
            out.append(inputs)
            continue
        if id(inputs) not in by_span:
            by_span[id(inputs)] = replace(inputs, log_keys=ssmax_log_keys(inputs))
        out.append(by_span[id(inputs)])
    return out
