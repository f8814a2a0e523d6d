"""Issue 76 item 1: ``lenbench -m`` launches only the cells that apply (hydra_plugins/
lenbench_sweeper). A cell that does not apply (a scaling its family has no use for, a position
outside its arm) is composed once, checked with its job's own test, recorded with the status its
job would have written and not launched; the rows, the statuses and the sweep's summary are
those of Hydra's basic sweeper, which launches every cell."""

from __future__ import annotations

import json

import pytest

from bench.cli import STATUS_FILE, main
from bench.core.results import load_results
from bench.job import not_applicable
from hydra_plugins.lenbench_sweeper.lenbench_sweeper import SKIPPED_DIR

from fixtures.jobs import compose_config

pytestmark = pytest.mark.usefixtures("one_thread")

SMOKE = ["+experiment=smoke", "hydra.callbacks.report.enabled=false"]  # 4 cells, 1 not applicable


def sweep_dir(results):
    (sweep,) = (results / "smoke" / ".hydra-sweeps").iterdir()
    return sweep


def launched_and_skipped(results) -> tuple[list[str], list[str]]:
    """The sweep's job dirs: launched (numbered, as Hydra names them) and skipped."""
    names = sorted(p.name for p in sweep_dir(results).iterdir() if p.is_dir())
    return [n for n in names if n.isdigit()], [n for n in names if n.startswith(SKIPPED_DIR)]


def statuses(results, paths: str) -> list[dict]:
    """The sweep's job statuses without what names this run's folders and times: the cell's
    overrides less ``paths``, and the skipped cells' statuses whole."""
    found = [json.loads(p.read_text()) for p in sweep_dir(results).glob(f"*/{STATUS_FILE}")]
    out = []
    for status in found:
        status["job"] = status["job"].replace(paths, "")
        if status["status"] != "not_applicable":  # its message names its file and seconds
            status = {k: status.get(k) for k in ("job", "status", "position", "scaling", "rows")}
        out.append(status)
    return sorted(out, key=lambda s: s["job"])


def rows(results):
    frame = load_results(results / "smoke").drop(columns=["written_at", "source_file"])
    frame = frame.astype(str)  # NaN, None and lists compare as text
    return frame.sort_values(list(frame.columns)).reset_index(drop=True)


def summary_line(out: str) -> str:
    (line,) = [line for line in out.splitlines() if line.startswith("lenbench: 4 jobs:")]
    return line


def test_only_the_cells_that_apply_are_launched_with_the_basic_sweepers_results(in_tmp, capsys):
    import pandas as pd

    # negative control: Hydra's basic sweeper launches the cell that does not apply as well
    assert main([*SMOKE, "hydra/sweeper=basic", "paths.results=basic", "paths.cache=c1"]) == 0
    basic = capsys.readouterr().out
    assert main([*SMOKE, "paths.results=ours", "paths.cache=c2"]) == 0
    ours = capsys.readouterr().out
    assert launched_and_skipped(in_tmp / "basic") == (["0", "1", "2", "3"], [])
    assert launched_and_skipped(in_tmp / "ours") == (["0", "1", "2"], [f"{SKIPPED_DIR}-0"])
    assert summary_line(ours) == summary_line(basic)
    assert "1 not applicable (skipped)" in summary_line(ours)
    ours_statuses = statuses(in_tmp / "ours", "paths.cache=c2,paths.results=ours,")
    assert ours_statuses == statuses(in_tmp / "basic", "paths.cache=c1,paths.results=basic,")
    assert [s["status"] for s in ours_statuses].count("not_applicable") == 1
    pd.testing.assert_frame_equal(rows(in_tmp / "ours"), rows(in_tmp / "basic"))


def test_not_applicable_is_the_jobs_own_decision():
    skipped = not_applicable(compose_config("position=learned", "scaling=yarn", hydra=True))
    assert skipped["status"] == "not_applicable" and skipped["message"].endswith("; skipped.")
    assert skipped["position"] == "learned" and skipped["scaling"] == "yarn"
    assert not_applicable(compose_config("position=rope", "scaling=yarn", hydra=True)) is None
    # a broken cell is launched: its job reports it (an invalid status, not a skip)
    assert not_applicable(compose_config("train.steps=-5", hydra=True)) is None
