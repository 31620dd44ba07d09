"""A sensor_stats pipeline with completed epochs, for the savepoint, restore and maintenance DAG tests.

The epochs are run in this process on the session's Spark (cheaper than a
spark-submit per epoch); those DAGs only need a pipeline with history.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
from barrierflow.plan.registry import get_pipeline

__all__ = ["run_epochs_in_process", "write_landing", "LANDING_ENV"]

LANDING_ENV = "BARRIERFLOW_SENSOR_STATS__LANDING_DIR"


def write_landing(tmp_path: Path, files: int, seed: int = 7) -> Path:
    landing = tmp_path / "landing"
    write_sensor_files(landing, SensorStreamSpec(n_files=files, records_per_file=40, seed=seed, late_rate=0.05))
    return landing


def run_epochs_in_process(warehouse: str, landing: Path, spark: Any, epochs: int) -> CheckpointCoordinator:
    """``epochs`` epochs of one file each; returns the coordinator (for reading the log)."""
    coordinator = CheckpointCoordinator(
        get_pipeline("sensor_stats"),
        {"landing_dir": str(landing), "max_files_per_epoch": 1},
        str(warehouse),
        spark_factory=lambda: spark,
    )
    done = coordinator.run(epochs=epochs)
    assert [r.epoch for r in done] == list(range(1, epochs + 1))
    return coordinator
