"""A *series*: the full identity of a measured model minus its seed, under one scaling.

Seeds are the only replicate axis: rows of one series and different seeds are replicates; rows
of different series are never pooled, in the Findings (``bench.findings``) and in the report's
tables and plots (``bench.report.frame``) alike. Both use :func:`series_key`.

The identity is :data:`SERIES_COLUMNS`: experiment, arm, position and its parameters, the
training's position sampling, attention sink and model switches (where set; also inside
``model_config_id``), scaling
and its parameters, training length, ``model_config_id`` (a hash of everything else that
determines the weights: model, data, training settings, fine-tune settings; the seed left out),
corpus fingerprint, and the fine-tune's method, length and steps. A column a frame lacks (older
rows) counts as one value.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from models.designs.registry import design_column_names

__all__ = [
    "MODEL_COLUMNS",
    "SERIES_COLUMNS",
    "SWITCH_COLUMNS",
    "columns_key",
    "key_values",
    "model_series_key",
    "series_key",
    "series_labels",
]

#: Model switches that make a model its own series, from the design registry
#: (``models.designs.registry``: ``model.qk_norm``, ``model.output_gate``, ``model.attn_scale``,
#: ``model.attention``, ``model.mixer`` and ``model.hybrid_every``): a row carries the column only
#: when the switch is on (its value names the variant). The attention sink's column is the
#: series' too, but no switch column: the Findings scope it by ``sinks``.
SWITCH_COLUMNS: list[str] = [c for c in design_column_names() if c != "attention_sink"]
#: Switch columns added since the committed rows (the mixer's): a key holds each as a
#: "name=value" part after the others, and only where it is set, so that the key of every row
#: without them is the string it was (the leaderboard seeds its bootstraps with series keys).
TAGGED_COLUMNS: list[str] = [
    c for c in SWITCH_COLUMNS if c not in ("qk_norm", "output_gate", "attn_scale", "attention")
]
#: What identifies a series (a model identity minus the seed, under one eval-time scaling).
SERIES_COLUMNS: list[str] = [
    "experiment",
    "arm",
    "position",
    "position_params",
    "position_sampling",
    "attention_sink",
    *SWITCH_COLUMNS,
    "scaling",
    "scaling_params",
    "train_length",
    "model_config_id",
    "corpus_fingerprint",
    "finetune_method",
    "finetune_length",
    "finetune_steps",
]
#: A series minus its eval-time scaling: the trained model (all seeds of it). Two series with the
#: same model series key differ only in how the model was evaluated, so their seeds pair.
MODEL_COLUMNS: list[str] = [c for c in SERIES_COLUMNS if c not in ("scaling", "scaling_params")]

_SEP = "\x1f"


def _text(values: pd.Series) -> pd.Series:
    """A column as text, missing values as "" (so that groupby never drops them)."""
    out = values.astype(object)
    return out.where(out.notna(), "").map(str)


def columns_key(df: pd.DataFrame, columns: Sequence[str]) -> pd.Series:
    """One opaque string per row, equal exactly for rows equal in ``columns`` (missing = ""):
    the values of the columns but :data:`TAGGED_COLUMNS` in order, then "name=value" of each
    tagged column where it is set."""
    if df.empty:
        return pd.Series([], index=df.index, dtype=object)
    fixed = [c for c in columns if c not in TAGGED_COLUMNS]
    parts = [_text(df[c]) if c in df.columns else pd.Series("", index=df.index) for c in fixed]
    key = parts[0]
    for p in parts[1:]:
        key = key + _SEP + p
    for c in columns:
        if c in TAGGED_COLUMNS and c in df.columns:
            key = key + _text(df[c]).map(lambda v, c=c: f"{_SEP}{c}={v}" if v else "")
    return key


def key_values(key: str, columns: Sequence[str]) -> dict[str, str]:
    """The column values a :func:`columns_key` key holds (a tagged column not set: "")."""
    fixed = [c for c in columns if c not in TAGGED_COLUMNS]
    parts = key.split(_SEP)
    values = dict(zip(fixed, parts[: len(fixed)], strict=True))
    for part in parts[len(fixed) :]:
        name, _, value = part.partition("=")
        values[name] = value
    return values


def series_key(df: pd.DataFrame) -> pd.Series:
    """One opaque string per row, equal exactly for rows of the same series."""
    return columns_key(df, SERIES_COLUMNS)


def model_series_key(df: pd.DataFrame) -> pd.Series:
    """One opaque string per row, equal for rows of the same trained model series (any scaling)."""
    return columns_key(df, MODEL_COLUMNS)


def series_labels(keys: Sequence[str], columns: Sequence[str] = SERIES_COLUMNS) -> dict[str, str]:
    """Short text per distinct key: only the columns whose values differ between the keys
    ("" for all when there is one key), e.g. "experiment=findings" / "experiment=quickstart"."""
    distinct = list(dict.fromkeys(keys))
    split = {k: key_values(k, columns) for k in distinct}
    differing = [c for c in columns if len({split[k].get(c, "") for k in distinct}) > 1]
    out = {}
    for k in distinct:
        parts = []
        for column in differing:
            value = split[k].get(column, "") or "–"
            if column == "model_config_id":
                value = value[:8]
            parts.append(f"{column}={value}")
        out[k] = ", ".join(parts)
    return out
