"""Passkey section: accuracy by depth and length (heatmaps), accuracy vs length, passkey context.

The passkey context (largest length whose accuracy reaches the threshold) is computed once, by
the evaluation job; this section shows the stored ``passkey_context`` rows and draws the
threshold they were computed with (stored as axis="threshold", axis_value=<threshold>).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench.report.figures import Panels, Style, line_panels, save_figure, series_grid
from bench.report.frame import (
    GROUP_KEYS,
    aggregate,
    numeric_axis,
    pivot,
    sort_series,
    summary_or_detail,
)
from bench.report.markdown import ReportDir, figure_md, note, write_table

#: Threshold label of ``passkey_context`` rows written before the evaluation stored it.
NOT_RECORDED = "not recorded"


def passkey_section(rep: ReportDir, df: pd.DataFrame, style: Style) -> str:
    head = "## Passkey retrieval"
    acc = df[df["metric"] == "passkey_acc"].copy()
    recorded = df[df["metric"] == "passkey_context"]
    if acc.empty and recorded.empty:
        return head + "\n\n" + note("passkey_acc", "the passkey tables and figures are omitted")
    if acc.empty:
        parts = [head, note("passkey_acc", "the passkey heatmaps and accuracy tables are omitted")]
    else:
        parts = [head, *_accuracy_parts(rep, acc, recorded, style)]
    parts += ["### Passkey context", *_context_parts(rep, recorded)]
    return "\n\n".join(parts)


def _accuracy_parts(
    rep: ReportDir, acc: pd.DataFrame, recorded: pd.DataFrame, style: Style
) -> list[str]:
    """Accuracy by depth (heatmap) and by length (figure with the stored threshold, table)."""
    parts = []
    acc["depth"] = numeric_axis(acc["axis_value"])
    acc.loc[acc["axis"].notna() & (acc["axis"] != "depth"), "depth"] = np.nan
    depth_rows = acc[acc["depth"].notna()]
    by_len = summary_or_detail(
        acc,
        [*GROUP_KEYS, "eval_length"],
        acc["depth"].isna(),
        ("per-length rows", "mean over depths"),
    )
    by_len = sort_series(by_len, ["eval_length"]).rename(columns={"value": "passkey_acc"})
    by_depth = sort_series(
        aggregate(depth_rows, [*GROUP_KEYS, "eval_length", "depth"]), ["eval_length", "depth"]
    ).rename(columns={"value": "passkey_acc"})
    piv = pivot(
        by_len,
        index=["series_rank", "series"],
        columns="eval_length",
        values="passkey_acc",
    )
    piv.columns = [f"L={c}" for c in piv.columns]
    md_len = write_table(rep, "passkey_by_length", by_len, piv, index=True)
    if not by_depth.empty:
        write_table(
            rep,
            "passkey_by_depth",
            by_depth,
            by_depth[["series", "eval_length", "depth", "passkey_acc", "n"]],
            index=False,
        )
        _heatmap(rep, by_depth)
        parts.append(
            figure_md(
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
    thresholds = sorted(set(stored_thresholds(recorded).dropna()))
    line = thresholds[0] if len(thresholds) == 1 else None
    line_panels(
        rep.plots_dir,
        style,
        by_len.assign(x=by_len["eval_length"], value=by_len["passkey_acc"]),
        name="passkey_acc_vs_length",
        title="Passkey accuracy vs context length (mean over depths)",
        xlabel="context length (tokens, log2 scale)",
        ylabel="exact-match accuracy (fraction)",
        hline=line,
        hline_label=None if line is None else f"passkey-context threshold {line:g}",
        panel_col=None,
    )
    if line is not None:
        caption = (
            f"Passkey accuracy averaged over depths; the dotted line is the {line:g} threshold "
            "that defines the passkey context, the grey vertical line the training length."
        )
    else:
        if recorded.empty:
            why = "no `passkey_context` rows"
        elif thresholds:
            why = f"the runs used different thresholds ({', '.join(f'{t:g}' for t in thresholds)})"
        else:
            why = "threshold not recorded"
        caption = (
            "Passkey accuracy averaged over depths; the grey vertical line marks the training "
            f"length (no passkey-context threshold line: {why})."
        )
    parts += [
        figure_md("passkey_acc_vs_length", caption),
        "Passkey accuracy by context length (the per-length rows where stored, else the "
        "mean over depths; weighted by trials, seeds pooled). Source: "
        "`tables/passkey_by_length.csv`, by depth: `tables/passkey_by_depth.csv`.",
        md_len,
    ]
    return parts


def _context_parts(rep: ReportDir, recorded: pd.DataFrame) -> list[str]:
    """The stored passkey context per series and threshold (table and its description)."""
    if recorded.empty:
        return [note("passkey_context", "the passkey-context table is omitted")]
    ctx = context_table(recorded)
    shown = ["series", "threshold", "passkey_context"]
    if (ctx["seed_min"] != ctx["seed_max"]).any():  # seeds disagree somewhere
        shown += ["seed_min", "seed_max", "n_seeds"]
    md_ctx = write_table(rep, "passkey_context", ctx, ctx[shown], index=False)
    recorded_thresholds = [t for t in dict.fromkeys(ctx["threshold"]) if t != NOT_RECORDED]
    return [
        "Largest context length whose passkey accuracy (mean over depths) is at least the "
        "threshold (0 = none; YaRN's definition), from the `passkey_context` rows the "
        "evaluation jobs stored. Seeds pooled: the mean, with the smallest and largest seed's "
        "value (`seed_min`, `seed_max`) in the CSV and shown here where seeds disagree. "
        + (f"Threshold: {', '.join(recorded_thresholds)}. " if recorded_thresholds else "")
        + (
            f"`{NOT_RECORDED}`: threshold not recorded (rows written before the evaluation "
            "stored it). "
            if (ctx["threshold"] == NOT_RECORDED).any()
            else ""
        )
        + "Source: `tables/passkey_context.csv`.",
        md_ctx,
    ]


def stored_thresholds(rows: pd.DataFrame) -> pd.Series:
    """The threshold each ``passkey_context`` row was computed with (stored as axis="threshold",
    axis_value=<threshold>); NaN for rows written before the evaluation stored it."""
    return numeric_axis(rows["axis_value"]).where(rows["axis"] == "threshold")


def threshold_labels(rows: pd.DataFrame) -> pd.Series:
    """:func:`stored_thresholds` as text, :data:`NOT_RECORDED` where it is missing."""
    labels = [NOT_RECORDED if np.isnan(v) else f"{v:g}" for v in stored_thresholds(rows)]
    return pd.Series(labels, index=rows.index, dtype=object)


def context_table(recorded: pd.DataFrame) -> pd.DataFrame:
    """The stored ``passkey_context`` rows per series and threshold: mean over seeds (weighted by
    ``n``, the lengths tested), with the smallest and largest seed's value."""
    rows = recorded.assign(threshold=threshold_labels(recorded))
    keys = [*GROUP_KEYS, "threshold"]
    t = aggregate(rows, keys).rename(columns={"value": "passkey_context"})
    spread = rows.groupby(keys, sort=False)["value"].agg(seed_min="min", seed_max="max")
    t = t.merge(spread.reset_index(), on=keys, how="left")
    cols = [*keys, "passkey_context", "seed_min", "seed_max", "n_seeds", "n_rows", "row_ids"]
    return sort_series(t[cols], ["threshold"])


def _heatmap(rep: ReportDir, by_depth: pd.DataFrame) -> None:
    """Depth x length heatmaps, one panel per series."""
    cells, nrows, ncols = series_grid(by_depth)
    grid = Panels(nrows, ncols, pw=2.8, ph=2.0, wgap=0.75, hgap=0.95, bottom=1.0)
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
    save_figure(fig, rep.plots_dir, "passkey_heatmap")
