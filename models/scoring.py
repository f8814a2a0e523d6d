"""Per-token log-probabilities from hidden states, the LM head applied in chunks of positions.

Full-vocabulary logits of a long window are [N, L, V] float32: at V = 128k and L = 32k that is
16 GB per row, far more than the model's attention needs. Scoring a chunk of positions at a time
(LM head, log-softmax, gather) keeps at most ``LOGIT_CHUNK_ELEMENTS`` logits alive, so evaluation
memory grows with the length times the width, not times the vocabulary. For a byte-level model
(V = 259) a chunk covers tens of thousands of positions: the loop then runs once.

Shapes: N rows, T scored positions, D width, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

from models.lazy import F, torch

__all__ = ["LOGIT_CHUNK_ELEMENTS", "chunked_token_nll", "chunk_positions"]

# logits computed at once: 2**24 float32 = 64 MiB (and as much again for the log-softmax)
LOGIT_CHUNK_ELEMENTS = 2**24


def chunk_positions(rows: int, vocab_size: int, limit: int | None = None) -> int:
    """Positions per chunk so that rows x positions x vocabulary stays within ``limit`` elements."""
    limit = LOGIT_CHUNK_ELEMENTS if limit is None else int(limit)
    return max(1, limit // max(1, int(rows) * int(vocab_size)))


def chunked_token_nll(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    vocab_size: int,
    limit: int | None = None,
) -> torch.Tensor:
    """NLL (nats, float32) of ``targets`` [N, T] under ``head(hidden)``; hidden [N, T, D] -> [N, T].

    ``head`` maps hidden states to logits (the LM head, after the final norm); its logits are
    made float32 before the log-softmax, whatever the autocast precision, as the full-logit path
    does. Equal to ``cross_entropy(head(hidden).float(), targets)`` up to float-reduction noise.
    """
    n, t = targets.shape
    if hidden.shape[:2] != (n, t):
        raise ValueError(
            f"hidden states {tuple(hidden.shape)} do not match targets {tuple(targets.shape)}."
        )
    targets = targets.to(hidden.device)
    nll = torch.empty(n, t, dtype=torch.float32, device=hidden.device)
    step = chunk_positions(n, vocab_size, limit)
    for begin in range(0, t, step):
        end = min(t, begin + step)
        logits = head(hidden[:, begin:end]).float()  # [N, c, V]
        nll[:, begin:end] = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            targets[:, begin:end].reshape(-1),
            reduction="none",
        ).view(n, end - begin)
    return nll
