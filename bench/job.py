"""One benchmark job: validate -> corpus -> checkpoint (trained only if not cached) -> evaluate -> parquet.

:func:`run_job` is what the ``lenbench`` Hydra app runs for every job of a sweep. Steps:

1. :func:`validate_job` checks the whole composed config before anything expensive happens:
   model and position configs (``validate``), the scaling method and whether it applies to the
   position family, its parameters at every eval length (on a throwaway one-layer model, so the
   model's own checks run), eval lengths against a learned position table with the ``error``
   policy, the passkey training mix against the training length, the device, and the data config
   (missing paths). Every problem is a ``ValueError`` with one sentence.
2. The corpus is loaded (``bench.corpora.load_corpus``, cached per process) and the job's identity
   computed: ``model_id`` = the checkpoint cache key (``bench.cache.weights_key(cfg, corpus)``:
   only what changes the weights, incl. the corpus fingerprint) and ``run_id`` = a hash of
   model_id + scaling + resolved eval config + experiment + seed. If
   ``<results>/<experiment>/<run_id>.parquet`` exists the job is done already and is skipped
   (re-running finished work is free; Hydra has no sweep resume, this is it).
3. The checkpoint is loaded or trained (``bench.cache.get_or_train``; two jobs wanting one
   checkpoint: one trains, the other waits on its file lock and loads).
4. ``bench.evaluate.evaluate_model`` measures, identity columns are added, and the table is written
   atomically (``bench.results.write_results``).

Outcomes (``summary["status"]``): ``done`` (evaluated and written), ``cached`` (result file already
there), ``not_applicable`` (the scaling method has no meaning for the position family, e.g. yarn
on learned: a sweep's cartesian product produces such pairs and they are skipped with a one-line
note), ``invalid`` (a config error; message = the sentence), ``failed`` (training diverged or ran
out of memory; nothing is written). Unexpected exceptions propagate.

Distributed training (accelerate/torchrun) composes with this the other way round: Hydra outside,
the distributed launcher inside. A sweep job that needs several GPUs runs one
``accelerate launch`` subprocess with a fixed ``hydra.run.dir`` (see conf/hydra/launcher/
submitit_slurm.yaml); never ``accelerate launch lenbench -m ...``, which would start every sweep
once per process.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from bench.config import plain
from bench.results import canonical_json, write_results
from bench.runtime import resolve_device
from models.positions import PositionConfig
from models.scaling import SCALING_METHODS
from models.transformer import METHODS_FOR_FAMILY, DecoderLM, ModelConfig, ScalingConfig

log = logging.getLogger("lenbench")

__all__ = [
    "JobSpec",
    "NotApplicable",
    "code_version",
    "run_job",
    "scaling_config",
    "validate_job",
]

STATUSES = ("done", "cached", "not_applicable", "invalid", "failed")
_RUN_ID_CHARS = 16


class NotApplicable(ValueError):
    """The scaling method has no meaning for the position family (a skipped sweep cell)."""


@dataclass
class JobSpec:
    """The validated, typed form of one job's config."""

    experiment: str
    model_cfg: ModelConfig
    position_cfg: PositionConfig
    scaling: ScalingConfig
    train_length: int
    eval_cfg: dict[str, Any]  # resolved: lengths in tokens (bench.evaluate.resolve_eval_config)
    seed: int
    device: str
    results_dir: Path  # <paths.results>/<experiment>
    cache_root: Path

    @property
    def eval_lengths(self) -> list[int]:
        return list(self.eval_cfg["lengths"])


# --------------------------------------------------------------------------- helpers


def _section(cfg: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = cfg.get(key)
    if not isinstance(value, Mapping):
        raise ValueError(f"the config has no {key!r} section; choose one with {key}=<option>.")
    return dict(value)


def _dataclass_from(cls: type, values: Mapping[str, Any], what: str) -> Any:
    allowed = [f.name for f in fields(cls)]
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ValueError(
            f"{what} config has unknown keys {unknown}; allowed keys: {', '.join(allowed)}."
        )
    return cls(**values)


def _int(value: Any, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} {value!r} is invalid; allowed: an integer >= {minimum}.")
    return value


def base_dir() -> Path:
    """Where lenbench was started: Hydra's original cwd inside a Hydra job, else the cwd."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return Path(HydraConfig.get().runtime.cwd)
    except (ImportError, ValueError):  # pragma: no cover - no Hydra context
        pass
    return Path.cwd()


def resolve_path(value: Any, what: str) -> Path:
    """``~``-expanded absolute path; relative paths are relative to where lenbench was started."""
    if value is None or str(value).strip() in ("", "???"):
        raise ValueError(f"{what} is not set; give a directory.")
    path = Path(os.path.expandvars(os.path.expanduser(str(value))))
    return path if path.is_absolute() else base_dir() / path


def code_version() -> str:
    """Package version + the models' code salt (the salt also enters every checkpoint key)."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        pkg = version("lenbench")
    except PackageNotFoundError:  # pragma: no cover - running from a plain checkout
        pkg = "0+unknown"
    salt = _code_salt()
    return f"{pkg}+{salt}" if salt else pkg


def _code_salt() -> str:
    for module in ("models", "bench.cache"):
        try:
            salt = getattr(__import__(module, fromlist=["CODE_SALT"]), "CODE_SALT", None)
        except ImportError:  # pragma: no cover
            salt = None
        if salt:
            return str(salt)
    return ""


# --------------------------------------------------------------------------- validation


def scaling_config(cfg: Mapping[str, Any]) -> ScalingConfig:
    """The ScalingConfig of a ``scaling`` config section (name, method, params, logn)."""
    raw = dict(cfg)
    sc = _dataclass_from(ScalingConfig, raw, "scaling")
    if not isinstance(sc.name, str) or not sc.name.strip():
        raise ValueError(f"scaling.name {sc.name!r} is invalid; give a non-empty label.")
    if sc.method not in SCALING_METHODS:
        raise ValueError(
            f"scaling method {sc.method!r} is unknown; allowed: {', '.join(SCALING_METHODS)}."
        )
    params = sc.params if sc.params is not None else {}
    if not isinstance(params, Mapping):
        raise ValueError(f"scaling.params {params!r} is invalid; give a mapping of parameters.")
    if not isinstance(sc.logn, bool):
        raise ValueError(f"scaling.logn {sc.logn!r} is invalid; allowed: true, false.")
    return ScalingConfig(name=sc.name, method=sc.method, params=dict(params), logn=sc.logn)


def check_applicable(position_kind: str, scaling: ScalingConfig) -> None:
    """Raise NotApplicable when the scaling method means nothing for the position family."""
    allowed = METHODS_FOR_FAMILY.get(position_kind)
    if allowed is not None and scaling.method not in allowed:
        raise NotApplicable(
            f"scaling {scaling.name} (method {scaling.method}) does not apply to position "
            f"{position_kind}; methods for {position_kind}: {', '.join(allowed)}, each may add logn"
        )


def _check_scaling_at_lengths(spec: JobSpec) -> None:
    """Run the model's own scaling checks at every eval length on a throwaway 1-layer model.

    Also rejects eval lengths a learned table cannot embed under the ``error`` policy (the eval
    would otherwise skip those lengths with only a warning, after training).
    """
    from bench.probes import position_range_error

    probe_cfg = ModelConfig(**{**asdict(spec.model_cfg), "n_layers": 1})
    with torch.random.fork_rng(devices=[]):  # the throwaway init must not move the global rng
        model = DecoderLM(probe_cfg, spec.position_cfg, spec.train_length)
    for length in spec.eval_lengths:
        try:
            model.set_scaling(spec.scaling, length)
        except ValueError as exc:
            raise ValueError(
                f"scaling {spec.scaling.name} is invalid at eval length {length}: {exc}"
            ) from None
        problem = position_range_error(model, length - 1, length)
        if problem is not None:
            rows = spec.position_cfg.max_positions or spec.train_length
            raise ValueError(
                f"eval length {length} is beyond the learned position table ({rows} rows) and "
                f"position.out_of_range is {spec.position_cfg.out_of_range!r}; allowed: eval "
                f"lengths <= {rows}, position.out_of_range=clamp or interpolate, or scaling=linear."
            )


def validate_job(cfg: Mapping[str, Any]) -> JobSpec:
    """Check a composed job config; return its typed form or raise ValueError (one sentence).

    Raises :class:`NotApplicable` (a ValueError) when the scaling method does not apply to the
    position family. Cheap: no corpus is read and nothing is trained.
    """
    from bench.corpora import normalize_data_config
    from bench.evaluate import resolve_eval_config
    from bench.passkey import min_passkey_length
    from bench.train import normalize_train_config

    cfg = plain(cfg)
    experiment = cfg.get("experiment_name", "default")
    if not isinstance(experiment, str) or not experiment.strip() or "/" in experiment:
        raise ValueError(
            f"experiment_name {experiment!r} is invalid; give a non-empty name without '/'."
        )
    model_cfg = _dataclass_from(ModelConfig, _section(cfg, "model"), "model")
    model_cfg.validate()
    position = _section(cfg, "position")
    if "base" in position and isinstance(position["base"], (int, float)):
        position["base"] = float(position["base"])
    position_cfg = _dataclass_from(PositionConfig, position, "position")
    position_cfg.validate(model_cfg.head_dim, model_cfg.d_model)

    train = normalize_train_config(_section(cfg, "train"))  # unknown keys, types, ranges
    train_length = train["length"]
    if position_cfg.kind == "learned" and 0 < position_cfg.max_positions < train_length:
        raise ValueError(
            f"position.max_positions {position_cfg.max_positions} is smaller than train.length "
            f"{train_length}; allowed: 0 (= train.length) or at least {train_length}."
        )
    passkey_fraction = train["passkey_fraction"]
    if passkey_fraction > 0 and train_length + 1 < min_passkey_length():
        raise ValueError(
            f"train.length {train_length} is too short for passkey training examples "
            f"(train.passkey_fraction={passkey_fraction:g}); allowed: train.length >= "
            f"{min_passkey_length() - 1} or train.passkey_fraction=0."
        )
    seed = _int(cfg.get("seed", 0), "seed", 0)

    scaling = scaling_config(_section(cfg, "scaling"))
    check_applicable(position_cfg.kind, scaling)
    eval_cfg = resolve_eval_config(_section(cfg, "eval"), train_length)
    normalize_data_config(_section(cfg, "data"))  # unknown keys, missing paths
    device = resolve_device(cfg.get("device", "auto"))

    paths = _section(cfg, "paths")
    spec = JobSpec(
        experiment=experiment,
        model_cfg=model_cfg,
        position_cfg=position_cfg,
        scaling=scaling,
        train_length=train_length,
        eval_cfg=eval_cfg,
        seed=seed,
        device=device,
        results_dir=resolve_path(paths.get("results"), "paths.results") / experiment,
        cache_root=resolve_path(paths.get("cache"), "paths.cache"),
    )
    _check_scaling_at_lengths(spec)
    return spec


# --------------------------------------------------------------------------- identity


def scaling_params_json(scaling: ScalingConfig) -> str:
    return canonical_json(
        {"method": scaling.method, "params": scaling.params, "logn": scaling.logn}
    )


def position_params_json(cfg: Mapping[str, Any]) -> str:
    """The position config as given (kind is its own column)."""
    return canonical_json({k: v for k, v in plain(cfg["position"]).items() if k != "kind"})


def make_run_id(model_id: str, spec: JobSpec) -> str:
    """Hash of everything that identifies the job's rows: weights, scaling, eval protocol, experiment."""
    identity = {
        "model_id": model_id,
        "scaling": {"name": spec.scaling.name, "params": scaling_params_json(spec.scaling)},
        "eval": spec.eval_cfg,
        "experiment": spec.experiment,
        "seed": spec.seed,
    }
    return hashlib.sha256(canonical_json(identity).encode("utf-8")).hexdigest()[:_RUN_ID_CHARS]


# --------------------------------------------------------------------------- running


def configure_threads(cfg: Mapping[str, Any]) -> None:
    """torch intra-op threads: ``threads`` if set, else cpu_count / n_jobs under the joblib launcher."""
    threads = cfg.get("threads")
    if threads is None:
        try:
            from hydra.core.hydra_config import HydraConfig

            if HydraConfig.initialized():
                launcher = HydraConfig.get().launcher
                if "joblib" in str(launcher.get("_target_", "")).lower():
                    cpus = os.cpu_count() or 1
                    n_jobs = int(launcher.get("n_jobs", 1) or 1)
                    threads = max(1, cpus // (cpus if n_jobs < 1 else n_jobs))
        except (ImportError, ValueError):  # pragma: no cover
            threads = None
    if threads is not None:
        torch.set_num_threads(_int(threads, "threads", 1))


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
    )


def _summary(status: str, message: str = "", **extra: Any) -> dict[str, Any]:
    return {"status": status, "message": message, **extra}


def run_job(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Run one job (module doc); return a summary dict with ``status`` and ``message``.

    Expected problems never raise: a bad config gives status ``invalid`` (message = one sentence),
    a scaling that does not apply gives ``not_applicable``, divergence or out-of-memory ``failed``.
    In all three nothing is trained after the problem and nothing is written.
    """
    started = time.perf_counter()
    raw = plain(cfg)
    base = {
        "experiment": raw.get("experiment_name"),
        "position": (raw.get("position") or {}).get("kind"),
        "scaling": (raw.get("scaling") or {}).get("name"),
    }
    try:
        spec = validate_job(raw)
    except NotApplicable as exc:
        return _summary("not_applicable", f"{exc}; skipped.", **base)
    except ValueError as exc:
        return _summary("invalid", str(exc), **base)

    from bench.cache import get_or_train, weights_key
    from bench.corpora import load_corpus
    from bench.evaluate import evaluate_model
    from bench.train import TrainingDiverged

    try:
        corpus = load_corpus(raw["data"])  # cached per process; the key needs its fingerprint
    except ValueError as exc:
        return _summary("invalid", str(exc), **base)
    if not corpus.split("test"):
        return _summary(
            "invalid",
            f"the test split of corpus {corpus.name} ({corpus.fingerprint}) is empty, so there is "
            "nothing to evaluate on; give data.split_fractions a larger test share or raise "
            "data.max_files / data.max_bytes.",
            **base,
        )
    model_id = weights_key(raw, corpus)
    run_id = make_run_id(model_id, spec)
    out_path = spec.results_dir / f"{run_id}.parquet"
    base.update(run_id=run_id, model_id=model_id, results_path=str(out_path))
    if out_path.exists():
        return _summary(
            "cached", f"results already exist at {out_path}; nothing to do.", trained=False, **base
        )

    try:
        model, _meta, trained = get_or_train(raw, corpus, spec.cache_root, device=spec.device)
    except TrainingDiverged as exc:
        return _summary("failed", f"training diverged: {exc}", trained=True, **base)
    except (RuntimeError, MemoryError) as exc:
        if not _is_oom(exc) and not isinstance(exc, MemoryError):
            raise
        return _summary("failed", f"out of memory while training: {_first_line(exc)}", **base)
    except ValueError as exc:
        return _summary("invalid", str(exc), **base)

    try:
        rows = evaluate_model(
            model,
            spec.eval_cfg,
            corpus.split("test"),
            train_length=spec.train_length,
            scaling=spec.scaling,
            device=spec.device,
            seed=spec.seed,
        )
    except (RuntimeError, MemoryError) as exc:
        if not _is_oom(exc) and not isinstance(exc, MemoryError):
            raise
        return _summary(
            "failed", f"out of memory while evaluating: {_first_line(exc)}", trained=trained, **base
        )
    except ValueError as exc:
        return _summary("invalid", str(exc), trained=trained, **base)
    harness = spec.eval_cfg["harness"]
    if harness["tasks"]:
        from bench.harness import harness_rows, run_harness

        results = run_harness(
            model,
            list(harness["tasks"]),
            scaling=spec.scaling,
            limit=harness["limit"],
            device=spec.device,
            metadata={"data": raw["data"]},
        )
        rows += [{**row, "eval_length": row["eval_length"] or 0} for row in harness_rows(results)]
    if not rows:
        return _summary(
            "failed",
            "the evaluation produced no rows; check the eval config.",
            trained=trained,
            **base,
        )

    identity = {
        "experiment": spec.experiment,
        "run_id": run_id,
        "model_id": model_id,
        "position": spec.position_cfg.kind,
        "position_params": position_params_json(raw),
        "scaling": spec.scaling.name,
        "scaling_params": scaling_params_json(spec.scaling),
        "train_length": spec.train_length,
        "seed": spec.seed,
        "corpus": corpus.name,
        "corpus_fingerprint": corpus.fingerprint,
        "code_version": code_version(),
    }
    write_results([{**row, **identity} for row in rows], out_path)
    seconds = time.perf_counter() - started
    return _summary(
        "done",
        f"{len(rows)} rows written to {out_path} in {seconds:.1f} s.",
        trained=trained,
        rows=len(rows),
        seconds=round(seconds, 2),
        **base,
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
