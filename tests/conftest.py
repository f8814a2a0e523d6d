"""Shared fixtures: a text corpus, one intra-op thread, a tiny-model factory and a random-documents
factory."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.data.corpora import Corpus, Document, load_corpus
from models.positions import PositionConfig
from models.transformer import DecoderLM, ModelConfig

#: Default dimensions of :func:`tiny_model`.
TINY = ModelConfig(n_layers=2, d_model=32, n_heads=4)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of small text documents (``fixtures.jobs.write_text_corpus``), once per module;
    modules that need another corpus define their own ``corpus_dir`` / ``corpus``."""
    from fixtures.jobs import write_text_corpus

    return write_text_corpus(tmp_path_factory.mktemp("docs"))


@pytest.fixture(scope="module")
def corpus(corpus_dir: Path) -> Corpus:
    """The ``text`` corpus of :func:`corpus_dir`."""
    return load_corpus({"name": "text", "paths": [str(corpus_dir)]})


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models on a busy 2-core box: one intra-op thread avoids OpenMP contention.

    Modules that train or evaluate tiny models opt in with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _tiny_model(
    kind: str = "rope",
    seed: int = 0,
    train_length: int = 32,
    model_cfg: ModelConfig = TINY,
    sharpen: float = 6.0,
    **position_kwargs,
) -> DecoderLM:
    torch.manual_seed(seed)
    model = DecoderLM(model_cfg, PositionConfig(kind=kind, **position_kwargs), train_length)
    with torch.no_grad():  # sharper attention than at init, so that context and position matter
        for block in model.blocks:
            block.attn.q_proj.weight.mul_(sharpen)
            block.attn.kv_proj.weight.mul_(sharpen)
    return model.eval()


def _random_docs(lengths: Sequence[int], seed: int = 0) -> list[Document]:
    rng = np.random.default_rng(seed)
    return [
        Document(f"doc{i}", rng.integers(0, 256, size=n).astype(np.int16))
        for i, n in enumerate(lengths)
    ]


@pytest.fixture
def tiny_model() -> Callable[..., DecoderLM]:
    """Factory ``tiny_model(kind="rope", seed=0, train_length=32, model_cfg=TINY, sharpen=6.0,
    **position_kwargs)``: a seeded DecoderLM in eval mode whose query and key/value projections
    are scaled by ``sharpen``.

    A module with other defaults overrides it with a fixture of the same name that returns
    ``functools.partial(tiny_model, train_length=16, ...)``.
    """
    return _tiny_model


@pytest.fixture
def random_docs() -> Callable[..., list[Document]]:
    """Factory ``random_docs(lengths, seed=0)``: documents ``doc<i>`` of uniform random bytes,
    one per length."""
    return _random_docs


# --------------------------------------------------------------------------- transformers models
# Built locally by tests/fixtures/hf.py (a tokenizer trained on stdlib text, random weights).


@pytest.fixture(scope="session")
def hf_bpe():
    """A byte-level BPE tokenizer (vocab 400) trained on stdlib text, as a transformers tokenizer."""
    from fixtures.hf import train_bpe_tokenizer

    return train_bpe_tokenizer()


@pytest.fixture(scope="session")
def hf_model_dirs(tmp_path_factory, hf_bpe) -> dict:
    """{architecture: directory} of tiny random-weight models (fixtures.hf.ARCHITECTURES) saved
    with ``hf_bpe``."""
    from fixtures.hf import ARCHITECTURES, save_model

    root = tmp_path_factory.mktemp("hf")
    return {arch: save_model(arch, root / arch, hf_bpe) for arch in ARCHITECTURES}


@pytest.fixture(scope="session")
def hf_text_docs() -> list[Document]:
    """Byte-token documents of stdlib text (valid UTF-8)."""
    from fixtures.hf import stdlib_docs

    return stdlib_docs()


@pytest.fixture
def quiet_training(monkeypatch):
    """Training through the checkpoint cache as usual, without progress bars."""
    import bench.train.cache as cache_module

    original = cache_module.get_or_train
    monkeypatch.setattr(
        cache_module,
        "get_or_train",
        lambda cfg, corpus, root=None, **kw: original(cfg, corpus, root, progress=False, **kw),
    )


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """The test runs in its own temporary directory (results/ and reports/ land there)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
