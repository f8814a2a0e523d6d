"""The FlexAttention path of :func:`models.attention.attend`: when it is taken
(:data:`FLEX_ATTENTION`), the score bias as a ``score_mod``, the mask as a block mask, the kernel.

Shapes: N batch, H query heads, G key/value heads, L new tokens, S keys (cached + new), d head dim.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from models.attention_inputs import AttentionInputs, fused_plain, span_mask

__all__ = [
    "FLEX_ATTENTION",
    "FLEX_BLOCK_SIZE",
    "attend_flex",
    "flex_attention_unavailable",
    "flex_block_mask",
    "flex_mask_mod",
    "flex_score_mod",
    "use_flex",
]

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


def use_flex(q: torch.Tensor, inputs: AttentionInputs) -> bool:
    """Whether :func:`models.attention.attend` takes the flex-attention path for queries ``q``
    [N, H, L, d].

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
    if fused_plain(q.shape[2], inputs.k_pos.shape[1], inputs):
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
    """:func:`models.attention.attend` without entropy through ``flex_attention``: q [N, H, L, d],
    k, v [N, G, S, d] -> [N, H, L, d].

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
