"""The RULER study's committed reference (results/ruler, reports/ruler).

As tests/test_training_free_reference.py does for its study: the Findings computed from the
committed rows equal the committed table, reports/ruler/README.md states each status, its
calibration table (every task's exact accuracy at L per seed, the issue's "above chance at L on
every documented seed") and its per-method table are the numbers the rows give (to the digits
printed; a changed digit fails), and regenerating the report reproduces every committed table.
"""

from __future__ import annotations

import pytest

from bench import findings as F
from bench.core.results import effective_length_score
from bench.findings import NOT_MEASURED, wilson
from bench.report.render import labelled_rows
from bench.report.sections.ruler import ruler_rows, score_table
from bench.tasks.ruler import default_ruler_tasks

from fixtures import ROOT
from fixtures.markdown import agrees, markdown_table
from fixtures.reports import (
    ESTIMATE,
    assert_committed_findings,
    assert_report_regenerates,
    changed_digit,
    committed_rows,
)

RULER_TASKS = default_ruler_tasks()  # RULER's suite: the tasks these rows have

RESULTS = ROOT / "results" / "ruler"
REPORT = ROOT / "reports" / "ruler"
NUMBERS = REPORT / "README.md"
SEEDS = (4, 5, 6)
#: the zero-shot methods of +experiment=ruler, and its two fine-tunes (at 4L)
METHODS = ("none", "linear", "ntk", "yarn", "self_extend")
TUNED = ("pi", "yarn")

pytestmark = pytest.mark.skipif(
    not any(RESULTS.glob("*.parquet")), reason="no committed RULER reference results"
)


def test_the_committed_findings_are_what_the_rows_give():
    df = committed_rows(RESULTS)
    status = assert_committed_findings(df, REPORT, ("R1", "R2"))
    assert status["R1"] != NOT_MEASURED, status
    assert set(df["seed"]) == set(SEEDS)
    assert set(df["scaling"]) >= set(METHODS)
    assert set(F.col(df, "finetune_method").dropna()) == set(TUNED)


def _cell_agrees(cell: str, k: float, n: float) -> None:
    """``cell`` is "acc [lo, hi]" of k successes in n trials (Wilson), and a changed digit of
    the accuracy is not."""
    ((value, lo, hi),) = ESTIMATE.findall(cell)
    (wlo, whi) = wilson(k, n)
    for printed, v in ((value, k / n), (lo, wlo), (hi, whi)):
        assert agrees(printed, v), (cell, printed, v)
    assert not agrees(changed_digit(value), k / n), cell


def test_the_calibration_table_is_the_base_models_rows_at_L():
    """ "| task | chance | seed 4 | seed 5 | seed 6 |": each task's exact accuracy at L of the raw
    base model of each seed with its Wilson interval; passkey over its 40 examples."""
    df = committed_rows(RESULTS)
    table = markdown_table(NUMBERS.read_text(encoding="utf-8"), "| task | chance | seed 4 |")
    assert set(table) == {*RULER_TASKS, "passkey"}
    raw = F.at(F.select(df, "rope", "none"), 1)
    for task, cells in table.items():
        if task == "passkey":
            trials = F.trials(F.passkey(raw)).set_index("seed")
        else:
            rows = raw[raw["metric"] != "effective_length"]
            r = rows[(F.col(rows, "task") == task) & (rows["axis"] == "score")]
            trials = F.trials(r[r["axis_value"] == "exact"]).set_index("seed")
        for seed, cell in zip(SEEDS, cells[1:], strict=True):
            _cell_agrees(cell, trials.loc[seed, "k"], trials.loc[seed, "n"])


def test_the_per_method_table_is_the_score_table():
    """ "| method | L | 2L | 4L | effective length, exact | effective length, match |": the tasks'
    mean exact score (seed mean, the report's ``average``) per method at each length, and the
    stored relative-threshold effective length of the tasks' mean on each score (median over
    seeds, then each seed's); a fine-tune after its last update."""
    df = labelled_rows(committed_rows(RESULTS))
    table = markdown_table(NUMBERS.read_text(encoding="utf-8"), "| method | L | 2L | 4L |")
    assert set(table) == {*METHODS, *(f"{m} fine-tuned" for m in TUNED)}
    for method, cells in table.items():
        if method.endswith(" fine-tuned"):
            rows = F.select(df, "rope", None, tuned=method.removesuffix(" fine-tuned"))
            rows = rows[rows["finetune_steps"] == rows["finetune_steps"].max()]
        else:
            rows = F.select(df, "rope", method)
        rows = ruler_rows(rows)
        assert rows["_series"].nunique() == 1, method
        scores = score_table(rows)
        mean = scores[scores["task"] == "average"].set_index("eval_length")["exact"]
        lengths = sorted(mean.index)
        assert len(lengths) == 3, (method, lengths)
        for printed, length in zip(cells[:3], lengths, strict=True):
            assert agrees(printed, mean[length]), (method, length, printed, mean[length])
        assert not agrees(changed_digit(cells[0]), mean[lengths[0]]), method
        for cell, score in zip(cells[3:], ("exact", "match"), strict=True):
            eff = _relative_effective_lengths(rows, score)
            assert eff["seed"].nunique() == len(SEEDS), (method, score)
            median, per_seed = cell.split(" ", 1)
            assert float(median) == float(eff["value"].median()), (method, score)
            stored = eff.sort_values("seed")["value"].astype(int).tolist()
            assert per_seed == "(" + ", ".join(map(str, stored)) + ")", (method, score)


def _relative_effective_lengths(rows, score: str):
    """The stored effective-length rows of the tasks' mean at the relative threshold, on
    ``score`` (exact or match)."""
    eff = rows[
        (rows["metric"] == "effective_length")
        & (rows["task"] == "average")
        & (rows["axis"] == "relative_threshold")
    ]
    return eff[[effective_length_score(p) == score for p in eff["task_params"]]]


def test_regenerating_the_report_reproduces_every_committed_table(tmp_path, monkeypatch):
    assert_report_regenerates("ruler", tmp_path, monkeypatch)


# --------------------------------------------- the fine-tunes run on to 800 updates (README)

#: PI's and YaRN's fine-tunes of seeds 4 and 5 at 4L, run on to 800 updates (their rows)
LONG_RESULTS = ROOT / "results" / "ruler_finetune_long"
LONG_HEADER = "| seed, fine-tune, updates of run |"
#: how the README names the fine-tunes
TUNED_NAMES = {"PI": "pi", "YaRN": "yarn"}


def _per_seed_cells(rows, seed: int) -> list[str]:
    """One seed's fine-tune rows at one update count as the README prints them: the tasks' mean
    exact score at L, 2L, 4L, the relative-threshold effective length of that mean on the exact
    and on the match score, and passkey accuracy at L / 2L / 4L."""
    rows = rows[rows["seed"] == seed]
    ruler = ruler_rows(rows)
    scores = score_table(ruler)
    mean = scores[scores["task"] == "average"].set_index("eval_length")["exact"].sort_index()
    assert len(mean) == 3, mean
    (exact,) = _relative_effective_lengths(ruler, "exact")["value"].astype(int)
    (match,) = _relative_effective_lengths(ruler, "match")["value"].astype(int)
    passkey = F.passkey(rows)
    accs = [float(F.trials(F.at(passkey, k))["acc"].iloc[0]) for k in (1, 2, 4)]
    return [*(f"{v:.2f}" for v in mean), f"{exact} / {match}", " / ".join(f"{a:.2f}" for a in accs)]


def check_long_fine_tunes(text: str) -> int:
    """ "| seed, fine-tune, updates of run | L | 2L | 4L | effective length | passkey ... |": a
    row per seed, method and update count k of the run on to 800 updates
    (results/ruler_finetune_long, the former task text's models; the former reference's own
    200-update fine-tunes left results/ruler with the compact text's regeneration)."""
    table = markdown_table(text, LONG_HEADER)
    sources = {800: LONG_RESULTS}
    sources = {run: labelled_rows(committed_rows(path)) for run, path in sources.items()}
    checked = 0
    for label, cells in table.items():
        seed, method, counts = (part.strip() for part in label.split(","))
        updates, run = (int(x) for x in counts.split(" of "))
        rows = F.select(sources[run], "rope", None, tuned=TUNED_NAMES[method])
        rows = rows[rows["finetune_steps"] == updates]
        expected = _per_seed_cells(rows, int(seed))
        for printed, value in zip(cells, expected, strict=True):
            assert printed == value, (label, printed, value)
        checked += len(expected)
    assert checked == 5 * 2 * 2 * 3, checked  # seeds 4, 5 x PI, YaRN x 200, 400, 800 of 800
    return checked


def test_the_long_fine_tune_table_is_their_rows():
    assert check_long_fine_tunes(NUMBERS.read_text(encoding="utf-8")) > 0


@pytest.mark.parametrize("row", [0, 7])
def test_the_long_fine_tune_check_fails_on_a_changed_cell(row):
    text = NUMBERS.read_text(encoding="utf-8")
    start = text.index(LONG_HEADER)
    lines = text[start:].splitlines()
    line = lines[2 + row]
    cells = line.split("|")
    cells[2] = f" {changed_digit(cells[2].strip())} "
    with pytest.raises(AssertionError):
        check_long_fine_tunes(text.replace(line, "|".join(cells), 1))
