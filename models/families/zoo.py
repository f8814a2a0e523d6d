"""The position-encoding zoo's relative biases: families compared against since 2020, each one
registered definition.

Relative biases added to the attention logits (``acts_on == "scores"``), as a function of query
position i, key position j and the causal distance n = i - j >= 0:

- ``t5`` (Raffel et al. 2020): a learned per-head value per log-spaced distance bucket;
- ``kerple_log`` / ``kerple_power`` (Chi et al. 2022): -r1_h log(1 + r2_h n) / -r1_h n^r2_h, with
  learned positive per-head r1, r2;
- ``fire`` (Li et al. 2024): a small MLP of psi(n) / psi(max(L_thr, i)), psi(x) = log(c x + 1);
  depends on i, so not shift invariant by design;
- ``sandwich`` (Chi et al. 2023): parameter-free, the inner product of sinusoidal embeddings of i
  and j (a sum of cosines of n) with ALiBi-like per-head compression.

The zoo's rotary variants (p-RoPE, HoPE, xPos) are in :mod:`models.families.rotary`, its
contextual family (CoPE) in :mod:`models.families.cope`.

A method acting on positions (``applies_to=("positions",)``, e.g. ``scaling=linear``) divides
positions and distances by its factor for every family here: the families without frequencies
read the resolved position transform (``models.resolved_scaling.ResolvedScaling.position_factor``,
CoPE's counted positions included), the rotary ones the method's frequencies. Formulas and their sources: ``../shared/REFERENCE-ZOO.md``; each is tested
against an independent evaluation (tests/models/test_zoo.py, tests/models/test_xpos.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any

from models.lazy import nn, torch
from models.positions import Family, PositionConfig, ScoreBias, register_family


@dataclass
class T5Config(PositionConfig):
    """T5's buckets: how many, and the distance past which they are all one."""

    kind: str = "t5"
    num_buckets: int = 32
    max_distance: int = 128


@dataclass
class FireConfig(PositionConfig):
    """FIRE's MLP width, the initial c and L_0 (0: the training length)."""

    kind: str = "fire"
    fire_width: int = 32
    fire_c: float = 0.1
    fire_threshold: int = 0


# KERPLE keeps r1, r2 >= this (its reference clamps the parameters at 1e-2)
KERPLE_EPS = 1e-2
# ... and kerple_power's exponent r2 <= this
KERPLE_POWER_MAX = 2.0


def _distances(q_pos: torch.Tensor, k_pos: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """n = (i - j) / factor, float32, >= 0 (entries with j > i are masked; kept finite here)."""
    return (q_pos - k_pos).clamp(min=0).to(torch.float32) / factor


def _pi_factor(model: Any) -> torch.Tensor:
    """The active position transform's factor as a float32 0-d tensor (1: none), built once per
    scaling set (``models.resolved_scaling``)."""
    return model.resolved_scaling.factor_tensor(model.tok_emb.weight.device)


def _per_head(values: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """Every head's values in the tiled kernel's layout: values [N, 1, T, S, H] -> [N, H, T, S]
    (its ``head`` is every head in order, [1, H, 1, 1])."""
    if head.numel() != values.shape[-1]:
        raise ValueError(f"{head.numel()} heads asked for, {values.shape[-1]} computed.")
    return values.squeeze(1).movedim(-1, 1)


class _BiasFamily(Family):
    acts_on = "scores"
    # a position transform divides the distance; a training-free method re-positions a pair
    capabilities = ("positions", "pairs")


# --------------------------------------------------------------------------- T5


def t5_bucket(distance: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's causal bucket of a distance n >= 0 (``bidirectional=False``): n itself below
    num_buckets / 2, then log-spaced up to max_distance, and the last bucket beyond.

    ``distance`` may be fractional (position interpolation): exact buckets take its floor.
    """
    max_exact = num_buckets // 2
    small = distance < max_exact
    # clamp: the log branch is only used for distance >= max_exact (no log of 0)
    ratio = distance.clamp(min=max_exact) / max_exact
    large = max_exact + (
        torch.log(ratio) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).to(torch.long)
    large = large.clamp(max=num_buckets - 1)
    return torch.where(small, distance.floor().to(torch.long), large)


def _t5(head, q_pos, k_pos, table, factor, num_buckets, max_distance):
    bucket = t5_bucket(_distances(q_pos, k_pos, factor), num_buckets, max_distance)
    return table[head, bucket]  # table [H, num_buckets]


@register_family
class T5(_BiasFamily):
    """T5's relative position bias: a learned [H, num_buckets] table, one bias per bucket."""

    name = "t5"
    config = T5Config

    def check(self, cfg: PositionConfig, head_dim: int, d_model: int) -> None:
        if cfg.num_buckets < 2:
            raise ValueError(f"position.num_buckets must be >= 2, got {cfg.num_buckets}.")
        if cfg.max_distance <= cfg.num_buckets // 2:
            raise ValueError(
                f"position.max_distance must be greater than num_buckets / 2 = "
                f"{cfg.num_buckets // 2}, got {cfg.max_distance}."
            )

    def init(self, model: Any) -> None:
        rows = (model.model_cfg.n_heads, model.position_cfg.num_buckets)
        model.t5_bias = nn.Parameter(torch.randn(rows) * 0.02)  # [H, num_buckets]

    def score_bias(self, model: Any, length: int) -> ScoreBias:
        cfg = model.position_cfg
        return ScoreBias(_t5, (model.t5_bias, _pi_factor(model), cfg.num_buckets, cfg.max_distance))


# --------------------------------------------------------------------------- KERPLE


def clamp_through(x: torch.Tensor, low: float, high: float | None = None) -> torch.Tensor:
    """``x.clamp(low, high)`` in value, with the gradient of the identity: a parameter outside
    the range still learns, as in KERPLE's reference, which clamps the parameter's data (outside
    autograd) and differentiates at the clamped value."""
    return x + (x.clamp(low, high) - x).detach()


def project_(low: float, high: float | None, param: torch.Tensor) -> None:
    """Clamp ``param``'s data into [low, high] in place (a post-accumulate-grad hook: after its
    gradient, before the optimizer step, where KERPLE's reference clamps it in the forward)."""
    with torch.no_grad():
        param.clamp_(low, high)


def _kerple_log(head, q_pos, k_pos, r1, r2, factor):
    n = _distances(q_pos, k_pos, factor)
    r1, r2 = clamp_through(r1, KERPLE_EPS)[head], clamp_through(r2, KERPLE_EPS)[head]
    return -r1 * torch.log1p(r2 * n)


def _kerple_power(head, q_pos, k_pos, r1, r2, factor):
    n = _distances(q_pos, k_pos, factor)
    r1 = clamp_through(r1, KERPLE_EPS)[head]
    r2 = clamp_through(r2, KERPLE_EPS, KERPLE_POWER_MAX)[head]
    # 0^r2 = 0, without pow's infinite gradient in r2 at 0
    positive = n > 0
    return torch.where(positive, -r1 * torch.where(positive, n, 1.0) ** r2, 0.0)


class _Kerple(_BiasFamily):
    """KERPLE: learned positive per-head r1 (the multiplier) and r2, initialised and kept in
    range as the paper's reference (chijames/KERPLE, ``megatron/mpu/layers.py``): the bias reads
    them clamped at KERPLE_EPS (r2 <= 2 for the power kernel), and their data is clamped in place
    before every optimizer step, so that a parameter at the bound keeps its gradient and learns."""

    fn: Any = None
    # init U(0, r1_scale) and U(0, r2_scale), drawn in the reference's order (first drawn first)
    r1_scale, r2_scale, r2_first = 2.0, 1.0, False
    r2_max: float | None = None
    # the init ranges and the gradient at the bound changed (issue 50): retrain cached weights
    weights_revision = 1

    def init(self, model: Any) -> None:
        heads = model.model_cfg.n_heads
        if self.r2_first:
            r2 = torch.rand(heads) * self.r2_scale
            r1 = torch.rand(heads) * self.r1_scale
        else:
            r1 = torch.rand(heads) * self.r1_scale
            r2 = torch.rand(heads) * self.r2_scale
        model.kerple_r1, model.kerple_r2 = nn.Parameter(r1), nn.Parameter(r2)
        model.kerple_r1.register_post_accumulate_grad_hook(partial(project_, KERPLE_EPS, None))
        model.kerple_r2.register_post_accumulate_grad_hook(
            partial(project_, KERPLE_EPS, self.r2_max)
        )

    def score_bias(self, model: Any, length: int) -> ScoreBias:
        return ScoreBias(type(self).fn, (model.kerple_r1, model.kerple_r2, _pi_factor(model)))


@register_family
class KerpleLog(_Kerple):
    """-r1 log(1 + r2 n): r1 (the reference's bias_p) U(0, 2), r2 (bias_a) U(0, 1)."""

    name, fn = "kerple_log", staticmethod(_kerple_log)


@register_family
class KerplePower(_Kerple):
    """-r1 n^r2: the multiplier r1 (the reference's bias_a) U(0, 1), the exponent r2 (bias_p)
    U(0, 2), kept in [KERPLE_EPS, 2]."""

    name, fn = "kerple_power", staticmethod(_kerple_power)
    r1_scale, r2_scale, r2_first, r2_max = 1.0, 2.0, True, KERPLE_POWER_MAX


# --------------------------------------------------------------------------- FIRE


def _fire(head, q_pos, k_pos, w1, b1, w2, b2, c, multiplier, init_threshold, factor):
    c = c.clamp(min=1e-4)
    n = _distances(q_pos, k_pos, factor)
    i = q_pos.to(torch.float32) / factor
    threshold = multiplier.abs() * init_threshold  # L_thr = |m| L_0, the reference's
    # at least 1: at i = 0 (n = 0) the ratio is 0, not 0 / 0
    x = torch.log1p(c * n) / torch.log1p(c * torch.maximum(threshold, i).clamp(min=1.0))
    hidden = torch.relu(x[..., None] * w1 + b1)  # [..., W]
    if head.dim() == 0:  # flex: one entry, one head
        return (hidden * w2[head]).sum(-1) + b2[head]
    return _per_head(hidden @ w2.T + b2, head)  # [N, 1, T, S, H] -> [N, H, T, S]


def _fire_threshold_as_multiplier(init_threshold: float, module, state_dict, prefix, *_) -> None:
    """A load_state_dict pre-hook: a checkpoint of the raw-threshold FIRE (``fire_threshold``,
    before issue 50) loads as m = L_thr / L_0, which gives the same bias."""
    raw = state_dict.pop(prefix + "fire_threshold", None)
    if raw is not None and prefix + "fire_l_multiplier" not in state_dict:
        state_dict[prefix + "fire_l_multiplier"] = raw / init_threshold


@register_family
class Fire(_BiasFamily):
    """FIRE: b_h(i, j) = f(psi(n) / psi(max(L_thr, i)))_h with f an MLP 1 -> fire_width -> H
    (ReLU), psi(x) = log(c x + 1), c learned (init fire_c). As the paper's reference code (Li et
    al. 2024, appendix: ``threshold = abs(L_multiplier * init_L)``), the threshold is a learned
    multiplier of a fixed L_0 (fire_threshold, or the training length): L_thr = |m| L_0, m init
    1, so that an optimizer step of about lr moves L_thr by about lr L_0 (a raw L_thr would move
    by about lr, nothing at L_0 in the hundreds)."""

    name = "fire"
    config = FireConfig
    # the threshold became a multiplier of L_0 (issue 50): retrain cached weights
    weights_revision = 1

    def check(self, cfg: PositionConfig, head_dim: int, d_model: int) -> None:
        if cfg.fire_width < 1:
            raise ValueError(f"position.fire_width must be >= 1, got {cfg.fire_width}.")
        if cfg.fire_c <= 0:
            raise ValueError(f"position.fire_c must be > 0, got {cfg.fire_c}.")
        if cfg.fire_threshold < 0:
            raise ValueError(
                f"position.fire_threshold must be >= 0 (0 = the training length), got "
                f"{cfg.fire_threshold}."
            )

    def init(self, model: Any) -> None:
        cfg, heads = model.position_cfg, model.model_cfg.n_heads
        width = cfg.fire_width
        # nn.Linear's default initialisation (uniform in +-1/sqrt(fan_in))
        model.fire_w1 = nn.Parameter(torch.rand(width) * 2 - 1)  # fan_in 1
        model.fire_b1 = nn.Parameter(torch.rand(width) * 2 - 1)
        bound = 1 / math.sqrt(width)
        model.fire_w2 = nn.Parameter((torch.rand(heads, width) * 2 - 1) * bound)
        model.fire_b2 = nn.Parameter((torch.rand(heads) * 2 - 1) * bound)
        model.fire_c = nn.Parameter(torch.tensor(float(cfg.fire_c)))
        model.fire_l_multiplier = nn.Parameter(torch.tensor(1.0))  # L_thr = |m| L_0
        hook = partial(_fire_threshold_as_multiplier, self.init_threshold(model))
        model.register_load_state_dict_pre_hook(hook)

    def init_threshold(self, model: Any) -> float:
        """L_0, what the learned multiplier multiplies: fire_threshold, or the training length."""
        return float(model.position_cfg.fire_threshold or model.train_length)

    def score_bias(self, model: Any, length: int) -> ScoreBias:
        tensors = (
            model.fire_w1,
            model.fire_b1,
            model.fire_w2,
            model.fire_b2,
            model.fire_c,
            model.fire_l_multiplier,
            self.init_threshold(model),
            _pi_factor(model),
        )
        return ScoreBias(_fire, tensors)


# --------------------------------------------------------------------------- Sandwich


def sandwich_table(length: int, d_model: int, factor: float = 1.0) -> torch.Tensor:
    """sum_{k=1..D/2} cos(n 10000^(-2k/D)) - D/2 for n = 0..length-1 (divided by ``factor``),
    float32 [length]: the inner product of the sinusoidal embeddings of i and j minus its value
    at n = 0, so that the bias is 0 at distance 0 and negative beyond."""
    k = torch.arange(1, d_model // 2 + 1, dtype=torch.float64)
    inv_freq = 10000.0 ** (-2 * k / d_model)  # [D/2]
    n = torch.arange(length, dtype=torch.float64) / factor
    return ((n[:, None] * inv_freq).cos().sum(-1) - d_model // 2).to(torch.float32)


def _sandwich(head, q_pos, k_pos, table, compression):
    n = (q_pos - k_pos).clamp(0, table.shape[0] - 1)
    return table[n] / compression[head]


@register_family
class Sandwich(_BiasFamily):
    """Sandwich: (sum_k cos(n w_k) - D/2) / (h 8 / H) for head h = 1..H, parameter-free (the
    sinusoid has the model width D, as in the paper's NeMo implementation)."""

    name = "sandwich"

    def score_bias(self, model: Any, length: int) -> ScoreBias:
        heads, device = model.model_cfg.n_heads, model.tok_emb.weight.device
        resolved = model.resolved_scaling
        # built once per scaling set and grown by doubling: an entry depends only on its n
        key = ("sandwich_table", str(device))
        table = resolved.cache.get(key)
        if table is None or table.shape[0] < length:
            size = max(int(length), 2 * (0 if table is None else table.shape[0]))
            factor = float(resolved.position_factor or 1.0)
            table = sandwich_table(size, model.model_cfg.d_model, factor).to(device)  # [size]
            resolved.cache[key] = table
        compression = resolved.cached(
            ("sandwich_compression", heads, str(device)),
            lambda: torch.arange(1, heads + 1, device=device, dtype=torch.float32) * 8 / heads,
        )
        return ScoreBias(_sandwich, (table, compression))
