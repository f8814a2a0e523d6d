"""A pretrained transformers model as the model source of a lenbench job (``bench.eval.source``).

The job's eval config runs on the model at lengths relative to its training length, the scaling is
applied through its own rope parameters (``bench.pretrained.adapter``), the corpus is read in the
model's tokens (``bench.data.pretrained_documents``), and the rows carry the usual identity columns
(``model_id`` from ``bench.pretrained.config``, ``position`` = the detected family,
``position_params`` naming the model) so that reports and the dedup rule work unchanged. Until the
pipeline asks for the model only its config is read.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from bench.core.rows import canonical_json
from bench.data.corpora import Corpus, Document
from bench.data.pretrained_documents import retokenize
from bench.eval.metrics import ResolvedEval
from bench.eval.source import SourceModel
from bench.pretrained.adapter import PretrainedLM, check_pretrained_scaling, check_scaling_params
from bench.pretrained.config import (
    PretrainedConfig,
    learned_table_length,
    load_config,
    load_pretrained,
    model_id,
    position_family,
    position_params,
    rope_geometry,
    train_length_of,
)
from models.lazy import nn
from models.scaling_config import ScalingConfig, run_scaling

__all__ = ["PretrainedSource"]

log = logging.getLogger("lenbench")


class PretrainedSource:
    """The ``pretrained`` section's model (``bench.eval.source.ModelSource``)."""

    obtains = "loading the model"
    caches = False

    def __init__(self, job: Any) -> None:
        self.job = job  # bench.schema.JobConfig
        self.cfg: PretrainedConfig = job.pretrained

    @functools.cached_property
    def config(self) -> Any:
        """The model's transformers config (no weights); one-sentence ValueErrors."""
        return load_config(self.cfg)

    def check_scaling(self, scaling: ScalingConfig) -> None:
        check_pretrained_scaling(position_family(self.config), scaling, self._model_class())

    def _model_class(self) -> type | None:
        """The causal-LM class transformers builds for the config (no weights); None when the
        auto mapping does not know it (remote code): checks that need it then wait for the model."""
        from transformers import AutoModelForCausalLM

        try:
            return AutoModelForCausalLM._model_mapping[type(self.config)]
        except (KeyError, ValueError):
            return None

    def plan(self) -> tuple[ResolvedEval, ScalingConfig]:
        job, config = self.job, self.config
        train_length = train_length_of(config, self.cfg.train_length)
        resolved = job.eval.resolve(train_length)
        table = learned_table_length(config)
        beyond = [x for x in resolved.lengths if table is not None and x > table]
        if beyond:  # else each is skipped with a warning after the model has loaded
            raise ValueError(
                f"eval lengths {beyond} are beyond this {config.model_type} model's learned position "
                f"table ({table} positions); allowed: eval lengths <= {table} (eval.lengths, tokens "
                f"or multiples of the training length {train_length})."
            )
        scaling = run_scaling(job.scaling, train_length=train_length, lengths=resolved.lengths)
        if position_family(config) == "rope" and scaling.method != "default":
            rope_geometry(config)  # a rope model without head geometry fails here, in one sentence
            for length in resolved.lengths:
                try:
                    check_scaling_params(config, train_length, scaling, length)
                except ValueError as exc:
                    raise ValueError(
                        f"scaling {job.scaling.name} is invalid at eval length {length}: {exc}"
                    ) from None
        return resolved, scaling

    def model_id(self, corpus: Corpus) -> str:
        return model_id(self.cfg)

    def model(self, corpus: Corpus, spec: Any) -> SourceModel:
        hf_model, tokenizer = load_pretrained(self.cfg, spec.device)
        lm = PretrainedLM(hf_model, tokenizer, spec.eval.train_length)
        return SourceModel(lm, labels={"position": lm.family}, tokenizer=tokenizer)

    def test_docs(self, corpus: Corpus, model: SourceModel) -> Sequence[Document]:
        return retokenize(corpus.split("test"), model.tokenizer)

    def measured(
        self, model: SourceModel, corpus: Corpus, spec: Any
    ) -> Iterator[tuple[nn.Module, dict[str, Any] | None]]:
        yield model.module, None

    def extra_rows(self, model: SourceModel, spec: Any) -> list[dict[str, Any]]:
        if spec.eval.harness.tasks:
            log.warning(
                "eval.harness.tasks are not run on a pretrained model; run lm-eval's own hf model "
                "(lm_eval --model hf --model_args pretrained=%s) for them.",
                self.cfg.path,
            )
        return []

    def columns(self, model: SourceModel, corpus: Corpus) -> dict[str, Any]:
        lm = model.module
        params = position_params(self.cfg, lm.hf.config, lm.family)
        return {
            "position": lm.family,
            "position_params": canonical_json(params),
            "train_length": lm.train_length,
            # one pretrained model = one configuration; seeds sample the eval
            "model_config_id": model_id(self.cfg),
            # its own recipe: ranked only against itself (other scalings of the same model)
            "recipe": f"pretrained:{model_id(self.cfg)}",
        }
