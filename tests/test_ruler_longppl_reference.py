"""The RULER study with LongPPL, committed: results/ruler_longppl (K = 64, 8 documents),
results/ruler_longppl_k16 (K = 16, 24 documents) and results/ruler_longppl_zoo_2025 (the K = 16
run with the zoo_2025 families FoX, PoPE, NoPE and stick-breaking and the model switches SSMax,
output gate and QK-norm trained on the RULER arm), with their reports.

For each: the Findings computed from the committed rows equal the committed table (P1 beside R1
and R2) and its README states each status; the README's per-series table is what P1 reads (to the
digits printed; a changed digit fails); every series was scored on one evaluator's key tokens (one
key-token count per length); regenerating the report reproduces every committed table. P1 is
measured on the K = 16 runs only: K = 64 left one key token per length.
"""

from __future__ import annotations

import json

import pytest

from bench.core.series import SERIES_COLUMNS, SWITCH_COLUMNS, key_values
from bench.findings import NOT_MEASURED
from bench.findings.longppl import series_table

from fixtures import ROOT
from fixtures.markdown import agrees, markdown_table
from fixtures.reports import (
    assert_committed_findings,
    assert_report_regenerates,
    changed_digit,
    committed_rows,
)

COLUMNS = "| RULER effective length | LongPPL at 4L | perplexity at 4L | key tokens at 4L |"
#: run -> (the README holding its series table, that table's first header cell, its series)
RUNS = {
    "ruler_longppl": ("ruler_longppl", "| series, K = 64 ", 7),
    "ruler_longppl_k16": ("ruler_longppl", "| series, K = 16 ", 7),
    "ruler_longppl_zoo_2025": (
        "ruler_longppl_zoo_2025",
        "| series, K = 16, with the zoo_2025 families ",
        16,
    ),
}
MEASURED = {"ruler_longppl_k16", "ruler_longppl_zoo_2025"}  # P1 has enough key tokens
#: the findings whose status each run's README states
STATED = {"ruler_longppl_zoo_2025": ("P1", "R1", "R2", "N1", "N2", "N3", "N4", "N5", "N6")}


def numbers(name: str) -> str:
    return (ROOT / "reports" / RUNS[name][0] / "README.md").read_text(encoding="utf-8")


def results(name: str):
    path = ROOT / "results" / name
    if not any(path.glob("*.parquet")):
        pytest.skip(f"no committed results/{name}")
    return path


@pytest.mark.parametrize("name", list(RUNS))
def test_the_committed_findings_are_what_the_rows_give(name):
    status = assert_committed_findings(
        committed_rows(results(name)), ROOT / "reports" / name, STATED.get(name, ("P1", "R1", "R2"))
    )
    measured = status["P1"] != NOT_MEASURED
    assert measured == (name in MEASURED), status


@pytest.mark.parametrize("name", list(RUNS))
def test_every_series_is_scored_on_one_evaluators_key_tokens(name):
    """One evaluator (a checkpoint that is none of the judged series) chose the key tokens: at a
    length every series and seed has the same key-token count, and every row names that key."""
    df = committed_rows(results(name))
    long = df[df["metric"] == "longppl"]
    assert len(long) > 0
    evaluators = {json.loads(p)["evaluator"] for p in long["task_params"]}
    assert len(evaluators) == 1, evaluators
    assert evaluators.isdisjoint(set(df["model_id"]) | set(df["parent_model_id"].dropna()))
    assert (long.groupby("eval_length")["n"].nunique() == 1).all()
    assert (long["n"] > 0).all()


def label(series: str) -> str:
    """A series key's name in the README: its scaling (none, linear, ntk, yarn, self_extend), or
    "<method> fine-tune" for a fine-tune; a position other than RoPE goes first ("pope linear"),
    then each model switch that is on as its row column and value ("nope attention=stick_breaking
    none", "qk_norm=rms none")."""
    parts = key_values(series, SERIES_COLUMNS)
    method = parts["finetune_method"]
    name = f"{method} fine-tune" if method else parts["scaling"]
    model = [parts["position"]] if parts["position"] != "rope" else []
    switches = [f"{c}={parts[c]}" for c in SWITCH_COLUMNS if parts.get(c)]
    return " ".join([*model, *switches, name])


def check_series_table(text: str, name: str) -> int:
    """ "| series, K = .. | RULER effective length | LongPPL at 4L | perplexity at 4L | key tokens
    at 4L |": each row is P1's per-series table (bench.findings.longppl.series_table) to the
    digits printed, the key tokens summed over seeds."""
    first = RUNS[name][1]
    header = text[text.index(first) :].splitlines()[0]
    assert header.endswith(COLUMNS), header
    table = markdown_table(text, first)
    t = series_table(committed_rows(results(name))).rename(index=label)
    assert set(table) == set(t.index), (set(table), set(t.index))
    checked = 0
    for series, cells in table.items():
        for printed, value in zip(cells[:3], t.loc[series, ["eff", "longppl", "ppl"]], strict=True):
            assert agrees(printed, float(value)), (series, printed, value)
            checked += 1
        assert int(cells[3]) == int(t.loc[series, "key_tokens"]), (series, cells[3])
    return checked


@pytest.mark.parametrize("name", list(RUNS))
def test_the_series_table_is_what_p1_reads(name):
    results(name)
    assert check_series_table(numbers(name), name) == 3 * RUNS[name][2]


@pytest.mark.parametrize("name", list(RUNS))
def test_the_series_table_check_fails_on_a_changed_cell(name):
    results(name)
    text = numbers(name)
    lines = text[text.index(RUNS[name][1]) :].splitlines()
    cells = lines[2].split("|")
    cells[3] = f" {changed_digit(cells[3].strip())} "
    with pytest.raises(AssertionError):
        check_series_table(text.replace(lines[2], "|".join(cells), 1), name)


@pytest.mark.parametrize("name", list(RUNS))
def test_the_committed_report_regenerates(name, tmp_path, monkeypatch):
    results(name)
    assert_report_regenerates(name, tmp_path, monkeypatch)


def same_rows(a, b) -> bool:
    """Two row sets hold the same values per (seed, metric, method, length, task, axis, bucket):
    the rows of one model evaluated twice, run ids and write times aside."""
    key = ["seed", "metric", "scaling", "finetune_method", "eval_length", "task", "axis"]
    key += ["axis_value", "bucket_lo", "layer"]

    def values(df):
        df = df[key + ["value"]].astype({"value": float}).astype(str)
        return df.sort_values(key + ["value"]).reset_index(drop=True)

    return len(a) == len(b) and values(a).equals(values(b))


def test_the_rope_series_beside_the_families_are_the_k16_runs_rows():
    """results/ruler_longppl_zoo_2025 evaluated the RoPE series again from the cached models of
    ruler_longppl_k16: the same rows, value for value (a changed value is caught). Beside them are
    RoPE models with a switch on, trained for this run, and first-token attention rows
    (``attn_first_mass``, for N5), a metric the K = 16 run did not have."""
    zoo = committed_rows(results("ruler_longppl_zoo_2025"))
    k16 = committed_rows(results("ruler_longppl_k16"))
    switched = zoo.reindex(columns=SWITCH_COLUMNS).notna().any(axis=1)
    rope = zoo[(zoo["position"] == "rope") & ~switched & (zoo["metric"] != "attn_first_mass")]
    assert set(zoo["position"]) == {"rope", "fox", "pope", "nope"}
    assert set(zoo.loc[switched & (zoo["position"] == "rope"), "model_id"]).isdisjoint(
        k16["model_id"]
    )
    assert same_rows(rope, k16)
    changed = rope.copy()
    changed.loc[changed.index[0], "value"] = float(changed["value"].iloc[0]) + 1e-6
    assert not same_rows(changed, k16)
