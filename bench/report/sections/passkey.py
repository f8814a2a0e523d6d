"""Passkey section: accuracy vs length (one panel per position family), accuracy by depth and
length (heatmaps, only for models that retrieve somewhere), passkey context.

The passkey context (largest length whose accuracy reaches the threshold) is computed once, by
the evaluation job; this section shows the stored ``passkey_context`` rows and draws the
threshold they were computed with (stored as axis="threshold", axis_value=<threshold>).
"""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from bench.report.family_panels import family_panels
from bench.report.figures import Panels, Style, display_label, line_colors, save_figure
from bench.report.frame import (
    FINETUNE_MARK,
    GROUP_KEYS,
    aggregate,
    numeric_axis,
    pivot,
    seed_summary,
    sort_series,
    summary_band_text,
    summary_or_detail,
)
from bench.report.markdown import ReportDir, figure_md, note, write_table

#: Threshold label of ``passkey_context`` rows written before the evaluation stored it.
NOT_RECORDED = "not recorded"
#: A model gets a depth x length heatmap only if its accuracy reaches this somewhere (a wall
#: of all-zero panels says nothing the accuracy-vs-length figure does not).
HEATMAP_MIN_ACC = 0.1


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
    if not acc.empty:
        parts += _recovery_parts(rep, acc)
    parts += ["### Passkey context", *_context_parts(rep, recorded)]
    return "\n\n".join(parts)


def recovery_table(acc: pd.DataFrame) -> pd.DataFrame:
    """Per fine-tune recipe with a recovery curve (``finetune_curve_id`` with several update
    counts), update count and eval length: the per-length accuracy's seed mean, smallest and
    largest seed (``seed_min``, ``seed_max``), seeds and row ids. Empty without curves."""
    cols = ["curve", "finetune_method", "finetune_steps", "eval_length", "passkey_acc",
            "seed_min", "seed_max", "n_seeds", "row_ids"]  # fmt: skip
    if "finetune_curve_id" not in acc.columns:
        return pd.DataFrame(columns=cols)
    rows = _with_depth(acc)
    rows = rows[rows["depth"].isna() & rows["finetune_curve_id"].notna()]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    steps = rows.groupby("finetune_curve_id")["finetune_steps"].nunique()
    rows = rows[rows["finetune_curve_id"].isin(steps[steps > 1].index)]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    label = rows["scaling_label"].str.split(FINETUNE_MARK).str[0]  # before " ft@4x, ..."
    rows = rows.assign(
        curve=label
        + " ft@"
        + (rows["finetune_length"].astype(float) / rows["train_length"].astype(float)).map(
            lambda m: f"{m:g}x"
        )
        + rows["arm"].map(lambda a: f" [arm {a}]" if isinstance(a, str) else "")
    )
    per_seed = aggregate(
        rows,
        ["curve", "finetune_curve_id", "finetune_method", "finetune_steps", "eval_length", "seed"],
    )
    t = (
        per_seed.groupby(["curve", "finetune_method", "finetune_steps", "eval_length"])
        .agg(
            passkey_acc=("value", "mean"),
            seed_min=("value", "min"),
            seed_max=("value", "max"),
            n_seeds=("seed", "nunique"),
            row_ids=("row_ids", ";".join),
        )
        .reset_index()
    )
    return t.sort_values(["curve", "finetune_steps", "eval_length"]).reset_index(drop=True)[cols]


def recovery_figure(t: pd.DataFrame) -> Figure:
    """Accuracy vs fine-tuning updates, one panel per eval length, one line per recipe (seed
    mean; band: smallest to largest seed)."""
    lengths = sorted(t["eval_length"].unique())
    fig = Figure(figsize=(3.2 * len(lengths) + 0.6, 3.0), layout="constrained")
    axes = fig.subplots(1, len(lengths), sharey=True, squeeze=False)[0]
    curves = list(dict.fromkeys(t["curve"]))
    for ax, length in zip(axes, lengths, strict=True):
        for curve, color in zip(curves, line_colors(len(curves)), strict=True):
            c = t[(t["curve"] == curve) & (t["eval_length"] == length)].sort_values(
                "finetune_steps"
            )
            ax.plot(c["finetune_steps"], c["passkey_acc"], "o-", color=color, label=curve, ms=3)
            ax.fill_between(
                c["finetune_steps"], c["seed_min"], c["seed_max"], color=color, alpha=0.15
            )
        ax.set_xscale("symlog", linthresh=50)
        ax.set_title(f"eval length {length}", fontsize=9)
        ax.set_xlabel("fine-tuning updates")
        ax.set_ylim(-0.04, 1.06)
    axes[0].set_ylabel("exact-match accuracy")
    axes[-1].legend(fontsize=7, frameon=False, loc="best")
    fig.suptitle("Passkey retrieval recovered by fine-tuning at length", fontsize=10)
    return fig


def _recovery_parts(rep: ReportDir, acc: pd.DataFrame) -> list[str]:
    t = recovery_table(acc)
    if t.empty:
        return []
    piv = (
        t.assign(
            cell=[
                f"{v:.2f} ({lo:.2f}-{hi:.2f})"
                for v, lo, hi in zip(t["passkey_acc"], t["seed_min"], t["seed_max"], strict=True)
            ]
        )
        .set_index(["curve", "eval_length", "finetune_steps"])["cell"]
        .unstack("finetune_steps")
    )
    piv.columns = [f"{int(c)} updates" for c in piv.columns]
    md = write_table(rep, "passkey_recovery", t, piv, index=True)
    save_figure(recovery_figure(t), rep.plots_dir, "passkey_recovery")
    return [
        "### Recovery by fine-tuning",
        figure_md(
            "passkey_recovery",
            "Passkey accuracy after k updates of fine-tuning at length (k = 0: the base model "
            "with the method's scaling), from states saved along one run per seed; one panel "
            "per eval length, one line per fine-tune recipe (seed mean; band: smallest to "
            "largest seed; x axis linear below 50 updates, logarithmic above).",
        ),
        "Accuracy per eval length and update count: seed mean (smallest-largest seed). "
        "Source: `tables/passkey_recovery.csv`.",
        md,
    ]


def _with_depth(acc: pd.DataFrame) -> pd.DataFrame:
    """``passkey_acc`` rows with ``depth`` (a number for axis="depth" rows, else NaN)."""
    acc = acc.copy()
    acc["depth"] = numeric_axis(acc["axis_value"])
    acc.loc[acc["axis"].notna() & (acc["axis"] != "depth"), "depth"] = np.nan
    return acc


def accuracy_by_depth(acc: pd.DataFrame) -> pd.DataFrame:
    """Accuracy per series x eval length x depth (seeds pooled, weighted by trials)."""
    acc = _with_depth(acc)
    rows = acc[acc["depth"].notna()]
    t = aggregate(rows, [*GROUP_KEYS, "eval_length", "depth"])
    return sort_series(t, ["eval_length", "depth"]).rename(columns={"value": "passkey_acc"})


def heatmap_series(by_depth: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The rows of the series that get a heatmap (some cell reaches :data:`HEATMAP_MIN_ACC`) and
    the labels of those that do not."""
    best = by_depth.groupby("series_rank")["passkey_acc"].max()
    keep = set(best[best >= HEATMAP_MIN_ACC].index)
    dropped = by_depth[~by_depth["series_rank"].isin(keep)]
    labels = list(dropped.drop_duplicates("series_rank").sort_values("series_rank")["series"])
    return by_depth[by_depth["series_rank"].isin(keep)], labels


def passkey_figure(
    acc: pd.DataFrame, style: Style, threshold: float | None = None
) -> tuple[Figure, str] | None:
    """Accuracy vs context length, one panel per family, methods as lines, seeds as band (the
    per-length rows where stored, else the mean over depths). None without rows."""
    acc = _with_depth(acc)
    per = summary_or_detail(
        acc,
        [*GROUP_KEYS, "eval_length", "seed"],
        acc["depth"].isna(),
        ("per-length rows", "mean over depths"),
    )
    if per.empty:
        return None
    s = seed_summary(per, [*GROUP_KEYS, "eval_length"])
    if s.empty:
        return None
    s["lo"] = s["lo"].clip(lower=0.0)
    s["hi"] = s["hi"].clip(upper=1.0)
    s["x"] = s["eval_length"]
    fig = family_panels(
        style,
        s,
        title="Passkey retrieval accuracy vs context length",
        xlabel="context length (tokens, log2)",
        ylabel="exact-match accuracy",
        ylim=(-0.04, 1.06),
        hline=threshold,
        hline_label=None if threshold is None else f"passkey-context threshold {threshold:g}",
    )
    text = summary_band_text(s)
    line = "mean over seeds" if int(s["n_seeds"].max()) > 1 else "the run's accuracy"
    bands = f"Line: {line}; shaded: {text} (clipped to [0, 1])." if text else f"Line: {line}."
    return fig, bands


def _accuracy_parts(
    rep: ReportDir, acc: pd.DataFrame, recorded: pd.DataFrame, style: Style
) -> list[str]:
    """Accuracy by length (figure with the stored threshold, table) and by depth (heatmaps of
    the series with signal)."""
    acc = _with_depth(acc)
    md_len = _length_table(rep, acc)
    by_depth = accuracy_by_depth(acc)
    parts = _length_figure_parts(rep, acc, recorded, style)
    parts += [
        "Passkey accuracy by context length (the per-length rows where stored, else the "
        "mean over depths; weighted by trials, seeds pooled). Source: "
        "`tables/passkey_by_length.csv`, by depth: `tables/passkey_by_depth.csv`.",
        md_len,
    ]
    return parts + _depth_parts(rep, by_depth)


def _length_table(rep: ReportDir, acc: pd.DataFrame) -> str:
    """Write the accuracy-by-length table (series x eval length); return its markdown."""
    by_len = summary_or_detail(
        acc,
        [*GROUP_KEYS, "eval_length"],
        acc["depth"].isna(),
        ("per-length rows", "mean over depths"),
    )
    by_len = sort_series(by_len, ["eval_length"]).rename(columns={"value": "passkey_acc"})
    piv = pivot(
        by_len,
        index=["series_rank", "series"],
        columns="eval_length",
        values="passkey_acc",
    )
    piv.columns = [f"L={c}" for c in piv.columns]
    return write_table(rep, "passkey_by_length", by_len, piv, index=True)


def _length_figure_parts(
    rep: ReportDir, acc: pd.DataFrame, recorded: pd.DataFrame, style: Style
) -> list[str]:
    """Save the accuracy-vs-length figure, with the stored threshold where the runs share one;
    return its markdown (nothing without rows)."""
    thresholds = sorted(set(stored_thresholds(recorded).dropna()))
    line = thresholds[0] if len(thresholds) == 1 else None
    made = passkey_figure(acc, style, line)
    if made is None:
        return []
    fig, bands = made
    save_figure(fig, rep.plots_dir, "passkey_vs_length")
    if line is not None:
        mark = (
            f"the dotted line is the {line:g} threshold that defines the passkey context, "
            "the grey vertical line the training length"
        )
    else:
        if recorded.empty:
            why = "no `passkey_context` rows"
        elif thresholds:
            why = f"the runs used different thresholds ({', '.join(f'{t:g}' for t in thresholds)})"
        else:
            why = "threshold not recorded"
        mark = (
            "the grey vertical line marks the training length (no passkey-context "
            f"threshold line: {why})"
        )
    return [
        figure_md(
            "passkey_vs_length",
            "Passkey accuracy (mean over key depths) vs context length, one panel per "
            "position family with rows; colour = scaling method, the same in every panel "
            "(black = none, the raw model), fine-tuned models are their own lines; "
            f"{mark}. {bands}",
        )
    ]


def _depth_parts(rep: ReportDir, by_depth: pd.DataFrame) -> list[str]:
    """Write the accuracy-by-depth table and save the heatmaps of the series with signal;
    return their markdown (a note where there is nothing to draw)."""
    if by_depth.empty:
        return [
            "> Note: no per-depth `passkey_acc` rows (axis=depth) in these results, so the "
            "depth x length heatmap is omitted."
        ]
    write_table(
        rep,
        "passkey_by_depth",
        by_depth,
        by_depth[["series", "eval_length", "depth", "passkey_acc", "n"]],
        index=False,
    )
    fig, dropped = heatmap_figure(by_depth)
    skipped = (
        f"No heatmap for {len(dropped)} model(s) whose accuracy stays below "
        f"{HEATMAP_MIN_ACC:g} at every depth and length (their rows are in "
        f"`tables/passkey_by_depth.csv`, their lines in the figure above): "
        + ", ".join(f"`{d}`" for d in dropped)
        + "."
        if dropped
        else ""
    )
    if fig is None:
        return [
            f"> Note: every model's passkey accuracy stays below {HEATMAP_MIN_ACC:g} at every "
            "depth and length, so the depth x length heatmap is omitted."
        ]
    save_figure(fig, rep.plots_dir, "passkey_heatmap")
    return [
        figure_md(
            "passkey_heatmap",
            "Exact-match accuracy of retrieving a numeric pass key hidden at the given depth "
            "(rows, 0% = start of the context) in contexts of the given length (columns), one "
            "panel per model with some retrieval (seeds pooled); bright is good, grey = not "
            "evaluated, and columns right of the red dashed line are longer than the training "
            "length. " + skipped,
        )
    ]


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


def heatmap_figure(by_depth: pd.DataFrame) -> tuple[Figure | None, list[str]]:
    """Depth x length heatmaps (:func:`accuracy_by_depth`), one panel per series whose accuracy
    reaches :data:`HEATMAP_MIN_ACC` somewhere (in series order, at most 4 a row, no empty
    panels); None if no series does. With the labels of the series left out."""
    by_depth, dropped = heatmap_series(by_depth)
    series_list = by_depth.drop_duplicates("series_rank").sort_values("series_rank")
    if series_list.empty:
        return None, dropped
    n = len(series_list)
    ncols = min(4, n)
    nrows = math.ceil(n / ncols)
    grid = Panels(nrows, ncols, pw=2.6, ph=2.0, wgap=0.75, hgap=1.0, bottom=0.95, top=0.85)
    axes = list(grid.axes.flat)
    for ax in axes[n:]:
        ax.set_axis_off()
    from matplotlib import colormaps

    cmap = colormaps["viridis"].with_extremes(bad="0.88")
    lengths_all = sorted(by_depth["eval_length"].unique())
    depths_all = sorted(by_depth["depth"].dropna().unique()) or [np.nan]
    image = None
    for i, (ax, (_, srow)) in enumerate(zip(axes, series_list.iterrows(), strict=False)):
        s = by_depth[by_depth["series_rank"] == srow["series_rank"]]
        mat = np.full((len(depths_all), len(lengths_all)), np.nan)
        for d, ev, v in s[["depth", "eval_length", "passkey_acc"]].itertuples(index=False):
            j = depths_all.index(d) if d in depths_all else 0
            mat[j, lengths_all.index(ev)] = v
        image = ax.imshow(mat, vmin=0, vmax=1, cmap=cmap, aspect="auto", origin="upper")
        boundary = sum(length <= srow["train_length"] for length in lengths_all) - 0.5
        ax.axvline(boundary, color="#e41a1c", linewidth=2.0, linestyle="--")
        ax.set_xticks(
            range(len(lengths_all)),
            [str(v) for v in lengths_all],
            rotation=45 if len(lengths_all) > 4 else 0,
            fontsize=7,
        )
        ax.set_yticks(
            range(len(depths_all)),
            [f"{d:.0%}" if np.isfinite(d) and d <= 1 else f"{d:g}" for d in depths_all],
            fontsize=7,
        )
        ax.set_title("\n".join(textwrap.wrap(display_label(str(srow["series"])), 34)), fontsize=8.5)
        if i % ncols == 0:
            ax.set_ylabel("key depth in context", fontsize=8)
        if i + ncols >= n:
            ax.set_xlabel("context length (tokens)", fontsize=8)
    title = "Passkey accuracy by key depth and context length (red dashed line: training length)"
    fig = grid.finish(title, colorbar=image, colorbar_label="passkey exact-match accuracy")
    return fig, dropped
