"""Passkey examples: exact length, needle depth, template text, keys, grid determinism."""

from __future__ import annotations

import random

import pytest

from bench.data.tokenizer import ByteTokenizer
from bench.tasks.passkey import (
    KEY_MAX,
    KEY_MIN,
    PasskeyExample,
    make_passkey_example,
    min_passkey_length,
    parse_passkey,
    passkey_correct,
    passkey_grid,
    standard_filler_text,
)

TOK = ByteTokenizer()

# The template spelled out independently of bench.tasks.passkey (Landmark attention's run_test.py).
TASK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
    "them. I will quiz you about the important information there."
)
GARBAGE = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
)
QUESTION = "What is the pass key? The pass key is"


def landmark_prompt(n_prefix: int, n_suffix: int, key: int) -> str:
    """Landmark's generate_prompt with a fixed prefix/suffix split."""
    garbage_inf = " ".join([GARBAGE] * 2000)
    info = f"The pass key is {key}. Remember it. {key} is the pass key."
    return "\n".join([TASK, garbage_inf[:n_prefix], info, garbage_inf[:n_suffix], QUESTION])


def test_matches_landmark_template_exactly() -> None:
    ex = make_passkey_example(1000, 0.25, 4242)
    text = TOK.decode(ex.prompt_ids)
    n_filler = len(text) - len(landmark_prompt(0, 0, 4242))
    n_prefix = round(0.25 * n_filler)
    assert text == landmark_prompt(n_prefix, n_filler - n_prefix, 4242)
    assert TOK.decode(ex.answer_ids) == " 4242"
    assert text.startswith(TASK + "\n" + GARBAGE)
    assert text.endswith(QUESTION)
    assert "The pass key is 4242. Remember it. 4242 is the pass key." in text


@pytest.mark.parametrize("key", [KEY_MIN, 7, 12345, KEY_MAX])
def test_exact_length_over_many_lengths_and_depths(key: int) -> None:
    rng = random.Random(key)
    lengths = [min_passkey_length(key), min_passkey_length(key) + 1, 256 + 1, 257, 1000, 4096]
    lengths += [rng.randint(min_passkey_length(key), 20000) for _ in range(20)]
    for length in lengths:
        for depth in [0.0, 0.1, 0.33, 0.5, 0.77, 1.0, rng.random()]:
            ex = make_passkey_example(length, depth, key)
            assert len(ex.prompt_ids) + len(ex.answer_ids) == length == ex.length
            assert ex.input_ids == ex.prompt_ids + ex.answer_ids
            assert all(0 <= i < 256 for i in ex.input_ids)
            needle = f"The pass key is {key}."
            assert TOK.decode(ex.prompt_ids[ex.needle_start :]).startswith(needle)


def test_needle_position_follows_depth() -> None:
    length, key = 3000, 31337
    depths = [i / 20 for i in range(21)]
    starts = [make_passkey_example(length, d, key).needle_start for d in depths]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)  # strictly increasing
    head = len(TASK) + 2  # task sentence + newline, then the newline after the prefix filler
    n_filler = length - min_passkey_length(key)
    for depth, start in zip(depths, starts, strict=True):
        assert start - head == round(depth * n_filler)
    # Extremes: right after the task sentence / right before the question.
    first = TOK.decode(make_passkey_example(length, 0.0, key).prompt_ids)
    assert first.startswith(TASK + "\n\nThe pass key is")
    last = TOK.decode(make_passkey_example(length, 1.0, key).prompt_ids)
    assert last.endswith("is the pass key.\n\n" + QUESTION)
    # Negative control: the needle does move (a depth-ignoring implementation fails here).
    assert starts[-1] - starts[0] == n_filler


def test_filler_is_trimmed_sentences_plus_partial() -> None:
    text = standard_filler_text(len(GARBAGE) * 2 + 1 + 10)
    assert text == GARBAGE + " " + GARBAGE + " " + GARBAGE[:9]
    assert standard_filler_text(0) == "" and standard_filler_text(5) == "The g"


def test_answer_decodes_to_key() -> None:
    for key in [1, 9, 10, 999, 50000, 123456]:
        ex = make_passkey_example(500, 0.5, key)
        answer = TOK.decode(ex.answer_ids)
        assert answer == f" {key}" and int(answer) == key == ex.key
        assert parse_passkey(answer) == key
        assert passkey_correct(ex.answer_ids, key)
        assert not passkey_correct(ex.answer_ids, key + 1)  # negative control


def test_passkey_correct_requires_whole_key() -> None:
    assert passkey_correct(TOK.encode(" 12345. Remember"), 12345)
    assert passkey_correct(TOK.encode("12345"), 12345)
    assert not passkey_correct(TOK.encode(" 123456"), 12345)
    assert not passkey_correct(TOK.encode(" 1234"), 12345)
    assert not passkey_correct(TOK.encode(" the key"), 12345)
    assert not passkey_correct([], 12345)


def test_too_short_raises_with_length_and_minimum() -> None:
    minimum = min_passkey_length(12345)
    make_passkey_example(minimum, 0.5, 12345)  # the boundary itself fits
    with pytest.raises(ValueError, match=rf"total_length {minimum - 1} .* minimum is {minimum}"):
        make_passkey_example(minimum - 1, 0.5, 12345)
    with pytest.raises(ValueError, match="total_length 100"):
        make_passkey_example(100, 0.0, 1)
    assert min_passkey_length() == min_passkey_length(KEY_MAX) > min_passkey_length(1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"depth": 1.5}, "depth"),
        ({"depth": float("nan")}, "depth"),
        ({"filler": "lorem"}, "filler"),
        ({"key": -3}, "key"),
        ({"key": None}, "rng"),
        ({"filler": "corpus"}, "filler_source"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, match: str) -> None:
    args = {"total_length": 400, "depth": 0.5, "key": 5, **kwargs}
    with pytest.raises(ValueError, match=match):
        make_passkey_example(**args)


def test_corpus_filler_uses_source_text() -> None:
    source = "def f(x):\n    return x + 1\n" * 10
    ex = make_passkey_example(600, 0.5, 777, filler="corpus", filler_source=source)
    text = TOK.decode(ex.prompt_ids)
    assert ex.length == 600 and ex.filler == "corpus"
    assert "The grass" not in text and "return x + 1" in text
    assert "The pass key is 777. Remember it. 777 is the pass key." in text
    # The filler is contiguous source text, wrapping around a short source.
    prefix = text[len(TASK) + 1 : text.index("\nThe pass key")]
    assert prefix == (source * 3)[: len(prefix)]
    # A random offset comes from the rng; same rng seed -> same example.
    a = make_passkey_example(
        600, 0.5, 777, filler="corpus", filler_source=source, rng=random.Random(1)
    )
    b = make_passkey_example(
        600, 0.5, 777, filler="corpus", filler_source=source, rng=random.Random(1)
    )
    assert a == b
    # Token-id sources (e.g. a document) work too, specials included.
    ids = make_passkey_example(400, 0.5, 3, filler="corpus", filler_source=[65, 66, 257])
    assert 257 in ids.prompt_ids and ids.length == 400


def test_grid_deterministic_per_cell_and_seeded() -> None:
    lengths, depths = [300, 512, 1024], [0.0, 0.5, 1.0]
    grid = passkey_grid(lengths, depths, trials=4, seed=0)
    assert len(grid) == 3 * 3 * 4 and all(isinstance(e, PasskeyExample) for e in grid)
    assert [(e.length, e.depth, e.trial) for e in grid[:5]] == [
        (300, 0.0, 0),
        (300, 0.0, 1),
        (300, 0.0, 2),
        (300, 0.0, 3),
        (300, 0.5, 0),
    ]
    assert passkey_grid(lengths, depths, trials=4, seed=0) == grid
    # A cell does not depend on the rest of the grid.
    sub = passkey_grid([512], [0.5], trials=2, seed=0)
    assert sub == [e for e in grid if e.length == 512 and e.depth == 0.5 and e.trial < 2]
    # Different seeds -> different keys; keys vary across trials and lie in range.
    other = passkey_grid(lengths, depths, trials=4, seed=1)
    assert [e.key for e in other] != [e.key for e in grid]
    keys = [e.key for e in passkey_grid([300], [0.5], trials=200, seed=7)]
    assert all(KEY_MIN <= k <= KEY_MAX for k in keys)
    assert len(set(keys)) > 190 and min(keys) < 5000 and max(keys) > 45000


def test_grid_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="trials"):
        passkey_grid([300], [0.5], trials=0, seed=0)
    with pytest.raises(ValueError, match="depth"):
        passkey_grid([300], [2.0], trials=1, seed=0)
    with pytest.raises(ValueError, match="minimum"):
        passkey_grid([100], [0.5], trials=1, seed=0)


# --------------------------------------------------------------------------- templates, verdict


def test_short_template_leaves_most_of_the_window_to_the_filler() -> None:
    from bench.tasks.passkey import PASSKEY_TEMPLATES

    for length in (256, 512):
        share = 1 - min_passkey_length(template="short") / length
        assert share >= 0.7, (length, share)
    # Negative control: Landmark's text leaves almost nothing at 256 tokens.
    assert 1 - min_passkey_length(template="landmark") / 256 < 0.05
    assert set(PASSKEY_TEMPLATES) >= {"short", "landmark"}


@pytest.mark.parametrize("template", ["short", "landmark"])
def test_templates_keep_the_landmark_structure(template: str) -> None:
    from bench.tasks.passkey import passkey_template

    t = passkey_template(template)
    ex = make_passkey_example(300, 0.5, 4321, template=template)
    text = TOK.decode(ex.prompt_ids)
    lines = text.split("\n")
    assert lines[0] == t.task and lines[2] == t.needle.format(key=4321)
    assert lines[-1] == t.question and TOK.decode(ex.answer_ids) == t.answer.format(key=4321)
    assert TOK.decode(ex.answer_ids) == {"short": "4321", "landmark": " 4321"}[template]
    assert ex.template == template and len(ex.prompt_ids) + len(ex.answer_ids) == 300
    # The question ends in words of the needle; in the short template the standard filler never
    # contains them (a copy cue with one match), in Landmark's it does ("The sky is blue").
    tail = t.question.split()[-1]
    assert tail in t.needle
    assert (tail not in standard_filler_text(5000)) == (template == "short")


def test_unknown_template_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="passkey template 'nope' is unknown; allowed: "):
        make_passkey_example(300, 0.5, 1, template="nope")


def test_answer_verdict_requires_the_key_to_end() -> None:
    from bench.tasks.passkey import answer_matches, is_digit_token

    assert answer_matches(" 1234", " 1234")
    assert answer_matches(" 1234.", " 1234")
    assert answer_matches(" 1234\nmore", " 1234")
    assert not answer_matches(" 12345", " 1234")  # the defect: a longer number
    assert not answer_matches(" 123", " 1234")
    assert not answer_matches("1234", " 1234")
    assert is_digit_token(TOK.encode("7")[0]) and not is_digit_token(TOK.encode(".")[0])
    assert not is_digit_token(TOK.EOS)


def _tokens_before_the_key(
    template: str, key: int = 31337, length: int = 256
) -> tuple[int, list[int]]:
    """(the token right before the key in the needle, every prompt position holding that token)."""
    example = make_passkey_example(length, 0.5, key, template=template)
    prompt = example.prompt_ids
    needle_key = example.needle_start + TOK.decode(prompt[example.needle_start :]).index(str(key))
    before = prompt[needle_key - 1]
    return before, [i for i, t in enumerate(prompt) if t == before]


def test_short_template_cues_the_key_uniquely() -> None:
    """In the short template the token before the key's first digit occurs only in the needle and
    at the end of the question, so the question's last token points at the key by content alone.
    Control: the landmark template puts a space there, which the filler repeats everywhere."""
    before, where = _tokens_before_the_key("short")
    example = make_passkey_example(256, 0.5, 31337, template="short")
    assert where == [where[0], len(example.prompt_ids) - 1]  # needle, then the question's end
    assert example.answer_ids == TOK.encode("31337")
    landmark_before, landmark_where = _tokens_before_the_key("landmark")
    assert TOK.decode([landmark_before]) == " " and len(landmark_where) > 20
