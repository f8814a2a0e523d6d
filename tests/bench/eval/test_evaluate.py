"""evaluate_model, the nll protocols, passkey scoring and the eval configs; each with a negative control."""

import dataclasses
import inspect
import logging
import math
import re
import shutil
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from torch import nn

import bench.schema  # noqa: F401  (stores the typed schema that conf/config.yaml composes)
from bench.data.corpora import Document
from bench.eval.evaluate import evaluate_model, parse_length
from bench.eval.metrics import METRICS, EvalConfig, EvalContext, as_eval_config
from bench.eval.metrics.nll import nll_rows, nll_windows
from bench.eval.metrics.passkey import (
    greedy_passkey_verdicts,
    passkey_context_row,
    passkey_verdicts,
)
from bench.tasks.passkey import QUESTION, passkey_grid
from models.transformer import ScalingConfig

from fixtures import ROOT
from fixtures.jobs import compose_config

CONF = ROOT / "conf" / "eval"
TRAIN = 32
ROW_KEYS = {
    "metric",
    "value",
    "n",
    "eval_length",
    "bucket_lo",
    "bucket_hi",
    "axis",
    "axis_value",
    "layer",
    "ci_lo",
    "ci_hi",
    "span",  # nll under fill: the tokens of each document every length scores
    "template",  # passkey_acc: the template measured
    "doc_nll_sums",  # nll whole window: per document, for a seed x document bootstrap
    "doc_tokens",
}


pytestmark = pytest.mark.usefixtures("one_thread")


def ctx_of(model, batch_size=4):
    return EvalContext(model, progress=False, batch_size=batch_size)


def only(**sections):
    """An eval config with every metric disabled except the given sections."""
    cfg = {name: {"enabled": False} for name in METRICS}
    for name, section in sections.items():
        cfg[name] = {"enabled": True, **section}
    return cfg


def composed(name, conf_dir=None):
    """The ``eval`` section of the default config with ``eval=<name>``, composed as the lenbench
    CLI composes it (conf/config.yaml: the typed schema, then the eval preset), as plain data.
    ``conf_dir``: a copy of the config tree to compose from instead of the packaged one."""
    overrides = [f"eval={name}"]
    if conf_dir is None:
        cfg = compose_config(*overrides)
    else:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
    return OmegaConf.to_container(cfg.eval, resolve=True)


def leaves(mapping, prefix=()):
    """{(key, ...): value} of the non-mapping values of a nested mapping."""
    out = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            out.update(leaves(value, (*prefix, key)))
        else:
            out[(*prefix, key)] = value
    return out


def resolved(mapping, train_length):
    return as_eval_config(mapping).resolve(train_length)


# ---------------------------------------------------------------- configs


def test_the_composed_standard_protocol_is_the_dataclass_defaults(tmp_path, monkeypatch, capsys):
    """The defaults are written once, on the dataclasses: what `lenbench --cfg job` shows for
    eval=standard is EvalConfig() (standard.yaml holds no copy of them)."""
    from bench.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["--cfg", "job", "eval=standard"]) == 0
    shown = OmegaConf.to_container(OmegaConf.create(capsys.readouterr().out).eval)
    assert shown == dataclasses.asdict(EvalConfig())
    assert composed("standard") == shown  # the helper below composes the same way
    assert shown["nll"]["max_docs"] == 64 and shown["passkey"]["threshold"] == 0.8


def test_a_value_in_standard_yaml_reaches_the_composed_config_and_quick(tmp_path):
    """Negative control for the test above: a choice written into standard.yaml changes the
    composed protocol (so the equality is not vacuous), and eval=quick inherits it."""
    shutil.copytree(CONF.parent, tmp_path / "conf")
    standard = tmp_path / "conf" / "eval" / "standard.yaml"
    standard.write_text(standard.read_text() + "batch_size: 3\npasskey: {threshold: 0.5}\n")
    defaults = dataclasses.asdict(EvalConfig())
    changed = composed("standard", tmp_path / "conf")
    assert changed != defaults
    assert {k: v for k, v in leaves(changed).items() if leaves(defaults)[k] != v} == {
        ("batch_size",): 3,
        ("passkey", "threshold"): 0.5,
    }
    quick = composed("quick", tmp_path / "conf")
    assert quick["batch_size"] == 3 and quick["passkey"]["threshold"] == 0.5
    assert quick["passkey"]["depths"] == 3  # and keeps its own changes


def test_eval_presets_hold_only_their_changes():
    """standard.yaml sets no key to its default; quick.yaml no key to what it inherits from
    standard, and every key it sets arrives."""
    defaults = leaves(dataclasses.asdict(EvalConfig()))
    standard = yaml.safe_load((CONF / "standard.yaml").read_text()) or {}
    for key, value in leaves(standard).items():
        assert defaults[key] != value, f"standard.yaml repeats the default {key}={value!r}"
    inherited = leaves(composed("standard"))
    changes = yaml.safe_load((CONF / "quick.yaml").read_text())
    assert changes.pop("defaults") == ["standard", "_self_"]
    quick = leaves(composed("quick"))
    for key, value in leaves(changes).items():
        assert inherited[key] != value, f"quick.yaml repeats {key}={value!r}"
        assert quick[key] == value, key
    for key, value in quick.items():  # the rest is standard's
        if key not in leaves(changes):
            assert value == inherited[key], key
    assert quick[("lengths",)] == ["1x", "2x", "4x"] and quick[("passkey", "depths")] == 3


def test_every_eval_key_is_documented_where_its_default_is_written():
    """Each field of the eval config has a comment (inline or the line above) in the dataclass
    that declares it (or a base class of it), and each section class a docstring."""
    from bench.eval.metrics.config import HarnessConfig
    from bench.eval.metrics.registry import EvalKeys

    classes = [EvalKeys, HarnessConfig, *(metric.config for metric in METRICS.values())]
    for cls in classes:
        assert cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("), cls  # own docstring
        for f in dataclasses.fields(cls):
            documented = False
            for owner in cls.__mro__:
                if f.name not in getattr(owner, "__annotations__", {}):
                    continue
                lines = inspect.getsource(owner).splitlines()
                for i, line in enumerate(lines):
                    if re.match(rf"    {f.name}: ", line):
                        documented |= "#" in line or lines[i - 1].strip().startswith("#")
            assert documented, f"{cls.__name__}.{f.name} has no comment"
    for name in ("standard", "quick"):  # presets: valid, known keys, each change commented
        text = (CONF / f"{name}.yaml").read_text()
        resolved(composed(name), 64)  # no unknown keys, every value valid
        assert set(yaml.safe_load(text) or {}) - {"defaults"} <= set(
            dataclasses.asdict(EvalConfig())
        )
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if re.match(r"\s*\w+:", line) and line.strip() != "defaults:":
                above = lines[i - 1].strip() if i else ""
                assert "#" in line or above.startswith("#"), (
                    f"{name}: {line.strip()} is not documented"
                )


def test_lengths_accept_tokens_and_multiples():
    assert parse_length("4x", 256) == 1024
    assert parse_length("0.25x", 256) == 64
    assert parse_length(300, 256) == 300
    cfg = resolved({"lengths": ["2x", 100, "1x"], "attn_entropy": {"lengths": ["2x", "16x"]}}, 64)
    assert cfg.lengths == [64, 100, 128]
    assert cfg.metrics["attn_entropy"].lengths == [128]  # only eval lengths
    assert cfg.metrics["nll"].lengths == [64, 100, 128]
    assert resolved({}, 10).lengths == [10, 20, 40, 80, 160]
    assert resolved({"passkey": {"depths": 3}}, 10).metrics["passkey"].depths == [0.0, 0.5, 1.0]


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"lenghts": [1]}, "eval.lenghts is an unknown key"),
        ({"nll": {"protocl": "sliding"}}, "eval.nll.protocl is an unknown key"),
        ({"nll": {"protocol": "rolling"}}, "rolling"),
        ({"nll": None}, "eval.nll must be a mapping of keys, got None."),
        ({"nll": {"max_docs": -1}}, "eval.nll.max_docs must be an integer >= 1, got -1."),
        ({"nll": {"max_docs": "abc"}}, "eval.nll.max_docs must be an integer >= 1, got 'abc'."),
        ({"nll": {"ci": 1.0}}, "eval.nll.ci must be a number in (0, 1), got 1.0."),
        ({"lengths": ["fourx"]}, "fourx"),
        ({"lengths": [1.5]}, "1.5"),
        ({"lengths": [1]}, "eval.lengths must hold at least one length of >= 2 tokens"),
        ({"precision": "fp8"}, "fp8"),
        ({"passkey": {"depths": [0.5, 2]}}, "eval.passkey.depths must be a count >= 1 or"),
        ({"passkey": {"threshold": 1.5}}, "eval.passkey.threshold must be a number in [0, 1]"),
        ({"shift_dnll": {"max_docs": 0}}, "max_docs"),
        ({"shift_dnll": {"deltas": ["x2"]}}, "eval.shift_dnll.deltas entry 'x2' is invalid"),
        ({"order_dnll": {"shuffle_block": 0}}, "eval.order_dnll.shuffle_block must be an integer"),
        ({"position_probe_r2": {"ridge": 0}}, "eval.position_probe_r2.ridge must be a number > 0"),
        ({"harness": {"limit": -3}}, "eval.harness.limit must be a number > 0, got -3."),
    ],
)
def test_bad_config_values_raise_clearly(bad, message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        resolved(bad, 64)
    text = str(error.value)
    assert "\n" not in text and text.endswith(".") and text.count(". ") == 0  # one sentence


# ---------------------------------------------------------------- nll


def test_nll_windows_hand_cases():
    assert nll_windows(10, 4, 5, "nonoverlapping", 4) == [(0, 0), (4, 0)]
    assert nll_windows(4, 4, 5, "nonoverlapping", 4) == []  # 4 tokens give only 3 targets
    # span 8 targets, stride 3: windows at 0, 3, 4 (last one ends at the span's end)
    assert nll_windows(10, 4, 5, "sliding", 3) == [(0, 0), (3, 1), (4, 3)]
    assert nll_windows(10, 4, 5, "sliding", 4) == nll_windows(10, 4, 5, "nonoverlapping", 4)
    for doc_len, stride in [(50, 3), (50, 1), (33, 7)]:
        scored = []
        for start, score_from in nll_windows(doc_len, 8, 4, "sliding", stride):
            scored += range(start + score_from, start + 8)
        assert scored == list(range(len(scored)))  # every target once, in order


def manual_nll(model, doc, start, length):
    tokens = doc.tensor(start, start + length + 1)[None]
    with torch.no_grad():
        logits = model(tokens[:, :-1]).logits
    return -logits.log_softmax(-1).gather(-1, tokens[:, 1:, None])[0, :, 0].double()


def test_nll_buckets_and_whole_window_match_an_independent_computation(tiny_model, random_docs):
    """Whole window: every scored token; buckets: the first window of each document only."""
    model = tiny_model()
    docs = random_docs([200, 90, 300, 150])
    length = 64
    rows = nll_rows(ctx_of(model), docs, length, TRAIN, max_docs=10, max_windows=2, bootstrap=100)
    buckets = [r for r in rows if "bucket_lo" in r]
    whole = [r for r in rows if "bucket_lo" not in r]
    assert len(whole) == 1 and whole[0]["axis"] == "docs" and whole[0]["axis_value"] == 4
    windows = {200: 2, 90: 1, 300: 2, 150: 2}
    assert whole[0]["n"] == sum(windows.values()) * length
    assert sum(r["n"] for r in buckets) == len(docs) * length  # first windows
    assert [(r["bucket_lo"], r["bucket_hi"]) for r in buckets][-2:] == [(16, 32), (32, 64)]
    per_token = torch.cat(
        [manual_nll(model, d, k * length, length) for d in docs for k in range(windows[len(d)])]
    )
    assert whole[0]["value"] == pytest.approx(per_token.mean().item(), abs=1e-5)
    first = torch.stack([manual_nll(model, d, 0, length) for d in docs])  # [D, L]
    position = torch.arange(length)
    for r in buckets:
        in_bucket = (position >= r["bucket_lo"]) & (position < r["bucket_hi"])
        assert r["value"] == pytest.approx(first[:, in_bucket].mean().item(), abs=1e-5)
        assert r["ci_lo"] <= r["value"] <= r["ci_hi"]
    assert whole[0]["ci_lo"] < whole[0]["value"] < whole[0]["ci_hi"]
    # per document, in document order: what a seed x document bootstrap resamples
    sums, tokens = whole[0]["doc_nll_sums"], whole[0]["doc_tokens"]
    assert tokens == [windows[len(d)] * length for d in docs]
    assert sum(sums) / sum(tokens) == pytest.approx(whole[0]["value"], rel=1e-12)
    first_doc = torch.cat([manual_nll(model, docs[0], k * length, length) for k in range(2)])
    assert sums[0] == pytest.approx(first_doc.sum().item(), rel=1e-5)


def test_nll_windows_cover_a_span_the_length_does_not_divide():
    """fill with S = 10 targets and windows of 4: windows at 0, 4 and 6 (the last one ends at
    S and scores only targets 8, 9); every target once, none beyond S."""
    assert nll_windows(11, 4, None, "nonoverlapping", 4, span=10) == [(0, 0), (4, 0), (6, 2)]
    assert nll_windows(10, 4, None, "nonoverlapping", 4, span=10) == []  # needs S + 1 tokens
    for length, span, stride, protocol in [
        (4, 10, 4, "nonoverlapping"),
        (3, 16, 3, "nonoverlapping"),
        (6, 16, 2, "sliding"),
        (16, 16, 16, "nonoverlapping"),
    ]:
        scored = []
        for start, score_from in nll_windows(100, length, None, protocol, stride, span=span):
            assert 0 <= score_from < length
            scored += range(start + score_from, start + length)
        assert scored == list(range(span))


def test_sliding_with_stride_equal_to_window_is_nonoverlapping_exactly(tiny_model, random_docs):
    model = tiny_model()
    docs = random_docs([300, 200, 260])
    kwargs = dict(max_docs=3, max_windows=4, bootstrap=50, seed=3)
    plain = nll_rows(ctx_of(model), docs, 64, TRAIN, protocol="nonoverlapping", **kwargs)
    sliding = nll_rows(ctx_of(model), docs, 64, TRAIN, protocol="sliding", stride=64, **kwargs)
    assert plain == sliding
    # negative control: a smaller stride scores the same tokens with more context, so values move
    short = nll_rows(ctx_of(model), docs, 64, TRAIN, protocol="sliding", stride=16, **kwargs)
    assert short[-1]["n"] == plain[-1]["n"]
    assert abs(short[-1]["value"] - plain[-1]["value"]) > 1e-4
    assert sum(r["n"] for r in short[:-1]) == 3 * 64  # buckets: each document's first window


def test_short_docs_are_skipped_and_counted(caplog, tiny_model, random_docs):
    model = tiny_model()
    docs = random_docs([64, 65, 10, 200, 64])  # 64 tokens are one short of a 64-token window
    rows = nll_rows(ctx_of(model), docs, 64, TRAIN, max_docs=10, bootstrap=0)
    assert rows[-1]["axis_value"] == 2 and rows[-1]["n"] == 2 * 64
    assert "ci_lo" not in rows[-1]  # bootstrap 0: no CI
    with caplog.at_level(logging.WARNING, logger="bench.eval.metrics.nll"):
        empty = nll_rows(ctx_of(model), docs, 256, TRAIN, max_docs=10)
    assert len(empty) == 1 and empty[0]["n"] == 0 and empty[0]["axis_value"] == 0
    assert math.isnan(empty[0]["value"])
    assert "no test document has the 257 tokens" in caplog.text


# ---------------------------------------------------------------- one document set per run

#: 1x = 32 and 4x = 128 tokens: every document is long enough for 1x, doc5 also for 2x, only doc1,
#: doc3, doc4 and doc6 (>= 129 tokens) for 4x, so a per-length choice and a per-run choice differ.
MIXED = [40, 200, 45, 150, 300, 100, 140]
LONG_ENOUGH = ["doc1", "doc3", "doc4", "doc6"]
DOC_METRICS = {  # every metric that reads test documents, with settings that run at 1x..4x
    "nll": {"max_docs": 3, "bootstrap": 0},
    "shift_dnll": {"lengths": None, "max_docs": 3, "deltas": [16]},
    "order_dnll": {"max_docs": 3, "block": 8},
    "context_nll": {"max_docs": 3, "block": 8, "contexts": [0, 8]},
    "attn_entropy": {"lengths": None, "max_docs": 3},
    "position_probe_r2": {"lengths": None, "fit_docs": 2, "test_docs": 2},
}


@pytest.fixture
def documents_read(monkeypatch):
    """Ids of the documents whose tokens were read, by slice width (eval length or length + 1)."""
    read = defaultdict(set)
    tensor = Document.tensor

    def spy(doc, start=0, end=None):
        out = tensor(doc, start, end)
        read[out.numel()].add(doc.id)
        return out

    monkeypatch.setattr(Document, "tensor", spy)
    return read


def by_length(read, lengths):
    """Document ids read at each eval length (windows of L or L + 1 tokens)."""
    return {length: read.get(length, set()) | read.get(length + 1, set()) for length in lengths}


@pytest.mark.parametrize("metric", list(DOC_METRICS))
def test_every_length_reads_the_same_documents(metric, documents_read, tiny_model, random_docs):
    cfg = only(**{metric: DOC_METRICS[metric]}) | {"lengths": ["1x", "2x", "4x"]}
    model = tiny_model()
    rows = evaluate_model(model, cfg, random_docs(MIXED), train_length=TRAIN, progress=False)
    assert {r["eval_length"] for r in rows} == {32, 64, 128}
    read = by_length(documents_read, [32, 64, 128])
    assert read[32] == read[64] == read[128]
    assert read[128] <= set(LONG_ENOUGH) and len(read[128]) >= 2  # capped by its own max_docs
    # control: when 4x is not an eval length, the shorter documents long enough for 2x are read
    documents_read.clear()
    cfg["lengths"] = ["1x", "2x"]
    evaluate_model(model, cfg, random_docs(MIXED), train_length=TRAIN, progress=False)
    assert by_length(documents_read, [32])[32] - set(LONG_ENOUGH)


def test_nll_at_each_length_is_the_mean_over_the_common_documents(tiny_model, random_docs):
    model, docs = tiny_model(), random_docs(MIXED)
    cfg = only(nll={"max_docs": 10, "bootstrap": 0}) | {"lengths": ["1x", "4x"]}
    rows = evaluate_model(model, cfg, docs, train_length=TRAIN, progress=False)
    whole = {r["eval_length"]: r for r in rows if "bucket_lo" not in r}
    common = [d for d in docs if d.id in LONG_ENOUGH]
    for length in (32, 128):
        # max_windows: fill -> each document's first 128 tokens, in windows of the length
        by_hand = torch.cat(
            [manual_nll(model, d, k * length, length) for d in common for k in range(128 // length)]
        )
        assert whole[length]["value"] == pytest.approx(by_hand.mean().item(), abs=1e-5)
        assert whole[length]["axis"] == "docs" and whole[length]["axis_value"] == len(common)
        assert whole[length]["n"] == len(common) * 128
    # negative control: the 1x mean over every document (a per-length set) is another number
    every = torch.cat([manual_nll(model, d, 0, 32) for d in docs]).mean().item()
    assert abs(every - whole[32]["value"]) > 1e-4


class UnigramLM(nn.Module):
    """Logits that depend on the current token only: its NLL of a token does not depend on the
    window it is read in, so any difference between lengths comes from which tokens are scored."""

    def __init__(self, vocab: int = 259):
        super().__init__()
        self.table = nn.Parameter(
            torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0))
        )

    def forward(self, input_ids, **kwargs):
        return SimpleNamespace(logits=self.table[input_ids])


def test_nll_fill_scores_the_same_tokens_at_every_length(random_docs):
    docs = random_docs([300] * 6)
    lengths = ["1x", "2x", "4x"]
    fill = evaluate_model(
        UnigramLM(),
        only(nll={"bootstrap": 0}) | {"lengths": lengths},
        docs,
        train_length=TRAIN,
        progress=False,
    )
    whole = [r for r in fill if "bucket_lo" not in r]
    assert [r["n"] for r in whole] == [6 * 128] * 3
    assert max(r["value"] for r in whole) - min(r["value"] for r in whole) < 1e-9
    # control: the first window only scores other tokens at each length
    first = evaluate_model(
        UnigramLM(),
        only(nll={"bootstrap": 0, "max_windows": 1}) | {"lengths": lengths},
        docs,
        train_length=TRAIN,
        progress=False,
    )
    whole = [r for r in first if "bucket_lo" not in r]
    assert [r["n"] for r in whole] == [6 * 32, 6 * 64, 6 * 128]
    assert max(r["value"] for r in whole) - min(r["value"] for r in whole) > 1e-3


def test_nll_fill_scores_the_same_tokens_when_lengths_do_not_divide_the_longest(random_docs):
    """The audit's case: lengths 1.25x, 1.5x and 3x (40, 48, 96 tokens). Before, 1.25x scored 2
    windows of 40 = 80 of the 96 tokens (the end dropped); now every length scores exactly the
    first 96 (the ``span`` recorded), so a model that ignores context gives one NLL everywhere."""
    docs = random_docs([300] * 5)
    rows = evaluate_model(
        UnigramLM(),
        only(nll={"bootstrap": 0}) | {"lengths": ["1.25x", "1.5x", "3x"]},
        docs,
        train_length=TRAIN,
        progress=False,
    )
    whole = [r for r in rows if "bucket_lo" not in r]
    assert [r["eval_length"] for r in whole] == [40, 48, 96]
    assert [r["n"] for r in whole] == [5 * 96] * 3 and {r["span"] for r in rows} == {96}
    assert max(r["value"] for r in whole) - min(r["value"] for r in whole) < 1e-9


class PositionLM(nn.Module):
    """Logits that depend on the token and its position in the window (not on other tokens):
    a bucket's NLL changes only if the bucket holds other tokens."""

    def __init__(self, vocab: int = 259, positions: int = 512):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.table = nn.Parameter(torch.randn(vocab, vocab, generator=g))
        self.bias = nn.Parameter(torch.randn(positions, vocab, generator=g))

    def forward(self, input_ids, **kwargs):
        n = input_ids.shape[1]
        return SimpleNamespace(logits=self.table[input_ids] + self.bias[None, :n])


def test_nll_buckets_hold_the_same_tokens_at_every_length(random_docs):
    """The audit's case: bucket [0, 32) at 1x and at 4x under fill. From first windows it holds
    each document's first 32 tokens at both lengths, so a model whose prediction at a position
    cannot depend on later tokens gives the same value; pooled over every window (before) it
    held the starts of later windows too, and the values differed (the negative control)."""
    docs = random_docs([300] * 6)
    rows = evaluate_model(
        PositionLM(),
        only(nll={"bootstrap": 0, "buckets": [0, 32, 64, 128]}) | {"lengths": ["1x", "4x"]},
        docs,
        train_length=TRAIN,
        progress=False,
    )
    first = {r["eval_length"]: r for r in rows if r.get("bucket_lo") == 0}
    assert first[32]["n"] == first[128]["n"] == 6 * 32
    assert first[32]["value"] == pytest.approx(first[128]["value"], abs=1e-9)
    model = PositionLM()
    pooled_1x = torch.cat([manual_nll(model, d, k * 32, 32) for d in docs for k in range(4)])
    assert abs(pooled_1x.mean().item() - first[128]["value"]) > 1e-3


def test_nll_max_windows_is_fill_or_a_positive_integer():
    for bad in ("all", 0, -1):
        with pytest.raises(ValueError, match="max_windows"):
            as_eval_config({"nll": {"max_windows": bad}})


def test_a_document_too_short_for_the_longest_length_is_read_at_no_length(
    documents_read, tiny_model, random_docs
):
    model, docs = tiny_model(), random_docs([200, 200, 100, 200])  # doc2: 65..128 tokens
    cfg = only(nll={"bootstrap": 0}) | {"lengths": ["1x", "2x", "4x"]}
    rows = evaluate_model(model, cfg, docs, train_length=TRAIN, progress=False)
    assert [r["axis_value"] for r in rows if r.get("axis") == "docs"] == [3, 3, 3]
    assert all("doc2" not in ids for ids in documents_read.values())
    # control: without 4x, doc2 is long enough and is read at every length
    documents_read.clear()
    rows = evaluate_model(
        model, cfg | {"lengths": ["1x", "2x"]}, docs, train_length=TRAIN, progress=False
    )
    assert [r["axis_value"] for r in rows if r.get("axis") == "docs"] == [4, 4]
    assert all("doc2" in ids for ids in documents_read.values())


def test_no_document_long_enough_for_the_longest_length_raises_before_any_work(
    documents_read, tiny_model, random_docs
):
    cfg = only(nll={"bootstrap": 0}, shift_dnll={}) | {"lengths": ["1x", "4x"]}
    with pytest.raises(ValueError) as error:
        evaluate_model(
            tiny_model(), cfg, random_docs([40, 100]), train_length=TRAIN, progress=False
        )
    text = str(error.value)
    assert "129 tokens" in text and "eval length 128" in text and "2 test documents" in text
    assert "\n" not in text and text.endswith(".") and text.count(". ") == 0  # one sentence
    assert not documents_read  # raised before any metric read a document
    # control: a run that reads no document (passkey with its generated filler) needs none
    passkey_only = only(passkey={"trials": 1, "depths": 1}) | {"lengths": [300]}
    assert evaluate_model(PasskeyOracle(), passkey_only, [], train_length=TRAIN, progress=False)


# ---------------------------------------------------------------- passkey


class PasskeyOracle(nn.Module):
    """Reads the key from the needle and answers it, except for keys divisible by 3 (last digit off)
    and for sequences longer than ``fail_beyond`` tokens. Greedy decoding without a cache."""

    def __init__(self, fail_beyond=10**9):
        super().__init__()
        self.fail_beyond = fail_beyond
        self.dummy = nn.Parameter(torch.zeros(1))

    def answer(self, key: int) -> str:
        """Right for most keys; a wrong last digit when key % 3 == 0, and the key followed by an
        extra digit ("12345" for 1234: a longer number) when key % 5 == 0."""
        text = f" {key}"
        if key % 3 == 0:
            text = text[:-1] + str((int(text[-1]) + 1) % 10)
        elif key % 5 == 0:
            text += "7"
        return text

    def forward(self, input_ids, position_ids=None, attention_mask=None, **_):
        n, length = input_ids.shape
        logits = torch.zeros(n, length, 259)
        for row in range(n):
            text = bytes(input_ids[row].tolist()).decode("latin-1")
            key = int(re.search(r"The pass key is (\d+)\.", text).group(1))
            answer = self.answer(key) if length <= self.fail_beyond else " 0"
            end = text.rfind(QUESTION) + len(QUESTION)  # index of the first answer token
            for t in range(end - 1, length):
                if 0 <= t + 1 - end < len(answer):
                    logits[row, t, ord(answer[t + 1 - end])] = 10.0
        return SimpleNamespace(logits=logits)

    def generate_greedy(self, input_ids, max_new_tokens, attention_mask=None):
        ids = input_ids
        for _ in range(max_new_tokens):
            ids = torch.cat([ids, self(ids).logits[:, -1:].argmax(-1)], dim=1)
        return ids[:, input_ids.shape[1] :]


def test_teacher_forced_passkey_equals_greedy_on_an_oracle():
    examples = passkey_grid([260, 300], [0.0, 0.5, 1.0], trials=4, seed=1)
    oracle = PasskeyOracle()
    teacher = passkey_verdicts(oracle, examples, batch_size=5, device="cpu")
    greedy = greedy_passkey_verdicts(oracle, examples, batch_size=5, device="cpu")
    truth = [e.key % 3 != 0 and e.key % 5 != 0 for e in examples]
    assert teacher == greedy == truth
    assert any(truth) and not all(truth)  # both verdicts occur: the equality is not vacuous
    # The "key continues" case occurs, and only the end-of-key check rejects it.
    assert any(e.key % 5 == 0 and e.key % 3 != 0 for e in examples)


@pytest.mark.parametrize("kind", ["rope", "alibi"])
def test_teacher_forced_passkey_equals_greedy_on_a_decoder(kind, tiny_model):
    """A random model fails real keys, so score it on its own greedy continuations (all True) and on
    corrupted ones (all False): teacher forcing must agree with KV-cache greedy decoding on both."""
    model = tiny_model(kind, train_length=128)
    examples = passkey_grid([256], [0.0, 1.0], trials=3, seed=0)
    real = passkey_verdicts(model, examples, 4, "cpu")
    assert real == greedy_passkey_verdicts(model, examples, 4, "cpu")
    prompts = torch.tensor([e.prompt_ids for e in examples[:1]])
    own, ends = [], []
    for e in examples:
        prompts = torch.tensor([e.prompt_ids])
        tokens = model.generate_greedy(prompts, len(e.answer_ids) + 1)[0].tolist()
        own.append(dataclasses.replace(e, answer_ids=tokens[:-1]))
        ends.append(not chr(tokens[-1]).isdigit())  # the verdict also needs the key to end
    wrong = [
        dataclasses.replace(e, answer_ids=e.answer_ids[:-1] + [(e.answer_ids[-1] + 1) % 256])
        for e in own
    ]
    mixed = own + wrong
    expected = ends + [False] * len(wrong)
    assert passkey_verdicts(model, mixed, 4, "cpu") == expected
    assert greedy_passkey_verdicts(model, mixed, 4, "cpu") == expected


def test_passkey_rows_and_context_through_evaluate_model():
    oracle = PasskeyOracle(fail_beyond=300)
    cfg = only(passkey={"depths": [0.0, 1.0], "trials": 3, "threshold": 0.6})
    cfg["lengths"] = [64, 260, 290, 400]
    rows = evaluate_model(oracle, cfg, [], train_length=130, scaling=None, progress=False)
    acc = [r for r in rows if r["metric"] == "passkey_acc"]
    assert {r["eval_length"] for r in acc} == {260, 290, 400}  # 64 is below the template minimum
    overall = {r["eval_length"]: r["value"] for r in acc if r.get("axis") == "template"}
    assert all(r["axis_value"] == "landmark" for r in acc if r.get("axis") == "template")
    for length in (260, 290):  # the oracle's own rule, on the same seeded grid
        keys = [e.key for e in passkey_grid([length], [0.0, 1.0], 3, seed=0)]
        assert overall[length] == pytest.approx(np.mean([k % 3 != 0 and k % 5 != 0 for k in keys]))
    assert overall[400] == 0.0 and overall[260] < 0.6 < overall[290]  # 0.6: the threshold below
    by_depth = [r for r in acc if r.get("axis") == "depth"]
    assert sorted({r["axis_value"] for r in by_depth}) == [0.0, 1.0] and all(
        r["n"] == 3 for r in by_depth
    )
    (context,) = [r for r in rows if r["metric"] == "passkey_context"]
    assert context["value"] == 290 and context["eval_length"] == 290 and context["n"] == 3
    assert context["axis"] == "threshold" and context["axis_value"] == 0.6  # the configured one
    none = passkey_context_row({256: 0.5, 512: 0.9}, 0.95)
    assert none["value"] == 0 and none["eval_length"] == 0 and none["n"] == 2
    assert none["axis_value"] == 0.95
    # the threshold decides: at 0.4 both lengths pass; when only the shorter passes, it wins
    assert passkey_context_row({256: 0.5, 512: 0.9}, 0.4)["value"] == 512
    assert passkey_context_row({256: 0.5, 512: 0.0}, 0.4)["value"] == 256


# ---------------------------------------------------------------- evaluate_model


def test_quick_config_runs_every_metric_and_restores_the_model(tiny_model, random_docs):
    model = tiny_model("rope")
    model.train()
    cfg = composed("quick")
    cfg["passkey"]["lengths"] = []  # passkey needs >= 253 tokens; covered above
    docs = random_docs([30, 140, 140, 140, 140, 140])
    scaling = ScalingConfig(name="yarn", method="yarn", params={"factor": "auto"})
    rows = evaluate_model(model, cfg, docs, train_length=TRAIN, scaling=scaling, progress=False)
    metrics = {r["metric"] for r in rows}
    assert metrics == {
        "nll",
        "shift_dnll",
        "order_dnll",
        "context_nll",
        "attn_entropy",
        "position_probe_r2",
    }
    assert {r["eval_length"] for r in rows} == {32, 64, 128}
    for r in rows:
        assert set(r) <= ROW_KEYS and {"metric", "value", "n", "eval_length"} <= set(r)
        assert isinstance(r["value"], float) and isinstance(r["n"], int)
    assert model.training and model.scaling.method == "default"
    # the scaling was active: factor auto at 4x changes the 4x NLL versus the raw model
    raw = evaluate_model(
        model,
        only(nll={"max_docs": 5}) | {"lengths": ["4x"]},
        docs,
        train_length=TRAIN,
        scaling=None,
        progress=False,
    )
    scaled = [
        r for r in rows if r["metric"] == "nll" and r["eval_length"] == 128 and "bucket_lo" not in r
    ]
    assert abs(raw[-1]["value"] - scaled[0]["value"]) > 1e-4


def test_learned_table_lengths_beyond_the_table_are_skipped(caplog, tiny_model, random_docs):
    model = tiny_model("learned")
    cfg = only(nll={"bootstrap": 0}) | {"lengths": ["1x", "2x"]}
    with caplog.at_level(logging.WARNING, logger="bench.eval.evaluate"):
        rows = evaluate_model(
            model, cfg, random_docs([100] * 2), train_length=TRAIN, scaling=None, progress=False
        )
    assert {r["eval_length"] for r in rows} == {TRAIN}
    assert "eval length 64 skipped" in caplog.text
    # negative control: a clamping table runs at 2x
    clamp = tiny_model("learned", out_of_range="clamp")
    rows = evaluate_model(
        clamp, cfg, random_docs([100] * 2), train_length=TRAIN, scaling=None, progress=False
    )
    assert {r["eval_length"] for r in rows} == {TRAIN, 2 * TRAIN}


def test_bf16_precision_runs_close_to_fp32(tiny_model, random_docs):
    model = tiny_model()
    docs = random_docs([100] * 2)
    cfg = only(nll={"bootstrap": 0}) | {"lengths": [64]}
    fp32 = evaluate_model(model, cfg, docs, train_length=TRAIN, scaling=None, progress=False)
    bf16 = evaluate_model(
        model, cfg | {"precision": "bf16"}, docs, train_length=TRAIN, scaling=None, progress=False
    )
    assert bf16[-1]["value"] == pytest.approx(fp32[-1]["value"], abs=0.05)
    assert bf16[-1]["value"] != fp32[-1]["value"]


def test_a_resolved_config_runs_as_its_mapping_and_must_match_the_training_length(
    tiny_model, random_docs
):
    model, docs = tiny_model(), random_docs([100] * 2)
    cfg = only(nll={"bootstrap": 0}) | {"lengths": ["1x", 48]}
    run = resolved(cfg, TRAIN)
    assert run.lengths == [TRAIN, 48] and run.to_dict()["nll"]["lengths"] == [TRAIN, 48]
    rows = evaluate_model(model, run, docs, train_length=TRAIN, progress=False)
    assert rows == evaluate_model(model, cfg, docs, train_length=TRAIN, progress=False)
    with pytest.raises(ValueError, match="resolved for train_length 32, not 64"):
        evaluate_model(model, run, docs, train_length=64, progress=False)


# ---------------------------------------------------------------- one scaling factor per run (issue 11, item 2)

STUDY = only(  # the scaling_study protocol in small: every continuous metric, 1x..4x
    nll={"max_docs": 3, "bootstrap": 0},
    order_dnll={"max_docs": 2, "block": 16},
    context_nll={"max_docs": 2, "block": 16, "contexts": [0, 16, 48, 112]},
    attn_entropy={"lengths": None, "max_docs": 1},
) | {"lengths": ["1x", "2x", "4x"]}
NTK = ScalingConfig(name="ntk", method="ntk", params={"alpha": "auto"})
DYNAMIC = ScalingConfig(name="dynamic", method="dynamic", params={"factor": 1.0})
CELL = ("metric", "eval_length", "bucket_lo", "bucket_hi", "axis", "axis_value", "layer")


def cells(rows):
    """{(metric, eval_length, bucket, axis value, layer): value} of result rows."""
    out = {tuple(r.get(k) for k in CELL): r["value"] for r in rows}
    assert len(out) == len(rows)
    return out


def study(model, docs, scaling, cfg=STUDY):
    return cells(
        evaluate_model(model, cfg, docs, train_length=TRAIN, scaling=scaling, progress=False)
    )


def test_static_ntk_keeps_one_factor_and_differs_from_dynamic_below_the_target(
    tiny_model, random_docs
):
    """Static NTK (alpha auto = 4x / 1x = 4 for the whole run) against dynamic NTK (the base from
    the length read): equal only where dynamic reads the target length, different everywhere else."""
    model, docs = tiny_model("rope"), random_docs([200] * 3)
    static, dynamic = study(model, docs, NTK), study(model, docs, DYNAMIC)
    assert static.keys() == dynamic.keys() and len(static) > 60
    target, block = 4 * TRAIN, 16
    same, gaps = 0, []
    for key, value in static.items():
        metric, length, _, bucket_hi, _, context, _ = key
        if bucket_hi == 1:
            continue  # position 0 is never rotated: no frequency can change it
        reads = context + block if metric == "context_nll" else length  # tokens the model reads
        if reads == target:  # dynamic's base at 128 tokens = static's base for alpha 128 / 32
            assert value == dynamic[key], key
            same += 1
        else:  # bit-identical before issue 11 wherever dynamic reads the eval length
            assert value != dynamic[key], key
            gaps.append(abs(value - dynamic[key]))
    assert same >= 10 and len(gaps) >= 30 and max(gaps) > 1e-3


def test_oracle_factor_follows_each_eval_length_as_before(tiny_model, random_docs):
    """Control: ``oracle=True`` gives each eval length its own factor (the rule before issue 11),
    so its whole-window NLL is the dynamic method's again, at every length."""
    model, docs = tiny_model("rope"), random_docs([200] * 3)
    oracle = dataclasses.replace(NTK, oracle=True)
    per_length = study(model, docs, oracle)
    for multiple in (1, 2, 4):
        length = multiple * TRAIN
        fixed = ScalingConfig(name="ntk", method="ntk", params={"alpha": float(multiple)})
        # the same scored tokens as the 1x..4x run: windows filling its longest length
        nll = STUDY["nll"] | {"max_windows": 4 // multiple}
        alone = study(model, docs, fixed, STUDY | {"lengths": [length], "nll": nll})
        assert alone == {k: v for k, v in per_length.items() if k[1] == length}
    dynamic = study(model, docs, DYNAMIC)
    whole = [k for k in per_length if k[0] == "nll" and k[2] is None]
    assert len(whole) == 3 and all(per_length[k] == dynamic[k] for k in whole)
    static = study(model, docs, NTK)  # negative control: the run factor differs below 4x
    assert all(static[k] != per_length[k] for k in whole if k[1] < 4 * TRAIN)
