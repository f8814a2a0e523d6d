"""lenbench's lm-eval tasks: the YAML definitions in ``tasks/`` and the data builders they name.

Passkey prompts, RULER-style examples and held-out corpus documents are generated locally (no hub
download) from each task's ``metadata``; the YAMLs reach these builders through
``tasks/utils.py``. Each RULER-style task is one lm-eval task, ``lenbench_ruler_<task>``, whose
documents span its ``lengths`` and which reports ``acc``/``match`` overall and per length
(``acc_<L>``, ``match_<L>``), as lm-eval's own RULER does; its YAMLs are written by
:func:`write_ruler_task_files` (a test checks the committed files equal its output).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.args import positive_int
from bench.tasks.passkey import (
    DEFAULT_TEMPLATE,
    answer_matches,
    parse_passkey,
    passkey_grid,
    passkey_template,
)
from bench.tasks.ruler import (
    RULER_TASKS,
    default_ruler_tasks,
    exact_match,
    match_score,
    params_from,
    ruler_depths,
    ruler_grid,
)

TASKS_DIR = Path(__file__).resolve().parent / "tasks"


def _depth_list(depths: Any) -> list[float]:
    """``depths`` as in conf/eval: a count n (n evenly spaced depths in [0, 1]) or a list."""
    if isinstance(depths, bool):
        raise ValueError(
            f"passkey depths {depths!r} is invalid; allowed: a count >= 1 or a list of depths in [0, 1]."
        )
    if isinstance(depths, (int, np.integer)):
        if depths < 1:
            raise ValueError(
                f"passkey depths {depths!r} is invalid; allowed: a count >= 1 or a list of depths in [0, 1]."
            )
        return [0.0] if depths == 1 else np.linspace(0.0, 1.0, int(depths)).round(6).tolist()
    values = sorted({float(d) for d in depths})
    if not values or not all(0.0 <= d <= 1.0 for d in values):
        raise ValueError(
            f"passkey depths {depths!r} is invalid; allowed: a count >= 1 or a list of depths in [0, 1]."
        )
    return values


def passkey_docs(
    length: int,
    depths: Any = 10,
    trials: int = 10,
    seed: int = 0,
    filler: str = "standard",
    template: str = DEFAULT_TEMPLATE,
    **_: Any,
) -> list[dict]:
    """One document per example of ``passkey_grid([length], depths, trials, seed, template=...)``.

    ``template`` is the native metric's: ``run_harness`` and ``lenbench-harness`` set it to the
    checkpoint's training template unless the metadata names one (as the native evaluation
    follows the training). Fields: ``prompt`` (the prompt bytes as text), ``answer`` (the
    template's answer with the key), ``key``, ``depth``, ``trial``, ``eval_length`` (= length,
    prompt + answer in bytes), ``template``. Extra keyword arguments (lm-eval passes every
    metadata key to every task) are ignored.
    """
    if filler != "standard":
        raise ValueError(
            f"harness passkey filler {filler!r} is not supported; allowed: standard (corpus "
            "filler bytes need not be valid UTF-8 text, which lm-eval prompts must be)."
        )
    length = positive_int(length, "passkey length")
    fixed = passkey_template(template)
    examples = passkey_grid(
        [length],
        _depth_list(depths),
        positive_int(trials, "passkey trials"),
        int(seed),
        template=fixed,
    )
    docs = []
    for example in examples:
        prompt = bytes(example.prompt_ids).decode("utf-8")
        answer = fixed.answer.format(key=example.key)
        assert list(answer.encode()) == example.answer_ids
        docs.append(
            {
                "prompt": prompt,
                "answer": answer,
                "key": int(example.key),
                "depth": float(example.depth),
                "trial": int(example.trial),
                "eval_length": length,
                "template": fixed.name,
            }
        )
    return docs


def passkey_dataset(**metadata: Any) -> dict:
    """lm-eval ``custom_dataset``: ``{"test": Dataset}`` of :func:`passkey_docs` (metadata as kwargs)."""
    import datasets

    return {"test": datasets.Dataset.from_list(passkey_docs(**metadata))}


def passkey_process_results(doc: Mapping, results: Sequence[str]) -> dict[str, int]:
    """Metrics of one passkey generation: ``acc`` (starts with the answer, and the key ends
    there) and ``acc_parsed`` (the first number in the generation is the key)."""
    generation = results[0]
    return {
        "acc": int(answer_matches(generation, doc["answer"])),
        "acc_parsed": int(parse_passkey(generation) == int(doc["key"])),
    }


def _is_count(depths: Any) -> bool:
    return isinstance(depths, (int, np.integer)) and not isinstance(depths, bool) and depths >= 1


#: Lengths a RULER-style task may be asked for: its YAML declares a per-length metric for each
#: (lm-eval aggregates only declared metrics); powers of two from 64 to 128K bytes.
RULER_METRIC_LENGTHS = tuple(2**k for k in range(6, 18))


def _ruler_lengths(lengths: Any) -> list[int]:
    values = [lengths] if isinstance(lengths, (int, np.integer)) else lengths
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise ValueError(f"ruler lengths must be a non-empty list of lengths, got {lengths!r}.")
    out = [positive_int(v, "ruler length") for v in values]
    bad = [v for v in out if v not in RULER_METRIC_LENGTHS]
    if bad:
        raise ValueError(
            f"ruler length {bad[0]} has no per-length metric in the task's YAML; allowed: "
            + ", ".join(str(x) for x in RULER_METRIC_LENGTHS)
            + "."
        )
    return out


def ruler_docs(
    task: str,
    lengths: Any = None,
    depths: Any = 3,
    trials: int = 4,
    seed: int = 0,
    params: Mapping | None = None,
    **_: Any,
) -> list[dict]:
    """One document per example of the native ``ruler`` metric's grid for ``task`` at each of
    ``lengths`` (``bench.tasks.ruler.ruler_grid``, standard filler), shortest length first:
    ``prompt``, ``answer`` (comma-separated), ``expected`` (the strings RULER's score looks for),
    ``task``, ``depth`` (-1 where the task has none), ``trial``, ``eval_length`` (prompt + answer,
    in bytes). ``lengths`` defaults to :data:`TASK_LENGTHS`."""
    docs = []
    for length in _ruler_lengths(TASK_LENGTHS if lengths is None else lengths):
        examples = ruler_grid(
            [task],
            [length],
            # a count: the native metric's depths; a list (or a bad value) as passkey reads it
            ruler_depths(depths) if _is_count(depths) else _depth_list(depths),
            positive_int(trials, "ruler trials"),
            int(seed),
            params_from(params),
        )
        docs += [
            {
                "prompt": bytes(e.prompt_ids).decode("utf-8"),
                "answer": e.answer_text,
                "expected": list(e.expected),
                "task": task,
                "depth": -1.0 if e.depth is None else float(e.depth),
                "trial": int(e.trial),
                "eval_length": length,
            }
            for e in examples
        ]
    return docs


def ruler_dataset(**metadata: Any) -> dict:
    """lm-eval ``custom_dataset``: ``{"test": Dataset}`` of :func:`ruler_docs`."""
    import datasets

    return {"test": datasets.Dataset.from_list(ruler_docs(**metadata))}


def ruler_process_results(doc: Mapping, results: Sequence[str]) -> dict[str, float]:
    """Scores of one generation: ``acc`` (the native exact verdict: the whole answer, then no
    letter or digit) and ``match`` (RULER's fraction of expected strings present)."""
    generation = results[0]
    acc = float(exact_match(generation, doc["answer"]))
    match = match_score(generation, doc["expected"])
    length = int(doc["eval_length"])
    return {
        "acc": acc,
        "match": match,
        f"acc_{length}": acc,
        f"match_{length}": match,
        f"n_{length}": 1,  # summed: the documents scored at this length
    }


def count(items: Sequence[Any]) -> int:
    """lm-eval aggregation of the ``n_<L>`` metrics: how many documents were scored."""
    return len(items)


#: Lengths of the ``lenbench_passkey_<L>`` and ``lenbench_ppl_<L>`` tasks, and the default
#: ``lengths`` of each ``lenbench_ruler_<task>``.
TASK_LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384)
RULER_METRICS = ("acc", "match")


def _metric_names() -> list[str]:
    return [*RULER_METRICS, *(f"{m}_{x}" for x in RULER_METRIC_LENGTHS for m in RULER_METRICS)]


def _shared_ruler_yaml() -> str:
    lines = [
        "# written by bench.harness.tasks.write_ruler_task_files; do not edit",
        "# Shared settings of the lenbench_ruler_<task> tasks (no `task:` key, so lm-eval does not",
        "# index this file). Data: bench.tasks.ruler.ruler_grid at each of the task's lengths, built",
        "# locally (no download), the native `ruler` metric's examples. acc and match overall, and",
        "# acc_<L> / match_<L> for each length L a task may be asked for (RULER_METRIC_LENGTHS).",
        "output_type: generate_until",
        "custom_dataset: !function utils.ruler_dataset",
        "test_split: test",
        "doc_to_text: prompt",
        "doc_to_target: answer",
        "process_results: !function utils.ruler_process_results",
        "generation_kwargs:",
        '  until: ["\\n"]',
        "  max_gen_toks: 48",
        "  do_sample: false",
        "num_fewshot: 0",
        "metric_list:",
    ]
    for name in _metric_names():
        lines += [f"  - metric: {name}", "    aggregation: mean", "    higher_is_better: true"]
    for x in RULER_METRIC_LENGTHS:
        lines += [f"  - metric: n_{x}", "    aggregation: !function utils.count"]
        lines += ["    higher_is_better: true"]
    return "\n".join(lines) + "\n"


def ruler_task_files() -> dict[str, str]:
    """File name -> YAML text of the shared settings, of every ``lenbench_ruler_<task>`` task and
    of the groups ``lenbench_ruler`` (RULER's suite) and ``lenbench_reasoning``."""
    files = {"_lenbench_ruler.yaml": _shared_ruler_yaml()}
    lengths = ", ".join(str(x) for x in TASK_LENGTHS)
    for task in RULER_TASKS:
        name = f"lenbench_ruler_{task}"
        files[f"{name}.yaml"] = (
            "# written by bench.harness.tasks.write_ruler_task_files; do not edit\n"
            "include: _lenbench_ruler.yaml\n"
            f"task: {name}\n"
            "metadata:\n"
            "  version: 2.0\n"
            f"  task: {task}\n"
            f"  lengths: [{lengths}]  # prompt + answer, in bytes (= lenbench tokens)\n"
            "  depths: 3         # a count (evenly spaced in [0, 1]) or a list of depths\n"
            "  trials: 4         # examples per depth and length (trials for tasks without depth)\n"
            "  seed: 0           # ruler_grid seed (the native evaluation uses the job seed)\n"
        )
    suite = default_ruler_tasks()
    files["lenbench_ruler.yaml"] = _group_yaml(
        "lenbench_ruler", [f"lenbench_ruler_{task}" for task in suite]
    )  # RULER's suite; the reasoning tasks (qa1-qa3, kv_middle) are their own group
    files["lenbench_reasoning.yaml"] = _group_yaml(
        "lenbench_reasoning",
        [f"lenbench_ruler_{task}" for task in RULER_TASKS if task not in suite],
    )
    return files


def _group_yaml(group: str, tasks: Sequence[str]) -> str:
    lines = [
        "# written by bench.harness.tasks.write_ruler_task_files; do not edit",
        f"group: {group}",
        "task:",
    ]
    lines += [f"  - {t}" for t in tasks]
    lines += ["aggregate_metric_list:"]
    for metric in _metric_names():
        lines += [f"  - metric: {metric}", "    aggregation: mean", "    weight_by_size: true"]
    lines += ["metadata:", "  version: 2.0"]
    return "\n".join(lines) + "\n"


def write_ruler_task_files(folder: Path = TASKS_DIR) -> list[Path]:
    """Write :func:`ruler_task_files` into ``folder`` and remove the ``lenbench_ruler*`` YAMLs it no
    longer writes; returns the paths written."""
    keep = set(ruler_task_files())
    for old in Path(folder).glob("lenbench_ruler_*.yaml"):
        if old.name not in keep:
            old.unlink()
    paths = []
    for name, text in ruler_task_files().items():
        path = Path(folder) / name
        path.write_text(text)
        paths.append(path)
    return paths


#: Lengths of the ``lenbench_ppl_<L>`` tasks; their default ``span`` is the longest.
PPL_LENGTHS = TASK_LENGTHS


def perplexity_docs(
    length: int,
    data: Mapping | None = None,
    split: str = "test",
    max_docs: int = 64,
    span: int = max(PPL_LENGTHS),
    **_: Any,
) -> list[dict]:
    """Windows of ``length`` bytes tiling the first ``span`` bytes of up to ``max_docs``
    documents of ``split`` of corpus ``data``: the native ``nll`` protocol (``max_windows:
    fill``), so every task of the group reads one document set and scores the same bytes.

    ``data`` is a lenbench data config (default ``{"name": "pycorpus"}``, the held-out stdlib
    files). A document is used if it has ``span`` bytes that cut into valid UTF-8 text at every
    multiple of the shortest task length (so at every task's window boundaries); they are picked
    evenly over the corpus order (``bench.eval.metrics.context.select_documents``), whatever
    ``length`` is. ``length`` must divide ``span``. Fields: ``id`` (document#window), ``text``,
    ``eval_length``.
    """
    from bench.data.corpora import load_corpus
    from bench.eval.metrics.context import select_documents

    length = positive_int(length, "perplexity length")
    span = positive_int(span, "perplexity span")
    if span % length:
        raise ValueError(
            f"perplexity span {span} is not a multiple of the task length {length}; give a span "
            "(metadata 'span') that every task length of the group divides."
        )
    corpus = load_corpus(dict(data) if data is not None else {"name": "pycorpus"})
    cut = math.gcd(min(PPL_LENGTHS), length)  # every window boundary is a multiple of it
    eligible, texts = [], {}
    for doc in corpus.split(split):
        if len(doc) < span:
            continue
        raw = doc.tokens[:span].astype(np.uint8).tobytes()
        try:
            texts[doc.id] = [raw[i : i + cut].decode("utf-8") for i in range(0, span, cut)]
        except UnicodeDecodeError:
            continue
        eligible.append(doc)
    selected, _ = select_documents(eligible, span, positive_int(max_docs, "perplexity max_docs"))
    if not selected:
        raise ValueError(
            f"the {split} split of corpus {corpus.name} ({corpus.fingerprint}) has no document with "
            f"{span} bytes of valid UTF-8 text; use a shorter span (metadata 'span') or another "
            "corpus (metadata 'data')."
        )
    per_window = length // cut
    return [
        {
            "id": f"{d.id}#{k}",
            "text": "".join(texts[d.id][k * per_window : (k + 1) * per_window]),
            "eval_length": length,
        }
        for d in selected
        for k in range(span // length)
    ]


def perplexity_dataset(**metadata: Any) -> dict:
    """lm-eval ``custom_dataset``: ``{"test": Dataset}`` of :func:`perplexity_docs`."""
    import datasets

    return {"test": datasets.Dataset.from_list(perplexity_docs(**metadata))}


def training_template(meta: Mapping | None) -> str | None:
    """The passkey template a checkpoint trained with (its parent's, for a fine-tune), from its
    ``weights_config``; None when the meta does not say."""
    config = (meta or {}).get("weights_config") or {}
    while "parent" in config:
        config = config["parent"]
    template = (config.get("train") or {}).get("passkey_template")
    return str(template) if template else None


def task_names() -> list[str]:
    """Every task and group name defined in :data:`TASKS_DIR` (fast: lm-eval's own tasks not indexed)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(TASKS_DIR), include_defaults=False).all_tasks


def split_tasks(tasks: str | Sequence[str]) -> list[str]:
    """Task names from a comma-separated string or a list of them."""
    if isinstance(tasks, str):
        tasks = [tasks]
    return [t.strip() for item in tasks for t in str(item).split(",") if t.strip()]
