"""``ruler``: RULER-style tasks (``bench.tasks.ruler``) and the effective context length.

Two scores per example. The **exact** verdict is passkey's: the whole answer, then no letter or
digit. On byte tokens it is teacher-forced (one forward pass of prompt + answer: every answer
token is the argmax, and the argmax after it is not a letter or digit); on a pretrained model's
tokenizer it is read from the greedy generation, and every example is fitted to the eval length in
that tokenizer's tokens (``bench.tasks.ruler.fit_ruler_example``). The **match** score is RULER's
``string_match_all``: the fraction of expected strings present in the greedy generation of
``len(answer) + extra_tokens`` tokens (KV cache). On byte tokens the greedy generation's exact
verdict is the teacher-forced one (tested), so the two scores are two readings of one run.

Rows (metric = the task's name, ``task`` and ``task_params`` columns set; the parameters include
the filler, ``min_length``, the fewest byte tokens the task fits, and ``fixed_length``, its
text that is not haystack: head, statements, question and answer): per length,
``axis="score"`` with ``axis_value`` ``exact`` / ``match`` (``ci_lo``/``ci_hi``: Wilson
intervals; for ``match``, over the expected strings, which treats them as independent), and for
the depth tasks one exact row per depth (``axis="depth"``). Once per run ``effective_length``
rows per task and for the tasks' mean (``task="average"``, lengths where every task ran):
for each score (``exact`` and ``match``, named in ``task_params`` with ``headline`` true for
``score``, default exact), the largest evaluated length at which that score is >=
``relative_threshold`` x the score at ``reference_length`` (``axis="relative_threshold"``; 0
where that score is 0) or, where an absolute ``threshold`` is set (default none: RULER's 0.856
is Llama-2-7B's 13-task mean at 4K and calibrates nothing for these tasks and models), >= it
(``axis="threshold"``), with every shorter evaluated length passing too; not interpolated
between lengths (``task_params`` says so); 0 when the shortest length fails.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from bench.core.checks import choice, integer, number
from bench.core.rows import canonical_json
from bench.data.corpora import Document
from bench.data.tokenizer import ByteTokenizer
from bench.eval.metrics.context import EvalContext, make_row
from bench.eval.metrics.passkey import corpus_filler_source, decode_in_context, passkey_verdicts
from bench.eval.metrics.registry import METRICS, MetricConfig, Split, register_metric, split_rows
from bench.tasks.ruler import (
    RULER_FILLERS,
    RULER_TASKS,
    RulerExample,
    default_ruler_tasks,
    exact_match,
    fixed_ruler_length,
    match_score,
    min_ruler_length,
    params_from,
    ruler_depths,
    ruler_examples,
    ruler_task,
)
from models.lazy import no_grad, torch

__all__ = [
    "RulerConfig",
    "effective_length",
    "effective_length_rows",
    "generated_scores",
    "teacher_forced_verdicts",
]

logger = logging.getLogger(__name__)
TOK = ByteTokenizer()
# byte tokens that would continue the answer's last item (the verdict needs anything else)
_ALNUM_IDS = tuple(i for i in range(256) if chr(i).isascii() and chr(i).isalnum())
SCORES = ("exact", "match")
RULE = "largest evaluated length with it and every shorter one passing; not interpolated"
#: the protocol: the filler is at least this share of every evaluated window
MIN_FILLER_SHARE = 0.5


@dataclass
class RulerConfig(MetricConfig):
    """``eval.ruler``: RULER-style tasks at each eval length; rows per task and length and
    ``effective_length`` rows. Off by default (``eval.ruler.enabled=true``)."""

    enabled: bool = False  # off by default: eval.ruler.enabled=true
    # tasks (bench/tasks/ruler_tasks/); default: RULER's suite, not the reasoning tasks (qa1-qa3, kv_middle)
    tasks: list = field(default_factory=default_ruler_tasks)
    depths: int = 3  # depths of the asked needle (niah_single, niah_multikey), evenly in [0, 1]
    trials: int = 4  # examples per depth; the other tasks get depths x trials per length
    filler: str = "standard"  # haystack of the needle tasks and vt: standard | corpus
    params: dict = field(default_factory=dict)  # task parameters (bench.tasks.ruler.RulerParams)
    extra_tokens: int = 8  # generated beyond the answer's length for the match score
    score: str = "exact"  # the headline score of effective_length (rows for both): exact | match
    # an absolute threshold (RULER's 0.856 is Llama-2-7B's 13-task mean at 4K: it calibrates
    # nothing for these tasks and models); null = relative effective lengths only
    threshold: float | None = None
    relative_threshold: float = 0.85  # x the score at reference_length
    reference_length: int | None = None  # null = the training length

    def __post_init__(self) -> None:
        super().__post_init__()
        tasks = list(self.tasks) if isinstance(self.tasks, (list, tuple)) else [self.tasks]
        for task in tasks:
            choice(self.key("tasks"), task, RULER_TASKS)
        if not tasks or len(set(tasks)) != len(tasks):
            raise ValueError(
                f"{self.key('tasks')} must name distinct tasks of {', '.join(RULER_TASKS)}, got {self.tasks!r}."
            )
        self.tasks = tasks
        self.depths = integer(self.key("depths"), self.depths, 1)
        self.trials = integer(self.key("trials"), self.trials, 1)
        self.filler = choice(self.key("filler"), self.filler, RULER_FILLERS)
        try:
            params_from(self.params)
        except ValueError as exc:
            raise ValueError(f"{self.key('params')}: {exc}") from None
        self.params = dict(self.params)
        self.extra_tokens = integer(self.key("extra_tokens"), self.extra_tokens, 1)
        self.score = choice(self.key("score"), self.score, SCORES)
        if self.threshold is not None:
            self.threshold = number(self.key("threshold"), self.threshold, 0.0, 1.0)
        self.relative_threshold = number(
            self.key("relative_threshold"), self.relative_threshold, 0.0, 1.0
        )
        self.reference_length = integer(
            self.key("reference_length"), self.reference_length, 1, optional=True
        )

    @property
    def reads_documents(self) -> bool:
        return self.filler == "corpus"

    @property
    def depth_list(self) -> list[float]:
        return ruler_depths(self.depths)

    def resolve(self, train_length: int, eval_lengths: Sequence[int]) -> RulerConfig:
        out = super().resolve(train_length, eval_lengths)
        given = self.reference_length
        if given is not None and out.enabled and out.lengths and given not in out.lengths:
            raise ValueError(  # else every task warns after the evaluation and has none
                f"{self.key('reference_length')} {given} is not a ruler eval length "
                f"{list(out.lengths)}, so no relative effective length could be computed; "
                "allowed: one of them, or null (the training length)."
            )
        return replace(out, reference_length=given or int(train_length))

    def check_fit(self) -> str | None:
        """For a resolved section on byte tokens (a lenbench model): raise ValueError (one
        sentence) when a task fits none of its eval lengths; return the warning for tasks that
        fit only some of them (skipped at the others) and for windows whose filler is under
        :data:`MIN_FILLER_SHARE`, else None. Called before training."""
        if not self.enabled or not self.lengths:
            return None
        params = params_from(self.params)
        need = {task: min_ruler_length(task, params) for task in self.tasks}
        longest, lengths = max(self.lengths), sorted(self.lengths)
        nowhere = [task for task in self.tasks if need[task] > longest]
        if nowhere:
            needs = ", ".join(f"{task} {need[task]}" for task in nowhere)
            raise ValueError(
                f"{self.key('tasks')} has tasks that fit none of the ruler eval lengths "
                f"{lengths} (tokens they need: {needs}); allowed: longer eval lengths "
                f"(eval.lengths, {self.key('lengths')}) or tasks without them."
            )
        warnings = []
        fixed = {task: fixed_ruler_length(task, params) for task in self.tasks}
        thin = [
            f"{task} at {length} ({1 - fixed[task] / length:.0%})"
            for task in self.tasks
            for length in lengths
            if need[task] <= length and fixed[task] / length > 1 - MIN_FILLER_SHARE
        ]
        if thin:
            warnings.append(
                f"ruler: the filler is under {MIN_FILLER_SHARE:.0%} of the window (the protocol's "
                f"minimum; the rest is the task's fixed text) for {', '.join(thin)}."
            )
        some = [task for task in self.tasks if need[task] > lengths[0]]
        if not some:
            return " ".join(warnings) or None
        skips = ", ".join(f"{task} below {need[task]}" for task in some)
        reference = self.reference_length
        late = [task for task in some if reference is not None and need[task] > reference]
        note = (
            f"; no relative effective length for {', '.join(late)} (the reference length "
            f"{reference} is too short)"
            if late
            else ""
        )
        warnings.insert(
            0,
            f"ruler tasks that fit only some eval lengths {lengths} are skipped at the shorter "
            f"ones: {skips} tokens{note}.",
        )
        return " ".join(warnings)


def _finish(cfg: RulerConfig, rows: list[dict]) -> list[dict]:
    return effective_length_rows(rows, cfg)


def _items(ctx: EvalContext, cfg: RulerConfig, docs: Sequence[Document], length: int) -> int:
    return len(cfg.tasks)


def _measure(
    ctx: EvalContext, cfg: RulerConfig, docs: Sequence[Document], length: int, items: range
) -> dict:
    """The rows of the tasks ``items`` (a part: one task), as JSON text."""
    rows = ruler_rows(ctx, cfg, docs, length, [cfg.tasks[i] for i in items])
    return {"rows": np.array(json.dumps(rows))}


def _combine(cfg: RulerConfig, length: int, payloads: list[dict | None]) -> list[dict]:
    return [row for p in payloads for row in json.loads(str(p["rows"]))]


@register_metric(
    "ruler",
    config=RulerConfig,
    finish=_finish,
    split=Split(
        _items, _measure, _combine, per_part=1, weight=lambda cfg: len(cfg.depth_list) * cfg.trials
    ),
)  # a part: one task
def ruler_metric(
    ctx: EvalContext, cfg: RulerConfig, docs: Sequence[Document], length: int
) -> list[dict]:
    return split_rows(METRICS["ruler"].split, ctx, cfg, docs, length, f"ruler L={length}")


def ruler_rows(
    ctx: EvalContext, cfg: RulerConfig, docs: Sequence[Document], length: int, tasks: Sequence[str]
) -> list[dict]:
    """The rows of ``tasks`` at one eval length (each task's examples are its own)."""
    params = params_from(cfg.params)
    source = ctx.cached(
        ("ruler", id(docs), length),
        lambda: corpus_filler_source(docs, length, "ruler") if cfg.filler == "corpus" else None,
    )
    rows = []
    for task in tasks:
        minimum = min_ruler_length(task, params)  # in byte tokens; a tokenizer's fit says its own
        if ctx.tokenizer is None and length < minimum:
            logger.debug(  # a lenbench job warned before training (RulerConfig.check_fit)
                "ruler task %s at eval length %d skipped: it needs at least %d tokens.",
                task, length, minimum,
            )  # fmt: skip
            continue
        try:
            examples = ruler_examples(
                task, length, cfg.depth_list, cfg.trials, ctx.seed, params, cfg.filler, source,
                ctx.tokenizer,
            )  # fmt: skip
        except ValueError as exc:
            if ctx.tokenizer is None:
                raise
            logger.warning("ruler task %s at eval length %d skipped: %s", task, length, exc)
            continue
        if ctx.tokenizer is not None:
            _warn_short(examples, task, length)
            exact, match = generated_scores(ctx, examples, cfg.extra_tokens, text=True)
        else:
            exact = teacher_forced_verdicts(ctx, examples)
            _, match = generated_scores(ctx, examples, cfg.extra_tokens)
        rows += _task_rows(task, examples, exact, match, length, cfg)
    return rows


def _warn_short(examples: Sequence[RulerExample], task: str, length: int) -> None:
    off = sum(e.length != length for e in examples)
    if off:
        logger.warning(
            "ruler task %s at eval length %d: %d of %d examples have fewer tokens (no byte length "
            "gives exactly %d tokens with this tokenizer).",
            task, length, off, len(examples), length,
        )  # fmt: skip


def _batches(ctx: EvalContext, examples: Sequence[RulerExample], key) -> list[list[int]]:
    groups: dict = defaultdict(list)
    for i, example in enumerate(examples):
        groups[key(example)].append(i)
    out = []
    for k, indices in groups.items():
        step = ctx.rows_per_batch(k if isinstance(k, int) else k[0])
        out += [indices[s : s + step] for s in range(0, len(indices), step)]
    return out


def teacher_forced_verdicts(ctx: EvalContext, examples: Sequence[RulerExample]) -> list[bool]:
    """Exact verdicts of byte examples, teacher-forced (passkey's, with "the answer ends" = the
    next token is no letter or digit)."""
    return passkey_verdicts(ctx.model, examples, ctx.batch_size, ctx.device, ctx, _ALNUM_IDS)


def _decode_generated(tokenizer, prompt_ids: Sequence[int], generated: Sequence[int]) -> str:
    """The generation as text: bytes on byte tokens, else in context (passkey's decoding), or
    alone where the tokenizer rewrites across the prompt's end."""
    if tokenizer is None:
        return TOK.decode([t for t in generated if t < 256])
    text = decode_in_context(tokenizer, prompt_ids, generated)
    kw = {"skip_special_tokens": True, "clean_up_tokenization_spaces": False}
    return text if text is not None else tokenizer.decode(generated, **kw)


@no_grad
def generated_scores(
    ctx: EvalContext, examples: Sequence[RulerExample], extra_tokens: int, text: bool = False
) -> tuple[list[bool], list[float]]:
    """(exact verdicts, match scores) from greedy generation with the KV cache of
    ``len(answer) + extra_tokens`` tokens after each prompt (one fewer where a learned position
    table would end). ``text``: decode with ``ctx.tokenizer`` in context."""
    exact = [False] * len(examples)
    match = [0.0] * len(examples)
    tokenizer = ctx.tokenizer if text else None
    for batch in _batches(ctx, examples, lambda e: (len(e.prompt_ids), len(e.answer_ids))):
        chosen = [examples[i] for i in batch]
        prompt_len = len(chosen[0].prompt_ids)
        new = len(chosen[0].answer_ids) + int(extra_tokens)
        while new > 1 and ctx.position_range_error(prompt_len + new - 2, prompt_len + new - 1):
            new -= 1  # at a learned table's end
        prompts = torch.tensor([e.prompt_ids for e in chosen], device=ctx.device)
        with ctx.autocast():
            generated = ctx.model.generate_greedy(prompts, max_new_tokens=new).cpu().tolist()
        for i, example, row in zip(batch, chosen, generated, strict=True):
            output = _decode_generated(tokenizer, example.prompt_ids, row)
            exact[i] = exact_match(output, example.answer_text)
            match[i] = match_score(output, example.expected)
    return exact, match


def _task_rows(
    task: str,
    examples: Sequence[RulerExample],
    exact: Sequence[bool],
    match: Sequence[float],
    length: int,
    cfg: RulerConfig,
) -> list[dict]:
    # the fixed text's length in byte tokens, as passkey rows name their template: what is left
    # of the length is haystack
    task_params = params_from(cfg.params)
    sizes = {
        "min_length": min_ruler_length(task, task_params),
        "fixed_length": fixed_ruler_length(task, task_params),
    }
    params = canonical_json({**examples[0].params, "filler": cfg.filler, **sizes})
    common = {"task": task, "task_params": params}
    n = len(examples)
    k = int(sum(exact))
    rows = [
        make_row(task, k / n, n, length, axis="score", axis_value="exact",
                 **_ci(k, n), **common),
    ]  # fmt: skip
    found = sum(round(m * len(e.expected)) for m, e in zip(match, examples, strict=True))
    strings = sum(len(e.expected) for e in examples)
    rows.append(
        make_row(task, float(np.mean(match)), n, length, axis="score", axis_value="match",
                 **_ci(found, strings), **common)
    )  # fmt: skip
    if ruler_task(task).depth:
        by_depth: dict[float, list[bool]] = defaultdict(list)
        for example, verdict in zip(examples, exact, strict=True):
            by_depth[float(example.depth)].append(verdict)
        for depth, verdicts in sorted(by_depth.items()):
            kd, nd = int(sum(verdicts)), len(verdicts)
            rows.append(
                make_row(task, kd / nd, nd, length, axis="depth", axis_value=depth,
                         **_ci(kd, nd), **common)
            )  # fmt: skip
    return rows


def _ci(k: int, n: int) -> dict:
    from bench.core.stats import wilson  # scipy: not on the config check path

    lo, hi = wilson(k, n)
    return {"ci_lo": lo, "ci_hi": hi}


def effective_length(scores: dict[int, float], threshold: float) -> int:
    """The largest length of ``scores`` whose score and every shorter length's are >=
    ``threshold``; 0 when the shortest fails."""
    best = 0
    for length in sorted(scores):
        if scores[length] < threshold:
            break
        best = length
    return best


def effective_length_rows(rows: Sequence[dict], cfg: RulerConfig) -> list[dict]:
    """``effective_length`` rows (module doc) from a run's ``ruler`` task rows: for each score
    (exact and match) and task, at the relative threshold and, where ``cfg.threshold`` is set, at
    that absolute one; ``task_params`` names the score and whether it is the headline
    (``eval.ruler.score``)."""
    out = []
    for score in SCORES:
        out += _effective_length_rows(rows, cfg, score)
    return out


def _effective_length_rows(rows: Sequence[dict], cfg: RulerConfig, score: str) -> list[dict]:
    scores: dict[str, dict[int, float]] = defaultdict(dict)
    for r in rows:
        if r.get("axis") == "score" and r.get("axis_value") == score:
            scores[r["task"]][int(r["eval_length"])] = float(r["value"])
    if not scores:
        return []
    common = set.intersection(*(set(s) for s in scores.values()))
    if common:
        scores["average"] = {x: float(np.mean([s[x] for s in scores.values()])) for x in common}
    out = []
    for task, by_length in scores.items():
        params = {"score": score, "headline": score == cfg.score, "rule": RULE}
        if cfg.threshold is not None:
            value = effective_length(by_length, cfg.threshold)
            out.append(
                make_row("effective_length", value, len(by_length), value, axis="threshold",
                         axis_value=cfg.threshold, task=task, task_params=canonical_json(params))
            )  # fmt: skip
        reference = by_length.get(int(cfg.reference_length or 0))
        if reference is None:
            if score == cfg.score:  # once per task, not once per score
                logger.warning(
                    "ruler: no relative effective length for %s (reference length %s not "
                    "evaluated).", task, cfg.reference_length,
                )  # fmt: skip
            continue
        # a model that scores 0 at its reference length has no effective length on the task
        bar = cfg.relative_threshold * reference
        value = effective_length(by_length, bar) if reference > 0 else 0
        rel = {
            **params,
            "reference_length": int(cfg.reference_length),
            "reference_score": reference,
        }
        out.append(
            make_row("effective_length", value, len(by_length), value,
                     axis="relative_threshold", axis_value=cfg.relative_threshold, task=task,
                     task_params=canonical_json(rel))
        )  # fmt: skip
    return out
