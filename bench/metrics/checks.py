"""Type and range checks for eval config fields, each failing with one sentence.

Every message names the full key (``eval.nll.max_docs``), the bad value and what is allowed,
and each check returns the value in its canonical Python type (an int given for a float field
becomes a float).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any

__all__ = ["boolean", "choice", "integer", "number"]


def boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}.")
    return value


def integer(key: str, value: Any, minimum: int, *, optional: bool = False) -> int | None:
    """An integer >= minimum (or None when ``optional``)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        allowed = f"an integer >= {minimum}" + (" or null" if optional else "")
        raise ValueError(f"{key} must be {allowed}, got {value!r}.")
    return int(value)


def number(
    key: str, value: Any, low: float, high: float = math.inf, *, interval: str = "[]"
) -> float:
    """A finite number in the interval low..high; ``interval`` says which ends are closed."""
    ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(float(value))
    if ok:
        x = float(value)
        ok = (x >= low if interval[0] == "[" else x > low) and (
            x <= high if interval[1] == "]" else x < high
        )
    if not ok:
        if math.isinf(high):
            allowed = f"a number {'>=' if interval[0] == '[' else '>'} {low:g}"
        else:
            allowed = f"a number in {interval[0]}{low:g}, {high:g}{interval[1]}"
        raise ValueError(f"{key} must be {allowed}, got {value!r}.")
    return float(value)


def choice(key: str, value: Any, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(f"{key} must be one of {', '.join(allowed)}, got {value!r}.")
    return value
