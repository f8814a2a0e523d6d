"""``model.attention=differential`` (Ye et al., ICLR 2025): (softmax(Q1 K1) - lambda softmax(Q2 K2)) V
per pair of heads, a head-wise RMSNorm times (1 - lambda_init)."""

from __future__ import annotations

import math

from models.designs.registry import Design, register_design
from models.lazy import nn, torch


def differential_lambda_init(layer: int) -> float:
    """The Differential Transformer's lambda_init of block ``layer`` (0-based; the paper's l - 1):
    0.8 - 0.6 exp(-0.3 layer)."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


@register_design
class Differential(Design):
    name, switch, label = "differential", "attention", " +differential"
    hooks = ("heads",)
    order = 5
    reference = (
        "a float64 transcription of the official `MultiheadDiffAttn` forward "
        "(microsoft/unilm Diff-Transformer)"
    )
    test = "tests/conformance.py (attention design differential)"

    def check_fields(self, model_cfg):
        heads, kv_heads = model_cfg.n_heads, model_cfg.kv_heads
        if model_cfg.attention == self.name and (heads % 2 or kv_heads != heads):
            return (
                f"attention differential pairs heads and their values: n_heads {heads} must "
                f"be even and n_kv_heads ({kv_heads}) equal to it."
            )
        return None

    def attach(self, attn, model_cfg, position_cfg, layer):
        # lambda_q1, lambda_k1, lambda_q2, lambda_k2 (the paper's init)
        attn.lambda_init = differential_lambda_init(layer)
        attn.lambdas = nn.Parameter(torch.randn(4, attn.head_dim) * 0.1)
        attn.sub_norm = nn.RMSNorm(2 * attn.head_dim, eps=1e-5)  # head-wise, over a pair's values

    def values(self, attn, v):
        """v [N, H, S, d] -> [N, H, S, 2d]: each head reads its pair's values (concatenated)."""
        n, _, s, d = v.shape
        pairs = v.reshape(n, attn.n_heads // 2, 2, s, d).transpose(2, 3).reshape(n, -1, s, 2 * d)
        return pairs.repeat_interleave(2, dim=1)

    def heads(self, attn, out):
        """[N, H, L, 2d] (each head's softmax map times its pair's values) -> [N, H/2, L, 2d]:
        (map 1 - lambda map 2) V, RMS-normed per head, times (1 - lambda_init); lambda =
        exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init (Ye et al. 2025)."""
        lq1, lk1, lq2, lk2 = attn.lambdas.float()
        lam = torch.exp(lq1 @ lk1) - torch.exp(lq2 @ lk2) + attn.lambda_init
        first, second = out[:, 0::2], out[:, 1::2]
        mixed = first.float() - lam * second.float()
        return (attn.sub_norm(mixed) * (1 - attn.lambda_init)).to(out.dtype)
