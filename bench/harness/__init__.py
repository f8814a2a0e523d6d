"""lm-evaluation-harness adapter: lenbench models and long-context tasks inside lm-eval.

Importing the package registers the lm-eval model ``lenbench`` (:mod:`.model`); :mod:`.tasks`
holds the task YAMLs and their local data builders, :mod:`.run` runs tasks and turns lm-eval's
results into lenbench rows, :mod:`.cli` is ``lenbench-harness``. Stage 8 of ``bench``: may
import every stage before it (tasks for the data, eval's documents, train's checkpoint cache).
"""

from bench.harness.args import parse_scaling, scaling_presets
from bench.harness.cli import main
from bench.harness.model import MODEL_NAME, LenbenchLM
from bench.harness.run import harness_rows, run_harness
from bench.harness.tasks import (
    TASKS_DIR,
    passkey_dataset,
    passkey_docs,
    passkey_process_results,
    perplexity_dataset,
    perplexity_docs,
    ruler_dataset,
    ruler_docs,
    ruler_process_results,
    task_names,
)

__all__ = [
    "MODEL_NAME",
    "TASKS_DIR",
    "LenbenchLM",
    "harness_rows",
    "main",
    "parse_scaling",
    "passkey_dataset",
    "passkey_docs",
    "passkey_process_results",
    "perplexity_dataset",
    "perplexity_docs",
    "ruler_dataset",
    "ruler_docs",
    "ruler_process_results",
    "run_harness",
    "scaling_presets",
    "task_names",
]
