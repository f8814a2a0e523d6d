"""Content-addressed checkpoint cache: train a configuration once, reuse it everywhere.

A checkpoint's key is ``sha256(canonical JSON of weights_config(job, corpus))[:16]``: only what
changes the weights (model, position, data and train fields not marked ``weights: False`` in
``bench.schema``, seed, corpus fingerprint, ``CODE_SALT``, and the position family's
``weights_revision`` when it is > 0). Eval-time settings never enter it.
A fine-tune's (``extend`` active, ``bench.train.extend``) is the hash of its parent's key and config and
its own ``extend`` fields; its checkpoint also stores the scaling it was trained with.

Layout under the cache root (default: env ``LENBENCH_CACHE`` or ``~/.cache/lenbench/checkpoints``)::

    <root>/<key>/model.pt    torch.save({"key", "model_cfg", "position_cfg", "train_length",
                                         "weights_config", "state_dict", "train_stats",
                                         ["scaling" of a fine-tune]})
    <root>/<key>/DONE        {"key": ..., "weights_config": ...} (JSON), written last
    <root>/<key>/resume.pt   resumable state of an unfinished training (bench.train.resume)
    <root>/<key>.lock        filelock: held while a process trains or writes this key

Protocol (``get_or_train``): if DONE exists, load. Otherwise (a fine-tune: get its parent first,
under the parent's lock) take the lock, look again, delete leftovers of interrupted writers, train,
write model.pt and then DONE, each through a temporary file + ``os.replace``, then delete the
resumable state. A killed process leaves either no DONE or a complete checkpoint; the OS releases
its lock, and the next run resumes from the last resumable state the training wrote (every
``train.save_every`` updates / ``save_every_minutes``), or starts over without one. A DONE
checkpoint is final: a state is never read then. Loading verifies that the stored weights config
hashes to the key and matches DONE, the stored model and the request (``CheckpointError``
otherwise). Under ``accelerate launch`` rank 0 takes the lock and decides train-or-load for every
rank. Writing, reading and verifying one checkpoint directory: :mod:`bench.train.checkpoints`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from bench.core.checks import weights_dict
from bench.core.runtime import use_cpu_backend
from bench.core.sections import position_weights
from bench.data.corpora import Corpus
from bench.tasks.passkey import passkey_template
from bench.tasks.ruler import ruler_text
from bench.train.checkpoints import (
    DONE_FILE,
    MODEL_FILE,
    CheckpointCorrupt,
    json_safe,
    key_of,
    load_model,
    normalized,
    resolve_cache_root,
    save_checkpoint,
)
from bench.train.extend import base_job, extend_weights
from bench.train.resume import RESUME_FILE, TMP_PREFIX, ResumeFile
from bench.train.stats import TrainStats
from bench.train.trainer import train_model
from models.designs.registry import design_column_names
from models.transformer import DecoderLM

if TYPE_CHECKING:  # the job schema sits above the stages (bench.schema)
    from bench.schema import JobConfig

logger = logging.getLogger(__name__)

__all__ = [
    "CODE_SALT",
    "get_or_train",
    "weights_config",
    "weights_key",
]

# Bump whenever a code change alters the weights a given config trains to (model init, training
# loop, data pipeline): every key changes, so stale checkpoints are never reused.
CODE_SALT = "lenbench-weights-1"


# --------------------------------------------------------------------------- keys


def weights_config(job: JobConfig, corpus: Corpus | str | None = None) -> dict[str, Any]:
    """What determines the trained weights, normalized: model, position, data, train, seed, salt.

    ``corpus`` (a Corpus or its fingerprint) adds ``corpus_fingerprint``, so a changed corpus
    (edited text files, another Python's stdlib) never reuses weights trained on the old one.
    ``get_or_train`` always passes it: the key of a job is ``weights_key(job, corpus)``.
    A fine-tune's is ``{code_salt, parent_key, parent: <its parent's>, extend}``.
    """
    if job.extend.active:
        parent = weights_config(base_job(job), corpus)
        extend = {
            "code_salt": CODE_SALT,
            "parent_key": key_of(parent),
            "parent": parent,
            "extend": extend_weights(job),
        }
        return normalized(extend)
    out: dict[str, Any] = {
        "code_salt": CODE_SALT,
        "model": weights_dict(job.model),
        "position": position_weights(job.position),
        "data": weights_dict(job.data),
        "train": weights_dict(job.train),
        "seed": job.seed,
    }
    revision = job.position.family.weights_revision
    if revision:  # a family's own code change (models.positions.Family.weights_revision)
        out["position_revision"] = revision
    if job.model.attn_scale == "ssmax" and job.position.family.layer_spans:
        # SSMax's n on a windowed or chunked layer counts the keys in its span (issue 76 item 2),
        # no longer every key seen: such models train to other weights than before
        out["ssmax_keys"] = "attended"
    if job.train.passkey_fraction > 0:
        # the template's text, not only its name: editing a template retrains its models
        out["passkey_text"] = asdict(passkey_template(job.train.passkey_template))
    trained = [t for t in job.train.trained_ruler_tasks() if t != "passkey"]
    if trained:  # likewise the RULER-style tasks' text
        out["ruler_text"] = ruler_text(trained)
    if corpus is not None:
        out["corpus_fingerprint"] = corpus if isinstance(corpus, str) else corpus.fingerprint
    return normalized(out)


def weights_key(job: JobConfig, corpus: Corpus | str | None = None) -> str:
    """sha256 hex[:16] of ``weights_config(job, corpus)``."""
    return key_of(weights_config(job, corpus))


def model_config_id(job: JobConfig, corpus: Corpus | str | None = None) -> str:
    """The weights key with the seed left out: equal for every seed of one model configuration
    (the ``model_config_id`` column that ``bench.core.series`` counts in a series)."""
    return weights_key(replace(job, seed=0), corpus)


#: the model switches (and a switch's own fields: ``hybrid_every``), which name a design compared
#: on one recipe, left out of :func:`recipe_id` (``models.designs.registry.design_column_names``);
#: a design's own parameters (Llama 4's ``attn_floor``) stay in it, as they did before the registry
DESIGN_SWITCHES = tuple(design_column_names())


def recipe_id(job: JobConfig, corpus: Corpus | str | None = None) -> str:
    """The training recipe of a job's model: the weights config of the model it starts from (a
    fine-tune's base) with the seed, the position section, the family's revision and the design
    switches left out; equal for every position family and attention design trained alike (the
    ``recipe`` column, which the leaderboard never ranks across)."""
    config = weights_config(replace(base_job(job), seed=0), corpus)
    for key in ("seed", "position", "position_revision"):
        config.pop(key, None)
    config["model"] = {k: v for k, v in config["model"].items() if k not in DESIGN_SWITCHES}
    return key_of(config)


# --------------------------------------------------------------------------- paths


def _clean_leftovers(directory: Path) -> None:
    """Remove temp files of interrupted writers and a DONE-less model.pt (caller holds the lock)."""
    if not directory.is_dir():
        return
    for leftover in directory.glob(f"{TMP_PREFIX}*"):
        leftover.unlink(missing_ok=True)
    if not (directory / DONE_FILE).exists():
        (directory / MODEL_FILE).unlink(missing_ok=True)


# --------------------------------------------------------------------------- get or train


def _distributed(accelerator: Any) -> Any:
    """accelerate's PartialState when several processes run this job, else None."""
    if accelerator is not None:
        return accelerator.state if accelerator.num_processes > 1 else None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or (
        torch.distributed.is_available() and torch.distributed.is_initialized()
    ):
        from accelerate import PartialState

        state = PartialState(cpu=use_cpu_backend())
        return state if state.num_processes > 1 else None
    return None


def _finish(model: DecoderLM, job: JobConfig, device: Any) -> DecoderLM:
    # Eval-time position settings of the request (out_of_range) apply to the returned model.
    model.position_cfg = job.position
    return model.to(device).eval()


def curve_job(job: JobConfig, steps: int) -> JobConfig:
    """The fine-tune of ``job`` stopped after ``steps`` updates (a point of its recovery curve)."""
    return replace(job, extend=job.extend.with_steps(steps))


def save_snapshot(
    job: JobConfig,
    corpus: Corpus,
    cache_root: str | Path | None,
    steps: int,
    model: DecoderLM,
    stats: Mapping[str, Any],
) -> Path | None:
    """Store ``model`` (a fine-tune of ``job`` after ``steps`` updates) as the checkpoint of
    :func:`curve_job` ``(job, steps)``; nothing if it exists or another process holds its lock."""
    from filelock import FileLock, Timeout

    point = curve_job(job, steps)
    config = weights_config(point, corpus)
    key = key_of(config)
    root = resolve_cache_root(cache_root)
    directory = root / key
    if (directory / DONE_FILE).exists():
        return None
    root.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(str(root / f"{key}.lock"), timeout=0):
            if (directory / DONE_FILE).exists():
                return None
            _clean_leftovers(directory)
            return save_checkpoint(model, key, config, root, json_safe(stats))
    except Timeout:
        return None  # being trained by another process: its own run writes it


#: What get_or_train returns: (model in eval mode, meta, whether this call trained it).
_Result = tuple[DecoderLM, dict[str, Any], bool]


class _CacheEntry:
    """The cache slot of one job for :func:`get_or_train`: its key, directory and resumable
    state, and the two ways to fill a request from it (load, or train and write)."""

    def __init__(
        self,
        job: JobConfig,
        corpus: Corpus,
        cache_root: str | Path | None,
        *,
        train_fn: Callable[..., tuple[DecoderLM, TrainStats | Mapping[str, Any]]],
        progress: bool,
        accelerator: Any,
        device: str | torch.device,
        lock_timeout: float,
        retrain_corrupt: bool,
    ):
        self.job, self.corpus, self.train_fn, self.progress = job, corpus, train_fn, progress
        self.accelerator, self.device = accelerator, device
        self.lock_timeout, self.retrain_corrupt = lock_timeout, retrain_corrupt
        self.config = weights_config(job, corpus)
        self.key = key_of(self.config)
        self.root = resolve_cache_root(cache_root)
        self.directory = self.root / self.key
        self.resume = ResumeFile(self.directory / RESUME_FILE, self.key, self.config)
        # train_fn's keyword arguments; parent() adds a fine-tune's init
        self.kwargs: dict[str, Any] = {"progress": progress, "resume": self.resume}
        if accelerator is not None:
            self.kwargs["accelerator"] = accelerator
        if job.extend.active and any(job.extend.curve):
            self.kwargs["snapshot"] = lambda steps, model, stats: save_snapshot(
                job, corpus, self.root, steps, model, stats
            )

    def done(self) -> bool:
        return (self.directory / DONE_FILE).exists()

    def lock(self) -> Any:
        from filelock import FileLock

        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / f"{self.key}.lock"), timeout=self.lock_timeout)

    def parent(self) -> None:
        """A fine-tune's parent model as ``init`` (every rank calls this: it may train)."""
        if self.job.extend.active:
            self.kwargs["init"], _, _ = get_or_train(
                base_job(self.job),
                self.corpus,
                self.root,
                train_fn=self.train_fn,
                progress=self.progress,
                accelerator=self.accelerator,
                device=self.device,
                lock_timeout=self.lock_timeout,
            )

    def load(self) -> _Result:
        model, meta = load_model(self.directory, device=self.device, expected_config=self.config)
        return _finish(model, self.job, self.device), meta, False

    def load_or_forget(self) -> _Result | None:
        """The stored model, or None (its DONE removed, so it trains again) when its file does
        not match its recorded SHA-256 and ``retrain_corrupt`` allows retraining."""
        try:
            return self.load()
        except CheckpointCorrupt as err:
            if not self.retrain_corrupt:
                raise
            logger.warning("%s", err)
            (self.directory / DONE_FILE).unlink(missing_ok=True)
            return None

    def train_and_save(self, write: bool) -> _Result:
        """Train; with ``write``, store the checkpoint and drop the now obsolete resumable state."""
        model, stats = self.train_fn(self.job, self.corpus, **self.kwargs)
        stats = json_safe(stats)
        if write:
            save_checkpoint(model, self.key, self.config, self.root, stats)
            self.resume.clear()  # the checkpoint is final; the partial run is obsolete
        # meta describes the model as trained, before _finish sets the request's position_cfg
        meta = {
            "key": self.key,
            "weights_config": self.config,
            "train_length": int(model.train_length),
            "train_stats": stats,
            "model_cfg": asdict(model.model_cfg),
            "position_cfg": asdict(model.position_cfg),
            "scaling": asdict(model.scaling) if self.job.extend.active else None,
            "path": str(self.directory),
        }
        return _finish(model, self.job, self.device), meta, True

    def get_alone(self) -> _Result:
        """One process: load a finished checkpoint, else train it under the key's lock."""
        if self.done():
            loaded = self.load_or_forget()
            if loaded is not None:
                return loaded
        self.parent()
        with self.lock():
            if self.done():
                loaded = self.load_or_forget()  # another process trained it while we waited
                if loaded is not None:
                    return loaded
            _clean_leftovers(self.directory)
            return self.train_and_save(write=True)

    def get_ranked(self, state: Any) -> _Result:
        """Several ranks: rank 0 holds the lock and decides train-or-load for all of them."""
        from accelerate.utils import broadcast_object_list

        lock = None
        decision = ["load"]
        try:
            if state.is_main_process:
                lock = self.lock()
                lock.acquire()
                if not self.done():
                    _clean_leftovers(self.directory)
                    decision = ["train"]
            broadcast_object_list(decision, from_process=0)
            if decision[0] == "load":
                if lock is not None:
                    lock.release()
                    lock = None
                return self.load()
            self.parent()
            result = self.train_and_save(write=state.is_main_process)
            state.wait_for_everyone()  # nobody returns before the checkpoint is complete
            return result
        finally:
            if lock is not None:
                lock.release()


def get_or_train(
    job: JobConfig,
    corpus: Corpus,
    cache_root: str | Path | None = None,
    train_fn: Callable[..., tuple[DecoderLM, TrainStats | Mapping[str, Any]]] = train_model,
    progress: bool = True,
    *,
    accelerator: Any = None,
    device: str | torch.device = "cpu",
    lock_timeout: float = -1,
    retrain_corrupt: bool = True,
) -> tuple[DecoderLM, dict[str, Any], bool]:
    """The trained model for ``job`` on ``corpus``: loaded from the cache, or trained and stored.

    Returns (model in eval mode on ``device``, meta, trained) where meta is ``load_model``'s
    (``key``, ``weights_config``, ``train_length``, ``train_stats``, ``path``, ...) and trained
    says whether this call trained. ``train_fn(job, corpus, progress=..., resume=<ResumeFile>,
    [accelerator=...], [snapshot=...], [init=<parent model>])`` returns (model, TrainStats or a
    stats mapping) and is called at most once per finished key across concurrent processes;
    others wait on the lock (``lock_timeout`` seconds, -1 = forever) and then load. A checkpoint
    whose file no longer matches the SHA-256 recorded when it was written, or whose DONE marker
    is no longer JSON (a flipped bit, a truncation), is retrained with a warning naming the file
    (or, with ``retrain_corrupt=False``, raises ``CheckpointCorrupt``).
    For a fine-tune (``job.extend`` active) the parent comes from this function first (loaded, or
    trained under its own lock) and is passed as ``init``; a finished fine-tune needs no parent.
    Single process: :meth:`_CacheEntry.get_alone`; several: :meth:`_CacheEntry.get_ranked`.
    """
    entry = _CacheEntry(
        job,
        corpus,
        cache_root,
        train_fn=train_fn,
        progress=progress,
        accelerator=accelerator,
        device=device,
        lock_timeout=lock_timeout,
        retrain_corrupt=retrain_corrupt,
    )
    state = _distributed(accelerator)
    return entry.get_alone() if state is None else entry.get_ranked(state)
