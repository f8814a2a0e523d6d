"""The committed rows keep their series labels and switch columns under the design registry
(issue 75 Part A).

Labels: every committed report's ``tables/source_rows.csv`` holds each row as the report read it
with the ``position_label``, ``scaling_label`` and ``series`` the code of its day computed; the
labels ``bench.report.frame.add_labels`` computes now from the same rows (the design marks come
from ``models.designs``) must be those. Columns: every committed result file under ``results/``
holds the switch columns ``bench.trained_source`` wrote (from ``ModelConfig.switches()`` before
the registry); the model config those values select (each value looked up in the registry) must
give exactly those columns again (``design_columns``), and every value must be a registered
variant. Negative controls: a changed design label changes the labels of the reports that use
it, and a column value no design declares is caught.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from bench.report.frame import add_labels
from models.designs.registry import SWITCHES, design_column_names, design_columns, designs
from models.model_config import ModelConfig

from fixtures import ROOT

LABELS = ["position_label", "scaling_label", "series"]
REPORTS = sorted(p.parents[1].name for p in (ROOT / "reports").glob("*/tables/source_rows.csv"))


def _stored(report: str) -> pd.DataFrame:
    return pd.read_csv(ROOT / "reports" / report / "tables" / "source_rows.csv", low_memory=False)


def _relabelled(stored: pd.DataFrame) -> pd.DataFrame:
    return add_labels(stored.drop(columns=LABELS))


def test_the_committed_reports_cover_every_switch_column():
    """The comparison below reaches the switches (else it would compare nothing of them)."""
    seen = set()
    for report in REPORTS:
        seen |= set(_stored(report).columns) & set(design_column_names())
    assert {"qk_norm", "output_gate", "attn_scale", "attention", "attention_sink"} <= seen


@pytest.mark.parametrize("report", REPORTS)
def test_committed_labels_are_recomputed_exactly(report):
    stored = _stored(report)
    fresh = _relabelled(stored)
    for column in LABELS:
        assert fresh[column].tolist() == stored[column].tolist(), (report, column)


def test_a_changed_design_label_changes_the_labels(monkeypatch):
    """Control: the labels above depend on the registry's marks."""
    design = designs()[("attn_scale", "ssmax")]
    monkeypatch.setattr(design, "label", " +scalable softmax")
    stored = _stored("zoo_2025")
    fresh = _relabelled(stored)
    changed = fresh["series"] != stored["series"]
    assert changed.any() and (stored.loc[changed, "attn_scale"] == "ssmax").all()


def _config_of(columns: dict[str, str]) -> ModelConfig:
    """The model config whose switches the stored column values name (each looked up among
    the registered designs' variants; ValueError for a value none declares)."""
    fields = {}
    for column, value in columns.items():
        if column == "hybrid_every":
            fields[column] = int(value)
            continue
        match = [d for d in designs().values() if d.switch == column and d.variant == value]
        if not match:
            raise ValueError(f"{column}={value!r} names no registered design")
        fields[column] = True if SWITCHES[column].type is bool else match[0].name
    return ModelConfig(**fields)


def _committed_switch_values() -> set[tuple[tuple[str, str], ...]]:
    """Each distinct set of switch column values in the committed result files."""
    names = set(design_column_names())
    combos = set()
    for path in sorted((ROOT / "results").rglob("*.parquet")):
        present = [c for c in pq.read_schema(path).names if c in names]
        if not present:
            combos.add(())
            continue
        frame = pq.read_table(path, columns=present).to_pandas().drop_duplicates()
        for row in frame.to_dict("records"):
            combos.add(tuple(sorted((k, v) for k, v in row.items() if pd.notna(v))))
    return combos


def test_committed_switch_columns_are_recomputed_exactly():
    combos = _committed_switch_values()
    assert len(combos) >= 6  # the default and the zoo_2025 / leaderboard / sink designs
    for combo in combos:
        assert design_columns(_config_of(dict(combo))) == dict(combo), combo
    # control: a value no design declares is caught, not passed through
    with pytest.raises(ValueError, match="names no registered design"):
        _config_of({"attn_scale": "ssmax2"})


def test_source_rows_exist_for_the_reports_with_switches():
    assert {"zoo_2025", "train_for_length"} <= set(REPORTS)
    assert all(Path(ROOT / "reports" / r / "tables" / "source_rows.csv").is_file() for r in REPORTS)


def test_series_keys_of_rows_without_a_mixer_are_the_strings_they_were():
    """The leaderboard seeds its bootstraps with series keys: a committed row's key must be the
    string the columns before the registry gave (the fixed columns joined, the mixer's absent);
    a mixer row's key differs and its label names the mixer (control)."""
    from bench.core.series import SERIES_COLUMNS, TAGGED_COLUMNS, series_key, series_labels

    stored = _stored("zoo_2025")
    before = [c for c in SERIES_COLUMNS if c not in TAGGED_COLUMNS]
    assert len(before) == len(SERIES_COLUMNS) - 2 and SERIES_COLUMNS[-1] == "finetune_steps"
    old = stored.reindex(columns=before).astype(object)
    old = old.where(old.notna(), "").map(str).agg("\x1f".join, axis=1)
    assert series_key(stored).tolist() == old.tolist()
    mixed = stored.head(2).assign(mixer=["gated_deltanet", None], hybrid_every=["4", None])
    keys = series_key(mixed).tolist()
    assert keys[0] != keys[1] and keys[1] == old.iloc[1]
    assert "mixer=gated_deltanet" in series_labels(keys)[keys[0]]
