"""The conformance page (issue #54 item 10): lenbench's position families, attention designs and
scaling methods against independent references, measured, in one table.

    python tests/conformance.py            # writes docs/conformance.md
    python tests/conformance.py --check    # exit 1 if a measured row leaves its tolerance

Each measured row compares lenbench with its oracle (a PyPI package at the version installed, or a
float64 transcription of the published formula or reference code, named) on the inputs it names,
and reports the largest absolute difference beside its negative control's (the same comparison
with one thing deliberately wrong, which must differ). A registered name without a measured row
here is listed with the test that checks it. ``tests/test_conformance_page.py`` regenerates the
rows and checks the page is current (the same rows, every difference within its tolerance).
Not collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.metadata
import math
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from models.designs.forget_gate import forget_decay  # noqa: E402
from models.designs.registry import designs  # noqa: E402
from models.positions import (  # noqa: E402
    PositionConfig,
    alibi_bias,
    alibi_slopes,
    families,
    rope_cos_sin,
    rotate,
)
from models.scaling import SCALING_METHODS, ntk_base, rope_parameters  # noqa: E402
from models.transformer import DecoderLM, ModelConfig  # noqa: E402

PAGE = ROOT / "docs" / "conformance.md"
#: the longest position compared where a row says "to 8K"
LONG = 8192
#: a measured row passes when its difference is at most its tolerance and its control's at least
#: CONTROL_MIN. TOLERANCE: float32 against float64 at short lengths; ANGLE_TOLERANCE: where float32
#: angles or running sums reach position 8K, whose rounding is about 8192 x 2^-23 = 1e-3 rad
TOLERANCE = 1e-4
ANGLE_TOLERANCE = 2e-3
CONTROL_MIN = 1e-3


@dataclasses.dataclass
class Row:
    kind: str  # position family, attention design, scaling method
    name: str
    oracle: str
    inputs: str
    diff: float | None = None  # None: checked by ``test`` only
    control: float | None = None
    control_what: str = ""
    test: str = ""
    tol: float = TOLERANCE


CHECKS: list[tuple[Row, Callable[[], tuple[float, float]]]] = []


def check(
    kind: str, name: str, oracle: str, inputs: str, control_what: str, tol: float = TOLERANCE
):
    def register(fn: Callable[[], tuple[float, float]]):
        row = Row(kind, name, oracle, inputs, control_what=control_what, tol=tol)
        CHECKS.append((row, fn))
        return fn

    return register


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max())


# --------------------------------------------------------------------------- scaling methods

HEAD, BASE, ORIGINAL = 64, 10000.0, 1024
SCALING_PARAMS = {
    "default": {},
    "linear": {"factor": 8.0},
    "dynamic": {"factor": 2.0},
    "yarn": {"factor": 8.0},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    "longrope": {
        "factor": 8.0,
        "short_factor": [1.0 + 0.01 * i for i in range(HEAD // 2)],
        "long_factor": [1.0 + 0.1 * i for i in range(HEAD // 2)],
    },
}


def _hf_rope(method: str, seq_len: int, params: dict) -> tuple[torch.Tensor, float]:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rope = {"rope_type": method, "rope_theta": BASE, **params}
    max_pos = ORIGINAL
    if method not in ("default", "dynamic"):
        rope["original_max_position_embeddings"] = ORIGINAL
        max_pos = int(ORIGINAL * params.get("factor", 1.0))
    cfg = LlamaConfig(
        hidden_size=2 * HEAD,
        num_attention_heads=2,
        head_dim=HEAD,
        max_position_embeddings=max_pos,
        rope_parameters=rope,
    )
    if method == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
    return ROPE_INIT_FUNCTIONS[method](cfg, "cpu", seq_len=seq_len)


def _table(inv_freq: torch.Tensor, factor: float) -> torch.Tensor:
    """cos and sin of every position to LONG, times the attention factor: [LONG, r]."""
    cos, sin = rope_cos_sin(torch.arange(LONG, dtype=torch.float64)[None], inv_freq.double())
    return torch.cat((cos, sin), dim=-1)[0] * factor


def _ours(method: str, seq_len: int, params: dict) -> tuple[torch.Tensor, float]:
    return rope_parameters(
        method, head_dim=HEAD, base=BASE, original_length=ORIGINAL, seq_len=seq_len, **params
    )


def _scaling_check(method: str) -> Callable[[], tuple[float, float]]:
    def run() -> tuple[float, float]:
        params = SCALING_PARAMS[method]
        ours = _table(*_ours(method, LONG, params))
        theirs = _table(*_hf_rope(method, LONG, params))
        wrong = dict(params, factor=params.get("factor", 1.0) * 1.5) if params else {}
        control = _table(*_hf_rope(method if params else "linear", LONG, wrong or {"factor": 1.5}))
        return _gap(ours, theirs), _gap(ours, control)

    return run


for _method in SCALING_PARAMS:
    check(
        "scaling method",
        _method,
        f"transformers {_version('transformers')} `ROPE_INIT_FUNCTIONS` / Llama's default",
        f"head dim {HEAD}, base 1e4, L {ORIGINAL}, cos and sin x attention factor at positions 0..{LONG - 1}",
        "factor x 1.5",
        ANGLE_TOLERANCE,
    )(_scaling_check(_method))


@check(
    "scaling method",
    "ntk",
    f"transformers {_version('transformers')} default RoPE at the NTK-aware base b alpha^(r/(r-2)) (YaRN repo)",
    f"head dim {HEAD}, base 1e4, alpha 8, cos and sin at positions 0..{LONG - 1}",
    "alpha 4",
    ANGLE_TOLERANCE,
)
def _ntk() -> tuple[float, float]:
    ours = _table(*_ours("ntk", LONG, {"alpha": 8.0}))
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    def default_at(base: float) -> torch.Tensor:
        cfg = LlamaConfig(
            hidden_size=2 * HEAD,
            num_attention_heads=2,
            head_dim=HEAD,
            rope_parameters={"rope_type": "default", "rope_theta": base},
        )
        return _table(*LlamaRotaryEmbedding.compute_default_rope_parameters(cfg))

    return _gap(ours, default_at(ntk_base(BASE, 8.0, HEAD))), _gap(
        ours, default_at(ntk_base(BASE, 4.0, HEAD))
    )


# --------------------------------------------------------------------------- position families


@check(
    "position family",
    "rope",
    "complex-number RoPE (Su et al.: q_m e^{i m theta}, torch.polar), float64",
    f"q [1, 2, {LONG}, 64] random, interleaved layout, positions 0..{LONG - 1}",
    "half layout against the complex pairs (0,1),(2,3),...",
    ANGLE_TOLERANCE,
)
def _rope() -> tuple[float, float]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, LONG, HEAD, generator=g, dtype=torch.float64)
    inv = rope_parameters(
        "default", head_dim=HEAD, base=BASE, original_length=ORIGINAL, seq_len=LONG
    )[0].double()
    pos = torch.arange(LONG, dtype=torch.float64)[None]
    cos, sin = rope_cos_sin(pos, inv)
    angle = torch.polar(torch.ones_like(pos[0, :, None] * inv), pos[0, :, None] * inv)
    z = torch.view_as_complex(x.reshape(1, 2, LONG, HEAD // 2, 2).contiguous()) * angle
    reference = torch.view_as_real(z).reshape(1, 2, LONG, HEAD)
    ours = rotate(x, cos[:, None], sin[:, None], "interleaved")
    control = rotate(x, cos[:, None], sin[:, None], "half")
    return _gap(ours, reference), _gap(control, reference)


@check(
    "position family",
    "alibi",
    f"x-transformers {_version('x-transformers')} `AlibiPositionalBias`",
    "8 heads, query and key positions 0..2047 (the causal triangle)",
    "the slopes of 6 heads for 8",
)
def _alibi() -> tuple[float, float]:
    from x_transformers.x_transformers import AlibiPositionalBias

    n = 2048
    theirs = AlibiPositionalBias(heads=8, total_heads=8)(n, n)  # [8, n, n]
    heads = torch.arange(8)[:, None, None]
    pos = torch.arange(n)
    ours = alibi_bias(alibi_slopes(8))(heads, pos[None, :, None], pos[None, None, :])
    wrong = alibi_bias(torch.cat((alibi_slopes(6), alibi_slopes(6)[-2:])))(
        heads, pos[None, :, None], pos[None, None, :]
    )
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return _gap(ours[:, causal], theirs[:, causal]), _gap(wrong[:, causal], theirs[:, causal])


@check(
    "position family",
    "t5",
    f"transformers {_version('transformers')} `T5Attention._relative_position_bucket` (causal)",
    f"32 buckets, max distance 128, distances 0..{LONG - 1}",
    "bidirectional buckets",
)
def _t5() -> tuple[float, float]:
    from transformers.models.t5.modeling_t5 import T5Attention

    from models.families.zoo import t5_bucket

    n = torch.arange(LONG)
    ours = t5_bucket(n.float(), 32, 128)
    theirs = T5Attention._relative_position_bucket(
        -n, bidirectional=False, num_buckets=32, max_distance=128
    )
    both = T5Attention._relative_position_bucket(
        -n, bidirectional=True, num_buckets=32, max_distance=128
    )
    return _gap(ours, theirs), _gap(ours, both)


def _layer(kind: str, n_layers: int = 1, n_heads: int = 2, seed: int = 0) -> DecoderLM:
    """A width-32 model of ``kind`` whose q and k projections are redrawn at std 0.5 (logits of
    order 1, so that a position signal shows)."""
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layers=n_layers, d_model=32, n_heads=n_heads)
    out = DecoderLM(cfg, PositionConfig(kind=kind), 16).eval()
    with torch.no_grad():
        for block in out.blocks:
            block.attn.q_proj.weight.normal_(0.0, 0.5)
            block.attn.kv_proj.weight.normal_(0.0, 0.5)
    return out


@check(
    "position family",
    "fox",
    f"x-transformers {_version('x-transformers')} `DataDependentAlibi` (the forget-gate bias F_i - F_j)",
    "width 32, 2 heads, 2048 random inputs, gate bias 0",
    "the bias of the reversed sequence",
    ANGLE_TOLERANCE,
)
def _fox() -> tuple[float, float]:
    from x_transformers.x_transformers import DataDependentAlibi

    model = _layer("fox")
    gate = model.blocks[0].attn.fgate
    with torch.no_grad():
        gate.bias.zero_()
        gate.weight.normal_(0.0, 0.5)
        x = torch.randn(1, 2048, 32, generator=torch.Generator().manual_seed(1))
        alibi = DataDependentAlibi(32, 2).double()
        alibi.to_forget_gates[0].weight.copy_(gate.weight)
        alibi.to_forget_gates[0].bias.copy_(gate.bias)
        theirs = alibi(x.double())
        inputs = model._attention_inputs(
            model._positions(x[..., 0].long(), None, None, None), False
        )
        running = forget_decay(model.blocks[0].attn, x, inputs, None).double()
        reverse = forget_decay(model.blocks[0].attn, x.flip(1), inputs, None).double()
    causal = torch.ones(2048, 2048, dtype=torch.bool).tril()
    ours = (running[..., :, None] - running[..., None, :])[..., causal]
    wrong = (reverse[..., :, None] - reverse[..., None, :])[..., causal]
    return _gap(ours, theirs[..., causal]), _gap(wrong, theirs[..., causal])


@check(
    "position family",
    "pope",
    f"x-transformers {_version('x-transformers')} `PolarEmbedding` + `apply_polar_pos_emb`",
    f"head dim 16, 2 heads, base 1e4, q and k random at positions 0..{LONG - 1}, phase bias in [-2 pi, 0]",
    "no phase bias on the keys",
    ANGLE_TOLERANCE,
)
def _pope() -> tuple[float, float]:
    from x_transformers.x_transformers import PolarEmbedding, apply_polar_pos_emb

    model = _layer("pope")
    with torch.no_grad():
        model.pope_bias.uniform_(-6.0, 0.0)
        polar = PolarEmbedding(16, 2)
        polar.learned_bias.copy_(model.pope_bias[:, None, :])
        freqs, bias = polar(torch.arange(LONG))
        g = torch.Generator().manual_seed(2)
        q, k = (torch.randn(1, 2, LONG, 16, generator=g) for _ in range(2))
        cos, sin, k_cos, k_sin = model.family.rotary(model, torch.arange(LONG)[None], LONG)
        ours_q = rotate(q, cos[:, None], sin[:, None], "polar")
        ours_k = rotate(k, k_cos, k_sin, "polar")
        theirs_q, theirs_k = apply_polar_pos_emb(q, freqs), apply_polar_pos_emb(k, freqs + bias)
        unbiased = apply_polar_pos_emb(k, freqs)
    return max(_gap(ours_q, theirs_q), _gap(ours_k, theirs_k)), _gap(ours_k, unbiased)


@check(
    "position family",
    "xpos",
    f"rotary-embedding-torch {_version('rotary-embedding-torch')} `RotaryEmbedding(use_xpos=True)`",
    "head dim 16, 2 heads, gamma 512, interleaved, q and k random at positions 0..1023 (q.k logits)",
    "gamma 1024",
)
def _xpos() -> tuple[float, float]:
    from rotary_embedding_torch import RotaryEmbedding

    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=2)
    model = DecoderLM(
        cfg, PositionConfig(kind="xpos", layout="interleaved", xpos_scale_base=512.0), 16
    ).eval()
    n = 1024
    g = torch.Generator().manual_seed(5)
    q, k = (torch.randn(1, 2, n, 16, generator=g) for _ in range(2))
    positions = torch.arange(n)[None]
    q_cos, q_sin, k_cos, k_sin = (t[:, None] for t in model.family.rotary(model, positions, n))
    layout = model.position_cfg.layout
    ours = rotate(q, q_cos, q_sin, layout) @ rotate(k, k_cos, k_sin, layout).transpose(-1, -2)

    def theirs(scale_base: float) -> torch.Tensor:
        rq, rk = RotaryEmbedding(
            dim=16, use_xpos=True, xpos_scale_base=scale_base
        ).rotate_queries_and_keys(q, k)
        return rq @ rk.transpose(-1, -2)

    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return _gap(ours[..., causal], theirs(512.0)[..., causal]), _gap(
        ours[..., causal], theirs(1024.0)[..., causal]
    )


@check(
    "position family",
    "cope",
    f"x-transformers {_version('x-transformers')} `CoPE` (its term on the same logits)",
    "head dim 16, 2 heads, npos_max 64, 512 random queries and keys (causal)",
    "another layer's position table",
)
def _cope() -> tuple[float, float]:
    from x_transformers.x_transformers import CoPE

    from models.families.cope import _cope as cope_term

    n, d = 512, 16
    scale = 1 / math.sqrt(d)
    g = torch.Generator().manual_seed(6)
    q, k = (torch.randn(1, 2, n, d, generator=g) * 2 for _ in range(2))
    logits = (q @ k.transpose(-1, -2) * scale).masked_fill(
        torch.ones(n, n).triu(1).bool(), -math.inf
    )
    emb = torch.randn(2, 64, d, generator=g)
    oracle = CoPE(dim=d, heads=2, max_pos=64)
    with torch.no_grad():
        oracle.pos_emb.copy_(emb[1])
        theirs = oracle(q * scale, logits)
        ours = cope_term(1, q, logits, scale, emb, 1.0, 64)
        other = cope_term(0, q, logits, scale, emb, 1.0, 64)
    visible = torch.isfinite(logits)
    return _gap(ours[visible], theirs[visible]), _gap(other[visible], theirs[visible])


@check(
    "position family",
    "sinusoidal",
    "Vaswani et al. 2017, Sec. 3.5: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(...), float64",
    f"width 128, positions 0..{LONG - 1} (the model's embedding times sqrt(width))",
    "sin and cos channels swapped",
    ANGLE_TOLERANCE,
)
def _sinusoidal() -> tuple[float, float]:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=1, d_model=128, n_heads=2)
    model = DecoderLM(cfg, PositionConfig(kind="sinusoidal"), 16)
    with torch.no_grad():
        # the model adds PE / sqrt(width), so that it starts at the token embeddings' scale
        ours = model.family.embed(model, torch.arange(LONG)[None], LONG)[0] * math.sqrt(128)
    i = torch.arange(64, dtype=torch.float64)
    angle = torch.arange(LONG, dtype=torch.float64)[:, None] / 10000 ** (2 * i / 128)
    reference = torch.stack((angle.sin(), angle.cos()), dim=-1).flatten(-2)
    swapped = torch.stack((angle.cos(), angle.sin()), dim=-1).flatten(-2)
    return _gap(ours, reference), _gap(ours, swapped)


def _rotation_table(kind: str, **position) -> torch.Tensor:
    """A family's cos and sin at positions 0..LONG-1 as the model rotates: [LONG, r]."""
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=1, d_model=128, n_heads=2)
    model = DecoderLM(cfg, PositionConfig(kind=kind, **position), 256)
    cos, sin = model.family.rotary(model, torch.arange(LONG)[None], LONG)
    return torch.cat((cos, sin), dim=-1)[0]


def _split_table(kept: int) -> torch.Tensor:
    """RoPE's table (head dim 64, base 1e4) with only the first ``kept`` pairs rotating, float64."""
    i = torch.arange(32, dtype=torch.float64)
    inv = 10000.0 ** (-2 * i / 64)
    inv[kept:] = 0.0
    angle = torch.arange(LONG, dtype=torch.float64)[:, None] * inv
    return torch.cat((angle.cos(), angle.sin()), dim=-1)


@check(
    "position family",
    "p_rope",
    "Barbero et al. 2025, p-RoPE: the lowest-frequency 1 - p of RoPE's pairs unrotated, float64",
    f"head dim 64, base 1e4, p 0.75, positions 0..{LONG - 1}",
    "every pair rotating (RoPE)",
    ANGLE_TOLERANCE,
)
def _p_rope() -> tuple[float, float]:
    ours = _rotation_table("p_rope", frequency_fraction=0.75)
    return _gap(ours, _split_table(24)), _gap(ours, _split_table(32))


@check(
    "position family",
    "hope",
    "Chen et al., ACL 2025, HoPE: the pairs whose period 2 pi base^(2i/d) exceeds L unrotated, float64",
    f"head dim 64, base 1e4, L 256, positions 0..{LONG - 1}",
    "every pair rotating (RoPE)",
    ANGLE_TOLERANCE,
)
def _hope() -> tuple[float, float]:
    ours = _rotation_table("hope")
    i = torch.arange(32, dtype=torch.float64)
    kept = int((2 * math.pi * 10000.0 ** (2 * i / 64) <= 256).sum())
    return _gap(ours, _split_table(kept)), _gap(ours, _split_table(32))


# --------------------------------------------------------------------------- attention designs


@check(
    "attention design",
    "stick_breaking",
    "the definition A_ij = beta_ij prod_{j<k<i} (1 - beta_ik) as explicit products, float64",
    "width 32, 2 heads, 48 random inputs (NoPE)",
    "the query's own key taking part",
)
def _stick_breaking() -> tuple[float, float]:
    from models.tiled_attention import stick_breaking_weights

    g = torch.Generator().manual_seed(3)
    n = 48
    z = torch.randn(1, 2, n, n, generator=g, dtype=torch.float64) * 2
    causal = torch.ones(n, n, dtype=torch.bool).tril(-1)  # keys before the query
    ours, _ = stick_breaking_weights(z.masked_fill(~causal, -math.inf))
    beta = torch.sigmoid(z)

    def reference(last_offset: int) -> torch.Tensor:
        out = torch.zeros_like(z)
        for i in range(n):
            last = i - 1 + last_offset
            for j in range(last + 1):
                out[..., i, j] = beta[..., i, j] * torch.prod(
                    1 - beta[..., i, j + 1 : last + 1], -1
                )
        return out

    return _gap(ours, reference(0)), _gap(ours, reference(1))


@check(
    "attention design",
    "differential",
    "a float64 transcription of the official `MultiheadDiffAttn` forward (microsoft/unilm Diff-Transformer)",
    "width 32, 4 heads (2 pairs), layer 2, 256 random inputs (NoPE)",
    "layer 3's lambda_init",
)
def _differential() -> tuple[float, float]:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=3, d_model=32, n_heads=4, attention="differential")
    model = DecoderLM(cfg, PositionConfig(kind="nope"), 16).eval()
    attn = model.blocks[2].attn
    n, d, half = 256, 8, 2
    with torch.no_grad():
        attn.q_proj.weight.normal_(0.0, 0.5)
        attn.kv_proj.weight.normal_(0.0, 0.5)
        attn.sub_norm.weight.uniform_(0.5, 1.5)
        x = torch.randn(1, n, 32, generator=torch.Generator().manual_seed(7))
        inputs = model._attention_inputs(
            model._positions(x[..., 0].long(), None, None, None), False
        )
        ours = attn(x, inputs, None)[0]

    def official(layer: int) -> torch.Tensor:
        x64 = x.double()
        q = (x64 @ attn.q_proj.weight.double().T).view(1, n, 2 * half, d).transpose(1, 2)
        kv = (x64 @ attn.kv_proj.weight.double().T).view(1, n, 2, 4 * d)
        k = kv[:, :, 0].view(1, n, 2 * half, d).transpose(1, 2)
        v = kv[:, :, 1].view(1, n, half, 2 * d).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) * d**-0.5
        scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), -math.inf)
        maps = scores.softmax(-1).view(1, half, 2, n, n)
        lq1, lk1, lq2, lk2 = attn.lambdas.detach().double()
        lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer)
        lam = torch.exp((lq1 * lk1).sum()) - torch.exp((lq2 * lk2).sum()) + lambda_init
        out = (maps[:, :, 0] - lam * maps[:, :, 1]) @ v
        out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + 1e-5)
        out = out * attn.sub_norm.weight.detach().double() * (1 - lambda_init)
        return out.transpose(1, 2).reshape(1, n, 32) @ attn.o_proj.weight.detach().double().T

    return _gap(ours, official(2)), _gap(ours, official(3))


@check(
    "attention design",
    "qk_norm",
    "transformers Qwen3Attention (its q_norm / k_norm, learned scales) carrying our weights",
    "width 32, 4 heads (2 key heads), 20 random inputs, RoPE half layout",
    "ours without the norm",
)
def _qk_norm() -> tuple[float, float]:
    test = _test_module("models/test_qk_norm.py")
    return _gap(*test._qwen3_pair(True)), _gap(*test._qwen3_pair(False))


@check(
    "attention design",
    "output_gate",
    "transformers Qwen3NextAttention (the gate rows of its q_proj, its QK-norm) carrying our weights",
    "width 32, 4 heads (2 key heads), 20 random inputs, RoPE half layout, with model.qk_norm",
    "ours without the gate",
)
def _output_gate() -> tuple[float, float]:
    test = _test_module("models/test_output_gate.py")
    return _gap(*test._qwen3_next_pair(True)), _gap(*test._qwen3_next_pair(False))


@check(
    "attention design",
    "ssmax",
    "Nakanishi 2025: softmax(s_h ln(n_i) q_i.k_j / sqrt(d)) V over the real causal keys, float64",
    "width 32, 2 heads (s_h 0.43, 0.9), 12 random inputs, one row left-padded by 3 (NoPE)",
    "n counted over the padding",
)
def _ssmax() -> tuple[float, float]:
    test = _test_module("models/test_ssmax.py")
    from fixtures.decoding import attention_output

    x = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(5))
    valid = torch.ones(2, 12, dtype=torch.bool)
    valid[1, :3] = False
    model = test._model()
    ours = attention_output(model, x, valid=valid).double()
    real = valid[:, :, None].expand_as(ours)
    expected = test._reference(model, x, valid, count_padding=False)
    miscounted = test._reference(model, x, valid, count_padding=True)
    return _gap(ours[real], expected[real]), _gap(ours[real], miscounted[real])


@check(
    "attention design",
    "llama4",
    "transformers Llama4TextAttention's NoPE layer (attn_temperature_tuning) carrying our weights",
    "width 32, 4 heads (2 key heads), 24 random inputs, attn_floor 4, attn_temperature 0.25 (NoPE)",
    "attn_temperature 0.5",
)
def _llama4() -> tuple[float, float]:
    modeling = importlib.import_module("transformers.models.llama4.modeling_llama4")
    from transformers import Llama4TextConfig

    from fixtures.decoding import attention_output, causal_mask, copy_attention_weights

    config = Llama4TextConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_hidden_layers=4, floor_scale=4, attn_scale=0.25, attn_temperature_tuning=True,
        use_qk_norm=False,
    )  # fmt: skip
    config._attn_implementation = "eager"
    theirs = modeling.Llama4TextAttention(config, layer_idx=3).eval()  # a NoPE layer
    x = torch.randn(1, 24, 32, generator=torch.Generator().manual_seed(7))
    gaps = []
    for temperature in (0.25, 0.5):
        torch.manual_seed(0)
        cfg = ModelConfig(n_layers=1, d_model=32, n_heads=4, n_kv_heads=2, attn_scale="llama4",
                          attn_floor=4, attn_temperature=temperature)  # fmt: skip
        model = DecoderLM(cfg, PositionConfig(kind="nope"), 32).eval()
        with torch.no_grad():  # logits of order 1, so that a query factor shows
            model.blocks[0].attn.q_proj.weight.normal_(0.0, 0.5)
            model.blocks[0].attn.kv_proj.weight.normal_(0.0, 0.5)
            copy_attention_weights(model.blocks[0].attn, theirs)
            expected = theirs(x, position_embeddings=None, attention_mask=causal_mask(24))[0]
        gaps.append(_gap(attention_output(model, x), expected))
    return gaps[0], gaps[1]


# --------------------------------------------------------------------------- token mixers


def _mixer_gaps(relative: str) -> tuple[float, float]:
    ours, theirs, control = _test_module(relative).conformance_outputs()
    return _gap(ours, theirs), _gap(control, theirs)


@check(
    "token mixer",
    "gated_deltanet",
    "transformers `Qwen3NextGatedDeltaNet` (torch path `torch_chunk_gated_delta_rule`), its fused "
    "q/k/v/z and b/a rows carrying our weights",
    "width 32, 4 heads of 8, 2 x 130 random inputs (two chunks of 64 and a tail)",
    "ours without the short conv",
)
def _gated_deltanet() -> tuple[float, float]:
    return _mixer_gaps("models/test_mixers_gated_deltanet.py")


@check(
    "token mixer",
    "kda",
    "transformers `KimiLinearDeltaAttention` (torch path `chunk_kimi_delta_attention`, chunk 64) "
    "carrying our weights",
    "width 32, 4 heads of 8, 2 x 130 random inputs (our chunk 8)",
    "the decay per head instead of per key channel",
)
def _kda() -> tuple[float, float]:
    return _mixer_gaps("models/test_mixers_kda.py")


@check(
    "token mixer",
    "mamba2",
    "transformers `Mamba2Mixer` torch path (`mamba2_chunk_scan`, chunk 16) carrying our weights",
    "width 32, expand 2, 8 heads of 8, state 16, one group, 2 x 130 random inputs (our chunk 16)",
    "ours without the D skip",
)
def _mamba2() -> tuple[float, float]:
    return _mixer_gaps("models/test_mixers_mamba2.py")


@check(
    "scaling method",
    "drope",
    "a NoPE model carrying the same weights (DroPE's claim: no position signal is left)",
    "2 layers, width 32, 4 heads, RoPE, 512 random tokens",
    "the raw RoPE model",
)
def _drope() -> tuple[float, float]:
    from models.scaling_config import ScalingConfig

    rope = _layer("rope", n_layers=2, n_heads=4)
    nope = DecoderLM(rope.model_cfg, PositionConfig(kind="nope"), 16).eval()
    nope.load_state_dict(rope.state_dict())
    tokens = torch.randint(0, 256, (1, 512), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        raw = rope(tokens).logits
        rope.set_scaling(ScalingConfig(name="drope", method="drope"))
        return _gap(rope(tokens).logits, nope(tokens).logits), _gap(raw, nope(tokens).logits)


def _test_module(relative: str):
    """A test module of tests/ loaded by path, for the transcriptions it holds (its helpers are
    the oracles those tests use; tests/ is put on the path for its fixtures, and its own folder
    for the set-up it shares with its neighbours, as pytest puts it: test_mixers_common)."""
    import importlib.util

    for folder in (ROOT / "tests", (ROOT / "tests" / relative).parent):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    name = "conformance_" + relative.replace("/", "_").removesuffix(".py")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


#: the training-free rows: 2 layers whose weights are scaled by 4, so logits are large
PAIR_TOLERANCE = 5e-3


def _pair_check(
    method: str, params: dict, relative, wrong_relative, visible=None, wrong_visible=None
):
    def run() -> tuple[float, float]:
        from models.scaling_config import ScalingConfig

        tf = _test_module("models/test_training_free.py")
        from fixtures.decoding import scaled_logits

        model = tf._model()
        ours = scaled_logits(model, tf.IDS, ScalingConfig(method, method, params))
        expected = tf.reference_logits(
            model, tf.IDS, relative(tf), (visible or (lambda tf: tf.ALWAYS))(tf)
        )
        other = tf.reference_logits(
            model,
            tf.IDS,
            wrong_relative(tf),
            (wrong_visible or visible or (lambda tf: tf.ALWAYS))(tf),
        )
        return _gap(ours, expected), _gap(ours, other)

    return run


_PAIR_INPUTS = "RoPE, 2 layers, width 32, 4 heads (2 key heads), weights x 4, 72 tokens, logits"
check(
    "scaling method",
    "self_extend",
    "LongLM's (Self-Extend) relative position rule, dense float64 attention with complex rotations",
    _PAIR_INPUTS + "; group 3, window 8",
    "group 4",
    PAIR_TOLERANCE,
)(
    _pair_check(
        "self_extend",
        {"group_size": 3, "window": 8},
        lambda tf: lambda i, j: tf.self_extend_relative(i, j, 3, 8),
        lambda tf: lambda i, j: tf.self_extend_relative(i, j, 4, 8),
    )
)
check(
    "scaling method",
    "rerope",
    "bojone/rerope's rule (i - j inside the window, the window beyond), dense float64 attention",
    _PAIR_INPUTS + "; window 10",
    "window 11",
    PAIR_TOLERANCE,
)(
    _pair_check(
        "rerope",
        {"window": 10},
        lambda tf: lambda i, j: tf.leaky_rerope_relative(i, j, 10, 0.0),
        lambda tf: lambda i, j: tf.leaky_rerope_relative(i, j, 11, 0.0),
    )
)
check(
    "scaling method",
    "leaky_rerope",
    "bojone/rerope's leaky rule (W + (i - j - W) / k beyond the window), dense float64 attention",
    _PAIR_INPUTS + "; window 10, slope 0.25",
    "window 11",
    PAIR_TOLERANCE,
)(
    _pair_check(
        "leaky_rerope",
        {"window": 10, "slope": 0.25},
        lambda tf: lambda i, j: tf.leaky_rerope_relative(i, j, 10, 0.25),
        lambda tf: lambda i, j: tf.leaky_rerope_relative(i, j, 11, 0.25),
    )
)


def _cache_rule(sinks: int, window: int):
    def relative(tf):
        def rel(i, j):
            cache = tf.streaming_cache(i, sinks, window)
            return cache.index(i) - cache.index(j) if j in cache else 0.0

        return rel

    def visible(tf):
        return lambda i, j: j in tf.streaming_cache(i, sinks, window)

    return relative, visible


_rel, _vis = _cache_rule(4, 16)
_wrong_rel, _wrong_vis = _cache_rule(5, 16)
check(
    "scaling method",
    "streaming",
    "StreamingLLM's StartRecentKVCache (sinks + recent window, positions in the cache), dense float64",
    _PAIR_INPUTS + "; 4 sinks, window 16",
    "5 sinks",
    PAIR_TOLERANCE,
)(_pair_check("streaming", {"sink_tokens": 4, "window": 16}, _rel, _wrong_rel, _vis, _wrong_vis))


def _dca_check() -> tuple[float, float]:
    from models.scaling_config import ScalingConfig

    dca = _test_module("models/test_dca.py")
    from fixtures.decoding import scaled_logits

    model = dca._model()
    ours = scaled_logits(
        model, dca.IDS, ScalingConfig("dca", "dca", {"chunk_size": 24, "local_window": 4})
    )
    expected = dca.reference_logits(model, dca.IDS, 24, 4)
    other = dca.reference_logits(model, dca.IDS, 26, 4)
    return _gap(ours, expected), _gap(ours, other)


check(
    "scaling method",
    "dca",
    "HKUNLP/ChunkLlama's prefill (chunked flash attention merged by log-sum-exp), transcribed, float64",
    "RoPE, 2 layers, width 32, 4 heads (2 key heads), weights x 4, 90 tokens at L 32, logits; "
    "chunk_size 24, local_window 4 (chunks of 20: intra, successive and inter regimes)",
    "chunk_size 26",
    PAIR_TOLERANCE,
)(_dca_check)


def _kerple_check(kind: str) -> Callable[[], tuple[float, float]]:
    def run() -> tuple[float, float]:
        zoo = _test_module("models/test_zoo.py")
        model = zoo.zoo_model(kind)
        size = 512
        with torch.no_grad():
            ours = zoo._our_bias(model, size)
            r1, r2 = model.kerple_r1.detach().clone(), model.kerple_r2.detach().clone()
            theirs = zoo._kerple_reference_bias(kind, r1, r2, size)
            wrong = zoo._kerple_reference_bias(kind, r2.clone(), r1.clone(), size)
        causal = torch.ones(size, size, dtype=torch.bool).tril()
        return _gap(ours[:, causal], theirs[:, causal]), _gap(ours[:, causal], wrong[:, causal])

    return run


for _kind in ("kerple_log", "kerple_power"):
    check(
        "position family",
        _kind,
        "a transcription of chijames/KERPLE's forward (parameters clamped as it does)",
        "4 heads, random parameters in [0.05, 1.55], query and key positions 0..511",
        "its two parameters swapped",
    )(_kerple_check(_kind))


@check(
    "position family",
    "sandwich",
    "Chi et al. 2023's closed form: (sum_k cos(n 10000^(-2k/d)) - d/2) / (8 h / H), float64",
    "width 32, 4 heads, distances 0..511",
    "the table of width 34",
)
def _sandwich() -> tuple[float, float]:
    zoo = _test_module("models/test_zoo.py")
    model = zoo.zoo_model("sandwich")
    size, d, heads = 512, 32, 4
    with torch.no_grad():
        ours = zoo._our_bias(model, size)  # [H, size, size]
    n = torch.arange(size, dtype=torch.float64)

    def closed_form(width: int) -> torch.Tensor:
        k = torch.arange(1, width // 2 + 1, dtype=torch.float64)
        total = torch.cos(n[:, None] * 10000 ** (-2 * k / width)).sum(-1) - width / 2  # [size]
        return total[None] / ((torch.arange(heads, dtype=torch.float64)[:, None] + 1) * 8 / heads)

    distance = ours[:, torch.arange(size), 0]  # query i, key 0: distance i
    return _gap(distance, closed_form(d)), _gap(distance, closed_form(d + 2))


@check(
    "attention design",
    "softmax",
    "transformers LlamaForCausalLM carrying our weights (RoPE half layout, SwiGLU, RMSNorm)",
    "2 layers, width 64, 2 heads, 256 random tokens, logits",
    "Llama with RoPE base 1e5",
)
def _softmax() -> tuple[float, float]:
    speed = _test_module("perf/train_speed.py")
    args = argparse.Namespace(layers=2, width=64, heads=2, seq=256, base=BASE)
    torch.manual_seed(0)
    ours = speed.build_ours(args).eval()
    llama = speed.build_llama(args, ours).eval()
    speed.copy_weights(ours, llama)
    other = speed.build_llama(argparse.Namespace(**{**vars(args), "base": 1e5}), ours).eval()
    speed.copy_weights(ours, other)
    tokens = torch.randint(0, 256, (1, 256), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        mine = ours(tokens).logits
        return _gap(mine, llama(tokens).logits), _gap(mine, other(tokens).logits)


@check(
    "position family",
    "learned",
    "GPT-2's absolute table: row p of the table added at position p",
    "width 32, a 512-row table, positions 0..511",
    "rows shifted by one",
)
def _learned() -> tuple[float, float]:
    torch.manual_seed(0)
    model = DecoderLM(
        ModelConfig(n_layers=1, d_model=32, n_heads=2), PositionConfig(kind="learned"), 512
    )
    table = model.pos_table.detach()  # [512, 32]
    with torch.no_grad():
        ours = model.family.embed(model, torch.arange(512)[None], 512)[0]
    return _gap(ours, table), _gap(ours, table.roll(1, dims=0))


@check(
    "position family",
    "nope",
    "the definition: no position signal, so every position id shifted by 1000 gives the same logits",
    "2 layers, width 32, 4 heads, 128 random tokens",
    "sinusoidal (absolute) with the same weights, shifted",
)
def _nope() -> tuple[float, float]:
    tokens = torch.randint(0, 256, (1, 128), generator=torch.Generator().manual_seed(9))
    pos = torch.arange(128)[None]
    gaps = []
    for kind in ("nope", "sinusoidal"):
        model = _layer(kind, n_layers=2, n_heads=4)
        with torch.no_grad():
            a = model(tokens, position_ids=pos).logits
            b = model(tokens, position_ids=pos + 1000).logits
        gaps.append(_gap(a, b))
    return gaps[0], gaps[1]


@check(
    "position family",
    "fire",
    "Li et al. 2024's FIRE: f(psi(i - j) / psi(max(L_thr, i))), psi(x) = log(c x + 1), an MLP, float64",
    "4 heads, MLP width 32, random parameters, L 16, query and key positions 0..255",
    "c + 0.2",
)
def _fire() -> tuple[float, float]:
    zoo = _test_module("models/test_zoo.py")
    model = zoo.zoo_model("fire", train_length=16)
    size = 256
    with torch.no_grad():
        ours = zoo._our_bias(model, size)  # [H, size, size]
    w1, b1 = model.fire_w1.detach().double(), model.fire_b1.detach().double()
    w2, b2 = model.fire_w2.detach().double(), model.fire_b2.detach().double()
    threshold = abs(model.fire_l_multiplier.item()) * 16
    i = torch.arange(size, dtype=torch.float64)[:, None]
    j = torch.arange(size, dtype=torch.float64)[None, :]

    def reference(c: float) -> torch.Tensor:
        x = torch.log(c * (i - j).clamp(min=0) + 1) / torch.log(
            c * torch.clamp(i, min=threshold) + 1
        )
        hidden = torch.relu(x[..., None] * w1 + b1)  # [size, size, width]
        return (hidden @ w2.T + b2).permute(2, 0, 1)  # [H, size, size]

    c = model.fire_c.item()
    causal = torch.ones(size, size, dtype=torch.bool).tril()
    return _gap(ours[:, causal], reference(c)[:, causal]), _gap(
        ours[:, causal], reference(c + 0.2)[:, causal]
    )


@check(
    "position family",
    "irope",
    "transformers Llama4TextAttention with our weights (a chunked RoPE layer with QK-norm, a NoPE layer with the temperature)",
    "width 32, 4 heads (2 key heads), 24 random inputs, layers 0 and 3",
    "our RoPE layer without QK-norm",
)
def _irope() -> tuple[float, float]:
    hybrid = _test_module("models/test_hybrid.py")
    gaps = []
    for layer in (0, 3):
        ours, theirs, _ = hybrid._llama4_attention_pair(True, layer)
        gaps.append(_gap(ours, theirs))
    plain = hybrid._llama4_attention_pair(False, 0)[0]
    normed = hybrid._llama4_attention_pair(True, 0)[1]
    return max(gaps), _gap(plain, normed)


@check(
    "position family",
    "rnope_swa",
    "Yang et al. 2025's RNoPE-SWA layer by layer: RoPE (complex rotation) within a sliding window, then global NoPE, dense float64",
    "4 layers (swa, swa, swa, nope), width 32, 2 heads, window 16, 96 random inputs",
    "a window of 8",
)
def _rnope_swa() -> tuple[float, float]:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=4, d_model=32, n_heads=2)
    model = DecoderLM(cfg, PositionConfig(kind="rnope_swa", window=16), 64).eval()
    n, d = 96, 16
    x = torch.randn(1, n, 32, generator=torch.Generator().manual_seed(10))
    inputs = model._attention_inputs(model._positions(x[..., 0].long(), None, None, None), False)
    per_layer = model.family.layer_inputs(model, inputs)
    inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # [d/2]
    pos = torch.arange(n, dtype=torch.float64)

    def reference(attn, rotate_keys: bool, window: int | None) -> torch.Tensor:
        x64 = x.double()
        q = (x64 @ attn.q_proj.weight.detach().double().T).view(1, n, 2, d).transpose(1, 2)
        kv = (x64 @ attn.kv_proj.weight.detach().double().T).view(1, n, 2, 2, d)
        k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
        if rotate_keys:  # half layout: pairs (c, c + d/2), as complex numbers
            phase = torch.polar(torch.ones(n, d // 2, dtype=torch.float64), pos[:, None] * inv)
            qc = torch.complex(q[..., : d // 2], q[..., d // 2 :]) * phase
            kc = torch.complex(k[..., : d // 2], k[..., d // 2 :]) * phase
            logits = (qc @ kc.conj().transpose(-1, -2)).real
        else:
            logits = q @ k.transpose(-1, -2)
        allowed = torch.ones(n, n, dtype=torch.bool).tril()
        if window is not None:
            allowed &= (pos[:, None] - pos[None, :]) < window
        probs = (logits / math.sqrt(d)).masked_fill(~allowed, -math.inf).softmax(-1)
        out = (probs @ v).transpose(1, 2).reshape(1, n, 32)
        return out @ attn.o_proj.weight.detach().double().T

    gaps, controls = [], []
    with torch.no_grad():
        for layer, kind in enumerate(("swa", "swa", "swa", "nope")):
            attn = model.blocks[layer].attn
            ours = attn(x, per_layer[layer], None)[0]
            rope = kind == "swa"
            gaps.append(_gap(ours, reference(attn, rope, 16 if rope else None)))
            if rope:
                controls.append(_gap(ours, reference(attn, rope, 8)))
    return max(gaps), min(controls)


# --------------------------------------------------------------------------- the rest

#: registered names checked by a test rather than measured on this page: name -> the test (none
#: now; a new family or method without a check here fails tests/test_conformance_page.py)
TESTED_ELSEWHERE: dict[tuple[str, str], str] = {}


def _design_rows() -> dict[tuple[str, str], str]:
    """Each design a switch selects (models.designs), by its row key (a mixer: "token mixer";
    named as its +design= preset), with the test its declaration names; and attention itself,
    the softmax."""
    rows = {("attention design", "softmax"): ""}
    for design in designs().values():
        if design.switch:  # FoX's gate is its family's (the position family fox's row)
            kind = "token mixer" if "mixer" in design.hooks else "attention design"
            rows[(kind, design.yaml)] = design.test or "none"
    return rows


def registered() -> set[tuple[str, str]]:
    """Every registered family, design and scaling method."""
    names = {("position family", k) for k in families()}
    names |= set(_design_rows())
    return names | {("scaling method", m) for m in SCALING_METHODS}


def measure() -> list[Row]:
    rows = []
    for row, fn in CHECKS:
        row.diff, row.control = fn()
        rows.append(row)
    measured = {(r.kind, r.name) for r in rows}
    tests = {**_design_rows(), **TESTED_ELSEWHERE}
    for key in sorted(registered() - measured):
        rows.append(Row(key[0], key[1], "", "", test=tests.get(key) or "none"))
    return rows


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.1e}"


def markdown(rows: list[Row]) -> str:
    lines = [
        "# Conformance: lenbench against independent references",
        "",
        "Generated by `python tests/conformance.py` (do not edit; `tests/test_conformance_page.py`",
        "regenerates it and fails when it is stale). Each measured row: the largest absolute",
        "difference between lenbench and its oracle on the inputs named, and its negative control's",
        "(one thing deliberately wrong); a row passes at difference <= its tolerance (float32 against",
        f"float64: {TOLERANCE:g}; {ANGLE_TOLERANCE:g} where float32 angles or running sums reach position",
        f"8K, whose rounding alone is about 8192 x 2^-23 = 1e-3; {PAIR_TOLERANCE:g} for the training-free",
        "methods' logits, two layers whose weights are scaled by 4) and control >= "
        f"{CONTROL_MIN:g}.",
        f"Machine of the committed page: {platform.processor() or platform.machine()}, torch {torch.__version__}.",
        "",
        "| kind | name | oracle | inputs | max abs diff | tolerance | control | control diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted((r for r in rows if r.test == ""), key=lambda r: (r.kind, r.name)):
        lines.append(
            f"| {r.kind} | {r.name} | {r.oracle} | {r.inputs} | {_number(r.diff)} | {r.tol:g} | "
            f"{r.control_what} | {_number(r.control)} |"
        )
    rest = sorted((r for r in rows if r.test), key=lambda r: (r.kind, r.name))
    if not rest:
        return "\n".join([*lines, "", "Every registered name is measured above."]) + "\n"
    lines += ["", "Checked by a test, not measured on this page yet:", ""]
    lines += ["| kind | name | test |", "|---|---|---|"]
    lines += [f"| {r.kind} | {r.name} | {r.test} |" for r in rest]
    return "\n".join(lines) + "\n"


def failures(rows: list[Row]) -> list[str]:
    return [
        f"{r.kind} {r.name}: diff {r.diff:.1e}, control {r.control:.1e}"
        for r in rows
        if r.test == "" and not (r.diff <= r.tol and r.control >= CONTROL_MIN)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="measure, write nothing")
    args = parser.parse_args(argv)
    rows = measure()
    bad = failures(rows)
    for line in bad:
        print("out of tolerance:", line)
    if not args.check:
        PAGE.write_text(markdown(rows))
        print(f"wrote {PAGE.relative_to(ROOT)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
