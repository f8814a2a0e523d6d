"""Result rows: their columns, canonical JSON (``*_params`` columns, checkpoint keys) and the
validation of rows (:func:`normalize_results`, :func:`non_finite_row`); result files are
:mod:`bench.core.results`.

Column conventions after :func:`normalize_results`:

* identifying strings (``experiment``, ``position``, ``metric``, ...) are non-empty strings;
* ``position_params`` / ``scaling_params`` are canonical JSON (see :func:`canonical_json`);
* ``train_length``, ``eval_length``, ``n``, ``seed`` are int64; ``value`` is float64;
* ``bucket_lo``, ``bucket_hi``, ``ci_lo``, ``ci_hi`` are float64 (NaN when absent),
  ``layer`` is nullable Int64, ``axis`` is a string or missing;
* ``finetune_method`` / ``parent_model_id`` are strings and ``finetune_length`` /
  ``finetune_steps`` nullable Int64, all missing for a model that was not fine-tuned at length;
* ``axis_value`` is a string or missing: numbers are stored canonically (``128``, ``0.25``) so
  that numeric axes (depth, delta, distance, context) and label axes (region ``inside`` /
  ``beyond``) share one parquet column; use ``pd.to_numeric(..., errors="coerce")`` to plot;
* ``written_at`` is a UTC timestamp.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from models.lazy import pd

REQUIRED_COLUMNS: list[str] = [
    "experiment",
    "run_id",
    "model_id",
    "position",
    "position_params",
    "scaling",
    "scaling_params",
    "train_length",
    "eval_length",
    "metric",
    "value",
    "n",
    "seed",
    "corpus",
    "corpus_fingerprint",
    "code_version",
]
#: Optional column beyond DESIGN.md's schema: the study arm (``conf/arm``) whose job wrote the row.
ARM_COLUMN = "arm"
#: Optional columns beyond DESIGN.md's schema: a hash of everything that determines the weights
#: except the seed (``bench.train.cache.model_config_id``; what tells two series apart beyond the
#: named columns, ``bench.core.series``), and the passkey template a ``passkey_acc`` row measured.
MODEL_CONFIG_COLUMN = "model_config_id"
TEMPLATE_COLUMN = "template"
#: Optional column: the training recipe (``bench.train.cache.recipe_id``: what determines the
#: weights but the position family, the model switches, the seed and a fine-tune), equal for
#: every design trained alike; the leaderboard ranks only rows of one recipe together.
RECIPE_COLUMN = "recipe"
#: Optional columns of RULER rows (``bench.eval.metrics.ruler``): the task a row measured, and its
#: parameters as canonical JSON (for ``effective_length`` rows: the score and the rule used).
TASK_COLUMNS = ["task", "task_params"]
#: Optional column of ``nll`` rows under ``max_windows: fill``: S, the tokens of each document
#: that every eval length scores (``bench.eval.metrics.nll``).
SPAN_COLUMN = "span"
#: Optional column of a fine-tuned model's rows: ``model_config_id`` of the same fine-tune with 0
#: updates, equal for every update count of one recipe (the points of one recovery curve).
CURVE_COLUMN = "finetune_curve_id"
#: Optional list columns of a whole-window ``nll`` row: each document's summed NLL (nats) and its
#: scored tokens, in the run's document order (the same documents at every eval length), so that
#: an interval can resample documents as well as seeds (``bench.findings``).
DOC_COLUMNS = ["doc_nll_sums", "doc_tokens"]
#: Optional columns of a model fine-tuned at length (``bench.train.extend``); empty for the others.
FINETUNE_COLUMNS: list[str] = [
    "finetune_method",
    "finetune_length",
    "finetune_steps",
    "parent_model_id",
]
OPTIONAL_COLUMNS: list[str] = [
    "bucket_lo",
    "bucket_hi",
    "axis",
    "axis_value",
    "layer",
    "ci_lo",
    "ci_hi",
]
TIMESTAMP_COLUMN = "written_at"

#: Metric names from DESIGN.md plus ``passkey_context``. Other metric names are accepted too.
ROW_METRICS: tuple[str, ...] = (
    "nll",
    "passkey_acc",
    "passkey_context",
    "shift_dnll",
    "order_dnll",
    "attn_entropy",
    "context_nll",
    "position_probe_r2",
    "longppl",
)

_STRING_COLUMNS = [
    "experiment",
    "run_id",
    "model_id",
    "position",
    "scaling",
    "metric",
    "corpus",
    "corpus_fingerprint",
    "code_version",
]
_PARAMS_COLUMNS = ["position_params", "scaling_params"]
_INT_COLUMNS = ["train_length", "eval_length", "n", "seed"]
_FLOAT_OPTIONAL = ["bucket_lo", "bucket_hi", "ci_lo", "ci_hi"]
_INT_OPTIONAL = ["layer", "finetune_length", "finetune_steps", "span"]
_STRING_OPTIONAL = [
    "arm",
    "axis",
    "finetune_method",
    "parent_model_id",
    "model_config_id",
    "template",
    "finetune_curve_id",
    *TASK_COLUMNS,
]


# ----------------------------------------------------------------------------- canonical JSON


def _plain(obj: Any, canonical: bool = False) -> Any:
    """``obj`` as plain JSON types with stable numbers. ``canonical``: for canonical JSON, floats are
    rounded to 12 significant digits (so ``3e-3 * 0.1`` and ``3e-4`` agree) and non-finite ones
    become strings."""
    if obj is None or isinstance(obj, (bool, np.bool_)):
        return None if obj is None else bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        # float32 & co.: use their own shortest repr so 0.1f stays 0.1, not 0.10000000149
        x = float(str(obj)) if isinstance(obj, np.floating) and obj.itemsize < 8 else float(obj)
        if not math.isfinite(x):
            return repr(x) if canonical else x
        if x.is_integer() and abs(x) < 2**53:
            return int(x)  # 4.0 and 4 are the same parameter value
        return float(f"{x:.12g}") if canonical else x
    if isinstance(obj, str):
        return obj
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, Mapping):
        return {str(k): _plain(v, canonical) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return [_plain(v, canonical) for v in obj.tolist()]
    if isinstance(obj, (Sequence, set, frozenset)) and not isinstance(obj, (bytes, bytearray)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
        return [_plain(v, canonical) for v in items]
    if callable(getattr(obj, "item", None)):  # torch scalars
        return _plain(obj.item(), canonical)
    raise ValueError(
        f"cannot encode {obj!r} (type {type(obj).__name__}) as JSON; allowed are None, bool, "
        "int, float, str, paths, mappings and sequences of those"
    )


def canonical_json(obj: Any) -> str:
    """Canonical JSON for ``*_params`` columns and checkpoint keys: sorted keys, compact
    separators, stable numbers.

    Integral floats are written as integers (``4.0`` -> ``4``), other floats rounded to 12
    significant digits, numpy scalars and float32 values use their shortest representation,
    non-finite floats become strings, tuples become lists and ``None`` becomes ``{}``, so the same
    parameters always give the same string.
    """
    if obj is None:
        obj = {}
    return json.dumps(
        _plain(obj, canonical=True), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def _canonical_params(value: Any, column: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "{}"
    if isinstance(value, str):
        text = value.strip() or "{}"
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"column {column!r} holds {value!r}, which is not JSON; allowed are JSON strings, "
                "dicts or None"
            ) from exc
        return canonical_json(parsed)
    return canonical_json(value)


def _canonical_axis_value(value: Any) -> Any:
    if value is None or value is pd.NA:
        return None
    if isinstance(value, (float, np.floating)) and math.isnan(float(value)):
        return None
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        x = _plain(value)
        return str(x) if isinstance(x, int) else repr(x)
    return str(value)


# ----------------------------------------------------------------------------- validation


def normalize_results(frame: pd.DataFrame | Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Validate result rows and return a copy with canonical column types and order.

    Raises ``ValueError`` naming the first problem: a missing required column, a missing value in
    a required column, or a value of the wrong type. Optional columns that are absent are added
    empty; a missing ``written_at`` is set to now (UTC). Extra columns are kept at the end.
    """
    df = frame.copy() if isinstance(frame, pd.DataFrame) else pd.DataFrame(list(frame))
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"results are missing required column(s) {', '.join(repr(c) for c in missing)}; "
            f"required columns are: {', '.join(REQUIRED_COLUMNS)}"
        )
    df = df.reset_index(drop=True)
    # the checks below run in this order so that the first problem named stays the same
    _check_required_present(df)
    _normalize_names(df)
    _normalize_required_numbers(df)
    _normalize_optional_numbers(df)
    _normalize_optional_objects(df)
    _normalize_timestamps(df)
    ordered = (
        REQUIRED_COLUMNS
        + OPTIONAL_COLUMNS
        + [ARM_COLUMN, MODEL_CONFIG_COLUMN, TEMPLATE_COLUMN, SPAN_COLUMN, CURVE_COLUMN]
        + TASK_COLUMNS
        + DOC_COLUMNS
        + FINETUNE_COLUMNS
        + [TIMESTAMP_COLUMN]
    )
    extras = [c for c in df.columns if c not in ordered]
    return df[ordered + extras]


def _check_required_present(df: pd.DataFrame) -> None:
    """Raise on the first row that leaves a required string or integer column empty."""
    for col in _STRING_COLUMNS + _INT_COLUMNS:
        if df[col].isna().any():
            bad = int(df[col].isna().to_numpy().nonzero()[0][0])
            raise ValueError(
                f"required column {col!r} is empty in row {bad}; every row needs a value"
            )


def _normalize_names(df: pd.DataFrame) -> None:
    """Required names as non-empty ``str`` and ``*_params`` as canonical JSON (in place)."""
    for col in _STRING_COLUMNS:
        values = [str(v) for v in df[col].tolist()]
        if any(v == "" for v in values):
            raise ValueError(
                f"required column {col!r} holds an empty string; give a non-empty name"
            )
        df[col] = pd.Series(values, dtype=object, index=df.index)
    for col in _PARAMS_COLUMNS:
        memo: dict[str, str] = {}  # few distinct values: canonicalize each once

        def canon(v: Any, col: str = col, memo: dict[str, str] = memo) -> str:
            if isinstance(v, str):
                if v not in memo:
                    memo[v] = _canonical_params(v, col)
                return memo[v]
            return _canonical_params(v, col)

        df[col] = pd.Series([canon(v) for v in df[col].tolist()], dtype=object, index=df.index)


def _normalize_required_numbers(df: pd.DataFrame) -> None:
    """Required integer columns as int64 and ``value`` as float64 (in place)."""
    for col in _INT_COLUMNS:
        numeric = pd.to_numeric(df[col], errors="coerce")
        bad = numeric.isna() | (numeric != np.floor(numeric))
        if bad.any():
            idx = int(bad.to_numpy().nonzero()[0][0])
            raise ValueError(
                f"column {col!r} must hold integers, got {df[col].iloc[idx]!r} in row {idx}"
            )
        if col == "n" and (numeric < 0).any():  # a count of tokens, documents or trials
            idx = int((numeric < 0).to_numpy().nonzero()[0][0])
            raise ValueError(
                f"column 'n' must hold counts >= 0, got {int(numeric.iloc[idx])} in row {idx}"
            )
        df[col] = numeric.astype("int64")

    value = pd.to_numeric(df["value"], errors="coerce")
    bad = value.isna() & df["value"].notna()
    if bad.any():
        idx = int(bad.to_numpy().nonzero()[0][0])
        raise ValueError(
            f"column 'value' must hold numbers, got {df['value'].iloc[idx]!r} in row {idx}"
        )
    df["value"] = value.astype("float64")


def _normalize_optional_numbers(df: pd.DataFrame) -> None:
    """Optional float columns as float64 (NaN when absent), integer ones as nullable Int64."""
    for col in _FLOAT_OPTIONAL:
        if col not in df.columns:
            df[col] = np.nan
        else:
            numeric = pd.to_numeric(df[col], errors="coerce")
            bad = numeric.isna() & df[col].notna()
            if bad.any():
                idx = int(bad.to_numpy().nonzero()[0][0])
                raise ValueError(
                    f"column {col!r} must hold numbers or be empty, got {df[col].iloc[idx]!r} in row {idx}"
                )
            # an interval ends somewhere: an infinite end is a computation gone wrong
            if col in ("ci_lo", "ci_hi") and np.isinf(numeric).any():
                idx = int(np.isinf(numeric).to_numpy().nonzero()[0][0])
                raise ValueError(
                    f"column {col!r} must hold finite numbers or be empty, got "
                    f"{float(numeric.iloc[idx])} in row {idx}"
                )
            df[col] = numeric.astype("float64")
    for col in _INT_OPTIONAL:
        if col not in df.columns:
            df[col] = pd.array([pd.NA] * len(df), dtype="Int64")
            continue
        numeric = pd.to_numeric(df[col], errors="coerce")
        if (
            (numeric.isna() & df[col].notna()) | (numeric.notna() & (numeric != np.floor(numeric)))
        ).any():
            raise ValueError(f"column {col!r} must hold integers or be empty")
        df[col] = numeric.astype("Int64")


def _normalize_optional_objects(df: pd.DataFrame) -> None:
    """Optional string, per-document list and ``axis_value`` columns, ``None`` where missing."""
    for col in _STRING_OPTIONAL:
        values = df[col].tolist() if col in df.columns else [None] * len(df)
        df[col] = pd.Series(
            [None if _is_missing(v) else str(v) for v in values], dtype=object, index=df.index
        )
    for col in DOC_COLUMNS:
        values = df[col].tolist() if col in df.columns else [None] * len(df)
        df[col] = pd.Series(
            [None if _is_missing(v) else _numbers(v, col, i) for i, v in enumerate(values)],
            dtype=object,
            index=df.index,
        )
    if "axis_value" not in df.columns:
        df["axis_value"] = pd.Series([None] * len(df), dtype=object, index=df.index)
    else:
        df["axis_value"] = pd.Series(
            [_canonical_axis_value(v) for v in df["axis_value"].tolist()],
            dtype=object,
            index=df.index,
        )


def _normalize_timestamps(df: pd.DataFrame) -> None:
    """``written_at`` as UTC microsecond timestamps; missing ones become now (in place)."""
    if TIMESTAMP_COLUMN not in df.columns or df[TIMESTAMP_COLUMN].isna().all():
        df[TIMESTAMP_COLUMN] = pd.Timestamp(datetime.now(timezone.utc))
    else:
        try:
            stamps = pd.to_datetime(df[TIMESTAMP_COLUMN], utc=True)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"column {TIMESTAMP_COLUMN!r} must hold timestamps: {exc}") from exc
        df[TIMESTAMP_COLUMN] = stamps.fillna(pd.Timestamp(datetime.now(timezone.utc)))
    df[TIMESTAMP_COLUMN] = df[TIMESTAMP_COLUMN].astype("datetime64[us, UTC]")


def _numbers(values: Any, col: str, row: int) -> list[float]:
    """A per-document list as floats; one sentence when it holds something else."""
    try:
        return [float(x) for x in values]
    except (TypeError, ValueError):
        raise ValueError(
            f"column {col!r} must hold lists of numbers or be empty, got {values!r} in row {row}"
        ) from None


def _is_missing(v: Any) -> bool:
    if v is None or v is pd.NA:
        return True
    return isinstance(v, float) and math.isnan(v)


# ----------------------------------------------------------------------------- finite values


def _as_float(value: Any) -> float:
    try:
        return float("nan") if _is_missing(value) else float(value)
    except (TypeError, ValueError):
        return float("nan")


def non_finite_row(rows: pd.DataFrame | Sequence[Mapping[str, Any]]) -> int | None:
    """Index (position) of the first row whose measured value is NaN or infinite, else None.

    A row with ``n > 0`` measured something, so its ``value`` must be a finite number; a row with
    ``n == 0`` measured nothing (e.g. ``nll`` when no test document is long enough) and holds NaN
    (not infinity, which is a number gone wrong).
    """
    if isinstance(rows, pd.DataFrame):
        if rows.empty:
            return None
        values = pd.to_numeric(rows["value"], errors="coerce").to_numpy(dtype=float)
        n = pd.to_numeric(rows["n"], errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(values) & ~((n == 0) & np.isnan(values))
        return int(bad.nonzero()[0][0]) if bad.any() else None
    for i, row in enumerate(rows):
        value = _as_float(row.get("value"))
        if not math.isfinite(value) and not (_as_float(row.get("n")) == 0 and math.isnan(value)):
            return i
    return None


def describe_row(row: Mapping[str, Any] | pd.Series) -> str:
    """``metric nll at eval length 1024 (bucket 512-1024) of series position rope {...}, scaling
    none {...}, train length 256 (model ..., seed 0)``: where a row's value was measured."""

    def get(key: str) -> Any:
        value = row.get(key)
        return None if _is_missing(value) else value

    where = []
    if get("bucket_lo") is not None or get("bucket_hi") is not None:
        where.append(f"bucket {_number(get('bucket_lo'))}-{_number(get('bucket_hi'))}")
    if get("axis") is not None:
        where.append(f"{get('axis')}={get('axis_value')}")
    if get("layer") is not None:
        where.append(f"layer {get('layer')}")
    for key in ("task", "template"):
        if get(key) is not None:
            where.append(f"{key} {get(key)}")
    series = f"position {get('position')}"
    if get("position_params") not in (None, "", "{}"):
        series += f" {get('position_params')}"
    series += f", scaling {get('scaling')}"
    if get("scaling_params") not in (None, "", "{}"):
        series += f" {get('scaling_params')}"
    if get("train_length") is not None:
        series += f", train length {get('train_length')}"
    if get("finetune_method") is not None:
        series += f", fine-tune {get('finetune_method')} at {get('finetune_length')}"
        series += f" ({get('finetune_steps')} updates)"
    model = [f"model {get('model_id')}"] if get("model_id") is not None else []
    model += [f"seed {get('seed')}"] if get("seed") is not None else []
    text = f"metric {get('metric')} at eval length {get('eval_length')}"
    if where:
        text += f" ({', '.join(where)})"
    text += f" of series {series}"
    return text + (f" ({', '.join(model)})" if model else "")


def _number(value: Any) -> str:
    if value is None:
        return "?"
    x = float(value)
    return str(int(x)) if x.is_integer() else repr(x)
