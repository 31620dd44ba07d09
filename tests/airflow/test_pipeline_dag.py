"""``barrierflow_sensor_stats`` run for real: Airflow ``dag.test()``, spark-submit, Delta tables.

Every case compares the tables with the plain-Python reference and checks
exactly one Delta commit per table per epoch, so a lost or duplicated record,
or a re-planned barrier, fails the test.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from barrierflow.airflow.dags import build_pipeline_dag
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
from barrierflow.plan.registry import get_pipeline
from barrierflow.storage import objects
from dag_runs import (
    RunOutcome,
    asset_events,
    completed_epochs,
    dag_settings,
    fault_plan,
    minute,
    run_dag,
    running_dag_run,
    set_mtime,
    task_logs,
    xcom,
)
from reference.sensor_stats_reference import run_reference
from sensor_check import (
    assert_matches_reference,
    assert_nothing_staged_visible,
    assert_one_commit_per_table_per_epoch,
    reference_for,
)

pytestmark = pytest.mark.slow

SINKS = ["sensor_totals", "sensor_minute", "alerts", "late_readings"]
EPOCH_TASKS = ("process", "commit")


def _landing(tmp_path: Path, files: int, seed: int) -> Path:
    landing = tmp_path / "landing"
    write_sensor_files(landing, SensorStreamSpec(n_files=files, records_per_file=40, seed=seed, late_rate=0.05))
    return landing


def _dag(warehouse: str, landing: Path, **settings: object):
    return build_pipeline_dag(
        "sensor_stats",
        dag_settings(warehouse, **settings),
        environ={"BARRIERFLOW_SENSOR_STATS__LANDING_DIR": str(landing)},
    )


def _coordinator(warehouse: str, landing: Path) -> CheckpointCoordinator:
    return CheckpointCoordinator(get_pipeline("sensor_stats"), {"landing_dir": str(landing)}, str(warehouse))


def _barrier_doc(warehouse: str, landing: Path, epoch: int) -> dict:
    coordinator = _coordinator(warehouse, landing)
    lineage = coordinator.current_lineage()["lineage_id"]
    doc = objects.read_json(coordinator.layout.barrier(lineage, epoch))
    assert doc is not None, f"no barrier for epoch {epoch}"
    return doc


def _epoch_files(warehouse: str, landing: Path, epoch: int) -> list[str]:
    return [f[0] for f in _barrier_doc(warehouse, landing, epoch)["end_offsets"]["readings"]["files"]]


def _assert_skipped_after_barrier(run: RunOutcome) -> None:
    assert run.state == "success", run
    assert run.state_of("barrier") == "success"
    assert all(run.state_of(t) == "skipped" for t in (*EPOCH_TASKS, "catch_up")), run.tasks
    assert asset_events(run) == []


def test_epochs_through_the_dag_equal_the_reference(
    tmp_path: Path, warehouse: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    landing = _landing(tmp_path, files=2, seed=5)
    dag = _dag(warehouse, landing)

    # One run, two epochs: the lifecycle tasks complete epoch 1, catch_up epoch 2.
    first = run_dag(dag, minute(2035, 1, 1, 0, 1), {"max_files_per_epoch": 1, "catch_up_epochs": 3})
    assert first.state == "success", first.tasks
    assert {t: s for t, (s, _) in first.tasks.items()} == dict.fromkeys(first.tasks, "success")
    assert completed_epochs(_coordinator(warehouse, landing)) == [1, 2]
    events = asset_events(first)
    assets = sorted(f"barrierflow.sensor_stats.{s}" for s in SINKS)
    assert sorted(name for task, name, _ in events if task == "commit") == assets
    assert sorted(name for task, name, _ in events if task == "catch_up") == assets
    assert {(task, extra["epoch"]) for task, _, extra in events} == {("commit", 1), ("catch_up", 2)}
    versions = {(task, name): extra["delta_version"] for task, name, extra in events}
    assert versions[("commit", "barrierflow.sensor_stats.sensor_totals")] == 0
    assert versions[("catch_up", "barrierflow.sensor_stats.sensor_totals")] == 1
    assert xcom(first, "catch_up") == {"epochs": [2]}  # the third epoch had no input
    barrier = xcom(first, "barrier")
    assert barrier["epoch"] == 1 and barrier["details"]["replayed"] is False

    task_logs(caplog, capfd)
    idle = run_dag(dag, minute(2035, 1, 1, 0, 2), {"max_files_per_epoch": 1})
    _assert_skipped_after_barrier(idle)
    assert "no new input up to 2035-01-01T00:02:00+00:00: nothing to do" in task_logs(caplog, capfd)

    assert_matches_reference(warehouse, reference_for(landing, 1))
    assert_one_commit_per_table_per_epoch(warehouse, 2)
    assert_nothing_staged_visible(warehouse)


def test_a_failure_in_every_task_is_retried_to_exactly_once_output(tmp_path: Path, warehouse: str) -> None:
    landing = _landing(tmp_path, files=2, seed=11)
    # The spark-submit mode: process is a Spark application of its own, whose driver the fault kills.
    dag = _dag(warehouse, landing, process_mode="spark-submit")
    # Each task fails once; the crossing counter is shared by the tasks and the
    # Spark job, so each fault fires in the first attempt only and Airflow's retry
    # (a fresh attempt, and for process a fresh spark-submit) gets through.
    # barrier and commit each run two steps, and each of those steps fails once.
    faults = ",".join(
        [
            "recover.start:1:raise",  # step 1, in barrier's first attempt
            "barrier.before_write:1:raise",  # step 2, before the barrier is recorded (second attempt)
            "process.after_read:1:kill",  # the Spark driver dies mid-epoch, before voting
            "commit.after_delta_commit:4:raise",  # step 4, between the Delta commits of two tables
            "notify.start:1:raise",  # step 5, after the epoch COMPLETED (commit's second attempt)
        ]
    )
    with fault_plan(faults, tmp_path / "faults"):
        run = run_dag(dag, minute(2035, 1, 2, 0, 1), {"max_files_per_epoch": 2})
    assert run.state == "success", run.tasks
    assert {t: run.tasks[t] for t in ("barrier", "process", "commit")} == {
        "barrier": ("success", 3),
        "process": ("success", 2),
        "commit": ("success", 3),
    }, run.tasks
    assert run.state_of("catch_up") == "skipped"  # no input left: commit skipped it
    assert_matches_reference(warehouse, reference_for(landing, 2))
    assert_one_commit_per_table_per_epoch(warehouse, 1)
    assert_nothing_staged_visible(warehouse)
    assert [extra["epoch"] for _, _, extra in asset_events(run)] == [1] * 4


def test_the_run_after_a_failed_one_resumes_from_the_last_committed_epoch(
    tmp_path: Path, warehouse: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    landing = _landing(tmp_path, files=1, seed=17)
    dag = _dag(warehouse, landing, retries=0)

    # Run 1 fails right after recording epoch 1's barrier (no retries).
    with fault_plan("barrier.after_write:1:raise", tmp_path / "faults-1"):
        failed = run_dag(dag, minute(2035, 1, 3, 0, 1))
    assert failed.state == "failed" and failed.state_of("barrier") == "failed", failed.tasks
    assert failed.state_of("process") == "upstream_failed"
    planned = _barrier_doc(warehouse, landing, 1)

    # Run 2 replays the recorded barrier (never re-plans it), processes it, then
    # fails after the Delta commits of epoch 1 but before it is recorded COMPLETED.
    task_logs(caplog, capfd)
    with fault_plan("commit.before_completed:1:raise", tmp_path / "faults-2"):
        second = run_dag(dag, minute(2035, 1, 3, 0, 2))
    out = task_logs(caplog, capfd)
    assert second.state == "failed" and second.state_of("commit") == "failed", second.tasks
    assert second.state_of("process") == "success"
    # Run 1 owns that barrier and has ended: run 2 finishes it as recorded, and says whose it was.
    assert f"epoch 1: finishing the barrier that run {failed.dag_id}:{failed.run_id} recorded at {planned['planned_at']}" in out
    assert _barrier_doc(warehouse, landing, 1) == planned
    assert completed_epochs(_coordinator(warehouse, landing)) == []

    # Run 3 rolls epoch 1 forward from its durable vote (no reprocessing); no input is left.
    third = run_dag(dag, minute(2035, 1, 3, 0, 3))
    out = task_logs(caplog, capfd)
    _assert_skipped_after_barrier(third)
    assert "rolled forward pre-committed epoch(s) [1]" in out
    assert completed_epochs(_coordinator(warehouse, landing)) == [1]
    assert_matches_reference(warehouse, reference_for(landing, 1))
    assert_one_commit_per_table_per_epoch(warehouse, 1)
    assert_nothing_staged_visible(warehouse)


def test_backfill_runs_one_epoch_per_data_interval_in_order(
    tmp_path: Path, warehouse: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    landing = _landing(tmp_path, files=3, seed=23)
    files = sorted(landing.glob("*.jsonl"))
    start = minute(2025, 3, 1, 6, 0)
    # Arrival times: two files in the first minute, none in the second, one in the
    # third (the DAG's schedule cuts one-minute data intervals).
    for path, seconds in zip(files, (10, 40, 150)):
        set_mtime(path, start + timedelta(seconds=seconds))
    dag = _dag(warehouse, landing)
    conf = {"max_files_per_epoch": 10}  # only the data interval bounds an epoch
    interval_ends = [start + timedelta(minutes=k) for k in (1, 2, 3)]

    task_logs(caplog, capfd)
    for end in interval_ends:  # what a backfill over [06:00, 06:03) runs, in order
        run = run_dag(dag, end, conf)
        assert run.state == "success", (end, run.tasks)
    coordinator = _coordinator(warehouse, landing)
    assert completed_epochs(coordinator) == [1, 2]
    names = [p.name for p in files]
    assert [_epoch_files(warehouse, landing, e) for e in (1, 2)] == [names[:2], names[2:]]
    assert "no new input up to 2025-03-01T06:02:00+00:00: nothing to do" in task_logs(caplog, capfd)

    # Repeating the range is a no-op that says so, interval by interval.
    for end in interval_ends:
        _assert_skipped_after_barrier(run_dag(dag, end, conf))
        assert f"no new input up to {end.isoformat()}: nothing to do" in task_logs(caplog, capfd)
    assert completed_epochs(coordinator) == [1, 2]

    assert_matches_reference(warehouse, run_reference([files[:2], files[2:]], 30))
    assert_one_commit_per_table_per_epoch(warehouse, 2)


def test_an_s3_warehouse_reached_through_the_airflow_aws_connection(
    tmp_path: Path, s3_server: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tasks know S3 only from ``aws_default``: without it they would try AWS itself."""
    import boto3

    from s3_server import aws_env

    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ALLOW_HTTP"):
        monkeypatch.delenv(name, raising=False)  # also removed again after the test, when the tasks set them
    endpoint = s3_server.endpoint  # type: ignore[attr-defined]
    conn = {
        "conn_type": "aws",
        "login": "testing",
        "password": "testing",
        "extra": {"region_name": "us-east-1", "endpoint_url": endpoint},
    }
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(conn))
    bucket = f"dag-{uuid.uuid4().hex[:16]}"
    credentials = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}
    boto3.session.Session().client("s3", endpoint_url=endpoint, **credentials).create_bucket(Bucket=bucket)
    s3_warehouse = f"s3://{bucket}/warehouse"
    landing = _landing(tmp_path, files=2, seed=9)
    run = run_dag(_dag(s3_warehouse, landing), minute(2035, 1, 3, 0, 1), {"max_files_per_epoch": 1, "catch_up_epochs": 3})
    assert run.state == "success", run.tasks
    for name, value in aws_env(endpoint).items():
        monkeypatch.setenv(name, value)
    assert completed_epochs(_coordinator(s3_warehouse, landing)) == [1, 2]
    assert_matches_reference(s3_warehouse, reference_for(landing, 1))


def test_a_pipeline_without_its_required_param_fails_at_once_saying_how_to_set_it(
    warehouse: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    dag = build_pipeline_dag("sensor_stats", dag_settings(warehouse, retries=2), environ={})
    run = run_dag(dag, minute(2035, 1, 4, 0, 1))
    assert run.state == "failed" and run.tasks["barrier"] == ("failed", 1)  # no retries: they cannot help
    out = task_logs(caplog, capfd)
    assert "missing required parameter(s) landing_dir" in out and "BARRIERFLOW_SENSOR_STATS__LANDING_DIR" in out
    assert not objects.exists(warehouse)


def test_a_file_landing_behind_the_position_fails_at_once_visibly_and_each_policy_does_what_it_says(
    tmp_path: Path, warehouse: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """A late file: ``late_files=refuse`` blocks (no retry, the page says why), ``dead_letter`` sets it
    aside whole, ``next_epoch`` (the default) reads it; a file gone before the spark-submit process
    job reads it fails that task at once too."""
    from barrierflow.airflow.dags.settings import SPARK_SUBMIT_MODE
    from barrierflow.airflow.ui.history import pipeline_history
    from barrierflow.airflow.ui.render import render_pipeline

    landing = _landing(tmp_path, files=2, seed=31)
    files = sorted(landing.glob("*.jsonl"))
    extra = sorted(_landing(tmp_path / "extra", files=3, seed=32).glob("*.jsonl"))
    dag = _dag(warehouse, landing)
    assert run_dag(dag, minute(2035, 1, 6, 0, 1)).state == "success"  # epoch 1: both files
    late_a, late_b = landing / "0-late-a.jsonl", landing / "0-late-b.jsonl"  # sort before every file read
    extra[0].rename(late_a)

    task_logs(caplog, capfd)
    refused = run_dag(dag, minute(2035, 1, 6, 0, 2), {"late_files": "refuse"})
    assert refused.state == "failed" and refused.tasks["barrier"] == ("failed", 1), refused.tasks  # no retries
    assert "'0-late-a.jsonl' landed" in task_logs(caplog, capfd)
    history = pipeline_history(warehouse, "sensor_stats", state_size=False, savepoint_lister=lambda *_: [])
    assert history.blocked is not None and "'0-late-a.jsonl' landed" in history.blocked["message"]
    assert 'class="blocked"' in render_pipeline(history)

    assert run_dag(dag, minute(2035, 1, 6, 0, 3), {"late_files": "dead_letter"}).state == "success"  # epoch 2
    assert _coordinator(warehouse, landing).blocked() is None
    extra[1].rename(late_b)
    # A DAG object keeps the last dag.test()'s conf in its params: a fresh one has the default policy.
    assert run_dag(_dag(warehouse, landing), minute(2035, 1, 6, 0, 4)).state == "success"  # epoch 3
    assert _epoch_files(warehouse, landing, 3) == [late_b.name]
    assert_matches_reference(warehouse, run_reference([files, [], [late_b]], 30), late_files={late_a.name: 2})

    # A file recorded in a barrier, gone before the spark-submit job reads it.
    gone = landing / extra[2].name
    extra[2].rename(gone)
    with fault_plan("barrier.after_write:1:raise", tmp_path / "faults"):
        assert run_dag(_dag(warehouse, landing, retries=0), minute(2035, 1, 6, 0, 5)).state == "failed"
    gone.unlink()
    task_logs(caplog, capfd)
    run = run_dag(_dag(warehouse, landing, process_mode=SPARK_SUBMIT_MODE), minute(2035, 1, 6, 0, 6))
    assert run.state == "failed" and run.tasks["process"] == ("failed", 1), run.tasks
    assert f"epoch 4 is blocked: source readings: file {gone.name} recorded in the barrier is gone" in task_logs(caplog, capfd)
    assert _coordinator(warehouse, landing).blocked()["step"] == "process"


def test_json_reports_are_pushed_for_the_ui(tmp_path: Path, warehouse: str) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    dag = _dag(warehouse, landing)
    run = run_dag(dag, minute(2035, 1, 5, 0, 1))
    _assert_skipped_after_barrier(run)
    report = xcom(run, "barrier", key="report")
    assert report["step"] == "barrier" and report["details"]["last_completed_epoch"] == 0
    assert report["proceed"] is False
    assert json.loads(json.dumps(report)) == report


@pytest.mark.parametrize("earlier_state", ["running", "queued"])
def test_a_run_waits_while_an_earlier_run_is_queued_or_running(
    tmp_path: Path,
    warehouse: str,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    earlier_state: str,
) -> None:
    # An Airflow 3 backfill runs up to its own max_active_runs (10 unless given)
    # at once, whatever the DAG's max_active_runs, and its next run waits queued:
    # barrier waits for earlier runs in either state.
    landing = tmp_path / "landing"
    landing.mkdir()
    dag = _dag(warehouse, landing, retries=0, lease_wait_s=3)
    day = 6 if earlier_state == "running" else 7
    assert run_dag(dag, minute(2035, 1, day, 0, 1)).state == "success"  # the DAG is now in the database
    with running_dag_run(dag, minute(2035, 1, day, 0, 2), earlier_state) as earlier:
        task_logs(caplog, capfd)
        blocked = run_dag(dag, minute(2035, 1, day, 0, 3))
        out = task_logs(caplog, capfd)
        assert blocked.state == "failed" and blocked.state_of("barrier") == "failed", blocked.tasks
        assert f"waiting for the earlier run {earlier} of barrierflow_sensor_stats ({earlier_state}) to finish" in out
        assert "epochs run in data-interval order" in out
    assert run_dag(dag, minute(2035, 1, day, 0, 4)).state == "success"  # the earlier run ended


def test_a_dead_engine_fails_process_naming_it_and_the_retry_succeeds_once_it_is_back(
    tmp_path: Path,
    warehouse: str,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from barrierflow.airflow.dags.environment import engine_connection
    from barrierflow.execution.engine import EngineConfig, LocalEngine
    from barrierflow.tools.devserver import free_port

    landing = _landing(tmp_path, files=1, seed=29)
    config = EngineConfig(port=free_port(), master="local[2]", driver_memory="1g")
    monkeypatch.setenv("AIRFLOW_CONN_BACKUP_ENGINE", engine_connection(config.address))
    dag = _dag(
        warehouse,
        landing,
        spark_conn_id="backup_engine",
        retries=5,
        retry_delay=timedelta(seconds=15),
        max_retry_delay=timedelta(seconds=30),
    )
    engine = LocalEngine(config, log=(tmp_path / "engine.log").open("wb"))

    def start_after_the_first_failure() -> None:
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session
        from airflow.utils.state import TaskInstanceState

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with create_session() as session:
                # Earlier tests' runs of this DAG share the database: look for this run's retry only.
                waiting = (
                    session.query(TaskInstance)
                    .filter_by(dag_id=dag.dag_id, task_id="process", state=TaskInstanceState.UP_FOR_RETRY)
                    .first()
                )
                if waiting is not None:
                    break
            time.sleep(0.2)
        engine.start(wait_s=300)

    starter = threading.Thread(target=start_after_the_first_failure)
    task_logs(caplog, capfd)
    try:
        starter.start()
        run = run_dag(dag, minute(2035, 1, 7, 0, 1))
    finally:
        starter.join()
        engine.stop()
    out = task_logs(caplog, capfd)
    assert run.state == "success", run.tasks
    assert run.tries("process") >= 2, run.tasks  # the engine's JVM takes a while to listen under load
    assert f"the Spark engine at {config.address}/ is not reachable" in out
    assert_matches_reference(warehouse, reference_for(landing, 10))
    assert_one_commit_per_table_per_epoch(warehouse, 1)
