"""Corpora: documents, train/validation/test splits and fingerprints.

Three corpus kinds, chosen by the ``name`` of a ``bench.data.config.DataConfig`` (the Hydra ``data``
group): ``pycorpus`` (the running Python's standard library sources), ``text`` (local files,
directories or glob patterns) and ``hf`` (a Hugging Face dataset).

Design choices (why):

* Tokens are bytes (``bench.data.tokenizer``); files are read as bytes and never
  decoded, so every file tokenizes, and one token is one byte everywhere.
* Documents are ordered by sorted relative path and assigned to a split by a
  SHA-256 hash of that path (not ``hash()``, which is salted per process), so the
  assignment is identical on every machine; near-duplicate documents are then kept
  on one side (``bench.data.splits``): a held-out document shares at most 20% of its
  32-byte shingles with the training split.
* ``pycorpus`` excludes the standard library's test suites (directories named
  ``test``, ``tests`` or ``idle_test``) unless ``include_tests`` is true: they are
  ~60% of the bytes, highly repetitive, and contain deliberately malformed
  files (bad encodings, tokenizer stress data), which would make the
  "natural long code" corpus less natural. ``site-packages``/``dist-packages``
  are always excluded so installed packages never leak in, and so are the
  build-generated ``_sysconfigdata*.py`` and ``config-*/``. Empty files are
  skipped in every kind (they would be a lone EOS).
* The fingerprint is a short SHA-256 of the sorted (id, size in bytes) list: it
  is cheap (a ``stat`` per file), changes when a file is added, removed or
  changes size, and differs between Python versions for ``pycorpus``, so result
  rows from different corpora are never mixed silently.
* Corpora are cached in memory per process (LRU): sweeps call ``load_corpus``
  for every job. File corpora are keyed by their fingerprint, so a changed
  file is re-read; Hugging Face corpora are keyed by their config.
* Caps are deterministic: files are taken in the order of a SHA-256 hash of their
  ids that is independent of the split hash (so every split keeps its share of a
  small corpus, and it still spans all packages), up to ``max_files`` files and
  ``max_bytes`` bytes (files that would exceed the byte budget are skipped). For ``hf`` the caps apply per loaded HF split, as
  a prefix in row order (reading every row to hash-order it would defeat the cap).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
import sysconfig
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from bench.core.progress import progress_bar
from bench.data.config import (
    CORPUS_KINDS,
    DEFAULT_SPLIT_FRACTIONS,
    SPLITS,
    DataConfig,
    normalize_fractions,
)
from bench.data.splits import SPLIT_PROTOCOL, cap_order_key, near_duplicate_assignment
from bench.data.tokenizer import ByteTokenizer, bytes_to_tokens
from models.lazy import torch

__all__ = [
    "CORPUS_KINDS",
    "DEFAULT_SPLIT_FRACTIONS",
    "SPLITS",
    "Corpus",
    "Document",
    "assign_split",
    "clear_corpus_cache",
    "corpus_fingerprint",
    "load_corpus",
    "stdlib_root",
]

EOS = ByteTokenizer.EOS

_TEST_DIRS = frozenset({"test", "tests", "idle_test"})
_ALWAYS_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
_FINGERPRINT_CHARS = 16
_CACHE_SIZE = 4


# --------------------------------------------------------------------------- documents


@dataclass(frozen=True, eq=False)
class Document:
    """One document: an id (relative path or ``<hf split>/<row>``) and its byte-token ids.

    ``tokens`` is a read-only int16 numpy array (ids < 259); use :meth:`tensor` for
    a LongTensor slice. Read-only because corpora are shared through the cache.
    """

    id: str
    tokens: np.ndarray

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def tensor(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """LongTensor copy of ``tokens[start:end]``."""
        return torch.from_numpy(self.tokens[start:end].astype(np.int64))


@dataclass(frozen=True, eq=False)
class Corpus:
    """Tokenized documents with a fixed split assignment.

    ``name`` is the corpus kind (pycorpus/text/hf), ``source`` says where the text
    came from, ``fingerprint`` identifies the exact set of documents.
    """

    name: str
    fingerprint: str
    source: str
    documents: tuple[Document, ...]
    assignment: Mapping[str, str]  # document id -> split name

    def split(self, name: str) -> list[Document]:
        """Documents of split ``name`` ("train", "validation" or "test"), in corpus order."""
        _check_split(name)
        return [d for d in self.documents if self.assignment[d.id] == name]

    def long_documents(self, split: str, min_tokens: int) -> list[Document]:
        """Documents of ``split`` with at least ``min_tokens`` tokens (e.g. 16 * train length)."""
        return [d for d in self.split(split) if len(d) >= int(min_tokens)]

    def require_long_documents(self, split: str, min_tokens: int, count: int = 1) -> list[Document]:
        """Like :meth:`long_documents`, but raise ValueError if fewer than ``count`` exist.

        Evaluating at 16x the training length silently on zero documents would
        report nothing (or NaN) instead of failing; this makes the shortage explicit.
        """
        docs = self.long_documents(split, min_tokens)
        if len(docs) < int(count):
            raise ValueError(
                f"the {split} split of corpus {self.name} ({self.fingerprint}) has {len(docs)} "
                f"documents with >= {int(min_tokens)} tokens but {int(count)} are required; "
                "use a corpus with longer documents, shorter evaluation lengths, a larger "
                f"{split} fraction, or higher max_files/max_bytes."
            )
        return docs

    def stats(self) -> dict[str, Any]:
        """Document counts and token totals per split (for logs and reports)."""
        out: dict[str, Any] = {"name": self.name, "fingerprint": self.fingerprint}
        for split in SPLITS:
            docs = self.split(split)
            out[f"{split}_docs"] = len(docs)
            out[f"{split}_tokens"] = sum(len(d) for d in docs)
        out["total_tokens"] = sum(len(d) for d in self.documents)
        return out


def _check_split(name: str) -> None:
    if name not in SPLITS:
        raise ValueError(f"split {name!r} is unknown; allowed splits are {', '.join(SPLITS)}.")


# --------------------------------------------------------------------------- splits and fingerprints


def _unit_hash(key: str) -> float:
    """A number in [0, 1) from SHA-256 of ``key``: stable across processes and machines."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def assign_split(doc_id: str, fractions: object = None) -> str:
    """The split of a document id under the given fractions (hash of the id, not of content)."""
    train, validation, _ = normalize_fractions(fractions)
    u = _unit_hash(doc_id)
    if u < train:
        return "train"
    if u < train + validation:
        return "validation"
    return "test"


def corpus_fingerprint(entries: Sequence[tuple[str, int]]) -> str:
    """Short SHA-256 hex of the sorted (id, size in bytes) list and the split protocol."""
    payload = json.dumps(
        [SPLIT_PROTOCOL, sorted([str(i), int(s)] for i, s in entries)], separators=(",", ":")
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:_FINGERPRINT_CHARS]


# --------------------------------------------------------------------------- file listings


@dataclass(frozen=True)
class _FileEntry:
    id: str  # posix relative path: the split/fingerprint key, identical on every OS
    path: Path
    size: int


def stdlib_root() -> Path:
    """Directory of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def _list_stdlib(root: Path, include_tests: bool) -> list[_FileEntry]:
    excluded = _ALWAYS_EXCLUDED_DIRS | (frozenset() if include_tests else _TEST_DIRS)
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Prune in place so os.walk never descends. config-*/ and _sysconfigdata* are generated
        # at build time and embed the build machine's paths: not library text, and they would
        # make the fingerprint differ between two installs of the same Python version.
        dirnames[:] = [d for d in dirnames if d not in excluded and not d.startswith("config-")]
        for fname in filenames:
            if fname.endswith(".py") and not fname.startswith("_sysconfigdata"):
                path = Path(dirpath) / fname
                entries.append(
                    _FileEntry(path.relative_to(root).as_posix(), path, path.stat().st_size)
                )
    return entries


def _has_magic(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _files_under(directory: Path, suffixes: Sequence[str]) -> list[Path]:
    wanted = tuple(s.lower() for s in suffixes)
    return [p for p in directory.rglob("*") if p.is_file() and p.name.lower().endswith(wanted)]


def _resolve_text_paths(patterns: Sequence[str], suffixes: Sequence[str]) -> list[Path]:
    """Files named by each pattern; a pattern matching no file is an error naming it."""
    files: set[Path] = set()
    for pattern in patterns:
        expanded = os.path.expandvars(os.path.expanduser(str(pattern)))
        if _has_magic(expanded):
            candidates = [Path(p) for p in glob.glob(expanded, recursive=True)]
        else:
            candidates = [Path(expanded)] if os.path.exists(expanded) else []
        matched: list[Path] = []
        for cand in candidates:
            # Directories expand to their files with the wanted suffixes; explicit files are taken as is.
            matched.extend(_files_under(cand, suffixes) if cand.is_dir() else [cand])
        if not matched:
            raise ValueError(
                f"data.paths pattern {pattern!r} matches no file; give existing files, "
                f"directories containing {', '.join(suffixes)} files, or glob patterns that match files."
            )
        files.update(p.resolve() for p in matched)
    return sorted(files)


def _list_text(
    patterns: Sequence[str], suffixes: Sequence[str], root: str | None
) -> tuple[list[_FileEntry], Path]:
    files = _resolve_text_paths(patterns, suffixes)
    base = (
        Path(os.path.expanduser(root)).resolve()
        if root
        else Path(os.path.commonpath([str(p.parent) for p in files]))
    )
    entries = []
    for path in files:
        try:
            rel = path.relative_to(base).as_posix()
        except ValueError:
            raise ValueError(
                f"data.root {root!r} does not contain the file {str(path)!r}; ids are relative to root."
            ) from None
        entries.append(_FileEntry(rel, path, path.stat().st_size))
    return entries, base


def _cap_entries(
    entries: list[_FileEntry], max_files: int | None, max_bytes: int | None
) -> list[_FileEntry]:
    """Deterministic subset in :func:`bench.data.splits.cap_order_key` order (independent of the split
    hash), up to max_files files and max_bytes bytes."""
    if max_files is None and max_bytes is None:
        return entries
    chosen: list[_FileEntry] = []
    total = 0
    for entry in sorted(entries, key=lambda e: cap_order_key(e.id)):
        if max_files is not None and len(chosen) >= max_files:
            break
        if max_bytes is not None and total + entry.size > max_bytes:
            continue  # skip, not stop: a single large file must not empty the corpus
        chosen.append(entry)
        total += entry.size
    return chosen


def _finish_file_listing(
    entries: list[_FileEntry], spec: Mapping[str, Any], what: str
) -> list[_FileEntry]:
    non_empty = [e for e in entries if e.size > 0]
    if entries and not non_empty:
        raise ValueError(f"{what}: every file it matches is empty ({len(entries)} file(s)).")
    entries = _cap_entries(non_empty, spec["max_files"], spec["max_bytes"])
    if not entries:
        raise ValueError(
            f"{what} has no non-empty files under the given caps; raise max_files/max_bytes."
        )
    return sorted(entries, key=lambda e: e.id)


def _read_files(entries: Sequence[_FileEntry], desc: str) -> list[Document]:
    docs = []
    # delay: the progress bar only appears for slow reads (a big text corpus), not for pycorpus.
    for entry in progress_bar(entries, desc=desc, unit="file", delay=2.0, leave=False):
        tokens = bytes_to_tokens(entry.path.read_bytes())
        tokens.flags.writeable = False
        docs.append(Document(entry.id, tokens))
    return docs


def _build_corpus(
    name: str,
    source: str,
    docs: list[Document],
    fractions: Sequence[float],
    fixed: Mapping[str, str] | None = None,
) -> Corpus:
    """A Corpus with hash-based, near-duplicate-aware split assignment (or the ``fixed`` one for
    HF split mappings)."""
    if fixed is not None:
        assignment = dict(fixed)
    else:
        assignment = near_duplicate_assignment(
            [(d.id, d.tokens) for d in docs], lambda doc_id: assign_split(doc_id, fractions)
        )
    fingerprint = corpus_fingerprint([(d.id, len(d)) for d in docs])
    # Read-only view: the corpus is shared by every caller through the cache.
    return Corpus(name, fingerprint, source, tuple(docs), MappingProxyType(assignment))


# --------------------------------------------------------------------------- Hugging Face


def _hf_docs(spec: Mapping[str, Any]) -> tuple[list[Document], dict[str, str] | None, str]:
    """Documents from a datasets.Dataset(Dict); ids are ``<hf split>/<row index>``."""
    import datasets  # imported lazily: pycorpus/text users should not pay for it

    if spec["splits"] is not None:
        wanted = [(ours, str(theirs)) for ours, theirs in spec["splits"].items()]
    else:
        wanted = [(None, str(spec["split"]))]

    if spec["load_from_disk"]:
        loaded = datasets.load_from_disk(os.path.expanduser(spec["path"]))

        def get(hf_split: str) -> Any:
            if isinstance(loaded, datasets.DatasetDict):
                if hf_split not in loaded:
                    raise ValueError(
                        f"data.split {hf_split!r} is not in the saved dataset at {spec['path']!r}; "
                        f"allowed splits are {', '.join(loaded)}."
                    )
                return loaded[hf_split]
            return loaded  # a single saved Dataset: the split name is only a label

    else:

        def get(hf_split: str) -> Any:
            try:
                return datasets.load_dataset(
                    spec["path"],
                    spec["config_name"],
                    split=hf_split,
                    data_files=spec["data_files"],
                    cache_dir=spec["cache_dir"],
                    revision=spec["revision"],
                    **(spec["load_kwargs"] or {}),
                )
            except (OSError, FileNotFoundError, ConnectionError) as err:  # offline, no such id
                raise ValueError(
                    f"data.path {spec['path']!r} (split {hf_split!r}) could not be loaded with "
                    f"datasets ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                    "without network, save it first and use data.load_from_disk=true with its "
                    "local path."
                ) from None

    docs: list[Document] = []
    fixed: dict[str, str] = {}
    budget_files, budget_bytes = spec["max_files"], spec["max_bytes"]
    for ours, hf_split in wanted:
        # Caps are per HF split, so a capped train split cannot starve the test split.
        total_bytes = 0
        ds = get(hf_split)
        field = spec["text_field"]
        if field not in ds.column_names:
            raise ValueError(
                f"data.text_field {field!r} is not a column of {spec['path']!r} split {hf_split!r}; "
                f"allowed fields are {', '.join(ds.column_names)}."
            )
        n_rows = len(ds) if budget_files is None else min(len(ds), budget_files)
        column = ds.select(range(n_rows))[field] if n_rows < len(ds) else ds[field]
        for row, text in enumerate(
            progress_bar(column, desc=f"encoding {hf_split}", unit="doc", delay=2.0, leave=False)
        ):
            data = (text or "").encode("utf-8")
            if not data:
                continue
            if budget_bytes is not None and total_bytes + len(data) > budget_bytes:
                break  # row order: the cap is a prefix of each split
            tokens = bytes_to_tokens(data)
            tokens.flags.writeable = False
            doc_id = f"{hf_split}/{row}"
            docs.append(Document(doc_id, tokens))
            total_bytes += len(data)
            if ours is not None:
                fixed[doc_id] = ours
    if not docs:
        raise ValueError(
            f"the hf dataset {spec['path']!r} yielded no non-empty {spec['text_field']!r} texts."
        )
    label = spec["path"] + (f"/{spec['config_name']}" if spec["config_name"] else "")
    return docs, (fixed if spec["splits"] is not None else None), f"hf:{label}"


# --------------------------------------------------------------------------- factory and cache

_CACHE: OrderedDict[str, Corpus] = OrderedDict()


def clear_corpus_cache() -> None:
    """Forget every cached corpus (tests; or to free memory)."""
    _CACHE.clear()


def _cache_get(key: str) -> Corpus | None:
    corpus = _CACHE.get(key)
    if corpus is not None:
        _CACHE.move_to_end(key)
    return corpus


def _cache_put(key: str, corpus: Corpus) -> None:
    _CACHE[key] = corpus
    _CACHE.move_to_end(key)
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)


def load_corpus(cfg: DataConfig | Mapping[str, Any]) -> Corpus:
    """The corpus described by a ``data`` config (plain data, e.g. lm-eval task metadata, is
    checked by ``DataConfig.from_mapping``); see the module doc.

    Cached per process: file corpora by (config, fingerprint), so an edited file
    is re-read; Hugging Face corpora by config.
    """
    data = cfg if isinstance(cfg, DataConfig) else DataConfig.from_mapping(cfg)
    spec = data.as_dict()
    kind = spec["name"]
    spec_key = json.dumps(spec, sort_keys=True, default=str)

    if kind == "hf":
        key = f"hf:{spec_key}"
        cached = _cache_get(key)
        if cached is None:
            docs, fixed, source = _hf_docs(spec)
            cached = _build_corpus(kind, source, docs, spec["split_fractions"], fixed)
            _cache_put(key, cached)
        return cached

    if kind == "pycorpus":
        root = stdlib_root()
        entries = _list_stdlib(root, bool(spec["include_tests"]))
        source = f"python{sys.version_info.major}.{sys.version_info.minor} stdlib at {root}"
    else:
        entries, root = _list_text(spec["paths"], spec["suffixes"], spec["root"])
        source = f"text files under {root}"
    entries = _finish_file_listing(entries, spec, f"corpus {kind} ({source})")
    fingerprint = corpus_fingerprint([(e.id, e.size) for e in entries])
    key = f"{kind}:{fingerprint}:{spec_key}"
    cached = _cache_get(key)
    if cached is None:
        docs = _read_files(entries, desc=f"reading {kind}")
        cached = _build_corpus(kind, source, docs, spec["split_fractions"])
        _cache_put(key, cached)
    return cached
