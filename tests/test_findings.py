"""Tests for bench/findings.py, the report's Findings section and ``lenbench-report --check``.

Synthetic rows shaped as the metrics write them: a world where every finding holds, one negative
control per finding (it does not hold), and absent rows (not measured).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from bench.findings import (
    ALIBI_MAX_RATIO,
    FAILS,
    HOLDS,
    NOT_MEASURED,
    RUN_CI,
    SEED_CI,
    check_findings,
)
from bench.report import generate_report, main
from bench.results import canonical_json, normalize_results, write_results

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
}
#: passkey accuracy at 1x, 2x, 4x L per (position, scaling, finetune_method)
PASSKEY = {
    ("rope", "none", None): (1.0, 0.0, 0.0),
    ("rope", "pi", "pi"): (0.95, 0.9, 0.85),  # a fine-tune's scaling label is the method's
    ("rope", "yarn", "yarn"): (0.95, 0.95, 0.9),
}
#: shift-probe dNLL per position at delta = L and 4L
SHIFT = {"rope": 1e-7, "alibi": 0.0, "nope": 0.0, "sinusoidal": 0.5, "learned": 0.4}


def _base(pos: str, scaling: str, seed: int, tuned: str | None = None) -> dict:
    row = {
        "experiment": "findings",
        "run_id": f"{pos}-{scaling}-{tuned}-s{seed}",
        "model_id": f"m-{pos}-{tuned}-s{seed}",
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
            finetune_method=tuned, finetune_length=4 * L, finetune_steps=50, parent_model_id="p"
        )
    return row


def rows(seeds=SEEDS, nll=None, passkey=None, shift=None) -> list[dict]:
    """Rows of the world in NLL / PASSKEY / SHIFT (overridden per key by the arguments).

    Seed s adds 0.01 * (s - 1) nats beyond L, so ratios vary across seeds."""
    nll, passkey, shift = {**NLL, **(nll or {})}, {**PASSKEY, **(passkey or {})}, shift or {}
    shift = {**SHIFT, **shift}
    out = []
    for seed in seeds:
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
        for (pos, scal, tuned), accs in passkey.items():
            for k, acc in zip((1, 2, 4), accs, strict=True):
                if acc is None:
                    continue
                out.append(
                    {**_base(pos, scal, seed, tuned), "eval_length": k * L, "metric": "passkey_acc",
                     "value": acc, "n": 40, "axis": "template", "axis_value": "short"}
                )  # fmt: skip
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
    results = check_findings(normalize_results(rows()))
    assert {r.key: r.status for r in results} == {f"F{i}": HOLDS for i in range(1, 7)}
    f1 = results[0].estimates[0]
    assert f1.n_seeds == 3 and f1.ci == SEED_CI
    assert f1.lo > 1 and f1.value == pytest.approx(2.718, rel=0.02)  # exp(1)


def test_one_seed_uses_the_stored_ci() -> None:
    results = check_findings(normalize_results(rows(seeds=(0,))))
    by_key = {r.key: r for r in results}
    assert by_key["F1"].status == HOLDS and by_key["F1"].estimates[0].ci == RUN_CI
    assert all(r.status == HOLDS for r in results), [(r.key, r.status, r.numbers) for r in results]


NEGATIVE = {
    "F1 sinusoidal flat": ("F1", {"nll": {("sinusoidal", "none"): (2.0, 2.0, 2.0)}}),
    "F2 alibi degrades": ("F2", {"nll": {("alibi", "none"): (2.0, 2.0, 2.0 + 0.05)}}),
    "F3 raw rope flat": ("F3", {"nll": {("rope", "none"): (2.0, 2.0, 2.0)}}),
    "F3 ntk worse than PI": ("F3", {"nll": {("rope", "ntk"): (2.0, 3.0, 3.5)}}),
    "F4 yarn ft loses 4L": ("F4", {"passkey": {("rope", "yarn", "yarn"): (0.95, 0.9, 0.5)}}),
    "F4 raw rope beyond L": ("F4", {"passkey": {("rope", "none", None): (1.0, 0.5, 0.0)}}),
    "F5 rope misses at L": ("F5", {"passkey": {("rope", "none", None): (0.85, 0.0, 0.0)}}),
    "F6 nope moves": ("F6", {"shift": {"nope": 0.05}}),
    "F6 sinusoidal still": ("F6", {"shift": {"sinusoidal": 0.0}}),
}


@pytest.mark.parametrize("case", list(NEGATIVE))
def test_negative_control_does_not_hold(case: str) -> None:
    key, change = NEGATIVE[case]
    got = statuses(rows(**change))
    assert got[key] == FAILS, got
    assert all(s == HOLDS for k, s in got.items() if k != key), got


@pytest.mark.parametrize("scale, status", [(0.9, HOLDS), (1.1, FAILS)])
def test_f2_threshold_is_the_named_constant(scale: float, status: str) -> None:
    """Seed 1 has no jitter: ratio = ALIBI_MAX_RATIO ** scale."""
    at_4l = 2.0 + scale * math.log(ALIBI_MAX_RATIO)
    assert statuses(rows(seeds=(1,), nll={("alibi", "none"): (2.0, 2.0, at_4l)}))["F2"] == status


ABSENT = {
    "F1": {"nll": {("learned", "none"): (2.0, None, None)}},
    "F2": {"nll": {("alibi", "none"): (2.0, 1.98, None)}},
    "F3": {"nll": {("rope", "ntk"): (None, None, None)}},
    "F4": {"passkey": {("rope", "pi", "pi"): (None, None, None)}},
    "F5": {"passkey": {("rope", "none", None): (None, 0.0, 0.0)}},
    "F6": {"shift": {"learned": None}},
}


@pytest.mark.parametrize("key", list(ABSENT))
def test_absent_rows_are_not_measured(key: str) -> None:
    got = statuses(rows(**ABSENT[key]))
    assert got[key] == NOT_MEASURED, got


def test_one_seed_without_ci_is_not_measured() -> None:
    r = [{k: v for k, v in x.items() if k not in ("ci_lo", "ci_hi")} for x in rows(seeds=(0,))]
    results = {f.key: f for f in check_findings(normalize_results(r))}
    assert results["F1"].status == NOT_MEASURED and "[no CI]" in results["F1"].numbers
    assert results["F2"].status == HOLDS  # a point-estimate check needs no CI


def test_finetuned_rows_are_not_zero_shot() -> None:
    """PI's NLL rows from a fine-tuned model (even labelled "linear") are not zero-shot PI (F3),
    and a fine-tuned model's passkey rows are not raw RoPE's (F5)."""
    tuned = {"finetune_method": "pi", "finetune_length": 4 * L, "finetune_steps": 50}
    r = [{**x, **tuned} if x["scaling"] == "linear" else x for x in rows()]
    assert statuses(r)["F3"] == NOT_MEASURED
    r = [{**x, **tuned} if x["metric"] == "passkey_acc" else x for x in rows()]
    assert statuses(r)["F5"] == NOT_MEASURED


def test_no_rows_measure_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    only_nll = [r for r in rows() if r["metric"] == "nll" and r["position"] == "nope"]
    assert set(statuses(only_nll).values()) == {NOT_MEASURED}
    assert main([str(write(tmp_path / "res", only_nll)), "--check"]) == 0
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
    report = generate_report([write(tmp_path / "res", rows())], tmp_path / "out")
    text = report.read_text()
    sections = [line for line in text.splitlines() if line.startswith("## ")]
    assert sections[0] == "## Findings", sections
    assert "plots/findings.png" in text and (report.parent / "plots" / "findings.svg").is_file()
    table = pd.read_csv(report.parent / "tables" / "findings.csv")
    assert list(table["finding"]) == [f"F{i}" for i in range(1, 7)]
    assert set(table["status"]) == {HOLDS}
    assert table["source"].str.len().min() > 10
