"""Causal self-attention of one layer: projections, RoPE on queries and keys, log-n, the kernel.

Everything position-dependent arrives precomputed in :class:`AttentionInputs` (once per forward
pass, shared by all layers), so a layer never assumes ``arange(L)`` positions.

Shapes: N batch, L new tokens, S keys (cached + new), H query heads, G key/value heads, d head dim,
D model width, T query tile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from models.positions import rotate

if TYPE_CHECKING:
    from models.transformer import ModelConfig

__all__ = ["Attention", "AttentionInputs", "attend", "logn_query_scale"]

# Entries of a masked attention logit tile held at once when the mask must be materialised.
ATTENTION_TILE_ELEMENTS = 1 << 24


@dataclass
class AttentionInputs:
    """What every layer's attention needs, computed once per forward pass."""

    cos: torch.Tensor | None  # [N, 1, L, r/2] float32
    sin: torch.Tensor | None
    layout: str
    slopes: torch.Tensor | None  # [H] ALiBi
    q_scale: torch.Tensor | None  # [N, 1, L, 1] float32 log-n factor per query; None = 1
    q_pos: torch.Tensor  # [N, L]
    k_pos: torch.Tensor  # [N, S]
    k_valid: torch.Tensor | None  # [N, S] bool; None when every key is real
    past_len: int
    scale: float
    want_entropy: bool


def logn_query_scale(position_ids: torch.Tensor, train_length: int) -> torch.Tensor:
    """Log-n factor of the query at each position id j: max(1, ln(j + 1) / ln L), float32, same shape.

    The published rule (Su; Qwen's ``logn_attn``: ``logn_list[j] = math.log(j + 1, L)`` if
    j + 1 > L else 1), i.e. ``logn_factor(j + 1, L)`` per query: queries inside the trained range
    are untouched, and a query's factor depends on its own position only, so what a position
    predicts does not depend on how many tokens follow it. The factor multiplies the query, hence
    the q.k logits only; ALiBi's distance bias is added unscaled (Qwen scales the query the same
    way; scaling the bias too would also sharpen ALiBi's distance penalty).
    """
    if train_length < 2:
        raise ValueError(f"train_length must be >= 2 (ln(1) = 0), got {train_length!r}.")
    ratio = torch.log(position_ids.to(torch.float64) + 1) / math.log(train_length)
    return ratio.clamp(min=1.0).to(torch.float32)


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Causal attention of q [N, H, L, d] over k, v [N, G, S, d] -> ([N, H, L, d], entropy [N, H, L] | None).

    Plain causal attention goes straight to the fused kernel (no L x S matrix). Padding, ALiBi or an
    entropy request need an explicit mask or probabilities: those are built in query tiles so that
    memory stays O(tile x S) however long the sequence.
    """
    n, h, length, _ = q.shape
    s = k.shape[2]
    gqa = h != k.shape[1]
    plain = inputs.slopes is None and inputs.k_valid is None and not inputs.want_entropy
    if plain and (length == s or length == 1):
        return (
            F.scaled_dot_product_attention(
                q, k, v, is_causal=length == s and length > 1, scale=inputs.scale, enable_gqa=gqa
            ),
            None,
        )
    if gqa:
        k = k.repeat_interleave(h // k.shape[1], dim=1)
        v = v.repeat_interleave(h // v.shape[1], dim=1)
    tile = max(1, ATTENTION_TILE_ELEMENTS // (n * h * s))
    key_index = torch.arange(s, device=q.device)
    outputs, entropies = [], []
    for start in range(0, length, tile):
        stop = min(start + tile, length)
        query_index = inputs.past_len + torch.arange(start, stop, device=q.device)
        allowed = key_index[None, :] <= query_index[:, None]  # [T, S]
        allowed = allowed[None, None]  # [1, 1, T, S]
        if inputs.k_valid is not None:
            # a padding query still sees itself, so its (ignored) row never becomes all -inf
            is_self = key_index[None, :] == query_index[:, None]
            allowed = allowed & (inputs.k_valid[:, None, None, :] | is_self)
        bias = torch.zeros(allowed.shape, dtype=torch.float32, device=q.device)
        bias = bias.masked_fill(~allowed, float("-inf"))
        if inputs.slopes is not None:
            distance = inputs.q_pos[:, start:stop, None] - inputs.k_pos[:, None, :]  # [N, T, S]
            bias = bias - inputs.slopes[None, :, None, None] * distance[:, None].float()
        q_tile = q[:, :, start:stop]
        if inputs.want_entropy:
            logits = (
                torch.einsum("nhtd,nhsd->nhts", q_tile.float(), k.float()) * inputs.scale + bias
            )
            probs = logits.softmax(dim=-1)
            entropies.append(-torch.special.xlogy(probs, probs).sum(-1))  # [N, H, T]
            outputs.append(torch.einsum("nhts,nhsd->nhtd", probs, v.float()).to(q.dtype))
        else:
            outputs.append(
                F.scaled_dot_product_attention(
                    q_tile, k, v, attn_mask=bias.to(q.dtype), scale=inputs.scale
                )
            )
    entropy = torch.cat(entropies, dim=2) if entropies else None
    return torch.cat(outputs, dim=2), entropy


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.kv_proj = nn.Linear(cfg.d_model, 2 * cfg.kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        inputs: AttentionInputs,
        cached: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor | None]:
        n, length, _ = x.shape
        q = (
            self.q_proj(x).view(n, length, self.n_heads, self.head_dim).transpose(1, 2)
        )  # [N, H, L, d]
        k, v = (
            self.kv_proj(x).view(n, length, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        )  # [N, G, L, d] each
        if inputs.cos is not None:  # RoPE: rotate this layer's queries and keys, never the values
            q = rotate(q, inputs.cos, inputs.sin, inputs.layout)
            k = rotate(k, inputs.cos, inputs.sin, inputs.layout)
        if inputs.q_scale is not None:  # log-n, per query position
            q = (q.float() * inputs.q_scale).to(q.dtype)
        if cached is not None:
            k = torch.cat((cached[0], k), dim=2)  # [N, G, S, d]
            v = torch.cat((cached[1], v), dim=2)
        out, entropy = attend(q, k, v, inputs)
        out = out.transpose(1, 2).reshape(n, length, -1)  # [N, L, D]
        return self.o_proj(out), (k, v), entropy
