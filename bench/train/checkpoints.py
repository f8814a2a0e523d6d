"""A checkpoint directory on disk: where a key's checkpoint lives, and writing, reading and
verifying its ``model.pt`` and ``DONE`` marker (the cache built on it: :mod:`bench.train.cache`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from bench.core.checks import weights_dict
from bench.core.rows import canonical_json
from bench.core.sections import ModelSchema, position_weights
from bench.train.resume import RESUME_FILE, atomic_write
from bench.train.stats import TrainStats
from models.positions import PositionConfig
from models.transformer import DecoderLM, ModelConfig, ScalingConfig

__all__ = [
    "DONE_FILE",
    "ENV_CACHE",
    "KEY_CHARS",
    "MODEL_FILE",
    "CheckpointCorrupt",
    "CheckpointError",
    "checkpoint_dir",
    "checkpoint_ref_dir",
    "default_cache_root",
    "file_sha256",
    "finished_train_length",
    "json_safe",
    "key_of",
    "load_model",
    "normalized",
    "resolve_cache_root",
    "save_checkpoint",
]

MODEL_FILE = "model.pt"
DONE_FILE = "DONE"
KEY_CHARS = 16
ENV_CACHE = "LENBENCH_CACHE"
_KEY_PATTERN = re.compile(rf"[0-9a-f]{{{KEY_CHARS}}}")


class CheckpointError(ValueError):
    """A stored checkpoint is missing, incomplete or does not match its key or the request."""


class CheckpointCorrupt(CheckpointError):
    """A stored checkpoint file's bytes differ from the SHA-256 recorded when it was written."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------- keys


def normalized(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as its canonical JSON reads back (``256.0`` -> ``256``, floats to 12 digits)."""
    return json.loads(canonical_json(config))


def key_of(config: Mapping[str, Any]) -> str:
    """The 16-hex-char key of an already normalized weights config."""
    return hashlib.sha256(canonical_json(config).encode("utf-8")).hexdigest()[:KEY_CHARS]


# --------------------------------------------------------------------------- paths


def default_cache_root() -> Path:
    """``$LENBENCH_CACHE`` or ``~/.cache/lenbench/checkpoints``."""
    env = os.environ.get(ENV_CACHE)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lenbench" / "checkpoints"


def resolve_cache_root(cache_root: str | Path | None) -> Path:
    return Path(cache_root).expanduser() if cache_root is not None else default_cache_root()


def checkpoint_dir(key: str, cache_root: str | Path | None = None) -> Path:
    if not _KEY_PATTERN.fullmatch(key):
        raise ValueError(
            f"checkpoint key {key!r} is invalid; a key is {KEY_CHARS} lowercase hex characters."
        )
    return resolve_cache_root(cache_root) / key


# --------------------------------------------------------------------------- save / load


def _base_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The base model's weights config: a fine-tune's ``parent``, followed to its root."""
    while "parent" in config:  # a fine-tune has its base model's architecture
        config = config["parent"]
    return config


def _model_part(config: Mapping[str, Any]) -> tuple[Any, Any, int]:
    config = _base_config(config)
    return config["model"], config["position"], config["train"]["length"]


def _scaling_part(scaling: ScalingConfig) -> dict[str, Any]:
    return scaling.identity


def _check_model_matches(
    model_cfg: Mapping[str, Any],
    position_cfg: Mapping[str, Any],
    train_length: int,
    config: Mapping[str, Any],
    where: str,
) -> None:
    want_model, want_position, want_length = _model_part(config)
    # both sides as they enter the key (a field added later is absent from older configs)
    model_cfg = weights_dict(ModelSchema(**model_cfg))
    want_model = weights_dict(ModelSchema(**want_model))
    position = position_weights(PositionConfig.from_stored(position_cfg))
    if (
        canonical_json(model_cfg) != canonical_json(want_model)
        or canonical_json(position) != canonical_json(want_position)
        or int(train_length) != int(want_length)
    ):
        raise CheckpointError(
            f"{where}: the model's configuration (model {canonical_json(model_cfg)}, position "
            f"{canonical_json(position)}, train_length {train_length}) does not match its weights "
            f"config (model {canonical_json(want_model)}, position {canonical_json(want_position)}, "
            f"train.length {want_length})."
        )


def save_checkpoint(
    model: DecoderLM,
    key: str,
    weights_config: Mapping[str, Any],
    cache_root: str | Path | None = None,
    train_stats: TrainStats | Mapping[str, Any] | None = None,
) -> Path:
    """Write ``<root>/<key>/model.pt`` then ``DONE``, each atomically; return the checkpoint dir.

    ``key`` must be ``key_of(weights_config)`` and the model must have the weights config's
    architecture; both are checked so a bad checkpoint is refused at write time, not at load.
    Callers that may race should hold the key's lock (``get_or_train`` does).
    """
    config = normalized(weights_config)
    if key_of(config) != key:
        raise CheckpointError(
            f"key {key!r} is not the key of the given weights config ({key_of(config)!r})."
        )
    _check_model_matches(
        asdict(model.model_cfg),
        asdict(model.position_cfg),
        model.train_length,
        config,
        f"checkpoint {key}",
    )
    if "extend" in config and canonical_json(_scaling_part(model.scaling)) != canonical_json(
        config["extend"]["scaling"]
    ):
        raise CheckpointError(
            f"checkpoint {key}: the model's scaling {canonical_json(_scaling_part(model.scaling))} "
            f"is not the one it was fine-tuned with ({canonical_json(config['extend']['scaling'])})."
        )
    directory = checkpoint_dir(key, cache_root)
    directory.mkdir(parents=True, exist_ok=True)
    state_dict = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    payload = {
        "key": key,
        "model_cfg": asdict(model.model_cfg),
        "position_cfg": asdict(model.position_cfg),
        "train_length": int(model.train_length),
        "weights_config": config,
        "state_dict": state_dict,
        "train_stats": json_safe(train_stats),
    }
    if "extend" in config:  # a fine-tuned model is evaluated with the scaling it trained with
        payload["scaling"] = asdict(model.scaling)
    (directory / DONE_FILE).unlink(missing_ok=True)  # a rewrite is incomplete until DONE is back
    atomic_write(directory / MODEL_FILE, lambda handle: torch.save(payload, handle))
    # the file's digest, verified on every load: a flipped bit is never silently a model
    record = {"key": key, "weights_config": config, "sha256": file_sha256(directory / MODEL_FILE)}
    done = json.dumps(record, indent=1, sort_keys=True)
    atomic_write(directory / DONE_FILE, lambda handle: handle.write(done.encode("utf-8")))
    return directory


def json_safe(stats: TrainStats | Mapping[str, Any] | None) -> dict[str, Any]:
    """train_stats as JSON would return them (int dict keys become strings), for both code paths."""
    if isinstance(stats, TrainStats):
        stats = stats.as_dict()
    return json.loads(json.dumps(dict(stats or {}), default=str))


def finished_train_length(key: str, cache_root: str | Path | None = None) -> int | None:
    """The training length of the finished checkpoint ``key`` under ``cache_root`` read from its
    DONE record (cheap: the weights are not loaded), or None when no finished checkpoint is there.
    A fine-tune answers its base model's length, as the loaded model does."""
    done = checkpoint_dir(key, cache_root) / DONE_FILE
    try:
        config = json.loads(done.read_text(encoding="utf-8"))["weights_config"]
        return int(_base_config(config)["train"]["length"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def checkpoint_ref_dir(ref: str | Path, cache_root: str | Path | None) -> Path:
    """Checkpoint directory of a key, a checkpoint directory or a model.pt path."""
    path = Path(ref).expanduser()
    if isinstance(ref, str) and _KEY_PATTERN.fullmatch(ref) and not path.exists():
        path = checkpoint_dir(ref, cache_root)
    if path.is_file():
        return path.parent
    if path.is_dir():
        return path
    raise CheckpointError(
        f"checkpoint {str(ref)!r} was not found; give a {KEY_CHARS}-hex-character key (looked up "
        f"under {resolve_cache_root(cache_root)}), a checkpoint directory or a path to its "
        f"{MODEL_FILE}."
    )


def _read_checkpoint(directory: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(DONE record, model.pt payload) of a finished checkpoint whose file still has the SHA-256
    recorded in DONE; CheckpointError when it is incomplete or unreadable."""
    model_path, done_path = directory / MODEL_FILE, directory / DONE_FILE
    if (
        not done_path.exists()
        and not model_path.exists()
        and not (directory / RESUME_FILE).exists()
    ):
        raise CheckpointError(
            f"{directory} is not a lenbench checkpoint (it has no {MODEL_FILE}); give a checkpoint "
            f"directory, its {MODEL_FILE} or a {KEY_CHARS}-hex-character cache key."
        )
    if not done_path.exists() or not model_path.exists():
        raise CheckpointError(
            f"checkpoint {directory} is incomplete (no {DONE_FILE} marker or no {MODEL_FILE}): its "
            "training was interrupted; rerun the job to train it again."
        )
    try:
        done = json.loads(done_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:  # DONE is written atomically
        raise CheckpointCorrupt(
            f"checkpoint marker {done_path} is not the JSON written when it was completed (its "
            f"bytes changed on disk: {type(err).__name__}); it is retrained, or delete its "
            "directory."
        ) from err
    except Exception as err:
        raise CheckpointError(
            f"checkpoint {directory} cannot be read ({err}); delete it to retrain."
        ) from err
    if not isinstance(done, dict):
        raise CheckpointCorrupt(
            f"checkpoint marker {done_path} is not the JSON record written when it was completed "
            "(its bytes changed on disk); it is retrained, or delete its directory."
        )
    recorded = done.get("sha256")
    if recorded is not None and file_sha256(model_path) != recorded:
        raise CheckpointCorrupt(
            f"checkpoint file {model_path} does not match the SHA-256 recorded when it was "
            "written (its bytes changed on disk); it is retrained, or delete its directory."
        )
    try:
        payload = torch.load(model_path, map_location="cpu", weights_only=True)
    except Exception as err:  # a corrupt file must name its path
        raise CheckpointError(
            f"checkpoint {directory} cannot be read ({err}); delete it to retrain."
        ) from err
    return done, payload


def _verified_config(
    directory: Path,
    done: dict[str, Any],
    payload: dict[str, Any],
    expected_config: Mapping[str, Any] | None,
) -> tuple[str, dict[str, Any]]:
    """(key, weights config) of a read checkpoint after checking that the config hashes to the
    key, agrees with DONE, the request and the stored model; CheckpointError otherwise."""
    model_path = directory / MODEL_FILE
    stored = payload.get("weights_config")
    key = payload.get("key")
    if not isinstance(stored, dict) or not isinstance(key, str):
        raise CheckpointError(
            f"checkpoint {model_path} has no weights_config/key; delete {directory} to retrain."
        )
    if key_of(stored) != key or (_KEY_PATTERN.fullmatch(directory.name) and directory.name != key):
        raise CheckpointError(
            f"checkpoint {model_path} is inconsistent: its stored weights config hashes to "
            f"{key_of(stored)} but it is stored as {key!r} in {directory.name!r} (edited or "
            f"corrupted); delete {directory} to retrain."
        )
    if done.get("key") != key or canonical_json(done.get("weights_config")) != canonical_json(
        stored
    ):
        raise CheckpointError(
            f"checkpoint {directory} is inconsistent: {DONE_FILE} and {MODEL_FILE} disagree about "
            f"the weights config (edited or corrupted); delete {directory} to retrain."
        )
    if expected_config is not None and canonical_json(expected_config) != canonical_json(stored):
        raise CheckpointError(
            f"checkpoint {model_path} does not hold the requested weights config: stored "
            f"{canonical_json(stored)}, requested {canonical_json(expected_config)}."
        )
    _check_model_matches(
        payload["model_cfg"],
        payload["position_cfg"],
        payload["train_length"],
        stored,
        f"checkpoint {model_path}",
    )
    return key, stored


def load_model(
    ref: str | Path,
    cache_root: str | Path | None = None,
    device: str | torch.device = "cpu",
    expected_config: Mapping[str, Any] | None = None,
) -> tuple[DecoderLM, dict[str, Any]]:
    """Load a finished checkpoint -> (model in eval mode on ``device``, meta).

    ``ref`` is a key (under ``cache_root``, default ``$LENBENCH_CACHE`` or
    ``~/.cache/lenbench/checkpoints``), a checkpoint directory or its model.pt. meta holds
    ``key``, ``weights_config``, ``train_length``, ``train_stats``, ``model_cfg``,
    ``position_cfg``, ``scaling`` (a fine-tune's, set on the model; else None) and ``path``.
    Raises CheckpointError (a ValueError) if the checkpoint is incomplete (no DONE), was edited
    (its weights config does not hash to its key), or does not equal ``expected_config`` when
    given.
    """
    directory = checkpoint_ref_dir(ref, cache_root)
    done, payload = _read_checkpoint(directory)
    key, stored = _verified_config(directory, done, payload, expected_config)
    model = DecoderLM(
        ModelConfig(**payload["model_cfg"]),
        PositionConfig.from_stored(payload["position_cfg"]),
        int(payload["train_length"]),
    )
    model.load_state_dict(payload["state_dict"])
    if payload.get("scaling") is not None:
        model.set_scaling(ScalingConfig(**payload["scaling"]))
    model.to(device).eval()
    meta = {
        "key": key,
        "weights_config": stored,
        "train_length": int(payload["train_length"]),
        "train_stats": payload.get("train_stats", {}),
        "model_cfg": payload["model_cfg"],
        "position_cfg": payload["position_cfg"],
        "scaling": payload.get("scaling"),
        "path": str(directory),
    }
    return model, meta
