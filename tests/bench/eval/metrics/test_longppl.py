"""``longppl`` (issue #55 item 1): key tokens and LongPPL against the ``longppl`` package on small
transformers models, a hand-built case whose key tokens are known (a copied span), the config's
one-sentence refusals, and the metric end to end in ``+experiment=smoke``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from bench.data.corpora import Document
from bench.eval.metrics.longppl import (
    LongPPLConfig,
    fixed_key_mask,
    key_token_mask,
    longppl_value,
    tiled_windows,
    window_positions,
)

from fixtures.hf import _llama, _training_text, train_bpe_tokenizer

ROOT = Path(__file__).resolve().parents[4]


def hf_scorer(model):
    """NLL of tokens 1..n-1 of ``ids`` [N, n] under a transformers model, float64."""

    def score(ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            logits = model(ids).logits.double()  # [N, n, V]
        return F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")

    return score


@pytest.mark.parametrize(
    ("alpha", "beta", "short", "window"), [(0.5, -100.0, 48, 12), (0.0, -4.0, 40, 40)]
)
def test_key_tokens_and_longppl_equal_the_longppl_package(alpha, beta, short, window):
    """The reference's find_key_token + compute_longppl on a random Llama evaluator and another
    judged model (float64, one BPE tokenizer) give our key tokens and LongPPL."""
    pytest.importorskip("longppl")
    from longppl.longppl import compute_longppl
    from transformers import LlamaForCausalLM

    tok = train_bpe_tokenizer()
    text = _training_text(2000)[:700]
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"][:, :150]
    text = tok.decode(ids[0])
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    config = _llama(len(tok), max_position_embeddings=256, initializer_range=0.5)  # sharp
    torch.manual_seed(0)
    evaluator = LlamaForCausalLM(config).double().eval()
    torch.manual_seed(1)
    judged = LlamaForCausalLM(config).double().eval()
    ref = compute_longppl(
        text, judged, evaluator, tok, tok, trunc_len=short, sliding_window=window,
        alpha=alpha, beta=beta,
    )  # fmt: skip
    mask = key_token_mask(hf_scorer(evaluator), ids, short, window, alpha, beta)
    value, count = longppl_value(hf_scorer(judged)(ids), mask)
    assert 0 < count < mask.numel() - short  # a real selection, neither none nor all
    assert count == ref["n_key_token"]
    assert value == pytest.approx(float(ref["longppl"]), rel=1e-6)
    # control: another evaluator chooses other tokens, so the comparison can fail
    torch.manual_seed(2)
    other = LlamaForCausalLM(config).double().eval()
    assert not torch.equal(key_token_mask(hf_scorer(other), ids, short, window, alpha, beta), mask)


class CopyOracle(torch.nn.Module):
    """Predicts the token after the most recent earlier occurrence of the last 4 tokens it sees
    (probability 0.99), else every byte alike: a model whose gain from long context is known."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [N, n] -> NLL of tokens 1..n-1
        n = ids.shape[1]
        out = torch.empty(ids.shape[0], n - 1, dtype=torch.float64)
        for row in range(ids.shape[0]):
            seq = ids[row].tolist()
            for p in range(1, n):  # predict seq[p] from seq[:p]
                guess = None
                if p >= 4:
                    gram = seq[p - 4 : p]
                    for q in range(p - 5, -1, -1):  # an occurrence with a continuation before p
                        if seq[q : q + 4] == gram:
                            guess = seq[q + 4]
                            break
                if guess is None:
                    out[row, p - 1] = math.log(256)
                else:
                    out[row, p - 1] = -math.log(0.99) if guess == seq[p] else -math.log(0.01 / 255)
        return out


def test_the_key_tokens_of_a_copied_span_are_that_span():
    """100 random bytes, then their first 60 again: with 32 tokens of short context (+ 8 targets
    per read) only full context sees the source, so the key tokens are exactly the copy from its
    5th token (the first four have no earlier 4-gram); control: a short context that reaches the
    source selects none."""
    gen = torch.Generator().manual_seed(0)
    source = torch.randint(0, 256, (100,), generator=gen)
    ids = torch.cat([source, source[:60]])[None]  # [1, 160]
    oracle = CopyOracle()
    mask = key_token_mask(oracle, ids, 32, 8, 2.0, -2.0)
    tokens = {j + 1 for j in torch.nonzero(mask[0]).flatten().tolist()}
    assert tokens == set(range(104, 160))
    assert not key_token_mask(oracle, ids, 110, 8, 2.0, -2.0).any()
    # LongPPL of the oracle is its confidence on the copy; a model that cannot look back past
    # 32 tokens is uniform there, whatever its perplexity elsewhere
    value, count = longppl_value(oracle(ids), mask)
    assert count == 56 and value == pytest.approx(1 / 0.99)

    def short_memory(x: torch.Tensor) -> torch.Tensor:
        return torch.cat(
            [oracle(x[:, max(0, p - 32) : p + 1])[:, -1:] for p in range(1, x.shape[1])], 1
        )

    value, _ = longppl_value(short_memory(ids), mask)
    assert value == pytest.approx(256.0)


def judged_positions(doc: Document, length: int, span: int) -> list[int]:
    """The document positions each window judges, in reading order (one entry per judged target)."""
    windows, counted = tiled_windows([doc], length, span)
    out = []
    for window, keep in zip(windows, counted, strict=True):
        start = next(  # where the window sits in the document (its tokens are unique)
            s
            for s in range(len(doc) - length + 1)
            if torch.equal(doc.tensor(s, s + length), window)
        )
        out += [start + 1 + j for j in torch.nonzero(keep).flatten().tolist()]
    return out


def test_fill_judges_the_same_text_at_every_length():
    """Under ``max_windows: fill`` a document's first S tokens are read as consecutive windows at
    every length: each target of the span is judged once (a window's first token has no context,
    so it is no target), also when the length does not divide S (the last window ends at S and
    counts only what the windows before it left). Control: ``max_windows: 1`` reads one window."""
    doc = Document("d", np.arange(100, dtype=np.int16))  # unique tokens: positions are findable
    span = 64
    for length, starts in [(64, [0]), (16, [0, 16, 32, 48]), (24, [0, 24])]:
        judged = judged_positions(doc, length, span)
        assert len(judged) == len(set(judged)) and max(judged) == span - 1
        assert set(judged) == set(range(1, span)) - set(starts), length
    assert len(tiled_windows([doc], 24, span)[0]) == 3  # starts 0, 24 and 40 (ends at S)
    cfg = LongPPLConfig(enabled=True).resolve(16, [16, 32, 64])
    assert cfg.max_windows == "fill" and cfg.span_at(32) == cfg.span_at(64) == 64
    first = LongPPLConfig(enabled=True, max_windows=1).resolve(16, [16, 32, 64])
    assert first.span_at(32) == 32 and len(tiled_windows([doc], 32, first.span_at(32))[0]) == 1


def _selected_positions(mask: torch.Tensor, length: int, span: int) -> set[int]:
    """The document positions a one-document mask at ``length`` selects."""
    positions, _ = window_positions(length, span)
    return set(positions[mask].tolist())


def test_a_fixed_key_set_scores_the_same_tokens_at_every_length():
    """``key_set: longest`` (issue #73 item 5): the key tokens chosen at the longest length (here
    every third position) are the tokens scored at 16, 24 and 64, the same set at each, less the
    positions some length does not judge (a window's first token: 16, 24, 32, 40, 48). Control:
    the same positions read as a per-length mask at 16 are another set."""
    span, lengths = 64, [16, 24, 64]
    positions, counted = window_positions(64, span)
    chosen = (positions % 3 == 0) & counted  # [1, 63]
    unjudged = {16, 24, 32, 40, 48}
    expected = {p for p in range(1, span) if p % 3 == 0} - unjudged
    for length in lengths:
        mask = fixed_key_mask(chosen, 1, lengths, span, length)
        assert mask.shape == tiled_windows([Document("d", np.arange(100))], length, span)[1].shape
        assert _selected_positions(mask, length, span) == expected, length
    pos16, counted16 = window_positions(16, span)
    per_length = (pos16 % 3 == 0) & counted16  # control: chosen at 16, not at the longest
    assert _selected_positions(per_length, 16, span) != expected


def test_a_fixed_key_set_measures_the_window_on_a_copied_span():
    """100 random bytes, then their first 60 again (160 tokens, K = 32): at 160 the copy is key
    (its source is in the window, beyond K). Read in windows of 80, the copy's source is in the
    other window: per length, no token of the windows of 80 is key (no LongPPL at 80 at all);
    with the key set fixed at 160, the copy is scored at 80 too, where the model cannot see its
    source: LongPPL 1/0.99 at 160 and 256 (uniform) at 80, the window's effect alone."""
    gen = torch.Generator().manual_seed(0)
    source = torch.randint(0, 256, (100,), generator=gen)
    doc = Document("copy", torch.cat([source, source[:60]]).numpy().astype(np.int16))
    oracle, span = CopyOracle(), 160
    at_160, counted_160 = tiled_windows([doc], 160, span)
    chosen = key_token_mask(oracle, at_160, 32, 8, 2.0, -2.0) & counted_160
    at_80, counted_80 = tiled_windows([doc], 80, span)
    per_length = key_token_mask(oracle, at_80, 32, 8, 2.0, -2.0) & counted_80
    assert not per_length.any()
    fixed = fixed_key_mask(chosen, 1, [80, 160], span, 80)
    assert _selected_positions(fixed, 80, span) == set(range(104, 160))
    value_160, n_160 = longppl_value(oracle(at_160), chosen)
    value_80, n_80 = longppl_value(oracle(at_80), fixed)
    assert n_160 == n_80 == 56
    assert value_160 == pytest.approx(1 / 0.99) and value_80 == pytest.approx(256.0)


def test_config_refusals_are_one_sentence():
    cfg = LongPPLConfig(enabled=True)
    resolved = cfg.resolve(64, [64, 128, 256])
    assert resolved.lengths == [128, 256] and resolved.short_context == 64 and resolved.window == 16
    with pytest.raises(
        ValueError, match=r"eval.longppl.lengths has 64 at or below eval.longppl.short_context 64"
    ):
        LongPPLConfig(enabled=True, lengths=["1x", "2x"]).resolve(64, [64, 128])
    with pytest.raises(
        ValueError, match=r"eval.longppl.evaluator 'gpt2' is invalid; allowed: auto or"
    ):
        LongPPLConfig(evaluator="gpt2")
    with pytest.raises(ValueError, match=r"eval.longppl.alpha must be a number >= 0, got -1"):
        LongPPLConfig(alpha=-1)
    with pytest.raises(
        ValueError, match=r"eval.longppl.max_windows must be 'fill' or an integer >= 1, got 'all'"
    ):
        LongPPLConfig(max_windows="all")
    with pytest.raises(ValueError, match=r"eval.longppl.key_set 'fixed' is invalid; allowed: per_"):
        LongPPLConfig(key_set="fixed")
    with pytest.raises(ValueError, match=r"key_set longest .* needs eval.longppl.max_windows fill"):
        LongPPLConfig(key_set="longest", max_windows=1)
    assert LongPPLConfig(key_set="longest").key_set == "longest"  # control: with fill


def test_a_named_evaluator_is_checked_before_any_training(tmp_path):
    """``eval.longppl.evaluator=<key>`` is refused in one sentence when validated (before the
    judged model trains, not after): no finished checkpoint of that key in ``paths.cache``, or one
    trained shorter than the longest LongPPL length. Control: one trained at that length passes."""
    from bench.job import validate_job

    from fixtures.jobs import compose_job

    key = "0123456789abcdef"

    def validate() -> None:
        validate_job(compose_job("+experiment=smoke", "eval.longppl.enabled=true",
                                 f"eval.longppl.evaluator={key}", f"paths.cache={tmp_path}"))  # fmt: skip

    with pytest.raises(ValueError, match=rf"evaluator '{key}' is not a finished checkpoint under"):
        validate()
    (tmp_path / key).mkdir()
    (tmp_path / key / "model.pt").write_bytes(b"")  # no DONE: an interrupted training
    with pytest.raises(ValueError, match=r"is not a finished checkpoint"):
        validate()

    def done_at(length: int) -> None:
        record = {"key": key, "weights_config": {"train": {"length": length}}}
        (tmp_path / key / "DONE").write_text(json.dumps(record), "utf-8")

    done_at(64)  # smoke: L = 64, LongPPL at 2x = 128
    with pytest.raises(
        ValueError, match=rf"'{key}' was trained at 64 tokens and cannot score LongPPL length 128"
    ):
        validate()
    done_at(128)
    validate()
    record = {"key": key, "weights_config": {"parent": {"train": {"length": 128}}}}
    (tmp_path / key / "DONE").write_text(json.dumps(record), "utf-8")
    validate()  # a fine-tune: its base model's length, as the loaded evaluator reports it


def test_an_auto_evaluator_that_is_the_judged_model_is_refused_before_training():
    """RoPE, no scaling, seed 0, LongPPL only at L: the auto evaluator (the recipe with RoPE at the
    longest LongPPL length, seed 0) is the judged model, refused when validated. Controls: another
    judged seed, or another evaluator_seed, is a different model."""
    from bench.job import validate_job

    from fixtures.jobs import compose_job

    def validate(*overrides: str) -> None:
        validate_job(compose_job("+experiment=smoke", "position=rope", "scaling=none",
                                 "eval.lengths=[1x]", "eval.longppl.enabled=true",
                                 "eval.longppl.short_context=0.25x", *overrides))  # fmt: skip

    with pytest.raises(ValueError, match=r"auto evaluator \(the recipe with RoPE at 64 tokens, "
                       r"seed 0\) would be the judged model itself; allowed: another"):  # fmt: skip
        validate("seed=0")
    validate("seed=1")
    validate("seed=0", "eval.longppl.evaluator_seed=1")


def test_smoke_writes_longppl_rows_on_one_evaluators_tokens(tmp_path):
    """``+experiment=smoke eval.longppl.enabled=true``: every series has its LongPPL row at 2x,
    scored on the same key tokens of one evaluator (the recipe at 2x) that is none of them; as a
    user runs it, with smoke's own alpha 0 and beta -10 (an 8-update model gains little from
    context), which the rows state."""
    args = ["+experiment=smoke", "eval.longppl.enabled=true", f"paths.results={tmp_path}/res",
            f"paths.reports={tmp_path}/rep", f"paths.cache={tmp_path}/cache"]  # fmt: skip
    run = [sys.executable, "-c", "import sys; from bench.cli import main; sys.exit(main())"]
    done = subprocess.run([*run, *args], cwd=ROOT, env=dict(os.environ), capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = pd.concat(pd.read_parquet(p) for p in (tmp_path / "res" / "smoke").glob("*.parquet"))
    long = rows[rows["metric"] == "longppl"]
    assert len(long) == 3 and set(long["eval_length"]) == {128}  # rope, rope+PI, alibi
    params = [json.loads(p) for p in long["task_params"]]
    assert len({p["evaluator"] for p in params}) == 1 and len(set(long["n"])) == 1
    assert params[0]["short_context"] == 64 and params[0]["window"] == 16
    assert (params[0]["alpha"], params[0]["beta"]) == (0, -10)
    series_keys = set(rows["model_id"]) | set(rows["model_config_id"])
    assert len(series_keys) >= 2 and params[0]["evaluator"] not in series_keys
    assert (long["value"] > 1).all() and long["value"].nunique() > 1


def test_one_auto_evaluator_for_every_design_of_a_recipe():
    """The leaderboard ranks attention designs (QK-norm, output gate, SSMax, differential and
    stick-breaking attention, sinks) on their recipe beside the position families: all of them are
    judged by the recipe's one RoPE evaluator, so on the same key tokens. Control: a change of
    recipe (the model's width) is another evaluator."""
    from bench.train.cache import weights_key
    from bench.trained_source import evaluator_job

    from fixtures.jobs import compose_job

    def evaluator_key(*overrides: str) -> str:
        job = compose_job("+experiment=leaderboard", "arm=lm_leaderboard", *overrides)
        return weights_key(evaluator_job(job, 1024, 0), "corpus")

    plain = evaluator_key("position=rope")
    designs = ["model.qk_norm=true", "model.output_gate=true", "model.attn_scale=ssmax",
               "model.attention=differential", "model.attention_sink=learned"]  # fmt: skip
    assert {evaluator_key("position=rope", d) for d in designs} == {plain}
    assert evaluator_key("position=nope", "model.attention=stick_breaking") == plain
    assert evaluator_key("position=rope", "model.d_model=64") != plain  # control


def test_a_short_context_at_or_above_every_length_is_refused():
    """K = 2x with eval lengths up to 2x: no length above K, so LongPPL would write no row without
    a word (the audit's case); one sentence instead. Control: K = 1x keeps 2x."""
    with pytest.raises(
        ValueError, match=r"short_context 128 \(K\) is at or above every eval length"
    ):
        LongPPLConfig(enabled=True, short_context="2x").resolve(64, [64, 128])
    assert LongPPLConfig(enabled=True, short_context="1x").resolve(64, [64, 128]).lengths == [128]
    LongPPLConfig(enabled=False, short_context="2x").resolve(64, [64, 128])  # off: nothing to say
