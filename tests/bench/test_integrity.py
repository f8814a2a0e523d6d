"""Integrity faults where a wrong number could pass as a result: a non-finite metric value, a
resumable training state whose bytes changed on disk, a result file whose value changed but that
still reads. Each with a healthy control that must go on as before.
"""

from __future__ import annotations

import math
import re
import struct
import zipfile
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

import bench.eval.evaluate
from bench.cli import main
from bench.core.result_digest import DIGEST_KEY, recorded_sha256, rows_sha256
from bench.core.results import load_results, write_results
from bench.core.rows import non_finite_row, normalize_results
from bench.report.cli import main as report_main
from bench.train.cache import get_or_train, weights_config, weights_key
from bench.train.guards import TrainingDiverged
from bench.train.resume import ResumeFile

from fixtures.jobs import Killed, make_cfg, same_weights
from fixtures.rows import row

pytestmark = pytest.mark.usefixtures("one_thread")


SMOKE = [
    "+experiment=smoke",
    "hydra.mode=RUN",
    "position=rope",
    "scaling=none",
    "hydra.callbacks.report.enabled=false",
]


def flip_a_stored_value(path: Path, column: str = "value") -> None:
    """Flip the lowest bit of one stored float of ``column`` in the parquet file at ``path`` so
    that the file still reads (with plain pyarrow) but that column's values differ."""
    original = pq.read_table(path).column(column).to_pylist()
    data = path.read_bytes()
    for value in dict.fromkeys(v for v in original if v is not None and math.isfinite(v)):
        pattern, start = struct.pack("<d", value), 0
        while (at := data.find(pattern, start)) >= 0:
            start = at + 1
            changed = bytearray(data)
            changed[at] ^= 0x01  # the mantissa's lowest bit
            path.write_bytes(bytes(changed))
            try:
                now = pq.read_table(path).column(column).to_pylist()
            except Exception:  # noqa: BLE001 - this byte broke the file: try another
                continue
            if now != original:
                return
    path.write_bytes(data)
    raise AssertionError(f"no stored value of {column!r} found in {path}")


# --------------------------------------------------------------------------- result files


def three_rows() -> list[dict]:
    # the middle value is neither the column's min nor max: its bytes are only in the data
    return [
        row(eval_length=64, value=1.0),
        row(eval_length=128, value=2.718281828459045),
        row(eval_length=256, value=5.0),
    ]


def test_a_result_file_whose_value_changed_is_refused_naming_it(tmp_path, capsys):
    path = write_results(three_rows(), tmp_path / "exp" / "a.parquet")
    table = pq.read_table(path)
    assert recorded_sha256(table) == rows_sha256(table)
    # healthy control: the file as written loads, the report CLI gets past loading it
    assert load_results(path)["value"].tolist() == [1.0, 2.718281828459045, 5.0]
    flip_a_stored_value(path)
    changed = pq.read_table(path)["value"].to_pylist()  # it still reads: one number changed
    assert changed != [1.0, 2.718281828459045, 5.0] and len(changed) == 3
    with pytest.raises(ValueError, match="SHA-256") as info:
        load_results(tmp_path / "exp")
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(SystemExit) as exit_info:
        report_main([str(tmp_path / "exp"), "--check"])
    err = capsys.readouterr().err
    assert exit_info.value.code != 0 and str(path) in err and "SHA-256" in err


def test_a_wrong_recorded_digest_is_refused_and_a_file_without_one_is_legacy(tmp_path):
    rows = normalize_results(three_rows())
    legacy = tmp_path / "legacy" / "old.parquet"
    legacy.parent.mkdir()
    rows.to_parquet(legacy, index=False)  # as lenbench wrote results before the digest
    assert recorded_sha256(pq.read_table(legacy)) is None
    assert len(load_results(legacy)) == 3  # read, unverified
    table = pq.read_table(legacy)
    wrong = table.replace_schema_metadata({**table.schema.metadata, DIGEST_KEY: b"0" * 64})
    forged = tmp_path / "forged" / "x.parquet"
    forged.parent.mkdir()
    pq.write_table(wrong, forged)
    with pytest.raises(ValueError, match=f"results file '{forged}' does not match the SHA-256"):
        load_results(forged)


def test_a_changed_result_file_is_moved_aside_and_recomputed(tmp_path, monkeypatch, capsys):
    """The audit's case: one bit of a stored value flipped, the file still reads; before, the
    rerun said "results already exist; nothing to do" and kept the wrong number."""
    monkeypatch.chdir(tmp_path)
    args = [*SMOKE, f"paths.cache={tmp_path / 'cache'}"]
    assert main(args) == 0, capsys.readouterr().err
    results = tmp_path / "results" / "smoke"
    (path,) = results.glob("*.parquet")
    good = pd.read_parquet(path)
    stamp = path.stat().st_mtime_ns
    assert main(args) == 0 and path.stat().st_mtime_ns == stamp  # control: intact, not redone
    flip_a_stored_value(path)
    assert pd.read_parquet(path)["value"].tolist() != good["value"].tolist()  # still reads
    assert main(args) == 0, capsys.readouterr().err
    (aside,) = results.glob("*.parquet.unreadable-*")
    assert pd.read_parquet(aside)["value"].tolist() != good["value"].tolist()
    again = pd.read_parquet(path)
    assert again["value"].tolist() == good["value"].tolist()  # recomputed: the true numbers
    assert len(load_results(results)) == len(good)


# --------------------------------------------------------------------------- non-finite values


def test_non_finite_rows_are_found_and_rows_that_measured_nothing_are_not(tmp_path):
    assert non_finite_row([row(), row(value=float("nan"))]) == 1
    assert non_finite_row([row(value=float("inf"))]) == 0
    assert non_finite_row(pd.DataFrame([row(), row(value=-math.inf)])) == 1
    # a row that measured nothing (no test document long enough) holds NaN with n = 0
    assert non_finite_row([row(value=float("nan"), n=0), row()]) is None
    # ... NaN, not infinity, which is a number gone wrong whatever n says
    assert non_finite_row([row(value=float("inf"), n=0)]) == 0
    assert non_finite_row(pd.DataFrame([row(), row(value=math.inf, n=0)])) == 1
    with pytest.raises(ValueError, match=r"metric nll at eval length 128 .*position rope.*never"):
        write_results([row(value=float("nan"))], tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()


@pytest.mark.parametrize(
    ("edit", "sentence"),
    [
        ({"n": -5}, "column 'n' must hold counts >= 0, got -5 in row 1"),
        ({"ci_lo": -math.inf}, "column 'ci_lo' must hold finite numbers or be empty, got -inf"),
        ({"ci_hi": math.inf}, "column 'ci_hi' must hold finite numbers or be empty, got inf"),
        ({"doc_nll_sums": [None, None]}, "column 'doc_nll_sums' must hold lists of numbers"),
    ],
)
def test_rows_a_report_cannot_trust_are_refused_in_one_sentence(edit, sentence):
    """The audit's edited files: a negative count (once clipped to zero weight in a perplexity
    mean labelled with all its seeds), infinite interval ends (copied into the tables), a
    per-document list of nulls (a TypeError traceback). Control: the same row unedited loads."""
    good = row(ci_lo=1.0, ci_hi=2.0, doc_nll_sums=[1.0, 2.0])
    assert len(normalize_results([good, good])) == 2
    with pytest.raises(ValueError, match=re.escape(sentence)):
        normalize_results([good, {**good, **edit}])


def test_a_non_finite_metric_value_fails_its_job_and_writes_no_row(tmp_path, monkeypatch, capsys):
    """A NaN from the evaluation: before, the job wrote it as a row, the report failed with
    "cannot convert float NaN to integer" and the run exited 0. Now the job fails with one
    sentence naming the metric, length and series and writes nothing; a stored NaN row stops
    the report with a non-zero exit."""
    original = bench.eval.evaluate.evaluate_model

    def nan_at_the_longest_length(*args, **kwargs):
        rows = original(*args, **kwargs)
        longest = max(r["eval_length"] for r in rows if r["metric"] == "nll")
        bad = next(r for r in rows if r["metric"] == "nll" and r["eval_length"] == longest)
        bad["value"] = float("nan")
        return rows

    monkeypatch.chdir(tmp_path)
    args = [*SMOKE, f"paths.cache={tmp_path / 'cache'}"]
    with monkeypatch.context() as patch:
        patch.setattr(bench.eval.evaluate, "evaluate_model", nan_at_the_longest_length)
        assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "the evaluation gave nan for metric nll at eval length" in err
    assert "series position rope" in err and "scaling none" in err and "wrote no rows" in err
    assert not list((tmp_path / "results").rglob("*.parquet"))  # no row recorded
    assert main(args) == 0, capsys.readouterr().err  # control: the healthy job is kept
    results = tmp_path / "results" / "smoke"
    assert len(list(results.glob("*.parquet"))) == 1

    # a NaN row written by an older lenbench: the report refuses it, and the run says so
    stale = normalize_results([row(experiment="smoke", value=float("nan"))])
    stale.to_parquet(results / "old.parquet", index=False)
    with_report = [a for a in args if not a.startswith("hydra.callbacks.report")]
    assert main(with_report) == 1
    err = capsys.readouterr().err
    assert "report not written" in err and str(results / "old.parquet") in err
    with pytest.raises(SystemExit) as info:
        report_main([str(results), "--check"])
    err = capsys.readouterr().err
    assert info.value.code != 0 and "old.parquet" in err and "non-finite" in err


# --------------------------------------------------------------------------- resumable states


def kill_after_save(patch: pytest.MonkeyPatch, at_step: int) -> None:
    original = ResumeFile.save

    def save(self: ResumeFile, state: dict) -> None:
        original(self, state)
        if state["step"] == at_step:
            raise Killed(at_step)

    patch.setattr(ResumeFile, "save", save)


def interrupted(cfg, corpus, root: Path, at_step: int = 4) -> Path:
    """Train ``cfg`` under ``root`` until its state of ``at_step`` is saved; the state's path."""
    with pytest.MonkeyPatch.context() as patch:
        kill_after_save(patch, at_step)
        with pytest.raises(Killed):
            get_or_train(cfg, corpus, root, progress=False)
    path = root / weights_key(cfg, corpus) / "resume.pt"
    assert path.exists()
    return path


def xor_inside_the_largest_tensor(path: Path, n_bytes: int = 64) -> None:
    """XOR ``n_bytes`` in the middle of the largest tensor record of a torch.save file (it still
    loads)."""
    with zipfile.ZipFile(path) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    offset = info.header_offset
    name_len = int.from_bytes(data[offset + 26 : offset + 28], "little")
    extra_len = int.from_bytes(data[offset + 28 : offset + 30], "little")
    start = offset + 30 + name_len + extra_len + info.file_size // 2 - n_bytes // 2
    for i in range(start, start + n_bytes):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_resume_state_whose_bytes_changed_is_dropped_and_training_restarts(
    tmp_path, corpus, corpus_dir
):
    """The audit's case: 64 bytes XOR-ed in resume.pt, still loadable. Before, the rerun resumed
    from the corrupt state (and failed, and kept it, and every rerun failed alike)."""
    cfg = make_cfg(corpus_dir, steps=8, warmup_steps=2, eval_batches=0, save_every=2)
    reference, _, _ = get_or_train(cfg, corpus, tmp_path / "a", progress=False)
    path = interrupted(cfg, corpus, tmp_path / "b")
    stored = ResumeFile(path, weights_key(cfg, corpus), weights_config(cfg, corpus))
    before = stored.load()
    assert before["step"] == 4  # healthy control: an intact state is used
    xor_inside_the_largest_tensor(path)
    raw = torch.load(path, weights_only=True)  # still loads, for the same key and config ...
    assert raw["key"] == stored.key and raw["config"] == stored.config
    tensors = [(k, v) for k, v in before["model"].items()]
    assert any(not torch.equal(v, raw["state"]["model"][k]) for k, v in tensors) or any(
        not torch.equal(a["exp_avg"], b["exp_avg"])
        for a, b in zip(
            before["optimizer"]["state"].values(),
            raw["state"]["optimizer"]["state"].values(),
            strict=True,
        )
    )  # ... but its content changed
    with pytest.warns(UserWarning, match="SHA-256") as caught:
        model, meta, trained = get_or_train(cfg, corpus, tmp_path / "b", progress=False)
    (warning,) = [w for w in caught if "SHA-256" in str(w.message)]
    assert str(path) in str(warning.message) and "training from scratch" in str(warning.message)
    assert trained and meta["train_stats"]["resumed_from"] == 0
    assert same_weights(model, reference)
    assert not path.exists()  # dropped (and the finished checkpoint needs none)


def test_a_job_that_fails_right_after_resuming_drops_the_state(tmp_path, corpus, corpus_dir):
    """A state that verifies but cannot train (weights that give a NaN loss): the resumed run
    fails, says that it dropped the state, and the next run trains from scratch. Before, the
    state was kept and every rerun failed the same way."""
    cfg = make_cfg(corpus_dir, steps=8, warmup_steps=2, eval_batches=0, save_every=2)
    reference, _, _ = get_or_train(cfg, corpus, tmp_path / "a", progress=False)
    path = interrupted(cfg, corpus, tmp_path / "b")
    stored = ResumeFile(path, weights_key(cfg, corpus), weights_config(cfg, corpus))
    state = stored.load()
    state["model"] = {k: torch.full_like(v, math.nan) for k, v in state["model"].items()}
    stored.save(state)  # a valid digest: this state passes the integrity check
    with pytest.raises(TrainingDiverged) as info:
        get_or_train(cfg, corpus, tmp_path / "b", progress=False)
    message = str(info.value)
    assert "resumed from the saved state of update 4, which is now dropped" in message
    assert "\n" not in message and not path.exists()
    model, meta, trained = get_or_train(cfg, corpus, tmp_path / "b", progress=False)
    assert trained and meta["train_stats"]["resumed_from"] == 0
    assert same_weights(model, reference)
    # control: a run that did not resume fails without the note (and has no state to drop)
    fresh = replace(cfg, seed=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            "bench.train.trainer.lm_loss",
            lambda logits, targets, mask=None: logits.sum() * math.nan,
        )
        with pytest.raises(TrainingDiverged) as info:
            get_or_train(fresh, corpus, tmp_path / "c", progress=False)
    assert "resumed" not in str(info.value)


def test_a_resume_state_without_a_recorded_digest_is_dropped(tmp_path):
    """A state written before states carried a SHA-256 cannot be verified: dropped, not trusted.
    Control: the same state saved through ResumeFile (with its digest) loads."""
    path = tmp_path / "resume.pt"
    state = {"step": 3, "model": {"w": torch.arange(4.0)}, "rng": {"python": (3, (1, 2), None)}}
    stored = ResumeFile(path, "k" * 16, {"x": 1})
    stored.save(state)
    loaded = stored.load()
    assert loaded["step"] == 3 and torch.equal(loaded["model"]["w"], torch.arange(4.0))
    torch.save({"key": stored.key, "config": stored.config, "state": state}, path)  # no digest
    with pytest.warns(UserWarning, match="has no recorded SHA-256") as caught:
        assert stored.load() is None
    assert len(caught) == 1 and "\n" not in str(caught[0].message) and not path.exists()
