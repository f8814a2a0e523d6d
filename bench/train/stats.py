"""What a training run did (:mod:`bench.train.trainer`): :class:`TrainStats`, the form a checkpoint
stores, and the stats of a zero-update fine-tune.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the job schema sits above the stages (bench.schema)
    from bench.schema import JobConfig
    from models.transformer import DecoderLM

__all__ = ["TrainStats", "zero_step_stats"]


@dataclass
class TrainStats:
    """What one :func:`~bench.train.trainer.train_model` run did. :meth:`as_dict` is the stored
    form (a checkpoint's ``train_stats``, read back by ``bench.train.checkpoints.load_model``):
    keys in field order."""

    steps: int  # updates of the recipe (0: a zero-update fine-tune)
    tokens: int  # tokens trained on, all processes together
    tokens_per_s: float  # tokens / train_time_s
    train_time_s: float  # the updates only: validation and saving excluded
    wall_time_s: float  # the whole call of train_model
    final_train_loss: float | None  # mean loss of the last log window; None without updates
    train_losses: dict[int, float]  # {update: mean loss of the log window ending there}
    val_losses: dict[int, float]  # {update: validation loss}
    final_val_loss: float | None  # validation loss after the last update; None without one
    n_params: int
    precision: str
    device: str
    num_processes: int
    # the update a resumed run started at (0: from scratch); None when no loop ran (zero updates)
    resumed_from: int | None = None
    # train.until_retrieves: {update: passkey accuracy at L of the check after it}; None = off
    retrieval_checks: dict[int, float] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The dict stored in checkpoints; a zero-update fine-tune's has no ``resumed_from``, a
        run without the retrieval check no ``retrieval_checks``."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("resumed_from", "retrieval_checks"):
            if out[name] is None:
                del out[name]
        return out


def zero_step_stats(model: DecoderLM, job: JobConfig, started: float) -> TrainStats:
    """Stats of a fine-tune with ``extend.steps == 0``: the parent's weights, the scaling set."""
    return TrainStats(
        steps=0,
        tokens=0,
        tokens_per_s=0.0,
        train_time_s=0.0,
        wall_time_s=time.perf_counter() - started,
        final_train_loss=None,
        train_losses={},
        val_losses={},
        final_val_loss=None,
        n_params=model.num_parameters(),
        precision=job.train.precision,
        device="cpu",
        num_processes=1,
    )
