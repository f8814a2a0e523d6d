"""Word extraction: the common words of a list (``cwe``: a few words repeated more often than
the rest) and the most frequent words of a Zipf-distributed list (``fwe``). The list is the
haystack (RULER's too); its words are random 4-letter ones (no download)."""

from __future__ import annotations

import math
import random

import numpy as np

from bench.tasks.ruler_registry import (
    WORD,
    Layout,
    RulerParams,
    distinct,
    random_word,
    register_ruler_task,
)

CWE_TEXT = {
    "head_cwe": "Find the most common words.",
    "cwe_ask": "What are the {n} most common words? words:",
}
FWE_TEXT = {
    "head_fwe": "Find the most frequent words.",
    "fwe_ask": "What are the {n} most frequent words? words:",
}


def _list_text(words: list[str], n_chars: int) -> str:
    """``words`` joined by spaces, padded with spaces to exactly ``n_chars``."""
    text = " ".join(words)
    assert len(text) <= n_chars < len(text) + WORD + 2
    return text + " " * (n_chars - len(text))


def _list_slots(n_chars: int) -> int:
    """Words of :data:`~bench.tasks.ruler.WORD` letters that fit ``n_chars`` characters, space-separated."""
    return (n_chars + 1) // (WORD + 1)


@register_ruler_task(
    "cwe",
    text=CWE_TEXT,
    fields=("common_words", "common_freq", "rare_freq"),
    answer_length=lambda params: params.common_words * (WORD + 1) - 1,
)
def cwe(params: RulerParams, depth: float, rng: random.Random) -> Layout:
    common = distinct(rng, params.common_words, random_word)
    question = CWE_TEXT["cwe_ask"].format(n=params.common_words)

    def words(n_chars: int, rng: random.Random) -> tuple[str, list[str]]:
        slots = _list_slots(n_chars)
        n_rare = math.ceil(max(slots - len(common) * params.common_freq, 0) / params.rare_freq)
        if n_rare < 1:
            raise ValueError("too short")
        rare = distinct(rng, n_rare + len(common), random_word)
        rare = [w for w in rare if w not in common][:n_rare]
        bag = [w for w in common for _ in range(params.common_freq)]
        bag += [w for w in rare for _ in range(params.rare_freq)][: slots - len(bag)]
        rng.shuffle(bag)
        order = sorted(common, key=bag.index)  # the answer: common words in order of first use
        return _list_text(bag, n_chars), order

    return Layout(CWE_TEXT["head_cwe"], question, [], words=words)


def zipf_counts(slots: int, top: int, alpha: float) -> list[int] | None:
    """Word counts summing to ``slots`` with Zipf shape ``r ** -alpha`` whose ``top`` largest are
    strictly ordered and strictly above every other count; None when ``slots`` is too few."""
    vocab = max(top + 1, slots // 4)
    weights = np.arange(1, vocab + 1, dtype=float) ** -float(alpha)
    counts = np.maximum(np.floor(slots * weights / weights.sum()).astype(int), 1)
    # too many words with one occurrence: keep the longest prefix within the slots (at least top + 1)
    fits = int(np.searchsorted(counts.cumsum(), slots, side="right"))
    counts = counts[: max(top + 1, min(vocab, fits))]
    counts[0] += slots - counts.sum()
    ordered = all(counts[i] > counts[i + 1] for i in range(top))
    return counts.tolist() if ordered and counts.sum() == slots and counts[-1] >= 1 else None


@register_ruler_task(
    "fwe",
    text=FWE_TEXT,
    fields=("frequent_words", "alpha"),
    answer_length=lambda params: params.frequent_words * (WORD + 1) - 1,
)
def fwe(params: RulerParams, depth: float, rng: random.Random) -> Layout:
    question = FWE_TEXT["fwe_ask"].format(n=params.frequent_words)

    def words(n_chars: int, rng: random.Random) -> tuple[str, list[str]]:
        counts = zipf_counts(_list_slots(n_chars), params.frequent_words, params.alpha)
        if counts is None:
            raise ValueError("too short")
        vocab = distinct(rng, len(counts), random_word)
        bag = [w for w, c in zip(vocab, counts, strict=True) for _ in range(c)]
        rng.shuffle(bag)
        return _list_text(bag, n_chars), vocab[: params.frequent_words]

    return Layout(FWE_TEXT["head_fwe"], question, [], words=words)
