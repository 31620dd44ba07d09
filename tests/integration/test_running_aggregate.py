"""Running aggregates on real Spark and Delta: exact sums at any parallelism, placement and state backend.

Checks end to end: exact decimal sums, the sorted-fold fallback, bad lines
beside good ones, and a state backend's copy used only while it is the
table's snapshot. Expected values come from :func:`_reference`, a
plain-Python model of the documented rules.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from decimal import ROUND_HALF_UP, Decimal, localcontext
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from barrierflow import Avg, Count, DeltaSink, FileSource, Max, Min, Param, PipelineBuilder, Sum, pipeline
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.core import settings
from barrierflow.operations.query import run_query
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


# The same pipeline on the heap backend: every live row kept on the executors' host between epochs.
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
    # Parallelism 3 and 7 run each epoch in parallel tasks (per input split, then per key-group range),
    # the others in one task.
    for parallelism, backend in ((1, "delta"), (3, "delta"), (7, "delta"), (2, "heap")):
        each = f"{warehouse}-{parallelism}-{backend}"
        monkeypatch.setenv(settings.SINGLE_TASK_INPUT_BYTES.env, "0" if parallelism in (3, 7) else str(1 << 30))
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


def test_bad_lines_beside_good_ones_are_dead_letters_and_leave_no_file_behind(spark: Any, tmp_path: Path, warehouse: str) -> None:
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
    completed = _run(spark, landing, warehouse)
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
    # Every staged file of every table is one a commit added.
    layout = PipelineLayout.of(str(warehouse), "running_totals")
    from deltalake import DeltaTable

    for uri in (layout.sink_table("totals_updates"), layout.dead_letter):
        live = {os.path.normpath(p) for p in DeltaTable(uri).file_uris()}
        stored = {os.path.normpath(objects.join_uri(uri, f.path)) for f in objects.walk(uri) if f.path.endswith(".parquet")}
        assert stored == live, uri


@pytest.mark.parametrize("backend", ["heap", "delta"])
def test_kept_state_is_used_only_while_it_is_the_tables_snapshot(
    spark: Any, tmp_path: Path, warehouse: str, backend: str
) -> None:
    landing = tmp_path / "landing"
    files = [[_record(10 * e + n, "abc"[n % 3], 1.5 * n + e) for n in range(6)] for e in range(3)]
    for e, records in enumerate(files):
        _write(landing, f"part-{e:03d}.jsonl", [json.dumps(r) for r in records])
    _run(spark, landing, warehouse, backend=backend)
    from deltalake import DeltaTable

    uri = PipelineLayout.of(str(warehouse), "running_totals").state_table("totals", "accumulators")
    # A commit from elsewhere: a copy kept by the heap backend (or a worker's cache of the files) no
    # longer describes the table, so the next epoch must read the table (where sensor a has no state any more).
    DeltaTable(uri).delete("sensor_id = 'a'")
    extra = [_record(100 + n, "ab"[n % 2], 2.0 + n) for n in range(4)]
    _write(landing, "part-003.jsonl", [json.dumps(r) for r in extra])
    _run(spark, landing, warehouse, backend=backend)
    got = _totals(warehouse)
    assert got["a"]["count"] == 2 and got["a"]["sum"] == 2.0 + 4.0
    assert got["b"]["count"] == 6 + 2 and got["c"]["count"] == 6


def test_epochs_on_a_second_connect_session_of_the_process(spark: Any, tmp_path: Path, warehouse: str) -> None:
    from pyspark.sql import SparkSession

    from barrierflow.execution.spark import REMOTE_ENV

    other = SparkSession.builder.remote(os.environ[REMOTE_ENV]).create()
    try:
        landing = tmp_path / "landing"
        files = [[_record(10 * e + n, "ab"[n % 2], 0.5 * n + e) for n in range(4)] for e in range(3)]
        for e, records in enumerate(files):
            _write(landing, f"part-{e:03d}.jsonl", [json.dumps(r) for r in records])
        params = {"landing_dir": str(landing), "parallelism": 2}
        CheckpointCoordinator(running_totals, params, str(warehouse), spark_factory=lambda: other).run(until_caught_up=True)
        assert _totals(warehouse) == {s: {**t, "avg": t["sum"] / t["count"]} for s, t in _reference(files).items()}
    finally:
        other.stop()
