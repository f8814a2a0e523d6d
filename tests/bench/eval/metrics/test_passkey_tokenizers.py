"""Pretrained models' tokenizers: passkey verdicts on text are right for any tokenizer, and
every nll window has the same form (BOS where the tokenizer adds one).

An oracle model generates exactly the answer's tokens, then ".": every example must pass, with a
byte-level BPE and with a SentencePiece (Metaspace) tokenizer, whose decoding of the answer
alone drops its leading space (the defect: a perfect model scored 0). A model that generates
another key, or the key with one more digit, must fail.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from bench.eval.metrics.context import EvalContext
from bench.eval.metrics.passkey import generated_answer_matches, passkey_rows
from bench.tasks.passkey import answer_matches, passkey_grid

from fixtures.hf import train_bpe_tokenizer, train_sentencepiece_tokenizer

LENGTH = 300
DEPTHS = [0.0, 0.5, 1.0]
TRIALS = 2


class ScriptedModel(nn.Module):
    """Greedy generation from a script: prompt -> the tokens it generates (then ".")."""

    def __init__(self, script: dict[tuple[int, ...], list[int]], stop: int):
        super().__init__()
        self.script, self.stop = script, stop

    def generate_greedy(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        rows = []
        for prompt in input_ids.tolist():
            out = (self.script[tuple(prompt)] + [self.stop] * max_new_tokens)[:max_new_tokens]
            rows.append(out)
        return torch.tensor(rows)


def _examples(tokenizer):
    return passkey_grid([LENGTH], DEPTHS, TRIALS, seed=0, tokenizer=tokenizer)


def _accuracy(tokenizer, answer_of) -> float:
    """passkey_acc of a scripted model that generates ``answer_of(example)``."""
    stop = tokenizer.encode(".", add_special_tokens=False)[-1]
    script = {tuple(e.prompt_ids): answer_of(e) for e in _examples(tokenizer)}
    ctx = EvalContext(ScriptedModel(script, stop), progress=False, tokenizer=tokenizer)
    rows = passkey_rows(ctx, LENGTH, depths=DEPTHS, trials=TRIALS, seed=0)
    # every row, per depth too, names its template (two templates on one model never collide)
    assert {r["template"] for r in rows} == {"landmark"} and len(rows) == len(DEPTHS) + 1
    return next(r["value"] for r in rows if r["axis"] == "template")


TOKENIZERS = {"byte-level BPE": train_bpe_tokenizer, "SentencePiece": train_sentencepiece_tokenizer}


@pytest.fixture(scope="module", params=list(TOKENIZERS))
def tokenizer(request):
    return TOKENIZERS[request.param]()


def test_an_oracle_scores_every_example(tokenizer) -> None:
    assert _accuracy(tokenizer, lambda e: list(e.answer_ids)) == 1.0


def test_another_key_scores_zero(tokenizer) -> None:
    def wrong(e):
        text = e.answer_text.replace(str(e.key), str(e.key + 1))
        return tokenizer.encode(text, add_special_tokens=False)

    assert _accuracy(tokenizer, wrong) == 0.0


def test_a_longer_number_scores_zero(tokenizer) -> None:
    digit = tokenizer.encode("7", add_special_tokens=False)[-1]
    assert _accuracy(tokenizer, lambda e: [*e.answer_ids, digit]) == 0.0


def test_the_sentencepiece_fixture_has_the_defect_decoding_alone_would_hit() -> None:
    """Negative control of the fixture: decoded alone, its answer loses the leading space, so
    judging the text of the generated tokens alone scores a perfect model 0."""
    tok = train_sentencepiece_tokenizer()
    e = _examples(tok)[0]
    assert e.answer_text.startswith(" ")
    alone = tok.decode(e.answer_ids, skip_special_tokens=True)
    assert not answer_matches(alone, e.answer_text)
    assert generated_answer_matches(tok, e, list(e.answer_ids))


# --------------------------------------------------------------------------- window form


class RecordingLM(nn.Module):
    """Uniform logits; records every input window it reads."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.inputs = vocab, []

    def forward(self, input_ids, **kwargs):
        from types import SimpleNamespace

        self.inputs.append(input_ids.clone())
        return SimpleNamespace(logits=torch.zeros(*input_ids.shape, self.vocab))


def test_every_nll_window_starts_with_the_bos_the_tokenizer_adds() -> None:
    """The audit's case: only a document's first window started with BOS, so short lengths (more
    windows) carried more BOS-less starts. Now every window starts with it, unscored."""
    from bench.data.corpora import Document
    from bench.data.pretrained_documents import window_bos
    from bench.eval.metrics.nll import nll_rows

    tok = train_sentencepiece_tokenizer()
    bos = window_bos(tok)
    assert bos == tok.bos_token_id
    assert window_bos(train_bpe_tokenizer()) is None  # adds no BOS: windows start with text
    text = "def f(x):\n    return x + 1\n" * 40
    docs = [Document(f"d{i}", np.asarray(tok(text)["input_ids"], dtype=np.int32)) for i in range(3)]
    for with_bos, expected in ((bos, True), (None, False)):
        model = RecordingLM(len(tok))
        ctx = EvalContext(model, progress=False, tokenizer=tok, window_bos=with_bos)
        rows = nll_rows(ctx, docs, 32, 32, max_windows=None, span=128, bootstrap=0)
        starts = torch.cat([x[:, 0] for x in model.inputs])
        assert len(starts) == 3 * 4  # 4 windows per document
        assert bool((starts == bos).all()) is expected  # control: without it, only first ones
        assert rows[-1]["n"] == 3 * 128  # the same targets either way
