"""Mamba-2 (Dao & Gu, ICML 2024, state space duality), as transformers' ``Mamba2Mixer`` computes
it on its torch path (``mamba2_chunk_scan``, no CUDA kernels), with one B/C group:

    z, xBC, dt = W_in x                                  z, x: [E = expand * D]; B, C: [state]
    x, B, C = SiLU(causal conv_4(xBC) + bias)
    dt_t = softplus(dt_t + dt_bias)                      per head (head_dim channels of x each)
    h_t = exp(dt_t A) h_{t-1} + B_t (dt_t x_t)^T         A = -exp(A_log), per head; h [state, head_dim]
    y_t = h_t^T C_t + D x_t
    out = W_o (RMSNorm(y * SiLU(z)))                     the gate before the norm (norm_before_gate=False)

In the shared recurrence (``models.mixers.recurrence``): q = C, k = B, v = dt x, log decay dt A, no
delta rule. transformers also clamps dt to ``time_step_limit``, (0, inf) by default, a no-op left
out here. No position enters. Decoding continues from the state (``Mamba2.step``: the conv's last
inputs and h), O(1) per token."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.mixers.recurrence import MixerState, ShortConv, chunked_recurrence

__all__ = ["Mamba2"]


class Mamba2(nn.Module):
    def __init__(
        self,
        d_model: int,
        head_dim: int,
        d_state: int = 64,
        expand: int = 2,
        conv_size: int = 4,
        chunk_size: int = 64,
        norm_eps: float = 1e-5,
    ):
        super().__init__()
        inner = expand * d_model
        if inner % head_dim:
            raise ValueError(
                f"expand * d_model = {inner} must be a multiple of head_dim {head_dim}."
            )
        self.inner, self.head_dim, self.d_state = inner, head_dim, d_state
        self.n_heads = inner // head_dim
        self.chunk_size, self.norm_eps = chunk_size, norm_eps
        conv_width = inner + 2 * d_state  # x, B, C go through the conv; z and dt do not
        self.in_proj = nn.Linear(d_model, inner + conv_width + self.n_heads, bias=False)
        self.conv = ShortConv(conv_width, conv_size, bias=True)
        # Mamba-2's initialisation (transformers' init_mamba2_weights): A_h = h (1..H), D = 1,
        # dt = exp(U(log 1e-3, log 1e-1)) floored at 1e-4, dt_bias its inverse softplus
        self.A_log = nn.Parameter(torch.arange(1, self.n_heads + 1, dtype=torch.float32).log())
        self.D = nn.Parameter(torch.ones(self.n_heads))
        dt = torch.empty(self.n_heads).uniform_(math.log(1e-3), math.log(1e-1)).exp()
        dt = dt.clamp_min(1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.norm_weight = nn.Parameter(torch.ones(inner))
        self.o_proj = nn.Linear(inner, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, L, D] -> [N, L, D], causal, from a zero state."""
        return self.step(x)[0]

    def step(
        self, x: torch.Tensor, state: MixerState | None = None, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, MixerState]:
        """x [N, T, D] the tokens after ``state`` (the conv's last inputs, the recurrence's h;
        None: the sequence starts) -> (y [N, T, D], the state after them); ``valid`` [N, T]
        bool: a False token (padding) is skipped (its own output is meaningless). Without state
        and valid this is the training path (``forward``)."""
        n, length, _ = x.shape
        h, p = self.n_heads, self.head_dim
        conv_state, rec_state = (None, None) if state is None else state
        z, xbc, dt = self.in_proj(x).split([self.inner, self.inner + 2 * self.d_state, h], dim=-1)
        xbc, conv_state = self.conv.step(xbc, conv_state, valid)
        xs, B, C = xbc.split([self.inner, self.d_state, self.d_state], dim=-1)
        dt = F.softplus(dt.float() + self.dt_bias.float()).transpose(1, 2)  # [N, H, L]
        xs = xs.float().view(n, length, h, p).transpose(1, 2)  # [N, H, L, p]
        # one group: every head reads the same B and C
        B = B.float().unsqueeze(1).expand(n, h, length, self.d_state)  # [N, H, L, state]
        C = C.float().unsqueeze(1).expand(n, h, length, self.d_state)
        log_decay = dt * -self.A_log.float().exp()[:, None]  # [N, H, L]
        writes = xs * dt.unsqueeze(-1)  # [N, H, L, p]
        y, rec_state = chunked_recurrence(
            C, B, writes, log_decay, None, self.chunk_size, rec_state, valid, return_state=True
        )
        y = y + self.D.float()[:, None, None] * xs  # [N, H, L, p] the skip connection
        y = y.transpose(1, 2).reshape(n, length, self.inner) * F.silu(z.float())
        y = F.rms_norm(y, (self.inner,), self.norm_weight.float(), self.norm_eps)
        return self.o_proj(y.to(x.dtype)), (conv_state, rec_state)
