"""The classic position families: RoPE, sinusoidal and learned absolute embeddings, ALiBi and
NoPE (their pure functions are in :mod:`models.positions`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from models.lazy import torch
from models.positions import (
    OUT_OF_RANGE_POLICIES,
    ROPE_LAYOUTS,
    Family,
    FrequencyConfig,
    PositionConfig,
    RotaryConfig,
    ScoreBias,
    alibi_bias,
    alibi_slopes,
    register_family,
)

# --------------------------------------------------------------------------- absolute


def sinusoidal_embedding(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """The seed's layout: channel 2i holds sin(p * w_i), channel 2i+1 holds cos(p * w_i).

    positions may be fractional (linear interpolation divides them by the factor). Returns float32
    [*positions.shape, 2 * len(inv_freq)].
    """
    angles = positions.to(torch.float32)[..., None] * inv_freq.to(torch.float32)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)


def sinusoidal_inv_freq(dim: int, base: float) -> torch.Tensor:
    """w_i = base^(-2i/dim), i = 0..dim/2-1 (Vaswani et al.)."""
    return 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)


def learned_table_coordinates(
    position_ids: torch.Tensor,
    rows: int,
    seq_len: int,
    out_of_range: str,
    position_factor: float | None = None,
) -> torch.Tensor:
    """Float32 table coordinates of position ids: the table is stretched, endpoints aligned.

    A position transform (position interpolation by ``position_factor``) stretches ``rows`` rows
    to ``rows * factor``; else the ``interpolate`` policy stretches them to the sequence length
    when it is longer; otherwise coordinates are positions.
    """
    stretched_rows = rows
    if position_factor is not None:
        stretched_rows = rows * float(position_factor)
    elif out_of_range == "interpolate":
        stretched_rows = max(rows, int(seq_len))
    return position_ids.float() * ((rows - 1) / max(stretched_rows - 1, 1))


def beyond_table(positions: torch.Tensor, n_rows: int) -> str | None:
    """The error for coordinates past the last row of an ``n_rows`` table, or None."""
    if not bool((positions > n_rows - 1).any()):
        return None
    return (
        f"position {float(positions.max()):g} is beyond the learned table of max_positions="
        f"{n_rows} (valid positions 0..{n_rows - 1}); set position.out_of_range to 'clamp' or "
        f"'interpolate', or use scaling=linear, to evaluate longer sequences."
    )


def learned_lookup(table: torch.Tensor, positions: torch.Tensor, out_of_range: str) -> torch.Tensor:
    """Rows of a learned table [P, D] at (possibly fractional) positions; linear between rows.

    A position beyond the last row is an error unless the policy is ``clamp``; never a modulo,
    which would silently map far positions onto old coordinates.
    """
    n_rows = table.shape[0]
    positions = positions.to(torch.float32)
    problem = beyond_table(positions, n_rows)
    if problem is not None:
        if out_of_range != "clamp":
            raise ValueError(problem)
        positions = positions.clamp(max=n_rows - 1)
    lower = positions.floor().long()
    upper = (lower + 1).clamp(max=n_rows - 1)
    weight = (positions - lower)[..., None]
    return table[lower] * (1 - weight) + table[upper] * weight


@dataclass
class RopeConfig(RotaryConfig):
    """RoPE's fields: ``base``, ``layout`` and the fraction of each head's channels it rotates."""

    kind: str = "rope"
    rotary_fraction: float = 1.0


@dataclass
class LearnedConfig(PositionConfig):
    """The learned table's rows (0: the training length) and what a position past it does."""

    kind: str = "learned"
    max_positions: int = 0
    # read only past the table's end, so not in the checkpoint key (bench.core.checks.WEIGHTS)
    out_of_range: str = field(default="error", metadata={"weights": False})

    def table_rows(self, train_length: int) -> int:
        """Rows of the table: ``max_positions``, or the training length if 0."""
        return self.max_positions or int(train_length)


class _FrequencyFamily(Family):
    """A family built on inverse frequencies, which the scaling methods rewrite."""

    def length_dependent(self, cfg: PositionConfig, scaling: Any) -> bool:
        return bool(scaling.method.length_dependent)


@register_family
class Rope(_FrequencyFamily):
    """Rotary position embedding (Su et al.): rotates the first r channels of q and k per layer."""

    name, acts_on = "rope", "qk"
    config = RopeConfig
    # rotation_only: the rotation is its whole position signal (DroPE drops it)
    capabilities = ("positions", "frequencies", "rotary", "pairs", "rotation_only")

    def check(self, cfg: PositionConfig, head_dim: int, d_model: int) -> None:
        if cfg.layout not in ROPE_LAYOUTS:
            raise ValueError(
                f"position.layout {cfg.layout!r} is unknown; allowed: {', '.join(ROPE_LAYOUTS)}."
            )
        if not 0 < cfg.rotary_fraction <= 1:
            raise ValueError(
                f"position.rotary_fraction must be in (0, 1], got {cfg.rotary_fraction}."
            )
        rotary_dim = int(head_dim * cfg.rotary_fraction)
        if rotary_dim < 2 or rotary_dim % 2:
            raise ValueError(
                f"RoPE needs an even rotary dimension, but head_dim {head_dim} x "
                f"position.rotary_fraction {cfg.rotary_fraction} gives {rotary_dim}; choose "
                "an even head_dim (model.d_model / model.n_heads) or a rotary_fraction "
                "giving an even count."
            )

    def frequency_dims(self, cfg: PositionConfig, head_dim: int, d_model: int) -> tuple[int, float]:
        return head_dim, cfg.rotary_fraction

    def rotary(self, model: Any, position_ids: torch.Tensor, seq_len: int):
        return model.rotary_table(seq_len)(position_ids)  # [N, L, r/2] each


@register_family
class Sinusoidal(_FrequencyFamily):
    """Vaswani et al.'s fixed sinusoids, added to the token embeddings."""

    name, acts_on = "sinusoidal", "input"
    config = FrequencyConfig
    # per-dimension methods (YaRN, Llama-3, LongRoPE) are defined per rotary pair
    capabilities = ("positions", "frequencies")

    def check(self, cfg: PositionConfig, head_dim: int, d_model: int) -> None:
        if d_model % 2:
            raise ValueError(f"sinusoidal positions need an even model.d_model, got {d_model}.")

    def frequency_dims(self, cfg: PositionConfig, head_dim: int, d_model: int) -> tuple[int, float]:
        return d_model, 1.0

    def embed(self, model: Any, position_ids: torch.Tensor, seq_len: int) -> torch.Tensor:
        inv_freq, _ = model.frequencies(seq_len)
        # scaled so a channel's RMS (~0.7/sqrt(D)) is near the token embeddings' at init (0.02 x ~3)
        return sinusoidal_embedding(position_ids, inv_freq) / math.sqrt(model.model_cfg.d_model)


@register_family
class Learned(Family):
    """A learned table of absolute positions (GPT-2), added to the token embeddings."""

    name, acts_on = "learned", "input"
    config = LearnedConfig
    capabilities = ("positions",)  # a position transform stretches the table

    def check(self, cfg: PositionConfig, head_dim: int, d_model: int) -> None:
        if cfg.max_positions < 0:
            raise ValueError(
                f"position.max_positions must be >= 0 (0 = the training length), got "
                f"{cfg.max_positions}."
            )
        if cfg.out_of_range not in OUT_OF_RANGE_POLICIES:
            raise ValueError(
                f"position.out_of_range {cfg.out_of_range!r} is unknown; "
                f"allowed: {', '.join(OUT_OF_RANGE_POLICIES)}."
            )

    def init(self, model: Any) -> None:
        rows = model.position_cfg.table_rows(model.train_length)
        model.pos_table = torch.nn.Parameter(torch.randn(rows, model.model_cfg.d_model) * 0.02)

    def length_dependent(self, cfg: PositionConfig, scaling: Any) -> bool:
        # the interpolate policy stretches the table to each sequence, unless a position
        # transform (position interpolation) fixes the stretch
        return cfg.out_of_range == "interpolate" and scaling.position_factor is None

    def embed(self, model: Any, position_ids: torch.Tensor, seq_len: int) -> torch.Tensor:
        out_of_range = model.position_cfg.out_of_range
        coordinates = learned_table_coordinates(
            position_ids,
            model.pos_table.shape[0],
            seq_len,
            out_of_range,
            model.resolved_scaling.position_factor,
        )
        return learned_lookup(model.pos_table, coordinates, out_of_range)

    def range_error(self, cfg, max_position, seq_len, train_length, position_factor):
        if cfg.out_of_range == "clamp":
            return None
        rows = cfg.table_rows(train_length)
        coordinates = learned_table_coordinates(
            torch.tensor([max_position]), rows, seq_len, cfg.out_of_range, position_factor
        )
        return beyond_table(coordinates, rows)


@register_family
class Alibi(Family):
    """ALiBi (Press et al. 2022): a per-head penalty linear in the query-key distance."""

    name, acts_on = "alibi", "scores"
    capabilities = ("pairs",)  # a training-free method may score a pair at other positions

    def init(self, model: Any) -> None:
        model.register_buffer("slopes", alibi_slopes(model.model_cfg.n_heads), persistent=False)

    def score_bias(self, model: Any, length: int) -> ScoreBias:
        return alibi_bias(model.slopes)


@register_family
class NoPE(Family):
    """No position signal (Kazemnejad et al. 2023): only the causal mask orders tokens."""

    name, acts_on = "nope", "none"
    capabilities = ("pairs",)  # nothing to re-position: a windowed method only masks
    reads_position_ids = False


# --------------------------------------------------------------------------- RoPE
