"""Training batches: deterministic random windows of a corpus split, with an optional passkey mix.

Batch k depends only on (seed, k), so any step can be regenerated alone and a run resumes exactly.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from fractions import Fraction
from typing import NamedTuple

import numpy as np
import torch

from bench.data.corpora import EOS, Document
from bench.data.tokenizer import ByteTokenizer
from bench.tasks.passkey import (
    DEFAULT_TEMPLATE,
    PASSKEY_FILLERS,
    PasskeyExample,
    make_passkey_example,
    min_passkey_length,
    random_key,
)
from bench.tasks.passkey import passkey_template as passkey_template_of
from bench.tasks.ruler import RULER_END, make_ruler_example, min_ruler_length, params_from
from bench.tasks.text import TaskExample
from bench.train.config import PASSKEY_LENGTHS, PASSKEY_LOSSES, POSITION_SAMPLINGS

__all__ = [
    "TrainingBatch",
    "TrainingStream",
    "concat_documents",
    "pose_positions",
    "randomized_positions",
    "validation_batches",
]


def concat_documents(docs: Sequence[Document]) -> np.ndarray:
    """All documents back to back, each followed by EOS (int16).

    The EOS teaches the model where one text ends, so windows that straddle two
    documents are not read as one continuous text.
    """
    if not docs:
        raise ValueError(
            "no documents to concatenate; the split is empty (check split_fractions and caps)."
        )
    parts: list[np.ndarray] = []
    eos = np.array([EOS], dtype=np.int16)
    for doc in docs:
        parts.append(np.asarray(doc.tokens, dtype=np.int16))
        parts.append(eos)
    return np.concatenate(parts)


def _step_seed(seed: int, step: int) -> int:
    """A 63-bit seed per (seed, step) so that any step can be regenerated alone (resume)."""
    digest = hashlib.sha256(f"lenbench-train:{int(seed)}:{int(step)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class TrainingBatch(NamedTuple):
    tokens: torch.Tensor  # LongTensor [B, seq_len + 1]; inputs = [:, :-1], targets = [:, 1:]
    loss_mask: torch.Tensor  # BoolTensor [B, seq_len], aligned with targets
    passkey_rows: torch.Tensor  # LongTensor [n_passkey] of row indices holding passkey examples
    # LongTensor [B, seq_len] of the inputs' position ids; None = contiguous 0..seq_len-1
    position_ids: torch.Tensor | None = None


def randomized_positions(
    rows: int, length: int, max_position: int, generator: torch.Generator
) -> torch.Tensor:
    """Randomized positions (Ruoss et al. 2023): per row, ``length`` distinct positions drawn
    uniformly without replacement from [0, ``max_position``), sorted -> [rows, length]."""
    if not 1 <= length <= max_position:
        raise ValueError(f"length {length} must be in [1, max_position = {max_position}].")
    scores = torch.rand(rows, max_position, generator=generator)  # [rows, max_position]
    # the top-k of i.i.d. uniform scores is a uniform k-subset
    return scores.topk(length, dim=1).indices.sort(dim=1).values


def pose_positions(
    rows: int, length: int, max_position: int, generator: torch.Generator
) -> torch.Tensor:
    """Positional skip-wise positions (PoSE, Zhu et al. 2024; two chunks, as in its reference
    code, dwzhu-pku/PoSE ``train_pose.py``): the window's first l tokens (l uniform in
    [1, (length + 1) // 2]) keep positions 0..l-1, the rest are shifted by a skip b uniform in
    [0, max_position - length] -> [rows, length], increasing, within [0, max_position). (The
    paper also shifts the first chunk; the reference code's last revision fixes that skip at 0
    for a more uniform coverage of large relative positions.) Over many windows every position
    of [0, max_position) occurs."""
    if not 2 <= length <= max_position:
        raise ValueError(f"length {length} must be in [2, max_position = {max_position}].")
    room = max_position - length  # the largest skip
    half = (length + 1) // 2
    first = 1 + (torch.rand(rows, 1, generator=generator) * half).long().clamp(max=half - 1)
    skip = (torch.rand(rows, 1, generator=generator) * (room + 1)).long().clamp(max=room)
    index = torch.arange(length)[None]  # [1, length]
    return index + torch.where(index < first, 0, skip)  # [rows, length]


class TrainingStream:
    """Deterministic, endless training batches from random windows of the concatenated docs.

    Iterating yields ``(tokens, loss_mask)``: tokens LongTensor [B, seq_len+1],
    loss_mask BoolTensor [B, seq_len] aligned with ``tokens[:, 1:]``. Batch ``k``
    depends only on (seed, k), so :meth:`batch` can regenerate any step and
    ``start_step`` resumes a run exactly.

    ``passkey_fraction`` of the rows (exactly, over the run: step k holds
    ``floor(f*B*(k+1)) - floor(f*B*k)`` rows, at random row positions) are passkey
    examples with a random key and depth: of exactly seq_len+1 tokens
    (``passkey_length="full"``), or (``"uniform"``) of a length drawn uniformly between the
    template's minimum and seq_len+1, at the start of the row, the rest of the row keeping its
    training text (a short example is a long one's easier case: less filler to search, so a
    small model finds the needle by content before it has to do so over the whole window).
    ``ruler_tasks`` (names of ``bench.tasks.ruler.RULER_TASKS`` and ``"passkey"``) makes each of these
    rows an example of a task drawn uniformly from the list (``ruler_params`` its parameters),
    of a length drawn as for passkey rows, followed by ".". ``ruler_stages`` (``(steps, tasks)``
    pairs) is a curriculum: the first ``steps`` updates draw from the first stage's ``tasks``, the
    next from the second's, and the updates after the stages from ``ruler_tasks``.
    ``passkey_filler="corpus"`` fills them with a random window of the training
    text instead of the standard sentences. ``passkey_loss="answer"`` restricts the
    loss of passkey rows to the answer tokens (and the end text after it); "all" (default)
    trains on every token.
    """

    def __init__(
        self,
        docs: Sequence[Document],
        seq_len: int,
        batch_size: int,
        seed: int,
        passkey_fraction: float = 0.0,
        passkey_filler: str = "standard",
        passkey_loss: str = "all",
        start_step: int = 0,
        tokenizer: ByteTokenizer | None = None,
        passkey_template: str = DEFAULT_TEMPLATE,
        passkey_length: str = "full",
        position_sampling: str = "contiguous",
        max_position: int | None = None,
        ruler_tasks: Sequence[str] = (),
        ruler_params: Mapping | None = None,
        ruler_stages: Sequence[tuple[int, Sequence[str]]] = (),
    ) -> None:
        _check_stream_args(
            seq_len, batch_size, passkey_fraction, passkey_filler, passkey_length, passkey_loss,
            position_sampling, max_position,
        )  # fmt: skip
        self.position_sampling = position_sampling
        self.max_position = max_position
        self.seq_len = int(seq_len)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        # Exact rational so that e.g. 0.3 * 10 rows is 3, not 2.9999 floored to 2.
        self.passkey_fraction = Fraction(float(passkey_fraction)).limit_denominator(10**6)
        self.passkey_filler = passkey_filler
        self.passkey_loss = passkey_loss
        self.start_step = int(start_step)
        self.tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
        self.passkey_template = passkey_template
        self.passkey_length = passkey_length
        self._end_ids = self.tokenizer.encode(passkey_template_of(passkey_template).end)
        self.ruler_tasks = list(ruler_tasks)
        self.ruler_params = params_from(ruler_params)
        if ruler_stages and not self.ruler_tasks:
            raise ValueError("ruler_stages needs ruler_tasks (the task rows after the stages).")
        # (first update after the stage, its tasks); updates from the last end read ruler_tasks
        self._stage_ends = _stage_ends(ruler_stages)
        self._ruler_end = self.tokenizer.encode(RULER_END)
        self._min_example = min_passkey_length(template=passkey_template)  # any key fits
        self._check_examples_fit(passkey_template)
        self._stream = torch.from_numpy(concat_documents(docs))
        if self._stream.numel() < self.seq_len + 1:
            raise ValueError(
                f"the training documents hold {self._stream.numel()} tokens, fewer than one window of "
                f"seq_len + 1 = {self.seq_len + 1}; use more documents or a shorter seq_len."
            )
        self._offsets = torch.arange(self.seq_len + 1)

    def _check_examples_fit(self, passkey_template: str) -> None:
        """Every task row's shortest example fits a window (checked against the longest key now,
        rather than failing at a random later step)."""
        needed = self._min_example + len(self._end_ids)
        what = f"passkey training examples with the {passkey_template!r} template"
        every_task = {*self.ruler_tasks, *(t for _, tasks in self._stage_ends for t in tasks)}
        for task in sorted(every_task):
            if task != "passkey":
                minimum = min_ruler_length(task, self.ruler_params) + len(self._ruler_end)
                if minimum > needed:
                    needed, what = minimum, f"ruler task {task!r} training examples"
        if self.passkey_fraction > 0 and self.seq_len + 1 < needed:
            raise ValueError(
                f"seq_len {self.seq_len} is too short for {what}; seq_len + 1 must be at least "
                f"{needed} (or set passkey_fraction=0)."
            )

    def passkey_rows_at(self, step: int) -> int:
        """Number of passkey rows in batch ``step`` (cumulative rounding keeps the run total exact)."""
        per_step = self.passkey_fraction * self.batch_size
        return math.floor(per_step * (step + 1)) - math.floor(per_step * step)

    def batch(self, step: int) -> TrainingBatch:
        """Batch number ``step`` (0-based), a pure function of (seed, step)."""
        step_seed = _step_seed(self.seed, step)
        gen = torch.Generator().manual_seed(step_seed)
        # Passkey keys/depths use the stdlib rng, as the passkey API does.
        rng = random.Random(step_seed)
        n_windows = self._stream.numel() - self.seq_len
        starts = torch.randint(0, n_windows, (self.batch_size,), generator=gen)
        tokens = self._stream[starts[:, None] + self._offsets].long()
        loss_mask = torch.ones(self.batch_size, self.seq_len, dtype=torch.bool)

        n_passkey = self.passkey_rows_at(step)
        rows = torch.randperm(self.batch_size, generator=gen)[:n_passkey].sort().values
        tasks = self.tasks_at(step)
        for row in rows.tolist():
            example, end = self._task_example(rng, tasks)
            ids = example.input_ids + end
            tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            if self.passkey_loss == "answer":
                loss_mask[row] = False
                # target j predicts token j+1: the first answer token is predicted at
                # len(prompt)-1, the end text's last token at len(ids)-2
                loss_mask[row, len(example.prompt_ids) - 1 : len(ids) - 1] = True
        return TrainingBatch(tokens, loss_mask, rows, self._positions(step_seed))

    def _positions(self, step_seed: int) -> torch.Tensor | None:
        """The batch's position ids [B, seq_len], None for contiguous; from a generator of its
        own, so the tokens of a batch do not depend on the sampling."""
        if self.position_sampling == "contiguous":
            return None
        gen = torch.Generator().manual_seed((step_seed + 1) % 2**63)
        sample = randomized_positions if self.position_sampling == "randomized" else pose_positions
        return sample(self.batch_size, self.seq_len, int(self.max_position), gen)

    def tasks_at(self, step: int) -> list[str]:
        """The task list update ``step`` draws its task rows from (its stage's, else ruler_tasks)."""
        for end, tasks in self._stage_ends:
            if step < end:
                return tasks
        return self.ruler_tasks

    def _task_example(self, rng: random.Random, tasks: list[str]) -> tuple[TaskExample, list[int]]:
        """A task row's example (of a task drawn from ``tasks``; none: passkey) and the end text
        that follows it."""
        if not tasks:
            return self._passkey_example(rng), self._end_ids
        task = rng.choice(tasks)
        if task == "passkey":
            return self._passkey_example(rng), self._end_ids
        minimum = min_ruler_length(task, self.ruler_params)
        total = self._example_length(rng, minimum, self._ruler_end)
        source = self._corpus_window(rng, total)
        example = make_ruler_example(
            task, total, rng.random(), rng=rng, params=self.ruler_params,
            filler=self.passkey_filler, filler_source=source,
        )  # fmt: skip
        return example, self._ruler_end

    def _passkey_example(self, rng: random.Random) -> PasskeyExample:
        """An example that leaves room for the template's end text after the answer."""
        total = self._example_length(rng, self._min_example, self._end_ids)
        key, depth = random_key(rng), rng.random()
        return make_passkey_example(
            total,
            depth,
            key,
            self.tokenizer,
            filler=self.passkey_filler,
            filler_source=self._corpus_window(rng, total),
            template=self.passkey_template,
        )

    def _example_length(self, rng: random.Random, minimum: int, end: list[int]) -> int:
        """A task row's example length: the row less the end text, or (``uniform``) drawn from
        ``minimum`` up to that."""
        total = self.seq_len + 1 - len(end)
        return rng.randint(minimum, total) if self.passkey_length == "uniform" else total

    def _corpus_window(self, rng: random.Random, total: int) -> np.ndarray | None:
        """``total`` training tokens at a random offset for ``filler: corpus`` (None otherwise):
        a window, since passing the whole stream would copy it for every row."""
        if self.passkey_filler != "corpus":
            return None
        start = rng.randrange(self._stream.numel() - total + 1)
        return self._stream[start : start + total].numpy()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        step = self.start_step
        while True:
            batch = self.batch(step)
            yield batch.tokens, batch.loss_mask
            step += 1


def validation_batches(
    docs: Sequence[Document], seq_len: int, n_batches: int, batch_size: int
) -> list[torch.Tensor]:
    """Fixed windows for validation: ``n_batches`` LongTensors [batch_size, seq_len+1].

    Window starts are spread evenly over the concatenated documents (no randomness),
    so every call and every model sees exactly the same tokens; windows do not
    overlap whenever the split holds at least n_batches*batch_size*(seq_len+1) tokens.
    """
    if int(seq_len) < 1 or int(n_batches) < 1 or int(batch_size) < 1:
        raise ValueError(
            f"seq_len {seq_len!r}, n_batches {n_batches!r} and batch_size {batch_size!r} are invalid; "
            "all must be integers >= 1."
        )
    stream = torch.from_numpy(concat_documents(docs))
    width = int(seq_len) + 1
    if stream.numel() < width:
        raise ValueError(
            f"the validation documents hold {stream.numel()} tokens, fewer than one window of "
            f"seq_len + 1 = {width}; use more documents or a shorter seq_len."
        )
    n = int(n_batches) * int(batch_size)
    last = stream.numel() - width
    starts = torch.tensor([(i * last) // max(n - 1, 1) for i in range(n)], dtype=torch.long)
    windows = stream[starts[:, None] + torch.arange(width)].long()
    return list(windows.split(int(batch_size)))


def _stage_ends(ruler_stages: Sequence[tuple[int, Sequence[str]]]) -> list[tuple[int, list[str]]]:
    """(first update after each curriculum stage, its tasks), checked."""
    ends: list[tuple[int, list[str]]] = []
    for steps, tasks in ruler_stages:
        if int(steps) < 1 or not tasks:
            raise ValueError(
                f"ruler stage ({steps!r}, {tasks!r}) is invalid; each stage needs steps >= 1 "
                "and a non-empty list of tasks."
            )
        ends.append((int(steps) + (ends[-1][0] if ends else 0), list(tasks)))
    return ends


def _check_stream_args(
    seq_len: int,
    batch_size: int,
    passkey_fraction: float,
    passkey_filler: str,
    passkey_length: str,
    passkey_loss: str,
    position_sampling: str,
    max_position: int | None,
) -> None:
    """One sentence for the first bad argument of :class:`TrainingStream`."""
    if int(seq_len) < 1 or int(batch_size) < 1:
        raise ValueError(
            f"seq_len {seq_len!r} and batch_size {batch_size!r} are invalid; both must be integers >= 1."
        )
    if not 0.0 <= float(passkey_fraction) <= 1.0:
        raise ValueError(
            f"passkey_fraction {passkey_fraction!r} is invalid; allowed values are in [0, 1]."
        )
    if passkey_filler not in PASSKEY_FILLERS:
        raise ValueError(
            f"passkey_filler {passkey_filler!r} is unknown; allowed fillers are {', '.join(PASSKEY_FILLERS)}."
        )
    if passkey_length not in PASSKEY_LENGTHS:
        raise ValueError(
            f"passkey_length {passkey_length!r} is unknown; allowed values are {', '.join(PASSKEY_LENGTHS)}."
        )
    if passkey_loss not in PASSKEY_LOSSES:
        raise ValueError(
            f"passkey_loss {passkey_loss!r} is unknown; allowed values are {', '.join(PASSKEY_LOSSES)}."
        )
    if position_sampling not in POSITION_SAMPLINGS:
        raise ValueError(
            f"position_sampling {position_sampling!r} is unknown; allowed values are "
            f"{', '.join(POSITION_SAMPLINGS)}."
        )
    if position_sampling != "contiguous" and (max_position or 0) < int(seq_len):
        raise ValueError(
            f"max_position {max_position!r} must be an integer >= seq_len {seq_len} for "
            f"{position_sampling} positions."
        )
