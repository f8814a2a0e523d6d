"""Hybrid layer patterns: RoPE layers with a limited attention span interleaved with global NoPE layers.

- ``rnope_swa`` (Cohere's RNoPE-SWA, Yang et al. 2025 "Rope to Nope and Back Again"): every 4th
  layer global attention without positions, the others RoPE with a sliding window;
- ``irope`` (Llama 4's iRoPE): every 4th layer global NoPE with a per-position query temperature
  (Llama 4's ``attn_temperature_tuning``), the others RoPE with chunked attention and a weightless
  RMS norm of q and k after the rotation (Llama 4's ``use_qk_norm``, ``position.qk_norm``).

The pattern is ``position.layers`` (repeated over the depth, so ``[swa, swa, swa, nope]`` is
"every 4th layer NoPE" at any depth), one of :data:`LAYER_KINDS` per layer; an empty list is the
family's own. Spans are in position ids (``models.attention_inputs.span_mask``): a query at position i
sees key j when i - j < ``window`` (``swa``) or i // ``chunk`` == j // ``chunk`` (``chunked``,
chunks counted from position 0 as Llama 4's mask counts them from each row's first token).
Eval-time RoPE scaling acts on the RoPE layers; the NoPE layers have nothing to scale. irope's
QK-norm follows the rotation, so a method's attention factor (YaRN's, which scales cos and sin)
cancels on its RoPE layers, as in transformers' Llama 4; log-n scales the query after the norm.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from models.families.classic import Rope, RopeConfig
from models.positions import PositionConfig, llama4_query_temperature, register_family

__all__ = ["LAYER_KINDS", "LLAMA4_QK_NORM_EPS", "layer_pattern", "llama4_query_temperature"]

#: What one layer of a hybrid pattern does: ``rope`` RoPE with full causal attention, ``swa`` RoPE
#: with a sliding window, ``chunked`` RoPE with chunked attention, ``nope`` no positions, full
#: causal attention (with the query temperature where ``temperature_scale`` > 0). ``rnope_swa``
#: takes all but ``chunked``, ``irope`` all but ``swa``: each family's fields describe its span.
LAYER_KINDS = ("rope", "swa", "chunked", "nope")

# a span of 0 means a quarter of the training length
DEFAULT_SPAN_DIVISOR = 4

#: eps of Llama 4's QK-norm: transformers builds it with ``config.rms_norm_eps`` (1e-5 by default in
#: ``Llama4TextConfig``), Meta's reference with the model's ``norm_eps`` (1e-5)
LLAMA4_QK_NORM_EPS = 1e-5


def layer_pattern(cfg: PositionConfig, default: tuple[str, ...], n_layers: int) -> list[str]:
    """What each of ``n_layers`` layers does: ``cfg.layers`` (or ``default``) repeated."""
    pattern = list(cfg.layers) or list(default)
    return list(itertools.islice(itertools.cycle(pattern), n_layers))


@dataclass
class RnopeSwaConfig(RopeConfig):
    """RNoPE-SWA's fields: the layer pattern ([] = the family's) and the window (0: L / 4)."""

    kind: str = "rnope_swa"
    layers: list[str] = field(default_factory=list)
    window: int = 0


@dataclass
class IropeConfig(RopeConfig):
    """iRoPE's fields: the layer pattern, the chunk (0: L / 4), Llama 4's query temperature
    log1p(floor((p + 1) / floor)) * scale + 1 on the NoPE layers (scale 0: none; floor 0: the
    chunk) and its weightless QK-norm on the RoPE layers."""

    kind: str = "irope"
    layers: list[str] = field(default_factory=list)
    chunk: int = 0
    temperature_scale: float = 0.0
    temperature_floor: int = 0
    qk_norm: bool = True


class _Hybrid(Rope):
    acts_on = "qk"
    # no "pairs": a training-free method's far pairs would rotate the NoPE layers' keys too
    capabilities = ("positions", "frequencies", "rotary")
    default_layers: tuple[str, ...] = ()
    #: the layer kinds this family's fields describe (its span: a window or chunks)
    layer_kinds: tuple[str, ...] = ()
    layer_spans = True

    def check(self, cfg: PositionConfig, head_dim: int, d_model: int) -> None:
        super().check(cfg, head_dim, d_model)
        unknown = [kind for kind in cfg.layers if kind not in self.layer_kinds]
        if unknown:
            raise ValueError(
                f"position.layers has {unknown[0]!r}; allowed per layer of position={self.name}: "
                f"{', '.join(self.layer_kinds)}."
            )
        for name in ("window", "chunk", "temperature_floor"):
            if name not in self.fields:
                continue
            value = getattr(cfg, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(
                    f"position.{name} must be an integer >= 0 (0 = a quarter of the training "
                    f"length{'; for the floor, the chunk' if name == 'temperature_floor' else ''}), "
                    f"got {value!r}."
                )
        if "qk_norm" in self.fields and not isinstance(cfg.qk_norm, bool):
            raise ValueError(f"position.qk_norm must be true or false, got {cfg.qk_norm!r}.")
        if "temperature_scale" in self.fields and not cfg.temperature_scale >= 0:
            raise ValueError(
                f"position.temperature_scale must be >= 0 (0 = no temperature), got "
                f"{cfg.temperature_scale!r}."
            )

    def spans(self, cfg: PositionConfig, train_length: int) -> tuple[int, int]:
        """(window, chunk) in tokens: the configured ones, a quarter of L where 0."""
        quarter = max(1, train_length // DEFAULT_SPAN_DIVISOR)
        return getattr(cfg, "window", 0) or quarter, getattr(cfg, "chunk", 0) or quarter

    def layer_inputs(self, model: Any, inputs: Any) -> list[Any]:
        cfg = model.position_cfg
        window, chunk = self.spans(cfg, model.train_length)
        pattern = layer_pattern(cfg, self.default_layers, model.model_cfg.n_layers)
        # Llama 4's QK-norm on the RoPE layers (only where the family reads position.qk_norm)
        qk_norm = LLAMA4_QK_NORM_EPS if "qk_norm" in self.fields and cfg.qk_norm else None
        by_kind: dict[str, Any] = {}
        for kind in dict.fromkeys(pattern):  # one AttentionInputs per kind: shared flex masks
            if kind == "rope":  # the same masks as the model's (the flex cache stays shared)
                by_kind[kind] = replace(inputs, qk_norm=qk_norm) if qk_norm else inputs
            elif kind == "swa":
                by_kind[kind] = replace(inputs, window=window, qk_norm=qk_norm, flex_cache={})
            elif kind == "chunked":
                by_kind[kind] = replace(inputs, chunk=chunk, qk_norm=qk_norm, flex_cache={})
            else:  # nope: no rotation; Llama 4's temperature on the queries where set
                q_scale = inputs.q_scale
                if "temperature_scale" in self.fields and cfg.temperature_scale > 0:
                    factor = llama4_query_temperature(
                        inputs.q_pos, cfg.temperature_floor or chunk, cfg.temperature_scale
                    )[:, None, :, None]  # [N, 1, L, 1]
                    q_scale = factor if q_scale is None else q_scale * factor
                by_kind[kind] = replace(
                    inputs,
                    cos=None,
                    sin=None,
                    k_cos=None,
                    k_sin=None,
                    q_scale=q_scale,
                    flex_cache={},
                )
        return [by_kind[kind] for kind in pattern]


@register_family
class RnopeSwa(_Hybrid):
    """RNoPE-SWA (Yang et al. 2025): RoPE layers with a sliding window, every 4th layer global NoPE."""

    name = "rnope_swa"
    config = RnopeSwaConfig
    default_layers = ("swa", "swa", "swa", "nope")
    layer_kinds = ("rope", "swa", "nope")


@register_family
class Irope(_Hybrid):
    """Llama 4's iRoPE: RoPE layers with chunked attention and QK-norm (a weightless RMS norm of q
    and k after the rotation, eps 1e-5; ``qk_norm: false`` leaves it out), every 4th layer global
    NoPE with a query temperature."""

    name = "irope"
    config = IropeConfig
    default_layers = ("chunked", "chunked", "chunked", "nope")
    layer_kinds = ("rope", "chunked", "nope")
