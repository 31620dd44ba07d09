"""File skipping by event time: the timestamp statistics staged files carry (barrierflow.storage.staging)."""

from __future__ import annotations

import datetime
import json

import pyarrow as pa

from barrierflow.storage.staging import _file_stats

UTC = datetime.timezone.utc
SCHEMA = pa.schema(
    [
        ("k", pa.string()),
        ("window_start", pa.timestamp("us", tz="UTC")),
        ("local", pa.timestamp("us")),  # no zone: Delta's timestamp_ntz, whose statistics differ
        ("_key_group", pa.int32()),
    ]
)


def _at(second: int, micros: int) -> datetime.datetime:
    return datetime.datetime(2024, 1, 1, 0, 0, second, micros, tzinfo=UTC)


def test_timestamp_statistics_are_widened_to_milliseconds_so_no_reader_skips_a_row_it_wants() -> None:
    parts = []
    for starts in ([_at(0, 123456), _at(59, 999999)], [_at(30, 500000)]):
        n = len(starts)
        parts.append(
            pa.table(
                {
                    "k": ["a"] * n,
                    "window_start": pa.array(starts, SCHEMA.field("window_start").type),
                    "local": pa.array([s.replace(tzinfo=None) for s in starts], pa.timestamp("us")),
                    "_key_group": pa.array(range(n), pa.int32()),
                }
            )
        )
    doc = json.loads(_file_stats(pa.concat_tables(parts)))
    assert doc["numRecords"] == 3
    # The minimum rounded down, the maximum up; an exact millisecond stays as it is.
    assert doc["minValues"] == {"window_start": "2024-01-01T00:00:00.123Z", "_key_group": 0}
    assert doc["maxValues"] == {"window_start": "2024-01-01T00:01:00.000Z", "_key_group": 1}
    exact = pa.table({"k": ["a"], "window_start": pa.array([_at(1, 5000)], SCHEMA.field("window_start").type),
                      "local": pa.array([None], pa.timestamp("us")), "_key_group": pa.array([0], pa.int32())})  # fmt: skip
    assert json.loads(_file_stats(exact))["maxValues"]["window_start"] == "2024-01-01T00:00:01.005Z"
