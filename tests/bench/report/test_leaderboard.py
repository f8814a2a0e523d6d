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
    128 and 256, mean log2 ratio 1.5 -> 64 x 2^1.5 = 181 tokens. Another method on the same
    model breaks at 2L on both seeds: paired per seed, the differences 1 and 2 (log2) give t = 3
    with one degree of freedom, p = 0.2: not decided, both span ranks 1-2. Seed 1 flat to 4L too:
    the differences are 2 and 2, decided (no document rows here, so no within-seed noise):
    ranks 1 and 2. Control: 11.1 at 2L (1.11 x) breaks seed 1 at L."""
    rows = []
    for seed, ppls in ((1, (10.0, 10.5, 12.0)), (2, (10.0, 10.9, 10.95))):
        rows += [_nll_row(seed, x, p) for x, p in zip((64, 128, 256), ppls, strict=True)]
    for seed in (1, 2):  # another method of the same recipe: breaks at 2L on both seeds
        rows += [
            _nll_row(seed, x, p, scaling="ntk") for x, p in ((64, 10.0), (128, 20.0), (256, 30.0))
        ]
    table = leaderboard_table(pd.DataFrame(rows)).set_index("method")
    assert table.loc["none", "ppl_seeds"] == "128,256"
    assert table.loc["none", "ppl_mean"] == pytest.approx(64 * 2**1.5)
    assert table.loc["ntk", "ppl_seeds"] == "64,64"
    for method in ("none", "ntk"):
        assert (table.loc[method, "ppl_rank_lo"], table.loc[method, "ppl_rank_hi"]) == (1, 2)
    assert table.loc["none", "ppl_at_L"] == pytest.approx(10.0)
    rows[2] = _nll_row(1, 256, 10.9)
    ranked = leaderboard_table(pd.DataFrame(rows)).set_index("method")
    assert ranked.loc["none", "ppl_seeds"] == "256,256"
    assert ranked.loc["none", "ppl_rank_hi"] == 1 and ranked.loc["ntk", "ppl_rank_lo"] == 2
    rows[1] = _nll_row(1, 128, 11.1)
    assert (
        leaderboard_table(pd.DataFrame(rows)).set_index("method").loc["none", "ppl_seeds"]
        == "64,256"
    )


def test_longppl_is_described_not_ranked():
    """LongPPL's value at the longest length every seed has (geometric mean over seeds) stands
    beside the ranks; it has no rank column (its key tokens differ per length). Control: the
    value follows an edited row."""
    rows = [_nll_row(s, x, 10.0) for s in (1, 2) for x in (64, 128, 256)]
    longppl = {"metric": "longppl"}
    rows += [{**_nll_row(s, x, 1.0), **longppl, "value": v, "n": 30}
             for s in (1, 2) for x, v in ((64, 8.0), (128, 8.5), (256, 9.0))]  # fmt: skip
    table = leaderboard_table(pd.DataFrame(rows)).set_index("method")
    assert table.loc["none", "longppl_at_longest"] == pytest.approx(9.0)
    assert not [c for c in table.columns if c.startswith("longppl_") and "rank" in c]
    rows[-1] = {**rows[-1], "value": 16.0}  # seed 2 at 4L: sqrt(9 x 16) = 12
    table = leaderboard_table(pd.DataFrame(rows)).set_index("method")
    assert table.loc["none", "longppl_at_longest"] == pytest.approx(12.0)
    assert table.loc["none", "ppl_seeds"] == "256,256"


def test_no_method_wins_by_being_bad_at_l():
    """A series flat past L from a perplexity at L five times the other's (zero-shot PI's shape)
    has the better perplexity AUC, but it is decidedly bad at L (†), so it ranks below the other
    on every perplexity statistic and overall, and no cell shows † with rank 1. Control: the same
    curve from the other's value at L is not bad at L and ranks first."""
    from bench.report.leaderboard_report import BAD_AT_L

    flat = [(64, 10.0), (128, 10.5), (256, 10.9)]
    breaks = [(64, 10.0), (128, 10.5), (256, 30.0)]

    def table(bad_at_l: float):
        rows = [_nll_row(s, x, p + 0.1 * s) for s in (1, 2, 3) for x, p in breaks]
        rows += [_nll_row(s, x, bad_at_l * p + 0.1 * s, scaling="linear")
                 for s in (1, 2, 3) for x, p in flat]  # fmt: skip
        return leaderboard_table(pd.DataFrame(rows)).set_index("method")

    bad = table(5.0)
    assert bad.loc["linear", "bad_at_L"] and not bad.loc["none", "bad_at_L"]
    assert bad.loc["linear", "ppl_auc_mean"] < bad.loc["none", "ppl_auc_mean"]  # flatter
    for stat in ("ppl_auc", "ppl", "ppl_at_L", "overall"):
        assert bad.loc["none", f"{stat}_rank_lo" if stat != "overall" else "overall_rank_lo"] == 1
        assert bad.loc["linear", f"{stat}_rank_lo" if stat != "overall" else "overall_rank_lo"] == 2
    assert bad.loc["linear", "ppl_at_L"] == pytest.approx(50.0, rel=0.02)
    shown = display_table(bad.reset_index()).set_index("method")
    assert shown.loc["linear", "ppl at L"] == "50.20† #2"
    assert not any(BAD_AT_L in c and "#1" in c for c in shown.loc["linear"])
    good = table(1.0)  # control: flat from the same value at L
    assert not good.loc["linear", "bad_at_L"] and good.loc["linear", "overall_rank_lo"] == 1
    assert good.loc["none", "overall_rank_lo"] == 2


def test_the_readmes_reach_holds_on_every_seed_of_every_named_series():
    """README's line names the top group (no series decidedly better) and its reach is what every
    named series reaches on every seed. none (good at L: 128, 256, 128 over seeds) is the top
    group, linear (5x worse at L, flat to 4L) is ranked below it: the reach is 128, not linear's
    256. Control: a second method undecided against none whose seed 2 reaches only L joins the
    top group and the reach falls to 64."""
    from bench.report.leaderboard import leaderboard
    from bench.report.leaderboard_readme import readme_block

    rows = []
    for s, ppls in ((1, (10.0, 10.5, 12.0)), (2, (10.0, 10.5, 10.9)), (3, (10.0, 10.5, 12.0))):
        rows += [_nll_row(s, x, p) for x, p in zip((64, 128, 256), ppls, strict=True)]
    rows += [_nll_row(s, x, p, scaling="linear")
             for s in (1, 2, 3) for x, p in ((64, 50.0), (128, 52.0), (256, 54.0))]  # fmt: skip

    def line(rows) -> str:
        block = readme_block(leaderboard(pd.DataFrame(rows)))
        return next(x for x in block.splitlines() if x.startswith("| `study:hand"))

    first = line(rows)
    assert "rope none" in first and "rope linear" not in first
    assert "| 128 (perplexity length) |" in first
    rows += [_nll_row(s, x, p, scaling="ntk")
             for s, ppls in ((1, (10.0, 10.5, 12.0)), (2, (10.0, 11.5, 12.0)),
                             (3, (10.0, 10.5, 10.9)))
             for x, p in zip((64, 128, 256), ppls, strict=True)]  # fmt: skip
    second = line(rows)
    assert "rope ntk" in second and "| 64 (perplexity length) |" in second


def _passkey_row(seed: int, length: int, acc: float, **extra) -> dict:
    row = _nll_row(seed, length, 1.0, metric="passkey_acc", n=80, train_length=256, **extra)
    return {**row, "value": acc}


def test_a_design_whose_raw_model_fails_at_l_is_marked():
    """Every series of a design whose raw model fails passkey at L carries the mark (a fine-tune
    that retrieves too: the mark is about the model it starts from), and the paragraph names the
    design. Control: a design whose raw model retrieves at L, with a method that fails at L,
    carries no mark (that failure is the method's). Failing series are not ranked."""
    from bench.report.leaderboard import leaderboard
    from bench.report.leaderboard_report import RAW_FAILS_AT_L, _block_paragraph

    lengths = (256, 512)
    rows = [_passkey_row(s, x, 0.0, position="learned") for s in (1, 2) for x in lengths]
    rows += [_passkey_row(s, x, 1.0, position="learned", scaling="yarn", finetune_method="yarn",
                          finetune_length=512)
             for s in (1, 2) for x in lengths]  # fmt: skip
    rows += [_passkey_row(s, x, 1.0, position="alibi") for s in (1, 2) for x in lengths]
    rows += [_passkey_row(s, x, 0.0, position="alibi", scaling="linear")
             for s in (1, 2) for x in lengths]  # fmt: skip
    lb = leaderboard(pd.DataFrame(rows))
    shown = display_table(lb.table).set_index(["design", "method"])["passkey length"]
    assert shown[("learned", "none")] == f"fails at L on 2/2{RAW_FAILS_AT_L} (0,0)"
    assert shown[("learned", "yarn")] == f"≥512 (512,512){RAW_FAILS_AT_L} #1–2"
    assert shown[("alibi", "none")] == "≥512 (512,512) #1–2"
    assert shown[("alibi", "linear")] == "fails at L on 2/2 (0,0)"  # control: alibi retrieves
    paragraph = _block_paragraph(lb.table, lb)
    assert "Raw models failing at L" in paragraph and paragraph.endswith(": learned.")


def test_failure_at_l_is_failure():
    """The audit's case: a series whose seeds read 0 (fails at L), 0, 512 ranked first while one
    at 512 on every seed ranked third. Now the first is not ranked ("fails at L on 2/3"), the
    second is. Control: without the failing seeds (512 on each) both are ranked."""
    lengths = (256, 512, 1024)

    def board(accuracies):
        rows = [_passkey_row(s, x, a, position="kerple_power", scaling="logn")
                for s, accs in zip((1, 2, 3), accuracies, strict=True)
                for x, a in zip(lengths, accs, strict=True)]  # fmt: skip
        rows += [
            _passkey_row(s, x, a, position="alibi")
            for s in (1, 2, 3)
            for x, a in zip(lengths, (1.0, 1.0, 0.0), strict=True)
        ]
        return leaderboard_table(pd.DataFrame(rows)).set_index("design")

    split = board([(0.0, 0.0, 0.0), (0.0, 0.0, 0.0), (1.0, 1.0, 0.0)])
    assert split.loc["kerple_power", "passkey_seeds"] == "0,0,512"
    assert split.loc["kerple_power", "passkey_fails"] == 2
    assert pd.isna(split.loc["kerple_power", "overall_rank_lo"])
    assert split.loc["alibi", "overall_rank_lo"] == 1 == split.loc["alibi", "overall_rank_hi"]
    shown = display_table(split.reset_index()).set_index("design")["overall"]
    assert shown["kerple_power"] == "not ranked: fails at L on 2/3"
    assert list(split.index) == ["alibi", "kerple_power"]  # the ranked first
    even = board([(1.0, 1.0, 0.0)] * 3)  # control
    assert even.loc["kerple_power", "passkey_fails"] == 0
    assert even["overall_rank_lo"].notna().all()


def test_recipes_are_never_ranked_together():
    """The same rows under two recipe values: two blocks, each ranked on its own (both rank 1);
    rows without the column fall back to their study (experiment, arm, L)."""
    a = [_nll_row(s, x, p, recipe="A") for s in (1, 2) for x, p in ((64, 10.0), (128, 10.0))]
    b = [_nll_row(s, x, p, recipe="B") for s in (1, 2) for x, p in ((64, 10.0), (128, 30.0))]
    table = leaderboard_table(pd.DataFrame(a + b))
    assert list(table["recipe"]) == ["A", "B"] and list(table["overall_rank_lo"]) == [1, 1]
    one = leaderboard_table(pd.DataFrame([{**r, "recipe": "A"} for r in a + b]))
    assert len(one) == 1  # control: one recipe, one series (its rows pooled per seed)
    old = leaderboard_table(
        pd.DataFrame([{k: v for k, v in r.items() if k != "recipe"} for r in a])
    )
    assert list(old["recipe"]) == ["study:hand/lm/L=64"]


def test_the_committed_leaderboard_regenerates_identically(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert report_main(["--leaderboard", *SOURCES, "--out", str(tmp_path)]) == 0
    for name in ("report.md", "tables/leaderboard.csv", "tables/comparisons.csv",
                 "tables/power.csv"):  # fmt: skip
        assert (tmp_path / name).read_text() == (COMMITTED / name).read_text(), name
    assert (COMMITTED / "index.html").is_file()


def test_a_changed_cell_changes_the_rank_it_should(tmp_path):
    """In a copy of the RULER study's rows, the raw model's passkey accuracy at 2L and 4L set to
    1.0 on every seed: its passkey length becomes >= 4L and its passkey AUC 1, first among the
    series ranked on it; every other series' per-seed passkey lengths stay as they were."""
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
    assert a.loc[series, "passkey_seeds"] == "1024,1024,1024"
    assert a.loc[series, "passkey_auc_mean"] == 1.0 and a.loc[series, "passkey_auc_rank_lo"] == 1
    assert b.loc[series, "passkey_auc_rank_lo"] > 1
    others = b.index.drop(series)
    pd.testing.assert_series_equal(b.loc[others, "passkey_seeds"], a.loc[others, "passkey_seeds"])
    shown = display_table(after).set_index(["design", "method", "fine-tune"])
    assert shown.loc[series, "passkey length"].startswith("≥1024 (1024,1024,1024) #1")
    write_leaderboard(edited, tmp_path, "edited copy")  # the edit reaches report.md too
    assert "≥1024 (1024,1024,1024) #1" in (tmp_path / "report.md").read_text()


@pytest.fixture(scope="module")
def committed():
    """The committed rows and their leaderboard, computed once (about 40 s)."""
    from bench.report.leaderboard import leaderboard

    rows = load_results([ROOT / p for p in SOURCES])
    return rows, leaderboard(rows)


def test_the_committed_leaderboard_is_decided_and_consistent(committed):
    """On the committed rows (issue #73's done-when): every pair of series of one tier whose
    rank intervals do not overlap has a decided comparison (no rank inversion); a series bad at
    L (†) ranks wholly below every series that is not on the perplexity statistics, and none has
    a rank interval starting at 1 there or overall; ranked series never follow unranked ones;
    the README's reach holds on every seed of every series it names."""
    from bench.findings.comparisons import decided_pairs
    from bench.findings.leaderboard import BAD_AT_L_TIERED
    from bench.report.leaderboard_report import reach, top_group

    _, lb = committed
    table = lb.table
    decided = {
        (r, s): set(zip(g["a"], g["b"], strict=True))
        for (r, s), g in lb.comparisons.groupby(["recipe", "statistic"])
    }
    checked = 0
    for (recipe, stat), pairs in decided.items():
        block = table[(table["recipe"] == recipe) & table[f"{stat}_rank_lo"].notna()]
        lo = dict(zip(block["series"], block[f"{stat}_rank_lo"], strict=True))
        hi = dict(zip(block["series"], block[f"{stat}_rank_hi"], strict=True))
        # a tiered statistic orders † below the rest by the rule (bad at L is itself decided)
        tier = dict(zip(block["series"], block["bad_at_L"] & (stat in BAD_AT_L_TIERED),
                        strict=True))  # fmt: skip
        for x in lo:
            for y in lo:
                if tier[x] == tier[y] and hi[x] < lo[y]:
                    assert (x, y) in pairs, (recipe, stat)
                    checked += 1
                if tier[x] < tier[y]:
                    assert hi[x] < lo[y], (recipe, stat)
        assert (
            decided_pairs(
                lb.comparisons[
                    (lb.comparisons["recipe"] == recipe) & (lb.comparisons["statistic"] == stat)
                ].assign(decided=True)
            )
            == pairs
        )
    assert checked > 1000  # the LM block alone orders thousands of pairs
    bad = table[table["bad_at_L"]]
    assert len(bad) > 10
    for stat in [*BAD_AT_L_TIERED, "overall"]:
        assert not (bad[f"{stat}_rank_lo"] == 1).any(), stat
    for _, block in table.groupby("recipe"):
        ranked = block["overall_rank_lo"].notna().to_numpy()
        assert (ranked[:-1] >= ranked[1:]).all()  # ranked first, then the rest
        top = top_group(block)
        stat = {"ppl_auc": "ppl", "passkey_auc": "passkey", "ruler_auc": "ruler_abs"}[
            block["primary"].iloc[0]
        ]
        reached = reach(top, stat)
        assert all(int(x) >= reached for s in top[f"{stat}_seeds"] for x in s.split(","))


def test_the_readmes_block_is_generated_from_the_committed_rows(tmp_path, committed):
    """README.md opens with the leaderboard's decided answer per recipe: the block between its
    markers is exactly what --readme writes from the committed rows (not hand-written); a changed
    row changes it (control); a README without the markers is one sentence."""
    from bench.report.leaderboard import leaderboard
    from bench.report.leaderboard_readme import (
        README_END,
        README_START,
        readme_block,
        update_readme,
    )

    rows, lb = committed
    readme = (ROOT / "README.md").read_text()
    block = readme.split(README_START, 1)[1].split(README_END, 1)[0]
    expected = readme_block(lb)
    assert README_START + block + README_END == expected
    copy = tmp_path / "README.md"
    copy.write_text(readme)
    edited = rows[rows["experiment"] == "ruler"].copy()
    raw = (edited["metric"] == "passkey_acc") & (edited["scaling"] == "none")
    raw &= edited["finetune_method"].isna()
    edited.loc[raw & (edited["eval_length"] > 256), "value"] = 1.0
    update_readme(copy, readme_block(leaderboard(edited)))
    assert copy.read_text() != readme and "study:ruler" in copy.read_text().split(README_END)[0]
    (tmp_path / "plain.md").write_text("# no block\n")
    with pytest.raises(ValueError, match="has no leaderboard block"):
        update_readme(tmp_path / "plain.md", expected)


@pytest.mark.parametrize("readme", ["missing.md", "plain.md", "folder"])
def test_a_bad_readme_is_refused_before_the_leaderboard_is_written(tmp_path, capsys, readme):
    """--readme that is no file or has no block: one sentence, and nothing written (the audit saw
    the page, tables and heatmaps written first). Control: a README with the block is updated."""
    from bench.report.leaderboard_readme import README_END, README_START

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
    assert (out / "report.md").exists() and "| recipe (L) |" in good.read_text()


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


def test_a_new_leaderboard_column_is_one_declaration(tmp_path, monkeypatch):
    """One Statistic entry (perplexity at 2L, lower is better) and nothing else: the table gets
    its mean (exp of the seeds' mean NLL at 2L, by hand), rank interval and per-seed values, and
    report.md its title and rule. Series "worse" is 3x the perplexity at 2L on every seed: ranked
    below. Control: without the entry the table has no such column."""
    from bench.findings.leaderboard import STATISTICS, Statistic

    rows = []
    for seed in (1, 2, 3):
        for scaling, far in (("none", 12.0 + seed), ("worse", 3 * (12.0 + seed))):
            for length, ppl in ((64, 10.0), (128, far)):
                rows.append(_nll_row(seed, length, ppl, scaling=scaling, run_id=f"{scaling}{seed}"))
    df = pd.DataFrame(rows)
    assert "ppl_at_2L_mean" not in leaderboard_table(df)
    column = Statistic(
        "ppl_at_2L", "ppl", False, lambda c: c["nll"][c.lengths.index(2 * c.train_length)],
        title="log perplexity at 2L", rule="log perplexity at twice the training length",
    )  # fmt: skip
    monkeypatch.setitem(STATISTICS, column.name, column)
    table = leaderboard_table(df).set_index("method")
    assert table.loc["none", "ppl_at_2L_mean"] == pytest.approx(
        sum(math.log(12.0 + s) for s in (1, 2, 3)) / 3
    )
    assert table.loc["none", "ppl_at_2L_rank_lo"] == 1 == table.loc["none", "ppl_at_2L_rank_hi"]
    assert table.loc["worse", "ppl_at_2L_rank_lo"] == 2
    from bench.core.rows import normalize_results

    full = [{**r, "model_id": r["run_id"], "code_version": "v"} for r in rows]
    write_leaderboard(normalize_results(full), tmp_path, "hand rows")
    text = (tmp_path / "report.md").read_text()
    assert "log perplexity at 2L" in text and "log perplexity at twice the training length" in text
