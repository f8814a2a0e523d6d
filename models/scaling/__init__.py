"""RoPE frequency scaling methods ("context extension"), one small function per method.

A package: :mod:`models.scaling.registry` holds the registry and the public calls, and every
other module of this folder holds methods (``frequencies``, ``training_free``), found by the one
discovery rule (:func:`models.discovery.import_package`): a new method is one new module here
(or in a package named in ``extensions``) and one YAML in ``conf/scaling/``.

Modelled on Hugging Face transformers' ``modeling_rope_utils``: each method is a pure
function registered by name in :data:`SCALING_METHODS`, and :func:`rope_parameters`
turns ``(method name, geometry, method parameters)`` into the inverse frequencies and
the attention factor a rotary layer needs.  Parameter names follow transformers'
``rope_parameters`` keys so configs translate one to one; our ``original_length`` (the
training length) plays transformers' ``original_max_position_embeddings`` (and, for
``dynamic``, its ``max_position_embeddings``).  :func:`applicable_methods` says which methods
mean something for which position family; the eval-time setting that names a method and its
parameters, and the rule that fixes its factor for a run, are in :mod:`models.scaling_config`.
The training-free methods (Self-Extend, ReRoPE, Leaky ReRoPE, StreamingLLM) are registered here
too (``pair_method``): instead of frequencies each returns a :class:`PairPositions`, the
positions at which a query-key pair beyond its window is scored, which the attention applies.

Why the numerics look the way they do:

* The exponents ``2i / r`` are built exactly like transformers does
  (``arange(0, r, 2)`` as int64, cast to float32, divided by ``r`` in float32), so the
  same rounding enters both; the rest is computed in float64 and only the result is
  cast to float32.  The frequencies therefore agree with transformers' to within float32
  rounding, for any rotary dimension.
* Every parameter is validated up front, by transformers' rule: a value its validation
  accepts silently and its computation can evaluate is accepted and gives transformers'
  result (also its "0 or None = not set" for YaRN's ``beta_fast``, ``beta_slow``,
  ``mscale``, ``mscale_all_dim``); a value it warns about, or cannot compute (division by
  zero, log of a negative, infinite frequencies), is refused with one sentence naming it.
  Stricter on types only: numbers must be numbers (not bools), ``truncate`` a bool.
"""

from __future__ import annotations

from models.discovery import import_package
from models.scaling.registry import (
    AUTO_PROBE_RATIO,
    CAPABILITIES,
    EVERY_FAMILY,
    SCALING_METHODS,
    PairPositions,
    RopeGeometry,
    ScalingFn,
    ScalingMethod,
    applicable_methods,
    default_inv_freq,
    frequencies_change,
    logn_factor,
    pair_positions,
    register_scaling,
    rope_parameters,
    scaling_method,
)

__all__ = [
    "AUTO_PROBE_RATIO",
    "CAPABILITIES",
    "EVERY_FAMILY",
    "SCALING_METHODS",
    "PairPositions",
    "RopeGeometry",
    "ScalingFn",
    "ScalingMethod",
    "applicable_methods",
    "default_inv_freq",
    "frequencies_change",
    "logn_factor",
    "ntk_base",
    "pair_positions",
    "register_scaling",
    "rope_parameters",
    "scaling_method",
]

from models.scaling import frequencies, training_free  # noqa: E402, F401, I001  (built-ins first, in order)

import_package(__name__)  # the methods: every module of this folder

from models.scaling.frequencies import ntk_base  # noqa: E402  (a method's helper, public)
