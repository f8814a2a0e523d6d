"""Kimi Delta Attention (Kimi Linear, Moonshot AI 2025, arXiv 2510.26692), as transformers'
``KimiLinearDeltaAttention`` computes it (its torch path, ``chunk_kimi_delta_attention``): Gated
DeltaNet with a decay per key channel instead of per head, and low-rank gates.

    q, k, v = SiLU(causal conv_4([W_q x, W_k x, W_v x]))      per head, dk = dv = D / H
    q = l2(q) / sqrt(dk), k = l2(k)
    beta_t = sigmoid(W_b x_t)                                 per head
    g_t = -exp(A_log_h) softplus(W_fb W_fa x_t + dt_bias)     log decay per head and key channel
    S_t = diag(exp(g_t)) S_{t-1} + k_t beta_t (v_t - (diag(exp(g_t)) S_{t-1})^T k_t)^T
    o_t = S_t^T q_t
    y = W_o (RMSNorm(o) * sigmoid(W_gb W_ga x))               norm per head, then the output gate

The rank of both low-rank gates is the head dim (Kimi Linear's). No position enters. What it shares
with Gated DeltaNet (q, k, v through the conv, the delta rule, the norm and output, decoding from
its state) is ``models.mixers.delta_rule``; this file holds its decay and gate."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.mixers.delta_rule import DeltaRuleMixer
from models.mixers.recurrence import ShortConv

__all__ = ["KimiDeltaAttention"]


class KimiDeltaAttention(DeltaRuleMixer):
    def __init__(
        self,
        d_model: int,
        n_heads: int,
        conv_size: int = 4,
        chunk_size: int = 8,
        norm_eps: float = 1e-6,
    ):
        # chunk 8, not 64: the per-channel decay forms a [C, C, dk] product per chunk (CPU step
        # time at width 128, L 128: chunk 8 312 ms, 16 450 ms, 32 993 ms; tests/perf/README.md)
        super().__init__(d_model, n_heads, chunk_size, norm_eps)  # the q, k, v projections
        width, rank = self.width, self.head_dim
        self.conv = ShortConv(3 * width, conv_size)
        self.f_a_proj = nn.Linear(d_model, rank, bias=False)  # forget gate, low rank
        self.f_b_proj = nn.Linear(rank, width, bias=False)
        self.b_proj = nn.Linear(d_model, n_heads, bias=False)  # write strength beta
        self.g_a_proj = nn.Linear(d_model, rank, bias=False)  # output gate, low rank
        self.g_b_proj = nn.Linear(rank, width, bias=False)
        # flash-linear-attention's initialisation (transformers' _init_weights): A ~ U(1, 16),
        # dt = exp(U(log 1e-3, log 1e-1)) floored at 1e-4, dt_bias its inverse softplus
        self.A_log = nn.Parameter(torch.empty(n_heads).uniform_(1, 16).log())
        dt = torch.empty(width).uniform_(math.log(1e-3), math.log(1e-1)).exp().clamp_min(1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.norm_weight = nn.Parameter(torch.ones(self.head_dim))
        self.o_proj = nn.Linear(width, d_model, bias=False)

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """g_t = -exp(A_log_h) softplus(W_fb W_fa x_t + dt_bias) [N, L, H, d], per key channel."""
        step = self.f_b_proj(self.f_a_proj(x)).float() + self.dt_bias.float()
        step = step.unflatten(-1, (self.n_heads, self.head_dim))  # [N, L, H, d]
        return -self.A_log.float().exp()[:, None] * F.softplus(step)

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        """sigmoid(W_gb W_ga x) [N, L, H, d]."""
        gate = self.g_b_proj(self.g_a_proj(x)).unflatten(-1, (self.n_heads, self.head_dim))
        return torch.sigmoid(gate.float())
