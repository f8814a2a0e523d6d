"""The methods that change RoPE's frequencies (and the attention factor): the default, linear
position interpolation, NTK-aware, dynamic NTK, YaRN, Llama-3 and LongRoPE, each as transformers'
``modeling_rope_utils`` computes it (``tests/models/test_scaling.py`` compares them)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from models.lazy import torch
from models.scaling.registry import (
    EVERY_FAMILY,
    RopeGeometry,
    default_inv_freq,
    param_at_least,
    param_nonzero,
    param_number,
    param_positive,
    param_unset_or_positive,
    register_scaling,
)


def _ntk_exponent(method: str, rotary_dim: int) -> float:
    """r / (r - 2), the NTK-aware base exponent; undefined for r = 2."""
    if rotary_dim <= 2:
        raise ValueError(
            f"{method}: needs a rotary dimension > 2 (the base exponent is r/(r-2)), got r={rotary_dim}."
        )
    return rotary_dim / (rotary_dim - 2)


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
    s = param_at_least("linear", "factor", factor, 1.0)
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
    a = param_positive("ntk", "alpha", alpha)
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
    s = param_at_least("dynamic", "factor", factor, 1.0)
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
    s = param_at_least("yarn", "factor", factor, 1.0)
    fast = param_unset_or_positive("yarn", "beta_fast", beta_fast, 32.0)
    slow = param_unset_or_positive("yarn", "beta_slow", beta_slow, 1.0)
    if fast < slow:
        raise ValueError(
            f"yarn: beta_fast must be >= beta_slow, got beta_fast={beta_fast!r}, beta_slow={beta_slow!r}."
        )
    if not isinstance(truncate, bool):
        raise ValueError(f"yarn: truncate must be True or False, got {truncate!r}.")
    m = 0.0 if mscale is None else param_number("yarn", "mscale", mscale)
    m_all = (
        0.0 if mscale_all_dim is None else param_number("yarn", "mscale_all_dim", mscale_all_dim)
    )

    if attention_factor is not None:
        attn = param_at_least("yarn", "attention_factor", attention_factor, 0.0)
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
    s = param_at_least("llama3", "factor", factor, 1.0)
    lf = param_nonzero(
        "llama3", "low_freq_factor", low_freq_factor, "L / low_freq_factor is a wavelength"
    )
    hf = param_nonzero(
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
            param_nonzero("longrope", f"{key}[{i}]", v, "theta_i / 0 is infinite")
            for i, v in enumerate(values)
        ]

    s = None if factor is None else param_at_least("longrope", "factor", factor, 1.0)
    if attention_factor is not None:
        attn = param_at_least("longrope", "attention_factor", attention_factor, 0.0)
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
