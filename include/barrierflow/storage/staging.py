"""Tasks write an epoch's staged files; the driver only gets their descriptions.

Every task writes its rows as Parquet straight into the table's staging directory and returns one description per file (path,
size, row count, Delta statistics). The epoch's add actions are made from those, never from listing a directory, so files of a
failed or speculative task attempt are never committed (an abort deletes the whole directory).

State tables are written clustered by key group: a file never spans two of the ``partitions`` contiguous key-group ranges, so its
key-group statistics stay narrow and an epoch that touches few key groups skips most files.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import uuid
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from barrierflow.core.columns import KEY_GROUP
from barrierflow.core.errors import StorageError
from barrierflow.storage.commits import StagedFile
from barrierflow.storage.objects import arrow_filesystem, is_local, join_uri

__all__ = ["write_partition", "write_parquet"]

_ROW_GROUP_ROWS = 64 * 1024
_FILE_ROWS = 2_000_000  # at most, in a file of the driver-side writer


def write_partition(
    table_uri: str, prefix: str, schema: pa.Schema, ranges: tuple[int, int] | None, rows: pa.Table
) -> list[dict[str, Any]]:
    """Executor side: write ``rows`` in ``schema``; one description per file.

    ``ranges = (partitions, key_groups)``: rows sorted by key group, a new file at each range boundary.
    """
    rows = rows.select(schema.names).cast(schema)
    return [_write_file(table_uri, prefix, part) for part in _split_ranges(rows, ranges) if part.num_rows]


def write_parquet(table_uri: str, prefix: str, data: pa.Table, *, sort_by: Sequence[str] = ()) -> list[StagedFile]:
    """The driver-side writer, for rows already in this process (compaction, tests)."""
    if sort_by:
        data = data.sort_by([(c, "ascending") for c in sort_by])
    return [StagedFile(**_write_file(table_uri, prefix, data.slice(i, _FILE_ROWS))) for i in range(0, data.num_rows, _FILE_ROWS)]


def _split_ranges(rows: pa.Table, ranges: tuple[int, int] | None) -> Iterator[pa.Table]:
    if ranges is None:
        yield rows
        return
    partitions, key_groups = ranges
    ids = rows[KEY_GROUP].to_numpy().astype(np.int64) * partitions // key_groups
    bounds = [0, *(np.flatnonzero(np.diff(ids)) + 1), rows.num_rows]  # sorted by key group: equal ids are contiguous
    for start, end in zip(bounds, bounds[1:]):
        yield rows.slice(int(start), int(end - start))


def _write_file(table_uri: str, prefix: str, rows: pa.Table) -> dict[str, Any]:
    """One staged Parquet file of ``rows`` (zstd, microsecond timestamps, never INT96); its description."""
    rel = f"{prefix}/part-{uuid.uuid4().hex}.parquet"
    uri = join_uri(table_uri, rel)
    fs, path = arrow_filesystem(uri)
    options = {
        "compression": "zstd",
        # Floating-point values rarely repeat: a dictionary costs time and bytes.
        "use_dictionary": [f.name for f in rows.schema if not pa.types.is_floating(f.type)],
        "coerce_timestamps": "us",
        "use_deprecated_int96_timestamps": False,
    }
    try:
        if is_local(uri):  # an object store has no directories (pyarrow would PUT a marker object)
            fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        # A stream of our own: its position is the file's size, so no request asks for it
        # after the upload (with the file system's delayed open, a small file is one PUT).
        with fs.open_output_stream(path) as sink:
            with pq.ParquetWriter(sink, rows.schema, **options) as writer:
                writer.write_table(rows, row_group_size=_ROW_GROUP_ROWS)
            size = sink.tell()
    except BaseException as exc:
        with contextlib.suppress(OSError):
            fs.delete_file(path)  # inside the staging directory: deleted with it on abort anyway
        if isinstance(exc, OSError):
            raise StorageError(f"cannot stage {path}: {exc}") from exc
        raise
    return {"path": rel, "size": size, "rows": rows.num_rows, "stats": _file_stats(rows)}


def _file_stats(rows: pa.Table) -> str:
    """A file's Delta statistics: min/max of integer (exact) and zoned timestamp columns; floats and strings have none.

    Timestamps at Delta's millisecond precision, rounded outwards: no reader skips a file holding a row it wants.
    """
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for f in rows.schema:
        zoned = pa.types.is_timestamp(f.type) and f.type.tz is not None and f.type.unit != "ns"
        if not (zoned or pa.types.is_integer(f.type)):
            continue
        nulls[f.name] = rows[f.name].null_count
        low, high = pc.min_max(rows[f.name]).as_py().values()
        if low is not None:
            mins[f.name] = _delta_timestamp(low, up=False) if zoned else low
            maxs[f.name] = _delta_timestamp(high, up=True) if zoned else high
    return json.dumps({"numRecords": rows.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls})


def _delta_timestamp(value: datetime.datetime, *, up: bool) -> str:
    """A timestamp statistic as Delta writes it (UTC, milliseconds), rounded ``up`` or down to the millisecond."""
    millis = value.replace(microsecond=value.microsecond // 1000 * 1000)
    if up and millis != value:
        millis += datetime.timedelta(milliseconds=1)
    return millis.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
