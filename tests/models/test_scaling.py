"""Tests for models/scaling.py: RoPE scaling methods against an independent implementation.

The oracle is Hugging Face transformers' own rope init functions, called directly
(``ROPE_INIT_FUNCTIONS[name](config, "cpu", seq_len=...)``; ``default`` through
``LlamaRotaryEmbedding.compute_default_rope_parameters``).  Written against and run with
transformers 5.24.0 (torch 2.13.0+cpu).  Oracle tests are skipped when transformers is
missing or older than 5.0 (4.x configures RoPE through ``rope_scaling`` instead).

Things learned from the 5.24 oracle:

* ``LlamaRotaryEmbedding.compute_default_rope_parameters`` ignores
  ``partial_rotary_factor`` (it always returns head_dim/2 frequencies), so partial
  ``default`` is checked against ``GPTNeoXRotaryEmbedding.compute_default_rope_parameters``,
  which honours it (and equals Llama's for full rotation).
* ``dynamic`` reads L from ``max_position_embeddings`` (so it is set to the training
  length); ``yarn``/``llama3``/``longrope`` read ``original_max_position_embeddings``.
* ``longrope`` without ``factor`` derives it as max_position_embeddings / original; ours
  takes that ratio as ``factor`` and the two agree.
* YaRN's ``mscale`` / ``mscale_all_dim`` only count when both are truthy, and
  ``beta_fast=0`` means 32; we do the same.  Which values transformers accepts (its
  validation silent, its computation finite) is asked of transformers itself, case by
  case, in ``test_accepts_exactly_what_transformers_accepts``.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch

from models.scaling import (
    SCALING_METHODS,
    RopeGeometry,
    applicable_methods,
    default_inv_freq,
    logn_factor,
    register_scaling,
    rope_parameters,
)

RTOL = 1e-6
HEAD_DIMS = (32, 64, 128)
BASES = (500.0, 1e4, 1e6)
FACTORS = (2.0, 4.0, 8.0, 16.0)
# 8192 with base 500 puts YaRN's `high` above r/2 - 1, where the r - 1 clamp matters.
TRAIN_LENGTHS = (64, 256, 2048, 8192)
FRACTIONS = (1.0, 0.75, 0.25)


# ----------------------------------------------------------------------------- helpers


def assert_rope_matches(
    ours: tuple[torch.Tensor, float],
    theirs: tuple[torch.Tensor, float],
    label: str = "",
    rtol: float = RTOL,
) -> None:
    """Same shape, float32, inv_freq within rtol (no atol) and attention factor within RTOL."""
    inv, attn = ours
    ref_inv, ref_attn = theirs
    assert inv.dtype == torch.float32, f"{label}: dtype {inv.dtype}"
    assert inv.shape == ref_inv.shape, (
        f"{label}: shape {tuple(inv.shape)} vs {tuple(ref_inv.shape)}"
    )
    rel = ((inv.double() - ref_inv.double()).abs() / ref_inv.double().abs()).max().item()
    assert rel <= rtol, f"{label}: inv_freq max relative error {rel:.3g} > {rtol}"
    assert math.isclose(attn, float(ref_attn), rel_tol=RTOL, abs_tol=0.0), (
        f"{label}: attention factor {attn!r} vs {float(ref_attn)!r}"
    )


def longrope_lists(rotary_dim: int, factor: float) -> tuple[list[float], list[float]]:
    """Deterministic short/long factor lists of length r/2 (long grows to ~factor)."""
    half = rotary_dim // 2
    short = [1.0 + 0.05 * i / half for i in range(half)]
    long = [1.0 + (factor - 1.0) * (i / (half - 1)) ** 1.5 for i in range(half)]
    return short, long


@pytest.fixture(scope="module")
def hf() -> Any:
    transformers = pytest.importorskip("transformers")
    major = int(transformers.__version__.split(".")[0])
    if major < 5:
        pytest.skip(
            f"oracle written for transformers 5.x rope_parameters, found {transformers.__version__}"
        )
    transformers.logging.set_verbosity_error()  # config validation warnings are expected noise here
    return transformers


@functools.cache
def _llama_config(hf: Any, head_dim: int, max_position_embeddings: int) -> Any:
    """One LlamaConfig per geometry (building one costs ~2 ms; rope_parameters is swapped per call)."""
    return hf.LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4},
    )


def hf_rope(
    hf: Any,
    method: str,
    *,
    head_dim: int,
    base: float,
    original_length: int,
    seq_len: int,
    rotary_fraction: float = 1.0,
    max_position_embeddings: int | None = None,
    **params: Any,
) -> tuple[torch.Tensor, float]:
    """transformers' inv_freq / attention factor for the same setting."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rope: dict[str, Any] = {"rope_type": method, "rope_theta": base, **params}
    if rotary_fraction != 1.0:
        rope["partial_rotary_factor"] = rotary_fraction
    if method == "dynamic":
        max_pos = original_length  # transformers' dynamic uses max_position_embeddings as L
    else:
        if method != "default":
            rope["original_max_position_embeddings"] = original_length
        factor = params.get("factor", 1.0)
        max_pos = max_position_embeddings or int(original_length * factor)
    cfg = _llama_config(hf, head_dim, max_pos)
    cfg.rope_parameters = rope  # the init functions standardize it themselves
    if method == "default":
        if rotary_fraction != 1.0:  # Llama's default ignores partial_rotary_factor
            return GPTNeoXRotaryEmbedding.compute_default_rope_parameters(cfg)
        return LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
    return ROPE_INIT_FUNCTIONS[method](cfg, "cpu", seq_len=seq_len)


def grid(method: str, head_dim: int) -> Iterator[dict[str, Any]]:
    """Settings for one method and head dim.

    Full product of bases x factors x training lengths (x seq_lens below/at/just
    above/far above L for the length-dependent methods); the rotary fraction cycles
    through FRACTIONS so partial rotation is covered without tripling the runtime.
    """
    seq_dependent = method in ("dynamic", "longrope")
    factors = (1.0,) if method == "default" else FACTORS
    for k, (base, factor, length) in enumerate(itertools.product(BASES, factors, TRAIN_LENGTHS)):
        seqs = (length // 2, length, length + 1, 4 * length) if seq_dependent else (length,)
        for seq_len in seqs:
            yield {
                "head_dim": head_dim,
                "base": base,
                "original_length": length,
                "seq_len": seq_len,
                "rotary_fraction": FRACTIONS[k % len(FRACTIONS)],
                "factor": factor,
            }


def method_params(method: str, setting: dict[str, Any]) -> list[dict[str, Any]]:
    """Parameter variants of ``method`` for one grid point (``factor`` is the grid's)."""
    s = setting["factor"]
    rotary_dim = int(setting["head_dim"] * setting["rotary_fraction"])
    if method == "default":
        return [{}]
    if method in ("linear", "dynamic"):
        return [{"factor": s}]
    if method == "yarn":
        return [
            {"factor": s},
            {"factor": s, "truncate": False},
            {"factor": s, "beta_fast": 16.0, "beta_slow": 2.0},
            {"factor": s, "mscale": 1.0, "mscale_all_dim": 0.5},
            {"factor": s, "mscale": 0.707, "mscale_all_dim": 0},  # DeepSeek style: 0 = not set
            {"factor": s, "mscale": 0.707},  # one alone: transformers ignores it
            {"factor": s, "attention_factor": 1.25},
        ]
    if method == "llama3":
        return [
            {"factor": s, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
            {"factor": s, "low_freq_factor": 2.0, "high_freq_factor": 8.0},
        ]
    if method == "longrope":
        short, long = longrope_lists(rotary_dim, s)
        return [
            {"short_factor": short, "long_factor": long, "factor": s},
            {"short_factor": short, "long_factor": long, "attention_factor": 1.1},
        ]
    raise AssertionError(method)


def oracle_rtol(method: str, params: dict[str, Any]) -> float:
    """transformers computes YaRN's ramp in float32; with truncate=False the blend
    theta * (1 - ramp * (1 - 1/s)) cancels and its error reaches ~1.5e-6 (ours is the
    exact value to float32 rounding, see test_yarn_untruncated_is_exact)."""
    if method == "yarn" and params.get("truncate") is False:
        return 4e-6
    return RTOL


# ----------------------------------------------------------------------------- oracle: transformers


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("method", ["default", "linear", "dynamic", "yarn", "llama3", "longrope"])
def test_matches_transformers(hf: Any, method: str, head_dim: int) -> None:
    checked = 0
    for setting in grid(method, head_dim):
        for params in method_params(method, setting):
            kwargs = {**{k: v for k, v in setting.items() if k != "factor"}, **params}
            ours = rope_parameters(method, **kwargs)
            theirs = hf_rope(hf, method, **kwargs)
            assert_rope_matches(ours, theirs, f"{method} {kwargs}", oracle_rtol(method, params))
            checked += 1
    assert checked >= 12


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_longrope_factor_derived_like_transformers(hf: Any, head_dim: int) -> None:
    """Without ``factor`` transformers uses max_position_embeddings / original; ours takes
    that ratio as ``factor`` and must give the same attention factor (short and long)."""
    for base, length, s in itertools.product(BASES, TRAIN_LENGTHS, FACTORS):
        short, long = longrope_lists(head_dim, s)
        common = {"head_dim": head_dim, "base": base, "original_length": length}
        lists = {"short_factor": short, "long_factor": long}
        seq_len = 4 * length if s > 4 else length
        ours = rope_parameters("longrope", **common, seq_len=seq_len, **lists, factor=s)
        theirs = hf_rope(
            hf,
            "longrope",
            **common,
            seq_len=seq_len,
            **lists,
            max_position_embeddings=int(length * s),
        )
        assert_rope_matches(ours, theirs, f"longrope derived factor {common} s={s}")


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_ntk_equals_dynamic_at_matching_ratio(hf: Any, head_dim: int) -> None:
    """Static NTK with alpha = s*seq/L - (s-1) is transformers' dynamic NTK at seq."""
    for base, length, s in itertools.product(BASES, TRAIN_LENGTHS, FACTORS):
        seq_len = int(s) * length  # so the ratio is s^2 - s + 1, a different alpha per s
        alpha = s * seq_len / length - (s - 1)
        common = {"head_dim": head_dim, "base": base, "original_length": length}
        ours = rope_parameters("ntk", **common, seq_len=length, alpha=alpha)
        theirs = hf_rope(hf, "dynamic", **common, seq_len=seq_len, factor=s)
        assert_rope_matches(ours, theirs, f"ntk alpha={alpha} {common}")


def test_yarn_untruncated_is_exact(hf: Any) -> None:
    """Where we and transformers differ by > 1e-6 (yarn, truncate=False, s=16), ours is the
    exact value rounded to float32 and transformers' float32 ramp is the one that is off."""
    r, b, length, s = 64, 500.0, 256, 16.0
    common = {"head_dim": r, "base": b, "original_length": length, "seq_len": length}
    ours, _ = rope_parameters("yarn", **common, factor=s, truncate=False)
    theirs, _ = hf_rope(hf, "yarn", **common, factor=s, truncate=False)

    def corr(n: float) -> float:
        return r * math.log(length / (2 * math.pi * n)) / (2 * math.log(b))

    low, high = max(corr(32), 0.0), min(corr(1), r - 1.0)
    exact = []
    for i in range(r // 2):
        theta, ramp = b ** (-2 * i / r), min(max((i - low) / (high - low), 0.0), 1.0)
        exact.append(theta / s * ramp + theta * (1 - ramp))
    exact_t = torch.tensor(exact, dtype=torch.float64)

    def rel(x: torch.Tensor) -> float:
        return ((x.double() - exact_t).abs() / exact_t).max().item()

    assert rel(ours) < 1e-7
    assert 1e-6 < rel(theirs) < 4e-6  # documents the oracle's own rounding (see oracle_rtol)


def test_default_partial_oracles_agree_on_full_rotation(hf: Any) -> None:
    """The NeoX default used for partial rotation equals Llama's for full rotation."""
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = hf.LlamaConfig(
        hidden_size=128,
        num_attention_heads=2,
        head_dim=64,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4},
    )
    a = GPTNeoXRotaryEmbedding.compute_default_rope_parameters(cfg)
    b = LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
    assert torch.equal(a[0], b[0]) and a[1] == b[1]


def rope_tables(
    inv_freq: torch.Tensor, attention_factor: float, positions: torch.Tensor, scale_sin: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin as transformers' rotary embedding emits them ("half" layout, factor on both)."""
    freqs = positions[:, None].float() * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * attention_factor, emb.sin() * (attention_factor if scale_sin else 1.0)


def hf_tables(
    hf: Any, rope: dict[str, Any], max_pos: int, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin from LlamaRotaryEmbedding.forward (incl. its dynamic/longrope seq_len logic)."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = hf.LlamaConfig(
        hidden_size=128,
        num_attention_heads=2,
        head_dim=64,
        max_position_embeddings=max_pos,
        rope_parameters=rope,
    )
    emb = LlamaRotaryEmbedding(cfg)
    x = torch.zeros(1, positions.numel(), 64)
    cos, sin = emb(x, positions[None, :])
    return cos[0], sin[0]


def assert_tables_close(
    ours: tuple[torch.Tensor, torch.Tensor], theirs: tuple[torch.Tensor, torch.Tensor]
) -> None:
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-4)  # float32 angles up to ~1e3 rad


@pytest.mark.parametrize(
    ("method", "params", "max_pos"),
    [
        ("yarn", {"factor": 4.0}, 1024),
        ("dynamic", {"factor": 4.0}, 256),
        ("longrope", {"factor": 4.0}, 1024),
    ],
)
def test_cos_sin_tables_match_transformers_forward(
    hf: Any, method: str, params: dict[str, Any], max_pos: int
) -> None:
    """End to end through LlamaRotaryEmbedding: seq_len is max(position) + 1, factor on cos and sin."""
    params = dict(params)
    if method == "longrope":
        params["short_factor"], params["long_factor"] = longrope_lists(64, 4.0)
    rope = {"rope_type": method, "rope_theta": 1e4, **params}
    if method != "dynamic":
        rope["original_max_position_embeddings"] = 256
    for n_pos in (200, 1000):  # below and above the training length
        positions = torch.arange(n_pos)
        inv, attn = rope_parameters(
            method, head_dim=64, base=1e4, original_length=256, seq_len=n_pos, **params
        )
        assert_tables_close(
            rope_tables(inv, attn, positions), hf_tables(hf, dict(rope), max_pos, positions)
        )


# ----------------------------------------------------------------------------- negative controls


def test_helper_rejects_perturbed_inv_freq() -> None:
    inv, attn = rope_parameters(
        "yarn", head_dim=64, base=1e4, original_length=256, seq_len=1024, factor=4.0
    )
    assert_rope_matches((inv, attn), (inv.clone(), attn))
    bumped = inv.clone()
    bumped[7] *= 1 + 1e-5
    with pytest.raises(AssertionError, match="relative error"):
        assert_rope_matches((bumped, attn), (inv, attn))
    with pytest.raises(AssertionError, match="attention factor"):
        assert_rope_matches((inv, attn * (1 + 1e-5)), (inv, attn))
    with pytest.raises(AssertionError, match="shape"):
        assert_rope_matches((inv[:-1], attn), (inv, attn))
    with pytest.raises(AssertionError, match="dtype"):
        assert_rope_matches((inv.double(), attn), (inv, attn))


def _wrong_yarn_half_clamp(geometry: RopeGeometry, factor: float) -> torch.Tensor:
    """YaRN with the classic bug: `high` clamped to r/2 - 1 instead of r - 1."""
    r, b, length = geometry.rotary_dim, geometry.base, geometry.original_length

    def corr(n: float) -> float:
        return r * math.log(length / (2 * math.pi * n)) / (2 * math.log(b))

    low, high = max(math.floor(corr(32)), 0), min(math.ceil(corr(1)), r // 2 - 1)
    ramp = ((torch.arange(r // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    theta = default_inv_freq(r, b)
    return ((theta / factor) * ramp + theta * (1 - ramp)).float()


def test_wrong_yarn_clamp_is_rejected(hf: Any) -> None:
    """In the regime L > 2*pi*b (here base 500, L 8192), clamping high to r/2-1 is detectably wrong."""
    setting = {"head_dim": 64, "base": 500.0, "original_length": 8192, "seq_len": 8192}
    theirs = hf_rope(hf, "yarn", **setting, factor=4.0)
    ours = rope_parameters("yarn", **setting, factor=4.0)
    assert_rope_matches(ours, theirs)
    wrong = _wrong_yarn_half_clamp(RopeGeometry(64, 500.0, 8192, 8192), 4.0)
    with pytest.raises(AssertionError, match="relative error"):
        assert_rope_matches((wrong, ours[1]), theirs)


def test_yarn_attention_factor_must_be_on_cos_and_sin(hf: Any) -> None:
    """Forgetting the factor on sin (or dropping it entirely) no longer matches transformers."""
    positions = torch.arange(600)
    rope = {
        "rope_type": "yarn",
        "rope_theta": 1e4,
        "factor": 4.0,
        "original_max_position_embeddings": 256,
    }
    theirs = hf_tables(hf, rope, 1024, positions)
    inv, attn = rope_parameters(
        "yarn", head_dim=64, base=1e4, original_length=256, seq_len=600, factor=4.0
    )
    assert_tables_close(rope_tables(inv, attn, positions), theirs)
    with pytest.raises(AssertionError):
        assert_tables_close(rope_tables(inv, attn, positions, scale_sin=False), theirs)
    with pytest.raises(AssertionError):
        assert_tables_close(rope_tables(inv, 1.0, positions), theirs)
    with pytest.raises(AssertionError, match="attention factor"):
        assert_rope_matches(
            (inv, 1.0),
            hf_rope(
                hf, "yarn", head_dim=64, base=1e4, original_length=256, seq_len=600, factor=4.0
            ),
        )


def test_dynamic_factor_as_target_ratio_is_rejected(hf: Any) -> None:
    """The trap: treating dynamic's factor as the target ratio (base' = b * s^(r/(r-2))) is wrong."""
    common = {"head_dim": 64, "base": 1e4, "original_length": 256}
    for seq_len in (256, 1024):
        theirs = hf_rope(hf, "dynamic", **common, seq_len=seq_len, factor=4.0)
        assert_rope_matches(
            rope_parameters("dynamic", **common, seq_len=seq_len, factor=4.0), theirs
        )
        wrong = rope_parameters("ntk", **common, seq_len=seq_len, alpha=4.0)
        with pytest.raises(AssertionError, match="relative error"):
            assert_rope_matches(wrong, theirs)


# ----------------------------------------------------------------------------- hand-checked values


REFERENCE = {
    # REFERENCE.md: head_dim 64, base 1e4, factor 4, L 256; inv_freq[:4], attention factor.
    "default": ({}, 256, [1.0, 0.749894, 0.562341, 0.421697], 1.0),
    "linear": ({"factor": 4.0}, 256, [0.25, 0.187474, 0.140585, 0.105424], 1.0),
    "dynamic": ({"factor": 4.0}, 1024, [1.0, 0.690345, 0.476577, 0.329002], 1.0),
    "yarn": ({"factor": 4.0}, 1024, [1.0, 0.706631, 0.497456, 0.348711], 1.1386294361),
}


@pytest.mark.parametrize("method", sorted(REFERENCE))
def test_reference_values(method: str) -> None:
    params, seq_len, head, attn = REFERENCE[method]
    inv, a = rope_parameters(
        method, head_dim=64, base=1e4, original_length=256, seq_len=seq_len, **params
    )
    assert inv.shape == (32,) and inv.dtype == torch.float32
    torch.testing.assert_close(inv[:4], torch.tensor(head), rtol=2e-6, atol=1e-6)
    assert a == pytest.approx(attn, rel=1e-9)


def test_reference_values_by_hand() -> None:
    """The same numbers from the closed forms, independent of any rope code."""
    r, b, s, length = 64, 1e4, 4.0, 256
    theta = [b ** (-2 * i / r) for i in range(r // 2)]
    inv, _ = rope_parameters("default", head_dim=r, base=b, original_length=length, seq_len=length)
    torch.testing.assert_close(inv, torch.tensor(theta, dtype=torch.float32), rtol=1e-6, atol=0)
    # dynamic at 4L: base' = b * (4*4 - 3)^(64/62) = b * 13^(32/31)
    base2 = b * 13 ** (64 / 62)
    inv, _ = rope_parameters(
        "dynamic", head_dim=r, base=b, original_length=length, seq_len=4 * length, factor=s
    )
    torch.testing.assert_close(
        inv,
        torch.tensor([base2 ** (-2 * i / r) for i in range(r // 2)], dtype=torch.float32),
        rtol=1e-6,
        atol=0,
    )
    # yarn: corr(32) = 64 ln(256/(64 pi)) / (2 ln 1e4) = 0.827 -> low 0; corr(1) = 12.88 -> high 13.
    inv, attn = rope_parameters(
        "yarn", head_dim=r, base=b, original_length=length, seq_len=length, factor=s
    )
    ramp = [min(max(i / 13, 0.0), 1.0) for i in range(r // 2)]
    hand = [t / s * m + t * (1 - m) for t, m in zip(theta, ramp, strict=True)]
    torch.testing.assert_close(inv, torch.tensor(hand, dtype=torch.float32), rtol=1e-6, atol=0)
    assert attn == pytest.approx(1 + 0.1 * math.log(4))
    # longrope's default attention factor: sqrt(1 + ln 4 / ln 256) = sqrt(1.25)
    short, long = longrope_lists(r, s)
    _, attn = rope_parameters(
        "longrope",
        head_dim=r,
        base=b,
        original_length=length,
        seq_len=10,
        short_factor=short,
        long_factor=long,
        factor=s,
    )
    assert attn == pytest.approx(math.sqrt(1.25))


# ----------------------------------------------------------------------------- properties


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("linear", {"factor": 1.0}),
        ("yarn", {"factor": 1.0}),
        ("llama3", {"factor": 1.0}),
        ("ntk", {"alpha": 1.0}),
    ],
)
def test_identity_settings_equal_default(method: str, params: dict[str, Any]) -> None:
    common = {"head_dim": 64, "base": 1e4, "original_length": 256, "seq_len": 1024}
    ref, _ = rope_parameters("default", **common)
    inv, attn = rope_parameters(method, **common, **params)
    torch.testing.assert_close(inv, ref, rtol=1e-6, atol=0)
    assert attn == 1.0


def test_dynamic_and_longrope_switch_only_beyond_training_length() -> None:
    common = {"head_dim": 64, "base": 1e4, "original_length": 256}
    ref, _ = rope_parameters("default", **common, seq_len=1)
    for seq_len in (1, 100, 256):
        assert torch.equal(
            rope_parameters("dynamic", **common, seq_len=seq_len, factor=8.0)[0], ref
        )
    assert not torch.allclose(rope_parameters("dynamic", **common, seq_len=257, factor=8.0)[0], ref)
    short, long = longrope_lists(64, 4.0)
    at_l = rope_parameters(
        "longrope", **common, seq_len=256, short_factor=short, long_factor=long, factor=4.0
    )
    past_l = rope_parameters(
        "longrope", **common, seq_len=257, short_factor=short, long_factor=long, factor=4.0
    )
    torch.testing.assert_close(at_l[0], ref / torch.tensor(short), rtol=1e-6, atol=0)
    torch.testing.assert_close(past_l[0], ref / torch.tensor(long), rtol=1e-6, atol=0)
    assert at_l[1] == past_l[1] > 1.0  # attention factor applies to short sequences too


def test_partial_rotation_shapes() -> None:
    for method, params in [("default", {}), ("yarn", {"factor": 4.0}), ("ntk", {"alpha": 2.0})]:
        inv, _ = rope_parameters(
            method,
            head_dim=64,
            base=1e4,
            original_length=256,
            seq_len=256,
            rotary_fraction=0.25,
            **params,
        )
        assert inv.shape == (8,) and inv.dtype == torch.float32


def test_registry_names_and_extension() -> None:
    assert {"default", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope"} <= set(
        SCALING_METHODS
    )

    @register_scaling("_test_halve")
    def _halve(geometry: RopeGeometry, *, amount: float = 2.0) -> tuple[torch.Tensor, float]:
        return default_inv_freq(geometry.rotary_dim, geometry.base) / amount, 1.0

    try:
        inv, _ = rope_parameters(
            "_test_halve", head_dim=8, base=1e4, original_length=16, seq_len=16, amount=4.0
        )
        assert inv[0].item() == 0.25
        with pytest.raises(ValueError, match="'factor'.*allowed parameters: \\['amount'\\]"):
            rope_parameters(
                "_test_halve", head_dim=8, base=1e4, original_length=16, seq_len=16, factor=4.0
            )
        with pytest.raises(ValueError, match="already registered"):
            register_scaling("_test_halve")(_halve)
        assert "_test_halve" in applicable_methods("rope")  # rope takes every registered method
        assert "_test_halve" not in applicable_methods("sinusoidal")
    finally:
        SCALING_METHODS.pop("_test_halve", None)


def test_applicable_methods_per_family() -> None:
    assert applicable_methods("rope") == tuple(SCALING_METHODS)
    assert applicable_methods("learned") == ("default", "linear")
    # a family without frequencies takes windows only (a training-free method that masks)
    assert applicable_methods("alibi") == applicable_methods("nope") == ("default", "streaming")
    assert set(applicable_methods("sinusoidal")) == {"default", "linear", "ntk", "dynamic"}
    assert all(
        set(applicable_methods(k)) <= set(SCALING_METHODS) for k in ("sinusoidal", "learned")
    )
    with pytest.raises(ValueError, match="position.kind 'rotary' is unknown; allowed: rope"):
        applicable_methods("rotary")


# ----------------------------------------------------------------------------- declared facts


def _model_with(method: str, family: str = "rope"):
    from models.positions import PositionConfig
    from models.transformer import DecoderLM, ModelConfig, ScalingConfig

    torch.manual_seed(0)
    model = DecoderLM(
        ModelConfig(n_layers=1, d_model=16, n_heads=2), PositionConfig(kind=family), 8
    )
    model.set_scaling(ScalingConfig(name=method, method=method))
    return model


@pytest.mark.parametrize("length_dependent", [True, False])
def test_length_dependent_method_gets_a_table_per_length(length_dependent: bool) -> None:
    """A method that declares itself length-dependent is computed at each sequence length; the
    same function declared static (the negative control) is computed once for every length."""

    @register_scaling("_test_grow", length_dependent=length_dependent)
    def _grow(geometry: RopeGeometry) -> tuple[torch.Tensor, float]:
        # frequencies shrink as the sequence grows past the training length
        stretch = max(1.0, geometry.seq_len / geometry.original_length)
        return default_inv_freq(geometry.rotary_dim, geometry.base) / stretch, 1.0

    try:
        model = _model_with("_test_grow")
        short_ids, long_ids = torch.arange(8)[None], torch.arange(32)[None]
        short, _ = model.family.rotary(model, short_ids, 8)
        long, _ = model.family.rotary(model, long_ids, 32)
        # the first 8 positions' angles: equal to raw RoPE at L, divided by 4 at 4L if dependent
        raw = torch.cos(torch.arange(8.0)[:, None] * default_inv_freq(8, 1e4).float())
        assert torch.allclose(short[0], raw, atol=1e-6)
        quarter = torch.cos(torch.arange(8.0)[:, None] * default_inv_freq(8, 1e4).float() / 4)
        assert torch.allclose(long[0, :8], quarter if length_dependent else raw, atol=1e-6)
        assert model._length_dependent() is length_dependent
    finally:
        SCALING_METHODS.pop("_test_grow", None)


def test_declared_facts_of_the_shipped_methods() -> None:
    facts = {
        n: (m.length_dependent, m.auto_keys, m.list_params) for n, m in SCALING_METHODS.items()
    }
    assert facts["dynamic"][0] and facts["longrope"][0]
    assert not any(facts[n][0] for n in ("default", "linear", "ntk", "yarn", "llama3"))
    assert facts["ntk"][1] == ("alpha",) and facts["linear"][1] == ("factor",)
    assert facts["longrope"][2] == ("short_factor", "long_factor")
    # a declared fact names a parameter the function takes
    with pytest.raises(ValueError, match="declares auto_keys \\['scale'\\]"):

        @register_scaling("_test_bad", auto_keys=("scale",))
        def _bad(geometry: RopeGeometry, *, factor: float = 1.0) -> tuple[torch.Tensor, float]:
            return default_inv_freq(geometry.rotary_dim, geometry.base), 1.0

    assert "_test_bad" not in SCALING_METHODS


def test_auto_and_list_params_follow_the_declaration() -> None:
    from models.scaling_config import ScalingConfig, resolve_params

    @register_scaling("_test_lists", auto_keys=("scale",), list_params=("per_pair",))
    def _lists(
        geometry: RopeGeometry, *, scale: float = 1.0, per_pair: Sequence[float] = ()
    ) -> tuple[torch.Tensor, float]:
        return default_inv_freq(geometry.rotary_dim, geometry.base) / scale, 1.0

    try:
        cfg = ScalingConfig(method="_test_lists", params={"scale": "auto", "per_pair": 2.0})
        assert cfg.auto_factor
        params = resolve_params(cfg, train_length=8, eval_length=32, rotary_pairs=3)
        assert params == {"scale": 4.0, "per_pair": [2.0, 2.0, 2.0]}
        # control: a method that does not declare "factor" leaves factor: auto alone
        undeclared = ScalingConfig(method="_test_lists", params={"factor": "auto"})
        assert not undeclared.auto_factor
        assert resolve_params(undeclared, train_length=8, eval_length=32, rotary_pairs=3) == {
            "factor": "auto"
        }
    finally:
        SCALING_METHODS.pop("_test_lists", None)


# ----------------------------------------------------------------------------- errors

GEOM = {"head_dim": 64, "base": 1e4, "original_length": 256, "seq_len": 1024}
SHORT, LONG = longrope_lists(64, 4.0)


def _call(name: str, **overrides: Any) -> Callable[[], object]:
    kwargs = {**GEOM, **overrides}
    return lambda: rope_parameters(name, **kwargs)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (_call("yarnn", factor=4.0), r"'yarnn'.*registered methods: \[.*'yarn'"),
        (_call("linear", alpha=2.0), r"\['alpha'\].*allowed parameters: \['factor'\]"),
        (_call("yarn", factor=4.0, beta=3), r"\['beta'\].*'beta_fast'"),
        (_call("linear"), r"missing required parameter\(s\) \['factor'\]"),
        (_call("linear", factor=0.5), r"factor must be >= 1, got 0.5"),
        (_call("yarn", factor=0.5), r"yarn: factor must be >= 1, got 0.5"),
        (_call("llama3", factor=0.9), r"llama3: factor must be >= 1, got 0.9"),
        (_call("dynamic", factor=0), r"dynamic: factor must be >= 1, got 0"),
        (_call("dynamic", factor=-2.0), r"got -2.0"),
        (_call("ntk", alpha=0.0), r"ntk: alpha must be > 0, got 0.0"),
        (_call("linear", factor="auto"), r"finite number, got 'auto'"),
        (_call("linear", factor=float("nan")), r"got nan"),
        (
            _call("longrope", short_factor=SHORT[:3], long_factor=LONG, factor=4.0),
            r"short_factor must have length rotary_dim/2 = 32, got length 3",
        ),
        (
            _call("longrope", short_factor=SHORT, long_factor=LONG + [1.0], factor=4.0),
            r"long_factor .* got length 33",
        ),
        (
            _call("longrope", short_factor=SHORT, long_factor="1,2", factor=4.0),
            r"long_factor must be a list",
        ),
        (
            _call("longrope", short_factor=SHORT, long_factor=LONG),
            r"give factor .* or attention_factor",
        ),
        (
            _call("longrope", short_factor=[0.0] * 32, long_factor=LONG, factor=4.0),
            r"short_factor\[0\] must be nonzero \(theta_i / 0 is infinite\), got 0.0",
        ),
        (
            _call("yarn", factor=4.0, beta_fast=-1),
            r"beta_fast must be > 0, or 0 / None for the default 32, got -1",
        ),
        (_call("yarn", factor=4.0, beta_fast=1, beta_slow=32), r"beta_fast=1, beta_slow=32"),
        (
            _call("yarn", factor=4.0, mscale=0.7, mscale_all_dim=-10 / math.log(4.0)),
            r"mscale_all_dim=-7.21.* denominator .* zero at factor=4.0",
        ),
        (
            _call("yarn", factor=4.0, attention_factor=-1.0),
            r"attention_factor must be >= 0, got -1.0",
        ),
        (_call("yarn", factor=4.0, truncate=None), r"truncate must be True or False, got None"),
        (
            _call("llama3", factor=8.0, low_freq_factor=0.0),
            r"low_freq_factor must be nonzero \(L / low_freq_factor is a wavelength\), got 0.0",
        ),
        (_call("yarn", factor=4.0, truncate="yes"), r"truncate must be True or False, got 'yes'"),
        (
            _call("llama3", factor=8.0, low_freq_factor=4.0, high_freq_factor=1.0),
            r"high_freq_factor=1.0, low_freq_factor=4.0",
        ),
        (_call("default", head_dim=63), r"= 63 must be even"),
        (_call("default", rotary_fraction=0.3), r"int\(64 \* 0.3\) = 19 must be even"),
        (_call("default", rotary_fraction=1.5), r"rotary_fraction must be in \(0, 1\], got 1.5"),
        (_call("ntk", head_dim=2, alpha=2.0), r"r/\(r-2\).*r=2"),
        (_call("default", base=1.0), r"base must be > 1, got 1.0"),
        (_call("default", seq_len=0), r"seq_len must be a positive integer, got 0"),
        (
            _call("default", original_length=256.0),
            r"original_length must be a positive integer, got 256.0",
        ),
    ],
)
def test_bad_parameters_raise(call: Callable[[], object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_valid_baseline_of_error_cases_passes() -> None:
    """Negative control for the error table: the unperturbed calls succeed."""
    for name, params in [
        ("linear", {"factor": 4.0}),
        ("yarn", {"factor": 4.0, "mscale": 0.7, "mscale_all_dim": 0.7}),
        ("llama3", {"factor": 8.0}),
        ("longrope", {"short_factor": SHORT, "long_factor": LONG, "factor": 4.0}),
        ("ntk", {"head_dim": 4, "alpha": 2.0}),
    ]:
        _call(name, **params)()


# ----------------------------------------------------------------------------- what transformers accepts

_ACCEPTED_BY_TRANSFORMERS = [
    ("yarn", {"factor": 4.0, "mscale": 0.707, "mscale_all_dim": 0}),  # DeepSeek style
    ("yarn", {"factor": 4.0, "mscale": 1.0, "mscale_all_dim": 1.0}),
    ("yarn", {"factor": 4.0, "mscale": 0.707, "mscale_all_dim": 0.707}),
    ("yarn", {"factor": 4.0, "mscale": 0, "mscale_all_dim": 1.0}),
    ("yarn", {"factor": 4.0, "mscale": 0.707}),
    ("yarn", {"factor": 4.0, "mscale_all_dim": 0.707}),
    ("yarn", {"factor": 4.0, "mscale": -1.0, "mscale_all_dim": 0.5}),
    ("yarn", {"factor": 4.0, "mscale": None, "mscale_all_dim": None}),
    ("yarn", {"factor": 1.0, "mscale": 2.0, "mscale_all_dim": 3.0}),
    ("yarn", {"factor": 4.0, "beta_fast": 0, "beta_slow": 0}),
    ("yarn", {"factor": 4.0, "beta_fast": None, "beta_slow": None}),
    ("yarn", {"factor": 4.0, "beta_fast": 16, "beta_slow": 16}),
    ("yarn", {"factor": 4.0, "attention_factor": 0.0}),
    ("yarn", {"factor": 4.0, "attention_factor": 0.5, "mscale": 1.0, "mscale_all_dim": 0.5}),
    ("dynamic", {"factor": 1.0}),
    ("llama3", {"factor": 4.0, "low_freq_factor": -1.0, "high_freq_factor": 4.0}),
    (
        "longrope",
        {"factor": 4.0, "short_factor": SHORT, "long_factor": LONG, "attention_factor": 0.0},
    ),
    ("longrope", {"factor": 4.0, "short_factor": SHORT, "long_factor": [-x for x in LONG]}),
]
_REFUSED_BY_TRANSFORMERS = [  # it warns, or its computation fails or is not finite
    ("yarn", {"factor": 0.5}),
    ("yarn", {"factor": 4.0, "beta_fast": -1}),
    ("yarn", {"factor": 4.0, "beta_slow": -1}),
    ("yarn", {"factor": 4.0, "beta_fast": 1, "beta_slow": 32}),
    ("yarn", {"factor": 4.0, "attention_factor": -1.0}),
    ("yarn", {"factor": 4.0, "mscale": 1.0, "mscale_all_dim": -10 / math.log(4.0)}),
    ("linear", {"factor": 0.5}),
    ("dynamic", {"factor": 0.5}),
    ("llama3", {"factor": 4.0, "low_freq_factor": 0.0, "high_freq_factor": 4.0}),
    ("llama3", {"factor": 4.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0}),
    ("longrope", {"factor": 4.0, "short_factor": SHORT, "long_factor": [0.0] + LONG[1:]}),
    ("longrope", {"factor": 0.5, "short_factor": SHORT, "long_factor": LONG}),
    (
        "longrope",
        {"factor": 4.0, "short_factor": SHORT, "long_factor": LONG, "attention_factor": -1.0},
    ),
]


def hf_verdict(hf: Any, method: str, params: dict[str, Any]) -> list[str]:
    """transformers' objections to ``params`` at GEOM: its validation warnings, plus an error
    or non-finite result of its computation. Empty = transformers accepts them."""
    from unittest import mock

    from transformers import modeling_rope_utils as rope_utils

    length = GEOM["original_length"]
    rope: dict[str, Any] = {"rope_type": method, "rope_theta": GEOM["base"], **params}
    if method != "dynamic":  # dynamic reads L from max_position_embeddings
        rope["original_max_position_embeddings"] = length
    max_pos = length if method == "dynamic" else int(length * max(params["factor"], 1.0))
    objections: list[str] = []
    with (
        mock.patch.object(rope_utils.logger, "warning", side_effect=objections.append),
        mock.patch.object(rope_utils.logger, "warning_once", side_effect=objections.append),
    ):
        cfg = hf.LlamaConfig(
            hidden_size=2 * GEOM["head_dim"],
            num_attention_heads=2,
            head_dim=GEOM["head_dim"],
            max_position_embeddings=max_pos,
            rope_parameters={"rope_type": "default", "rope_theta": GEOM["base"]},
        )
        cfg.rope_parameters = rope
        cfg.standardize_rope_params()
        cfg.validate_rope()
        try:
            inv, attn = rope_utils.ROPE_INIT_FUNCTIONS[method](cfg, "cpu", seq_len=GEOM["seq_len"])
            if not (bool(inv.isfinite().all()) and math.isfinite(attn)):
                objections.append("not finite")
        except (ValueError, ZeroDivisionError) as error:
            objections.append(f"{type(error).__name__}: {error}")
    return objections


@pytest.mark.parametrize(("method", "params"), _ACCEPTED_BY_TRANSFORMERS)
def test_accepts_exactly_what_transformers_accepts(
    hf: Any, method: str, params: dict[str, Any]
) -> None:
    assert hf_verdict(hf, method, params) == []  # the case really is one transformers accepts
    ours = rope_parameters(method, **GEOM, **params)
    assert_rope_matches(ours, hf_rope(hf, method, **GEOM, **params), f"{method} {params}")


@pytest.mark.parametrize(("method", "params"), _REFUSED_BY_TRANSFORMERS)
def test_refuses_what_transformers_refuses_in_one_sentence(
    hf: Any, method: str, params: dict[str, Any]
) -> None:
    assert hf_verdict(hf, method, params) != []  # negative control: transformers objects too
    with pytest.raises(ValueError) as error:
        rope_parameters(method, **GEOM, **params)
    message = str(error.value)
    assert message.startswith(f"{method}: ") and message.endswith(".") and "\n" not in message


# ----------------------------------------------------------------------------- logn


@pytest.mark.parametrize("length", [64, 256, 2048])
def test_logn_factor(length: int) -> None:
    assert logn_factor(1, length) == 1.0
    assert logn_factor(length // 2, length) == 1.0
    assert logn_factor(length, length) == 1.0
    assert logn_factor(4 * length, length) == pytest.approx(
        math.log(4 * length) / math.log(length), rel=1e-12
    )
    assert logn_factor(4 * length, length) > 1.0
    with pytest.raises(ValueError, match="train_length must be >= 2"):
        logn_factor(10, 1)
    with pytest.raises(ValueError, match="seq_len must be a positive integer, got 0"):
        logn_factor(0, length)


# ----------------------------------------------------------------------------- run factor (issue 11, item 2)
# A static method's "auto" factor is fixed once per run, for scaling.target_length or else the
# run's longest eval length; oracle=True keeps one factor per eval length (an upper bound).


def test_run_scaling_fixes_one_factor_for_the_longest_length() -> None:
    from models.scaling_config import ScalingConfig, resolve_params, run_scaling

    ntk = ScalingConfig(name="ntk", method="ntk", params={"alpha": "auto"})
    run = run_scaling(ntk, train_length=32, lengths=[64, 32, 128])
    assert run.params == {"alpha": 4.0} and run.target_length == 128 and run.label == "ntk"
    # the resolved factor no longer follows the length it is applied at
    for length in (32, 64, 128):
        assert resolve_params(run, train_length=32, eval_length=length, rotary_pairs=4) == {
            "alpha": 4.0
        }
    # an explicit target wins over the longest length; never below 1
    target = ScalingConfig(name="yarn", method="yarn", params={"factor": "auto"}, target_length=64)
    assert run_scaling(target, train_length=32, lengths=[32, 128]).params == {"factor": 2.0}
    short = ScalingConfig(name="linear", method="linear", params={"factor": "auto"})
    assert run_scaling(short, train_length=32, lengths=[16]).params == {"factor": 1.0}
    # a target below the training length is refused, not clamped to factor 1 (control: at L)
    below = ScalingConfig(
        name="linear", method="linear", params={"factor": "auto"}, target_length=16
    )
    with pytest.raises(ValueError, match="target_length 16 is below the training length 32"):
        run_scaling(below, train_length=32, lengths=[64])
    at_l = ScalingConfig(
        name="linear", method="linear", params={"factor": "auto"}, target_length=32
    )
    assert run_scaling(at_l, train_length=32, lengths=[64]).params == {"factor": 1.0}
    # longrope: the factor is fixed, the ramp is still built from it per model
    longrope = ScalingConfig(
        name="longrope",
        method="longrope",
        params={"short_factor": 1.0, "long_factor": "ramp", "factor": "auto"},
    )
    fixed = run_scaling(longrope, train_length=32, lengths=[32, 256])
    assert fixed.params == {"short_factor": 1.0, "long_factor": "ramp", "factor": 8.0}
    ramp = resolve_params(fixed, train_length=32, eval_length=64, rotary_pairs=3)["long_factor"]
    assert ramp == pytest.approx([1.0, 8.0**0.5, 8.0])


def test_run_scaling_leaves_oracle_fixed_and_dynamic_settings_alone() -> None:
    from models.scaling_config import ScalingConfig, resolve_params, run_scaling

    oracle = ScalingConfig(name="ntk", method="ntk", params={"alpha": "auto"}, oracle=True)
    assert run_scaling(oracle, train_length=32, lengths=[32, 128]) == oracle
    assert oracle.per_length and oracle.label == "ntk (oracle)"
    per_length = [
        resolve_params(oracle, train_length=32, eval_length=n, rotary_pairs=4)["alpha"]
        for n in (32, 64, 128)
    ]
    assert per_length == [1.0, 2.0, 4.0]  # control: the oracle follows each eval length
    for cfg in (
        ScalingConfig(name="ntk8", method="ntk", params={"alpha": 8.0}),
        ScalingConfig(name="dynamic", method="dynamic", params={"factor": 1.0}),
        ScalingConfig(name="logn", logn=True),
        ScalingConfig(name="dynamic", method="dynamic", params={"factor": 1.0}, oracle=True),
    ):
        assert run_scaling(cfg, train_length=32, lengths=[32, 128]) == cfg
        assert not cfg.per_length and cfg.label == cfg.name  # oracle means nothing without auto
    both = ScalingConfig(method="ntk", params={"alpha": "auto"}, oracle=True, target_length=64)
    with pytest.raises(ValueError, match="oracle=True .* target_length=64"):
        run_scaling(both, train_length=32, lengths=[32])
    with pytest.raises(ValueError, match="needs an eval length"):
        run_scaling(
            ScalingConfig(method="ntk", params={"alpha": "auto"}), train_length=32, lengths=[]
        )
