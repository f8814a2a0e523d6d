"""A scaling resolved once, when it is set on a model: the facts every position family reads.

:class:`models.scaling_config.ScalingConfig` names a method and its parameters; a family never
asks for a method by name. :func:`resolve` turns the config into a :class:`ResolvedScaling` for one
model geometry: its parameters made concrete (``resolve_params``), checked against the family
(``applicable_methods``), and its facts computed once: the inverse frequencies and attention
factor (families with frequencies: RoPE and its variants, sinusoidal), the pair spec of a
training-free method (:class:`models.scaling.PairPositions`), and the position transform of a
method that acts on positions for a family without frequencies (a learned table, the score-bias
families, CoPE): the factor that divides its positions, read from the frequencies the method
computes, which for a method acting on positions must be the default ones divided by one factor.
A method whose facts change nothing is refused, so no row is labelled with a method its model
ignored. The object also caches what forward passes would otherwise rebuild (rotary tables, the
factor as a tensor, a family's constant tables) for as long as the scaling stays set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from models.lazy import torch
from models.positions import Family, FrequencyConfig, PositionConfig, RotaryTable
from models.scaling import (
    AUTO_PROBE_RATIO,
    EVERY_FAMILY,
    PairPositions,
    RopeGeometry,
    ScalingMethod,
    applicable_methods,
    default_inv_freq,
    frequencies_change,
    pair_positions,
    rope_parameters,
    scaling_method,
)
from models.scaling_config import AUTO, ScalingConfig, resolve_params

if TYPE_CHECKING:
    from models.model_config import ModelConfig

__all__ = [
    "ResolvedScaling",
    "family_frequencies",
    "resolve",
    "resolve_scaling",
    "resolved_scaling",
    "scaling_frequencies",
]

#: rotary dimension at which a family without frequencies reads a method's position transform
#: (any even dimension gives the same factor for a method that divides every frequency by one)
PROBE_ROTARY_DIM = 64
#: relative spread of the per-pair ratios default / method frequencies that still counts as one
#: factor (the frequencies are computed in float64 and differ only by rounding)
UNIFORM_RTOL = 1e-9
#: how many per-length frequency tables a length-dependent method keeps
MAX_TABLES = 16


def family_frequencies(
    scaling: ScalingConfig,
    position_cfg: PositionConfig,
    head_dim: int,
    d_model: int,
    train_length: int,
    seq_len: int,
) -> tuple[torch.Tensor, float] | None:
    """inv_freq and attention factor of a resolved scaling for a family with frequencies (RoPE:
    per head; sinusoidal: the model width), before the family adjusts them; None for a family
    without frequencies."""
    dims = position_cfg.family.frequency_dims(position_cfg, head_dim, d_model)
    if dims is None:
        return None
    dim, fraction = dims
    return rope_parameters(
        scaling.method,
        head_dim=dim,
        base=position_cfg.base,
        original_length=train_length,
        seq_len=seq_len,
        rotary_fraction=fraction,
        **scaling.params,
    )


@dataclass(eq=False)
class ResolvedScaling:
    """One scaling resolved for one model geometry (:func:`resolve`): what the families read.

    ``config`` is the setting with its parameters concrete (what results record), ``method`` its
    registered :class:`models.scaling.ScalingMethod`. ``pairs`` is the training-free method's
    :class:`models.scaling.PairPositions` (None: every pair at its own positions).
    ``position_factor`` is the factor that divides positions and distances in a family without
    frequencies (None: the method moves no positions, or the family reads frequencies instead;
    1.0 is position interpolation by 1, which a learned table's ``interpolate`` policy tells from
    no interpolation). Families with frequencies read :meth:`frequencies` / :meth:`rotary_table`.
    """

    config: ScalingConfig
    method: ScalingMethod
    family: Family
    position_cfg: PositionConfig
    head_dim: int
    d_model: int
    train_length: int
    pairs: PairPositions | None = None
    position_factor: float | None = None
    _frequencies: dict[int | None, tuple[torch.Tensor, float]] = field(
        default_factory=dict, repr=False
    )
    _tables: dict[int | None, RotaryTable] = field(default_factory=dict, repr=False)
    cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    @property
    def has_frequencies(self) -> bool:
        dims = self.family.frequency_dims(self.position_cfg, self.head_dim, self.d_model)
        return dims is not None

    def length_dependent(self) -> bool:
        """Whether the family's position signal depends on the sequence length under this scaling."""
        return self.family.length_dependent(self.position_cfg, self)

    def _key(self, seq_len: int) -> int | None:
        return int(seq_len) if self.method.length_dependent else None

    def frequencies(self, seq_len: int) -> tuple[torch.Tensor, float]:
        """inv_freq (as the family uses them) and attention factor at ``seq_len``; computed once
        for a method that does not depend on the length, once per length otherwise."""
        key = self._key(seq_len)
        if key not in self._frequencies:
            found = family_frequencies(
                self.config,
                self.position_cfg,
                self.head_dim,
                self.d_model,
                self.train_length,
                seq_len,
            )
            if found is None:
                raise ValueError(f"position family {self.position_cfg.kind!r} has no frequencies.")
            if len(self._frequencies) > MAX_TABLES:
                self._frequencies.clear()
            inv_freq, attention_factor = found
            inv_freq = self.family.adjust_frequencies(
                self.position_cfg, inv_freq, self.train_length
            )
            self._frequencies[key] = inv_freq, attention_factor
        return self._frequencies[key]

    def rotary_table(self, seq_len: int) -> RotaryTable:
        """The cos/sin table at ``seq_len``: one for every length unless the method depends on it."""
        key = self._key(seq_len)
        if key not in self._tables:
            if len(self._tables) > MAX_TABLES:
                self._tables.clear()
            self._tables[key] = RotaryTable(*self.frequencies(seq_len))
        return self._tables[key]

    def factor_tensor(self, device: torch.device) -> torch.Tensor:
        """``position_factor`` (1 where None) as a float32 0-d tensor on ``device``."""
        return self.cached(
            ("position_factor", str(device)),
            lambda: torch.tensor(float(self.position_factor or 1.0), device=device),
        )

    def cached(self, key: Any, build: Callable[[], Any]) -> Any:
        """``build()`` once per ``key`` while this scaling stays set (a family's constant tables)."""
        if key not in self.cache:
            self.cache[key] = build()
        return self.cache[key]


def resolve(
    scaling: ScalingConfig | None,
    position_cfg: PositionConfig,
    head_dim: int,
    d_model: int,
    train_length: int,
    eval_length: int | None = None,
) -> ResolvedScaling:
    """``scaling`` (None = raw) resolved for a model geometry, checked (one sentence each).

    A factor "auto" is set for ``scaling.target_length`` if given (not with ``oracle``), else for
    ``eval_length`` (``models.scaling_config.resolve_params``). Refused: an unknown method, a
    method that does not apply to the position family, parameters the method rejects for this
    geometry, a method acting on positions whose frequencies are not the default ones divided by
    one factor (or that scales the attention) where the family has no frequencies to take them,
    and a method that changes nothing for this family even with its "auto" parameters set for a
    target of several training lengths. Needs no model.
    """
    scaling = scaling or ScalingConfig()
    kind = position_cfg.kind
    method = scaling_method(scaling.method)  # known
    allowed = applicable_methods(kind)
    if scaling.method not in allowed:
        raise ValueError(
            f"scaling method {scaling.method!r} does not apply to position family {kind!r}; "
            f"allowed for {kind}: {', '.join(allowed)} (each may add logn)."
        )
    family = position_cfg.family
    dims = family.frequency_dims(position_cfg, head_dim, d_model)
    pairs_n = int(dims[0] * dims[1]) // 2 if dims else 0
    params = resolve_params(
        scaling, train_length=train_length, eval_length=eval_length, rotary_pairs=pairs_n
    )
    config = replace(scaling, params=params)
    resolved = ResolvedScaling(
        config, method, family, position_cfg, head_dim, d_model, train_length
    )
    # validated now, not mid-eval; a static method's frequencies are computed here, once
    if dims is not None:
        resolved.frequencies(train_length)
    resolved.pairs = pair_positions(config.method, train_length=train_length, **params)
    if dims is None and "positions" in method.applies_to and not method.pair_method:
        resolved.position_factor = _position_factor(config, method, position_cfg, train_length)
    if not _changes_anything(config, method, position_cfg, head_dim, d_model, train_length):
        raise ValueError(
            f"scaling method {config.method!r} changes nothing for position={kind}: even with its "
            f"auto parameters set for a {AUTO_PROBE_RATIO:g}x target, its frequencies, attention "
            f"factor, position transform and pairs are the raw model's, so its rows would equal "
            f"the raw ones."
        )
    return resolved


def _geometry(position_cfg: PositionConfig, train_length: int, seq_len: int) -> RopeGeometry:
    # a family without frequencies is probed with the default base
    base = getattr(position_cfg, "base", FrequencyConfig.base)
    return RopeGeometry(PROBE_ROTARY_DIM, float(base), train_length, seq_len)


def _position_factor(
    config: ScalingConfig, method: ScalingMethod, position_cfg: PositionConfig, train_length: int
) -> float:
    """The factor a method acting on positions divides them by, read from its frequencies: they
    must be the default ones divided by one factor, with attention factor 1 (a family without
    frequencies has nothing else to take)."""
    geometry = _geometry(position_cfg, train_length, train_length)
    inv_freq, attention_factor = method(geometry, **config.params)
    ratio = default_inv_freq(geometry.rotary_dim, geometry.base) / inv_freq.to(torch.float64)
    low, high = float(ratio.min()), float(ratio.max())
    kind = position_cfg.kind
    if not (torch.isfinite(ratio).all() and low > 0 and high - low <= UNIFORM_RTOL * high):
        raise ValueError(
            f"scaling method {config.method!r} applies to positions, but its frequencies are not "
            f"the default ones divided by one factor (ratios {low:.6g} to {high:.6g}), which is "
            f"all position={kind} (no frequencies) can take; declare applies_to=('frequencies',) "
            f"or ('rotary',) instead."
        )
    if float(attention_factor) != 1.0:
        raise ValueError(
            f"scaling method {config.method!r} scales the attention by {float(attention_factor):g} "
            f"(cos and sin of a rotation), which position={kind} does not have; allowed for it: "
            f"a position transform with attention factor 1."
        )
    return _shortest_factor(default_inv_freq(geometry.rotary_dim, geometry.base), inv_freq)


def _shortest_factor(default: torch.Tensor, inv_freq: torch.Tensor) -> float:
    """The factor s with ``default / s == inv_freq`` exactly, in its shortest decimal form (the
    number a config gave, e.g. 6 for linear's factor 6), else the median ratio (within float64
    rounding of it): a family reads the same factor the method was given."""
    inv_freq = inv_freq.to(torch.float64)
    ratio = float((default / inv_freq).median())
    for digits in range(1, 18):
        candidate = float(f"{ratio:.{digits}g}")
        if torch.equal(default / candidate, inv_freq):
            return candidate
    return ratio


def _changes_anything(
    config: ScalingConfig,
    method: ScalingMethod,
    position_cfg: PositionConfig,
    head_dim: int,
    d_model: int,
    train_length: int,
) -> bool:
    """Whether the method changes anything for this family with its "auto" parameters set for a
    target of AUTO_PROBE_RATIO training lengths (a factor 1 at the actual target is the identity
    point of a method that does change things): log-n, a pair spec, frequencies or attention
    factor other than the default ones (the family's, or the probe geometry's for a family that
    reads a position transform). The raw model (a method for every family) changes nothing."""
    if config.logn or method.pair_method or EVERY_FAMILY in method.applies_to:
        return True
    target = AUTO_PROBE_RATIO * train_length
    probe_params = {**config.params, **dict.fromkeys(method.auto_keys, AUTO)}
    probe = replace(config, params=probe_params, target_length=target, oracle=False)
    dims = position_cfg.family.frequency_dims(position_cfg, head_dim, d_model)
    if dims is None:
        if "positions" not in method.applies_to:
            return False  # nothing this family reads
        geometry = _geometry(position_cfg, train_length, target)
        rotary_pairs = geometry.rotary_dim // 2
    else:
        rotary_dim = int(dims[0] * dims[1])
        geometry = RopeGeometry(rotary_dim, float(position_cfg.base), train_length, target)
        rotary_pairs = rotary_dim // 2
    try:
        params = resolve_params(
            probe, train_length=train_length, eval_length=None, rotary_pairs=rotary_pairs
        )
        return frequencies_change(method, geometry, params)
    except ValueError:  # a probe the method refuses says nothing
        return True


# ----------------------------------------------------------------------------- by model config


def resolved_scaling(
    scaling: ScalingConfig | None,
    model_cfg: ModelConfig,
    position_cfg: PositionConfig,
    train_length: int,
    eval_length: int | None = None,
) -> ResolvedScaling:
    """``scaling`` (None = raw) resolved for this geometry: its parameters concrete and its facts
    computed once (``models.resolved_scaling.resolve``, which says what it refuses). Needs no model.
    """
    return resolve(
        scaling, position_cfg, model_cfg.head_dim, model_cfg.d_model, train_length, eval_length
    )


def resolve_scaling(
    scaling: ScalingConfig | None,
    model_cfg: ModelConfig,
    position_cfg: PositionConfig,
    train_length: int,
    eval_length: int | None = None,
) -> ScalingConfig:
    """``scaling`` (None = raw) with its shorthands made concrete, checked.

    A factor "auto" is set for ``scaling.target_length`` if given (not with ``oracle``), else for
    ``eval_length`` (``models.scaling_config.resolve_params``). Raises ValueError (one sentence)
    for an unknown method, a method that does not apply to the position family, parameters the
    method rejects for this geometry, or a method that changes nothing for it
    (:func:`resolved_scaling`). Needs no model.
    """
    return resolved_scaling(scaling, model_cfg, position_cfg, train_length, eval_length).config


def scaling_frequencies(
    scaling: ScalingConfig,
    model_cfg: ModelConfig,
    position_cfg: PositionConfig,
    train_length: int,
    seq_len: int,
) -> tuple[torch.Tensor, float] | None:
    """inv_freq and attention factor of a resolved scaling for a family with frequencies (RoPE:
    per head; sinusoidal: the model width); None for a family without them."""
    return family_frequencies(
        scaling, position_cfg, model_cfg.head_dim, model_cfg.d_model, train_length, seq_len
    )
