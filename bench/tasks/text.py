"""What every task's text is made of (passkey, ``bench.tasks.ruler``): the example type, the standard
filler and corpus filler, the depth check, and fitting an example to a tokenizer's length."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np

__all__ = [
    "STANDARD_FILLER",
    "TaskExample",
    "check_depth",
    "corpus_filler",
    "fit_filler_length",
    "source_ids",
    "standard_filler_text",
]

#: Landmark Attention's passkey filler sentence group, repeated to any length.
STANDARD_FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
)


class TaskExample:
    """What every task example (passkey, ``bench.tasks.ruler``) has: ``prompt_ids`` and ``answer_ids``
    (set by the dataclass that subclasses it), its length and its full sequence."""

    prompt_ids: list[int]
    answer_ids: list[int]

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.answer_ids)

    @property
    def input_ids(self) -> list[int]:
        """Prompt followed by answer: the full sequence for teacher-forced scoring/training."""
        return self.prompt_ids + self.answer_ids


def standard_filler_text(n_chars: int) -> str:
    """The first ``n_chars`` characters of the endlessly repeated standard filler.

    Equal to Landmark's ``" ".join([garbage] * N)[:n_chars]`` for any large N: whole
    sentences first, then a partial sentence to hit the exact length.
    """
    if n_chars <= 0:
        return ""
    unit = STANDARD_FILLER + " "
    return (unit * (n_chars // len(unit) + 1))[:n_chars]


def check_depth(depth: object) -> float:
    value = float(depth)  # type: ignore[arg-type]
    if not 0.0 <= value <= 1.0:  # also rejects NaN
        raise ValueError(f"passkey depth {depth!r} is invalid; allowed depths are in [0, 1].")
    return value


def source_ids(filler_source: object) -> np.ndarray:
    """Normalize a corpus filler source (str, bytes, ids, array, tensor) to a 1-D int array."""
    if isinstance(filler_source, str):
        filler_source = filler_source.encode("utf-8")
    if isinstance(filler_source, (bytes, bytearray, memoryview)):
        arr = np.frombuffer(bytes(filler_source), dtype=np.uint8).astype(np.int64)
    elif hasattr(filler_source, "numpy"):  # torch tensor
        arr = filler_source.detach().cpu().numpy().astype(np.int64).reshape(-1)  # type: ignore[union-attr]
    else:
        arr = np.asarray(filler_source, dtype=np.int64).reshape(-1)
    if arr.size == 0:
        raise ValueError("passkey filler_source is empty; corpus filler needs at least one token.")
    return arr


def corpus_filler(source: np.ndarray, n_tokens: int, rng: random.Random | None) -> list[int]:
    """``n_tokens`` consecutive ids from ``source`` at a random offset (wrapping around).

    Contiguous text keeps the haystack natural; wrapping lets a short source still
    fill a long context instead of failing.
    """
    if n_tokens <= 0:
        return []
    offset = rng.randrange(source.size) if rng is not None else 0
    idx = (offset + np.arange(n_tokens)) % source.size
    return source[idx].tolist()


def fit_filler_length(count: Callable[[int], int], target: int, low: int = 0) -> int:
    """The filler size n >= ``low`` whose example has ``target`` tokens (``count(n)``, a
    non-decreasing count), or where no n hits it (a merge can skip a count) the largest n whose
    count is below: Newton steps on n from the tokens per filler unit, then a local scan."""
    per_unit = 4096 / max(count(low + 4096) - count(low), 1)  # filler units per token
    n = low
    for _ in range(8):
        step = round((target - count(n)) * per_unit)
        if step == 0:
            break
        n = max(low, n + step)
    while count(n) > target and n > low:
        n -= 1
    while count(n + 1) <= target and count(n) < target:
        n += 1
    return n
