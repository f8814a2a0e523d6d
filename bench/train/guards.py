"""The guards and checks of a training run (:mod:`bench.train.trainer`) apart from its loop: the
divergence errors and their advice, the validation loss and ``train.until_retrieves``'s check.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from bench.core.runtime import autocast
from bench.data.corpora import Corpus
from bench.eval.metrics.passkey import corpus_filler_source, passkey_verdicts
from bench.tasks.passkey import PasskeyExample, passkey_grid
from bench.train.batches import validation_batches
from bench.train.config import TrainConfig
from bench.train.extend import finetune_recipe
from bench.train.optim import lr_at

if TYPE_CHECKING:  # the job schema sits above the stages (bench.schema)
    from bench.schema import JobConfig

__all__ = [
    "CHECK_DEPTHS",
    "CHECK_PURPOSE",
    "CHECK_TRIALS",
    "MIN_STEPS_FOR_PROGRESS",
    "NO_BETTER_MARGIN",
    "TrainingDiverged",
    "Validator",
    "check_batch_split",
    "check_finetune_init",
    "check_progress",
    "divergence_advice",
    "divergence_error",
    "final_train_loss",
    "resumed_divergence",
    "retrieval_check_due",
    "retrieval_check_examples",
    "retrieval_end",
    "retrieval_verdicts",
]

logger = logging.getLogger("lenbench")


def check_finetune_init(job: JobConfig, init: Any) -> None:
    """A fine-tune (``job.extend`` active) needs its parent model as ``init``."""
    if job.extend.active and init is None:
        raise ValueError(
            f"extend.method {job.extend.method!r} fine-tunes a trained model; pass its parent "
            "model as init= (bench.train.cache.get_or_train does)."
        )


def check_batch_split(spec: TrainConfig, world: int, extended: bool) -> None:
    """Every one of the ``world`` processes takes an equal share of the global batch."""
    if spec.batch_size % world:
        what = "extend" if extended else "train"
        raise ValueError(
            f"{what}.batch_size {spec.batch_size} is not divisible by the {world} "
            f"processes; use a multiple of {world}."
        )


class TrainingDiverged(ValueError):
    """The training loss became NaN or infinite, or a long run ended no better than a uniform
    guess (:func:`check_progress`); ``step`` (1-based update) and ``loss`` say where."""

    def __init__(self, message: str, step: int, loss: float):
        super().__init__(message)
        self.step, self.loss = step, loss


#: A run of at least this many updates whose final loss is within NO_BETTER_MARGIN nats of a
#: uniform guess (ln vocab) learned nothing (or diverged to a uniform output): a failed job.
MIN_STEPS_FOR_PROGRESS = 100
NO_BETTER_MARGIN = 0.05


def check_progress(final_loss: float, steps: int, vocab_size: int) -> None:
    """Raise TrainingDiverged when a run of >= MIN_STEPS_FOR_PROGRESS updates ends no better than
    predicting every token uniformly (loss >= ln(vocab) - NO_BETTER_MARGIN): its model would
    report the same perplexity (about the vocabulary size) for every length and method."""
    uniform = math.log(vocab_size)
    if steps >= MIN_STEPS_FOR_PROGRESS and final_loss >= uniform - NO_BETTER_MARGIN:
        raise TrainingDiverged(
            f"training ended no better than a uniform guess: the final loss {final_loss:.3f} is "
            f"within {NO_BETTER_MARGIN} of ln({vocab_size}) = {uniform:.3f} after {steps} updates "
            "(diverged or learned nothing); lower train.lr, raise train.warmup_steps or check "
            "the data.",
            step=steps,
            loss=final_loss,
        )


def final_train_loss(
    losses: torch.Tensor, spec: TrainConfig, accelerator: Any, vocab_size: int
) -> float:
    """The mean loss of the run's last log window, all processes together; raises
    TrainingDiverged when a long run learned nothing (:func:`check_progress`)."""
    steps = spec.steps
    # [last log window]; losses may be longer than the run (until_retrieves ended it early)
    tail = losses[steps - max(1, min(spec.log_every, steps)) : steps]
    if accelerator.num_processes > 1:
        tail = accelerator.gather(tail[None])  # [world, window]
    final_loss = float(tail.mean().cpu())
    check_progress(final_loss, steps, vocab_size)
    return final_loss


def resumed_divergence(exc: TrainingDiverged, start: int) -> TrainingDiverged:
    """``exc`` of a run that had resumed from the saved state of update ``start``, with the note
    that the state is dropped (the caller drops it), so a rerun trains from scratch."""
    return TrainingDiverged(
        f"{str(exc).rstrip('.')}; this run had resumed from the saved state of update "
        f"{start}, which is now dropped, so a rerun trains from scratch.",
        step=exc.step,
        loss=exc.loss,
    )


def divergence_advice(job: JobConfig, step: int, lr: float) -> str:
    """What to change after a non-finite loss at update ``step`` (1-based) whose lr was ``lr``:
    the rest of the sentence after "the loss is nan". At update 1 the loss is the initial
    model's, before any update, so the learning rate cannot be the cause; the precision is
    named only where it is not fp32 already."""
    section = "extend" if job.extend.active else "train"
    spec = finetune_recipe(job) if job.extend.active else job.train
    position = job.position
    changed = position.params()
    # the position's parameters that differ from their defaults (xpos_scale_base=0.001), else all
    defaults = type(position)(kind=position.kind).params()
    named = {k: v for k, v in changed.items() if v != defaults.get(k)} or changed
    params = ", ".join(f"position.{k}={v!r}" for k, v in named.items())
    check = f"the parameters of position={position.kind}" + (f" ({params})" if params else "")
    bf16 = spec.precision != "fp32"
    if step == 1:
        advice = (
            f"before any update, so the initial model's forward pass overflows, not the lr: check "
            f"{check}" + (f" or use train.precision=fp32 (now {spec.precision})" if bf16 else "")
        )
    else:
        advice = (
            f"(lr {lr:.3g}, precision {spec.precision}); lower {section}.lr, raise "
            f"{section}.warmup_steps, set train.grad_clip, "
            + ("use train.precision=fp32, " if bf16 else "")
            + f"or check {check}"
        )
    return advice + "."


def divergence_error(
    values: torch.Tensor, offset: int, job: JobConfig, spec: TrainConfig
) -> TrainingDiverged | None:
    """The error for the first NaN/inf of ``values`` (the losses of updates ``offset + 1`` on,
    1-based) in a run of recipe ``spec``; None when every loss is finite."""
    finite = torch.isfinite(values)
    if bool(finite.all()):
        return None
    first = int((~finite).nonzero()[0, 0])
    step, loss = offset + first + 1, float(values[first])
    return TrainingDiverged(
        f"training diverged at step {step} of {spec.steps}: the loss is {loss} "
        f"{divergence_advice(job, step, lr_at(step - 1, spec))}",
        step=step,
        loss=loss,
    )


#: The retrieval check of ``train.until_retrieves``: this many depths from 0 to 1 times this many
#: examples each (the retrieval arm's evaluation grid: 80 examples), drawn for this purpose only,
#: so that no check example is an evaluation example.
CHECK_DEPTHS = 5
CHECK_TRIALS = 16
CHECK_PURPOSE = "train-check"


def retrieval_check_examples(spec: TrainConfig, seed: int, corpus: Corpus) -> list[PasskeyExample]:
    """The passkey examples at ``spec.length`` that ``train.until_retrieves`` scores: the
    training's template and filler (a corpus filler from the validation split)."""
    source = None
    if spec.passkey_filler == "corpus":
        source = corpus_filler_source(corpus.split("validation"), spec.length)
    depths = [i / (CHECK_DEPTHS - 1) for i in range(CHECK_DEPTHS)]
    return passkey_grid(
        [spec.length],
        depths,
        CHECK_TRIALS,
        seed,
        filler=spec.passkey_filler,
        filler_source=source,
        template=spec.passkey_template,
        purpose=CHECK_PURPOSE,
    )


def retrieval_check_due(spec: TrainConfig, done: int) -> bool:
    """Whether ``train.until_retrieves`` checks after update ``done``: every
    ``retrieval_check_every`` updates of the constant lr."""
    if done % spec.retrieval_check_every:
        return False
    # not while warming up, already decaying, or once the end was brought forward
    return spec.warmup_steps < done and done + spec.decay_steps < spec.steps


def retrieval_verdicts(
    model: torch.nn.Module, examples: list[PasskeyExample], spec: TrainConfig, device: Any
) -> list[bool]:
    """The check's passkey verdicts of ``model`` (unwrapped) on ``examples``, in eval mode."""
    model.eval()
    verdicts = passkey_verdicts(model, examples, batch_size=spec.batch_size, device=device)
    model.train()
    return verdicts


def retrieval_end(verdicts: list[bool], spec: TrainConfig, done: int) -> tuple[float, int | None]:
    """The accuracy of the check after update ``done``, and the run's new end: ``decay_steps``
    updates later the first time its Wilson interval's lower end reaches the threshold, the lr
    decaying over them; None to go on."""
    from bench.core.stats import wilson  # F5's interval; pandas only when a check runs

    hits, n = sum(verdicts), len(verdicts)
    low, _ = wilson(hits, n)
    decay = spec.decay_steps
    if low >= spec.until_retrieves:  # decidedly: the interval's lower end, as F5 reads it
        logger.info(
            "lenbench: passkey at L %d/%d (Wilson lower end %.3f >= train.until_retrieves "
            "%g) after %d updates: decaying the lr over %d updates, ending at %d.",
            hits,
            n,
            low,
            spec.until_retrieves,
            done,
            decay,
            done + decay,
        )
        return hits / n, done + decay
    # each check that does not pass is logged too, so a long run shows how far it has come
    logger.info(
        "lenbench: passkey at L %d/%d (Wilson lower end %.3f < train.until_retrieves %g) after "
        "%d updates: training on (at most %d).",
        hits,
        n,
        low,
        spec.until_retrieves,
        done,
        spec.steps,
    )
    return hits / n, None


# --------------------------------------------------------------------------- validation


class Validator:
    """Fixed validation windows, this rank's share of them, and the reduced mean loss."""

    def __init__(self, corpus: Corpus, spec: TrainConfig, rank: int, world: int, stacklevel: int):
        # stacklevel: the frames up to train_model's caller, which the warning names
        self.batches: list[torch.Tensor] = []
        self.enabled = False  # identical on every rank, so all ranks validate together
        if spec.eval_batches == 0:
            return
        docs = corpus.split("validation")
        if sum(len(d) for d in docs) < spec.length + 1:
            warnings.warn(
                f"the validation split of corpus {corpus.name} ({corpus.fingerprint}) holds fewer "
                f"than train.length + 1 = {spec.length + 1} tokens; training without validation "
                "loss (raise the validation fraction or use a larger corpus).",
                stacklevel=stacklevel,
            )
            return
        windows = validation_batches(docs, spec.length, spec.eval_batches, spec.batch_size)
        self.batches = windows[rank::world]  # a rank may get none; it still joins the reduce
        self.enabled = True

    @torch.no_grad()
    def __call__(self, model: torch.nn.Module, accelerator: Any, precision: str) -> float:
        device = accelerator.device
        totals = torch.zeros(2, dtype=torch.float64, device=device)  # [sum of losses, tokens]
        model.eval()
        for window in self.batches:
            window = window.to(device)
            with autocast(device, precision):
                logits = model(window[:, :-1]).logits
            losses = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(),
                window[:, 1:].reshape(-1),
                reduction="sum",
            )
            totals += torch.stack((losses.double(), totals.new_tensor(window[:, 1:].numel())))
        model.train()
        if accelerator.num_processes > 1:
            totals = accelerator.reduce(totals, reduction="sum")
        return float(totals[0] / totals[1].clamp(min=1))
