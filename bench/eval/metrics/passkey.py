"""``passkey``: retrieval of a key hidden in filler; verdicts, rows and the passkey context.

A verdict is exact match of the whole key, ended: the model must produce every answer token
and then a token that is not a digit (so " 12345" is wrong for the key 1234). Teacher forcing
does this in one batched forward pass of prompt + answer: the argmax at each answer position
must equal the answer token and the argmax after the last one must not be a digit. That is the
same decision as greedy decoding of ``len(answer) + 1`` tokens, which
:func:`greedy_passkey_verdicts` computes with the KV cache so the two can be cross-checked.
Examples of the same length (a passkey grid cell's length) batch together without padding.

With a transformers tokenizer on the context (a pretrained model), the examples are built as
text and fitted to each length in its tokens, and :func:`text_passkey_verdicts` decodes greedily
and compares the answer as text decoded in context (:func:`generated_answer_matches`), so a
tokenizer that drops a leading space when decoding alone (SentencePiece) scores right.

Rows: ``passkey_acc`` per depth (axis="depth") and per length (axis="template", axis_value = the
template's name) at each eval length, every one with the template in its ``template`` column, and
once per run ``passkey_context``: the largest tested length whose accuracy is >= the configured
threshold (axis="threshold", axis_value = that threshold), computed only here.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from bench.core.checks import choice, integer, number
from bench.data.corpora import Document
from bench.data.tokenizer import ByteTokenizer
from bench.eval.metrics.context import EvalContext, make_row
from bench.eval.metrics.registry import METRICS, MetricConfig, Split, register_metric, split_rows
from bench.tasks.passkey import (
    DEFAULT_TEMPLATE,
    PASSKEY_FILLERS,
    PASSKEY_TEMPLATES,
    PasskeyExample,
    answer_matches,
    is_digit_token,
    min_passkey_length,
    passkey_grid,
)
from models.lazy import nn, no_grad, torch

__all__ = [
    "PasskeyConfig",
    "corpus_filler_source",
    "decode_in_context",
    "generated_answer_matches",
    "greedy_passkey_verdicts",
    "passkey_context",
    "passkey_context_row",
    "passkey_rows",
    "passkey_verdicts",
    "text_passkey_verdicts",
]

logger = logging.getLogger(__name__)

# byte tokens that would continue the key (the verdict needs anything else after it)
_DIGIT_IDS = tuple(i for i in range(ByteTokenizer.vocab_size) if is_digit_token(i))


@dataclass
class PasskeyConfig(MetricConfig):
    """``eval.passkey``: exact-match retrieval of a key hidden in filler; passkey_acc and
    passkey_context rows. Eval lengths shorter than the template are skipped."""

    # a count of depths evenly spaced from 0 (needle first) to 1 (last), or a list of depths
    depths: Any = 10
    trials: int = 10  # examples per (length, depth), each with its own seeded key
    # standard ("The grass is green...") | corpus (text of the test documents)
    filler: str = "standard"
    # passkey_context = the largest length with accuracy >= this (YaRN: 0.8)
    threshold: float = 0.8
    # text around the filler: landmark (Landmark/PI/YaRN, 253 tokens) | short (73) (bench.tasks.passkey);
    # null = the template the model was trained with (a lenbench job sets it from
    # train.passkey_template), else landmark
    template: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        depths = self.depths
        is_count = not isinstance(depths, bool) and isinstance(depths, (int, np.integer))
        if not (depths >= 1 if is_count else self._depth_list(depths)):
            raise ValueError(
                f"{self.key('depths')} must be a count >= 1 or a non-empty list of depths in "
                f"[0, 1], got {depths!r}."
            )
        self.trials = integer(self.key("trials"), self.trials, 1)
        self.filler = choice(self.key("filler"), self.filler, PASSKEY_FILLERS)
        self.threshold = number(self.key("threshold"), self.threshold, 0.0, 1.0)
        if self.template is not None:
            self.template = choice(self.key("template"), self.template, tuple(PASSKEY_TEMPLATES))

    @property
    def reads_documents(self) -> bool:
        """Only the corpus filler reads test documents; the standard filler is generated."""
        return self.filler == "corpus"

    @staticmethod
    def _depth_list(depths: Any) -> bool:
        if not isinstance(depths, (list, tuple)) or not depths:
            return False
        return all(
            isinstance(d, (int, float)) and not isinstance(d, bool) and 0.0 <= d <= 1.0
            for d in depths
        )

    def resolve(self, train_length: int, eval_lengths: Sequence[int]) -> PasskeyConfig:
        """As :meth:`MetricConfig.resolve`, with ``depths`` as a sorted list of floats."""
        out = super().resolve(train_length, eval_lengths)
        if isinstance(self.depths, (list, tuple)):
            depths = sorted({float(d) for d in self.depths})
        elif int(self.depths) == 1:
            depths = [0.0]
        else:
            depths = np.linspace(0.0, 1.0, int(self.depths)).round(6).tolist()
        return replace(out, depths=depths)


def _finish(cfg: PasskeyConfig, rows: list[dict]) -> list[dict]:
    accuracy = {
        r["eval_length"]: r["value"]
        for r in rows
        if r["metric"] == "passkey_acc" and r.get("axis") == "template"
    }
    row = passkey_context_row(accuracy, cfg.threshold)
    return [] if row is None else [row]


def _items(ctx: EvalContext, cfg: PasskeyConfig, docs: Sequence[Document], length: int) -> int:
    return len(cfg.depths) * cfg.trials  # passkey_grid: one example per (depth, trial)


def _measure(
    ctx: EvalContext, cfg: PasskeyConfig, docs: Sequence[Document], length: int, items: range
) -> dict | None:
    """Depths and verdicts of the trials ``items`` (one forward batch); None where the length is
    skipped."""
    examples = ctx.cached(
        ("passkey", id(docs), length),
        lambda: _length_examples(
            ctx, length, depths=cfg.depths, trials=cfg.trials, seed=ctx.seed, filler=cfg.filler,
            docs=docs, template=cfg.template or DEFAULT_TEMPLATE,
        ),
    )  # fmt: skip
    if examples is None:
        return None
    chosen = examples[items.start : items.stop]
    verdicts = _batched_verdicts(ctx, chosen, length)
    return {"depth": np.array([e.depth for e in chosen], dtype=np.float64),
            "verdict": np.array(verdicts, dtype=bool)}  # fmt: skip


def _combine(cfg: PasskeyConfig, length: int, payloads: list[dict | None]) -> list[dict]:
    if any(p is None for p in payloads):
        return []
    depths = [float(d) for p in payloads for d in p["depth"]]
    verdicts = [bool(v) for p in payloads for v in p["verdict"]]
    return _accuracy_rows(depths, verdicts, length, cfg.template or DEFAULT_TEMPLATE)


@register_metric(
    "passkey", config=PasskeyConfig, finish=_finish, split=Split(_items, _measure, _combine)
)  # a part: one forward batch of trials
def passkey_metric(
    ctx: EvalContext, cfg: PasskeyConfig, docs: Sequence[Document], length: int
) -> list[dict]:
    return split_rows(METRICS["passkey"].split, ctx, cfg, docs, length, f"passkey L={length}")


def _groups(examples: Sequence[PasskeyExample], key) -> dict:
    groups: dict = defaultdict(list)
    for i, example in enumerate(examples):
        groups[key(example)].append(i)
    return groups


def _context(model, batch_size: int, device, ctx: EvalContext | None) -> EvalContext:
    if ctx is not None:
        return ctx
    return EvalContext(model, device=device, batch_size=int(batch_size), progress=False)


@no_grad
def passkey_verdicts(
    model: nn.Module,
    examples: Sequence[PasskeyExample],
    batch_size: int,
    device: str | torch.device = "cpu",
    ctx: EvalContext | None = None,
    continues: Sequence[int] = _DIGIT_IDS,
) -> list[bool]:
    """Teacher-forced exact-match verdicts, in the order of ``examples`` (any
    :class:`bench.tasks.passkey.TaskExample`).

    One forward pass of ``prompt + answer`` per batch of equal-length examples; the answer sits at
    the end of every example, so the predictions for it are the logits at positions
    ``L - 1 - len(answer) .. L - 2``, and the logits at ``L - 1`` say whether the answer ends
    there: the argmax is none of the byte tokens ``continues`` (digits, for a key).
    """
    ctx = _context(model, batch_size, device, ctx)
    verdicts = [False] * len(examples)
    for length, indices in _groups(examples, lambda e: e.length).items():
        step = ctx.rows_per_batch(length)
        for start in range(0, len(indices), step):
            batch = [examples[i] for i in indices[start : start + step]]
            ids = torch.tensor([e.input_ids for e in batch], dtype=torch.long)  # [B, L]
            answer_lens = torch.tensor([len(e.answer_ids) for e in batch])
            span = int(answer_lens.max())
            # only the last span + 1 positions' logits: [B, A + 1, V]
            logits = ctx.forward(ids, logits_from=length - 1 - span).logits
            predicted = logits[:, :span].argmax(dim=-1).cpu()  # [B, A]
            targets = ids[:, length - span :]
            in_answer = torch.arange(span)[None, :] >= (span - answer_lens)[:, None]
            after = logits[:, span].argmax(dim=-1).cpu()  # [B]: the token after the answer
            ended = ~torch.isin(after, torch.tensor(continues))
            ok = ((predicted == targets) | ~in_answer).all(dim=1) & ended
            for i, verdict in zip(indices[start : start + step], ok.tolist(), strict=True):
                verdicts[i] = bool(verdict)
    return verdicts


@no_grad
def greedy_passkey_verdicts(
    model: nn.Module,
    examples: Sequence[PasskeyExample],
    batch_size: int,
    device: str | torch.device = "cpu",
) -> list[bool]:
    """Verdicts from ``model.generate_greedy`` (KV cache): the generated tokens equal the answer,
    then a non-digit follows."""
    verdicts = [False] * len(examples)
    groups = _groups(examples, lambda e: (len(e.prompt_ids), len(e.answer_ids)))
    for (_, answer_len), indices in groups.items():
        for start in range(0, len(indices), int(batch_size)):
            chunk = indices[start : start + int(batch_size)]
            prompts = torch.tensor([examples[i].prompt_ids for i in chunk], device=device)
            generated = model.generate_greedy(prompts, max_new_tokens=answer_len + 1).cpu()
            answers = torch.tensor([examples[i].answer_ids for i in chunk])
            ok = (generated[:, :answer_len] == answers).all(dim=1)
            ok &= ~torch.isin(generated[:, answer_len], torch.tensor(_DIGIT_IDS))
            for i, verdict in zip(chunk, ok.tolist(), strict=True):
                verdicts[i] = bool(verdict)
    return verdicts


@no_grad
def text_passkey_verdicts(ctx: EvalContext, examples: Sequence[PasskeyExample]) -> list[bool]:
    """Verdicts on text, for a subword tokenizer (``ctx.tokenizer``): greedy decoding (the model's
    ``generate_greedy``, KV cache) of ``len(answer_ids) + 2`` tokens after each prompt (+ 1 where
    a learned position table ends), decoded
    and judged in context by :func:`generated_answer_matches` (the answer text, then no digit).
    Prompts of equal length batch together."""
    verdicts = [False] * len(examples)
    for length, indices in _groups(examples, lambda e: len(e.prompt_ids)).items():
        step = ctx.rows_per_batch(length)
        for start in range(0, len(indices), step):
            chunk = indices[start : start + step]
            prompts = torch.tensor([examples[i].prompt_ids for i in chunk], device=ctx.device)
            new = max(len(examples[i].answer_ids) for i in chunk) + 2
            if ctx.position_range_error(length + new - 2, length + new - 1) is not None:
                new -= 1  # at a learned table's end: the answer and the token after it only
            with ctx.autocast():
                generated = ctx.model.generate_greedy(prompts, max_new_tokens=new).cpu()
            for i, row in zip(chunk, generated.tolist(), strict=True):
                verdicts[i] = generated_answer_matches(ctx.tokenizer, examples[i], row)
    return verdicts


#: Prompt tokens decoded before the generated ones, so that they decode in context.
CONTEXT_TOKENS = 16


def decode_in_context(tokenizer, prompt_ids: Sequence[int], generated: Sequence[int]) -> str | None:
    """The text of ``generated`` as it reads after the prompt: the prompt's last
    :data:`CONTEXT_TOKENS` tokens and the generated ones decoded together, minus the text of the
    prompt tokens alone; None where that text is not a prefix of the joint one (a tokenizer that
    rewrites across the boundary)."""
    kw = {"skip_special_tokens": True, "clean_up_tokenization_spaces": False}
    tail = list(prompt_ids[-CONTEXT_TOKENS:])
    before = tokenizer.decode(tail, **kw)
    whole = tokenizer.decode(tail + list(generated), **kw)
    return whole[len(before) :] if whole.startswith(before) else None


def generated_answer_matches(tokenizer, example: PasskeyExample, generated: Sequence[int]) -> bool:
    """Whether ``generated`` (the tokens after ``example``'s prompt) is the key, then no digit.

    The generation is decoded in context: the prompt's last :data:`CONTEXT_TOKENS` tokens and the
    generated ones together, minus the text of the prompt tokens alone. Decoded alone, a
    SentencePiece (Metaspace) tokenizer drops the space that starts " 1234", so a perfect model
    would score 0. Where the prompt's text is not a prefix of the joint text (a tokenizer that
    rewrites across the boundary), the verdict is on token ids: the answer's tokens, then a token
    whose text in context does not start with a digit.
    """
    generated = [int(t) for t in generated]
    text = decode_in_context(tokenizer, example.prompt_ids, generated)
    if text is not None:
        return answer_matches(text, example.answer_text)
    kw = {"skip_special_tokens": True, "clean_up_tokenization_spaces": False}
    tail = list(example.prompt_ids[-CONTEXT_TOKENS:])
    answer = list(example.answer_ids)
    if generated[: len(answer)] != answer:
        return False
    context = tail + answer
    after = tokenizer.decode(context + generated[len(answer) :], **kw)
    rest = after[len(tokenizer.decode(context, **kw)) :]
    return not rest[:1].isdigit()


def corpus_filler_source(
    docs: Sequence[Document], length: int, metric: str = "passkey"
) -> np.ndarray:
    """Test-document text for ``filler: corpus`` (of ``metric``), capped so that each example
    copies little."""
    budget = max(8 * int(length), 1 << 16)
    parts, total = [], 0
    for doc in docs:
        parts.append(np.asarray(doc.tokens[: budget - total], dtype=np.int64))
        total += parts[-1].size
        if total >= budget:
            break
    if total == 0:
        raise ValueError(f"{metric} filler 'corpus' needs test documents, but none were given.")
    return np.concatenate(parts)


def passkey_rows(
    ctx: EvalContext,
    length: int,
    *,
    depths: Sequence[float],
    trials: int,
    seed: int,
    filler: str = "standard",
    docs: Sequence[Document] = (),
    template: str = DEFAULT_TEMPLATE,
) -> list[dict]:
    """``passkey_acc`` rows at one eval length: one per depth (axis="depth") and one overall.

    Lengths below the template's minimum are skipped with a logged warning (no rows).
    """
    examples = _length_examples(
        ctx,
        length,
        depths=depths,
        trials=trials,
        seed=seed,
        filler=filler,
        docs=docs,
        template=template,
    )
    if examples is None:
        return []
    verdicts = _batched_verdicts(ctx, examples, length)
    return _accuracy_rows([e.depth for e in examples], verdicts, length, template)


def _length_examples(
    ctx: EvalContext,
    length: int,
    *,
    depths: Sequence[float],
    trials: int,
    seed: int,
    filler: str,
    docs: Sequence[Document],
    template: str,
) -> list[PasskeyExample] | None:
    """The passkey grid at one eval length; None (with a logged warning) where it is skipped."""
    tok = ctx.tokenizer
    minimum = min_passkey_length(template=template)
    if tok is None and length < minimum:
        logger.warning(
            "passkey at eval length %d skipped: the passkey template needs at least %d tokens.",
            length,
            minimum,
        )
        return None
    source = corpus_filler_source(docs, length) if filler == "corpus" else None
    if tok is not None and source is not None:
        source = tok.decode(source.tolist(), skip_special_tokens=True)
    try:
        examples = passkey_grid(
            [length], depths, trials, seed, tok, filler, source, template=template
        )
    except ValueError as exc:
        if tok is None:
            raise
        logger.warning("passkey at eval length %d skipped: %s", length, exc)
        return None
    off = sum(e.length != length for e in examples)
    if off:
        logger.warning(
            "passkey at eval length %d: %d of %d examples have fewer tokens (no filler length "
            "gives exactly %d tokens with this tokenizer).",
            length,
            off,
            len(examples),
            length,
        )
    return examples


def _batched_verdicts(
    ctx: EvalContext, examples: Sequence[PasskeyExample], length: int
) -> list[bool]:
    """Verdicts in the order of ``examples``: teacher-forced on byte tokens, greedy on text."""
    verdicts = []
    with ctx.bar(len(examples), f"passkey L={length}", unit="ex") as bar:
        step = max(1, ctx.rows_per_batch(length))
        for start in range(0, len(examples), step):
            chunk = examples[start : start + step]
            if ctx.tokenizer is None:
                verdicts += passkey_verdicts(ctx.model, chunk, step, ctx.device, ctx=ctx)
            else:
                verdicts += text_passkey_verdicts(ctx, chunk)
            bar.update(len(chunk))
    return verdicts


def _accuracy_rows(
    depths: Sequence[float], verdicts: list[bool], length: int, template: str
) -> list[dict]:
    """One ``passkey_acc`` row per depth (of each trial, ``depths``), then one over every depth
    (axis "template")."""
    by_depth: dict[float, list[bool]] = defaultdict(list)
    for depth, verdict in zip(depths, verdicts, strict=True):
        by_depth[depth].append(verdict)
    # every row names the template it measured (two templates on one model never collide); the
    # per-length row has it as its axis too (axis "template")
    template_name = template if isinstance(template, str) else template.name
    rows = [
        make_row(
            "passkey_acc",
            np.mean(v),
            len(v),
            length,
            axis="depth",
            axis_value=float(depth),
            template=template_name,
        )
        for depth, v in sorted(by_depth.items())
    ]
    rows.append(
        make_row(
            "passkey_acc",
            np.mean(verdicts),
            len(verdicts),
            length,
            axis="template",
            axis_value=template_name,
            template=template_name,
        )
    )
    return rows


def passkey_context(accuracy: Mapping[int, float], threshold: float) -> int:
    """The largest tested length whose accuracy is >= ``threshold``; 0 if none.

    YaRN's definition: the largest passing length, even if a shorter one failed.
    """
    return int(max((length for length, acc in accuracy.items() if acc >= threshold), default=0))


def passkey_context_row(accuracy: Mapping[int, float], threshold: float) -> dict | None:
    """The ``passkey_context`` row of a run's per-length accuracies; None when none was tested.

    ``eval_length`` and ``value`` are the passkey context (0 if none), ``n`` the number of lengths
    tested, ``axis="threshold"`` with the threshold as ``axis_value``.
    """
    if not accuracy:
        return None
    context = passkey_context(accuracy, threshold)
    return make_row(
        "passkey_context",
        context,
        len(accuracy),
        context,
        axis="threshold",
        axis_value=float(threshold),
    )
