"""The leaderboard table and report (issue #56 items 2, 4, 6): the rules on hand-built rows, recipes
never ranked together, the committed report regenerated identically from the committed rows, and a
changed-cell control (a row edited in a copy changes the rank it should, and only that series'
effective length)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from bench.core.results import load_results
from bench.report.cli import main as report_main
from bench.report.leaderboard import leaderboard_table
from bench.report.leaderboard_report import display_table, write_leaderboard

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = ROOT / "reports" / "leaderboard"
#: what reports/leaderboard is generated from (its README says so)
SOURCES = [
    "results/leaderboard", "results/zoo", "results/zoo_2025", "results/training_free",
    "results/ruler",
]  # fmt: skip


def _nll_row(seed: int, length: int, ppl: float, **extra) -> dict:
    base = {
        "experiment": "hand", "arm": "lm", "position": "rope", "position_params": "{}",
        "scaling": "none", "scaling_params": "{}", "train_length": 64, "eval_length": length,
        "metric": "nll", "value": math.log(ppl), "n": 1000, "seed": seed, "corpus": "c",
        "corpus_fingerprint": "f", "model_config_id": "m", "run_id": f"r{seed}",
    }  # fmt: skip
    return {**base, **extra}


def test_effective_lengths_follow_the_rules_on_hand_built_rows():
    """Seed 1 stays within 1.1 x its perplexity at L up to 2L, seed 2 up to 4L: effective lengths
    128 and 256, mean log2 ratio 1.5 -> 64 x 2^1.5 = 181 tokens; a series flat nowhere past L
    ranks below it once their intervals are apart."""
    rows = []
    for seed, ppls in ((1, (10.0, 10.5, 12.0)), (2, (10.0, 10.9, 10.95))):
        rows += [_nll_row(seed, x, p) for x, p in zip((64, 128, 256), ppls, strict=True)]
    for seed in (1, 2):  # another method of the same recipe: breaks at 2L on both seeds
        rows += [
            _nll_row(seed, x, p, scaling="ntk") for x, p in ((64, 10.0), (128, 20.0), (256, 30.0))
        ]
    table = leaderboard_table(pd.DataFrame(rows)).set_index("method")
    assert table.loc["none", "ppl_seeds"] == "128,256"
    assert table.loc["none", "ppl_eff"] == pytest.approx(64 * 2**1.5)
    assert table.loc["ntk", "ppl_seeds"] == "64,64"
    # two seeds 1 log2 apart: a t-interval (df 1) wide enough to overlap ntk's, so they tie
    assert table.loc["none", "ppl_rank"] == 1 and table.loc["ntk", "ppl_rank"] == 1
    assert table.loc["none", "ppl_at_L"] == pytest.approx(10.0)
    # seed 1 flat to 4L too: both seeds 256, an interval above ntk's: ntk ranks 2
    rows[2] = _nll_row(1, 256, 10.9)
    ranked = leaderboard_table(pd.DataFrame(rows)).set_index("method")
    assert ranked.loc["none", "ppl_seeds"] == "256,256" and ranked.loc["ntk", "ppl_rank"] == 2
    # control: a perplexity of 11.1 at 2L (1.11 x) breaks seed 1 at L
    rows[1] = _nll_row(1, 128, 11.1)
    assert (
        leaderboard_table(pd.DataFrame(rows)).set_index("method").loc["none", "ppl_seeds"]
        == "64,256"
    )


def test_the_longppl_rule_reads_longppl_at_l():
    """LongPPL's effective length is the perplexity rule on LongPPL against its value at L:
    8.0 at L, 8.5 at 2L (1.06 x), 9.0 at 4L (1.125 x) -> 2L on both seeds. Control: a series
    whose LongPPL starts at 4L (no key token before) has no LongPPL length at all, not one
    measured from 4L (which would read as flat from 4L on, whatever it did at 2L)."""
    rows = [_nll_row(s, x, 10.0) for s in (1, 2) for x in (64, 128, 256)]
    longppl = {"metric": "longppl"}
    rows += [{**_nll_row(s, x, 1.0), **longppl, "value": v, "n": 30}
             for s in (1, 2) for x, v in ((64, 8.0), (128, 8.5), (256, 9.0))]  # fmt: skip
    table = leaderboard_table(pd.DataFrame(rows)).set_index("method")
    assert table.loc["none", "longppl_seeds"] == "128,128"
    # described beside the rule, not ranked: LongPPL at the longest length, geometric mean
    assert table.loc["none", "longppl_at_longest"] == pytest.approx(9.0)
    rows[-1] = {**rows[-1], "value": 16.0}  # seed 2 at 4L: sqrt(9 x 16) = 12
    table = leaderboard_table(pd.DataFrame(rows)).set_index("method")
    assert table.loc["none", "longppl_at_longest"] == pytest.approx(12.0)
    assert table.loc["none", "longppl_seeds"] == "128,128"  # the rule does not read it
    late = [r for r in rows if not (r["metric"] == "longppl" and r["eval_length"] < 256)]
    table = leaderboard_table(pd.DataFrame(late)).set_index("method")
    assert "longppl_seeds" not in table.columns or pd.isna(table.loc["none", "longppl_seeds"])
    assert table.loc["none", "ppl_seeds"] == "256,256"


def test_no_method_wins_by_being_bad_at_l():
    """A series flat past L from a perplexity at L five times the other's (zero-shot PI's shape)
    ties on the perplexity length but ranks below on ppl at L, so its overall rank is worse.
    Control: the same curve from the other's value at L ties overall."""
    flat = [(64, 10.0), (128, 10.5), (256, 10.9)]
    breaks = [(64, 10.0), (128, 10.5), (256, 30.0)]

    def table(bad_at_l: float):
        rows = [_nll_row(s, x, p + 0.1 * s) for s in (1, 2, 3) for x, p in breaks]
        rows += [_nll_row(s, x, bad_at_l * p + 0.1 * s, scaling="linear")
                 for s in (1, 2, 3) for x, p in flat]  # fmt: skip
        return leaderboard_table(pd.DataFrame(rows)).set_index("method")

    bad = table(5.0)
    assert bad.loc["linear", "ppl_rank"] == 1 and bad.loc["none", "ppl_rank"] == 2
    assert bad.loc["none", "ppl_at_L_rank"] == 1 and bad.loc["linear", "ppl_at_L_rank"] == 2
    assert bad.loc["linear", "ppl_at_L"] == pytest.approx(50.0, rel=0.02)
    assert bad.loc["linear", "overall_rank"] == bad.loc["none", "overall_rank"] == 1.5
    assert display_table(bad.reset_index()).set_index("method").loc["linear", "ppl at L"] == (
        "50.20† #2"
    )
    good = table(1.0)  # control: flat from the same value at L
    assert good.loc["linear", "ppl_at_L_rank"] == 1 and good.loc["linear", "overall_rank"] == 1.0


def test_the_readmes_reach_is_of_the_series_it_names():
    """README's rank-1 line names the series good at L and counts the bad-at-L ones; its "reaches"
    is how far the named ones reach. Here none (good at L: 128, 256, 128 over seeds) ties with
    linear (5x worse at L, flat to 4L on every seed): the reach is none's, not linear's >=256.
    Control: with linear alone at rank 1, the reach is linear's, marked as bad at L."""
    from bench.report.leaderboard_report import BAD_AT_L, readme_block

    rows = []
    for s, ppls in ((1, (10.0, 10.5, 12.0)), (2, (10.0, 10.5, 10.9)), (3, (10.0, 10.5, 12.0))):
        rows += [_nll_row(s, x, p) for x, p in zip((64, 128, 256), ppls, strict=True)]
    rows += [_nll_row(s, x, p, scaling="linear")
             for s in (1, 2, 3) for x, p in ((64, 50.0), (128, 52.0), (256, 54.0))]  # fmt: skip
    table = leaderboard_table(pd.DataFrame(rows))
    ranked = table.set_index("method")
    assert ranked.loc["none", "ppl_rank"] == ranked.loc["linear", "ppl_rank"] == 1
    line = next(x for x in readme_block(table).splitlines() if x.startswith("| perplexity"))
    assert "rope none" in line and f"+1 worse at L{BAD_AT_L}" in line
    reach = line.rstrip(" |").rsplit("| ", 1)[1]
    assert reach.startswith("161 (") and "≥256" not in reach and BAD_AT_L not in reach
    # control: none breaks at L on every seed, so linear alone is rank 1 and its reach is shown
    broken = [r if r["scaling"] == "linear" or r["eval_length"] == 64 else {**r, "value": 5.0}
              for r in rows]  # fmt: skip
    line = next(
        x
        for x in readme_block(leaderboard_table(pd.DataFrame(broken))).splitlines()
        if x.startswith("| perplexity")
    )
    assert line.rstrip(" |").rsplit("| ", 1)[1] == f"≥256{BAD_AT_L}"


def _passkey_row(seed: int, length: int, acc: float, **extra) -> dict:
    row = _nll_row(seed, length, 1.0, metric="passkey_acc", n=80, train_length=256, **extra)
    return {**row, "value": acc}


def test_a_design_whose_raw_model_fails_at_l_is_marked():
    """Every series of a design whose raw model fails passkey at L carries the mark (a fine-tune
    that retrieves too: the mark is about the model it starts from), and the paragraph names the
    design. Control: a design whose raw model retrieves at L, with a method that fails at L,
    carries no mark (that failure is the method's)."""
    from bench.report.leaderboard_report import RAW_FAILS_AT_L, _paragraph

    lengths = (256, 512)
    rows = [_passkey_row(s, x, 0.0, position="learned") for s in (1, 2) for x in lengths]
    rows += [_passkey_row(s, x, 1.0, position="learned", scaling="yarn", finetune_method="yarn",
                          finetune_length=512)
             for s in (1, 2) for x in lengths]  # fmt: skip
    rows += [_passkey_row(s, x, 1.0, position="alibi") for s in (1, 2) for x in lengths]
    rows += [_passkey_row(s, x, 0.0, position="alibi", scaling="linear")
             for s in (1, 2) for x in lengths]  # fmt: skip
    table = leaderboard_table(pd.DataFrame(rows))
    shown = display_table(table).set_index(["design", "method"])["passkey"]
    assert shown[("learned", "none")] == f"fails at L{RAW_FAILS_AT_L} #3"
    assert shown[("learned", "yarn")].startswith(f"≥512{RAW_FAILS_AT_L} ")
    assert shown[("alibi", "none")] == "≥512 #1"
    assert shown[("alibi", "linear")] == "fails at L #3"  # control: alibi's raw model retrieves
    paragraph = _paragraph(table, "passkey")
    assert "Raw models that fail at L" in paragraph and paragraph.endswith(": learned.")


def test_recipes_are_never_ranked_together():
    """The same rows under two recipe values: two blocks, each ranked on its own (both rank 1);
    rows without the column fall back to their study (experiment, arm, L)."""
    a = [_nll_row(s, x, p, recipe="A") for s in (1, 2) for x, p in ((64, 10.0), (128, 10.0))]
    b = [_nll_row(s, x, p, recipe="B") for s in (1, 2) for x, p in ((64, 10.0), (128, 30.0))]
    table = leaderboard_table(pd.DataFrame(a + b))
    assert list(table["recipe"]) == ["A", "B"] and list(table["ppl_rank"]) == [1, 1]
    one = leaderboard_table(pd.DataFrame([{**r, "recipe": "A"} for r in a + b]))
    assert len(one) == 1  # control: one recipe, one series (its rows pooled per seed)
    old = leaderboard_table(
        pd.DataFrame([{k: v for k, v in r.items() if k != "recipe"} for r in a])
    )
    assert list(old["recipe"]) == ["study:hand/lm/L=64"]


def test_the_committed_leaderboard_regenerates_identically(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert report_main(["--leaderboard", *SOURCES, "--out", str(tmp_path)]) == 0
    for name in ("report.md", "tables/leaderboard.csv"):
        assert (tmp_path / name).read_text() == (COMMITTED / name).read_text(), name
    assert (COMMITTED / "index.html").is_file()


def test_a_changed_cell_changes_the_rank_it_should(tmp_path):
    """In a copy of the RULER study's rows, the raw model's passkey accuracy at 2L and 4L set to
    1.0 on every seed: its passkey cell becomes >= 4L at rank 1; every other series' passkey
    effective length stays as it was."""
    rows = load_results([ROOT / "results" / "ruler"])
    before = leaderboard_table(rows)
    raw = (
        (rows["metric"] == "passkey_acc") & (rows["scaling"] == "none")
        & rows["finetune_method"].isna() & (rows["eval_length"] > 256)
    )  # fmt: skip
    edited = rows.copy()
    edited.loc[raw, "value"] = 1.0
    after = leaderboard_table(edited)
    key = ["design", "method", "finetune"]
    b, a = before.set_index(key), after.set_index(key)
    series = ("rope", "none", "none")
    assert b.loc[series, "passkey_seeds"] == "256,256,256"
    assert a.loc[series, "passkey_seeds"] == "1024,1024,1024" and a.loc[series, "passkey_rank"] == 1
    others = b.index.drop(series)
    pd.testing.assert_series_equal(b.loc[others, "passkey_eff"], a.loc[others, "passkey_eff"])
    shown = display_table(after).set_index(["design", "method", "fine-tune"])
    assert shown.loc[series, "passkey"] == "≥1024 #1"
    write_leaderboard(edited, tmp_path, "edited copy")  # the edit reaches report.md too
    assert "≥1024 #1" in (tmp_path / "report.md").read_text()


def test_the_readmes_block_is_generated_from_the_committed_rows(tmp_path):
    """README.md opens with the leaderboard's rank-1 rows per metric: the block between its markers
    is exactly what --readme writes from the committed rows (not hand-written); a changed row
    changes it (control); a README without the markers is one sentence."""
    from bench.report.leaderboard_report import (
        README_END,
        README_START,
        readme_block,
        update_readme,
    )

    rows = load_results([ROOT / p for p in SOURCES])
    readme = (ROOT / "README.md").read_text()
    block = readme.split(README_START, 1)[1].split(README_END, 1)[0]
    expected = readme_block(leaderboard_table(rows))
    assert README_START + block + README_END == expected
    copy = tmp_path / "README.md"
    copy.write_text(readme)
    edited = rows.copy()
    raw = (edited["experiment"] == "ruler") & (edited["metric"] == "passkey_acc")
    raw &= (edited["scaling"] == "none") & edited["finetune_method"].isna()
    edited.loc[raw & (edited["eval_length"] > 256), "value"] = 1.0
    update_readme(copy, readme_block(leaderboard_table(edited)))
    assert copy.read_text() != readme and "rope none" in copy.read_text().split(README_END)[0]
    (tmp_path / "plain.md").write_text("# no block\n")
    with pytest.raises(ValueError, match="has no leaderboard block"):
        update_readme(tmp_path / "plain.md", expected)


@pytest.mark.parametrize("readme", ["missing.md", "plain.md", "folder"])
def test_a_bad_readme_is_refused_before_the_leaderboard_is_written(tmp_path, capsys, readme):
    """--readme that is no file or has no block: one sentence, and nothing written (the audit saw
    the page, tables and heatmaps written first). Control: a README with the block is updated."""
    from bench.report.leaderboard_report import README_END, README_START

    (tmp_path / "plain.md").write_text("# no block\n")
    (tmp_path / "folder").mkdir()
    out = tmp_path / "out"
    argv = ["results/training_free", "--leaderboard", "--out", str(out), "--readme"]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        with pytest.raises(SystemExit) as stop:
            report_main([*argv, str(tmp_path / readme)])
        assert stop.value.code == 2 and not out.exists()
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert err[-1].startswith("lenbench-report: error: ")  # argparse's usage, then one line
        assert "is not a file" in err[-1] or "has no leaderboard block" in err[-1]
        good = tmp_path / "good.md"
        good.write_text(f"# x\n{README_START}\n{README_END}\n")
        assert report_main([*argv, str(good)]) == 0
    assert (out / "report.md").exists() and "| metric |" in good.read_text()


def test_a_fine_tune_curve_is_ranked_at_its_final_checkpoint():
    """The audit's case: a YaRN fine-tune's recovery curve (checkpoints after 0 and 800 updates)
    shared one leaderboard key, so its trials were pooled (the 0-update state is the base model,
    failing at L here). The series is the final checkpoint: 4L on both seeds. Control: two series
    that a key cannot tell apart (another model_config_id) are refused, not pooled."""
    lengths = (256, 512, 1024)
    curve = dict(position="rope", scaling="yarn", finetune_method="yarn", finetune_length=1024)
    rows = [_passkey_row(s, x, 0.0, finetune_steps=0, **curve) for s in (1, 2) for x in lengths]
    rows += [_passkey_row(s, x, 1.0, finetune_steps=800, **curve) for s in (1, 2) for x in lengths]
    table = leaderboard_table(pd.DataFrame(rows)).set_index("method")
    assert table.loc["yarn", "passkey_seeds"] == "1024,1024"
    clash = [_passkey_row(s, x, 1.0, position="rope") for s in (1, 2) for x in lengths]
    clash += [_passkey_row(s, x, 0.0, position="rope", model_config_id="other")
              for s in (1, 2) for x in lengths]  # fmt: skip
    with pytest.raises(ValueError, match="holds 2 different series"):
        leaderboard_table(pd.DataFrame(clash))
