"""Tests for bench/report/ on synthetic, realistically shaped result tables (no torch)."""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench import report as report_mod
from bench.core.results import load_results, write_results
from bench.core.rows import canonical_json, normalize_results
from bench.report import generate_report, latest_experiment_dir, main

from fixtures import ROOT
from fixtures.synthetic import DEPTHS, EMPTY_CELL, EVAL_LENGTHS, POSITIONS, SEEDS, synthetic_rows

EXPECTED_PLOTS = [
    "ppl_vs_length",
    "extrapolation_ratio",
    "nll_by_bucket",
    "passkey_heatmap",
    "passkey_vs_length",
    "shift_dnll",
    "order_dnll",
    "attn_entropy",
    "context_nll",
    "position_probe_r2",
]


def write_sweep(directory: Path, rows: list[dict]) -> None:
    """One parquet file per (position, seed) job, as a sweep would write them."""
    df = pd.DataFrame(rows)
    for (pos, seed), g in df.groupby(["position", "seed"]):
        write_results(g, directory / f"{pos}-s{seed}.parquet")


STALE_TIME = pd.Timestamp("2020-01-01", tz="UTC")


@pytest.fixture(scope="module")
def full_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The whole sweep, plus a stale file from an earlier run of the rope/yarn jobs whose
    whole-window NLL values are 5 nats worse; it sorts last, so only the timestamp rule
    (not file order) can drop it."""
    root = tmp_path_factory.mktemp("full")
    results = root / "results" / "train_short_test_long"
    rows = synthetic_rows()
    write_sweep(results, rows)
    stale = pd.DataFrame(
        [r for r in rows if r["run_id"].startswith("rope-yarn") and r["metric"] == "nll"]
    )
    stale = stale[stale["bucket_lo"].isna()].assign(written_at=STALE_TIME)
    stale["value"] += 5.0
    write_results(stale, results / "zzz_stale_rope-yarn.parquet")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = generate_report([results], root / "out")
    (root / "warnings.txt").write_text("\n".join(str(w.message) for w in caught))
    return results, report


def test_plots_warn_about_nothing(full_report: tuple[Path, Path]) -> None:
    """E.g. a log x-axis with a point at 0 (context_nll's no-context point) must become symlog."""
    text = (full_report[1].parent.parent / "warnings.txt").read_text()
    assert "non-positive" not in text, text


def test_all_plots_written_nonempty(full_report: tuple[Path, Path]) -> None:
    _, report = full_report
    plots = report.parent / "plots"
    for name in EXPECTED_PLOTS:
        for ext in ("png", "svg"):
            f = plots / f"{name}.{ext}"
            assert f.is_file(), f"missing {f.name}"
            assert f.stat().st_size > 2000, f"{f.name} is suspiciously small"
        assert f"plots/{name}.png" in report.read_text()
    png = (plots / "ppl_vs_length.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert (plots / "ppl_vs_length.svg").read_text().lstrip().startswith(("<?xml", "<svg"))


def test_report_md_contents(full_report: tuple[Path, Path]) -> None:
    _, report = full_report
    text = report.read_text()
    assert text.startswith("# lenbench report: train_short_test_long")
    for needle in [
        "abc123",
        "pycorpus",
        "0.1.0+g1234",
        "yarn (beta_fast=32,beta_slow=1,factor=4)",
        "Passkey context",
        "Extrapolation ratio",
        "## Configuration",
    ]:
        assert needle in text, needle
    assert "Note: no" not in text  # every metric is present
    tables = report.parent / "tables"
    for name in [
        "perplexity",
        "extrapolation_ratio",
        "nll_by_bucket",
        "passkey_by_length",
        "passkey_by_depth",
        "passkey_context",
        "probe_shift_dnll",
        "probe_order_dnll",
        "probe_attn_entropy",
        "probe_attn_entropy_summary",
        "probe_context_nll",
        "probe_position_probe_r2",
    ]:
        assert (tables / f"{name}.csv").is_file(), name
        assert (tables / f"{name}.md").read_text().startswith("|"), name
    assert (tables / "source_rows.csv").is_file()


def _trace(tables: Path, table: pd.DataFrame, i: int) -> pd.DataFrame:
    source = pd.read_csv(tables / "source_rows.csv")
    ids = [int(x) for x in str(table.loc[i, "row_ids"]).split(";")]
    assert len(ids) == table.loc[i, "n_rows"]
    return source.set_index("row_id").loc[ids]


def test_perplexity_table_traces_to_source_rows(full_report: tuple[Path, Path]) -> None:
    _, report = full_report
    tables = report.parent / "tables"
    t = pd.read_csv(tables / "perplexity.csv")
    i = int(
        t.index[(t["position"] == "rope") & (t["scaling"] == "yarn") & (t["eval_length"] == 512)][0]
    )
    src = _trace(tables, t, i)
    # the rows it came from are exactly the whole-window nll rows of both seeds
    assert set(src["metric"]) == {"nll"} and src["bucket_lo"].isna().all()
    assert sorted(src["seed"]) == SEEDS and set(src["eval_length"]) == {512}
    assert set(src["position"]) == {"rope"} and set(src["scaling"]) == {"yarn"}
    expected = np.average(src["value"], weights=src["n"])
    assert t.loc[i, "nll"] == pytest.approx(expected, rel=1e-12)
    assert t.loc[i, "ppl"] == pytest.approx(math.exp(expected), rel=1e-12)
    # negative control: the table value is not simply one seed's value
    assert not np.isclose(t.loc[i, "nll"], src["value"].iloc[0])

    r = pd.read_csv(tables / "extrapolation_ratio.csv")
    j = int(
        r.index[(r["position"] == "rope") & (r["scaling"] == "yarn") & (r["eval_length"] == 512)][0]
    )
    base = t[(t["position"] == "rope") & (t["scaling"] == "yarn") & (t["eval_length"] == 64)][
        "ppl"
    ].iloc[0]
    assert r.loc[j, "ratio"] == pytest.approx(t.loc[i, "ppl"] / base)
    assert r.loc[j, "k"] == 8
    # an empty (NaN, n=0) whole-window row carries no weight: the other seed's value is used
    pos, scal, seed, ev = EMPTY_CELL
    j = int(t.index[(t["position"] == pos) & (t["scaling"] == scal) & (t["eval_length"] == ev)][0])
    src = _trace(tables, t, j)
    assert len(src) == 2 and src.loc[src["seed"] == seed, "value"].isna().all()
    other = src[src["seed"] != seed]
    assert t.loc[j, "nll"] == pytest.approx(float(other["value"].iloc[0]))  # not NaN
    # partial sweep: learned has only k = 1
    assert set(r[r["position"] == "learned"]["k"]) == {1}


def test_passkey_and_probe_tables_trace(full_report: tuple[Path, Path]) -> None:
    _, report = full_report
    tables = report.parent / "tables"
    t = pd.read_csv(tables / "passkey_by_length.csv")
    i = int(
        t.index[
            (t["position"] == "sinusoidal") & (t["scaling"] == "none") & (t["eval_length"] == 128)
        ][0]
    )
    src = _trace(tables, t, i)
    # the stored per-length rows (one per seed), not those plus the per-depth rows
    assert len(src) == len(SEEDS) and set(src["metric"]) == {"passkey_acc"}
    assert src["axis"].isna().all() and (src["eval_length"] == 128).all()
    assert t.loc[i, "passkey_acc"] == pytest.approx(np.average(src["value"], weights=src["n"]))
    d = pd.read_csv(tables / "passkey_by_depth.csv")
    d = d[(d["position"] == "sinusoidal") & (d["scaling"] == "none") & (d["eval_length"] == 128)]
    assert sorted(d["depth"]) == DEPTHS and (d["n_rows"] == len(SEEDS)).all()
    assert t.loc[i, "passkey_acc"] == pytest.approx(np.average(d["passkey_acc"], weights=d["n"]))

    ctx = pd.read_csv(tables / "passkey_context.csv").set_index(["position", "scaling"])
    # alibi degrades slowest: accuracy stays >= 0.8 to the longest length; learned only tested at 64
    acc = t.set_index(["position", "scaling", "eval_length"])["passkey_acc"]
    for (pos, scal), row in ctx.iterrows():
        good = [
            ev
            for ev in EVAL_LENGTHS
            if (pos, scal, ev) in acc.index and acc[(pos, scal, ev)] >= 0.8
        ]
        assert row["passkey_context"] == (max(good) if good else 0), (pos, scal)
    assert ctx.loc[("alibi", "none"), "passkey_context"] == 1024
    assert ctx.loc[("sinusoidal", "none"), "passkey_context"] == 64
    # the table shows the values the jobs stored (both seeds), with their threshold
    assert (ctx["threshold"].astype(str) == "0.8").all()
    c = pd.read_csv(tables / "passkey_context.csv")
    for j in range(len(c)):
        src = _trace(tables, c, j)
        assert set(src["metric"]) == {"passkey_context"} and sorted(src["seed"]) == SEEDS
        assert (src["value"] == c.loc[j, "passkey_context"]).all()

    e = pd.read_csv(tables / "probe_attn_entropy_summary.csv")
    k = int(
        e.index[(e["position"] == "rope") & (e["scaling"] == "none") & (e["region"] == "beyond")][0]
    )
    src = _trace(tables, e, k)
    assert set(src["layer"]) == {0, 1} and (src["bucket_lo"] >= 64).all()
    assert e.loc[k, "value"] == pytest.approx(np.average(src["value"], weights=src["n"]))


def test_missing_metrics_give_notes(tmp_path: Path) -> None:
    rows = [r for r in synthetic_rows(seeds=[0]) if r["metric"] == "nll" and "bucket_lo" not in r]
    write_sweep(tmp_path / "res", rows)
    report = generate_report(tmp_path / "res", tmp_path / "out")
    text = report.read_text()
    for metric in [
        "passkey_acc",
        "shift_dnll",
        "order_dnll",
        "attn_entropy",
        "context_nll",
        "position_probe_r2",
    ]:
        assert f"no `{metric}` rows in these results" in text, metric
    assert "no bucketed `nll` rows" in text
    assert "no `nll` rows" not in text  # negative control: nll is present
    assert (tmp_path / "out" / "plots" / "ppl_vs_length.png").is_file()
    assert not (tmp_path / "out" / "plots" / "passkey_heatmap.png").exists()


def test_report_uses_newest_rows(full_report: tuple[Path, Path]) -> None:
    results, report = full_report
    tables = report.parent / "tables"
    source = pd.read_csv(tables / "source_rows.csv")
    assert not source["written_at"].str.startswith("2020").any()
    t = pd.read_csv(tables / "perplexity.csv")
    fresh = load_results([results])
    sel = (fresh["position"] == "rope") & (fresh["scaling"] == "yarn") & (fresh["metric"] == "nll")
    sel &= fresh["bucket_lo"].isna() & (fresh["eval_length"] == 256)
    want = np.average(fresh.loc[sel, "value"], weights=fresh.loc[sel, "n"])
    got = t[(t["position"] == "rope") & (t["scaling"] == "yarn") & (t["eval_length"] == 256)]["nll"]
    assert got.tolist() == [pytest.approx(want)]
    # negative control: without dedup the stale rows are there and would shift the mean
    raw = load_results([results], dedup=False)
    rsel = (raw["position"] == "rope") & (raw["scaling"] == "yarn") & (raw["metric"] == "nll")
    rsel &= raw["bucket_lo"].isna() & (raw["eval_length"] == 256)
    assert rsel.sum() == 2 * sel.sum()  # both seeds have a stale duplicate
    assert np.average(raw.loc[rsel, "value"], weights=raw.loc[rsel, "n"]) > want + 1.0


def test_cli_explicit_dirs_and_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two result dirs without any nll rows: probe rows for rope, passkey rows for alibi."""
    rows = synthetic_rows(seeds=[0])
    a = [r for r in rows if r["metric"] == "position_probe_r2" and r["position"] == "rope"]
    b = [
        r
        for r in rows
        if r["metric"] in ("passkey_acc", "passkey_context") and r["position"] == "alibi"
    ]
    write_sweep(tmp_path / "a", a)
    write_sweep(tmp_path / "b", b)
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "rep")]) == 0
    out = tmp_path / "rep" / "report.md"
    assert out.is_file() and str(out) in capsys.readouterr().out
    text = out.read_text()
    assert "no `nll` rows in these results" in text
    assert "no `passkey_acc` rows" not in text and "no `position_probe_r2` rows" not in text
    for name in ("position_probe_r2", "passkey_heatmap", "passkey_vs_length"):
        assert (tmp_path / "rep" / "plots" / f"{name}.svg").stat().st_size > 2000
    assert not (tmp_path / "rep" / "plots" / "ppl_vs_length.png").exists()
    t = pd.read_csv(tmp_path / "rep" / "tables" / "passkey_context.csv")
    assert t["position"].tolist() == ["alibi"] * 3
    r2 = pd.read_csv(tmp_path / "rep" / "tables" / "probe_position_probe_r2.csv")
    assert set(r2["position"]) == {"rope"} and set(r2["region"]) == {"inside", "beyond"}


def test_cli_default_latest_experiment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [
        r
        for r in synthetic_rows(seeds=[0])
        if r["metric"] == "nll" and r["position"] == "rope" and "bucket_lo" not in r
    ]
    exp_a = [{**r, "experiment": "exp_a"} for r in rows]
    exp_b = [{**r, "experiment": "exp_b"} for r in rows]
    write_sweep(tmp_path / "results" / "exp_b", exp_b)
    write_sweep(tmp_path / "results" / "exp_a", exp_a)
    past = time.time() - 3600
    for p in (tmp_path / "results" / "exp_b").rglob("*"):
        os.utime(p, (past, past))
    os.utime(tmp_path / "results" / "exp_b", (past, past))
    for p in (tmp_path / "results" / "exp_a").rglob("*"):  # modified later -> the latest
        os.utime(p, None)
    monkeypatch.chdir(tmp_path)
    assert latest_experiment_dir() == Path("results") / "exp_a"
    assert main([]) == 0
    assert (tmp_path / "reports" / "exp_a" / "report.md").is_file()
    assert not (tmp_path / "reports" / "exp_b").exists()
    # negative control: make the other one newer and the choice follows
    for p in (tmp_path / "results" / "exp_b").rglob("*.parquet"):
        os.utime(p, (time.time() + 10, time.time() + 10))
    assert latest_experiment_dir() == Path("results") / "exp_b"


def test_passkey_context_comes_from_stored_rows(tmp_path: Path) -> None:
    """The report shows the stored passkey_context rows (it never recomputes them) and draws the
    threshold stored with them; rows written before the threshold was stored say so."""
    rows = [
        r
        for r in synthetic_rows(seeds=[0])
        if r["position"] == "rope" and r["scaling"] == "none" and r["metric"].startswith("passkey")
    ]
    acc = [r for r in rows if r["metric"] == "passkey_acc"]
    (stored,) = [r for r in rows if r["metric"] == "passkey_context"]
    assert stored["value"] == 64 and stored["axis_value"] == 0.8  # the accuracies' answer at 0.8

    def report(name: str, context_rows: list[dict]) -> tuple[str, str, Path]:
        write_sweep(tmp_path / name, acc + context_rows)
        out = generate_report(tmp_path / name, tmp_path / f"{name}_report")
        svg = (out.parent / "plots" / "passkey_vs_length.svg").read_text()
        return out.read_text(), svg, out.parent / "tables" / "passkey_context.csv"

    # a job that used threshold 0.6 stored 256: shown as stored, with a dotted line at 0.6
    text, svg, table = report(
        "t06", [{**stored, "value": 256.0, "eval_length": 256, "axis_value": 0.6}]
    )
    t = pd.read_csv(table)
    assert t["passkey_context"].tolist() == [256] and t["threshold"].tolist() == [0.6]
    assert "passkey-context threshold 0.6" in svg and "the dotted line is the 0.6 threshold" in text
    assert "Threshold: 0.6." in text and "threshold not recorded" not in text
    # negative control: the 0.8 of the earlier hard-coded threshold appears nowhere
    assert "passkey-context threshold 0.8" not in svg and "0.8 threshold" not in text

    # an older row without a threshold: its value, "threshold not recorded", no threshold line
    old = {k: v for k, v in stored.items() if k not in ("axis", "axis_value")}
    text, svg, table = report("old", [old])
    t = pd.read_csv(table)
    assert t["passkey_context"].tolist() == [64] and t["threshold"].tolist() == ["not recorded"]
    assert "threshold not recorded" in text and "passkey-context threshold" not in svg

    # seeds that disagree (mean, min, max) and two thresholds (one row each, no single line)
    seed1 = {**stored, "seed": 1, "run_id": "rope-none-s1", "value": 256.0, "eval_length": 256}
    loose = {**stored, "value": 512.0, "eval_length": 512, "axis_value": 0.6}
    text, svg, table = report("mixed", [stored, seed1, loose])
    t = pd.read_csv(table)
    assert t["threshold"].tolist() == [0.6, 0.8] and t["passkey_context"].tolist() == [512, 160]
    assert t["seed_min"].tolist() == [512, 64] and t["seed_max"].tolist() == [512, 256]
    assert "| seed_min | seed_max |" in text and "Threshold: 0.6, 0.8." in text
    assert "different thresholds (0.6, 0.8)" in text and "passkey-context threshold" not in svg

    # accuracies without stored passkey_context rows: a note instead of the table
    text, _, table = report("none", [])
    assert "no `passkey_context` rows in these results" in text and not table.exists()
    assert "no `passkey_acc` rows" not in text


def test_bad_paths_give_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope_dir"
    with pytest.raises(ValueError, match="nope_dir.*does not exist"):
        generate_report([missing], tmp_path / "out")
    with pytest.raises(SystemExit) as exc:
        main([str(missing)])
    assert exc.value.code == 2
    assert "nope_dir" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no .parquet result files found under .*empty"):
        generate_report([tmp_path / "empty"], tmp_path / "out")
    with pytest.raises(ValueError, match="results directory .* does not exist"):
        latest_experiment_dir(tmp_path / "no_results_here")


def test_check_with_out_is_refused_in_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--check`` writes nothing, so ``--check --out DIR`` (which ignored DIR) is refused with one
    sentence naming --out; controls: --check alone checks, --out alone writes the report there."""
    rows = [r for r in synthetic_rows(seeds=[0]) if r["metric"] == "position_probe_r2"]
    write_sweep(tmp_path / "res", rows)
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "res"), "--check", "--out", str(tmp_path / "rep")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"lenbench-report: error: --out '{tmp_path / 'rep'}' has no use with "
                          "--check, which writes nothing;"), err  # fmt: skip
    assert not (tmp_path / "rep").exists()
    assert main([str(tmp_path / "res"), "--check"]) in (0, 1, 3)
    assert main([str(tmp_path / "res"), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.md").is_file()


def test_markdown_table_helper() -> None:
    df = pd.DataFrame({"name": ["a|b", "c"], "x": [1.23456, float("nan")], "k": [1, 2]})
    md = report_mod.markdown_table(df).splitlines()
    assert md[0] == "| name | x | k |"
    assert md[1] == "|:---|---:|---:|"
    assert md[2] == "| a\\|b | 1.235 | 1 |"
    assert md[3] == "| c | – | 2 |"


def test_report_does_not_import_torch() -> None:
    import subprocess

    code = "import sys, bench.report, bench.core.results; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_python_m_bench_report_help() -> None:
    import subprocess

    run = subprocess.run(
        [sys.executable, "-m", "bench.report", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: lenbench-report") and "--out" in run.stdout


def test_perplexity_section_states_the_documents_per_run(tmp_path: Path) -> None:
    rows = [r for r in synthetic_rows(seeds=[0, 1]) if r["metric"] == "nll"]
    write_sweep(tmp_path / "res", rows)
    report = generate_report(tmp_path / "res", tmp_path / "out")
    t = pd.read_csv(tmp_path / "out" / "tables" / "perplexity.csv")
    assert set(t["docs"]) == {8}  # the whole-window rows' axis="docs", axis_value=8
    assert "| series | docs |" in (tmp_path / "out" / "tables" / "perplexity.md").read_text()
    assert "documents per run, 8 in every run" in report.read_text()
    # control: a run that read other documents shows both counts, and no single count is claimed
    for r in rows:
        if r["position"] == "alibi" and r["seed"] == 1 and r.get("axis") == "docs" and r["n"]:
            r["axis_value"] = 7
    write_sweep(tmp_path / "res2", rows)
    report = generate_report(tmp_path / "res2", tmp_path / "out2")
    t = pd.read_csv(tmp_path / "out2" / "tables" / "perplexity.csv")
    assert set(t.loc[t["position"] == "alibi", "docs"]) == {"7/8"}
    assert "in every run" not in report.read_text()


# --------------------------------------------------------------------------- figure layout
# The figures are small multiples: one panel per position family present, scalings as lines
# (one colour each, the same in every panel), seeds as a band. These tests read the figures the
# sections build (matplotlib objects), not the PNGs.


def _labelled(rows: list[dict]) -> tuple[pd.DataFrame, object]:
    from bench.core.rows import normalize_results
    from bench.report.figures import Style
    from bench.report.render import labelled_rows

    df = labelled_rows(normalize_results(rows))
    return df, Style(df)


def _panels(fig) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Panel title (family, before any " (" note) -> axes."""
    from bench.report.figures import panel_axes

    return {ax.get_title().split(" (")[0]: ax for ax in panel_axes(fig)}


def _data_lines(ax) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return {ln.get_label(): ln for ln in ax.get_lines() if ln.get_gid() != "marker"}


def _band(ax, label: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    """x, lower and upper bound of the band drawn for the line ``label``."""
    (band,) = [c for c in ax.collections if c.get_label() == f"_band {label}"]
    v = band.get_paths()[0].vertices
    xs = np.unique(v[:, 0])
    lo = np.array([v[v[:, 0] == x, 1].min() for x in xs])
    hi = np.array([v[v[:, 0] == x, 1].max() for x in xs])
    return xs, lo, hi


def _texts(fig) -> list[str]:  # type: ignore[no-untyped-def]
    from matplotlib.text import Text

    return [t.get_text() for t in fig.findobj(Text)]


def test_ppl_figure_has_one_panel_per_family_and_no_empty_panel() -> None:
    from bench.report.figures import has_data
    from bench.report.sections.nll import bucket_figure, ppl_figure

    rows = synthetic_rows(seeds=[0])
    df, style = _labelled(rows)
    fig, _ = ppl_figure(df, style)
    panels = _panels(fig)
    assert list(panels) == POSITIONS  # rope, sinusoidal, learned, alibi, nope in this order
    assert all(has_data(ax) for ax in panels.values())
    # scalings are lines with one colour each, the same in every panel; none = black
    colours: dict[str, set] = {}
    for ax in panels.values():
        for label, line in _data_lines(ax).items():
            colours.setdefault(label, set()).add(line.get_color())
    assert set(colours) == {"none (raw)", "linear", "yarn"}
    assert all(len(c) == 1 for c in colours.values())
    assert colours["none (raw)"] == {"black"}
    assert len(set().union(*colours.values())) == 3
    assert set(_data_lines(panels["rope"])) == {"none (raw)", "linear", "yarn"}
    # the bucket figure: one panel per family with rows, never a "no rows" placeholder
    fig, _ = bucket_figure(df, style)
    panels = _panels(fig)
    assert list(panels) == POSITIONS and all(has_data(ax) for ax in panels.values())
    assert not any("no rows" in t for t in _texts(fig))
    assert panels["rope"].get_title() == "rope (eval length 1024)"
    assert panels["learned"].get_title() == "learned (eval length 64)"  # its longest


def test_adding_a_family_adds_a_panel() -> None:
    from bench.report.figures import has_data
    from bench.report.sections.nll import ppl_figure

    rows = synthetic_rows(seeds=[0])
    only_rope = [r for r in rows if r["position"] == "rope"]
    fig, _ = ppl_figure(*_labelled(only_rope))
    assert list(_panels(fig)) == ["rope"]  # one family: one panel, no empty cells
    visible = [ax for ax in fig.axes if ax.axison]
    assert len(visible) == 1 and has_data(visible[0])
    fig, _ = ppl_figure(*_labelled([r for r in rows if r["position"] in ("rope", "alibi")]))
    assert list(_panels(fig)) == ["rope", "alibi"]
    assert len([ax for ax in fig.axes if ax.axison]) == 2


def test_several_seeds_draw_mean_and_a_band_that_brackets_it() -> None:
    from scipy import stats

    from bench.report.sections.nll import per_seed_nll, ppl_figure

    rows = [r for r in synthetic_rows(seeds=[0, 1, 2]) if r["position"] == "rope"]
    df, style = _labelled(rows)
    fig, caption = ppl_figure(df, style)
    assert "95% t-interval of the mean over 3 seeds" in caption
    ax = _panels(fig)["rope"]
    line = _data_lines(ax)["none (raw)"]
    x, y = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
    bx, lo, hi = _band(ax, "none (raw)")
    assert np.array_equal(bx, x)
    assert (lo < y).all() and (y < hi).all()
    # the numbers: exp of the mean per-seed NLL, t-interval of that mean
    per = per_seed_nll(df)
    per = per[(per["scaling"] == "none") & (per["eval_length"] == 256)]
    v = per["value"].to_numpy()
    assert len(v) == 3
    half = stats.t.ppf(0.975, 2) * v.std(ddof=1) / math.sqrt(3)
    i = int(np.flatnonzero(x == 256)[0])
    assert y[i] == pytest.approx(math.exp(v.mean()))
    assert (lo[i], hi[i]) == (
        pytest.approx(math.exp(v.mean() - half)),
        pytest.approx(math.exp(v.mean() + half)),
    )
    # negative control: one seed shows that run's stored bootstrap CI, not a seed interval
    fig, caption = ppl_figure(*_labelled([r for r in rows if r["seed"] == 0]))
    assert "bootstrap CI stored with the run" in caption and "t-interval" not in caption
    ax = _panels(fig)["rope"]
    y1 = np.asarray(_data_lines(ax)["none (raw)"].get_ydata(), float)
    _, lo1, hi1 = _band(ax, "none (raw)")
    one = [r for r in rows if r["seed"] == 0 and r["scaling"] == "none" and r["metric"] == "nll"]
    one = [r for r in one if "bucket_lo" not in r and r["eval_length"] == 256]
    assert y1[i] == pytest.approx(math.exp(one[0]["value"]))
    assert lo1[i] == pytest.approx(math.exp(one[0]["ci_lo"]))
    assert hi1[i] == pytest.approx(math.exp(one[0]["ci_hi"]))
    # ... and one seed without a stored CI draws no band at all
    bare = [{k: v for k, v in r.items() if k not in ("ci_lo", "ci_hi")} for r in rows]
    fig, caption = ppl_figure(*_labelled([r for r in bare if r["seed"] == 0]))
    assert not _panels(fig)["rope"].collections and "no interval" in caption


def test_seed_summary_band_kinds() -> None:
    from bench.report.frame import NO_BAND, RUN_BAND, SEED_BAND, seed_summary

    per = pd.DataFrame(
        {
            "k": ["a", "a", "a", "b", "c", "d", "d"],
            "seed": [0, 1, 2, 0, 0, 0, 1],
            "value": [1.0, 2.0, 3.0, 5.0, 7.0, 4.0, np.nan],  # d: the NaN seed measured nothing
            "ci_lo": [0.0, 0.0, 0.0, 4.5, np.nan, 3.0, np.nan],
            "ci_hi": [9.0, 9.0, 9.0, 5.5, np.nan, 5.0, np.nan],
        }
    )
    s = seed_summary(per, ["k"]).set_index("k")
    assert s.loc["a", "value"] == 2.0 and s.loc["a", "band"] == SEED_BAND
    half = 4.302652729911275 * 1.0 / math.sqrt(3)  # t(0.975, 2) * sd / sqrt(n)
    assert s.loc["a", "lo"] == pytest.approx(2.0 - half) and s.loc["a", "hi"] == pytest.approx(
        2.0 + half
    )
    assert (s.loc["b", "lo"], s.loc["b", "hi"], s.loc["b", "band"]) == (4.5, 5.5, RUN_BAND)
    assert np.isnan(s.loc["c", "lo"]) and s.loc["c", "band"] == NO_BAND
    assert s.loc["d", "n_seeds"] == 1 and s.loc["d", "band"] == RUN_BAND


def _passkey_rows(zero: tuple[str, str] = ("sinusoidal", "none"), keep: float = 0.0) -> list[dict]:
    """The synthetic passkey rows (2 seeds), with every accuracy of ``zero`` set to 0 except the
    depth-0 cell at the longest length, set to ``keep``."""
    rows = [r for r in synthetic_rows(seeds=[0, 1]) if r["metric"].startswith("passkey")]
    for r in rows:
        if (r["position"], r["scaling"]) == zero and r["metric"] == "passkey_acc":
            hit = r.get("axis_value") == 0.0 and r["eval_length"] == 1024
            r["value"] = keep if hit else 0.0
    return rows


def test_passkey_heatmap_only_for_models_with_signal(tmp_path: Path) -> None:
    from bench.report.figures import has_data
    from bench.report.sections.passkey import (
        accuracy_by_depth,
        heatmap_figure,
        passkey_figure,
    )

    df, style = _labelled(_passkey_rows())
    acc = df[df["metric"] == "passkey_acc"]
    fig, dropped = heatmap_figure(accuracy_by_depth(acc))
    titles = [ax.get_title() for ax in fig.axes if ax.axison and ax.get_title()]
    assert dropped == ["sinusoidal / none"]
    assert "sinusoidal / none (raw)" not in titles and "rope / none (raw)" in titles
    assert len(titles) == 3 * len(POSITIONS) - 1
    assert all(ax.get_images() for ax in fig.axes if ax.axison and ax.get_title())
    # the compact summary still shows it: one panel per family, its line flat at 0
    fig, caption = passkey_figure(acc, style, 0.8)
    panels = _panels(fig)
    assert list(panels) == POSITIONS and all(has_data(ax) for ax in panels.values())
    flat = _data_lines(panels["sinusoidal"])["none (raw)"]
    assert (np.asarray(flat.get_ydata(), float) == 0).all()
    assert "95% t-interval of the mean over 2 seeds" in caption
    # negative control: one depth x length cell with some retrieval brings its panel back
    df2, _ = _labelled(_passkey_rows(keep=0.3))
    fig, dropped = heatmap_figure(accuracy_by_depth(df2[df2["metric"] == "passkey_acc"]))
    assert dropped == [] and "sinusoidal / none (raw)" in [ax.get_title() for ax in fig.axes]
    # the report says which models have no heatmap and shows the summary figure
    write_sweep(tmp_path / "res", _passkey_rows())
    text = generate_report(tmp_path / "res", tmp_path / "out").read_text()
    assert "No heatmap for 1 model(s)" in text and "`sinusoidal / none`" in text
    assert "plots/passkey_vs_length.png" in text and "plots/passkey_heatmap.png" in text


def test_all_zero_passkey_gives_no_heatmap(tmp_path: Path) -> None:
    rows = [r for r in synthetic_rows(seeds=[0]) if r["metric"] == "passkey_acc"]
    rows = [{**r, "value": 0.0} for r in rows if r["position"] == "rope"]
    write_sweep(tmp_path / "res", rows)
    text = generate_report(tmp_path / "res", tmp_path / "out").read_text()
    assert not (tmp_path / "out" / "plots" / "passkey_heatmap.png").exists()
    assert "depth x length heatmap is omitted" in text
    assert (tmp_path / "out" / "plots" / "passkey_vs_length.png").is_file()


def test_finetuned_models_are_their_own_lines_in_the_rope_panel() -> None:
    from bench.report.sections.nll import ppl_figure
    from bench.report.sections.passkey import passkey_figure

    rows = [r for r in synthetic_rows(seeds=[0]) if r["position"] in ("rope", "alibi")]
    tuned = [
        {**r, "scaling": "pi", "scaling_params": canonical_json({"factor": 4}),
         "model_id": r["model_id"] + "-pi", "finetune_method": "pi", "finetune_length": 256,
         "finetune_steps": 50, "parent_model_id": r["model_id"]}
        for r in rows
        if r["position"] == "rope" and r["scaling"] == "none"
    ]  # fmt: skip
    df, style = _labelled(rows + tuned)
    fig, _ = ppl_figure(df, style)
    panels = _panels(fig)
    assert list(panels) == ["rope", "alibi"]
    rope = _data_lines(panels["rope"])
    assert "pi (fine-tuned at 4x)" in rope and "linear (zero-shot)" in rope
    assert "pi (fine-tuned at 4x)" not in _data_lines(panels["alibi"])
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "pi (fine-tuned at 4x)" in legend and "none (raw)" in legend
    colours = {lab: ln.get_color() for lab, ln in rope.items()}
    assert len(set(colours.values())) == len(colours)  # its own colour
    fig, _ = passkey_figure(df[df["metric"] == "passkey_acc"], style)
    assert "pi (fine-tuned at 4x)" in _data_lines(_panels(fig)["rope"])


def test_rows_of_different_arms_are_not_pooled() -> None:
    from bench.report.sections.nll import ppl_figure

    rows = [
        r for r in synthetic_rows(seeds=[0]) if r["position"] == "rope" and r["scaling"] == "none"
    ]
    both = [{**r, "arm": "lm"} for r in rows] + [
        {**r, "arm": "retrieval", "model_id": r["model_id"] + "-r"} for r in rows
    ]
    df, style = _labelled(both)
    assert set(df["series"]) == {"rope / none [arm lm]", "rope / none [arm retrieval]"}
    fig, _ = ppl_figure(df, style)
    assert set(_data_lines(_panels(fig)["rope"])) == {
        "none (raw) [arm lm]",
        "none (raw) [arm retrieval]",
    }
    # control: one arm only keeps the plain labels
    df, _ = _labelled([{**r, "arm": "lm"} for r in rows])
    assert set(df["series"]) == {"rope / none"}


def test_report_figures_have_no_empty_panels(full_report: tuple[Path, Path]) -> None:
    """The full report's SVGs: no "no rows" placeholder, one titled panel per family."""
    _, report = full_report
    plots = report.parent / "plots"
    for name in ("ppl_vs_length", "nll_by_bucket", "passkey_vs_length", "shift_dnll"):
        svg = (plots / f"{name}.svg").read_text()
        assert "no rows" not in svg, name
        for family in POSITIONS:
            assert f">{family}" in svg, (name, family)
    text = report.read_text()
    assert "95% t-interval of the mean over 2 seeds" in text


def test_configuration_lists_only_measured_eval_lengths() -> None:
    """passkey_context (and harness) rows carry eval_length 0: not an eval length."""
    from bench.report.sections.config import config_section

    base = {
        "experiment": "e", "run_id": "r", "model_id": "m", "position": "rope",
        "position_params": "{}", "scaling": "none", "scaling_params": "{}", "train_length": 64,
        "seed": 0, "corpus": "c", "corpus_fingerprint": "f", "code_version": "v", "n": 1,
    }  # fmt: skip
    df = normalize_results(
        [
            {**base, "eval_length": 64, "metric": "passkey_acc", "value": 1.0},
            {**base, "eval_length": 0, "metric": "passkey_context", "value": 64.0},
        ]
    ).assign(source_file="x.parquet")
    line = next(x for x in config_section(df, ["x"]).splitlines() if "eval lengths" in x)
    assert line.replace(" ", "").endswith("|64|"), line
