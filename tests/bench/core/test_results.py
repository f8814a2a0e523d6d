"""Tests for bench/core/results.py and bench/core/rows.py: schema validation, canonical JSON,
atomic writes, newest-wins dedup."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from bench.core import results as R
from bench.core.results import CELL_COLUMNS, dedup_results, load_results, write_results
from bench.core.rows import (
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    ROW_METRICS,
    canonical_json,
    normalize_results,
)

from fixtures.rows import row


def sweep_rows() -> list[dict]:
    """Whole-window + bucket NLL rows and a passkey row for two positions and two lengths."""
    rows = []
    for pos in ("rope", "alibi"):
        for ev in (64, 128):
            common = {
                "position": pos,
                "run_id": f"run-{pos}",
                "model_id": f"m-{pos}",
                "eval_length": ev,
            }
            rows.append(row(**common, value=2.0 + ev / 1000))
            for lo, hi in ((0, 32), (32, ev)):
                rows.append(row(**common, value=2.1, n=8 * (hi - lo), bucket_lo=lo, bucket_hi=hi))
            rows.append(
                row(**common, metric="passkey_acc", value=1.0, n=10, axis="depth", axis_value=0.5)
            )
    return rows


def test_schema_constants_match_design() -> None:
    assert (
        REQUIRED_COLUMNS[:3] == ["experiment", "run_id", "model_id"] and len(REQUIRED_COLUMNS) == 16
    )
    assert OPTIONAL_COLUMNS == [
        "bucket_lo",
        "bucket_hi",
        "axis",
        "axis_value",
        "layer",
        "ci_lo",
        "ci_hi",
    ]
    for m in (
        "nll",
        "passkey_acc",
        "shift_dnll",
        "order_dnll",
        "attn_entropy",
        "context_nll",
        "position_probe_r2",
        "passkey_context",
    ):
        assert m in ROW_METRICS
    assert "run_id" not in CELL_COLUMNS and "value" not in CELL_COLUMNS


def test_canonical_json_is_stable() -> None:
    a = canonical_json({"factor": 4.0, "beta_fast": np.int64(32), "short_factor": (1.0, 1.5)})
    b = canonical_json({"short_factor": [1, 1.5], "beta_fast": 32, "factor": 4})
    assert a == b == '{"beta_fast":32,"factor":4,"short_factor":[1,1.5]}'
    assert canonical_json({"x": np.float32(0.1)}) == '{"x":0.1}'
    assert canonical_json(None) == "{}"
    assert json.loads(canonical_json({"a": {"c": 1, "b": 2}})) == {"a": {"b": 2, "c": 1}}
    assert canonical_json({"z": 1, "a": 2}).index('"a"') < canonical_json({"z": 1, "a": 2}).index(
        '"z"'
    )
    # negative control: different values must stay different
    assert canonical_json({"factor": 4.5}) != canonical_json({"factor": 4})
    with pytest.raises(ValueError, match="cannot encode"):
        canonical_json({"f": object()})
    # one canonical JSON for params columns and checkpoint keys: float noise below 12
    # significant digits disappears, real differences stay, non-finite values stay valid JSON
    assert 3e-3 * 0.1 != 3e-4 and canonical_json(3e-3 * 0.1) == canonical_json(3e-4) == "0.0003"
    assert canonical_json(0.1 + 1e-11) != canonical_json(0.1)
    assert json.loads(canonical_json({"x": float("inf"), "y": float("nan")})) == {
        "x": "inf",
        "y": "nan",
    }
    assert canonical_json({"s": {3, 1, 2}}) == '{"s":[1,2,3]}'


def test_normalize_types_and_params() -> None:
    df = normalize_results(
        [row(position_params='{ "base" : 10000.0 }', axis_value=128.0, layer=1.0)]
    )
    assert df.loc[0, "position_params"] == '{"base":10000}'
    assert df.loc[0, "scaling_params"] == "{}"
    assert df.loc[0, "axis_value"] == "128"
    assert df["train_length"].dtype == np.int64 and df["value"].dtype == np.float64
    assert int(df.loc[0, "layer"]) == 1 and np.isnan(df.loc[0, "bucket_lo"])
    assert str(df["written_at"].dt.tz) == "UTC"
    assert list(df.columns[: len(REQUIRED_COLUMNS)]) == REQUIRED_COLUMNS
    region = normalize_results([row(axis="region", axis_value="beyond")])
    assert region.loc[0, "axis_value"] == "beyond"


@pytest.mark.parametrize("column", ["metric", "corpus_fingerprint", "seed"])
def test_missing_required_column_is_named(column: str, tmp_path: Path) -> None:
    r = row()
    del r[column]
    with pytest.raises(ValueError, match=f"missing required column.*'{column}'"):
        write_results([r], tmp_path / "x.parquet")
    assert not any(tmp_path.iterdir())


def test_bad_values_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'eval_length' must hold integers"):
        normalize_results([row(eval_length=12.5)])
    with pytest.raises(ValueError, match="'value' must hold numbers"):
        normalize_results([row(value="high")])
    with pytest.raises(ValueError, match="'position_params'.*not JSON"):
        normalize_results([row(position_params="base=10000")])
    with pytest.raises(ValueError, match="'model_id' is empty"):
        normalize_results([row(model_id=None)])
    with pytest.raises(ValueError, match="must end in '.parquet'"):
        write_results([row()], tmp_path / "x.csv")
    assert (
        normalize_results([row(value=float("nan"))])["value"].isna().all()
    )  # diverged runs are kept


def test_write_roundtrip(tmp_path: Path) -> None:
    rows = sweep_rows()
    path = write_results(rows, tmp_path / "exp" / "run-1.parquet")
    assert path.is_file() and [p.name for p in path.parent.iterdir()] == ["run-1.parquet"]
    back = load_results([tmp_path / "exp"])
    assert len(back) == len(rows)
    assert set(back["source_file"]) == {str(path.resolve())}
    assert back[back["metric"] == "passkey_acc"]["axis_value"].tolist() == ["0.5"] * 4


def test_atomic_write_leaves_nothing_half_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "run.parquet"
    write_results([row(value=1.0)], target)
    before = target.read_bytes()

    def crash(table: object, path: str, **kw: object) -> None:
        Path(path).write_bytes(b"PAR1 half written")
        raise RuntimeError("disk full")

    monkeypatch.setattr(pq, "write_table", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        write_results([row(value=2.0)], target)
    assert target.read_bytes() == before  # the old complete file is untouched
    assert [p.name for p in tmp_path.iterdir()] == ["run.parquet"]  # temp file cleaned up
    monkeypatch.undo()
    assert load_results([tmp_path])["value"].tolist() == [1.0]


def test_leftover_temp_files_are_not_loaded(tmp_path: Path) -> None:
    write_results([row()], tmp_path / "a.parquet")
    (tmp_path / ".b.parquet.x1y2.tmp").write_bytes(b"garbage")
    (tmp_path / ".hidden.parquet").write_bytes(b"garbage")
    assert len(load_results([tmp_path])) == 1


def test_rerun_same_path_adds_no_duplicates(tmp_path: Path) -> None:
    rows = sweep_rows()
    write_results(rows, tmp_path / "run.parquet")
    write_results([{**r, "value": r["value"] + 1} for r in rows], tmp_path / "run.parquet")
    back = load_results([tmp_path])
    assert len(back) == len(rows)
    assert sorted(back["value"]) == pytest.approx(sorted(r["value"] + 1 for r in rows))


def test_dedup_keeps_newest_across_files(tmp_path: Path) -> None:
    old_t, new_t = pd.Timestamp("2024-01-01", tz="UTC"), pd.Timestamp("2024-02-01", tz="UTC")
    rows = sweep_rows()
    # newer file is named so that it sorts (and is read) first: order must not decide
    write_results(
        pd.DataFrame(rows).assign(value=7.0, written_at=new_t, run_id="rerun"),
        tmp_path / "a.parquet",
    )
    write_results(pd.DataFrame(rows).assign(written_at=old_t), tmp_path / "b.parquet")
    deduped = load_results([tmp_path])
    assert len(deduped) == len(rows)
    assert (deduped["value"] == 7.0).all() and set(deduped["run_id"]) == {"rerun"}
    # negative control: without dedup the old values are still there
    raw = load_results([tmp_path], dedup=False)
    assert len(raw) == 2 * len(rows)
    assert (raw["value"] != 7.0).sum() == len(rows)


def test_dedup_is_nan_safe_and_respects_cells() -> None:
    t0, t1 = pd.Timestamp("2024-01-01", tz="UTC"), pd.Timestamp("2024-01-02", tz="UTC")
    df = normalize_results(
        [
            row(value=1.0, written_at=t0),  # whole window (NaN buckets)
            row(value=2.0, written_at=t1),  # same cell, newer -> wins
            row(value=3.0, bucket_lo=0, bucket_hi=32, written_at=t0),  # different cell (bucket)
            row(value=4.0, seed=1, written_at=t0),  # different seed
            row(value=5.0, metric="passkey_acc", axis="depth", axis_value=0.5, written_at=t0),
            row(value=6.0, metric="passkey_acc", axis="depth", axis_value=0.75, written_at=t0),
            row(value=7.0, corpus_fingerprint="fp2", written_at=t0),
        ]
    )
    out = dedup_results(df)
    assert sorted(out["value"]) == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    # ties on written_at: the later row wins
    tie = dedup_results(
        normalize_results([row(value=1.0, written_at=t0), row(value=9.0, written_at=t0)])
    )
    assert tie["value"].tolist() == [9.0]


def test_dedup_keeps_rows_of_other_arms_and_templates() -> None:
    """Two arms (different models), or two passkey templates on one model, are different cells;
    before, the newer row of the other arm or template replaced the older one."""
    t0, t1 = pd.Timestamp("2024-01-01", tz="UTC"), pd.Timestamp("2024-01-02", tz="UTC")
    passkey = {"metric": "passkey_acc", "axis": "depth", "axis_value": 0.5}
    df = normalize_results(
        [
            row(value=1.0, arm="lm", written_at=t0),
            row(value=2.0, arm="retrieval", written_at=t1),
            row(value=3.0, template="short", written_at=t0, **passkey),
            row(value=4.0, template="landmark", written_at=t1, **passkey),
        ]
    )
    assert sorted(dedup_results(df)["value"]) == [1.0, 2.0, 3.0, 4.0]
    # control: the same arm and template are one cell, the newest row wins
    same = normalize_results(
        [
            row(value=1.0, arm="lm", written_at=t0),
            row(value=2.0, arm="lm", written_at=t1),
            row(value=3.0, template="short", written_at=t0, **passkey),
            row(value=4.0, template="short", written_at=t1, **passkey),
        ]
    )
    assert sorted(dedup_results(same)["value"]) == [2.0, 4.0]


def test_per_document_lists_round_trip_next_to_rows_without_them(tmp_path: Path) -> None:
    rows = [row(doc_nll_sums=[1.5, 2.5], doc_tokens=[10, 12]), row(eval_length=64)]
    path = write_results(rows, tmp_path / "r.parquet")
    back = load_results(path).sort_values("eval_length")
    assert back["doc_nll_sums"].iloc[1] == [1.5, 2.5] and back["doc_tokens"].iloc[1] == [10.0, 12.0]
    assert back["doc_nll_sums"].iloc[0] is None


def test_missing_written_at_uses_file_mtime(tmp_path: Path) -> None:
    old = normalize_results([row(value=1.0)]).drop(columns=["written_at"])
    new = normalize_results([row(value=2.0)]).drop(columns=["written_at"])
    old.to_parquet(tmp_path / "z_old.parquet")
    new.to_parquet(tmp_path / "a_new.parquet")
    os.utime(tmp_path / "z_old.parquet", (1_000_000, 1_000_000))
    assert load_results([tmp_path])["value"].tolist() == [2.0]


def test_load_accepts_files_and_dirs_and_partial_sweeps(tmp_path: Path) -> None:
    write_results([row(position="rope")], tmp_path / "d1" / "sub" / "a.parquet")
    write_results([row(position="alibi", eval_length=64)], tmp_path / "b.parquet")
    df = load_results([tmp_path / "d1", tmp_path / "b.parquet"])
    assert sorted(df["position"]) == ["alibi", "rope"]
    # the same file reached twice is read once
    assert len(load_results([tmp_path, tmp_path / "b.parquet"])) == 2


def test_load_errors_name_the_paths(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does_not_exist.*does not exist"):
        load_results([tmp_path / "does_not_exist"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no .parquet result files found under .*empty"):
        load_results([tmp_path / "empty"])
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="notes.txt.*not a .parquet"):
        load_results([tmp_path / "notes.txt"])
    (tmp_path / "bad").mkdir()
    pd.DataFrame({"metric": ["nll"]}).to_parquet(tmp_path / "bad" / "x.parquet")
    with pytest.raises(ValueError, match=r"x\.parquet: results are missing required column"):
        load_results([tmp_path / "bad"])
    with pytest.raises(ValueError, match="no results paths"):
        load_results([])


def test_module_does_not_need_torch() -> None:
    assert "torch" not in R.__dict__
