"""Result rows -> report tables: series labels and order, token-weighted aggregation, pivots.

A *series* is one line in a plot: one (experiment, position, scaling, train length) with its
parameters. Every summary table groups the (deduplicated, ``row_id``-numbered) result rows by
series plus its own axes and keeps the ids of the rows it was computed from.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence

import numpy as np
import pandas as pd

from models.scaling_config import ORACLE_SUFFIX

POSITION_ORDER = ["rope", "sinusoidal", "learned", "alibi", "nope"]
SCALING_ORDER = ["none", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope", "logn"]
SERIES_KEYS = [
    "experiment",
    "position",
    "position_params",
    "scaling",
    "scaling_params",
    "train_length",
]
LABEL_KEYS = ["series", "position_label", "scaling_label"]
#: Columns constant within one series (what every summary table groups by, before its own axes).
GROUP_KEYS = [*SERIES_KEYS, *LABEL_KEYS, "series_rank"]


@functools.lru_cache(maxsize=1024)
def params_text(params: str) -> str:
    try:
        parsed = json.loads(params)
    except (TypeError, json.JSONDecodeError):
        return str(params)
    if isinstance(parsed, dict):
        return ",".join(f"{k}={v}" for k, v in parsed.items())
    return str(parsed)


def rank(value: str, order: list[str]) -> int:
    return order.index(value) if value in order else len(order)


#: Scaling-label parts that tell a model fine-tuned at length ("pi ft@4x", bench.extend) from
#: eval-time scaling of a model that was not ("linear (zero-shot)").
FINETUNE_MARK = " ft@"
ZERO_SHOT = " (zero-shot)"


def finetune_labels(df: pd.DataFrame) -> list[str]:
    """``scaling_label`` with fine-tunes marked: "<label> ft@<m>x" (m = finetune_length /
    train_length; ", <n> steps" too where one label has several step counts), and
    "<label> (zero-shot)" for other scalings than none where the frame has fine-tunes."""
    labels = df["scaling_label"].tolist()
    if "finetune_method" not in df.columns or not df["finetune_method"].notna().any():
        return labels
    tuned = df["finetune_method"].notna().tolist()
    out = []
    for label, is_tuned, scaling, length, train_length in zip(
        labels, tuned, df["scaling"], df["finetune_length"], df["train_length"], strict=True
    ):
        if is_tuned:
            out.append(f"{label}{FINETUNE_MARK}{float(length) / float(train_length):g}x")
        else:
            out.append(label if scaling == "none" else label + ZERO_SHOT)
    frame = pd.DataFrame({"label": out, "steps": df["finetune_steps"].tolist(), "tuned": tuned})
    n_steps = frame[frame["tuned"]].groupby("label")["steps"].nunique()
    several = set(n_steps[n_steps > 1].index)
    return [
        f"{label}, {int(steps)} steps" if is_tuned and label in several else label
        for label, steps, is_tuned in zip(out, frame["steps"], tuned, strict=True)
    ]


def add_labels(df: pd.DataFrame) -> pd.DataFrame:
    """Add ``position_label``, ``scaling_label`` (fine-tunes marked: :func:`finetune_labels`),
    ``series`` (legend text) and ``series_rank``."""
    df = df.copy()
    for kind in ("position", "scaling"):
        n_params = df.groupby(kind)[f"{kind}_params"].nunique()
        varied = set(n_params[n_params > 1].index)
        labels = []
        for name, params in zip(df[kind], df[f"{kind}_params"], strict=True):
            text = params_text(params)
            labels.append(f"{name} ({text})" if name in varied and text else name)
        df[f"{kind}_label"] = labels
    df["scaling_label"] = finetune_labels(df)
    series = df["position_label"] + " / " + df["scaling_label"]
    if df["train_length"].nunique() > 1:
        series = series + " L=" + df["train_length"].astype(str)
    if df["experiment"].nunique() > 1:
        series = series + " [" + df["experiment"] + "]"
    df["series"] = series
    keys = (
        df[["position", "position_label", "scaling", "scaling_label", "train_length", "experiment"]]
        .drop_duplicates()
        .assign(
            _pr=lambda d: [rank(p, POSITION_ORDER) for p in d["position"]],
            # an oracle series (a factor per eval length) right after its method's
            _sr=lambda d: [
                rank(s.removesuffix(ORACLE_SUFFIX), SCALING_ORDER) for s in d["scaling"]
            ],
        )
        .sort_values(
            ["_pr", "position_label", "_sr", "scaling_label", "train_length", "experiment"]
        )
    )
    ranks: dict[tuple, int] = {}
    for pos, scal, tl, exp in zip(
        keys["position_label"],
        keys["scaling_label"],
        keys["train_length"],
        keys["experiment"],
        strict=True,
    ):
        ranks.setdefault((pos, scal, tl, exp), len(ranks))
    df["series_rank"] = [
        ranks[k]
        for k in zip(
            df["position_label"],
            df["scaling_label"],
            df["train_length"],
            df["experiment"],
            strict=True,
        )
    ]
    return df


def aggregate(rows: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Token-weighted (weights ``n``) mean of ``value`` (and ``ci_lo``/``ci_hi``) per group.

    Adds ``n`` (summed), ``n_seeds``, ``n_rows`` and ``row_ids``. A NaN value with n > 0 makes
    its group's mean NaN (never silently skipped); NaN rows with n = 0 (nothing measured) carry
    no weight; a group whose weights sum to 0 gets the plain mean of its values.
    """
    out_cols = [*keys, "value", "ci_lo", "ci_hi", "n", "n_seeds", "n_rows", "row_ids"]
    if rows.empty:
        return pd.DataFrame(columns=out_cols)
    r = rows.sort_values("row_id")
    r["_rid"] = r["row_id"].astype(str)
    w = r["n"].astype(float).clip(lower=0.0)
    r["_w"] = w
    r["_wv"] = r["value"] * w
    r["_nan"] = r["value"].isna() & (w > 0)  # an empty (n=0) NaN row carries no tokens
    r["_wlo"] = r["ci_lo"] * w
    r["_whi"] = r["ci_hi"] * w
    r["_cinan"] = (r["ci_lo"].isna() | r["ci_hi"].isna()) & (w > 0)
    g = r.groupby(keys, dropna=False, sort=False)
    a = g.agg(
        _w=("_w", "sum"),
        _wv=("_wv", "sum"),
        _mean=("value", "mean"),
        _nan=("_nan", "any"),
        _wlo=("_wlo", "sum"),
        _whi=("_whi", "sum"),
        _lo=("ci_lo", "mean"),
        _hi=("ci_hi", "mean"),
        _cinan=("_cinan", "any"),
        n=("n", "sum"),
        n_seeds=("seed", "nunique"),
        n_rows=("value", "size"),
        row_ids=("_rid", ";".join),  # rows are sorted by row_id, so the list is too
    ).reset_index()
    pos = a["_w"] > 0
    a["value"] = np.where(pos, a["_wv"] / a["_w"].where(pos, 1.0), a["_mean"])
    a.loc[a["_nan"].astype(bool), "value"] = np.nan
    a["ci_lo"] = np.where(pos, a["_wlo"] / a["_w"].where(pos, 1.0), a["_lo"])
    a["ci_hi"] = np.where(pos, a["_whi"] / a["_w"].where(pos, 1.0), a["_hi"])
    a.loc[a["_cinan"].astype(bool), ["ci_lo", "ci_hi"]] = np.nan
    return a[out_cols]


def sort_series(df: pd.DataFrame, extra: Sequence[str] = ()) -> pd.DataFrame:
    return df.sort_values(["series_rank", *extra], kind="stable").reset_index(drop=True)


def pivot(df: pd.DataFrame, index: list[str], columns: str, values: str) -> pd.DataFrame:
    """Wide view of a long table; only existing index combinations, missing cells NaN. The
    first index level (``series_rank``, used for ordering) is dropped."""
    wide = df.set_index([*index, columns])[values].unstack(columns)
    wide = wide.sort_index()
    if columns == "region":  # inside before beyond, then anything else
        wide = wide[
            sorted(wide.columns, key=lambda r: (rank(str(r), ["inside", "beyond"]), str(r)))
        ]
    wide.columns.name = None
    return wide.droplevel(0) if index[0] == "series_rank" else wide


def numeric_axis(values: pd.Series) -> pd.Series:
    return pd.to_numeric(values, errors="coerce")


def summary_or_detail(
    rows: pd.DataFrame, keys: list[str], summary: pd.Series, labels: tuple[str, str]
) -> pd.DataFrame:
    """Aggregate ``rows`` per ``keys``, using a group's summary rows (``summary`` mask, e.g. the
    whole-window NLL row) where it has any, else its detail rows (e.g. the buckets), so nothing
    is counted twice. Adds a ``source`` column naming which (``labels`` = (summary, detail))."""
    mask = summary.to_numpy(dtype=bool)
    have = set(map(tuple, rows.loc[mask, keys].drop_duplicates().to_numpy().tolist()))
    in_have = np.array([tuple(k) in have for k in rows[keys].to_numpy().tolist()], dtype=bool)
    t = aggregate(rows[mask | ~in_have], keys)
    if not t.empty:
        t["source"] = [
            labels[0] if k in have else labels[1] for k in map(tuple, t[keys].to_numpy().tolist())
        ]
    return t
