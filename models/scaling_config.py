"""The eval-time scaling setting and the rule that fixes its factor for a run.

:class:`ScalingConfig` names a registered method (``models.scaling``), its parameters and log-n.
A static method is deployed with one factor chosen for a target length, so a factor ``"auto"`` is
fixed once per run (:func:`run_scaling`) and used at every eval length; per-length factors are an
explicit, labelled oracle. :func:`resolve_params` makes the config shorthands concrete for a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "AUTO",
    "ORACLE_SUFFIX",
    "ScalingConfig",
    "resolve_params",
    "run_scaling",
]

AUTO = "auto"
ORACLE_SUFFIX = " (oracle)"  # results label of a factor set for each eval length


@dataclass
class ScalingConfig:
    """An eval-time context-extension setting: ``name`` labels results, ``method`` picks the function.

    A static factor ``"auto"`` (``factor``/``alpha``) is target_length / train_length, set once
    per run (:func:`run_scaling`): for ``target_length`` (tokens), else the run's longest eval
    length. ``oracle=True`` sets it for each eval length instead (an upper bound no deployed
    model has; its label says so). Neither changes a method without an ``"auto"`` factor.
    """

    name: str = "none"
    method: str = "default"
    params: dict = field(default_factory=dict)
    logn: bool = False
    target_length: int | None = None
    oracle: bool = False

    @property
    def auto_factor(self) -> bool:
        """Whether a static factor is still ``"auto"`` (not yet resolved to a number)."""
        return any(self.params.get(key) == AUTO for key in _auto_keys(self.method))

    @property
    def per_length(self) -> bool:
        """Whether the factor follows each eval length (``oracle`` with an ``"auto"`` factor)."""
        return self.oracle and self.auto_factor

    @property
    def identity(self) -> dict[str, Any]:
        """What the scaling applies, without its label: method, parameters and logn (the
        checkpoint key of a fine-tune, the ``scaling_params`` column, the cache's record)."""
        return {"method": self.method, "params": self.params, "logn": self.logn}

    @property
    def label(self) -> str:
        """The results label: ``name``, plus :data:`ORACLE_SUFFIX` for a per-length factor."""
        return self.name + ORACLE_SUFFIX if self.per_length else self.name


def resolve_params(
    scaling: ScalingConfig, *, train_length: int, eval_length: int | None, rotary_pairs: int
) -> dict:
    """``scaling.params`` with the config shorthands made concrete.

    ``factor``/``alpha`` "auto" is length / train_length (at least 1) for ``scaling.target_length``
    if set, else for ``eval_length``; with ``scaling.oracle`` always for ``eval_length`` (callers
    that measure several lengths fix one target per run first: :func:`run_scaling`). LongRoPE's
    per-dimension factors come from a search on a pretrained model, which tiny models lack: a
    number is repeated for every one of the ``rotary_pairs``, and "ramp" rises geometrically from
    1 (highest frequency, kept) to ``factor`` (lowest, fully interpolated). Which parameters take
    one value per pair is the method's ``list_params``.
    """
    length = eval_length if scaling.oracle else scaling.target_length or eval_length
    params = _auto_factors(scaling, length, train_length)
    method = _registered(scaling.method)
    if method is not None:
        for key in method.list_params:
            value = params.get(key)
            if value == "ramp":
                top = float(params.get("factor", 1.0))
                params[key] = [top ** (i / max(rotary_pairs - 1, 1)) for i in range(rotary_pairs)]
            elif isinstance(value, (int, float)):
                params[key] = [float(value)] * rotary_pairs
    return params


def _registered(method: str):
    """The registered ``models.scaling.ScalingMethod`` named ``method``, or None (refused later).

    Imported here, not at the top: the report reads ``ORACLE_SUFFIX`` from this module and must
    not import torch.
    """
    from models.scaling import SCALING_METHODS

    return SCALING_METHODS.get(method)


def _auto_keys(method: str) -> tuple[str, ...]:
    """The parameters of ``method`` that accept "auto" (none for an unknown name)."""
    registered = _registered(method)
    return registered.auto_keys if registered is not None else ()


def _check_target(scaling: ScalingConfig) -> None:
    if scaling.oracle and scaling.target_length is not None:
        raise ValueError(
            f"scaling oracle=True sets the factor for each eval length and target_length="
            f"{scaling.target_length} sets one for the run; give one of them."
        )


def _auto_factors(scaling: ScalingConfig, length: int | None, train_length: int) -> dict:
    """``scaling.params`` with every "auto" value set for ``length``: max(1, length / train_length),
    or by the method's ``auto_rule``."""
    _check_target(scaling)
    params = dict(scaling.params)
    keys = [key for key in _auto_keys(scaling.method) if params.get(key) == AUTO]
    if not keys:
        return params
    if length is None:
        raise ValueError(
            f"scaling {keys[0]} 'auto' needs an eval length (or a target_length) to resolve against."
        )
    rule = _registered(scaling.method).auto_rule
    if rule is not None:  # the method's own rule (training-free windows and group sizes)
        return rule(params, int(length), int(train_length))
    for key in keys:
        params[key] = max(1.0, length / train_length)
    return params


def run_scaling(
    scaling: ScalingConfig, *, train_length: int, lengths: Sequence[int]
) -> ScalingConfig:
    """The scaling a run applies at every one of its eval ``lengths``: one factor per run.

    A static method is deployed with one factor chosen for a target length, so each "auto" factor
    becomes target / train_length (at least 1) for ``scaling.target_length``, else the longest of
    ``lengths``, and ``target_length`` records the target. Unchanged: an oracle scaling (its
    factor follows each eval length) and a scaling without an "auto" factor (fixed numbers, or a
    method that reads the current sequence length itself: dynamic, longrope's switch, log-n).
    """
    _check_target(scaling)
    if scaling.target_length is not None and scaling.target_length < train_length:
        raise ValueError(
            f"scaling.target_length {scaling.target_length} is below the training length "
            f"{train_length}; allowed: at least {train_length} (a factor >= 1)."
        )
    if not scaling.auto_factor or scaling.oracle:
        return scaling
    target = scaling.target_length or (max(lengths) if len(lengths) else None)
    params = _auto_factors(scaling, target, train_length)
    return replace(scaling, params=params, target_length=int(target))
