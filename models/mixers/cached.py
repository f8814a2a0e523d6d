"""How a decoder layer runs its token mixer over new tokens with the KV cache
(``models.transformer.Block.mix``).

A stateful mixer (one with ``step(x, state, valid) -> (y, state)``: every mixer of
``models.mixers``) continues from the state its cache entry holds: the conv's last inputs and the
recurrence's state, whose size does not grow with the prefix, so a decoding step costs O(1) per
token (transformers' Mamba2 and Qwen3-Next caches keep the same two). A pad is skipped: the conv's
window and the state pass over it, whatever the layout (left padding, or padding after a prefill),
so a padded row equals the unpadded one.

Any other mixer (a user's, with ``forward`` only) reads the whole prefix again: its cache entry is
the layer's inputs [N, S, D], O(S) per token, and a row with padding runs its real tokens alone.
The benchmark reaches this path for the mixers above too (``Block.stateful = False``:
tests/perf/mixer_speed.py ``--decode``). Either way a pad's output is 0."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["is_stateful", "mix_cached"]


def is_stateful(mixer: nn.Module) -> bool:
    """Whether ``mixer`` decodes from a state (it has ``step``)."""
    return callable(getattr(mixer, "step", None))


def mix_cached(
    mixer: nn.Module,
    h: torch.Tensor,
    valid: torch.Tensor | None,
    cached: tuple[torch.Tensor, ...] | None,
    stateful: bool,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The mixer over its normed input h [N, L, D], after the tokens ``cached`` holds (None: the
    sequence starts); ``valid`` [N, S] bool over cached + new tokens, False for padding (None:
    none) -> (output [N, L, D], the layer's new cache entry)."""
    if stateful:
        new = None if valid is None else valid[:, valid.shape[1] - h.shape[1] :]  # [N, L]
        if new is not None and bool(new.all()):  # padding only before: nothing to skip now
            new = None
        out, state = mixer.step(h, cached, new)
        if new is not None:
            out = out.masked_fill(~new[..., None], 0.0)
        return out, state
    seen = h if cached is None else torch.cat((cached[0], h), dim=1)  # [N, S, D]
    if valid is None:
        out = mixer(seen)
    else:
        out = torch.zeros_like(seen)
        for row in valid.any(dim=1).nonzero().flatten().tolist():  # rows with a real token
            out[row, valid[row]] = mixer(seen[row : row + 1, valid[row]])[0]
    return out[:, seen.shape[1] - h.shape[1] :], (seen,)
