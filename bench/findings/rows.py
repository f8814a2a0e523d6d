"""Which result rows a finding reads: one column (absent columns read as NaN), one position and
scaling (:func:`select`), one series (:func:`by_series`), whole-window NLL, passkey rows and
their trials, per-seed values at one multiple of the training length. Shared by every study
module of :mod:`bench.findings`; nothing here decides anything."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from bench.core.series import SERIES_COLUMNS, model_series_key, series_key, series_labels
from bench.core.stats import DocSums, se_from_ci


def col(df: pd.DataFrame, name: str) -> pd.Series:
    """Column ``name`` of ``df``, or NaN where the rows do not have it."""
    return df[name] if name in df.columns else pd.Series(np.nan, index=df.index)


def with_series(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with ``_series`` / ``_model`` keys (``bench.core.series``), computed once."""
    if "_series" in df.columns:
        return df
    return df.assign(_series=series_key(df), _model=model_series_key(df))


def select(df: pd.DataFrame, position: str, scaling: str | None = "none", tuned: str | None = None):
    """Rows of one position x scaling (any when None); zero-shot (no ``finetune_method``) unless
    ``tuned`` names the fine-tune method (a fine-tune's scaling label is its own, e.g. "pi")."""
    df = with_series(df)
    method = col(df, "finetune_method")
    keep = df["position"] == position
    if scaling is not None:
        keep &= df["scaling"] == scaling
    keep &= method.isna() if tuned is None else (method == tuned)
    return df[keep]


def by_series(rows: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(series key, its rows) per series in ``rows``, in key order."""
    rows = with_series(rows)
    return [(str(k), g) for k, g in rows.groupby("_series", sort=True)]


def named(name: str, key: str, labels: dict[str, str]) -> str:
    """``name``, with the series' distinguishing label where several series matched."""
    label = labels.get(key, "")
    return f"{name} [{label}]" if label else name


def window_nll(df: pd.DataFrame) -> pd.DataFrame:
    """Whole-window ``nll`` rows (no bucket columns) with tokens and a finite value."""
    keep = (df["metric"] == "nll") & col(df, "bucket_lo").isna() & col(df, "bucket_hi").isna()
    keep &= (df["n"] > 0) & np.isfinite(df["value"])
    return df[keep]


def at(rows: pd.DataFrame, multiple: float | None) -> pd.DataFrame:
    """The rows at eval length = ``multiple`` x their training length (all when None)."""
    if multiple is None:
        return rows
    return rows[rows["eval_length"] == (rows["train_length"] * multiple).round().astype(int)]


def per_seed(rows: pd.DataFrame, multiple: float | None) -> pd.DataFrame:
    """Per seed of one series: token-weighted value, with an se from the stored CI, at eval
    length = ``multiple`` x L (any eval length when None). Rows of one series and seed come from
    one model, so nothing of different models is averaged."""
    rows = at(rows, multiple)
    if rows.empty:
        return pd.DataFrame(columns=["seed", "value", "se"])
    se = se_from_ci(col(rows, "ci_hi") - col(rows, "ci_lo"))
    w = rows.assign(_w=rows["n"].astype(float), _se=se)
    return (
        w.groupby("seed")
        .apply(
            lambda g: pd.Series(
                {
                    "value": np.average(g["value"], weights=g["_w"]),
                    "se": math.sqrt(np.average(g["_se"] ** 2, weights=g["_w"])),
                }
            ),
            include_groups=False,
        )
        .reset_index()
    )


def doc_sums(rows: pd.DataFrame, multiple: float) -> DocSums:
    """Per seed: the whole-window row's per-document NLL sums and tokens at ``multiple`` x L;
    empty when any seed's row lacks them (rows written before they were stored)."""
    rows = at(window_nll(rows), multiple)
    out = {}
    for seed, g in rows.groupby("seed"):
        sums, tokens = col(g, "doc_nll_sums").iloc[0], col(g, "doc_tokens").iloc[0]
        if len(g) != 1 or not isinstance(sums, (list, np.ndarray)):
            return {}
        out[int(seed)] = (np.asarray(sums, dtype=float), np.asarray(tokens, dtype=float))
    return out


def passkey(rows: pd.DataFrame) -> pd.DataFrame:
    """Per-length ``passkey_acc`` rows: axis="template" (or no axis, as older rows have it)."""
    axis = col(rows, "axis")
    return rows[(rows["metric"] == "passkey_acc") & ((axis == "template") | axis.isna())]


def template(p: pd.DataFrame) -> pd.Series:
    """The template of per-length passkey rows (older rows have it only as the axis value)."""
    value = col(p, "template").astype(object)
    return value.where(value.notna(), col(p, "axis_value").astype(object))


def passkey_series(rows: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Per-length passkey rows per series and template (two templates are two measurements)."""
    p = passkey(with_series(rows))
    if p.empty:
        return []
    t = template(p)
    p = p.assign(_series=p["_series"] + "\x1f" + t.where(t.notna(), "").map(str))
    return by_series(p)


def passkey_labels(keys: list[str]) -> dict[str, str]:
    """What tells the passkey series ``keys`` apart (:func:`passkey_series`: template too)."""
    return series_labels(keys, [*SERIES_COLUMNS, "template"])


def trials(rows: pd.DataFrame) -> pd.DataFrame:
    """Per seed: successes, trials (from value x n) and accuracy."""
    n = rows["n"].astype(float)
    k = (rows["value"].astype(float) * n).round()
    t = rows.assign(_k=k, _n=n).groupby("seed")[["_k", "_n"]].sum()
    return pd.DataFrame({"k": t["_k"], "n": t["_n"], "acc": t["_k"] / t["_n"]}).reset_index()


def shift_rows(df: pd.DataFrame, position: str) -> pd.DataFrame:
    """Raw ``shift_dnll`` rows of ``position`` at every delta > 0 (column ``delta``)."""
    rows = select(df, position)
    rows = rows[(rows["metric"] == "shift_dnll") & (col(rows, "axis") == "delta")]
    return rows.assign(delta=pd.to_numeric(rows["axis_value"], errors="coerce")).query("delta > 0")
