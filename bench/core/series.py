"""A *series*: the full identity of a measured model minus its seed, under one scaling.

Seeds are the only replicate axis: rows of one series and different seeds are replicates; rows
of different series are never pooled, in the Findings (``bench.findings``) and in the report's
tables and plots (``bench.report.frame``) alike. Both use :func:`series_key`.

The identity is :data:`SERIES_COLUMNS`: experiment, arm, position and its parameters, the
training's position sampling and attention sink (where set; also inside ``model_config_id``), scaling
and its parameters, training length, ``model_config_id`` (a hash of everything else that
determines the weights: model, data, training settings, fine-tune settings; the seed left out),
corpus fingerprint, and the fine-tune's method, length and steps. A column a frame lacks (older
rows) counts as one value.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

__all__ = [
    "MODEL_COLUMNS",
    "SERIES_COLUMNS",
    "columns_key",
    "model_series_key",
    "series_key",
    "series_labels",
]

#: Model switches that make a model its own series (``model.qk_norm``, ``model.output_gate``,
#: ``model.attn_scale``, ``model.attention``): a row carries the column only when the switch is on
#: (its value names the variant).
SWITCH_COLUMNS: list[str] = ["qk_norm", "output_gate", "attn_scale", "attention"]
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
    """One opaque string per row, equal exactly for rows equal in ``columns`` (missing = "")."""
    if df.empty:
        return pd.Series([], index=df.index, dtype=object)
    parts = [_text(df[c]) if c in df.columns else pd.Series("", index=df.index) for c in columns]
    key = parts[0]
    for p in parts[1:]:
        key = key + _SEP + p
    return key


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
    split = {k: k.split(_SEP) for k in distinct}
    differing = [i for i in range(len(columns)) if len({split[k][i] for k in distinct}) > 1]
    out = {}
    for k in distinct:
        parts = []
        for i in differing:
            value = split[k][i] or "–"
            if columns[i] == "model_config_id":
                value = value[:8]
            parts.append(f"{columns[i]}={value}")
        out[k] = ", ".join(parts)
    return out
