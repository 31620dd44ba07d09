"""The docker-compose deployment, without Docker: the same services started by the same commands.

``barrierflow.tools.topology`` is what each compose service runs; here it starts
them all as child processes on free loopback ports: PostgreSQL for Airflow's
metadata, the S3 endpoint holding the warehouse, a standalone Spark master
with two workers, the warm engine on that master, and Airflow's API server,
scheduler, DAG processor and triggerer. Three epochs and a savepoint are then
triggered through Airflow's REST API, as a user would from the UI, the
checkpoints page's data is read from the API server, and the tables on S3
are compared with the plain-Python reference.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from barrierflow.airflow.dags.settings import pipeline_dag_id, savepoint_dag_id
from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
from barrierflow.operations.savepoint import list_savepoints
from barrierflow.tools.devserver import ApiClient, free_port
from barrierflow.tools.topology import TopologyConfig, running_topology
from integration.sensor_check import assert_matches_reference, assert_one_commit_per_table_per_epoch, reference_for
from stack import ROOT, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

DAG_ID = pipeline_dag_id("sensor_stats")
SAVEPOINT_DAG_ID = savepoint_dag_id("sensor_stats")
EPOCHS = 3  # then a savepoint, as docker-compose.yaml describes


def _trigger_and_wait(api: ApiClient, dag_id: str, conf: dict[str, Any], timeout_s: float = 600) -> dict[str, Any]:
    status, run = api.post(f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf})
    assert status == 200, run

    def finished() -> dict[str, Any] | None:
        status, doc = api.get(f"/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}")
        return doc if status == 200 and doc["state"] in ("success", "failed") else None

    return until(f"{dag_id} run {run['dag_run_id']}", finished, timeout_s, poll_s=3)


def _workers(config: TopologyConfig) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{config.master_ui_port}/json/", timeout=10) as resp:
        return json.loads(resp.read())["workers"]


def test_epochs_and_a_savepoint_through_the_rest_api_equal_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    base = Path(tempfile.mkdtemp(prefix="barrierflow-topology-"))
    ports = [free_port() for _ in range(8)]
    config = TopologyConfig(
        home=base, postgres_port=ports[0], s3_port=ports[1], master_port=ports[2], master_ui_port=ports[3],
        worker_ui_ports=(ports[4], ports[5]), engine_port=ports[6], api_port=ports[7], bucket="topology-test",
    )  # fmt: skip
    # What a container would start from: no settings of this test process (its Airflow, its engine, its S3).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "AWS_", "BARRIERFLOW_", "SPARK_"))}
    env["BARRIERFLOW_SCHEDULE"] = "none"  # runs come only from the REST API
    env["BARRIERFLOW_LEASE_TTL_SECONDS"] = "10"
    logs = ROOT / "test-artifacts" / "topology"
    shutil.rmtree(logs, ignore_errors=True)
    try:
        with running_topology(config, logs, base_env=env):
            old = time.time() - 600  # landed well before the runs
            files = write_sensor_files(
                config.landing, SensorStreamSpec(n_files=EPOCHS, records_per_file=40, seed=17, late_rate=0.05)
            )
            for path in files:
                os.utime(path, (old, old))
            api = ApiClient(config.api_url, "admin", "admin", timeout_s=60)
            until("the DAGs to be parsed and unpaused", lambda: all(
                (api.get(f"/api/v2/dags/{d}")[1] or {}).get("is_paused") is False for d in (DAG_ID, SAVEPOINT_DAG_ID)
            ), 300)  # fmt: skip
            alive = [w for w in _workers(config) if w["state"] == "ALIVE"]
            assert len(alive) == 2, alive

            for _ in range(EPOCHS):
                run = _trigger_and_wait(api, DAG_ID, {"max_files_per_epoch": 1, "catch_up_epochs": 1})
                assert run["state"] == "success", run
            savepoint = _trigger_and_wait(api, SAVEPOINT_DAG_ID, {"savepoint_name": "after-three"})
            assert savepoint["state"] == "success", savepoint
            # The checkpoints page's data, served by the API server from the warehouse on S3 (the browser
            # test reads the same page from a local one).
            status, page = api.get("/barrierflow/api/pipelines/sensor_stats?state_size=false")
            assert status == 200, page
            assert [s["name"] for s in page["savepoints"]] == ["after-three"], page["savepoints"]
            assert sorted(e["epoch"] for e in page["epochs"] if e["status"] == "COMPLETED") == list(range(1, EPOCHS + 1))
            # The engine's executors ran on the two workers.
            assert all(w["coresused"] == 1 for w in _workers(config) if w["state"] == "ALIVE")

            for name, value in config.aws_environment().items():
                monkeypatch.setenv(name, value)
            assert_matches_reference(config.warehouse, reference_for(config.landing, 1))
            assert_one_commit_per_table_per_epoch(config.warehouse, EPOCHS)
            saved = list_savepoints("sensor_stats", config.warehouse)
            assert [(s.name, s.epoch) for s in saved] == [("after-three", EPOCHS)]
    finally:
        shutil.rmtree(base, ignore_errors=True)
