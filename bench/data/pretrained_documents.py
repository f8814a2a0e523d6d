"""The corpus in a pretrained model's tokens.

Corpora hold byte tokens (``bench.data.corpora``); a pretrained model reads its own subword tokens, so
each test document is decoded to text and re-tokenized with the model's tokenizer, with its
default special tokens (e.g. a BOS at the start). Lengths, buckets and windows then count the
model's tokens, and "eval length" means the context the model read.

Where the tokenizer starts each text with a BOS, a document's first window starts with it and
later windows would not; :func:`window_bos` names that token so that the metrics put it at the
start of every window (as its unscored first input), giving every window the same form.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bench.data.corpora import Document
from bench.data.tokenizer import ByteTokenizer

__all__ = ["retokenize", "window_bos"]


def retokenize(docs: Sequence[Document], tokenizer, batch: int = 64) -> list[Document]:
    """``docs`` (byte tokens) as Documents of ``tokenizer``'s ids (int32), same ids and order."""
    byte_tokens = ByteTokenizer()
    out: list[Document] = []
    for start in range(0, len(docs), batch):
        part = docs[start : start + batch]
        texts = [byte_tokens.decode(d.tokens) for d in part]
        encoded = tokenizer(texts, add_special_tokens=True, verbose=False)["input_ids"]
        out += [
            Document(d.id, np.asarray(ids, dtype=np.int32))
            for d, ids in zip(part, encoded, strict=True)
        ]
    return out


def window_bos(tokenizer) -> int | None:
    """The token ``tokenizer`` puts before every text (its BOS, where it adds one), else None."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return None
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return int(bos) if ids and ids[0] == bos else None
