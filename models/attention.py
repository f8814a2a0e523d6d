"""Causal self-attention of one layer: projections, RoPE on queries and keys, log-n, the kernel.

Everything position-dependent arrives precomputed in :class:`AttentionInputs` (once per forward
pass, shared by all layers), so a layer never assumes ``arange(L)`` positions.

The kernel (:func:`attend`): SDPA for plain causal attention; on CUDA, compiled flex attention for
a score bias, padding and cache chunks (bias and mask applied inside the kernel, nothing L x S in memory);
elsewhere an explicit mask in query tiles. See :data:`FLEX_ATTENTION`. A position family that
acts on the scores hands in one :class:`models.positions.ScoreBias`, which every
kernel applies the same way; nothing here knows which family it came from. A training-free
method's per-pair positions (:class:`PairInputs`: Self-Extend, ReRoPE, StreamingLLM) score each
pair closer than the window as usual and a farther one at the method's positions, in the tiled
path (two logit tiles merged by distance).

Shapes: N batch, L new tokens, S keys (cached + new), H query heads, G key/value heads, d head dim,
D model width, T query tile.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.model_config import SSMAX_INIT
from models.positions import ContextualBias, ScoreBias, rope_cos_sin, rotate
from models.scaling import PairPositions

__all__ = [
    "FLEX_ATTENTION",
    "Attention",
    "AttentionInputs",
    "PairInputs",
    "attend",
    "attend_flex",
    "flex_attention_unavailable",
    "flex_block_mask",
    "flex_mask_mod",
    "flex_score_mod",
    "logn_query_scale",
    "pair_inputs",
    "span_mask",
    "weightless_rms_norm",
]

# Entries of a masked attention logit tile held at once when the mask must be materialised.
ATTENTION_TILE_ELEMENTS = 1 << 24
# A contextual term (CoPE) keeps about this many tile-sized float32 tensors alive (logits, gates,
# counts, interpolation weights, gathered terms): its tiles are this much smaller.
CONTEXTUAL_TEMPORARIES = 8
# A training-free pair method (Self-Extend, ReRoPE) holds two logit tiles (near and far) at once.
PAIR_TEMPORARIES = 2
# A layer with a window or chunks attends in query tiles of about one span (at least this many
# queries, where fewer calls cost more than the keys they leave out)
SPAN_TILE_MIN = 128

_FLEX_MODES = {
    "auto": "auto",
    "1": "auto",
    "on": "auto",
    "0": "off",
    "off": "off",
    "always": "always",
}


def _flex_mode(value: str) -> str:
    mode = _FLEX_MODES.get(value.strip().lower())
    if mode is None:
        raise ValueError(
            f"LENBENCH_FLEX_ATTENTION={value!r} is unknown; allowed: auto (or 1, on), off (or 0), always."
        )
    return mode


#: When masked or biased attention goes through ``torch.nn.attention.flex_attention``, from the
#: environment variable ``LENBENCH_FLEX_ATTENTION`` at import (a test may set the attribute):
#: ``auto`` (default) on CUDA only, ``off`` never (the tiled path everywhere), ``always`` on every
#: device, CPU included (compiled by inductor; for tests and experiments).
#:
#: Why CUDA only by default: there the compiled flex kernel applies the score bias and the
#: causal/padding mask inside the fused kernel (no L x S mask in memory, masked blocks skipped).
#: On CPU the tiled path stays as it was: flex would need an inductor compilation (seconds, per
#: shape class) and has no CPU backward, and the tiles already bound the memory.
FLEX_ATTENTION = _flex_mode(os.environ.get("LENBENCH_FLEX_ATTENTION", "auto"))

#: Query and key block size of the flex block mask (flex's default; tests use smaller ones).
FLEX_BLOCK_SIZE = 128


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
    reads the query's position (a score bias's i, log-n) reads q_far (:meth:`query_positions`)."""

    window: int
    sink_end: torch.Tensor | None  # [N, 1, 1, 1] the first position id after each row's sinks
    q_far: torch.Tensor  # [N, L] far position of each query (int64 where whole, else float32)
    k_far: torch.Tensor  # [N, S] far position of each key
    anchored: bool = False
    q_cos: torch.Tensor | None = None  # [N, 1, L, r/2] float32: rotation by q_far - q_pos
    q_sin: torch.Tensor | None = None
    k_cos: torch.Tensor | None = None  # [N, 1, S, r/2] float32: rotation by k_far - k_pos
    k_sin: torch.Tensor | None = None

    def queries_from(self, start: int) -> PairInputs:
        """The same pairs for the queries ``start``.. only (the keys unchanged)."""
        rotated = self.q_cos is not None
        return replace(
            self,
            q_far=self.q_far[:, start:],
            q_cos=self.q_cos[:, :, start:] if rotated else None,
            q_sin=self.q_sin[:, :, start:] if rotated else None,
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
    q_far = spec.far_query(q64 - start) + offset  # [N, L]
    k_far = spec.far_key(k64 - start) + offset  # [N, S]
    sink_end = None if spec.sinks is None else (start + spec.sinks)[:, :, None, None]
    pairs = PairInputs(
        spec.window, sink_end, _whole_or_float(q_far), _whole_or_float(k_far), spec.anchored
    )
    if inv_freq is None:
        return pairs
    q_cos, q_sin = rope_cos_sin(q_far - q_pos, inv_freq.to(q_pos.device))  # [N, L, r/2]
    k_cos, k_sin = rope_cos_sin(k_far - k_pos, inv_freq.to(q_pos.device))  # [N, S, r/2]
    return replace(
        pairs,
        q_cos=q_cos[:, None],
        q_sin=q_sin[:, None],
        k_cos=k_cos[:, None],
        k_sin=k_sin[:, None],
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
    # SSMax (model.attn_scale=ssmax): ln of the number of real keys each query sees, [N, 1, L, 1]
    # float32 (cached and new, padding not counted); None = no SSMax
    log_keys: torch.Tensor | None = None
    # per forward pass: the flex block mask, shared by all layers (built on first use)
    flex_cache: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)


def weightless_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last (head) dim, computed in float32, in x's dtype: an
    RMS norm without a weight (transformers' ``Llama4TextWeightlessRMSNorm``, alias
    ``Llama4TextL2Norm``)."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def logn_query_scale(position_ids: torch.Tensor, train_length: int) -> torch.Tensor:
    """Log-n factor of the query at each position id j: max(1, ln(j + 1) / ln L), float32, same shape.

    The published rule (Su; Qwen's ``logn_attn``: ``logn_list[j] = math.log(j + 1, L)`` if
    j + 1 > L else 1), i.e. ``logn_factor(j + 1, L)`` per query: queries inside the trained range
    are untouched, and a query's factor depends on its own position only, so what a position
    predicts does not depend on how many tokens follow it. The factor multiplies the query, hence
    the q.k logits only; a family's score bias is added unscaled (Qwen scales the query the same
    way; scaling the bias too would also sharpen a distance penalty).
    """
    if train_length < 2:
        raise ValueError(f"train_length must be >= 2 (ln(1) = 0), got {train_length!r}.")
    ratio = torch.log(position_ids.to(torch.float64) + 1) / math.log(train_length)
    return ratio.clamp(min=1.0).to(torch.float32)


def _fused_plain(length: int, s: int, inputs: AttentionInputs) -> bool:
    """Whether SDPA needs neither a mask nor a bias: no padding, no score bias or contextual term,
    no entropy, and the causal pattern is SDPA's own (full length) or absent (one query that sees
    every key)."""
    plain = inputs.score_bias is None and inputs.k_valid is None and not inputs.want_entropy
    plain = plain and inputs.contextual_bias is None and inputs.pairs is None
    plain = plain and inputs.window is None and inputs.chunk is None
    return plain and (length == s or length == 1)


def _use_flex(q: torch.Tensor, inputs: AttentionInputs) -> bool:
    """Whether :func:`attend` takes the flex-attention path for queries ``q`` [N, H, L, d].

    Only calls that need a mask or bias (padding, a score bias, a cache with several new queries) and no
    entropy (flex returns no probabilities), on CUDA unless :data:`FLEX_ATTENTION` is ``always``.
    Head dims below 16 stay tiled (the CUDA flex kernel does not support them), and so does CPU
    attention that needs a gradient (flex has no CPU backward) and a contextual term (it needs
    each logits row whole; a score_mod sees one entry).
    """
    if FLEX_ATTENTION == "off" or inputs.want_entropy or inputs.contextual_bias is not None:
        return False
    if inputs.pairs is not None:  # two position sets per pair: the tiled path
        return False
    if _fused_plain(q.shape[2], inputs.k_pos.shape[1], inputs):
        return False
    if FLEX_ATTENTION == "auto" and (q.device.type != "cuda" or q.shape[-1] < 16):
        return False
    if q.device.type == "cpu" and q.requires_grad:  # flex has no backward on CPU
        return False
    return flex_attention_unavailable() is None


@functools.cache
def flex_attention_unavailable() -> str | None:
    """Why ``torch.nn.attention.flex_attention`` cannot be used here (None if it can)."""
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if version < (2, 6):
        return f"flex attention needs torch >= 2.6, this is {torch.__version__}"
    try:
        from torch.nn.attention.flex_attention import BlockMask, flex_attention  # noqa: F401
    except ImportError as error:  # pragma: no cover - a torch build without it
        return f"torch.nn.attention.flex_attention does not import: {error}"
    return None


_compiled_flex_attention: Callable[..., torch.Tensor] | None = None


def _dynamic_lengths(tensor: torch.Tensor | None, *dims: int) -> torch.Tensor | None:
    """Mark sequence-length dims dynamic for the compiled kernel (a no-op outside compilation).

    ``dynamic=True`` alone still specialises a first call whose query and key lengths are equal
    (a prefill) to L == S, and recompiles at the first cache step.
    """
    if tensor is not None:
        for dim in dims:
            torch._dynamo.maybe_mark_dynamic(tensor, dim)
    return tensor


def _flex_kernel(compiled: bool) -> Callable[..., torch.Tensor]:
    """``flex_attention``, compiled once per process on first use (eager materialises all scores)."""
    global _compiled_flex_attention
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    if _compiled_flex_attention is None:
        # dynamic: lengths change with every decode step and evaluation length
        kernel = torch.compile(flex_attention, dynamic=True)
        limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else None

        def compiled_flex_attention(*args, **kwargs):
            # a few compilations per score_mod (one query or more, one key block or more, dtype)
            # may pass dynamo's default limit of 8, after which flex would silently run eagerly
            # and materialise every score
            if limit is None:
                return kernel(*args, **kwargs)
            with torch._dynamo.config.patch({limit: max(64, getattr(torch._dynamo.config, limit))}):
                return kernel(*args, **kwargs)

        _compiled_flex_attention = compiled_flex_attention
    return _compiled_flex_attention


def flex_score_mod(inputs: AttentionInputs, device: torch.device) -> Callable | None:
    """The family's score bias as a flex ``score_mod`` (None without one): the scaled logit of
    query t in row n, head h, and key s plus ``score_bias(h, q_pos[n, t], k_pos[n, s])``, from the
    position ids (never from indices), as the tiled path adds it."""
    if inputs.score_bias is None:
        return None
    fn = inputs.score_bias.fn
    args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in inputs.score_bias.args)
    # own contiguous copies: in a prefill q_pos is k_pos, and aliasing that comes and goes recompiles
    q_pos = _dynamic_lengths(
        inputs.q_pos.to(device).clone(memory_format=torch.contiguous_format), 1
    )
    k_pos = _dynamic_lengths(
        inputs.k_pos.to(device).clone(memory_format=torch.contiguous_format), 1
    )

    def biased(score, b, h, q_idx, kv_idx):
        return score + fn(h, q_pos[b, q_idx], k_pos[b, kv_idx], *args)

    return biased


def _keys_real(inputs: AttentionInputs, device: torch.device) -> torch.Tensor:
    """[N, S] bool, False for padding keys (all True without padding)."""
    if inputs.k_valid is None:
        return torch.ones(inputs.k_pos.shape, dtype=torch.bool, device=device)
    return inputs.k_valid.to(device)


def flex_mask_mod(inputs: AttentionInputs, device: torch.device) -> Callable:
    """The tiled path's mask as a flex ``mask_mod``: causal by absolute index (key s visible to
    new query t iff s <= past_len + t), padding keys hidden except from their own query.

    One function with or without padding (all keys real then): each distinct function is a
    separate compilation of the kernel.
    """
    # a tensor, not an int: a new cache length must not recompile the kernel
    offset = torch.tensor(inputs.past_len, device=device)
    k_valid = _dynamic_lengths(_keys_real(inputs, device).contiguous(), 1)  # [N, S]

    def causal_unpadded(b, h, q_idx, kv_idx):
        query = q_idx + offset
        # a padding query still sees itself, so its (ignored) row never becomes all -inf
        return (kv_idx <= query) & (k_valid[b, kv_idx] | (kv_idx == query))

    if inputs.window is None and inputs.chunk is None:
        return causal_unpadded
    q_pos = _dynamic_lengths(inputs.q_pos.to(device).contiguous(), 1)  # [N, L]
    k_pos = _dynamic_lengths(inputs.k_pos.to(device).contiguous(), 1)  # [N, S]
    window, chunk = inputs.window, inputs.chunk

    def causal_unpadded_in_span(b, h, q_idx, kv_idx):
        query = q_idx + offset
        in_span = span_mask(q_pos[b, q_idx], k_pos[b, kv_idx], window, chunk)
        return causal_unpadded(b, h, q_idx, kv_idx) & (in_span | (kv_idx == query))

    return causal_unpadded_in_span


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


def _dense_to_kv_blocks(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, H, Q blocks, KV blocks] bool -> (number of blocks, their indices first) int32."""
    blocks = blocks.to(torch.int32)
    order = torch.argsort(blocks, dim=-1, descending=True, stable=True)
    return blocks.sum(dim=-1).to(torch.int32).contiguous(), order.to(torch.int32).contiguous()


def _block_range(positions: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Smallest and largest position id of each block of ``size`` along dim 1: [N, X] -> [N, B] each."""
    pad = (-positions.shape[1]) % size
    low = F.pad(positions, (0, pad), value=int(positions.max()) if positions.numel() else 0)
    high = F.pad(positions, (0, pad), value=int(positions.min()) if positions.numel() else 0)
    n = positions.shape[0]
    return low.view(n, -1, size).amin(-1), high.view(n, -1, size).amax(-1)


def _blocks_in_span(inputs: AttentionInputs, size: int, device: torch.device) -> torch.Tensor:
    """[N, 1, Q blocks, K blocks] bool: whether some query of the block and some key of the
    block may be inside the layer's span by their position ids (from each block's range of
    positions, so never False where an entry is inside)."""
    q_lo, q_hi = _block_range(inputs.q_pos.to(device), size)  # [N, Q blocks]
    k_lo, k_hi = _block_range(inputs.k_pos.to(device), size)  # [N, K blocks]
    q_lo, q_hi, k_lo, k_hi = q_lo[:, :, None], q_hi[:, :, None], k_lo[:, None, :], k_hi[:, None, :]
    inside = torch.ones(
        q_lo.shape[0], q_lo.shape[1], k_lo.shape[2], dtype=torch.bool, device=device
    )
    if inputs.window is not None:  # the closest pair: the latest key, the earliest query
        inside = inside & (q_lo - k_hi < inputs.window)
    if inputs.chunk is not None:  # the blocks' chunk ranges overlap
        c = inputs.chunk
        inside = inside & (k_lo // c <= q_hi // c) & (q_lo // c <= k_hi // c)
    return inside[:, None]


def flex_block_mask(
    inputs: AttentionInputs,
    n: int,
    length: int,
    s: int,
    device: torch.device,
    block_size: int | None = None,
):
    """The :func:`flex_mask_mod` pattern as a flex ``BlockMask`` [N, 1, Q blocks, K blocks], from
    per-block index arithmetic: O(N x blocks) memory, never the L x S mask (``create_block_mask``
    would evaluate every entry).

    A block is *full* (the kernel skips the mask) when it is complete and every key in it is real
    and causally visible to every query in it; *partial* when some entry is visible; skipped
    otherwise. Equals ``create_block_mask(flex_mask_mod(...), ...)`` (tested).
    """
    from torch.nn.attention.flex_attention import BlockMask

    size = block_size or FLEX_BLOCK_SIZE
    q_start = torch.arange(0, length, size, device=device)
    k_start = torch.arange(0, s, size, device=device)
    q_lo = inputs.past_len + q_start  # absolute index of each query block's first query
    q_hi = inputs.past_len + (q_start + size).clamp(max=length) - 1  # ... and last
    k_lo, k_hi = k_start, (k_start + size).clamp(max=s) - 1  # first and last key of each key block
    complete = ((q_hi - q_lo + 1) == size)[:, None] & ((k_hi - k_lo + 1) == size)[None, :]
    causal_some = k_lo[None, :] <= q_hi[:, None]  # [Q blocks, K blocks]
    causal_all = k_hi[None, :] <= q_lo[:, None]
    real = F.pad(_keys_real(inputs, device).long().cumsum(dim=-1), (1, 0))  # [N, S + 1] before
    # the last key of each block that some query of the block may see
    last_seen = torch.minimum(k_hi[None, :], q_hi[:, None])
    real_seen = real[:, last_seen + 1] - real[:, k_lo[None, :].expand_as(last_seen)]
    # a query of the block is itself a key of the block: it sees at least that one
    self_seen = (k_lo[None, :] <= q_hi[:, None]) & (q_lo[:, None] <= k_hi[None, :])
    some = (causal_some & ((real_seen > 0) | self_seen))[:, None]  # [N, 1, Q blocks, K blocks]
    all_real = (real[:, k_hi + 1] - real[:, k_lo]) == (k_hi - k_lo + 1)  # [N, K blocks]
    full = (causal_all & complete)[None, None] & all_real[:, None, None, :]
    if inputs.window is not None or inputs.chunk is not None:
        # a span cuts blocks by position id: no block is full, and a block none of whose
        # (query, key) position pairs is inside the span is skipped, unless it holds a query's
        # own key
        full = torch.zeros_like(full)
        some = some & (_blocks_in_span(inputs, size, device) | self_seen[None, None])
    partial = some & ~full
    block_mask = BlockMask.from_kv_blocks(
        *_dense_to_kv_blocks(partial),
        *_dense_to_kv_blocks(full),
        BLOCK_SIZE=size,
        mask_mod=flex_mask_mod(inputs, device),
        seq_lengths=(length, s),
    )
    for name in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
        _dynamic_lengths(getattr(block_mask, name, None), 2)
    for name in ("kv_indices", "full_kv_indices", "q_indices", "full_q_indices"):
        _dynamic_lengths(getattr(block_mask, name, None), 2, 3)
    return block_mask


def attend_flex(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    inputs: AttentionInputs,
    compiled: bool = True,
) -> torch.Tensor:
    """:func:`attend` without entropy through ``flex_attention``: q [N, H, L, d], k, v [N, G, S, d]
    -> [N, H, L, d].

    The score bias is a ``score_mod``; causality and padding are a block mask, built once per forward pass
    and shared by the layers. ``compiled=False`` runs flex eagerly (the same semantics, all scores
    materialised, block sparsity ignored): for tests only.
    """
    if inputs.want_entropy:
        raise ValueError("flex attention returns no probabilities: entropy needs the tiled path.")
    n, h, length, _ = q.shape
    s = k.shape[2]
    if s != inputs.past_len + length:
        raise ValueError(f"{s} keys but past_len {inputs.past_len} + {length} new queries.")
    key = ("block_mask", q.device, n, length, s, FLEX_BLOCK_SIZE)
    block_mask = inputs.flex_cache.get(key)
    if block_mask is None:
        block_mask = inputs.flex_cache[key] = flex_block_mask(inputs, n, length, s, q.device)
    score_mod = inputs.flex_cache.get(("score_mod", q.device), False)
    if score_mod is False:
        score_mod = inputs.flex_cache[("score_mod", q.device)] = flex_score_mod(inputs, q.device)
    # contiguous: a cached k is, a fresh one is a view; strides that differ would recompile
    q, k, v = (_dynamic_lengths(t.contiguous(), 2) for t in (q, k, v))
    return _flex_kernel(compiled)(
        q,
        k,
        v,
        score_mod=score_mod,
        block_mask=block_mask,
        scale=inputs.scale,
        enable_gqa=h != k.shape[1],
    )


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    inputs: AttentionInputs,
    layer: int = 0,
    far: tuple[torch.Tensor, torch.Tensor] | None = None,
    sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Causal attention of q [N, H, L, d] over k, v [N, G, S, d] -> ([N, H, L, d], entropy [N, H, L] | None).

    Plain causal attention goes straight to the fused kernel (no L x S matrix; flash/efficient
    kernels on CUDA). Padding, a score bias or a cache with several new queries need a mask or a bias: on
    CUDA they go through compiled flex attention (:func:`attend_flex`, see :data:`FLEX_ATTENTION`),
    elsewhere and for an entropy request (which needs the probabilities) or a contextual term
    (which needs whole logits rows; ``layer`` is the block it belongs to) the mask is built in
    query tiles so that memory stays O(tile x S) however long the sequence. So is a training-free
    method's (``inputs.pairs``): ``far`` = (queries, keys) rotated to their far positions. So is
    a layer with a learned attention ``sink`` [H] (one logit per head that joins every softmax's
    denominator, attached to no value) and one with a sliding window or chunks (``inputs.window``,
    ``inputs.chunk``; also on flex).
    """
    n, h, length, _ = q.shape
    s = k.shape[2]
    gqa = h != k.shape[1]
    if sink is not None:
        return _attend_tiled(q, k, v, inputs, layer, far, sink)
    if _fused_plain(length, s, inputs):
        return (
            F.scaled_dot_product_attention(
                q, k, v, is_causal=length == s and length > 1, scale=inputs.scale, enable_gqa=gqa
            ),
            None,
        )
    if _use_flex(q, inputs):
        return attend_flex(q, k, v, inputs), None
    return _attend_tiled(q, k, v, inputs, layer, far)


def _sink_column(sink: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The sink logit of every head as one more key column: [H] -> [N, H, T, 1] float32."""
    n, h, t = like.shape[0], like.shape[1], like.shape[2]
    return sink.float()[None, :, None, None].expand(n, h, t, 1)


def _first_key_in_span(inputs: AttentionInputs, start: int, stop: int, visible: int) -> int:
    """Index of the first key that some query start..stop-1 may see within the layer's span
    (every earlier key is outside every query's window or chunk, in every row), at most the
    tile's first query, so that a query always keeps its own key."""
    q_min = int(inputs.q_pos[:, start:stop].min())
    lowest = -math.inf  # the smallest key position a query of the tile may see
    if inputs.window is not None:
        lowest = max(lowest, q_min - inputs.window + 1)
    if inputs.chunk is not None:
        lowest = max(lowest, q_min // inputs.chunk * inputs.chunk)
    needed = (inputs.k_pos[:, :visible] >= lowest).any(dim=0)  # [S']
    first = int(needed.to(torch.int8).argmax()) if bool(needed.any()) else visible
    return min(first, inputs.past_len + start)


def _cached_tile_bias(
    inputs: AttentionInputs, h: int, start: int, stop: int, first: int, visible: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`_tile_bias`, kept for the other layers of the forward pass that share ``inputs``
    (the same for each) while all kept tiles hold at most ``ATTENTION_TILE_ELEMENTS`` entries."""
    key = ("tile_bias", inputs.q_pos.device, start, stop, first, visible)
    found = inputs.flex_cache.get(key)
    if found is not None:
        return found
    found = _tile_bias(inputs, h, start, stop, first, visible)
    kept = inputs.flex_cache.get("tile_bias_elements", 0) + found[0].numel()
    if kept <= ATTENTION_TILE_ELEMENTS:
        inputs.flex_cache[key] = found
        inputs.flex_cache["tile_bias_elements"] = kept
    return found


def _tile_bias(
    inputs: AttentionInputs, h: int, start: int, stop: int, first: int, visible: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The additive logit bias of queries start..stop-1 over keys first..visible-1: -inf where
    masked (causal, padding, the layer's span, a training-free method's sinks), plus the family's
    score bias (at far positions for far pairs; an anchored method's every pair at its query's
    cache position); [N|1, 1|H, T, S'] float32. And which pairs are near (a training-free
    method's; None without one)."""
    device, pairs = inputs.q_pos.device, inputs.pairs
    keys = slice(first, visible)
    k_index = torch.arange(first, visible, device=device)
    k_pos = inputs.k_pos[:, None, None, keys]  # [N, 1, 1, S']
    q_pos = inputs.q_pos[:, None, start:stop, None]  # [N, 1, T, 1]
    query_index = inputs.past_len + torch.arange(start, stop, device=device)
    allowed = (k_index[None, :] <= query_index[:, None])[None, None]  # [1, 1, T, S']
    is_self = k_index[None, :] == query_index[:, None]  # [T, S']
    if inputs.k_valid is not None:
        # a padding query still sees itself, so its (ignored) row never becomes all -inf
        allowed = allowed & (inputs.k_valid[:, None, None, keys] | is_self)
    if inputs.window is not None or inputs.chunk is not None:  # the layer's window or chunk
        allowed = allowed & (span_mask(q_pos, k_pos, inputs.window, inputs.chunk) | is_self)
    near = None
    if pairs is not None:  # which pairs keep their own positions; sinks mask the rest
        near = q_pos - k_pos < pairs.window  # [N, 1, T, S']
        if pairs.sink_end is not None:
            allowed = allowed & (near | (k_pos < pairs.sink_end))
    bias = torch.zeros(allowed.shape, dtype=torch.float32, device=device)
    bias = bias.masked_fill(~allowed, float("-inf"))
    if inputs.score_bias is not None:
        heads = torch.arange(h, device=device)[None, :, None, None]  # [1, H, 1, 1]
        if pairs is not None and pairs.anchored:  # every pair at the query's cache position
            q_at = pairs.q_far[:, None, start:stop, None]  # [N, 1, T, 1]
            k_at = torch.where(near, k_pos - q_pos + q_at, pairs.k_far[:, None, None, keys])
            family_bias = inputs.score_bias(heads, q_at, k_at)  # [N, H, T, S']
        else:
            family_bias = inputs.score_bias(heads, q_pos, k_pos)  # [N, H, T, S']
        if pairs is not None and not pairs.anchored:  # far pairs: the bias at their far positions
            far_bias = inputs.score_bias(
                heads, pairs.q_far[:, None, start:stop, None], pairs.k_far[:, None, None, keys]
            )
            family_bias = torch.where(near, family_bias, far_bias)
        bias = bias + family_bias
    return bias, near


def _attend_tiled(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    inputs: AttentionInputs,
    layer: int = 0,
    far: tuple[torch.Tensor, torch.Tensor] | None = None,
    sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The explicit-mask path of :func:`attend`, in query tiles of O(tile x S) memory; ``sink``
    [H] adds one logit per head to every softmax's denominator (a learned attention sink)."""
    n, h, length, _ = q.shape
    s = k.shape[2]
    q_far, k_far = far if far is not None else (None, None)
    if h != k.shape[1]:
        k = k.repeat_interleave(h // k.shape[1], dim=1)
        v = v.repeat_interleave(h // v.shape[1], dim=1)
        if k_far is not None:
            k_far = k_far.repeat_interleave(h // k_far.shape[1], dim=1)
    tile = ATTENTION_TILE_ELEMENTS // (n * h * s)
    if inputs.contextual_bias is not None:  # CoPE holds about 8 tile-sized temporaries at once
        tile //= CONTEXTUAL_TEMPORARIES
    if far is not None:
        tile //= PAIR_TEMPORARIES
    spanned = inputs.window is not None or inputs.chunk is not None
    if spanned:  # tiles of about one span: each sees about two spans of keys, not all of them
        span = min(x for x in (inputs.window, inputs.chunk) if x is not None)
        tile = min(tile, max(span, SPAN_TILE_MIN))
    tile = max(1, tile)
    outputs, entropies = [], []
    for start in range(0, length, tile):
        stop = min(start + tile, length)
        # causal: keys after the tile's last query are masked for all of it, so leave them out
        visible = min(s, inputs.past_len + stop)
        # a span: keys before the first one any query of the tile may see are left out too
        first = _first_key_in_span(inputs, start, stop, visible) if spanned else 0
        keys = slice(first, visible)
        k_tile, v_tile = k[:, :, keys], v[:, :, keys]
        bias, near = _cached_tile_bias(inputs, h, start, stop, first, visible)
        q_tile = q[:, :, start:stop]
        if inputs.want_entropy or inputs.contextual_bias is not None or q_far is not None:
            q32 = q_tile.float()
            logits = torch.einsum("nhtd,nhsd->nhts", q32, k_tile.float())
            if q_far is not None:  # far pairs: queries and keys rotated to their far positions
                far_logits = torch.einsum(
                    "nhtd,nhsd->nhts", q_far[:, :, start:stop].float(), k_far[:, :, keys].float()
                )
                logits = torch.where(near, logits, far_logits)
            logits = logits * inputs.scale + bias
            if inputs.contextual_bias is not None:
                logits = logits + inputs.contextual_bias(layer, q32, logits, inputs.scale)
            if sink is not None:  # one more entry in every softmax, attached to no value
                logits = torch.cat((logits, _sink_column(sink, logits)), dim=-1)
            probs = logits.softmax(dim=-1)  # [N, H, T, S' (+ 1)]
            if inputs.want_entropy:
                entropies.append(-torch.special.xlogy(probs, probs).sum(-1))  # [N, H, T]
            if sink is not None:
                probs = probs[..., :-1]
            outputs.append(torch.einsum("nhts,nhsd->nhtd", probs, v_tile.float()).to(q.dtype))
        else:
            if sink is not None:  # a zero key (logit 0 + the sink as its bias) and a zero value
                zero = k_tile.new_zeros(n, h, 1, k_tile.shape[-1])
                k_tile, v_tile = torch.cat((k_tile, zero), dim=2), torch.cat((v_tile, zero), dim=2)
                bias = bias.expand(n, h, *bias.shape[2:])
                bias = torch.cat((bias, _sink_column(sink, bias)), dim=-1)
            outputs.append(
                F.scaled_dot_product_attention(
                    q_tile, k_tile, v_tile, attn_mask=bias.to(q.dtype), scale=inputs.scale
                )
            )
    entropy = torch.cat(entropies, dim=2) if entropies else None
    return torch.cat(outputs, dim=2), entropy


class Attention(nn.Module):
    def __init__(
        self,
        d_model: int,
        n_heads: int,
        kv_heads: int,
        head_dim: int,
        layer: int = 0,
        learned_sink: bool = False,
        qk_norm: bool = False,
        output_gate: bool = False,
        ssmax: bool = False,
    ):
        super().__init__()
        self.n_heads, self.kv_heads, self.head_dim = n_heads, kv_heads, head_dim
        self.layer = layer  # the block index: a contextual term may have parameters per layer
        # gpt-oss's attention sink: one learned logit per head in every softmax's denominator
        self.sink = nn.Parameter(torch.zeros(n_heads)) if learned_sink else None
        # model.qk_norm (Qwen3): RMSNorm with a learned scale over each head's d channels
        self.q_norm = nn.RMSNorm(head_dim) if qk_norm else None
        self.k_norm = nn.RMSNorm(head_dim) if qk_norm else None
        # model.output_gate: a sigmoid gate per head and channel from the layer's input
        self.gate_proj = nn.Linear(d_model, n_heads * head_dim, bias=False) if output_gate else None
        # model.attn_scale=ssmax: s_h per head, each query times s_h ln(keys it sees)
        self.ssmax = nn.Parameter(torch.full((n_heads,), SSMAX_INIT)) if ssmax else None
        self.q_proj = nn.Linear(d_model, n_heads * head_dim, bias=False)
        self.kv_proj = nn.Linear(d_model, 2 * kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        inputs: AttentionInputs,
        cached: tuple[torch.Tensor, torch.Tensor] | None,
        query_from: int = 0,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor | None]:
        """x [N, L, D] -> (output [N, L - query_from, D], (k, v) [N, G, S, d], entropy).

        ``query_from`` > 0: keys and values for all L new tokens, queries (and the output) only
        for tokens ``query_from..L-1``, which attend as new tokens after a cache of that length.
        """
        n, length, _ = x.shape
        queries = length - query_from
        q = (
            self.q_proj(x[:, query_from:]).view(n, queries, self.n_heads, self.head_dim)
        ).transpose(1, 2)  # [N, H, L - query_from, d]
        k, v = (
            self.kv_proj(x).view(n, length, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        )  # [N, G, L, d] each
        if self.q_norm is not None:  # model.qk_norm: per head, before any rotation (Qwen3)
            q, k = self.q_norm(q), self.k_norm(k)
        if inputs.cos is not None:  # RoPE: rotate this layer's queries and keys, never the values
            q_cos, q_sin = inputs.cos[:, :, query_from:], inputs.sin[:, :, query_from:]
            q = rotate(q, q_cos, q_sin, inputs.layout)
            k_cos = inputs.cos if inputs.k_cos is None else inputs.k_cos
            k_sin = inputs.sin if inputs.k_sin is None else inputs.k_sin
            k = rotate(k, k_cos, k_sin, inputs.layout)
        if inputs.qk_norm is not None:  # after the rotation, before any query factor (Llama 4)
            q, k = weightless_rms_norm(q, inputs.qk_norm), weightless_rms_norm(k, inputs.qk_norm)
        if inputs.q_scale is not None:  # log-n, per query position
            q = (q.float() * inputs.q_scale[:, :, query_from:]).to(q.dtype)
        if self.ssmax is not None:  # SSMax: s_h ln n, n the real keys the query sees
            factor = self.ssmax[None, :, None, None] * inputs.log_keys[:, :, query_from:]
            q = (q.float() * factor).to(q.dtype)
        if cached is not None:
            k = torch.cat((cached[0], k), dim=2)  # [N, G, S, d]
            v = torch.cat((cached[1], v), dim=2)
        pairs, far = inputs.pairs, None
        if pairs is not None and pairs.q_cos is not None:
            # a training-free method's far pairs: rotated on from their own positions (the cache
            # keeps keys at their own), so every key is moved again at each step
            q_far = rotate(
                q, pairs.q_cos[:, :, query_from:], pairs.q_sin[:, :, query_from:], inputs.layout
            )
            far = q_far, rotate(k, pairs.k_cos, pairs.k_sin, inputs.layout)  # [N, G, S, d]
        if query_from:
            if inputs.want_entropy:
                raise ValueError("attention entropy needs every query: query_from must be 0.")
            inputs = replace(
                inputs,
                q_pos=inputs.q_pos[:, query_from:],
                past_len=inputs.past_len + query_from,
                flex_cache={},  # another query range: another block mask
                pairs=pairs.queries_from(query_from) if pairs is not None else None,
            )
        out, entropy = attend(q, k, v, inputs, self.layer, far, self.sink)
        out = out.transpose(1, 2).reshape(n, queries, -1)  # [N, L - query_from, D]
        if self.gate_proj is not None:  # gated attention: elementwise, per head and channel
            out = out * torch.sigmoid(self.gate_proj(x[:, query_from:]))
        return self.o_proj(out), (k, v), entropy
