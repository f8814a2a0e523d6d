"""The leaderboard (issues #56 and #73): every series of one training recipe compared with every
other, per statistic, by the rules of :mod:`bench.findings.leaderboard` (fixed before the rows
they rank) and the comparisons of :mod:`bench.findings.comparisons`.

A series is a design (position family and attention switches) x method (eval-time scaling or
training-free method) x fine-tune, within one **recipe** (the ``recipe`` column,
``bench.train.cache.recipe_id``; rows written before it existed count as the recipe
``study:<experiment>/<arm>/L=<L>``, so that studies are never ranked together on a guess). Rows
of different recipes are never ranked together: the table has one block per recipe.

Per series and statistic (``ppl_auc``, ``ppl``, ``ppl_at_L``, ``passkey_auc``, ``passkey``,
``ruler_auc``, ``ruler_abs``): the mean over seeds with its 95% interval, the per-seed values,
how many seeds fail at L (gated statistics), the rank interval from the decided comparisons and
the bootstrap rank interval; the overall rank interval is the block's primary statistic's.
:func:`leaderboard` returns the table every output (report.md, the heatmaps, index.html) is
written from, with the decided comparisons and each block's power.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from bench.core.series import SWITCH_COLUMNS
from bench.findings.comparisons import (
    FDR,
    Sample,
    bootstrap_ranks,
    compare,
    decided_pairs,
    decidedly_above,
    rank_intervals,
    replicate_means,
    seeds_to_decide,
)
from bench.findings.leaderboard import (
    AT_L,
    BAD_AT_L_TIERED,
    PPL_FLAT,
    PRIMARY,
    STATISTICS,
)
from bench.findings.rows import col, passkey, window_nll, with_series
from bench.report.leaderboard_samples import series_samples

__all__ = ["Leaderboard", "leaderboard", "leaderboard_table", "recipe_of"]

KEY_COLUMNS = ["recipe", "design", "method", "finetune"]


def eff_key(stat: str | None) -> str | None:
    """Where a length statistic's per-seed effective lengths in tokens are kept (None: not one)."""
    return f"_{stat}_eff" if stat and STATISTICS[stat].length else None


#: adjacent pairs counted by the power summary
TOP = 10
#: the columns the table reads of the labelled rows
READ_COLUMNS = [
    *KEY_COLUMNS, "_series", "experiment", "arm", "seed", "train_length", "eval_length",
    "metric", "value", "n", "bucket_lo", "bucket_hi", "axis", "axis_value", "task", "template",
    "doc_nll_sums", "doc_tokens",
]  # fmt: skip


def recipe_of(df: pd.DataFrame) -> pd.Series:
    """Each row's recipe: its ``recipe`` column, else ``study:<experiment>/<arm>/L=<L>``."""
    study = "study:" + df["experiment"].astype(str) + "/" + col(df, "arm").fillna("-").astype(str)
    return col(df, "recipe").astype(object).fillna(study + "/L=" + df["train_length"].astype(str))


def recipe_label(recipe: str, rows: pd.DataFrame) -> str:
    """A recipe as a reader names it: a study fallback or pretrained id as it is; a recipe id as
    its experiments, arms and L, with the id's first 8 characters."""
    if recipe.startswith(("study:", "pretrained:")):
        return recipe
    experiments = "+".join(sorted(rows["experiment"].astype(str).unique()))
    arms = "+".join(sorted(col(rows, "arm").dropna().astype(str).unique())) or "-"
    return f"{experiments}/{arms}/L={int(rows['train_length'].iloc[0])} ({recipe[:8]})"


def _design(df: pd.DataFrame) -> pd.Series:
    """Position family plus the attention switches that are on (``rope+attention=differential``)."""
    out = df["position"].astype(str)
    for name in [*SWITCH_COLUMNS, "attention_sink", "position_sampling"]:
        values = col(df, name)
        on = values.notna() & (values.astype(str) != "")
        out = out.where(~on, out + "+" + name + "=" + values.astype(str))
    return out


def _finetune(df: pd.DataFrame) -> pd.Series:
    method, length = col(df, "finetune_method"), col(df, "finetune_length")
    label = method.astype(str) + "@" + length.astype("Int64").astype(str)
    return label.where(method.notna(), "none")


def labelled(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with the leaderboard's key columns and its series keys; a fine-tune's recovery
    curve (``extend.curve``: its checkpoints after 0, 50, ... updates) keeps its final checkpoint,
    the model the fine-tune label names. Each key then holds one series (checked)."""
    df = with_series(df)
    df = df.assign(
        recipe=recipe_of(df), design=_design(df), method=df["scaling"].astype(str),
        finetune=_finetune(df),
    )  # fmt: skip
    steps = pd.to_numeric(col(df, "finetune_steps"), errors="coerce")
    final = steps.groupby([df[k] for k in [*KEY_COLUMNS, "seed"]]).transform("max")
    df = df[steps.isna() | (steps == final)]
    pooled = df.groupby(KEY_COLUMNS)["_series"].nunique()
    if (pooled > 1).any():
        key = pooled[pooled > 1].index[0]
        raise ValueError(
            f"leaderboard series {' / '.join(map(str, key))} holds {int(pooled.max())} different "
            "series (their rows would be pooled); its key needs the column that tells them apart."
        )
    return df


# --------------------------------------------------------------------------- the table


def longest_lengths(rows: pd.DataFrame) -> dict[str, int]:
    """Per length statistic: the longest length evaluated (an effective length equal to it
    means "at least": the series passes wherever it was measured)."""
    task = col(rows, "task")
    sources = {
        "ppl": window_nll(rows),
        "passkey": passkey(rows),
        "ruler": rows[task.notna() & (rows["metric"] != "effective_length")],
    }
    return {
        name: int(sources[s.family]["eval_length"].max())
        for name, s in STATISTICS.items()
        if s.length and not sources[s.family].empty
    }


def _longppl_at_longest(rows: pd.DataFrame) -> float:
    """LongPPL at the longest length every seed has it, geometric mean over seeds (described
    beside the ranks, never ranked: :mod:`bench.findings.leaderboard`)."""
    lp = rows[(rows["metric"] == "longppl") & (rows["n"] > 0)]
    if lp.empty:
        return math.nan
    longest = lp.groupby("seed")["eval_length"].max().min()
    at = lp[lp["eval_length"] == longest]
    return math.exp(float(np.log(at["value"]).mean()))


@dataclass
class Leaderboard:
    """The table (one row per series), every decided comparison (``recipe``, ``statistic``,
    ``a`` better than ``b``, ``diff``, ``se``, ``df``, ``paired``, ``p``, ``p_adj``; closed
    transitively: ``direct`` False where only implied) and each block's power per statistic."""

    table: pd.DataFrame
    comparisons: pd.DataFrame
    power: pd.DataFrame


def _display(stat: str, x: float, train_length: int) -> float:
    """A statistic's value on the scale it is shown on: tokens, perplexity or the AUC itself."""
    if STATISTICS[stat].length:
        return train_length * 2.0**x
    if stat == AT_L:
        return math.exp(x)
    return x


def _mean_interval(sample: Sample, reps: np.ndarray) -> tuple[float, float, float]:
    """Mean over seeds and its 95% interval: t with the two-level bootstrap's standard error
    (the seed level's n / (n - 1) correction); the mean alone with one seed."""
    mean, n = sample.mean, len(sample.values)
    if n < 2:
        return mean, mean, mean
    half = stats.t.ppf(0.975, n - 1) * math.sqrt(float(np.var(reps)) * n / (n - 1))
    return mean, mean - half, mean + half


def _seed_text(stat: str, sample: Sample, effs: dict[int, float] | None) -> str:
    if effs is not None:
        return ",".join(str(int(effs[s])) for s in sample.seeds)
    digits = 2 if stat == AT_L else 3
    value = (lambda v: math.exp(v)) if stat == AT_L else (lambda v: v)
    return ",".join(f"{value(sample.values[s]):.{digits}f}" for s in sample.seeds)


def _power_rows(recipe, stat, ordered, samples, decided, comparisons) -> dict:
    """Adjacent pairs of ``ordered`` (lists per tier, best first) and how many are decided; of
    the first :data:`TOP`, the decided fraction and the seeds that would decide the rest."""
    pairs = [(t[i], t[i + 1]) for t in ordered for i in range(len(t) - 1)]
    top = pairs[:TOP]
    m = max(len(comparisons), 1)
    level = FDR * (int(comparisons["decided"].sum()) + 1) / m  # BH's bar for the next one
    needed = []
    for a, b in top:
        if (a, b) in decided:
            continue
        sa, sb = samples[a], samples[b]
        diff = abs(sa.mean - sb.mean)
        if sa.group == sb.group:
            d = np.array([sa.values[s] - sb.values[s] for s in sa.seeds])
            sd = float(d.std(ddof=1)) if len(d) > 1 else math.nan
        else:
            va = np.var(list(sa.values.values()), ddof=1) if len(sa.values) > 1 else math.nan
            vb = np.var(list(sb.values.values()), ddof=1) if len(sb.values) > 1 else math.nan
            sd = math.sqrt(va + vb)
        needed.append(seeds_to_decide(diff, sd, level))
    finite = [n for n in needed if n is not None]
    return {
        "recipe": recipe, "statistic": stat, "series": sum(len(t) for t in ordered),
        "adjacent_pairs": len(pairs), "adjacent_decided": sum(p in decided for p in pairs),
        "top_pairs": len(top), "top_decided": sum(p in decided for p in top),
        "top_undecided_seeds_max": max(finite) if len(finite) == len(needed) and finite else None,
        "top_undecided_seeds_median": float(np.median(finite)) if finite else None,
        "top_undecided_beyond_cap": len(needed) - len(finite),
        "pairs_compared": len(comparisons), "pairs_decided": int(comparisons["decided"].sum()),
    }  # fmt: skip


def _series_rows(recipe: str, block: pd.DataFrame) -> tuple[dict[str, dict], dict[str, dict]]:
    """Per series of one recipe: its table row's keys and labels, and its samples per statistic
    (:func:`bench.report.leaderboard_samples.series_samples`)."""
    label = recipe_label(recipe, block)
    rows: dict[str, dict] = {}
    samples: dict[str, dict[str, Sample]] = {}
    for key, g in block.groupby(KEY_COLUMNS, sort=True):
        found = series_samples(g, recipe, group=(recipe, key[1], key[3]))
        if not any(k in STATISTICS for k in found):
            continue
        name = str(g["_series"].iloc[0])
        row = dict(zip(KEY_COLUMNS, key, strict=True))
        row.update(
            recipe_label=label, train_length=int(g["train_length"].iloc[0]), series=name,
            seeds=",".join(str(int(s)) for s in sorted(g["seed"].unique())),
            longppl_at_longest=_longppl_at_longest(g),
        )  # fmt: skip
        longest = longest_lengths(g)
        for stat in STATISTICS:
            if eff_key(stat) in found:
                row[f"{stat}_max"] = longest.get(stat, math.nan)
        if "_ruler_eff" in found:
            relative = found["_ruler_eff"]
            row["ruler_rel_seeds"] = ",".join(str(int(relative.values[s])) for s in relative.seeds)
        rows[name] = row
        samples[name] = found
    return rows, samples


def _rank(recipe, stat, rows, samples, bad) -> tuple[list[dict], dict]:
    """One statistic of one recipe: its columns in ``rows`` (mean, interval, per-seed values,
    seeds failing at L, rank intervals within the † tiers) and its decided comparisons and
    power row."""
    spec = STATISTICS[stat]
    train_length = next(iter(rows.values()))["train_length"]
    gate_key = eff_key(spec.gate)
    have = {k: s[stat] for k, s in samples.items() if stat in s}
    fails = {
        k: sum(int(samples[k][gate_key].values.get(x, 1)) <= 0 for x in have[k].seeds)
        if gate_key and gate_key in samples[k] else 0
        for k in have
    }  # fmt: skip
    eligible = {k: v for k, v in have.items() if fails[k] == 0}
    sign = 1.0 if spec.higher_is_better else -1.0
    tiered = stat in BAD_AT_L_TIERED
    tiers = [
        sorted((k for k in eligible if bad.get(k, False) == t or not tiered),
               key=lambda k: (-sign * eligible[k].mean, k))
        for t in ((False, True) if tiered else (False,))
    ]  # fmt: skip
    comparisons = compare(eligible, spec.higher_is_better)
    decided = decided_pairs(comparisons)
    offset = 0
    for tier in tiers:
        intervals = rank_intervals(tier, decided)
        boot = bootstrap_ranks({k: eligible[k] for k in tier}, spec.higher_is_better)
        for k in tier:
            rows[k][f"{stat}_rank_lo"] = offset + intervals[k][0]
            rows[k][f"{stat}_rank_hi"] = offset + intervals[k][1]
            rows[k][f"{stat}_boot_lo"] = offset + boot[k][0]
            rows[k][f"{stat}_boot_hi"] = offset + boot[k][1]
        offset += len(tier)
    reps = replicate_means(have)
    for k, sample in have.items():
        mean, lo, hi = _mean_interval(sample, reps[k])
        row = rows[k]
        row[f"{stat}_mean"] = _display(stat, mean, train_length)
        lo, hi = _display(stat, lo, train_length), _display(stat, hi, train_length)
        row[f"{stat}_lo"], row[f"{stat}_hi"] = min(lo, hi), max(lo, hi)
        effs = samples[k][eff_key(stat)].values if spec.length else None
        row[f"{stat}_seeds"] = _seed_text(stat, sample, effs)
        if spec.gate:
            row[f"{stat}_fails"] = fails[k]
    tested = {(c["a"], c["b"]): c for c in comparisons.to_dict("records")}  # each pair's test
    decided_rows = [
        {"recipe": recipe, "statistic": stat, "a": a, "b": b,
         "direct": bool(tested.get((a, b), {}).get("decided", False)),
         **{k: tested[(a, b)][k] for k in ("diff", "se", "df", "paired", "p", "p_adj")
            if (a, b) in tested}}
        for a, b in sorted(decided)
    ]  # fmt: skip
    return decided_rows, _power_rows(recipe, stat, tiers, eligible, decided, comparisons)


def _overall(rows: dict[str, dict], bad: dict[str, bool], primary: str | None) -> None:
    """Each row's † flag, primary statistic, overall rank interval and sort key."""
    sign = 1.0 if primary and STATISTICS[primary].higher_is_better else -1.0
    for k, row in rows.items():
        row["bad_at_L"] = bool(bad.get(k, False))
        row["ppl_at_L"] = row.get(f"{AT_L}_mean", math.nan)
        row["primary"] = primary
        ranked = primary is not None and f"{primary}_rank_lo" in row
        row["overall_rank_lo"] = row[f"{primary}_rank_lo"] if ranked else math.nan
        row["overall_rank_hi"] = row[f"{primary}_rank_hi"] if ranked else math.nan
        value = row.get(f"{primary}_mean", math.nan) if primary else math.nan
        row["_order"] = (not ranked, row["bad_at_L"], -sign * value if np.isfinite(value) else 0)


def _block(recipe: str, block: pd.DataFrame):
    rows, samples = _series_rows(recipe, block)
    if not rows:
        return [], [], []
    # bad at L: perplexity at L decidedly above PPL_FLAT x the block's best
    at_l = {k: s[AT_L] for k, s in samples.items() if AT_L in s}
    bad: dict[str, bool] = {}
    if at_l:
        best = min(at_l, key=lambda k: (at_l[k].mean, k))
        bad = decidedly_above(at_l, best, math.log(PPL_FLAT))
    present = [m for m in STATISTICS if any(m in s for s in samples.values())]
    decided_rows, power = [], []
    for stat in present:
        decided, power_row = _rank(recipe, stat, rows, samples, bad)
        decided_rows += decided
        power.append(power_row)
    _overall(rows, bad, next((m for m in PRIMARY if m in present), None))
    return list(rows.values()), decided_rows, power


def leaderboard(df: pd.DataFrame) -> Leaderboard:
    """The table, decided comparisons and power of every recipe in ``df`` (result rows, or rows
    already :func:`labelled`). Table columns per statistic ``m``: ``m_mean`` / ``m_lo`` /
    ``m_hi`` (shown scale: tokens, AUC, perplexity), ``m_seeds``, ``m_fails`` (gated: seeds
    failing at L), ``m_rank_lo`` / ``m_rank_hi`` (decided comparisons), ``m_boot_lo`` /
    ``m_boot_hi`` (bootstrap ranks), ``m_max`` (lengths: longest evaluated); ``bad_at_L`` (†),
    ``primary``, ``overall_rank_lo`` / ``overall_rank_hi``; sorted by recipe, ranked first,
    good at L first, then the primary's mean."""
    empty = Leaderboard(pd.DataFrame(columns=KEY_COLUMNS), pd.DataFrame(), pd.DataFrame())
    if df.empty:
        return empty
    if "design" not in df.columns:  # raw result rows
        df = labelled(df)
    df = df[[c for c in READ_COLUMNS if c in df.columns]]  # narrow frames: cheaper to subset
    table, decided, power = [], [], []
    for recipe, block in df.groupby("recipe", sort=True):
        rows, d, p = _block(str(recipe), block)
        table += rows
        decided += d
        power += p
    if not table:
        return empty
    out = pd.DataFrame(table)
    out = out.sort_values(
        ["recipe", "_order", "design", "method", "finetune"], kind="stable"
    ).drop(columns="_order").reset_index(drop=True)  # fmt: skip
    return Leaderboard(out, pd.DataFrame(decided), pd.DataFrame(power))


def leaderboard_table(df: pd.DataFrame) -> pd.DataFrame:
    """:func:`leaderboard`'s table alone."""
    return leaderboard(df).table
