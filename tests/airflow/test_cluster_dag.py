"""``barrierflow_sensor_stats`` on a standalone Spark cluster: ``process`` as spark-submit applications on its master.

The master comes from the Airflow Spark connection (``spark_default``), as a
deployment configures it; a ``$BARRIERFLOW_SPARK_MASTER`` in the task's
environment must not override it. The executors run on the cluster's two
workers (``tests/spark_cluster.py``), importing the package the driver ships.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from barrierflow.airflow.dags import build_pipeline_dag
from barrierflow.airflow.dags.environment import SPARK_CONN_ENV
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
from barrierflow.execution.spark import MASTER_ENV
from barrierflow.plan.registry import get_pipeline
from dag_runs import completed_epochs, dag_settings, minute, run_dag
from sensor_check import (
    assert_matches_reference,
    assert_nothing_staged_visible,
    assert_one_commit_per_table_per_epoch,
    reference_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def test_process_runs_on_the_connections_cluster_and_equals_the_reference(
    tmp_path: Path, warehouse: str, standalone: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    write_sensor_files(landing, SensorStreamSpec(n_files=2, records_per_file=40, seed=17, late_rate=0.05, duplicate_rate=0.1))
    host, _, port = standalone.master.rpartition(":")
    monkeypatch.setenv(SPARK_CONN_ENV, json.dumps({"conn_type": "spark", "host": host, "port": int(port)}))
    monkeypatch.setenv(MASTER_ENV, "local[1]")  # must not win over the connection's master
    before = len(standalone.completed_applications())
    dag = build_pipeline_dag(
        "sensor_stats",
        dag_settings(warehouse, process_mode="spark-submit"),
        environ={"BARRIERFLOW_SENSOR_STATS__LANDING_DIR": str(landing)},
    )
    # One run, two epochs: process runs epoch 1, catch_up epoch 2, each a spark-submit application.
    run = run_dag(dag, minute(2035, 1, 3, 0, 1), {"max_files_per_epoch": 1, "catch_up_epochs": 3})
    assert run.state == "success", run.tasks
    coordinator = CheckpointCoordinator(get_pipeline("sensor_stats"), {"landing_dir": str(landing)}, warehouse)
    assert completed_epochs(coordinator) == [1, 2]
    # The master records an application once its driver has stopped it.
    deadline = time.monotonic() + 60
    while len(standalone.completed_applications()) < before + 2 and time.monotonic() < deadline:
        time.sleep(1)
    assert len(standalone.completed_applications()) == before + 2, standalone.state()
    assert_matches_reference(warehouse, reference_for(landing, 1))
    assert_one_commit_per_table_per_epoch(warehouse, 2)
    assert_nothing_staged_visible(warehouse)
