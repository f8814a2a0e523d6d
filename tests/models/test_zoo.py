"""The zoo's position families (models/families/zoo.py, rotary.py, cope.py) against independent evaluations of their formulas.

Each bias equals its oracle on random inputs with a perturbed-parameter control; every family
works with the KV cache and left padding, is shift invariant exactly when it is relative, and has
its gradients; p-RoPE reduces to RoPE and NoPE at its ends and differs from NeoX partial rotary.
KERPLE initialises and learns at its bounds as chijames/KERPLE does, and FIRE's threshold learns as
a multiplier of L as in the paper's code.
"""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
import torch

from models.attention_inputs import AttentionInputs
from models.families.zoo import KERPLE_EPS, sandwich_table, t5_bucket
from models.flex import attend_flex
from models.positions import PositionConfig, family
from models.scaling import applicable_methods, default_inv_freq
from models.tiled_attention import attend_tiled
from models.transformer import DecoderLM, ModelConfig, ScalingConfig

from fixtures.attention import dense_reference

BIAS_FAMILIES = ("t5", "kerple_log", "kerple_power", "fire", "sandwich")
ZOO = (*BIAS_FAMILIES, "p_rope", "xpos", "cope")
RELATIVE = ("t5", "kerple_log", "kerple_power", "sandwich", "p_rope", "xpos", "cope")
HEADS = 4
#: fields that make a family's position signal strong at test lengths (xPos: decay base 32)
STRONG = {"xpos": {"xpos_scale_base": 32.0}}


def zoo_model(
    kind: str, train_length: int = 16, seed: int = 0, randomize: bool = True, **fields
) -> DecoderLM:
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=HEADS)
    model = DecoderLM(cfg, PositionConfig(kind=kind, **fields), train_length).eval()
    if not randomize:
        return model
    with torch.no_grad():  # random, not initial, parameters: the oracles must hold anywhere
        for name, param in model.named_parameters():
            if name.startswith(("t5_", "kerple_", "fire_", "cope_")):
                param.copy_(torch.rand_like(param) * 1.5 + 0.05)
    return model


def bias_at(model: DecoderLM, head: int, i: int, j: int) -> float:
    bias = model.family.score_bias(model, max(i, j) + 1)
    with torch.no_grad():
        return float(bias(torch.tensor(head), torch.tensor(i), torch.tensor(j)))


# ----------------------------------------------------------------------------- oracles


@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 64), (8, 100)])
def test_t5_bucket_equals_transformers(num_buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    n = torch.arange(0, 3000)
    theirs = T5Attention._relative_position_bucket(
        -n, bidirectional=False, num_buckets=num_buckets, max_distance=max_distance
    )  # their relative_position is j - i
    assert torch.equal(t5_bucket(n.float(), num_buckets, max_distance), theirs)
    # control: the bidirectional buckets (half for each direction) differ
    both = T5Attention._relative_position_bucket(
        -n, bidirectional=True, num_buckets=num_buckets, max_distance=max_distance
    )
    assert not torch.equal(t5_bucket(n.float(), num_buckets, max_distance), both)


def test_t5_bias_is_its_table_at_the_bucket():
    from transformers.models.t5.modeling_t5 import T5Attention

    model = zoo_model("t5", num_buckets=16, max_distance=40)
    for head, (i, j) in itertools.product(range(HEADS), [(0, 0), (9, 2), (70, 1), (300, 3)]):
        bucket = int(T5Attention._relative_position_bucket(torch.tensor(j - i), False, 16, 40))
        assert bias_at(model, head, i, j) == pytest.approx(float(model.t5_bias[head, bucket]))
    with torch.no_grad():
        model.t5_bias[1, 7] += 0.5  # control: the table entry of head 1, distance 7
    assert bias_at(model, 1, 9, 2) != pytest.approx(
        bias_at(zoo_model("t5", 16, 0, num_buckets=16, max_distance=40), 1, 9, 2)
    )


@pytest.mark.parametrize("kind", ["kerple_log", "kerple_power"])
def test_kerple_equals_the_paper_formula(kind):
    model = zoo_model(kind)
    r1, r2 = model.kerple_r1.tolist(), model.kerple_r2.tolist()
    for head, (i, j) in itertools.product(range(HEADS), [(0, 0), (5, 4), (40, 3), (100, 0)]):
        n = i - j
        a, b = max(r1[head], KERPLE_EPS), max(r2[head], KERPLE_EPS)
        if kind == "kerple_log":
            expected = -a * math.log(1 + b * n)
        else:
            expected = -a * n ** min(b, 2.0)
        assert bias_at(model, head, i, j) == pytest.approx(expected, rel=1e-6, abs=1e-6)
    with torch.no_grad():
        model.kerple_r2[2] += 0.3  # control
    n = 37
    a = model.kerple_r1[2].item()
    stale = -a * (math.log(1 + r2[2] * n) if kind == "kerple_log" else n ** min(r2[2], 2))
    assert bias_at(model, 2, n, 0) != pytest.approx(stale, rel=1e-4)


def test_kerple_hand_computed_values():
    model = zoo_model("kerple_log")
    with torch.no_grad():
        model.kerple_r1.fill_(1.0)
        model.kerple_r2.fill_(0.5)
    assert bias_at(model, 0, 3, 0) == pytest.approx(-math.log(2.5))  # -1 * log(1 + 0.5 * 3)
    power = zoo_model("kerple_power")
    with torch.no_grad():
        power.kerple_r1.fill_(2.0)
        power.kerple_r2.fill_(0.5)
    assert bias_at(power, 0, 9, 0) == pytest.approx(-6.0)  # -2 * 9^0.5


def test_fire_equals_a_direct_evaluation_and_depends_on_the_query_position():
    model = zoo_model("fire", train_length=16)
    c = model.fire_c.item()
    threshold = abs(model.fire_l_multiplier.item()) * 16  # the reference's |L_multiplier| init_L
    mlp = torch.nn.Sequential(torch.nn.Linear(1, 32), torch.nn.ReLU(), torch.nn.Linear(32, HEADS))
    with torch.no_grad():
        mlp[0].weight.copy_(model.fire_w1[:, None])
        mlp[0].bias.copy_(model.fire_b1)
        mlp[2].weight.copy_(model.fire_w2)
        mlp[2].bias.copy_(model.fire_b2)
    for head, (i, j) in itertools.product(range(HEADS), [(0, 0), (7, 3), (40, 2), (90, 89)]):
        x = math.log(c * (i - j) + 1) / math.log(c * max(threshold, i) + 1)
        expected = float(mlp(torch.tensor([[x]]))[0, head])
        assert bias_at(model, head, i, j) == pytest.approx(expected, rel=1e-5, abs=1e-6)
    # by design not shift invariant past the threshold: the same distance, another query
    assert bias_at(model, 1, 60, 50) != pytest.approx(bias_at(model, 1, 90, 80), abs=1e-4)
    with torch.no_grad():
        model.fire_c += 0.2  # control
    assert bias_at(model, 1, 60, 50) != pytest.approx(
        bias_at(zoo_model("fire", train_length=16), 1, 60, 50), abs=1e-5
    )


def test_sandwich_equals_the_closed_form():
    model = zoo_model("sandwich")
    d = model.model_cfg.d_model
    for head, n in itertools.product(range(HEADS), [0, 1, 5, 63, 200]):
        total = sum(math.cos(n * 10000 ** (-2 * k / d)) for k in range(1, d // 2 + 1))
        expected = (total - d / 2) / ((head + 1) * 8 / HEADS)
        assert bias_at(model, head, n + 3, 3) == pytest.approx(expected, rel=1e-5, abs=1e-5)
    # control: a table built for another width differs
    assert not torch.allclose(sandwich_table(50, d), sandwich_table(50, d + 2))


def test_p_rope_keeps_ropes_highest_frequencies_and_differs_from_partial_rotary():
    model = zoo_model("p_rope", frequency_fraction=0.5)
    inv_freq, _ = model.frequencies(16)
    rope = default_inv_freq(8, 10000.0).float()  # head_dim 8: 4 pairs
    assert torch.equal(inv_freq, torch.cat((rope[:2], torch.zeros(2))))
    partial = zoo_model("rope", rotary_fraction=0.5).frequencies(16)[0]
    assert partial.shape == (2,) and not torch.allclose(partial, rope[:2])  # NeoX: over r = 4


@pytest.mark.parametrize("p,other", [(1.0, "rope"), (0.0, "nope")])
def test_p_rope_at_its_ends_is_rope_or_nope(p, other):
    ids = torch.randint(0, 250, (2, 24))
    model = zoo_model("p_rope", frequency_fraction=p)
    twin = zoo_model(other)
    twin.load_state_dict(model.state_dict())
    with torch.no_grad():  # the same arithmetic: cos 1 and sin 0 leave a pair exactly as it was
        assert torch.equal(model(ids).logits, twin(ids).logits)
        control = zoo_model("p_rope", frequency_fraction=0.5)
        control.load_state_dict(model.state_dict())
        assert (control(ids).logits - twin(ids).logits).abs().max() > 1e-7


# ----------------------------------------------------------------------------- kernels


def _inputs(model: DecoderLM, q_pos, k_pos, k_valid, past_len) -> AttentionInputs:
    return AttentionInputs(
        cos=None,
        sin=None,
        layout="half",
        score_bias=model.family.score_bias(model, int(k_pos.max()) + 1),
        q_scale=None,
        q_pos=q_pos,
        k_pos=k_pos,
        k_valid=k_valid,
        past_len=past_len,
        scale=0.5,
        want_entropy=False,
    )


@pytest.mark.parametrize("kind", BIAS_FAMILIES)
def test_tiled_and_flex_apply_the_bias_like_the_dense_reference(kind):
    model = zoo_model(kind)
    gen = torch.Generator().manual_seed(1)
    past, length = 5, 4
    valid = torch.ones(2, past + length, dtype=torch.bool)
    valid[0, :2] = False  # left padding in row 0
    k_pos = ((valid.long().cumsum(-1) - 1) * valid).clamp(min=0) * 3 + 20  # spread, shifted
    q, k, v = (
        torch.randn(2, HEADS, x, 8, generator=gen) for x in (length, past + length, past + length)
    )
    inputs = _inputs(model, k_pos[:, past:], k_pos, valid, past)
    with torch.no_grad():
        reference = dense_reference(q, k, v, inputs)
        torch.testing.assert_close(attend_tiled(q, k, v, inputs)[0], reference)
        torch.testing.assert_close(attend_flex(q, k, v, inputs, compiled=False), reference)


@pytest.mark.parametrize("kind", ZOO)
def test_cache_and_left_padding_give_the_rows_alone(kind):
    model = zoo_model(kind, **STRONG.get(kind, {}))
    ids = torch.randint(0, 250, (2, 20))
    with torch.no_grad():
        full = model(ids).logits
        # prefill 12 tokens, then decode the rest one at a time with the cache
        out = model(ids[:, :12], use_cache=True)
        steps = [out.logits]
        for t in range(12, 20):
            out = model(ids[:, t : t + 1], past=out.past, use_cache=True)
            steps.append(out.logits)
        torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-4, rtol=1e-4)
        # row 1 left-padded by 5 equals row 1 alone
        padded = torch.cat((torch.zeros(1, 5, dtype=torch.long), ids[1:, :15]), dim=1)
        mask = torch.cat((torch.zeros(1, 5), torch.ones(1, 15)), dim=1)
        alone = model(ids[1:, :15]).logits
        torch.testing.assert_close(
            model(padded, attention_mask=mask).logits[:, 5:], alone, atol=1e-4, rtol=1e-4
        )


@pytest.mark.parametrize("kind", [*ZOO, "sinusoidal", "learned"])
def test_shift_invariance_exactly_for_the_relative_families(kind):
    model = zoo_model(kind, train_length=16, **STRONG.get(kind, {}))
    if kind == "learned":
        model = zoo_model(kind, train_length=16, max_positions=128, out_of_range="clamp")
    ids = torch.randint(0, 250, (1, 16))
    with torch.no_grad():
        base = model(ids).logits
        shifted = model(ids, position_ids=torch.arange(16) + 40).logits
    if kind in RELATIVE:
        torch.testing.assert_close(shifted, base, atol=1e-4, rtol=1e-4)
    else:  # fire past its threshold, and the absolute families
        assert (shifted - base).abs().max() > 1e-3


@pytest.mark.parametrize("kind", ("t5", "kerple_log", "kerple_power", "fire"))
def test_learnable_bias_parameters_get_gradients(kind):
    model = zoo_model(kind, randomize=False).train()  # FIRE's threshold (L = 16) is then in use
    ids = torch.randint(0, 250, (2, 12))
    model(ids).logits.logsumexp(-1).mean().backward()
    own = [p for n, p in model.named_parameters() if n.startswith(("t5_", "kerple_", "fire_"))]
    assert own and all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in own)


# ----------------------------------------------------------------------------- as the references learn


def _kerple_init(kind: str, heads: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(r1, r2) as the family initialises them for ``heads`` heads under ``seed``."""
    holder = SimpleNamespace(model_cfg=SimpleNamespace(n_heads=heads))
    torch.manual_seed(seed)
    family(kind).init(holder)
    return holder.kerple_r1.detach(), holder.kerple_r2.detach()


def _uniform_on(x: torch.Tensor, high: float) -> bool:
    """Whether n draws look like U(0, high): all in [0, high], the largest above 0.99 high
    (missed with probability 0.99^n) and the mean within 5 standard errors of high / 2."""
    stderr = high / math.sqrt(12 * x.numel())
    return (
        bool((x >= 0).all() and (x <= high).all())
        and float(x.max()) > 0.99 * high
        and abs(float(x.mean()) - high / 2) < 5 * stderr
    )


@pytest.mark.parametrize(
    "kind,r1_high,r2_high", [("kerple_log", 2.0, 1.0), ("kerple_power", 1.0, 2.0)]
)
def test_kerple_initialises_as_its_reference(kind, r1_high, r2_high):
    """chijames/KERPLE ``megatron/mpu/layers.py``: log -bias_p log(1 + bias_a n) draws bias_p
    U(0, 2) then bias_a U(0, 1); power -bias_a n^bias_p draws the exponent bias_p U(0, 2) then the
    multiplier bias_a U(0, 1). r1 is the multiplier, r2 the other. Negative control: the old
    init (r1 U(0, 2), r2 U(0, 1) for both kernels) fails kerple_power's ranges."""
    heads = 4096
    r1, r2 = _kerple_init(kind, heads, seed=3)
    assert _uniform_on(r1, r1_high) and _uniform_on(r2, r2_high)
    # the reference's draws, in its order, under the same seed: bit for bit
    torch.manual_seed(3)
    bias_p, bias_a = torch.rand(heads) * 2, torch.rand(heads)
    reference = (bias_p, bias_a) if kind == "kerple_log" else (bias_a, bias_p)
    assert torch.equal(r1, reference[0]) and torch.equal(r2, reference[1])
    torch.manual_seed(3)
    old = torch.rand(heads) * 2, torch.rand(heads)
    assert (_uniform_on(old[0], r1_high) and _uniform_on(old[1], r2_high)) == (kind == "kerple_log")


def _kerple_reference_bias(kind: str, r1: torch.Tensor, r2: torch.Tensor, size: int):
    """The reference's forward on parameters [H]: their data clamped in place first (bias_p
    and bias_a at 1e-2, the power's exponent at most 2), then the kernel on the causal distances
    (tril: 0 above the diagonal) -> [H, size, size]."""
    with torch.no_grad():
        r1.data = r1.data.clamp(min=1e-2)
        r2.data = r2.data.clamp(min=1e-2, max=2 if kind == "kerple_power" else None)
    diff = torch.tril(torch.arange(size)[:, None] - torch.arange(size)[None, :]).float()
    if kind == "kerple_log":
        return -r1[:, None, None] * torch.log(1 + r2[:, None, None] * diff)
    return -diff.pow(r2[:, None, None]) * r1[:, None, None]


def _our_bias(model: DecoderLM, size: int) -> torch.Tensor:
    """The family's bias of every head at query and key positions 0..size-1 -> [H, size, size]."""
    bias = model.family.score_bias(model, size)
    pos = torch.arange(size)
    head = torch.arange(HEADS)[None, :, None, None]
    return bias(head, pos[None, None, :, None], pos[None, None, None, :])[0]


@pytest.mark.parametrize("kind", ["kerple_log", "kerple_power"])
def test_kerple_parameters_beyond_their_bounds_learn_as_the_reference(kind):
    """A parameter below KERPLE_EPS (or a power exponent above 2) reads as its bound and still
    has a gradient, the reference's (which clamps the data outside autograd); five Adam steps
    follow the reference's parameters. Negative control: the old forward clamp gives that
    parameter no gradient, and it never moves."""
    size, steps = 12, 5
    weights = torch.randn(HEADS, size, size, generator=torch.Generator().manual_seed(2))
    start_r1 = torch.tensor([0.001, 0.5, -0.3, 1.2])  # heads 0 and 2 below the bound
    start_r2 = torch.tensor([0.7, 0.004, 0.3, 2.5 if kind == "kerple_power" else 0.9])
    model = zoo_model(kind, randomize=False).train()
    ref_r1, ref_r2 = (torch.nn.Parameter(t.clone()) for t in (start_r1, start_r2))
    with torch.no_grad():
        model.kerple_r1.copy_(start_r1)
        model.kerple_r2.copy_(start_r2)
    ours_opt = torch.optim.Adam([model.kerple_r1, model.kerple_r2], lr=0.05)
    ref_opt = torch.optim.Adam([ref_r1, ref_r2], lr=0.05)
    for step in range(steps):
        ours, ref = _our_bias(model, size), _kerple_reference_bias(kind, ref_r1, ref_r2, size)
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)  # the clamped values
        (ours * weights).sum().backward()
        (ref * weights).sum().backward()
        if step == 0:
            beyond = [(model.kerple_r1, [0, 2]), (model.kerple_r2, [1])]
            beyond += [(model.kerple_r2, [3])] if kind == "kerple_power" else []
            assert all(bool((p.grad[i].abs() > 1e-6).all()) for p, i in beyond)
        torch.testing.assert_close(model.kerple_r1.grad, ref_r1.grad, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(model.kerple_r2.grad, ref_r2.grad, rtol=1e-5, atol=1e-6)
        ours_opt.step(), ref_opt.step()
        ours_opt.zero_grad(), ref_opt.zero_grad()
    # the same stored parameters (each clamped before its update, then updated)
    torch.testing.assert_close(model.kerple_r1.detach(), ref_r1.detach())
    torch.testing.assert_close(model.kerple_r2.detach(), ref_r2.detach())
    assert float(ref_r1[0]) != pytest.approx(KERPLE_EPS)  # it moved off the bound
    # control: the old forward clamp (x.clamp(min=eps)) cuts the gradient of head 0's r1
    old_r1 = torch.nn.Parameter(start_r1.clone())
    n = torch.arange(1, size).float()
    bias = -old_r1.clamp(min=KERPLE_EPS)[:, None] * torch.log1p(0.5 * n)
    (bias * weights[:, 0, 1:]).sum().backward()
    assert float(old_r1.grad[0]) == 0.0 and float(old_r1.grad[2]) == 0.0


def _identity_fire(train_length: int) -> DecoderLM:
    """A FIRE model whose MLP passes x = psi(n) / psi(max(L_thr, i)) through to every head."""
    model = zoo_model("fire", train_length=train_length, randomize=False)
    with torch.no_grad():
        for name in ("fire_w1", "fire_b1", "fire_w2", "fire_b2"):
            getattr(model, name).zero_()
        model.fire_w1[0] = 1.0
        model.fire_w2[:, 0] = 1.0
    return model


def _threshold_after_adam(fit_threshold, steps: int = 800) -> float:
    """Adam (lr 1e-3) on ``fit_threshold`` 's parameter for ``steps`` updates; the threshold
    it ends at (``fit_threshold() -> (loss, parameter, threshold)``)."""
    _, param, _ = fit_threshold()
    opt = torch.optim.Adam([param], lr=1e-3)
    for _ in range(steps):
        loss, _, _ = fit_threshold()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(fit_threshold()[2].detach())


def test_fire_threshold_learns_at_the_scale_of_the_training_length():
    """FIRE's reference (Li et al. 2024, appendix) learns L_thr = |L_multiplier| init_L, so Adam
    (steps of about lr) moves it by about lr L per update. Toy objective: the normalised
    distances of a threshold L / 4 (float64, from the formula) over positions 0..L-1; 800 updates
    at lr 1e-3 move L_thr from L down by more than L / 2. Negative control: the old parametrisation,
    a raw L_thr (the same function with L_0 = 1 and the parameter starting at L), moves by less
    than 2 positions."""
    length = 64
    model = _identity_fire(length)
    for name, param in model.named_parameters():
        param.requires_grad_(name == "fire_l_multiplier")
    c = model.fire_c.item()
    pos = torch.arange(length, dtype=torch.float64)
    n = (pos[:, None] - pos[None, :]).clamp(min=0)
    target = (torch.log1p(c * n) / torch.log1p(c * pos.clamp(min=length / 4)[:, None])).float()
    causal = torch.ones(length, length).tril().bool()

    def ours():
        loss = ((_our_bias(model, length) - target)[:, causal] ** 2).mean()
        return loss, model.fire_l_multiplier, model.fire_l_multiplier.abs() * length

    assert float(ours()[2].detach()) == length  # the paper's init: L_thr = L
    assert length - _threshold_after_adam(ours) > length / 2

    # control: the old raw threshold, through the same bias function (L_0 = 1)
    raw = torch.nn.Parameter(torch.tensor(float(length)))
    bias = model.family.score_bias(model, length)
    args = list(bias.args)
    multiplier_at = next(i for i, a in enumerate(args) if a is model.fire_l_multiplier)
    args[multiplier_at], args[multiplier_at + 1] = raw, 1.0
    pos_i = torch.arange(length)
    head = torch.arange(HEADS)[None, :, None, None]

    def old():
        values = bias.fn(head, pos_i[None, None, :, None], pos_i[None, None, None, :], *args)[0]
        return ((values - target)[:, causal] ** 2).mean(), raw, raw.abs()

    assert length - _threshold_after_adam(old) < 2.0  # about lr per update: 0.8


def test_a_raw_threshold_fire_checkpoint_loads_as_its_multiplier():
    """A state dict of the old FIRE (a raw ``fire_threshold`` L_thr) loads as m = L_thr / L_0 and
    gives the old bias, L_thr = 40 with L_0 = 16. Negative control: the raw value taken as the
    multiplier (L_thr = 640) gives another bias."""
    model = zoo_model("fire", train_length=16)
    state = {k: v for k, v in model.state_dict().items() if k != "fire_l_multiplier"}
    old = zoo_model("fire", train_length=16)
    old.load_state_dict({**state, "fire_threshold": torch.tensor(40.0)})
    assert float(old.fire_l_multiplier) == pytest.approx(40.0 / 16)
    with torch.no_grad():
        model.fire_l_multiplier.fill_(2.5)
    assert bias_at(old, 1, 30, 20) == pytest.approx(bias_at(model, 1, 30, 20), abs=1e-6)
    with torch.no_grad():
        model.fire_l_multiplier.fill_(40.0)
    assert bias_at(old, 1, 30, 20) != pytest.approx(bias_at(model, 1, 30, 20), abs=1e-4)


# ----------------------------------------------------------------------------- config


def test_position_params_scalings_and_checkpoint_key_fields():
    from bench.core.checks import weights_dict

    assert PositionConfig(kind="t5").params() == {"num_buckets": 32, "max_distance": 128}
    assert PositionConfig(kind="sandwich").params() == {}
    assert set(PositionConfig(kind="p_rope").params()) == {"base", "layout", "frequency_fraction"}
    # a zoo field enters the checkpoint key only where its family reads it
    assert "num_buckets" in weights_dict(PositionConfig(kind="t5"))
    assert "num_buckets" not in weights_dict(PositionConfig(kind="rope"))
    assert "frequency_fraction" not in weights_dict(PositionConfig(kind="t5"))
    for kind in BIAS_FAMILIES:  # StreamingLLM's window moves a bias's pairs (models.scaling)
        assert applicable_methods(kind) == ("default", "linear", "streaming")
    assert applicable_methods("p_rope") == applicable_methods("rope")


@pytest.mark.parametrize("kind", BIAS_FAMILIES)
def test_position_interpolation_divides_the_distance(kind):
    model = zoo_model(kind, train_length=16)
    raw = bias_at(model, 1, 40, 8)
    pi = ScalingConfig(name="linear", method="linear", params={"factor": 4.0})
    with model.scaled(pi):  # positions 40 and 8 read as 10 and 2
        assert bias_at(model, 1, 40, 8) == pytest.approx(bias_at(zoo_model(kind, 16), 1, 10, 2))
    assert raw != pytest.approx(bias_at(model, 1, 10, 2), abs=1e-5)  # control: unscaled differs


def test_bad_zoo_fields_are_one_sentence():
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=HEADS)
    for fields, message in [
        ({"kind": "t5", "num_buckets": 1}, "num_buckets must be >= 2"),
        ({"kind": "t5", "max_distance": 8}, "max_distance must be greater than"),
        ({"kind": "p_rope", "frequency_fraction": 1.5}, "frequency_fraction must be in"),
        ({"kind": "p_rope", "rotary_fraction": 0.5}, "rotary_fraction=0.5 means nothing for"),
        ({"kind": "fire", "fire_c": 0.0}, "fire_c must be > 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            DecoderLM(cfg, PositionConfig(**fields), 16)


# ----------------------------------------------------------------------------- every metric


@pytest.mark.parametrize("kind", ZOO)
def test_every_metric_lands_rows_for_every_zoo_family(kind, random_docs):
    """All registered metrics (passkey and every probe included) run on each family at 1x and 2x
    its training length, raw and with position interpolation, and give finite values."""
    from bench.eval.evaluate import evaluate_model
    from bench.eval.metrics import METRICS, as_eval_config

    model = zoo_model(kind, train_length=64, randomize=False)
    cfg = as_eval_config(
        {
            "lengths": ["1x", "2x"],
            "batch_size": 4,
            "nll": {"max_docs": 2, "bootstrap": 0},
            "passkey": {"depths": [0.5], "trials": 1, "template": "short", "lengths": [128]},
            "shift_dnll": {"max_docs": 1, "bootstrap": 0, "deltas": ["1x"]},
            "order_dnll": {"max_docs": 1, "bootstrap": 0},
            "context_nll": {"max_docs": 1},
            "attn_entropy": {"max_docs": 1},
            "position_probe_r2": {"fit_docs": 2, "test_docs": 1},
        }
    ).resolve(64)
    docs = random_docs([300, 300, 300])
    pi = ScalingConfig(name="linear", method="linear", params={"factor": "auto"})
    for scaling in (None, pi):
        rows = evaluate_model(model, cfg, docs, train_length=64, scaling=scaling, progress=False)
        metrics = {r["metric"] for r in rows}
        for name, section in cfg.metrics.items():
            if section.enabled:
                assert any(m.startswith(name.split("_r2")[0]) for m in metrics), (name, metrics)
        assert all(math.isfinite(r["value"]) for r in rows if isinstance(r["value"], float))
    assert set(cfg.metrics) == set(METRICS)
