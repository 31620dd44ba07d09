"""Executors write staged files; the driver gets descriptions, never rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
from barrierflow.execution.runtime import EpochContext
from barrierflow.plan.registry import get_pipeline
from barrierflow.state.delta_backend import COMPACTED_DIR
from barrierflow.state.spec import KEY_GROUP
from barrierflow.storage import objects
from barrierflow.storage.staging import stage_frame
from sensor_check import assert_matches_reference, reference_for

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


def _frame(spark: Any, n: int, key_groups: int) -> Any:
    from pyspark.sql import functions as F

    return spark.range(n).select(
        F.concat(F.lit("k"), F.col("id").cast("string")).alias("key"),
        F.pmod(F.col("id") * 7, F.lit(key_groups)).cast("int").alias(KEY_GROUP),
        F.when(F.col("id") % 10 == 0, F.lit(None)).otherwise(F.col("id")).alias("value"),
        F.timestamp_micros(F.col("id") * 1000).alias("at"),
    )


def test_descriptions_are_the_files_executors_wrote(spark: Any, store_root: str) -> None:
    """On local disk and on S3: each description is a file the executors wrote, and nothing else was written."""
    table = objects.join_uri(store_root, "table")
    files = stage_frame(_frame(spark, 5000, 128), table, "_staging/a", SCHEMA, partitions=4, key_groups=128)
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


def test_constant_columns_are_added_by_the_writer(spark: Any, store_root: str) -> None:
    """An epoch's number and time are written by the writer, not as literals of the plan (compiled again each epoch)."""
    frame = _frame(spark, 300, 16).drop("value")
    files = stage_frame(frame, store_root, "_staging/c", SCHEMA, partitions=2, key_groups=16, constants={"value": 42})
    data = pa.concat_tables(_read(objects.join_uri(store_root, f.path)) for f in files)
    assert data.schema == SCHEMA and data.num_rows == 300
    assert set(data["value"].to_pylist()) == {42}
    assert all(json.loads(f.stats)["minValues"]["value"] == 42 for f in files)


def test_an_empty_frame_writes_no_file(spark: Any, store_root: str) -> None:
    assert stage_frame(_frame(spark, 100, 16).limit(0), store_root, "_staging/b", SCHEMA, partitions=2) == []
    assert list(objects.walk(objects.join_uri(store_root, "_staging"))) == []


def test_an_epoch_never_collects_rows_to_the_driver(
    spark: Any, tmp_path: Path, warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sensor_stats (dedup, windows, running totals, a process function, both sink modes) with every row-collecting call refused."""

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("an epoch brought a table's rows to the driver")

    landing = tmp_path / "landing"
    write_sensor_files(landing, SensorStreamSpec(n_files=8, records_per_file=150, seed=5, late_rate=0.05, duplicate_rate=0.1))
    given = {"landing_dir": str(landing), "max_files_per_epoch": 2}
    coordinator = CheckpointCoordinator(get_pipeline("sensor_stats"), given, warehouse, spark_factory=lambda: spark)
    with monkeypatch.context() as m:
        m.setattr(EpochContext, "to_arrow", refuse)
        for module in ("pyspark.sql.connect.dataframe", "pyspark.sql.classic.dataframe"):
            cls = __import__(module, fromlist=["DataFrame"]).DataFrame
            for method in ("toArrow", "toPandas"):
                m.setattr(cls, method, refuse)
        assert [r.epoch for r in coordinator.run(until_caught_up=True)] == [1, 2, 3, 4]
    assert_matches_reference(warehouse, reference_for(landing, 2))
    # Dedup state grows by similar generations: by epoch 4 their sum exceeds twice the
    # largest, and that epoch compacted the table on the executors, in its own commit.
    table = DeltaTable(coordinator.layout.state_table("dedup", "seen"))
    paths = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
    assert any(f"/{COMPACTED_DIR}/" in p for p in paths), paths
    assert all(h.get("barrierflow.epoch") for h in table.history() if h.get("operation") != "CREATE TABLE"), "a commit outside an epoch"
