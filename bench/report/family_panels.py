"""The per-family small-multiples figure of the report sections (:func:`family_panels`): one
panel per position family present, the scaling methods as lines, the seeds' interval as a band.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from bench.report.figures import (
    TRAIN_MARKER,
    Panels,
    Style,
    int_ticks,
    log_y_ticks,
    rotate_crowded,
    share_limits,
    thin_ticks,
)
from bench.report.frame import POSITION_ORDER, sort_series, summary_band_text


def family_order(positions: Sequence[str] | pd.Series) -> list[str]:
    """The position families present, in :data:`POSITION_ORDER` (unknown ones last, sorted)."""
    present = set(positions)
    return [p for p in POSITION_ORDER if p in present] + sorted(present - set(POSITION_ORDER))


def family_grid(n: int) -> tuple[int, int]:
    """Rows x columns for ``n`` panels: one row up to 3, 2 x 2 for 4, then rows of 3."""
    if n <= 3:
        return 1, max(1, n)
    if n == 4:
        return 2, 2
    return math.ceil(n / 3), 3


def family_panels(
    style: Style,
    summary: pd.DataFrame,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    xscale: str = "log2",
    ylog: bool = False,
    ylim: tuple[float, float] | None = None,
    xticks: Sequence[float] | None = None,
    marker_x: Callable[[int, int], float | None] = lambda train, _ev: float(train),
    marker_label: str = "train length ({m:g})",
    hline: float | None = None,
    hline_label: str | None = None,
    panel_note: Callable[[str, pd.DataFrame], str] | None = None,
) -> Figure:
    """Small multiples: one panel per position family in ``summary`` (only those present, in
    :data:`POSITION_ORDER`), each series a line (colour = scaling, the same in every panel)
    with its band, one shared y axis, one legend (in a free grid cell where there is one).

    ``summary``: one row per series x ``x`` with ``value``, ``lo``, ``hi`` (band; NaN = none),
    ``band`` and ``n_seeds`` (:func:`bench.report.frame.seed_summary`) and the label columns.
    ``panel_note(family, rows)`` adds text to a panel's title. Returns the figure (unsaved)."""
    families = family_order(summary["position"])
    grid, xlabel = _family_panel_grid(len(families), xlabel)
    axes = list(grid.axes.flat)
    for ax in axes[len(families) :]:
        ax.set_axis_off()
    xs = summary["x"].to_numpy(dtype=float)
    xs = xs[np.isfinite(xs)]
    if xscale == "log2" and len(xs) and xs.min() <= 0:
        xscale = "symlog2"  # a log axis cannot show x = 0 (e.g. no context)
    entries: dict[str, tuple[tuple, object]] = {}
    markers: dict[str, object] = {}
    marks_all: set[float] = set()
    used = axes[: len(families)]
    for i, (ax, family) in enumerate(zip(used, families, strict=True)):
        sub = summary[summary["position"] == family]
        _plot_family_series(ax, style, sub, entries)
        marks_all |= _draw_markers(ax, sub, marker_x, marker_label, hline, hline_label, markers)
        note = panel_note(family, sub) if panel_note else ""
        _dress_panel(ax, family + note, xscale=xscale, ylog=ylog)
        if i % grid.ncols == 0:
            ax.set_ylabel(ylabel + (" (log scale)" if ylog else ""), fontsize=9)
        else:
            ax.tick_params(labelleft=False)
        if i + grid.ncols >= len(families):  # nothing below it
            ax.set_xlabel(xlabel, fontsize=9)
    _share_panel_limits(used, xs, marks_all, xscale=xscale, xticks=xticks, ylim=ylim, ylog=ylog)
    rotate_crowded(used, grid.pw)
    handles = _family_legend(entries, markers, summary)
    slot = axes[len(families)] if len(axes) > len(families) else None
    return grid.finish(title, handles, legend_slot=slot, legend_title="line colour: scaling method")


def _family_panel_grid(n_families: int, xlabel: str) -> tuple[Panels, str]:
    """The panel grid for ``n_families`` panels and the x label wrapped to a panel's width."""
    nrows, ncols = family_grid(n_families)
    pw = 5.4 if n_families == 1 else 3.3
    xlabel = "\n".join(textwrap.wrap(xlabel, int(pw * 13))) or xlabel  # no label runs into the next
    lines = xlabel.count("\n")
    if n_families == 1:
        grid = Panels(1, 1, pw=pw, ph=3.6, top=0.7, bottom=0.8 + 0.17 * lines)
    else:
        grid = Panels(
            nrows,
            ncols,
            pw=pw,
            ph=2.6,
            wgap=0.3,
            hgap=0.8 + 0.17 * lines,
            bottom=0.8 + 0.17 * lines,
        )
    return grid, xlabel


def _plot_family_series(
    ax: Axes, style: Style, sub: pd.DataFrame, entries: dict[str, tuple[tuple, object]]
) -> None:
    """One line (and its band) per series of one family; its legend entry goes to ``entries``,
    keyed by label with a sort key (scaling order, series rank), first panel wins."""
    for _, s in sort_series(sub).groupby("series_rank", sort=True):
        s = s.sort_values("x")
        first = s.iloc[0]
        kw = style.line_kwargs(str(first["series"]), str(first["scaling_label"]))
        x = s["x"].to_numpy(dtype=float)
        (line,) = ax.plot(x, s["value"].to_numpy(dtype=float), zorder=3, **kw)
        lo, hi = s["lo"].to_numpy(dtype=float), s["hi"].to_numpy(dtype=float)
        ok = np.isfinite(lo) & np.isfinite(hi)
        if ok.any():
            ax.fill_between(
                x[ok],
                lo[ok],
                hi[ok],
                color=kw["color"],
                alpha=0.13,
                linewidth=0,
                zorder=1,
                label=f"_band {kw['label']}",  # "_": not a legend entry
            )
        order = (
            style.scaling_order.index(first["scaling_label"])
            if first["scaling_label"] in style.scaling_order
            else len(style.scaling_order)
        )
        entries.setdefault(str(kw["label"]), ((order, int(first["series_rank"])), line))


def _draw_markers(
    ax: Axes,
    sub: pd.DataFrame,
    marker_x: Callable[[int, int], float | None],
    marker_label: str,
    hline: float | None,
    hline_label: str | None,
    markers: dict[str, object],
) -> set[float]:
    """A panel's vertical markers (``marker_x`` of each train x eval length) and horizontal
    line; their legend handles go to ``markers``. Returns the marked x values."""
    marks = {
        m
        for tl, ev in sub[["train_length", "eval_length"]].drop_duplicates().itertuples(index=False)
        if (m := marker_x(int(tl), int(ev))) is not None
    }
    for m in sorted(marks):
        markers[marker_label.format(m=m)] = ax.axvline(m, zorder=0, gid="marker", **TRAIN_MARKER)
    if hline is not None:
        h = ax.axhline(hline, color="0.45", linewidth=1.0, linestyle=":", zorder=2, gid="marker")
        if hline_label:
            markers[hline_label] = h
    return marks


def _dress_panel(ax: Axes, title: str, *, xscale: str, ylog: bool) -> None:
    """A panel's axis scales, title, grid and tick size."""
    if xscale == "log2":
        ax.set_xscale("log", base=2)
    elif xscale == "symlog2":
        ax.set_xscale("symlog", base=2, linthresh=1.0)
    if ylog:
        ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.tick_params(labelsize=8)


def _share_panel_limits(
    used: Sequence[Axes],
    xs: np.ndarray,
    marks_all: set[float],
    *,
    xscale: str,
    xticks: Sequence[float] | None,
    ylim: tuple[float, float] | None,
    ylog: bool,
) -> None:
    """One x range (covering the data ``xs`` and the markers) and one y range for all panels."""
    if len(xs):
        lo_x = min([xs.min(), *marks_all])
        hi_x = max([xs.max(), *marks_all])
        if xscale in ("log2", "symlog2") and lo_x >= 0:
            xlim = (lo_x / 1.3 if lo_x > 0 else -0.3, hi_x * 1.3)
        else:
            pad = 0.04 * (hi_x - lo_x or 1.0)
            xlim = (lo_x - pad, hi_x + pad)
        for ax in used:
            if xscale in ("log2", "symlog2"):
                ticks = xticks if xticks is not None else thin_ticks(sorted(set(xs) | marks_all))
                int_ticks(ax, [t for t in ticks if xlim[0] <= t <= xlim[1]])
            ax.set_xlim(*xlim)  # after the ticks: setting ticks widens the limits
    if ylim is not None:
        for ax in used:
            ax.set_ylim(*ylim)
    else:
        share_limits(used, "y")
    if ylog:
        for ax in used:
            log_y_ticks(ax)


def _family_legend(
    entries: dict[str, tuple[tuple, object]], markers: dict[str, object], summary: pd.DataFrame
) -> dict[str, object]:
    """Legend handles: the series in sort-key order (labels wrapped), then the markers, then
    what the shaded bands mean."""
    handles = {
        "\n".join(textwrap.wrap(k, 40)) or k: h
        for k, (_, h) in sorted(entries.items(), key=lambda kv: kv[1][0])
    }
    handles.update(markers)
    text = summary_band_text(summary)
    if text:
        label = "\n".join(textwrap.wrap("shaded: " + text, 36))
        handles[label] = Patch(facecolor="0.35", alpha=0.25, linewidth=0)
    return handles
