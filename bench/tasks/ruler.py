"""RULER-style synthetic tasks (Hsieh et al. 2024), generated offline at an exact length.

The task definitions follow RULER's synthetic generators (needle-in-a-haystack variants,
variable tracking, common and frequent word extraction); the text is lenbench's own, compact
enough for small byte-level models (like the passkey ``short`` template: the question ends in
the needle's own words, so that retrieval is a content match) and read the same way by
pretrained models. The fixed text is short so that the filler is at least half of a 256-token
window for every task at its default parameters (RULER's protocol: the haystack is most of the
window). Every example is ``prompt | answer`` with the answer kept apart, so that evaluation can
teacher-force or generate it and training can restrict the loss to it.

Each task is one declaration (:func:`register_ruler_task`: its text, the parameters it reads,
whether it has depths, its layout) in a module of ``bench/tasks/ruler_tasks/`` (found by the one
discovery rule, ``models.discovery``); this module assembles any layout into an example of an
exact length and scores answers. The built-ins:

========================  ==================================================================
task                      prompt (needles ``\\n``-separated inside the haystack)
========================  ==================================================================
``niah_single``           one needle ``KEY:VALUE.``; asked ``value of KEY:``
``niah_multikey``         ``keys`` needles with distinct keys; asked for one of them
``niah_multivalue``       ``values`` needles with one key; every value, in text order
``niah_multiquery``       ``queries`` needles, all asked at once; values in question order
``vt``                    ``chains`` chains ``XXXXX=12345.`` ``YYYYY=XXXXX.`` of ``hops``
                          hops; every variable bound to the asked value, in chain order
``cwe``                   a list of words: ``common_words`` words ``common_freq`` times each,
                          the rest ``rare_freq`` times; the common ones, in order of first use
``fwe``                   words drawn with Zipf frequencies (exponent ``alpha``); the
                          ``frequent_words`` most frequent, most frequent first
========================  ==================================================================

The haystack of the needle tasks and of ``vt`` is the standard passkey filler or corpus text
(``filler``); ``cwe`` and ``fwe`` are their own haystack (RULER's too). Lengths count byte
tokens: every example has exactly ``total_length`` tokens (a ``cwe``/``fwe`` list that does not
end on a word boundary is padded with at most ``WORD + 1`` spaces). Keys are 4 lowercase letters, values
5-digit numbers, variables 5 uppercase letters, list words 4 lowercase letters (RULER uses English
words; random ones need no download). Answers are comma-separated; RULER's score
(:func:`match_score`) is the fraction of expected strings present in a generation; the exact
verdict (:func:`exact_match`) needs the whole answer, then no letter or digit.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from bench.data.tokenizer import ByteTokenizer
from bench.tasks.passkey import SEPARATOR
from bench.tasks.ruler_registry import (
    RULER_TASK_REGISTRY,
    RULER_TASKS,
    Layout,
    RulerParams,
    RulerTask,
    default_ruler_tasks,
    distinct,
    params_dict,
    params_from,
    random_key,
    random_value,
    random_var,
    random_word,
    register_ruler_task,
    ruler_task,
    ruler_text,
    task_params,
)
from bench.tasks.text import (
    TaskExample,
    check_depth,
    corpus_filler,
    fit_filler_length,
    source_ids,
    standard_filler_text,
)
from models.discovery import import_package

__all__ = [
    "RULER_END",
    "RULER_FILLERS",
    "RULER_TASKS",
    "RULER_TASK_REGISTRY",
    "Layout",
    "RulerExample",
    "RulerParams",
    "RulerTask",
    "exact_match",
    "fit_ruler_example",
    "fixed_ruler_length",
    "make_ruler_example",
    "match_score",
    "params_dict",
    "params_from",
    "MAX_WORD_LIST",
    "min_ruler_length",
    "ruler_depths",
    "ruler_examples",
    "ruler_grid",
    "default_ruler_tasks",
    "ruler_task",
    "ruler_text",
    "register_ruler_task",
    "distinct",
    "random_key",
    "random_value",
    "random_var",
    "random_word",
    "task_params",
]

RULER_FILLERS = ("standard", "corpus")
#: what follows the answer in training examples, so that a model learns where the answer ends
RULER_END = "."
_TOKENIZER = ByteTokenizer()


@dataclass(frozen=True)
class RulerExample(TaskExample):
    """One example; ``len(prompt_ids) + len(answer_ids)`` is its length in tokens.

    ``needles`` are the ``(start, stop)`` token spans in ``prompt_ids`` of the statements the
    answer is read from (needle tasks and ``vt``; empty for the word lists), ``distractors`` those
    of the other statements; ``expected`` the strings RULER's score looks for.
    """

    task: str
    prompt_ids: list[int]
    answer_ids: list[int]
    expected: tuple[str, ...]
    depth: float | None
    trial: int
    params: dict[str, Any]
    needles: tuple[tuple[int, int], ...] = ()
    distractors: tuple[tuple[int, int], ...] = ()
    filler: str = "standard"

    @property
    def answer_text(self) -> str:
        return ",".join(self.expected)


# --------------------------------------------------------------------------- assembly


def _layout(task: str, params: RulerParams, depth: float, rng: random.Random) -> Layout:
    return ruler_task(task).layout(params, depth, rng)


def _fixed_length(layout: Layout) -> int:
    """Bytes of everything but the haystack: head, statements with their separators, question."""
    text = layout.head + SEPARATOR + SEPARATOR + layout.question
    return len(text.encode()) + sum(len(s.encode()) + 2 for _, s, _ in layout.statements)


#: The longest word list (tokens) :func:`min_ruler_length` searches before it gives up.
MAX_WORD_LIST = 1 << 14


@functools.lru_cache(maxsize=64)
def min_ruler_length(task: str, params: RulerParams | None = None) -> int:
    """Fewest tokens an example of ``task`` fits in, for any random draw (byte tokens). Cached:
    every generated example and training row checks it, and the word lists' is a search."""
    params = params or RulerParams()
    fixed = fixed_ruler_length(task, params)
    layout = _layout(task, params, 0.0, random.Random(0))
    if layout.words is None:
        return fixed
    for n in range(1, MAX_WORD_LIST + 1):  # the shortest list the generator accepts (its words
        try:  # do not depend on the draw)
            layout.words(n, random.Random(0))
            return fixed + n
        except ValueError:
            continue
    values = ", ".join(f"params.{k} {v!r}" for k, v in task_params(task, params).items())
    raise ValueError(
        f"ruler task {task!r} with {values}: no word list of up to {MAX_WORD_LIST} tokens satisfies "
        "it (fwe: its most frequent words must have strictly ordered counts under the Zipf "
        "exponent alpha); allowed: values for which one does, e.g. the defaults."
    )


def fixed_ruler_length(task: str, params: RulerParams | None = None) -> int:
    """Tokens of an example of ``task`` that are not haystack: head, statements, question and
    answer (byte tokens). The rest of the window is filler (needle tasks, ``vt``) or the word
    list (``cwe``, ``fwe``, which also need a list of :func:`min_ruler_length`'s size)."""
    params = params or RulerParams()
    layout = _layout(task, params, 0.0, random.Random(0))
    if layout.words is None:
        return _fixed_length(layout) + len(",".join(layout.expected))
    return _fixed_length(layout) + ruler_task(task).answer_length(params)


def make_ruler_example(
    task: str,
    total_length: int,
    depth: float = 0.5,
    *,
    rng: random.Random,
    params: RulerParams | None = None,
    filler: str = "standard",
    filler_source: object = None,
    trial: int = 0,
) -> RulerExample:
    """An example of ``task`` with exactly ``total_length`` byte tokens (prompt + answer).

    ``depth`` places the asked needle (a ``depth`` task; the other tasks place their statements
    at random). ``filler="corpus"`` takes contiguous ids of ``filler_source`` at an ``rng`` offset.
    Raises ValueError when ``total_length`` is below :func:`min_ruler_length`.
    """
    params = params or RulerParams()
    depth = check_depth(depth)
    if filler not in RULER_FILLERS:
        raise ValueError(
            f"ruler filler {filler!r} is unknown; allowed: {', '.join(RULER_FILLERS)}."
        )
    layout = _layout(task, params, depth, rng)
    total_length = int(total_length)
    minimum = min_ruler_length(task, params)
    if total_length < minimum:
        raise ValueError(
            f"ruler total_length {total_length} is too short for task {task!r}; the minimum is "
            f"{minimum} tokens."
        )
    tok = _TOKENIZER
    sep = tok.encode(SEPARATOR)
    prompt = tok.encode(layout.head + SEPARATOR)
    needles: list[tuple[int, int]] = []
    distractors: list[tuple[int, int]] = []
    if layout.words is not None:
        fixed = _fixed_length(layout)
        n_chars = total_length - fixed - ruler_task(task).answer_length(params)
        text, expected = layout.words(n_chars, rng)
        prompt += tok.encode(text)
    else:
        expected = layout.expected
        n_filler = total_length - _fixed_length(layout) - len(",".join(expected))
        if filler == "standard":
            stream = tok.encode(standard_filler_text(n_filler))
        else:
            if filler_source is None:
                raise ValueError('ruler filler "corpus" needs a filler_source (text or token ids).')
            stream = corpus_filler(source_ids(filler_source), n_filler, rng)
        cut = 0
        for at, text, holds_answer in sorted(layout.statements, key=lambda s: s[0]):
            stop = round(at * n_filler)
            prompt += stream[cut:stop] + sep
            span = (len(prompt), len(prompt) + len(text))
            (needles if holds_answer else distractors).append(span)
            prompt += tok.encode(text) + sep
            cut = stop
        prompt += stream[cut:]
    prompt += sep + tok.encode(layout.question)
    answer = tok.encode(",".join(expected))
    assert len(prompt) + len(answer) == total_length, (task, len(prompt) + len(answer))
    return RulerExample(
        task=task,
        prompt_ids=prompt,
        answer_ids=answer,
        expected=tuple(expected),
        depth=depth if ruler_task(task).depth else None,
        trial=int(trial),
        params=task_params(task, params),
        needles=tuple(needles),
        distractors=tuple(distractors),
        filler=filler,
    )


def _cell_rng(seed: int, task: str, length: int, depth: float, trial: int) -> random.Random:
    """An rng of (seed, task, length, depth, trial) only (stable across processes)."""
    return random.Random(
        f"lenbench-ruler:{int(seed)}:{task}:{int(length)}:{float(depth)!r}:{int(trial)}"
    )


def ruler_grid(
    tasks: Iterable[str],
    lengths: Iterable[int],
    depths: Iterable[float],
    trials: int,
    seed: int,
    params: RulerParams | None = None,
    filler: str = "standard",
    filler_source: object = None,
) -> list[RulerExample]:
    """Examples for every (task, length, depth, trial): depths apply to the depth tasks;
    the other tasks get ``trials x len(depths)`` examples at random placements, so every task
    has as many trials per length. Each example depends only on (seed, task, length, depth,
    trial)."""
    params = params or RulerParams()
    depths = [check_depth(d) for d in depths]
    if isinstance(trials, bool) or int(trials) < 1:
        raise ValueError(f"ruler trials {trials!r} is invalid; allowed values are integers >= 1.")
    out = []
    for task in tasks:
        for length in lengths:
            for depth, trial in _cells(task, depths, trials):
                rng = _cell_rng(seed, task, length, depth, trial)
                out.append(
                    make_ruler_example(
                        task,
                        length,
                        depth,
                        rng=rng,
                        params=params,
                        filler=filler,
                        filler_source=filler_source,
                        trial=trial,
                    )  # fmt: skip
                )
    return out


def ruler_depths(count: int) -> list[float]:
    """``count`` depths of the asked needle, evenly spaced in [0, 1] (one: the middle)."""
    return [0.5] if int(count) == 1 else np.linspace(0.0, 1.0, int(count)).round(6).tolist()


def _cells(task: str, depths: list[float], trials: int) -> list[tuple[float, int]]:
    if ruler_task(task).depth:
        return [(d, t) for d in depths for t in range(int(trials))]
    return [(0.5, t) for t in range(int(trials) * len(depths))]


def fit_ruler_example(
    task: str,
    total_length: int,
    depth: float,
    trial: int,
    seed: int,
    tokenizer,
    params: RulerParams | None = None,
    filler: str = "standard",
    filler_source: object = None,
) -> RulerExample:
    """The example of cell (seed, task, ``total_length``, depth, trial) in a pretrained model's
    tokens (a transformers ``tokenizer``): built at a byte length n, its text tokenized (the
    prompt with the tokenizer's special tokens, e.g. BOS, the answer without), n searched so that
    prompt + answer has exactly ``total_length`` tokens; where no n hits it (a merge can skip a
    count), the largest count below, and its ``length`` says so. Raises ValueError when even the
    shortest example is longer."""
    params = params or RulerParams()

    def build(n: int) -> RulerExample:
        rng = _cell_rng(seed, task, total_length, depth, trial)
        e = make_ruler_example(
            task, n, depth, rng=rng, params=params, filler=filler,
            filler_source=filler_source, trial=trial,
        )  # fmt: skip
        prompt = bytes(e.prompt_ids).decode("utf-8", errors="replace")
        return replace(
            e,
            prompt_ids=list(tokenizer.encode(prompt, add_special_tokens=True)),
            answer_ids=list(tokenizer.encode(e.answer_text, add_special_tokens=False)),
            needles=(),
            distractors=(),
        )

    cache: dict[int, RulerExample] = {}

    def count(n: int) -> int:
        if n not in cache:
            cache[n] = build(n)
        return cache[n].length

    low, target = min_ruler_length(task, params), int(total_length)
    if count(low) > target:
        raise ValueError(
            f"ruler total_length {target} is too short for task {task!r} in this tokenizer; the "
            f"minimum is {count(low)} tokens."
        )
    return cache[fit_filler_length(count, target, low)]


def ruler_examples(
    task: str,
    length: int,
    depths: Iterable[float],
    trials: int,
    seed: int,
    params: RulerParams | None = None,
    filler: str = "standard",
    filler_source: object = None,
    tokenizer=None,
) -> list[RulerExample]:
    """The grid of one task at one length: :func:`ruler_grid` on byte tokens, or with a
    transformers ``tokenizer`` every cell fitted to ``length`` of its tokens
    (:func:`fit_ruler_example`)."""
    if tokenizer is None:
        return ruler_grid([task], [length], depths, trials, seed, params, filler, filler_source)
    depths = [check_depth(d) for d in depths]
    return [
        fit_ruler_example(task, length, d, t, seed, tokenizer, params, filler, filler_source)
        for d, t in _cells(task, depths, trials)
    ]


# --------------------------------------------------------------------------- scoring


def match_score(generation: str, expected: Iterable[str]) -> float:
    """RULER's ``string_match_all``: the fraction of expected strings found in the generation
    (case-insensitive)."""
    expected = list(expected)
    text = generation.lower()
    return sum(e.lower() in text for e in expected) / len(expected)


def exact_match(generation: str, answer: str) -> bool:
    """The generation starts with the whole answer and the answer ends there: the next
    character, if any, is neither a letter nor a digit."""
    if not generation.startswith(answer):
        return False
    rest = generation[len(answer) :]
    return not rest[:1].isalnum()


import_package(
    "bench.tasks.ruler_tasks"
)  # the tasks: every module of that folder (models.discovery)
