"""docs/conformance.md is current (issue #54 item 10): regenerating its rows (tests/conformance.py)
gives the committed page's rows (kind, name, oracle, inputs, tolerance, control; the measured
numbers differ by machine, so each is checked against its tolerance instead), every measured row
is within its tolerance with its control outside it, and every registered position family,
attention design and scaling method has exactly one row. Negative controls: a page missing a row,
or with a row's oracle edited, is stale."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest

from fixtures import ROOT

_spec = importlib.util.spec_from_file_location("conformance", ROOT / "tests" / "conformance.py")
conformance = importlib.util.module_from_spec(_spec)
sys.modules["conformance"] = conformance  # its dataclass looks its module up there
_spec.loader.exec_module(conformance)


def page_rows(text: str) -> tuple[set[tuple[str, ...]], dict[tuple[str, str], float]]:
    """(the rows without their numbers, measured diff by (kind, name)) of a page's text."""
    rows, diffs = set(), {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("|") and len(cells) == 8 and re.fullmatch(r"\d\.\de[+-]\d+", cells[4]):
            kind, name, oracle, inputs, diff, tol, control, _ = cells
            rows.add((kind, name, oracle, inputs, tol, control))
            diffs[(kind, name)] = float(diff)
        elif line.startswith("|") and len(cells) == 3 and cells[0] not in ("kind", "---"):
            rows.add(tuple(cells))
    return rows, diffs


def expected_rows(rows) -> set[tuple[str, ...]]:
    return page_rows(conformance.markdown(rows))[0]


@pytest.fixture(scope="module")
def fresh():
    return conformance.measure()


def test_every_measured_row_is_within_its_tolerance_and_its_control_outside(fresh):
    assert conformance.failures(fresh) == []
    assert sum(r.test == "" for r in fresh) >= 14


def test_the_committed_page_is_current(fresh):
    committed, diffs = page_rows(conformance.PAGE.read_text(encoding="utf-8"))
    assert committed == expected_rows(fresh), "stale: run python tests/conformance.py"
    tolerance = {(r.kind, r.name): r.tol for r in fresh if r.test == ""}
    assert diffs.keys() == tolerance.keys()
    assert all(diffs[k] <= tolerance[k] for k in diffs)


def test_every_registered_name_has_one_row(fresh):
    keys = [(r.kind, r.name) for r in fresh]
    assert len(keys) == len(set(keys))
    assert set(keys) == conformance.registered()
    assert all(r.test != "none" for r in fresh), [r.name for r in fresh if r.test == "none"]


def test_a_stale_page_is_caught(fresh):
    text = conformance.markdown(fresh)
    rows = expected_rows(fresh)
    dropped = "\n".join(line for line in text.splitlines() if "| alibi |" not in line)
    assert page_rows(dropped)[0] != rows
    edited = text.replace("`AlibiPositionalBias`", "`AlibiBias`")
    assert page_rows(edited)[0] != rows
