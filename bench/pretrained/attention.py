"""Attention functions lenbench registers with transformers' AttentionInterface: attention
entropy in query tiles, log-n around a model's own attention, and training-free pair methods."""

from __future__ import annotations

import inspect
import sys

import torch
from torch import nn

from models.attention import logn_query_scale
from models.attention_inputs import pair_inputs
from models.positions import rotate
from models.tiled_attention import ATTENTION_TILE_ELEMENTS, PAIR_TEMPORARIES

__all__ = [
    "ENTROPY_ATTENTION",
    "LOGN_ATTENTION",
    "PAIR_ATTENTION",
    "register_entropy_attention",
    "register_logn_attention",
    "register_pair_attention",
    "rotates_half",
    "uses_attention_interface",
]

ENTROPY_ATTENTION = "lenbench_entropy"
PAIR_ATTENTION = "lenbench_pairs"
#: prefix of the registered log-n attention functions, one per wrapped implementation
LOGN_ATTENTION = "lenbench_logn"


# --------------------------------------------------------------------------- entropy attention


def _tiled_attention(
    query, key, value, attention_mask, scale, softcap=None, want_entropy=False, pairs=None
):
    """Attention of q [N, H, L, d] over k, v [N, G, S, d] in query tiles (memory linear in
    length) -> ([N, H, L, d], entropy [N, H, L] nats float32 | None), under transformers'
    ``attention_mask`` (bool or additive; None = plain causal, the queries the last L of S).
    ``pairs`` = (q_fars, k_far, q_pos, k_pos, PairInputs): a training-free method's far pairs
    are scored with the far queries of their regime (q_fars: one per regime 1, 2, ...) and the
    far keys, and its sinks mask the far keys past them."""
    n, h, length, _ = query.shape
    s = key.shape[2]
    repeat = h // key.shape[1]
    if pairs is not None:
        q_fars, k_far, q_pos, k_pos, spec = pairs
        k_far = k_far.repeat_interleave(repeat, dim=1) if repeat > 1 else k_far
    if repeat > 1:
        key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
    tile = ATTENTION_TILE_ELEMENTS // (n * h * s) // (PAIR_TEMPORARIES if pairs else 1)
    tile = max(1, tile)
    key_index = torch.arange(s, device=query.device)
    outputs, entropies = [], []
    for start in range(0, length, tile):
        stop = min(start + tile, length)
        # a causal model's query sees no key after its own position: the tile's queries (the
        # last L of S) read only the first s - length + stop keys, the rest would be masked out
        # (half the work of a prefill; the same probabilities)
        end = s - length + stop
        keys, values = key[:, :, :end], value[:, :, :end]  # [N, H, E, d]
        logits = torch.einsum("nhtd,nhsd->nhts", query[:, :, start:stop].float(), keys.float())
        if pairs is not None:
            region = spec.region(q_pos[:, None, start:stop, None], k_pos[:, None, None, :end])
            near = region == 0
            for r, q_far in enumerate(q_fars, 1):
                far = torch.einsum(
                    "nhtd,nhsd->nhts", q_far[:, :, start:stop].float(), k_far[:, :, :end].float()
                )
                logits = torch.where(region == r, far, logits)  # [N, H, T, E]
        logits = logits * scale
        if softcap:
            logits = softcap * torch.tanh(logits / softcap)
        if attention_mask is None:  # plain causal; the queries are the last L of S positions
            query_index = s - length + torch.arange(start, stop, device=query.device)
            logits = logits.masked_fill(key_index[None, :end] > query_index[:, None], float("-inf"))
        else:
            mask = attention_mask[:, :, start:stop, :end]
            if mask.dtype == torch.bool:
                logits = logits.masked_fill(~mask, float("-inf"))
            else:
                logits = logits + mask.float()
        if pairs is not None and spec.sink_end is not None:  # StreamingLLM: only sinks far
            sink = k_pos[:, None, None, :end] < spec.sink_end
            logits = logits.masked_fill(~(near | sink), float("-inf"))
        probs = logits.softmax(dim=-1)  # [N, H, T, E]
        if want_entropy:
            entropies.append(-torch.special.xlogy(probs, probs).sum(-1))  # [N, H, T]
        outputs.append(torch.einsum("nhts,nhsd->nhtd", probs, values.float()).to(query.dtype))
    entropy = torch.cat(entropies, dim=2) if want_entropy else None
    return torch.cat(outputs, dim=2), entropy


def _entropy_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
):
    """Attention of q [N, H, L, d] over k, v [N, G, S, d] in query tiles, storing each query's
    attention entropy [N, H, L] (nats, float32) on ``module``; returns ([N, L, H, d], None)."""
    if getattr(module, "sinks", None) is not None:
        raise ValueError("attention entropy does not support attention sinks.")
    scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    out, module._lenbench_entropy = _tiled_attention(
        query, key, value, attention_mask, scale, kwargs.get("softcap"), want_entropy=True
    )
    return out.transpose(1, 2).contiguous(), None


def register_entropy_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if ENTROPY_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ENTROPY_ATTENTION, _entropy_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(ENTROPY_ATTENTION, sdpa_mask)


def _pair_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """A training-free method (``models.scaling.PairPositions``) on q [N, H, L, d] and k, v
    [N, G, S, d] as the model rotated them at their own positions: far pairs are rotated on to
    their far positions (the model's own inverse frequencies, rotate_half), near and far logits
    merged per pair, in query tiles (memory linear in length); log-n and attention entropy
    (stored on ``module``) as the active scaling asks. ``config._lenbench_pairs`` = (pairs, inverse
    frequencies, training length, log-n, entropy), set by :meth:`bench.pretrained.adapter.PretrainedLM._attention_implementation`.
    Keys are at consecutive positions ending at the last query's (a prefill's keys are its queries)."""
    if getattr(module, "sinks", None) is not None:
        raise ValueError("training-free methods do not support learned attention sinks.")
    spec, inv_freq, train_length, logn, want_entropy = module.config._lenbench_pairs
    n, h, length, d = query.shape
    s = key.shape[2]
    q_pos = kwargs.get("position_ids")
    if q_pos is None:
        raise ValueError(
            f"a training-free method needs each query's position id, which "
            f"{type(module).__name__} does not pass to its attention function."
        )
    q_pos = q_pos.to(query.device).expand(n, length)  # [N, L]
    if s == length:
        k_pos = q_pos
    else:  # a cache: consecutive positions up to the last query's
        k_pos = q_pos[:, -1:] - torch.arange(s - 1, -1, -1, device=query.device)  # [N, S]
    k_valid = None  # padding keys: those the last query may not see (its row of the mask)
    if attention_mask is not None:
        last = attention_mask[:, 0, -1, :s]  # [N, S]
        k_valid = last if last.dtype == torch.bool else last == 0
    pairs = pair_inputs(spec, q_pos, k_pos, inv_freq.to(query.device), k_valid)
    if logn:  # at each query's position (StreamingLLM's: in its cache)
        factor = logn_query_scale(pairs.query_positions(q_pos), train_length)[:, None, :, None]
        query = (query.float() * factor).to(query.dtype)
    rotations = [(pairs.q_cos, pairs.q_sin), *((c, s) for _, c, s in pairs.more)]
    q_fars = [rotate(query, cos, sin, "half") for cos, sin in rotations]  # one per far regime
    k_far = rotate(key, pairs.k_cos, pairs.k_sin, "half")
    scale = d**-0.5 if scaling is None else float(scaling)
    out, entropy = _tiled_attention(
        query, key, value, attention_mask, scale, kwargs.get("softcap"), want_entropy,
        pairs=(q_fars, k_far, q_pos, k_pos, pairs),
    )  # fmt: skip
    if want_entropy:
        module._lenbench_entropy = entropy
    return out.transpose(1, 2).contiguous(), None


def register_pair_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if PAIR_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(PAIR_ATTENTION, _pair_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(PAIR_ATTENTION, sdpa_mask)


def _logn_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Log-n (``models.attention.logn_query_scale``): query [N, H, L, d] times max(1, ln(p + 1) /
    ln L) at its position id p, then the implementation this one wraps (``config._lenbench_logn``
    = (L, its name), set by :meth:`bench.pretrained.adapter.PretrainedLM._attention_implementation`)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    train_length, inner = module.config._lenbench_logn
    position_ids = kwargs.get("position_ids")
    if position_ids is None:
        raise ValueError(
            f"log-n needs each query's position id, which {type(module).__name__} does not pass "
            "to its attention function."
        )
    factor = logn_query_scale(position_ids.expand(query.shape[0], -1), train_length)
    query = (query.float() * factor[:, None, :, None].to(query.device)).to(query.dtype)
    if inner == ENTROPY_ATTENTION:
        fn = _entropy_attention
    elif inner == "eager":  # the model's own eager attention, from its modeling module
        fn = vars(sys.modules[type(module).__module__])["eager_attention_forward"]
    else:
        fn = ALL_ATTENTION_FUNCTIONS[inner]
    return fn(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)


def register_logn_attention(inner: str) -> str:
    """The name of the log-n attention function wrapping ``inner``, registered with ``inner``'s
    mask function (the wrapped implementation reads the mask it expects)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    name = f"{LOGN_ATTENTION}_{inner}"
    if name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, _logn_attention)
        mask = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(inner, sdpa_mask)
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, mask)
    return name


def rotates_half(model: nn.Module | type) -> bool:
    """Whether the model's modeling module rotates with ``rotate_half`` (Llama, GPT-NeoX, Qwen):
    the layout a training-free method's extra rotation must share."""
    cls = model if isinstance(model, type) else type(model)
    module = sys.modules.get(cls.__module__) or inspect.getmodule(cls)
    return module is not None and "rotate_half" in vars(module)


def uses_attention_interface(model: nn.Module | type) -> bool:
    """Whether the model's (or model class's) code dispatches attention through transformers'
    AttentionInterface."""
    cls = model if isinstance(model, type) else type(model)
    module = sys.modules.get(cls.__module__) or inspect.getmodule(cls)
    return module is not None and "ALL_ATTENTION_FUNCTIONS" in vars(module)
