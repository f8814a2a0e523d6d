"""The optimization pieces of a training run (:mod:`bench.train.trainer`): the learning-rate schedule,
AdamW's parameter groups and the masked next-token loss. Pure functions of their arguments.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from bench.train.config import WEIGHT_DECAY_SCOPES, TrainConfig

__all__ = ["ADAM_EPS", "lm_loss", "lr_at", "param_groups"]

ADAM_EPS = 1e-8


def lr_at(step: int, spec: TrainConfig) -> float:
    """Learning rate of update ``step`` (0-based): linear warmup, constant, then cosine to
    ``final_lr`` over the last ``decay_steps`` updates (all updates after warmup when None).

    Warmup reaches ``lr`` at update ``warmup_steps - 1``; the decay starts at ``lr`` and reaches
    ``min_lr`` exactly on the last update.
    """
    lr, min_lr, warmup, steps = spec.lr, spec.final_lr, spec.warmup_steps, spec.steps
    if step < warmup:
        return lr * (step + 1) / warmup
    span = steps - warmup - 1 if spec.decay_steps is None else spec.decay_steps
    start = steps - 1 - span  # the last update at the full lr
    if span <= 0 or step <= start:
        return lr
    progress = min(1.0, (step - start) / span)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def param_groups(
    model: torch.nn.Module, weight_decay: float, scope: str = "matrices"
) -> list[dict[str, Any]]:
    """AdamW groups ``[decayed, not decayed]`` for ``weight_decay_scope``.

    ``matrices`` (as in nanoGPT) decays only the linear projections' weight matrices: decay would
    pull rarely seen byte and position rows towards zero and norm gains towards 0 instead of 1.
    ``all`` decays every parameter. Tied parameters appear once (``named_parameters``
    deduplicates), so a tied output head is an embedding and, with ``matrices``, is not decayed.
    """
    if scope not in WEIGHT_DECAY_SCOPES:
        raise ValueError(
            f"weight decay scope {scope!r} is unknown; allowed values are {', '.join(WEIGHT_DECAY_SCOPES)}."
        )
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        is_matrix = param.dim() >= 2 and id(param) not in embeddings and "pos_table" not in name
        (decay if scope == "all" or is_matrix else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean next-token cross entropy (float32) over the tokens where ``mask`` is True (None = all)."""
    flat = logits.reshape(-1, logits.shape[-1]).float()
    if mask is None:
        return F.cross_entropy(flat, targets.reshape(-1))
    per_token = F.cross_entropy(flat, targets.reshape(-1), reduction="none")
    weights = mask.reshape(-1).to(per_token.dtype)
    return (per_token * weights).sum() / weights.sum().clamp(min=1.0)
