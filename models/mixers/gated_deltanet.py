"""Gated DeltaNet (Yang, Kautz, Hatamizadeh, ICLR 2025), the linear layer of Qwen3-Next, Qwen3.5
and Olmo Hybrid, as transformers' ``Qwen3NextGatedDeltaNet`` computes it (its torch path,
``torch_chunk_gated_delta_rule``; one key head per value head):

    q, k, v = SiLU(causal conv_4([W_q x, W_k x, W_v x]))      per head, dk = dv = D / H
    q = l2(q) / sqrt(dk), k = l2(k)
    beta_t = sigmoid(W_b x_t)                                 write strength, per head
    g_t = -exp(A_log) softplus(W_a x_t + dt_bias)             log decay, per head (<= 0)
    S_t = exp(g_t) S_{t-1} + k_t beta_t (v_t - (exp(g_t) S_{t-1})^T k_t)^T,   o_t = S_t^T q_t
    y = W_o (RMSNorm(o) * SiLU(W_z x))                        norm per head, then the output gate

Separate projections (Olmo Hybrid's layout): Qwen3-Next fuses W_q, W_k, W_v, W_z into one matrix
and W_b, W_a into another, a permutation of the same rows (the test maps one onto the other). No
position enters: order reaches the layer only through the causal conv and the recurrence. What it
shares with Kimi Delta Attention (q, k, v through the conv, the delta rule, the norm and output,
decoding from its state) is ``models.mixers.delta_rule``; this file holds its decay and gate."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.mixers.delta_rule import DeltaRuleMixer
from models.mixers.recurrence import ShortConv

__all__ = ["GatedDeltaNet"]


class GatedDeltaNet(DeltaRuleMixer):
    def __init__(
        self,
        d_model: int,
        n_heads: int,
        conv_size: int = 4,
        chunk_size: int = 64,
        norm_eps: float = 1e-6,
    ):
        super().__init__(d_model, n_heads, chunk_size, norm_eps)  # the q, k, v projections
        width = self.width
        self.a_proj = nn.Linear(d_model, n_heads, bias=False)  # decay's time step
        self.b_proj = nn.Linear(d_model, n_heads, bias=False)  # write strength beta
        self.z_proj = nn.Linear(d_model, width, bias=False)  # output gate
        self.conv = ShortConv(3 * width, conv_size)
        # Qwen3-Next's initialisation: A ~ U(0.01, 16) (bounded away from 0 so A_log is finite),
        # dt_bias = 1
        self.A_log = nn.Parameter(torch.empty(n_heads).uniform_(0.01, 16).log())
        self.dt_bias = nn.Parameter(torch.ones(n_heads))
        self.norm_weight = nn.Parameter(torch.ones(self.head_dim))
        self.o_proj = nn.Linear(width, d_model, bias=False)

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """g_t = -exp(A_log) softplus(W_a x_t + dt_bias) [N, L, H], one per head."""
        # float32 before the exponential: A_log up to log 16 overflows nothing there
        return -self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias)

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        """SiLU(W_z x) [N, L, H, d]."""
        return F.silu(self.z_proj(x).unflatten(-1, (self.n_heads, self.head_dim)).float())
