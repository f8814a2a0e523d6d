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
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from models.attention_inputs import AttentionInputs, PairInputs, fused_plain
from models.flex import attend_flex, use_flex
from models.model_config import SSMAX_INIT, differential_lambda_init
from models.positions import rotate
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
    def __init__(
        self,
        d_model: int,
        n_heads: int,
        kv_heads: int,
        head_dim: int,
        layer: int = 0,
        learned_sink: bool = False,
        qk_norm: bool = False,
        output_gate: bool = False,
        ssmax: bool = False,
        forget_gate: float | None = None,
        attention: str = "softmax",
    ):
        super().__init__()
        self.n_heads, self.kv_heads, self.head_dim = n_heads, kv_heads, head_dim
        self.layer = layer  # the block index: a contextual term may have parameters per layer
        # gpt-oss's attention sink: one learned logit per head in every softmax's denominator
        self.sink = nn.Parameter(torch.zeros(n_heads)) if learned_sink else None
        # model.qk_norm (Qwen3): RMSNorm with a learned scale over each head's d channels
        self.q_norm = nn.RMSNorm(head_dim) if qk_norm else None
        self.k_norm = nn.RMSNorm(head_dim) if qk_norm else None
        # model.output_gate: a sigmoid gate per head and channel from the layer's input
        self.gate_proj = nn.Linear(d_model, n_heads * head_dim, bias=False) if output_gate else None
        # model.attn_scale=ssmax: s_h per head, each query times s_h ln(keys it sees)
        self.ssmax = nn.Parameter(torch.full((n_heads,), SSMAX_INIT)) if ssmax else None
        # FoX (a family with a forget gate): log f_t = log sigmoid(w_h . x_t + b_h) per head, the
        # bias starting at ``forget_gate`` (the model's init leaves biases alone)
        self.fgate = None
        if forget_gate is not None:
            self.fgate = nn.Linear(d_model, n_heads, bias=True)
            nn.init.constant_(self.fgate.bias, forget_gate)
        # model.attention: stick_breaking replaces the softmax; differential subtracts two maps
        self.stick_breaking = attention == "stick_breaking"
        self.lambdas = self.sub_norm = None
        if attention == "differential":  # lambda_q1, lambda_k1, lambda_q2, lambda_k2 (paper init)
            self.lambda_init = differential_lambda_init(layer)
            self.lambdas = nn.Parameter(torch.randn(4, head_dim) * 0.1)
            self.sub_norm = nn.RMSNorm(2 * head_dim, eps=1e-5)  # head-wise, over a pair's values
        self.q_proj = nn.Linear(d_model, n_heads * head_dim, bias=False)
        self.kv_proj = nn.Linear(d_model, 2 * kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forget_decay(
        self, x: torch.Tensor, inputs: AttentionInputs, past: torch.Tensor | None
    ) -> torch.Tensor:
        """FoX's F of every key [N, H, S] float32: the running sum of log f_t over the tokens,
        continuing the cached keys' ``past`` [N, H, S - L]; a padding token forgets nothing
        (log f = 0), so it moves no pair of real tokens apart."""
        log_f = F.logsigmoid(self.fgate(x).float()).transpose(1, 2)  # [N, H, L]
        if inputs.k_valid is not None:
            log_f = log_f * inputs.k_valid[:, None, -x.shape[1] :]
        running = log_f.cumsum(dim=-1)
        if past is None:
            return running
        return torch.cat((past, running + past[:, :, -1:]), dim=-1)

    def differential(self, maps_v: torch.Tensor) -> torch.Tensor:
        """[N, H, L, 2d] (each head's softmax map times its pair's values) -> [N, H/2, L, 2d]:
        (map 1 - lambda map 2) V, RMS-normed per head, times (1 - lambda_init); lambda =
        exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init (Ye et al. 2025)."""
        lq1, lk1, lq2, lk2 = self.lambdas.float()
        lam = torch.exp(lq1 @ lk1) - torch.exp(lq2 @ lk2) + self.lambda_init
        first, second = maps_v[:, 0::2], maps_v[:, 1::2]
        out = first.float() - lam * second.float()
        return (self.sub_norm(out) * (1 - self.lambda_init)).to(maps_v.dtype)

    def forward(
        self,
        x: torch.Tensor,
        inputs: AttentionInputs,
        cached: tuple[torch.Tensor, ...] | None,
        query_from: int = 0,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor | None]:
        """x [N, L, D] -> (output [N, L - query_from, D], (k, v) [N, G, S, d], entropy); a FoX
        layer's cache entry also holds its keys' F [N, H, S] (:meth:`forget_decay`).

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
        if self.q_norm is not None:  # model.qk_norm: per head, before any rotation (Qwen3)
            q, k = self.q_norm(q), self.k_norm(k)
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
        if self.ssmax is not None:  # SSMax: s_h ln n, n the real keys the query sees
            factor = self.ssmax[None, :, None, None] * inputs.log_keys[:, :, query_from:]
            q = (q.float() * factor).to(q.dtype)
        decay = None
        if self.fgate is not None:
            past = cached[2] if cached is not None else None
            decay_k = self.forget_decay(x, inputs, past)  # [N, H, S]
            decay = (decay_k[:, :, decay_k.shape[2] - queries :], decay_k)
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
        if self.lambdas is not None:  # each pair of heads reads its pair's values, [N, H, S, 2d]
            v_pairs = v.reshape(n, self.n_heads // 2, 2, -1, self.head_dim)
            v_pairs = v_pairs.transpose(2, 3).reshape(n, self.n_heads // 2, -1, 2 * self.head_dim)
            out, entropy = attend(
                q, k, v_pairs.repeat_interleave(2, dim=1), inputs, self.layer, far, self.sink, decay
            )
            out = self.differential(out)  # [N, H/2, L - query_from, 2d]
        else:
            out, entropy = attend(
                q, k, v, inputs, self.layer, far, self.sink, decay, self.stick_breaking
            )
        out = out.transpose(1, 2).reshape(n, queries, -1)  # [N, L - query_from, D]
        if self.gate_proj is not None:  # gated attention: elementwise, per head and channel
            out = out * torch.sigmoid(self.gate_proj(x[:, query_from:]))
        kept = (k, v) if decay is None else (k, v, decay[1])
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
