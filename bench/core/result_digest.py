"""The SHA-256 of a result table's rows, recorded in its parquet key-value metadata.

:func:`bench.core.results.write_results` records :func:`rows_sha256` under :data:`DIGEST_KEY`; every
reader (:func:`bench.core.results.read_result_table`, a job that finds its file) recomputes it, so a
file whose bytes changed on disk but that still reads is refused instead of silently changing a
number. The digest covers each column's name, type and values (not the file's bytes), so a
normal write/read round trip keeps it; files written before it existed have no such key and are
read unverified.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

#: Key of a result file's parquet key-value metadata holding :func:`rows_sha256` of its rows.
DIGEST_KEY = b"lenbench.rows_sha256"


def _column_bytes(column: Any) -> bytes:
    """A canonical byte form of one Arrow column's values: the same values give the same bytes
    however the column is chunked, and whatever lies under its nulls."""
    import pyarrow as pa

    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = array.type
    fixed = (
        pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_timestamp(kind)
        or pa.types.is_boolean(kind)
    )
    if not fixed:  # strings, lists, nulls: their Python values as JSON (floats as repr)
        return json.dumps(array.to_pylist(), default=str, ensure_ascii=False).encode("utf-8")
    nulls = array.is_null().to_numpy(zero_copy_only=False)
    if pa.types.is_timestamp(kind):
        array = array.cast(pa.int64())
    filled = array.fill_null(False if pa.types.is_boolean(kind) else 0)
    values = np.ascontiguousarray(filled.to_numpy(zero_copy_only=False))
    return nulls.tobytes() + values.astype(values.dtype.newbyteorder("<")).tobytes()


def _type_name(kind: Any) -> str:
    """An Arrow type as text, list types without their child's field name (pyarrow names it
    ``item`` when it builds the list, parquet ``element`` when it reads it back) and large
    variants as the plain ones (the same values, whichever a reader picks)."""
    import pyarrow as pa

    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return f"list<{_type_name(kind.value_type)}>"
    if pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return "string"
    return str(kind)


def rows_sha256(table: Any) -> str:
    """SHA-256 (hex) of a pyarrow Table's rows: each column's name, type and values, in order.
    Its schema metadata (where the digest itself is kept) does not enter it."""
    digest = hashlib.sha256()
    for name, column in zip(table.column_names, table.columns, strict=True):
        header = json.dumps([name, _type_name(column.type), len(column)]).encode("utf-8")
        body = _column_bytes(column)
        digest.update(len(header).to_bytes(8, "little") + header)
        digest.update(len(body).to_bytes(8, "little") + body)
    return digest.hexdigest()


def recorded_sha256(table: Any) -> str | None:
    """The rows' SHA-256 recorded in a result file's metadata, or None (a legacy file)."""
    recorded = (table.schema.metadata or {}).get(DIGEST_KEY)
    return None if recorded is None else recorded.decode("ascii", errors="replace")


def digest_problem(table: Any) -> str | None:
    """Why a result table read from disk is not the one written (its rows' SHA-256 differs from
    the one recorded in it), else None; a file without a recorded digest (written before
    lenbench recorded one) passes unverified."""
    recorded = recorded_sha256(table)
    if recorded is None or rows_sha256(table) == recorded:
        return None
    return (
        "does not match the SHA-256 of its rows recorded when it was written (its bytes changed "
        "on disk)"
    )
