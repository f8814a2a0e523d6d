"""Training of one :class:`~models.transformer.DecoderLM` on a corpus's training split.

:func:`train_model` runs the recipe of a typed ``train`` section (``bench.schema.TrainConfig``):
linear warmup then cosine decay, AdamW, bf16 autocast or fp32, optional passkey rows, periodic
validation, NaN/inf detection. It is deterministic for a seed on one machine and gives the same
global batches under DDP (through ``accelerate``) as in one process. The checkpoint cache
(``bench.train.cache.get_or_train``) calls it only when no checkpoint with the same weights key exists.
The run itself is a :class:`Trainer` (setup, then one small method per part of the loop); it
returns :class:`~bench.train.stats.TrainStats`. Its pieces: the schedule, parameter groups and loss
in :mod:`bench.train.optim`, the divergence checks, validation and retrieval check in
:mod:`bench.train.guards`, the accelerator and precision set-up in :mod:`bench.core.runtime`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from bench.core.progress import progress_bar
from bench.core.runtime import autocast, make_accelerator, warn_if_emulated_bf16
from bench.data.corpora import Corpus
from bench.train.batches import TrainingStream
from bench.train.extend import finetune_recipe, finetune_scaling
from bench.train.guards import (
    TrainingDiverged,
    Validator,
    check_batch_split,
    check_finetune_init,
    divergence_error,
    final_train_loss,
    resumed_divergence,
    retrieval_check_due,
    retrieval_check_examples,
    retrieval_end,
    retrieval_verdicts,
)
from bench.train.optim import ADAM_EPS, lm_loss, lr_at, param_groups
from bench.train.resume import SaveClock, rng_state, set_rng_state
from bench.train.stats import TrainStats, zero_step_stats
from models.transformer import DecoderLM

if TYPE_CHECKING:  # the job schema sits above the stages (bench.schema)
    from bench.schema import JobConfig

__all__ = [
    "Trainer",
    "make_model",
    "train_model",
]

logger = logging.getLogger("lenbench")


def make_model(job: JobConfig) -> DecoderLM:
    """An untrained DecoderLM for the job's model, position and train.length; seeds nothing."""
    return DecoderLM(job.model, job.position, job.train.length)


# --------------------------------------------------------------------------- training


def compiled(model: torch.nn.Module) -> torch.nn.Module:
    """``torch.compile(model)`` with static shapes (every training batch has one shape); the
    first steps pay the compilation, later runs reuse inductor's on-disk cache."""
    return torch.compile(model, dynamic=False)


def _initial_model(job: JobConfig, init: DecoderLM | None) -> DecoderLM:
    """The seeded initial model; a fine-tune's holds the parent's weights and its scaling."""
    torch.manual_seed(job.seed)
    model = make_model(job)
    if job.extend.active:
        model.load_state_dict(init.state_dict())
        model.set_scaling(finetune_scaling(job))
    return model


Snapshot = Callable[[int, DecoderLM, dict[str, Any]], None]


class Trainer:
    """One run of :func:`train_model`, as a small recipe: ``setup()`` builds the model, data,
    optimizer and any resumed state; ``train()`` runs the updates and returns (model, stats).

    The setup order is part of the result: the seed is set just before the model is built and a
    resumed run restores the RNG states last, so a run draws the same numbers as before.
    """

    def __init__(
        self,
        job: JobConfig,
        corpus: Corpus,
        *,
        progress: bool,
        accelerator: Any,
        init: DecoderLM | None,
        resume: Any,
        snapshot: Snapshot | None,
        started: float,
    ):
        self.job, self.corpus, self.init = job, corpus, init
        self.progress, self.resume, self.snapshot_fn = progress, resume, snapshot
        self.started = started  # time.perf_counter() when train_model was called
        self.extended = job.extend.active
        self.spec = finetune_recipe(job) if self.extended else job.train
        self.accelerator = make_accelerator(accelerator, self.spec.precision)
        warn_if_emulated_bf16(self.accelerator.device, self.spec.precision, stacklevel=4)
        self.world, self.rank = self.accelerator.num_processes, self.accelerator.process_index
        check_batch_split(self.spec, self.world, self.extended)

    # ----------------------------------------------------------------------- setup

    def setup(self) -> None:
        """Model, data, optimizer, resumed state (if any), accelerator wrapping, progress bar."""
        self._setup_model()
        self._setup_data()
        self._setup_optimizer()
        state = self._load_state()
        self._prepare()
        self._restore_progress(state)
        self._setup_bar()

    def _setup_model(self) -> None:
        self.model = _initial_model(self.job, self.init)
        self.n_params = self.model.num_parameters()

    def _setup_data(self) -> None:
        spec = self.spec
        self.stream = TrainingStream(
            self.corpus.split("train"),
            spec.length,
            spec.batch_size,
            self.job.seed,
            passkey_fraction=spec.passkey_fraction,
            passkey_filler=spec.passkey_filler,
            passkey_loss=spec.passkey_loss,
            passkey_template=spec.passkey_template,
            passkey_length=spec.passkey_length,
            ruler_tasks=spec.ruler_tasks,
            ruler_params=spec.ruler_params,
            ruler_stages=[(stage["steps"], stage["tasks"]) for stage in spec.ruler_stages],
            position_sampling=spec.position_sampling,
            max_position=spec.sampled_positions,
        )
        self.validator = Validator(self.corpus, spec, self.rank, self.world, stacklevel=5)
        self.check_examples = None
        if spec.until_retrieves is not None:
            self.check_examples = retrieval_check_examples(spec, self.job.seed, self.corpus)

    def _setup_optimizer(self) -> None:
        spec = self.spec
        self.optimizer = torch.optim.AdamW(
            param_groups(self.model, spec.weight_decay, spec.weight_decay_scope),
            lr=lr_at(0, spec),
            betas=tuple(spec.betas),
            eps=ADAM_EPS,
        )

    def _load_state(self) -> dict[str, Any] | None:
        """A saved state of an interrupted run of this recipe, its weights and optimizer state
        loaded; None to start from scratch."""
        steps = self.spec.steps
        state = self.resume.load() if self.resume is not None else None
        if state is not None and not 0 < int(state["step"]) < steps:
            return None  # cannot come from this recipe's run
        if state is not None:
            logger.info(
                "lenbench: resuming %s from update %d of %d (a saved state of an interrupted run).",
                "the fine-tune" if self.extended else "the training",
                int(state["step"]),
                steps,
            )
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        return state

    def _prepare(self) -> None:
        # self.model is the accelerator's (DDP-wrapped under several processes) from here on
        self.model, self.optimizer = self.accelerator.prepare(self.model, self.optimizer)
        self.model.train()
        self.device = self.accelerator.device
        # the compiled module shares the weights; self.model stays the one saved and returned
        self.forward = compiled(self.model) if self.spec.compile else self.model

    def _restore_progress(self, state: dict[str, Any] | None) -> None:
        """Losses, counters and RNG states: a resumed run's from ``state``, else from zero."""
        self.losses = torch.zeros(self.spec.steps, dtype=torch.float32, device=self.device)
        self.train_losses: dict[int, float] = {}
        self.val_losses: dict[int, float] = {}
        self.start, self.train_time, self.tokens_done = 0, 0.0, 0
        if state is not None:
            self.start = int(state["step"])
            self.losses[: self.start] = state["losses"].to(self.device)
            self.train_losses = {int(k): float(v) for k, v in state["train_losses"].items()}
            self.val_losses = {int(k): float(v) for k, v in state["val_losses"].items()}
            self.train_time, self.tokens_done = float(state["train_time_s"]), int(state["tokens"])
            set_rng_state(state["rng"])
        self.checked = self.start  # losses[:checked] are known to be finite
        self.retrieval_checks: dict[int, float] = {}
        if state is not None and "end" in state:  # train.until_retrieves ended the run early
            self.retrieval_checks = {int(k): float(v) for k, v in state["retrieval_checks"].items()}
            self._end_at(int(state["end"]))
        self.clock = SaveClock(self.spec.save_every, self.spec.save_every_minutes, self.accelerator)

    def _setup_bar(self) -> None:
        length = self.spec.length
        if self.extended:
            what = f"finetune {self.job.extend.name} L={length}"
        else:
            what = f"train {self.job.position.kind} L={length}"
        self.bar = progress_bar(
            total=self.spec.steps,
            initial=self.start,
            desc=what,
            unit="step",
            disable=not self.progress or not self.accelerator.is_main_process,
            dynamic_ncols=True,
            leave=False,
        )

    # ----------------------------------------------------------------------- training

    def train(self) -> tuple[DecoderLM, TrainStats]:
        """Run the updates start..steps-1, with logging, validation, snapshots, the retrieval
        check and saves after each as due; return (model in eval mode, stats). The retrieval
        check (``train.until_retrieves``) may bring the end (``self.spec.steps``) forward."""
        self.tick = time.perf_counter()  # start of the current timed stretch of updates
        step = self.start
        while step < self.spec.steps:
            lr = self.train_step(step)
            done = step = step + 1
            self._log_and_validate(done, lr)
            self._snapshot(done)
            self._check_retrieval(done)
            self._save_if_due(done)
            self.bar.update(1)
        self.train_time += time.perf_counter() - self.tick
        self.bar.close()
        return self._finish()

    def train_step(self, step: int) -> float:
        """One AdamW update on global batch ``step`` (this process's rows of it); returns its lr."""
        spec, device = self.spec, self.device
        batch = self.stream.batch(step)
        tokens, mask = batch.tokens, batch.loss_mask  # [B, L + 1] and [B, L]
        positions = batch.position_ids  # [B, L] or None (contiguous)
        if self.world > 1:
            tokens, mask = tokens[self.rank :: self.world], mask[self.rank :: self.world]
            if positions is not None:
                positions = positions[self.rank :: self.world]
        kwargs = {} if positions is None else {"position_ids": positions.to(device)}
        tokens = tokens.to(device, non_blocking=True)
        mask = None if bool(mask.all()) else mask.to(device, non_blocking=True)
        lr = lr_at(step, spec)  # set by hand: a scheduler would step once per process
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with autocast(device, spec.precision):
            logits = self.forward(tokens[:, :-1], **kwargs).logits  # [B, L, vocab]
        loss = lm_loss(logits, tokens[:, 1:], mask)
        self.accelerator.backward(loss)
        if spec.grad_clip > 0:
            self.accelerator.clip_grad_norm_(self.model.parameters(), spec.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.losses[step] = loss.detach()
        self.tokens_done += spec.batch_size * spec.length
        return lr

    def check(self, upto: int) -> float:
        """Sync losses[checked:upto]; raise on NaN/inf; return the window mean (all ranks agree)."""
        window = self.losses[self.checked : upto]  # [n]
        if self.world > 1:
            window = self.accelerator.gather(window[None]).mean(dim=0)  # [world, n] -> [n]
        values = window.cpu()
        error = divergence_error(values, self.checked, self.job, self.spec)
        if error is not None:
            self.bar.close()
            raise error
        mean = float(values.mean())
        self.checked = upto
        return mean

    @contextmanager
    def _untimed(self) -> Iterator[None]:
        """Leave what runs inside (validation, saving) out of train_time_s."""
        self.train_time += time.perf_counter() - self.tick
        yield
        self.tick = time.perf_counter()

    def _log_and_validate(self, done: int, lr: float) -> None:
        """Record the mean loss of the log window ending at update ``done``, and validate, when
        due (the last update always logs, and validates when validation is enabled)."""
        spec = self.spec
        last = done == spec.steps
        validate = self.validator.enabled and (
            last or (spec.eval_every > 0 and done % spec.eval_every == 0)
        )
        if done % spec.log_every == 0 or last or validate:
            mean = self.check(done)
            self.train_losses[done] = mean
            elapsed = self.train_time + time.perf_counter() - self.tick
            self.bar.set_postfix(
                loss=f"{mean:.3f}", tok_s=f"{self.tokens_done / elapsed:,.0f}", lr=f"{lr:.2g}"
            )
        if validate:
            self.validate(done)

    def validate(self, done: int) -> None:
        """The validation loss after update ``done`` (every rank calls this)."""
        with self._untimed():
            # the unwrapped module: no DDP hooks, so ranks with different shard sizes cannot hang
            self.val_losses[done] = self.validator(
                self.accelerator.unwrap_model(self.model), self.accelerator, self.spec.precision
            )
            self.bar.set_postfix(
                loss=f"{self.train_losses[done]:.3f}",
                val=f"{self.val_losses[done]:.3f}",
                tok_s=f"{self.tokens_done / self.train_time:,.0f}",
            )

    # ----------------------------------------------------------------------- retrieval check

    def _check_retrieval(self, done: int) -> None:
        """``train.until_retrieves``: after every ``retrieval_check_every`` updates of the constant
        lr, passkey accuracy at L on the check examples; the first time its Wilson interval's
        lower end reaches the threshold the run ends ``decay_steps`` updates later, the lr
        decaying over them. Every rank scores
        the same weights, so all agree."""
        if self.check_examples is None or not retrieval_check_due(self.spec, done):
            return
        with self._untimed():
            model = self.accelerator.unwrap_model(self.model)
            verdicts = retrieval_verdicts(model, self.check_examples, self.spec, self.device)
        self.retrieval_checks[done], end = retrieval_end(verdicts, self.spec, done)
        if end is not None:
            self._end_at(end)

    def _end_at(self, end: int) -> None:
        """Make update ``end`` the run's last: the schedule decays over the updates before it."""
        self.spec = replace(self.spec, steps=end)
        if hasattr(self, "bar"):
            self.bar.total = end

    # ----------------------------------------------------------------------- snapshot / save

    def _snapshot(self, done: int) -> None:
        """Hand the weights after update ``done`` to ``snapshot`` when ``done`` is a point of the
        fine-tune's ``extend.curve`` (rank 0; every rank checks the losses)."""
        if self.snapshot_fn is None or not self.extended or done not in self.job.extend.curve:
            return
        self.check(done)  # never store a diverged state
        if self.accelerator.is_main_process:
            unwrapped = self.accelerator.unwrap_model(self.model)
            self.snapshot_fn(done, unwrapped, self._snapshot_stats(done))

    def _snapshot_stats(self, done: int) -> dict[str, Any]:
        """The stored stats of the ``done``-update fine-tune cut from this longer run."""
        return {
            "steps": done,
            "tokens": self.tokens_done,
            "final_train_loss": float(
                self.losses[max(0, done - self.spec.log_every) : done].mean()
            ),
            "train_losses": dict(self.train_losses),
            "snapshot_of_steps": self.spec.steps,
            "n_params": self.n_params,
            "precision": self.spec.precision,
            "device": str(self.device),
            "num_processes": self.world,
        }

    def _save_if_due(self, done: int) -> None:
        # the last update saves nothing: the finished checkpoint replaces the resumable state
        if self.resume is None or done == self.spec.steps or not self.clock.due(done):
            return
        self.check(done)  # never save a diverged state
        with self._untimed():
            self.save(done)

    def save(self, done: int) -> None:
        """Write the resumable state after update ``done`` (rank 0; every rank calls this)."""
        if self.accelerator.is_main_process:
            unwrapped = self.accelerator.unwrap_model(self.model)
            self.resume.save(
                {
                    "step": done,
                    "model": {k: v.detach().cpu() for k, v in unwrapped.state_dict().items()},
                    "optimizer": self.optimizer.state_dict(),
                    "rng": rng_state(),
                    "losses": self.losses[:done].cpu(),
                    "train_losses": self.train_losses,
                    "val_losses": self.val_losses,
                    "train_time_s": self.train_time,
                    "tokens": self.tokens_done,
                    **self._check_state(),
                }
            )
        self.clock.saved()

    def _check_state(self) -> dict[str, Any]:
        """What a saved state needs of the retrieval check: its accuracies and the run's end."""
        if self.check_examples is None:
            return {}
        return {"retrieval_checks": dict(self.retrieval_checks), "end": self.spec.steps}

    def _finish(self) -> tuple[DecoderLM, TrainStats]:
        """The unwrapped model in eval mode and the run's stats; raises TrainingDiverged when a
        long run learned nothing (:func:`~bench.train.guards.check_progress`)."""
        spec, steps = self.spec, self.spec.steps
        model = self.accelerator.unwrap_model(self.model)
        model.eval()
        self.optimizer.zero_grad(set_to_none=True)
        vocab_size = model.model_cfg.vocab_size
        final_loss = final_train_loss(self.losses, spec, self.accelerator, vocab_size)
        return model, TrainStats(
            steps=steps,
            tokens=self.tokens_done,
            tokens_per_s=self.tokens_done / max(self.train_time, 1e-9),
            train_time_s=self.train_time,
            wall_time_s=time.perf_counter() - self.started,
            final_train_loss=final_loss,
            train_losses=self.train_losses,
            val_losses=self.val_losses,
            final_val_loss=self.val_losses.get(steps),
            n_params=self.n_params,
            precision=spec.precision,
            device=str(self.device),
            num_processes=self.world,
            resumed_from=self.start,
            retrieval_checks=(None if self.check_examples is None else dict(self.retrieval_checks)),
        )


def train_model(
    job: JobConfig,
    corpus: Corpus,
    *,
    progress: bool = True,
    accelerator: Any = None,
    init: DecoderLM | None = None,
    resume: Any = None,
    snapshot: Snapshot | None = None,
) -> tuple[DecoderLM, TrainStats]:
    """Train a DecoderLM for ``job`` (its model, position, train recipe and seed) on ``corpus``'s
    training split. Under DDP every process builds the same global batch and takes rows
    ``rank::world``, so ``train.batch_size`` must be divisible by the number of processes.

    A fine-tune (``job.extend`` active, :mod:`bench.train.extend`) starts from ``init``'s weights (the
    parent model) and runs ``finetune_recipe(job)`` at the extend length with the fine-tune's
    scaling set on the model, which keeps it. ``resume`` (None, or ``bench.train.resume.ResumeFile``:
    ``load() -> state | None`` and ``save(state)``) makes the run resumable: it starts from a
    loaded state and saves one every ``train.save_every`` updates and/or
    ``train.save_every_minutes`` (rank 0 writes). A state holds the weights, optimizer and RNG
    states and the update count, which is also the data position (batches are a pure function of
    (seed, update)), so a resumed run ends with the same weights as an uninterrupted one on the
    same machine and thread count. ``snapshot(k, model, stats)`` is called (rank 0) after each
    update count k of a fine-tune's ``extend.curve`` with the weights at that point and their
    stats as stored (a recovery curve: ``bench.train.cache`` stores them as the k-update fine-tune's
    checkpoint).

    Returns (model in eval mode on the accelerator's device, :class:`TrainStats`).
    Raises TrainingDiverged (a ValueError) if the loss becomes NaN or infinite or a long run ends
    no better than a uniform guess; when that run had resumed from a saved state, the state is
    deleted first (``resume.clear()``) and the message says so, so a rerun starts from scratch.
    """
    started = time.perf_counter()
    check_finetune_init(job, init)
    if job.extend.active and job.extend.steps == 0:
        model = _initial_model(job, init)
        return model.eval(), zero_step_stats(model, job, started)
    trainer = Trainer(
        job,
        corpus,
        progress=progress,
        accelerator=accelerator,
        init=init,
        resume=resume,
        snapshot=snapshot,
        started=started,
    )
    trainer.setup()
    try:
        return trainer.train()
    except TrainingDiverged as exc:
        if resume is None or not trainer.start:
            raise
        # the saved state may be what failed (a resumed run fails again the same way every
        # rerun): drop it, so that the next run starts from scratch
        if trainer.accelerator.is_main_process:
            resume.clear()
        raise resumed_divergence(exc, trainer.start) from exc
