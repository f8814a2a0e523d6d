"""xPos (models/families/rotary.py) against rotary-embedding-torch's ``use_xpos`` (a test-only dependency)
and against the uncentred logits in float64 at offsets up to 10^6 (centred exponents stay
finite), KV-cache decoding at such an offset, its fields and scalings (KV cache, left padding and
shift invariance, with a strong decay: tests/models/test_zoo.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from models.families.rotary import xpos_decay
from models.positions import PositionConfig, rotate
from models.scaling import applicable_methods
from models.transformer import DecoderLM, ModelConfig


def xpos_model(scale_base: float = 512.0, layout: str = "interleaved") -> DecoderLM:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=2)
    position = PositionConfig(kind="xpos", layout=layout, xpos_scale_base=scale_base)
    return DecoderLM(cfg, position, train_length=16).eval()


def our_logits(model: DecoderLM, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q.k logits [B, H, L, L] after our xPos rotation of q and k [B, H, L, d] at 0..L-1."""
    positions = torch.arange(q.shape[2])[None]
    q_cos, q_sin, k_cos, k_sin = (t[:, None] for t in model.family.rotary(model, positions, 16))
    layout = model.position_cfg.layout
    return rotate(q, q_cos, q_sin, layout) @ rotate(k, k_cos, k_sin, layout).transpose(-1, -2)


@pytest.mark.parametrize("scale_base", [512.0, 16.0])
def test_xpos_logits_equal_rotary_embedding_torch(scale_base):
    from rotary_embedding_torch import RotaryEmbedding

    model = xpos_model(scale_base)
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(2, 2, 40, 16, generator=gen) for _ in range(2))
    theirs = RotaryEmbedding(dim=16, use_xpos=True, xpos_scale_base=scale_base)
    rq, rk = theirs.rotate_queries_and_keys(q, k)  # centred exponents: the same logits
    torch.testing.assert_close(
        our_logits(model, q, k), rq @ rk.transpose(-1, -2), rtol=1e-5, atol=1e-5
    )
    # controls: another decay base, and RoPE without decay, give other logits
    other = RotaryEmbedding(dim=16, use_xpos=True, xpos_scale_base=scale_base * 2)
    oq, ok = other.rotate_queries_and_keys(q, k)
    assert (our_logits(model, q, k) - oq @ ok.transpose(-1, -2)).abs().max() > 1e-3
    plain = RotaryEmbedding(dim=16)
    pq, pk = plain.rotate_queries_or_keys(q), plain.rotate_queries_or_keys(k)
    assert (our_logits(model, q, k) - pq @ pk.transpose(-1, -2)).abs().max() > 1e-3


def test_xpos_fields_and_scalings():
    assert PositionConfig(kind="xpos").params() == {
        "base": 10000.0,
        "layout": "half",
        "xpos_scale_base": 512.0,
    }
    # every frequency method; no training-free pair method (a key's decay follows its own position)
    pair_methods = {"self_extend", "rerope", "leaky_rerope", "streaming", "dca"}
    # nor DroPE: zero frequencies would leave xPos's scales, so its encoding would not be dropped
    expected = set(applicable_methods("rope")) - pair_methods - {"drope"}
    assert set(applicable_methods("xpos")) == expected
    with pytest.raises(ValueError, match="xpos_scale_base must be > 0"):
        xpos_model(scale_base=0.0)


def _rotated_logits(model, q, k, positions, centre=None):
    """q.k logits [H, L, L] of q, k [H, L, d] after our xPos rotation at ``positions`` [L] (a
    row of length max + 1), with the family's centre or ``centre``."""
    ids = positions[None]
    seq_len = int(positions.max()) + 1
    if centre is None:
        q_cos, q_sin, k_cos, k_sin = model.family.rotary(model, ids, seq_len)
    else:  # the same rotation, exponents centred on ``centre`` (0: the old uncentred path)
        cos, sin = model.rotary_table(seq_len)(ids)
        decay = xpos_decay(ids, centre, 2 * cos.shape[-1], model.position_cfg.xpos_scale_base)
        q_cos, q_sin, k_cos, k_sin = cos * decay, sin * decay, cos / decay, sin / decay
    layout = model.position_cfg.layout
    return rotate(q, q_cos, q_sin, layout) @ rotate(k, k_cos, k_sin, layout).transpose(-1, -2)


def _uncentred_float64(model, q, k, positions):
    """The uncentred xPos logits in float64: sum over channels of (RoPE-rotated q_i)(RoPE-rotated
    k_j) zeta_pair^(i / gamma) zeta_pair^(-j / gamma), the two factors taken together as
    zeta^((i - j) / gamma) (float64 overflows for each alone from ~290,000 positions). The
    rotation is RoPE's float32-angle table, in float64."""
    cos, sin = (t.double() for t in model.rotary_table(16)(positions[None]))  # [1, L, r/2]
    layout = model.position_cfg.layout
    q_rot, k_rot = rotate(q.double(), cos, sin, layout), rotate(k.double(), cos, sin, layout)
    zeta = (torch.arange(0, 16, 2, dtype=torch.float64) / 16 + 0.4) / 1.4  # [r/2]
    channel = zeta.repeat_interleave(2) if layout == "interleaved" else zeta.repeat(2)  # [d]
    gap = (positions[:, None] - positions[None, :]).double()  # i - j, exact
    decay = channel ** (gap[..., None] / model.position_cfg.xpos_scale_base)  # [L, L, d]
    return torch.einsum("hic,hjc,ijc->hij", q_rot, k_rot, decay)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("scale_base", [512.0, 16.0])
def test_xpos_logits_are_finite_and_uncentred_at_any_offset(scale_base, layout):
    """Rows of 48 positions starting at offsets up to 10^6: finite logits equal to the uncentred
    logits computed in float64 (and at offset 0, where the old uncentred float32 path is finite,
    equal to it). Negative control: the old uncentred float32 path is non-finite from position
    ~36,000 at gamma 512 (~1,100 at gamma 16)."""
    model = xpos_model(scale_base, layout)
    gen = torch.Generator().manual_seed(4)
    q, k = (torch.randn(2, 48, 16, generator=gen) for _ in range(2))
    for offset in (0, 1_000, 40_000, 10**5, 10**6):
        positions = torch.arange(48) + offset
        with torch.no_grad():
            ours = _rotated_logits(model, q, k, positions)
            old = _rotated_logits(model, q, k, positions, centre=0)
        assert torch.isfinite(ours).all(), offset
        expected = _uncentred_float64(model, q, k, positions).float()
        torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)
        if offset == 0:
            torch.testing.assert_close(ours, old, rtol=1e-5, atol=1e-5)
        elif offset >= 40_000:
            assert not torch.isfinite(old).all(), offset  # control: the old path overflows
    # control: the float64 oracle tells the decay apart from another decay base
    other = _uncentred_float64(xpos_model(scale_base * 2, layout), q, k, positions).float()
    assert (ours - other).abs().max() > 1e-3


def _decoded(model, ids, positions, prefill):
    """Logits of a prefill of ``prefill`` tokens, then one token at a time with the KV cache."""
    out = model(ids[:, :prefill], position_ids=positions[:prefill], use_cache=True)
    steps = [out.logits]
    for t in range(prefill, ids.shape[1]):  # each continues its row's positions
        out = model(ids[:, t : t + 1], past=out.past, use_cache=True)
        steps.append(out.logits)
    return torch.cat(steps, dim=1)


def test_xpos_cache_decoding_equals_the_full_forward_at_a_large_offset(monkeypatch):
    """At position ids 10^6..10^6+19 (decay base 32): finite logits, and prefill + decoding with
    the KV cache (keys cached scaled) equals the full forward: the centre is each row's length
    frozen at the prefill, the same for cached keys and later queries. Negative controls: the old
    uncentred exponents give non-finite logits; a centre taken per forward from its own position
    ids (not kept by the cache) makes decoding differ from the full forward."""
    from models.families.rotary import XPos

    model = xpos_model(scale_base=32.0)
    with torch.no_grad():  # sharp attention, so that a wrong key scale shows in the logits
        for name, param in model.named_parameters():
            if name.endswith(("q_proj.weight", "kv_proj.weight", "o_proj.weight")):
                param.mul_(10.0)
    ids = torch.randint(0, 250, (2, 20), generator=torch.Generator().manual_seed(5))
    positions = torch.arange(20) + 10**6
    with torch.no_grad():
        full = model(ids, position_ids=positions).logits
        assert torch.isfinite(full).all()
        torch.testing.assert_close(_decoded(model, ids, positions, 12), full, atol=1e-4, rtol=1e-4)
        # the same model at offset 0: relative, so the same logits (float32 angles at 10^6 aside)
        near = model(ids, position_ids=torch.arange(20)).logits
        torch.testing.assert_close(full, near, atol=1e-2, rtol=1e-2)
        with monkeypatch.context() as patch:
            patch.setattr(XPos, "centre", lambda self, pos, n: 0)
            assert not torch.isfinite(model(ids, position_ids=positions).logits).all()
        with monkeypatch.context() as patch:
            patch.setattr(XPos, "centre", lambda self, pos, n: int(pos.min()))
            per_forward = model(ids, position_ids=positions).logits
            torch.testing.assert_close(per_forward, full, atol=1e-4, rtol=1e-4)
            decoded = _decoded(model, ids, positions, 12)
            assert (decoded - full).abs().max() > 1e-2


@pytest.mark.parametrize("scale_base", [512.0, 16.0])
def test_one_long_row_is_finite_up_to_the_span_a_job_allows_and_refused_beyond(scale_base):
    """Issue 76 item 3: one row from position 0 to xpos_max_span(gamma) - 1 (26,156 positions at
    gamma 512, 817 at 16), q and k of size 100: finite logits equal to the uncentred float64 ones
    at sampled pairs across the row. Beyond, a job is refused before any work in one sentence
    naming the length and what is allowed (1e5 at gamma 512: the issue's row). Control: such a
    row (and one 1.35 x the allowed span) does give non-finite logits, so the refusal is needed."""
    from bench.job import validate_job
    from bench.schema import JobConfig
    from models.families.rotary import xpos_max_span

    model = xpos_model(scale_base)
    most = xpos_max_span(scale_base)
    assert most == {512.0: 26156, 16.0: 817}[scale_base]
    gen = torch.Generator().manual_seed(7)
    q, k = (100 * torch.randn(2, 7, 16, generator=gen) for _ in range(2))
    causal = torch.ones(7, 7, dtype=torch.bool).tril()

    def logits(span):
        positions = torch.tensor([0, 1, span // 3, span // 2, span - 3, span - 2, span - 1])
        with torch.no_grad():
            return positions, _rotated_logits(model, q, k, positions)

    positions, ours = logits(most)
    assert torch.isfinite(ours).all()
    expected = _uncentred_float64(model, q, k, positions).float()
    torch.testing.assert_close(ours[:, causal], expected[:, causal], rtol=1e-4, atol=1e-2)
    for span in (int(most * 1.35), 4 * most):
        assert not torch.isfinite(logits(span)[1][:, causal]).all(), span  # control
    too_long = 100_000 if scale_base == 512.0 else 4 * most
    job = JobConfig.from_hydra(
        {
            "position": {"kind": "xpos", "xpos_scale_base": scale_base},
            "train": {"length": 16},
            "eval": {"lengths": [16, too_long]},
        }
    )
    needed = math.ceil(too_long * math.log(3.5) / 64)
    with pytest.raises(ValueError) as refused:
        validate_job(job)
    assert str(refused.value) == (
        f"eval length {too_long} is too long for one row of position=xpos with "
        f"position.xpos_scale_base {scale_base:g}, whose query and key scales zeta^(+-span / "
        f"gamma) leave float32's range beyond {most} positions (non-finite logits); allowed: rows "
        f"of at most {most} positions, or position.xpos_scale_base >= {needed} for {too_long}."
    )
    # controls: the allowed span passes, and so does a long row under a larger scale base
    validate_job(replace(job, eval=replace(job.eval, lengths=[16, most])))
    wider = JobConfig.from_hydra(
        {
            "position": {"kind": "xpos", "xpos_scale_base": float(needed)},
            "train": {"length": 16},
            "eval": {"lengths": [16, too_long]},
        }
    )
    validate_job(wider)
