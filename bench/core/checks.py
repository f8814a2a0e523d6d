"""Config checks, each failing with one sentence that names the key, the value and what is allowed.

The one home of lenbench's validators: value checks (:func:`boolean`, :func:`integer`,
:func:`number`, :func:`choice`; each returns the value in its canonical Python type, so an int
given for a float field becomes a float), lengths as token counts or ``"<m>x"`` multiples of the
training length (:func:`parse_length`, :func:`resolve_grid`: "4x" means the same everywhere),
the field metadata that says what enters the checkpoint key and where a field applies
(``WEIGHTS``, ``KINDS``; declared on the dataclass fields, so no separate list of
keys is kept in sync), :func:`parse_section` (a config section from plain data or a DictConfig,
checked as Hydra checks it) with :func:`config_error` (OmegaConf's errors as one sentence), and
:class:`NotApplicable` (a sweep cell whose scaling means nothing for the model: skipped).
"""

from __future__ import annotations

import functools
import math
import types
import typing
from collections.abc import Sequence
from dataclasses import MISSING as NO_DEFAULT
from dataclasses import Field, field, fields, is_dataclass
from numbers import Integral, Real
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

__all__ = [
    "KINDS",
    "NOT_IN_KEY",
    "WEIGHTS",
    "NotApplicable",
    "boolean",
    "check_grid",
    "check_method",
    "choice",
    "config_error",
    "field_default",
    "first_line",
    "integer",
    "kind_field",
    "number",
    "parse_length",
    "parse_section",
    "resolve_grid",
    "weight_fields",
    "weights_dict",
]


class NotApplicable(ValueError):
    """The scaling method has no meaning for the model (a skipped sweep cell)."""


def check_method(
    what: str,
    name: str,
    method: str,
    family: str,
    allowed: Sequence[str],
    *,
    owner: str = "",
    note: str = "",
) -> None:
    """The one applicability rule: raise :class:`NotApplicable` (one sentence) unless ``method``
    is one of ``allowed``, the methods that apply to a ``family`` model (the model source says
    which). ``what`` and ``name`` name the setting ("scaling yarn"), ``owner`` the model in the
    sentence (default: the family), ``note`` ends it."""
    if method not in allowed:
        raise NotApplicable(
            f"{what} {name} (method {method}) does not apply to position {family}; methods for "
            f"{owner or family}: {', '.join(allowed)}{note}"
        )


# --------------------------------------------------------------------------- values


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


# --------------------------------------------------------------------------- lengths


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


# --------------------------------------------------------------------------- checkpoint-key metadata

# Field metadata keys.
# False: not in the checkpoint key; fn(section): the value that enters it, or NOT_IN_KEY when
# this section's other values make the field irrelevant to the weights
WEIGHTS = "weights"
NOT_IN_KEY = object()
# the field enters the key only when it differs from its default (a field added later, so that
# the keys of models trained before it existed hold)
IF_SET = "if_set"
KINDS = "kinds"  # data kinds (DataConfig.name) the field belongs to; absent = every kind


def kind_field(*kinds: str, **kwargs: Any) -> Any:
    """A field that belongs to the data kinds ``kinds`` only (``KINDS`` metadata)."""
    return field(metadata={KINDS: kinds}, **kwargs)


def weights_dict(section: Any) -> dict[str, Any]:
    """The fields of a config section that enter the checkpoint key, as they enter it."""
    out = {}
    for f in fields(section):
        rule = f.metadata.get(WEIGHTS, True)
        kinds = f.metadata.get(KINDS)
        if rule is False or (kinds and section.name not in kinds):
            continue
        if rule == IF_SET and getattr(section, f.name) == field_default(f):
            continue
        value = rule(section) if callable(rule) else getattr(section, f.name)
        if isinstance(value, (list, tuple)):
            value = list(value)  # a Hydra ListConfig enters as a plain list
        if value is not NOT_IN_KEY:
            out[f.name] = value
    return out


def weight_fields(schema: type) -> tuple[str, ...]:
    """Names of the fields of ``schema`` that may enter the checkpoint key."""
    return tuple(f.name for f in fields(schema) if f.metadata.get(WEIGHTS, True) is not False)


def field_default(f: Field) -> Any:
    """The default value of a dataclass field (its factory called)."""
    return f.default_factory() if f.default_factory is not NO_DEFAULT else f.default


# --------------------------------------------------------------------------- sections and errors


def parse_section(schema: type, values: Any, key: str | None = None) -> Any:
    """``values`` merged into ``schema`` (at config key ``key``) and instantiated, so that types,
    unknown keys and missing values are checked as Hydra checks them; OmegaConf's errors become
    one-sentence ValueErrors."""
    try:
        typed = isinstance(values, DictConfig) and OmegaConf.get_type(values) is schema
        node = values if typed else OmegaConf.structured(schema)
        root = node if key is None else OmegaConf.create({key: node})  # errors name full keys
        if not typed:
            root = OmegaConf.merge(root, values if key is None else {key: values})
        _check_keys(root, "")  # keys added with +key=... are not rejected by Hydra
        obj = OmegaConf.to_object(root)
        return obj if key is None else obj[key]
    except OmegaConfBaseException as exc:
        raise ValueError(config_error(exc) or first_line(exc)) from None


def _check_keys(node: DictConfig, where: str) -> None:
    """Raise for a key that is not a field of its section's dataclass (at any depth)."""
    schema = OmegaConf.get_type(node)
    if is_dataclass(schema):
        allowed = [f.name for f in fields(schema)]
        for key in node.keys():
            if key not in allowed and where == "position":
                from models.positions import foreign_field_error

                raise ValueError(foreign_field_error(str(node.get("kind")), str(key), node[key]))
            if key not in allowed:
                raise ValueError(
                    f"{where + '.' if where else ''}{key} is an unknown key; allowed keys: "
                    f"{', '.join(allowed)}."
                )
    for key, child in node.items_ex(resolve=False):
        if isinstance(child, DictConfig) and not (child._is_none() or child._is_missing()):
            _check_keys(child, f"{where}.{key}" if where else str(key))


def config_error(exc: BaseException) -> str | None:
    """One sentence for an OmegaConf error (or a Hydra error caused by one) about a config key
    or value: a wrong type, an unknown key or a missing value; None for anything else."""
    err = _omegaconf_cause(exc)
    if err is None or not err.full_key:
        return None
    key = str(err.full_key)
    name = str(err.key) if err.key is not None else key.rpartition(".")[2]
    schema = err.object_type if is_dataclass(err.object_type) else None
    if isinstance(err, MissingMandatoryValue):
        return f"{key} is required; set it, e.g. {key}=<value>."
    if isinstance(err, (ConfigKeyError, ConfigAttributeError)) and schema is not None:
        from models.positions import PositionConfig, foreign_field_error

        parent = getattr(err, "parent_node", None)
        if issubclass(schema, PositionConfig) and isinstance(parent, DictConfig):
            return foreign_field_error(str(parent.get("kind")), name)  # another family's field
        allowed = ", ".join(f.name for f in fields(schema))
        return f"{key} is an unknown key; allowed keys: {allowed}."
    if isinstance(err, ValidationError) and schema is not None:
        hint = _type_hints(schema).get(name)
        if hint is not None:
            return f"{key} must be {_describe(hint)}, got {err.value!r}."
    return None


def _omegaconf_cause(exc: BaseException | None) -> OmegaConfBaseException | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OmegaConfBaseException):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


@functools.cache
def _type_hints(schema: type) -> dict[str, Any]:
    return typing.get_type_hints(schema)


def _describe(hint: Any) -> str:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return f"{_describe(inner[0])} or null" if len(inner) == 1 else "a value of another type"
    origin = typing.get_origin(hint) or hint
    names = {
        bool: "true or false",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }
    if origin in names:
        return names[origin]
    return "a mapping of keys" if is_dataclass(origin) else "a value of another type"


def first_line(exc: BaseException) -> str:
    """An exception's first non-empty line (its type's name if it has none): for one sentence."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
