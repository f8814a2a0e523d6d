"""What Gated DeltaNet and Kimi Delta Attention share: q, k, v projections through one short causal
conv, l2-normed q and k, a write strength beta per head, the delta rule (``chunked_recurrence``),
a norm per head, an output gate and the output projection. A subclass builds the rest of its
layer (its decay and gate projections, the conv, A_log, dt_bias, norm_weight, o_proj) in its own
order, since the order of construction sets what a seed draws for each parameter, and says how
it decays (:meth:`log_decay`) and gates (:meth:`output_gate`).

Both run as a stateful layer too (:meth:`DeltaRuleMixer.step`): the state is the conv's last
inputs and the recurrence's S, so decoding costs O(1) per token whatever the prefix."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.mixers.recurrence import MixerState, chunked_recurrence, l2_normalize

__all__ = ["DeltaRuleMixer"]


class DeltaRuleMixer(nn.Module):
    conv: nn.Module  # a ShortConv over the 3 * width channels of q, k, v, built by the subclass
    norm_weight: nn.Parameter  # [head_dim]
    o_proj: nn.Linear
    b_proj: nn.Linear  # d_model -> n_heads, the write strength beta

    def __init__(self, d_model: int, n_heads: int, chunk_size: int, norm_eps: float):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} must be a multiple of n_heads {n_heads}.")
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.chunk_size, self.norm_eps = chunk_size, norm_eps
        self.width = n_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, self.width, bias=False)
        self.k_proj = nn.Linear(d_model, self.width, bias=False)
        self.v_proj = nn.Linear(d_model, self.width, bias=False)

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, L, D] -> float32 log decay [N, L, H] (per head) or [N, L, H, d] (per key
        channel), entries <= 0."""
        raise NotImplementedError

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, L, D] -> the activated float32 gate [N, L, H, d] on the normed output."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, L, D] -> [N, L, D], causal, from a zero state."""
        return self.step(x)[0]

    def step(
        self, x: torch.Tensor, state: MixerState | None = None, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, MixerState]:
        """x [N, T, D] the tokens after ``state`` (None: the sequence starts) -> (y [N, T, D],
        the state after them). ``valid`` [N, T] bool: a False token (padding) is skipped, the
        conv's window and the state pass over it (its own output is meaningless). Without state
        and valid this is the training path (``forward``)."""
        n, length, _ = x.shape
        h, d = self.n_heads, self.head_dim
        conv_state, rec_state = (None, None) if state is None else state
        qkv = torch.cat((self.q_proj(x), self.k_proj(x), self.v_proj(x)), dim=-1)
        qkv, conv_state = self.conv.step(qkv, conv_state, valid)
        q, k, v = qkv.view(n, length, 3, h, d).permute(2, 0, 3, 1, 4)  # each [N, H, L, d]
        q = l2_normalize(q.float()) * d**-0.5
        k = l2_normalize(k.float())
        beta = torch.sigmoid(self.b_proj(x)).transpose(1, 2)  # [N, H, L]
        decay = self.log_decay(x).transpose(1, 2)  # [N, H, L] or [N, H, L, d]
        o, rec_state = chunked_recurrence(
            q, k, v, decay, beta, self.chunk_size, rec_state, valid, return_state=True
        )
        o = o.transpose(1, 2).float()  # [N, L, H, d]
        o = F.rms_norm(o, (d,), self.norm_weight.float(), self.norm_eps) * self.output_gate(x)
        return self.o_proj(o.reshape(n, length, h * d).to(x.dtype)), (conv_state, rec_state)
