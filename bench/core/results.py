"""Result files: atomic parquet writes, verified reads, loading with "newest wins" dedup.

One row per measured value (tidy, long format). Every job writes one parquet file named by its
run_id; a rerun overwrites that file atomically, and :func:`load_results` keeps, per measured cell,
only the row with the newest ``written_at`` timestamp, so reruns never add duplicate rows.

The columns of a row, canonical JSON and the validation of rows
(:func:`bench.core.rows.normalize_results`) are in :mod:`bench.core.rows`.

Integrity: :func:`write_results` stores the SHA-256 of the rows
(:func:`bench.core.result_digest.rows_sha256`) in the parquet file's key-value metadata; every reader
recomputes it (:func:`read_result_table`), so a file whose bytes changed on disk but
that still reads is refused (a job moves it aside and recomputes it) instead of silently changing
a number. Files written before the digest existed (no such key, e.g. the committed ``results/``)
are read as legacy files, unverified. A measured value (``n > 0``) is never NaN or infinite
(:func:`bench.core.rows.non_finite_row`): such a row is refused on write and on read; a row that
measured nothing (``n == 0``, e.g. no test document long enough) holds NaN.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.core.checks import first_line
from bench.core.result_digest import DIGEST_KEY, digest_problem, rows_sha256
from bench.core.rows import (
    FINETUNE_COLUMNS,
    REQUIRED_COLUMNS,
    TIMESTAMP_COLUMN,
    describe_row,
    non_finite_row,
    normalize_results,
)
from models.lazy import pd

#: Columns that identify one measured cell; rows agreeing on all of them are duplicates.
CELL_COLUMNS: list[str] = [
    "experiment",
    "model_id",
    "position",
    "position_params",
    "scaling",
    "scaling_params",
    "train_length",
    "eval_length",
    "metric",
    "seed",
    "corpus_fingerprint",
    "bucket_lo",
    "bucket_hi",
    "axis",
    "axis_value",
    "layer",
    "arm",
    "template",
    "task",
    *FINETUNE_COLUMNS,
]


# ----------------------------------------------------------------------------- read


def read_result_table(path: str | Path) -> Any:
    """The pyarrow Table of a result file, its digest verified; ValueError (one sentence naming
    the file) when it cannot be read or its rows changed since they were written."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - any reader error means an unreadable file
        raise ValueError(f"cannot read results file {str(path)!r}: {first_line(exc)}") from exc
    problem = digest_problem(table)
    if problem is not None:
        raise ValueError(
            f"results file {str(path)!r} {problem}; rerun its job to recompute it (lenbench moves "
            "the file aside), or remove the file."
        )
    return table


# ----------------------------------------------------------------------------- write / load


def os_error_naming(cause: BaseException, path: str | Path) -> OSError | None:
    """An OSError that names no file (a full disk, ENOSPC, raised by a write) as one naming
    ``path``, for the one-sentence error of every atomic writer; None for any other error."""
    if isinstance(cause, OSError) and cause.filename is None:
        return OSError(cause.errno, cause.strerror or str(cause), str(path))
    return None


def umask_mode() -> int:
    """The mode a plain ``open`` would give a new file (0o666 less the umask): mkstemp's 0o600
    would make a shared cluster cache or results folder unreadable to the rest of a group."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_results(rows: pd.DataFrame | Iterable[Mapping[str, Any]], path: str | Path) -> Path:
    """Validate ``rows`` and write them to ``path`` (parquet) atomically; return the path.

    The table goes to a hidden temporary file in the same directory, is flushed to disk and then
    renamed over ``path`` with ``os.replace``: readers see the old file or the new one, never a
    half-written one, and a crash leaves no ``*.parquet`` behind. One file per job (named by its
    run_id) means a rerun replaces its own file instead of adding rows. The file's metadata holds
    the SHA-256 of its rows (:data:`DIGEST_KEY`), checked by every reader here. Raises
    ValueError on a row whose measured value is NaN or infinite
    (:func:`bench.core.rows.non_finite_row`).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    df = normalize_results(rows)
    if df.empty:
        raise ValueError(f"no result rows to write to {str(path)!r}; pass at least one row")
    path = Path(path)
    if path.suffix != ".parquet":
        raise ValueError(f"results path {str(path)!r} must end in '.parquet'")
    bad = non_finite_row(df)
    if bad is not None:
        raise ValueError(
            f"refusing to write {str(path)!r}: {describe_row(df.iloc[bad])} is "
            f"{df['value'].iloc[bad]}, and a non-finite value is never a result."
        )
    table = pa.Table.from_pandas(df, preserve_index=False)
    metadata = dict(table.schema.metadata or {})
    metadata[DIGEST_KEY] = rows_sha256(table).encode("ascii")
    table = table.replace_schema_metadata(metadata)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        pq.write_table(table, tmp_name)
        with open(tmp_name, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp_name, umask_mode())
        os.replace(tmp_name, path)
    except BaseException as exc:
        Path(tmp_name).unlink(missing_ok=True)
        named = os_error_naming(exc, path)
        if named is not None:
            raise named from exc
        raise
    return path


def _result_files(paths: Sequence[str | Path]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(
                f
                for f in p.rglob("*.parquet")
                if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts)
            )
            files.extend(found)
        elif p.is_file():
            if p.suffix != ".parquet":
                raise ValueError(f"results file {str(p)!r} is not a .parquet file")
            files.append(p)
        else:
            raise ValueError(
                f"results path {str(p)!r} does not exist; pass a results directory or .parquet file"
            )
    # one entry per file, named as it was found (relative paths stay relative: reports built from
    # committed results must not carry this machine's directories)
    unique: dict[Path, Path] = {}
    for f in files:
        unique.setdefault(f.resolve(), f)
    return list(unique.values())


def _first_bad_file(frames: list[pd.DataFrame]) -> str | None:
    for frame in frames:
        try:
            normalize_results(frame)
        except ValueError:
            return str(frame["source_file"].iloc[0])
    return None


def effective_length_score(task_params: Any) -> str:
    """The score an ``effective_length`` row reads (``task_params``' ``score``); rows written
    before both scores were stored read RULER's ``match``."""
    params = json.loads(task_params) if isinstance(task_params, str) and task_params else {}
    return str(params.get("score", "match"))


def _effective_length_score(df: pd.DataFrame) -> list:
    """Per row: :func:`effective_length_score` for an ``effective_length`` row (one cell per
    score), else None."""
    if "task_params" not in df.columns:
        return [None] * len(df)
    return [
        effective_length_score(params) if metric == "effective_length" else None
        for metric, params in zip(df["metric"], df["task_params"], strict=True)
    ]


def dedup_results(df: pd.DataFrame) -> pd.DataFrame:
    """Keep, per measured cell (:data:`CELL_COLUMNS`, and the score an ``effective_length`` row
    reads; missing values compare equal), the newest row.

    Ties on ``written_at`` go to the row that comes later in ``df``.
    """
    ordered = df.sort_values(TIMESTAMP_COLUMN, kind="stable")
    key = ordered[CELL_COLUMNS].astype(object).where(ordered[CELL_COLUMNS].notna(), None)
    key = key.assign(_score=_effective_length_score(ordered))
    keep = ~key.duplicated(keep="last").to_numpy()
    return ordered[keep].sort_index()


def load_results(paths: str | Path | Sequence[str | Path], *, dedup: bool = True) -> pd.DataFrame:
    """Load result tables from directories (all ``**/*.parquet``) and files.

    Rows are validated and concatenated; with ``dedup`` (the default) each measured cell keeps
    only its newest row (see :func:`dedup_results`). A ``source_file`` column records where each
    row came from. Files without ``written_at`` use their modification time. Raises ValueError
    (one sentence naming the file) on a file that cannot be read, whose rows do not match the
    SHA-256 recorded in it (:func:`read_result_table`), or that holds a measured value that is
    NaN or infinite (:func:`bench.core.rows.non_finite_row`).
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    paths = list(paths)
    if not paths:
        raise ValueError("no results paths given; pass results directories or .parquet files")
    files = _result_files(paths)
    shown = ", ".join(repr(str(p)) for p in paths)
    if not files:
        raise ValueError(f"no .parquet result files found under {shown}")
    frames = []
    for f in files:
        raw = read_result_table(f).to_pandas()
        if raw.empty:
            continue
        missing = [c for c in REQUIRED_COLUMNS if c not in raw.columns]
        if missing:
            raise ValueError(
                f"{f}: results are missing required column(s) "
                f"{', '.join(repr(c) for c in missing)}; required columns are: "
                f"{', '.join(REQUIRED_COLUMNS)}"
            )
        if TIMESTAMP_COLUMN not in raw.columns:
            raw[TIMESTAMP_COLUMN] = pd.Timestamp(f.stat().st_mtime, unit="s", tz="UTC")
        raw["source_file"] = str(f)
        frames.append(raw)
    if not frames:
        raise ValueError(f"the result files under {shown} hold no rows")
    raw_all = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    try:
        df = normalize_results(raw_all)  # one pass over all files: much faster than per file
    except ValueError as exc:
        bad = _first_bad_file(frames)
        raise ValueError(f"{bad}: {exc}" if bad else str(exc)) from exc
    bad_row = non_finite_row(df)
    if bad_row is not None:
        row = df.iloc[bad_row]
        raise ValueError(
            f"results file {row['source_file']!r} holds {row['value']} for {describe_row(row)}: a "
            "non-finite value is never a result; rerun its job or remove the file."
        )
    if dedup:
        df = dedup_results(df)
    return df.reset_index(drop=True)
