"""The RULER-style tasks' registry and their building blocks: task parameters (:class:`RulerParams`),
what a task declares (:class:`RulerTask`, :func:`register_ruler_task`), the text parts a layout
returns (:class:`Layout`) and the random keys, values and words the layouts draw. The task
modules (``bench/tasks/ruler_tasks/``) import this module; ``bench.tasks.ruler`` assembles their layouts into
examples of an exact length (and re-exports these names)."""

from __future__ import annotations

import math
import random
import string
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

VALUE_DIGITS = 5
KEY_LETTERS = 4
VAR_LETTERS = 5
WORD = 4  # letters of a cwe/fwe list word


@dataclass(frozen=True)
class RulerParams:
    """Task parameters (config values ``eval.ruler.params``); each task reads its ``fields``."""

    keys: int = 4  # niah_multikey: needles with distinct keys (one asked, the others distractors)
    values: int = 4  # niah_multivalue: needles (values) of the one key
    queries: int = 2  # niah_multiquery: needles, every one asked
    chains: int = 1  # vt: chains of assignments (one asked, the others distractors)
    hops: int = 3  # vt: assignments after the first in each chain (hops + 1 variables)
    common_words: int = 2  # cwe: words to return
    common_freq: int = 6  # cwe: occurrences of each common word
    rare_freq: int = 2  # cwe: occurrences of each other word (< common_freq)
    frequent_words: int = 3  # fwe: words to return
    alpha: float = 2.0  # fwe: Zipf exponent of the word frequencies
    people: int = 3  # qa1-qa3: people who move (one asked or holding the asked object)
    moves: int = 3  # qa1-qa3: "X went to Y." statements
    objects: int = 1  # qa2, qa3: objects taken, one asked (the others distractors)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            low = 0 if f.name == "chains" else 1
            if f.name == "alpha":
                if (
                    isinstance(value, bool)
                    or not isinstance(value, (int, float))
                    or not math.isfinite(value)
                    or value <= 0
                ):
                    raise ValueError(
                        f"ruler params.alpha {value!r} is invalid; allowed: a finite number > 0."
                    )
            elif isinstance(value, bool) or not isinstance(value, int) or value < max(low, 1):
                raise ValueError(
                    f"ruler params.{f.name} {value!r} is invalid; allowed: an integer >= 1."
                )
        if self.rare_freq >= self.common_freq:
            raise ValueError(
                f"ruler params.rare_freq {self.rare_freq} must be below params.common_freq "
                f"{self.common_freq} (the common words must be the most common)."
            )


def task_params(task: str, params: RulerParams) -> dict[str, Any]:
    """The parameters ``task`` reads, by name."""
    return {name: getattr(params, name) for name in ruler_task(task).fields}


# --------------------------------------------------------------------------- random parts


def _letters(rng: random.Random, n: int, alphabet: str) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def distinct(rng: random.Random, n: int, draw) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        item = draw(rng)
        if item not in out:
            out.append(item)
    return out


def random_key(rng: random.Random) -> str:
    return _letters(rng, KEY_LETTERS, string.ascii_lowercase)


def random_value(rng: random.Random) -> str:
    return str(rng.randint(10 ** (VALUE_DIGITS - 1), 10**VALUE_DIGITS - 1))


def random_var(rng: random.Random) -> str:
    return _letters(rng, VAR_LETTERS, string.ascii_uppercase)


def random_word(rng: random.Random) -> str:
    return _letters(rng, WORD, string.ascii_lowercase)


# --------------------------------------------------------------------------- layouts
# A layout is the example as text parts: the head, statements to place in the haystack (each
# with the fraction of the haystack before it and whether it holds the answer), the question and
# the expected strings. The haystack is filler (needle tasks, vt) or a word list (cwe, fwe).


@dataclass
class Layout:
    head: str
    question: str
    expected: list[str]
    statements: list[tuple[float, str, bool]] = field(default_factory=list)  # (at, text, answer)
    words: Any = None  # cwe/fwe: words(n_chars, rng) -> the list text of exactly n_chars


@dataclass(frozen=True)
class RulerTask:
    """One RULER-style task, declared once beside its layout (a module of ``bench/tasks/ruler_tasks/``,
    or of a package named in ``extensions``) by :func:`register_ruler_task`.

    ``layout(params, depth, rng)`` gives the example's text parts (:class:`Layout`); ``text``
    holds every piece of the task's own text (``str.format`` fields in braces), which enters the
    checkpoint key of a model trained on the task (editing it retrains such models only);
    ``fields`` are the :class:`RulerParams` it reads (its rows' ``task_params``); ``depth``: its
    asked statement is placed at the depth asked for (rows per depth, ``eval.ruler.depths``);
    ``answer_length(params)``: for a task whose haystack is its own list (``Layout.words``), the
    characters its answer has; ``default``: in ``eval.ruler.tasks``' default (RULER's suite).
    """

    name: str
    layout: Callable[[RulerParams, float, random.Random], Layout]
    text: dict[str, str]
    fields: tuple[str, ...] = ()
    depth: bool = False
    answer_length: Callable[[RulerParams], int] | None = None
    default: bool = True


#: The registered tasks by name, in registration order (built-ins first).
RULER_TASK_REGISTRY: dict[str, RulerTask] = {}
#: Their names: a live view of the registry (a task registered later is in it).
RULER_TASKS = RULER_TASK_REGISTRY.keys()


def register_ruler_task(
    name: str,
    *,
    text: dict[str, str],
    fields: Iterable[str] = (),
    depth: bool = False,
    answer_length: Callable[[RulerParams], int] | None = None,
    default: bool = True,
) -> Callable:
    """Decorator: register the layout function below it as task ``name`` (:class:`RulerTask`)."""
    known = set(RulerParams.__dataclass_fields__)

    def register(layout: Callable) -> Callable:
        if not name or name in RULER_TASK_REGISTRY or name == "passkey":
            raise ValueError(f"ruler task name {name!r} is empty or already registered.")
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(
                f"ruler task {name!r} reads params {unknown} that RulerParams does not have."
            )
        RULER_TASK_REGISTRY[name] = RulerTask(
            name, layout, text, tuple(fields), bool(depth), answer_length, bool(default)
        )
        return layout

    return register


def ruler_task(name: str) -> RulerTask:
    """The registered task ``name``; an unknown name is one sentence listing the registered ones."""
    if name not in RULER_TASK_REGISTRY:
        raise ValueError(f"ruler task {name!r} is unknown; allowed: {', '.join(RULER_TASKS)}.")
    return RULER_TASK_REGISTRY[name]


def default_ruler_tasks() -> list[str]:
    """The tasks ``eval.ruler.tasks`` runs when it is not set: RULER's suite (``default``)."""
    return [name for name, task in RULER_TASK_REGISTRY.items() if task.default]


def ruler_text(tasks: Iterable[str]) -> dict[str, str]:
    """The text of ``tasks`` (every piece, by name; tasks sharing a piece share its text): what
    a model trained on them has in its checkpoint key (``bench.train.cache.weights_config``)."""
    out: dict[str, str] = {}
    for name in tasks:
        for key, value in ruler_task(name).text.items():
            if out.setdefault(key, value) != value:
                raise ValueError(f"ruler task {name!r} gives text {key!r} another value.")
    return out


def params_from(mapping: Mapping[str, Any] | None) -> RulerParams:
    """:class:`RulerParams` from a config mapping; unknown names are an error."""
    mapping = dict(mapping or {})
    unknown = sorted(set(mapping) - {f.name for f in fields(RulerParams)})
    if unknown:
        allowed = ", ".join(f.name for f in fields(RulerParams))
        raise ValueError(f"ruler params {', '.join(unknown)} unknown; allowed: {allowed}.")
    return replace(RulerParams(), **mapping)


def params_dict(params: RulerParams) -> dict[str, Any]:
    return asdict(params)
