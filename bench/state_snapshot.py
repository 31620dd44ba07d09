"""Size of a full snapshot of a pipeline's keyed state, for the incremental-checkpoint ratio.

Every Delta table under ``<warehouse>/<pipeline>/state/`` is read whole and
reduced to one row per key: the row with the highest ``_epoch`` (the last
one read on ties). Key columns are taken from the table's metadata when it
documents them (a configuration entry or a JSON description naming
``key_columns``/``keys``), else the benchmark's own key ``sensor_id`` if the
table has it. Without either, the table is written as is and its size scaled
by ``known_keys / rows``. Each reduced table is written to one zstd Parquet
file; the snapshot size is the sum of those files' sizes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

__all__ = ["SnapshotSize", "full_snapshot_bytes", "delta_tables"]

EPOCH_COLUMN = "_epoch"
BENCH_KEY_COLUMNS = ["sensor_id"]
KEY_ENTRY_SUFFIXES = ("key_columns", "keycolumns", "keys")


@dataclass(frozen=True)
class SnapshotSize:
    """Total snapshot bytes and a description of how each table was reduced."""

    bytes: int
    methods: list[str]


def delta_tables(root: Path) -> list[Path]:
    """Directories under ``root`` (inclusive) that hold a Delta table, sorted."""
    if not root.is_dir():
        return []
    return sorted(log.parent for log in root.rglob("_delta_log") if log.is_dir())


def _as_names(value: Any) -> list[str]:
    """Column names from a metadata value: a list, a JSON list or a comma-separated string."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = value.split(",")
    if isinstance(value, str):
        value = [value]
    return [str(name).strip() for name in value] if isinstance(value, list) else []


def _metadata_entries(table: DeltaTable) -> dict[str, Any]:
    """The table's configuration plus its description when that is a JSON object."""
    metadata = table.metadata()
    entries: dict[str, Any] = dict(metadata.configuration)
    try:
        description = json.loads(metadata.description or "")
    except json.JSONDecodeError:
        description = None
    if isinstance(description, dict):
        entries.update(description)
    return entries


def _key_columns(table: DeltaTable, columns: list[str]) -> tuple[list[str], str] | None:
    """Key columns and where they came from, or None if they cannot be told."""
    for name, value in _metadata_entries(table).items():
        keys = _as_names(value) if name.lower().endswith(KEY_ENTRY_SUFFIXES) else []
        if keys and all(key in columns for key in keys):
            return keys, f"metadata {name!r}"
    if all(key in columns for key in BENCH_KEY_COLUMNS):
        return BENCH_KEY_COLUMNS, "benchmark key"
    return None


def _latest_per_key(rows: pa.Table, keys: list[str]) -> pa.Table:
    """One row per key: the highest ``_epoch`` if present, else the last row read."""
    frame = rows.to_pandas(types_mapper=pd.ArrowDtype)
    if EPOCH_COLUMN in frame.columns:
        frame = frame.sort_values(EPOCH_COLUMN, kind="stable")
    latest = frame.drop_duplicates(subset=keys, keep="last")
    return pa.Table.from_pandas(latest, schema=rows.schema, preserve_index=False)


def _write_zstd(rows: pa.Table, path: Path) -> int:
    """Write ``rows`` as one zstd Parquet file and return its size in bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows, path, compression="zstd")
    return path.stat().st_size


def _table_snapshot(path: Path, name: str, out_dir: Path, known_keys: int) -> tuple[int, str]:
    """Snapshot bytes of one state table and how they were obtained."""
    out_file = out_dir / f"{name}.parquet"
    table = DeltaTable(str(path))
    rows = table.to_pyarrow_table()
    found = _key_columns(table, rows.column_names)
    if found is not None:
        keys, source = found
        latest = _latest_per_key(rows, keys)
        return _write_zstd(
            latest, out_file
        ), f"{name}: {rows.num_rows:,} rows -> {latest.num_rows:,} keys by {keys} ({source})"
    size = _write_zstd(rows, out_file)
    if rows.num_rows <= known_keys:
        return size, f"{name}: {rows.num_rows:,} rows, keys unknown, written as is"
    scaled = round(size * known_keys / rows.num_rows)
    return scaled, f"{name}: {rows.num_rows:,} rows, keys unknown, size scaled to {known_keys:,} keys"


def full_snapshot_bytes(state_root: str | Path, out_dir: str | Path, known_keys: int) -> SnapshotSize:
    """Bytes of a zstd Parquet full snapshot of every state table under ``state_root``.

    ``known_keys`` is the number of distinct keys the input holds, used only
    when a table's key columns cannot be determined.
    """
    root, out = Path(state_root), Path(out_dir)
    total, methods = 0, []
    for path in delta_tables(root):
        name = "/".join(path.relative_to(root).parts) or "state"
        size, method = _table_snapshot(path, name, out, known_keys)
        total += size
        methods.append(method)
    return SnapshotSize(total, methods)
