"""``python -m bench.eval.rederive``: a run's effective_length rows re-derived from its own task rows
under the current rule; every other row unchanged."""

from __future__ import annotations

import json

import pandas as pd

from bench.core.results import write_results
from bench.core.rows import normalize_results
from bench.eval.metrics.ruler import RulerConfig, effective_length_rows
from bench.eval.rederive import main, rederived_effective_lengths

from fixtures.rows import row

L = 256


def run_rows(run: str, exact: tuple, match: tuple) -> list[dict]:
    common = dict(experiment="ruler", run_id=run, model_id=f"m-{run}", seed=4, train_length=L)
    rows = [row(metric="nll", value=2.0, n=100, eval_length=L, **common)]
    for score, values in (("exact", exact), ("match", match)):
        for length, v in zip((L, 2 * L, 4 * L), values, strict=True):
            rows.append(row(metric="vt", value=v, n=24, eval_length=length, axis="score",
                            axis_value=score, task="vt", task_params="{}", **common))  # fmt: skip
    # what the old rule stored: the match score only, with RULER's absolute threshold
    old = RulerConfig(enabled=True, score="match", threshold=0.856, reference_length=L)
    stored = [r for r in effective_length_rows(rows, old)
              if json.loads(r["task_params"])["score"] == "match"]  # fmt: skip
    return rows + [row(**{**common, **r}) for r in stored]


def test_rederive_replaces_effective_lengths_from_the_runs_task_rows(tmp_path):
    old = normalize_results(run_rows("a", (0.9, 0.5, 0.1), (0.9, 0.9, 0.1))
                            + run_rows("b", (0.8, 0.8, 0.8), (0.8, 0.8, 0.8)))  # fmt: skip
    new = rederived_effective_lengths(old)
    eff = new[new["metric"] == "effective_length"]
    params = [json.loads(p) for p in eff["task_params"]]
    got = {
        (r, p["score"], a): v
        for r, p, a, v in zip(eff["run_id"], params, eff["axis"], eff["value"], strict=True)
    }
    assert set(eff["axis"]) == {"relative_threshold"}  # the absolute 0.856 rows are gone
    assert got[("a", "exact", "relative_threshold")] == L  # 0.5 < 0.85 x 0.9 at 2L
    assert got[("a", "match", "relative_threshold")] == 2 * L
    # negative control: the old stored row read match, not exact
    before = old[(old["metric"] == "effective_length") & (old["axis"] == "relative_threshold")]
    assert set(before[before["run_id"] == "a"]["value"]) == {2 * L}
    assert got[("b", "exact", "relative_threshold")] == 4 * L
    assert (eff[eff["run_id"] == "b"]["model_id"] == "m-b").all()  # identity from its own run
    rest = ["run_id", "metric", "eval_length", "axis", "axis_value"]
    kept = new[new["metric"] != "effective_length"].sort_values(rest).reset_index(drop=True)
    was = old[old["metric"] != "effective_length"].sort_values(rest).reset_index(drop=True)
    pd.testing.assert_frame_equal(kept, was)
    # idempotent: the current rule's rows re-derive to themselves
    again = rederived_effective_lengths(new)
    pd.testing.assert_frame_equal(
        again.sort_values([*rest, "task_params"]).reset_index(drop=True),
        new.sort_values([*rest, "task_params"]).reset_index(drop=True),
    )
    # the command rewrites the file in place
    path = write_results(old, tmp_path / "run.parquet")
    assert main([str(tmp_path)]) == 0
    assert len(pd.read_parquet(path).query("metric == 'effective_length'")) == len(eff)


def test_loading_keeps_each_scores_effective_length(tmp_path):
    """One cell per score: load_results' newest-row-wins dedup kept one of the exact and match
    effective_length rows of a run (same metric, axis and threshold), so R2 saw one seed of
    three. Negative control: a rerun's row of the same score still replaces the older one."""
    from bench.core.results import load_results

    rows = rederived_effective_lengths(normalize_results(run_rows("a", (0.9, 0.5, 0.1),
                                                                  (0.9, 0.9, 0.1))))  # fmt: skip
    write_results(rows, tmp_path / "a.parquet")
    eff = load_results([tmp_path]).query("metric == 'effective_length'")
    assert len(eff) == len(rows.query("metric == 'effective_length'")) == 2 * 2  # vt, average
    newer = rows.query("metric == 'effective_length'").assign(
        run_id="a2", written_at=pd.Timestamp("2100-01-01", tz="UTC")
    )
    write_results(newer, tmp_path / "a2.parquet")
    both = load_results([tmp_path]).query("metric == 'effective_length'")
    assert len(both) == 4 and set(both["run_id"]) == {"a2"}


def test_a_folder_without_result_files_is_refused(tmp_path, capsys):
    """The results root (its files are one folder down) once re-derived '0 of 0 file(s)' and
    exited 0; now one sentence, exit 2. Control: the experiment folder itself runs."""
    import pytest

    experiment = tmp_path / "ruler"
    experiment.mkdir()
    write_results(normalize_results(run_rows("a", (0.9, 0.5, 0.1), (0.9, 0.9, 0.1))),
                  experiment / "a.parquet")  # fmt: skip
    with pytest.raises(SystemExit) as stop:
        main([str(tmp_path)])
    assert stop.value.code == 2 and "holds no result file" in capsys.readouterr().err
    assert main([str(experiment)]) == 0
    assert "of 1 file(s)" in capsys.readouterr().out
