"""Plot building blocks shared by the report sections: series styles, panel grids, legends,
axis ticks.

Most figures are small multiples (:func:`bench.report.family_panels.family_panels`): one panel
per position family present (rope, sinusoidal, learned, alibi, nope), the scaling methods (and
fine-tunes) as lines in one colour each, the same in every panel and figure (no scaling = black),
the mean over seeds as the line and its interval as a light band. A thick grey vertical line marks
the training length. Figures are laid out with fixed margins in inches and saved as PNG and SVG.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

from bench.report.frame import FINETUNE_MARK, scaling_rank

_LINESTYLES = ["-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 1)), (0, (3, 1, 1, 1, 1, 1))]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
TRAIN_MARKER = {"color": "0.45", "linestyle": "-", "linewidth": 3.0, "alpha": 0.35}


class Style:
    """Consistent styles across plots: in :func:`family_panels` a colour per scaling label
    (``scaling_color``; none = black), legend text per series (``line_label``) and a line style
    per variant of one scaling (``variant_style``); in the bar chart a colour per position."""

    def __init__(self, df: pd.DataFrame) -> None:
        ordered = df.sort_values("series_rank")
        positions = list(dict.fromkeys(ordered["position_label"]))
        scalings = list(dict.fromkeys(ordered["scaling_label"]))
        self.color = dict(zip(positions, line_colors(len(positions)), strict=True))
        self.linestyle = {s: _LINESTYLES[i % len(_LINESTYLES)] for i, s in enumerate(scalings)}
        self.marker = {s: _MARKERS[i % len(_MARKERS)] for i, s in enumerate(scalings)}

        self._scaling_styles(ordered)

    def kwargs(self, position_label: str, scaling_label: str) -> dict[str, object]:
        return {
            "color": self.color[position_label],
            "linestyle": self.linestyle[scaling_label],
            "marker": self.marker[scaling_label],
            "markersize": 3.5,
            "linewidth": 1.5,
        }

    def _scaling_styles(self, ordered: pd.DataFrame) -> None:
        """Colours per scaling label (none = black; fine-tunes after zero-shot methods), legend
        text per series and a line style per variant of one scaling label (train length,
        experiment, arm, position parameters), for :func:`family_panels`."""
        series = ordered.drop_duplicates("series_rank")
        tuned = (
            series["finetune_method"].notna()
            if "finetune_method" in series.columns
            else pd.Series(False, index=series.index)
        )
        keys = pd.DataFrame(
            {
                "label": series["scaling_label"],
                "tuned": tuned.astype(bool),
                "rank": [scaling_rank(sc) for sc in series["scaling"]],
            }
        ).drop_duplicates("label")
        keys = keys.sort_values(["tuned", "rank", "label"], kind="stable")
        palette = _palette(int((keys["label"] != "none").sum()))
        self.scaling_order = list(keys["label"])
        self.scaling_color: dict[str, object] = {}
        i = 0
        for label in self.scaling_order:
            if label == "none":
                self.scaling_color[label] = "black"
            else:
                self.scaling_color[label] = palette[i % len(palette)]
                i += 1
        several = series.groupby("position")["position_label"].nunique()
        self.line_label: dict[str, str] = {}
        self.variant_style: dict[str, object] = {}
        variants: dict[tuple, int] = {}
        for row in series.itertuples(index=False):
            full, pos = str(row.series), str(row.position_label)
            own = several.get(row.position, 1) > 1  # the panel needs the position label too
            self.line_label[full] = display_label(full if own else full[len(pos) + 3 :])
            # what tells two series of one scaling apart: train length, experiment, arm, params
            suffix = full[len(pos) + 3 + len(str(row.scaling_label)) :].strip()
            key = (pos if own else "", suffix)
            index = variants.setdefault(key, len(variants))
            self.variant_style[full] = _LINESTYLES[index % len(_LINESTYLES)]

    def line_kwargs(self, series: str, scaling_label: str) -> dict[str, object]:
        """Colour (scaling), line style (variant) and marker of one series in family panels."""
        return {
            "color": self.scaling_color.get(scaling_label, "0.4"),
            "linestyle": self.variant_style.get(series, "-"),
            "marker": self.marker.get(scaling_label, "o"),
            "markersize": 3.5,
            "linewidth": 1.6,
            "label": self.line_label.get(series, series),
        }


_FINETUNE_RE = re.compile(re.escape(FINETUNE_MARK) + r"([^ ,]+x)(, \d+ steps)?")


def display_label(text: str) -> str:
    """Legend text of a line: "pi ft@4x" -> "pi (fine-tuned at 4x)", "none" -> "none (raw)"."""
    text = _FINETUNE_RE.sub(lambda m: f" (fine-tuned at {m.group(1)}{m.group(2) or ''})", text)
    if text == "none" or text.startswith("none "):
        text = "none (raw)" + text[4:]
    elif " / none" in text:  # a label that keeps its position: "rope (base=500000) / none"
        text = text.replace(" / none", " / none (raw)", 1)
    return text


def line_colors(n: int) -> list[object]:
    """``n`` colours for lines that a legend tells apart: tab10's for up to 10, tab20's for up to
    20 (10 colours cycled would give two series one colour); beyond 20 they repeat."""
    from matplotlib import colormaps

    colors = colormaps["tab10" if n <= 10 else "tab20"].colors  # type: ignore[attr-defined]
    return [colors[i % len(colors)] for i in range(n)]


def _palette(n: int) -> list[object]:
    """Distinct colours for the scaling methods other than none (black): tab10 without its grey,
    tab20 without greys when there are more."""
    from matplotlib import colormaps

    if n <= 9:
        colors = colormaps["tab10"].colors  # type: ignore[attr-defined]
        return [c for i, c in enumerate(colors) if i != 7]
    colors = colormaps["tab20"].colors  # type: ignore[attr-defined]
    return [c for i, c in enumerate(colors) if i not in (14, 15)]


def save_figure(fig: Figure, plots_dir: Path, name: str) -> None:
    """Save PNG and SVG (SVG text stays text: smaller, faster, searchable). The SVG has no
    date and fixed ids, so a report regenerated from the same rows is byte-identical."""
    fig.savefig(plots_dir / f"{name}.png", dpi=100)
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "lenbench"}):
        fig.savefig(plots_dir / f"{name}.svg", metadata={"Date": None})


def int_ticks(ax, values: Sequence[float], axis: str = "x") -> None:  # type: ignore[no-untyped-def]
    vals = sorted({float(v) for v in values if np.isfinite(v)})
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_minor_locator(NullLocator())
    if 0 < len(vals) <= 12:
        target.set_ticks(vals)
    target.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g}"))


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
        legend_slot: Axes | None = None,
        legend_title: str | None = None,
    ) -> Figure:
        """``legend_slot``: an unused grid cell to hold the legend when it fits there (else the
        legend goes right of the panels as usual)."""
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
                title=legend_title,
                title_fontsize=8,
                alignment="left",
                frameon=False,
                handlelength=2.6,
                borderaxespad=0.0,
            )
            box = leg.get_window_extent(renderer)
            if legend_slot is not None and colorbar is None:
                slot = legend_slot.get_position()
                w_in, h_in = fig.get_size_inches()
                room_w = slot.width * w_in + self.right + 0.2
                room_h = (slot.y1 * h_in) - 0.1
                if box.width / fig.dpi <= room_w and box.height / fig.dpi <= room_h:
                    leg.set_bbox_to_anchor(
                        (slot.x0 + 0.1 / w_in, slot.y1), transform=fig.transFigure
                    )
                    return self._title(title)
            extra += box.width / fig.dpi + 0.3
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
        return self._title(title)

    def _title(self, title: str) -> Figure:
        w, h = self.fig.get_size_inches()
        self.fig.suptitle(
            title,
            x=0.5 * (self.left + self._width(0.0) - self.right) / w,
            y=1 - 0.12 / h,
            va="top",
            fontsize=12,
        )
        return self.fig


def legend_handles(axes: np.ndarray) -> dict[str, object]:
    """Handles for one figure legend right of the panels: every labelled artist, once."""
    handles: dict[str, object] = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if not lab.startswith("_"):
                handles.setdefault(lab, h)
    return handles


def log_y_ticks(ax: Axes) -> None:
    """Plain-number ticks on a log y axis: 1-2-3-5 steps within about a decade, 1-2-5 up to
    three decades, powers of ten beyond."""
    lo, hi = ax.get_ylim()
    decades = math.log10(hi / lo) if lo > 0 and hi > lo else 1.0
    subs = (1.0, 2.0, 3.0, 5.0) if decades <= 1.2 else (1.0, 2.0, 5.0) if decades <= 3 else (1.0,)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _p: _plain_number(y)))
    ax.yaxis.set_minor_locator(NullLocator())


def _plain_number(y: float) -> str:
    """Tick text: "0.5", "20", "5000", and "1e4", "2e6" from ten thousand up."""
    if y >= 1e4:
        mantissa, exponent = f"{y:.0e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    return f"{y:g}"


def wants_log(values: Sequence[float] | np.ndarray, span: float = 3.0) -> bool:
    """Log scale when the positive finite values span more than ``span`` x."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    return bool(len(v) and v.max() / v.min() > span)


def pow2_ticks(values: Sequence[float], most: int = 6) -> list[float]:
    """Powers of two among ``values`` (e.g. bucket edges), at most ``most`` of them."""
    v = sorted({float(x) for x in values if np.isfinite(x) and x > 0})
    powers = [x for x in v if math.log2(x).is_integer()] or v
    return thin_ticks(powers, most)


def thin_ticks(values: list[float], most: int = 8) -> list[float]:
    """At most ``most`` tick positions: every k-th value (always keeping the last)."""
    if len(values) <= most:
        return values
    step = math.ceil(len(values) / most)
    kept = values[::-1][::step][::-1]
    return kept


def rotate_crowded(axes: Sequence[Axes], panel_width: float) -> None:
    """Tilt x tick labels where they would run into each other."""
    for ax in axes:
        labels = [t.get_text() for t in ax.get_xticklabels()]
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        chars = sum(len(str(lab)) + 2 for lab in labels[: len(ticks)]) if labels else 0
        if not any(labels):
            chars = sum(len(f"{t:g}") + 2 for t in ticks)
        if chars * 0.075 > 0.85 * panel_width:
            ax.tick_params(axis="x", labelrotation=45)
            for lab in ax.get_xticklabels():
                lab.set_horizontalalignment("right")
                lab.set_rotation_mode("anchor")


def panel_axes(fig: Figure) -> list[Axes]:
    """The panels of a figure (visible axes with a title), in order."""
    return [ax for ax in fig.axes if ax.axison and ax.get_title()]


def has_data(ax: Axes) -> bool:
    """Whether a panel shows data: a line with a finite point that is not a marker line
    (training length, reference line), or an image."""
    for line in ax.get_lines():
        y = np.asarray(line.get_ydata(), dtype=float)
        if line.get_gid() != "marker" and len(y) and np.isfinite(y).any():
            return True
    return bool(ax.get_images())
