"""The trained model source (``bench.eval.source.ModelSource``): lenbench models from the checkpoint
cache, trained on a miss, fine-tuned with ``extend``; and the models a job obtains beside its
own from the same cache (``eval.longppl``'s evaluator). ``spec`` is the job's
``bench.job.JobSpec``, as in ``bench.eval.source``."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import asdict, fields, replace
from typing import Any

from bench.core.checks import NotApplicable, check_method
from bench.core.rows import canonical_json
from bench.data.corpora import Corpus, Document
from bench.eval.metrics import ResolvedEval
from bench.eval.source import SourceModel
from bench.schema import JobConfig
from bench.train.extend import base_job, check_finetune_eval, finetune_columns, finetune_scaling
from models.lazy import torch
from models.model_config import ModelConfig
from models.resolved_scaling import resolved_scaling
from models.scaling import applicable_methods
from models.scaling_config import ScalingConfig, run_scaling

log = logging.getLogger("lenbench")

__all__ = ["TrainedSource", "evaluator_job", "longppl_evaluator"]


def evaluator_job(job: JobConfig, length: int, seed: int) -> JobConfig:
    """``eval.longppl``'s auto evaluator: the job's recipe (model, data, training) with RoPE, no
    scaling, no fine-tune and no design switch (QK-norm, gate, SSMax, attention kind, sink: one
    evaluator for every design the recipe ranks), seed ``seed``, trained at ``length`` tokens."""
    from bench.train.cache import DESIGN_SWITCHES

    values = asdict(job)
    values.update(
        seed=int(seed), position={"kind": "rope"}, scaling={"name": "none", "method": "default"}
    )
    values.update(extend={}, pretrained=None)
    values["model"].update(
        {f.name: f.default for f in fields(ModelConfig) if f.name in DESIGN_SWITCHES}
    )
    values["train"]["length"] = int(length)
    return JobConfig.from_hydra(values)


def longppl_evaluator(spec: Any, corpus: Corpus, tokenizer: Any = None) -> Any:
    """The evaluator model of ``eval.longppl`` (``bench.eval.metrics.longppl.Evaluator``), from the
    cache (the auto evaluator trained on a miss), or None when the metric does not run.
    ``tokenizer``: the judged model's (a pretrained job's; its evaluator must share it)."""
    from bench.eval.metrics.longppl import AUTO, Evaluator
    from bench.train.cache import get_or_train, weights_key
    from bench.train.checkpoints import load_model

    cfg = spec.eval.metrics.get("longppl")
    if cfg is None or not cfg.enabled or not cfg.lengths:
        return None
    longest = max(cfg.lengths)
    if spec.job.pretrained is not None:
        return pretrained_evaluator(cfg.evaluator_pretrained, spec, longest, tokenizer)
    if cfg.evaluator != AUTO:
        module, meta = load_model(cfg.evaluator, spec.cache_root, device=spec.device)
        return Evaluator(module, meta["key"], int(meta["train_length"]))
    job = evaluator_job(spec.job, longest, cfg.evaluator_seed)  # never the judged model (job.py)
    module, _, _ = get_or_train(job, corpus, spec.cache_root, device=spec.device)
    return Evaluator(module, weights_key(job, corpus), longest)


def pretrained_evaluator(path: str, spec: Any, longest: int, judged_tokenizer: Any) -> Any:
    """A transformers evaluator for a pretrained job: same vocabulary as ``judged_tokenizer``
    (the judged model's), and positions up to ``longest`` it can embed (a learned table's end refuses; a
    rotary or bias model scores any length, as the judged model does)."""
    from bench.eval.metrics.longppl import Evaluator
    from bench.pretrained.adapter import PretrainedLM
    from bench.pretrained.config import PretrainedConfig, load_pretrained

    hf, tokenizer = load_pretrained(PretrainedConfig(path=path), spec.device)
    if tokenizer.get_vocab() != judged_tokenizer.get_vocab():
        raise ValueError(
            f"eval.longppl.evaluator_pretrained {path!r} has another tokenizer than the judged "
            "model; allowed: a model with the same tokenizer (key tokens are token positions)."
        )
    lm = PretrainedLM(hf, tokenizer, spec.eval.train_length)
    problem = lm.position_range_error(longest - 1, longest)  # a learned table's end, else None
    if problem is not None:
        raise ValueError(
            f"eval.longppl.evaluator_pretrained {path!r} cannot score length {longest}: {problem}"
        )
    return Evaluator(lm, f"hf:{path}", int(longest))


class TrainedSource:
    """A lenbench model of the job's config (``bench.eval.source.ModelSource``): from the checkpoint
    cache, trained on a miss; with ``extend`` active, the fine-tune of that model (and the states
    of its recovery curve)."""

    obtains = "training"
    caches = True  # checkpoints under paths.cache

    def __init__(self, job: JobConfig) -> None:
        self.job = job

    def check_scaling(self, scaling: ScalingConfig) -> None:
        job, kind = self.job, self.job.position.kind
        allowed, note = applicable_methods(kind), ", each may add logn"
        check_method("scaling", scaling.name, scaling.method, kind, allowed, note=note)
        outside = job.arm.excluded(
            kind,
            scaling.name,
            job.extend.name,
            job.train.position_sampling,
            job.model.attention_sink,
        )
        outside = outside or job.train.sampling_problem(job.position.family)
        if outside:
            raise NotApplicable(outside)

    def plan(self) -> tuple[ResolvedEval, ScalingConfig]:
        job = self.job
        resolved = job.eval.resolve(job.train.length)
        check_row_span(job, resolved.lengths)  # before the scaling checks, which load torch
        ruler = resolved.metrics.get("ruler")
        partial = ruler.check_fit() if ruler is not None else None  # raises if none fits
        if partial:
            log.warning("lenbench: %s", partial)
        passkey = resolved.metrics.get("passkey")
        if passkey is not None and passkey.template is None:  # evaluate with the trained template
            resolved.metrics["passkey"] = passkey = replace(
                passkey, template=job.train.passkey_template
            )
        if passkey is not None and passkey.enabled and passkey.lengths:
            _check_passkey_fits(passkey)
        if job.extend.active:
            check_finetune_eval(job)
            scaling = finetune_scaling(job)
        else:
            scaling = run_scaling(
                job.scaling, train_length=job.train.length, lengths=resolved.lengths
            )
        check_scaling_at_lengths(job, scaling, resolved.lengths)
        return resolved, scaling

    def model_id(self, corpus: Corpus) -> str:
        from bench.train.cache import weights_key

        return weights_key(self.job, corpus)

    def model(self, corpus: Corpus, spec: Any) -> SourceModel:
        from bench.train.cache import get_or_train

        module, meta, trained = get_or_train(self.job, corpus, spec.cache_root, device=spec.device)
        # the end-of-sweep summary counts trainings that went on from a saved state
        stats = meta.get("train_stats") or {}
        resumed = bool(trained and stats.get("resumed_from"))
        columns = {}
        if self.job.train.until_retrieves is not None and not self.job.extend.active:
            columns["train_steps"] = int(stats["steps"])  # where the retrieval check ended it
        return SourceModel(module, trained=trained, labels={"resumed": resumed}, columns=columns)

    def test_docs(self, corpus: Corpus, model: SourceModel) -> Sequence[Document]:
        return corpus.split("test")

    def measured(
        self, model: SourceModel, corpus: Corpus, spec: Any
    ) -> Iterator[tuple[torch.nn.Module, dict[str, Any] | None]]:
        """The fine-tune after k updates for each k of ``extend.curve``, one at a time (the states
        the job's run stored, ``bench.train.cache.save_snapshot``, or trained like any checkpoint), with
        their own identity; then the job's model."""
        from bench.train.cache import curve_job, get_or_train, model_config_id, weights_key

        job = self.job
        for k in job.extend.curve if job.extend.active else ():
            point = curve_job(job, k)
            point_model, _, _ = get_or_train(point, corpus, spec.cache_root, device=spec.device)
            own = {
                "model_id": weights_key(point, corpus),
                "model_config_id": model_config_id(point, corpus),
                "finetune_steps": point.extend.steps,
            }
            yield point_model, own
        yield model.module, None

    def extra_rows(self, model: SourceModel, spec: Any) -> list[dict[str, Any]]:
        harness = spec.eval.harness
        if not harness.tasks:
            return []
        from bench.harness import harness_rows, run_harness

        results = run_harness(
            model.module,
            list(harness.tasks),
            scaling=spec.scaling,
            limit=harness.limit,
            device=spec.device,
            # the native passkey metric's template (the training's unless eval names one)
            metadata={"data": asdict(self.job.data), "template": passkey_template_name(spec)},
        )
        return [{**row, "eval_length": row["eval_length"] or 0} for row in harness_rows(results)]

    def columns(self, model: SourceModel, corpus: Corpus) -> dict[str, Any]:
        from bench.train.cache import curve_job, model_config_id, recipe_id, weights_key

        job = self.job
        columns = {
            "position": job.position.kind,
            "position_params": canonical_json(job.position.params()),  # kind: its own column
            "train_length": job.train.length,
            "model_config_id": model_config_id(job, corpus),
            "recipe": recipe_id(job, corpus),
        }
        if job.train.position_sampling != "contiguous":  # how its training windows were positioned
            columns["position_sampling"] = job.train.position_sampling
        if job.model.attention_sink != "none":
            columns["attention_sink"] = job.model.attention_sink
        columns.update(job.model.switches())  # bench.core.series.SWITCH_COLUMNS: the variants on
        columns.update(model.columns)
        if job.extend.active:
            columns.update(finetune_columns(job, weights_key(base_job(job), corpus)))
            # one id for every update count of this fine-tune recipe: the points of one curve
            columns["finetune_curve_id"] = model_config_id(curve_job(job, 0), corpus)
        return columns


def check_row_span(job: JobConfig, eval_lengths: Sequence[int]) -> None:
    """The longest row the job trains or evaluates (its position ids' span) must be one the
    position family encodes (``Family.check_row_span``: xPos's scales stay finite), else one
    sentence naming the setting and its value."""
    train = job.train
    rows = [("eval length", max(eval_lengths)), ("train.length", train.length)]
    if train.position_sampling != "contiguous":  # sampled position ids reach train.max_position
        rows.append(("train.max_position", train.sampled_positions))
    if job.extend.active:
        rows.append(("extend.length", job.extend.length))
    what, span = max(rows, key=lambda row: row[1])
    job.position.family.check_row_span(job.position, span, what)


def check_scaling_at_lengths(
    job: JobConfig, scaling: ScalingConfig, eval_lengths: list[int]
) -> None:
    """The run's scaling's parameters at every eval length, and eval lengths a learned table with
    the ``error`` policy cannot embed (the evaluation would skip them only after training)."""
    position, length_trained = job.position, job.train.length
    for length in eval_lengths:
        try:
            resolved = resolved_scaling(scaling, job.model, position, length_trained, length)
        except ValueError as exc:
            raise ValueError(
                f"scaling {job.scaling.name} is invalid at eval length {length}: {exc}"
            ) from None
        if position.range_error(length - 1, length, length_trained, resolved.position_factor):
            rows = position.table_rows(length_trained)
            raise ValueError(
                f"eval length {length} is beyond the learned position table ({rows} rows) and "
                f"position.out_of_range is {position.out_of_range!r}; allowed: eval lengths "
                f"<= {rows}, position.out_of_range=clamp or interpolate, or scaling=linear."
            )


def _check_passkey_fits(passkey: Any) -> None:
    """Before training, on byte tokens: raise ValueError (one sentence) when the passkey template
    fits none of the metric's lengths; warn for the lengths it skips."""
    from bench.tasks.passkey import min_passkey_length

    minimum = min_passkey_length(template=passkey.template)
    short = [x for x in passkey.lengths if x < minimum]
    if short == list(passkey.lengths):
        raise ValueError(
            f"eval.passkey runs at {short}, all shorter than the {passkey.template!r} template's "
            f"{minimum} tokens; allowed: passkey lengths >= {minimum} (eval.passkey.lengths, "
            "eval.lengths), another eval.passkey.template, or eval.passkey.enabled=false."
        )
    if short:
        log.warning(
            "lenbench: passkey skips eval lengths %s (the %r template needs %d tokens).",
            short, passkey.template, minimum,
        )  # fmt: skip


def passkey_template_name(spec: Any) -> str:
    passkey = spec.eval.metrics.get("passkey")
    template = getattr(passkey, "template", None)
    return str(template or spec.job.train.passkey_template)
