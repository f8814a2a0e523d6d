"""RoPE frequency scaling methods ("context extension"), one small function per method.

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

import functools
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

from models.lazy import torch

__all__ = [
    "AUTO_PROBE_RATIO",
    "CAPABILITIES",
    "PairPositions",
    "EVERY_FAMILY",
    "SCALING_METHODS",
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


@dataclass(frozen=True)
class RopeGeometry:
    """What every scaling method may look at, already validated.

    ``rotary_dim`` is r (even, > 0), ``base`` the RoPE base b (> 1), ``original_length``
    the training length L, ``seq_len`` the length the frequencies are computed for (only
    ``dynamic`` and ``longrope`` use it; for them it is ``max(position_id) + 1``).
    """

    rotary_dim: int
    base: float
    original_length: int
    seq_len: int


ScalingFn = Callable[..., "tuple[torch.Tensor, float]"]
"""``fn(geometry, **params) -> (inv_freq float64 [r/2], attention_factor)``."""

#: ``applies_to`` value of a method that applies to every position family (only ``default``).
EVERY_FAMILY = "*"
#: What a scaling method can act on; each position family lists the ones it has
#: (``models.positions.Family.capabilities``): ``positions`` (position ids or distances, which
#: position interpolation divides: a method acting on them returns the default frequencies divided
#: by one factor, which a family without frequencies reads as its position transform,
#: ``models.resolved_scaling``), ``frequencies`` (a sinusoid's inverse frequencies, which NTK
#: rescales), ``rotary`` (per-rotary-pair frequencies: YaRN, Llama-3, LongRoPE) and ``pairs``
#: (the position signal of a query-key pair is a function of the two positions alone, so a
#: training-free method may score a pair at other positions: RoPE by a rotation, a score bias by
#: its function; NoPE trivially. Not xPos, whose keys also scale, nor CoPE or absolute ones).
CAPABILITIES = ("positions", "frequencies", "rotary", "pairs")
#: A method is probed with its "auto" parameters set for a target of this many training lengths
#: (where it is registered, and where it is set on a model): one that changes nothing there is
#: refused, since every row labelled with it would equal the raw model's.
AUTO_PROBE_RATIO = 4
#: the probe geometry of a registration: rotary dimension, base, training length
_PROBE = (64, 10000.0, 256)


@dataclass(frozen=True)
class ScalingMethod:
    """A registered scaling method: its function and the facts the rest of the code asks about.

    Declared once, where the method is registered (:func:`register_scaling`), so that no side list
    has to remember a new method: what it acts on (``applies_to``: capabilities a family must
    have, :data:`CAPABILITIES`, or :data:`EVERY_FAMILY`), whether its frequencies
    depend on the current sequence length (``length_dependent``: the model then builds one table
    per length), which parameters accept ``"auto"`` (set from the target length), and which take
    one value per rotary pair (``list_params``), and whether it is a training-free method that
    scores each query-key pair at its own positions (``pair_method``: its function returns a
    :class:`PairPositions`, the frequencies stay the default ones) with the rule that sets its
    "auto" parameters (``auto_rule``; default: target / training length).
    """

    name: str
    fn: ScalingFn
    applies_to: tuple[str, ...]
    length_dependent: bool = False
    auto_keys: tuple[str, ...] = ()
    list_params: tuple[str, ...] = ()
    pair_method: bool = False
    auto_rule: Callable[[dict, int, int], dict] | None = None

    def __call__(self, geometry: RopeGeometry, **params: Any) -> tuple[torch.Tensor, float]:
        return self.fn(geometry, **params)

    @property
    def parameters(self) -> tuple[str, ...]:
        """The names the method accepts: its function's keyword-only parameters."""
        return tuple(_method_params(self.fn)[0])

    def applies(self, capabilities: Sequence[str]) -> bool:
        """Whether the method means something for a family with these capabilities.

        A family reads what the method acts on: frequencies where it has them, else the position
        transform (one factor per run, ``models.resolved_scaling``); so a length-dependent method
        applies only to a family with frequencies (``frequencies`` or ``rotary``).
        """
        if EVERY_FAMILY in self.applies_to:
            return True
        caps = set(capabilities)
        if not set(self.applies_to) <= caps:
            return False
        return not (self.length_dependent and not caps & {"frequencies", "rotary"})


SCALING_METHODS: dict[str, ScalingMethod] = {}
"""Registered scaling methods by name, in registration order; the keyword-only parameters of each
function are exactly the parameters that method accepts (parameters without a default are
required)."""
_PROBED: set[str] = set()  # the methods that passed their first-lookup probe


def register_scaling(
    name: str,
    *,
    applies_to: Sequence[str] = ("rotary",),
    length_dependent: bool = False,
    auto_keys: Sequence[str] = (),
    list_params: Sequence[str] = (),
    pair_method: bool = False,
    auto_rule: Callable[[dict, int, int], dict] | None = None,
) -> Callable[[ScalingFn], ScalingFn]:
    """Register ``fn(geometry: RopeGeometry, *, <params>) -> (inv_freq, attention_factor)``, or
    with ``pair_method`` ``fn(train_length: int, *, <params>) -> PairPositions``.

    Adding a method is one decorated function: its keyword-only parameters define which
    names :func:`rope_parameters` accepts, so unknown names are rejected automatically; the
    keyword arguments here are the method's facts (:class:`ScalingMethod`). ``auto_rule(params,
    target_length, train_length) -> params`` resolves the "auto" values of ``auto_keys`` (default:
    each becomes max(1, target / train_length)).

    A method that changes nothing is refused (one sentence): at its first lookup
    (:func:`scaling_method`), where every required parameter takes "auto" and so can be probed
    (set for an :data:`AUTO_PROBE_RATIO` x target), and again where it is set on a model, for that
    family (``models.resolved_scaling.resolve``).
    """

    def decorator(fn: ScalingFn) -> ScalingFn:
        if name in SCALING_METHODS:
            raise ValueError(f"Scaling method {name!r} is already registered.")
        positional = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(positional) != 1:
            raise ValueError(
                f"Scaling function {fn.__name__!r} must take exactly one positional argument "
                f"(the RopeGeometry) and keyword-only parameters, got {len(positional)} positional."
            )
        unknown_caps = sorted(set(applies_to) - {EVERY_FAMILY, *CAPABILITIES})
        if unknown_caps:
            raise ValueError(
                f"Scaling method {name!r} applies to {unknown_caps}; allowed: "
                f"{', '.join(CAPABILITIES)} or {EVERY_FAMILY!r}."
            )
        accepted = set(_method_params(fn)[0])
        for what, keys in (("auto_keys", auto_keys), ("list_params", list_params)):
            unknown = sorted(set(keys) - accepted)
            if unknown:
                raise ValueError(
                    f"Scaling method {name!r} declares {what} {unknown}, which its function does "
                    f"not accept; its parameters: {sorted(accepted) or 'none'}."
                )
        method = ScalingMethod(
            name,
            fn,
            tuple(applies_to),
            bool(length_dependent),
            tuple(auto_keys),
            tuple(list_params),
            bool(pair_method),
            auto_rule,
        )
        SCALING_METHODS[name] = method  # probed at its first lookup (scaling_method)
        _PROBED.discard(name)
        return fn

    return decorator


def frequencies_change(method: ScalingMethod, geometry: RopeGeometry, params: dict) -> bool:
    """Whether ``method`` with ``params`` gives other frequencies (beyond float64 rounding) or
    another attention factor than the default ones at ``geometry`` (not for a pair method)."""
    inv_freq, attention_factor = method(geometry, **params)
    default = default_inv_freq(geometry.rotary_dim, geometry.base)
    same = inv_freq.shape == default.shape and torch.allclose(
        inv_freq.to(torch.float64), default, rtol=1e-9, atol=0.0
    )
    return float(attention_factor) != 1.0 or not same


def _changes_nothing(method: ScalingMethod) -> bool:
    """Whether a method being registered changes nothing at the probe: its "auto" parameters set
    for an AUTO_PROBE_RATIO x target (by its ``auto_rule``, else that ratio), at a probe geometry.
    Only a method whose required parameters all take "auto" can be probed here (the others are
    probed where they are set on a model, ``models.resolved_scaling``); a pair method always
    changes the pairs, and the raw model (a method for every family) changes nothing by design."""
    if method.pair_method or EVERY_FAMILY in method.applies_to:
        return False
    allowed, required = _method_params(method.fn)
    if not required <= set(method.auto_keys):
        return False
    rotary_dim, base, length = _PROBE
    target = AUTO_PROBE_RATIO * length
    params = dict.fromkeys(method.auto_keys, "auto")
    if method.auto_rule is not None:
        params = method.auto_rule(params, target, length)
    else:
        params = dict.fromkeys(method.auto_keys, float(AUTO_PROBE_RATIO))
    try:
        return not frequencies_change(
            method, RopeGeometry(rotary_dim, base, length, target), params
        )
    except (ValueError, TypeError, NameError):  # refused, or a helper defined later in its
        return False  # module: the probe says nothing (the method is probed again where set)


def _method_params(fn: ScalingFn) -> tuple[set[str], set[str]]:
    """(allowed, required) parameter names of a registered function."""
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    allowed = {p.name for p in params}
    required = {p.name for p in params if p.default is inspect.Parameter.empty}
    return allowed, required


def scaling_method(name: str) -> ScalingMethod:
    """The registered method ``name``; an unknown name is one sentence listing the registered ones.

    The first lookup of a method probes it (:func:`_changes_nothing`; the probe computes
    frequencies, so it runs here and not at registration, where checking a config would load
    torch): one that changes nothing is removed from the registry and refused in one sentence.
    """
    if name not in SCALING_METHODS:
        raise ValueError(
            f"scaling method {name!r} is unknown; registered: {', '.join(SCALING_METHODS)}."
        )
    method = SCALING_METHODS[name]
    if name not in _PROBED:
        if _changes_nothing(method):
            del SCALING_METHODS[name]
            raise ValueError(
                f"Scaling method {name!r} changes nothing: with its auto parameters set for a "
                f"{AUTO_PROBE_RATIO:g}x target its frequencies and attention factor are the default "
                f"ones, so every row labelled {name!r} would equal the raw model's."
            )
        _PROBED.add(name)
    return method


def applicable_methods(position_kind: str) -> tuple[str, ...]:
    """Names of the registered scaling methods that apply to a position family (each may add logn).

    A method declares what it acts on where it is registered (``applies_to``) and a family what it
    has (``Family.capabilities``): position interpolation needs positions, NTK and dynamic NTK a
    sinusoid's frequencies, YaRN, Llama-3 and LongRoPE per-rotary-pair frequencies; a family
    without any (ALiBi, NoPE) takes only ``default``.
    """
    from models.positions import family as position_family  # checks the name

    capabilities = position_family(position_kind).capabilities
    return tuple(n for n, m in SCALING_METHODS.items() if m.applies(capabilities))


# ----------------------------------------------------------------------------- validation


def _number(method: str, key: str, value: Any) -> float:
    """A finite real number (bools and strings such as an unresolved "auto" are rejected)."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise ValueError(f"{method}: {key} must be a finite number, got {value!r}.")
    return float(value)


def _at_least(method: str, key: str, value: Any, minimum: float) -> float:
    x = _number(method, key, value)
    if x < minimum:
        raise ValueError(f"{method}: {key} must be >= {minimum:g}, got {value!r}.")
    return x


def _positive(method: str, key: str, value: Any) -> float:
    x = _number(method, key, value)
    if x <= 0:
        raise ValueError(f"{method}: {key} must be > 0, got {value!r}.")
    return x


def _nonzero(method: str, key: str, value: Any, why: str) -> float:
    x = _number(method, key, value)
    if x == 0:
        raise ValueError(f"{method}: {key} must be nonzero ({why}), got {value!r}.")
    return x


def _unset_or_positive(method: str, key: str, value: Any, default: float) -> float:
    """transformers' ``value or default``: 0 or None means the default; negatives are refused."""
    if value is None:
        return default
    x = _number(method, key, value)
    if x < 0:
        raise ValueError(
            f"{method}: {key} must be > 0, or 0 / None for the default {default:g}, got {value!r}."
        )
    return x or default


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value <= 0:
        raise ValueError(f"{key} must be a positive integer, got {value!r}.")
    return int(value)


def _ntk_exponent(method: str, rotary_dim: int) -> float:
    """r / (r - 2), the NTK-aware base exponent; undefined for r = 2."""
    if rotary_dim <= 2:
        raise ValueError(
            f"{method}: needs a rotary dimension > 2 (the base exponent is r/(r-2)), got r={rotary_dim}."
        )
    return rotary_dim / (rotary_dim - 2)


# ----------------------------------------------------------------------------- building blocks


def default_inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    """theta_i = base^(-2i/r), i = 0..r/2-1, float64.

    The exponent is formed as transformers forms it (int64 arange -> float32, divided by
    r in float32) so its rounding matches theirs; the power itself is taken in float64.
    """
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return 1.0 / (base ** exponent.double())


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature g(s, m) = 0.1 m ln s + 1 (1 for s <= 1)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _yarn_correction_dim(num_rotations: float, rotary_dim: int, base: float, length: int) -> float:
    """Dimension index whose wavelength fits ``num_rotations`` times into ``length``."""
    return (rotary_dim * math.log(length / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


# ----------------------------------------------------------------------------- methods


@register_scaling("default", applies_to=(EVERY_FAMILY,))
def _default(geometry: RopeGeometry) -> tuple[torch.Tensor, float]:
    """Plain RoPE: theta_i = b^(-2i/r)."""
    return default_inv_freq(geometry.rotary_dim, geometry.base), 1.0


@register_scaling("linear", applies_to=("positions",), auto_keys=("factor",))
def _linear(geometry: RopeGeometry, *, factor: float) -> tuple[torch.Tensor, float]:
    """Position interpolation (Chen et al. 2023): theta_i / s, i.e. positions divided by s."""
    s = _at_least("linear", "factor", factor, 1.0)
    return default_inv_freq(geometry.rotary_dim, geometry.base) / s, 1.0


@register_scaling("ntk", applies_to=("frequencies",), auto_keys=("alpha",))
def _ntk(geometry: RopeGeometry, *, alpha: float) -> tuple[torch.Tensor, float]:
    """Static NTK-aware scaling (YaRN repo): base' = b * alpha^(r/(r-2)).

    The exponent is chosen so the highest frequency (theta_0 = 1) is unchanged and the
    lowest one is divided by exactly alpha: extrapolate high frequencies, interpolate low.
    """
    base = ntk_base(geometry.base, alpha, geometry.rotary_dim)
    return default_inv_freq(geometry.rotary_dim, base), 1.0


def ntk_base(base: float, alpha: float, rotary_dim: int) -> float:
    """Static NTK-aware base b * alpha^(r/(r-2)): with it, RoPE's default frequencies are
    :func:`_ntk`'s (what a pretrained model's default rope type gets for ``ntk``)."""
    a = _positive("ntk", "alpha", alpha)
    return base * a ** _ntk_exponent("ntk", rotary_dim)


@register_scaling(
    "dynamic", applies_to=("frequencies",), length_dependent=True, auto_keys=("factor",)
)
def _dynamic(geometry: RopeGeometry, *, factor: float) -> tuple[torch.Tensor, float]:
    """Dynamic NTK (transformers' ``dynamic``): the base grows with the current length.

    seq' = max(seq_len, L); base' = b * (s * seq'/L - (s - 1))^(r/(r-2)).  ``factor`` is
    a multiplier on the length ratio, not the target ratio: at seq' = L nothing changes.
    ``factor`` >= 1, as transformers' validation requires.
    """
    s = _at_least("dynamic", "factor", factor, 1.0)
    r = geometry.rotary_dim
    length = max(geometry.seq_len, geometry.original_length)
    ratio = s * length / geometry.original_length - (s - 1)
    base = geometry.base * ratio ** _ntk_exponent("dynamic", r)
    return default_inv_freq(r, base), 1.0


@register_scaling("yarn", auto_keys=("factor",))
def _yarn(
    geometry: RopeGeometry,
    *,
    factor: float,
    beta_fast: float | None = 32.0,
    beta_slow: float | None = 1.0,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    attention_factor: float | None = None,
    truncate: bool = True,
) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023): interpolate low frequencies, keep high ones, blend between.

    Dimensions rotating fewer than ``beta_slow`` times over L are divided by s, those
    rotating more than ``beta_fast`` times are kept, with a linear ramp over the index
    range [low, high] in between; ``high`` is clamped to r - 1 (not r/2 - 1), as in
    transformers.  The attention factor multiplies cos and sin, so logits scale by its
    square: explicit ``attention_factor`` (>= 0), else g(s, mscale)/g(s, mscale_all_dim)
    when both are nonzero, else g(s, 1).  As in transformers' ``_compute_yarn_parameters``,
    0 or None means "not set": ``beta_fast`` 32, ``beta_slow`` 1, and an unset ``mscale``
    or ``mscale_all_dim`` (DeepSeek-style ``mscale_all_dim: 0``) leaves g(s, 1).
    """
    s = _at_least("yarn", "factor", factor, 1.0)
    fast = _unset_or_positive("yarn", "beta_fast", beta_fast, 32.0)
    slow = _unset_or_positive("yarn", "beta_slow", beta_slow, 1.0)
    if fast < slow:
        raise ValueError(
            f"yarn: beta_fast must be >= beta_slow, got beta_fast={beta_fast!r}, beta_slow={beta_slow!r}."
        )
    if not isinstance(truncate, bool):
        raise ValueError(f"yarn: truncate must be True or False, got {truncate!r}.")
    m = 0.0 if mscale is None else _number("yarn", "mscale", mscale)
    m_all = 0.0 if mscale_all_dim is None else _number("yarn", "mscale_all_dim", mscale_all_dim)

    if attention_factor is not None:
        attn = _at_least("yarn", "attention_factor", attention_factor, 0.0)
    elif m and m_all:
        if _yarn_mscale(s, m_all) == 0:
            raise ValueError(
                f"yarn: mscale_all_dim={mscale_all_dim!r} makes the attention factor's denominator "
                f"0.1 * mscale_all_dim * ln(factor) + 1 zero at factor={factor!r}."
            )
        attn = _yarn_mscale(s, m) / _yarn_mscale(s, m_all)
    else:
        attn = _yarn_mscale(s)

    r, b, length = geometry.rotary_dim, geometry.base, geometry.original_length
    low = _yarn_correction_dim(fast, r, b, length)
    high = _yarn_correction_dim(slow, r, b, length)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, r - 1)
    if low == high:
        high += 0.001  # avoid 0/0, as transformers does

    ramp = ((torch.arange(r // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    theta = default_inv_freq(r, b)
    return (theta / s) * ramp + theta * (1 - ramp), attn


@register_scaling("llama3", auto_keys=("factor",))
def _llama3(
    geometry: RopeGeometry,
    *,
    factor: float,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
) -> tuple[torch.Tensor, float]:
    """Llama 3.1 scaling: wavelengths longer than L/low_freq_factor are divided by s,
    shorter than L/high_freq_factor kept, and smoothly blended in between.

    Defaults are Meta's Llama 3.1 values (1 and 4); transformers has no defaults.
    """
    s = _at_least("llama3", "factor", factor, 1.0)
    lf = _nonzero(
        "llama3", "low_freq_factor", low_freq_factor, "L / low_freq_factor is a wavelength"
    )
    hf = _nonzero(
        "llama3", "high_freq_factor", high_freq_factor, "L / high_freq_factor is a wavelength"
    )
    if hf <= lf:
        raise ValueError(
            "llama3: high_freq_factor must be > low_freq_factor, got "
            f"high_freq_factor={high_freq_factor!r}, low_freq_factor={low_freq_factor!r}."
        )
    length = geometry.original_length
    theta = default_inv_freq(geometry.rotary_dim, geometry.base)
    wavelen = 2 * math.pi / theta
    low_freq_wavelen, high_freq_wavelen = length / lf, length / hf

    smooth = (length / wavelen - lf) / (hf - lf)
    blended = (1 - smooth) * theta / s + smooth * theta
    out = torch.where(wavelen > low_freq_wavelen, theta / s, theta)
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, blended, out), 1.0


@register_scaling(
    "longrope",
    length_dependent=True,
    auto_keys=("factor",),
    list_params=("short_factor", "long_factor"),
)
def _longrope(
    geometry: RopeGeometry,
    *,
    short_factor: Sequence[float],
    long_factor: Sequence[float],
    factor: float | None = None,
    attention_factor: float | None = None,
) -> tuple[torch.Tensor, float]:
    """LongRoPE (Ding et al. 2024; Phi-3): per-dimension rescale factors, theta_i / ext_i.

    ``long_factor`` is used when seq_len > L (strictly), else ``short_factor``.  The
    attention factor depends only on the static ``factor`` (transformers derives it as
    max_position_embeddings / original_max_position_embeddings when absent; pass that
    ratio here), so it also applies to short sequences: explicit ``attention_factor``,
    else 1 if s <= 1, else sqrt(1 + ln s / ln L).
    """
    half = geometry.rotary_dim // 2
    factors = {}
    for key, values in (("short_factor", short_factor), ("long_factor", long_factor)):
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise ValueError(f"longrope: {key} must be a list of {half} numbers, got {values!r}.")
        if len(values) != half:
            raise ValueError(
                f"longrope: {key} must have length rotary_dim/2 = {half}, got length {len(values)}."
            )
        factors[key] = [
            _nonzero("longrope", f"{key}[{i}]", v, "theta_i / 0 is infinite")
            for i, v in enumerate(values)
        ]

    s = None if factor is None else _at_least("longrope", "factor", factor, 1.0)
    if attention_factor is not None:
        attn = _at_least("longrope", "attention_factor", attention_factor, 0.0)
    elif s is None:
        raise ValueError(
            "longrope: give factor (target length / original_length, transformers' "
            "max_position_embeddings / original_max_position_embeddings) or attention_factor; "
            "got neither."
        )
    else:
        attn = 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(geometry.original_length))

    use_long = geometry.seq_len > geometry.original_length
    ext = torch.tensor(factors["long_factor" if use_long else "short_factor"], dtype=torch.float64)
    return default_inv_freq(geometry.rotary_dim, geometry.base) / ext, attn


# ----------------------------------------------------------------------------- training-free


@dataclass(frozen=True)
class PairPositions:
    """Where a training-free method scores each query-key pair (Self-Extend, ReRoPE, StreamingLLM).

    A pair of query position i and key position j with i - j < ``window`` is scored at its own
    positions; a farther pair as if the query stood at ``far_query(i)`` and the key at
    ``far_key(j)`` (float64 tensors in, float64 out; for RoPE the logit depends only on their
    difference, the relative position the method assigns). With ``sinks`` set, a farther pair
    attends only when j < sinks (StreamingLLM's attention sinks) and is masked otherwise.
    ``anchored``: positions are counted from the row's first token (StreamingLLM's cache
    positions, which ignore the position ids it is given), so i and j above are position ids
    minus the row's first one, and the query stands at ``far_query(i)`` for every pair, near ones
    too (the key at the same distance from there), as the repo's pos_shift puts it: whatever
    reads the query's position (a score bias's i such as FIRE's normaliser, log-n) reads that one;
    otherwise they are the position ids themselves (Self-Extend and ReRoPE group or clip the ids
    they are given, as their reference patches do, and near pairs keep them).
    """

    window: int
    far_query: Callable[[torch.Tensor], torch.Tensor]
    far_key: Callable[[torch.Tensor], torch.Tensor]
    sinks: int | None = None
    anchored: bool = False

    def relative(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """The relative position each pair is scored at, float64, broadcast of q_pos - k_pos
        (the dense reference of tests and docs; masked pairs included)."""
        q64, k64 = q_pos.to(torch.float64), k_pos.to(torch.float64)
        far = self.far_query(q64) - self.far_key(k64)
        return torch.where(q64 - k64 < self.window, q64 - k64, far)

    def visible(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Whether each (causal) pair may attend: always, except far pairs past the sinks."""
        near = q_pos - k_pos < self.window
        if self.sinks is None:
            return torch.ones_like(near)
        return near | (k_pos < self.sinks)


def _window(method: str, window: Any) -> int:
    if isinstance(window, bool) or not isinstance(window, Integral) or window < 1:
        raise ValueError(f"{method}: window must be a positive integer (tokens), got {window!r}.")
    return int(window)


def _quarter_window(params: dict, train_length: int) -> dict:
    """``window: auto`` -> a quarter of the training length (at least 1)."""
    if params.get("window") == "auto":
        params["window"] = max(1, train_length // 4)
    return params


def _window_inside(method: str, key: str, params: dict, train_length: int) -> int:
    """The resolved window, which ``key`` auto needs below the training length (the far
    positions it sets must fit in the trained range)."""
    window = _window(method, params.get("window"))
    if window >= train_length:
        raise ValueError(
            f"{method}: window {window} must be below the training length {train_length} for "
            f"{key} auto (the far positions must fit in the trained range)."
        )
    return window


def _group_floor(positions: torch.Tensor, group: int, shift: int = 0) -> torch.Tensor:
    return torch.div(positions, group, rounding_mode="floor") + shift


def _affine(positions: torch.Tensor, slope: float, shift: float) -> torch.Tensor:
    return positions * slope + shift


def _capped(positions: torch.Tensor, cap: int) -> torch.Tensor:
    return positions.clamp(max=cap)


def _self_extend_auto(params: dict, target: int, train_length: int) -> dict:
    """window auto: a quarter of L; group_size auto: the smallest integer G for which the farthest
    pair of a ``target``-token input, floor((T - 1) / G) + W - floor(W / G), stays below L."""
    params = _quarter_window(params, train_length)
    if params.get("group_size") == "auto":
        window = _window_inside("self_extend", "group_size", params, train_length)
        group = 1
        while (target - 1) // group + window - window // group > train_length - 1:
            group += 1
        params["group_size"] = group
    return params


@register_scaling(
    "self_extend",
    applies_to=("rotary", "pairs"),
    auto_keys=("group_size", "window"),
    pair_method=True,
    auto_rule=_self_extend_auto,
)
def _self_extend(train_length: int, *, group_size: int, window: int) -> PairPositions:
    """Self-Extend (Jin et al. 2024; LongLM ``self_extend_patch``): pairs closer than the
    neighbour ``window`` W keep their positions; farther ones are scored at grouped positions,
    the query at floor(i / G) + W - floor(W / G) and the key at floor(j / G), G = ``group_size``."""
    if isinstance(group_size, bool) or not isinstance(group_size, Integral) or group_size < 1:
        raise ValueError(f"self_extend: group_size must be a positive integer, got {group_size!r}.")
    w, g = _window("self_extend", window), int(group_size)
    return PairPositions(
        w,
        functools.partial(_group_floor, group=g, shift=w - w // g),
        functools.partial(_group_floor, group=g),
    )


@register_scaling(
    "rerope",
    applies_to=("rotary", "pairs"),
    auto_keys=("window",),
    pair_method=True,
    auto_rule=lambda params, target, train_length: _quarter_window(params, train_length),
)
def _rerope(train_length: int, *, window: int) -> PairPositions:
    """ReRoPE (Su 2023; bojone/rerope): relative positions clipped at ``window`` W, i.e. a far
    pair is scored with the query at W and the key at 0. bojone's patch also applies log-n
    (here ``scaling.logn=true``)."""
    w = _window("rerope", window)
    return PairPositions(
        w,
        functools.partial(_affine, slope=0.0, shift=float(w)),
        functools.partial(_affine, slope=0.0, shift=0.0),
    )


def _leaky_auto(params: dict, target: int, train_length: int) -> dict:
    """window auto: a quarter of L; slope auto: the largest slope 1/k <= 1 for which the farthest
    pair of a ``target``-token input, W + (T - 1 - W) / k, stays within L - 1."""
    params = _quarter_window(params, train_length)
    if params.get("slope") == "auto":
        window = _window_inside("leaky_rerope", "slope", params, train_length)
        far = target - 1 - window
        params["slope"] = 1.0 if far <= 0 else min(1.0, (train_length - 1 - window) / far)
    return params


@register_scaling(
    "leaky_rerope",
    applies_to=("rotary", "pairs"),
    auto_keys=("window", "slope"),
    pair_method=True,
    auto_rule=_leaky_auto,
)
def _leaky_rerope(train_length: int, *, window: int, slope: float) -> PairPositions:
    """Leaky ReRoPE (Su 2023; bojone/rerope ``leaky_rerope_patch``): relative positions past the
    window W grow with ``slope`` 1/k, W + (i - j - W) / k: the query at i / k + W (1 - 1 / k), the
    key at j / k. Slope 0 is ReRoPE, slope 1 the raw model."""
    w = _window("leaky_rerope", window)
    a = _number("leaky_rerope", "slope", slope)
    if not 0 <= a <= 1:
        raise ValueError(f"leaky_rerope: slope must be in [0, 1], got {slope!r}.")
    return PairPositions(
        w,
        functools.partial(_affine, slope=a, shift=w * (1 - a)),
        functools.partial(_affine, slope=a, shift=0.0),
    )


def _streaming_auto(params: dict, target: int, train_length: int) -> dict:
    """window auto: the training length less the sinks (the whole cache fits the trained range)."""
    if params.get("window") == "auto":
        sinks = params.get("sink_tokens", 4)
        if isinstance(sinks, Integral) and not isinstance(sinks, bool):
            params["window"] = max(1, train_length - int(sinks))
    return params


@register_scaling(
    "streaming",
    applies_to=("pairs",),
    auto_keys=("window",),
    pair_method=True,
    auto_rule=_streaming_auto,
)
def _streaming(train_length: int, *, window: int, sink_tokens: int = 4) -> PairPositions:
    """StreamingLLM (Xiao et al. 2024; mit-han-lab/streaming-llm): each query sees the first
    ``sink_tokens`` tokens (attention sinks) and the ``window`` most recent ones, itself included,
    at their positions in that cache: keys keep their distances, the query stands at most at
    sinks + window - 1, counted from the row's first token whatever its position id (the repo
    re-positions the cache from 0; whatever reads the query's position, FIRE's normaliser or
    log-n, reads that one). The repo's ``recent_size`` is window - 1 (its new token joins the cache);
    ``sink_tokens`` 0 is plain window attention. Keys outside are masked, not evicted: the same
    logits as the repo's eviction, without its bounded memory."""
    w = _window("streaming", window)
    if isinstance(sink_tokens, bool) or not isinstance(sink_tokens, Integral) or sink_tokens < 0:
        raise ValueError(f"streaming: sink_tokens must be an integer >= 0, got {sink_tokens!r}.")
    s = int(sink_tokens)
    if s >= train_length:  # every key of a trained-length input is a sink: plain attention
        raise ValueError(
            f"streaming: sink_tokens {s} must be below the training length {train_length} "
            "(sinks covering the trained range leave plain attention, not StreamingLLM)."
        )
    if w < 2:
        raise ValueError(
            f"streaming: window {w} must be at least 2 (a query would see only itself besides "
            f"the {s} sink tokens); lower sink_tokens or set a larger window."
        )
    return PairPositions(
        w, functools.partial(_capped, cap=s + w - 1), _identity, sinks=s, anchored=True
    )


def _identity(positions: torch.Tensor) -> torch.Tensor:
    return positions


def pair_positions(name: str, *, train_length: int, **params: Any) -> PairPositions | None:
    """The :class:`PairPositions` of training-free method ``name`` with ``params`` (resolved,
    no "auto" left), checked (one sentence per bad value); None for a method that changes
    frequencies instead."""
    method = scaling_method(name)
    if not method.pair_method:
        return None
    allowed, required = _method_params(method.fn)
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValueError(
            f"{name}: unknown parameter(s) {unknown}; allowed parameters: {sorted(allowed)}."
        )
    missing = sorted(required - set(params))
    if missing:
        raise ValueError(
            f"{name}: missing required parameter(s) {missing}; allowed parameters: {sorted(allowed)}."
        )
    for key, value in params.items():
        if value == "auto":
            raise ValueError(f"{name}: {key} 'auto' needs a target length to resolve against.")
    return method.fn(_positive_int("train_length", train_length), **params)


# ----------------------------------------------------------------------------- public API


def rope_parameters(
    name: str,
    *,
    head_dim: int,
    base: float,
    original_length: int,
    seq_len: int,
    rotary_fraction: float = 1.0,
    **params: Any,
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and attention factor of scaling method ``name``.

    Returns ``(inv_freq, attention_factor)``: ``inv_freq`` is a float32 tensor of shape
    [r/2] with r = int(head_dim * rotary_fraction) (the rotated channels; the rest pass
    through), ``attention_factor`` a float that multiplies both cos and sin, so
    attention logits scale by its square (as in transformers).  ``seq_len`` is the
    length the frequencies are for (``max(position_id) + 1``); ``params`` are the
    method's parameters, named as in transformers' ``rope_parameters``.
    """
    if name not in SCALING_METHODS:
        raise ValueError(
            f"Unknown scaling method {name!r}; registered methods: {sorted(SCALING_METHODS)}."
        )
    fn = SCALING_METHODS[name].fn
    allowed, required = _method_params(fn)
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValueError(
            f"{name}: unknown parameter(s) {unknown}; allowed parameters: {sorted(allowed) or 'none'}."
        )
    missing = sorted(required - set(params))
    if missing:
        raise ValueError(
            f"{name}: missing required parameter(s) {missing}; allowed parameters: {sorted(allowed)}."
        )

    head_dim = _positive_int("head_dim", head_dim)
    original_length = _positive_int("original_length", original_length)
    seq_len = _positive_int("seq_len", seq_len)
    fraction = _number(name, "rotary_fraction", rotary_fraction)
    if not 0 < fraction <= 1:
        raise ValueError(f"rotary_fraction must be in (0, 1], got {rotary_fraction!r}.")
    rotary_dim = int(head_dim * fraction)
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(
            f"The rotary dimension int(head_dim * rotary_fraction) = int({head_dim} * {rotary_fraction}) "
            f"= {rotary_dim} must be even and > 0."
        )
    b = _number(name, "base", base)
    if b <= 1:
        raise ValueError(f"base must be > 1, got {base!r}.")

    geometry = RopeGeometry(rotary_dim, b, original_length, seq_len)
    if SCALING_METHODS[name].pair_method:  # validated; the frequencies stay the default ones
        fn(original_length, **params)
        fn = _default
        params = {}
    inv_freq, attention_factor = fn(geometry, **params)
    if inv_freq.shape != (rotary_dim // 2,):
        raise RuntimeError(
            f"Scaling method {name!r} returned inv_freq of shape {tuple(inv_freq.shape)}, "
            f"expected ({rotary_dim // 2},)."
        )
    return inv_freq.to(torch.float32), float(attention_factor)


def logn_factor(seq_len: int, train_length: int) -> float:
    """Log-n attention scaling: max(1, ln(seq_len) / ln(train_length)).

    The factor for a query that attends to ``seq_len`` tokens, i.e. the query at position
    seq_len - 1 (the model applies it per query: ``models.attention.logn_query_scale``).
    Keeps the attention entropy roughly constant as the number of attended tokens grows
    beyond the training length; at or below it the factor is exactly 1.
    """
    seq_len = _positive_int("seq_len", seq_len)
    train_length = _positive_int("train_length", train_length)
    if train_length < 2:
        raise ValueError(f"train_length must be >= 2 (ln(1) = 0), got {train_length!r}.")
    return max(1.0, math.log(seq_len) / math.log(train_length))
