"""The one discovery rule of lenbench's registries (position families, scaling methods, metrics,
findings, RULER-style tasks): a registry's package imports every module in its folder whose name
does not start with an underscore, alphabetically, and each module registers what it defines by
a decorator. A user's own modules load the same way from config (``extensions: [my_pkg.methods]``).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from types import ModuleType

__all__ = ["import_package", "load_extensions"]


def import_package(package: str) -> list[ModuleType]:
    """Import ``package`` and every module in its folder whose name does not start with "_",
    alphabetically (not recursing into subpackages); returns those modules."""
    root = importlib.import_module(package)
    path = getattr(root, "__path__", None)
    if path is None:
        return []
    names = sorted(
        info.name for info in pkgutil.iter_modules(path) if not info.name.startswith("_")
    )
    return [importlib.import_module(f"{package}.{name}") for name in names]


def load_extensions(names: Iterable[str]) -> list[str]:
    """Import each named module (a package: it and every module in it, :func:`import_package`),
    so that what they register (families, scaling methods, metrics, findings, tasks) is there
    before a config is checked. One sentence naming the module that cannot be imported."""
    loaded = []
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"extensions entry {name!r} is invalid; allowed: a module name.")
        try:
            import_package(name)
        except ModuleNotFoundError as exc:
            raise ValueError(
                f"extensions entry {name!r} cannot be imported ({exc}); allowed: a module or "
                f"package importable from this Python (installed or on PYTHONPATH)."
            ) from None
        loaded.append(name)
    return loaded
