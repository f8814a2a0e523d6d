"""Key-value retrieval from a JSON-like list (``kv_middle``; Liu et al. 2023, "Lost in the
Middle"): the list of ``"key": "value"`` pairs is the haystack, and the asked pair sits at the
depth asked for, so accuracy by depth shows whether the middle of the context is read worse than
its ends (the U-curve). Keys are 4 lowercase letters, values 5-digit numbers, both distinct. Not in
``eval.ruler.tasks``' default."""

from __future__ import annotations

import random

from bench.tasks.ruler_registry import (
    VALUE_DIGITS,
    Layout,
    RulerParams,
    distinct,
    random_key,
    random_value,
    register_ruler_task,
)

TEXT = {
    "head_kv": "Read the JSON.",
    "pair": '"{key}": "{value}"',
    "ask_kv": 'value of "{key}":',
}
PAIR = len(TEXT["pair"].format(key="abcd", value="1" * VALUE_DIGITS)) + 2  # with ", "


@register_ruler_task(
    "kv_middle", text=TEXT, depth=True, answer_length=lambda _: VALUE_DIGITS, default=False
)
def kv_middle(params: RulerParams, depth: float, rng: random.Random) -> Layout:
    asked = random_key(rng)

    def pairs(n_chars: int, rng: random.Random) -> tuple[str, list[str]]:
        n = (n_chars - 2 + 2) // PAIR  # "{" + pairs joined by ", " + "}"
        if n < 1:
            raise ValueError("too short")
        keys = [asked] + [k for k in distinct(rng, n, random_key) if k != asked][: n - 1]
        while len(keys) < n:  # the draw hit the asked key: one more
            key = random_key(rng)
            if key not in keys:
                keys.append(key)
        values = distinct(rng, n, random_value)
        order = keys[1:]
        order.insert(round(depth * (n - 1)), asked)
        value_of = dict(zip(keys, values, strict=True))
        body = ", ".join(TEXT["pair"].format(key=k, value=value_of[k]) for k in order)
        text = "{" + body + "}"
        return text + " " * (n_chars - len(text)), [value_of[asked]]

    return Layout(TEXT["head_kv"], TEXT["ask_kv"].format(key=asked), [], words=pairs)
