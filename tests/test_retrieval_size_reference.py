"""The passkey arm at twice the width (results/retrieval_size; issue #73 item 3): the table
"Would a larger size?" in reports/leaderboard/README.md is what the committed rows give, the
width-128 cells from results/retrieval_size and the width-64 cells from results/leaderboard (to
the digits printed; a changed digit or update count fails)."""

from __future__ import annotations

import pandas as pd
import pytest

from bench import findings as F
from bench.core.series import SWITCH_COLUMNS

from fixtures import ROOT
from fixtures.markdown import agrees, markdown_table
from fixtures.reports import committed_rows

RESULTS = ROOT / "results" / "retrieval_size"
LEADERBOARD = ROOT / "results" / "leaderboard"
README = ROOT / "reports" / "leaderboard" / "README.md"
HEADER = "| family, seed | width 64 (committed): at L (updates) |"
#: the table's labels -> (position, attention design or None, seed)
SERIES = {
    "fox, 5": ("fox", None, 5),
    "kerple_log, 5": ("kerple_log", None, 5),
    "sinusoidal, 4": ("sinusoidal", None, 4),
    "kerple_power, 4": ("kerple_power", None, 4),
    "learned, 6": ("learned", None, 6),
    "nope stick-breaking, 4": ("nope", "stick_breaking", 4),
    "rope, 4 (control)": ("rope", None, 4),
}

pytestmark = pytest.mark.skipif(
    not any(RESULTS.glob("*.parquet")), reason="no committed retrieval_size rows"
)


def raw_passkey(df: pd.DataFrame, position: str, design: str | None, seed: int) -> pd.DataFrame:
    """The raw base model's passkey rows of one family, design and seed (no other switch)."""
    rows = F.select(df, position)
    rows = rows[(rows["metric"] == "passkey_acc") & (rows["seed"] == seed)]
    for column in SWITCH_COLUMNS:
        if column in rows.columns:
            want = design if column == "attention" else None
            rows = rows[rows[column].isna()] if want is None else rows[rows[column] == want]
    assert len(rows) > 0, (position, design, seed)
    return rows


def cell(rows: pd.DataFrame, lengths: list[int]) -> tuple[list[float], int]:
    """Passkey accuracy at each length (its template row: all 80 examples) and the updates
    trained."""
    (steps,) = rows["train_steps"].unique()
    whole = rows[rows["axis"] == "template"].set_index("eval_length")["value"]
    assert whole.index.is_unique, "one template row per length"
    return [float(whole[n]) for n in lengths], int(steps)


def parse(text: str) -> tuple[list[str], int]:
    """'1.00, 0.29, 0.00 (1250)' -> (['1.00', '0.29', '0.00'], 1250)."""
    values, steps = text.rsplit(" (", 1)
    return values.split(", "), int(steps.rstrip(")"))


def test_the_larger_size_table_is_the_rows():
    table = markdown_table(README.read_text(encoding="utf-8"), HEADER)
    assert set(table) == set(SERIES)
    wide = committed_rows(RESULTS)
    narrow = committed_rows(LEADERBOARD)
    narrow = narrow[narrow["arm"] == "retrieval_leaderboard"]
    # one recipe, the arm's, but not the committed width-64 block's
    assert (wide["arm"] == "retrieval_leaderboard").all() and wide["recipe"].nunique() == 1
    assert not set(wide["recipe"]) & set(narrow["recipe"])
    checked = 0
    for label, (position, design, seed) in SERIES.items():
        at_l, wide_cells = table[label][0], table[label][1]
        printed, steps = parse(at_l)
        values, trained = cell(raw_passkey(narrow, position, design, seed), [256])
        assert trained == steps and agrees(printed[0], values[0]), label
        printed, steps = parse(wide_cells)
        values, trained = cell(raw_passkey(wide, position, design, seed), [256, 512, 1024])
        assert trained == steps, label
        assert all(agrees(p, v) for p, v in zip(printed, values, strict=True)), label
        checked += 4
    assert checked == 4 * len(SERIES)


def test_a_changed_digit_fails():
    """Negative control: the check rejects a cell one unit off in its last digit."""
    wide = committed_rows(RESULTS)
    (value,), _ = cell(raw_passkey(wide, "fox", None, 5), [256])
    assert agrees(f"{value:.2f}", value) and not agrees(f"{value - 0.01:.2f}", value)
