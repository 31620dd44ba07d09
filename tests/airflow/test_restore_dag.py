"""``barrierflow_sensor_stats_restore`` (with the savepoint and epoch DAGs), run for real."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from barrierflow.airflow.dags import build_pipeline_dag, build_restore_dag, build_savepoint_dag
from barrierflow.airflow.dags.restore_dag import restore_point
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.core.errors import ParameterError
from barrierflow.plan.pipeline import PipelineBuilder, PipelineDefinition
from barrierflow.plan.registry import get_pipeline
from dag_runs import asset_events, completed_epochs, dag_settings, minute, run_dag, task_logs, xcom
from operations import LANDING_ENV, run_epochs_in_process, write_landing
from sensor_check import assert_matches_reference, reference_for

pytestmark = pytest.mark.slow


@pytest.fixture
def history(tmp_path: Path, warehouse: str, spark: Any) -> Path:
    """One completed epoch of sensor_stats (one file) and a second file waiting."""
    landing = write_landing(tmp_path, files=2, seed=31)
    run_epochs_in_process(warehouse, landing, spark, epochs=1)
    return landing


def _env(landing: Path) -> dict[str, str]:
    return {LANDING_ENV: str(landing)}


def _coordinator(warehouse: str, landing: Path) -> CheckpointCoordinator:
    return CheckpointCoordinator(get_pipeline("sensor_stats"), {"landing_dir": str(landing)}, str(warehouse))


def test_stop_with_savepoint_then_restore_resumes_exactly_once(
    warehouse: str, history: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    settings = dag_settings(warehouse)
    savepoint = build_savepoint_dag("sensor_stats", settings, environ=_env(history))
    restore = build_restore_dag("sensor_stats", settings, environ=_env(history))
    epochs = build_pipeline_dag("sensor_stats", settings, environ=_env(history))
    conf = {"max_files_per_epoch": 1}

    stop = run_dag(savepoint, minute(2036, 2, 1, 0, 0), {"savepoint_name": "sp-stop", "stop_pipeline": True})
    assert stop.state == "success" and xcom(stop, "savepoint")["stopped"] is True
    task_logs(caplog, capfd)

    # Stopped: the epoch DAG skips its run (input is waiting), says why, emits no asset event.
    idle = run_dag(epochs, minute(2036, 2, 1, 0, 1), conf)
    assert idle.state == "success" and idle.state_of("barrier") == "success", idle.tasks
    assert all(idle.state_of(t) == "skipped" for t in ("process", "commit", "catch_up"))
    assert asset_events(idle) == []
    assert "stopped with savepoint 'sp-stop'" in task_logs(caplog, capfd)
    assert completed_epochs(_coordinator(warehouse, history)) == [1]

    restored = run_dag(restore, minute(2036, 2, 1, 0, 2), {"savepoint": "sp-stop"})
    assert restored.state == "success" and restored.tries("restore") == 1, restored.tasks
    result = xcom(restored, "restore")
    assert result["epoch"] == 1 and result["restored_from"] == "savepoint sp-stop"

    resumed = run_dag(epochs, minute(2036, 2, 1, 0, 3), conf)
    assert resumed.state == "success", resumed.tasks
    assert [extra["epoch"] for _, _, extra in asset_events(resumed)] == [2] * 4
    assert [extra["lineage_id"] for _, _, extra in asset_events(resumed)] == [result["lineage_id"]] * 4
    assert_matches_reference(warehouse, reference_for(history, 1))


def test_restore_points_from_the_form(
    tmp_path: Path, warehouse: str, spark: Any, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    landing = write_landing(tmp_path, files=2, seed=37)
    run_epochs_in_process(warehouse, landing, spark, epochs=2)
    restore = build_restore_dag("sensor_stats", dag_settings(warehouse, retries=2), environ=_env(landing))

    # Exactly one of savepoint and epoch, and it must exist: else the task fails at once.
    for conf, message in (
        ({"savepoint": "", "epoch": None}, "give exactly one of 'savepoint'"),
        ({"savepoint": "sp", "epoch": 1}, "give exactly one of 'savepoint'"),
        ({"savepoint": "no-such-savepoint", "epoch": None}, "no savepoint 'no-such-savepoint'"),
    ):
        refused = run_dag(restore, minute(2036, 2, 2, 0, 0), conf)
        assert refused.tasks["restore"] == ("failed", 1), (conf, refused.tasks)
        assert message in task_logs(caplog, capfd)

    run = run_dag(restore, minute(2036, 2, 2, 0, 1), {"savepoint": "", "epoch": 1, "rewind_sinks": True, "parallelism": 3})
    assert run.state == "success", run.tasks
    result = xcom(run, "restore")
    assert result["epoch"] == 1 and result["params"] == {"parallelism": 3}
    coordinator = _coordinator(warehouse, landing)
    assert coordinator.current_lineage()["lineage_id"] == result["lineage_id"] != result["previous_lineage_id"]
    assert coordinator.recover().last_completed_epoch == 1


def _without_alerts() -> PipelineDefinition:
    """sensor_stats as if a release dropped the rising-temperature alerts (and their state)."""
    original = get_pipeline("sensor_stats")

    def build(p: PipelineBuilder, params: dict[str, Any]) -> None:
        original.build_fn(p, params)
        p.nodes[:] = [n for n in p.nodes if n.operator_id not in ("rising_alerts", "sink_alerts")]

    return dataclasses.replace(original, build_fn=build)


def test_an_incompatible_restore_fails_at_once_listing_the_state(
    warehouse: str, history: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    settings = dag_settings(warehouse, retries=2)
    run_dag(
        build_savepoint_dag("sensor_stats", settings, environ=_env(history)), minute(2036, 2, 3, 0, 0), {"savepoint_name": "v1"}
    )
    task_logs(caplog, capfd)
    restore = build_restore_dag(_without_alerts(), settings, environ=_env(history))

    refused = run_dag(restore, minute(2036, 2, 3, 0, 1), {"savepoint": "v1"})
    assert refused.state == "failed"
    assert refused.tasks["restore"] == ("failed", 1)  # AirflowFailException: no retries
    out = task_logs(caplog, capfd)
    assert "would be dropped" in out and "rising_alerts/last_two" in out
    assert "dropped: rising_alerts/last_two" in out  # the list, from the exception's fields

    allowed = run_dag(restore, minute(2036, 2, 3, 0, 2), {"savepoint": "v1", "allow_non_restored_state": True})
    assert allowed.state == "success", allowed.tasks
    assert xcom(allowed, "restore")["dropped_states"] == ["rising_alerts/last_two"]


def test_restore_point_from_the_form() -> None:
    assert restore_point("sp-1", None) == ("sp-1", None)
    assert restore_point(" ", 4) == (None, 4)
    for savepoint, epoch in (("", None), (None, None), ("sp", 2), ("", 0), ("", True)):
        with pytest.raises(ParameterError):
            restore_point(savepoint, epoch)
