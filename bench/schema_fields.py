"""Field metadata of the config schemas: what enters the checkpoint key, and where a field applies.

Declared on the dataclass fields (``field(metadata=...)``) so that no separate list of keys has to
be kept in sync with the schemas.
"""

from __future__ import annotations

from dataclasses import MISSING as NO_DEFAULT
from dataclasses import Field, field, fields
from typing import Any

__all__ = ["FAMILIES", "KINDS", "NOT_IN_KEY", "WEIGHTS", "weight_fields", "weights_dict"]

# Field metadata keys.
# False: not in the checkpoint key; fn(section): the value that enters it, or NOT_IN_KEY when
# this section's other values make the field irrelevant to the weights
WEIGHTS = "weights"
NOT_IN_KEY = object()
KINDS = "kinds"  # data kinds (DataConfig.name) the field belongs to; absent = every kind
FAMILIES = "families"  # position families whose parameters include the field (position_params)


def _only(*kinds: str, **kwargs: Any) -> Any:
    return field(metadata={KINDS: kinds}, **kwargs)


def weights_dict(section: Any) -> dict[str, Any]:
    """The fields of a config section that enter the checkpoint key, as they enter it."""
    out = {}
    for f in fields(section):
        rule = f.metadata.get(WEIGHTS, True)
        kinds = f.metadata.get(KINDS)
        if rule is False or (kinds and section.name not in kinds):
            continue
        value = rule(section) if callable(rule) else getattr(section, f.name)
        if value is not NOT_IN_KEY:
            out[f.name] = value
    return out


def weight_fields(schema: type) -> tuple[str, ...]:
    """Names of the fields of ``schema`` that may enter the checkpoint key."""
    return tuple(f.name for f in fields(schema) if f.metadata.get(WEIGHTS, True) is not False)


def _default(f: Field) -> Any:
    return f.default_factory() if f.default_factory is not NO_DEFAULT else f.default
