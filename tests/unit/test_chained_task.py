"""Operator chaining without a JVM: which pipelines chain, and what the chained task declines.

The task must compute exactly what the Spark path computes or decline; the
lines below are those Arrow's JSON reader and Spark's read differently (each
checked against both), and values the running aggregate treats specially.
The comparison with the Spark path itself is in tests/integration/test_chaining.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from barrierflow.connectors import DeltaSink, FileSource
from barrierflow.execution.chaining import CHAINING_ENV, _aggregate, _Declined, _epoch_schema, _parse, _plain, _Read, chain_of
from barrierflow.operators import Avg, Count, Max, Min, Sum
from barrierflow.plan.pipeline import PipelineBuilder, pipeline
from barrierflow.state.spec import KEY_GROUP

SCHEMA = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("sensor_id", pa.string(), nullable=False),
        pa.field("ts", pa.int64()),
        pa.field("temperature", pa.float64(), nullable=False),
    ]
)
GOOD = '{"event_id":"e1","sensor_id":"s1","ts":1,"temperature":1.5}'


def _built(sink: DeltaSink = DeltaSink.append("out"), key: str = "sensor_id", extra: bool = False, backend: str = "delta") -> Any:
    @pipeline("chain_shape")
    def shape(p: PipelineBuilder, params: dict[str, Any]) -> None:
        events = p.source(FileSource("events", "/nowhere", schema=SCHEMA))
        if extra:
            events = events.filter("temperature > 0")
        events.key_by(key).aggregate("totals", count=Count(), total=Sum("temperature"), avg=Avg("temperature")).sink_to(sink)

    return dataclasses.replace(shape, state_backend=backend).build({})


def test_only_a_source_aggregate_append_sink_chain_is_chained(monkeypatch: pytest.MonkeyPatch) -> None:
    assert chain_of(_built()) is not None
    assert chain_of(_built(sink=DeltaSink.upsert("out", key="sensor_id"))) is None
    assert chain_of(_built(extra=True)) is None
    assert chain_of(_built(backend="heap")) is None
    assert chain_of(_built(key="temperature")) is None  # a double key: not hashed by the task
    monkeypatch.setenv(CHAINING_ENV, "false")
    assert chain_of(_built()) is None


def _read(tmp_path: Path, *lines: str | bytes) -> _Read:
    data = b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines)
    path = tmp_path / "part.jsonl"
    path.write_bytes(data)
    chain = chain_of(_built())
    assert chain is not None
    return _Read(
        files=((str(path), len(data)),),
        schema=pa.schema([f.with_nullable(True) for f in SCHEMA]),
        required=("event_id", "sensor_id", "temperature"),
        text_keys=("sensor_id",),
        aggregate=chain.aggregate,
        key_groups=128,
        saved_as="unused",
    )


# Lines Arrow's reader accepts and Spark's reads otherwise (or makes a dead letter of), and
# lines both refuse: every one must leave the epoch to Spark.
DECLINED = {
    "null line": b"null",
    "byte-order mark": b"\xef\xbb\xbf" + GOOD.encode(),
    "invalid UTF-8 in a string": b'{"event_id":"e\xff","sensor_id":"s1","ts":1,"temperature":1.5}',
    "two objects on a line": (GOOD + GOOD).encode(),
    "an object over two lines": b'{"event_id":"e1","sensor_id":"s1",\n"ts":1,"temperature":1.5}',
    "blank line": b"",
    "whitespace line": b"   ",
    "Inf": b'{"event_id":"e1","sensor_id":"s1","ts":1,"temperature":Inf}',
    "-NaN in an unknown field": b'{"event_id":"e1","sensor_id":"s1","ts":1,"temperature":1.5,"x":-NaN}',
    "a raw tab in a string": b'{"event_id":"e\t1","sensor_id":"s1","ts":1,"temperature":1.5}',
    "a lone surrogate": b'{"event_id":"e\\ud800","sensor_id":"s1","ts":1,"temperature":1.5}',
    "a long line": ('{"event_id":"' + "e" * 1000 + '","sensor_id":"s1","ts":1,"temperature":1.5}').encode(),
    "duplicate key": b'{"event_id":"e1","sensor_id":"s1","sensor_id":"s2","ts":1,"temperature":1.5}',
    "single quotes": b"{'event_id':'e1','sensor_id':'s1','ts':1,'temperature':1.5}",
    "a number for a string": b'{"event_id":"e1","sensor_id":5,"ts":1,"temperature":1.5}',
    "a quoted number": b'{"event_id":"e1","sensor_id":"s1","ts":1,"temperature":"1.5"}',
    "a float for a long": b'{"event_id":"e1","sensor_id":"s1","ts":1.0,"temperature":1.5}',
    "a missing required field": b'{"event_id":"e1","sensor_id":"s1","ts":1}',
    "a null key": b'{"event_id":"e1","sensor_id":null,"ts":1,"temperature":1.5}',
    "an empty key": b'{"event_id":"e1","sensor_id":"","ts":1,"temperature":1.5}',
    "trailing garbage": (GOOD + " x").encode(),
}


@pytest.mark.parametrize("case", sorted(DECLINED))
def test_lines_read_differently_or_not_records_are_left_to_spark(tmp_path: Path, case: str) -> None:
    with pytest.raises(_Declined):
        _parse(_read(tmp_path, GOOD, DECLINED[case], GOOD))


def test_plain_lines_are_counted_and_parsed_as_spark_would(tmp_path: Path) -> None:
    lines = [GOOD, '{"ts":null,"temperature":2,"sensor_id":"s2","event_id":"e2","extra":{"a":[1,{"b":null}]}}\r', GOOD]
    read = _read(tmp_path, *lines)
    data = Path(read.files[0][0]).read_bytes()
    assert _plain("part.jsonl", data) == 3
    assert _plain("part.jsonl", data.rstrip(b"\n")) == 3  # the last line needs no newline
    records = _parse(read)
    assert records.to_pylist()[1] == {"event_id": "e2", "sensor_id": "s2", "ts": None, "temperature": 2.0}


def test_a_changed_file_is_left_to_spark(tmp_path: Path) -> None:
    read = _read(tmp_path, GOOD)
    with pytest.raises(_Declined, match="when its epoch was planned"):
        _parse(dataclasses.replace(read, files=((read.files[0][0], read.files[0][1] + 1),)))


@pytest.mark.parametrize("value", ["-0.0", "0.1234567", "1e9", "NaN", "Infinity", "1e-7"])
def test_values_the_running_aggregate_treats_specially_are_left_to_spark(tmp_path: Path, value: str) -> None:
    read = _read(tmp_path, GOOD, f'{{"event_id":"e2","sensor_id":"s1","ts":1,"temperature":{value}}}')
    with pytest.raises(_Declined):
        _aggregate(read, _parse(read))


def test_sums_that_could_leave_micro_units_are_left_to_spark(tmp_path: Path) -> None:
    # 12 x 999999999.999999: a millionths sum beyond 2**53 (the Spark path sums it as a decimal).
    line = '{"event_id":"e","sensor_id":"s1","ts":1,"temperature":999999999.999999}'
    read = _read(tmp_path, *[line] * 12)
    with pytest.raises(_Declined, match="too large"):
        _aggregate(read, _parse(read))


def test_epoch_aggregates_are_those_of_the_spark_paths_step_one(tmp_path: Path) -> None:
    values = {"s1": [21.37, -3.25, 0.1, 0.2], "s2": [19.5], "s3": [1e-6, 999999999.5]}
    lines = [
        json.dumps({"event_id": f"e{i}", "sensor_id": s, "ts": i, "temperature": v})
        for i, (s, v) in enumerate((s, v) for s, vs in values.items() for v in vs)
    ]
    read = _read(tmp_path, *lines)
    epoch = _aggregate(read, _parse(read))
    assert epoch.schema == _epoch_schema(read)
    got = {row["sensor_id"]: row for row in epoch.to_pylist()}
    assert set(got) == set(values)
    for sensor, vs in values.items():
        row = got[sensor]
        # Micro-units: the exact sum of the values' millionths, then one division.
        assert row["_esum_temperature"] == sum(round(v * 1e6) for v in vs) / 1e6
        assert row["_n"] == len(vs) and row["_inexact_temperature"] is False
        assert 0 <= row[KEY_GROUP] < 128
    assert not any(math.isnan(row["_esum_temperature"]) for row in got.values())


@pipeline("chain_with_minmax")
def _minmax(p: PipelineBuilder, params: dict[str, Any]) -> None:
    events = p.source(FileSource("events", "/nowhere", schema=SCHEMA))
    events.key_by("sensor_id", "ts").aggregate("totals", Count(), Min("temperature", "lo"), Max("temperature", "hi")).sink_to(
        DeltaSink.append("out")
    )


def test_min_and_max_per_key_of_two_columns(tmp_path: Path) -> None:
    chain = chain_of(_minmax.build({}))
    assert chain is not None
    lines = [
        json.dumps({"event_id": f"e{i}", "sensor_id": "s1", "ts": i % 2, "temperature": t})
        for i, t in enumerate([3.5, 1.25, -2.0, 8.0, 4.5])
    ]
    read = dataclasses.replace(_read(tmp_path, *lines), aggregate=chain.aggregate)
    rows = {(r["sensor_id"], r["ts"]): r for r in _aggregate(read, _parse(read)).to_pylist()}
    assert rows[("s1", 0)]["_emin_temperature"] == -2.0 and rows[("s1", 0)]["_emax_temperature"] == 4.5
    assert rows[("s1", 1)]["_emin_temperature"] == 1.25 and rows[("s1", 1)]["_emax_temperature"] == 8.0
    assert rows[("s1", 0)]["_n"] == 3
