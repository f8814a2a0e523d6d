"""Where a job's model comes from: what a model source gives the job pipeline.

:func:`bench.job.run_job` is one pipeline (plan, model id, already done?, model, evaluate, write)
over a :class:`ModelSource`. There are two: ``bench.trained_source.TrainedSource`` (the checkpoint cache,
training on a miss, ``extend`` fine-tunes) and ``bench.pretrained.source.PretrainedSource`` (a
transformers model). The pipeline asks the source whether the scaling applies (the sources differ
in which methods they implement; each says so through ``bench.core.checks.check_method``), what the run's
evaluation and scaling are, which model it is, the model itself, the documents it reads in its
own tokens, every model the job measures, the rows beyond the metrics and the columns that name
the model; everything else (corpus, result file, de-dup, rows, statuses) is the pipeline's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from bench.data.corpora import Corpus, Document
from bench.eval.metrics import ResolvedEval
from models.lazy import nn
from models.scaling_config import ScalingConfig

__all__ = ["ModelSource", "SourceModel"]


@dataclass
class SourceModel:
    """The model a source hands the pipeline."""

    module: nn.Module  # what the metrics measure (a DecoderLM, a PretrainedLM)
    trained: bool = False  # a training ran for this job (the sweep summary counts them)
    labels: dict[str, Any] = field(default_factory=dict)  # summary labels learnt on the way
    tokenizer: Any = None  # the model's own tokenizer; None = lenbench's bytes
    # columns of every row of this model learnt on the way (e.g. the updates its training ran)
    columns: dict[str, Any] = field(default_factory=dict)


class ModelSource(Protocol):
    """One job's model source; ``spec`` is the job's ``bench.job.JobSpec``."""

    #: what :meth:`model` does, for the out-of-memory sentence ("training", "loading the model")
    obtains: str
    #: whether it keeps checkpoints under ``paths.cache`` (the job's ``cache_root``)
    caches: bool

    def check_scaling(self, scaling: ScalingConfig) -> None:
        """Raise NotApplicable when the scaling (or the cell) means nothing for this model."""

    def plan(self) -> tuple[ResolvedEval, ScalingConfig]:
        """(the eval config in tokens, the scaling as applied at every length); one-sentence
        ValueErrors (NotApplicable for a cell that is skipped). Cheap: no weights are read."""

    def model_id(self, corpus: Corpus) -> str:
        """The id of the model the job measures (its rows' ``model_id``)."""

    def model(self, corpus: Corpus, spec: Any) -> SourceModel:
        """The model: from the cache, trained, or loaded."""

    def test_docs(self, corpus: Corpus, model: SourceModel) -> Sequence[Document]:
        """The test documents in the model's tokens."""

    def measured(
        self, model: SourceModel, corpus: Corpus, spec: Any
    ) -> Iterator[tuple[nn.Module, dict[str, Any] | None]]:
        """(model, its own identity columns or None for the job's) of every model the job
        measures, one at a time, the job's model last."""

    def extra_rows(self, model: SourceModel, spec: Any) -> list[dict[str, Any]]:
        """Rows beyond the registered metrics (lm-eval harness tasks)."""

    def columns(self, model: SourceModel, corpus: Corpus) -> dict[str, Any]:
        """The columns that say which model was measured: ``position``, ``position_params``,
        ``train_length``, ``model_config_id`` (and the fine-tune columns where there are some)."""
