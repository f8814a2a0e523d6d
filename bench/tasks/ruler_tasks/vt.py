"""Variable tracking (``vt``): chains of assignments ``XXXXX=12345.`` ``YYYYY=XXXXX.``; asked for
every variable bound to a value, in chain order (the other chains are distractors)."""

from __future__ import annotations

import random

from bench.tasks.ruler_registry import (
    Layout,
    RulerParams,
    distinct,
    random_value,
    random_var,
    register_ruler_task,
)

TEXT = {
    "head_vt": "Track the variables.",
    "vt_value": "{var}={value}.",
    "vt_hop": "{var}={source}.",
    "vt_ask": "vars of {value}:",
}


@register_ruler_task("vt", text=TEXT, fields=("chains", "hops"))
def vt(params: RulerParams, depth: float, rng: random.Random) -> Layout:
    values = distinct(rng, params.chains, random_value)
    names = distinct(rng, params.chains * (params.hops + 1), random_var)
    statements = []
    for c, value in enumerate(values):
        chain = names[c * (params.hops + 1) : (c + 1) * (params.hops + 1)]
        ats = sorted(rng.random() for _ in chain)  # each chain's assignments in order
        texts = [TEXT["vt_value"].format(var=chain[0], value=value)]
        texts += [
            TEXT["vt_hop"].format(var=b, source=a) for a, b in zip(chain, chain[1:], strict=False)
        ]
        statements += [(at, text, c == 0) for at, text in zip(ats, texts, strict=True)]
    asked = names[: params.hops + 1]
    return Layout(TEXT["head_vt"], TEXT["vt_ask"].format(value=values[0]), asked, statements)
