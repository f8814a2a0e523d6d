"""NLL sections: perplexity vs evaluation length, extrapolation ratio, NLL by position bucket.

Perplexity uses each run's whole-window NLL rows where stored, else the token-weighted mean of
its position buckets, so no token is counted twice; its ``docs`` column is the number of test
documents per run, read from the whole-window rows (axis="docs").
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, NullLocator

from bench.report.figures import (
    Panels,
    Style,
    legend_handles,
    line_panels,
    save_figure,
    series_grid,
    share_limits,
    train_lines,
)
from bench.report.frame import (
    GROUP_KEYS,
    SERIES_KEYS,
    aggregate,
    numeric_axis,
    pivot,
    sort_series,
    summary_or_detail,
)
from bench.report.markdown import ReportDir, figure_md, note, write_table


def _doc_counts(df: pd.DataFrame) -> pd.DataFrame:
    """The whole-window ``nll`` rows that record their documents, with ``docs`` as a number."""
    counted = df[
        (df["metric"] == "nll")
        & df["bucket_lo"].isna()
        & df["bucket_hi"].isna()
        & (df["axis"] == "docs")
        & (df["n"] > 0)
    ]
    return counted.assign(docs=numeric_axis(counted["axis_value"]))


def _counts_text(values: pd.Series) -> str:
    """Distinct document counts as text: "24", or "19/24" when pooled runs differ; "" if none."""
    return "/".join(str(int(v)) for v in sorted(set(values.dropna())))


def nll_table(df: pd.DataFrame) -> pd.DataFrame:
    """Perplexity per series x eval length: whole-window rows, else token-weighted buckets.

    ``docs``: test documents per run (see :func:`_counts_text`), from the whole-window rows.
    """
    nll = df[df["metric"] == "nll"]
    window = nll["bucket_lo"].isna() & nll["bucket_hi"].isna()
    keys = [*GROUP_KEYS, "eval_length"]
    t = summary_or_detail(nll, keys, window, ("whole window", "bucket mean"))
    if t.empty:
        return t
    docs = _doc_counts(nll).groupby(keys, dropna=False)["docs"].agg(_counts_text)
    t = t.merge(docs.reset_index(), on=keys, how="left")
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
        "docs",
        "n_seeds",
        "n_rows",
        "row_ids",
        "source",
    ]
    return sort_series(t[cols], ["eval_length"])


def perplexity_section(rep: ReportDir, df: pd.DataFrame, style: Style) -> str:
    t = nll_table(df)
    if t.empty:
        return "## Perplexity vs evaluation length\n\n" + note(
            "nll", "the perplexity tables and figures are omitted"
        )
    wide = pivot(t, index=["series_rank", "series"], columns="eval_length", values="ppl")
    wide.columns = [f"L={c}" for c in wide.columns]
    counted = _doc_counts(df)
    docs = counted.groupby("series")["docs"].agg(_counts_text)
    wide.insert(0, "docs", docs.reindex(wide.index))
    counts = _counts_text(counted["docs"])
    every_run = f", {counts} in every run" if counts and "/" not in counts else ""
    md = write_table(rep, "perplexity", t, wide, index=True)
    plot = t.assign(x=t["eval_length"], value=t["nll"])
    span = np.nanmax(t["ppl"].replace(np.inf, np.nan)) / max(np.nanmin(t["ppl"]), 1e-12)
    line_panels(
        rep.plots_dir,
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
        figure_md(
            "ppl_vs_length",
            "Perplexity of each position encoding (colour) and scaling method (line style) when the "
            "models read sequences of the given length; the thick grey vertical line marks the training "
            "length, so everything to its right is extrapolation and a flat line means the method "
            "extrapolates. Shaded bands are the stored confidence intervals.",
        ),
        "Perplexity (exp of the token-weighted mean NLL; whole-window rows where present, else the "
        "token-weighted mean over position buckets; seeds pooled). Each run reads one set of test "
        "documents at every length (those long enough for its longest eval length, each truncated "
        f"to the length); column `docs`: documents per run{every_run}. "
        "Source: `tables/perplexity.csv`.",
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
        *GROUP_KEYS,
        "eval_length",
        "k",
        "ppl",
        "ppl_train",
        "ratio",
        "n_rows",
        "row_ids",
    ]
    r = sort_series(r[rcols], ["eval_length"])
    rp = pivot(r, index=["series_rank", "series"], columns="k", values="ratio")
    rp.columns = [f"{c:g}x" for c in rp.columns]
    rmd = write_table(rep, "extrapolation_ratio", r, rp, index=True)
    text += [
        "### Extrapolation ratio",
        "Perplexity at k x the training length divided by perplexity at the training length "
        "(1 = no degradation; – = no evaluation at that length or at the training length). "
        "Source: `tables/extrapolation_ratio.csv`.",
        rmd,
    ]
    if r["ratio"].notna().any():
        rplot = r.assign(x=r["k"], value=r["ratio"], ci_lo=np.nan, ci_hi=np.nan)
        line_panels(
            rep.plots_dir,
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
            figure_md(
                "extrapolation_ratio",
                "The same perplexities divided by each model's perplexity at its training length "
                "(k = 1, grey vertical line); values above the dotted line at 1 mean the model got worse on "
                "longer inputs.",
            ),
        )
    return "\n\n".join(text)


def bucket_section(rep: ReportDir, df: pd.DataFrame, style: Style) -> str:
    nll = df[(df["metric"] == "nll") & df["bucket_lo"].notna() & df["bucket_hi"].notna()]
    head = "## NLL by position bucket"
    if nll.empty:
        return (
            head
            + "\n\n"
            + "> Note: no bucketed `nll` rows (bucket_lo/bucket_hi) in these results, so the per-position figure is omitted."
        )
    keys = [*GROUP_KEYS, "eval_length", "bucket_lo", "bucket_hi"]
    t = sort_series(aggregate(nll, keys), ["eval_length", "bucket_lo"])
    t["bucket_mid"] = (t["bucket_lo"] + t["bucket_hi"]) / 2
    cells, nrows, ncols = series_grid(t)
    grid = Panels(nrows, ncols, pw=3.0, ph=2.3, wgap=0.35, hgap=0.75, bottom=0.9)
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
        train_lines(ax, list(s["train_length"].unique()))
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _p: f"{x:g}"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
        ax.set_title(srow["series"], fontsize=9)
    used_axes = [axes[rc] for rc in cells]
    share_limits(used_axes, "x")
    share_limits(used_axes, "y")
    for r_, c_ in cells:
        ax = axes[r_, c_]
        if (r_ + 1, c_) not in used:
            ax.set_xlabel("token position (bucket midpoint, log2)", fontsize=8)
        if c_ == 0 or (r_, c_ - 1) not in used:
            ax.set_ylabel("NLL (nats/token)", fontsize=8)
        else:
            ax.tick_params(labelleft=False)
    title = "Per-token NLL by position in the window (one panel per encoding / scaling)"
    save_figure(grid.finish(title, legend_handles(axes)), rep.plots_dir, "nll_by_bucket")
    shown = pivot(
        t,
        index=["series_rank", "series", "eval_length"],
        columns="bucket_mid",
        values="value",
    )
    shown.columns = [f"{c:g}" for c in shown.columns]
    md = write_table(rep, "nll_by_bucket", t, shown, index=True)
    return "\n\n".join(
        [
            head,
            figure_md(
                "nll_by_bucket",
                "Mean NLL of the tokens in each position bucket (x: bucket midpoint), one line per "
                "evaluation length; tokens right of the grey training-length line sit at positions "
                "never seen in training, so a rising curve there is the extrapolation failure.",
            ),
            "<details><summary>NLL by bucket (columns: bucket midpoint; source "
            "`tables/nll_by_bucket.csv`)</summary>\n\n" + md + "\n\n</details>",
        ]
    )
