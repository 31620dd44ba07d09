"""Tasks write an epoch's staged files; the driver only gets their descriptions.

This is how Spark's own Delta writer divides the work: every task writes
its rows as Parquet straight into the table's staging directory and
returns one description per file (path, size, row count, Delta
statistics). The add actions of the epoch's commit are made from those
rows, never from listing a directory, so files of a failed or speculative
task attempt are never committed (an abort deletes the whole directory).

State tables are written clustered by key group: rows are sorted by key
group and a file never spans two of the ``partitions`` contiguous key-group
ranges, so each file's min/max key-group statistics stay narrow and an
epoch that touches few key groups skips most files.
"""

from __future__ import annotations

import datetime
import json
import uuid
from typing import Any, Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from barrierflow.core.columns import KEY_GROUP
from barrierflow.core.errors import StorageError
from barrierflow.storage.commits import StagedFile
from barrierflow.storage.objects import arrow_filesystem, is_local, join_uri

__all__ = ["write_partition", "write_parquet", "with_constants", "parquet_options", "DESCRIPTION_SCHEMA"]

# One row per written file, collected by the driver.
DESCRIPTION_SCHEMA = pa.schema([("path", pa.string()), ("size", pa.int64()), ("rows", pa.int64()), ("stats", pa.string())])
_ROW_GROUP_ROWS = 64 * 1024


def write_partition(
    table_uri: str,
    prefix: str,
    schema: pa.Schema,
    ranges: tuple[int, int] | None,
    constants: Mapping[str, Any],
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """Executor side: write one partition's batches; yield one description per file.

    With ``ranges = (partitions, key_groups)`` the batches arrive sorted by
    key group and a new file starts at each key-group range boundary.
    ``constants`` are added to every batch (see :func:`stage_frame`).
    """
    files = _RangeFiles(table_uri, prefix, schema, ranges)
    try:
        for batch in batches:
            files.add(with_constants(pa.Table.from_batches([batch]), constants, schema))
        described = files.close()
    finally:
        files.abandon()
    if described:
        yield pa.RecordBatch.from_pylist(described, schema=DESCRIPTION_SCHEMA)


class _RangeFiles:
    """A partition's files of one table: a new file at each key-group range boundary (with ``ranges``)."""

    def __init__(self, table_uri: str, prefix: str, schema: pa.Schema, ranges: tuple[int, int] | None) -> None:
        self.table_uri, self.prefix, self.schema, self.ranges = table_uri, prefix, schema, ranges
        self.out: _FileWriter | None = None
        self.current_range: int | None = None
        self.described: list[dict[str, Any]] = []

    def add(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        for part_range, part in _split_ranges(table, self.ranges):
            if self.out is None or part_range != self.current_range:
                if self.out is not None:
                    self.described.append(self.out.close())
                self.out = _FileWriter(self.table_uri, self.prefix, self.schema)
                self.current_range = part_range
            self.out.write(part)

    def close(self) -> list[dict[str, Any]]:
        """Every file's description; the last file is closed."""
        if self.out is not None:
            out, self.out = self.out, None
            self.described.append(out.close())
        return self.described

    def abandon(self) -> None:
        """Delete the file being written, if any (after an error; a no-op after :meth:`close`)."""
        if self.out is not None:
            self.out.abandon()
            self.out = None


def _written_schema(schema: pa.Schema, constants: Mapping[str, Any]) -> pa.Schema:
    """The columns a frame gives the writer: ``schema``'s but ``constants``, every level nullable."""
    return pa.schema([pa.field(f.name, _nullable(f.type)) for f in schema if f.name not in constants])


def _nullable(type_: pa.DataType) -> pa.DataType:
    """``type_`` with every nested field, list item and map value nullable."""
    if pa.types.is_struct(type_):
        return pa.struct([pa.field(f.name, _nullable(f.type)) for f in type_])
    if pa.types.is_map(type_):
        return pa.map_(type_.key_type, _nullable(type_.item_type))
    if pa.types.is_large_list(type_):
        return pa.large_list(_nullable(type_.value_type))
    if pa.types.is_list(type_):
        return pa.list_(_nullable(type_.value_type))
    return type_


def with_constants(table: pa.Table, constants: Mapping[str, Any], schema: pa.Schema) -> pa.Table:
    """``table`` with the ``constants`` columns added (replacing any of that name), selected and cast to ``schema``."""
    table = table.drop_columns([name for name in constants if name in table.column_names])
    for name, value in constants.items():
        table = table.append_column(name, pa.repeat(pa.scalar(value, schema.field(name).type), table.num_rows))
    return table.select(schema.names).cast(schema)


def _split_ranges(table: pa.Table, ranges: tuple[int, int] | None) -> Iterator[tuple[int | None, pa.Table]]:
    if ranges is None:
        yield None, table
        return
    partitions, key_groups = ranges
    ids = pc.divide(pc.multiply(table[KEY_GROUP].cast(pa.int64()), partitions), key_groups)
    # Sorted by key group, so equal range ids are contiguous.
    values = ids.to_pylist()
    start = 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            yield values[start], table.slice(start, i - start)
            start = i


class _FileWriter:
    """One staged Parquet file being written, with its Delta statistics."""

    def __init__(self, table_uri: str, prefix: str, schema: pa.Schema) -> None:
        self.rel = f"{prefix}/part-{uuid.uuid4().hex}.parquet"
        uri = join_uri(table_uri, self.rel)
        self.fs, self.path = arrow_filesystem(uri)
        self.schema = schema
        self.stats = _StatsAccumulator(schema)
        try:
            if is_local(uri):  # an object store has no directories (pyarrow would PUT a marker object)
                self.fs.create_dir(self.path.rsplit("/", 1)[0], recursive=True)
            # A stream of our own: its position is the file's size, so no request
            # asks for it after the upload (with the file system's delayed open, a
            # small file is one PUT).
            self.sink = self.fs.open_output_stream(self.path)
            self.writer = pq.ParquetWriter(self.sink, schema, **parquet_options(schema))
        except OSError as exc:
            raise StorageError(f"cannot stage {self.path}: {exc}") from exc

    def write(self, table: pa.Table) -> None:
        try:
            self.writer.write_table(table, row_group_size=_ROW_GROUP_ROWS)
        except OSError as exc:
            raise StorageError(f"cannot stage {self.path}: {exc}") from exc
        self.stats.add(table)

    def close(self) -> dict[str, Any]:
        try:
            self.writer.close()
            size = self.sink.tell()
            self.sink.close()  # the upload completes (or fails) here
        except OSError as exc:
            raise StorageError(f"cannot stage {self.path}: {exc}") from exc
        return {"path": self.rel, "size": size, "rows": self.stats.rows, "stats": self.stats.to_json()}

    def abandon(self) -> None:
        try:
            self.writer.close()
            self.sink.close()
            self.fs.delete_file(self.path)
        except OSError:
            pass  # inside the staging directory: deleted with it on abort


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """Writer options of every staged file: zstd, microsecond UTC timestamps (no INT96)."""
    return {
        "compression": "zstd",
        # Floating-point values rarely repeat: a dictionary costs time and bytes.
        "use_dictionary": [f.name for f in schema if not pa.types.is_floating(f.type)],
        "coerce_timestamps": "us",
        "use_deprecated_int96_timestamps": False,
    }


def write_parquet(
    table_uri: str, prefix: str, data: pa.Table, *, sort_by: Sequence[str] = (), max_rows_per_file: int = 2_000_000
) -> list[StagedFile]:
    """The driver-side writer, for rows already in this process (compaction, tests)."""
    if data.num_rows == 0:
        return []
    if sort_by:
        data = data.sort_by([(c, "ascending") for c in sort_by])
    staged = []
    for offset in range(0, data.num_rows, max_rows_per_file):
        out = _FileWriter(table_uri, prefix, data.schema)
        out.write(data.slice(offset, max_rows_per_file))
        staged.append(StagedFile(**out.close()))
    return staged


class _StatsAccumulator:
    """Delta statistics of a file, accumulated over the tables written to it.

    Integer columns get exact min/max: enough for key-group and epoch
    skipping. Zoned timestamp columns (a window's start, a timer's time:
    skipping by event time) get them at Delta's millisecond precision, the minimum
    rounded down and the maximum up, so that no reader skips a file holding a
    row it wants. Float and string statistics have subtle truncation rules:
    none.
    """

    def __init__(self, schema: pa.Schema) -> None:
        self.timestamps = {
            f.name for f in schema if pa.types.is_timestamp(f.type) and f.type.tz is not None and f.type.unit != "ns"
        }
        self.columns = [f.name for f in schema if pa.types.is_integer(f.type) or f.name in self.timestamps]
        self.rows = 0
        self.mins: dict[str, Any] = {}
        self.maxs: dict[str, Any] = {}
        self.nulls = {name: 0 for name in self.columns}

    def add(self, table: pa.Table) -> None:
        self.rows += table.num_rows
        for name in self.columns:
            col = table[name]
            self.nulls[name] += col.null_count
            mm = pc.min_max(col).as_py()
            if mm["min"] is not None:
                self.mins[name] = min(mm["min"], self.mins.get(name, mm["min"]))
                self.maxs[name] = max(mm["max"], self.maxs.get(name, mm["max"]))

    def to_json(self) -> str:
        mins = {k: _delta_timestamp(v, up=False) if k in self.timestamps else v for k, v in self.mins.items()}
        maxs = {k: _delta_timestamp(v, up=True) if k in self.timestamps else v for k, v in self.maxs.items()}
        return json.dumps({"numRecords": self.rows, "minValues": mins, "maxValues": maxs, "nullCount": self.nulls})


def _delta_timestamp(value: "datetime.datetime", *, up: bool) -> str:
    """A timestamp statistic as Delta writes it (UTC, milliseconds), rounded ``up`` or down to the millisecond."""
    millis = value.replace(microsecond=value.microsecond // 1000 * 1000)
    if up and millis != value:
        millis += datetime.timedelta(milliseconds=1)
    return millis.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
