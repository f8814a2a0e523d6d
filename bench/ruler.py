"""RULER-style synthetic tasks (Hsieh et al. 2024), generated offline at an exact length.

The task definitions follow RULER's synthetic generators (needle-in-a-haystack variants,
variable tracking, common and frequent word extraction); the text is lenbench's own, compact
enough for small byte-level models (like the passkey ``short`` template: the question ends in
the needle's own words, so that retrieval is a content match) and read the same way by
pretrained models. The fixed text is short so that the filler is at least half of a 256-token
window for every task at its default parameters (RULER's protocol: the haystack is most of the
window); :data:`TEMPLATES` holds all of it, and a checkpoint trained on the tasks keys on it. Every example is ``prompt | answer`` with the answer kept apart, so that
evaluation can teacher-force or generate it and training can restrict the loss to it.

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
import math
import random
import string
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from bench.passkey import (
    SEPARATOR,
    TaskExample,
    _check_depth,
    _corpus_filler,
    _source_ids,
    fit_filler_length,
    standard_filler_text,
)
from bench.tokenizer import ByteTokenizer

__all__ = [
    "RULER_END",
    "RULER_FILLERS",
    "RULER_TASKS",
    "TASK_FIELDS",
    "TEMPLATES",
    "RulerExample",
    "RulerParams",
    "exact_match",
    "fit_ruler_example",
    "fixed_ruler_length",
    "make_ruler_example",
    "match_score",
    "min_ruler_length",
    "ruler_depths",
    "ruler_examples",
    "ruler_grid",
    "task_params",
]

RULER_TASKS = (
    "niah_single",
    "niah_multikey",
    "niah_multivalue",
    "niah_multiquery",
    "vt",
    "cwe",
    "fwe",
)
RULER_FILLERS = ("standard", "corpus")
#: tasks whose rows are per depth as well: the queried needle sits at the depth asked for
DEPTH_TASKS = ("niah_single", "niah_multikey")
VALUE_DIGITS = 5
KEY_LETTERS = 4
VAR_LETTERS = 5
WORD = 4  # letters of a cwe/fwe list word
#: what follows the answer in training examples, so that a model learns where the answer ends
RULER_END = "."
_TOKENIZER = ByteTokenizer()


@dataclass(frozen=True)
class RulerParams:
    """Task parameters (config values ``eval.ruler.params``); each task reads :data:`TASK_FIELDS`."""

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

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            low = 0 if f.name == "chains" else 1
            if f.name == "alpha":
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                    raise ValueError(
                        f"ruler params.alpha {value!r} is invalid; allowed: a number > 0."
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


#: The parameters each task reads (its rows' ``task_params``).
TASK_FIELDS: dict[str, tuple[str, ...]] = {
    "niah_single": (),
    "niah_multikey": ("keys",),
    "niah_multivalue": ("values",),
    "niah_multiquery": ("queries",),
    "vt": ("chains", "hops"),
    "cwe": ("common_words", "common_freq", "rare_freq"),
    "fwe": ("frequent_words", "alpha"),
}


def task_params(task: str, params: RulerParams) -> dict[str, Any]:
    """The parameters ``task`` reads, by name."""
    return {name: getattr(params, name) for name in TASK_FIELDS[_check_task(task)]}


def _check_task(task: str) -> str:
    if task not in RULER_TASKS:
        raise ValueError(f"ruler task {task!r} is unknown; allowed: {', '.join(RULER_TASKS)}.")
    return task


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


# --------------------------------------------------------------------------- random parts


def _letters(rng: random.Random, n: int, alphabet: str) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _distinct(rng: random.Random, n: int, draw) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        item = draw(rng)
        if item not in out:
            out.append(item)
    return out


def _key(rng: random.Random) -> str:
    return _letters(rng, KEY_LETTERS, string.ascii_lowercase)


def _value(rng: random.Random) -> str:
    return str(rng.randint(10 ** (VALUE_DIGITS - 1), 10**VALUE_DIGITS - 1))


def _var(rng: random.Random) -> str:
    return _letters(rng, VAR_LETTERS, string.ascii_uppercase)


def _word(rng: random.Random) -> str:
    return _letters(rng, WORD, string.ascii_lowercase)


# --------------------------------------------------------------------------- layouts
# A layout is the example as text parts: the head, statements to place in the haystack (each
# with the fraction of the haystack before it and whether it holds the answer), the question and
# the expected strings. The haystack is filler (needle tasks, vt) or a word list (cwe, fwe).


@dataclass
class _Layout:
    head: str
    question: str
    expected: list[str]
    statements: list[tuple[float, str, bool]] = field(default_factory=list)  # (at, text, answer)
    words: Any = None  # cwe/fwe: words(n_chars, rng) -> the list text of exactly n_chars


#: Every piece of task text (``str.format`` fields in braces). A model trained on the tasks has
#: these in its checkpoint key (``bench.cache.weights_config``): editing one retrains it.
TEMPLATES = {
    "head_niah": "Remember the values.",
    "head_vt": "Track the variables.",
    "head_cwe": "Find the most common words.",
    "head_fwe": "Find the most frequent words.",
    "needle": "{key}:{value}.",
    "ask_one": "value of {key}:",  # ends in the needle's own words: a content match
    "ask_all": "values of {keys}:",  # multi-value (one key) and multi-query (every key)
    "vt_value": "{var}={value}.",
    "vt_hop": "{var}={source}.",
    "vt_ask": "vars of {value}:",
    "cwe_ask": "What are the {n} most common words? words:",
    "fwe_ask": "What are the {n} most frequent words? words:",
}

HEADS = {
    "niah_single": TEMPLATES["head_niah"],
    "niah_multikey": TEMPLATES["head_niah"],
    "niah_multivalue": TEMPLATES["head_niah"],
    "niah_multiquery": TEMPLATES["head_niah"],
    "vt": TEMPLATES["head_vt"],
    "cwe": TEMPLATES["head_cwe"],
    "fwe": TEMPLATES["head_fwe"],
}


def _needle(key: str, value: str) -> str:
    return TEMPLATES["needle"].format(key=key, value=value)


def _niah_layout(task: str, params: RulerParams, depth: float, rng: random.Random) -> _Layout:
    head = HEADS[task]
    if task in ("niah_single", "niah_multikey"):
        n = 1 if task == "niah_single" else params.keys
        keys = _distinct(rng, n, _key)
        values = _distinct(rng, len(keys), _value)  # no distractor holds the answer
        statements = [(depth, _needle(keys[0], values[0]), True)]
        statements += [
            (rng.random(), _needle(k, v), False) for k, v in zip(keys[1:], values[1:], strict=True)
        ]
        return _Layout(head, TEMPLATES["ask_one"].format(key=keys[0]), [values[0]], statements)
    if task == "niah_multivalue":
        key = _key(rng)
        values = _distinct(rng, params.values, _value)
        ats = sorted(rng.random() for _ in values)  # values in text order are the answer's
        statements = [(at, _needle(key, v), True) for at, v in zip(ats, values, strict=True)]
        return _Layout(head, TEMPLATES["ask_all"].format(keys=key), values, statements)
    keys = _distinct(rng, params.queries, _key)  # niah_multiquery
    values = _distinct(rng, len(keys), _value)  # no distractor holds the answer
    statements = [(rng.random(), _needle(k, v), True) for k, v in zip(keys, values, strict=True)]
    return _Layout(head, TEMPLATES["ask_all"].format(keys=",".join(keys)), values, statements)


def _vt_layout(params: RulerParams, rng: random.Random) -> _Layout:
    values = _distinct(rng, params.chains, _value)
    names = _distinct(rng, params.chains * (params.hops + 1), _var)
    statements = []
    for c, value in enumerate(values):
        chain = names[c * (params.hops + 1) : (c + 1) * (params.hops + 1)]
        ats = sorted(rng.random() for _ in chain)  # each chain's assignments in order
        texts = [TEMPLATES["vt_value"].format(var=chain[0], value=value)]
        texts += [
            TEMPLATES["vt_hop"].format(var=b, source=a)
            for a, b in zip(chain, chain[1:], strict=False)
        ]
        statements += [(at, text, c == 0) for at, text in zip(ats, texts, strict=True)]
    asked = names[: params.hops + 1]
    return _Layout(HEADS["vt"], TEMPLATES["vt_ask"].format(value=values[0]), asked, statements)


def _list_text(words: list[str], n_chars: int) -> str:
    """``words`` joined by spaces, padded with spaces to exactly ``n_chars``."""
    text = " ".join(words)
    assert len(text) <= n_chars < len(text) + WORD + 2
    return text + " " * (n_chars - len(text))


def _list_slots(n_chars: int) -> int:
    """Words of :data:`WORD` letters that fit ``n_chars`` characters, space-separated."""
    return (n_chars + 1) // (WORD + 1)


def _cwe_layout(params: RulerParams, rng: random.Random) -> _Layout:
    common = _distinct(rng, params.common_words, _word)
    question = TEMPLATES["cwe_ask"].format(n=params.common_words)

    def words(n_chars: int, rng: random.Random) -> tuple[str, list[str]]:
        slots = _list_slots(n_chars)
        n_rare = math.ceil(max(slots - len(common) * params.common_freq, 0) / params.rare_freq)
        if n_rare < 1:
            raise ValueError("too short")
        rare = _distinct(rng, n_rare + len(common), _word)
        rare = [w for w in rare if w not in common][:n_rare]
        bag = [w for w in common for _ in range(params.common_freq)]
        bag += [w for w in rare for _ in range(params.rare_freq)][: slots - len(bag)]
        rng.shuffle(bag)
        order = sorted(common, key=bag.index)  # the answer: common words in order of first use
        return _list_text(bag, n_chars), order

    return _Layout(HEADS["cwe"], question, [], words=words)


def zipf_counts(slots: int, top: int, alpha: float) -> list[int] | None:
    """Word counts summing to ``slots`` with Zipf shape ``r ** -alpha`` whose ``top`` largest are
    strictly ordered and strictly above every other count; None when ``slots`` is too few."""
    vocab = max(top + 1, slots // 4)
    weights = np.arange(1, vocab + 1, dtype=float) ** -float(alpha)
    counts = np.maximum(np.floor(slots * weights / weights.sum()).astype(int), 1)
    while counts.sum() > slots and vocab > top + 1:  # too many words with one occurrence
        vocab -= 1
        counts = counts[:vocab]
    counts[0] += slots - counts.sum()
    ordered = all(counts[i] > counts[i + 1] for i in range(top))
    return counts.tolist() if ordered and counts.sum() == slots and counts[-1] >= 1 else None


def _fwe_layout(params: RulerParams, rng: random.Random) -> _Layout:
    question = TEMPLATES["fwe_ask"].format(n=params.frequent_words)

    def words(n_chars: int, rng: random.Random) -> tuple[str, list[str]]:
        counts = zipf_counts(_list_slots(n_chars), params.frequent_words, params.alpha)
        if counts is None:
            raise ValueError("too short")
        vocab = _distinct(rng, len(counts), _word)
        bag = [w for w, c in zip(vocab, counts, strict=True) for _ in range(c)]
        rng.shuffle(bag)
        return _list_text(bag, n_chars), vocab[: params.frequent_words]

    return _Layout(HEADS["fwe"], question, [], words=words)


def _layout(task: str, params: RulerParams, depth: float, rng: random.Random) -> _Layout:
    if task.startswith("niah"):
        return _niah_layout(task, params, depth, rng)
    if task == "vt":
        return _vt_layout(params, rng)
    return _cwe_layout(params, rng) if task == "cwe" else _fwe_layout(params, rng)


# --------------------------------------------------------------------------- assembly


def _fixed_length(layout: _Layout) -> int:
    """Bytes of everything but the haystack: head, statements with their separators, question."""
    text = layout.head + SEPARATOR + SEPARATOR + layout.question
    return len(text.encode()) + sum(len(s.encode()) + 2 for _, s, _ in layout.statements)


@functools.lru_cache(maxsize=64)
def min_ruler_length(task: str, params: RulerParams | None = None) -> int:
    """Fewest tokens an example of ``task`` fits in, for any random draw (byte tokens). Cached:
    every generated example and training row checks it, and the word lists' is a search."""
    params = params or RulerParams()
    rng = random.Random(0)
    layout = _layout(_check_task(task), params, 0.0, rng)
    fixed = _fixed_length(layout)
    if layout.words is None:
        return fixed + len(",".join(layout.expected))
    answer = {"cwe": params.common_words, "fwe": params.frequent_words}[task] * (WORD + 1) - 1
    n = 1
    while True:  # the shortest list the generator accepts (its words do not depend on the draw)
        try:
            layout.words(n, random.Random(0))
            return fixed + n + answer
        except ValueError:
            n += 1


def fixed_ruler_length(task: str, params: RulerParams | None = None) -> int:
    """Tokens of an example of ``task`` that are not haystack: head, statements, question and
    answer (byte tokens). The rest of the window is filler (needle tasks, ``vt``) or the word
    list (``cwe``, ``fwe``, which also need a list of :func:`min_ruler_length`'s size)."""
    params = params or RulerParams()
    layout = _layout(_check_task(task), params, 0.0, random.Random(0))
    if layout.words is None:
        return _fixed_length(layout) + len(",".join(layout.expected))
    return _fixed_length(layout) + _answer_count(task, params) * (WORD + 1) - 1


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

    ``depth`` places the asked needle (:data:`DEPTH_TASKS`; the other tasks place their statements
    at random). ``filler="corpus"`` takes contiguous ids of ``filler_source`` at an ``rng`` offset.
    Raises ValueError when ``total_length`` is below :func:`min_ruler_length`.
    """
    params = params or RulerParams()
    depth = _check_depth(depth)
    if filler not in RULER_FILLERS:
        raise ValueError(
            f"ruler filler {filler!r} is unknown; allowed: {', '.join(RULER_FILLERS)}."
        )
    layout = _layout(_check_task(task), params, depth, rng)
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
        n_chars = total_length - fixed - len(",".join(["x" * WORD] * _answer_count(task, params)))
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
            stream = _corpus_filler(_source_ids(filler_source), n_filler, rng)
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
        depth=depth if task in DEPTH_TASKS else None,
        trial=int(trial),
        params=task_params(task, params),
        needles=tuple(needles),
        distractors=tuple(distractors),
        filler=filler,
    )


def _answer_count(task: str, params: RulerParams) -> int:
    return params.common_words if task == "cwe" else params.frequent_words


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
    """Examples for every (task, length, depth, trial): depths apply to :data:`DEPTH_TASKS`;
    the other tasks get ``trials x len(depths)`` examples at random placements, so every task
    has as many trials per length. Each example depends only on (seed, task, length, depth,
    trial)."""
    params = params or RulerParams()
    depths = [_check_depth(d) for d in depths]
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
    if task in DEPTH_TASKS:
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
    depths = [_check_depth(d) for d in depths]
    return [
        fit_ruler_example(task, length, d, t, seed, tokenizer, params, filler, filler_source)
        for d, t in _cells(task, depths, trials)
    ]


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
