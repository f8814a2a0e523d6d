"""The tiled path of :func:`models.attention.attend`: an explicit mask and bias in query tiles of
O(tile x S) memory, for what SDPA and flex attention cannot do (entropy, CoPE, pair methods, sinks).

Shapes: N batch, H query heads, T query tile, S keys (cached + new), S' keys of a tile, d head dim.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from models.attention_inputs import AttentionInputs, span_mask

__all__ = [
    "ATTENTION_TILE_ELEMENTS",
    "CONTEXTUAL_TEMPORARIES",
    "PAIR_TEMPORARIES",
    "SPAN_TILE_MIN",
    "STICK_TEMPORARIES",
    "attend_tiled",
    "stick_breaking_weights",
]

# Entries of a masked attention logit tile held at once when the mask must be materialised.
ATTENTION_TILE_ELEMENTS = 1 << 24
# A contextual term (CoPE) keeps about this many tile-sized float32 tensors alive (logits, gates,
# counts, interpolation weights, gathered terms): its tiles are this much smaller.
CONTEXTUAL_TEMPORARIES = 8
# A training-free pair method (Self-Extend, ReRoPE) holds two logit tiles (near and far) at once.
PAIR_TEMPORARIES = 2
# Stick-breaking attention keeps about this many tile-sized float32 tensors alive at once.
STICK_TEMPORARIES = 4
# A layer with a window or chunks attends in query tiles of about one span (at least this many
# queries, where fewer calls cost more than the keys they leave out)
SPAN_TILE_MIN = 128


def stick_breaking_weights(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stick-breaking attention (Tan et al., ICLR 2025) from logits z [N, H, T, S'] (-inf where a
    key takes no part): A_ij = sigmoid(z_ij) prod_{k > j} (1 - sigmoid(z_ik)) over the row's later
    keys (nearest first breaks the stick), in log space: log sigmoid(z_ij) plus a reverse cumulative
    sum of log sigmoid(-z) after j. -> (A [N, H, T, S'], the leftover stick [N, H, T, 1])."""
    log_rest = F.logsigmoid(-logits)  # 0 where masked: such a key breaks nothing
    after = log_rest.flip(-1).cumsum(-1).flip(-1) - log_rest  # the sum over the later keys
    weights = torch.exp(F.logsigmoid(logits) + after)
    return weights, torch.exp(log_rest.sum(-1, keepdim=True))


def _with_first_mass(entropy: torch.Tensor, probs: torch.Tensor, first: int) -> torch.Tensor:
    """[N, H, T, 2]: each query's attention entropy and its attention on key 0 (the window's first
    token; 0 where the tile's keys start later, outside the query's span)."""
    mass = probs[..., 0] if first == 0 else torch.zeros_like(entropy)
    return torch.stack((entropy, mass.to(entropy.dtype)), dim=-1)


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
    cache position); [N|1, 1|H, T, S'] float32. And each pair's regime (a training-free
    method's, 0 = its own positions; None without one)."""
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
    near = region = None
    if pairs is not None:  # which pairs keep their own positions; sinks mask the rest
        region = pairs.region(q_pos, k_pos)  # [N, 1, T, S']
        near = region == 0
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
            for r, (q_at, _, _) in enumerate(pairs.more, 2):  # more regimes (DCA)
                far_bias = inputs.score_bias(
                    heads, q_at[:, None, start:stop, None], pairs.k_far[:, None, None, keys]
                )
                family_bias = torch.where(region == r, far_bias, family_bias)
        bias = bias + family_bias
    return bias, region


def _tile_queries(entries_per_query: int, inputs: AttentionInputs, pairs: bool, stick: bool) -> int:
    """Queries per tile: ATTENTION_TILE_ELEMENTS over a query's logits, less where a tile keeps
    several tile-sized temporaries (CoPE, a pair method's two logit tiles, stick-breaking); about
    one span for a layer with a window or chunks (each tile then sees about two spans of keys)."""
    tile = ATTENTION_TILE_ELEMENTS // entries_per_query
    if inputs.contextual_bias is not None:  # CoPE holds about 8 tile-sized temporaries at once
        tile //= CONTEXTUAL_TEMPORARIES
    if pairs:
        tile //= PAIR_TEMPORARIES
    if stick:  # logits, two log-sigmoids, their running sum, the weights
        tile //= STICK_TEMPORARIES
    if inputs.window is not None or inputs.chunk is not None:
        span = min(x for x in (inputs.window, inputs.chunk) if x is not None)
        tile = min(tile, max(span, SPAN_TILE_MIN))
    return max(1, tile)


def _weights(
    logits: torch.Tensor, want_stats: bool, first: int, sunk: bool, own: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The attention weights of a tile's logits [N, H, T, S' (+ 1 sink column)] -> (weights over
    its keys [N, H, T, S'], per query [N, H, T, 2] entropy and first-key mass when ``want_stats``):
    a softmax, or stick-breaking with ``own`` [T, S'] (each query's own key, left out)."""
    if own is not None:
        probs, leftover = stick_breaking_weights(logits.masked_fill(own, float("-inf")))
        whole = torch.cat((probs, leftover), dim=-1)  # with the leftover: sums to 1
    else:
        probs = whole = logits.softmax(dim=-1)  # [N, H, T, S' (+ 1)]
    stats = None
    if want_stats:
        stats = _with_first_mass(-torch.special.xlogy(whole, whole).sum(-1), probs, first)
    return (probs[..., :-1] if sunk else probs), stats


def _with_far_pairs(
    logits: torch.Tensor,
    region: torch.Tensor,
    q_fars: tuple[torch.Tensor, ...],
    k_far: torch.Tensor,
    start: int,
    stop: int,
) -> torch.Tensor:
    """A tile's logits [N, H, T, S'] with each pair of regime r >= 1 scored by the r-th far
    queries ``q_fars[r - 1]`` [N, H, L, d] and the far keys ``k_far`` [N, H, S', d]."""
    for r, q_r in enumerate(q_fars, 1):
        far_logits = torch.einsum("nhtd,nhsd->nhts", q_r[:, :, start:stop].float(), k_far.float())
        logits = torch.where(region == r, far_logits, logits)
    return logits


def attend_tiled(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    inputs: AttentionInputs,
    layer: int = 0,
    far: tuple[torch.Tensor, torch.Tensor] | None = None,
    sink: torch.Tensor | None = None,
    decay: tuple[torch.Tensor, torch.Tensor] | None = None,
    stick_breaking: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The explicit-mask path of :func:`models.attention.attend`, in query tiles of O(tile x S)
    memory (with ``inputs.want_entropy``, per query [N, H, L, 2]: the attention entropy and the
    attention on the first key); ``sink`` [H] adds one logit per head to every softmax's denominator (a learned
    attention sink); ``decay`` = (F_q [N, H, L], F_k [N, H, S]) adds F_i - F_j to the logit of
    query i and key j (FoX's forget gates; per layer, so never in the shared tile cache);
    ``stick_breaking`` replaces the softmax by :func:`stick_breaking_weights` (its entropy is that
    of the weights and the leftover stick, which sum to 1). ``far`` = (queries, keys, queries of
    regimes 2, 3, ...) rotated to a training-free method's far positions."""
    n, h, length, _ = q.shape
    s = k.shape[2]
    q_far, k_far, *q_more = far if far is not None else (None, None)
    if h != k.shape[1]:
        k = k.repeat_interleave(h // k.shape[1], dim=1)
        v = v.repeat_interleave(h // v.shape[1], dim=1)
        if k_far is not None:
            k_far = k_far.repeat_interleave(h // k_far.shape[1], dim=1)
    tile = _tile_queries(n * h * s, inputs, far is not None, stick_breaking)
    spanned = inputs.window is not None or inputs.chunk is not None
    outputs, entropies = [], []
    for start in range(0, length, tile):
        stop = min(start + tile, length)
        # causal: keys after the tile's last query are masked for all of it, so leave them out
        visible = min(s, inputs.past_len + stop)
        # a span: keys before the first one any query of the tile may see are left out too
        first = _first_key_in_span(inputs, start, stop, visible) if spanned else 0
        keys = slice(first, visible)
        k_tile, v_tile = k[:, :, keys], v[:, :, keys]
        bias, region = _cached_tile_bias(inputs, h, start, stop, first, visible)
        if decay is not None:  # [N, H, T, S']: differences of running sums, in float32
            bias = bias + (decay[0][:, :, start:stop, None] - decay[1][:, :, None, keys])
        q_tile = q[:, :, start:stop]
        explicit = inputs.want_entropy or inputs.contextual_bias is not None or q_far is not None
        if explicit or stick_breaking:
            q32 = q_tile.float()
            logits = torch.einsum("nhtd,nhsd->nhts", q32, k_tile.float())
            if q_far is not None:  # far pairs: queries and keys rotated to their far positions
                logits = _with_far_pairs(
                    logits, region, (q_far, *q_more), k_far[:, :, keys], start, stop
                )
            logits = logits * inputs.scale + bias
            if inputs.contextual_bias is not None:
                logits = logits + inputs.contextual_bias(layer, q32, logits, inputs.scale)
            if sink is not None:  # one more entry in every softmax, attached to no value
                logits = torch.cat((logits, _sink_column(sink, logits)), dim=-1)
            own = None
            if stick_breaking:  # the query's own key takes no part (keys before it only)
                own = torch.arange(first, visible, device=q.device)[None, :] == (
                    inputs.past_len + torch.arange(start, stop, device=q.device)[:, None]
                )  # [T, S']
            probs, stats = _weights(logits, inputs.want_entropy, first, sink is not None, own)
            if stats is not None:
                entropies.append(stats)
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
