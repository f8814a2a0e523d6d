"""Causal self-attention of one layer: projections, RoPE on queries and keys, log-n, the kernel.

Everything position-dependent arrives precomputed in
:class:`models.attention_inputs.AttentionInputs` (once per forward pass, shared by all layers), so
a layer never assumes ``arange(L)`` positions.

The kernel (:func:`attend`): SDPA for plain causal attention; on CUDA, compiled flex attention for
a score bias, padding and cache chunks (bias and mask applied inside the kernel, nothing L x S in memory);
elsewhere an explicit mask in query tiles. See :data:`models.flex.FLEX_ATTENTION`. A position
family that acts on the scores hands in one :class:`models.positions.ScoreBias`, which every
kernel applies the same way; nothing here knows which family it came from. A training-free
method's per-pair positions (:class:`models.attention_inputs.PairInputs`: Self-Extend, ReRoPE,
StreamingLLM) score each pair closer than the window as usual and a farther one at the method's
positions, in the tiled path (:mod:`models.tiled_attention`: two logit tiles merged by distance).

Shapes: N batch, L new tokens, S keys (cached + new), H query heads, G key/value heads, d head dim,
D model width, T query tile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from models.attention_inputs import AttentionInputs, PairInputs, fused_plain
from models.designs.registry import HOOKS, Design
from models.flex import attend_flex, use_flex
from models.model_config import ModelConfig
from models.positions import PositionConfig, rotate
from models.tiled_attention import attend_tiled

__all__ = [
    "Attention",
    "attend",
    "logn_query_scale",
    "weightless_rms_norm",
]


def weightless_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last (head) dim, computed in float32, in x's dtype: an
    RMS norm without a weight (transformers' ``Llama4TextWeightlessRMSNorm``, alias
    ``Llama4TextL2Norm``)."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def logn_query_scale(position_ids: torch.Tensor, train_length: int) -> torch.Tensor:
    """Log-n factor of the query at each position id j: max(1, ln(j + 1) / ln L), float32, same shape.

    The published rule (Su; Qwen's ``logn_attn``: ``logn_list[j] = math.log(j + 1, L)`` if
    j + 1 > L else 1), i.e. ``logn_factor(j + 1, L)`` per query: queries inside the trained range
    are untouched, and a query's factor depends on its own position only, so what a position
    predicts does not depend on how many tokens follow it. The factor multiplies the query, hence
    the q.k logits only; a family's score bias is added unscaled (Qwen scales the query the same
    way; scaling the bias too would also sharpen a distance penalty).
    """
    if train_length < 2:
        raise ValueError(f"train_length must be >= 2 (ln(1) = 0), got {train_length!r}.")
    ratio = torch.log(position_ids.to(torch.float64) + 1) / math.log(train_length)
    return ratio.clamp(min=1.0).to(torch.float32)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    inputs: AttentionInputs,
    layer: int = 0,
    far: tuple[torch.Tensor, ...] | None = None,
    sink: torch.Tensor | None = None,
    decay: tuple[torch.Tensor, torch.Tensor] | None = None,
    stick_breaking: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Causal attention of q [N, H, L, d] over k, v [N, G, S, d'] -> ([N, H, L, d'], stats | None),
    stats [N, H, L, 2] each query's attention entropy and attention on the first key (when
    ``inputs.want_entropy``).

    Plain causal attention goes straight to the fused kernel (no L x S matrix; flash/efficient
    kernels on CUDA). Padding, a score bias or a cache with several new queries need a mask or a bias: on
    CUDA they go through compiled flex attention (:func:`models.flex.attend_flex`, see
    :data:`models.flex.FLEX_ATTENTION`), elsewhere and for an entropy request (which needs the
    probabilities) or a contextual term
    (which needs whole logits rows; ``layer`` is the block it belongs to) the mask is built in
    query tiles so that memory stays O(tile x S) however long the sequence. So is a training-free
    method's (``inputs.pairs``): ``far`` = (queries, keys) rotated to their far positions. So is
    a layer with a learned attention ``sink`` [H] (one logit per head that joins every softmax's
    denominator, attached to no value) and one with a sliding window or chunks (``inputs.window``,
    ``inputs.chunk``; also on flex). So is a FoX layer's ``decay`` = (F of the queries [N, H, L],
    F of the keys [N, H, S]): the logit of pair (i, j) gains F_i - F_j. So is ``stick_breaking``
    attention, which replaces the softmax (:func:`models.tiled_attention.stick_breaking_weights`).
    """
    n, h, length, _ = q.shape
    s = k.shape[2]
    gqa = h != k.shape[1]
    if sink is not None or decay is not None or stick_breaking:
        return attend_tiled(q, k, v, inputs, layer, far, sink, decay, stick_breaking)
    if fused_plain(length, s, inputs):
        return (
            F.scaled_dot_product_attention(
                q, k, v, is_causal=length == s and length > 1, scale=inputs.scale, enable_gqa=gqa
            ),
            None,
        )
    if use_flex(q, inputs):
        return attend_flex(q, k, v, inputs), None
    return attend_tiled(q, k, v, inputs, layer, far)


class Attention(nn.Module):
    """One layer's causal self-attention; the active designs (``models.designs``) fill its hooks:
    ``qk`` before the rotation, ``query`` after it and log-n, ``kernel`` in the kernel call,
    ``heads`` around it, ``output`` before ``o_proj`` (each in its design's ``order``)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        kv_heads: int,
        head_dim: int,
        layer: int = 0,
        designs: Sequence[Design] = (),
        model_cfg: ModelConfig | None = None,
        position_cfg: PositionConfig | None = None,
    ):
        super().__init__()
        self.n_heads, self.kv_heads, self.head_dim = n_heads, kv_heads, head_dim
        self.layer = layer  # the block index: a contextual term may have parameters per layer
        self.designs = tuple(designs)
        for design in self.designs:  # their parameters first, in order (the seeded init stream)
            design.attach(self, model_cfg, position_cfg, layer)
        self.q_proj = nn.Linear(d_model, n_heads * head_dim, bias=False)
        self.kv_proj = nn.Linear(d_model, 2 * kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        self.hooks = {h: [d for d in self.designs if h in d.hooks] for h in HOOKS}

    def forward(
        self,
        x: torch.Tensor,
        inputs: AttentionInputs,
        cached: tuple[torch.Tensor, ...] | None,
        query_from: int = 0,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor | None]:
        """x [N, L, D] -> (output [N, L - query_from, D], (k, v) [N, G, S, d], entropy); a
        design's ``kernel`` hook may keep one more entry per layer (FoX: its keys' F [N, H, S]).

        ``query_from`` > 0: keys and values for all L new tokens, queries (and the output) only
        for tokens ``query_from..L-1``, which attend as new tokens after a cache of that length.
        """
        n, length, _ = x.shape
        queries = length - query_from
        q = (
            self.q_proj(x[:, query_from:]).view(n, queries, self.n_heads, self.head_dim)
        ).transpose(1, 2)  # [N, H, L - query_from, d]
        k, v = (
            self.kv_proj(x).view(n, length, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        )  # [N, G, L, d] each
        for design in self.hooks["qk"]:  # per head, before any rotation (Qwen3's QK-norm)
            q, k = design.qk(self, q, k)
        if inputs.cos is not None:  # RoPE: rotate this layer's queries and keys, never the values
            q_cos, q_sin = inputs.cos[:, :, query_from:], inputs.sin[:, :, query_from:]
            q = rotate(q, q_cos, q_sin, inputs.layout)
            k_cos = inputs.cos if inputs.k_cos is None else inputs.k_cos
            k_sin = inputs.sin if inputs.k_sin is None else inputs.k_sin
            k = rotate(k, k_cos, k_sin, inputs.layout)
        if inputs.qk_norm is not None:  # after the rotation, before any query factor (Llama 4)
            q, k = weightless_rms_norm(q, inputs.qk_norm), weightless_rms_norm(k, inputs.qk_norm)
        if inputs.q_scale is not None:  # log-n, per query position
            q = (q.float() * inputs.q_scale[:, :, query_from:]).to(q.dtype)
        for design in self.hooks["query"]:  # SSMax: s_h ln n, n the real keys the query sees
            q = design.query(self, q, inputs, query_from)
        kernel: dict = {}
        for design in self.hooks["kernel"]:  # a sink logit, FoX's decay, stick-breaking
            kernel.update(design.kernel(self, x, inputs, cached, queries))
        keep = kernel.pop("keep", None)
        if cached is not None:
            k = torch.cat((cached[0], k), dim=2)  # [N, G, S, d]
            v = torch.cat((cached[1], v), dim=2)
        pairs = inputs.pairs
        far = _far_pairs(q, k, pairs, query_from, inputs.layout) if pairs is not None else None
        if query_from:
            if inputs.want_entropy:
                raise ValueError("attention entropy needs every query: query_from must be 0.")
            inputs = replace(
                inputs,
                q_pos=inputs.q_pos[:, query_from:],
                past_len=inputs.past_len + query_from,
                flex_cache={},  # another query range: another block mask
                pairs=pairs.queries_from(query_from) if pairs is not None else None,
            )
        read = v
        for design in self.hooks["heads"]:  # differential: each head reads its pair's values
            read = design.values(self, read)
        out, entropy = attend(q, k, read, inputs, self.layer, far, **kernel)
        for design in self.hooks["heads"]:
            out = design.heads(self, out)  # differential: [N, H/2, L - query_from, 2d]
        out = out.transpose(1, 2).reshape(n, queries, -1)  # [N, L - query_from, D]
        for design in self.hooks["output"]:  # gated attention: elementwise, per head and channel
            out = design.output(self, out, x, query_from)
        kept = (k, v) if keep is None else (k, v, keep)
        return self.o_proj(out), kept, entropy


def _far_pairs(
    q: torch.Tensor, k: torch.Tensor, pairs: PairInputs, query_from: int, layout: str
) -> tuple[torch.Tensor, ...] | None:
    """A training-free method's far pairs: (queries, keys, queries of regimes 2, 3, ...) rotated
    on from their own positions (the cache keeps keys at their own, so every key is moved again
    at each step); None where the method rotates nothing (a score-bias family)."""
    if pairs.q_cos is None:
        return None
    rotations = [(pairs.q_cos, pairs.q_sin), *((c, s) for _, c, s in pairs.more)]
    q_fars = [rotate(q, c[:, :, query_from:], s[:, :, query_from:], layout) for c, s in rotations]
    return q_fars[0], rotate(k, pairs.k_cos, pairs.k_sin, layout), *q_fars[1:]  # k: [N, G, S, d]
