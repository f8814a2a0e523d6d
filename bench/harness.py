"""EleutherAI lm-evaluation-harness adapter: a ``lenbench`` model class, local tasks, a CLI.

Importing this module registers the model ``lenbench`` with lm-eval (0.4.x has no plugin
discovery, so ``lenbench-harness`` imports it and then hands over to lm-eval's own CLI, adding
``--include_path`` for the tasks shipped in ``bench/harness_tasks``)::

    lenbench-harness --model lenbench \\
        --model_args pretrained=<cache key or checkpoint path>,scaling=yarn \\
        --tasks lenbench_passkey,lenbench_ppl_1024 --batch_size 8 --device cpu

Model arguments (``--model_args`` is ``key=value,...``; lm-eval converts numbers and booleans):

``pretrained``
    a checkpoint cache key (looked up under ``cache_root``, default ``$LENBENCH_CACHE`` or
    ``~/.cache/lenbench/checkpoints``), a checkpoint directory / ``model.pt`` path, or (Python
    only) a ``DecoderLM`` instance.
``scaling``
    eval-time context extension, as lenbench's ``scaling=<name>``: a config of ``conf/scaling``
    (``none`` (default, the raw model), ``linear``, ``ntk``, ``dynamic``, ``yarn``, ``llama3``,
    ``longrope``, ``logn``; e.g. ``yarn`` brings ``factor: auto``), or any method registered in
    ``models.scaling``. Further model arguments named as the method's parameters (transformers'
    names: ``factor=4``, ``beta_fast=32``, ``alpha=2``; ``short_factor``/``long_factor`` as a
    number, ``ramp`` or colon-separated numbers ``1.0:1.2:...``) override the preset's;
    ``logn=true`` adds log-n scaling to any method; ``scaling_name`` sets the label. From Python,
    ``scaling`` may also be a ``ScalingConfig`` or a mapping ``{name, method, params, logn}``.
``factor=auto`` (or ``alpha=auto``)
    resolves to ``eval_length / train_length`` (>= 1) as in lenbench's own evaluation, against
    the first of: the ``eval_length`` model argument; the ``eval_length`` field of the request's
    document (every lenbench task has one: the task's length, which makes the harness match the
    native evaluation exactly); the number of tokens the model reads for the request.
``max_length``
    longest input (tokens) of one forward pass. Default: no limit, so every request is read in
    one piece, which is what a length-extrapolation benchmark measures. When set, perplexity
    requests are split into lm-eval's rolling windows of ``max_length`` tokens, and a
    loglikelihood or generation request whose context is longer raises ``ValueError``: contexts
    are never truncated silently. Generated tokens are not counted against it.
``prefix_token``
    ``eos`` (default) or ``bos``: the token that conditions the first byte of a rolling
    (perplexity) request and an empty loglikelihood context. lenbench trains on documents joined
    by EOS, so EOS is what precedes a document in training; BOS never occurs in training data.
``precision``, ``batch_size``, ``max_batch_size``, ``max_batch_tokens``, ``device``
    ``fp32``/``bf16`` (autocast, as the native evaluation); rows per forward pass (``auto`` means
    ``max_batch_size``, default 64), capped so that a batch holds at most ``max_batch_tokens``
    tokens (default 32768, the native default); a CUDA device falls back to CPU when CUDA is
    absent.

Batches hold requests of equal token length only (lm-eval's tasks here have one length per task),
so no padding ever changes a result and length-dependent methods (``dynamic``, ``longrope``,
``logn``) see each sequence's true length. Tokens are UTF-8 bytes (``bench.tokenizer``).

``generate_until`` decodes greedily with the KV cache, stops a row at EOS, at any of the task's
``until`` strings (the returned text is cut before the first one) or after ``max_gen_toks``.
With ``dynamic``/``longrope``/``logn`` the length-dependent part is frozen at the prompt length
when the cache is filled, while the native teacher-forced passkey reads prompt + answer (a few
tokens more): for those methods the two can differ slightly; static methods match exactly.

Tasks (``bench/harness_tasks``; data generated locally, no downloads; see the YAML files):

* ``lenbench_passkey_<L>`` (group ``lenbench_passkey``), L in 256, 512, ..., 16384: the passkey
  prompts of ``bench.passkey.passkey_grid([L], depths, trials, seed)`` as plain text, greedy
  generation. Metrics: ``acc`` = the generation starts with the answer ``" <key>"`` (for a
  lenbench model the same verdict as the native teacher-forced ``passkey_acc``), ``acc_parsed``
  = the first integer of the generation is the key (``bench.passkey.parse_passkey``; tolerant of
  tokenizers that drop the leading space, rejects extra digits).
* ``lenbench_ppl_<L>`` (group ``lenbench_ppl``): the first L bytes of held-out corpus documents
  (``metadata.data``, default pycorpus, split ``test``), ``loglikelihood_rolling``; metrics
  ``word_perplexity``, ``byte_perplexity``, ``bits_per_byte``.

Both are plain text, so lm-eval's ``hf`` model runs them too (with its own tokenizer).
From Python: :func:`run_harness` (``lm_eval.simple_evaluate``) and :func:`harness_rows` (lm-eval
results -> lenbench result rows).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lm_eval.models  # noqa: F401  (fills the registry's lazy table first; see _register)
import numpy as np
import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from torch import nn
from tqdm.auto import tqdm

from bench.config import plain
from bench.passkey import ANSWER_TEMPLATE, parse_passkey, passkey_grid
from bench.probes import PRECISIONS
from bench.tokenizer import ByteTokenizer
from models.scaling import SCALING_METHODS
from models.transformer import ScalingConfig

__all__ = [
    "MODEL_NAME",
    "TASKS_DIR",
    "LenbenchLM",
    "harness_rows",
    "main",
    "parse_scaling",
    "scaling_presets",
    "passkey_dataset",
    "passkey_docs",
    "passkey_process_results",
    "perplexity_dataset",
    "perplexity_docs",
    "run_harness",
    "task_names",
]

logger = logging.getLogger(__name__)

MODEL_NAME = "lenbench"
TASKS_DIR = Path(__file__).resolve().parent / "harness_tasks"
PREFIX_TOKENS = ("eos", "bos")
DEFAULT_MAX_GEN_TOKS = 256
DEFAULT_MAX_BATCH_SIZE = 64
DEFAULT_MAX_BATCH_TOKENS = 32768
LIST_PARAMS = ("short_factor", "long_factor")

_TOKENIZER = ByteTokenizer()


# --------------------------------------------------------------------------- task data


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


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 1:
        raise ValueError(f"{what} {value!r} is invalid; allowed: an integer >= 1.")
    return int(value)


def passkey_docs(
    length: int,
    depths: Any = 10,
    trials: int = 10,
    seed: int = 0,
    filler: str = "standard",
    **_: Any,
) -> list[dict]:
    """One document per example of ``passkey_grid([length], depths, trials, seed)``.

    Fields: ``prompt`` (the prompt bytes as text), ``answer`` (``" <key>"``), ``key``, ``depth``,
    ``trial``, ``eval_length`` (= length, prompt + answer in bytes). Extra keyword arguments (lm-eval
    passes every metadata key to every task) are ignored.
    """
    if filler != "standard":
        raise ValueError(
            f"harness passkey filler {filler!r} is not supported; allowed: standard (corpus "
            "filler bytes need not be valid UTF-8 text, which lm-eval prompts must be)."
        )
    length = _positive_int(length, "passkey length")
    examples = passkey_grid(
        [length], _depth_list(depths), _positive_int(trials, "passkey trials"), int(seed)
    )
    docs = []
    for example in examples:
        prompt = bytes(example.prompt_ids).decode("utf-8")
        answer = ANSWER_TEMPLATE.format(key=example.key)
        assert list(answer.encode()) == example.answer_ids
        docs.append(
            {
                "prompt": prompt,
                "answer": answer,
                "key": int(example.key),
                "depth": float(example.depth),
                "trial": int(example.trial),
                "eval_length": length,
            }
        )
    return docs


def passkey_dataset(**metadata: Any) -> dict:
    """lm-eval ``custom_dataset``: ``{"test": Dataset}`` of :func:`passkey_docs` (metadata as kwargs)."""
    import datasets

    return {"test": datasets.Dataset.from_list(passkey_docs(**metadata))}


def passkey_process_results(doc: Mapping, results: Sequence[str]) -> dict[str, int]:
    """Metrics of one passkey generation: ``acc`` (starts with the answer) and ``acc_parsed``."""
    generation = results[0]
    return {
        "acc": int(generation.startswith(doc["answer"])),
        "acc_parsed": int(parse_passkey(generation) == int(doc["key"])),
    }


def perplexity_docs(
    length: int,
    data: Mapping | None = None,
    split: str = "test",
    max_docs: int = 64,
    **_: Any,
) -> list[dict]:
    """The first ``length`` bytes of up to ``max_docs`` documents of ``split`` of corpus ``data``.

    ``data`` is a lenbench data config (default ``{"name": "pycorpus"}``, the held-out stdlib
    files). Documents shorter than ``length`` bytes, or whose first ``length`` bytes are not valid
    UTF-8 text, are skipped; the rest are picked evenly over the corpus order as the native
    evaluation does (``bench.probes.select_documents``). Fields: ``id``, ``text``, ``eval_length``.
    """
    from bench.corpora import load_corpus
    from bench.probes import select_documents

    length = _positive_int(length, "perplexity length")
    corpus = load_corpus(dict(data) if data is not None else {"name": "pycorpus"})
    eligible, texts = [], {}
    for doc in corpus.split(split):
        if len(doc) < length:
            continue
        try:
            texts[doc.id] = doc.tokens[:length].astype(np.uint8).tobytes().decode("utf-8")
        except UnicodeDecodeError:
            continue
        eligible.append(doc)
    selected, _ = select_documents(eligible, length, _positive_int(max_docs, "perplexity max_docs"))
    if not selected:
        raise ValueError(
            f"the {split} split of corpus {corpus.name} ({corpus.fingerprint}) has no document with "
            f"{length} bytes of valid UTF-8 text; use a shorter length or another corpus (metadata 'data')."
        )
    return [{"id": d.id, "text": texts[d.id], "eval_length": length} for d in selected]


def perplexity_dataset(**metadata: Any) -> dict:
    """lm-eval ``custom_dataset``: ``{"test": Dataset}`` of :func:`perplexity_docs`."""
    import datasets

    return {"test": datasets.Dataset.from_list(perplexity_docs(**metadata))}


# --------------------------------------------------------------------------- scaling arguments


def _method_param_names(method: str) -> set[str]:
    fn = SCALING_METHODS[method]
    return {
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def _coerce_param(key: str, value: Any) -> Any:
    """String-friendly parameter values: numbers, booleans, ``auto``/``ramp`` and ``a:b:c`` lists."""
    if key in LIST_PARAMS and isinstance(value, str) and ":" in value:
        try:
            return [float(v) for v in value.split(":") if v.strip()]
        except ValueError:
            raise ValueError(
                f"scaling parameter {key}={value!r} is invalid; allowed: a number, 'ramp' or "
                "colon-separated numbers such as 1.0:1.5:2.0."
            ) from None
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        try:
            return float(value)
        except ValueError:
            return lowered if lowered in ("auto", "ramp") else value
    return value


def scaling_presets() -> dict[str, dict]:
    """lenbench's scaling configs (``conf/scaling/<name>.yaml``) by name: name, method, params, logn."""
    import yaml

    try:
        import conf
    except ImportError:  # pragma: no cover - conf ships with the package
        return {}
    presets = {}
    for path in sorted((Path(conf.__file__).parent / "scaling").glob("*.yaml")):
        with path.open(encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
        if isinstance(data, dict) and "method" in data:
            presets[path.stem] = data
    return presets


def parse_scaling(
    scaling: Any = None, *, logn: Any = False, name: str | None = None, **params: Any
) -> ScalingConfig | None:
    """A ``ScalingConfig`` from string-friendly arguments (None = the raw model).

    ``scaling``: None/"none"; the name of a lenbench scaling config (``conf/scaling/<name>.yaml``:
    none, linear, ntk, dynamic, yarn, llama3, longrope, logn; the same presets as lenbench's
    ``scaling=<name>``, e.g. yarn has ``factor: auto``); else a method registered in
    ``models.scaling.SCALING_METHODS`` (its parameters then all come from ``params``); a
    ``ScalingConfig``; or a mapping with keys name/method/params/logn. ``params`` override the
    preset's and are checked against the method's signature here (values are checked when the
    model applies them). ``logn=True`` adds log-n scaling; ``name`` sets the results label.
    """
    logn = _coerce_param("logn", logn) if isinstance(logn, str) else bool(logn)
    if isinstance(scaling, ScalingConfig):
        if params or logn:
            raise ValueError(
                "scaling is a ScalingConfig; put its parameters and logn inside it, not beside it."
            )
        return scaling
    if isinstance(scaling, Mapping):
        scaling = plain(scaling)
        unknown = sorted(set(scaling) - {"name", "method", "params", "logn"})
        if unknown:
            raise ValueError(
                f"scaling mapping has unknown keys {unknown}; allowed keys: name, method, params, logn."
            )
        return _scaling_config(
            str(scaling.get("method", "default")),
            {**dict(scaling.get("params") or {}), **params},
            bool(scaling.get("logn", False)) or bool(logn),
            name or scaling.get("name"),
        )
    key = "none" if scaling in (None, "") else str(scaling)
    presets = scaling_presets()
    if key in presets:
        preset = presets[key]
        return _scaling_config(
            str(preset["method"]),
            {**dict(preset.get("params") or {}), **params},
            bool(preset.get("logn", False)) or bool(logn),
            name
            or (
                str(preset.get("name", key)) + ("+logn" if logn and not preset.get("logn") else "")
            ),
        )
    if key not in SCALING_METHODS:
        allowed = sorted(set(presets) | set(SCALING_METHODS) | {"none", "logn"})
        raise ValueError(f"scaling {scaling!r} is unknown; allowed: {', '.join(allowed)}.")
    return _scaling_config(key, params, bool(logn), name)


def _scaling_config(
    method: str, params: dict, logn: bool, name: str | None
) -> ScalingConfig | None:
    if method not in SCALING_METHODS:
        raise ValueError(
            f"scaling method {method!r} is unknown; registered: {', '.join(sorted(SCALING_METHODS))}."
        )
    allowed_params = _method_param_names(method)
    unknown = sorted(set(params) - allowed_params)
    if unknown:
        what = f"scaling method {method!r}" if method != "default" else "scaling none"
        raise ValueError(
            f"model argument(s) {unknown} are unknown for {what}; allowed scaling parameters: "
            f"{', '.join(sorted(allowed_params)) or 'none'} (other model arguments: {', '.join(_MODEL_ARGS)})."
        )
    coerced = {k: _coerce_param(k, v) for k, v in params.items()}
    if method == "default" and not logn:
        return None
    label = name or ("logn" if method == "default" else method + ("+logn" if logn else ""))
    return ScalingConfig(name=label, method=method, params=coerced, logn=bool(logn))


# --------------------------------------------------------------------------- the model


def _pick_device(device: Any) -> torch.device:
    if device is None or str(device).strip() in ("", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(str(device))
    except RuntimeError:
        raise ValueError(
            f"device {device!r} is invalid; allowed: cpu, cuda, cuda:<n>, mps or auto."
        ) from None
    if chosen.type == "cuda" and not torch.cuda.is_available():
        logger.warning("device %s requested but CUDA is not available; using cpu.", device)
        return torch.device("cpu")
    if chosen.type == "mps" and not torch.backends.mps.is_available():
        logger.warning("device %s requested but MPS is not available; using cpu.", device)
        return torch.device("cpu")
    return chosen


def _batch_rows(batch_size: Any, max_batch_size: Any) -> int:
    if batch_size is None:
        return 1
    text = str(batch_size).strip().lower()
    if text.startswith("auto"):
        return _positive_int(
            int(max_batch_size) if max_batch_size else DEFAULT_MAX_BATCH_SIZE, "max_batch_size"
        )
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(
            f"batch_size {batch_size!r} is invalid; allowed: an integer >= 1, 'auto' or 'auto:N'."
        )
    return value


def _optional_length(value: Any, what: str) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        return None
    return _positive_int(value, what)


def _load_model(ref: Any, cache_root: Any, device: torch.device) -> tuple[nn.Module, dict]:
    if isinstance(ref, nn.Module):
        return ref, {"key": None, "train_length": int(ref.train_length)}
    if ref is None or str(ref).strip() == "":
        raise ValueError(
            "model argument pretrained is missing; give a checkpoint cache key or path."
        )
    from bench.cache import load_model

    return load_model(str(ref), cache_root=cache_root, device=str(device))


_MODEL_ARGS = (
    "pretrained",
    "cache_root",
    "scaling",
    "scaling_name",
    "logn",
    "eval_length",
    "max_length",
    "prefix_token",
    "precision",
    "batch_size",
    "max_batch_size",
    "max_batch_tokens",
    "device",
)


def _register(name: str):
    """``register_model(name)``, tolerant of a second import of this file (``python -m bench.harness``).

    ``import lm_eval.models`` above matters: lm-eval fills its lazy model table only when the
    registry is empty, so registering first would hide ``hf`` and every other built-in model.
    """

    def decorate(cls):
        try:
            return register_model(name)(cls)
        except ValueError:
            from lm_eval.api.registry import get_model

            existing = get_model(name)
            if getattr(existing, "__qualname__", None) != cls.__qualname__:
                raise
            return cls

    return decorate


@_register(MODEL_NAME)
class LenbenchLM(LM):
    """lm-eval model over a lenbench ``DecoderLM`` (see the module doc for the arguments)."""

    def __init__(
        self,
        pretrained: Any = None,
        cache_root: str | None = None,
        scaling: Any = None,
        scaling_name: str | None = None,
        logn: Any = False,
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
        self.scaling = parse_scaling(scaling, logn=logn, name=scaling_name, **scaling_params)
        if prefix_token not in PREFIX_TOKENS:
            raise ValueError(
                f"prefix_token {prefix_token!r} is unknown; allowed: {', '.join(PREFIX_TOKENS)}."
            )
        if precision not in PRECISIONS:
            raise ValueError(
                f"precision {precision!r} is unknown; allowed: {', '.join(PRECISIONS)}."
            )
        self._device = _pick_device(device)
        self.eval_length = _optional_length(eval_length, "eval_length")
        self._max_length = _optional_length(max_length, "max_length")
        self.batch_rows = _batch_rows(batch_size, max_batch_size)
        self.max_batch_tokens = _optional_length(max_batch_tokens, "max_batch_tokens")
        self.precision = precision
        self.tokenizer = _TOKENIZER
        self.prefix_token_id = _TOKENIZER.EOS if prefix_token == "eos" else _TOKENIZER.BOS
        self.model, self.meta = _load_model(pretrained, cache_root, self._device)
        self.model.to(self._device).eval()
        self.train_length = int(getattr(self.model, "train_length", self.meta.get("train_length")))
        self._auto_factor = self.scaling is not None and "auto" in (
            self.scaling.params.get("factor"),
            self.scaling.params.get("alpha"),
        )
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

    def _autocast(self):
        if self.precision == "bf16":
            return torch.autocast(device_type=self._device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _scaling_length(self, doc: Any, n_input: int, whole: bool = True) -> int:
        """The eval length ``factor: auto`` resolves against (module doc); n_input if irrelevant."""
        if not self._auto_factor:
            return n_input
        if self.eval_length:
            return self.eval_length
        doc_length = doc.get("eval_length") if isinstance(doc, Mapping) else None
        if whole and isinstance(doc_length, (int, np.integer)) and doc_length >= n_input:
            return int(doc_length)
        return n_input

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
            with self._autocast():
                logits = self.model(whole[:, :-1].to(self._device)).logits  # [B, n_input, V]
            span = max(len(items[i][1]) for i in chunk)
            logprobs = torch.log_softmax(
                logits[:, n_input - span :].float(), dim=-1
            ).cpu()  # [B, span, V]
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
        bar = tqdm(
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
        results = self._score(items, "loglikelihood")
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
        for r, (logprob, _) in zip(owner, self._score(items, "loglikelihood_rolling"), strict=True):
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
        max_gen = _positive_int(
            int(max_gen) if isinstance(max_gen, (float, str)) else max_gen, "max_gen_toks"
        )
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
        """Greedy continuation of each context, cut before the first stop string (see module doc)."""
        prepared = []
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for i, req in enumerate(requests):
            context, gen_kwargs = req.args[0], req.args[1]
            until, max_gen = self._generation_settings(gen_kwargs)
            ids = self.tok_encode(context) or [self.prefix_token_id]
            self._check_length(len(ids), "generation context")
            prepared.append((ids, until, max_gen))
            groups[(len(ids), self._scaling_length(req.doc, len(ids)))].append(i)
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
        with self._autocast():
            out = self.model(ids, use_cache=True)
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
            with self._autocast():
                out = self.model(next_tokens[:, None], past=out.past, use_cache=True)
        return [
            self._cut(_TOKENIZER.decode(g), until)
            for g, (_, until, _) in zip(generated, batch, strict=True)
        ]


# --------------------------------------------------------------------------- running and rows


def task_names() -> list[str]:
    """Every task and group name defined in :data:`TASKS_DIR` (fast: lm-eval's own tasks not indexed)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(TASKS_DIR), include_defaults=False).all_tasks


def _split_tasks(tasks: str | Sequence[str]) -> list[str]:
    if isinstance(tasks, str):
        tasks = [tasks]
    return [t.strip() for item in tasks for t in str(item).split(",") if t.strip()]


def run_harness(
    model_ref: Any,
    tasks: str | Sequence[str],
    *,
    scaling: Any = None,
    limit: int | float | None = None,
    batch_size: int | str = 8,
    cache_root: str | Path | None = None,
    device: str = "cpu",
    max_length: int | None = None,
    eval_length: int | None = None,
    metadata: Mapping | None = None,
    model_args: Mapping | None = None,
    log_samples: bool = False,
) -> dict:
    """Run lm-eval tasks on a lenbench checkpoint; returns lm-eval's results dict.

    ``model_ref``: a cache key, checkpoint path or DecoderLM; ``scaling``: as in
    :func:`parse_scaling` (None, a method name, a ScalingConfig or a mapping); ``metadata`` reaches
    every task's dataset builder (e.g. ``{"data": {...}}`` for the perplexity corpus);
    ``model_args`` are extra ``LenbenchLM`` arguments (``prefix_token``, ``precision``, ...).
    Uses ``bootstrap_iters=0`` (no stderr). lm-eval's own tasks are indexed only when a requested
    task is not one of ours (that index takes ~30 s).
    """
    import lm_eval
    from lm_eval.tasks import TaskManager

    names = _split_tasks(tasks)
    if not names:
        raise ValueError(
            "run_harness needs at least one task name; ours: " + ", ".join(task_names()) + "."
        )
    scaling_cfg = parse_scaling(scaling) if not isinstance(scaling, ScalingConfig) else scaling
    previous = getattr(model_ref, "scaling", None) if isinstance(model_ref, nn.Module) else None
    lm = LenbenchLM(
        pretrained=model_ref,
        cache_root=None if cache_root is None else str(cache_root),
        scaling=scaling_cfg,
        eval_length=eval_length,
        max_length=max_length,
        batch_size=batch_size,
        device=device,
        **dict(model_args or {}),
    )
    ours = set(task_names())
    task_manager = TaskManager(
        include_path=str(TASKS_DIR),
        include_defaults=not set(names) <= ours,
        metadata=plain(metadata or {}),
    )
    try:
        results = lm_eval.simple_evaluate(
            model=lm,
            tasks=names,
            limit=limit,
            bootstrap_iters=0,
            task_manager=task_manager,
            log_samples=log_samples,
        )
    finally:
        if isinstance(model_ref, nn.Module):  # the caller's model object gets its own scaling back
            lm.model.set_scaling(previous)
    if results is None:  # only a non-zero rank of a distributed run gets None
        return {}
    return dict(results)


_LENGTH_SUFFIX = re.compile(r"^lenbench_\w+?_(\d+)$")


def _task_length(task: str, config: Mapping | None) -> int | None:
    meta = (config or {}).get("metadata") or {}
    length = meta.get("length") if isinstance(meta, Mapping) else None
    if isinstance(length, (int, np.integer)) and not isinstance(length, bool):
        return int(length)
    match = _LENGTH_SUFFIX.match(task)
    return int(match.group(1)) if match else None


def harness_rows(results: Mapping) -> list[dict]:
    """lenbench result rows (measured part only) from lm-eval's results dict.

    One row per task (or group) and numeric metric: ``metric = "harness/<task>/<metric>"`` (a
    filter other than ``none`` is appended: ``.../<metric>/<filter>``), ``value``, ``n`` (documents
    evaluated; for a group the sum over its tasks), ``eval_length`` (the task's length for lenbench
    tasks, else None), and ``ci_lo``/``ci_hi`` (value -+ 1.96 stderr) when lm-eval computed a stderr.
    The job runner adds the identity columns, as for ``bench.evaluate`` rows.
    """
    per_task = results.get("results") or {}
    n_samples = results.get("n-samples") or {}
    configs = results.get("configs") or {}
    group_subtasks = results.get("group_subtasks") or {}

    def count(task: str) -> int | None:
        info = n_samples.get(task)
        if isinstance(info, Mapping):
            return int(info.get("effective", info.get("original", 0)))
        subtasks = group_subtasks.get(task)
        if subtasks:
            counts = [count(t) for t in subtasks]
            return int(sum(c for c in counts if c is not None))
        return None

    rows = []
    for task, metrics in per_task.items():
        length = _task_length(task, configs.get(task))
        n = count(task)
        for key, value in metrics.items():
            if "," not in key or "_stderr," in key:
                continue
            if isinstance(value, bool) or not isinstance(
                value, (int, float, np.floating, np.integer)
            ):
                continue
            metric, _, filter_name = key.partition(",")
            name = f"harness/{task}/{metric}" + (
                f"/{filter_name}" if filter_name not in ("", "none") else ""
            )
            row = {"metric": name, "value": float(value), "n": n, "eval_length": length}
            stderr = metrics.get(f"{metric}_stderr,{filter_name}")
            if (
                isinstance(stderr, (int, float))
                and not isinstance(stderr, bool)
                and math.isfinite(stderr)
            ):
                row["ci_lo"] = float(value) - 1.96 * float(stderr)
                row["ci_hi"] = float(value) + 1.96 * float(stderr)
            rows.append(row)
    return rows


# --------------------------------------------------------------------------- CLI

_SUBCOMMANDS = ("run", "ls", "validate")
_HELP = ("-h", "--help")


def _option_value(argv: Sequence[str], option: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(option + "="):
            return arg[len(option) + 1 :]
    return None


def _with_include_path(argv: list[str]) -> list[str]:
    """``argv`` plus ``--include_path TASKS_DIR`` unless given, or unless nothing would run."""
    if not argv or all(a in _HELP for a in argv):
        return argv
    if argv[0] not in _SUBCOMMANDS and not argv[0].startswith("-"):
        return argv  # lm-eval reports the unknown command itself
    if argv[0] == "run" and len(argv) == 1:
        return argv
    if _option_value(argv, "--include_path") is not None:
        return argv
    return [*argv, "--include_path", str(TASKS_DIR)]


def _skip_builtin_index_if_possible(argv: Sequence[str]) -> None:
    """When every requested task is ours, stop lm-eval from indexing its ~14k built-in tasks (~30 s).

    The CLI builds its TaskManager through ``lm_eval.tasks.TaskManager``; this swaps in a subclass
    whose ``include_defaults`` defaults to False, for this process only. Any other task name (or a
    user's own ``--include_path``) leaves lm-eval untouched.
    """
    if _option_value(argv, "--include_path") != str(TASKS_DIR):
        return
    requested = _option_value(argv, "--tasks")
    if not requested:
        return
    names = _split_tasks(requested)
    try:
        import lm_eval.tasks as tasks_module

        if not names or not set(names) <= set(task_names()):
            return
        base = tasks_module.TaskManager

        class _OwnTasksOnly(base):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs.setdefault("include_defaults", False)
                super().__init__(*args, **kwargs)

        tasks_module.TaskManager = _OwnTasksOnly
    except Exception as err:  # an lm-eval layout we do not know: just index everything
        logger.debug("not skipping lm-eval's task index: %s", err)


def main(argv: Sequence[str] | None = None) -> None:
    """``lenbench-harness``: lm-eval's CLI with the ``lenbench`` model and our tasks available."""
    from lm_eval.__main__ import cli_evaluate

    args = _with_include_path(list(sys.argv[1:] if argv is None else argv))
    _skip_builtin_index_if_possible(args)
    sys.argv = ["lenbench-harness", *args]
    cli_evaluate()


if __name__ == "__main__":
    main()
