"""Result rows -> report tables: series labels and order, token-weighted aggregation, pivots.

A *series* is one line in a plot: one model identity minus the seed under one scaling
(``bench.core.series``, the definition the Findings use too). Every summary table groups the
(deduplicated, ``row_id``-numbered) result rows by series plus its own axes and keeps the ids of
the rows it was computed from.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from bench.core.series import series_key, series_labels
from models.designs.registry import design_column_names, design_mark
from models.scaling_config import ORACLE_SUFFIX

# Display order only (the report reads rows and never imports torch, so it cannot ask the
# registries in models/): names not listed here sort after these, by name, and are shown all the same.
POSITION_ORDER = [
    "rope", "sinusoidal", "learned", "alibi", "nope",
    # the zoo (models/families/zoo.py, rotary.py, cope.py): bias families, rotary variants, contextual
    "t5", "kerple_log", "kerple_power", "fire", "sandwich", "p_rope", "xpos", "cope", "hope",
]  # fmt: skip
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


def _flat_params(params: str) -> dict[str, str]:
    """Parameters as flat key -> text: the nested ``params`` of a scaling config lifted to the
    top ("factor" rather than "params={'factor': 8}")."""
    try:
        parsed = json.loads(params)
    except (TypeError, json.JSONDecodeError):
        return {"": str(params)}
    if not isinstance(parsed, dict):
        return {"": str(parsed)}

    def text(v: object) -> str:
        return json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else str(v)

    out: dict[str, str] = {}
    for k, v in parsed.items():
        if k == "params" and isinstance(v, dict):
            for k2, v2 in v.items():
                out[k2 if k2 not in parsed else f"params.{k2}"] = text(v2)
        else:
            out[k] = text(v)
    return out


def _param_labels(names: list[str], params: list[str], groups: list[object]) -> list[str]:
    """``name``, or "name (k=v,...)" with only the parameters that differ between the parameter
    sets of one name (within one group) where it has several."""
    sets: dict[tuple, set[str]] = {}
    for name, p, g in zip(names, params, groups, strict=True):
        sets.setdefault((name, g), set()).add(p)
    differing: dict[tuple, list[str]] = {}
    for key, ps in sets.items():
        if len(ps) < 2:
            continue
        flats = [_flat_params(p) for p in ps]
        keys = list(dict.fromkeys(k for f in flats for k in f))
        differing[key] = [k for k in keys if len({f.get(k) for f in flats}) > 1]
    labels = []
    for name, p, g in zip(names, params, groups, strict=True):
        keys = differing.get((name, g))
        if not keys:
            labels.append(name)
            continue
        flat = _flat_params(p)
        parts = [f"{k}={flat[k]}" if k else flat[k] for k in keys if k in flat]
        labels.append(f"{name} ({','.join(parts)})" if parts else name)
    return labels


def rank(value: str, order: Sequence[str]) -> int:
    return order.index(value) if value in order else len(order)


def scaling_rank(scaling: str) -> int:
    """Where a scaling config sorts (:data:`SCALING_ORDER`); an oracle series right after its
    method's."""
    return rank(str(scaling).removesuffix(ORACLE_SUFFIX), SCALING_ORDER)


#: Scaling-label parts that tell a model fine-tuned at length ("pi ft@4x", bench.train.extend) from
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
    """Add ``position_label`` (with the training's position sampling where it was not
    contiguous), ``scaling_label`` (fine-tunes marked: :func:`finetune_labels`),
    ``series`` (legend text; with "[arm <name>]" where the rows come from several arms,
    which train different models) and ``series_rank``."""
    df = df.copy()
    tuned = (
        df["finetune_method"].notna()
        if "finetune_method" in df.columns
        else pd.Series(False, index=df.index)
    )
    for kind in ("position", "scaling"):
        # a fine-tune's scaling is told apart by its mark, not by its (other) parameters
        group = tuned if kind == "scaling" else pd.Series(False, index=df.index)
        df[f"{kind}_label"] = _param_labels(
            df[kind].tolist(), df[f"{kind}_params"].tolist(), group.tolist()
        )
    df["scaling_label"] = finetune_labels(df)
    if "position_sampling" in df.columns:  # trained on randomized or PoSE positions
        sampled = df["position_sampling"].notna()
        df.loc[sampled, "position_label"] += " (" + df.loc[sampled, "position_sampling"] + ")"
    for column in design_column_names():  # trained with a sink or a switch on: its design's mark
        if column in df.columns:
            on = df[column].notna()
            df.loc[on, "position_label"] += df.loc[on, column].map(
                lambda v, column=column: design_mark(column, v)
            )
    series = df["position_label"] + " / " + df["scaling_label"]
    if df["train_length"].nunique() > 1:
        series = series + " L=" + df["train_length"].astype(str)
    if df["experiment"].nunique() > 1:
        series = series + " [" + df["experiment"] + "]"
    arm = _arm_labels(df)
    if arm.nunique() > 1:  # different arms train different models: never pool them
        series = series + " [arm " + arm.replace("", "–") + "]"
    # one line per series (bench.core.series, shared with the Findings): labels that still stand for
    # several series (another model configuration, corpus, ...) name what differs
    key = series_key(df)
    for label in series[key.groupby(series).transform("nunique") > 1].unique():
        mask = series == label
        texts = series_labels(key[mask].tolist())
        series[mask] = label + " [" + key[mask].map(texts) + "]"
    df["series"] = series
    keys = (
        df[["position", "position_label", "scaling", "scaling_label", "train_length", "experiment"]]
        .assign(_arm=arm, _series=series, _key=key)
        .drop_duplicates("_key")
        .assign(
            _pr=lambda d: [rank(p, POSITION_ORDER) for p in d["position"]],
            # an oracle series (a factor per eval length) right after its method's
            _sr=lambda d: [scaling_rank(s) for s in d["scaling"]],
        )
        .sort_values(
            [
                "_pr",
                "position_label",
                "_sr",
                "scaling_label",
                "train_length",
                "experiment",
                "_arm",
                "_series",
            ]
        )
    )
    ranks = {k: i for i, k in enumerate(keys["_key"])}
    df["series_rank"] = [ranks[k] for k in key]
    return df


def _arm_labels(df: pd.DataFrame) -> pd.Series:
    """The ``arm`` column as text ("" where a row has none, or the frame has no such column)."""
    if "arm" not in df.columns:
        return pd.Series("", index=df.index, dtype=object)
    return df["arm"].astype(object).where(df["arm"].notna(), "").astype(str)


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


#: Confidence level of the bands drawn in figures (as in :mod:`bench.findings`).
BAND_LEVEL = 0.95
#: ``band`` values of :func:`seed_summary`: how a point's interval was made.
SEED_BAND = "seeds"  # t-interval of the mean over seeds
RUN_BAND = "run CI"  # one seed: the run's stored (bootstrap) CI
NO_BAND = "none"  # one seed without a stored CI


def seed_summary(
    per_seed: pd.DataFrame,
    keys: Sequence[str],
    transform: Callable[[np.ndarray], np.ndarray] | None = None,
    level: float = BAND_LEVEL,
) -> pd.DataFrame:
    """Mean over seeds with an interval, per ``keys``: what a figure draws as line and band.

    ``per_seed`` has one row per ``keys`` x ``seed`` (``value``, ``ci_lo``, ``ci_hi``). Seeds
    whose value is NaN (nothing measured) are left out. With several seeds the band is the
    ``level`` t-interval of the seed mean (mean ± t·sd/√n, as the Findings use); with one seed it
    is that run's stored CI (NaN if none). ``transform`` (e.g. ``np.exp`` for NLL -> perplexity)
    is applied to value and bounds afterwards. Adds ``lo``, ``hi``, ``n_seeds`` and ``band``
    (:data:`SEED_BAND`, :data:`RUN_BAND` or :data:`NO_BAND`).
    """
    from scipy import stats

    keys = list(keys)
    cols = [*keys, "value", "lo", "hi", "n_seeds", "band"]
    ok = per_seed[np.isfinite(per_seed["value"].to_numpy(dtype=float))]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    dup = ok.duplicated([*keys, "seed"])
    if dup.any():
        raise ValueError(f"seed_summary needs one row per keys x seed; {int(dup.sum())} repeat")
    a = (
        ok.groupby(keys, dropna=False, sort=False)
        .agg(
            value=("value", "mean"),
            _sd=("value", "std"),
            n_seeds=("value", "size"),
            _lo=("ci_lo", "first"),
            _hi=("ci_hi", "first"),
        )
        .reset_index()
    )
    n = a["n_seeds"].to_numpy(dtype=float)
    several = n >= 2
    t = np.where(several, stats.t.ppf(0.5 + level / 2, np.maximum(n - 1, 1)), np.nan)
    half = t * a["_sd"].to_numpy(dtype=float) / np.sqrt(n)
    v = a["value"].to_numpy(dtype=float)
    a["lo"] = np.where(several, v - half, a["_lo"].to_numpy(dtype=float))
    a["hi"] = np.where(several, v + half, a["_hi"].to_numpy(dtype=float))
    has_ci = np.isfinite(a["lo"].to_numpy(dtype=float)) & np.isfinite(a["hi"].to_numpy(dtype=float))
    a["band"] = np.where(several, SEED_BAND, np.where(has_ci, RUN_BAND, NO_BAND))
    if transform is not None:
        for c in ("value", "lo", "hi"):
            a[c] = transform(a[c].to_numpy(dtype=float))
    return a[cols]


def band_text(bands: pd.Series | Sequence[str], n_seeds: pd.Series | Sequence[int]) -> str:
    """What the shaded bands of a figure are, for its caption and legend ("" if none drawn)."""
    kinds = set(bands)
    counts = sorted({int(n) for b, n in zip(bands, n_seeds, strict=True) if b == SEED_BAND})
    seeds = "/".join(str(c) for c in counts)
    pct = f"{BAND_LEVEL:.0%}"
    parts = []
    if SEED_BAND in kinds:
        parts.append(f"{pct} t-interval of the mean over {seeds} seeds")
    if RUN_BAND in kinds:
        parts.append(f"{pct} bootstrap CI stored with the run" + (" (one seed)" if parts else ""))
    return "; ".join(parts)


def summary_band_text(summary: pd.DataFrame) -> str:
    """:func:`band_text` of the points of a :func:`seed_summary` that have a band."""
    lo, hi = summary["lo"].to_numpy(dtype=float), summary["hi"].to_numpy(dtype=float)
    drawn = summary[np.isfinite(lo) & np.isfinite(hi)]
    return band_text(drawn["band"], drawn["n_seeds"])


def at_longest_eval(t: pd.DataFrame) -> pd.DataFrame:
    """The rows of each series at its longest evaluation length."""
    longest = t.groupby("series_rank")["eval_length"].transform("max")
    return t[t["eval_length"] == longest]
