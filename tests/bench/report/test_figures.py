"""Saved figures: an SVG saved from the same figure on another day is byte-identical, so a
regenerated report differs from the committed one only where its rows do."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.figure import Figure

from bench.report.figures import save_figure


def figure() -> Figure:
    fig = Figure(figsize=(2, 2))
    fig.subplots().plot([1, 2, 4], [0.5, 0.25, 0.1], "o-", label="rope")
    return fig


def test_svg_has_no_date_and_is_identical_across_days(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = []
    for day, epoch in enumerate(["1700000000", "1800000000"]):
        monkeypatch.setenv("SOURCE_DATE_EPOCH", epoch)  # matplotlib's date for SVG metadata
        (tmp_path / str(day)).mkdir()
        save_figure(figure(), tmp_path / str(day), "plot")
        saved.append((tmp_path / str(day) / "plot.svg").read_bytes())
    assert saved[0] == saved[1] and b"<dc:date>" not in saved[0]
    # control: matplotlib's default SVG metadata carries the day, so the two would differ
    dated = []
    for epoch in ["1700000000", "1800000000"]:
        monkeypatch.setenv("SOURCE_DATE_EPOCH", epoch)
        figure().savefig(tmp_path / f"dated{epoch}.svg")
        dated.append((tmp_path / f"dated{epoch}.svg").read_bytes())
    assert b"<dc:date>" in dated[0] and dated[0] != dated[1]
