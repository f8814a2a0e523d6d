"""Modules bound now and imported at first use, so that checking a config loads no tensor library.

``from models.lazy import torch`` binds ``torch``; its first attribute use imports it (the real
module, the one every ``import torch`` gets) and each attribute is then kept. A module on the
config check path (``tests/bench/test_fast_errors.py``: composing and checking a config, the
answer to a bad setting and to ``--help``) binds torch, pandas and scipy this way and uses none of
their attributes at import time (no ``@torch.no_grad()`` decorator, no module-level tensor, no
``nn.Module`` subclass): loading torch alone takes 1-2 s on a 2-core machine.
"""

from __future__ import annotations

import functools
import importlib
import types
from collections.abc import Callable
from typing import Any

__all__ = ["LazyModule", "F", "nn", "no_grad", "pd", "torch"]


class LazyModule(types.ModuleType):
    """Stands for the module ``name``; imports it at the first attribute that is looked up."""

    def __getattr__(self, attr: str) -> Any:
        value = getattr(importlib.import_module(self.__name__), attr)
        setattr(self, attr, value)  # later lookups find it directly
        return value


torch = LazyModule("torch")
nn = LazyModule("torch.nn")
F = LazyModule("torch.nn.functional")
pd = LazyModule("pandas")


def no_grad(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``@torch.no_grad()`` for a module on the config check path: torch loads at the first call."""

    @functools.wraps(fn)
    def without_grad(*args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            return fn(*args, **kwargs)

    return without_grad
