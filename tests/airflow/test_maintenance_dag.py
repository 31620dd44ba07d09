"""``barrierflow_maintenance``: retention and vacuum per pipeline, run for real."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from barrierflow.airflow.dags import build_maintenance_dag
from barrierflow.storage import objects
from dag_runs import dag_settings, minute, run_dag, task_logs, xcom
from operations import LANDING_ENV, run_epochs_in_process, write_landing
from readme_example import TARGET, write_readme_module
from sensor_check import assert_matches_reference, reference_for

pytestmark = pytest.mark.slow


def test_maintenance_keeps_the_retained_checkpoints_and_skips_pipelines_that_never_ran(
    tmp_path: Path,
    warehouse: str,
    spark: Any,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    landing = write_landing(tmp_path, files=2, seed=41)
    coordinator = run_epochs_in_process(warehouse, landing, spark, epochs=2)
    lineage = coordinator.current_lineage()["lineage_id"]
    # A user's pipeline (the README's), registered but never run: its task is skipped.
    write_readme_module(tmp_path / "user_code")
    monkeypatch.syspath_prepend(str(tmp_path / "user_code"))
    monkeypatch.setenv("BARRIERFLOW_PIPELINES", TARGET)
    dag = build_maintenance_dag(None, dag_settings(warehouse), environ={LANDING_ENV: str(landing)})

    run = run_dag(dag, minute(2036, 3, 1, 0, 0), {"retained_checkpoints": 1, "vacuum_retention_hours": 0})
    assert run.state == "success", run.tasks
    assert run.state_of("maintain_sensor_stats") == "success"
    assert run.state_of("maintain_clicks") == "skipped"
    assert "pipeline clicks has never run" in task_logs(caplog, capfd)
    report = xcom(run, "maintain_sensor_stats")
    assert report["retained_epochs"] == [2]
    assert report["expired_epochs"] == [f"{lineage}/1"]
    assert not objects.exists(coordinator.layout.barrier(lineage, 1))
    assert objects.exists(coordinator.layout.manifest(lineage, 2))
    # The retained cut still reads the same data.
    assert_matches_reference(warehouse, reference_for(landing, 1))


def test_maintenance_params_are_validated_by_the_form(local_warehouse: str) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    dag = build_maintenance_dag(["sensor_stats"], dag_settings(local_warehouse))
    assert [t.task_id for t in dag.tasks] == ["maintain_sensor_stats"]
    for name, bad in (("retained_checkpoints", 0), ("vacuum_retention_hours", -1), ("retained_checkpoints", "ten")):
        with pytest.raises(ParamValidationError):
            dag.params.get_param(name).resolve(bad)
