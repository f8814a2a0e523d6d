"""Byte-level tokenizer: every UTF-8 byte is a token, plus three special ids.

A byte vocabulary needs no download, is identical on every machine and makes
"length" mean the same thing for every corpus (one token = one byte), which is
what a length-extrapolation benchmark measures against.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

__all__ = ["ByteTokenizer", "bytes_to_tokens"]

N_BYTES = 256


def bytes_to_tokens(data: bytes | bytearray | memoryview) -> np.ndarray:
    """Token ids of raw bytes as a compact int16 array (ids < 259 fit in int16).

    Files are read as bytes and never decoded, so a file with broken UTF-8 still
    tokenizes to exactly its bytes; int16 halves memory against int32.
    """
    return np.frombuffer(bytes(data), dtype=np.uint8).astype(np.int16)


class ByteTokenizer:
    """256 byte ids, then BOS=256, EOS=257, PAD=258 (vocab_size=259)."""

    BOS: int = 256
    EOS: int = 257
    PAD: int = 258
    vocab_size: int = 259

    # Lower-case aliases, the spelling most training loops expect.
    bos_id: int = BOS
    eos_id: int = EOS
    pad_id: int = PAD

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """UTF-8 bytes of ``text`` as ids; specials only when asked for."""
        ids = list(text.encode("utf-8"))
        if add_bos:
            ids.insert(0, self.BOS)
        if add_eos:
            ids.append(self.EOS)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of the byte ids; special ids are skipped, broken UTF-8 becomes U+FFFD.

        Accepts any iterable of ints (list, numpy array, 1-D tensor via ``.tolist()``).
        """
        if hasattr(ids, "tolist"):
            ids = ids.tolist()  # tensors/arrays: avoid one Python object per element access
        values = [int(x) for x in ids]
        bad = [i for i in values if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(
                f"token id {bad[0]} is outside the byte vocabulary; allowed ids are 0..{self.vocab_size - 1}."
            )
        return bytes(i for i in values if i < N_BYTES).decode("utf-8", errors="replace")
