"""Resumable training states: what one holds, when one is written, and where it lives.

While a checkpoint trains (:mod:`bench.train.trainer`), a state is written to ``<cache>/<key>/resume.pt``
(:mod:`bench.train.cache`): the weights, the optimizer state, every global RNG state and the update
count, which is also the data position (batch k is a pure function of (seed, k),
:mod:`bench.train.batches`). Only a checkpoint with its DONE marker is final; a state is a partial run,
used only by a run of the same weights config, and deleted once the checkpoint is complete.
"""

from __future__ import annotations

import hashlib
import os
import random
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.core.results import os_error_naming, umask_mode
from bench.core.rows import canonical_json

__all__ = [
    "RESUME_FILE",
    "TMP_PREFIX",
    "ResumeFile",
    "SaveClock",
    "atomic_write",
    "rng_state",
    "set_rng_state",
    "state_sha256",
]

RESUME_FILE = "resume.pt"
TMP_PREFIX = ".tmp-"  # temp files of interrupted writers start with it


class _WriteErrors:
    """A file object that remembers the OSError its ``write`` raised: ``torch.save`` turns one
    (a full disk: ENOSPC) into a RuntimeError that names neither the file nor the cause."""

    def __init__(self, handle: Any):
        self.handle, self.error = handle, None

    def write(self, data: Any) -> int:
        try:
            return self.handle.write(data)
        except OSError as err:
            self.error = err
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


def atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    """write(file object) into a temp file next to ``path``, fsync, then os.replace onto it
    (with the mode the umask gives new files). On any failure the temp file is removed and
    ``path`` is untouched; an I/O error (a full disk, ...) is raised as an OSError naming
    ``path``, also where the writer wrapped it in another exception."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{TMP_PREFIX}{path.name}.")
    recorder = None
    try:
        with os.fdopen(fd, "wb") as handle:
            recorder = _WriteErrors(handle)
            write(recorder)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, umask_mode())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        cause = recorder.error if recorder is not None and recorder.error is not None else exc
        named = os_error_naming(cause, path) if isinstance(exc, Exception) else None
        if named is not None:
            raise named from exc
        raise


def _feed(digest: Any, obj: Any) -> None:
    """Add ``obj`` (tensors, mappings, sequences and Python scalars, nested) to ``digest``."""
    if isinstance(obj, torch.Tensor):
        flat = obj.detach().cpu().contiguous().reshape(-1)
        digest.update(f"T{flat.dtype}{tuple(obj.shape)}:".encode())
        digest.update(flat.view(torch.uint8).numpy())
    elif isinstance(obj, Mapping):
        items = sorted(obj.items(), key=lambda item: repr(item[0]))
        digest.update(f"D{len(items)}:".encode())
        for key, value in items:
            _feed(digest, key)
            _feed(digest, value)
    elif isinstance(obj, (list, tuple)):
        digest.update(f"L{len(obj)}:".encode())
        for value in obj:
            _feed(digest, value)
    elif obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        text = repr(obj).encode()
        digest.update(f"S{type(obj).__name__}{len(text)}:".encode() + text)
    else:
        raise TypeError(f"cannot digest a {type(obj).__name__} in a resumable state")


def state_sha256(state: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of a resumable state's content: every tensor's dtype, shape and bytes and
    every other value, in a fixed order (what ``torch.load`` gives back hashes the same)."""
    digest = hashlib.sha256()
    _feed(digest, state)
    return digest.hexdigest()


class ResumeFile:
    """The resumable state of one unfinished checkpoint, tagged with its key and weights config.

    ``load()`` returns the state a :meth:`save` wrote for the same key and config, else None (a
    missing file; an unreadable or foreign one with a warning: training then starts over and
    overwrites it; a state whose content no longer matches the SHA-256 recorded in it, or that
    has none, with a warning, and the file is deleted). ``clear()`` deletes it.
    """

    def __init__(self, path: Path, key: str, weights_config: Mapping[str, Any]):
        self.path, self.key, self.config = Path(path), key, canonical_json(weights_config)

    def load(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        try:
            payload = torch.load(self.path, map_location="cpu", weights_only=True)
            ok = payload["key"] == self.key and payload["config"] == self.config
        except Exception as err:  # noqa: BLE001 - any unreadable state means: start over
            warnings.warn(
                f"resume state {self.path} cannot be read ({err}); training from scratch.",
                stacklevel=2,
            )
            return None
        if not ok:
            warnings.warn(
                f"resume state {self.path} belongs to another weights config; training from scratch.",
                stacklevel=2,
            )
            return None
        problem = self._digest_problem(payload)
        if problem is not None:
            warnings.warn(
                f"resume state {self.path} {problem}; dropped it, training from scratch.",
                stacklevel=2,
            )
            self.clear()
            return None
        return payload["state"]

    @staticmethod
    def _digest_problem(payload: Mapping[str, Any]) -> str | None:
        recorded = payload.get("sha256")
        if not isinstance(recorded, str):
            return (
                "has no recorded SHA-256 (written by an older lenbench), so it cannot be verified"
            )
        try:
            actual = state_sha256(payload["state"])
        except (KeyError, TypeError) as err:
            return f"cannot be verified ({err})"
        if actual != recorded:
            return (
                "does not match the SHA-256 recorded when it was written (its bytes changed on "
                "disk)"
            )
        return None

    def save(self, state: Mapping[str, Any]) -> None:
        state = dict(state)
        payload = {
            "key": self.key,
            "config": self.config,
            "state": state,
            "sha256": state_sha256(state),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, lambda handle: torch.save(payload, handle))

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def rng_state() -> dict[str, Any]:
    """Every global RNG a training step may draw from (dropout: torch's), as torch.save-able data."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuple(state["python"]))
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(value: Any) -> Any:
    """random.setstate wants the nested tuples random.getstate gave (a round trip may give lists)."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


class SaveClock:
    """When to save: every ``every`` updates and/or every ``minutes`` (0 = off for either).

    Under DDP rank 0's clock decides for every rank (one broadcast per update, only when a time
    limit is set), so all ranks agree on the updates at which a state is written.
    """

    def __init__(self, every: int, minutes: float, accelerator: Any):
        self.every, self.seconds, self.accelerator = every, minutes * 60.0, accelerator
        self.last = time.monotonic()

    def due(self, done: int) -> bool:
        if self.every > 0 and done % self.every == 0:
            return True
        if self.seconds <= 0:
            return False
        due = time.monotonic() - self.last >= self.seconds
        if self.accelerator.num_processes > 1:
            from accelerate.utils import broadcast

            flag = torch.tensor([int(due)], device=self.accelerator.device)
            due = bool(broadcast(flag, from_process=0).item())
        return due

    def saved(self) -> None:
        self.last = time.monotonic()
