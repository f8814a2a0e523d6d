"""Probes on hand-built models whose answer is known, each with a negative control."""

import logging
import math
import re

import numpy as np
import pytest
import torch

from bench.eval.metrics.context import (
    EvalContext,
    bootstrap_ratio_ci,
    bucket_edges,
    bucket_index,
    select_documents,
)
from bench.eval.metrics.probes import (
    attn_entropy_rows,
    context_nll_rows,
    order_dnll_rows,
    shift_dnll_rows,
    shuffle_far_context,
)
from bench.eval.metrics.probes_position import (
    position_probe_rows,
    r2_score,
    ridge_fit,
    ridge_predict,
)
from models.transformer import ModelConfig

TINY = ModelConfig(n_layers=2, d_model=32, n_heads=4)
TRAIN = 32


pytestmark = pytest.mark.usefixtures("one_thread")


def ctx_of(model):
    return EvalContext(model, progress=False, batch_size=4)


def values(rows, key="axis_value"):
    return {r[key]: r["value"] for r in rows}


# ---------------------------------------------------------------- primitives


def test_bucket_edges_powers_of_two_plus_train_length():
    assert bucket_edges(None, 100, 48).tolist() == [0, 1, 2, 4, 8, 16, 32, 48, 64, 100]
    assert bucket_edges([10, 0, 500], 64, 32).tolist() == [0, 10, 64]
    index = bucket_index(np.array([0, 1, 2, 4]), 4)
    assert index.tolist() == [0, 1, 2, 2]


def test_select_documents_spreads_and_counts(random_docs):
    docs = random_docs([5, 50, 50, 50, 50, 5, 50])
    selected, eligible = select_documents(docs, 50, 2)
    assert eligible == 5
    assert [d.id for d in selected] == ["doc1", "doc3"]
    assert len(select_documents(docs, 51, 3)[0]) == 0


def test_bootstrap_ci_contains_mean_and_is_degenerate_for_one_doc():
    rng = np.random.default_rng(0)
    sums = rng.normal(5, 1, size=(20, 3)) * 10
    counts = np.full((20, 3), 10.0)
    lo, hi = bootstrap_ratio_ci(sums, counts, 500, 0.95, np.random.default_rng(1))
    mean = sums.sum(0) / counts.sum(0)
    assert np.all(lo < mean) and np.all(mean < hi)
    expected_width = 2 * 1.96 * (sums / counts).std(axis=0) / math.sqrt(20)  # normal approximation
    np.testing.assert_allclose(hi - lo, expected_width, rtol=0.3)
    lo1, hi1 = bootstrap_ratio_ci(sums[:1], counts[:1], 100, 0.95, np.random.default_rng(1))
    np.testing.assert_allclose(lo1, mean * 0 + sums[0] / counts[0])
    np.testing.assert_allclose(hi1, lo1)


def test_ridge_recovers_a_linear_map_and_r2_matches_hand_computation():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 5))
    y = x @ np.array([1.0, -2.0, 0.5, 0.0, 3.0]) + 7.0
    probe = ridge_fit(x, y, 1e-9)
    np.testing.assert_allclose(ridge_predict(probe, x), y, atol=1e-5)
    assert r2_score(y, ridge_predict(probe, x)) == pytest.approx(1.0, abs=1e-9)
    # hand computation: y = [1, 2, 3], prediction [1, 2, 2] -> 1 - 1 / 2
    assert r2_score(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 2.0])) == pytest.approx(0.5)
    # negative control: unrelated targets give R^2 near or below 0 out of sample
    noise_probe = ridge_fit(x[:100], rng.normal(size=100), 1e-3)
    assert r2_score(rng.normal(size=100), ridge_predict(noise_probe, x[100:])) < 0.2


def test_shuffle_far_context_permutes_only_far_blocks():
    window = torch.arange(100)
    out = shuffle_far_context(window, 64, 16, np.random.default_rng(0))
    assert torch.equal(out[64:], window[64:])
    assert not torch.equal(out[:64], window[:64])
    assert sorted(out[:64].tolist()) == list(range(64))
    blocks = {tuple(out[i : i + 16].tolist()) for i in range(0, 64, 16)}
    assert blocks == {tuple(range(i, i + 16)) for i in range(0, 64, 16)}  # whole blocks moved
    # two blocks: the permutation is never the identity, whatever the seed
    for seed in range(5):
        two = shuffle_far_context(window, 32, 16, np.random.default_rng(seed))
        assert torch.equal(two[:32], torch.cat([window[16:32], window[:16]]))


# ---------------------------------------------------------------- shift_dnll


def test_shift_dnll_is_zero_for_a_constant_position_table(tiny_model, random_docs):
    model = tiny_model("learned", max_positions=16 * TRAIN + TRAIN)
    with torch.no_grad():
        model.pos_table.copy_(model.pos_table[:1].expand_as(model.pos_table))
    rows = shift_dnll_rows(
        ctx_of(model), random_docs([40] * 3), TRAIN, [1, TRAIN, 16 * TRAIN], max_docs=3
    )
    assert len(rows) == 3
    assert all(r["value"] == 0.0 and r["n"] == 3 * TRAIN for r in rows)
    assert all(r["axis"] == "delta" for r in rows)


def test_shift_dnll_negative_control_learned_and_sinusoidal_move(tiny_model, random_docs):
    for model in (tiny_model("learned", max_positions=4 * TRAIN), tiny_model("sinusoidal")):
        rows = shift_dnll_rows(
            ctx_of(model), random_docs([40] * 3), TRAIN, [TRAIN, 2 * TRAIN], max_docs=3
        )
        assert all(abs(r["value"]) > 1e-3 for r in rows), rows


@pytest.mark.parametrize("kind", ["rope", "alibi", "nope"])
def test_shift_dnll_is_flat_for_relative_encodings(kind, tiny_model, random_docs):
    model = tiny_model(kind)
    rows = shift_dnll_rows(
        ctx_of(model),
        random_docs([40] * 3),
        TRAIN,
        [1, 4 * TRAIN, 16 * TRAIN],
        max_docs=3,
        bootstrap=50,
    )
    assert len(rows) == 3
    assert max(abs(r["value"]) for r in rows) < 1e-4


def test_shift_dnll_skips_deltas_outside_a_learned_table(caplog, tiny_model, random_docs):
    model = tiny_model("learned", max_positions=3 * TRAIN)
    with caplog.at_level(logging.WARNING, logger="bench.eval.metrics.probes"):
        rows = shift_dnll_rows(
            ctx_of(model), random_docs([40] * 2), TRAIN, [TRAIN, 2 * TRAIN + 1], max_docs=2
        )
    assert list(values(rows)) == [TRAIN]
    assert "delta=65" in caplog.text and "learned table" in caplog.text


# ---------------------------------------------------------------- context-free models


def context_free(model):
    with torch.no_grad():
        for block in model.blocks:
            block.attn.o_proj.weight.zero_()
    return model


def test_context_nll_flat_and_order_dnll_zero_without_attention(tiny_model, random_docs):
    model = context_free(tiny_model("rope"))
    docs = random_docs([200] * 3)
    ctx = ctx_of(model)
    ctx_rows = context_nll_rows(ctx, docs, 128, None, block=16, max_docs=3, bootstrap=50)
    cs = [r["axis_value"] for r in ctx_rows]
    assert cs == [0, 1, 2, 4, 8, 16, 32, 64, 112]
    assert all(r["axis"] == "context" and r["n"] == 3 * 16 for r in ctx_rows)
    nlls = [r["value"] for r in ctx_rows]
    assert max(nlls) - min(nlls) < 1e-6
    order = order_dnll_rows(ctx, docs, 128, None, block=16, max_docs=3)
    assert [r["axis_value"] for r in order] == [0, 16, 32, 64]
    assert all(abs(r["value"]) < 1e-6 and r["axis"] == "distance" for r in order)


def test_negative_control_context_matters_with_attention(tiny_model, random_docs):
    model = tiny_model("rope")
    docs = random_docs([200] * 3)
    ctx = ctx_of(model)
    nlls = [r["value"] for r in context_nll_rows(ctx, docs, 128, [0, 112], block=16, max_docs=3)]
    assert abs(nlls[0] - nlls[1]) > 1e-3
    order = order_dnll_rows(ctx, docs, 128, [0], block=16, max_docs=3)
    assert abs(order[0]["value"]) > 1e-4


# ---------------------------------------------------------------- attention entropy


def test_uniform_attention_entropy_is_log_number_of_keys(tiny_model, random_docs):
    model = tiny_model("rope")
    with torch.no_grad():
        for block in model.blocks:
            block.attn.q_proj.weight.zero_()  # every logit 0 -> uniform over the causal keys
    length = 64
    rows = attn_entropy_rows(
        ctx_of(model), random_docs([70] * 2), length, TRAIN, edges=None, max_docs=2
    )
    edges = bucket_edges(None, length, TRAIN)
    assert len(rows) == TINY.n_layers * (len(edges) - 1)
    for r in rows:
        expected = np.mean(np.log(np.arange(r["bucket_lo"], r["bucket_hi"]) + 1.0))
        assert r["value"] == pytest.approx(expected, abs=1e-5)
        assert r["n"] == 2 * (r["bucket_hi"] - r["bucket_lo"])
    assert {r["layer"] for r in rows} == {0, 1}
    # negative control: learned attention is not uniform
    sharp = attn_entropy_rows(
        ctx_of(tiny_model("rope")), random_docs([70] * 2), length, TRAIN, edges=None, max_docs=2
    )
    last = [r for r in sharp if r["bucket_lo"] == 32]
    assert all(r["value"] < math.log(48) - 0.05 for r in last)


# ---------------------------------------------------------------- position probe


def test_position_probe_reads_sinusoidal_embeddings_but_not_nope(tiny_model, random_docs):
    docs = random_docs([128] * 4)
    kwargs = dict(layer=0, fit_docs=2, test_docs=2, positions_per_doc=64, ridge=1e-3)
    sin_rows = position_probe_rows(
        ctx_of(tiny_model("sinusoidal")), docs, 4 * TRAIN, TRAIN, **kwargs
    )
    r2 = values(sin_rows)
    assert set(r2) == {"inside", "beyond"}
    assert r2["inside"] > 0.95, r2
    assert all(r["axis"] == "region" and r["layer"] == 0 for r in sin_rows)
    nope_r2 = values(
        position_probe_rows(ctx_of(tiny_model("nope")), docs, 4 * TRAIN, TRAIN, **kwargs)
    )
    assert nope_r2["inside"] < 0.3, nope_r2


def test_position_probe_has_no_beyond_row_at_the_training_length(tiny_model, random_docs):
    rows = position_probe_rows(
        ctx_of(tiny_model("rope")),
        random_docs([40] * 4),
        TRAIN,
        TRAIN,
        layer=None,
        fit_docs=2,
        test_docs=2,
        positions_per_doc=16,
        ridge=1e-3,
    )
    assert [r["axis_value"] for r in rows] == ["inside"]
    assert rows[0]["layer"] == TINY.n_layers // 2
    with pytest.raises(ValueError, match="layer 9"):
        position_probe_rows(
            ctx_of(tiny_model("rope")),
            random_docs([40] * 4),
            TRAIN,
            TRAIN,
            layer=9,
            fit_docs=2,
            test_docs=2,
            positions_per_doc=16,
            ridge=1e-3,
        )


# ---------------------------------------------------------------- context_nll: one length rule (issue 11, item 4)


def periodic_docs(n_docs: int, period: int, length: int) -> list:
    """Random documents that repeat every ``period`` tokens: the tokens ending at eval length L
    and at L + k * period are the same, so context_nll reads identical inputs at both."""
    from bench.data.corpora import Document

    rng = np.random.default_rng(7)
    return [
        Document(f"doc{i}", np.resize(rng.integers(0, 256, size=period), length).astype(np.int16))
        for i in range(n_docs)
    ]


def context_curves(model, docs, scaling):
    from bench.eval.evaluate import evaluate_model
    from bench.eval.metrics import METRICS

    cfg = {name: {"enabled": False} for name in METRICS}
    cfg["context_nll"] = {"max_docs": 2, "block": 16, "contexts": [0, 16, 48], "bootstrap": 0}
    cfg["lengths"] = [2 * TRAIN, 4 * TRAIN]
    rows = evaluate_model(model, cfg, docs, train_length=TRAIN, scaling=scaling, progress=False)
    return {(r["eval_length"], r["axis_value"]): r["value"] for r in rows}


@pytest.mark.parametrize(
    "method, params, logn",
    [
        ("ntk", {"alpha": "auto"}, False),
        ("linear", {"factor": "auto"}, False),
        ("yarn", {"factor": "auto"}, False),
        ("longrope", {"short_factor": 1.0, "long_factor": "ramp", "factor": "auto"}, False),
        ("dynamic", {"factor": 1.0}, False),
        ("default", {}, True),
    ],
)
def test_context_nll_curve_does_not_depend_on_the_eval_length(tiny_model, method, params, logn):
    """Same c, same tokens read: the same NLL at eval length 2x and 4x, for a static method (its
    run factor) as for a length-dependent one (the c + block tokens it reads)."""
    from models.scaling_config import ScalingConfig

    model = tiny_model("rope")
    docs = periodic_docs(2, TRAIN, 300)
    scaling = ScalingConfig(name=method, method=method, params=params, logn=logn)
    curves = context_curves(model, docs, scaling)
    for c in (0, 16, 48):
        assert curves[(2 * TRAIN, c)] == pytest.approx(curves[(4 * TRAIN, c)], rel=1e-6, abs=1e-7)
    if params.get("alpha") == "auto" or params.get("factor") == "auto":
        # negative control: a factor per eval length (the oracle) moves the same curve
        oracle = context_curves(
            model, docs, ScalingConfig(method=method, params=params, oracle=True)
        )
        assert all(
            oracle[(2 * TRAIN, c)] != pytest.approx(oracle[(4 * TRAIN, c)], rel=1e-5)
            for c in (0, 16, 48)
        )


def test_a_grid_that_measures_nothing_at_a_length_it_runs_is_refused():
    """The audit's cases: context_nll contexts all above L - block (once numpy's 'need at least
    one array to stack' after training), shift_dnll deltas of 0 only and order_dnll distances
    beyond what shuffles two blocks (once zero rows, exit 0). Each is one sentence when the
    section resolves; controls: the same sections with a grid that fits resolve."""
    from bench.eval.metrics.probes import ContextNllConfig, OrderDnllConfig, ShiftDnllConfig

    lengths = [64, 128]
    bad = [
        (ContextNllConfig(contexts=[500, 1000], lengths=["2x"]), "no context of at most 96 tokens"),
        (ShiftDnllConfig(deltas=[0]), "has no offset above 0"),
        (OrderDnllConfig(distances=[500], lengths=["2x"]), "at eval length 128 (at most 32)"),
    ]
    for section, words in bad:
        with pytest.raises(ValueError, match=re.escape(words)):
            section.resolve(64, lengths)
    assert ContextNllConfig(contexts=[0, 64], lengths=["2x"]).resolve(64, lengths).contexts == [
        0,
        64,
    ]
    assert ShiftDnllConfig(deltas=[0, 16]).resolve(64, lengths).deltas == [0, 16]
    assert OrderDnllConfig(distances=[0, 32], lengths=["2x"]).resolve(64, lengths).lengths == [128]
    # disabled, or auto grids: nothing to check
    ContextNllConfig(enabled=False, contexts=[500]).resolve(64, lengths)
    ContextNllConfig(lengths=["2x"]).resolve(64, lengths)


def test_the_position_probe_needs_two_positions_per_region():
    from bench.eval.metrics.probes_position import PositionProbeConfig

    with pytest.raises(ValueError, match="positions_per_doc must be an integer >= 2, got 1"):
        PositionProbeConfig(positions_per_doc=1)
    assert PositionProbeConfig(positions_per_doc=2).positions_per_doc == 2  # control
