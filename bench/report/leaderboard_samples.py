"""Per series and seed, the leaderboard's statistics (:data:`bench.findings.leaderboard.STATISTICS`)
and their within-seed replicates, as :class:`bench.findings.comparisons.Sample` values.

Every statistic is computed by one function on arrays with a trailing replicate axis: on the
seed's own documents or trials (one column: the point value) and on :data:`REPLICATES`
resamples of them. Perplexity resamples the seed's documents (the same documents at every
length, drawn by a generator seeded by recipe and seed, so series on one model's seed share the
draws and are paired by document); passkey and RULER resample the trials of each (length, depth)
or (length, task) cell binomially (per-trial outcomes are not stored, so their trials cannot be
paired across series). A seed whose rows lack what the resampling needs has no replicates (no
within-seed noise is assumed for it).
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pandas as pd

from bench.findings.comparisons import REPLICATES, Sample
from bench.findings.leaderboard import BELOW_L, STATISTICS, Curve, ruler_relative_lengths
from bench.findings.rows import col, passkey, window_nll

__all__ = ["series_samples"]


def _rng(*key: object) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32("/".join(map(str, key)).encode()))


def _log2_ratio(eff: np.ndarray, train_length: int) -> np.ndarray:
    """Effective lengths on the comparisons' scale, log2(eff / L); 0 (fails at L) as BELOW_L."""
    with np.errstate(divide="ignore"):
        return np.where(eff > 0, np.log2(np.maximum(eff, 1) / train_length), BELOW_L)


def _stats(family: str, curve: Curve) -> dict[str, np.ndarray]:
    """Every statistic of ``family`` (:data:`STATISTICS`) on ``curve``, per replicate; an
    effective length as log2(eff / L) under its name and in tokens under ``_<name>_eff``."""
    out = {}
    for name, stat in STATISTICS.items():
        if stat.family != family:
            continue
        value = stat.compute(curve)
        if stat.length:
            out[f"_{name}_eff"] = value
            value = _log2_ratio(value, curve.train_length)
        out[name] = value
    if family == "ruler":  # shown beside the ranks, not ranked
        out["_ruler_eff"] = ruler_relative_lengths(curve)
    return out


# --------------------------------------------------------------------------- perplexity


def _ppl_seed(g: pd.DataFrame, train_length: int, recipe: str, seed: int):
    by_length = g.groupby("eval_length")
    lengths = sorted(int(x) for x in by_length.groups)
    if train_length not in lengths:
        return None
    point = np.array(
        [[np.average(x["value"], weights=x["n"])] for _, x in sorted(by_length, key=lambda t: t[0])]
    )  # [n_lengths, 1]
    values = {
        k: float(v[0])
        for k, v in _stats("ppl", Curve(lengths, train_length, {"nll": point})).items()
    }
    sums = [col(by_length.get_group(x), "doc_nll_sums").iloc[0] for x in lengths]
    tokens = [col(by_length.get_group(x), "doc_tokens").iloc[0] for x in lengths]
    docs = {len(s) if isinstance(s, (list, np.ndarray)) else -1 for s in sums}
    one_row = all(len(by_length.get_group(x)) == 1 for x in lengths)
    if not one_row or len(docs) != 1 or min(docs) < 2:
        return values, {}
    n_docs = docs.pop()
    s, t = np.array(sums, dtype=float), np.array(tokens, dtype=float)  # [n_lengths, D]
    draws = _rng(recipe, seed, n_docs).integers(0, n_docs, size=(REPLICATES, n_docs))  # [R, D]
    nll = s[:, draws].sum(axis=2) / t[:, draws].sum(axis=2)  # [n_lengths, R]
    return values, _stats("ppl", Curve(lengths, train_length, {"nll": nll}))


# --------------------------------------------------------------------------- passkey and RULER


def _passkey_seed(g: pd.DataFrame, train_length: int, rng: np.random.Generator):
    per_length = passkey(g)
    per_length = per_length[per_length["eval_length"] > 0]
    if per_length.empty:
        return None
    lengths = sorted(int(x) for x in per_length["eval_length"].unique())
    k = np.array(
        [[float((x["value"] * x["n"]).sum())] for _, x in per_length.groupby("eval_length")]
    )
    n = np.array([[float(x["n"].sum())] for _, x in per_length.groupby("eval_length")])
    point = Curve(lengths, train_length, {"k": k.round(), "n": n})
    values = {a: float(b[0]) for a, b in _stats("passkey", point).items()}
    depth = g[(g["metric"] == "passkey_acc") & (col(g, "axis") == "depth")]
    cells = depth.groupby("eval_length")["n"].sum() if not depth.empty else pd.Series(dtype=float)
    if [int(x) for x in cells.index] != lengths or not np.allclose(cells.to_numpy(), n[:, 0]):
        depth = per_length  # no depth cells adding up to the lengths' trials: resample per length
    kk = np.zeros((len(lengths), REPLICATES))
    for i, x in enumerate(lengths):
        for _, row in depth[depth["eval_length"] == x].iterrows():
            trials = int(row["n"])
            kk[i] += rng.binomial(trials, min(max(float(row["value"]), 0.0), 1.0), REPLICATES)
    nn = np.repeat(n, REPLICATES, axis=1)
    return values, _stats("passkey", Curve(lengths, train_length, {"k": kk, "n": nn}))


def _ruler_seed(g: pd.DataFrame, train_length: int, rng: np.random.Generator):
    task = col(g, "task")
    exact = g[
        task.notna() & (g["metric"] != "effective_length") & (col(g, "axis") == "score")
        & (col(g, "axis_value") == "exact")
    ]  # fmt: skip
    if exact.empty:
        return None
    lengths = sorted(int(x) for x in exact["eval_length"].unique())
    if train_length not in lengths:
        return None
    point = np.array([[x["value"].mean()] for _, x in exact.groupby("eval_length")])
    point = Curve(lengths, train_length, {"exact": point})
    values = {a: float(b[0]) for a, b in _stats("ruler", point).items()}
    reps = np.zeros((len(lengths), REPLICATES))
    for i, x in enumerate(lengths):
        cells = exact[exact["eval_length"] == x]
        for _, row in cells.iterrows():
            trials = max(int(row["n"]), 1)
            p = min(max(float(row["value"]), 0.0), 1.0)
            reps[i] += rng.binomial(trials, p, REPLICATES) / trials
        reps[i] /= len(cells)
    return values, _stats("ruler", Curve(lengths, train_length, {"exact": reps}))


# --------------------------------------------------------------------------- per series


def series_samples(rows: pd.DataFrame, recipe: str, group: object) -> dict[str, Sample]:
    """One series' rows (one recipe, design, method, fine-tune): per statistic its Sample over
    the seeds that have it; ``_..._eff`` entries hold the per-seed effective lengths in tokens."""
    train_length = int(rows["train_length"].iloc[0])
    series = str(rows["_series"].iloc[0])
    per_stat: dict[str, tuple[dict[int, float], dict[int, np.ndarray]]] = {}
    nll = window_nll(rows)
    for seed, g in rows.groupby("seed", sort=True):
        seed = int(seed)
        found = [
            _ppl_seed(nll[nll["seed"] == seed], train_length, recipe, seed)
            if (nll["seed"] == seed).any() else None,
            _passkey_seed(g, train_length, _rng(series, seed, "passkey")),
            _ruler_seed(g, train_length, _rng(series, seed, "ruler")),
        ]  # fmt: skip
        for result in found:
            if result is None:
                continue
            values, reps = result
            for name, value in values.items():
                v, r = per_stat.setdefault(name, ({}, {}))
                v[seed] = value
                if name in reps and not name.startswith("_"):
                    r[seed] = reps[name]
    out = {}
    for name, (values, reps) in per_stat.items():
        if any(math.isnan(x) for x in values.values()):
            continue
        seeds = tuple(sorted(values))
        out[name] = Sample(values, reps, group=(*_as_tuple(group), seeds))
    return out


def _as_tuple(group: object) -> tuple:
    return tuple(group) if isinstance(group, tuple) else (group,)
