"""Passkey retrieval scoring: teacher-forced verdicts, greedy verdicts, and result rows.

A verdict is exact match of the whole key: the model must produce every answer token
(" " followed by the key's digits). Teacher forcing does this in one batched forward pass of
prompt + answer: the verdict is True iff the argmax at each answer position equals the answer
token. That is the same decision as greedy decoding of ``len(answer)`` tokens (greedy can only
stay on the answer if each argmax matches, given the answer so far), which
:func:`greedy_passkey_verdicts` computes with the KV cache so the two can be cross-checked.
The template marks no end of key, so neither checks what would follow the last digit.

Examples of the same length (a passkey grid cell's length) batch together without padding.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from bench.corpora import Document
from bench.passkey import PasskeyExample, min_passkey_length, passkey_grid
from bench.probes import EvalContext

__all__ = ["greedy_passkey_verdicts", "passkey_context_row", "passkey_rows", "passkey_verdicts"]

logger = logging.getLogger(__name__)


def _groups(examples: Sequence[PasskeyExample], key) -> dict:
    groups: dict = defaultdict(list)
    for i, example in enumerate(examples):
        groups[key(example)].append(i)
    return groups


def _context(model, batch_size: int, device, ctx: EvalContext | None) -> EvalContext:
    if ctx is not None:
        return ctx
    return EvalContext(model, device=device, batch_size=int(batch_size), progress=False)


@torch.no_grad()
def passkey_verdicts(
    model: nn.Module,
    examples: Sequence[PasskeyExample],
    batch_size: int,
    device: str | torch.device = "cpu",
    ctx: EvalContext | None = None,
) -> list[bool]:
    """Teacher-forced exact-match verdicts, in the order of ``examples``.

    One forward pass of ``prompt + answer`` per batch of equal-length examples; the answer sits at
    the end of every example, so the predictions for it are the logits at positions
    ``L - 1 - len(answer) .. L - 2``.
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
            logits = ctx.forward(ids).logits  # [B, L, V]
            predicted = logits[:, length - 1 - span : length - 1].argmax(dim=-1).cpu()  # [B, A]
            targets = ids[:, length - span :]
            in_answer = torch.arange(span)[None, :] >= (span - answer_lens)[:, None]
            ok = ((predicted == targets) | ~in_answer).all(dim=1)
            for i, verdict in zip(indices[start : start + step], ok.tolist(), strict=True):
                verdicts[i] = bool(verdict)
    return verdicts


@torch.no_grad()
def greedy_passkey_verdicts(
    model: nn.Module,
    examples: Sequence[PasskeyExample],
    batch_size: int,
    device: str | torch.device = "cpu",
) -> list[bool]:
    """Verdicts from ``model.generate_greedy`` (KV cache): the generated tokens equal the answer."""
    verdicts = [False] * len(examples)
    groups = _groups(examples, lambda e: (len(e.prompt_ids), len(e.answer_ids)))
    for (_, answer_len), indices in groups.items():
        for start in range(0, len(indices), int(batch_size)):
            chunk = indices[start : start + int(batch_size)]
            prompts = torch.tensor([examples[i].prompt_ids for i in chunk], device=device)
            generated = model.generate_greedy(prompts, max_new_tokens=answer_len).cpu()
            answers = torch.tensor([examples[i].answer_ids for i in chunk])
            for i, verdict in zip(chunk, (generated == answers).all(dim=1).tolist(), strict=True):
                verdicts[i] = bool(verdict)
    return verdicts


def _filler_source(docs: Sequence[Document], length: int) -> np.ndarray:
    """Test-document text for ``filler: corpus``, capped so that each example copies little."""
    budget = max(8 * int(length), 1 << 16)
    parts, total = [], 0
    for doc in docs:
        parts.append(np.asarray(doc.tokens[: budget - total], dtype=np.int64))
        total += parts[-1].size
        if total >= budget:
            break
    if total == 0:
        raise ValueError("passkey filler 'corpus' needs test documents, but none were given.")
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
) -> list[dict]:
    """``passkey_acc`` rows at one eval length: one per depth (axis="depth") and one overall.

    Lengths below the template's minimum are skipped with a logged warning (no rows).
    """
    minimum = min_passkey_length()
    if length < minimum:
        logger.warning(
            "passkey at eval length %d skipped: the passkey template needs at least %d tokens.",
            length,
            minimum,
        )
        return []
    source = _filler_source(docs, length) if filler == "corpus" else None
    examples = passkey_grid([length], depths, trials, seed, filler=filler, filler_source=source)
    verdicts = []
    with ctx.bar(len(examples), f"passkey L={length}", unit="ex") as bar:
        step = max(1, ctx.rows_per_batch(length))
        for start in range(0, len(examples), step):
            chunk = examples[start : start + step]
            verdicts += passkey_verdicts(ctx.model, chunk, step, ctx.device, ctx=ctx)
            bar.update(len(chunk))
    by_depth: dict[float, list[bool]] = defaultdict(list)
    for example, verdict in zip(examples, verdicts, strict=True):
        by_depth[example.depth].append(verdict)
    rows = [
        {
            "metric": "passkey_acc",
            "value": float(np.mean(v)),
            "n": len(v),
            "eval_length": int(length),
            "axis": "depth",
            "axis_value": float(depth),
        }
        for depth, v in sorted(by_depth.items())
    ]
    rows.append(
        {
            "metric": "passkey_acc",
            "value": float(np.mean(verdicts)),
            "n": len(verdicts),
            "eval_length": int(length),
        }
    )
    return rows


def passkey_context_row(accuracy: dict[int, float], threshold: float) -> dict | None:
    """``passkey_context``: the largest tested length with accuracy >= threshold (0 if none).

    YaRN's definition (the largest passing length, even if a shorter one failed). As in
    ``bench.results.passkey_context``, ``eval_length`` and ``value`` are that length (0 if none);
    ``n`` is the number of lengths tested. None when no length was tested.
    """
    if not accuracy:
        return None
    passed = [length for length, acc in accuracy.items() if acc >= threshold]
    context = int(max(passed, default=0))
    return {
        "metric": "passkey_context",
        "value": float(context),
        "n": len(accuracy),
        "eval_length": context,
    }
