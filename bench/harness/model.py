"""``LenbenchLM``: a lenbench ``DecoderLM`` as the lm-eval model ``lenbench``.

Requests are batched only with others of the same token length, so no padding ever changes a
result and length-dependent scaling methods see each sequence's true length. A static
``factor: auto`` is set once, as lenbench's own metrics set it: for ``eval_length`` (or the
scaling's ``target_length``), else for the longest request; ``oracle=true`` sets it for each
request's length instead. Tokens are UTF-8 bytes; contexts are never truncated.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

import lm_eval.models  # noqa: F401  (fills lm-eval's lazy model table before we register ours)
import numpy as np
import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from torch import nn

from bench.core.progress import progress_bar
from bench.core.runtime import autocast, resolve_device
from bench.data.tokenizer import ByteTokenizer
from bench.harness.args import batch_rows, optional_length, parse_scaling, positive_int
from models.transformer import ScalingConfig

MODEL_NAME = "lenbench"
PREFIX_TOKENS = ("eos", "bos")
DEFAULT_MAX_GEN_TOKS = 256
DEFAULT_MAX_BATCH_TOKENS = 32768

_TOKENIZER = ByteTokenizer()


def _load_model(ref: Any, cache_root: Any, device: torch.device) -> tuple[nn.Module, dict]:
    if isinstance(ref, nn.Module):
        return ref, {"key": None, "train_length": int(ref.train_length)}
    if ref is None or str(ref).strip() == "":
        raise ValueError(
            "model argument pretrained is missing; give a checkpoint cache key or path."
        )
    from bench.train.checkpoints import load_model

    return load_model(str(ref), cache_root=cache_root, device=str(device))


@register_model(MODEL_NAME)
class LenbenchLM(LM):
    """lm-eval model over a lenbench ``DecoderLM``; arguments as ``--model_args`` (README).

    ``pretrained`` is a checkpoint cache key, a checkpoint path or a ``DecoderLM``; ``scaling``,
    ``scaling_name``, ``logn``, ``oracle`` and any further keyword (a parameter of the scaling
    method) go to :func:`bench.harness.args.parse_scaling`. ``eval_length`` is the length a
    static ``factor: auto`` is set for (default: the longest request; not with ``oracle``).
    """

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        """lm-eval's CLI passes ``--device`` / ``--batch_size`` as ``additional_config`` next to
        ``--model_args``; an argument given in ``--model_args`` wins (lm-eval's own merge passed
        both and failed with "got multiple values")."""
        from lm_eval import utils

        return cls.create_from_arg_obj(
            utils.simple_parse_args_string(arg_string), additional_config
        )

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        """As :meth:`create_from_arg_string`, for ``--model_args`` lm-eval parsed itself."""
        args = dict(arg_dict)
        extra = {
            k: v for k, v in (additional_config or {}).items() if v is not None and k not in args
        }
        return cls(**args, **extra)

    def __init__(
        self,
        pretrained: Any = None,
        cache_root: str | None = None,
        scaling: Any = None,
        scaling_name: str | None = None,
        config_dir: str | None = None,
        logn: Any = False,
        oracle: Any = False,
        eval_length: Any = None,
        max_length: Any = None,
        prefix_token: str = "eos",
        precision: str = "fp32",
        batch_size: Any = 1,
        max_batch_size: Any = None,
        max_batch_tokens: Any = DEFAULT_MAX_BATCH_TOKENS,
        device: Any = None,
        **scaling_params: Any,
    ) -> None:
        super().__init__()
        self.scaling = parse_scaling(
            scaling,
            logn=logn,
            name=scaling_name,
            oracle=oracle,
            config_dir=config_dir,
            **scaling_params,
        )
        if prefix_token not in PREFIX_TOKENS:
            raise ValueError(
                f"prefix_token {prefix_token!r} is unknown; allowed: {', '.join(PREFIX_TOKENS)}."
            )
        self._device = torch.device(resolve_device(device))
        autocast(self._device, precision)  # an unknown precision fails here, not mid-evaluation
        self.eval_length = optional_length(eval_length, "eval_length")
        self._max_length = optional_length(max_length, "max_length")
        self.batch_rows = batch_rows(batch_size, max_batch_size)
        self.max_batch_tokens = optional_length(max_batch_tokens, "max_batch_tokens")
        self.precision = precision
        self.tokenizer = _TOKENIZER
        self.prefix_token_id = _TOKENIZER.EOS if prefix_token == "eos" else _TOKENIZER.BOS
        self.model, self.meta = _load_model(pretrained, cache_root, self._device)
        self.model.to(self._device).eval()
        self.train_length = int(getattr(self.model, "train_length", self.meta.get("train_length")))
        trained = self.meta.get("scaling")  # a fine-tuned checkpoint's scaling, as trained
        if trained:
            if self.scaling is not None:
                raise ValueError(
                    f"checkpoint {pretrained} was fine-tuned with scaling {trained.get('name')!r} "
                    "and is evaluated with it; drop the scaling arguments."
                )
            self.scaling = ScalingConfig(**trained)
        self._auto_factor = self.scaling is not None and self.scaling.auto_factor
        if self._auto_factor and self.eval_length:
            if self.scaling.oracle:
                raise ValueError(
                    f"eval_length={self.eval_length} sets one factor for every request and "
                    "oracle=true one per request length; give one of them."
                )
            self.scaling = replace(self.scaling, target_length=self.eval_length)
        self._scaling_len: int | None = None
        # validates the method and its parameters against the model now, not mid-evaluation
        self.model.set_scaling(self.scaling, self.eval_length or self.train_length)

    # -- lm-eval API surface ---------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return _TOKENIZER.EOS

    @property
    def max_length(self) -> int | None:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return DEFAULT_MAX_GEN_TOKS

    def tok_encode(self, string: str, **_: Any) -> list[int]:
        return _TOKENIZER.encode(string)

    def tok_decode(self, tokens: Iterable[int], **_: Any) -> str:
        return _TOKENIZER.decode(tokens)

    def get_model_info(self) -> dict:
        return {
            "lenbench_key": self.meta.get("key"),
            "train_length": self.train_length,
            "position": getattr(getattr(self.model, "position_cfg", None), "kind", None),
            "scaling": asdict(self.scaling) if self.scaling is not None else None,
            "max_length": self._max_length,
            "eval_length": self.eval_length,
            "prefix_token_id": self.prefix_token_id,
        }

    # -- helpers ---------------------------------------------------------------------

    def _rows_per_batch(self, length: int) -> int:
        rows = self.batch_rows
        if self.max_batch_tokens:
            rows = min(rows, self.max_batch_tokens // max(length, 1))
        return max(1, rows)

    def _scaling_length(self, doc: Any, n_input: int, whole: bool = True) -> int:
        """A request's own length: the document's ``eval_length`` (the task's length) when the
        request is read whole, else the number of tokens the model reads (n_input)."""
        if not self._auto_factor:
            return n_input
        doc_length = doc.get("eval_length") if isinstance(doc, Mapping) else None
        if whole and isinstance(doc_length, (int, np.integer)) and doc_length >= n_input:
            return int(doc_length)
        return n_input

    def _factor_lengths(self, lengths: list[int]) -> list[int]:
        """The length each request's ``factor: auto`` is set for, given the requests' own lengths:
        each its own with ``oracle``; else one for all, the scaling's ``target_length`` (set from
        ``eval_length``) or the longest request of the call (lm-eval hands every request of one
        kind to one call)."""
        if not self._auto_factor or self.scaling.oracle:
            return lengths
        target = self.scaling.target_length or max(lengths, default=self.train_length)
        return [target] * len(lengths)

    def _with_factor_lengths(
        self, items: list[tuple[list[int], list[int], int]]
    ) -> list[tuple[list[int], list[int], int]]:
        """(context, continuation, own length) items with the own length made the factor length."""
        lengths = self._factor_lengths([length for _, _, length in items])
        return [(c, k, n) for (c, k, _), n in zip(items, lengths, strict=True)]

    def _use_scaling_length(self, length: int) -> None:
        if self._auto_factor and length != self._scaling_len:
            self.model.set_scaling(self.scaling, length)
            self._scaling_len = length

    def _check_length(self, n_tokens: int, what: str) -> None:
        if self._max_length is not None and n_tokens > self._max_length:
            raise ValueError(
                f"a {what} of {n_tokens} tokens exceeds max_length {self._max_length}; lenbench never "
                "truncates contexts: raise max_length (model_args) or evaluate shorter lengths."
            )

    @torch.no_grad()
    def _score(
        self, items: Sequence[tuple[list[int], list[int], int]], desc: str
    ) -> list[tuple[float, bool]]:
        """(sum log p(continuation | context), is_greedy) for (context_ids, continuation_ids, scaling_len).

        The model reads ``(context + continuation)[:-1]``; requests are batched only with others of
        the same input length and scaling length, so no padding is ever needed.
        """
        results: list[tuple[float, bool] | None] = [None] * len(items)
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for i, (context, continuation, scaling_len) in enumerate(items):
            if not continuation:
                results[i] = (0.0, True)
                continue
            n_input = len(context) + len(continuation) - 1
            self._check_length(n_input, "context + continuation")
            groups[(n_input, scaling_len)].append(i)
        for n_input, chunk in self._batches(groups, desc, disable=len(items) < 2):
            whole = torch.tensor([items[i][0] + items[i][1] for i in chunk], dtype=torch.long)
            span = max(len(items[i][1]) for i in chunk)
            with autocast(self._device, self.precision):
                # the continuation's logits only: no [B, n_input, V] tensor for a long context
                logits = self.model(
                    whole[:, :-1].to(self._device), logits_from=n_input - span
                ).logits[:, -span:]  # [B, span, V]
            logprobs = torch.log_softmax(logits.float(), dim=-1).cpu()  # [B, span, V]
            targets = whole[:, -span:]  # [B, span]
            picked = logprobs.gather(-1, targets[..., None])[..., 0].double()  # [B, span]
            greedy = logprobs.argmax(dim=-1) == targets  # [B, span]
            for row, i in enumerate(chunk):
                c = len(items[i][1])
                results[i] = (
                    float(picked[row, span - c :].sum()),
                    bool(greedy[row, span - c :].all()),
                )
        return results  # type: ignore[return-value]

    def _batches(
        self, groups: Mapping[tuple[int, int], list[int]], desc: str, disable: bool
    ) -> Iterator[tuple[int, list[int]]]:
        """(input length, request indices) batches of the groups {(input length, scaling length):
        indices}, longest first, with the model's scaling switched to each group's scaling length
        and a progress bar that counts a batch once the caller is done with it."""
        bar = progress_bar(
            total=sum(len(v) for v in groups.values()), desc=desc, disable=disable, leave=False
        )
        try:
            for (length, scaling_len), indices in sorted(groups.items(), reverse=True):
                self._use_scaling_length(scaling_len)
                step = self._rows_per_batch(length)
                for start in range(0, len(indices), step):
                    chunk = indices[start : start + step]
                    yield length, chunk
                    bar.update(len(chunk))
        finally:
            bar.close()

    # -- requests ----------------------------------------------------------------------

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """Sum log-probability of each continuation's bytes given its context, and is_greedy.

        The continuation's own bytes are scored (no moving of spaces between context and
        continuation: bytes need no word-boundary trick); an empty context becomes the prefix token.
        """
        items = []
        for req in requests:
            context, continuation = req.args[0], req.args[1]
            ctx_ids = self.tok_encode(context) or [self.prefix_token_id]
            cont_ids = self.tok_encode(continuation)
            n_input = len(ctx_ids) + len(cont_ids) - 1
            items.append((ctx_ids, cont_ids, self._scaling_length(req.doc, n_input)))
        results = self._score(self._with_factor_lengths(items), "loglikelihood")
        for req, result in zip(requests, results, strict=True):
            self.cache_hook.add_partial("loglikelihood", req.args, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of each whole text: every byte is scored once, the first given the prefix token.

        Without ``max_length`` a text is read in one forward pass; with it, in lm-eval's rolling
        windows (``get_rolling_token_windows`` + ``make_disjoint_window``) of ``max_length`` tokens.
        """
        items, owner = [], []
        for r, req in enumerate(requests):
            tokens = self.tok_encode(req.args[0])
            if not tokens:
                continue
            windows = [
                make_disjoint_window(w)
                for w in get_rolling_token_windows(
                    token_list=tokens,
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self._max_length or len(tokens),
                    context_len=1,
                )
            ]
            for context, continuation in windows:
                n_input = len(context) + len(continuation) - 1
                items.append(
                    (
                        context,
                        continuation,
                        self._scaling_length(req.doc, n_input, len(windows) == 1),
                    )
                )
                owner.append(r)
        totals = [0.0] * len(requests)
        scored = self._score(self._with_factor_lengths(items), "loglikelihood_rolling")
        for r, (logprob, _) in zip(owner, scored, strict=True):
            totals[r] += logprob
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    @staticmethod
    def _generation_settings(gen_kwargs: Mapping | None) -> tuple[list[str], int]:
        kwargs = dict(gen_kwargs or {})
        until = kwargs.pop("until", None) or []
        if isinstance(until, str):
            until = [until]
        if not isinstance(until, (list, tuple)) or not all(isinstance(s, str) for s in until):
            raise ValueError(
                f"generation 'until' {until!r} is invalid; allowed: a string or a list of strings."
            )
        max_gen = kwargs.pop("max_gen_toks", DEFAULT_MAX_GEN_TOKS)
        max_gen = positive_int(max_gen, "max_gen_toks")
        if kwargs.get("do_sample") or float(kwargs.get("temperature") or 0.0) > 0.0:
            raise ValueError(
                f"generation kwargs {kwargs!r} ask for sampling; the lenbench model decodes greedily only "
                "(allowed: do_sample false, temperature 0)."
            )
        return [s for s in until if s], max_gen

    @staticmethod
    def _cut(text: str, until: Sequence[str]) -> str:
        for stop in until:
            text = text.split(stop)[0]
        return text

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuation of each context, cut before the first stop string.

        A row stops at EOS, at a stop string or after ``max_gen_toks``. Length-dependent scaling
        (``dynamic``, ``longrope``) is frozen at the prompt length when the cache fills; log-n
        scales each new token's query at its own position.
        """
        prepared, own_lengths = [], []
        for req in requests:
            context, gen_kwargs = req.args[0], req.args[1]
            until, max_gen = self._generation_settings(gen_kwargs)
            ids = self.tok_encode(context) or [self.prefix_token_id]
            self._check_length(len(ids), "generation context")
            prepared.append((ids, until, max_gen))
            own_lengths.append(self._scaling_length(req.doc, len(ids)))
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for i, scaling_len in enumerate(self._factor_lengths(own_lengths)):
            groups[(len(prepared[i][0]), scaling_len)].append(i)
        outputs: list[str | None] = [None] * len(requests)
        disable = disable_tqdm or len(requests) < 2
        for _length, chunk in self._batches(groups, "generate_until", disable):
            texts = self._generate([prepared[i] for i in chunk])
            for i, text in zip(chunk, texts, strict=True):
                outputs[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return outputs  # type: ignore[return-value]

    @torch.no_grad()
    def _generate(self, batch: Sequence[tuple[list[int], list[str], int]]) -> list[str]:
        """Greedy decoding with the KV cache for equal-length prompts; per-row stops."""
        ids = torch.tensor([p for p, _, _ in batch], dtype=torch.long, device=self._device)
        generated: list[list[int]] = [[] for _ in batch]
        done = [False] * len(batch)
        with autocast(self._device, self.precision):  # the prompt's last logits only
            out = self.model(ids, use_cache=True, logits_from=ids.shape[1] - 1)
        for _ in range(max(m for _, _, m in batch)):
            next_tokens = out.logits[:, -1].argmax(dim=-1)  # [B]
            for row, token in enumerate(next_tokens.tolist()):
                if done[row]:
                    continue
                until, max_gen = batch[row][1], batch[row][2]
                if token == _TOKENIZER.EOS:
                    done[row] = True
                    continue
                generated[row].append(token)
                if len(generated[row]) >= max_gen or (
                    until and any(stop in _TOKENIZER.decode(generated[row]) for stop in until)
                ):
                    done[row] = True
            if all(done):
                break
            with autocast(self._device, self.precision):
                out = self.model(next_tokens[:, None], past=out.past, use_cache=True)
        return [
            self._cut(_TOKENIZER.decode(g), until)
            for g, (_, until, _) in zip(generated, batch, strict=True)
        ]
