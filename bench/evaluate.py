"""Evaluate one model at several lengths: length-bucketed NLL, passkey retrieval and probes.

Entry point: :func:`evaluate_model`. For each eval length it calls
``model.set_scaling(scaling, eval_length)`` and then measures every enabled metric whose
``lengths`` include that length. It returns result rows holding only the measured part::

    {"metric", "value", "n", "eval_length"} + optional
    {"bucket_lo", "bucket_hi", "axis", "axis_value", "layer", "ci_lo", "ci_hi"}

(the job runner adds the identity columns). Rows per metric:

* ``nll``: one row per position bucket [bucket_lo, bucket_hi) of the window (value = mean NLL in
  nats, n = scored tokens, ci = bootstrap over documents), plus one whole-window row with no
  bucket columns (the report's convention for "whole window"), ``axis="docs"`` and
  ``axis_value`` = number of documents used. The bucket rows' ``n`` add up to the whole-window
  row's ``n``. If no test document is long enough, the whole-window row is still written with
  value NaN, n=0 and axis_value=0, and a warning is logged (never silent padding).
* ``passkey_acc``: one row per depth (axis="depth") and one per length (no axis);
  ``passkey_context``: one row per run (see :func:`bench.passkey_eval.passkey_context_row`).
* ``shift_dnll`` (axis="delta"), ``order_dnll`` (axis="distance"), ``context_nll``
  (axis="context"), ``attn_entropy`` (layer + bucket), ``position_probe_r2`` (axis="region",
  axis_value "inside"/"beyond", layer): see :mod:`bench.probes`.

A length at which the model cannot embed its positions (a learned table with
``out_of_range: error``) is skipped with a logged warning. The configuration keys are documented
in ``conf/eval/standard.yaml``; :data:`DEFAULT_EVAL_CONFIG` holds the same values.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from bench.config import plain
from bench.corpora import Document
from bench.passkey import PASSKEY_FILLERS
from bench.passkey_eval import passkey_context_row, passkey_rows
from bench.probes import (
    PRECISIONS,
    EvalContext,
    attn_entropy_rows,
    bootstrap_ratio_ci,
    bucket_edges,
    bucket_index,
    context_nll_rows,
    order_dnll_rows,
    position_probe_rows,
    position_range_error,
    select_documents,
    shift_dnll_rows,
)
from models.transformer import ScalingConfig

__all__ = [
    "DEFAULT_EVAL_CONFIG",
    "METRIC_SECTIONS",
    "evaluate_model",
    "nll_rows",
    "nll_windows",
    "parse_length",
    "resolve_eval_config",
]

logger = logging.getLogger(__name__)

NLL_PROTOCOLS = ("nonoverlapping", "sliding")

#: The protocol of ``conf/eval/standard.yaml`` (a test keeps the two identical).
DEFAULT_EVAL_CONFIG: dict[str, Any] = {
    "lengths": ["1x", "2x", "4x", "8x", "16x"],
    "precision": "fp32",
    "batch_size": 8,
    "max_batch_tokens": 32768,
    "nll": {
        "enabled": True,
        "lengths": None,
        "protocol": "nonoverlapping",
        "stride": 256,
        "max_docs": 64,
        "max_windows": 1,
        "buckets": "auto",
        "bootstrap": 1000,
        "ci": 0.95,
    },
    "passkey": {
        "enabled": True,
        "lengths": None,
        "depths": 10,
        "trials": 10,
        "filler": "standard",
        "threshold": 0.8,
    },
    "shift_dnll": {
        "enabled": True,
        "lengths": ["1x"],
        "deltas": [16, "0.25x", "1x", "2x", "4x", "8x", "16x"],
        "max_docs": 16,
        "bootstrap": 1000,
        "ci": 0.95,
    },
    "order_dnll": {
        "enabled": True,
        "lengths": None,
        "block": 32,
        "shuffle_block": None,
        "distances": "auto",
        "max_docs": 16,
        "bootstrap": 1000,
        "ci": 0.95,
    },
    "context_nll": {
        "enabled": True,
        "lengths": None,
        "block": 32,
        "contexts": "auto",
        "max_docs": 16,
        "bootstrap": 1000,
        "ci": 0.95,
    },
    "attn_entropy": {
        "enabled": True,
        "lengths": ["1x", "4x", "16x"],
        "buckets": "auto",
        "max_docs": 4,
    },
    "position_probe_r2": {
        "enabled": True,
        "lengths": ["1x", "4x", "16x"],
        "layer": None,
        "fit_docs": 8,
        "test_docs": 8,
        "positions_per_doc": 256,
        "ridge": 0.001,
    },
    # lm-evaluation-harness tasks run by the job runner after the native metrics (bench.harness).
    "harness": {
        "tasks": [],
        "limit": None,
    },
}
#: Metric sections in the order they run at each length (harness tasks run separately).
METRIC_SECTIONS = tuple(
    k for k, v in DEFAULT_EVAL_CONFIG.items() if isinstance(v, dict) and k != "harness"
)
_DEFAULT_MULTIPLES = ("1x", "2x", "4x", "8x", "16x")


# --------------------------------------------------------------------------- config


def parse_length(value: Any, train_length: int, what: str = "length") -> int:
    """A length in tokens: an int (tokens) or a string ``"<m>x"`` (m times the training length)."""
    if isinstance(value, bool):
        raise ValueError(
            f"{what} {value!r} is invalid; allowed: an integer number of tokens or '<m>x'."
        )
    if isinstance(value, str) and value.strip().lower().endswith("x"):
        try:
            multiple = float(value.strip()[:-1])
        except ValueError:
            multiple = float("nan")
        if not math.isfinite(multiple) or multiple < 0:
            raise ValueError(
                f"{what} {value!r} is invalid; allowed: an integer number of tokens or '<m>x' "
                "with m a non-negative number (m times the training length)."
            )
        return int(round(multiple * int(train_length)))
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not math.isfinite(number) or number != int(number) or number < 0:
        raise ValueError(
            f"{what} {value!r} is invalid; allowed: a non-negative integer number of tokens or "
            "'<m>x' (m times the training length)."
        )
    return int(number)


def _grid(value: Any, train_length: int, what: str) -> list[int] | None:
    """'auto'/None -> None; a list of token counts / '<m>x' strings -> sorted unique ints."""
    if value is None or value == "auto":
        return None
    if isinstance(value, (str, int, float)):
        value = [value]
    return sorted({parse_length(v, train_length, what) for v in value})




def _merge(defaults: dict, given: Mapping, where: str) -> dict:
    out = copy.deepcopy(defaults)
    for key, value in given.items():
        if key not in defaults:
            raise ValueError(
                f"eval config key {where}{key!r} is unknown; allowed keys: {', '.join(defaults)}."
            )
        if isinstance(defaults[key], dict):
            if not isinstance(value, Mapping):
                raise ValueError(
                    f"eval config key {where}{key!r} must be a mapping, got {value!r}."
                )
            out[key] = _merge(defaults[key], value, f"{where}{key}.")
        else:
            out[key] = value
    return out


def _positive_int(value: Any, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < minimum:
        raise ValueError(f"{what} {value!r} is invalid; allowed: an integer >= {minimum}.")
    return int(value)


def _probability(value: Any, what: str, open_low: bool = True) -> float:
    number = float(value)
    if not (0.0 < number < 1.0 if open_low else 0.0 <= number <= 1.0):
        allowed = "(0, 1)" if open_low else "[0, 1]"
        raise ValueError(f"{what} {value!r} is invalid; allowed: a number in {allowed}.")
    return number


def resolve_eval_config(eval_cfg: Mapping | None, train_length: int) -> dict[str, Any]:
    """Defaults merged with ``eval_cfg``, validated, with every length resolved to tokens.

    Unknown keys raise ValueError (a typo must not silently fall back to a default). In the
    result, ``lengths`` and every metric's ``lengths`` are sorted lists of ints (a metric's list is
    the eval lengths it runs at), and grids (deltas, distances, contexts, buckets) are sorted int
    lists or None for "auto".
    """
    given = plain(eval_cfg) if eval_cfg is not None else {}
    if not isinstance(given, Mapping):
        raise ValueError(f"eval config must be a mapping, got {eval_cfg!r}.")
    cfg = _merge(DEFAULT_EVAL_CONFIG, given, "")
    train_length = _positive_int(train_length, "train_length", 2)
    lengths = cfg["lengths"] if cfg["lengths"] is not None else list(_DEFAULT_MULTIPLES)
    if isinstance(lengths, (str, int)):
        lengths = [lengths]
    cfg["lengths"] = sorted({parse_length(v, train_length, "eval length") for v in lengths})
    if not cfg["lengths"] or min(cfg["lengths"]) < 2:
        raise ValueError(
            f"eval lengths {lengths!r} are invalid; allowed: at least one length of >= 2 tokens."
        )
    if cfg["precision"] not in PRECISIONS:
        raise ValueError(
            f"eval precision {cfg['precision']!r} is unknown; allowed: {', '.join(PRECISIONS)}."
        )
    cfg["batch_size"] = _positive_int(cfg["batch_size"], "eval batch_size")
    if cfg["max_batch_tokens"] is not None:
        cfg["max_batch_tokens"] = _positive_int(cfg["max_batch_tokens"], "eval max_batch_tokens")

    for name in METRIC_SECTIONS:
        section = cfg[name]
        section["enabled"] = bool(section["enabled"])
        wanted = _grid(section["lengths"], train_length, f"{name}.lengths entry")
        section["lengths"] = (
            list(cfg["lengths"]) if wanted is None else [x for x in cfg["lengths"] if x in wanted]
        )
        if section["enabled"] and wanted is not None and not section["lengths"]:
            logger.warning(
                "eval metric %s is enabled but none of its lengths %s is an eval length %s; it will not run.",
                name,
                wanted,
                cfg["lengths"],
            )
        for key in (
            "max_docs",
            "fit_docs",
            "test_docs",
            "positions_per_doc",
            "trials",
            "max_windows",
        ):
            if key in section:
                section[key] = _positive_int(section[key], f"{name}.{key}")
        for key in ("block", "stride"):
            if key in section:
                section[key] = _positive_int(section[key], f"{name}.{key}")
        if "bootstrap" in section:
            section["bootstrap"] = _positive_int(section["bootstrap"], f"{name}.bootstrap", 0)
        if "ci" in section:
            section["ci"] = _probability(section["ci"], f"{name}.ci")
        for key in ("buckets", "deltas", "distances", "contexts"):
            if key in section:
                section[key] = _grid(section[key], train_length, f"{name}.{key} entry")

    nll = cfg["nll"]
    if nll["protocol"] not in NLL_PROTOCOLS:
        raise ValueError(
            f"nll protocol {nll['protocol']!r} is unknown; allowed: {', '.join(NLL_PROTOCOLS)}."
        )
    passkey = cfg["passkey"]
    depths = passkey["depths"]
    if isinstance(depths, (int, np.integer)) and not isinstance(depths, bool):
        count = _positive_int(depths, "passkey.depths")
        passkey["depths"] = [0.0] if count == 1 else np.linspace(0.0, 1.0, count).round(6).tolist()
    else:
        passkey["depths"] = sorted(
            {_probability(d, "passkey depth", open_low=False) for d in depths}
        )
        if not passkey["depths"]:
            raise ValueError(
                "passkey.depths is empty; allowed: a count >= 1 or a list of depths in [0, 1]."
            )
    if passkey["filler"] not in PASSKEY_FILLERS:
        raise ValueError(
            f"passkey filler {passkey['filler']!r} is unknown; allowed: {', '.join(PASSKEY_FILLERS)}."
        )
    passkey["threshold"] = _probability(passkey["threshold"], "passkey.threshold", open_low=False)
    shuffle = cfg["order_dnll"]["shuffle_block"]
    if shuffle is not None:
        cfg["order_dnll"]["shuffle_block"] = _positive_int(shuffle, "order_dnll.shuffle_block")
    layer = cfg["position_probe_r2"]["layer"]
    if layer is not None:
        cfg["position_probe_r2"]["layer"] = _positive_int(layer, "position_probe_r2.layer", 0)
    cfg["position_probe_r2"]["ridge"] = float(cfg["position_probe_r2"]["ridge"])
    if not cfg["position_probe_r2"]["ridge"] > 0:
        raise ValueError(
            f"position_probe_r2.ridge {cfg['position_probe_r2']['ridge']!r} is invalid; allowed: a number > 0."
        )
    return cfg


# --------------------------------------------------------------------------- nll


def nll_windows(
    doc_len: int, length: int, max_windows: int, protocol: str, stride: int
) -> list[tuple[int, int]]:
    """(start, score_from) of each window of one document; a window reads tokens[start:start+length+1].

    The scored span is the first ``n * length`` targets, n = min(max_windows, (doc_len-1) // length).
    ``nonoverlapping`` scores each window from its first token. ``sliding`` starts windows every
    ``stride`` tokens (the last one ends exactly at the span's end) and scores only the tokens not
    scored by the previous window, so every target of the span is scored exactly once, and
    ``stride == length`` is the nonoverlapping protocol.
    """
    n = min(int(max_windows), (int(doc_len) - 1) // int(length))
    if n <= 0:
        return []
    if protocol == "nonoverlapping" or stride >= length:
        return [(k * length, 0) for k in range(n)]
    span = n * length
    starts = list(range(0, span - length + 1, stride))
    if starts[-1] != span - length:
        starts.append(span - length)
    out, scored_until = [], 0
    for start in starts:
        out.append((start, scored_until - start))
        scored_until = start + length
    return out


def nll_rows(
    ctx: EvalContext,
    docs: Sequence[Document],
    length: int,
    train_length: int,
    *,
    protocol: str = "nonoverlapping",
    stride: int | None = None,
    max_docs: int = 64,
    max_windows: int = 1,
    buckets: Sequence[int] | None = None,
    bootstrap: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
) -> list[dict]:
    """``nll`` rows at one eval length (see the module doc for the rows)."""
    selected, n_eligible = select_documents(docs, length + 1, max_docs)
    if n_eligible < len(docs):
        logger.info(
            "nll at eval length %d: %d of %d test documents are shorter than %d tokens and are skipped.",
            length,
            len(docs) - n_eligible,
            len(docs),
            length + 1,
        )
    if not selected:
        logger.warning(
            "nll at eval length %d: no test document has the %d tokens needed; writing an empty "
            "(NaN, n=0) whole-window row.",
            length,
            length + 1,
        )
        return [
            {
                "metric": "nll",
                "value": float("nan"),
                "n": 0,
                "eval_length": int(length),
                "axis": "docs",
                "axis_value": 0,
            }
        ]
    edges = bucket_edges(buckets, length, train_length)
    n_buckets = len(edges) - 1
    bucket_of = torch.from_numpy(bucket_index(edges, length))  # [L]
    windows = [
        (d, start, score_from)
        for d, doc in enumerate(selected)
        for start, score_from in nll_windows(
            len(doc), length, max_windows, protocol, stride or length
        )
    ]
    sums = torch.zeros(len(selected) * n_buckets, dtype=torch.float64)
    counts = torch.zeros(len(selected) * n_buckets, dtype=torch.float64)
    positions = torch.arange(length)
    step = ctx.rows_per_batch(length)
    with ctx.bar(len(windows), f"nll L={length}") as bar:
        for begin in range(0, len(windows), step):
            chunk = windows[begin : begin + step]
            tokens = torch.stack([selected[d].tensor(s, s + length + 1) for d, s, _ in chunk])
            nll = ctx.token_nll(tokens).double()  # [B, L]
            doc_ids = torch.tensor([d for d, _, _ in chunk])
            score_from = torch.tensor([f for _, _, f in chunk])
            scored = positions[None, :] >= score_from[:, None]  # [B, L]
            cell = doc_ids[:, None] * n_buckets + bucket_of[None, :]  # [B, L]
            sums.index_add_(0, cell[scored], nll[scored])
            counts.index_add_(0, cell[scored], torch.ones_like(nll[scored]))
            bar.update(len(chunk))
    sums_arr = sums.view(len(selected), n_buckets).numpy()
    counts_arr = counts.view(len(selected), n_buckets).numpy()
    rng = np.random.default_rng([int(seed), int(length), 1])
    # the whole window is one more column, so its CI comes from the same resamples
    all_sums = np.concatenate([sums_arr, sums_arr.sum(1, keepdims=True)], axis=1)
    all_counts = np.concatenate([counts_arr, counts_arr.sum(1, keepdims=True)], axis=1)
    lo, hi = bootstrap_ratio_ci(all_sums, all_counts, bootstrap, ci, rng)
    totals, token_counts = all_sums.sum(0), all_counts.sum(0)

    def ci_of(j: int) -> dict:
        if math.isnan(lo[j]):
            return {}
        return {"ci_lo": float(lo[j]), "ci_hi": float(hi[j])}

    rows = []
    for b in range(n_buckets):
        if token_counts[b] == 0:
            continue  # sliding windows leave early buckets of later windows unscored
        rows.append(
            {
                "metric": "nll",
                "value": float(totals[b] / token_counts[b]),
                "n": int(token_counts[b]),
                "eval_length": int(length),
                "bucket_lo": int(edges[b]),
                "bucket_hi": int(edges[b + 1]),
                **ci_of(b),
            }
        )
    rows.append(
        {
            "metric": "nll",
            "value": float(totals[-1] / token_counts[-1]),
            "n": int(token_counts[-1]),
            "eval_length": int(length),
            "axis": "docs",
            "axis_value": len(selected),
            **ci_of(n_buckets),
        }
    )
    return rows


# --------------------------------------------------------------------------- driver


def evaluate_model(
    model: nn.Module,
    eval_cfg: Mapping | None,
    test_docs: list[Document],
    *,
    train_length: int,
    scaling: ScalingConfig | None = None,
    device: str | torch.device = "cpu",
    seed: int = 0,
    progress: bool = True,
) -> list[dict]:
    """Measure every enabled metric at every eval length; return result rows (module doc).

    ``scaling`` (a ``models.transformer.ScalingConfig`` or None for the raw model) is applied per
    length with ``model.set_scaling(scaling, eval_length)``, so ``factor: auto`` follows the length.
    Runs under ``torch.no_grad`` in eval mode; the model's previous scaling and train/eval mode are
    restored afterwards.
    """
    cfg = resolve_eval_config(eval_cfg, train_length)
    test_docs = list(test_docs)
    ctx = EvalContext(
        model,
        device=device,
        precision=cfg["precision"],
        batch_size=cfg["batch_size"],
        max_batch_tokens=cfg["max_batch_tokens"],
        progress=progress,
    )
    has_scaling = hasattr(model, "set_scaling")
    if scaling is not None and not has_scaling:
        raise ValueError(f"scaling {scaling!r} was given but the model has no set_scaling method.")
    previous_scaling = getattr(model, "scaling", None)
    was_training = model.training
    model.to(device)
    model.eval()
    rows: list[dict] = []
    passkey_accuracy: dict[int, float] = {}
    try:
        with torch.no_grad():
            for length in tqdm(
                cfg["lengths"], desc="eval lengths", unit="len", disable=not progress
            ):
                if has_scaling:
                    model.set_scaling(scaling, length)
                problem = position_range_error(model, length - 1, length)
                if problem is not None:
                    logger.warning("eval length %d skipped for every metric: %s", length, problem)
                    continue
                for name in METRIC_SECTIONS:
                    section = cfg[name]
                    if not section["enabled"] or length not in section["lengths"]:
                        continue
                    started = time.perf_counter()
                    new = _run_metric(name, section, ctx, test_docs, length, train_length, seed)
                    logger.info(
                        "%s at eval length %d: %d rows in %.2f s",
                        name,
                        length,
                        len(new),
                        time.perf_counter() - started,
                    )
                    if name == "passkey":
                        overall = [
                            r for r in new if r["metric"] == "passkey_acc" and "axis" not in r
                        ]
                        if overall:
                            passkey_accuracy[length] = overall[0]["value"]
                    rows += new
        context_row = passkey_context_row(passkey_accuracy, cfg["passkey"]["threshold"])
        if context_row is not None:
            rows.append(context_row)
    finally:
        if has_scaling:
            model.set_scaling(previous_scaling)
        model.train(was_training)
    return rows


def _run_metric(
    name: str,
    s: dict,
    ctx: EvalContext,
    docs: list[Document],
    length: int,
    train_length: int,
    seed: int,
) -> list[dict]:
    if name == "nll":
        return nll_rows(
            ctx,
            docs,
            length,
            train_length,
            protocol=s["protocol"],
            stride=s["stride"],
            max_docs=s["max_docs"],
            max_windows=s["max_windows"],
            buckets=s["buckets"],
            bootstrap=s["bootstrap"],
            ci=s["ci"],
            seed=seed,
        )
    if name == "passkey":
        return passkey_rows(
            ctx,
            length,
            depths=s["depths"],
            trials=s["trials"],
            seed=seed,
            filler=s["filler"],
            docs=docs,
        )
    if name == "shift_dnll":
        return shift_dnll_rows(
            ctx,
            docs,
            length,
            s["deltas"] or [],
            max_docs=s["max_docs"],
            bootstrap=s["bootstrap"],
            ci=s["ci"],
            seed=seed,
        )
    if name == "order_dnll":
        return order_dnll_rows(
            ctx,
            docs,
            length,
            s["distances"],
            block=s["block"],
            shuffle_block=s["shuffle_block"],
            max_docs=s["max_docs"],
            bootstrap=s["bootstrap"],
            ci=s["ci"],
            seed=seed,
        )
    if name == "context_nll":
        return context_nll_rows(
            ctx,
            docs,
            length,
            s["contexts"],
            block=s["block"],
            max_docs=s["max_docs"],
            bootstrap=s["bootstrap"],
            ci=s["ci"],
            seed=seed,
        )
    if name == "attn_entropy":
        return attn_entropy_rows(
            ctx, docs, length, train_length, edges=s["buckets"], max_docs=s["max_docs"]
        )
    if name == "position_probe_r2":
        return position_probe_rows(
            ctx,
            docs,
            length,
            train_length,
            layer=s["layer"],
            fit_docs=s["fit_docs"],
            test_docs=s["test_docs"],
            positions_per_doc=s["positions_per_doc"],
            ridge=s["ridge"],
        )
    raise ValueError(f"eval metric {name!r} is unknown; allowed: {', '.join(METRIC_SECTIONS)}.")
