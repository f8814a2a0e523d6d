"""The LongPPL section: LongPPL beside the same series' perplexity, pooled over runs by key
tokens, with the evaluator; no section without longppl rows."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from bench.core.results import write_results
from bench.report import generate_report

from fixtures.rows import row


def rows_of(seed: int, longppl: float, keys: int) -> list[dict]:
    common = dict(run_id=f"r{seed}", model_id=f"m{seed}", seed=seed)
    params = '{"evaluator":"abcdef0123456789","alpha":2,"beta":-2}'
    return [
        row(metric="nll", value=math.log(50.0), n=1000, eval_length=128, **common),
        row(metric="longppl", value=longppl, n=keys, eval_length=128, task_params=params, **common),
    ]


def test_longppl_section_pools_by_key_tokens_beside_perplexity(tmp_path: Path) -> None:
    write_results(rows_of(0, 100.0, 10) + rows_of(1, 400.0, 30), tmp_path / "res" / "a.parquet")
    report = generate_report(tmp_path / "res", tmp_path / "rep").read_text()
    assert "## LongPPL beside perplexity" in report
    t = pd.read_csv(tmp_path / "rep" / "tables" / "longppl.csv")
    expected = math.exp((10 * math.log(100.0) + 30 * math.log(400.0)) / 40)
    assert len(t) == 1 and math.isclose(t["longppl"].iloc[0], expected, rel_tol=1e-9)
    assert math.isclose(t["ppl"].iloc[0], 50.0, rel_tol=1e-9) and t["n"].iloc[0] == 40
    assert t["evaluator"].iloc[0] == "abcdef0123456789"
    assert (tmp_path / "rep" / "plots" / "longppl_vs_length.svg").is_file()
    assert "| longppl |" not in report  # not in "Other metrics" as well
    # control: the plain mean of the two runs' LongPPL (what a per-run average gives) differs
    assert not math.isclose(expected, 250.0, rel_tol=1e-3)


def test_no_longppl_rows_no_section(tmp_path: Path) -> None:
    write_results([row()], tmp_path / "res" / "a.parquet")
    report = generate_report(tmp_path / "res", tmp_path / "rep").read_text()
    assert "LongPPL" not in report


def series_colors(tmp_path: Path, monkeypatch, n: int) -> list[str]:
    """The colours of the LongPPL lines (solid) of a report with ``n`` series (bases 1e4, 2e4, ..)."""
    from matplotlib.colors import to_hex

    import bench.report.sections.longppl as section

    figures = []
    monkeypatch.setattr(section, "save_figure", lambda fig, *a: figures.append(fig))
    rows = []
    for i in range(n):
        params = {"position_params": {"base": 10000.0 * (i + 1)}, "model_config_id": f"c{i}"}
        rows += [{**r, **params} for r in rows_of(0, 100.0 + i, 10)]
    write_results(rows, tmp_path / "res" / "a.parquet")
    generate_report(tmp_path / "res", tmp_path / "rep")
    (ax,) = figures[0].axes
    solid = [line for line in ax.get_lines() if line.get_linestyle() == "-"]
    assert len(solid) == n
    return [to_hex(line.get_color()) for line in solid]


def test_eleven_series_get_eleven_colours(tmp_path: Path, monkeypatch) -> None:
    """More series than tab10 has colours: none shares one (the plot cycled 10 colours, so the
    11th series was drawn in the 1st's); up to 10, tab10's colours as before."""
    from matplotlib import colormaps

    import bench.report.sections.longppl as section
    from bench.report.figures import line_colors

    assert len(set(series_colors(tmp_path / "a", monkeypatch, 11))) == 11
    assert line_colors(10) == list(colormaps["tab10"].colors)
    # control: with 10 colours cycled (the former palette) the same check finds a repeat
    monkeypatch.setattr(section, "line_colors", lambda n: [f"C{i % 10}" for i in range(n)])
    assert len(set(series_colors(tmp_path / "b", monkeypatch, 11))) == 10
