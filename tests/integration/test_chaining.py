"""Operator chaining on real Spark and Delta: chained epochs write exactly the tables Spark's epochs write.

``running_totals`` (a file source, a running aggregate, an append sink) is
run with chaining on and off over the same input: epochs of plain lines are
chained (and compact the state table as they go), an epoch with a bad line
is declined and computed on Spark with its dead letter. Both runs must give
identical sink, state and dead-letter tables, and the plain-Python
reference's totals.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_running_aggregate import _record, _reference, _totals, _write, running_totals

from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.core.errors import InjectedFault
from barrierflow.core.faults import ENV_VAR as FAULT_ENV
from barrierflow.core.faults import STATE_ENV_VAR as FAULT_STATE_ENV
from barrierflow.execution import runtime
from barrierflow.execution.chaining import CHAINING_ENV, spark_key_groups
from barrierflow.operations.query import run_query
from barrierflow.state.worker_cache import latest_rows
from barrierflow.storage.layout import PipelineLayout


def _files(landing: Path) -> list[list[dict[str, Any]]]:
    """Six epochs over 40 sensors, two-decimal readings; the fourth also has a bad line."""
    rng = random.Random(7)
    files = []
    for epoch in range(6):
        records = [_record(1000 * epoch + i, f"s{rng.randrange(40)}", round(rng.uniform(-30, 60), 2)) for i in range(300)]
        lines: list[str | bytes] = [json.dumps(r) for r in records]
        if epoch == 3:
            lines.insert(17, '{"event_id": "bad", "sensor_id": "s1", "temperature": "hot"}')
        _write(landing, f"part-{epoch:03d}.jsonl", lines)
        files.append(records)
    return files


def _run(spark: Any, landing: Path, warehouse: str) -> None:
    params = {"landing_dir": str(landing), "parallelism": 2}
    CheckpointCoordinator(running_totals, params, warehouse, spark_factory=lambda: spark).run(until_caught_up=True)


def _tables(warehouse: str) -> dict[str, pa.Table]:
    from deltalake import DeltaTable

    layout = PipelineLayout.of(warehouse, "running_totals")
    state = pa.table(DeltaTable(layout.state_table("totals", "accumulators")).to_pyarrow_table())
    sink = run_query(warehouse, "running_totals", "select * from totals_updates order by _epoch, sensor_id")
    dead = run_query(warehouse, "running_totals", "select source_file, line, raw, reason, _epoch from dead_letter")
    live = latest_rows(state, ["sensor_id"]).sort_by("sensor_id").drop_columns(["_updated_at_ms"])
    return {"sink": sink, "live state": live, "dead letters": dead}


def test_chained_epochs_write_the_tables_spark_epochs_write(
    spark: Any, tmp_path: Path, warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    files = _files(landing)
    chained: list[int | None] = []

    def counted(ctx: Any, chain: Any) -> int | None:
        rows = run_chained(ctx, chain)
        chained.append(ctx.epoch if rows is not None else None)
        return rows

    run_chained = runtime.run_chained
    monkeypatch.setattr(runtime, "run_chained", counted)
    _run(spark, landing, warehouse)
    assert sorted(e for e in chained if e is not None) == [1, 2, 3, 5, 6], "plain epochs chained, the one with a bad line not"
    monkeypatch.setenv(CHAINING_ENV, "false")
    spark_only = f"{warehouse}-spark"
    _run(spark, landing, spark_only)
    assert len(chained) == 6, "chaining off: no epoch chained"
    ours, theirs = _tables(warehouse), _tables(spark_only)
    for name in ours:
        assert ours[name].equals(theirs[name]), f"{name} differ between chained and Spark epochs"
    assert ours["dead letters"].num_rows == 1
    expected = _reference(files)
    got = _totals(warehouse)
    assert {s: (g["count"], g["sum"], g["min"], g["max"]) for s, g in got.items()} == {
        s: (e["count"], e["sum"], e["min"], e["max"]) for s, e in expected.items()
    }
    # Compacted on the way, as Spark's epochs compact: not one file per epoch.
    from deltalake import DeltaTable

    state = DeltaTable(PipelineLayout.of(warehouse, "running_totals").state_table("totals", "accumulators"))
    assert any("_compacted" in path for path in state.file_uris())


def test_a_chained_epoch_that_fails_after_staging_leaves_nothing_and_resumes(
    spark: Any, tmp_path: Path, warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    files = _files(landing)[:3]
    for extra in ("part-003.jsonl", "part-004.jsonl", "part-005.jsonl"):
        (landing / extra).unlink()
    monkeypatch.setenv(FAULT_STATE_ENV, str(tmp_path / "faults"))  # crossings counted for this test alone
    monkeypatch.setenv(FAULT_ENV, "process.after_stage:2:raise")
    with pytest.raises(InjectedFault):
        _run(spark, landing, warehouse)
    monkeypatch.delenv(FAULT_ENV)
    _run(spark, landing, warehouse)
    expected = _reference(files)
    assert {s: g["count"] for s, g in _totals(warehouse).items()} == {s: e["count"] for s, e in expected.items()}
    sink = run_query(warehouse, "running_totals", "select _epoch, count(*) as n from totals_updates group by _epoch order by _epoch")
    assert sink.column("_epoch").to_pylist() == [1, 2, 3], "each epoch's rows once"


def test_key_groups_are_sparks(spark: Any) -> None:
    from pyspark.sql import functions as F

    rng = random.Random(3)
    texts = ["", "a", "s1", "sensor-000042", "ünïcødé ✓", "日本語のキー", "x" * 40, *(f"k{rng.getrandbits(40)}" for _ in range(300))]
    longs = [0, 1, -1, 2**63 - 1, -(2**63), *(rng.randrange(-(2**62), 2**62) for _ in range(300))]
    for keys in (
        pa.table({"k": texts}),
        pa.table({"k": pa.array(longs, pa.int64())}),
        pa.table({"a": texts[:300], "b": pa.array([None if i % 7 == 0 else v for i, v in enumerate(longs[:300])], pa.int64())}),
    ):
        columns = keys.column_names
        theirs = spark.createDataFrame(keys).select(F.pmod(F.xxhash64(*columns), F.lit(128)).alias("g")).toArrow()
        assert spark_key_groups(keys, 128).tolist() == theirs.column("g").to_pylist(), columns
