"""Probe sections: shift, order, attention entropy, context NLL and the linear position probe.

The axis-valued probes share one table and figure recipe (:data:`PROBES`: one panel per position
family, scalings as lines, seeds as band); attention entropy adds an inside/beyond-training-length
summary and the position probe is a bar chart by region.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from bench.report.family_panels import family_panels
from bench.report.figures import (
    TRAIN_MARKER,
    Panels,
    Style,
    grid_shape,
    legend_handles,
    pow2_ticks,
    save_figure,
)
from bench.report.frame import (
    GROUP_KEYS,
    aggregate,
    at_longest_eval,
    numeric_axis,
    pivot,
    rank,
    seed_summary,
    sort_series,
    summary_band_text,
)
from bench.report.markdown import ReportDir, figure_md, note, write_table


@dataclass
class Probe:
    """Titles, axis labels and caption of one axis-valued probe's figure."""

    metric: str
    title: str
    xlabel: str
    ylabel: str
    caption: str
    marker_label: str = "train length ({m:g})"
    xscale: str = "log2"
    hline: float | None = None


PROBES = [
    Probe(
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
    Probe(
        "order_dnll",
        "Order probe: NLL change on the final block when context beyond distance d is shuffled",
        "distance d beyond which context is shuffled (tokens, log2)",
        "ΔNLL vs unshuffled (nats/token)",
        "How much the final block's NLL rises when tokens farther back than d are shuffled; a "
        "near-zero value at large d means the model ignores word order that far back. The grey "
        "vertical line marks the training length.",
        hline=0.0,
    ),
    Probe(
        "attn_entropy",
        "Attention entropy by query position (mean over layers and heads)",
        "query position (bucket midpoint, tokens, log2)",
        "attention entropy (nats)",
        "Mean entropy of each query's attention distribution, averaged over heads and layers; "
        "entropy that keeps rising right of the grey training-length line means attention is "
        "diluting over more keys than the model saw in training.",
    ),
    Probe(
        "context_nll",
        "NLL of a fixed final block vs visible context",
        "visible context c (tokens, log2)",
        "NLL of final block (nats/token)",
        "NLL of the same final block given c tokens of preceding context; a model that uses long "
        "context keeps falling to the right, one that breaks beyond its training length (grey "
        "line) turns upward.",
    ),
]


def probe_section(rep: ReportDir, df: pd.DataFrame, style: Style) -> str:
    parts = ["## Probes"]
    for probe in PROBES:
        rows = df[df["metric"] == probe.metric]
        parts.append(f"### {probe.metric}")
        if rows.empty:
            parts.append(note(probe.metric, f"the {probe.metric} table and figure are omitted"))
            continue
        if probe.metric == "attn_entropy":
            md, text = _entropy_tables(rep, rows)
        else:
            md, text = _axis_table(rep, rows, probe)
        fig, extra = probe_figure(rows, probe, style)
        save_figure(fig, rep.plots_dir, probe.metric)
        parts += [figure_md(probe.metric, f"{probe.caption} {extra}"), text, md]
    parts.append("### position_probe_r2")
    parts += _position_probe_parts(rep, df, style)
    return "\n\n".join(parts)


def _entropy_tables(rep: ReportDir, rows: pd.DataFrame) -> tuple[str, str]:
    """Write the attention-entropy tables (per layer and bucket; inside vs beyond the training
    length); return the summary's markdown and its description."""
    full = sort_series(
        aggregate(rows, [*GROUP_KEYS, "eval_length", "layer", "bucket_lo", "bucket_hi"]),
        ["eval_length", "layer", "bucket_lo"],
    )
    write_table(
        rep,
        "probe_attn_entropy",
        full,
        full[["series", "eval_length", "layer", "bucket_lo", "bucket_hi", "value"]],
        index=False,
    )
    r2 = rows.assign(
        region=np.where(
            (rows["bucket_lo"] + rows["bucket_hi"]) / 2 < rows["train_length"],
            "inside",
            "beyond",
        )
    )
    summ = sort_series(
        aggregate(r2, [*GROUP_KEYS, "eval_length", "region"]), ["eval_length", "region"]
    )
    shown = pivot(
        summ,
        index=["series_rank", "series", "eval_length"],
        columns="region",
        values="value",
    )
    if {"inside", "beyond"} <= set(shown.columns):
        shown["beyond - inside"] = shown["beyond"] - shown["inside"]
    md = write_table(rep, "probe_attn_entropy_summary", summ, shown, index=True)
    text = (
        "Mean attention entropy (nats) over query positions inside vs beyond the training "
        "length (token-weighted over layers, buckets and seeds). Source: "
        "`tables/probe_attn_entropy_summary.csv`; per layer and bucket: `tables/probe_attn_entropy.csv`."
    )
    return md, text


def _axis_table(rep: ReportDir, rows: pd.DataFrame, probe: Probe) -> tuple[str, str]:
    """Write an axis-valued probe's table (series x eval length by axis value); return its
    markdown and description."""
    t = aggregate(
        rows.assign(x=numeric_axis(rows["axis_value"])),
        [*GROUP_KEYS, "eval_length", "axis", "x"],
    )
    t = sort_series(t, ["eval_length", "x"])
    shown = pivot(
        t,
        index=["series_rank", "series", "eval_length"],
        columns="x",
        values="value",
    )
    shown.columns = [f"{c:g}" for c in shown.columns]
    md = write_table(rep, f"probe_{probe.metric}", t, shown, index=True)
    axis = ", ".join(sorted({str(a) for a in rows["axis"].dropna().unique()})) or "axis value"
    text = f"{probe.metric} by {axis} (columns). Source: `tables/probe_{probe.metric}.csv`."
    return md, text


def _position_probe_parts(rep: ReportDir, df: pd.DataFrame, style: Style) -> list[str]:
    """The position-probe R² by region: table and bar chart (a note without rows)."""
    rows = df[df["metric"] == "position_probe_r2"]
    if rows.empty:
        return [note("position_probe_r2", "the position-probe table and figure are omitted")]
    rows = rows.assign(
        region=[_region(ax_, a) for a, ax_ in zip(rows["axis_value"], rows["axis"], strict=True)]
    )
    t = sort_series(
        aggregate(rows, [*GROUP_KEYS, "eval_length", "region"]), ["eval_length", "region"]
    )
    shown = pivot(
        t,
        index=["series_rank", "series", "eval_length"],
        columns="region",
        values="value",
    )
    md = write_table(rep, "probe_position_probe_r2", t, shown, index=True)
    _r2_plot(rep, style, t)
    return [
        figure_md(
            "position_probe_r2",
            "R² of a linear probe that decodes absolute position from hidden states, for "
            "positions inside vs beyond the training length; bars near the grey line at 1 mean "
            "position is linearly readable there, a drop beyond the training length means the "
            "model's notion of position breaks down.",
        ),
        "Position-probe R² by region. Source: `tables/probe_position_probe_r2.csv`.",
        md,
    ]


def probe_figure(rows: pd.DataFrame, probe: Probe, style: Style) -> tuple[Figure, str]:
    """One panel per family, the scalings as lines, seeds as band, at each series' longest eval
    length (attention entropy: mean over layers by query bucket); with caption text."""
    if probe.metric == "attn_entropy":
        keys = [*GROUP_KEYS, "eval_length", "bucket_lo", "bucket_hi"]
        per = aggregate(rows, [*keys, "seed"])
        per["x"] = (per["bucket_lo"] + per["bucket_hi"]) / 2
        keys.append("x")
        ticks = pow2_ticks(per["bucket_hi"])
    else:
        ticks = None
        keys = [*GROUP_KEYS, "eval_length", "axis", "x"]
        per = aggregate(rows.assign(x=numeric_axis(rows["axis_value"])), [*keys, "seed"])
    several = per["eval_length"].nunique() > 1
    s = seed_summary(at_longest_eval(per), keys)

    def note_(_family: str, sub: pd.DataFrame) -> str:
        lengths = sorted(sub["eval_length"].unique())
        return f" (eval length {'/'.join(str(v) for v in lengths)})"

    fig = family_panels(
        style,
        s,
        title=probe.title,
        xlabel=probe.xlabel,
        ylabel=probe.ylabel,
        xscale=probe.xscale,
        marker_label=probe.marker_label,
        hline=probe.hline,
        hline_label=None if probe.hline is None else f"{probe.hline:g} (no change)",
        panel_note=note_ if several else None,
        xticks=ticks,
    )
    text = summary_band_text(s)
    parts = ["One panel per position family with rows; colour = scaling method (black = none)."]
    if several:
        parts.append(
            "Each model at its longest evaluation length (panel titles); every length is in "
            "the table below."
        )
    mean = "mean over seeds" if int(s["n_seeds"].max()) > 1 else "the run's value"
    parts.append(f"Line: {mean}; shaded: {text}." if text else f"Line: {mean}.")
    return fig, " ".join(parts)


def _region(axis: object, value: object) -> str:
    """Region label of a position-probe row: axis_value when axis is "region" (or missing),
    else the axis itself (rows written as axis="inside"/"beyond"); "all" if neither is set."""
    if isinstance(value, str) and (axis == "region" or not isinstance(axis, str)):
        return value
    if isinstance(axis, str) and axis:
        return axis
    return "all"


def _r2_plot(rep: ReportDir, style: Style, t: pd.DataFrame) -> None:
    regions = sorted(t["region"].unique(), key=lambda r: (rank(r, ["inside", "beyond"]), r))
    panels = sorted(t["eval_length"].unique())
    nrows, ncols = grid_shape(len(panels), max_cols=2)
    n_series = t["series_rank"].nunique()
    longest = max(len(str(v)) for v in t["series"])
    grid = Panels(
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
            for srank in series["series_rank"]:
                v = sub[(sub["series_rank"] == srank) & (sub["region"] == region)]["value"]
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
        ax.axhline(1.0, **TRAIN_MARKER, label="R² = 1 (perfect decoding)")
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
    save_figure(grid.finish(title, legend_handles(axes)), rep.plots_dir, "position_probe_r2")
