"""Pretrained transformers models through lenbench's loading, scaling methods and metrics.

Every model is built locally (``tests/fixtures/hf.py``): nothing is downloaded. Parity: a lenbench
``DecoderLM`` copied into an equivalent ``LlamaForCausalLM`` gives the same metric rows through
both paths; a different rope layout breaks it (negative control).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from collections import Counter

import numpy as np
import pytest
import torch

from bench.data.pretrained_documents import retokenize
from bench.eval.evaluate import evaluate_model
from bench.eval.metrics import METRICS
from bench.job import NotApplicable
from bench.pretrained.adapter import PretrainedLM, check_pretrained_scaling
from bench.pretrained.config import (
    PretrainedConfig,
    load_config,
    model_id,
    position_family,
    train_length_of,
)
from bench.tasks.passkey import fit_passkey_example
from models.scaling_config import ScalingConfig

from fixtures.hf import byte_tokenizer, load_adapter, one_sentence, save_model, small_eval

pytestmark = pytest.mark.usefixtures("one_thread")

TRAIN = 32  # the parity models' training length
# |value(DecoderLM) - value(LlamaForCausalLM)| of every metric row; measured <= 1.3e-6 (longrope)
PARITY_TOL = 1e-5

SCALINGS = {
    "none": ScalingConfig(),
    "linear": ScalingConfig(name="linear", method="linear", params={"factor": "auto"}),
    "yarn": ScalingConfig(
        name="yarn", method="yarn", params={"factor": "auto", "beta_fast": 32.0, "beta_slow": 1.0}
    ),
    "dynamic": ScalingConfig(name="dynamic", method="dynamic", params={"factor": 1.0}),
    "llama3": ScalingConfig(
        name="llama3",
        method="llama3",
        params={"factor": "auto", "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    ),
    "longrope": ScalingConfig(
        name="longrope",
        method="longrope",
        params={"short_factor": 1.0, "long_factor": "ramp", "factor": "auto"},
    ),
    # not rope types of transformers: the default type with the NTK base, and a query wrapper
    "ntk": ScalingConfig(name="ntk", method="ntk", params={"alpha": "auto"}),
    "logn": ScalingConfig(name="logn", logn=True),
    "yarn+logn": ScalingConfig(
        name="yarn+logn", method="yarn", params={"factor": "auto"}, logn=True
    ),
    # training-free: pairs re-positioned in a registered attention function (the shipped rope)
    "self_extend": ScalingConfig(
        name="self_extend", method="self_extend", params={"group_size": "auto", "window": "auto"}
    ),
    "rerope+logn": ScalingConfig(
        name="rerope+logn", method="rerope", params={"window": 8}, logn=True
    ),
    "leaky_rerope": ScalingConfig(
        name="leaky_rerope", method="leaky_rerope", params={"window": "auto", "slope": "auto"}
    ),
    "streaming": ScalingConfig(
        name="streaming", method="streaming", params={"sink_tokens": 4, "window": 12}
    ),
    # three regimes per pair (intra, successive, inter chunk)
    "dca": ScalingConfig(
        name="dca", method="dca", params={"chunk_size": "auto", "local_window": "auto"}
    ),
}


def by_key(rows):
    keys = (
        "metric",
        "eval_length",
        "bucket_lo",
        "bucket_hi",
        "axis",
        "axis_value",
        "layer",
        "task",
    )

    # an effective_length row per score (task_params names it)
    def score(r):
        return json.loads(r.get("task_params") or "{}").get("score")

    out = {(*(r.get(k) for k in keys), score(r)): r for r in rows}
    assert len(out) == len(rows), "rows must be unique per key"
    return out


# --------------------------------------------------------------------------- loading


def test_loading_detects_family_length_and_identity(hf_model_dirs):
    expected = {
        "llama": ("rope", 64),
        "llama_yarn": ("rope", 32),  # original_max_position_embeddings, not the YaRN-extended 128
        "neox": ("rope", 64),
        "gpt2": ("learned", 64),
        "bloom": ("alibi", 64),
    }
    ids = set()
    for arch, (family, length) in expected.items():
        cfg = PretrainedConfig(path=str(hf_model_dirs[arch]))
        config = load_config(cfg)
        lm = load_adapter(hf_model_dirs[arch])
        assert (position_family(config), lm.family, lm.train_length) == (family, family, length)
        assert train_length_of(config, 40) == 40  # overridable
        assert model_id(cfg) == model_id(PretrainedConfig(path=str(hf_model_dirs[arch])))
        ids.add(model_id(cfg))
    assert len(ids) == len(expected)  # the weights' hashes differ
    hub = [model_id(PretrainedConfig(path="org/model", revision=r)) for r in (None, "main", "v2")]
    assert hub[0] == hub[1] != hub[2]


def test_model_id_follows_the_weights(hf_model_dirs, tmp_path, hf_bpe):
    a = save_model("gpt2", tmp_path / "a", hf_bpe, seed=0)
    b = save_model("gpt2", tmp_path / "b", hf_bpe, seed=1)
    assert model_id(PretrainedConfig(path=str(a))) == model_id(
        PretrainedConfig(path=str(hf_model_dirs["gpt2"]))
    )
    assert model_id(PretrainedConfig(path=str(a))) != model_id(PretrainedConfig(path=str(b)))


def test_bad_input_stops_withone_sentence(tmp_path, monkeypatch):
    from transformers import T5Config

    with pytest.raises(ValueError, match="does not exist") as missing:
        load_config(PretrainedConfig(path=str(tmp_path / "nowhere")))
    one_sentence(str(missing.value))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="without config.json") as empty:
        load_config(PretrainedConfig(path=str(tmp_path / "empty")))
    one_sentence(str(empty.value))
    T5Config(vocab_size=100, d_model=16, num_layers=1, num_heads=2, d_ff=32).save_pretrained(
        tmp_path / "t5"
    )
    with pytest.raises(ValueError, match="not a causal language model") as t5:
        load_config(PretrainedConfig(path=str(tmp_path / "t5")))
    one_sentence(str(t5.value))

    import huggingface_hub.constants as hub_constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
    with pytest.raises(ValueError, match="offline") as offline:
        load_config(PretrainedConfig(path="lenbench-test/no-such-model"))
    one_sentence(str(offline.value))


# --------------------------------------------------------------------------- scaling


def test_scaled_equals_transformers_own_rope_parameters_and_restores(hf_model_dirs):
    """Scaling through the adapter = loading the model with those rope parameters in its config."""
    from transformers import AutoModelForCausalLM

    lm = load_adapter(hf_model_dirs["llama"])
    tokens = torch.randint(0, 300, (2, 200))
    raw = lm(tokens).logits
    yarn = ScalingConfig(name="yarn", method="yarn", params={"factor": "auto"})
    with lm.scaled(yarn, 256):
        scaled = lm(tokens).logits
    assert torch.allclose(lm(tokens).logits, raw, atol=1e-5)  # restored on exit
    reference = AutoModelForCausalLM.from_pretrained(
        hf_model_dirs["llama"],
        rope_parameters={
            "rope_type": "yarn",
            "factor": 4.0,  # auto: 256 / 64
            "original_max_position_embeddings": 64,
            "rope_theta": 10000.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
        },
    ).eval()
    with torch.no_grad():
        expected = reference(tokens).logits
    assert torch.allclose(scaled, expected, atol=1e-5)
    assert (scaled - raw).abs().max() > 1e-2  # negative control: the scaling changes something


def test_none_keeps_the_shipped_rope_scaling(hf_model_dirs):
    lm = load_adapter(hf_model_dirs["llama_yarn"])  # ships with YaRN factor 4 over 32 tokens
    tokens = torch.randint(0, 300, (1, 120))
    shipped = lm(tokens).logits
    with lm.scaled(ScalingConfig(), 128):
        assert torch.allclose(lm(tokens).logits, shipped)
    same = ScalingConfig(name="yarn", method="yarn", params={"factor": 4.0})
    other = ScalingConfig(name="linear", method="linear", params={"factor": 4.0})
    with lm.scaled(same, 128):
        assert torch.allclose(lm(tokens).logits, shipped, atol=1e-5)
    with lm.scaled(other, 128):
        assert (lm(tokens).logits - shipped).abs().max() > 1e-3


def test_scalings_that_do_not_apply_are_reported(hf_model_dirs):
    ntk = ScalingConfig(name="ntk", method="ntk", params={"alpha": 2.0})
    logn = ScalingConfig(name="logn", logn=True)
    yarn = ScalingConfig(name="yarn", method="yarn", params={"factor": 2.0})
    linear = ScalingConfig(name="linear", method="linear", params={"factor": 2.0})
    for family, scaling, reason in [
        ("learned", ntk, "does not apply to position learned"),
        ("learned", yarn, "does not apply to position learned"),
        ("learned", linear, "does not apply to position learned"),
        ("alibi", yarn, "does not apply to position alibi"),
    ]:
        with pytest.raises(NotApplicable, match=reason) as info:
            check_pretrained_scaling(family, scaling)
        assert "\n" not in str(info.value)
    for scaling in (yarn, ntk, logn):  # negative control: these apply to rope
        check_pretrained_scaling("rope", scaling)
    lm = load_adapter(hf_model_dirs["gpt2"])
    with pytest.raises(NotApplicable), lm.scaled(yarn, 128):
        pass
    # log-n needs transformers' attention interface, which BLOOM's own attention code bypasses
    bloom = load_adapter(hf_model_dirs["bloom"])
    with pytest.raises(NotApplicable, match="AttentionInterface") as info, bloom.scaled(logn, 128):
        pass
    assert "\n" not in str(info.value)


def test_ntk_is_the_default_rope_with_the_ntk_base_and_logn_leaves_the_trained_range(hf_model_dirs):
    """ntk: the swapped rotary module's frequencies are models.scaling's ntk frequencies
    (control: alpha 1 gives the shipped ones). logn: queries up to the training length keep
    their logits exactly (factor 1), later ones change; both restored on exit."""
    from models.scaling import rope_parameters

    lm = load_adapter(hf_model_dirs["llama"], train_length=16)
    tokens = torch.randint(0, 300, (2, 48))
    with torch.no_grad():
        raw = lm(tokens).logits
        with lm.scaled(ScalingConfig(name="ntk", method="ntk", params={"alpha": 3.0}), 48):
            ((_, _, rotary),) = lm._rotary_modules()
            expected, _ = rope_parameters(
                "ntk", head_dim=rotary.inv_freq.numel() * 2, base=10000.0, original_length=16,
                seq_len=48, alpha=3.0,
            )  # fmt: skip
            torch.testing.assert_close(rotary.inv_freq.float(), expected, rtol=1e-6, atol=0)
        with lm.scaled(ScalingConfig(name="ntk", method="ntk", params={"alpha": 1.0}), 48):
            torch.testing.assert_close(lm(tokens).logits, raw, atol=1e-5, rtol=1e-5)
        with lm.scaled(ScalingConfig(name="logn", logn=True), 48):
            logn = lm(tokens).logits
            with_entropy = lm(tokens, output_attn_entropy=True)
        torch.testing.assert_close(lm(tokens).logits, raw)  # restored
    torch.testing.assert_close(logn[:, :16], raw[:, :16], atol=1e-5, rtol=1e-5)
    assert (logn[:, 16:] - raw[:, 16:]).abs().max() > 1e-3
    torch.testing.assert_close(with_entropy.logits, logn, atol=1e-5, rtol=1e-5)
    assert len(with_entropy.attn_entropy) == lm.model_cfg.n_layers


@pytest.mark.parametrize("method", ["self_extend", "rerope", "leaky_rerope", "streaming"])
def test_training_free_methods_run_in_attention_and_only_where_they_can(method, hf_model_dirs):
    """On a Llama: a window as long as the input keeps the shipped logits (the method's attention
    function is exact), a shorter one changes them past the window, the model's own attention
    comes back on exit. GPT-2 (learned positions) and BLOOM (ALiBi in its own attention code)
    refuse the method in one sentence."""
    params = {
        "self_extend": {"group_size": 3, "window": 8},
        "rerope": {"window": 8},
        "leaky_rerope": {"window": 8, "slope": 0.5},
        "streaming": {"sink_tokens": 2, "window": 8},
    }[method]
    lm = load_adapter(hf_model_dirs["llama"], train_length=16)
    tokens = torch.randint(0, 300, (2, 40))
    before = lm.hf.config._attn_implementation
    with torch.no_grad():
        raw = lm(tokens).logits
        with lm.scaled(ScalingConfig(method, method, {**params, "window": 40})):
            torch.testing.assert_close(lm(tokens).logits, raw, atol=1e-5, rtol=1e-5)
        with lm.scaled(ScalingConfig(method, method, params)):
            moved = lm(tokens).logits
            entropy = lm(tokens, output_attn_entropy=True)
    torch.testing.assert_close(moved[:, :8], raw[:, :8], atol=1e-5, rtol=1e-5)
    assert (moved[:, 8:] - raw[:, 8:]).abs().max() > 1e-3
    torch.testing.assert_close(entropy.logits, moved, atol=1e-5, rtol=1e-5)
    assert len(entropy.attn_entropy) == lm.model_cfg.n_layers
    assert lm.hf.config._attn_implementation == before
    for arch in ("gpt2", "bloom"):
        other = load_adapter(hf_model_dirs[arch])
        with (
            pytest.raises(NotApplicable) as info,
            other.scaled(ScalingConfig(method, method, params)),
        ):
            pass
        one_sentence(str(info.value))


def test_streaming_log_n_reads_the_query_cache_position(hf_model_dirs):
    """StreamingLLM puts each query at its cache position (mit-han-lab/streaming-llm pos_shift), so
    log-n reads that one too: a cache that fits the trained range (2 sinks + 8 recent, positions
    0..9 < L = 16) leaves every factor at 1 however far the position ids go (up to 39, factor
    1.33 there). Control: a cache that reaches past L (2 + 30) does change the logits."""
    lm = load_adapter(hf_model_dirs["llama"], train_length=16)
    tokens = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(0))
    for window, changes in ((8, False), (30, True)):
        params = {"sink_tokens": 2, "window": window}
        with torch.no_grad():
            with lm.scaled(ScalingConfig("st", "streaming", params)):
                plain = lm(tokens).logits
            with lm.scaled(ScalingConfig("st+logn", "streaming", params, logn=True)):
                scaled = lm(tokens).logits
        assert ((scaled - plain).abs().max() > 1e-3) == changes, window


@pytest.mark.parametrize("arch", ["llama_yarn", "neox"])
def test_rerope_far_pairs_follow_the_shipped_rotation(arch, hf_model_dirs):
    """Shipped YaRN (scaled cos/sin) and GPT-NeoX's partial rotary: ReRoPE's logits depend on
    i - j only, so shifting every position leaves them (the far pairs' extra rotation uses the
    model's own frequencies and layout); raw RoPE's far pairs stay shift-invariant too, but the
    ReRoPE logits differ from raw ones (control)."""
    lm = load_adapter(hf_model_dirs[arch], train_length=16)
    tokens = torch.randint(0, 300, (1, 40))
    positions = torch.arange(40)[None]
    rerope = ScalingConfig("rerope", "rerope", {"window": 6})
    with torch.no_grad(), lm.scaled(rerope):
        here = lm(tokens, position_ids=positions).logits
        shifted = lm(tokens, position_ids=positions + 7).logits
    torch.testing.assert_close(here, shifted, atol=2e-4, rtol=2e-4)
    with torch.no_grad():
        raw = lm(tokens, position_ids=positions).logits
    assert (here[:, 6:] - raw[:, 6:]).abs().max() > 1e-3
    # the extra rotation in the interleaved layout (wrong for these models) breaks the invariance
    import bench.pretrained.attention as attention

    real_rotate = attention.rotate
    attention.rotate = lambda x, cos, sin, layout: real_rotate(x, cos, sin, "interleaved")
    try:
        with torch.no_grad(), lm.scaled(rerope):
            wrong = lm(tokens, position_ids=positions).logits
            wrong_shifted = lm(tokens, position_ids=positions + 7).logits
    finally:
        attention.rotate = real_rotate
    assert (wrong - wrong_shifted).abs().max() > 1e-3


def test_dynamic_rope_is_stateless_across_lengths(hf_model_dirs):
    """transformers' dynamic rope caches the longest length seen; the adapter resets it per pass."""
    lm = load_adapter(hf_model_dirs["llama"])
    tokens = torch.randint(0, 300, (1, 100))
    dynamic = SCALINGS["dynamic"]
    with lm.scaled(dynamic, 256):
        first = lm(tokens).logits
        lm(torch.randint(0, 300, (1, 256)))  # a longer pass in between
        again = lm(tokens).logits
    assert torch.allclose(first, again, atol=1e-6)


# --------------------------------------------------------------------------- documents and passkey


def test_retokenize_counts_the_models_tokens(hf_text_docs, hf_bpe):
    docs = retokenize(hf_text_docs, hf_bpe)
    assert [d.id for d in docs] == [d.id for d in hf_text_docs]
    for byte_doc, doc in zip(hf_text_docs, docs, strict=True):
        text = bytes(byte_doc.tokens.astype(np.uint8)).decode()
        assert hf_bpe.decode(doc.tokens.tolist()) == text
        assert len(doc) < len(byte_doc)  # subwords: fewer tokens than bytes
    bytes_again = retokenize(hf_text_docs, byte_tokenizer())  # negative control: one token per byte
    assert all(
        np.array_equal(a.tokens, b.tokens) for a, b in zip(bytes_again, hf_text_docs, strict=True)
    )


def test_passkey_examples_have_the_eval_length_in_model_tokens(hf_bpe):
    for length in (100, 257, 1000):
        for depth in (0.0, 0.5, 1.0):
            example = fit_passkey_example(length, depth, 31337, hf_bpe, template="short")
            assert example.length == length
            text = hf_bpe.decode(example.prompt_ids)
            assert "pass key:31337." in text and text.endswith("pass key:")
            assert example.answer_text == "31337" and hf_bpe.decode(example.answer_ids) == "31337"
    with pytest.raises(ValueError, match="too short"):
        fit_passkey_example(10, 0.5, 31337, hf_bpe, template="short")


class _Oracle(torch.nn.Module):
    """Answers every passkey prompt with the key in its needle (+ ``extra`` text)."""

    def __init__(self, tokenizer, extra: str):
        super().__init__()
        self.tokenizer, self.extra = tokenizer, extra

    def generate_greedy(self, prompts, max_new_tokens):
        rows = []
        for prompt in prompts.tolist():
            key = self.tokenizer.decode(prompt).split("pass key:")[1].split(".")[0]
            ids = self.tokenizer.encode(f"{key}{self.extra}", add_special_tokens=False)
            rows.append((ids + [0] * max_new_tokens)[:max_new_tokens])
        return torch.tensor(rows)


@pytest.mark.parametrize(("extra", "accuracy"), [(". Done", 1.0), ("7", 0.0)])
def test_passkey_verdict_compares_text(hf_bpe, extra, accuracy):
    from bench.eval.metrics import EvalContext
    from bench.eval.metrics.passkey import passkey_rows

    ctx = EvalContext(_Oracle(hf_bpe, extra), progress=False, tokenizer=hf_bpe)
    rows = passkey_rows(ctx, 150, depths=[0.0, 1.0], trials=2, seed=0, template="short")
    overall = [r for r in rows if r.get("axis") == "template"]
    assert overall[0]["value"] == accuracy and overall[0]["n"] == 4
    assert overall[0]["axis_value"] == "short"  # the row names the template it measured


# --------------------------------------------------------------------------- metrics on architectures


@pytest.mark.parametrize("arch", ["llama", "neox", "gpt2", "bloom"])
def test_every_metric_runs_on_the_architecture(arch, hf_model_dirs, hf_text_docs, caplog):
    train = 16 if arch == "gpt2" else 32  # 4x within GPT-2's 64-row position table
    lm = load_adapter(hf_model_dirs[arch], train_length=train)
    docs = retokenize(hf_text_docs, lm.tokenizer)
    with caplog.at_level(logging.WARNING):
        rows = evaluate_model(
            lm, small_eval(["4x"]), docs, train_length=train, progress=False, tokenizer=lm.tokenizer
        )
    metrics = Counter(r["metric"] for r in rows)
    expected = {
        "nll",
        "passkey_acc",
        "passkey_context",
        "order_dnll",
        "context_nll",
        "attn_entropy",
        "position_probe_r2",
    }
    assert expected <= set(metrics)
    assert all(math.isfinite(r["value"]) for r in rows if r["metric"] != "position_probe_r2")
    shift = [r for r in rows if r["metric"] == "shift_dnll"]
    if arch == "bloom":  # ALiBi from the attention mask: no position ids to offset
        assert not shift and "takes no position ids" in caplog.text
    elif arch == "gpt2":  # learned table: offsets change the input
        assert shift and max(abs(r["value"]) for r in shift) > 1e-3
    else:  # rope: relative, so offsets change nothing but float error
        assert shift and max(abs(r["value"]) for r in shift) < 1e-4
    layers = {r["layer"] for r in rows if r["metric"] == "attn_entropy"}
    assert layers == {0, 1}
    # nll buckets: the whole-window row's n counts the model's tokens
    whole = [r for r in rows if r["metric"] == "nll" and r.get("axis") == "docs"]
    assert [r["eval_length"] for r in whole] == [train, 2 * train, 4 * train]


def test_learned_table_skips_lengths_beyond_it(hf_model_dirs, hf_text_docs, caplog):
    lm = load_adapter(hf_model_dirs["gpt2"])  # 64 positions
    docs = retokenize(hf_text_docs, lm.tokenizer)
    cfg = {"lengths": ["1x", "2x"], **{name: {"enabled": name == "nll"} for name in METRICS}}
    with caplog.at_level(logging.WARNING):
        rows = evaluate_model(lm, cfg, docs, train_length=32, progress=False)
    assert {r["eval_length"] for r in rows} == {32, 64}
    with caplog.at_level(logging.WARNING):
        rows = evaluate_model(
            lm, {**cfg, "lengths": ["1x", "4x"]}, docs, train_length=32, progress=False
        )
    assert {r["eval_length"] for r in rows} == {
        32
    } and "beyond the learned position table" in caplog.text


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_attention_entropy_matches_eager_attention_probabilities(arch, hf_model_dirs):
    """The tiled entropy of the adapter vs entropies of transformers' own eager probabilities."""
    from transformers import AutoModelForCausalLM

    lm = load_adapter(hf_model_dirs[arch])
    tokens = torch.randint(0, 300, (2, 50))
    with torch.no_grad():
        ours = lm(tokens, output_attn_entropy=True).attn_entropy
        eager = AutoModelForCausalLM.from_pretrained(
            hf_model_dirs[arch], attn_implementation="eager"
        ).eval()
        probs = eager(tokens, output_attentions=True).attentions
    for mine, p in zip(ours, probs, strict=True):
        reference = -torch.special.xlogy(p, p).sum(-1)  # [N, H, L]
        assert torch.allclose(mine, reference, atol=1e-4)
    assert (ours[0][:, :, 1:] > 0.1).any()  # negative control: not trivially zero


@pytest.mark.parametrize("arch", ["llama", "neox", "gpt2", "bloom"])
def test_logits_from_keeps_only_the_suffix_logits(arch, hf_model_dirs):
    lm = load_adapter(hf_model_dirs[arch])
    tokens = torch.randint(0, 300, (2, 40))
    head_rows = []  # positions the output embedding (LM head) computed, per call
    hook = lm.hf.get_output_embeddings().register_forward_hook(
        lambda module, args, out: head_rows.append(args[0].shape[1])
    )
    with torch.no_grad():
        full = lm(tokens).logits
        suffix = lm(tokens, logits_from=31).logits
    hook.remove()
    assert suffix.shape == (2, 9, full.shape[-1])
    torch.testing.assert_close(suffix, full[:, 31:], atol=1e-5, rtol=1e-5)
    assert head_rows == [40, 9]  # transformers' logits_to_keep: the head ran on 9 positions only
    with pytest.raises(
        ValueError, match=r"logits_from must be in \[0, 40\) for 40 tokens, got 40\.$"
    ):
        lm(tokens, logits_from=40)


# --------------------------------------------------------------------------- parity with DecoderLM


def _parity_pair(layout: str):
    """A DecoderLM (rope, ``layout``) and a LlamaForCausalLM holding the same weights."""
    from conftest import TINY, _tiny_model
    from perf.train_speed import build_llama, copy_weights

    ours = _tiny_model("rope", seed=3, train_length=TRAIN, model_cfg=TINY, layout=layout)
    args = argparse.Namespace(
        width=TINY.d_model, layers=TINY.n_layers, heads=TINY.n_heads, seq=TRAIN, base=10000.0
    )
    llama = build_llama(args, ours).eval()
    copy_weights(ours, llama)
    return ours, PretrainedLM(llama, byte_tokenizer(), TRAIN)


def _both_paths(layout, scaling, hf_text_docs, cfg):
    ours, lm = _parity_pair(layout)
    docs = retokenize(hf_text_docs, lm.tokenizer)
    assert all(np.array_equal(a.tokens, b.tokens) for a, b in zip(docs, hf_text_docs, strict=True))
    a = evaluate_model(ours, cfg, hf_text_docs, train_length=TRAIN, scaling=scaling, progress=False)
    b = evaluate_model(
        lm, cfg, docs, train_length=TRAIN, scaling=scaling, progress=False, tokenizer=lm.tokenizer
    )
    return by_key(a), by_key(b)


@pytest.mark.parametrize("scaling", list(SCALINGS))
def test_parity_decoderlm_and_llama_give_the_same_rows(scaling, hf_text_docs):
    a, b = _both_paths("half", SCALINGS[scaling], hf_text_docs, small_eval(["4x"]))
    assert a.keys() == b.keys()
    assert {k[0] for k in a} >= {
        "niah_single",  # RULER: teacher-forced (ours) vs fitted text examples generated (theirs)
        "effective_length",
        "nll",
        "passkey_acc",
        "shift_dnll",
        "order_dnll",
        "context_nll",
        "attn_entropy",
        "position_probe_r2",
    }
    for key, row in a.items():
        other = b[key]
        assert row["n"] == other["n"], key
        tol = PARITY_TOL * (100 if key[0] == "position_probe_r2" else 1)  # a refit ridge probe
        assert abs(row["value"] - other["value"]) <= tol, (key, row["value"], other["value"])


@pytest.mark.parametrize("scaling", ["none", "self_extend", "streaming", "dca"])
def test_parity_greedy_generations_are_identical(scaling, hf_text_docs):
    """The passkey verdicts of both paths come from the same continuations (a stronger check than
    their accuracy, which a random model keeps at 0), decoded with each path's KV cache."""
    ours, lm = _parity_pair("half")
    example = fit_passkey_example(4 * TRAIN, 0.5, 4242, lm.tokenizer, template="short")
    prompt = torch.tensor([example.prompt_ids])
    with (
        torch.no_grad(),
        ours.scaled(SCALINGS[scaling], 4 * TRAIN),
        lm.scaled(SCALINGS[scaling], 4 * TRAIN),
    ):
        assert torch.equal(ours.generate_greedy(prompt, 8), lm.generate_greedy(prompt, 8))
        # and the logits themselves, prefill and the cached steps alike
        steps = torch.cat((prompt, ours.generate_greedy(prompt, 8)[:, :-1]), dim=1)
        torch.testing.assert_close(ours(steps).logits, lm(steps).logits, atol=1e-4, rtol=1e-4)


def test_parity_negative_control_other_rope_layout_breaks_it(hf_text_docs):
    cfg = small_eval(**{name: {"enabled": name == "nll"} for name in METRICS})
    a, b = _both_paths("interleaved", SCALINGS["none"], hf_text_docs, cfg)
    # measured: up to 4e-3 nats on these nll rows (1e-2 on order_dnll and attn_entropy)
    assert max(abs(a[k]["value"] - b[k]["value"]) for k in a) > 100 * PARITY_TOL


def test_tiled_attention_reads_no_key_after_its_queries(monkeypatch):
    """The pretrained path's tiled attention (entropy, log-n and training-free methods) scores each
    query tile against the keys up to its last query only: the output equals causal softmax
    attention written out, and a NaN value in a key that the tile's queries may not see leaves
    them finite, while the queries that see it read it. Control: the full-key product that it
    replaced (probabilities x every value) turns the NaN into NaN for every query (0 x NaN)."""
    import bench.pretrained.attention as attention

    torch.manual_seed(0)
    n, h, g, length, d = 1, 4, 2, 37, 8
    q = torch.randn(n, h, length, d)
    k, v = torch.randn(n, g, length, d), torch.randn(n, g, length, d)
    out, entropy = attention._tiled_attention(q, k, v, None, d**-0.5, want_entropy=True)
    kk, vv = k.repeat_interleave(h // g, 1), v.repeat_interleave(h // g, 1)
    logits = (q @ kk.transpose(-1, -2)) * d**-0.5
    logits = logits.masked_fill(torch.ones(length, length).triu(1).bool(), float("-inf"))
    probs = logits.softmax(-1)  # [N, H, L, L]
    assert torch.allclose(out, probs @ vv, atol=1e-5)
    assert torch.allclose(entropy, -torch.special.xlogy(probs, probs).sum(-1), atol=1e-5)
    v_nan = v.clone()
    v_nan[:, :, 10] = float("nan")
    monkeypatch.setattr(attention, "ATTENTION_TILE_ELEMENTS", 5 * n * h * length)  # tiles of 5
    tiled, _ = attention._tiled_attention(q, k, v_nan, None, d**-0.5)
    assert torch.isfinite(tiled[:, :, :10]).all() and torch.isnan(tiled[:, :, 10:]).all()
    whole = probs @ v_nan.repeat_interleave(h // g, 1)
    assert torch.isnan(whole[:, :, :10]).all()
