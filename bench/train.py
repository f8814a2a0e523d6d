"""Training of one :class:`~models.transformer.DecoderLM` on a corpus's training split.

``train_model(cfg, corpus)`` reads ``cfg.model`` (:class:`ModelConfig` fields), ``cfg.position``
(:class:`PositionConfig` fields), ``cfg.train`` (below) and ``cfg.seed``, and returns the trained
model (eval mode, on the accelerator's device) and a ``train_stats`` dict. The checkpoint cache
(``bench.cache.get_or_train``) calls it only when no checkpoint with the same weights key exists.

Train config keys (``conf/train/*.yaml``; every key is optional, defaults in ``TRAIN_DEFAULTS``)::

    length: 256            training sequence length in tokens (= the model's train_length)
    steps: 300             optimizer updates
    batch_size: 16         sequences per update (global: split across processes under DDP)
    lr: 3.0e-3             peak learning rate
    min_lr: null           final learning rate of the cosine decay ...
    min_lr_ratio: 0.1      ... or as a fraction of lr (give one of the two; min_lr wins if set)
    warmup_steps: 30       linear warmup from lr/warmup_steps to lr over this many updates
    weight_decay: 0.1      AdamW decoupled decay ...
    weight_decay_scope: matrices   ... on the projection matrices only, or on all parameters
    betas: [0.9, 0.95]     AdamW betas (eps 1e-8)
    grad_clip: 1.0         global gradient-norm clip; 0 disables
    precision: fp32        fp32 | bf16 (bf16 = autocast; weights, optimizer state, softmax and
                           the loss stay float32)
    passkey_fraction: 0.0  fraction of training rows that are passkey examples (bench.batches)
    passkey_filler: standard   standard | corpus (filler of those rows)
    passkey_loss: all      all | answer (train passkey rows on every token or only the answer)
    eval_every: 100        validation every this many updates (and always after the last);
                           0 = only after the last
    eval_batches: 4        validation batches of batch_size windows (validation split); 0 = none
    log_every: 10          updates between loss checks / progress-bar updates

``eval_every``, ``eval_batches`` and ``log_every`` do not change the weights, so they are not part
of the checkpoint key (``bench.cache.NON_WEIGHT_TRAIN_KEYS``); every other key is. A ``name`` key
(a label some config groups carry) is ignored.

Choices (why):

* Schedule: linear warmup to ``lr``, then cosine decay reaching ``min_lr`` at the last update.
  The learning rate is set by hand on every update (no scheduler object), so the schedule does
  not depend on how many processes run: accelerate's wrapped schedulers step once per process.
* ``weight_decay_scope: matrices`` (the default, as in nanoGPT) decays only the weight matrices
  of the linear projections (attention, MLP and an untied output head). Embeddings (the token
  table, and the output head when tied to it), the learned position table, norms and biases
  are not decayed: decay would pull rarely seen byte and position rows towards zero, and norm
  gains towards 0 rather than their natural 1. ``all`` decays every parameter (plain
  ``AdamW(model.parameters())``). The quickstart needs ``all``: its 2-layer width-64 RoPE model
  learns passkey retrieval at L = 256 within 1000-1200 steps only when embeddings and norms are
  decayed too (measured: accuracy 1.00 with ``all``, 0.00 with ``matrices`` after 1200 steps;
  decaying the embedding alone gave 0.03). Decay on the token table seems to be what lets the
  copy circuit form early in such a small model.
* Determinism: ``torch.manual_seed(seed)`` before the model is built fixes the initialisation
  and dropout; the batches come from ``bench.corpora.TrainingStream(seed=seed)``, where batch k is
  a pure function of (seed, k). Same config and seed on the same machine -> identical weights.
* Under DDP every process builds the same global batch and takes rows ``rank::world``, so the
  global batch (and, up to float reduction order, the weights) does not depend on the number
  of processes; ``batch_size`` must be divisible by it.
* Loss checks are on-device: each update's loss goes into a preallocated tensor and is read
  back only every ``log_every`` updates (one host sync), where a NaN/inf anywhere in the
  window raises :class:`TrainingDiverged` naming the first bad update. Its mean is the
  logged training loss. tokens/s counts training tokens over training time (validation
  excluded).
* bf16 on CPU: autocast is emulated on CPUs without AVX512-BF16/AMX and was measured ~3-8x
  slower than fp32 on this project's AVX2 laptop and 12-25x slower on an AVX2 AMD EPYC
  (``benchmarks/bench_train.py``, widths 128/256), so ``conf/train/quick.yaml`` uses fp32,
  ``standard`` (GPU) uses bf16, and training bf16 on such a CPU warns once.
* Precision is not set through ``Accelerator(mixed_precision=...)``: accelerate's state is a
  process-wide singleton that refuses a second, different ``mixed_precision``, which a
  one-process Hydra sweep over ``train.precision`` needs. We create ``Accelerator(
  mixed_precision="no")`` and wrap forward passes in ``torch.autocast(device_type,
  dtype=torch.bfloat16)`` ourselves. An accelerator passed in with mixed precision on must
  agree with ``train.precision``.

Distributed training (Hydra outside, launcher inside): Hydra composes the config and sweeps;
one Hydra job = one process tree. A job that wants several devices starts ``accelerate launch
[--num_processes N] <job script> <resolved job config>`` as a subprocess with a fixed
``hydra.run.dir``; inside, every rank calls ``bench.cache.get_or_train`` (which makes the ranks
agree on train-or-load and lets only rank 0 hold the lock and write the checkpoint) and hence
``train_model``, whose ``Accelerator`` picks up the launcher's environment. Never run
``accelerate launch lenbench -m ...``: every rank would run the whole sweep. On SLURM use
submitit tasks (tasks_per_node = GPUs) with ``submitit.helpers.TorchDistributedEnvironment``.
``accelerate launch --cpu --num_processes 1 job.py`` runs one process on the CPU. For DDP on a CPU
box use ``torchrun --standalone --nproc_per_node 2 job.py`` or ``accelerate launch --multi_gpu
--num_processes 2 job.py`` (gloo; see :func:`use_cpu_backend`): accelerate's own ``--cpu
--num_processes 2`` starts a single process unless it is given an MPI hostfile.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from bench.batches import PASSKEY_LOSSES, TrainingStream, validation_batches
from bench.config import plain
from bench.corpora import Corpus
from bench.passkey import PASSKEY_FILLERS
from bench.runtime import PRECISIONS, autocast
from models.positions import PositionConfig
from models.transformer import DecoderLM, ModelConfig

__all__ = [
    "NON_WEIGHT_TRAIN_KEYS",
    "PRECISIONS",
    "TRAIN_DEFAULTS",
    "TrainingDiverged",
    "WEIGHT_DECAY_SCOPES",
    "lm_loss",
    "lr_at",
    "make_model",
    "model_config",
    "normalize_train_config",
    "param_groups",
    "position_config",
    "train_model",
]

WEIGHT_DECAY_SCOPES = ("matrices", "all")
TRAIN_DEFAULTS: dict[str, Any] = {
    "length": 256,
    "steps": 300,
    "batch_size": 16,
    "lr": 3.0e-3,
    "min_lr": None,
    "min_lr_ratio": 0.1,
    "warmup_steps": 30,
    "weight_decay": 0.1,
    "weight_decay_scope": "matrices",
    "betas": [0.9, 0.95],
    "grad_clip": 1.0,
    "precision": "fp32",
    "passkey_fraction": 0.0,
    "passkey_filler": "standard",
    "passkey_loss": "all",
    "eval_every": 100,
    "eval_batches": 4,
    "log_every": 10,
}
# Keys that only change what is measured or shown, never the weights (left out of the cache key).
NON_WEIGHT_TRAIN_KEYS = ("eval_every", "eval_batches", "log_every")
LABEL_KEYS = ("name",)  # labels a config group may carry; ignored
ADAM_EPS = 1e-8


class TrainingDiverged(ValueError):
    """The training loss became NaN or infinite; ``step`` (1-based update) and ``loss`` say where."""

    def __init__(self, message: str, step: int, loss: float):
        super().__init__(message)
        self.step, self.loss = step, loss


# --------------------------------------------------------------------------- config


def _section(cfg: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = cfg.get(name) if isinstance(cfg, Mapping) else None
    if value is None:
        return {}
    value = plain(value)
    if not isinstance(value, dict):
        raise ValueError(f"config section {name!r} is {value!r}; it must be a mapping of settings.")
    return value


def _dataclass_from(cls: type, raw: Mapping[str, Any], group: str) -> Any:
    allowed = {f.name for f in fields(cls)}
    raw = {k: v for k, v in raw.items() if k not in LABEL_KEYS}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ValueError(
            f"{group} config has unknown keys {unknown}; allowed keys are {sorted(allowed)}."
        )
    return cls(**raw)


def model_config(raw: Mapping[str, Any] | None) -> ModelConfig:
    """``ModelConfig`` from a ``model`` config section (unknown keys rejected, ``name`` ignored)."""
    cfg = _dataclass_from(ModelConfig, plain(raw or {}), "model")
    cfg.validate()
    return cfg


def position_config(raw: Mapping[str, Any] | None) -> PositionConfig:
    """``PositionConfig`` from a ``position`` config section (unknown keys rejected)."""
    return _dataclass_from(PositionConfig, plain(raw or {}), "position")


def _int(spec: dict[str, Any], key: str, minimum: int) -> int:
    value = spec[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"train.{key} {value!r} is invalid; allowed values are integers >= {minimum}."
        )
    return value


def _float(spec: dict[str, Any], key: str, lo: float, hi: float = math.inf) -> float:
    value = spec[key]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not (lo <= float(value) <= hi):
        upper = "" if hi == math.inf else f" and <= {hi:g}"
        raise ValueError(
            f"train.{key} {value!r} is invalid; allowed values are numbers >= {lo:g}{upper}."
        )
    return float(value)


def _choice(spec: dict[str, Any], key: str, allowed: tuple[str, ...]) -> str:
    value = spec[key]
    if value not in allowed:
        raise ValueError(
            f"train.{key} {value!r} is unknown; allowed values are {', '.join(allowed)}."
        )
    return value


def normalize_train_config(raw: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``train`` section with defaults filled in, types checked and ``min_lr`` resolved.

    Returns every key of ``TRAIN_DEFAULTS`` except ``min_lr_ratio`` (folded into ``min_lr``), so
    ``min_lr: 3e-4`` and ``min_lr_ratio: 0.1`` with ``lr: 3e-3`` give the same config.
    """
    raw = {k: v for k, v in plain(raw or {}).items() if k not in LABEL_KEYS}
    unknown = sorted(set(raw) - set(TRAIN_DEFAULTS))
    if unknown:
        raise ValueError(
            f"train config has unknown keys {unknown}; allowed keys are {sorted(TRAIN_DEFAULTS)}."
        )
    spec = {**TRAIN_DEFAULTS, **raw}
    out: dict[str, Any] = {}
    out["length"] = _int(spec, "length", 2)
    out["steps"] = _int(spec, "steps", 1)
    out["batch_size"] = _int(spec, "batch_size", 1)
    out["lr"] = _float(spec, "lr", 0.0)
    if spec["min_lr"] is not None:
        out["min_lr"] = _float(spec, "min_lr", 0.0, out["lr"])
    else:
        out["min_lr"] = out["lr"] * _float(spec, "min_lr_ratio", 0.0, 1.0)
    out["warmup_steps"] = _int(spec, "warmup_steps", 0)
    out["weight_decay"] = _float(spec, "weight_decay", 0.0)
    out["weight_decay_scope"] = _choice(spec, "weight_decay_scope", WEIGHT_DECAY_SCOPES)
    betas = spec["betas"]
    if (
        not isinstance(betas, (list, tuple))
        or len(betas) != 2
        or not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in betas)
    ):
        raise ValueError(f"train.betas {betas!r} is invalid; give two numbers in [0, 1).")
    out["betas"] = [float(b) for b in betas]
    out["grad_clip"] = _float(spec, "grad_clip", 0.0)
    out["precision"] = _choice(spec, "precision", PRECISIONS)
    out["passkey_fraction"] = _float(spec, "passkey_fraction", 0.0, 1.0)
    out["passkey_filler"] = _choice(spec, "passkey_filler", PASSKEY_FILLERS)
    out["passkey_loss"] = _choice(spec, "passkey_loss", PASSKEY_LOSSES)
    out["eval_every"] = _int(spec, "eval_every", 0)
    out["eval_batches"] = _int(spec, "eval_batches", 0)
    out["log_every"] = _int(spec, "log_every", 1)
    return out


def make_model(cfg: Mapping[str, Any]) -> DecoderLM:
    """An untrained DecoderLM for ``cfg`` (model, position, train.length); seeds nothing."""
    train = normalize_train_config(_section(cfg, "train"))
    return DecoderLM(
        model_config(_section(cfg, "model")),
        position_config(_section(cfg, "position")),
        train["length"],
    )


def seed_of(cfg: Mapping[str, Any]) -> int:
    seed = plain(cfg.get("seed", 0)) if isinstance(cfg, Mapping) else 0
    if isinstance(seed, float) and seed.is_integer():
        seed = int(seed)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed {seed!r} is invalid; allowed values are integers >= 0.")
    return seed


# --------------------------------------------------------------------------- pieces


def lr_at(step: int, spec: Mapping[str, Any]) -> float:
    """Learning rate of update ``step`` (0-based): linear warmup, then cosine to ``min_lr``.

    Warmup reaches ``lr`` at update ``warmup_steps - 1``; the decay starts at ``lr`` on the first
    update after warmup and reaches ``min_lr`` exactly on the last update.
    """
    lr, min_lr, warmup, steps = spec["lr"], spec["min_lr"], spec["warmup_steps"], spec["steps"]
    if step < warmup:
        return lr * (step + 1) / warmup
    decay_steps = steps - warmup - 1
    if decay_steps <= 0:
        return lr
    progress = min(1.0, (step - warmup) / decay_steps)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def param_groups(
    model: torch.nn.Module, weight_decay: float, scope: str = "matrices"
) -> list[dict[str, Any]]:
    """AdamW groups ``[decayed, not decayed]`` for ``weight_decay_scope`` (see the module doc).

    Tied parameters appear once (``named_parameters`` deduplicates), so a tied output head is
    an embedding and, with scope ``matrices``, is not decayed.
    """
    if scope not in WEIGHT_DECAY_SCOPES:
        raise ValueError(
            f"weight decay scope {scope!r} is unknown; allowed values are {', '.join(WEIGHT_DECAY_SCOPES)}."
        )
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        is_matrix = param.dim() >= 2 and id(param) not in embeddings and "pos_table" not in name
        (decay if scope == "all" or is_matrix else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean next-token cross entropy (float32) over the tokens where ``mask`` is True (None = all)."""
    flat = logits.reshape(-1, logits.shape[-1]).float()
    if mask is None:
        return F.cross_entropy(flat, targets.reshape(-1))
    per_token = F.cross_entropy(flat, targets.reshape(-1), reduction="none")
    weights = mask.reshape(-1).to(per_token.dtype)
    return (per_token * weights).sum() / weights.sum().clamp(min=1.0)


def cpu_has_native_bf16() -> bool | None:
    """True/False from the CPU flags (AVX512-BF16 or AMX-BF16) where Linux shows them, else None."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    flags = next((line for line in text.splitlines() if line.startswith("flags")), None)
    if flags is None:
        return None
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))


def _warn_if_emulated_bf16(device: torch.device, precision: str) -> None:
    if precision == "bf16" and device.type == "cpu" and cpu_has_native_bf16() is False:
        warnings.warn(
            "train.precision bf16 on this CPU (no AVX512-BF16/AMX-BF16) runs emulated, measured "
            "12-25x slower than fp32; use train.precision=fp32 here.",
            stacklevel=3,
        )


def use_cpu_backend() -> bool:
    """accelerate's ``cpu`` flag: True when ``ACCELERATE_USE_CPU`` is set, or when several
    processes were launched (``WORLD_SIZE`` > 1) on a machine without CUDA.

    accelerate only sets up multi-CPU (gloo) DDP when told ``cpu=True``; without it, ranks
    started by ``torchrun`` or ``accelerate launch --multi_gpu`` on a CPU box would each train
    alone. ``bench.cache`` uses the same flag so that both create one consistent state.
    """
    if os.environ.get("ACCELERATE_USE_CPU", "").strip().lower() in ("1", "true", "yes"):
        return True
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available()


def _make_accelerator(accelerator: Any, precision: str) -> Any:
    from accelerate import Accelerator

    if accelerator is None:
        return Accelerator(mixed_precision="no", cpu=use_cpu_backend())
    mixed = str(getattr(accelerator, "mixed_precision", "no"))
    wanted = {"fp32": "no", "bf16": "bf16"}[precision]
    if mixed not in ("no", wanted):
        raise ValueError(
            f"the accelerator passed in uses mixed_precision={mixed!r} but train.precision is "
            f"{precision!r}; create it with mixed_precision='no' (train.precision sets autocast) "
            f"or {wanted!r}."
        )
    return accelerator


class _Validator:
    """Fixed validation windows, this rank's share of them, and the reduced mean loss."""

    def __init__(self, corpus: Corpus, spec: Mapping[str, Any], rank: int, world: int):
        self.batches: list[torch.Tensor] = []
        self.enabled = False  # identical on every rank, so all ranks validate together
        if spec["eval_batches"] == 0:
            return
        docs = corpus.split("validation")
        if sum(len(d) for d in docs) < spec["length"] + 1:
            warnings.warn(
                f"the validation split of corpus {corpus.name} ({corpus.fingerprint}) holds fewer "
                f"than train.length + 1 = {spec['length'] + 1} tokens; training without validation "
                "loss (raise the validation fraction or use a larger corpus).",
                stacklevel=3,
            )
            return
        windows = validation_batches(docs, spec["length"], spec["eval_batches"], spec["batch_size"])
        self.batches = windows[rank::world]  # a rank may get none; it still joins the reduce
        self.enabled = True

    @torch.no_grad()
    def __call__(self, model: torch.nn.Module, accelerator: Any, precision: str) -> float:
        device = accelerator.device
        totals = torch.zeros(2, dtype=torch.float64, device=device)  # [sum of losses, tokens]
        model.eval()
        for window in self.batches:
            window = window.to(device)
            with autocast(device, precision):
                logits = model(window[:, :-1]).logits
            losses = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(),
                window[:, 1:].reshape(-1),
                reduction="sum",
            )
            totals += torch.stack((losses.double(), totals.new_tensor(window[:, 1:].numel())))
        model.train()
        if accelerator.num_processes > 1:
            totals = accelerator.reduce(totals, reduction="sum")
        return float(totals[0] / totals[1].clamp(min=1))


# --------------------------------------------------------------------------- training


def train_model(
    cfg: Mapping[str, Any],
    corpus: Corpus,
    *,
    progress: bool = True,
    accelerator: Any = None,
) -> tuple[DecoderLM, dict[str, Any]]:
    """Train a DecoderLM on ``corpus``'s training split; see the module doc for the config keys.

    Returns (model in eval mode on the accelerator's device, train_stats) where train_stats holds
    ``final_train_loss``, ``train_losses`` {update: mean loss of the log window ending there},
    ``val_losses`` {update: validation loss}, ``final_val_loss`` (None without validation),
    ``tokens``, ``tokens_per_s`` (training only), ``train_time_s``, ``wall_time_s``, ``steps``,
    ``n_params``, ``precision``, ``device``, ``num_processes``.
    Raises TrainingDiverged (a ValueError) if the loss becomes NaN or infinite.
    """
    wall_start = time.perf_counter()
    spec = normalize_train_config(_section(cfg, "train"))
    seed = seed_of(cfg)
    model_cfg = model_config(_section(cfg, "model"))
    position_cfg = position_config(_section(cfg, "position"))
    accelerator = _make_accelerator(accelerator, spec["precision"])
    _warn_if_emulated_bf16(accelerator.device, spec["precision"])
    world, rank = accelerator.num_processes, accelerator.process_index
    steps, batch_size, length = spec["steps"], spec["batch_size"], spec["length"]
    if batch_size % world:
        raise ValueError(
            f"train.batch_size {batch_size} is not divisible by the {world} processes; "
            f"use a multiple of {world}."
        )

    torch.manual_seed(seed)
    model = DecoderLM(model_cfg, position_cfg, length)
    n_params = model.num_parameters()
    stream = TrainingStream(
        corpus.split("train"),
        length,
        batch_size,
        seed,
        passkey_fraction=spec["passkey_fraction"],
        passkey_filler=spec["passkey_filler"],
        passkey_loss=spec["passkey_loss"],
    )
    validator = _Validator(corpus, spec, rank, world)
    optimizer = torch.optim.AdamW(
        param_groups(model, spec["weight_decay"], spec["weight_decay_scope"]),
        lr=lr_at(0, spec),
        betas=tuple(spec["betas"]),
        eps=ADAM_EPS,
    )
    model, optimizer = accelerator.prepare(model, optimizer)
    model.train()
    device = accelerator.device

    losses = torch.zeros(steps, dtype=torch.float32, device=device)
    train_losses: dict[int, float] = {}
    val_losses: dict[int, float] = {}
    checked = 0  # losses[:checked] are known to be finite
    train_time = 0.0
    tokens_done = 0
    bar = tqdm(
        total=steps,
        desc=f"train {position_cfg.kind} L={length}",
        unit="step",
        disable=not progress or not accelerator.is_main_process,
        dynamic_ncols=True,
        leave=False,
    )

    def check(upto: int) -> float:
        """Sync losses[checked:upto]; raise on NaN/inf; return the window mean (all ranks agree)."""
        nonlocal checked
        window = losses[checked:upto]
        if world > 1:
            window = accelerator.gather(window[None]).mean(dim=0)  # [world, n] -> mean over ranks
        values = window.cpu()
        finite = torch.isfinite(values)
        if not bool(finite.all()):
            first = int((~finite).nonzero()[0, 0])
            step, loss = checked + first + 1, float(values[first])
            bar.close()
            raise TrainingDiverged(
                f"training diverged at step {step} of {steps}: the loss is {loss} (lr "
                f"{lr_at(step - 1, spec):.3g}, precision {spec['precision']}); lower train.lr, "
                "raise train.warmup_steps, set train.grad_clip, or use precision fp32.",
                step=step,
                loss=loss,
            )
        mean = float(values.mean())
        checked = upto
        return mean

    tick = time.perf_counter()
    for step in range(steps):
        batch = stream.batch(step)
        tokens, mask = batch.tokens, batch.loss_mask
        if world > 1:
            tokens, mask = tokens[rank::world], mask[rank::world]
        tokens = tokens.to(device, non_blocking=True)
        mask = None if bool(mask.all()) else mask.to(device, non_blocking=True)
        lr = lr_at(step, spec)
        for group in optimizer.param_groups:
            group["lr"] = lr
        with autocast(device, spec["precision"]):
            logits = model(tokens[:, :-1]).logits
        loss = lm_loss(logits, tokens[:, 1:], mask)
        accelerator.backward(loss)
        if spec["grad_clip"] > 0:
            accelerator.clip_grad_norm_(model.parameters(), spec["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses[step] = loss.detach()
        tokens_done += batch_size * length

        done = step + 1
        last = done == steps
        validate = validator.enabled and (
            last or (spec["eval_every"] > 0 and done % spec["eval_every"] == 0)
        )
        if done % spec["log_every"] == 0 or last or validate:
            mean = check(done)
            train_losses[done] = mean
            elapsed = train_time + time.perf_counter() - tick
            bar.set_postfix(
                loss=f"{mean:.3f}", tok_s=f"{tokens_done / elapsed:,.0f}", lr=f"{lr:.2g}"
            )
        if validate:
            train_time += time.perf_counter() - tick
            # the unwrapped module: no DDP hooks, so ranks with different shard sizes cannot hang
            val_losses[done] = validator(
                accelerator.unwrap_model(model), accelerator, spec["precision"]
            )
            bar.set_postfix(
                loss=f"{train_losses[done]:.3f}",
                val=f"{val_losses[done]:.3f}",
                tok_s=f"{tokens_done / train_time:,.0f}",
            )
            tick = time.perf_counter()
        bar.update(1)
    train_time += time.perf_counter() - tick
    bar.close()

    model = accelerator.unwrap_model(model)
    model.eval()
    optimizer.zero_grad(set_to_none=True)
    tail = losses[steps - max(1, min(spec["log_every"], steps)) :]
    if world > 1:
        tail = accelerator.gather(tail[None])
    stats = {
        "steps": steps,
        "tokens": tokens_done,
        "tokens_per_s": tokens_done / max(train_time, 1e-9),
        "train_time_s": train_time,
        "wall_time_s": time.perf_counter() - wall_start,
        "final_train_loss": float(tail.mean().cpu()),
        "train_losses": train_losses,
        "val_losses": val_losses,
        "final_val_loss": val_losses.get(steps),
        "n_params": n_params,
        "precision": spec["precision"],
        "device": str(device),
        "num_processes": world,
    }
    return model, stats
