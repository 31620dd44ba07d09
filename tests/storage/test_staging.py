"""The staged-file writer: each description is a file it wrote, clustered by key-group range, with Delta statistics."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from barrierflow.core.columns import KEY_GROUP
from barrierflow.storage import objects
from barrierflow.storage.commits import StagedFile
from barrierflow.storage.staging import write_partition

SCHEMA = pa.schema(
    [
        pa.field("key", pa.string()),
        pa.field(KEY_GROUP, pa.int32()),
        pa.field("value", pa.int64()),
        pa.field("at", pa.timestamp("us", tz="UTC")),
    ]
)


def _read(uri: str) -> pa.Table:
    with objects.open_input(uri) as fh:
        return pq.read_table(fh)


def _rows(n: int, key_groups: int, *, without: tuple[str, ...] = ()) -> pa.Table:
    ids = list(range(n))
    table = pa.table(
        {
            "key": [f"k{i}" for i in ids],
            KEY_GROUP: pa.array([i * 7 % key_groups for i in ids], pa.int32()),
            "value": [None if i % 10 == 0 else i for i in ids],
            "at": pa.array([i * 1000 for i in ids], pa.timestamp("us", tz="UTC")),
        }
    )
    return table.sort_by(KEY_GROUP).drop_columns(list(without))


def stage(
    rows: pa.Table, table: str, prefix: str, schema: pa.Schema, *, ranges: tuple[int, int] | None = None
) -> list[StagedFile]:
    """What a task's staging does: its rows (sorted by key group when clustered) to staged files."""
    return [StagedFile(**d) for d in write_partition(table, prefix, schema, ranges, rows)]


def test_descriptions_are_the_files_the_writer_wrote(store_root: str) -> None:
    """On local disk and on S3: each description is a file the writer wrote, and nothing else was written."""
    table = objects.join_uri(store_root, "table")
    files = stage(_rows(5000, 128), table, "_staging/a", SCHEMA, ranges=(4, 128))
    assert files and sum(f.rows for f in files) == 5000
    ranges = set()
    for f in files:
        uri = objects.join_uri(table, f.path)
        assert objects.file_size(uri) == f.size
        data = _read(uri)
        assert data.schema == SCHEMA  # cast to the table's schema, timestamps as UTC microseconds
        stats = json.loads(f.stats)
        assert stats["numRecords"] == data.num_rows == f.rows
        for column in (KEY_GROUP, "value"):
            mm = pc.min_max(data[column]).as_py()
            assert (stats["minValues"][column], stats["maxValues"][column]) == (mm["min"], mm["max"])
            assert stats["nullCount"][column] == data[column].null_count
        groups = data[KEY_GROUP].to_pylist()
        assert groups == sorted(groups)
        # Clustered: a file holds key groups of one of the four contiguous ranges.
        file_ranges = {g * 4 // 128 for g in groups}
        assert len(file_ranges) == 1
        ranges |= file_ranges
    assert ranges == {0, 1, 2, 3}
    # Nothing else was written: descriptions cover every file.
    written = sorted(f.path for f in objects.walk(objects.join_uri(table, "_staging/a")))
    assert written == sorted(Path(f.path).name for f in files)


def test_no_rows_write_no_file(store_root: str) -> None:
    assert stage(_rows(0, 16), store_root, "_staging/b", SCHEMA, ranges=(2, 16)) == []
    assert list(objects.walk(objects.join_uri(store_root, "_staging"))) == []
