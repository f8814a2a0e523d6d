"""Reasoning over facts spread through the context, after bAbI (Weston et al. 2015; BABILong,
Kuratov et al. 2024, at long lengths): people move between places and take objects; the
statements sit in the haystack in text order, and the answer combines them.

``qa1`` (one supporting fact): where is a person, from their last move. ``qa2`` (two): where is
an object, from who took it and that person's last move. ``qa3`` (three): where was an object
before its current place, from the taking and the holder's last two moves (the holder takes it
before moving, and its last place is new to it). Answers are unambiguous by construction (tests
generate thousands and solve them from the text alone). Not in ``eval.ruler.tasks``' default.
"""

from __future__ import annotations

import random

from bench.tasks.ruler_registry import Layout, RulerParams, register_ruler_task

# one length each (names 3 letters, places 4, objects 3): every draw has the same fixed text
NAMES = ("Ann", "Bob", "Cal", "Dee", "Eli", "Fay", "Gus", "Ida", "Jon", "Kim")
PLACES = ("hall", "yard", "barn", "shed", "pool", "deck", "loft", "cave", "lawn", "dock")
OBJECTS = ("cup", "key", "hat", "pen", "box", "map", "jar", "mug")
#: compact, so that the filler is at least half of a 256-token window at the default sizes
TEXT = {
    "head_qa": "Follow people.",
    "move": "{name} went to {place}.",
    "take": "{name} took {thing}.",
    "ask_person": "where is {name}:",
    "ask_thing": "where is {thing}:",
    "ask_before": "where was {thing} before {place}:",
}
FIELDS = ("people", "moves")


def _check(params: RulerParams, task: str, least_moves: int) -> None:
    if params.people > len(NAMES) or params.objects > len(OBJECTS):
        raise ValueError(
            f"ruler params for {task}: people {params.people} and objects {params.objects} are "
            f"too many; allowed: people <= {len(NAMES)}, objects <= {len(OBJECTS)}."
        )
    if params.moves < least_moves:
        raise ValueError(
            f"ruler params.moves {params.moves} is too few for {task}; allowed: >= {least_moves}."
        )


def _moves(
    rng: random.Random, people: list[str], n: int, must: str, least: int
) -> list[tuple[str, str]]:
    """``n`` moves (person, place), ``must`` moving at least ``least`` times, nobody moving to
    where they already are."""
    who = [must] * least + [rng.choice(people) for _ in range(n - least)]
    rng.shuffle(who)
    where: dict[str, str] = {}
    out = []
    for name in who:
        place = rng.choice([p for p in PLACES if p != where.get(name)])
        where[name] = place
        out.append((name, place))
    return out


def _placed(rng: random.Random, texts: list[str]) -> list[tuple[float, str, bool]]:
    """Statements at random depths, kept in their order (the order is part of the story)."""
    ats = sorted(rng.random() for _ in texts)
    return [(at, text, True) for at, text in zip(ats, texts, strict=True)]


def _move_text(name: str, place: str) -> str:
    return TEXT["move"].format(name=name, place=place)


@register_ruler_task("qa1", text=TEXT, fields=FIELDS, default=False)
def qa1(params: RulerParams, depth: float, rng: random.Random) -> Layout:
    _check(params, "qa1", 1)
    people = rng.sample(NAMES, params.people)
    moves = _moves(rng, people, params.moves, people[0], 1)
    answer = [place for name, place in moves if name == people[0]][-1]
    statements = _placed(rng, [_move_text(*m) for m in moves])
    ask = TEXT["ask_person"].format(name=people[0])
    return Layout(TEXT["head_qa"], ask, [answer], statements)


def _taken(params: RulerParams, rng: random.Random, least: int):
    """(objects, holders, moves, statement texts): each object taken once; the asked object's
    holder moves at least ``least`` times, all after the taking."""
    people = rng.sample(NAMES, params.people)
    things = rng.sample(OBJECTS, params.objects)
    holders = [rng.choice(people) for _ in things]
    moves = _moves(rng, people, params.moves, holders[0], least)
    first = next(i for i, (name, _) in enumerate(moves) if name == holders[0])
    texts = [_move_text(*m) for m in moves]
    takes = [TEXT["take"].format(name=h, thing=t) for h, t in zip(holders, things, strict=True)]
    texts.insert(first, takes[0])  # the asked object is taken before its holder's first move
    for take in takes[1:]:
        texts.insert(rng.randint(0, len(texts)), take)
    return things, holders, moves, texts


@register_ruler_task("qa2", text=TEXT, fields=(*FIELDS, "objects"), default=False)
def qa2(params: RulerParams, depth: float, rng: random.Random) -> Layout:
    _check(params, "qa2", 1)
    things, holders, moves, texts = _taken(params, rng, 1)
    answer = [place for name, place in moves if name == holders[0]][-1]
    ask = TEXT["ask_thing"].format(thing=things[0])
    return Layout(TEXT["head_qa"], ask, [answer], _placed(rng, texts))


@register_ruler_task("qa3", text=TEXT, fields=(*FIELDS, "objects"), default=False)
def qa3(params: RulerParams, depth: float, rng: random.Random) -> Layout:
    _check(params, "qa3", 2)
    while True:  # the holder's last place must be new to it, or "before the X" is ambiguous
        things, holders, moves, texts = _taken(params, rng, 2)
        trail = [place for name, place in moves if name == holders[0]]
        if trail[-1] not in trail[:-1]:
            break
    ask = TEXT["ask_before"].format(thing=things[0], place=trail[-1])
    return Layout(TEXT["head_qa"], ask, [trail[-2]], _placed(rng, texts))
