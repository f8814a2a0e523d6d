"""Context extension by fine-tuning: what a job with ``extend`` active trains, and its identity.

PI, YaRN and base changes (ABF) are used in practice with a short fine-tune at the target length.
A fine-tune continues the job's base model (its parent, the checkpoint the same job without
``extend`` has) at ``extend.length`` with the scaling method active while it trains, and the
fine-tuned model is evaluated with that same scaling. This module turns the typed ``extend``
section into that scaling, the recipe the training loop runs (:mod:`bench.train.trainer`), the part of
the checkpoint key it adds to the parent's (:mod:`bench.train.cache`) and the result columns.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from bench.core.checks import NotApplicable, check_method, weights_dict
from bench.core.rows import FINETUNE_COLUMNS
from bench.train.config import ExtendConfig, TrainConfig
from models.resolved_scaling import resolve_scaling
from models.scaling import applicable_methods
from models.scaling_config import ScalingConfig

if TYPE_CHECKING:  # the job schema sits above the stages (bench.schema)
    from bench.schema import JobConfig

__all__ = [
    "base_job",
    "check_finetune_eval",
    "extend_weights",
    "finetune_columns",
    "finetune_recipe",
    "finetune_scaling",
]


def base_job(job: JobConfig) -> JobConfig:
    """The job whose checkpoint a fine-tune starts from: the same job without ``extend``."""
    return replace(job, extend=ExtendConfig())


def _rotary_dim(job: JobConfig) -> int:
    """r of the frequencies the scaling changes: rotated channels per head, or the sinusoid's width."""
    position = job.position
    dims = position.family.frequency_dims(position, job.model.head_dim, job.model.d_model)
    dim, fraction = dims if dims is not None else (job.model.head_dim, 1.0)
    return int(dim * fraction)


def finetune_scaling(job: JobConfig) -> ScalingConfig:
    """The scaling a fine-tune trains with and its model is evaluated with, factors as numbers.

    "auto" factors are ``extend.length / train.length``. ABF (``base_factor`` m) is static NTK,
    whose base is b * alpha^(r/(r-2)), with alpha = m^((r-2)/r): the base becomes exactly b * m.
    Raises ValueError when the method does not apply to the position family.
    """
    ext = job.extend
    if not ext.active:
        raise ValueError("finetune_scaling needs a job with extend.method other than none.")
    params = dict(ext.params)
    if ext.base_factor is not None:
        r = _rotary_dim(job)
        params["alpha"] = ext.base_factor ** ((r - 2) / r)
    scaling = ScalingConfig(
        name=ext.name, method=ext.method, params=params, target_length=ext.length
    )
    return resolve_scaling(scaling, job.model, job.position, job.train.length)


def check_finetune_eval(job: JobConfig) -> None:
    """That a model fine-tuned at length (``extend``) can be evaluated, which it is with the scaling
    it was trained with (:func:`finetune_scaling`). Raises NotApplicable for a method the family
    lacks, or for an eval-time scaling on top (its frequencies are already the fine-tune's; only
    ``scaling=none`` applies)."""
    ext, kind = job.extend, job.position.kind
    check_method("extend", ext.name, ext.method, kind, applicable_methods(kind))
    if job.scaling.method != "default" or job.scaling.logn:
        raise NotApplicable(
            f"scaling {job.scaling.name} on top of extend {ext.name}: a fine-tuned model is "
            "evaluated with the scaling it was trained with, so only scaling=none applies"
        )


def finetune_recipe(job: JobConfig) -> TrainConfig:
    """The ``train`` recipe of the fine-tune: the parent's, at the extend length, steps and lr.

    Weight decay, betas, clipping, precision and the passkey filler/template/loss are the
    parent's; ``extend.steps`` must be >= 1 (0 trains nothing: bench.train.trainer handles it).
    """
    ext = job.extend
    return replace(
        job.train,
        length=ext.length,
        steps=ext.steps,
        lr=ext.lr,
        min_lr=None,
        min_lr_ratio=ext.min_lr_ratio,
        warmup_steps=ext.warmup_steps,
        decay_steps=ext.decay_steps,
        batch_size=ext.batch_size,
        passkey_fraction=ext.passkey_fraction,
        # a fine-tune at length reads contiguous positions, as practitioners fine-tune
        position_sampling="contiguous",
        max_position=None,
        until_retrieves=None,  # a fine-tune runs its updates: its curve is the measurement
        ruler_stages=[],  # the parent's curriculum is behind it: a fine-tune reads its last rows
    )


def extend_weights(job: JobConfig) -> dict[str, Any]:
    """What the fine-tune adds to its parent's weights config: every ``extend`` field but the label,
    with method, params and base_factor as the scaling they resolve to (so ``4x`` and 1024 tokens,
    or a base_factor and the alpha it sets, are one checkpoint)."""
    out = weights_dict(job.extend)
    for key in ("method", "params", "base_factor"):
        out.pop(key)
    scaling = finetune_scaling(job)
    out["scaling"] = scaling.identity
    return out


def finetune_columns(job: JobConfig, parent_model_id: str | None) -> dict[str, Any]:
    """The result columns :data:`FINETUNE_COLUMNS` of a job's rows (None for a model not fine-tuned)."""
    ext = job.extend
    if not ext.active:
        return dict.fromkeys(FINETUNE_COLUMNS)
    values = (ext.name, ext.length, ext.steps, parent_model_id)
    return dict(zip(FINETUNE_COLUMNS, values, strict=True))
