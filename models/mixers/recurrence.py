"""The one chunked recurrence behind every recurrent mixer, and their short causal convolution.

Per head, a state S [dk, dv] is decayed, written and read once per token:

    S_t = diag(a_t) S_{t-1} + k_t u_t^T        o_t = S_t^T q_t

with a_t = exp(g_t) (``log_decay``: one scalar per head and token, Mamba-2 and Gated DeltaNet,
or one per key channel, Kimi Delta Attention). Without ``beta`` the write is u_t = v_t (Mamba-2's
state space duality, a decayed linear attention). With ``beta`` it is the delta rule (Yang et al.
2024/2025): u_t = beta_t (v_t - S'^T k_t), S' the decayed state before the write, so the layer
corrects what its state already predicts for k_t instead of adding to it.

Computed chunk by chunk (chunk C): inside a chunk every term is a C x C matmul against the chunk's
start state S0; the delta rule's writes solve one unit lower-triangular system per chunk (the WY /
UT form: (I + A) U = beta V - beta (K exp G) S0, A_ij = beta_i k_i.k_j exp(G_i - G_j), j < i), and
only the chunk boundaries run sequentially. G is the cumulative log decay inside the chunk, so every
exponential taken is of a non-positive number (no overflow, whatever the decay). Float32 throughout,
as the references keep their state (transformers' ``torch_chunk_gated_delta_rule``,
``chunk_kimi_delta_attention``, ``mamba2_chunk_scan``).

A call can start from a state and return the state after its last token, so that decoding
continues from it, O(1) per token (a mixer's ``step``; transformers' Mamba2 and Qwen3-Next caches
keep the same two: the conv's last inputs, the recurrent state). Padding is an identity step:
no decay, no write, and the conv's window passes over it."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["MixerState", "ShortConv", "chunked_recurrence", "l2_normalize"]

#: a stateful mixer's cache (``step``): its conv's last inputs [N, size - 1, C] and the
#: recurrence's state S [N, H, dk, dv] (float32); neither grows with the prefix
MixerState = tuple[torch.Tensor, torch.Tensor]


class ShortConv(nn.Module):
    """A causal depthwise convolution over time (kernel ``size``, the references' 4) and SiLU:
    token t sees tokens t - size + 1 .. t of its own channel only."""

    def __init__(self, channels: int, size: int, bias: bool = False):
        super().__init__()
        self.conv1d = nn.Conv1d(
            channels, channels, size, groups=channels, padding=size - 1, bias=bias
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, L, C] -> [N, L, C]; the left padding makes it causal, the right overhang is cut."""
        length = x.shape[1]
        return F.silu(self.conv1d(x.transpose(1, 2))[..., :length].transpose(1, 2))

    def step(
        self, x: torch.Tensor, state: torch.Tensor | None = None, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The convolution continued from ``state`` [N, size - 1, C], the inputs before x [N, T, C]
        (None: the sequence starts, as zeros: the same left padding as :meth:`forward`) ->
        (out [N, T, C], the new state: the last size - 1 real inputs). ``valid`` [N, T] bool: a
        False input (padding) is left out, so every real input's window holds the real inputs
        before it, as if the padding were not there; a pad's output is meaningless."""
        keep = self.conv1d.kernel_size[0] - 1
        n, length, channels = x.shape
        if state is None and valid is None:  # the training path, bit for bit
            last = x[:, length - min(keep, length) :]  # [N, <= keep, C]
            return self(x), F.pad(last, (0, 0, keep - last.shape[1], 0))
        if state is None:
            state = x.new_zeros(n, keep, channels)
        seen = torch.cat((state.to(x.dtype), x), dim=1)  # [N, keep + T, C]
        at = None  # [N, T] where each new input's window ends, after the reordering
        if valid is not None:
            # a stable sort moves each row's padding before its state: the real inputs then stand
            # in order, each right after the ones it follows
            real = torch.cat((valid.new_ones(n, keep), valid), dim=1).to(torch.int8)
            order = torch.sort(real, dim=1, stable=True).indices  # [N, keep + T]
            seen = seen.gather(1, order[..., None].expand(-1, -1, channels))
            at = (order.argsort(dim=1)[:, keep:] - keep).clamp(min=0)  # a pad's: any window
        # the windows as a view [N, T, C, size] times the taps: the depthwise conv without
        # padding (10x faster than conv1d's call for one token on CPU, as fast at 1024)
        out = (seen.unfold(1, keep + 1, 1) * self.conv1d.weight[:, 0]).sum(-1)  # [N, T, C]
        if self.conv1d.bias is not None:
            out = out + self.conv1d.bias
        if at is not None:
            out = out.gather(1, at[..., None].expand(-1, -1, channels))
        return F.silu(out), seen[:, seen.shape[1] - keep :]


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum x^2 + eps) over the last axis (flash-linear-attention's and transformers'
    form: eps inside the root, not F.normalize's max(norm, eps))."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def _pairwise_decay(G: torch.Tensor) -> torch.Tensor:
    """G [..., C, c] cumulative log decay -> exp(G_i - G_j) [..., C, C, c] for j <= i, 0 above
    (masked before the exponential, so no +inf is ever formed)."""
    size = G.shape[-2]
    causal = torch.ones(size, size, dtype=torch.bool, device=G.device).tril()  # [C, C] j <= i
    diff = G.unsqueeze(-2) - G.unsqueeze(-3)  # [..., C(i), C(j), c]
    return diff.masked_fill(~causal[..., None], float("-inf")).exp()


def _decayed_scores(a: torch.Tensor, b: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    """sum_c a_ic b_jc exp(G_ic - G_jc): a, b [..., C, dk], decay [..., C, C, 1 or dk] ->
    [..., C, C]. A scalar decay factors out of the dot product (one matmul); a per-channel one
    does not (the product is formed channel by channel)."""
    if decay.shape[-1] == 1:
        return (a @ b.transpose(-1, -2)) * decay.squeeze(-1)
    return (a.unsqueeze(-2) * b.unsqueeze(-3) * decay).sum(-1)


def chunked_recurrence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor | None = None,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
    return_state: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The recurrence above from ``initial_state`` [N, H, dk, dv] (None: zeros). q, k
    [N, H, L, dk]; v [N, H, L, dv]; log_decay [N, H, L] (per head) or [N, H, L, dk] (per key
    channel), entries <= 0; beta [N, H, L] or None (no delta rule). Returns o [N, H, L, dv] in v's
    dtype, and with ``return_state`` also the state after the last token [N, H, dk, dv] (float32),
    from which a later call continues. ``valid`` [N, L] bool: a False token (padding) is an
    identity step, no decay and no write (its own output is meaningless). L need not be a
    multiple of ``chunk_size``: the tail is zero-padded after the last token, which no earlier
    token reads and which leaves the state as it is (no decay, no write)."""
    dtype = v.dtype
    n, h, length, dk = k.shape
    # a continuation's chunk is at most its length: a decoding step is one token, not a chunk of
    # zero padding (a call from the zero state, the training path, keeps its chunk and numerics)
    size = chunk_size if initial_state is None else min(chunk_size, length)
    pad = (-length) % size
    g = log_decay if log_decay.dim() == 4 else log_decay.unsqueeze(-1)  # [N, H, L, dk or 1]
    if valid is not None:  # a pad decays nothing and writes nothing (u = 0: beta = 0, or v = 0)
        pads = ~valid[:, None, :, None]  # [N, 1, L, 1]
        g = g.masked_fill(pads, 0.0)
        if beta is None:
            v = v.masked_fill(pads, 0.0)
        else:
            beta = beta.masked_fill(pads[..., 0], 0.0)
    q, k, v, g = (F.pad(t.float(), (0, 0, 0, pad)) for t in (q, k, v, g))
    q, k, v, g = (t.view(n, h, -1, size, t.shape[-1]) for t in (q, k, v, g))  # [N, H, n, C, .]
    G = g.cumsum(dim=3)  # [N, H, n, C, dk or 1] log decay from the chunk's start through token t
    decay = _pairwise_decay(G)  # [N, H, n, C, C, dk or 1]
    scores = _decayed_scores(q, k, decay)  # [N, H, n, C, C] q_i.k_j decayed from j to i, j <= i
    q_start = q * G.exp()  # reads the chunk's start state, decayed through token i
    k_end = k * (G[..., -1:, :] - G).exp()  # writes of token j, decayed to the chunk's end
    end_decay = G[..., -1, :].exp().unsqueeze(-1)  # [N, H, n, dk or 1, 1] start -> end

    writes, carried = v, None  # u = v (no delta rule): no state term to subtract
    if beta is not None:
        b = F.pad(beta.float(), (0, pad)).view(n, h, -1, size, 1)  # [N, H, n, C, 1]
        strict = torch.ones(size, size, dtype=torch.bool, device=q.device).tril(-1)
        system = _decayed_scores(k * b, k, decay) * strict  # [N, H, n, C, C] A, j < i
        eye = torch.eye(size, device=q.device)
        # (I + A) U = beta V - beta (K exp G) S0: both right-hand sides solved once per chunk
        writes = torch.linalg.solve_triangular(system + eye, v * b, upper=False, unitriangular=True)
        carried = torch.linalg.solve_triangular(
            system + eye, k * b * G.exp(), upper=False, unitriangular=True
        )  # [N, H, n, C, dk]: how much of S0 each write subtracts

    state = (
        q.new_zeros(n, h, dk, v.shape[-1]) if initial_state is None else initial_state.float()
    )  # [N, H, dk, dv]
    out = []
    for c in range(q.shape[2]):
        u = writes[:, :, c] if carried is None else writes[:, :, c] - carried[:, :, c] @ state
        out.append(q_start[:, :, c] @ state + scores[:, :, c] @ u)  # [N, H, C, dv]
        state = state * end_decay[:, :, c] + k_end[:, :, c].transpose(-1, -2) @ u
    o = torch.cat(out, dim=2)[:, :, :length].to(dtype)
    return (o, state) if return_state else o
