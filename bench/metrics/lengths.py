"""Lengths in eval configs: token counts, or ``"<m>x"`` multiples of the training length.

One parser for every place that takes a length (eval lengths, metric lengths, grids such as
shift deltas), so "4x" means the same thing everywhere.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["check_grid", "parse_length", "resolve_grid"]


def parse_length(value: Any, train_length: int, what: str = "length") -> int:
    """A length in tokens: an int (tokens) or a string ``"<m>x"`` (m times the training length)."""
    if isinstance(value, bool):
        raise ValueError(
            f"{what} {value!r} is invalid; allowed: an integer number of tokens or '<m>x'."
        )
    if isinstance(value, str) and value.strip().lower().endswith("x"):
        try:
            multiple = float(value.strip()[:-1])
        except ValueError:
            multiple = float("nan")
        if not math.isfinite(multiple) or multiple < 0:
            raise ValueError(
                f"{what} {value!r} is invalid; allowed: an integer number of tokens or '<m>x' "
                "with m a non-negative number (m times the training length)."
            )
        return int(round(multiple * int(train_length)))
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not math.isfinite(number) or number != int(number) or number < 0:
        raise ValueError(
            f"{what} {value!r} is invalid; allowed: a non-negative integer number of tokens or "
            "'<m>x' (m times the training length)."
        )
    return int(number)


def _entries(value: Any, what: str) -> list | None:
    if value is None or value == "auto":
        return None
    if isinstance(value, (str, int, float)):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ValueError(
        f"{what} {value!r} is invalid; allowed: 'auto' or null, a length, or a list of lengths."
    )


def resolve_grid(value: Any, train_length: int, what: str) -> list[int] | None:
    """'auto'/None -> None; a length or a list of token counts / '<m>x' -> sorted unique ints."""
    entries = _entries(value, what)
    if entries is None:
        return None
    return sorted({parse_length(v, train_length, f"{what} entry") for v in entries})


def check_grid(value: Any, what: str) -> None:
    """Raise ValueError unless ``value`` is a grid :func:`resolve_grid` accepts (any train length)."""
    resolve_grid(value, 1, what)
