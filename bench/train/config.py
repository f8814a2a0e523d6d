"""The config of training: the ``train`` group (one training run) and the ``extend`` group (a
fine-tune at a longer length with a scaling method active), as typed, checked dataclasses. The
recipe that runs them is :mod:`bench.train.trainer`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from bench.core.checks import (
    IF_SET,
    NOT_IN_KEY,
    WEIGHTS,
    boolean,
    choice,
    integer,
    number,
    parse_length,
)
from bench.core.runtime import PRECISIONS
from bench.tasks.passkey import PASSKEY_FILLERS, PASSKEY_TEMPLATES, min_passkey_length
from bench.tasks.ruler import RULER_END, RULER_TASKS, min_ruler_length, params_from
from models.scaling import SCALING_METHODS

__all__ = [
    "EXTEND_NONE",
    "PASSKEY_LENGTHS",
    "PASSKEY_LOSSES",
    "POSITION_SAMPLINGS",
    "WEIGHT_DECAY_SCOPES",
    "ExtendConfig",
    "TrainConfig",
]

WEIGHT_DECAY_SCOPES = ("matrices", "all")
PASSKEY_LOSSES = ("all", "answer")
#: full: every passkey example is a whole row; uniform: its length is uniform between the
#: template's minimum and the row, and the rest of the row is training text
PASSKEY_LENGTHS = ("full", "uniform")
#: position ids of a training window (bench.train.batches): contiguous 0..L-1; randomized (Ruoss et al.
#: 2023) L sorted distinct positions from [0, max_position); pose (Zhu et al. 2024) two chunks,
#: each shifted by a random skip, within [0, max_position). Evaluation is always contiguous.
POSITION_SAMPLINGS = ("contiguous", "randomized", "pose")
#: train.max_position when null: this many times train.length (the LM arm's longest eval length)
DEFAULT_MAX_POSITION_MULTIPLE = 8


def _decay_steps(section: str, value: Any, steps: int, warmup: int) -> int | None:
    """``<section>.decay_steps``: null, or 1 .. steps - warmup_steps - 1."""
    if value is None:
        return None
    longest = max(1, steps - warmup - 1)
    value = integer(f"{section}.decay_steps", value, 1)
    if value > longest:
        raise ValueError(
            f"{section}.decay_steps must be at most steps - warmup_steps - 1 = {longest} "
            f"(or null), got {value}."
        )
    return value


@dataclass
class TrainConfig:
    """The ``train`` group: one training run's recipe (``bench.train.trainer.train_model``)."""

    length: int = 256  # training sequence length (the model's train_length)
    steps: int = 300  # optimizer updates
    batch_size: int = 16  # sequences per update (global: split across processes)
    lr: float = 3.0e-3  # peak learning rate (linear warmup, then cosine decay to min_lr)
    # the learning rate at the last update; None = lr * min_lr_ratio (the key holds the value)
    min_lr: float | None = field(default=None, metadata={WEIGHTS: lambda train: train.final_lr})
    min_lr_ratio: float = field(default=0.1, metadata={WEIGHTS: False})  # folded into min_lr
    warmup_steps: int = 30
    # updates over which the lr decays to min_lr at the end; None = all after warmup (cosine
    # schedule), N = constant lr, then the last N updates (warmup-stable-decay)
    decay_steps: int | None = None
    weight_decay: float = 0.1  # AdamW decoupled decay ...
    weight_decay_scope: str = "matrices"  # ... on the projection matrices only, or on all
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    grad_clip: float = 1.0  # global gradient-norm clip; 0 disables
    precision: str = "fp32"  # fp32 | bf16 (autocast)
    passkey_fraction: float = 0.0  # fraction of training rows that are passkey examples
    passkey_filler: str = "standard"
    passkey_template: str = (
        "landmark"  # text around the filler (bench.tasks.passkey.PASSKEY_TEMPLATES)
    )
    passkey_loss: str = "all"  # all | answer
    # full (a whole row) | uniform (template minimum .. row, README); in the key only where there
    # are passkey rows (so the keys of models trained before the field existed hold)
    passkey_length: str = field(
        default="full",
        metadata={
            WEIGHTS: lambda train: (
                train.passkey_length if train.passkey_fraction > 0 else NOT_IN_KEY
            )
        },
    )
    # the task rows (passkey_fraction of the rows) are examples of these RULER-style tasks
    # (bench.tasks.ruler; "passkey" = a passkey example), drawn uniformly, with passkey_filler,
    # passkey_loss and passkey_length; empty = passkey only. In the key only when set.
    ruler_tasks: list[str] = field(default_factory=list, metadata={WEIGHTS: IF_SET})
    ruler_params: dict[str, Any] = field(default_factory=dict, metadata={WEIGHTS: IF_SET})
    # a curriculum: the first updates draw their task rows from these lists in turn
    # ([{steps: N, tasks: [...]}, ...]), the updates after them from ruler_tasks (a circuit that
    # forms alone may not form in the whole mixture). In the key only when set.
    ruler_stages: list[dict[str, Any]] = field(default_factory=list, metadata={WEIGHTS: IF_SET})
    # position ids of each training window (POSITION_SAMPLINGS); in the key only where not
    # contiguous (so the keys of models trained before the field existed hold)
    position_sampling: str = field(
        default="contiguous",
        metadata={
            WEIGHTS: lambda train: (
                train.position_sampling if train.position_sampling != "contiguous" else NOT_IN_KEY
            )
        },
    )
    # sampled positions lie in [0, max_position); null = 8 x length; read by randomized and pose
    max_position: int | None = field(
        default=None,
        metadata={
            WEIGHTS: lambda train: (
                train.sampled_positions if train.position_sampling != "contiguous" else NOT_IN_KEY
            )
        },
    )
    # train until the passkey circuit has formed (the retrieval arm; bench.train.trainer): after every
    # retrieval_check_every updates, passkey accuracy at train.length on examples that are not the
    # evaluation's; the first time it is decidedly >= until_retrieves (the lower end of its
    # Wilson interval, as F5 decides), the lr decays over the next
    # decay_steps updates and the run ends there (train.steps is then the most it runs).
    # null = train for train.steps. In the key only when set.
    until_retrieves: float | None = field(default=None, metadata={WEIGHTS: IF_SET})
    retrieval_check_every: int = field(
        default=250,
        metadata={
            WEIGHTS: lambda train: (
                train.retrieval_check_every if train.until_retrieves is not None else NOT_IN_KEY
            )
        },
    )
    # what is measured and shown, never the weights:
    eval_every: int = field(default=100, metadata={WEIGHTS: False})  # 0 = after the last only
    eval_batches: int = field(default=4, metadata={WEIGHTS: False})  # validation batches; 0 = none
    log_every: int = field(default=10, metadata={WEIGHTS: False})  # updates between loss checks
    # resumable states (bench.train.cache): every N updates and/or every M minutes; 0 = off
    save_every: int = field(default=0, metadata={WEIGHTS: False})
    save_every_minutes: float = field(default=10.0, metadata={WEIGHTS: False})
    # torch.compile the model for training (a throughput switch: same math, so not in the key)
    compile: bool = field(default=False, metadata={WEIGHTS: False})

    def __post_init__(self) -> None:
        self.length = integer("train.length", self.length, 2)
        self.steps = integer("train.steps", self.steps, 1)
        self.batch_size = integer("train.batch_size", self.batch_size, 1)
        self.lr = number("train.lr", self.lr, 0.0)
        self.min_lr_ratio = number("train.min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        if self.min_lr is not None:
            self.min_lr = number("train.min_lr", self.min_lr, 0.0, self.lr)
        self.warmup_steps = integer("train.warmup_steps", self.warmup_steps, 0)
        self.decay_steps = _decay_steps("train", self.decay_steps, self.steps, self.warmup_steps)
        self.weight_decay = number("train.weight_decay", self.weight_decay, 0.0)
        choice("train.weight_decay_scope", self.weight_decay_scope, WEIGHT_DECAY_SCOPES)
        betas = self.betas
        if (
            not isinstance(betas, (list, tuple))
            or len(betas) != 2
            or not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in betas)
            or not all(0.0 <= b < 1.0 for b in betas)
        ):
            raise ValueError(f"train.betas must be two numbers in [0, 1), got {betas!r}.")
        self.betas = [float(b) for b in betas]
        self.grad_clip = number("train.grad_clip", self.grad_clip, 0.0)
        choice("train.precision", self.precision, PRECISIONS)
        self.passkey_fraction = number("train.passkey_fraction", self.passkey_fraction, 0.0, 1.0)
        choice("train.passkey_filler", self.passkey_filler, PASSKEY_FILLERS)
        choice("train.passkey_template", self.passkey_template, tuple(PASSKEY_TEMPLATES))
        choice("train.passkey_loss", self.passkey_loss, PASSKEY_LOSSES)
        choice("train.passkey_length", self.passkey_length, PASSKEY_LENGTHS)
        self.ruler_tasks = [
            choice("train.ruler_tasks", t, ("passkey", *RULER_TASKS)) for t in self.ruler_tasks
        ]
        try:
            params_from(self.ruler_params)
        except ValueError as exc:
            raise ValueError(f"train.ruler_params: {exc}") from None
        self.ruler_params = dict(self.ruler_params)
        self._check_ruler_stages()
        self._check_task_lengths()
        choice("train.position_sampling", self.position_sampling, POSITION_SAMPLINGS)
        self.max_position = integer(
            "train.max_position", self.max_position, self.length, optional=True
        )
        self._check_until_retrieves()
        self.eval_every = integer("train.eval_every", self.eval_every, 0)
        self.eval_batches = integer("train.eval_batches", self.eval_batches, 0)
        self.log_every = integer("train.log_every", self.log_every, 1)
        self.save_every = integer("train.save_every", self.save_every, 0)
        self.save_every_minutes = number("train.save_every_minutes", self.save_every_minutes, 0.0)
        self.compile = boolean("train.compile", self.compile)

    def trained_ruler_tasks(self) -> list[str]:
        """Every task name the training rows draw (``ruler_tasks`` and the stages'), each once,
        in order of first mention ("passkey" included)."""
        names = [*self.ruler_tasks, *(t for stage in self.ruler_stages for t in stage["tasks"])]
        return list(dict.fromkeys(names))

    def _check_ruler_stages(self) -> None:
        """Each stage is ``{steps, tasks}``; the stages end before the last update, and the rows
        after them are ``ruler_tasks``."""
        stages = []
        for i, stage in enumerate(self.ruler_stages):
            name = f"train.ruler_stages[{i}]"
            if not isinstance(stage, Mapping) or set(stage) != {"steps", "tasks"}:
                raise ValueError(
                    f"{name} must be a mapping with exactly the keys steps and tasks, got {stage!r}."
                )
            tasks = stage["tasks"]
            if isinstance(tasks, str) or not isinstance(tasks, (list, tuple)) or not tasks:
                raise ValueError(
                    f"{name}.tasks must be a non-empty list of task names, got {tasks!r}."
                )
            allowed = ("passkey", *RULER_TASKS)
            stages.append({
                "steps": integer(f"{name}.steps", stage["steps"], 1),
                "tasks": [choice(f"{name}.tasks", t, allowed) for t in tasks],
            })  # fmt: skip
        self.ruler_stages = stages
        if not stages:
            return
        if not self.ruler_tasks:
            raise ValueError(
                "train.ruler_stages needs train.ruler_tasks (the task rows after the stages)."
            )
        if self.until_retrieves is not None:
            raise ValueError(
                "train.ruler_stages and train.until_retrieves do not combine (the check could end "
                "the run inside a stage): set one of them to null/[]."
            )
        total = sum(stage["steps"] for stage in stages)
        if total >= self.steps:
            raise ValueError(
                f"train.ruler_stages take {total} updates, train.steps = {self.steps}: the stages "
                "must end before the last update (the rows after them are train.ruler_tasks)."
            )

    def _check_task_lengths(self) -> None:
        """Every RULER task of the task rows fits in a training row (checked here, not when the
        training stream is built after the sweep has started)."""
        if self.passkey_fraction == 0.0:
            return
        tasks = {*self.ruler_tasks, *(t for stage in self.ruler_stages for t in stage["tasks"])}
        params = params_from(self.ruler_params)
        for task in sorted(tasks - {"passkey"}):
            needed = min_ruler_length(task, params) + len(RULER_END.encode("utf-8"))
            if self.length + 1 < needed:
                raise ValueError(
                    f"train.length {self.length} is too short for ruler task {task!r} training "
                    f"examples (train.ruler_tasks / train.ruler_stages); allowed: train.length >= "
                    f"{needed - 1}, other tasks, or train.passkey_fraction=0."
                )

    def _check_until_retrieves(self) -> None:
        """``until_retrieves`` in (0, 1] needs passkey rows to learn from and a decay to end with."""
        self.retrieval_check_every = integer(
            "train.retrieval_check_every", self.retrieval_check_every, 1
        )
        if self.until_retrieves is None:
            return
        self.until_retrieves = number(
            "train.until_retrieves", self.until_retrieves, 0.0, 1.0, interval="(]"
        )
        if self.passkey_fraction == 0.0 or (self.ruler_tasks and "passkey" not in self.ruler_tasks):
            raise ValueError(
                "train.until_retrieves needs passkey rows to learn from: set "
                "train.passkey_fraction > 0 (with train.ruler_tasks empty or naming passkey), "
                "or set train.until_retrieves=null."
            )
        if self.decay_steps is None:
            raise ValueError(
                "train.until_retrieves needs train.decay_steps (the updates over which the lr "
                "decays once the model retrieves), got null."
            )
        minimum = min_passkey_length(template=self.passkey_template)
        if self.length < minimum:
            raise ValueError(
                f"train.until_retrieves checks passkey at train.length = {self.length}, shorter "
                f"than the {self.passkey_template} template's {minimum} tokens; use a longer "
                "train.length or set train.until_retrieves=null."
            )

    def sampling_problem(self, family: Any) -> str | None:
        """Why ``position_sampling`` means nothing for a model of position ``family`` (one that
        reads no position ids: every sampling trains the contiguous model again, bit for bit,
        under another checkpoint key and label), or None."""
        if self.position_sampling == "contiguous" or family.reads_position_ids:
            return None
        return (
            f"train.position_sampling={self.position_sampling} means nothing for position="
            f"{family.name} (it reads no position ids, so it would train the contiguous model "
            "again under another key); allowed for it: contiguous"
        )

    @property
    def sampled_positions(self) -> int:
        """The end (exclusive) of the positions a sampled window may use: ``max_position``, or
        8 x ``length`` when it is null."""
        if self.max_position is not None:
            return self.max_position
        return DEFAULT_MAX_POSITION_MULTIPLE * self.length

    @property
    def final_lr(self) -> float:
        """The learning rate at the last update: ``min_lr``, or ``lr * min_lr_ratio``."""
        return self.min_lr if self.min_lr is not None else self.lr * self.min_lr_ratio


EXTEND_NONE = "none"  # the extend method that means: no fine-tune (today's models)


@dataclass
class ExtendConfig:
    """The ``extend`` group: a fine-tune at ``length`` with a scaling method active (bench.train.extend).

    ``method`` none = no fine-tune; else a scaling method whose "auto" factors are length /
    train.length (``default`` = raw RoPE at the longer length). ``base_factor`` (method ntk only)
    multiplies the RoPE base exactly (ABF). :class:`JobConfig` turns ``length`` into tokens and
    fills ``batch_size`` / ``passkey_fraction`` left null from ``train``.
    """

    name: str = field(default="none", metadata={WEIGHTS: False})  # label (finetune_method)
    method: str = EXTEND_NONE
    params: dict[str, Any] = field(default_factory=dict)  # the method's, as for scaling
    base_factor: float | None = None
    length: Any = "4x"  # tokens or "<m>x" of train.length
    steps: int = 200  # optimizer updates; 0 = the parent's weights with the scaling
    lr: float = 1.0e-3
    min_lr_ratio: float = 0.1  # the lr at the last update, as a fraction of lr
    warmup_steps: int = 20
    decay_steps: int | None = None  # cosine over the last N updates; null = all after warmup
    batch_size: int | None = None  # null = train.batch_size
    passkey_fraction: float | None = None  # null = train.passkey_fraction
    # a recovery curve: the fine-tune is also evaluated after each of these update counts (< steps;
    # 0 = the parent with the scaling), from states saved along the one run as the checkpoints of
    # the same fine-tune with that many steps. Needs min_lr_ratio 1 (a learning rate that does not
    # depend on steps), so that the state after k updates is the k-update fine-tune's own.
    curve: list[int] = field(default_factory=list, metadata={WEIGHTS: False})

    @property
    def active(self) -> bool:
        return self.method != EXTEND_NONE

    def with_steps(self, steps: int) -> ExtendConfig:
        """This fine-tune stopped after ``steps`` updates (a point of its curve; no curve)."""
        return replace(self, steps=int(steps), curve=[])

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"extend.name must be a non-empty label, got {self.name!r}.")
        choice("extend.method", self.method, (EXTEND_NONE, *SCALING_METHODS))
        if not isinstance(self.params, Mapping):
            raise ValueError(f"extend.params must be a mapping of parameters, got {self.params!r}.")
        self.params = dict(self.params)
        if self.base_factor is not None:
            self.base_factor = number("extend.base_factor", self.base_factor, 1.0)
            if self.method != "ntk" or "alpha" in self.params:
                raise ValueError(
                    "extend.base_factor multiplies the RoPE base through method ntk (it sets "
                    f"alpha); got method {self.method!r} with params {self.params!r}; use "
                    "extend.method=ntk without params.alpha, or base_factor null."
                )
        parse_length(self.length, 1, "extend.length")
        self.steps = integer("extend.steps", self.steps, 0)
        self.lr = number("extend.lr", self.lr, 0.0)
        self.min_lr_ratio = number("extend.min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        self.warmup_steps = integer("extend.warmup_steps", self.warmup_steps, 0)
        self.decay_steps = _decay_steps("extend", self.decay_steps, self.steps, self.warmup_steps)
        self.batch_size = integer("extend.batch_size", self.batch_size, 1, optional=True)
        if self.passkey_fraction is not None:
            what = "extend.passkey_fraction"
            self.passkey_fraction = number(what, self.passkey_fraction, 0.0, 1.0)
        self.curve = self._checked_curve(self.curve)

    def _checked_curve(self, curve: Any) -> list[int]:
        if curve is None:
            return []
        if isinstance(curve, (str, bytes)) or not hasattr(curve, "__iter__"):
            raise ValueError(f"extend.curve must be a list of update counts, got {curve!r}.")
        points = sorted({integer("extend.curve", k, 0) for k in curve})
        if points and self.active and points[-1] >= self.steps:
            raise ValueError(
                f"extend.curve points must be below extend.steps = {self.steps} (the curve's "
                f"end), got {points[-1]}."
            )
        if any(points) and self.active and self.min_lr_ratio != 1.0:
            raise ValueError(
                f"extend.curve needs extend.min_lr_ratio 1.0 (a learning rate that does not "
                f"depend on steps, so a state after k updates is the k-update fine-tune's), "
                f"got {self.min_lr_ratio}."
            )
        return points
