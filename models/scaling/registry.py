"""The scaling methods' registry: what a method is (:class:`ScalingMethod`), how it registers
(:func:`register_scaling`), the checks every parameter goes through, and the public calls
(:func:`rope_parameters`, :func:`pair_positions`, :func:`logn_factor`). The methods themselves
are the other modules of :mod:`models.scaling`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

from models.lazy import torch


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
#: its function; NoPE trivially. Not xPos, whose keys also scale, nor CoPE or absolute ones) and
#: ``rotation_only`` (the rotation is the family's whole position signal, so zero frequencies
#: remove it: DroPE; not xPos, whose scales stay, nor the hybrids, whose spans and temperature do).
CAPABILITIES = ("positions", "frequencies", "rotary", "pairs", "rotation_only")
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


def param_number(method: str, key: str, value: Any) -> float:
    """A finite real number (bools and strings such as an unresolved "auto" are rejected)."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise ValueError(f"{method}: {key} must be a finite number, got {value!r}.")
    return float(value)


def param_at_least(method: str, key: str, value: Any, minimum: float) -> float:
    x = param_number(method, key, value)
    if x < minimum:
        raise ValueError(f"{method}: {key} must be >= {minimum:g}, got {value!r}.")
    return x


def param_positive(method: str, key: str, value: Any) -> float:
    x = param_number(method, key, value)
    if x <= 0:
        raise ValueError(f"{method}: {key} must be > 0, got {value!r}.")
    return x


def param_nonzero(method: str, key: str, value: Any, why: str) -> float:
    x = param_number(method, key, value)
    if x == 0:
        raise ValueError(f"{method}: {key} must be nonzero ({why}), got {value!r}.")
    return x


def param_unset_or_positive(method: str, key: str, value: Any, default: float) -> float:
    """transformers' ``value or default``: 0 or None means the default; negatives are refused."""
    if value is None:
        return default
    x = param_number(method, key, value)
    if x < 0:
        raise ValueError(
            f"{method}: {key} must be > 0, or 0 / None for the default {default:g}, got {value!r}."
        )
    return x or default


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value <= 0:
        raise ValueError(f"{key} must be a positive integer, got {value!r}.")
    return int(value)


# ----------------------------------------------------------------------------- building blocks


def default_inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    """theta_i = base^(-2i/r), i = 0..r/2-1, float64.

    The exponent is formed as transformers forms it (int64 arange -> float32, divided by
    r in float32) so its rounding matches theirs; the power itself is taken in float64.
    """
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return 1.0 / (base ** exponent.double())


# ----------------------------------------------------------------------------- pair positions


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

    A method with more than two regimes (Dual Chunk Attention) sets ``regions(i, j)``, each
    pair's regime as an integer tensor (0: own positions, 1: ``far_query``, r >= 2:
    ``more_far_queries[r - 2]``; the key always at ``far_key``) in place of the window's two.
    """

    window: int
    far_query: Callable[[torch.Tensor], torch.Tensor]
    far_key: Callable[[torch.Tensor], torch.Tensor]
    sinks: int | None = None
    anchored: bool = False
    regions: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    more_far_queries: tuple[Callable[[torch.Tensor], torch.Tensor], ...] = ()

    def __post_init__(self) -> None:
        if self.regions is not None and self.anchored:  # regions read position ids, not cache slots
            raise ValueError("PairPositions: a method with regions cannot be anchored.")
        if self.more_far_queries and self.regions is None:
            raise ValueError("PairPositions: more far queries need regions to choose them.")

    def region(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Each pair's regime (int64, broadcast of q_pos - k_pos): 0 scored at its own positions,
        r >= 1 with the query at the r-th far query (module doc)."""
        if self.regions is None:
            return (q_pos - k_pos >= self.window).long()
        return self.regions(q_pos, k_pos).long()

    def far_queries(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], ...]:
        """The query's far position in regime 1, 2, ... (in that order)."""
        return (self.far_query, *self.more_far_queries)

    def relative(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """The relative position each pair is scored at, float64, broadcast of q_pos - k_pos
        (the dense reference of tests and docs; masked pairs included)."""
        q64, k64 = q_pos.to(torch.float64), k_pos.to(torch.float64)
        region, out = self.region(q64, k64), q64 - k64
        for r, query in enumerate(self.far_queries(), 1):
            out = torch.where(region == r, query(q64) - self.far_key(k64), out)
        return out

    def visible(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Whether each (causal) pair may attend: always, except far pairs past the sinks."""
        near = self.region(q_pos, k_pos) == 0
        if self.sinks is None:
            return torch.ones_like(near)
        return near | (k_pos < self.sinks)


def _check_param_names(name: str, fn: ScalingFn, params: dict) -> None:
    """One sentence for a parameter method ``name`` (function ``fn``) does not take, or a
    required one missing."""
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


def pair_positions(name: str, *, train_length: int, **params: Any) -> PairPositions | None:
    """The :class:`PairPositions` of training-free method ``name`` with ``params`` (resolved,
    no "auto" left), checked (one sentence per bad value); None for a method that changes
    frequencies instead."""
    method = scaling_method(name)
    if not method.pair_method:
        return None
    _check_param_names(name, method.fn, params)
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
    _check_param_names(name, fn, params)

    head_dim = _positive_int("head_dim", head_dim)
    original_length = _positive_int("original_length", original_length)
    seq_len = _positive_int("seq_len", seq_len)
    fraction = param_number(name, "rotary_fraction", rotary_fraction)
    if not 0 < fraction <= 1:
        raise ValueError(f"rotary_fraction must be in (0, 1], got {rotary_fraction!r}.")
    rotary_dim = int(head_dim * fraction)
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(
            f"The rotary dimension int(head_dim * rotary_fraction) = int({head_dim} * {rotary_fraction}) "
            f"= {rotary_dim} must be even and > 0."
        )
    b = param_number(name, "base", base)
    if b <= 1:
        raise ValueError(f"base must be > 1, got {base!r}.")

    geometry = RopeGeometry(rotary_dim, b, original_length, seq_len)
    if SCALING_METHODS[name].pair_method:  # validated; the frequencies stay the default ones
        fn(original_length, **params)
        fn = SCALING_METHODS["default"].fn
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
