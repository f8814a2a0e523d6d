"""Tests for bench/findings/, the report's Findings section and ``lenbench-report --check``.

Synthetic rows shaped as the metrics write them: a world where every finding holds, one negative
control per finding (it does not hold), and absent rows (not measured).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.core.results import write_results
from bench.core.rows import canonical_json, normalize_results
from bench.findings import (
    ALIBI_MAX_RATIO,
    FAILS,
    HOLDS,
    NOT_DECIDED,
    NOT_MEASURED,
    RUN_CI,
    SEED_CI,
    SEED_DOC_CI,
    UNDECIDED,
    Estimate,
    Scope,
    accuracy_estimate,
    check_findings,
    decide,
    f1_absolute_degrade,
    findings,
    out_of_scope,
    register_finding,
    wilson,
)
from bench.findings.zoo import BIAS_FAMILIES, RELATIVE_FAMILIES
from bench.report import generate_report, main
from bench.report.cli import NOTHING_CHECKED

L = 64
SEEDS = (0, 1, 2)
#: whole-window NLL at 1x, 2x, 4x L per (position, scaling), zero-shot
NLL = {
    ("sinusoidal", "none"): (2.0, 2.5, 3.0),
    ("learned", "none"): (2.0, 2.6, 3.2),
    ("alibi", "none"): (2.0, 1.98, 1.97),
    ("nope", "none"): (2.0, 2.1, 2.2),
    ("rope", "none"): (2.0, 2.1, 2.6),
    ("rope", "linear"): (2.1, 2.8, 3.2),
    ("rope", "ntk"): (2.0, 2.05, 2.3),
    ("rope", "yarn"): (2.0, 2.05, 2.25),
    # training-free (T1, T3): within 10% at 4L, and flat
    ("rope", "self_extend"): (2.0, 2.02, 2.05),
    ("rope", "rerope"): (2.0, 2.03, 2.06),
    ("rope", "streaming"): (2.0, 1.98, 1.97),
}
#: the zoo's bias families (Z2): flatter than sinusoidal and raw RoPE (``rows(zoo=True)``)
NLL_ZOO = {(pos, "none"): (2.0, 2.01, 2.05) for pos in BIAS_FAMILIES}
#: the train-for-length study's arms (L1-L3, ``rows(zoo=True)``): raw NLL at 1x, 2x, 4x L per
#: (position, training's position sampling, attention sink, arm)
NLL_TRAIN = {
    ("learned", "contiguous", "none", "lm_sampling"): (2.0, 2.6, 3.2),
    ("learned", "randomized", "none", "lm_sampling"): (2.05, 2.3, 2.5),
    ("learned", "pose", "none", "lm_sampling"): (2.05, 2.4, 2.8),
    ("sinusoidal", "contiguous", "none", "lm_sampling"): (2.0, 2.5, 3.0),
    ("sinusoidal", "randomized", "none", "lm_sampling"): (2.05, 2.25, 2.45),
    ("rope", "contiguous", "none", "lm_sampling"): (2.0, 2.1, 2.6),
    ("rope", "randomized", "none", "lm_sampling"): (2.02, 2.1, 2.3),
    ("nope", "contiguous", "none", "lm_sampling"): (2.0, 2.1, 2.2),
    ("nope", "randomized", "none", "lm_sampling"): (2.0, 2.1, 2.2),
    ("rope", "contiguous", "none", "lm_hybrid"): (1.9, 2.0, 2.5),
    ("rnope_swa", "contiguous", "none", "lm_hybrid"): (1.9, 1.95, 2.1),
    ("irope", "contiguous", "none", "lm_hybrid"): (1.9, 1.95, 2.15),
    ("rope", "contiguous", "none", "lm_sinks"): (2.0, 2.1, 2.6),
    ("rope", "contiguous", "learned", "lm_sinks"): (2.002, 2.1, 2.5),
    ("rope", "contiguous", "token", "lm_sinks"): (1.998, 2.1, 2.6),
}
#: the RULER arm (R1, R2, ``rows(zoo=True)``), on p_rope (a family whose nll and passkey rows no
#: other finding reads): exact accuracy at 1x, 2x, 4x L per (scaling, task), TRIALS trials each
RULER = {
    ("none", "niah_single"): (1.0, 0.6, 0.3),
    ("none", "niah_multikey"): (0.9, 0.2, 0.0),
    ("none", "niah_multivalue"): (0.9, 0.1, 0.0),
    ("yarn", "niah_single"): (1.0, 0.9, 0.8),
    ("yarn", "niah_multikey"): (0.9, 0.5, 0.3),
    ("yarn", "niah_multivalue"): (0.9, 0.4, 0.2),
}
#: per scaling: the relative effective length of the tasks' mean (in L) and the NLL at 1x, 2x, 4x
#: L (YaRN: flat to 4L, where its effective length is 2L; raw: no NLL rows, so that F1-F3's
#: figure of raw ratios stays as it was: R2 lists it as not measured)
RULER_FLAT = {"none": (1, None), "yarn": (2, (2.0, 2.01, 2.015))}
#: passkey accuracy at 1x, 2x, 4x L per (position, scaling), zero-shot
PASSKEY = {("rope", "none"): (1.0, 0.0, 0.0), ("rope", "self_extend"): (1.0, 0.95, 0.9)}
#: passkey accuracy at 4L per depth (T3): StreamingLLM finds only needles inside its window
DEPTHS = {("rope", "streaming"): {0.0: 0.0, 0.25: 0.0, 0.5: 0.0, 0.75: 0.4, 1.0: 1.0}}
#: recovery curves: fine-tune method -> (its scaling label, {updates: accuracy at 1x, 2x, 4x L})
CURVES = {
    "direct": ("none", {0: (1.0, 0.0, 0.0), 50: (0.9, 0.3, 0.1), 200: (0.95, 0.6, 0.4)}),
    "pi": ("pi", {0: (0.0, 0.0, 0.0), 50: (0.5, 0.5, 0.5), 200: (0.96, 0.93, 0.92)}),
    "yarn": ("yarn", {0: (0.9, 0.8, 0.6), 50: (0.96, 0.96, 0.93), 200: (0.99, 0.98, 0.97)}),
}
#: passkey trials per length and seed: enough that every accuracy's Wilson interval decides
TRIALS = 200
#: shift-probe dNLL per position at delta = L and 4L
SHIFT = {"rope": 1e-7, "alibi": 0.0, "nope": 0.0, "sinusoidal": 0.5, "learned": 0.4}
SHIFT_ZOO = {**dict.fromkeys(RELATIVE_FAMILIES, 1e-7), "fire": 0.3}
#: every registered finding, in report order
KEYS = [
    *(f"F{i}" for i in range(1, 7)),
    "Z1",
    "Z2",
    "T1",
    "T2",
    "T3",
    "L1",
    "L2",
    "L3",
    "R1",
    "R2",
    "P1",
    *(f"N{i}" for i in range(1, 7)),
    *(f"S{i}" for i in range(1, 7)),
    *(f"M{i}" for i in range(1, 4)),
]
#: the findings this module's world of rows is about (P1's rows: test_findings_longppl.py; N1-N6's:
#: test_findings_zoo_2025.py; S1-S6's, a pretrained model's: test_findings_smollm2.py; M1-M3's,
#: the token mixers': test_findings_mixers.py)
WORLD_KEYS = [k for k in KEYS if k != "P1" and not k.startswith(("N", "S", "M"))]


def _base(pos: str, scaling: str, seed: int, tuned: str | None = None, steps: int = 0) -> dict:
    row = {
        "experiment": "findings",
        "run_id": f"{pos}-{scaling}-{tuned}-s{seed}",
        "model_id": f"m-{pos}-{tuned}-{steps}-s{seed}",
        "position": pos,
        "position_params": canonical_json({}),
        "scaling": scaling,
        "scaling_params": canonical_json({"factor": 4.0} if scaling != "none" else {}),
        "train_length": L,
        "seed": seed,
        "corpus": "pycorpus",
        "corpus_fingerprint": "abc123",
        "code_version": "0.1.0+g1234",
    }
    if tuned:
        row.update(
            finetune_method=tuned, finetune_length=4 * L, finetune_steps=steps,
            parent_model_id=f"m-rope-None-0-s{seed}", model_config_id=f"c-{tuned}-{steps}",
            finetune_curve_id=f"c-{tuned}",
        )  # fmt: skip
    return row


def _passkey_rows(base: dict, accs) -> list[dict]:
    return [
        {**base, "eval_length": k * L, "metric": "passkey_acc", "value": acc, "n": TRIALS,
         "axis": "template", "axis_value": "short", "template": "short"}
        for k, acc in zip((1, 2, 4), accs, strict=True)
        if acc is not None
    ]  # fmt: skip


def _ruler_rows(seed: int, ruler: dict, flat: dict) -> list[dict]:
    """The RULER arm's rows of one seed: exact task rows, effective lengths, NLL (no seed jitter)."""
    out = []
    for scal, (effective, nll) in flat.items():
        b = {**_base("p_rope", scal, seed), "arm": "ruler", "model_config_id": "c-ruler"}
        b["model_id"] = f"ruler-s{seed}"
        b["run_id"] = f"ruler-{scal}-s{seed}"
        for (s, task), accs in ruler.items():
            out += [
                {**b, "eval_length": k * L, "metric": task, "value": acc, "n": TRIALS,
                 "axis": "score", "axis_value": "exact", "task": task, "task_params": "{}"}
                for k, acc in zip((1, 2, 4), accs or (), strict=False)
                if s == scal and acc is not None
            ]  # fmt: skip
        if effective is not None:
            out.append(
                {**b, "eval_length": effective * L, "metric": "effective_length",
                 "value": effective * L, "n": 3, "axis": "relative_threshold",
                 "axis_value": 0.85, "task": "average", "task_params": "{}"}
            )  # fmt: skip
        out += [
            {**b, "eval_length": k * L, "metric": "nll", "value": v, "n": 8 * k * L}
            for k, v in zip((1, 2, 4), nll or (), strict=False)
        ]  # fmt: skip
    return out


def rows(
    seeds=SEEDS, nll=None, passkey=None, shift=None, curves=None, zoo=False, depths=None,
    train=None, ruler=None, ruler_flat=None,
) -> list[dict]:  # fmt: skip
    """Rows of the world in NLL / PASSKEY / DEPTHS / CURVES / SHIFT (overridden per key by the
    arguments), with the zoo's families (NLL_ZOO, SHIFT_ZOO), the train-for-length arms
    (NLL_TRAIN, overridden by ``train``; a value None drops the series) and the RULER arm (RULER,
    RULER_FLAT, overridden by ``ruler`` / ``ruler_flat``) when ``zoo``.

    Seed s adds 0.01 * (s - 1) nats beyond L, so ratios vary across seeds."""
    nll = {**NLL, **(NLL_ZOO if zoo else {}), **(nll or {})}
    shift = {**SHIFT, **(SHIFT_ZOO if zoo else {}), **(shift or {})}
    passkey, curves = {**PASSKEY, **(passkey or {})}, {**CURVES, **(curves or {})}
    depths = {**DEPTHS, **(depths or {})}
    trained = {**NLL_TRAIN, **(train or {})} if zoo else {}
    ruler = {**RULER, **(ruler or {})} if zoo else {}
    ruler_flat = {**RULER_FLAT, **(ruler_flat or {})} if zoo else {}
    out = []
    for seed in seeds:
        out += _ruler_rows(seed, ruler, ruler_flat)
        for (pos, sampling, sink, arm), values in trained.items():
            b = {**_base(pos, "none", seed), "arm": arm}
            b["run_id"] = b["model_id"] = f"{arm}-{pos}-{sampling}-{sink}-s{seed}"
            b["model_config_id"] = f"c-{arm}-{pos}-{sampling}-{sink}"
            if sampling != "contiguous":
                b["position_sampling"] = sampling
            if sink != "none":
                b["attention_sink"] = sink
            for k, v in zip((1, 2, 4), values or (None,) * 3, strict=True):
                if v is None:
                    continue
                v = v + 0.01 * (seed - 1) * (k > 1)
                out.append(
                    {**b, "eval_length": k * L, "metric": "nll", "value": v, "n": 8 * k * L,
                     "axis": "docs", "axis_value": 8, "ci_lo": v - 0.005, "ci_hi": v + 0.005}
                )  # fmt: skip
        for (pos, scal), per_depth in depths.items():
            out += [
                {**_base(pos, scal, seed), "eval_length": 4 * L, "metric": "passkey_acc",
                 "value": acc, "n": TRIALS, "axis": "depth", "axis_value": depth}
                for depth, acc in (per_depth or {}).items()
            ]  # fmt: skip
        for (pos, scal), values in nll.items():
            for k, v in zip((1, 2, 4), values, strict=True):
                if v is None:
                    continue
                v = v + 0.01 * (seed - 1) * (k > 1)
                b = _base(pos, scal, seed)
                out.append(
                    {**b, "eval_length": k * L, "metric": "nll", "value": v, "n": 8 * k * L,
                     "axis": "docs", "axis_value": 8, "ci_lo": v - 0.02, "ci_hi": v + 0.02}
                )  # fmt: skip
                # a bucket row with a wild value: findings must read whole windows only
                out.append(
                    {**b, "eval_length": k * L, "metric": "nll", "value": 50.0, "n": 8 * L,
                     "bucket_lo": 0, "bucket_hi": L}
                )  # fmt: skip
        for (pos, scal), accs in passkey.items():
            out += _passkey_rows(_base(pos, scal, seed), accs)
        for method, (scal, points) in curves.items():
            for steps, accs in (points or {}).items():
                out += _passkey_rows(_base("rope", scal, seed, method, steps), accs)
        for pos, v in shift.items():
            if v is None:
                continue
            for delta in (0, L, 4 * L):
                d = 0.0 if delta == 0 else v * (1 + 0.02 * (seed - 1)) * (delta / (4 * L))
                out.append(
                    {**_base(pos, "none", seed), "eval_length": L, "metric": "shift_dnll",
                     "value": d, "n": 512, "axis": "delta", "axis_value": delta,
                     "ci_lo": d - 0.05 * (d > 0), "ci_hi": d + 0.05 * (d > 0)}
                )  # fmt: skip
    return out


def statuses(row_list: list[dict]) -> dict[str, str]:
    return {r.key: r.status for r in check_findings(normalize_results(row_list))}


def write(directory: Path, row_list: list[dict]) -> Path:
    df = pd.DataFrame(row_list)
    for run_id, g in df.groupby("run_id"):
        write_results(g, directory / f"{run_id}.parquet")
    return directory


def test_every_finding_holds_with_seeds() -> None:
    results = check_findings(normalize_results(rows(zoo=True)))
    assert {r.key: r.status for r in results} == dict.fromkeys(WORLD_KEYS, HOLDS)
    f1 = results[0].estimates[0]
    assert f1.n_seeds == 3 and f1.ci == SEED_CI
    assert f1.lo > 1 and f1.value == pytest.approx(2.718, rel=0.02)  # exp(1)


def test_one_seed_uses_the_stored_ci() -> None:
    results = check_findings(normalize_results(rows(seeds=(0,), zoo=True)))
    by_key = {r.key: r for r in results}
    assert by_key["F1"].status == HOLDS and by_key["F1"].estimates[0].ci == RUN_CI
    assert all(r.status == HOLDS for r in results), [(r.key, r.status, r.numbers) for r in results]


#: a change of the world -> the findings it must make fail (every other one still holds)
NEGATIVE = {
    "F1 sinusoidal improves": (
        ("F1", "Z2"), {"nll": {("sinusoidal", "none"): (2.0, 1.9, 1.8)}}
    ),
    "F2 alibi degrades": (("F2",), {"nll": {("alibi", "none"): (2.0, 2.0, 2.0 + 0.05)}}),
    "F3 raw rope improves": (
        ("F3", "Z2", "T1"), {"nll": {("rope", "none"): (2.0, 1.9, 1.8)}}
    ),
    "F3 ntk worse than PI": (("F3",), {"nll": {("rope", "ntk"): (2.0, 3.0, 3.5)}}),
    "F4 yarn no faster than PI": (
        ("F4",),
        {"curves": {"yarn": ("yarn", {0: (0.5,) * 3, 50: (0.5,) * 3, 200: (1.0,) * 3})}},
    ),
    "F4 direct as fast as PI": (
        ("F4",),
        {"curves": {"direct": ("none", {0: (1.0, 0, 0), 50: (0.5,) * 3, 200: (1.0,) * 3})}},
    ),
    "F4 PI never recovers": (
        ("F4",), {"curves": {"pi": ("pi", {0: (0.0,) * 3, 200: (0.5,) * 3})}}
    ),
    "F4 raw rope beyond L": (("F4", "T2"), {"passkey": {("rope", "none"): (1.0, 0.5, 0.0)}}),
    "F5 rope misses at L": (("F5",), {"passkey": {("rope", "none"): (0.85, 0.0, 0.0)}}),
    "F6 nope moves": (("F6",), {"shift": {"nope": 0.05}}),
    "F6 sinusoidal still": (("F6", "Z1"), {"shift": {"sinusoidal": 0.0}}),
    "Z1 t5 moves": (("Z1",), {"shift": {"t5": 0.05}}),
    "Z1 cope moves": (("Z1",), {"shift": {"cope": 0.02}}),
    "Z1 fire still": (("Z1",), {"shift": {"fire": 0.0}}),
    "Z2 fire degrades like rope": (("Z2",), {"nll": {("fire", "none"): (2.0, 2.1, 2.6)}}),
    "Z2 kerple_log degrades more than sinusoidal": (
        ("Z2",), {"nll": {("kerple_log", "none"): (2.0, 2.6, 3.2)}}
    ),
    "T1 rerope degrades": (("T1",), {"nll": {("rope", "rerope"): (2.0, 2.2, 2.4)}}),
    "T1 self_extend degrades": (("T1",), {"nll": {("rope", "self_extend"): (2.0, 2.1, 2.3)}}),
    "T2 self_extend forgets": (("T2",), {"passkey": {("rope", "self_extend"): (1.0, 0.5, 0.2)}}),
    "T3 streaming degrades": (("T3",), {"nll": {("rope", "streaming"): (2.0, 2.1, 2.2)}}),
    "T3 streaming retrieves": (
        ("T3",), {"depths": {("rope", "streaming"): dict.fromkeys((0.0, 0.25, 0.5), 1.0)}}
    ),
    "L1 randomized rope degrades more": (
        ("L1",), {"train": {("rope", "randomized", "none", "lm_sampling"): (2.0, 2.2, 2.9)}}
    ),
    "L1 randomized learned degrades as much": (
        ("L1",), {"train": {("learned", "randomized", "none", "lm_sampling"): (2.0, 2.6, 3.2)}}
    ),
    "L2 irope degrades like rope": (
        ("L2",), {"train": {("irope", "contiguous", "none", "lm_hybrid"): (1.9, 2.0, 2.5)}}
    ),
    "L3 learned sink costs 5% at L": (
        ("L3",), {"train": {("rope", "contiguous", "learned", "lm_sinks"): (2.05, 2.1, 2.5)}}
    ),
    "L3 sink token gains 5% at L": (
        ("L3",), {"train": {("rope", "contiguous", "token", "lm_sinks"): (1.95, 2.1, 2.6)}}
    ),
    "R1 multikey easier than single": (
        ("R1",), {"ruler": {("yarn", "niah_multikey"): (1.0, 1.0, 0.95)}}
    ),
    "R2 effective reaches the flat length": (("R2",), {"ruler_flat": {"yarn": (4, (2.0, 2.01, 2.015))}}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(NEGATIVE))
def test_negative_control_does_not_hold(case: str) -> None:
    keys, change = NEGATIVE[case]
    got = statuses(rows(**change, zoo=True))
    assert all(got[key] == FAILS for key in keys), got
    assert all(s == HOLDS for k, s in got.items() if k not in keys), got


@pytest.mark.parametrize("offset, status", [(-0.06, HOLDS), (0.0, NOT_DECIDED), (0.06, FAILS)])
def test_f2_is_a_non_inferiority_check_on_the_named_constant(offset: float, status: str) -> None:
    """Seeds jitter the 4L NLL by ±0.01 (t-interval half width 0.025): centred on the tolerance
    the CI straddles it (not decided, never "holds" from the point estimate); 0.06 nats below,
    its upper end is under it (holds); 0.06 above, its lower end is over it (does not hold)."""
    at_4l = 2.0 + math.log(ALIBI_MAX_RATIO) + offset
    got = statuses(rows(nll={("alibi", "none"): (2.0, 1.98, at_4l)}))
    assert got["F2"] == status, got


def test_f2_undecided_ci_is_not_reported_as_holding() -> None:
    """The audit's case: a ratio CI of about [0.886, 1.116] with its point estimate under 1.02."""
    e = Estimate("r", 0.995, 0.886, 1.116, 3, SEED_CI)
    assert decide(e, ALIBI_MAX_RATIO, "at_most") == UNDECIDED
    assert decide(Estimate("r", 0.99, 0.98, 1.0), ALIBI_MAX_RATIO, "at_most") is True
    assert decide(Estimate("r", 1.1, 1.05, 1.2), ALIBI_MAX_RATIO, "at_most") is False


@pytest.mark.parametrize(
    "claim, lo, hi, expected",
    [
        ("above", 1.1, 1.3, True),
        ("above", 0.8, 1.0, False),
        ("above", 0.9, 1.1, UNDECIDED),
        ("below", -0.3, -0.1, True),
        ("below", 0.0, 0.2, False),
        ("below", -0.1, 0.1, UNDECIDED),
        ("at_least", 0.8, 0.95, True),
        ("at_least", 0.5, 0.79, False),
        ("at_least", 0.7, 0.9, UNDECIDED),
        ("at_most", 0.0, 0.1, True),
        ("at_most", 0.11, 0.3, False),
        ("at_most", 0.05, 0.2, UNDECIDED),
    ],
)
def test_decide_on_the_interval(claim: str, lo: float, hi: float, expected) -> None:
    threshold = {"above": 1.0, "below": 0.0, "at_least": 0.8, "at_most": 0.1}[claim]
    assert decide(Estimate("x", (lo + hi) / 2, lo, hi), threshold, claim) == expected
    assert decide(Estimate("x", (lo + hi) / 2), threshold, claim) is None  # no interval


ABSENT = {
    "Z1": {"shift": {"xpos": None}},
    "Z2": {"nll": {("sandwich", "none"): (2.0, 2.01, None)}},
    "F1": {
        "nll": {("learned", "none"): (2.0, None, None)},
        "train": {
            ("learned", s, "none", "lm_sampling"): None
            for s in ("contiguous", "randomized", "pose")
        },
    },
    "F2": {"nll": {("alibi", "none"): (2.0, 1.98, None)}},
    "F3": {"nll": {("rope", "ntk"): (None, None, None)}},
    "F4": {"curves": {"pi": ("pi", None)}},
    "F5": {"passkey": {("rope", "none"): (None, 0.0, 0.0)}},
    "F6": {"shift": {"learned": None}},
    "T1": {"nll": {("rope", "rerope"): (2.0, None, None)}},
    "T2": {"passkey": {("rope", "self_extend"): (1.0, None, None)}},
    "T3": {"depths": {("rope", "streaming"): None}},
    "L1": {"train": {("sinusoidal", "randomized", "none", "lm_sampling"): None}},
    "L2": {"train": {("rope", "contiguous", "none", "lm_hybrid"): None}},
    "L3": {"train": {("rope", "contiguous", "token", "lm_sinks"): None}},
    "R1": {"ruler": {("none", "niah_multivalue"): (0.9, 0.1, None)}},
    "R2": {"ruler_flat": {"yarn": (2, None)}},
}


@pytest.mark.parametrize("key", list(ABSENT))
def test_absent_rows_are_not_measured(key: str) -> None:
    got = statuses(rows(**ABSENT[key], zoo=True))
    assert got[key] == NOT_MEASURED, got


def test_t1_needs_raw_rope_to_degrade_past_the_margin() -> None:
    """T1's contrast: a raw RoPE that stays within the margin (6% at 4L) fails T1 even though
    Self-Extend and ReRoPE are flat."""
    got = statuses(rows(nll={("rope", "none"): (2.0, 2.02, 2.06)}))
    assert got["T1"] == FAILS, got


def test_one_seed_without_ci_is_not_measured() -> None:
    r = [{k: v for k, v in x.items() if k not in ("ci_lo", "ci_hi")} for x in rows(seeds=(0,))]
    results = {f.key: f for f in check_findings(normalize_results(r))}
    assert results["F1"].status == NOT_MEASURED and "[no CI]" in results["F1"].numbers
    assert results["F2"].status == NOT_MEASURED  # non-inferiority needs the CI's upper end
    assert "rope max |dNLL| 0.000" in results["F6"].numbers  # |dNLL| ≈ 0 needs no CI


def test_finetuned_rows_are_not_zero_shot() -> None:
    """PI's NLL rows from a fine-tuned model (even labelled "linear") are not zero-shot PI (F3),
    and a fine-tuned model's passkey rows are not raw RoPE's (F5)."""
    tuned = {"finetune_method": "pi", "finetune_length": 4 * L, "finetune_steps": 50}
    r = [{**x, **tuned} if x["scaling"] == "linear" else x for x in rows()]
    assert statuses(r)["F3"] == NOT_MEASURED
    r = [{**x, **tuned} if x["metric"] == "passkey_acc" else x for x in rows()]
    assert "F5" not in statuses(r)  # no raw RoPE passkey series: not about these rows
    assert "F5" in out_of_scope(normalize_results(r))


def test_no_rows_measure_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    only_nll = [r for r in rows() if r["metric"] == "nll" and r["position"] == "nope"]
    assert statuses(only_nll) == {}  # no finding is about NoPE's perplexity alone
    # nothing checked is not a success: its own exit status (before: 0)
    assert main([str(write(tmp_path / "res", only_nll)), "--check"]) == NOTHING_CHECKED == 3
    assert "No registered finding is about these rows" in capsys.readouterr().out
    only_f6 = [r for r in rows() if r["metric"] == "shift_dnll" and r["position"] == "nope"]
    assert set(statuses(only_f6).values()) == {NOT_MEASURED}  # in scope, its other rows absent
    assert main([str(write(tmp_path / "f6", only_f6)), "--check"]) == NOTHING_CHECKED
    assert "not measured" in capsys.readouterr().out


def test_check_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path / "good", rows())
    assert main([str(good), "--check"]) == 0
    out = capsys.readouterr().out
    assert "| F6 |" in out and "does not hold" not in out
    assert not (tmp_path / "reports").exists()
    bad = write(tmp_path / "bad", rows(shift={"alibi": 0.3}))
    assert main([str(bad), "--check"]) == 1
    assert "does not hold" in capsys.readouterr().out


def test_report_starts_with_findings(tmp_path: Path) -> None:
    report = generate_report([write(tmp_path / "res", rows(zoo=True))], tmp_path / "out")
    text = report.read_text()
    sections = [line for line in text.splitlines() if line.startswith("## ")]
    assert sections[0] == "## Findings", sections
    assert "plots/findings.png" in text and (report.parent / "plots" / "findings.svg").is_file()
    table = pd.read_csv(report.parent / "tables" / "findings.csv")
    assert list(table["finding"]) == WORLD_KEYS
    assert set(table["status"]) == {HOLDS}
    assert table["source"].str.len().min() > 10


# --------------------------------------------------------------------------- series, not pools


def _estimate(results, key: str, name_start: str) -> list[Estimate]:
    return [e for e in {r.key: r for r in results}[key].estimates if e.name.startswith(name_start)]


def test_another_experiments_run_of_the_same_model_is_its_own_series() -> None:
    """The audit's case: the quickstart's seed-0 rows next to the findings' 3 seeds. Before, they
    joined the findings' t-interval as a fourth seed; now each experiment is one line."""
    base = check_findings(normalize_results(rows()))
    extra = [
        {**r, "experiment": "quickstart", "value": r["value"] + 0.2 * (r["metric"] == "nll")}
        for r in rows(seeds=(0,))
    ]
    results = check_findings(normalize_results(rows() + extra))
    lines = _estimate(results, "F1", "sinusoidal")
    assert len(lines) == 2, [e.name for e in lines]
    findings_line = next(e for e in lines if "experiment=findings" in e.name)
    assert findings_line.n_seeds == 3
    assert findings_line.value == pytest.approx(_estimate(base, "F1", "sinusoidal")[0].value)
    assert next(e for e in lines if "experiment=quickstart" in e.name).n_seeds == 1
    # negative control: the same rows under the findings' name are one series of 4 seeds
    same = [{**r, "experiment": "findings", "seed": 3} for r in extra]
    pooled = _estimate(check_findings(normalize_results(rows() + same)), "F1", "sinusoidal")
    assert len(pooled) == 1 and pooled[0].n_seeds == 4


def test_a_second_model_configuration_is_its_own_series() -> None:
    """Another RoPE base (position_params) or another model width (model_config_id) in the same
    sweep: F3's raw ratio of the first model is unchanged, the second gets its own line."""
    base = _estimate(check_findings(normalize_results(rows())), "F3", "rope ppl")[0]
    for change in ({"position_params": canonical_json({"base": 500})}, {"model_config_id": "w256"}):
        other = [
            {**r, **change, "value": r["value"] + 0.5 * (r["eval_length"] > L)}
            for r in rows()
            if r["position"] == "rope" and r["metric"] == "nll"
        ]
        results = check_findings(normalize_results(rows() + other))
        ratios = _estimate(results, "F3", "rope ppl")
        assert len(ratios) == 2, [e.name for e in ratios]
        assert base.value in [pytest.approx(e.value) for e in ratios]
        # the scaled-vs-raw differences pair series of one model only: 2 models x 4 pairs
        assert len(_estimate(results, "F3", "NLL(")) == 8


def test_two_finetune_recipes_are_two_curves_never_averaged() -> None:
    """PI fine-tuned with another recipe (another curve id) that never recovers: its own line,
    and it makes F4 not hold (one series that does not hold is enough)."""
    other = [
        {**r, "finetune_curve_id": "c-pi-lr2", "model_config_id": r["model_config_id"] + "-lr2",
         "value": 0.0}
        for r in rows()
        if r.get("finetune_method") == "pi"
    ]  # fmt: skip
    result = {r.key: r for r in check_findings(normalize_results(rows() + other))}["F4"]
    lines = [e for e in result.estimates if e.name.startswith("pi ft")]
    assert sorted(e.value for e in lines) == [200, math.inf], [e.text() for e in lines]
    assert result.status == FAILS


def test_recovery_curve_finding_reads_each_point() -> None:
    """The world's curves: YaRN recovers at 50 updates, PI at 200, direct not within 200."""
    result = {r.key: r for r in check_findings(normalize_results(rows()))}["F4"]
    assert result.status == HOLDS, result.numbers
    first = {e.name.split()[0]: e.value for e in result.estimates if "updates" in e.name}
    assert first == {"direct": math.inf, "pi": 200, "yarn": 50}


#: PI that recovers decidedly late or never: 0.81 on every seed at 200 updates (486 of 600
#: trials: Wilson [0.78, 0.84] straddles RETRIEVAL_MIN_ACC, so PI's recovery is not decided)
PI_LATE = ("pi", {0: (0.0,) * 3, 50: (0.3,) * 3, 200: (0.81,) * 3})


@pytest.mark.parametrize(
    "pi, direct_at_50, status",
    [
        (PI_LATE, (0.95,) * 3, FAILS),  # direct recovered at 50 where PI decidedly had not
        (PI_LATE, (0.81,) * 3, NOT_DECIDED),  # control: direct's recovery at 50 not decided
        # control: PI not decidedly short of recovery at 50, so nothing refutes the claim yet
        (("pi", {**PI_LATE[1], 50: (0.81,) * 3}), (0.95,) * 3, NOT_DECIDED),
    ],
)
def test_f4_contrast_is_refuted_by_the_other_method_recovering_first(
    pi: tuple, direct_at_50: tuple, status: str
) -> None:
    """PI's recovery within the grid is undecided, yet "PI recovers where direct fine-tuning has
    not" is refuted when direct fine-tuning recovered at a count by which PI decidedly had not."""
    direct = ("none", {0: (1.0, 0.0, 0.0), 50: direct_at_50, 200: (1.0,) * 3})
    result = {
        r.key: r
        for r in check_findings(normalize_results(rows(curves={"pi": pi, "direct": direct})))
    }["F4"]
    assert result.status == status, result.numbers


def test_f4_faster_needs_the_other_method_short_at_every_smaller_count() -> None:
    """The world's YaRN recovers at 50 updates; PI is short at 50 but had recovered at 0: PI
    was first, so "YaRN needs fewer updates than PI" fails (it held when only the count 50 was
    read). The world itself (PI at 0.00 until 50) is the control: it holds there."""
    pi = ("pi", {**CURVES["pi"][1], 0: (0.95,) * 3})
    result = {r.key: r for r in check_findings(normalize_results(rows(curves={"pi": pi})))}["F4"]
    assert result.status == FAILS, result.numbers
    assert statuses(rows())["F4"] == HOLDS


def test_f4_needs_every_length_it_names() -> None:
    """The audit's case: a fine-tune with only its 4L rows was reported as holding."""
    r = [x for x in rows() if not (x.get("finetune_method") == "yarn" and x["eval_length"] < 4 * L)]
    result = {f.key: f for f in check_findings(normalize_results(r))}["F4"]
    assert result.status == NOT_MEASURED
    assert "yarn ft@4x: L..4L at 0/50/200 updates" in result.numbers, result.numbers


#: a seed whose base model never retrieves: 0 at every length, raw and after every fine-tune
NO_CIRCUIT = {m: (scal, dict.fromkeys(points, (0.0,) * 3)) for m, (scal, points) in CURVES.items()}


def _with_seed_9(parent_at_l: float) -> list[dict]:
    """The world plus the retrieval rows of a seed 9 whose raw RoPE model retrieves
    ``parent_at_l`` at L and nothing beyond it, and whose fine-tunes never retrieve."""
    nine = rows(seeds=(9,), passkey={("rope", "none"): (parent_at_l, 0.0, 0.0)}, curves=NO_CIRCUIT)
    return rows() + [
        r for r in nine if r["metric"] == "passkey_acc" and r["position"] == "rope"
    ]  # fmt: skip


@pytest.mark.parametrize(
    "parent_at_l, status",
    [
        (0.0, HOLDS),  # 0 of 200 at L: left out, the other seeds decide
        (0.78, NOT_DECIDED),  # control: Wilson [0.72, 0.83] reaches 0.8, so the seed is read
    ],
)
def test_f4_leaves_out_seeds_whose_parent_never_retrieves(parent_at_l: float, status: str) -> None:
    """F4 is about extending a model that retrieves at L: a seed whose raw RoPE model is
    decidedly below 0.8 there is left out (and named); F5 still counts it."""
    results = {r.key: r for r in check_findings(normalize_results(_with_seed_9(parent_at_l)))}
    assert results["F4"].status == status, results["F4"].numbers
    assert results["F5"].status == FAILS
    left_out = [e for e in results["F4"].estimates if e.name.startswith("left out")]
    if parent_at_l == 0.0:
        assert [e.name for e in left_out] == ["left out: seed 9, its raw RoPE parent's acc at L"]
        assert {e.n_seeds for e in results["F4"].estimates if "updates" in e.name} == {3}
    else:
        assert left_out == []
        assert {e.n_seeds for e in results["F4"].estimates if "updates" in e.name} == {4}


def test_f4_left_out_parent_is_matched_by_model_id() -> None:
    """Seed 9's fine-tunes name another parent (one with no rows): nothing links them to the
    failing raw model, so they are read and F4 is not decided (the gate is by parent, not seed)."""
    r = [
        {**x, "parent_model_id": "elsewhere"} if x["seed"] == 9 and x.get("finetune_method") else x
        for x in _with_seed_9(0.0)
    ]  # fmt: skip
    assert statuses(r)["F4"] == NOT_DECIDED


# --------------------------------------------------------------------------- binomial intervals


@pytest.mark.parametrize("k, n", [(0, 20), (20, 20), (17, 20), (39, 40), (3, 200)])
def test_wilson_interval_matches_scipy(k: int, n: int) -> None:
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert wilson(k, n) == pytest.approx((ci.low, ci.high), abs=1e-9)


@pytest.mark.parametrize("trials, status", [(20, NOT_DECIDED), (40, HOLDS)])
def test_f5_decides_on_each_seeds_interval(trials: int, status: str) -> None:
    """20 of 20 at L: the Wilson interval [0.84, 1] cannot show >= 0.9; 40 of 40 can."""
    r = [{**x, "n": trials} if x["metric"] == "passkey_acc" else x for x in rows()]
    assert statuses(r)["F5"] == status


def test_f4_raw_rope_near_zero_needs_enough_trials() -> None:
    """0 of 20 beyond L on one seed: upper end 0.16 > 0.1, not decided; 0 of 200: holds."""
    few = [{**x, "n": 20} if x["metric"] == "passkey_acc" else x for x in rows(seeds=(0,))]
    result = {f.key: f for f in check_findings(normalize_results(few))}["F4"]
    assert result.status == NOT_DECIDED, result.numbers
    assert statuses(rows(seeds=(0,)))["F4"] == HOLDS


def test_accuracy_interval_covers_the_spread_of_seeds() -> None:
    """Seeds at 0.0, 1.0, 1.0 (200 trials each): the pooled Wilson interval alone would be
    [0.60, 0.71]; the seed t-interval is far wider, and the estimate's interval covers it."""
    frame = normalize_results(
        [
            {**_base("rope", "none", s), "eval_length": L, "metric": "passkey_acc",
             "value": v, "n": 200, "axis": "template", "axis_value": "short"}
            for s, v in zip(SEEDS, (0.0, 1.0, 1.0), strict=True)
        ]
    )  # fmt: skip
    e = accuracy_estimate(frame, "acc")
    assert e.value == pytest.approx(2 / 3)
    assert e.lo == 0.0 and e.hi == 1.0


# --------------------------------------------------------------------------- seeds x documents


def _with_docs(row_list: list[dict], spread: float, rng_seed: int = 0) -> list[dict]:
    """Whole-window nll rows with per-document sums: 8 documents of 64 tokens whose NLLs spread
    by ``spread`` around the row's value (the same document offsets at every length and seed)."""
    offsets = np.random.default_rng(rng_seed).normal(0.0, spread, 8)
    offsets -= offsets.mean()
    out = []
    for r in row_list:
        if r["metric"] == "nll" and "bucket_lo" not in r:
            # a document's NLL moves with the length by its own amount: documents disagree
            k = r["eval_length"] // L
            per_doc = r["value"] + offsets * (k - 1)
            r = {**r, "doc_nll_sums": list(per_doc * 64), "doc_tokens": [64.0] * 8}
        out.append(r)
    return out


def test_interval_covers_documents_as_well_as_seeds() -> None:
    """Seeds that agree exactly (t-interval of zero width) on documents that disagree: the seed x
    document bootstrap gives the interval a width; without per-document sums (control) the
    interval is the seeds' alone."""
    flat = {("sinusoidal", "none"): (2.0, 2.5, 3.0)}
    same_seeds = [
        {**r, "value": r["value"] - 0.01 * (r["seed"] - 1) * (r["eval_length"] > L)}
        if r["metric"] == "nll" else r
        for r in rows(nll=flat)
    ]  # fmt: skip
    plain = _estimate(check_findings(normalize_results(same_seeds)), "F1", "sinusoidal")[0]
    assert plain.hi - plain.lo == pytest.approx(0.0, abs=1e-9) and plain.ci == SEED_CI
    docs = _estimate(
        check_findings(normalize_results(_with_docs(same_seeds, 0.3))), "F1", "sinusoidal"
    )[0]
    assert docs.value == pytest.approx(plain.value)
    assert docs.lo < plain.value < docs.hi and docs.hi - docs.lo > 0.05
    assert docs.ci == SEED_DOC_CI


def test_seed_document_bootstrap_collapses_when_documents_agree() -> None:
    """Every document moves by the same amount: resampling documents changes nothing."""
    from bench.findings import seed_doc_bootstrap, select

    df = normalize_results(_with_docs(rows(seeds=(1,)), 0.0))
    rows_ = select(df, "sinusoidal")
    lo, hi = seed_doc_bootstrap(rows_, rows_, 4, 1)
    assert lo == pytest.approx(1.0) and hi == pytest.approx(1.0)  # 3.0 - 2.0 nats
    assert seed_doc_bootstrap(select(normalize_results(rows(seeds=(1,))), "sinusoidal"),
                              select(normalize_results(rows(seeds=(1,))), "sinusoidal"), 4, 1) is None  # fmt: skip


def test_report_shows_the_recovery_curves(tmp_path: Path) -> None:
    """tables/passkey_recovery.csv: per recipe, update count and length, the seed mean of the
    world's curves (the per-length rows), and its figure."""
    report = generate_report([write(tmp_path / "res", rows())], tmp_path / "out")
    assert "### Recovery by fine-tuning" in report.read_text()
    assert (report.parent / "plots" / "passkey_recovery.svg").is_file()
    t = pd.read_csv(report.parent / "tables" / "passkey_recovery.csv")
    assert set(t["finetune_method"]) == {"pi", "yarn", "direct"}
    for method, (_, points) in CURVES.items():
        for steps, accs in points.items():
            for k, acc in zip((1, 2, 4), accs, strict=True):
                cell = t[(t["finetune_method"] == method) & (t["finetune_steps"] == steps)
                         & (t["eval_length"] == k * L)]  # fmt: skip
                assert len(cell) == 1 and cell["passkey_acc"].iloc[0] == pytest.approx(acc)
                assert cell["n_seeds"].iloc[0] == 3
    # control: without recovery curves (one update count per recipe) there is no such section
    single = [r for r in rows() if r.get("finetune_steps", 200) == 200]
    other = generate_report([write(tmp_path / "res2", single)], tmp_path / "out2").read_text()
    assert "### Recovery by fine-tuning" not in other


def test_report_to_an_unwritable_directory_is_one_sentence(tmp_path: Path, capsys) -> None:
    """--out below a file (a path that cannot be a directory, even for root): one sentence,
    exit 2, no traceback."""
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(SystemExit) as info:
        main([str(write(tmp_path / "res", rows())), "--out", str(blocker / "out")])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "cannot write the report to" in err and str(blocker) in err


# --------------------------------------------------------------------------- the zoo's Z2 ratio


def test_ratio_of_ratios_is_the_hand_computed_value() -> None:
    """kerple_log 2.0 -> 2.1 and rope 2.0 -> 2.6 nats (+0.01 (s - 1) each beyond L, which cancels):
    exp(0.1) / exp(0.6); a seed t-interval of zero width, widened by documents that disagree."""
    from bench.findings import ratio_of_ratios, select

    world = rows(nll={("kerple_log", "none"): (2.0, 2.05, 2.1)}, zoo=True)
    world = [r for r in world if "arm" not in r]  # one rope series (not the study's arms)
    df = normalize_results(world)
    e = ratio_of_ratios("x", select(df, "kerple_log"), select(df, "rope"))
    assert e.value == pytest.approx(math.exp(0.1 - 0.6)) and e.n_seeds == 3
    assert e.lo == pytest.approx(e.value) and e.hi == pytest.approx(e.value) and e.ci == SEED_CI
    # documents that agree at every length: the bootstrap adds no width
    df = normalize_results(_with_docs(world, 0.0))
    e = ratio_of_ratios("x", select(df, "kerple_log"), select(df, "rope"))
    assert e.hi - e.lo == pytest.approx(0.0, abs=1e-9) and e.ci == SEED_DOC_CI
    # the same document offsets in both families cancel in the paired difference; control:
    # documents that move differently in the two families widen it around the same value
    kerple = [r for r in world if r["position"] == "kerple_log"]
    rest = [r for r in world if r["position"] != "kerple_log"]
    df = normalize_results(_with_docs(kerple, 0.3, rng_seed=1) + _with_docs(rest, 0.3))
    wide = ratio_of_ratios("x", select(df, "kerple_log"), select(df, "rope"))
    assert wide.value == pytest.approx(math.exp(0.1 - 0.6))
    assert wide.lo < wide.value < wide.hi and wide.hi - wide.lo > 0.01


# --------------------------------------------------------------------------- scope


def test_findings_are_checked_only_on_the_series_they_are_about() -> None:
    """F1 (absolute encodings degrade) is about contiguous-trained models: a PoSE-trained
    sinusoidal model that stays flat beside them is not F1's series. Negative control: F1's
    function on every row (no scope) counts it and does not hold."""
    flat_pose = {("sinusoidal", "pose", "none", "lm_sampling"): (2.05, 2.05, 2.05)}
    df = normalize_results(rows(zoo=True, train=flat_pose))
    assert {r.key: r.status for r in check_findings(df)}["F1"] == HOLDS
    assert f1_absolute_degrade(df).status != HOLDS  # the old behaviour: every series checked


def test_a_report_lists_findings_without_series_in_one_line(tmp_path: Path) -> None:
    only_zoo = [r for r in rows(zoo=True) if r["position"] in RELATIVE_FAMILIES]
    df = normalize_results(only_zoo)
    outside = out_of_scope(df)
    assert "F1" in outside and "L1" in outside and "Z1" not in outside
    report = generate_report([write(tmp_path / "res", only_zoo)], tmp_path / "out").read_text()
    table = pd.read_csv(tmp_path / "out" / "tables" / "findings.csv")
    assert "F1" not in set(table["finding"]) and "Z1" in set(table["finding"])
    (line,) = [x for x in report.splitlines() if x.startswith("Not about these rows")]
    assert all(key in line for key in outside)


def test_every_finding_declares_a_scope_and_a_scope_is_required() -> None:
    registered = findings()
    assert set(registered) == set(KEYS)
    assert all(isinstance(f.scope, Scope) and f.scope.describe() for f in registered.values())
    with pytest.raises(TypeError, match="scope must be a Scope"):
        register_finding("X9", {"positions": ("rope",)})(f1_absolute_degrade)
    assert "X9" not in findings()


# --------------------------------------------------------------------------- power


def test_an_undecided_seed_interval_says_how_many_seeds_would_decide_it() -> None:
    """At the observed mean 0.5 and spread 1, the t-interval half-width t(n-1) / sqrt(n) drops
    below 0.5 first at n = 18 (hand: t_16 2.120 / sqrt 17 = 0.514, t_17 2.110 / sqrt 18 = 0.497).
    Negative controls: a decided interval gets no count; a mean on the threshold never decides."""
    from bench.findings import seeds_to_decide, summarise

    values = np.array([-0.5, 0.5, 1.5])  # mean 0.5, sd 1
    e = summarise("d", values, np.full(3, np.nan))
    assert decide(e, 0.0, "above") == UNDECIDED
    assert e.seeds_needed == 18 and "at least 18 seeds to decide" in e.text()
    decided = summarise("d", np.array([1.0, 1.1, 1.2]), np.full(3, np.nan))
    assert decide(decided, 0.0, "above") is True and decided.seeds_needed is None
    assert "to decide" not in decided.text()
    on = summarise("d", np.array([-1.0, 0.0, 1.0]), np.full(3, np.nan))
    assert seeds_to_decide(on, 0.0) > 1000
    # a ratio (exp of a log mean): the threshold is compared on the log scale
    ratio = summarise("r", np.log([0.9, 1.1, 1.3]), np.full(3, np.nan), transform=math.exp)
    assert ratio.log_scale and seeds_to_decide(ratio, 1.0) == seeds_to_decide(
        summarise("l", np.log([0.9, 1.1, 1.3]), np.full(3, np.nan)), 0.0
    )


# --------------------------------------------------------------------------- T3's reach


def test_t3_scores_the_depths_outside_the_window_and_within_the_masks_reach() -> None:
    """Issue 76 item 4: on the training-free reference's retrieval arm (its L, layers, the short
    template, StreamingLLM's auto window), the key at 4L lies beyond n_layers x (window - 1) of
    the answer at every depth below REACH_DEPTH (lost by the mask whatever the model learned) and
    within that reach, outside the window, at each of REACH_DEPTH..OUTSIDE_WINDOW_DEPTH."""
    from bench.findings.estimates import FAR
    from bench.findings.training_free import OUTSIDE_WINDOW_DEPTH, REACH_DEPTH
    from bench.tasks.passkey import make_passkey_example
    from models.scaling import pair_positions
    from models.scaling_config import run_scaling

    from fixtures.jobs import compose_job

    job = compose_job("+experiment=training_free", "arm=retrieval", "scaling=streaming")
    length = FAR * job.train.length
    scaling = run_scaling(job.scaling, train_length=job.train.length, lengths=[length])
    window = pair_positions("streaming", train_length=job.train.length, **scaling.params).window
    reach = job.model.n_layers * (window - 1)
    assert (job.train.length, job.model.n_layers, window, reach) == (256, 3, 252, 753)

    def distance(depth: float, key: int) -> int:  # from the key's digits to the answer's
        ex = make_passkey_example(length, depth, key, template=job.train.passkey_template)
        prompt, answer = bytes(ex.prompt_ids).decode(), bytes(ex.answer_ids).decode()
        start = prompt.index(str(key), ex.needle_start)
        return len(ex.prompt_ids) - 1 + answer.index(str(key)) - start

    keys = (1, 12345, 50000)
    for depth in (0.0, 0.125, 0.2):
        assert depth < REACH_DEPTH and min(distance(depth, k) for k in keys) > reach, depth
    for depth in (REACH_DEPTH, 0.375, OUTSIDE_WINDOW_DEPTH):
        assert window <= min(distance(depth, k) for k in keys), depth
        assert max(distance(depth, k) for k in keys) <= reach, depth


def test_t3_is_not_made_to_hold_by_needles_lost_by_construction() -> None:
    """T3 pools only depths 0.25 and 0.5: a model that retrieves 12% of the needles within reach
    does not hold T3 (accuracy above 0.1), however many depth-0 needles the mask alone loses (with
    depth 0 pooled it read 8%, and held). Control: nothing retrieved at 0.25 and 0.5 holds, and
    the estimate counts the trials of those two depths only."""
    from bench.core.stats import wilson

    lost = {0.0: 0.0, 0.25: 0.12, 0.5: 0.12, 0.75: 0.4, 1.0: 1.0}
    assert statuses(rows(depths={("rope", "streaming"): lost}))["T3"] == FAILS
    results = check_findings(normalize_results(rows()))
    assert {r.key: r.status for r in results}["T3"] == HOLDS
    (estimate,) = _estimate(results, "T3", "rope streaming acc")
    assert estimate.name == "rope streaming acc at 4L, depths 0.25-0.5"
    assert estimate.hi == pytest.approx(wilson(0, 2 * TRIALS * len(SEEDS))[1])  # 2 depths' trials
    assert estimate.hi != pytest.approx(wilson(0, 3 * TRIALS * len(SEEDS))[1])
