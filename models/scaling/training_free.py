"""The training-free methods: Self-Extend, ReRoPE, Leaky ReRoPE, StreamingLLM and Dual Chunk
Attention. Each returns a :class:`~models.scaling.registry.PairPositions` (where a query-key pair
beyond its window, or outside its chunk, is scored) instead of frequencies; the attention applies it (``tests/models/test_training_free.py``
compares each with its reference code)."""

from __future__ import annotations

import functools
from numbers import Integral
from typing import Any

from models.lazy import torch
from models.scaling.registry import PairPositions, param_number, register_scaling


def _window(method: str, window: Any) -> int:
    if isinstance(window, bool) or not isinstance(window, Integral) or window < 1:
        raise ValueError(f"{method}: window must be a positive integer (tokens), got {window!r}.")
    return int(window)


def _quarter_window(params: dict, train_length: int) -> dict:
    """``window: auto`` -> a quarter of the training length (at least 1)."""
    if params.get("window") == "auto":
        params["window"] = max(1, train_length // 4)
    return params


def _window_inside(method: str, key: str, params: dict, train_length: int) -> int:
    """The resolved window, which ``key`` auto needs below the training length (the far
    positions it sets must fit in the trained range)."""
    window = _window(method, params.get("window"))
    if window >= train_length:
        raise ValueError(
            f"{method}: window {window} must be below the training length {train_length} for "
            f"{key} auto (the far positions must fit in the trained range)."
        )
    return window


def _group_floor(positions: torch.Tensor, group: int, shift: int = 0) -> torch.Tensor:
    return torch.div(positions, group, rounding_mode="floor") + shift


def _affine(positions: torch.Tensor, slope: float, shift: float) -> torch.Tensor:
    return positions * slope + shift


def _capped(positions: torch.Tensor, cap: int) -> torch.Tensor:
    return positions.clamp(max=cap)


def _self_extend_auto(params: dict, target: int, train_length: int) -> dict:
    """window auto: a quarter of L; group_size auto: the smallest integer G for which the farthest
    pair of a ``target``-token input, floor((T - 1) / G) + W - floor(W / G), stays below L."""
    params = _quarter_window(params, train_length)
    if params.get("group_size") == "auto":
        window = _window_inside("self_extend", "group_size", params, train_length)
        group = 1
        while (target - 1) // group + window - window // group > train_length - 1:
            group += 1
        params["group_size"] = group
    return params


@register_scaling(
    "self_extend",
    applies_to=("rotary", "pairs"),
    auto_keys=("group_size", "window"),
    pair_method=True,
    auto_rule=_self_extend_auto,
)
def _self_extend(train_length: int, *, group_size: int, window: int) -> PairPositions:
    """Self-Extend (Jin et al. 2024; LongLM ``self_extend_patch``): pairs closer than the
    neighbour ``window`` W keep their positions; farther ones are scored at grouped positions,
    the query at floor(i / G) + W - floor(W / G) and the key at floor(j / G), G = ``group_size``."""
    if isinstance(group_size, bool) or not isinstance(group_size, Integral) or group_size < 1:
        raise ValueError(f"self_extend: group_size must be a positive integer, got {group_size!r}.")
    w, g = _window("self_extend", window), int(group_size)
    return PairPositions(
        w,
        functools.partial(_group_floor, group=g, shift=w - w // g),
        functools.partial(_group_floor, group=g),
    )


@register_scaling(
    "rerope",
    applies_to=("rotary", "pairs"),
    auto_keys=("window",),
    pair_method=True,
    auto_rule=lambda params, target, train_length: _quarter_window(params, train_length),
)
def _rerope(train_length: int, *, window: int) -> PairPositions:
    """ReRoPE (Su 2023; bojone/rerope): relative positions clipped at ``window`` W, i.e. a far
    pair is scored with the query at W and the key at 0. bojone's patch also applies log-n
    (here ``scaling.logn=true``)."""
    w = _window("rerope", window)
    return PairPositions(
        w,
        functools.partial(_affine, slope=0.0, shift=float(w)),
        functools.partial(_affine, slope=0.0, shift=0.0),
    )


def _leaky_auto(params: dict, target: int, train_length: int) -> dict:
    """window auto: a quarter of L; slope auto: the largest slope 1/k <= 1 for which the farthest
    pair of a ``target``-token input, W + (T - 1 - W) / k, stays within L - 1."""
    params = _quarter_window(params, train_length)
    if params.get("slope") == "auto":
        window = _window_inside("leaky_rerope", "slope", params, train_length)
        far = target - 1 - window
        params["slope"] = 1.0 if far <= 0 else min(1.0, (train_length - 1 - window) / far)
    return params


@register_scaling(
    "leaky_rerope",
    applies_to=("rotary", "pairs"),
    auto_keys=("window", "slope"),
    pair_method=True,
    auto_rule=_leaky_auto,
)
def _leaky_rerope(train_length: int, *, window: int, slope: float) -> PairPositions:
    """Leaky ReRoPE (Su 2023; bojone/rerope ``leaky_rerope_patch``): relative positions past the
    window W grow with ``slope`` 1/k, W + (i - j - W) / k: the query at i / k + W (1 - 1 / k), the
    key at j / k. Slope 0 is ReRoPE, slope 1 the raw model."""
    w = _window("leaky_rerope", window)
    a = param_number("leaky_rerope", "slope", slope)
    if not 0 <= a <= 1:
        raise ValueError(f"leaky_rerope: slope must be in [0, 1], got {slope!r}.")
    return PairPositions(
        w,
        functools.partial(_affine, slope=a, shift=w * (1 - a)),
        functools.partial(_affine, slope=a, shift=0.0),
    )


def _streaming_auto(params: dict, target: int, train_length: int) -> dict:
    """window auto: the training length less the sinks (the whole cache fits the trained range)."""
    if params.get("window") == "auto":
        sinks = params.get("sink_tokens", 4)
        if isinstance(sinks, Integral) and not isinstance(sinks, bool):
            params["window"] = max(1, train_length - int(sinks))
    return params


@register_scaling(
    "streaming",
    applies_to=("pairs",),
    auto_keys=("window",),
    pair_method=True,
    auto_rule=_streaming_auto,
)
def _streaming(train_length: int, *, window: int, sink_tokens: int = 4) -> PairPositions:
    """StreamingLLM (Xiao et al. 2024; mit-han-lab/streaming-llm): each query sees the first
    ``sink_tokens`` tokens (attention sinks) and the ``window`` most recent ones, itself included,
    at their positions in that cache: keys keep their distances, the query stands at most at
    sinks + window - 1, counted from the row's first token whatever its position id (the repo
    re-positions the cache from 0; whatever reads the query's position, FIRE's normaliser or
    log-n, reads that one). The repo's ``recent_size`` is window - 1 (its new token joins the cache);
    ``sink_tokens`` 0 is plain window attention. Keys outside are masked, not evicted: the same
    logits as the repo's eviction, without its bounded memory."""
    w = _window("streaming", window)
    if isinstance(sink_tokens, bool) or not isinstance(sink_tokens, Integral) or sink_tokens < 0:
        raise ValueError(f"streaming: sink_tokens must be an integer >= 0, got {sink_tokens!r}.")
    s = int(sink_tokens)
    if s >= train_length:  # every key of a trained-length input is a sink: plain attention
        raise ValueError(
            f"streaming: sink_tokens {s} must be below the training length {train_length} "
            "(sinks covering the trained range leave plain attention, not StreamingLLM)."
        )
    if w < 2:
        raise ValueError(
            f"streaming: window {w} must be at least 2 (a query would see only itself besides "
            f"the {s} sink tokens); lower sink_tokens or set a larger window."
        )
    return PairPositions(
        w, functools.partial(_capped, cap=s + w - 1), _identity, sinks=s, anchored=True
    )


def _identity(positions: torch.Tensor) -> torch.Tensor:
    return positions


def _dca_auto(params: dict, target: int, train_length: int) -> dict:
    """chunk_size auto: 3/4 of L; local_window auto: L / 8 (ChunkLlama's
    ``replace_with_chunkllama(pretraining_length)``: ``pretraining_length * 3 // 4`` and ``// 8``)."""
    if params.get("chunk_size") == "auto":
        params["chunk_size"] = max(2, train_length * 3 // 4)
    if params.get("local_window") == "auto":
        params["local_window"] = train_length // 8
    return params


def _chunk_regions(q_pos: torch.Tensor, k_pos: torch.Tensor, chunk: int) -> torch.Tensor:
    """0 in the query's chunk, 1 in the chunk before, 2 in any earlier one (chunks of ``chunk``
    positions from position 0)."""
    return (_group_floor(q_pos, chunk) - _group_floor(k_pos, chunk)).clamp(0, 2)


def _successive_query(positions: torch.Tensor, chunk: int, cap: int) -> torch.Tensor:
    return (torch.remainder(positions, chunk) + chunk).clamp(max=cap)


@register_scaling(
    "dca",
    applies_to=("rotary", "pairs"),
    auto_keys=("chunk_size", "local_window"),
    pair_method=True,
    auto_rule=_dca_auto,
)
def _dca(train_length: int, *, chunk_size: int, local_window: int) -> PairPositions:
    """Dual Chunk Attention (An et al., ICML 2024; HKUNLP/ChunkLlama ``chunkllama_attn_replace``):
    positions are cut into chunks of c = ``chunk_size`` - ``local_window`` and every key stands
    at its position within its chunk, j mod c. A query i scores the keys of its own chunk at
    i mod c (intra-chunk: their own distance i - j), those of the chunk before at
    min(i mod c + c, chunk_size) (successive chunks keep their local distances, capped), and all
    earlier ones at min(2c - 1, chunk_size) (inter-chunk). So no relative position exceeds
    ``chunk_size``, which must be below the training length. The repo's current code also
    multiplies cos and sin by 0.05 ln(T / L) + 1 past L (YaRN's mscale; its comment: the paper's
    results did not use it): not applied here."""
    for key, value in (("chunk_size", chunk_size), ("local_window", local_window)):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
            raise ValueError(f"dca: {key} must be an integer >= 0 (tokens), got {value!r}.")
    size, local = int(chunk_size), int(local_window)
    if not 0 <= local < size:
        raise ValueError(
            f"dca: local_window {local} must be below chunk_size {size} (the chunk is "
            "chunk_size - local_window positions)."
        )
    if size >= train_length:
        raise ValueError(
            f"dca: chunk_size {size} must be below the training length {train_length} (the "
            "largest relative position it assigns is chunk_size)."
        )
    chunk = size - local
    return PairPositions(
        chunk,  # unused: the chunks decide each pair's regime
        functools.partial(_successive_query, chunk=chunk, cap=size),
        functools.partial(torch.remainder, other=chunk),
        regions=functools.partial(_chunk_regions, chunk=chunk),
        more_far_queries=(
            functools.partial(_affine, slope=0.0, shift=float(min(2 * chunk - 1, size))),
        ),
    )
