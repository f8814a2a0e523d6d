"""Tokenizer, corpora (pycorpus/text/hf), splits, fingerprints and training batches."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.data.corpora import (
    SPLITS,
    Corpus,
    assign_split,
    clear_corpus_cache,
    corpus_fingerprint,
    load_corpus,
    stdlib_root,
)
from bench.data.tokenizer import ByteTokenizer
from bench.schema import DataConfig
from bench.tasks.passkey import TASK_DESCRIPTION, min_passkey_length
from bench.tasks.text import STANDARD_FILLER
from bench.train.batches import TrainingStream, concat_documents, validation_batches

TOK = ByteTokenizer()
TRAIN_LENGTH = 256


@pytest.fixture(scope="module")
def pycorpus() -> Corpus:
    return load_corpus(DataConfig())  # the default: pycorpus


# --------------------------------------------------------------------------- tokenizer


def test_tokenizer_constants() -> None:
    assert (TOK.BOS, TOK.EOS, TOK.PAD, TOK.vocab_size) == (256, 257, 258, 259)


@pytest.mark.parametrize("text", ["", "hello", "héllo wörld", "数据 🎉 ß", "tab\tnew\nline"])
def test_tokenizer_roundtrip(text: str) -> None:
    ids = TOK.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert all(0 <= i < 256 for i in ids)
    assert TOK.decode(ids) == text


def test_tokenizer_non_ascii_is_multibyte_and_specials() -> None:
    text = "数🎉"
    ids = TOK.encode(text, add_bos=True, add_eos=True)
    # Negative control: a char-level tokenizer would give 2 ids; UTF-8 bytes give 3 + 4.
    assert len(ids) == 2 + 3 + 4
    assert ids[0] == TOK.BOS and ids[-1] == TOK.EOS
    assert TOK.decode(ids + [TOK.PAD]) == text  # specials are skipped
    assert TOK.decode(torch.tensor(ids)) == text  # tensors accepted


def test_tokenizer_invalid_utf8_and_out_of_range() -> None:
    assert TOK.decode([0xFF, ord("a")]) == "\ufffda"
    with pytest.raises(ValueError, match="259"):
        TOK.decode([259])
    with pytest.raises(ValueError, match="-1"):
        TOK.decode([-1])


# --------------------------------------------------------------------------- splits, fingerprint


def test_assign_split_is_sha256_based_and_stable() -> None:
    # Golden values: they must never change, or old checkpoints' test sets would move.
    assert assign_split("asyncio/base_events.py") == "test"
    assert assign_split("json/decoder.py") == "train"
    assert assign_split("os.py") == "train"
    # Independent recomputation of the documented rule.
    for key in ["os.py", "a/b.txt", "train/17"]:
        u = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
        expected = "train" if u < 0.9 else "validation" if u < 0.95 else "test"
        assert assign_split(key) == expected
    # Fractions matter: os.py hashes to 0.85, so it moves to validation when train is 0.8.
    assert assign_split("os.py", {"train": 0.8, "validation": 0.1, "test": 0.1}) == "validation"
    assert assign_split("asyncio/base_events.py", [1.0, 0.0, 0.0]) == "train"


def test_split_fractions_are_respected_statistically() -> None:
    keys = [f"doc{i}.txt" for i in range(4000)]
    counts = {s: 0 for s in SPLITS}
    for k in keys:
        counts[assign_split(k, {"train": 0.6, "validation": 0.3, "test": 0.1})] += 1
    assert abs(counts["train"] / 4000 - 0.6) < 0.03
    assert abs(counts["validation"] / 4000 - 0.3) < 0.03
    assert abs(counts["test"] / 4000 - 0.1) < 0.02


@pytest.mark.parametrize(
    "bad", [[0.5, 0.5, 0.5], {"train": 1.0, "dev": 0.0}, [1.2, -0.2, 0.0], "x"]
)
def test_bad_split_fractions_raise(bad: object) -> None:
    with pytest.raises(ValueError, match="split_fractions"):
        assign_split("a", bad)


def test_fingerprint_depends_on_ids_sizes_and_split_protocol_only(monkeypatch) -> None:
    base = corpus_fingerprint([("a.txt", 3), ("b/c.txt", 10)])
    assert (
        base == "27aea058856f9422"
    )  # golden (was 4bb68aeb82213872 before the split protocol entered it)
    assert corpus_fingerprint([("b/c.txt", 10), ("a.txt", 3)]) == base  # order-free
    assert corpus_fingerprint([("a.txt", 4), ("b/c.txt", 10)]) != base
    assert corpus_fingerprint([("a2.txt", 3), ("b/c.txt", 10)]) != base
    assert len(base) == 16
    # A new way of making splits makes every old checkpoint and result row stale.
    monkeypatch.setattr("bench.data.corpora.SPLIT_PROTOCOL", "another-protocol")
    assert corpus_fingerprint([("a.txt", 3), ("b/c.txt", 10)]) != base


# --------------------------------------------------------------------------- text corpus


def _write_text_corpus(root: Path, n: int = 30) -> None:
    (root / "sub").mkdir(parents=True)
    for i in range(n):
        folder = root / "sub" if i % 3 == 0 else root
        (folder / f"doc{i:02d}.txt").write_bytes(f"document {i} ".encode() * (20 + i))
    (root / "ignored.md").write_text("not a txt file")
    (root / "empty.txt").write_text("")


def test_text_corpus_split_fingerprint_and_cache(tmp_path: Path) -> None:
    clear_corpus_cache()
    _write_text_corpus(tmp_path)
    cfg = DataConfig(name="text", paths=[str(tmp_path)])
    corpus = load_corpus(cfg)
    ids = [d.id for d in corpus.documents]
    assert len(ids) == 30  # .md ignored, empty file skipped
    assert ids == sorted(ids) and "sub/doc00.txt" in ids
    # Disjoint and covering.
    parts = [{d.id for d in corpus.split(s)} for s in SPLITS]
    assert sum(len(p) for p in parts) == 30 and set().union(*parts) == set(ids)
    assert all(corpus.assignment[i] == assign_split(i) for i in ids)
    assert corpus.documents[0].tokens.dtype == np.int16
    assert TOK.decode(corpus.documents[0].tokens) == (tmp_path / ids[0]).read_text()

    # Stable: same files -> same fingerprint, served from the cache.
    again = load_corpus(cfg)
    assert again is corpus and again.fingerprint == corpus.fingerprint

    # Same size, different content: fingerprint unchanged (documented: sizes only).
    target = tmp_path / "doc01.txt"
    data = target.read_bytes()
    target.write_bytes(data.upper())
    assert load_corpus(cfg).fingerprint == corpus.fingerprint

    # A size change -> new fingerprint, and the new content is read (no stale cache).
    target.write_bytes(data + b"more")
    changed = load_corpus(cfg)
    assert changed.fingerprint != corpus.fingerprint
    assert len(next(d for d in changed.documents if d.id == "doc01.txt")) == len(data) + 4

    # An added file also changes it.
    (tmp_path / "doc99.txt").write_text("new")
    assert load_corpus(cfg).fingerprint not in {corpus.fingerprint, changed.fingerprint}


def test_text_glob_and_explicit_files(tmp_path: Path) -> None:
    _write_text_corpus(tmp_path)
    corpus = load_corpus({"name": "text", "paths": str(tmp_path / "**" / "doc0*.txt")})
    assert sorted(d.id for d in corpus.documents) == sorted(
        [f"doc{i:02d}.txt" for i in range(10) if i % 3]
        + [f"sub/doc{i:02d}.txt" for i in (0, 3, 6, 9)]
    )
    single = load_corpus({"name": "text", "paths": [str(tmp_path / "ignored.md")]})
    assert [d.id for d in single.documents] == ["ignored.md"]


def test_text_pattern_matching_nothing_raises(tmp_path: Path) -> None:
    _write_text_corpus(tmp_path)
    pattern = str(tmp_path / "nothing-*.txt")
    with pytest.raises(ValueError, match="nothing-"):
        load_corpus({"name": "text", "paths": [str(tmp_path / "doc01.txt"), pattern]})
    with pytest.raises(ValueError, match="missing.txt"):
        load_corpus({"name": "text", "paths": [str(tmp_path / "missing.txt")]})
    with pytest.raises(ValueError, match="paths is required"):
        load_corpus({"name": "text", "paths": "???"})


def test_caps_are_deterministic_subsets(tmp_path: Path) -> None:
    _write_text_corpus(tmp_path)
    full = load_corpus({"name": "text", "paths": [str(tmp_path)]})
    capped = load_corpus({"name": "text", "paths": [str(tmp_path)], "max_files": 7})
    capped2 = load_corpus({"name": "text", "paths": [str(tmp_path)], "max_files": 7})
    ids = {d.id for d in capped.documents}
    assert len(ids) == 7 and ids == {d.id for d in capped2.documents}
    assert ids <= {d.id for d in full.documents}
    assert all(capped.assignment[i] == full.assignment[i] for i in ids)  # splits do not move
    assert capped.fingerprint != full.fingerprint
    by_bytes = load_corpus({"name": "text", "paths": [str(tmp_path)], "max_bytes": 2000})
    total = sum(len(d) for d in by_bytes.documents)
    assert 0 < total <= 2000 and len(by_bytes.documents) < 30


def test_config_validation() -> None:
    # plain data (e.g. lm-eval task metadata) is checked as the Hydra group is
    with pytest.raises(ValueError, match="data.name must be one of pycorpus, text, hf, got 'wiki'"):
        load_corpus({"name": "wiki"})
    with pytest.raises(ValueError, match="data.max_file is an unknown key"):
        load_corpus({"name": "pycorpus", "max_file": 3})  # typo must not be ignored
    with pytest.raises(ValueError, match="data.max_files must be an integer >= 1 or null, got 0"):
        load_corpus({"name": "pycorpus", "max_files": 0})
    with pytest.raises(ValueError, match="data.max_files must be an integer or null, got 'x'"):
        load_corpus({"name": "pycorpus", "max_files": "x"})
    with pytest.raises(
        ValueError, match="data.paths is a setting of data=text, not of data=pycorpus"
    ):
        DataConfig(paths=["a.txt"])  # another kind's key must not be ignored either
    with pytest.raises(ValueError, match="split_fractions"):
        DataConfig(split_fractions={"train": 0.5, "validation": 0.1, "test": 0.1})
    spec = DataConfig().as_dict()
    assert spec["split_fractions"] == [0.9, 0.05, 0.05] and spec["include_tests"] is False
    assert set(spec) == {"name", "split_fractions", "max_files", "max_bytes", "include_tests"}
    hf = DataConfig(name="hf", path="json").as_dict()
    assert hf["split"] == "train" and hf["splits"] is None  # one split, divided by hash


def test_accepts_omegaconf(tmp_path: Path) -> None:
    omegaconf = pytest.importorskip("omegaconf")
    _write_text_corpus(tmp_path)
    cfg = omegaconf.OmegaConf.create({"name": "text", "paths": [str(tmp_path)], "max_files": 5})
    assert len(load_corpus(cfg).documents) == 5


# --------------------------------------------------------------------------- hf corpus


@pytest.fixture()
def offline_hf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    return tmp_path


def test_hf_json_loads_offline(offline_hf: Path) -> None:
    import json

    data = offline_hf / "docs.jsonl"
    texts = [f"text {i} é " * (5 * i) for i in range(40)]
    data.write_text("".join(json.dumps({"body": t, "n": i}) + "\n" for i, t in enumerate(texts)))
    cfg = {
        "name": "hf",
        "path": "json",
        "data_files": {"train": str(data)},
        "split": "train",
        "text_field": "body",
        "cache_dir": str(offline_hf / "cache"),
    }
    corpus = load_corpus(cfg)
    assert corpus.name == "hf" and corpus.source == "hf:json"
    assert len(corpus.documents) == 39  # row 0 is empty
    doc = next(d for d in corpus.documents if d.id == "train/7")
    assert TOK.decode(doc.tokens) == texts[7]
    assert {corpus.assignment[d.id] for d in corpus.documents} <= set(SPLITS)
    assert len(corpus.split("train")) > len(corpus.split("test"))
    with pytest.raises(ValueError, match="'text'"):
        load_corpus({**cfg, "text_field": "text"})


def test_hf_load_from_disk_with_split_mapping(offline_hf: Path) -> None:
    import datasets

    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": ["a" * 50, "b" * 60, "c" * 70]}),
            "valid": datasets.Dataset.from_dict({"text": ["v" * 10]}),
            "test": datasets.Dataset.from_dict({"text": ["t" * 5000, ""]}),
        }
    )
    dd.save_to_disk(str(offline_hf / "saved"))
    cfg = {
        "name": "hf",
        "path": str(offline_hf / "saved"),
        "load_from_disk": True,
        "splits": {"train": "train", "validation": "valid", "test": "test"},
    }
    corpus = load_corpus(cfg)
    assert [d.id for d in corpus.split("train")] == ["train/0", "train/1", "train/2"]
    assert [d.id for d in corpus.split("validation")] == ["valid/0"]
    assert [len(d) for d in corpus.split("test")] == [5000]
    assert len(corpus.require_long_documents("test", 4096, count=1)) == 1
    with pytest.raises(ValueError, match="'nope'"):
        load_corpus({**cfg, "splits": {"train": "nope"}})
    capped = load_corpus({**cfg, "max_files": 2})
    assert [d.id for d in capped.split("train")] == ["train/0", "train/1"]


# --------------------------------------------------------------------------- pycorpus


def test_pycorpus_is_stdlib_without_tests_and_site_packages(pycorpus: Corpus) -> None:
    ids = [d.id for d in pycorpus.documents]
    assert ids == sorted(ids) and len(ids) == len(set(ids))
    assert "os.py" in ids and "json/decoder.py" in ids
    assert all(i.endswith(".py") for i in ids)
    assert not any(
        part in {"test", "tests", "idle_test", "site-packages"}
        for i in ids
        for part in i.split("/")
    )
    assert not any(i.startswith("_sysconfigdata") for i in ids)
    os_doc = next(d for d in pycorpus.documents if d.id == "os.py")
    assert (
        os_doc.tokens.tobytes() != b"" and len(os_doc) == (stdlib_root() / "os.py").stat().st_size
    )
    assert not os_doc.tokens.flags.writeable  # shared through the cache
    assert len(pycorpus.fingerprint) == 16


def test_pycorpus_splits_disjoint_and_sized(pycorpus: Corpus) -> None:
    splits = {s: {d.id for d in pycorpus.split(s)} for s in SPLITS}
    assert not (splits["train"] & splits["validation"]) and not (splits["train"] & splits["test"])
    assert not (splits["validation"] & splits["test"])
    n = len(pycorpus.documents)
    assert sum(len(v) for v in splits.values()) == n
    assert len(splits["train"]) > 0.8 * n and len(splits["test"]) >= 10
    with pytest.raises(ValueError, match="dev"):
        pycorpus.split("dev")


def test_pycorpus_test_split_has_16x_documents(pycorpus: Corpus) -> None:
    need = 16 * TRAIN_LENGTH
    long_docs = pycorpus.require_long_documents("test", need, count=8)
    assert all(len(d) >= need for d in long_docs)
    # Negative control: the check does fail when the requirement cannot be met.
    with pytest.raises(ValueError, match="test split"):
        pycorpus.require_long_documents("test", 10**9, count=1)


def test_pycorpus_caps_and_include_tests() -> None:
    small = load_corpus({"name": "pycorpus", "max_files": 50})
    assert len(small.documents) == 50
    assert load_corpus({"name": "pycorpus", "max_files": 50}).fingerprint == small.fingerprint
    if not (stdlib_root() / "test").is_dir():
        pytest.skip("this Python ships without its test suite (e.g. Debian's python3 package)")
    with_tests = load_corpus({"name": "pycorpus", "include_tests": True, "max_files": 200})
    assert sum(i.startswith("test/") for i in with_tests.assignment) > 50
    assert not any(i.startswith("test/") for i in small.assignment)  # negative control


# --------------------------------------------------------------------------- batches


def _is_passkey_row(row: torch.Tensor) -> bool:
    head = TOK.encode(TASK_DESCRIPTION)
    return row[: len(head)].tolist() == head


def test_training_stream_deterministic_and_seed_sensitive(pycorpus: Corpus) -> None:
    docs = pycorpus.split("train")
    a = TrainingStream(docs, 64, 4, seed=1)
    b = TrainingStream(docs, 64, 4, seed=1)
    c = TrainingStream(docs, 64, 4, seed=2)
    it_a, it_b, it_c = iter(a), iter(b), iter(c)
    for step in range(3):
        (ta, ma), (tb, _), (tc, _) = next(it_a), next(it_b), next(it_c)
        assert ta.shape == (4, 65) and ta.dtype == torch.long
        assert ma.shape == (4, 64) and ma.dtype == torch.bool and bool(ma.all())
        assert torch.equal(ta, tb)
        assert not torch.equal(ta, tc)
        assert torch.equal(a.batch(step).tokens, ta)  # random access == iteration
    resumed = next(iter(TrainingStream(docs, 64, 4, seed=1, start_step=2)))[0]
    assert torch.equal(resumed, ta)


def test_training_windows_are_contiguous_stream_slices() -> None:
    docs = load_corpus({"name": "pycorpus", "max_files": 20}).documents
    stream = concat_documents(docs)
    assert (stream == TOK.EOS).sum() == len(docs)
    tokens = TrainingStream(docs, 32, 8, seed=0).batch(0).tokens
    windows = np.lib.stride_tricks.sliding_window_view(stream.astype(np.int64), 33)
    for row in tokens.numpy():
        assert bool((windows == row).all(axis=1).any())
    # Negative control: a row that is not a slice (two halves swapped) is not found.
    swapped = np.roll(tokens[0].numpy(), 16)
    assert not bool((windows == swapped).all(axis=1).any())


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.25, 0.3])
def test_passkey_fraction_respected(pycorpus: Corpus, fraction: float) -> None:
    seq_len, batch, steps = 300, 10, 12
    stream = TrainingStream(
        pycorpus.split("train"), seq_len, batch, seed=3, passkey_fraction=fraction
    )
    rows = 0
    for step, (tokens, _) in zip(range(steps), stream, strict=False):
        assert tokens.shape == (batch, seq_len + 1)
        detected = [i for i in range(batch) if _is_passkey_row(tokens[i])]
        assert detected == stream.batch(step).passkey_rows.tolist()
        rows += len(detected)
    assert rows == math.floor(fraction * batch * steps + 1e-9)


def test_passkey_rows_content_and_answer_loss(pycorpus: Corpus) -> None:
    seq_len = 400
    docs = pycorpus.split("train")
    std = TrainingStream(docs, seq_len, 8, seed=5, passkey_fraction=0.5, passkey_loss="answer")
    batch = std.batch(0)
    assert len(batch.passkey_rows) == 4
    for row in range(8):
        text = TOK.decode(batch.tokens[row])
        if row in batch.passkey_rows.tolist():
            assert STANDARD_FILLER[:19] in text and "The pass key is" in text
            assert text.endswith(".") and text[-2].isdigit()  # the key, then where it ends
            body = text[:-1]
            n_answer = len(body) - len(body.rstrip("0123456789")) + 2  # " K" and the "."
            assert int(batch.loss_mask[row].sum()) == n_answer
            # The first target inside the mask is the answer's leading space.
            first = int(batch.loss_mask[row].nonzero()[0])
            assert int(batch.tokens[row, first + 1]) == ord(" ")
        else:
            assert bool(batch.loss_mask[row].all())
    corpus_filler = TrainingStream(
        docs, seq_len, 8, seed=5, passkey_fraction=0.5, passkey_filler="corpus"
    )
    cb = corpus_filler.batch(0)
    for row in cb.passkey_rows.tolist():
        text = TOK.decode(cb.tokens[row])
        assert "The pass key is" in text and "The grass is green" not in text
    assert bool(cb.loss_mask.all())  # default passkey_loss="all"


def test_uniform_passkey_lengths(pycorpus: Corpus) -> None:
    """passkey_length=uniform: each example is a prefix of its row, of a length spread between the
    template's minimum and the row, the rest of the row training text; the answer loss covers the
    key and the end text only. Control: "full" rows are whole examples."""
    seq_len, batch = 256, 16
    docs = pycorpus.split("train")
    minimum = min_passkey_length(template="short")
    stream = TrainingStream(
        docs,
        seq_len,
        batch,
        seed=7,
        passkey_fraction=1.0,
        passkey_loss="answer",
        passkey_template="short",
        passkey_length="uniform",
    )
    lengths = []
    for step in range(8):
        made = stream.batch(step)
        tokens, mask = made.tokens, made.loss_mask
        for row in range(batch):
            text = TOK.decode(tokens[row])
            question = "What is the pass key? pass key:"
            end = text.index(question) + len(question)
            key = text[end:].split(".")[0]
            assert key.isdigit() and f"pass key:{key}." in text[: end - len(question)]
            example_length = end + len(key)  # prompt + answer tokens (bytes)
            assert minimum <= example_length <= seq_len  # seq_len + 1 minus the "." after the key
            lengths.append(example_length)
            # targets: the key's digits and the "." after it, nothing else
            targets = mask[row].nonzero().flatten().tolist()
            assert targets == list(range(end - 1, end + len(key)))
    assert min(lengths) < minimum + 40 and max(lengths) > seq_len - 40  # spread over the range
    assert len(set(lengths)) > len(lengths) // 2
    full = TrainingStream(
        docs, seq_len, batch, seed=7, passkey_fraction=1.0, passkey_template="short"
    ).batch(0)
    for row in range(batch):
        text = TOK.decode(full.tokens[row])
        assert text.endswith(".") and text.index("What is the pass key?") > seq_len - 40
    with pytest.raises(ValueError, match="passkey_length 'random' is unknown"):
        TrainingStream(docs, seq_len, batch, seed=0, passkey_length="random")


def test_training_stream_rejects_bad_arguments(pycorpus: Corpus) -> None:
    docs = pycorpus.split("train")
    with pytest.raises(ValueError, match="too short for passkey"):
        TrainingStream(docs, 128, 4, seed=0, passkey_fraction=0.1)
    TrainingStream(docs, 128, 4, seed=0)  # fine without passkeys
    with pytest.raises(ValueError, match="passkey_filler"):
        TrainingStream(docs, 300, 4, seed=0, passkey_filler="lorem")
    with pytest.raises(ValueError, match="split is empty"):
        TrainingStream([], 64, 4, seed=0)


def test_validation_batches_fixed(pycorpus: Corpus) -> None:
    docs = pycorpus.split("validation")
    a = validation_batches(docs, 128, n_batches=3, batch_size=4)
    b = validation_batches(docs, 128, n_batches=3, batch_size=4)
    assert len(a) == 3 and all(x.shape == (4, 129) and x.dtype == torch.long for x in a)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    rows = torch.cat(a)
    assert len({tuple(r.tolist()) for r in rows}) == 12  # no duplicate windows
    assert not torch.equal(rows[0], rows[-1])


# --------------------------------------------------------------------------- near-duplicates, caps


def _train_share(hashes: dict[str, np.ndarray], assignment: dict[str, str]) -> dict[str, float]:
    """Each test document's share of its (all, unsampled) 32-byte shingles found in train."""
    from bench.data.splits import train_overlap

    train = np.sort(np.concatenate([hashes[i] for i, s in assignment.items() if s == "train"]))
    return {i: train_overlap(hashes[i], train) for i, s in assignment.items() if s == "test"}


def test_no_test_document_shares_more_than_a_fifth_of_its_shingles_with_train(pycorpus) -> None:
    from bench.data.splits import shingle_hashes

    hashes = {d.id: shingle_hashes(d.tokens) for d in pycorpus.documents}
    shares = _train_share(hashes, dict(pycorpus.assignment))
    worst = max(shares, key=shares.get)
    assert shares[worst] <= 0.2, (worst, shares[worst])
    assert len(shares) >= 10  # a held-out split worth the name remains
    # Negative control: hashing paths alone puts generated near-copies (the charmap codecs,
    # encodings/*.py) on both sides.
    by_path = {d.id: assign_split(d.id) for d in pycorpus.documents}
    assert max(_train_share(hashes, by_path).values()) > 0.9


def test_shingle_hashes_see_shared_text_and_only_it() -> None:
    from bench.data.splits import shingle_hashes, train_overlap

    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, 4000)
    b = np.concatenate([a[:2000], rng.integers(0, 256, 2000)])  # half of a
    ha, hb = shingle_hashes(a), shingle_hashes(b)
    assert ha.size == a.size - 31  # random bytes: every 32-byte window is distinct
    assert 0.45 < train_overlap(hb, ha) < 0.55
    assert train_overlap(shingle_hashes(rng.integers(0, 256, 4000)), ha) == 0.0  # control


@pytest.mark.parametrize("max_files", [50, 200, 500])
def test_file_caps_keep_every_split(max_files: int) -> None:
    capped = load_corpus(DataConfig(max_files=max_files))
    stats = capped.stats()
    assert stats["train_docs"] + stats["validation_docs"] + stats["test_docs"] == max_files
    assert stats["validation_docs"] > 0 and stats["test_docs"] > 0, stats
    # Negative control: taking files in the split hash's own order (the old cap) leaves the
    # held-out splits empty, because that order lists every train file first.
    ids = sorted(capped.assignment) + [d.id for d in load_corpus(DataConfig()).documents]
    old = sorted(set(ids), key=lambda i: hashlib.sha256(i.encode("utf-8")).digest())[:max_files]
    assert {assign_split(i) for i in old} == {"train"}
