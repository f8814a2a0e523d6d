"""The zoo's rotary variants (``acts_on == "qk"``), each RoPE with one change:

- ``p_rope`` (Barbero et al. 2025): RoPE keeping the highest-frequency fraction p of the rotary
  pairs and leaving the others unrotated (p = 0 is NoPE, p = 1 is RoPE); unlike NeoX partial
  rotary (``rotary_fraction``), the kept frequencies are RoPE's own;
- ``hope`` (Chen et al. 2025): RoPE's high-frequency pairs kept, the pairs whose period exceeds
  the training length made position-independent;
- ``xpos`` (Sun et al. 2023): RoPE with a per-pair decay of the logit with distance.

Tested against independent evaluations (tests/models/test_zoo.py, test_hope.py, test_xpos.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from models.families.classic import Rope
from models.lazy import torch
from models.positions import PositionConfig, RotaryConfig, register_family

# --------------------------------------------------------------------------- p-RoPE


@dataclass
class PRopeConfig(RotaryConfig):
    """p-RoPE's fields: the fraction of frequencies it keeps rotating (the highest)."""

    kind: str = "p_rope"
    frequency_fraction: float = 0.75


@dataclass
class XPosConfig(RotaryConfig):
    """xPos's fields: its decay's scale gamma."""

    kind: str = "xpos"
    xpos_scale_base: float = 512.0


@register_family
class PRope(Rope):
    """p-RoPE: RoPE whose lowest-frequency 1 - p of the rotary pairs are not rotated
    (inverse frequency 0), p = ``frequency_fraction``; int(p x pairs) pairs keep theirs."""

    name = "p_rope"
    config = PRopeConfig

    def check(self, cfg: PositionConfig, head_dim: int, d_model: int) -> None:
        if not 0 <= cfg.frequency_fraction <= 1:
            raise ValueError(
                f"position.frequency_fraction must be in [0, 1], got {cfg.frequency_fraction}."
            )
        super().check(cfg, head_dim, d_model)

    def adjust_frequencies(
        self, cfg: PositionConfig, inv_freq: torch.Tensor, train_length: int
    ) -> torch.Tensor:
        kept = int(cfg.frequency_fraction * inv_freq.numel())  # inv_freq falls with the index
        return torch.cat((inv_freq[:kept], torch.zeros_like(inv_freq[kept:])))


# --------------------------------------------------------------------------- HoPE


def hope_kept_pairs(pairs: int, base: float, train_length: int) -> int:
    """How many of RoPE's rotary pairs HoPE keeps: those whose period 2 pi / theta_i, with
    theta_i = base^(-i / pairs), fits the training length (<= L). They are the first ones: the
    frequencies fall with the index."""
    i = torch.arange(pairs, dtype=torch.float64)
    periods = 2 * math.pi * torch.pow(torch.tensor(float(base), dtype=torch.float64), i / pairs)
    return int((periods <= train_length).sum())


@register_family
class HoPE(Rope):
    """HoPE (Chen et al., ACL 2025, arXiv 2410.21216): RoPE keeping only its high-frequency pairs,
    those whose period fits the training length L (:func:`hope_kept_pairs`); every lower-frequency
    pair is position-independent (inverse frequency 0). The cut is a pair index fixed by L and the
    base, so an eval-time scaling rescales the kept pairs and never moves the cut (as p-RoPE's)."""

    name = "hope"
    # the split rule has no parameter, and every channel pairs (no position.rotary_fraction)
    config = RotaryConfig

    def adjust_frequencies(
        self, cfg: PositionConfig, inv_freq: torch.Tensor, train_length: int
    ) -> torch.Tensor:
        kept = hope_kept_pairs(inv_freq.numel(), cfg.base, train_length)
        return torch.cat((inv_freq[:kept], torch.zeros_like(inv_freq[kept:])))


# --------------------------------------------------------------------------- xPos


#: the largest ln of an xPos query or key scale a row may reach: e^64 (about 6e27) leaves float32's
#: range (3.4e38) a margin of about 5e10 for the rotated values and the factors that follow (log-n,
#: SSMax); the key scale e^-64 stays a normal float32 (above 1.2e-38), so no precision is lost
XPOS_MAX_LOG_SCALE = 64.0


def xpos_max_span(scale_base: float) -> int:
    """The most positions one row may span under xPos with decay scale gamma ``scale_base``: its
    scales zeta_k^(+-span / gamma), largest for zeta_0 = 0.4 / 1.4, stay within e^64
    (:data:`XPOS_MAX_LOG_SCALE`): floor(64 gamma / ln 3.5), 26,156 at gamma 512."""
    return int(XPOS_MAX_LOG_SCALE * scale_base / math.log(1.4 / 0.4))


def xpos_scale(rotary_dim: int) -> torch.Tensor:
    """xPos's per-pair decay base zeta_k = (2k / r + 0.4) / 1.4, k = 0..r/2-1, float32 [r/2]."""
    k = torch.arange(0, rotary_dim, 2, dtype=torch.float32)
    return (k / rotary_dim + 0.4) / 1.4


def xpos_decay(
    position_ids: torch.Tensor,
    centre: int,
    rotary_dim: int,
    scale_base: float,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """zeta_k^((i - centre) / gamma) for every position i of ``position_ids`` [N, L] and pair k,
    float32 [N, L, r/2]; the difference i - centre is taken in integers, so exactly. ``scale``:
    :func:`xpos_scale` of ``rotary_dim`` already on the device (else built here)."""
    power = (position_ids - centre).to(torch.float32)[..., None] / scale_base
    if scale is None:
        scale = xpos_scale(rotary_dim).to(position_ids.device)
    return scale**power


@register_family
class XPos(Rope):
    """xPos (Sun et al. 2023): RoPE whose pair k of the query at position i is scaled by
    zeta_k^((i - c) / gamma) and of the key at position j by zeta_k^(-(j - c) / gamma), so that
    the q.k logit carries zeta_k^((i - j) / gamma), a decay with distance (gamma =
    ``xpos_scale_base``), whatever the centre c. The paper's formula has c = 0, whose key scale
    zeta_0^(-j / gamma) leaves float32 from j ~ 36,000 at gamma 512 (non-finite logits);
    x-transformers and rotary-embedding-torch centre on the sequence (c = L // 2). Here c is each
    row's length (its largest position id + 1, which the KV cache keeps from the prefill: cached
    keys and later queries share it), so exponents stay within the row's span at any offset: finite
    while a row spans at most :func:`xpos_max_span` positions (26,156 at gamma 512; beyond, from
    about 35,000, some logits are non-finite), which a job checks before any work
    (:meth:`check_row_span`), and the logits are the uncentred ones to float32 rounding. A position transform and the frequency methods act on the rotation
    only (through its frequencies)."""

    name = "xpos"
    config = XPosConfig
    # no "pairs": a pair's decay follows its key's own position, which a rotation cannot move
    capabilities = ("positions", "frequencies", "rotary")

    def check(self, cfg: PositionConfig, head_dim: int, d_model: int) -> None:
        if cfg.xpos_scale_base <= 0:
            raise ValueError(f"position.xpos_scale_base must be > 0, got {cfg.xpos_scale_base}.")
        super().check(cfg, head_dim, d_model)

    def check_row_span(self, cfg: PositionConfig, span: int, what: str) -> None:
        most = xpos_max_span(cfg.xpos_scale_base)
        if span > most:
            needed = math.ceil(span * math.log(1.4 / 0.4) / XPOS_MAX_LOG_SCALE)
            raise ValueError(
                f"{what} {span} is too long for one row of position=xpos with "
                f"position.xpos_scale_base {cfg.xpos_scale_base:g}, whose query and key scales "
                f"zeta^(+-span / gamma) leave float32's range beyond {most} positions (non-finite "
                f"logits); allowed: rows of at most {most} positions, or "
                f"position.xpos_scale_base >= {needed} for {span}."
            )

    def length_dependent(self, cfg: PositionConfig, scaling: Any) -> bool:
        # the scales (not the logits) depend on the centre, each row's length: the model then
        # passes every row's own length (frozen at the prefill) as ``seq_len``
        return True

    def rotary(self, model: Any, position_ids: torch.Tensor, seq_len: int):
        cos, sin = model.rotary_table(seq_len)(position_ids)  # [N, L, r/2] each
        centre = self.centre(position_ids, seq_len)
        scale_base = model.position_cfg.xpos_scale_base
        rotary_dim, device = 2 * cos.shape[-1], position_ids.device
        scale = model.resolved_scaling.cached(
            ("xpos_scale", rotary_dim, str(device)), lambda: xpos_scale(rotary_dim).to(device)
        )
        decay = xpos_decay(position_ids, centre, rotary_dim, scale_base, scale)  # [N, L, r/2]
        return cos * decay, sin * decay, cos / decay, sin / decay

    def centre(self, position_ids: torch.Tensor, seq_len: int) -> int:
        """The exponents' centre c for rows of length ``seq_len`` at ``position_ids`` (which a
        decoding step's few new positions cannot give): the length."""
        return int(seq_len)
