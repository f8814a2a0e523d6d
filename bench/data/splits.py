"""Train/validation/test assignment that keeps near-duplicate documents on one side.

Documents are first placed by a SHA-256 hash of their id (stable across machines). Hashing ids
alone lets families of generated, near-identical files (the stdlib's ~100 charmap codecs) land on
both sides, so held-out text would be largely memorised text. Two steps prevent that:

1. documents that share more than ``threshold`` of their sampled 32-byte shingles with each other
   form one group (union-find), and a group takes the split of its smallest id;
2. a held-out document that still shares more than ``threshold`` of its shingles with the whole
   training split moves to train.

Shingles are sampled by content (hash mod ``SAMPLE_MOD`` == 0), so every document keeps the same
sample of any text it shares with another.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np

from models.lazy import LazyModule

sparse = LazyModule("scipy.sparse")  # loaded at first use: not on the config check path
csgraph = LazyModule("scipy.sparse.csgraph")

__all__ = [
    "NEAR_DUPLICATE_THRESHOLD",
    "SHINGLE_BYTES",
    "SPLIT_PROTOCOL",
    "near_duplicate_assignment",
    "shingle_hashes",
    "train_overlap",
]

#: Enters the corpus fingerprint: changing how splits are made must make old checkpoints stale.
SPLIT_PROTOCOL = "near-duplicate-groups-v1"
SHINGLE_BYTES = 32
NEAR_DUPLICATE_THRESHOLD = 0.2
SAMPLE_MOD = 8


def _mix(x: np.ndarray) -> np.ndarray:
    """A 64-bit avalanche (splitmix64's finaliser) so that nearby inputs give unrelated hashes."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def shingle_hashes(
    tokens: np.ndarray, width: int = SHINGLE_BYTES, sample_mod: int = 1
) -> np.ndarray:
    """Unique 64-bit hashes of every ``width``-byte window of ``tokens`` (sorted uint64).

    A window is ``width // 8`` consecutive 8-byte words, each mixed and combined with its own
    rotation, so the cost is a few operations per position. ``sample_mod > 1`` keeps only
    hashes divisible by it (a content-defined sample).
    """
    if width % 8:
        raise ValueError(f"shingle width {width} is invalid; allowed: a multiple of 8.")
    ids = np.asarray(tokens).astype(np.uint8, copy=False)  # byte tokens (special ids never occur)
    n = ids.size - width + 1
    if n <= 0:
        return np.empty(0, dtype=np.uint64)
    bytes8 = np.lib.stride_tricks.sliding_window_view(ids, 8)  # [size - 7, 8]
    words = np.zeros(bytes8.shape[0], dtype=np.uint64)
    for k in range(8):
        words |= bytes8[:, k].astype(np.uint64) << np.uint64(8 * k)
    words = _mix(words)  # [size - 7]: the hash of the 8 bytes starting at each position
    h = np.zeros(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(width // 8):
            h = h * np.uint64(0x9E3779B97F4A7C15) + words[8 * j : 8 * j + n]
    h = _mix(h)
    if sample_mod > 1:
        h = h[h % np.uint64(sample_mod) == 0]
    return _sorted_unique(h)


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """np.unique for uint64 by sorting (numpy's hash-based unique is several times slower here)."""
    values = np.sort(values)
    if values.size:
        values = values[np.concatenate(([True], values[1:] != values[:-1]))]
    return values


def _groups(ids: Sequence[str], shingles: Sequence[np.ndarray], threshold: float) -> list[str]:
    """For each document, the smallest id of its near-duplicate group (connected components of
    "shares more than ``threshold`` of one side's sampled shingles")."""
    n = len(ids)
    lengths = np.array([h.size for h in shingles], dtype=np.int64)
    if n == 0 or lengths.sum() == 0:
        return list(ids)
    flat = np.concatenate(shingles)
    order = np.argsort(flat, kind="stable")
    is_new = np.concatenate(([True], flat[order][1:] != flat[order][:-1]))
    column = np.empty(flat.size, dtype=np.int64)
    column[order] = np.cumsum(is_new) - 1
    row = np.repeat(np.arange(n), lengths)
    incidence = sparse.csr_matrix(
        (np.ones(flat.size, dtype=np.float32), (row, column.reshape(-1))),
        shape=(n, int(column.max()) + 1),
    )  # [docs, shingles]
    shared = (incidence @ incidence.T).tocoo()  # [docs, docs] counts of shared shingles
    share = shared.data / np.maximum(lengths[shared.row], 1)
    linked = (shared.row != shared.col) & (share > threshold)
    graph = sparse.coo_matrix(
        (np.ones(int(linked.sum())), (shared.row[linked], shared.col[linked])), shape=(n, n)
    )
    _, component = csgraph.connected_components(graph, directed=False)
    smallest: dict[int, str] = {}
    for doc_id, c in zip(ids, component.tolist(), strict=True):
        smallest[c] = min(smallest.get(c, doc_id), doc_id)
    return [smallest[c] for c in component.tolist()]


def train_overlap(hashes: np.ndarray, train_hashes: np.ndarray) -> float:
    """Share of ``hashes`` (one document's shingles) that also occur in ``train_hashes`` (sorted)."""
    if hashes.size == 0 or train_hashes.size == 0:
        return 0.0
    at = np.searchsorted(train_hashes, hashes).clip(max=train_hashes.size - 1)
    return float((train_hashes[at] == hashes).mean())


def near_duplicate_assignment(
    docs: Sequence[tuple[str, np.ndarray]],
    split_of_id: Callable[[str], str],
    threshold: float = NEAR_DUPLICATE_THRESHOLD,
) -> dict[str, str]:
    """Document id -> split, with near-duplicates kept together (module doc).

    ``docs`` are (id, tokens) pairs; ``split_of_id`` is the hash placement of one id.
    """
    ids = [doc_id for doc_id, _ in docs]
    sampled = [shingle_hashes(tokens, sample_mod=SAMPLE_MOD) for _, tokens in docs]
    shingles = dict(zip(ids, sampled, strict=True))
    groups = _groups(ids, sampled, threshold)
    assignment = {doc_id: split_of_id(group) for doc_id, group in zip(ids, groups, strict=True)}
    train = [shingles[d] for d, split in assignment.items() if split == "train"]
    train_hashes = _sorted_unique(np.concatenate(train)) if train else np.empty(0, dtype=np.uint64)
    for doc_id, split in sorted(assignment.items()):
        if split != "train" and train_overlap(shingles[doc_id], train_hashes) > threshold:
            assignment[doc_id] = "train"
    return assignment


def cap_order_key(doc_id: str) -> bytes:
    """Order in which caps (max_files/max_bytes) take files: a hash independent of the split's."""
    return hashlib.sha256(f"lenbench-cap:{doc_id}".encode()).digest()
