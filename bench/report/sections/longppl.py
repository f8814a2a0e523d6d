"""LongPPL beside perplexity: per series and eval length the LongPPL (``longppl`` rows: the
perplexity on the key tokens that one evaluator found need long context), the perplexity of the
same series at that length, the key tokens judged and the evaluator; and a figure with both
against length (solid LongPPL, dashed perplexity), so a method that keeps perplexity flat only on
tokens that need no far context shows it."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from bench.report.figures import line_colors, save_figure
from bench.report.frame import GROUP_KEYS, aggregate, sort_series
from bench.report.markdown import ReportDir, figure_md, write_table
from bench.report.sections.nll import nll_table


def longppl_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per series x eval length: LongPPL (exp of the key-token-weighted mean log LongPPL over the
    runs), key tokens, evaluators, and the series' perplexity at that length."""
    rows = df[df["metric"] == "longppl"].copy()
    if rows.empty:
        return rows
    rows["value"] = np.log(rows["value"].astype(float))  # pooled like NLL: weights n (key tokens)
    rows["evaluator"] = [json.loads(p)["evaluator"] for p in rows["task_params"]]
    keys = [*GROUP_KEYS, "eval_length"]
    t = aggregate(rows, keys)
    t["longppl"] = np.exp(t["value"])
    evaluators = rows.groupby(keys, dropna=False)["evaluator"].agg(
        lambda s: ";".join(sorted(set(s)))
    )
    t = t.merge(evaluators.reset_index(), on=keys, how="left")
    ppl = nll_table(df)
    if not ppl.empty:
        t = t.merge(ppl[[*keys, "ppl"]], on=keys, how="left")
    else:
        t["ppl"] = np.nan
    cols = [*keys, "longppl", "ppl", "n", "evaluator", "n_seeds", "n_rows", "row_ids"]
    t = sort_series(t, ["eval_length"])
    return t[[c for c in dict.fromkeys([*cols, "series_rank"]) if c in t.columns]]


def longppl_section(rep: ReportDir, df: pd.DataFrame) -> str:
    t = longppl_table(df)
    if t.empty:
        return ""
    shown = t.assign(
        LongPPL=t["longppl"].map(lambda v: f"{v:.3g}"),
        perplexity=t["ppl"].map(lambda v: "" if pd.isna(v) else f"{v:.3g}"),
        key_tokens=t["n"].astype(int),
    )[["series", "eval_length", "LongPPL", "perplexity", "key_tokens", "evaluator"]]
    md = write_table(rep, "longppl", t.drop(columns=["series_rank"]), shown, index=False)
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    groups = list(t.groupby("series", sort=False))
    for (series, s), color in zip(groups, line_colors(len(groups)), strict=True):
        ax.plot(s["eval_length"], s["longppl"], "o-", color=color, label=str(series))
        if s["ppl"].notna().any():
            ax.plot(s["eval_length"], s["ppl"], "--", color=color, alpha=0.7)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("LongPPL (solid), perplexity (dashed)")
    ax.legend(fontsize=7)
    save_figure(fig, rep.plots_dir, "longppl_vs_length")
    caption = (
        "LongPPL (solid: perplexity on the key tokens, those one evaluator finds gain from long "
        "context) and perplexity (dashed) of each series against the evaluation length; every "
        "series at a length is scored on the same key tokens."
    )
    return "\n\n".join(
        [
            "## LongPPL beside perplexity",
            figure_md("longppl_vs_length", caption),
            "Per series and length: LongPPL (key-token-weighted over runs), the perplexity of the "
            "same series at that length, the key tokens judged (summed over runs) and the "
            "evaluator's checkpoint key. Source: `tables/longppl.csv`.",
            md,
        ]
    )
