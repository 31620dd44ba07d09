"""Running aggregates over unordered reads, on real Spark and Delta.

Checks the fast path end to end: whole JSON Lines files read without line
numbers, exact decimal sums, the sorted-fold fallback, and the ordered
recompute an epoch falls back to when it meets a bad line. Expected values
come from :func:`_reference`, a plain-Python model of the documented rules.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from decimal import ROUND_HALF_UP, Decimal, localcontext
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from barrierflow.api.params import Param
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.connectors import DeltaSink, FileSource
from barrierflow.execution.chaining import CHAINING_ENV
from barrierflow.operations.query import run_query
from barrierflow.operators import Avg, Count, Max, Min, Sum
from barrierflow.plan.pipeline import PipelineBuilder, pipeline
from barrierflow.state import resident
from barrierflow.state.worker_cache import latest_rows
from barrierflow.storage import objects
from barrierflow.storage.layout import PipelineLayout

READINGS = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("sensor_id", pa.string(), nullable=False),
        pa.field("temperature", pa.float64(), nullable=False),
    ]
)


@pipeline("running_totals", params=[Param("landing_dir", str), Param("parallelism", int, 2)])
def running_totals(p: PipelineBuilder, params: dict[str, Any]) -> None:
    readings = p.source(FileSource("readings", params["landing_dir"], schema=READINGS, max_files_per_epoch=1))
    readings.key_by("sensor_id").aggregate(
        "totals", Count(), Sum("temperature", "sum"), Min("temperature", "min"), Max("temperature", "max"),
        Avg("temperature", "avg"),
    ).sink_to(DeltaSink.append("totals_updates"))  # fmt: skip


# The same pipeline on the heap backend: merged on the driver, state resident between epochs.
running_totals_heap = dataclasses.replace(running_totals, state_backend="heap")


def _exact_decimal(x: float) -> Decimal | None:
    """The value Spark sums for ``x`` in ``decimal(38,18)``, or None when it is not exact."""
    if not math.isfinite(x) or abs(x) >= 1e20:
        return None
    with localcontext() as context:
        context.prec = 80
        d = Decimal(repr(x)).quantize(Decimal("1e-18"), rounding=ROUND_HALF_UP)
    return d if float(d) == x else None


def _epoch_sum(values: list[float]) -> float:
    exact = [_exact_decimal(x) for x in values]
    if all(d is not None for d in exact) and max(abs(x) for x in values) * len(values) < 1e19:
        with localcontext() as context:
            context.prec = 80
            return float(sum(exact, Decimal(0)))  # type: ignore[arg-type]
    total = 0.0
    for x in sorted(values):
        total += x
    return total


def _reference(files: list[list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per-sensor count/sum/min/max after all files, one epoch per file."""
    totals: dict[str, dict[str, Any]] = {}
    for records in files:
        by_sensor: dict[str, list[float]] = {}
        for r in records:
            by_sensor.setdefault(r["sensor_id"], []).append(float(r["temperature"]))
        for sensor, values in by_sensor.items():
            t = totals.setdefault(sensor, {"count": 0, "sum": 0.0, "min": math.inf, "max": -math.inf})
            t["count"] += len(values)
            t["sum"] += _epoch_sum(values)
            t["min"] = min(t["min"], *values)
            t["max"] = max(t["max"], *values)
    return totals


def _write(landing: Path, name: str, lines: list[str | bytes]) -> None:
    landing.mkdir(parents=True, exist_ok=True)
    data = b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines)
    (landing / name).write_bytes(data)


def _record(i: int, sensor: str, temperature: float) -> dict[str, Any]:
    return {"event_id": f"e{i}", "sensor_id": sensor, "temperature": temperature}


def _run(spark: Any, landing: Path, warehouse: Path | str, parallelism: int = 2, backend: str = "delta") -> list[Any]:
    params = {"landing_dir": str(landing), "parallelism": parallelism}
    definition = running_totals_heap if backend == "heap" else running_totals
    return CheckpointCoordinator(definition, params, str(warehouse), spark_factory=lambda: spark).run(until_caught_up=True)


def _totals(warehouse: Path | str) -> dict[str, dict[str, Any]]:
    sql = "select sensor_id, count, sum, min, max, avg from totals_updates"
    latest: dict[str, dict[str, Any]] = {}
    rows = run_query(str(warehouse), "running_totals", sql + " order by _epoch").to_pylist()
    for row in rows:
        latest[row.pop("sensor_id")] = row
    return latest


# Values that exercise each path: short decimals (exact), values without an
# exact decimal(38,18) form (sorted fold), and values large enough that a
# partial sum could overflow (sorted fold).
_SPECIAL = {
    "short": [21.37, 19.5, -3.25, 0.1, 0.2, 0.3, 100.0, 1e-3],
    # Seven decimals, or a millionths sum beyond 2**53: decimal(38,18), not micro-units.
    "seven_decimals": [0.1234567, 1.0, -2.5],
    "micro_sum_bound": [999999999.999999] * 12,
    "long_digits": [1.2345678901234567e-5, 2.5, 7.0e-19, 3.3],
    "huge": [9e18, 9e18, -1.5, 4.25e18],
    "beyond": [1.5e25, 2.0, 3.0e-30],
}


def test_sums_are_exact_or_sorted_and_identical_at_any_parallelism_and_backend(
    spark: Any, tmp_path: Path, warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    files: list[list[dict[str, Any]]] = []
    i = 0
    for epoch in range(3):
        records = []
        for sensor, values in _SPECIAL.items():
            for v in values:
                records.append(_record(i, sensor, v * (epoch + 1)))
                i += 1
        files.append(records)
        _write(landing, f"part-{epoch:03d}.jsonl", [json.dumps(r) for r in records])
    tables = []
    # Parallelism 3 merges with the touched keys read from the tables, the
    # others with the executors' copy of the whole state.
    for parallelism, backend in ((1, "delta"), (3, "delta"), (7, "delta"), (2, "heap")):
        each = f"{warehouse}-{parallelism}-{backend}"
        monkeypatch.setenv("BARRIERFLOW_CACHED_STATE_ROWS", "0" if parallelism == 3 else "1000000")
        completed = _run(spark, landing, each, parallelism, backend)
        assert [c.record.rows_in for c in completed] == [len(f) for f in files]
        tables.append(_totals(each))
    assert tables[0] == tables[1] == tables[2] == tables[3], "parallelism or the state backend changed a result"
    expected = _reference(files)
    assert set(tables[0]) == set(expected)
    for sensor, want in expected.items():
        got = tables[0][sensor]
        assert got["count"] == want["count"] and got["min"] == want["min"] and got["max"] == want["max"], sensor
        assert got["sum"] == want["sum"], (sensor, got["sum"], want["sum"])
        assert got["avg"] == want["sum"] / want["count"], sensor


def test_bad_lines_make_the_epoch_compute_again_with_ordered_reads(
    spark: Any, tmp_path: Path, warehouse: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Spark's unordered read, and its fallback: a chained front would parse these lines in its task.
    monkeypatch.setenv(CHAINING_ENV, "false")
    landing = tmp_path / "landing"
    clean = [_record(n, f"s{n % 3}", 20.0 + n) for n in range(6)]
    _write(landing, "a.jsonl", [json.dumps(r) for r in clean[:3]] + ["", "  \r"])
    lines: list[str | bytes] = [
        json.dumps(clean[3]),
        "{not json",
        json.dumps({"event_id": "x", "temperature": 1.0}),  # no sensor_id
        "\u00a0",  # blank: Unicode white space only
        json.dumps(clean[4]) + "\r",
        json.dumps(clean[5]),
    ]
    _write(landing, "b.jsonl", lines)
    with caplog.at_level(logging.INFO, logger="barrierflow.execution.runtime"):
        completed = _run(spark, landing, warehouse)
    ordered = [r.getMessage() for r in caplog.records if "computing again with ordered reads" in r.getMessage()]
    assert len(ordered) == 1 and "epoch 2" in ordered[0]
    assert [c.record.rows_in for c in completed] == [3, 5]
    assert [c.record.dead_letters for c in completed] == [0, 2]
    dead = run_query(str(warehouse), "running_totals", "select source_file, line, reason, _epoch from dead_letter order by line")
    assert [(r["source_file"], r["line"], r["_epoch"]) for r in dead.to_pylist()] == [
        ("b.jsonl", 2, 2),
        ("b.jsonl", 3, 2),
    ]
    want = _reference([clean[:3], clean[3:]])
    got = _totals(warehouse)
    assert {s: {k: got[s][k] for k in ("count", "sum", "min", "max")} for s in got} == want
    # The discarded unordered attempt left no file behind in any table.
    layout = PipelineLayout.of(str(warehouse), "running_totals")
    from deltalake import DeltaTable

    for uri in (layout.sink_table("totals_updates"), layout.dead_letter):
        live = {os.path.normpath(p) for p in DeltaTable(uri).file_uris()}
        stored = {os.path.normpath(objects.join_uri(uri, f.path)) for f in objects.walk(uri) if f.path.endswith(".parquet")}
        assert stored == live, uri


_EDGE_SCHEMA = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("sensor_id", pa.string(), nullable=False),
        pa.field("ts", pa.int64()),
        pa.field("temperature", pa.float64(), nullable=False),
    ]
)
_OK = '{"event_id": "%s", "sensor_id": "s", "ts": 1, "temperature": 1.5}'
# Lines on which Spark's JSON reader (the unordered read) and ``from_json``
# (the ordered read) could part ways. "plain" must take the fast path and
# agree; the rest must make it step aside (or count a bad line).
_EDGE_FILES: dict[str, list[str | bytes]] = {
    "plain": [
        _OK % "a",
        (_OK % "b") + "\r",
        '{"event_id": "c", "sensor_id": "s", "tags": [1, [2]], "deep": {"x": [3]}, "temperature": 2}',
        '{"event_id": "d\u00e9", "sensor_id": "\u6e29\u5ea6 \U0001f321", "temperature": -0.0}',
        (_OK % "e") + ' {"event_id": "ignored"}',
        '{"event_id": "f", "sensor_id": 5, "temperature": 3}',
        '{"event_id": "g", "sensor_id": "s", "temperature": NaN}',
        '{"event_id": "h", "sensor_id": "s", "temperature": 1, "temperature": 2}',
        '{"event_id": "i", "sensor_id": "s", "ts": -7, "temperature": 1e308}',
        "",
        "   ",
        "\t\r",
        "\u00a0\u2003",
    ],
    "top_level_array": [_OK % "a", "[" + (_OK % "b") + "]"],
    "two_in_an_array": [_OK % "a", "[" + (_OK % "b") + ", " + (_OK % "c") + "]"],
    "empty_array": [_OK % "a", "[]"],
    "indented_array": [_OK % "a", " \t[" + (_OK % "b") + "]"],
    "nul_byte": [_OK % "a", b'{"event_id": "b\x00", "sensor_id": "s", "temperature": 1}'],
    "byte_order_mark": [_OK % "a", b"\xef\xbb\xbf" + (_OK % "b").encode()],
    "invalid_utf8_in_ignored_field": [_OK % "a", b'{"event_id": "b", "sensor_id": "s", "o": "\xff", "temperature": 1}'],
    "overlong_utf8": [_OK % "a", b'{"event_id": "b", "sensor_id": "\xc0\x80", "temperature": 1}'],
    "string_temperature": [_OK % "a", '{"event_id": "b", "sensor_id": "s", "temperature": "3"}'],
    "float_ts": [_OK % "a", '{"event_id": "b", "sensor_id": "s", "ts": 1.5e3, "temperature": 3}'],
    "unparsable_ts": [_OK % "a", '{"event_id": "b", "sensor_id": "s", "ts": "zz", "temperature": 3}'],
    "not_json": [_OK % "a", "{oops"],
}
_STEPS_ASIDE = {
    "top_level_array", "two_in_an_array", "empty_array", "indented_array", "nul_byte", "byte_order_mark",
    "invalid_utf8_in_ignored_field", "overlong_utf8",
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(_EDGE_FILES))
def test_unordered_read_gives_the_ordered_reads_records_or_steps_aside(spark: Any, tmp_path: Path, case: str) -> None:
    landing = tmp_path / "landing"
    _write(landing, "part-0.jsonl", _EDGE_FILES[case])
    source = FileSource("readings", str(landing), schema=_EDGE_SCHEMA)
    end = source.plan(None, None)
    fields = _EDGE_SCHEMA.names
    ordered = source.read(spark, end, 2, ordered=True)
    assert ordered.dead_letters is not None
    # repr: NaN equals NaN, and -0.0 differs from 0.0.
    want = sorted(tuple(map(repr, r)) for r in ordered.records.select(*fields).collect())
    unordered = source.read(spark, end, 2, ordered=False)
    assert unordered.observation is not None and unordered.plain_input is not None
    if case in _STEPS_ASIDE:
        assert unordered.plain_input.result() is False, "the byte check should send this epoch to the ordered read"
        return
    assert unordered.plain_input.result() is True
    got = sorted(tuple(map(repr, r)) for r in unordered.records.select(*fields).collect())
    metrics = unordered.observation.get
    if case == "plain":
        assert metrics["bad"] == 0 and ordered.dead_letters.count() == 0
    if metrics["bad"] == 0:
        assert got == want and metrics["good"] == len(want)
    else:
        # The epoch is computed again with the ordered read; nothing to compare.
        assert case != "plain"


_PLAIN = b'{"id": "a", "tags": [1, 2], "nested": {"x": [3]}}\r\n\n  \n{"id": "\xc3\xa9\xf0\x9f\x8c\xa1"}'
_BYTE_CASES: list[tuple[bytes, bool]] = [
    (_PLAIN, True),
    (b"", True),
    (b'{"a": 1}\n[{"a": 2}]\n', False),  # a top-level array is several records to the JSON reader
    (b'{"a": 1}\n \t[]\n', False),
    (b"[", False),
    (b'{"a": "[x"}\n"]"\n', True),  # a bracket after the line's first brace is inside the object
    (b'{"a": 1}\r[1]\n', True),  # lines end at \n only: this line starts with a brace
    ('{"a": 1}\u2028[1]\n'.encode(), True),  # U+2028 does not end a line either
    (b'{"a": "b\x00"}\n', False),  # NUL bytes make the reader guess UTF-16/32
    (b'\xef\xbb\xbf{"a": 1}\n', False),
    (b'{"a": 1}\n{"b": "\xef\xbb\xbf"}\n', False),  # a byte-order mark anywhere
    (b'{"a": "\xff"}\n', False),
    (b'{"a": "\xc0\x80"}\n', False),  # overlong: the reader would decode it
    (b'{"a": "\xed\xa0\x80"}\n', False),  # a UTF-16 surrogate
    (b'{"a": "\xf4\x90\x80\x80"}\n', False),  # beyond U+10FFFF
    (b'{"a": 1}\n\xe2\x82', False),  # truncated at the end
]


def test_plain_input_check_rules_out_what_the_json_reader_reads_differently(spark: Any, tmp_path: Path) -> None:
    """The Spark job behind ``plain_input``: per file, then over files together (one job, one answer)."""
    schema = pa.schema([pa.field("a", pa.int64())])
    for i, (data, plain) in enumerate(_BYTE_CASES):
        landing = tmp_path / f"case-{i}"
        landing.mkdir()
        (landing / "f.jsonl").write_bytes(data)
        source = FileSource("s", str(landing), schema=schema)
        batch = source.read(spark, source.plan(None, None), 2, ordered=False)
        assert batch.plain_input is not None
        assert batch.plain_input.result() is plain, (i, data)
    together = tmp_path / "together"
    together.mkdir()
    for i, (data, plain) in enumerate(_BYTE_CASES):
        (together / f"{i:02d}-{'plain' if plain else 'not'}.jsonl").write_bytes(data)
    source = FileSource("s", str(together), schema=schema, max_files_per_epoch=100)
    end = source.plan(None, None)
    assert source.read(spark, end, 2, ordered=False).plain_input.result() is False  # type: ignore[union-attr]
    for path in together.glob("*-not.jsonl"):
        path.unlink()
    end = source.plan(None, None)
    assert len(end["files"]) == sum(plain for _, plain in _BYTE_CASES)
    assert source.read(spark, end, 2, ordered=False).plain_input.result() is True  # type: ignore[union-attr]


@pytest.mark.parametrize("backend", ["heap", "delta"])
def test_resident_state_is_used_only_while_it_is_the_tables_snapshot(
    spark: Any, tmp_path: Path, warehouse: str, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The executors' copy belongs to epochs computed on Spark (a chained epoch reads the worker cache instead).
    monkeypatch.setenv(CHAINING_ENV, "false")
    landing = tmp_path / "landing"
    files = [[_record(10 * e + n, "abc"[n % 3], 1.5 * n + e) for n in range(6)] for e in range(3)]
    for e, records in enumerate(files):
        _write(landing, f"part-{e:03d}.jsonl", [json.dumps(r) for r in records])
    _run(spark, landing, warehouse, backend=backend)
    from deltalake import DeltaTable

    uri = PipelineLayout.of(str(warehouse), "running_totals").state_table("totals", "accumulators")
    table = DeltaTable(uri)
    # The heap keeps an Arrow table on the driver; the delta backend a frame on the executors.
    copies = resident.heap if backend == "heap" else resident.executors
    copy = copies.lookup(uri, resident.Snapshot.of(table))
    assert copy is not None, "three epochs in one process left no resident copy"
    if backend == "delta":
        copy = copy.toArrow()
    stored = latest_rows(table.to_pyarrow_table(), ["sensor_id"])
    names = [n for n in copy.schema.names if n != "_updated_at_ms"]
    assert copy.select(names).sort_by("sensor_id").to_pylist() == stored.select(names).sort_by("sensor_id").to_pylist()
    # A commit from elsewhere: the copy no longer describes the table, so the
    # next epoch must read the table (where sensor a has no state any more).
    table.delete("sensor_id = 'a'")
    assert copies.lookup(uri, resident.Snapshot.of(DeltaTable(uri))) is None
    extra = [_record(100 + n, "ab"[n % 2], 2.0 + n) for n in range(4)]
    _write(landing, "part-003.jsonl", [json.dumps(r) for r in extra])
    _run(spark, landing, warehouse, backend=backend)
    got = _totals(warehouse)
    assert got["a"]["count"] == 2 and got["a"]["sum"] == 2.0 + 4.0
    assert got["b"]["count"] == 6 + 2 and got["c"]["count"] == 6


def test_a_process_with_two_connect_sessions_keeps_each_copy_in_its_own(
    spark: Any, tmp_path: Path, warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PySpark's Connect client binds a checkpoint to the process's active
    # session; epochs on any other session must still keep and use theirs.
    from pyspark.sql import SparkSession

    monkeypatch.setenv(CHAINING_ENV, "false")  # the copy belongs to epochs computed on Spark

    from barrierflow.execution.spark import REMOTE_ENV

    other = SparkSession.builder.remote(os.environ[REMOTE_ENV]).create()
    try:
        landing = tmp_path / "landing"
        files = [[_record(10 * e + n, "ab"[n % 2], 0.5 * n + e) for n in range(4)] for e in range(3)]
        for e, records in enumerate(files):
            _write(landing, f"part-{e:03d}.jsonl", [json.dumps(r) for r in records])
        params = {"landing_dir": str(landing), "parallelism": 2}
        CheckpointCoordinator(running_totals, params, str(warehouse), spark_factory=lambda: other).run(until_caught_up=True)
        from deltalake import DeltaTable

        uri = PipelineLayout.of(str(warehouse), "running_totals").state_table("totals", "accumulators")
        copy = resident.executors.lookup(uri, resident.Snapshot.of(DeltaTable(uri)))
        assert copy is not None and copy.sparkSession is other
        assert _totals(warehouse) == {s: {**t, "avg": t["sum"] / t["count"]} for s, t in _reference(files).items()}
    finally:
        resident.executors.discard()
        other.stop()
