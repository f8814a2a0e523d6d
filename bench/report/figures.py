"""Plot building blocks shared by the report sections: series styles, panel grids, legends.

Colours follow the position encoding and line styles the scaling method in every figure; a thick
grey vertical line marks the training length. Figures are laid out with fixed margins in inches
and saved as PNG and SVG.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import rc_context
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullLocator

from bench.report.frame import sort_series

_LINESTYLES = ["-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 1)), (0, (3, 1, 1, 1, 1, 1))]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
TRAIN_MARKER = {"color": "0.45", "linestyle": "-", "linewidth": 3.0, "alpha": 0.35}


class Style:
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


def save_figure(fig: Figure, plots_dir: Path, name: str) -> None:
    """Save PNG and SVG (SVG text stays text: smaller, faster, searchable)."""
    fig.savefig(plots_dir / f"{name}.png", dpi=100)
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "lenbench"}):
        fig.savefig(plots_dir / f"{name}.svg")


def int_ticks(ax, values: Sequence[float], axis: str = "x") -> None:  # type: ignore[no-untyped-def]
    vals = sorted({float(v) for v in values if np.isfinite(v)})
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_minor_locator(NullLocator())
    if 0 < len(vals) <= 12:
        target.set_ticks(vals)
    target.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g}"))


def train_lines(ax, lengths: Sequence[int]) -> None:  # type: ignore[no-untyped-def]
    for length in sorted(set(lengths)):
        ax.axvline(length, **TRAIN_MARKER, label=f"train length ({length})")


def share_limits(axes: Sequence, which: str) -> None:  # type: ignore[type-arg]
    """Give ``axes`` one common x or y range (cheaper than matplotlib's shared axes, which
    re-autoscale every sibling on each artist added)."""
    if len(axes) < 2:
        return
    get = "get_ylim" if which == "y" else "get_xlim"
    lims = np.array([getattr(ax, get)() for ax in axes], dtype=float)
    lo, hi = float(np.nanmin(lims[:, 0])), float(np.nanmax(lims[:, 1]))
    for ax in axes:
        (ax.set_ylim if which == "y" else ax.set_xlim)(lo, hi)


def grid_shape(n: int, max_cols: int = 3) -> tuple[int, int]:
    cols = min(max_cols, max(1, n))
    return math.ceil(n / cols), cols


@dataclass
class Panels:
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


def legend_handles(
    axes: np.ndarray, style: Style | None = None, data: pd.DataFrame | None = None
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


def line_panels(
    plots_dir: Path,
    style: Style,
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
    nrows, ncols = grid_shape(len(panels))
    grid = Panels(1, 1, pw=6.0, ph=4.2, top=0.5) if len(panels) == 1 else Panels(nrows, ncols)
    axes = grid.axes
    for ax in axes.flat[len(panels) :]:
        ax.set_axis_off()
    tf = transform or (lambda a: a)
    for ax, panel in zip(axes.flat, panels, strict=False):
        sub = data if panel is None else data[data[panel_col] == panel]
        for _, s in sort_series(sub).groupby("series_rank", sort=True):
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
            ax.axvline(m, **TRAIN_MARKER, label=marker_label.format(m=m))
        if hline is not None:
            ax.axhline(hline, color="0.55", linewidth=1.0, linestyle=":", label=hline_label)
        xs = sub["x"].to_numpy(dtype=float)
        xs = xs[np.isfinite(xs)]
        panel_xscale = xscale
        if xscale == "log2" and len(xs) and xs.min() <= 0:
            panel_xscale = "symlog2"  # a log axis cannot show x = 0 (e.g. no context); keep it
        if panel_xscale == "log2":
            ax.set_xscale("log", base=2)
            int_ticks(ax, xs)
        elif panel_xscale == "symlog2":
            ax.set_xscale("symlog", base=2, linthresh=1.0)
            int_ticks(ax, xs)
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
    share_limits(list(axes.flat[: len(panels)]), "y")
    save_figure(grid.finish(title, legend_handles(axes, style, data)), plots_dir, name)


def series_grid(series: pd.DataFrame) -> tuple[list[tuple[int, int]], int, int]:
    """Place series on a (scaling row x position column) grid when that is unambiguous."""
    s = series.drop_duplicates("series_rank").sort_values("series_rank")
    pos = list(dict.fromkeys(s["position_label"]))
    scal = list(dict.fromkeys(s["scaling_label"]))
    pairs = list(zip(s["scaling_label"], s["position_label"], strict=True))
    if len(set(pairs)) == len(pairs) and len(pos) * len(scal) <= 2 * len(pairs) + 2:
        cells = [(scal.index(sc), pos.index(p)) for sc, p in pairs]
        return cells, len(scal), len(pos)
    nrows, ncols = grid_shape(len(pairs), max_cols=5)
    return [(i // ncols, i % ncols) for i in range(len(pairs))], nrows, ncols
