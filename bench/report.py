"""``lenbench-report``: summary tables, plots and ``report.md`` from stored result tables.

Reads result parquet files (see :mod:`bench.results`), never a model: regenerating a report needs
no torch and no recomputation.

Output layout (``out_dir``)::

    report.md               figures with captions, summary tables, configuration summary
    tables/<name>.csv       long summary tables; each row has ``n_rows`` and ``row_ids``
    tables/<name>.md        the same table as a Markdown pivot (as shown in report.md)
    tables/source_rows.csv  every (deduplicated) input row with its ``row_id``
    plots/<name>.png|.svg   figures

Traceability: the ``row_ids`` column of every CSV table lists (``;``-separated) the ``row_id``s in
``source_rows.csv`` that the row was computed from; ``n_rows`` is their count. Aggregated values
are token-weighted means (weights ``n``) over those rows, pooling seeds.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import rc_context
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullLocator

from bench.results import METRICS, PASSKEY_THRESHOLD, load_results

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
_LINESTYLES = ["-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 1)), (0, (3, 1, 1, 1, 1, 1))]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
_TRAIN_MARKER = {"color": "0.45", "linestyle": "-", "linewidth": 3.0, "alpha": 0.35}


@dataclass
class _Report:
    """Accumulates the pieces of report.md while tables and plots are written."""

    out_dir: Path
    tables: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)

    @property
    def tables_dir(self) -> Path:
        return self.out_dir / "tables"

    @property
    def plots_dir(self) -> Path:
        return self.out_dir / "plots"


# ============================================================================ labels and order


@functools.lru_cache(maxsize=1024)
def _params_text(params: str) -> str:
    try:
        parsed = json.loads(params)
    except (TypeError, json.JSONDecodeError):
        return str(params)
    if isinstance(parsed, dict):
        return ",".join(f"{k}={v}" for k, v in parsed.items())
    return str(parsed)


def _rank(value: str, order: list[str]) -> int:
    return order.index(value) if value in order else len(order)


def _add_labels(df: pd.DataFrame) -> pd.DataFrame:
    """Add ``position_label``, ``scaling_label``, ``series`` (legend text) and ``series_rank``."""
    df = df.copy()
    for kind in ("position", "scaling"):
        n_params = df.groupby(kind)[f"{kind}_params"].nunique()
        varied = set(n_params[n_params > 1].index)
        labels = []
        for name, params in zip(df[kind], df[f"{kind}_params"], strict=True):
            text = _params_text(params)
            labels.append(f"{name} ({text})" if name in varied and text else name)
        df[f"{kind}_label"] = labels
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
            _pr=lambda d: [_rank(p, POSITION_ORDER) for p in d["position"]],
            _sr=lambda d: [_rank(s, SCALING_ORDER) for s in d["scaling"]],
        )
        .sort_values(
            ["_pr", "position_label", "_sr", "scaling_label", "train_length", "experiment"]
        )
    )
    rank = {}
    for pos, scal, tl, exp in zip(
        keys["position_label"],
        keys["scaling_label"],
        keys["train_length"],
        keys["experiment"],
        strict=True,
    ):
        rank.setdefault((pos, scal, tl, exp), len(rank))
    df["series_rank"] = [
        rank[k]
        for k in zip(
            df["position_label"],
            df["scaling_label"],
            df["train_length"],
            df["experiment"],
            strict=True,
        )
    ]
    return df


class _Style:
    """Consistent colours (per position label) and line styles (per scaling label) across plots."""

    def __init__(self, df: pd.DataFrame) -> None:
        ordered = df.sort_values("series_rank")
        positions = list(dict.fromkeys(ordered["position_label"]))
        scalings = list(dict.fromkeys(ordered["scaling_label"]))
        cmap = "tab10" if len(positions) <= 10 else "tab20"
        from matplotlib import colormaps

        colors = colormaps[cmap].colors  # type: ignore[attr-defined]
        self.color = {p: colors[i % len(colors)] for i, p in enumerate(positions)}
        self.linestyle = {s: _LINESTYLES[i % len(_LINESTYLES)] for i, s in enumerate(scalings)}
        self.marker = {s: _MARKERS[i % len(_MARKERS)] for i, s in enumerate(scalings)}

    def kwargs(self, position_label: str, scaling_label: str) -> dict[str, object]:
        return {
            "color": self.color[position_label],
            "linestyle": self.linestyle[scaling_label],
            "marker": self.marker[scaling_label],
            "markersize": 3.5,
            "linewidth": 1.5,
        }


# ============================================================================ aggregation


def _aggregate(rows: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
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


def _sort(df: pd.DataFrame, extra: Sequence[str] = ()) -> pd.DataFrame:
    return df.sort_values(["series_rank", *extra], kind="stable").reset_index(drop=True)


def _pivot(df: pd.DataFrame, index: list[str], columns: str, values: str) -> pd.DataFrame:
    """Wide view of a long table; only existing index combinations, missing cells NaN. The
    first index level (``series_rank``, used for ordering) is dropped."""
    wide = df.set_index([*index, columns])[values].unstack(columns)
    wide = wide.sort_index()
    if columns == "region":  # inside before beyond, then anything else
        wide = wide[
            sorted(wide.columns, key=lambda r: (_rank(str(r), ["inside", "beyond"]), str(r)))
        ]
    wide.columns.name = None
    return wide.droplevel(0) if index[0] == "series_rank" else wide


def _numeric_axis(values: pd.Series) -> pd.Series:
    return pd.to_numeric(values, errors="coerce")


# ============================================================================ markdown + files


def _fmt(v: object) -> str:
    if v is None or v is pd.NA:
        return "–"
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        x = float(v)
        if math.isnan(x):
            return "–"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        if x.is_integer() and abs(x) < 1e6:
            return str(int(x))
        return f"{x:.3e}" if abs(x) >= 1e4 or abs(x) < 1e-3 else f"{x:.4g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(df: pd.DataFrame, index: bool = False) -> str:
    """Render ``df`` as a GitHub-flavoured Markdown table (numbers right-aligned)."""
    if index:
        df = df.reset_index()
    cols = [str(c) for c in df.columns]
    numeric = [pd.api.types.is_numeric_dtype(df[c]) for c in df.columns]
    lines = [
        "| " + " | ".join(c.replace("|", "\\|") for c in cols) + " |",
        "|" + "|".join("---:" if n else ":---" for n in numeric) + "|",
    ]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_fmt(v) for v in row) + " |")
    return "\n".join(lines)


def _write_table(
    rep: _Report, name: str, long: pd.DataFrame, shown: pd.DataFrame, index: bool
) -> str:
    """Write tables/<name>.csv (long, traceable) and tables/<name>.md; return the Markdown."""
    drop = [c for c in ("series_rank",) if c in long.columns]
    long.drop(columns=drop).to_csv(rep.tables_dir / f"{name}.csv", index=False)
    md = markdown_table(shown, index=index)
    (rep.tables_dir / f"{name}.md").write_text(md + "\n", encoding="utf-8")
    rep.tables.append(name)
    return md


def _save(rep: _Report, fig: Figure, name: str) -> None:
    """Save PNG and SVG (SVG text stays text: smaller, faster, searchable)."""
    fig.savefig(rep.plots_dir / f"{name}.png", dpi=100)
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "lenbench"}):
        fig.savefig(rep.plots_dir / f"{name}.svg")
    rep.plots.append(name)


def _figure_md(name: str, caption: str) -> str:
    return f"![{name}](plots/{name}.png)\n\n*{caption}* ([SVG](plots/{name}.svg))"


# ============================================================================ plotting helpers


def _int_ticks(ax, values: Sequence[float], axis: str = "x") -> None:  # type: ignore[no-untyped-def]
    vals = sorted({float(v) for v in values if np.isfinite(v)})
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_minor_locator(NullLocator())
    if 0 < len(vals) <= 12:
        target.set_ticks(vals)
    target.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g}"))


def _train_lines(ax, lengths: Sequence[int]) -> None:  # type: ignore[no-untyped-def]
    for length in sorted(set(lengths)):
        ax.axvline(length, **_TRAIN_MARKER, label=f"train length ({length})")


def _share_limits(axes: Sequence, which: str) -> None:  # type: ignore[type-arg]
    """Give ``axes`` one common x or y range (cheaper than matplotlib's shared axes, which
    re-autoscale every sibling on each artist added)."""
    if len(axes) < 2:
        return
    get = "get_ylim" if which == "y" else "get_xlim"
    lims = np.array([getattr(ax, get)() for ax in axes], dtype=float)
    lo, hi = float(np.nanmin(lims[:, 0])), float(np.nanmax(lims[:, 1]))
    for ax in axes:
        (ax.set_ylim if which == "y" else ax.set_xlim)(lo, hi)


def _grid(n: int, max_cols: int = 3) -> tuple[int, int]:
    cols = min(max_cols, max(1, n))
    return math.ceil(n / cols), cols


@dataclass
class _Panels:
    """A grid of axes with fixed margins in inches (no layout engine: constrained layout costs
    several extra draws of every tick label). ``finish`` adds the title, a legend (and colorbar)
    right of the panels and widens the figure to fit them exactly."""

    nrows: int
    ncols: int
    pw: float = 4.2  # panel width (inches)
    ph: float = 3.0  # panel height
    left: float = 0.95
    bottom: float = 0.95
    top: float = 0.75
    wgap: float = 0.75
    hgap: float = 1.05
    right: float = 0.25
    fig: Figure = field(init=False)
    axes: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        self.fig = Figure(figsize=(self._width(0.0), self._height()))
        FigureCanvasAgg(self.fig)
        self.axes = self.fig.subplots(self.nrows, self.ncols, squeeze=False)
        self._adjust(0.0)

    def _width(self, extra: float) -> float:
        return self.left + self.ncols * self.pw + (self.ncols - 1) * self.wgap + self.right + extra

    def _height(self) -> float:
        return self.top + self.nrows * self.ph + (self.nrows - 1) * self.hgap + self.bottom

    def _adjust(self, extra: float) -> None:
        w, h = self._width(extra), self._height()
        self.fig.set_size_inches(w, h)
        self.fig.subplots_adjust(
            left=self.left / w,
            right=(self.left + self.ncols * self.pw + (self.ncols - 1) * self.wgap) / w,
            bottom=self.bottom / h,
            top=1 - self.top / h,
            wspace=self.wgap / self.pw,
            hspace=self.hgap / self.ph,
        )

    def finish(
        self,
        title: str,
        handles: dict[str, object] | None = None,
        colorbar: object = None,
        colorbar_label: str = "",
    ) -> Figure:
        fig = self.fig
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        extra = 0.0
        cbar_w = 0.0
        if colorbar is not None:
            cbar_w = 1.0
            extra += cbar_w
        leg = None
        if handles:
            leg = fig.legend(
                list(handles.values()),
                list(handles.keys()),
                loc="upper left",
                fontsize=8,
                frameon=False,
                handlelength=2.6,
                borderaxespad=0.0,
            )
            extra += leg.get_window_extent(renderer).width / fig.dpi + 0.3
        self._adjust(extra)
        w, h = self._width(extra), self._height()
        x0 = self.left + self.ncols * self.pw + (self.ncols - 1) * self.wgap + 0.3
        if colorbar is not None:
            cax = fig.add_axes(
                ((x0 - 0.1) / w, self.bottom / h, 0.18 / w, (h - self.top - self.bottom) / h)
            )
            fig.colorbar(colorbar, cax=cax, label=colorbar_label)  # type: ignore[arg-type]
            x0 += cbar_w
        if leg is not None:
            leg.set_bbox_to_anchor((x0 / w, 1 - self.top / h), transform=fig.transFigure)
        fig.suptitle(
            title,
            x=0.5 * (self.left + self._width(0.0) - self.right) / w,
            y=1 - 0.12 / h,
            va="top",
            fontsize=12,
        )
        return fig


def _legend_handles(
    axes: np.ndarray, style: _Style | None = None, data: pd.DataFrame | None = None
) -> dict[str, object]:
    """Handles for one figure legend right of the panels. With ``style`` and ``data`` and when each series is
    one (position, scaling) pair, the legend is compact: colours = positions, line styles =
    scalings, instead of one entry per series."""
    handles: dict[str, object] = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if not lab.startswith("_"):
                handles.setdefault(lab, h)
    if style is not None and data is not None and not data.empty:
        pairs = data.drop_duplicates("series_rank").sort_values("series_rank")
        unique = len(pairs) == len(pairs[["position_label", "scaling_label"]].drop_duplicates())
        if unique and len(pairs) > 4:
            series = set(pairs["series"])
            extra = {k: v for k, v in handles.items() if k not in series}
            blank = Line2D([], [], linestyle="none")
            compact: dict[str, object] = {"position (colour)": blank}
            for p in dict.fromkeys(pairs["position_label"]):
                compact[f"  {p}"] = Line2D([], [], color=style.color[p], linewidth=2.5)
            compact["scaling (line style)"] = Line2D([], [], linestyle="none")
            for sc in dict.fromkeys(pairs["scaling_label"]):
                compact[f"  {sc}"] = Line2D(
                    [],
                    [],
                    color="0.2",
                    linestyle=style.linestyle[sc],
                    marker=style.marker[sc],
                    markersize=4,
                )
            if extra:
                compact["markers"] = Line2D([], [], linestyle="none")
                compact.update({f"  {k}": v for k, v in extra.items()})
            handles = compact
    return handles


def _line_panels(
    rep: _Report,
    style: _Style,
    data: pd.DataFrame,
    *,
    name: str,
    title: str,
    xlabel: str,
    ylabel: str,
    xscale: str = "log2",
    marker_x: Callable[[int, int], float | None] = lambda train, _ev: float(train),
    marker_label: str = "train length ({m:g})",
    hline: float | None = None,
    hline_label: str | None = None,
    ylog: bool = False,
    transform: Callable[[np.ndarray], np.ndarray] | None = None,
    panel_col: str | None = "eval_length",
    panel_fmt: Callable[[object], str] = lambda v: f"eval length {v}",
) -> None:
    """One line per series (x=``x``, y=``value``), CI band where present, one panel per
    ``panel_col`` value, vertical marker at ``marker_x(train_length, eval_length)``."""
    panels = sorted(data[panel_col].unique()) if panel_col else [None]
    nrows, ncols = _grid(len(panels))
    grid = _Panels(1, 1, pw=6.0, ph=4.2, top=0.5) if len(panels) == 1 else _Panels(nrows, ncols)
    axes = grid.axes
    for ax in axes.flat[len(panels) :]:
        ax.set_axis_off()
    tf = transform or (lambda a: a)
    for ax, panel in zip(axes.flat, panels, strict=False):
        sub = data if panel is None else data[data[panel_col] == panel]
        for _, s in _sort(sub).groupby("series_rank", sort=True):
            s = s.sort_values("x")
            x = s["x"].to_numpy(dtype=float)
            y = tf(s["value"].to_numpy(dtype=float))
            first = s.iloc[0]
            ax.plot(
                x,
                y,
                label=first["series"],
                **style.kwargs(first["position_label"], first["scaling_label"]),
            )
            lo, hi = s["ci_lo"].to_numpy(dtype=float), s["ci_hi"].to_numpy(dtype=float)
            ok = np.isfinite(lo) & np.isfinite(hi)
            if ok.sum() >= 1:
                ax.fill_between(
                    x[ok],
                    tf(lo[ok]),
                    tf(hi[ok]),
                    color=style.color[first["position_label"]],
                    alpha=0.15,
                    linewidth=0,
                )
        marks = sorted(
            {
                m
                for tl, ev in sub[["train_length", "eval_length"]]
                .drop_duplicates()
                .itertuples(index=False)
                if (m := marker_x(int(tl), int(ev))) is not None
            }
        )
        for m in marks:
            ax.axvline(m, **_TRAIN_MARKER, label=marker_label.format(m=m))
        if hline is not None:
            ax.axhline(hline, color="0.55", linewidth=1.0, linestyle=":", label=hline_label)
        xs = sub["x"].to_numpy(dtype=float)
        xs = xs[np.isfinite(xs)]
        panel_xscale = xscale
        if xscale == "log2" and len(xs) and xs.min() <= 0:
            panel_xscale = "symlog2"  # a log axis cannot show x = 0 (e.g. no context); keep it
        if panel_xscale == "log2":
            ax.set_xscale("log", base=2)
            _int_ticks(ax, xs)
        elif panel_xscale == "symlog2":
            ax.set_xscale("symlog", base=2, linthresh=1.0)
            _int_ticks(ax, xs)
        if ylog:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _p: f"{y:g}"))
            ax.yaxis.set_minor_locator(NullLocator())
        if panel_xscale in ("log2", "symlog2") and len(xs) and xs.min() >= 0:
            lo_x = min([xs.min(), *[m for m in marks if m >= 0]])
            hi_x = max([xs.max(), *marks])
            ax.set_xlim(lo_x / 1.4 if lo_x > 0 else -0.3, hi_x * 1.4)
        ax.tick_params(axis="x", labelrotation=45 if len(ax.get_xticks()) > 7 else 0, labelsize=8)
        ax.grid(True, alpha=0.3)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if panel is not None and len(panels) > 1:
            ax.set_title(panel_fmt(panel), fontsize=10)
    _share_limits(list(axes.flat[: len(panels)]), "y")
    _save(rep, grid.finish(title, _legend_handles(axes, style, data)), name)


def _series_grid(series: pd.DataFrame) -> tuple[list[tuple[int, int]], int, int]:
    """Place series on a (scaling row x position column) grid when that is unambiguous."""
    s = series.drop_duplicates("series_rank").sort_values("series_rank")
    pos = list(dict.fromkeys(s["position_label"]))
    scal = list(dict.fromkeys(s["scaling_label"]))
    pairs = list(zip(s["scaling_label"], s["position_label"], strict=True))
    if len(set(pairs)) == len(pairs) and len(pos) * len(scal) <= 2 * len(pairs) + 2:
        cells = [(scal.index(sc), pos.index(p)) for sc, p in pairs]
        return cells, len(scal), len(pos)
    nrows, ncols = _grid(len(pairs), max_cols=5)
    return [(i // ncols, i % ncols) for i in range(len(pairs))], nrows, ncols


# ============================================================================ sections


def _config_section(df: pd.DataFrame, paths: Sequence[str | Path]) -> str:
    def distinct(cols: list[str], fmt: Callable[[tuple], str]) -> str:
        vals = df[cols].drop_duplicates().itertuples(index=False, name=None)
        return "; ".join(sorted(fmt(v) for v in vals))

    def named(v: tuple) -> str:
        text = _params_text(v[1])
        return f"{v[0]} ({text})" if text else str(v[0])

    metrics = df.groupby("metric").size()
    rows = [
        ("experiment(s)", ", ".join(sorted(df["experiment"].unique()))),
        ("results paths", ", ".join(f"`{p}`" for p in paths)),
        (
            "rows / files",
            f"{len(df)} rows (after dedup) from {df['source_file'].nunique()} file(s)",
        ),
        (
            "written",
            f"{df['written_at'].min():%Y-%m-%d %H:%M:%S} to {df['written_at'].max():%Y-%m-%d %H:%M:%S} UTC",
        ),
        ("positions", distinct(["position", "position_params"], named)),
        ("scalings", distinct(["scaling", "scaling_params"], named)),
        ("train lengths", ", ".join(str(v) for v in sorted(df["train_length"].unique()))),
        ("eval lengths", ", ".join(str(v) for v in sorted(df["eval_length"].unique()))),
        ("seeds", ", ".join(str(v) for v in sorted(df["seed"].unique()))),
        ("models", f"{df['model_id'].nunique()} distinct model_id"),
        ("code versions", ", ".join(sorted(df["code_version"].unique()))),
        (
            "corpus (fingerprint)",
            distinct(["corpus", "corpus_fingerprint"], lambda v: f"{v[0]} (`{v[1]}`)"),
        ),
        ("metrics (rows)", ", ".join(f"{m} ({c})" for m, c in metrics.items())),
    ]
    table = pd.DataFrame(rows, columns=["setting", "values"])
    return "## Configuration\n\n" + markdown_table(table)


def _note(metric: str, consequence: str) -> str:
    return f"> Note: no `{metric}` rows in these results, so {consequence}."


def _summary_or_detail(
    rows: pd.DataFrame, keys: list[str], summary: pd.Series, labels: tuple[str, str]
) -> pd.DataFrame:
    """Aggregate ``rows`` per ``keys``, using a group's summary rows (``summary`` mask, e.g. the
    whole-window NLL row) where it has any, else its detail rows (e.g. the buckets), so nothing
    is counted twice. Adds a ``source`` column naming which (``labels`` = (summary, detail))."""
    mask = summary.to_numpy(dtype=bool)
    have = set(map(tuple, rows.loc[mask, keys].drop_duplicates().to_numpy().tolist()))
    in_have = np.array([tuple(k) in have for k in rows[keys].to_numpy().tolist()], dtype=bool)
    t = _aggregate(rows[mask | ~in_have], keys)
    if not t.empty:
        t["source"] = [
            labels[0] if k in have else labels[1] for k in map(tuple, t[keys].to_numpy().tolist())
        ]
    return t


def _nll_tables(df: pd.DataFrame) -> pd.DataFrame:
    """Perplexity per series x eval length: whole-window rows, else token-weighted buckets."""
    nll = df[df["metric"] == "nll"]
    window = nll["bucket_lo"].isna() & nll["bucket_hi"].isna()
    keys = [*SERIES_KEYS, *LABEL_KEYS, "series_rank", "eval_length"]
    t = _summary_or_detail(nll, keys, window, ("whole window", "bucket mean"))
    if t.empty:
        return t
    t = t.rename(columns={"value": "nll"})
    t["k"] = t["eval_length"] / t["train_length"]
    t["ppl"] = np.exp(t["nll"])
    t["ppl_lo"] = np.exp(t["ci_lo"])
    t["ppl_hi"] = np.exp(t["ci_hi"])
    cols = [
        *keys,
        "k",
        "nll",
        "ppl",
        "ci_lo",
        "ci_hi",
        "ppl_lo",
        "ppl_hi",
        "n",
        "n_seeds",
        "n_rows",
        "row_ids",
        "source",
    ]
    return _sort(t[cols], ["eval_length"])


def _perplexity_section(rep: _Report, df: pd.DataFrame, style: _Style) -> str:
    t = _nll_tables(df)
    if t.empty:
        return "## Perplexity vs evaluation length\n\n" + _note(
            "nll", "the perplexity tables and figures are omitted"
        )
    pivot = _pivot(t, index=["series_rank", "series"], columns="eval_length", values="ppl")
    pivot.columns = [f"L={c}" for c in pivot.columns]
    md = _write_table(rep, "perplexity", t, pivot, index=True)
    plot = t.assign(x=t["eval_length"], value=t["nll"])
    span = np.nanmax(t["ppl"].replace(np.inf, np.nan)) / max(np.nanmin(t["ppl"]), 1e-12)
    _line_panels(
        rep,
        style,
        plot,
        name="ppl_vs_length",
        title="Train short, test long: perplexity vs evaluation length",
        xlabel="evaluation length (tokens, log2 scale)",
        ylabel="perplexity (exp of mean NLL per token)",
        ylog=bool(span > 20),
        transform=np.exp,
        panel_col=None,
    )
    text = [
        "## Perplexity vs evaluation length",
        _figure_md(
            "ppl_vs_length",
            "Perplexity of each position encoding (colour) and scaling method (line style) when the "
            "models read sequences of the given length; the thick grey vertical line marks the training "
            "length, so everything to its right is extrapolation and a flat line means the method "
            "extrapolates. Shaded bands are the stored confidence intervals.",
        ),
        "Perplexity (exp of the token-weighted mean NLL; whole-window rows where present, else the "
        "token-weighted mean over position buckets; seeds pooled). Source: `tables/perplexity.csv`.",
        md,
    ]
    # extrapolation ratio
    base = t[t["eval_length"] == t["train_length"]][[*SERIES_KEYS, "ppl", "row_ids", "n_rows"]]
    base = base.rename(columns={"ppl": "ppl_train", "row_ids": "_rid", "n_rows": "_nr"})
    r = t.merge(base, on=SERIES_KEYS, how="left")
    r["ratio"] = r["ppl"] / r["ppl_train"]
    r["row_ids"] = [
        ";".join(
            str(i)
            for i in sorted(
                {int(x) for part in (a, b) if isinstance(part, str) for x in part.split(";")}
            )
        )
        for a, b in zip(r["row_ids"], r["_rid"], strict=True)
    ]
    r["n_rows"] = [len(s.split(";")) if s else 0 for s in r["row_ids"]]
    rcols = [
        *SERIES_KEYS,
        *LABEL_KEYS,
        "series_rank",
        "eval_length",
        "k",
        "ppl",
        "ppl_train",
        "ratio",
        "n_rows",
        "row_ids",
    ]
    r = _sort(r[rcols], ["eval_length"])
    rp = _pivot(r, index=["series_rank", "series"], columns="k", values="ratio")
    rp.columns = [f"{c:g}x" for c in rp.columns]
    rmd = _write_table(rep, "extrapolation_ratio", r, rp, index=True)
    text += [
        "### Extrapolation ratio",
        "Perplexity at k x the training length divided by perplexity at the training length "
        "(1 = no degradation; – = no evaluation at that length or at the training length). "
        "Source: `tables/extrapolation_ratio.csv`.",
        rmd,
    ]
    if r["ratio"].notna().any():
        rplot = r.assign(x=r["k"], value=r["ratio"], ci_lo=np.nan, ci_hi=np.nan)
        _line_panels(
            rep,
            style,
            rplot,
            name="extrapolation_ratio",
            title="Extrapolation ratio: perplexity relative to the training length",
            xlabel="evaluation length / training length (log2 scale)",
            ylabel="ppl(k x L) / ppl(L)",
            marker_x=lambda _tl, _ev: 1.0,
            marker_label="k = 1 (training length)",
            hline=1.0,
            ylog=bool(np.nanmax(r["ratio"].replace(np.inf, np.nan)) > 20),
            panel_col=None,
        )
        text.insert(
            -1,
            _figure_md(
                "extrapolation_ratio",
                "The same perplexities divided by each model's perplexity at its training length "
                "(k = 1, grey vertical line); values above the dotted line at 1 mean the model got worse on "
                "longer inputs.",
            ),
        )
    return "\n\n".join(text)


def _bucket_section(rep: _Report, df: pd.DataFrame, style: _Style) -> str:
    nll = df[(df["metric"] == "nll") & df["bucket_lo"].notna() & df["bucket_hi"].notna()]
    head = "## NLL by position bucket"
    if nll.empty:
        return (
            head
            + "\n\n"
            + "> Note: no bucketed `nll` rows (bucket_lo/bucket_hi) in these results, so the per-position figure is omitted."
        )
    keys = [*SERIES_KEYS, *LABEL_KEYS, "series_rank", "eval_length", "bucket_lo", "bucket_hi"]
    t = _sort(_aggregate(nll, keys), ["eval_length", "bucket_lo"])
    t["bucket_mid"] = (t["bucket_lo"] + t["bucket_hi"]) / 2
    cells, nrows, ncols = _series_grid(t)
    grid = _Panels(nrows, ncols, pw=3.0, ph=2.3, wgap=0.35, hgap=0.75, bottom=0.9)
    axes = grid.axes
    used = set(cells)
    for r_, c_ in np.ndindex(nrows, ncols):
        if (r_, c_) not in used:
            axes[r_, c_].text(
                0.5,
                0.5,
                "no rows",
                ha="center",
                va="center",
                transform=axes[r_, c_].transAxes,
                color="0.5",
            )
            axes[r_, c_].set_xticks([])
            axes[r_, c_].set_yticks([])
    from matplotlib import colormaps

    lengths = sorted(t["eval_length"].unique())
    cmap = colormaps["viridis"]
    lcolor = {v: cmap(i / max(1, len(lengths) - 1) * 0.9) for i, v in enumerate(lengths)}
    series_list = t.drop_duplicates("series_rank").sort_values("series_rank")
    for (r_, c_), (_, srow) in zip(cells, series_list.iterrows(), strict=True):
        ax = axes[r_, c_]
        s = t[t["series_rank"] == srow["series_rank"]]
        for ev, g in s.groupby("eval_length"):
            g = g.sort_values("bucket_mid")
            x = g["bucket_mid"].to_numpy(dtype=float)
            ax.plot(
                x,
                g["value"],
                color=lcolor[ev],
                linewidth=1.4,
                label=f"eval length {ev}",
                zorder=3 + len(lengths) - lengths.index(ev),  # shorter windows drawn on top
            )
            lo, hi = g["ci_lo"].to_numpy(dtype=float), g["ci_hi"].to_numpy(dtype=float)
            ok = np.isfinite(lo) & np.isfinite(hi)
            if ok.any():
                ax.fill_between(x[ok], lo[ok], hi[ok], color=lcolor[ev], alpha=0.15, linewidth=0)
        _train_lines(ax, list(s["train_length"].unique()))
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _p: f"{x:g}"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
        ax.set_title(srow["series"], fontsize=9)
    used_axes = [axes[rc] for rc in cells]
    _share_limits(used_axes, "x")
    _share_limits(used_axes, "y")
    for r_, c_ in cells:
        ax = axes[r_, c_]
        if (r_ + 1, c_) not in used:
            ax.set_xlabel("token position (bucket midpoint, log2)", fontsize=8)
        if c_ == 0 or (r_, c_ - 1) not in used:
            ax.set_ylabel("NLL (nats/token)", fontsize=8)
        else:
            ax.tick_params(labelleft=False)
    title = "Per-token NLL by position in the window (one panel per encoding / scaling)"
    _save(rep, grid.finish(title, _legend_handles(axes)), "nll_by_bucket")
    shown = _pivot(
        t,
        index=["series_rank", "series", "eval_length"],
        columns="bucket_mid",
        values="value",
    )
    shown.columns = [f"{c:g}" for c in shown.columns]
    md = _write_table(rep, "nll_by_bucket", t, shown, index=True)
    return "\n\n".join(
        [
            head,
            _figure_md(
                "nll_by_bucket",
                "Mean NLL of the tokens in each position bucket (x: bucket midpoint), one line per "
                "evaluation length; tokens right of the grey training-length line sit at positions "
                "never seen in training, so a rising curve there is the extrapolation failure.",
            ),
            "<details><summary>NLL by bucket (columns: bucket midpoint; source "
            "`tables/nll_by_bucket.csv`)</summary>\n\n" + md + "\n\n</details>",
        ]
    )


def _passkey_section(rep: _Report, df: pd.DataFrame, style: _Style) -> str:
    head = "## Passkey retrieval"
    acc = df[df["metric"] == "passkey_acc"].copy()
    recorded = df[df["metric"] == "passkey_context"]
    if acc.empty and recorded.empty:
        return head + "\n\n" + _note("passkey_acc", "the passkey tables and figures are omitted")
    parts = [head]
    skeys = [*SERIES_KEYS, *LABEL_KEYS, "series_rank"]
    if not acc.empty:
        acc["depth"] = _numeric_axis(acc["axis_value"])
        acc.loc[acc["axis"].notna() & (acc["axis"] != "depth"), "depth"] = np.nan
        depth_rows = acc[acc["depth"].notna()]
        by_len = _summary_or_detail(
            acc,
            [*skeys, "eval_length"],
            acc["depth"].isna(),
            ("per-length rows", "mean over depths"),
        )
        by_len = _sort(by_len, ["eval_length"]).rename(columns={"value": "passkey_acc"})
        by_depth = _sort(
            _aggregate(depth_rows, [*skeys, "eval_length", "depth"]), ["eval_length", "depth"]
        ).rename(columns={"value": "passkey_acc"})
        piv = _pivot(
            by_len,
            index=["series_rank", "series"],
            columns="eval_length",
            values="passkey_acc",
        )
        piv.columns = [f"L={c}" for c in piv.columns]
        md_len = _write_table(rep, "passkey_by_length", by_len, piv, index=True)
        if not by_depth.empty:
            _write_table(
                rep,
                "passkey_by_depth",
                by_depth,
                by_depth[["series", "eval_length", "depth", "passkey_acc", "n"]],
                index=False,
            )
            _passkey_heatmap(rep, by_depth)
            parts.append(
                _figure_md(
                    "passkey_heatmap",
                    "Exact-match accuracy of retrieving a numeric pass key hidden at the given "
                    "depth (rows, 0% = start of the context) in contexts of the given length "
                    "(columns), one panel per model; bright is good, grey = not evaluated, and "
                    "columns right of the red dashed line are longer than the training length.",
                )
            )
        else:
            parts.append(
                "> Note: no per-depth `passkey_acc` rows (axis=depth) in these results, so the "
                "depth x length heatmap is omitted."
            )
        # accuracy vs length
        _line_panels(
            rep,
            style,
            by_len.assign(x=by_len["eval_length"], value=by_len["passkey_acc"]),
            name="passkey_acc_vs_length",
            title="Passkey accuracy vs context length (mean over depths)",
            xlabel="context length (tokens, log2 scale)",
            ylabel="exact-match accuracy (fraction)",
            hline=PASSKEY_THRESHOLD,
            hline_label=f"passkey-context threshold {PASSKEY_THRESHOLD:g}",
            panel_col=None,
        )
        parts += [
            _figure_md(
                "passkey_acc_vs_length",
                "Passkey accuracy averaged over depths; the dotted line is the 0.8 threshold that "
                "defines the passkey context, the grey vertical line the training length.",
            ),
            "Passkey accuracy by context length (the per-length rows where stored, else the "
            "mean over depths; weighted by trials, seeds pooled). Source: "
            "`tables/passkey_by_length.csv`, by depth: `tables/passkey_by_depth.csv`.",
            md_len,
        ]
    # passkey context
    if not acc.empty:
        ctx_rows = []
        for _, g in by_len.groupby("series_rank", sort=True):
            good = g[g["passkey_acc"] >= PASSKEY_THRESHOLD]
            ctx = int(good["eval_length"].max()) if not good.empty else 0
            first = g.iloc[0]
            ids = sorted({int(x) for s in g["row_ids"] for x in s.split(";")})
            ctx_rows.append(
                {
                    **{k: first[k] for k in skeys},
                    "passkey_context": ctx,
                    "max_length_tested": int(g["eval_length"].max()),
                    "n_rows": len(ids),
                    "row_ids": ";".join(map(str, ids)),
                }
            )
        ctx_t = pd.DataFrame(ctx_rows)
    else:
        ctx_t = pd.DataFrame(columns=[*skeys, "n_rows", "row_ids"])
    if not recorded.empty:
        rec = _aggregate(recorded, skeys).rename(columns={"value": "recorded_passkey_context"})
        rec = rec[[*skeys, "recorded_passkey_context", "n_rows", "row_ids"]].rename(
            columns={"n_rows": "_nr", "row_ids": "_rid"}
        )
        ctx_t = ctx_t.merge(rec, on=skeys, how="outer")
        ctx_t["row_ids"] = [
            ";".join(
                sorted(
                    {x for p in (a, b) if isinstance(p, str) and p for x in p.split(";")}, key=int
                )
            )
            for a, b in zip(ctx_t["row_ids"], ctx_t["_rid"], strict=True)
        ]
        ctx_t["n_rows"] = [len(s.split(";")) if s else 0 for s in ctx_t["row_ids"]]
        ctx_t = ctx_t.drop(columns=["_nr", "_rid"])
    ctx_t = _sort(ctx_t)
    shown_cols = ["series"] + [
        c
        for c in ("passkey_context", "max_length_tested", "recorded_passkey_context")
        if c in ctx_t.columns
    ]
    md_ctx = _write_table(rep, "passkey_context", ctx_t, ctx_t[shown_cols], index=False)
    parts += [
        "### Passkey context",
        f"Largest context length whose passkey accuracy (mean over depths) is at least "
        f"{PASSKEY_THRESHOLD:g} (0 = none), as in YaRN; `recorded_passkey_context` is the value "
        "the evaluation job stored, where present. Source: `tables/passkey_context.csv`.",
        md_ctx,
    ]
    if acc.empty:
        parts.insert(
            1, _note("passkey_acc", "the passkey heatmaps and accuracy tables are omitted")
        )
    return "\n\n".join(parts)


def _passkey_heatmap(rep: _Report, by_depth: pd.DataFrame) -> None:
    """Depth x length heatmaps, one panel per series."""
    cells, nrows, ncols = _series_grid(by_depth)
    grid = _Panels(nrows, ncols, pw=2.8, ph=2.0, wgap=0.75, hgap=0.95, bottom=1.0)
    axes = grid.axes
    used = set(cells)
    for r_, c_ in np.ndindex(nrows, ncols):
        if (r_, c_) not in used:
            axes[r_, c_].set_axis_off()
    from matplotlib import colormaps

    cmap = colormaps["viridis"].with_extremes(bad="0.88")
    lengths_all = sorted(by_depth["eval_length"].unique())
    depths_all = sorted(by_depth["depth"].dropna().unique()) or [np.nan]
    image = None
    series_list = by_depth.drop_duplicates("series_rank").sort_values("series_rank")
    for (r_, c_), (_, srow) in zip(cells, series_list.iterrows(), strict=True):
        ax = axes[r_, c_]
        s = by_depth[by_depth["series_rank"] == srow["series_rank"]]
        mat = np.full((len(depths_all), len(lengths_all)), np.nan)
        for d, ev, v in s[["depth", "eval_length", "passkey_acc"]].itertuples(index=False):
            i = depths_all.index(d) if d in depths_all else 0
            mat[i, lengths_all.index(ev)] = v
        image = ax.imshow(mat, vmin=0, vmax=1, cmap=cmap, aspect="auto", origin="upper")
        boundary = sum(length <= srow["train_length"] for length in lengths_all) - 0.5
        ax.axvline(
            boundary,
            color="#e41a1c",
            linewidth=2.0,
            linestyle="--",
            label=f"train length {srow['train_length']}",
        )
        ax.set_xticks(
            range(len(lengths_all)), [str(v) for v in lengths_all], rotation=45, fontsize=7
        )
        ax.set_yticks(
            range(len(depths_all)),
            [f"{d:.0%}" if np.isfinite(d) and d <= 1 else f"{d:g}" for d in depths_all],
            fontsize=7,
        )
        ax.set_title(srow["series"], fontsize=9)
        if c_ == 0:
            ax.set_ylabel("key depth in context", fontsize=8)
        if r_ == nrows - 1 or (r_ + 1, c_) not in used:
            ax.set_xlabel("context length (tokens)", fontsize=8)
    title = "Passkey retrieval accuracy by key depth and context length (red dashed line: training length)"
    fig = grid.finish(title, colorbar=image, colorbar_label="passkey exact-match accuracy")
    _save(rep, fig, "passkey_heatmap")


@dataclass
class _Probe:
    metric: str
    title: str
    xlabel: str
    ylabel: str
    caption: str
    marker_label: str = "train length ({m:g})"
    xscale: str = "log2"
    hline: float | None = None


_PROBES = [
    _Probe(
        "shift_dnll",
        "Shift probe: NLL change when every position id is offset by Δ",
        "position offset Δ (tokens, symlog2 scale)",
        "ΔNLL vs unshifted (nats/token)",
        "NLL change when the same text is read with all position ids shifted by Δ; a purely "
        "relative encoding stays on the dotted zero line, and right of the grey vertical line (Δ = "
        "training length) every position is one the model never trained on.",
        marker_label="Δ = train length ({m:g})",
        xscale="symlog2",
        hline=0.0,
    ),
    _Probe(
        "order_dnll",
        "Order probe: NLL change on the final block when context beyond distance d is shuffled",
        "distance d beyond which context is shuffled (tokens, log2)",
        "ΔNLL vs unshuffled (nats/token)",
        "How much the final block's NLL rises when tokens farther back than d are shuffled; a "
        "near-zero value at large d means the model ignores word order that far back. The grey "
        "vertical line marks the training length.",
        hline=0.0,
    ),
    _Probe(
        "attn_entropy",
        "Attention entropy by query position (mean over layers and heads)",
        "query position (bucket midpoint, tokens, log2)",
        "attention entropy (nats)",
        "Mean entropy of each query's attention distribution, averaged over heads and layers; "
        "entropy that keeps rising right of the grey training-length line means attention is "
        "diluting over more keys than the model saw in training.",
    ),
    _Probe(
        "context_nll",
        "NLL of a fixed final block vs visible context",
        "visible context c (tokens, log2)",
        "NLL of final block (nats/token)",
        "NLL of the same final block given c tokens of preceding context; a model that uses long "
        "context keeps falling to the right, one that breaks beyond its training length (grey "
        "line) turns upward.",
    ),
]


def _probe_section(rep: _Report, df: pd.DataFrame, style: _Style) -> str:
    parts = ["## Probes"]
    skeys = [*SERIES_KEYS, *LABEL_KEYS, "series_rank"]
    for probe in _PROBES:
        rows = df[df["metric"] == probe.metric]
        parts.append(f"### {probe.metric}")
        if rows.empty:
            parts.append(_note(probe.metric, f"the {probe.metric} table and figure are omitted"))
            continue
        if probe.metric == "attn_entropy":
            full = _sort(
                _aggregate(rows, [*skeys, "eval_length", "layer", "bucket_lo", "bucket_hi"]),
                ["eval_length", "layer", "bucket_lo"],
            )
            _write_table(
                rep,
                "probe_attn_entropy",
                full,
                full[["series", "eval_length", "layer", "bucket_lo", "bucket_hi", "value"]],
                index=False,
            )
            mean_layers = _aggregate(rows, [*skeys, "eval_length", "bucket_lo", "bucket_hi"])
            mean_layers["x"] = (mean_layers["bucket_lo"] + mean_layers["bucket_hi"]) / 2
            plot = mean_layers
            r2 = rows.assign(
                region=np.where(
                    (rows["bucket_lo"] + rows["bucket_hi"]) / 2 < rows["train_length"],
                    "inside",
                    "beyond",
                )
            )
            summ = _sort(
                _aggregate(r2, [*skeys, "eval_length", "region"]), ["eval_length", "region"]
            )
            shown = _pivot(
                summ,
                index=["series_rank", "series", "eval_length"],
                columns="region",
                values="value",
            )
            if {"inside", "beyond"} <= set(shown.columns):
                shown["beyond - inside"] = shown["beyond"] - shown["inside"]
            md = _write_table(rep, "probe_attn_entropy_summary", summ, shown, index=True)
            parts.append(
                "Mean attention entropy (nats) over query positions inside vs beyond the training "
                "length (token-weighted over layers, buckets and seeds). Source: "
                "`tables/probe_attn_entropy_summary.csv`; per layer and bucket: `tables/probe_attn_entropy.csv`."
            )
        else:
            t = _aggregate(
                rows.assign(x=_numeric_axis(rows["axis_value"])),
                [*skeys, "eval_length", "axis", "x"],
            )
            t = _sort(t, ["eval_length", "x"])
            plot = t
            shown = _pivot(
                t,
                index=["series_rank", "series", "eval_length"],
                columns="x",
                values="value",
            )
            shown.columns = [f"{c:g}" for c in shown.columns]
            md = _write_table(rep, f"probe_{probe.metric}", t, shown, index=True)
            axis = (
                ", ".join(sorted({str(a) for a in rows["axis"].dropna().unique()})) or "axis value"
            )
            parts.append(
                f"{probe.metric} by {axis} (columns). Source: `tables/probe_{probe.metric}.csv`."
            )
        _line_panels(
            rep,
            style,
            plot,
            name=probe.metric,
            title=probe.title,
            xlabel=probe.xlabel,
            ylabel=probe.ylabel,
            xscale=probe.xscale,
            marker_label=probe.marker_label,
            hline=probe.hline,
        )
        parts.insert(-1, _figure_md(probe.metric, probe.caption))
        parts.append(md)
    parts.append("### position_probe_r2")
    rows = df[df["metric"] == "position_probe_r2"]
    if rows.empty:
        parts.append(_note("position_probe_r2", "the position-probe table and figure are omitted"))
    else:
        rows = rows.assign(
            region=[
                _region(ax_, a) for a, ax_ in zip(rows["axis_value"], rows["axis"], strict=True)
            ]
        )
        t = _sort(_aggregate(rows, [*skeys, "eval_length", "region"]), ["eval_length", "region"])
        shown = _pivot(
            t,
            index=["series_rank", "series", "eval_length"],
            columns="region",
            values="value",
        )
        md = _write_table(rep, "probe_position_probe_r2", t, shown, index=True)
        _r2_plot(rep, style, t)
        parts += [
            _figure_md(
                "position_probe_r2",
                "R² of a linear probe that decodes absolute position from hidden states, for "
                "positions inside vs beyond the training length; bars near the grey line at 1 mean "
                "position is linearly readable there, a drop beyond the training length means the "
                "model's notion of position breaks down.",
            ),
            "Position-probe R² by region. Source: `tables/probe_position_probe_r2.csv`.",
            md,
        ]
    return "\n\n".join(parts)


def _region(axis: object, value: object) -> str:
    """Region label of a position-probe row: axis_value when axis is "region" (or missing),
    else the axis itself (rows written as axis="inside"/"beyond"); "all" if neither is set."""
    if isinstance(value, str) and (axis == "region" or not isinstance(axis, str)):
        return value
    if isinstance(axis, str) and axis:
        return axis
    return "all"


def _r2_plot(rep: _Report, style: _Style, t: pd.DataFrame) -> None:
    regions = sorted(t["region"].unique(), key=lambda r: (_rank(r, ["inside", "beyond"]), r))
    panels = sorted(t["eval_length"].unique())
    nrows, ncols = _grid(len(panels), max_cols=2)
    n_series = t["series_rank"].nunique()
    longest = max(len(str(v)) for v in t["series"])
    grid = _Panels(
        nrows,
        ncols,
        pw=max(4.0, 0.5 * n_series + 0.6),
        ph=3.2,
        bottom=0.45 + 0.055 * longest,
        hgap=0.8 + 0.055 * longest,
        top=0.5 if len(panels) == 1 else 0.75,
    )
    axes = grid.axes
    for ax in axes.flat[len(panels) :]:
        ax.set_axis_off()
    hatches = ["", "//", "..", "xx", "\\\\"]
    floor = -1.0
    for ax, ev in zip(axes.flat, panels, strict=False):
        sub = t[t["eval_length"] == ev]
        series = sub.drop_duplicates("series_rank").sort_values("series_rank")
        width = 0.8 / max(1, len(regions))
        for j, region in enumerate(regions):
            vals = []
            for rank in series["series_rank"]:
                v = sub[(sub["series_rank"] == rank) & (sub["region"] == region)]["value"]
                vals.append(float(v.iloc[0]) if len(v) else np.nan)
            xs = np.arange(len(series)) + (j - (len(regions) - 1) / 2) * width
            colors = [style.color[p] for p in series["position_label"]]
            shown = np.maximum(np.array(vals), floor)
            ax.bar(
                xs,
                shown,
                width=width,
                color=colors,
                alpha=1.0 if j == 0 else 0.55,
                hatch=hatches[j % len(hatches)],
                edgecolor="0.2",
                linewidth=0.5,
                label=f"{region} training length" if region in ("inside", "beyond") else region,
            )
            for x, v in zip(xs, vals, strict=True):
                if np.isfinite(v) and (v < floor or len(series) * len(regions) <= 48):
                    ax.text(
                        x,
                        max(v, floor),
                        f"{v:.2f}",
                        ha="center",
                        va="bottom",
                        fontsize=6,
                        rotation=90,
                    )
        ax.axhline(1.0, **_TRAIN_MARKER, label="R² = 1 (perfect decoding)")
        ax.axhline(0.0, color="0.6", linewidth=0.8)
        ax.set_xticks(
            range(len(series)), list(series["series"]), rotation=60, ha="right", fontsize=7
        )
        ax.set_ylabel("probe R² (1 = position fully decodable)")
        ax.set_xlabel("position encoding / scaling")
        ax.set_ylim(bottom=max(floor, min(0.0, float(np.nanmin(sub["value"])) - 0.05)), top=1.22)
        if len(panels) > 1:
            ax.set_title(f"eval length {ev}", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    title = "Linear probe for absolute position: R² inside vs beyond the training length"
    _save(rep, grid.finish(title, _legend_handles(axes)), "position_probe_r2")


def _other_section(rep: _Report, df: pd.DataFrame) -> str:
    rows = df[~df["metric"].isin(METRICS)]
    if rows.empty:
        return ""
    keys = [
        *SERIES_KEYS,
        *LABEL_KEYS,
        "series_rank",
        "metric",
        "eval_length",
        "axis",
        "axis_value",
        "layer",
        "bucket_lo",
        "bucket_hi",
    ]
    t = _sort(_aggregate(rows, keys), ["metric", "eval_length"])
    shown = t[
        [
            "metric",
            "series",
            "eval_length",
            "axis",
            "axis_value",
            "layer",
            "bucket_lo",
            "bucket_hi",
            "value",
            "n_rows",
        ]
    ]
    md = _write_table(rep, "other_metrics", t, shown, index=False)
    return (
        "## Other metrics\n\nMetrics without a dedicated figure. Source: `tables/other_metrics.csv`.\n\n"
        + md
    )


# ============================================================================ entry points


def _clean(directory: Path, suffixes: tuple[str, ...]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for f in directory.iterdir():
        if f.is_file() and f.suffix in suffixes:
            f.unlink()


def _render(df: pd.DataFrame, results_paths: Sequence[str | Path], out_dir: Path) -> Path:
    rep = _Report(Path(out_dir))
    rep.out_dir.mkdir(parents=True, exist_ok=True)
    _clean(rep.tables_dir, (".csv", ".md"))
    _clean(rep.plots_dir, (".png", ".svg"))
    df = df.reset_index(drop=True)
    df.insert(0, "row_id", np.arange(len(df)))
    df = _add_labels(df)
    style = _Style(df)
    source = df.drop(columns=["series_rank"])
    source.to_csv(rep.tables_dir / "source_rows.csv", index=False)
    experiments = sorted(df["experiment"].unique())
    sections = [
        f"# lenbench report: {', '.join(experiments)}",
        "Regenerated from stored result tables by `lenbench-report`. Every table below is also in "
        "`tables/` as CSV; each CSV row lists in `row_ids` the `row_id`s of "
        "`tables/source_rows.csv` it was computed from (`n_rows` of them). Aggregates are "
        "token-weighted means (weights `n`), seeds pooled.",
        _config_section(df.drop(columns=["row_id"]), results_paths),
        _perplexity_section(rep, df, style),
        _bucket_section(rep, df, style),
        _passkey_section(rep, df, style),
        _probe_section(rep, df, style),
        _other_section(rep, df),
    ]
    report = rep.out_dir / "report.md"
    report.write_text("\n\n".join(s for s in sections if s) + "\n", encoding="utf-8")
    return report


def generate_report(results_paths: str | Path | Sequence[str | Path], out_dir: str | Path) -> Path:
    """Load results from ``results_paths`` (dirs and/or parquet files), write tables, plots and
    report.md under ``out_dir``; return the path of report.md."""
    if isinstance(results_paths, (str, Path)):
        results_paths = [results_paths]
    df = load_results(results_paths)
    return _render(df, list(results_paths), Path(out_dir))


def latest_experiment_dir(results_root: str | Path = "results") -> Path:
    """The experiment directory under ``results_root`` holding the most recently modified
    result file (or, failing that, the most recently modified directory)."""
    root = Path(results_root)
    if not root.is_dir():
        raise ValueError(
            f"results directory {str(root)!r} does not exist (working directory {os.getcwd()!r}); "
            "pass RESULTS_DIR explicitly"
        )
    best: tuple[float, str] | None = None
    best_dir: Path | None = None
    for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        files = [f for f in d.rglob("*.parquet") if not f.name.startswith(".")]
        if not files:
            continue
        mtime = max([d.stat().st_mtime, *(f.stat().st_mtime for f in files)])
        if best is None or (mtime, d.name) > best:
            best, best_dir = (mtime, d.name), d
    if best_dir is None:
        raise ValueError(
            f"no experiment directory with .parquet results under {str(root)!r}; pass RESULTS_DIR explicitly"
        )
    return best_dir


def _experiment_name(df: pd.DataFrame) -> str:
    names = sorted(df["experiment"].unique())
    name = names[0] if len(names) == 1 else "+".join(names)
    return name.replace(os.sep, "_").replace("/", "_") or "report"


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``lenbench-report [RESULTS_DIR ...] [--out DIR]``."""
    parser = argparse.ArgumentParser(
        prog="lenbench-report",
        description="Regenerate tables, plots and report.md from stored lenbench result tables.",
    )
    parser.add_argument(
        "results",
        nargs="*",
        metavar="RESULTS_DIR",
        help="result directories (searched recursively for *.parquet) or parquet files; default: "
        "the most recently modified experiment directory under --results-root",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="output directory (default: reports/<experiment>)"
    )
    parser.add_argument(
        "--results-root",
        type=Path,
        default=Path("results"),
        help="where to look for the default (default: results)",
    )
    args = parser.parse_args(argv)
    try:
        paths: list[str | Path] = list(args.results) or [latest_experiment_dir(args.results_root)]
        df = load_results(paths)
        out = args.out if args.out is not None else Path("reports") / _experiment_name(df)
        report = _render(df, paths, out)
    except ValueError as exc:
        parser.error(str(exc))
    print(f"wrote {report}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
