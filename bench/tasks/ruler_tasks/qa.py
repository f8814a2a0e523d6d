"""Reasoning over facts spread through the context, after bAbI (Weston et al. 2015; BABILong,
Kuratov et al. 2024, at long lengths): people move between places and take objects; the
statements sit in the haystack in text order, and the answer combines them.

``qa1`` (one supporting fact): where is a person, from their last move. ``qa2`` (two): where is
an object, from who took it and that person's last move (an object is with its holder, so where
in the story it was taken does not matter). ``qa3`` (three): where was an object before its
current place, from the taking and the holder's last two moves (taken before the last one).
Answers are unambiguous by construction (tests generate thousands and solve them from the text
alone). Not in ``eval.ruler.tasks``' default.

**No shortcut through the places alone** (issue #73 item 7). Every move statement names a place
of its own (``params.moves`` distinct places, so ``moves <= len(PLACES)``), and the statement that
decides the answer sits at a uniformly random position among the move statements: qa1 the asked
person's last move; qa2 the holder's last move, the asked object taken at a uniform point of the
story; qa3 the holder's second-to-last move, with the holder's last move at a uniform position
after it and the taking at a uniform point before that last move. The asked person's (holder's)
earlier moves come before the deciding statement, each position theirs with probability
1/people; other people's moves fill the rest (so ``people >= 2``). ``k``, the places a guess
chooses among: for qa1 and qa2 the places the move statements name (``k = moves``); for qa3 those
less the one the question names (the holder's current place, ``k = moves - 1``). Answering the
last, the first or a uniformly random one of those ``k`` places (:func:`guesses`) is right with
probability exactly ``1/k`` (tests: at most ``1/k + 0.05`` over 1000 examples; the RULER report
prints the measured rates). The former generator let "the last place mentioned" score 0.59 on
qa1 and qa2 at the defaults (3 people, 3 moves; a random mentioned place 0.37 and 0.34). Not at
chance (measured in the tests' docstring): on qa3, the place of the move statement just before
the asked place (adjacent whenever no other move falls between the holder's last two).
"""

from __future__ import annotations

import random
import re

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
QA_TASKS = ("qa1", "qa2", "qa3")


def _check(params: RulerParams, task: str, least_moves: int) -> None:
    if params.people > len(NAMES) or params.objects > len(OBJECTS):
        raise ValueError(
            f"ruler params for {task}: people {params.people} and objects {params.objects} are "
            f"too many; allowed: people <= {len(NAMES)}, objects <= {len(OBJECTS)}."
        )
    if params.people < 2:
        raise ValueError(
            f"ruler params.people {params.people} is too few for {task}; allowed: >= 2 (with one "
            f"person every move is theirs and the answer is the last place mentioned)."
        )
    if not least_moves <= params.moves <= len(PLACES):
        raise ValueError(
            f"ruler params.moves {params.moves} is invalid for {task}; allowed: {least_moves} to "
            f"{len(PLACES)} (every move names a place of its own)."
        )


def chance_places(task: str, params: RulerParams) -> int:
    """``k`` of the module docstring: the places a guess chooses among (qa1, qa2: ``moves``;
    qa3: ``moves - 1``, the question names the other)."""
    return params.moves - (task == "qa3")


def _moves(
    rng: random.Random, people: list[str], n: int, fixed: tuple[int, ...]
) -> list[tuple[str, str]]:
    """``n`` moves (person, place), each to a place of its own: ``people[0]`` moves at the
    positions ``fixed`` (increasing; its last moves) and may move before the first of them;
    only the others move after it."""
    others = people[1:]
    who = [
        people[0] if i in fixed else rng.choice(people if i < fixed[0] else others)
        for i in range(n)
    ]
    return list(zip(who, rng.sample(PLACES, n), strict=True))


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
    t = rng.randrange(params.moves)  # the asked person's last move
    moves = _moves(rng, people, params.moves, (t,))
    statements = _placed(rng, [_move_text(*m) for m in moves])
    ask = TEXT["ask_person"].format(name=people[0])
    return Layout(TEXT["head_qa"], ask, [moves[t][1]], statements)


def _taken(params: RulerParams, rng: random.Random, fixed: tuple[int, ...], upto: int):
    """(objects, moves, statement texts): each object taken once; the asked object's holder
    (``people[0]``) moves at ``fixed`` (its last moves) and perhaps before them, and takes the
    object at a uniform point before move ``upto`` (``upto = moves``: anywhere)."""
    people = rng.sample(NAMES, params.people)
    things = rng.sample(OBJECTS, params.objects)
    holders = [people[0], *(rng.choice(people) for _ in things[1:])]
    moves = _moves(rng, people, params.moves, fixed)
    texts = [_move_text(*m) for m in moves]
    takes = [TEXT["take"].format(name=h, thing=t) for h, t in zip(holders, things, strict=True)]
    texts.insert(rng.randint(0, upto), takes[0])
    for take in takes[1:]:
        texts.insert(rng.randint(0, len(texts)), take)
    return things, moves, texts


@register_ruler_task("qa2", text=TEXT, fields=(*FIELDS, "objects"), default=False)
def qa2(params: RulerParams, depth: float, rng: random.Random) -> Layout:
    _check(params, "qa2", 1)
    t = rng.randrange(params.moves)  # the holder's last move
    things, moves, texts = _taken(params, rng, (t,), params.moves)
    ask = TEXT["ask_thing"].format(thing=things[0])
    return Layout(TEXT["head_qa"], ask, [moves[t][1]], _placed(rng, texts))


@register_ruler_task("qa3", text=TEXT, fields=(*FIELDS, "objects"), default=False)
def qa3(params: RulerParams, depth: float, rng: random.Random) -> Layout:
    _check(params, "qa3", 2)
    t = rng.randrange(params.moves - 1)  # the holder's second-to-last move: the answer
    s = rng.randint(t + 1, params.moves - 1)  # its last move: the place the question names
    things, moves, texts = _taken(params, rng, (t, s), s)
    ask = TEXT["ask_before"].format(thing=things[0], place=moves[s][1])
    return Layout(TEXT["head_qa"], ask, [moves[t][1]], _placed(rng, texts))


# ------------------------------------------------------------------ guesses from the places alone

_MOVE = re.compile(r"^[A-Z][a-z]+ went to ([a-z]+)\.$", re.M)
_NAMED = re.compile(r" before ([a-z]+):$")


def candidate_places(prompt: str) -> list[str]:
    """The places the prompt's "X went to Y." statements name, in text order, less the place its
    question names (qa3's "before Y"): what a guess that reads no names chooses among."""
    body, _, question = prompt.rpartition("\n")
    named = _NAMED.findall(question)
    return [p for p in _MOVE.findall(body) if p not in named]


def guesses(prompt: str) -> dict[str, object]:
    """The heuristics' answers: ``last`` and ``first`` place mentioned (of
    :func:`candidate_places`); ``random``, the distinct candidates (a uniform guess among them is
    right with probability 1/len if the answer is one); and ``before_asked``, qa3's residual
    shortcut: the place of the move statement just before the one naming the asked place (None
    where the question names no place or that statement is the first)."""
    places = candidate_places(prompt)
    body, _, question = prompt.rpartition("\n")
    named = _NAMED.findall(question)
    every = _MOVE.findall(body)
    at = every.index(named[0]) if named and named[0] in every else 0
    return {
        "last": places[-1],
        "first": places[0],
        "random": tuple(dict.fromkeys(places)),
        "before_asked": every[at - 1] if at > 0 else None,
    }
