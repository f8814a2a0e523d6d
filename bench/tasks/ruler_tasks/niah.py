"""Needle-in-a-haystack: one needle (``niah_single``), distractor needles with other keys
(``niah_multikey``), every value of one key (``niah_multivalue``), several keys asked at once
(``niah_multiquery``). The question ends in the needle's own words (a content match)."""

from __future__ import annotations

import random

from bench.tasks.ruler_registry import (
    Layout,
    RulerParams,
    distinct,
    random_key,
    random_value,
    register_ruler_task,
)

#: the needle tasks' text (shared by the four)
TEXT = {
    "head_niah": "Remember the values.",
    "needle": "{key}:{value}.",
    "ask_one": "value of {key}:",  # ends in the needle's own words: a content match
    "ask_all": "values of {keys}:",  # multi-value (one key) and multi-query (every key)
}


def _needle(key: str, value: str) -> str:
    return TEXT["needle"].format(key=key, value=value)


def _one_asked(n: int, depth: float, rng: random.Random) -> Layout:
    """``n`` needles with distinct keys and values; the first, at ``depth``, is asked."""
    keys = distinct(rng, n, random_key)
    values = distinct(rng, len(keys), random_value)  # no distractor holds the answer
    statements = [(depth, _needle(keys[0], values[0]), True)]
    statements += [
        (rng.random(), _needle(k, v), False) for k, v in zip(keys[1:], values[1:], strict=True)
    ]
    ask = TEXT["ask_one"].format(key=keys[0])
    return Layout(TEXT["head_niah"], ask, [values[0]], statements)


@register_ruler_task("niah_single", text=TEXT, depth=True)
def niah_single(params: RulerParams, depth: float, rng: random.Random) -> Layout:
    return _one_asked(1, depth, rng)


@register_ruler_task("niah_multikey", text=TEXT, fields=("keys",), depth=True)
def niah_multikey(params: RulerParams, depth: float, rng: random.Random) -> Layout:
    return _one_asked(params.keys, depth, rng)


@register_ruler_task("niah_multivalue", text=TEXT, fields=("values",))
def niah_multivalue(params: RulerParams, depth: float, rng: random.Random) -> Layout:
    key = random_key(rng)
    values = distinct(rng, params.values, random_value)
    ats = sorted(rng.random() for _ in values)  # values in text order are the answer's
    statements = [(at, _needle(key, v), True) for at, v in zip(ats, values, strict=True)]
    return Layout(TEXT["head_niah"], TEXT["ask_all"].format(keys=key), values, statements)


@register_ruler_task("niah_multiquery", text=TEXT, fields=("queries",))
def niah_multiquery(params: RulerParams, depth: float, rng: random.Random) -> Layout:
    keys = distinct(rng, params.queries, random_key)
    values = distinct(rng, len(keys), random_value)  # no distractor holds the answer
    statements = [(rng.random(), _needle(k, v), True) for k, v in zip(keys, values, strict=True)]
    ask = TEXT["ask_all"].format(keys=",".join(keys))
    return Layout(TEXT["head_niah"], ask, values, statements)
