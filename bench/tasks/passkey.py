"""Passkey retrieval examples (Landmark attention template, reused by PI and YaRN).

Layout, joined by newlines exactly as Landmark's ``generate_prompt`` does::

    TASK \\n PREFIX_FILLER \\n NEEDLE \\n SUFFIX_FILLER \\n QUESTION | ANSWER

with NEEDLE = "The pass key is K. Remember it. K is the pass key.", QUESTION =
"What is the pass key? The pass key is" and ANSWER = " K" (leading space; the
answer ids are kept apart from the prompt so that evaluation can feed the prompt
and compare the continuation, and training can restrict the loss to the answer).

The filler is a character prefix of ``" ".join([STANDARD_FILLER] * n)``, as in
Landmark: whole sentences, then a partial sentence to reach the exact length.
Prefix and suffix filler both start at the beginning of that stream (Landmark
does the same), so the haystack carries no positional hint other than the needle.

Lengths are counted in byte tokens (``bench.data.tokenizer.ByteTokenizer``); every
example has exactly ``total_length`` tokens, so "length" in a results table is
the true context the model read.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from bench.data.tokenizer import ByteTokenizer
from bench.tasks.text import (
    STANDARD_FILLER,
    TaskExample,
    check_depth,
    corpus_filler,
    fit_filler_length,
    source_ids,
    standard_filler_text,
)

__all__ = [
    "ANSWER_TEMPLATE",
    "DEFAULT_TEMPLATE",
    "PASSKEY_TEMPLATES",
    "KEY_MAX",
    "KEY_MIN",
    "NEEDLE_TEMPLATE",
    "PASSKEY_FILLERS",
    "QUESTION",
    "STANDARD_FILLER",
    "TASK_DESCRIPTION",
    "PasskeyExample",
    "PasskeyTemplate",
    "TaskExample",
    "answer_matches",
    "fit_filler_length",
    "fit_passkey_example",
    "is_digit_token",
    "passkey_template",
    "make_passkey_example",
    "min_passkey_length",
    "parse_passkey",
    "passkey_correct",
    "passkey_grid",
    "random_key",
    "standard_filler_text",
]

SEPARATOR = "\n"
KEY_MIN = 1
KEY_MAX = 50000
PASSKEY_FILLERS = ("standard", "corpus")


@dataclass(frozen=True)
class PasskeyTemplate:
    """The fixed text of a passkey example: task line, needle, question and answer (``{key}``)."""

    name: str
    task: str
    needle: str
    question: str
    answer: str = " {key}"
    # what follows the answer in training examples, so that a model learns where the key ends
    # (the verdict requires a non-digit after the key)
    end: str = "."


#: ``landmark`` is Landmark attention's text (also used by PI and YaRN); it needs 253 tokens, so
#: at short training lengths the haystack is a few tokens and "depth" means little. ``short``
#: keeps the structure (task, filler, needle, filler, question) in 73 tokens (5-digit key). Its
#: question ends in the needle's own words ("pass key:") and the key follows the colon with no
#: space, so the token before the first digit occurs only in the needle and the question (never
#: in the filler): retrieval is a content match, which the retrieval arm's 3-layer byte-level
#: model learns (with a space there, the token before the key is one the filler has at every
#: word; reports/reference/README.md, "The retrieval arm's base budget").
PASSKEY_TEMPLATES = {
    "landmark": PasskeyTemplate(
        name="landmark",
        task=(
            "There is an important info hidden inside a lot of irrelevant text. "
            "Find it and memorize them. I will quiz you about the important information there."
        ),
        needle="The pass key is {key}. Remember it. {key} is the pass key.",
        question="What is the pass key? The pass key is",
    ),
    "short": PasskeyTemplate(
        name="short",
        task="Find the pass key.",
        needle="pass key:{key}.",
        question="What is the pass key? pass key:",
        answer="{key}",
    ),
}
DEFAULT_TEMPLATE = "landmark"

# The Landmark template's parts, for callers that spell the text out.
TASK_DESCRIPTION = PASSKEY_TEMPLATES["landmark"].task
NEEDLE_TEMPLATE = PASSKEY_TEMPLATES["landmark"].needle
QUESTION = PASSKEY_TEMPLATES["landmark"].question
ANSWER_TEMPLATE = PASSKEY_TEMPLATES["landmark"].answer


def passkey_template(template: str | PasskeyTemplate = DEFAULT_TEMPLATE) -> PasskeyTemplate:
    """The template named ``template`` (or ``template`` itself); unknown names are an error."""
    if isinstance(template, PasskeyTemplate):
        return template
    if template not in PASSKEY_TEMPLATES:
        raise ValueError(
            f"passkey template {template!r} is unknown; allowed: {', '.join(PASSKEY_TEMPLATES)}."
        )
    return PASSKEY_TEMPLATES[template]


_DEFAULT_TOKENIZER = ByteTokenizer()


@dataclass(frozen=True)
class PasskeyExample(TaskExample):
    """One passkey prompt; ``len(prompt_ids) + len(answer_ids)`` is the example length.

    ``needle_start`` is the token index in ``prompt_ids`` where the needle sentence
    begins; ``depth`` is the requested fraction of the filler placed before it.
    """

    prompt_ids: list[int]
    answer_ids: list[int]
    key: int
    depth: float
    needle_start: int
    trial: int = 0
    filler: str = "standard"
    template: str = DEFAULT_TEMPLATE

    @property
    def answer_text(self) -> str:
        """The answer as text (e.g. " 12345"), for verdicts on decoded text."""
        return passkey_template(self.template).answer.format(key=self.key)


def random_key(rng: random.Random) -> int:
    """A key uniform in KEY_MIN..KEY_MAX (inclusive), as in Landmark."""
    return rng.randint(KEY_MIN, KEY_MAX)


def _fixed_parts(key: int, template: PasskeyTemplate) -> tuple[str, str, str, str]:
    """(text before the prefix filler, needle line, question, answer) for ``key``."""
    return (
        template.task + SEPARATOR,
        template.needle.format(key=key),
        template.question,
        template.answer.format(key=key),
    )


def min_passkey_length(
    key: int = KEY_MAX, template: str | PasskeyTemplate = DEFAULT_TEMPLATE
) -> int:
    """Smallest ``total_length`` that fits the template with no filler.

    Depends on the number of digits of the key; the default (the largest key) is
    the bound that holds for every key, so callers that draw random keys should
    check against it.
    """
    head, needle, question, answer = _fixed_parts(key, passkey_template(template))
    # head already ends in a separator; then prefix "\n" needle "\n" suffix "\n" question answer.
    return len((head + SEPARATOR + needle + SEPARATOR + SEPARATOR + question + answer).encode())


def _check_key(key: object) -> int:
    if isinstance(key, bool) or not isinstance(key, (int, np.integer)) or int(key) < 0:
        raise ValueError(
            f"passkey key {key!r} is invalid; allowed keys are non-negative integers "
            f"(random keys are drawn from {KEY_MIN}..{KEY_MAX})."
        )
    return int(key)


def make_passkey_example(
    total_length: int,
    depth: float,
    key: int | None,
    tokenizer: ByteTokenizer | None = None,
    filler: str = "standard",
    filler_source: object = None,
    rng: random.Random | None = None,
    trial: int = 0,
    template: str | PasskeyTemplate = DEFAULT_TEMPLATE,
) -> PasskeyExample:
    """A passkey example of exactly ``total_length`` byte tokens (prompt + answer).

    ``depth`` in [0, 1] is the fraction of filler tokens placed before the needle
    (0: needle right after the task sentence, 1: right before the question).
    ``key=None`` draws a key with ``rng`` (uniform in 1..50000).
    ``filler="corpus"`` takes contiguous ids from ``filler_source`` (str, bytes or
    token ids) starting at an ``rng``-chosen offset (offset 0 without ``rng``).
    ``template`` names the text around the filler (:data:`PASSKEY_TEMPLATES`).
    Raises ValueError if ``total_length`` is below ``min_passkey_length(key, template)``.
    """
    template = passkey_template(template)
    tok = tokenizer if tokenizer is not None else _DEFAULT_TOKENIZER
    depth = check_depth(depth)
    if filler not in PASSKEY_FILLERS:
        raise ValueError(
            f"passkey filler {filler!r} is unknown; allowed fillers are {', '.join(PASSKEY_FILLERS)}."
        )
    if key is None:
        if rng is None:
            raise ValueError("passkey key is None and no rng was given; pass a key or an rng.")
        key = random_key(rng)
    key = _check_key(key)
    total_length = int(total_length)
    minimum = min_passkey_length(key, template)
    if total_length < minimum:
        raise ValueError(
            f"passkey total_length {total_length} is too short for the {template.name!r} template "
            f"with key {key}; the minimum is {minimum} tokens (any key fits from "
            f"{min_passkey_length(template=template)})."
        )

    head, needle, question, answer_text = _fixed_parts(key, template)
    n_filler = total_length - minimum
    # round(), not int(): depths like 0.29 must not lose a token to float error.
    n_prefix = round(depth * n_filler)
    n_suffix = n_filler - n_prefix

    if filler == "standard":
        prefix = tok.encode(standard_filler_text(n_prefix))
        suffix = tok.encode(standard_filler_text(n_suffix))
    else:
        if filler_source is None:
            raise ValueError('passkey filler "corpus" needs a filler_source (text or token ids).')
        stream = corpus_filler(source_ids(filler_source), n_filler, rng)
        prefix, suffix = stream[:n_prefix], stream[n_prefix:]

    sep = tok.encode(SEPARATOR)
    head_ids = tok.encode(head)
    needle_start = len(head_ids) + len(prefix) + len(sep)
    prompt = (
        head_ids + prefix + sep + tok.encode(needle) + sep + suffix + sep + tok.encode(question)
    )
    answer = tok.encode(answer_text)
    if len(prompt) + len(answer) != total_length:
        # Only a non-byte tokenizer can get here: filler lengths are counted in bytes.
        raise ValueError(
            f"passkey example has {len(prompt) + len(answer)} tokens instead of {total_length}; "
            "the tokenizer must be byte-level (one token per byte)."
        )
    return PasskeyExample(
        prompt_ids=prompt,
        answer_ids=answer,
        key=key,
        depth=depth,
        needle_start=needle_start,
        trial=int(trial),
        filler=filler,
        template=template.name,
    )


def _cell_rng(
    seed: int, length: int, depth: float, trial: int, purpose: str = "eval"
) -> random.Random:
    """An rng that depends only on (seed, length, depth, trial) and the examples' ``purpose``
    ("eval": the evaluation's; another name gives other examples, e.g. the training's retrieval
    check, so that no check example is an evaluation example).

    A string seed goes through SHA-512 inside ``random.Random``, so it is stable
    across processes (unlike ``hash()``), and adding cells to a grid never changes
    the examples of the other cells.
    """
    prefix = "lenbench-passkey" if purpose == "eval" else f"lenbench-passkey-{purpose}"
    return random.Random(f"{prefix}:{int(seed)}:{int(length)}:{float(depth)!r}:{int(trial)}")


def passkey_grid(
    lengths: Iterable[int],
    depths: Iterable[float],
    trials: int,
    seed: int,
    tokenizer: object = None,
    filler: str = "standard",
    filler_source: object = None,
    template: str | PasskeyTemplate = DEFAULT_TEMPLATE,
    purpose: str = "eval",
) -> list[PasskeyExample]:
    """Examples for every (length, depth, trial), ordered length-major, then depth, then trial.

    Each example (key, corpus offset) is a function of (seed, length, depth, trial) and
    ``purpose`` only ("eval": the evaluation's examples; any other name draws others). With a
    transformers ``tokenizer`` (not a ByteTokenizer) the examples are built as text and fitted to
    each length in its tokens (:func:`fit_passkey_example`); ``filler_source`` is then text.
    """
    lengths = [int(x) for x in lengths]
    depths = [check_depth(d) for d in depths]
    if isinstance(trials, bool) or int(trials) < 1:
        raise ValueError(f"passkey trials {trials!r} is invalid; allowed values are integers >= 1.")
    if not lengths or not depths:
        raise ValueError("passkey grid needs at least one length and one depth.")
    examples = []
    subword = tokenizer is not None and not isinstance(tokenizer, ByteTokenizer)
    for length in lengths:
        for depth in depths:
            for trial in range(int(trials)):
                rng = _cell_rng(seed, length, depth, trial, purpose)
                key = random_key(rng)
                if subword:  # a transformers tokenizer: built as text (fit_passkey_example)
                    text = str(filler_source or "")
                    offset = rng.randrange(len(text)) if filler == "corpus" and text else 0
                    examples.append(
                        fit_passkey_example(
                            length, depth, key, tokenizer, filler, text, offset, trial, template
                        )
                    )
                    continue
                examples.append(
                    make_passkey_example(
                        length,
                        depth,
                        key,
                        tokenizer,
                        filler,
                        filler_source,
                        rng,
                        trial=trial,
                        template=template,
                    )
                )
    return examples


_LEADING_NUMBER = re.compile(r"\s*(\d+)")


def parse_passkey(text: str) -> int | None:
    """The integer at the start of a generated continuation (leading spaces allowed), or None."""
    match = _LEADING_NUMBER.match(text)
    return int(match.group(1)) if match else None


def passkey_correct(
    generated_ids: Sequence[int], key: int, tokenizer: ByteTokenizer | None = None
) -> bool:
    """Exact match of the whole key: the continuation must start with exactly its digits.

    "123456" for key 12345 is wrong (extra digit); text after the number is ignored.
    """
    tok = tokenizer if tokenizer is not None else _DEFAULT_TOKENIZER
    return parse_passkey(tok.decode(generated_ids)) == int(key)


def answer_matches(generation: str, answer: str) -> bool:
    """The generation starts with ``answer`` and the key ends there: the next character, if
    any, is not a digit (so " 12345" does not pass for the answer " 1234")."""
    if not generation.startswith(answer):
        return False
    rest = generation[len(answer) :]
    return not rest[:1].isdigit()


def is_digit_token(token_id: int, tokenizer: ByteTokenizer | None = None) -> bool:
    """Whether a byte token is an ASCII digit (the verdict's "key continues" test)."""
    tok = tokenizer if tokenizer is not None else _DEFAULT_TOKENIZER
    return tok.decode([int(token_id)]).isdigit()


def fit_passkey_example(
    total_length: int,
    depth: float,
    key: int,
    tokenizer,
    filler: str = "standard",
    filler_text: str = "",
    offset: int = 0,
    trial: int = 0,
    template: str | PasskeyTemplate = DEFAULT_TEMPLATE,
) -> PasskeyExample:
    """A passkey example built as text and tokenized with a subword ``tokenizer`` (transformers).

    The prompt text is laid out as in :func:`make_passkey_example`, with ``n`` filler characters
    of which ``round(depth * n)`` go before the needle (standard filler, or contiguous
    ``filler_text`` from character ``offset``, wrapping); it is tokenized whole, with the tokenizer's special
    tokens (e.g. BOS), and the answer without. ``n`` is searched so that prompt + answer has
    exactly ``total_length`` tokens; where no ``n`` hits it (a merge can skip a count), the example
    has the largest count below, and its ``length`` says so. Raises ValueError when even ``n = 0``
    is longer than ``total_length``.
    """
    template = passkey_template(template)
    head, needle, question, answer_text = _fixed_parts(_check_key(key), template)
    answer = list(tokenizer.encode(answer_text, add_special_tokens=False))
    if filler == "corpus" and not filler_text:
        raise ValueError('passkey filler "corpus" needs a filler_text.')

    def parts(n: int) -> tuple[str, str]:
        n_prefix = round(depth * n)
        if filler == "standard":  # both start at the stream's beginning, as in Landmark
            return standard_filler_text(n_prefix), standard_filler_text(n - n_prefix)
        start = offset % len(filler_text)
        stream = (filler_text * ((start + n) // len(filler_text) + 1))[start : start + n]
        return stream[:n_prefix], stream[n_prefix:]

    def build(n: int) -> tuple[list[int], str]:
        prefix, suffix = parts(n)
        before = head + prefix + SEPARATOR
        text = before + needle + SEPARATOR + suffix + SEPARATOR + question
        return list(tokenizer.encode(text, add_special_tokens=True)), before

    target = int(total_length)
    cache: dict[int, int] = {}

    def count(n: int) -> int:
        if n not in cache:
            cache[n] = len(build(n)[0]) + len(answer)
        return cache[n]

    if count(0) > target:
        raise ValueError(
            f"passkey total_length {target} is too short for the {template.name!r} template with "
            f"key {key} in this tokenizer; the minimum is {count(0)} tokens."
        )
    n = fit_filler_length(count, target)
    prompt, before = build(n)
    return PasskeyExample(
        prompt_ids=prompt,
        answer_ids=answer,
        key=int(key),
        depth=check_depth(depth),
        needle_start=len(tokenizer.encode(before, add_special_tokens=True)),
        trial=int(trial),
        filler=filler,
        template=template.name,
    )
