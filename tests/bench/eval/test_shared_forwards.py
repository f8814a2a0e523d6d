"""Forward passes shared by the metrics of one eval length (``EvalContext.reuse_forwards``).

Each test compares two code paths on the same small random model: the shared path must give the
same rows as running every metric's windows itself, while running fewer forward passes; each
has a negative control (outside the block nothing is shared, other position ids or tokens are
not served from the memo).
"""

import contextlib
import dataclasses
import math

import numpy as np
import pytest
import torch

from bench.eval.evaluate import evaluate_model
from bench.eval.metrics import METRICS, EvalContext
from bench.eval.metrics.context import first_windows
from models.transformer import DecoderLM, ScalingConfig

TRAIN = 32
LENGTHS = [32, 64, 128]

#: every metric at every length, small: the nll docs (8) contain every probe's documents
EVERY_METRIC = {
    "lengths": LENGTHS,
    "batch_size": 4,
    "nll": {"lengths": None, "max_docs": 8, "bootstrap": 50},
    "passkey": {"enabled": False},
    "shift_dnll": {"lengths": None, "deltas": [8, "1x"], "max_docs": 2, "bootstrap": 50},
    "order_dnll": {"lengths": None, "block": 4, "max_docs": 2, "bootstrap": 50},
    "context_nll": {"lengths": None, "block": 4, "max_docs": 2, "bootstrap": 50},
    "attn_entropy": {"lengths": None, "max_docs": 1},
    "position_probe_r2": {"lengths": None, "fit_docs": 2, "test_docs": 2, "positions_per_doc": 16},
}

pytestmark = pytest.mark.usefixtures("one_thread")


class Counter:
    """Wraps a model's forward: (rows, width, position ids given, hidden states asked) per call."""

    def __init__(self, model):
        self.calls: list[tuple[int, int, bool, bool]] = []
        self.forward = model.forward
        model.forward = self

    def __call__(self, input_ids, *args, **kwargs):
        self.calls.append(
            (
                input_ids.shape[0],
                input_ids.shape[1],
                kwargs.get("position_ids") is not None,
                bool(kwargs.get("output_hidden_states")),
            )
        )
        return self.forward(input_ids, *args, **kwargs)

    def tokens(self) -> int:
        return sum(rows * width for rows, width, _, _ in self.calls)


@contextlib.contextmanager
def no_reuse():
    """Every metric runs its own windows: reuse_forwards as an empty block, no prepare hooks."""

    @contextlib.contextmanager
    def plain(self):
        yield self

    saved = dict(METRICS)
    original = EvalContext.reuse_forwards
    EvalContext.reuse_forwards = plain
    for name, metric in saved.items():
        METRICS[name] = dataclasses.replace(metric, prepare=None)
    try:
        yield
    finally:
        EvalContext.reuse_forwards = original
        METRICS.update(saved)


def by_key(rows):
    keys = ("metric", "eval_length", "bucket_lo", "bucket_hi", "axis", "axis_value", "layer")
    return {tuple(r.get(k) for k in keys): r for r in rows}


def assert_same_rows(shared, separate, rel=1e-6):
    a, b = by_key(shared), by_key(separate)
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].keys() == b[key].keys(), key
        for field in ("value", "n", "ci_lo", "ci_hi"):
            x, y = a[key].get(field), b[key].get(field)
            if x is None or (isinstance(x, float) and math.isnan(x)):
                assert y is None or math.isnan(y), (key, field)
            else:
                assert x == pytest.approx(y, rel=rel, abs=1e-9), (key, field, x, y)


def run(model, docs, cfg=EVERY_METRIC, scaling=None):
    return evaluate_model(
        model, cfg, docs, train_length=TRAIN, scaling=scaling, progress=False, seed=1
    )


@pytest.mark.parametrize(
    "kind, scaling",
    [
        ("rope", None),
        ("rope", ScalingConfig(method="dynamic", params={"factor": "auto"})),  # per-length rows
        ("rope", ScalingConfig(method="yarn", params={"factor": "auto"}, oracle=True)),
        ("alibi", None),  # the tiled attention path
        ("sinusoidal", None),
    ],
)
def test_shared_forward_passes_give_the_same_rows(tiny_model, random_docs, kind, scaling):
    docs = random_docs([LENGTHS[-1] + 1 + 3 * i for i in range(8)])
    model = tiny_model(kind)
    shared_count = Counter(model)
    shared = run(model, docs, scaling=scaling)
    shared_tokens = shared_count.tokens()
    model.forward = shared_count.forward
    with no_reuse():
        separate_count = Counter(model)
        separate = run(model, docs, scaling=scaling)
    assert_same_rows(shared, separate)
    # not run again: per length, the shift and order base and the whole-window context (2
    # documents each, L input tokens) and the probe's 4 windows (L tokens), all nll windows
    saved = sum((2 + 2 + 2 + 4) * length for length in LENGTHS)
    assert separate_count.tokens() - shared_tokens == saved
    # the hidden states came from nll passes of the probe's 4 windows alone (kept apart from the
    # other nll windows, so that only they hold every layer's output), not from probe passes
    hidden = [(rows, width) for rows, width, _, asked in shared_count.calls if asked]
    assert {width for _, width in hidden} == set(LENGTHS)
    assert sum(rows for rows, _ in hidden) == 4 * len(LENGTHS)
    assert len(shared_count.calls) > len(hidden) > len(LENGTHS)  # mixed batches were split
    hidden = [(rows, width) for rows, width, _, asked in separate_count.calls if asked]
    assert hidden == [(2, length) for length in LENGTHS for _ in range(2)]  # negative control


def test_probe_alone_and_nll_alone_are_unchanged(tiny_model, random_docs):
    """A metric that has nothing to share with runs its own windows, as before."""
    docs = random_docs([LENGTHS[-1] + 1] * 8)
    model = tiny_model()
    probe_only = {name: {"enabled": False} for name in METRICS}
    probe_only.update(lengths=[64], position_probe_r2=EVERY_METRIC["position_probe_r2"])
    count = Counter(model)
    rows = run(model, docs, probe_only)
    assert {r["metric"] for r in rows} == {"position_probe_r2"}
    assert [hidden for *_, hidden in count.calls] == [True, True]  # fit docs, then test docs
    model.forward = count.forward
    with no_reuse():
        assert_same_rows(rows, run(model, docs, probe_only))


def test_memo_serves_only_inside_the_block(tiny_model, random_docs):
    model = tiny_model()
    ctx = EvalContext(model, progress=False, batch_size=4)
    windows = first_windows(random_docs([65] * 3), 65)
    count = Counter(model)
    first = ctx.window_nll(windows)
    again = ctx.window_nll(windows)
    assert len(count.calls) == 2  # outside reuse_forwards: every window runs
    assert torch.equal(first, again)
    with ctx.reuse_forwards():
        inside = ctx.window_nll(windows)
        assert len(count.calls) == 3
        assert torch.equal(ctx.window_nll(windows[1:], score_from=10), inside[1:, 10:])
        assert len(count.calls) == 3  # served from the memo
        # negative controls: other position ids, other tokens, not remembered
        ctx.window_nll(windows, position_offset=5)
        assert len(count.calls) == 4 and count.calls[-1][2]
        changed = windows.clone()
        changed[0, 0] += 1
        ctx.window_nll(changed[:1], remember=False)
        ctx.window_nll(changed[:1])
        assert len(count.calls) == 6
        with ctx.reuse_forwards():  # nested: the same memo
            ctx.window_nll(windows)
        assert len(count.calls) == 6
        assert all(row.dim() == 1 and row.numel() == 64 for row in ctx._memo.values())  # O(L)
    assert torch.equal(inside, first)
    ctx.window_nll(windows)
    assert len(count.calls) == 7  # the memo ended with the block


def test_hidden_states_kept_from_an_nll_pass_equal_a_fresh_pass(tiny_model, random_docs):
    model = tiny_model()
    ctx = EvalContext(model, progress=False, batch_size=4)
    windows = first_windows(random_docs([65] * 3), 65)  # [3, L + 1]; inputs [3, L]
    positions = np.array([0, 5, 31, 40, 63])
    layer = 1
    fresh = model(windows[:, :-1], output_hidden_states=True).hidden_states[layer][:, positions]
    with ctx.reuse_forwards():
        ctx.want_hidden(windows[:2, :-1], layer, positions[::-1])  # any order
        count = Counter(model)
        ctx.window_nll(windows)
        # the two announced windows run apart from the third, which keeps no hidden states
        assert count.calls == [(2, 64, False, True), (1, 64, False, False)]
        kept = ctx.hidden_at(windows[:, :-1], layer, positions)  # the third is not kept
        assert len(count.calls) == 3 and count.calls[-1][0] == 1
        assert torch.allclose(kept, fresh, rtol=1e-5, atol=1e-6)
        subset = ctx.hidden_at(windows[:2, :-1], layer, positions[1:3])
        assert len(count.calls) == 3
        assert torch.equal(subset, kept[:2, 1:3])
        # negative control: a position that was not kept runs the window again
        ctx.hidden_at(windows[:1, :-1], layer, np.array([7]))
        assert len(count.calls) == 4
    ctx.want_hidden(windows[:, :-1], layer, positions)  # outside a block: nothing is kept
    ctx.window_nll(windows)
    assert count.calls[-1][3] is False


def test_prepare_runs_before_every_metric_of_the_length(tiny_model, random_docs, monkeypatch):
    order = []
    for name in ("nll", "position_probe_r2"):
        metric = METRICS[name]

        def fn(*args, _fn=metric.fn, _name=name, **kwargs):
            order.append((_name, args[3]))
            return _fn(*args, **kwargs)

        changes = {"fn": fn}
        if metric.prepare is not None:

            def prepare(*args, _prepare=metric.prepare, **kwargs):
                order.append(("prepare", args[3]))
                return _prepare(*args, **kwargs)

            changes["prepare"] = prepare
        monkeypatch.setitem(METRICS, name, dataclasses.replace(metric, **changes))
    cfg = {name: {"enabled": False} for name in METRICS}
    cfg.update(
        lengths=[32, 64],
        nll={"max_docs": 4, "bootstrap": 0},
        position_probe_r2=EVERY_METRIC["position_probe_r2"],
    )
    run(tiny_model(), random_docs([65] * 4), cfg)
    assert order == [
        ("prepare", 32),
        ("nll", 32),
        ("position_probe_r2", 32),
        ("prepare", 64),
        ("nll", 64),
        ("position_probe_r2", 64),
    ]


class WithoutLogitsFrom(DecoderLM):
    """The same model behind a forward that takes no ``logits_from``: the context then slices the
    full pass's logits (what it does for any model that cannot skip the work)."""

    def forward(
        self,
        input_ids,
        position_ids=None,
        attention_mask=None,
        past=None,
        use_cache=False,
        output_hidden_states=False,
        output_attn_entropy=False,
    ):
        return super().forward(
            input_ids,
            position_ids,
            attention_mask,
            past,
            use_cache,
            output_hidden_states,
            output_attn_entropy,
        )


SLIDING_NLL = {
    "protocol": "sliding",
    "stride": 24,
    "max_windows": 3,
    "max_docs": 4,
    "bootstrap": 50,
}


@pytest.mark.parametrize(
    ("kind", "nll"),
    [("rope", None), ("alibi", None), ("rope", SLIDING_NLL)],
    ids=["rope", "alibi", "rope-sliding"],
)
def test_suffix_only_passes_give_the_same_rows(tiny_model, random_docs, kind, nll):
    # order_dnll's shuffled variants, context_nll's shorter contexts, passkey's answer and sliding
    # windows after the first score a suffix: the model computes only its logits (and skips the
    # rest of its last layer)
    cfg = dict(
        EVERY_METRIC, passkey={"lengths": [128], "depths": 2, "trials": 2, "template": "short"}
    )
    if nll is not None:
        cfg["nll"] = dict(EVERY_METRIC["nll"], **nll)
    docs = random_docs([3 * LENGTHS[-1] + 1 + 3 * i for i in range(8)])
    model = tiny_model(kind)
    asked = []
    forward = model.forward
    model.forward = lambda ids, **kw: asked.append(kw.get("logits_from", 0)) or forward(ids, **kw)
    suffix = run(model, docs, cfg)
    assert sum(f > 0 for f in asked) > 0  # the suffix-only path ran
    if nll is not None:  # sliding windows after the first at L = 128 score their last 24 tokens
        assert 128 - 24 in asked
    model.forward = forward
    model.__class__ = WithoutLogitsFrom
    asked.clear()
    model.forward = lambda ids, **kw: asked.append(kw.get("logits_from", 0)) or forward(ids, **kw)
    whole = run(model, docs, cfg)
    assert not any(asked)  # control: this model was never asked for a suffix
    assert {r["metric"] for r in suffix} >= {"order_dnll", "context_nll", "passkey_acc"}
    assert_same_rows(suffix, whole, rel=1e-5)
