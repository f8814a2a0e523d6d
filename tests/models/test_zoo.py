"""The zoo's position families (models/zoo.py) against independent evaluations of their formulas.

Each bias equals its oracle on random inputs with a perturbed-parameter control; every family
works with the KV cache and left padding, is shift invariant exactly when it is relative, and has
its gradients; p-RoPE reduces to RoPE and NoPE at its ends and differs from NeoX partial rotary.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from models.attention import AttentionInputs, _attend_tiled, attend_flex
from models.positions import PositionConfig
from models.scaling import applicable_methods, default_inv_freq
from models.transformer import DecoderLM, ModelConfig, ScalingConfig
from models.zoo import KERPLE_EPS, sandwich_table, t5_bucket

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
    c, threshold = model.fire_c.item(), model.fire_threshold.item()
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
        torch.testing.assert_close(_attend_tiled(q, k, v, inputs)[0], reference)
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


# ----------------------------------------------------------------------------- config


def test_position_params_scalings_and_checkpoint_key_fields():
    from bench.checks import weights_dict

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
        ({"kind": "p_rope", "rotary_fraction": 0.5}, "rotary_fraction must stay 1.0"),
        ({"kind": "fire", "fire_c": 0.0}, "fire_c must be > 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            DecoderLM(cfg, PositionConfig(**fields), 16)


# ----------------------------------------------------------------------------- every metric


@pytest.mark.parametrize("kind", ZOO)
def test_every_metric_lands_rows_for_every_zoo_family(kind, random_docs):
    """All registered metrics (passkey and every probe included) run on each family at 1x and 2x
    its training length, raw and with position interpolation, and give finite values."""
    from bench.evaluate import evaluate_model
    from bench.metrics import METRICS, as_eval_config

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
