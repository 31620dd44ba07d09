"""``barrierflow_sensor_stats_savepoint``: the savepoint form, run for real with ``dag.test()``."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from barrierflow.airflow.dags import build_savepoint_dag
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.plan.registry import get_pipeline
from barrierflow.storage import objects
from dag_runs import dag_settings, minute, run_dag, task_logs, xcom
from operations import LANDING_ENV, run_epochs_in_process, write_landing

pytestmark = pytest.mark.slow


@pytest.fixture
def history(tmp_path: Path, warehouse: str, spark: Any) -> Path:
    """One completed epoch of sensor_stats; returns the landing directory."""
    landing = write_landing(tmp_path, files=1)
    run_epochs_in_process(warehouse, landing, spark, epochs=1)
    return landing


def _dag(warehouse: str, landing: Path, **settings: Any):
    return build_savepoint_dag("sensor_stats", dag_settings(warehouse, **settings), environ={LANDING_ENV: str(landing)})


def test_the_savepoint_form(
    warehouse: str, history: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    dag = _dag(warehouse, history, retries=2)
    named = run_dag(dag, minute(2036, 1, 1, 0, 0), {"savepoint_name": "before-upgrade", "description": "v2 rollout"})
    assert named.state == "success" and named.tries("savepoint") == 1, named.tasks
    doc = xcom(named, "savepoint")
    assert doc["name"] == "before-upgrade" and doc["epoch"] == 1 and doc["description"] == "v2 rollout"
    assert doc["stopped"] is False and doc["params"]["landing_dir"] == str(history)
    assert doc["uri"] == f"{warehouse}/_savepoints/sensor_stats/before-upgrade"
    assert objects.exists(f"{doc['uri']}/_savepoint.json")
    assert f"savepoint 'before-upgrade' of sensor_stats at epoch 1 written to {doc['uri']}" in task_logs(caplog, capfd)
    assert not objects.exists(f"{warehouse}/sensor_stats/_stopped.json")

    generated = run_dag(dag, minute(2036, 1, 1, 0, 1), {"savepoint_name": ""})
    assert generated.state == "success" and xcom(generated, "savepoint")["name"].startswith("sp-")

    # Bad input fails at once: AirflowFailException, no retry can help.
    for conf, message in (
        ({"savepoint_name": "not a name!"}, "savepoint name 'not a name!' is invalid"),
        ({"savepoint_name": "before-upgrade"}, "savepoint 'before-upgrade' of sensor_stats already exists"),
    ):
        refused = run_dag(dag, minute(2036, 1, 1, 0, 2), conf)
        assert refused.state == "failed" and refused.tasks["savepoint"] == ("failed", 1), refused.tasks
        assert message in task_logs(caplog, capfd)


def test_the_savepoint_waits_for_a_running_epoch(warehouse: str, history: Path) -> None:
    # Something holds the pipeline's epoch lease, as a running epoch step would.
    holder = CheckpointCoordinator(get_pipeline("sensor_stats"), {"landing_dir": str(history)}, str(warehouse))
    holder.acquire_lease()
    released_at: list[float] = []

    def release() -> None:
        time.sleep(6)
        released_at.append(time.time())
        holder.release_lease()

    threading.Thread(target=release, daemon=True).start()
    run = run_dag(_dag(warehouse, history), minute(2036, 1, 1, 0, 3), {"savepoint_name": "after-wait"})
    assert run.state == "success" and run.tries("savepoint") == 1, run.tasks
    doc = xcom(run, "savepoint")
    assert doc["epoch"] == 1
    assert released_at and datetime.fromisoformat(doc["created_at"]).timestamp() >= released_at[0]
