"""The RULER section: task x length table (match / exact), the tasks' mean, effective lengths from
the stored rows, the passkey accuracy beside them, the reasoning tasks' heuristic baselines; no
section without ruler rows."""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd
import pytest

from bench.core.results import write_results
from bench.data.tokenizer import ByteTokenizer
from bench.report import generate_report
from bench.report.sections.ruler import heuristic_baselines
from bench.tasks.ruler import RulerParams, default_ruler_tasks, make_ruler_example

from fixtures.rows import row
from fixtures.ruler import place_guesses

RULER_TASKS = default_ruler_tasks()  # RULER's suite: the tasks these rows have

L = 256


def ruler_rows(seed: int) -> list[dict]:
    common = dict(experiment="ruler", run_id=f"r{seed}", model_id=f"m{seed}", seed=seed,
                  train_length=L)  # fmt: skip
    rows = []
    for i, task in enumerate(RULER_TASKS):
        for length in (L, 2 * L):
            score = 1.0 - 0.1 * i - (0.3 if length > L else 0.0) + 0.02 * seed
            for kind, value in (("match", score), ("exact", score / 2)):
                rows.append(row(metric=task, value=value, n=24, eval_length=length, axis="score",
                                axis_value=kind, task=task,
                                task_params=f'{{"min_length":{100 + 20 * i}}}', **common))  # fmt: skip
        rows.append(row(metric="effective_length", value=L * (seed - 3), eval_length=L * (seed - 3),
                        n=2, axis="threshold", axis_value=0.856, task=task,
                        task_params="{}", **common))  # fmt: skip
    rows.append(row(metric="passkey_acc", value=0.75, n=40, eval_length=2 * L, axis="template",
                    axis_value="short", template="short", **common))  # fmt: skip
    return rows


def test_ruler_section(tmp_path: Path) -> None:
    write_results([*ruler_rows(4), *ruler_rows(5)], tmp_path / "results" / "r.parquet")
    md = generate_report(tmp_path / "results", tmp_path / "report").read_text()
    assert "## RULER-style tasks" in md and "### Effective length" in md
    scores = pd.read_csv(tmp_path / "report" / "tables" / "ruler_scores.csv")
    single = scores[(scores["task"] == "niah_single") & (scores["eval_length"] == L)].iloc[0]
    assert single["match"] == 1.0 + 0.02 * 4.5 and single["exact"] == (1.0 + 0.02 * 4.5) / 2
    mean = scores[(scores["task"] == "average") & (scores["eval_length"] == 2 * L)].iloc[0]
    expected = sum(0.7 - 0.1 * i + 0.09 for i in range(len(RULER_TASKS))) / len(RULER_TASKS)
    assert abs(mean["match"] - expected) < 1e-9
    assert list(scores["task"].drop_duplicates()) == [*RULER_TASKS, "average"]
    eff = pd.read_csv(tmp_path / "report" / "tables" / "ruler_effective_length.csv")
    assert set(eff["median"]) == {L * 1.5} and set(eff["seed_min"]) == {L}
    assert "| 384 (256-512) |" in md
    assert "### Passkey beside them" in md
    assert "match: >= 0.856" in md  # the score each effective length reads, in its row label
    filler = pd.read_csv(tmp_path / "report" / "tables" / "ruler_filler_share.csv")
    share = filler.set_index(["task", "eval_length"])["filler_share"]
    assert share[("niah_single", L)] == 1 - 100 / L and share[("fwe", 2 * L)] == 1 - 220 / (2 * L)
    below = [f"{t} at {L}" for i, t in enumerate(RULER_TASKS) if 100 + 20 * i > L / 2]
    assert below and ("below half: " + ", ".join(below)) in md
    assert (tmp_path / "report" / "plots" / "ruler_scores.png").stat().st_size > 0
    assert "## Other metrics" not in md  # the task rows are not repeated as "other" metrics


def test_no_ruler_rows_no_section(tmp_path: Path) -> None:
    write_results([row()], tmp_path / "results" / "r.parquet")
    md = generate_report(tmp_path / "results", tmp_path / "report").read_text()
    assert "## RULER-style tasks" not in md


def test_kv_middle_by_depth_is_a_table_and_a_figure(tmp_path: Path) -> None:
    """kv_middle rows per depth give the lost-in-the-middle table (trials pooled over seeds) and
    figure; control: the suite's rows alone give neither."""
    rows = ruler_rows(4)
    common = dict(experiment="ruler", run_id="r4", model_id="m4", seed=4, train_length=L)
    for depth, (k0, k1) in {0.0: (20, 22), 0.5: (6, 8), 1.0: (18, 20)}.items():
        for seed_n, k in ((4, k0), (5, k1)):
            extra = {**common, "run_id": f"r{seed_n}", "model_id": f"m{seed_n}", "seed": seed_n}
            rows.append(row(metric="kv_middle", value=k / 24, n=24, eval_length=L, axis="depth",
                            axis_value=depth, task="kv_middle", task_params="{}", **extra))  # fmt: skip
    write_results(rows, tmp_path / "res" / "a.parquet")
    report = generate_report(tmp_path / "res", tmp_path / "rep").read_text()
    assert "### kv_middle by depth" in report
    t = pd.read_csv(tmp_path / "rep" / "tables" / "kv_middle_by_depth.csv")
    pooled = dict(zip(t["depth"], t["value"], strict=True))
    assert pooled == pytest.approx({0.0: 42 / 48, 0.5: 14 / 48, 1.0: 38 / 48})
    assert (tmp_path / "rep" / "plots" / "kv_middle_by_depth.svg").is_file()
    write_results(ruler_rows(4), tmp_path / "plain" / "a.parquet")
    plain = generate_report(tmp_path / "plain", tmp_path / "rep2").read_text()
    assert "kv_middle by depth" not in plain


def test_score_table_builds_only_the_observed_series(tmp_path: Path, monkeypatch) -> None:
    """Six series that differ in position, its parameters, scaling and model: the table's memory
    follows the rows, not every combination of the series keys' values (the pivot with
    dropna=False that built that product took 24 GB on a committed run of 13 series)."""
    import tracemalloc

    from bench.report.sections import ruler as section

    rows = []
    for k in range(6):
        for r in ruler_rows(4):
            r.update(model_id=f"m{k}", run_id=f"r{k}", position=f"p{k}", scaling=f"s{k}",
                     position_params={"base": k}, model_config_id=f"c{k}")  # fmt: skip
            rows.append(r)
    write_results(rows, tmp_path / "results" / "r.parquet")
    seen: list[pd.DataFrame] = []
    real = section.score_table
    monkeypatch.setattr(section, "score_table", lambda r: seen.append(r) or real(r))
    generate_report(tmp_path / "results", tmp_path / "report")
    scores = pd.read_csv(tmp_path / "report" / "tables" / "ruler_scores.csv")
    assert len(scores) == 6 * (len(RULER_TASKS) + 1) * 2

    def peak(fn) -> int:
        tracemalloc.start()
        fn()
        size = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return size

    keys = [*section.GROUP_KEYS, "task", "eval_length", "axis_value"]
    per_seed = seen[0][seen[0]["axis"] == "score"].assign(value=lambda d: d["value"].astype(float))
    new = peak(lambda: real(seen[0]))
    # control: the former pivot over all keys' value combinations allocates far more
    old = peak(lambda: per_seed.pivot_table(index=keys[:-1], columns="axis_value",
                                            values="value", dropna=False))  # fmt: skip
    assert new * 10 < old, (new, old)


def test_the_heuristic_baselines_are_the_text_guesses_and_at_chance():
    """Issue #73 item 7: the report's heuristic-baseline rows (every RULER report prints them)
    equal the independent text-only guesses (``fixtures.ruler.place_guesses``) on the same
    generated examples, k is the places each example names (qa3: less the asked one), and each
    heuristic is within 1/k + 0.05. Control: a table with one guess moved off differs."""
    n = 300
    t = heuristic_baselines(n).set_index("task")
    tok = ByteTokenizer()
    for task in ("qa1", "qa2", "qa3"):
        hits = {"last": 0, "first": 0, "random": 0.0}
        for i in range(n):
            rng = random.Random(f"lenbench-qa-baseline:{task}:{i}")
            e = make_ruler_example(task, 256, 0.5, rng=rng, params=RulerParams())
            g = place_guesses(tok.decode(e.prompt_ids))
            assert len(g["places"]) == t.loc[task, "k"]
            hits["last"] += g["last"] == e.answer_text
            hits["first"] += g["first"] == e.answer_text
            hits["random"] += (e.answer_text in g["places"]) / len(g["places"])
        for name, value in hits.items():
            assert abs(t.loc[task, name] - value / n) < 1e-12, (task, name)
            assert abs(t.loc[task, name] - (value + 1) / n) > 1e-12  # control
            assert t.loc[task, name] <= 1 / t.loc[task, "k"] + 0.05
        assert t.loc[task, "chance"] == 1 / t.loc[task, "k"]
    assert list(t["k"]) == [3, 3, 2]
    committed = pd.read_csv(
        Path(__file__).parents[3] / "reports" / "ruler" / "tables" / "ruler_heuristic_baselines.csv"
    )
    pd.testing.assert_frame_equal(committed, heuristic_baselines().reset_index(drop=True))
