"""An epoch's tasks write its staged files; the driver gets their descriptions, never rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
from barrierflow.plan.registry import get_pipeline
from barrierflow.storage.layout import COMPACTED_DIR
from sensor_check import assert_matches_reference, reference_for


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
        for module in ("pyspark.sql.connect.dataframe", "pyspark.sql.classic.dataframe"):
            cls = __import__(module, fromlist=["DataFrame"]).DataFrame
            for method in ("toArrow", "toPandas"):
                m.setattr(cls, method, refuse)
        assert [r.epoch for r in coordinator.run(until_caught_up=True)] == [1, 2, 3, 4]
    assert_matches_reference(warehouse, reference_for(landing, 2))
    # Dedup state grows by similar generations: by epoch 4 their sum exceeds twice the
    # largest, and that epoch compacted the table in its tasks, in its own commit.
    table = DeltaTable(coordinator.layout.state_table("dedup", "seen"))
    paths = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
    assert any(f"/{COMPACTED_DIR}/" in p for p in paths), paths
    assert all(h.get("barrierflow.epoch") for h in table.history() if h.get("operation") != "CREATE TABLE"), (
        "a commit outside an epoch"
    )
