"""The ``LenbenchLM`` model arguments, parsed from lm-eval's strings in one place.

``--model_args`` arrive as ``key=value`` text; this turns them into lengths, batch sizes and a
``ScalingConfig`` (lenbench's ``conf/scaling`` presets plus per-parameter overrides).
"""

from __future__ import annotations

import math
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from models.scaling import SCALING_METHODS
from models.transformer import ScalingConfig

DEFAULT_MAX_BATCH_SIZE = 64
# LenbenchLM's own arguments: every other model argument must be a parameter of the scaling method.
MODEL_ARGS = (
    "pretrained",
    "cache_root",
    "scaling",
    "scaling_name",
    "config_dir",
    "logn",
    "oracle",
    "eval_length",
    "max_length",
    "prefix_token",
    "precision",
    "batch_size",
    "max_batch_size",
    "max_batch_tokens",
    "device",
)


def as_integer(value: Any) -> int | None:
    """``value`` as an int when it is one however it arrived (lm-eval's CLI turns ``-2`` into
    -2.0 and ``1e3`` into 1000.0; text such as ``"8"``), else None (a bool is no integer)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                return None
    if (
        isinstance(value, (float, np.floating))
        and math.isfinite(value)
        and float(value).is_integer()
    ):
        return int(value)
    return None


def positive_int(value: Any, what: str) -> int:
    """``value`` as an int >= 1 (also 8.0 or "8", as lm-eval may hand it over), else a ValueError
    naming ``what``."""
    number = as_integer(value)
    if number is None or number < 1:
        raise ValueError(f"{what} {value!r} is invalid; allowed: an integer >= 1.")
    return number


def optional_length(value: Any, what: str) -> int | None:
    """None (also for "", "none", "null") or an int >= 1."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        return None
    return positive_int(value, what)


def batch_rows(batch_size: Any, max_batch_size: Any) -> int:
    """Rows per forward pass: an int >= 1, or ``auto``/``auto:N`` = ``max_batch_size`` (default 64)."""
    if batch_size is None:
        return 1
    text = str(batch_size).strip().lower()
    if text.startswith("auto"):
        return positive_int(max_batch_size or DEFAULT_MAX_BATCH_SIZE, "max_batch_size")
    value = as_integer(text) or 0
    if value < 1:
        raise ValueError(
            f"batch_size {batch_size!r} is invalid; allowed: an integer >= 1, 'auto' or 'auto:N'."
        )
    return value


def _param_kinds(method: str) -> dict[str, type]:
    """The type each parameter of scaling method ``method`` is read as: int, float or bool, from
    its function's annotations (``float | None`` is float); a parameter of another type is absent."""
    fn = SCALING_METHODS[method].fn
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an annotation that does not resolve: read every value as given
        return {}
    kinds = {}
    for name in SCALING_METHODS[method].parameters:
        hint = hints.get(name)
        if typing.get_origin(hint) in (typing.Union, types.UnionType):  # float | None
            args = set(typing.get_args(hint)) - {type(None)}
            hint = next(iter(args)) if len(args) == 1 else None
        if hint in (int, float, bool):
            kinds[name] = hint
    return kinds


def _coerce_typed(method: str, key: str, value: Any, kind: type | None, auto: bool) -> Any:
    """``value`` read as the method's type for ``key``: an integer parameter gets an int whether
    the number came as -2, -2.0 or "-2" (lm-eval's CLI hands ``-2`` over as -2.0), and a value
    that is no integer is one sentence naming the parameter; ``auto`` stays for an ``auto`` key."""
    if kind is not int or isinstance(value, bool) or value is None:
        return value
    if auto and isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    number = as_integer(value)
    if number is None:
        raise ValueError(
            f"scaling parameter {key}={value!r} of scaling method {method!r} is invalid; "
            f"allowed: an integer{' or auto' if auto else ''}."
        )
    return number


def _coerce_param(key: str, value: Any, list_params: tuple[str, ...] = ()) -> Any:
    """String-friendly parameter values: numbers, booleans, ``auto``/``ramp`` and ``a:b:c`` lists
    (for the method's ``list_params``)."""
    if key in list_params and isinstance(value, str) and ":" in value:
        try:
            return [float(v) for v in value.split(":") if v.strip()]
        except ValueError:
            raise ValueError(
                f"scaling parameter {key}={value!r} is invalid; allowed: a number, 'ramp' or "
                "colon-separated numbers such as 1.0:1.5:2.0."
            ) from None
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        try:
            return float(value)
        except ValueError:
            return lowered if lowered in ("auto", "ramp") else value
    return value


def scaling_presets(config_dir: str | os.PathLike | None = None) -> dict[str, dict]:
    """lenbench's scaling presets by name (name, method, params, logn): ``conf/scaling/<name>.yaml``
    plus, with ``config_dir``, that folder's ``scaling/*.yaml`` (a user's ``--config-dir`` for
    ``lenbench``; a preset there wins over a packaged one of the same name).

    Each is read as lenbench's ``scaling`` group is: merged into its typed schema
    (``bench.schema.ScalingSchema``), so a type error or an unknown key is the same one sentence.
    """
    from bench.core.checks import parse_section
    from bench.core.config_dir import CONFIG_DIR  # not ``import conf``: a user's conf/ may be that
    from bench.core.sections import ScalingSchema

    folders = [CONFIG_DIR / "scaling"]
    if config_dir is not None:
        user = Path(os.path.expandvars(os.path.expanduser(str(config_dir))))
        if not user.is_dir():
            raise ValueError(f"config_dir {str(config_dir)!r} is not a folder.")
        folders.append(user / "scaling")
    presets = {}
    for folder in folders:
        for path in sorted(folder.glob("*.yaml")):
            try:
                values = OmegaConf.load(path)
            except Exception as exc:  # YAML syntax: one sentence naming the file
                raise ValueError(
                    f"scaling preset {path} does not parse: {exc}".split("\n")[0]
                ) from None
            preset = parse_section(ScalingSchema, values, key="scaling")
            presets[path.stem] = {
                "name": preset.name,
                "method": preset.method,
                "params": dict(preset.params),
                "logn": preset.logn,
            }
    return presets


def parse_scaling(
    scaling: Any = None,
    *,
    logn: Any = False,
    name: str | None = None,
    oracle: Any = False,
    config_dir: str | None = None,
    **params: Any,
) -> ScalingConfig | None:
    """A ``ScalingConfig`` from string-friendly arguments (None = the raw model).

    ``scaling``: None/"none"; the name of a lenbench scaling config (``conf/scaling/<name>.yaml``:
    none, linear, ntk, dynamic, yarn, llama3, longrope, logn; the same presets as lenbench's
    ``scaling=<name>``, e.g. yarn has ``factor: auto``); else a method registered in
    ``models.scaling.SCALING_METHODS`` (its parameters then all come from ``params``); a
    ``ScalingConfig``; or a mapping with keys name/method/params/logn/target_length/oracle.
    ``params`` override the preset's and are checked against the method's signature here (values
    are checked when the model applies them). ``logn=True`` adds log-n scaling; ``name`` sets the
    results label; ``oracle=True`` sets a factor "auto" for each request's length instead of one
    for the run (``LenbenchLM``); ``config_dir`` adds a user's preset folder
    (:func:`scaling_presets`).
    """
    logn = _coerce_param("logn", logn) if isinstance(logn, str) else bool(logn)
    oracle = bool(_coerce_param("oracle", oracle) if isinstance(oracle, str) else oracle)
    if isinstance(scaling, ScalingConfig):
        if params or logn or oracle:
            raise ValueError(
                "scaling is a ScalingConfig; put its parameters, logn and oracle inside it, not "
                "beside it."
            )
        return scaling
    if isinstance(scaling, Mapping):
        scaling = dict(OmegaConf.to_container(OmegaConf.create(dict(scaling)), resolve=True))
        keys = ("name", "method", "params", "logn", "target_length", "oracle")
        unknown = sorted(set(scaling) - set(keys))
        if unknown:
            raise ValueError(
                f"scaling mapping has unknown keys {unknown}; allowed keys: {', '.join(keys)}."
            )
        target = scaling.get("target_length")
        return _scaling_config(
            str(scaling.get("method", "default")),
            {**dict(scaling.get("params") or {}), **params},
            bool(scaling.get("logn", False)) or bool(logn),
            name or scaling.get("name"),
            oracle=bool(scaling.get("oracle", False)) or oracle,
            target_length=None if target is None else positive_int(target, "target_length"),
        )
    key = "none" if scaling in (None, "") else str(scaling)
    presets = scaling_presets(config_dir)
    if key in presets:
        preset = presets[key]
        return _scaling_config(
            str(preset["method"]),
            {**dict(preset.get("params") or {}), **params},
            bool(preset.get("logn", False)) or bool(logn),
            name
            or (
                str(preset.get("name", key)) + ("+logn" if logn and not preset.get("logn") else "")
            ),
            oracle=oracle,
        )
    if key not in SCALING_METHODS:
        allowed = sorted(set(presets) | set(SCALING_METHODS) | {"none", "logn"})
        raise ValueError(f"scaling {scaling!r} is unknown; allowed: {', '.join(allowed)}.")
    return _scaling_config(key, params, bool(logn), name, oracle=oracle)


def _scaling_config(
    method: str,
    params: dict,
    logn: bool,
    name: str | None,
    *,
    oracle: bool = False,
    target_length: int | None = None,
) -> ScalingConfig | None:
    if method not in SCALING_METHODS:
        raise ValueError(
            f"scaling method {method!r} is unknown; registered: {', '.join(sorted(SCALING_METHODS))}."
        )
    allowed_params = set(SCALING_METHODS[method].parameters)
    unknown = sorted(set(params) - allowed_params)
    if unknown:
        what = f"scaling method {method!r}" if method != "default" else "scaling none"
        raise ValueError(
            f"model argument(s) {unknown} are unknown for {what}; allowed scaling parameters: "
            f"{', '.join(sorted(allowed_params)) or 'none'} (other model arguments: {', '.join(MODEL_ARGS)})."
        )
    list_params = SCALING_METHODS[method].list_params
    kinds, auto_keys = _param_kinds(method), SCALING_METHODS[method].auto_keys
    coerced = {
        k: _coerce_typed(method, k, _coerce_param(k, v, list_params), kinds.get(k), k in auto_keys)
        for k, v in params.items()
    }
    if method == "default" and not logn:
        return None
    label = name or ("logn" if method == "default" else method + ("+logn" if logn else ""))
    return ScalingConfig(
        name=label,
        method=method,
        params=coerced,
        logn=bool(logn),
        target_length=target_length,
        oracle=oracle,
    )
