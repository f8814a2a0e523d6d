"""Evaluation metrics: a registry of metric functions, each with a typed YAML section.

Importing this package registers the built-in metrics (nll, passkey, the probes) in that order,
then every other module of this package (alphabetically), so a new metric is one module here:
its config dataclass holds the section's defaults and their comments (``conf/eval/*.yaml`` hold
only changes to them). ``EvalConfig`` is the eval config dataclass built from the registry
(:func:`bench.eval.metrics.config.eval_config_class`).
"""

from __future__ import annotations

from bench.core.checks import parse_length
from bench.eval.metrics import nll, passkey, probes, probes_position  # noqa: F401  (built-ins, in order)
from bench.eval.metrics.config import (
    EvalConfigBase,
    HarnessConfig,
    ResolvedEval,
    as_eval_config,
    eval_config_class,
)
from bench.eval.metrics.context import EvalContext, select_documents
from bench.eval.metrics.registry import (
    METRICS,
    BootstrapConfig,
    Metric,
    MetricConfig,
    grid_field,
    register_metric,
)
from models.discovery import import_package

import_package(__name__)  # metrics added as modules of this package (models.discovery)

__all__ = [
    "METRICS",
    "BootstrapConfig",
    "EvalConfig",
    "EvalConfigBase",
    "EvalContext",
    "HarnessConfig",
    "Metric",
    "MetricConfig",
    "ResolvedEval",
    "as_eval_config",
    "eval_config_class",
    "grid_field",
    "parse_length",
    "register_metric",
    "select_documents",
]


def __getattr__(name: str):
    if name == "EvalConfig":  # built on access, so that it has every metric registered so far
        return eval_config_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
