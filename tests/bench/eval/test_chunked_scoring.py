"""Chunked scoring: per-token NLL from hidden states with the LM head applied a chunk of positions
at a time equals full-logit scoring, for our models, pretrained ones and every metric; the head
never sees more positions than a chunk; generation computes the prompt's last logits only.
Each with a negative control (the full-logit path does show all positions to the head)."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bench.eval.evaluate
import models.scoring
from bench.data.pretrained_documents import retokenize
from bench.eval.evaluate import evaluate_model
from bench.eval.metrics import EvalContext
from models.scoring import chunk_positions, chunked_token_nll

from fixtures.hf import load_adapter, save_model, small_eval

pytestmark = pytest.mark.usefixtures("one_thread")

TRAIN = 32


class HeadSpy:
    """Records how many positions each call of an LM head computed logits for."""

    def __init__(self, head: torch.nn.Module):
        self.positions: list[int] = []
        self.handle = head.register_forward_hook(
            lambda module, args, out: self.positions.append(out.shape[-2] if out.dim() > 2 else 1)
        )

    def close(self) -> list[int]:
        self.handle.remove()
        return self.positions


def test_chunked_token_nll_equals_full_cross_entropy():
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 1000, bias=False)
    hidden, targets = torch.randn(3, 50, 16), torch.randint(0, 1000, (3, 50))
    spy = HeadSpy(head)
    with torch.no_grad():
        chunked = chunked_token_nll(head, hidden, targets, 1000, limit=3 * 1000 * 7)
        full = F.cross_entropy(head(hidden).flatten(0, 1), targets.flatten(), reduction="none")
    calls = spy.close()
    assert calls[:-1] == [7] * 7 + [1]  # 50 positions in chunks of 7, then the full pass
    torch.testing.assert_close(chunked, full.view(3, 50), atol=1e-5, rtol=1e-5)
    shifted = chunked_token_nll(head, hidden, targets.roll(1, dims=1), 1000)
    assert (shifted - chunked).abs().max() > 0.1  # negative control: the targets matter
    with pytest.raises(ValueError, match=r"hidden states \(3, 49, 16\) do not match targets"):
        chunked_token_nll(head, hidden[:, 1:], targets, 1000)


def test_chunk_positions_bound_the_logits_held_at_once():
    assert chunk_positions(2, 32_000, 2**24) == 262  # 2 x 262 x 32000 <= 2**24 < 2 x 263 x 32000
    assert chunk_positions(1, 259) == 2**24 // 259  # a byte-level model: one chunk in practice
    assert chunk_positions(4, 10**9) == 1  # never zero


@pytest.mark.parametrize("logits_from", [0, 5])
def test_decoderlm_targets_equal_its_logits_scored_by_chunks(logits_from, tiny_model, monkeypatch):
    model = tiny_model("rope", train_length=TRAIN)
    tokens = torch.randint(0, 256, (2, 41))
    targets = tokens[:, 1 + logits_from :]
    monkeypatch.setattr(models.scoring, "LOGIT_CHUNK_ELEMENTS", 2 * 259 * 4)  # 4 positions
    spy = HeadSpy(model.lm_head)
    with torch.no_grad():
        out = model(tokens[:, :-1], logits_from=logits_from, targets=targets)
        chunked_calls = list(spy.positions)
        logits = model(tokens[:, :-1], logits_from=logits_from).logits
    spy.close()
    assert out.logits is None and out.token_nll.shape == targets.shape
    full = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    torch.testing.assert_close(out.token_nll, full.view(targets.shape), atol=1e-5, rtol=1e-5)
    assert max(chunked_calls) == 4 and sum(chunked_calls) == 40 - logits_from
    assert spy.positions[-1] == 40 - logits_from  # negative control: logits see every position


@pytest.mark.parametrize("arch", ["llama", "neox", "gpt2", "bloom"])
def test_pretrained_targets_equal_its_logits_scored_by_chunks(arch, hf_model_dirs, monkeypatch):
    lm = load_adapter(hf_model_dirs[arch])
    vocab = lm.hf.get_output_embeddings().out_features
    tokens = torch.randint(0, 300, (2, 41))
    monkeypatch.setattr(models.scoring, "LOGIT_CHUNK_ELEMENTS", 2 * vocab * 6)  # 6 positions
    for logits_from in (0, 30):
        targets = tokens[:, 1 + logits_from :]
        spy = HeadSpy(lm.hf.get_output_embeddings())
        with torch.no_grad():
            out = lm(tokens[:, :-1], logits_from=logits_from, targets=targets)
            calls = list(spy.positions)
            logits = lm(tokens[:, :-1], logits_from=logits_from).logits
        spy.close()
        full = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
        torch.testing.assert_close(out.token_nll, full.view(targets.shape), atol=1e-5, rtol=1e-5)
        # the model's own head call got no positions; ours went by chunks of at most 6
        assert calls[0] == 0 and max(calls) == 6 and sum(calls) == 40 - logits_from, calls
        assert spy.positions[-1] == 40 - logits_from  # negative control: the full-logit pass


def test_a_model_whose_logits_are_transformed_is_scored_from_its_own_logits(tmp_path, hf_bpe):
    """Softcapping (Gemma 2) or a logit scale (Cohere) happen after the head: such a model is
    scored from the logits it returns, which then still equal the targets' NLL."""
    lm = load_adapter(save_model("llama", tmp_path / "m", hf_bpe))
    lm.hf.config.final_logit_softcapping = 30.0  # Llama ignores it; the adapter must not
    assert lm.chunked_head() is None
    tokens = torch.randint(0, 300, (2, 21))
    spy = HeadSpy(lm.hf.get_output_embeddings())
    with torch.no_grad():
        out = lm(tokens[:, :-1], targets=tokens[:, 1:])
        logits = lm(tokens[:, :-1]).logits
    assert spy.close() == [20, 20]  # the full-logit path both times
    full = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
    torch.testing.assert_close(out.token_nll, full.view(2, 20))
    lm.hf.config.final_logit_softcapping = None
    assert lm.chunked_head() is lm.hf.get_output_embeddings()  # control: the plain model chunks


def _rows_both_ways(model, docs, monkeypatch, vocab, **eval_kwargs):
    """evaluate_model's rows scored by chunks of 3 positions, and from full logits."""
    spy = HeadSpy(model.hf.get_output_embeddings() if hasattr(model, "hf") else model.lm_head)
    cfg = small_eval(["4x"])
    with monkeypatch.context() as patch:
        patch.setattr(models.scoring, "LOGIT_CHUNK_ELEMENTS", cfg["batch_size"] * vocab * 3)
        chunked = evaluate_model(
            model, cfg, docs, train_length=TRAIN, progress=False, **eval_kwargs
        )
    chunked_calls = list(spy.positions)
    with monkeypatch.context() as patch:
        full_logits = functools.partial(EvalContext, chunked_scoring=False)
        patch.setattr(bench.eval.evaluate, "EvalContext", full_logits)
        full = evaluate_model(model, cfg, docs, train_length=TRAIN, progress=False, **eval_kwargs)
    full_calls = spy.close()[len(chunked_calls) :]
    assert max(chunked_calls) < TRAIN  # no window's logits at once (passkey: its answer span)
    assert max(full_calls) >= TRAIN  # negative control: the full-logit run made them
    return chunked, full


def _close(a, b, tol) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= tol * max(1.0, abs(b))
    if isinstance(a, (list, tuple, np.ndarray)):
        return np.allclose(np.asarray(a, float), np.asarray(b, float), rtol=tol, atol=tol)
    return a == b


def _assert_same_rows(chunked, full) -> set[str]:
    assert len(chunked) == len(full) and len(chunked) > 20
    for a, b in zip(chunked, full, strict=True):
        assert set(a) == set(b) and a["n"] == b["n"], (a, b)
        tol = 1e-3 if a["metric"] == "position_probe_r2" else 1e-5  # a refit ridge probe
        assert all(_close(a[k], b[k], tol) for k in a), (a, b)
    return {r["metric"] for r in chunked}


def test_every_metric_is_the_same_scored_by_chunks_or_from_full_logits(
    tiny_model, random_docs, monkeypatch
):
    model = tiny_model("rope", train_length=TRAIN)
    docs = random_docs([400] * 6)
    chunked, full = _rows_both_ways(model, docs, monkeypatch, model.model_cfg.vocab_size)
    metrics = _assert_same_rows(chunked, full)
    assert {"nll", "shift_dnll", "order_dnll", "context_nll", "passkey_acc"} <= metrics


def test_every_metric_of_a_pretrained_model_is_the_same_by_chunks(
    hf_model_dirs, hf_text_docs, monkeypatch
):
    lm = load_adapter(hf_model_dirs["llama"], train_length=TRAIN)
    docs = retokenize(hf_text_docs, lm.tokenizer)
    vocab = lm.hf.get_output_embeddings().out_features
    chunked, full = _rows_both_ways(lm, docs, monkeypatch, vocab, tokenizer=lm.tokenizer)
    metrics = _assert_same_rows(chunked, full)
    assert {"nll", "shift_dnll", "order_dnll", "context_nll", "passkey_acc"} <= metrics


def test_generation_computes_the_prompts_last_logits_only(tiny_model, hf_model_dirs):
    model = tiny_model("rope", train_length=TRAIN)
    prompt = torch.randint(0, 256, (2, 30))
    spy = HeadSpy(model.lm_head)
    model.generate_greedy(prompt, max_new_tokens=3)
    assert spy.close() == [1, 1, 1]  # prefill: one position per row, then one per new token
    lm = load_adapter(hf_model_dirs["llama"])
    spy = HeadSpy(lm.hf.get_output_embeddings())
    lm.generate_greedy(prompt, max_new_tokens=3)
    assert spy.close() == [1, 1, 1]
    with torch.no_grad():  # negative control: a plain forward pass computes every position
        spy = HeadSpy(model.lm_head)
        model(prompt)
        assert spy.close() == [30]
