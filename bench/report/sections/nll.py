"""NLL sections: perplexity vs evaluation length, extrapolation ratio, NLL by position bucket.

Perplexity uses each run's whole-window NLL rows where stored, else the token-weighted mean of
its position buckets, so no token is counted twice; its ``docs`` column is the number of test
documents per run, read from the whole-window rows (axis="docs").
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from bench.report.family_panels import family_panels
from bench.report.figures import Style, pow2_ticks, save_figure, wants_log
from bench.report.frame import (
    GROUP_KEYS,
    SEED_BAND,
    aggregate,
    at_longest_eval,
    numeric_axis,
    pivot,
    seed_summary,
    sort_series,
    summary_band_text,
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


#: Caption text shared by the family-panel figures of this section.
PANELS_TEXT = (
    "One panel per position family with rows; colour = scaling method, the same in every panel "
    "(black = none, the raw model), fine-tuned models are their own lines"
)


def per_seed_nll(df: pd.DataFrame) -> pd.DataFrame:
    """Whole-window NLL per series x eval length x seed (else the token-weighted bucket mean)."""
    nll = df[df["metric"] == "nll"]
    window = nll["bucket_lo"].isna() & nll["bucket_hi"].isna()
    return summary_or_detail(
        nll, [*GROUP_KEYS, "eval_length", "seed"], window, ("whole window", "bucket mean")
    )


def ppl_figure(df: pd.DataFrame, style: Style) -> tuple[Figure, str] | None:
    """Perplexity vs eval length, one panel per family (seed mean and band); with the band
    text for the caption. None without nll rows."""
    per = per_seed_nll(df)
    if per.empty:
        return None
    s = seed_summary(per, [*GROUP_KEYS, "eval_length"], transform=np.exp)
    if s.empty:
        return None
    s["x"] = s["eval_length"]
    fig = family_panels(
        style,
        s,
        title="Train short, test long: perplexity vs evaluation length",
        xlabel="evaluation length (tokens, log2)",
        ylabel="perplexity",
        ylog=wants_log(s["value"].replace(np.inf, np.nan)),
    )
    return fig, _band_caption(s, "exp of the mean NLL over seeds", ", computed on the NLL")


def ratio_figure(df: pd.DataFrame, style: Style) -> tuple[Figure, str] | None:
    """ppl(k x L) / ppl(L) per family: per seed exp(NLL(kL) - NLL(L)), geometric mean over seeds
    and the t-interval on log scale (one seed: no band). None if no series has k = 1."""
    per = per_seed_nll(df)
    if per.empty:
        return None
    base = per[per["eval_length"] == per["train_length"]][[*GROUP_KEYS, "seed", "value"]]
    r = per.merge(base.rename(columns={"value": "_base"}), on=[*GROUP_KEYS, "seed"], how="inner")
    r = r.assign(value=r["value"] - r["_base"], ci_lo=np.nan, ci_hi=np.nan)
    s = seed_summary(r, [*GROUP_KEYS, "eval_length"], transform=np.exp)
    if s.empty:
        return None
    s["x"] = s["eval_length"] / s["train_length"]
    fig = family_panels(
        style,
        s,
        title="Extrapolation ratio: perplexity relative to the training length",
        xlabel="evaluation length / training length (log2)",
        ylabel="ppl(k x L) / ppl(L)",
        marker_x=lambda _tl, _ev: 1.0,
        marker_label="k = 1 (training length)",
        hline=1.0,
        hline_label="ratio 1 (no degradation)",
        ylog=wants_log(s["value"].replace(np.inf, np.nan), span=10.0),
    )
    return fig, _band_caption(s, "the geometric mean over seeds", ", computed on log scale")


def _band_caption(s: pd.DataFrame, mean: str = "the mean over seeds", scale: str = "") -> str:
    """What line and band of a family-panel figure show (``mean``: the line with several
    seeds; ``scale``: where the interval was computed, e.g. " on log scale")."""
    finite = np.isfinite(s["lo"].to_numpy(dtype=float)) & np.isfinite(s["hi"].to_numpy(dtype=float))
    drawn = s[finite]
    text = summary_band_text(s)
    seeds = int(s["n_seeds"].max()) if len(s) else 0
    line = mean if seeds > 1 else "the run's value"
    if not text:
        return f"Line: {line}; no interval (one seed, none stored)."
    return f"Line: {line}; shaded: {text}{scale if SEED_BAND in set(drawn['band']) else ''}."


def perplexity_section(rep: ReportDir, df: pd.DataFrame, style: Style) -> str:
    t = nll_table(df)
    if t.empty:
        return "## Perplexity vs evaluation length\n\n" + note(
            "nll", "the perplexity tables and figures are omitted"
        )
    text = ["## Perplexity vs evaluation length", *_perplexity_parts(rep, df, t, style)]
    text += _ratio_parts(rep, df, t, style)
    return "\n\n".join(text)


def _perplexity_parts(rep: ReportDir, df: pd.DataFrame, t: pd.DataFrame, style: Style) -> list[str]:
    """Perplexity per series x eval length (:func:`nll_table` ``t``): table and figure."""
    wide = pivot(t, index=["series_rank", "series"], columns="eval_length", values="ppl")
    wide.columns = [f"L={c}" for c in wide.columns]
    counted = _doc_counts(df)
    docs = counted.groupby("series")["docs"].agg(_counts_text)
    wide.insert(0, "docs", docs.reindex(wide.index))
    counts = _counts_text(counted["docs"])
    every_run = f", {counts} in every run" if counts and "/" not in counts else ""
    md = write_table(rep, "perplexity", t, wide, index=True)
    text = []
    made = ppl_figure(df, style)
    if made is not None:
        fig, bands = made
        save_figure(fig, rep.plots_dir, "ppl_vs_length")
        text.append(
            figure_md(
                "ppl_vs_length",
                f"Perplexity when the models read sequences of the given length. {PANELS_TEXT}. "
                "The thick grey vertical line marks the training length: everything to its right "
                "is extrapolation, and a flat line there means the method extrapolates. "
                f"{bands} Shared y axis (log scale when the values span more than 3x).",
            )
        )
    text += [
        "Perplexity (exp of the token-weighted mean NLL; whole-window rows where present, else the "
        "token-weighted mean over position buckets; seeds pooled). Each run reads one set of test "
        "documents at every length (those long enough for its longest eval length) and scores the "
        "same tokens at each: every document's first `span` tokens, in consecutive windows of the "
        f"length; column `docs`: documents per run{every_run}. "
        "Source: `tables/perplexity.csv`.",
        md,
    ]
    return text


def _ratio_table(t: pd.DataFrame) -> pd.DataFrame:
    """Perplexity at each eval length over the same series' perplexity at its training length,
    with the row ids of both."""
    base = t[t["eval_length"] == t["train_length"]][[*GROUP_KEYS, "ppl", "row_ids", "n_rows"]]
    base = base.rename(columns={"ppl": "ppl_train", "row_ids": "_rid", "n_rows": "_nr"})
    r = t.merge(base, on=GROUP_KEYS, how="left")
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
    return sort_series(r[rcols], ["eval_length"])


def _ratio_parts(rep: ReportDir, df: pd.DataFrame, t: pd.DataFrame, style: Style) -> list[str]:
    """The extrapolation ratio subsection: table, and its figure where some ratio is known."""
    r = _ratio_table(t)
    rp = pivot(r, index=["series_rank", "series"], columns="k", values="ratio")
    rp.columns = [f"{c:g}x" for c in rp.columns]
    rmd = write_table(rep, "extrapolation_ratio", r, rp, index=True)
    text = [
        "### Extrapolation ratio",
        "Perplexity at k x the training length divided by perplexity at the training length "
        "(1 = no degradation; – = no evaluation at that length or at the training length). "
        "Source: `tables/extrapolation_ratio.csv`.",
        rmd,
    ]
    made = ratio_figure(df, style) if r["ratio"].notna().any() else None
    if made is not None:
        fig, bands = made
        save_figure(fig, rep.plots_dir, "extrapolation_ratio")
        text.insert(
            -1,
            figure_md(
                "extrapolation_ratio",
                "The same perplexities divided by each model's perplexity at its training length "
                "(k = 1, grey vertical line); above the dotted line at 1 the model got worse on "
                f"longer inputs. {PANELS_TEXT}. Per seed the ratio is exp(NLL(kL) - NLL(L)). "
                + bands,
            ),
        )
    return text


def bucket_figure(df: pd.DataFrame, style: Style) -> tuple[Figure, str] | None:
    """NLL by position bucket at each series' longest eval length, one panel per family."""
    nll = df[(df["metric"] == "nll") & df["bucket_lo"].notna() & df["bucket_hi"].notna()]
    if nll.empty:
        return None
    keys = [*GROUP_KEYS, "eval_length", "bucket_lo", "bucket_hi"]
    per = at_longest_eval(aggregate(nll, [*keys, "seed"]))
    s = seed_summary(per, keys)
    if s.empty:
        return None
    s["x"] = (s["bucket_lo"] + s["bucket_hi"]) / 2
    ticks = pow2_ticks(s["bucket_hi"])

    def note_(_family: str, rows: pd.DataFrame) -> str:
        lengths = sorted(rows["eval_length"].unique())
        if len(lengths) == 1:
            return f" (eval length {lengths[0]})"
        return f" (eval lengths {'/'.join(str(v) for v in lengths)})"

    fig = family_panels(
        style,
        s,
        title="Per-token NLL by position in the window (each model at its longest eval length)",
        xlabel="token position in the window (bucket midpoint, log2)",
        ylabel="NLL (nats/token)",
        xticks=ticks,
        panel_note=note_,
    )
    return fig, _band_caption(s)


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
    parts = [head]
    made = bucket_figure(df, style)
    if made is not None:
        fig, bands = made
        save_figure(fig, rep.plots_dir, "nll_by_bucket")
        parts.append(
            figure_md(
                "nll_by_bucket",
                "Mean NLL of the tokens in each position bucket (x: bucket midpoint) at each "
                f"model's longest evaluation length (panel titles). {PANELS_TEXT}. Tokens right "
                "of the grey training-length line sit at positions never seen in training, so a "
                "curve rising there is the extrapolation failure. A causal model's NLL at a "
                "position depends on the window length only through length-dependent scalings "
                "(e.g. dynamic NTK), so shorter windows repeat the left part of these curves; "
                f"every length is in the table below. {bands}",
            )
        )
    shown = pivot(
        t,
        index=["series_rank", "series", "eval_length"],
        columns="bucket_mid",
        values="value",
    )
    shown.columns = [f"{c:g}" for c in shown.columns]
    md = write_table(rep, "nll_by_bucket", t, shown, index=True)
    parts.append(
        "<details><summary>NLL by bucket (columns: bucket midpoint; every evaluation length; "
        "source `tables/nll_by_bucket.csv`)</summary>\n\n" + md + "\n\n</details>"
    )
    return "\n\n".join(parts)
