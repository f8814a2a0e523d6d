"""A sweep job with ``eval.harness.tasks`` merges lm-eval's numbers into its result table."""

from __future__ import annotations

from bench.cli import main
from bench.core.results import load_results


def test_harness_tasks_in_a_sweep_job_land_in_the_results(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "+experiment=smoke",
            "hydra.sweeper.params.position=rope",
            "hydra.sweeper.params.scaling=none",
            "eval.harness.tasks=[lenbench_ppl_256]",
            "eval.harness.limit=1",
            f"paths.results={tmp_path / 'results'}",
            f"paths.reports={tmp_path / 'reports'}",
            f"paths.cache={tmp_path / 'cache'}",
            f"hydra.sweep.dir={tmp_path / 'multirun'}",
        ]
    )
    assert code == 0
    rows = load_results([tmp_path / "results"])
    harness = rows[rows.metric.str.startswith("harness/")]
    assert set(harness.metric) >= {"harness/lenbench_ppl_256/bits_per_byte"}
    assert (harness.eval_length == 256).all() and (harness.n == 1).all()
    # the native metrics are still there: the harness adds rows, it replaces nothing
    assert "nll" in set(rows.metric)
    bits = harness[harness.metric == "harness/lenbench_ppl_256/bits_per_byte"].value.iloc[0]
    assert 0 < bits < 9  # a byte model: at most log2(259) bits per byte untrained


def test_an_unknown_harness_task_is_refused_before_any_work(tmp_path, capsys):
    """The audit's case: eval.harness.tasks=[foo] trained and evaluated the model, then lm-eval
    refused the name with a traceback and nothing was written. Now the job check refuses it in one
    sentence, before training; lm-eval's own task (hellaswag) beside it passes, as do ours."""
    from types import SimpleNamespace

    import pytest

    from bench.job import _check_harness_tasks

    def resolved(*tasks):
        return SimpleNamespace(harness=SimpleNamespace(tasks=list(tasks)))

    _check_harness_tasks(resolved("lenbench_ppl_256", "lenbench_passkey"))  # ours: no index
    with pytest.raises(
        ValueError, match=r"names 'foo', neither a lenbench task .* nor one of lm-ev"
    ):
        _check_harness_tasks(resolved("hellaswag", "foo"))
    code = main(
        [
            "+experiment=smoke",
            "hydra.mode=RUN",
            "position=rope",
            "scaling=none",
            "eval.harness.tasks=[lenbench_ppl_256,foo]",
            f"paths.results={tmp_path / 'results'}",
            f"paths.cache={tmp_path / 'cache'}",
        ]
    )
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and "names 'foo'" in err[0]
    assert not (tmp_path / "cache").exists()  # nothing trained
