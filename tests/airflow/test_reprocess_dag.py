"""``barrierflow_sensor_stats_reprocess``: restore, then replay interval by interval, run for real.

The history: input landing in three one-minute intervals (one empty between
them), each committed by the epoch DAG's run of its interval, with a
savepoint after the first. Reprocessing from that savepoint reports the
epochs it will replay beforehand, replays one epoch per interval (never one
epoch for everything after the restore point), holds the schedule meanwhile
and releases it, and ends with the sinks of the interval-by-interval history.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from barrierflow.airflow.dags import build_pipeline_dag, build_reprocess_dag, build_savepoint_dag
from barrierflow.airflow.dags.settings import CONNECT_MODE, SPARK_SUBMIT_MODE
from barrierflow.checkpointing.checkpoint import EpochStatus
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.plan.registry import get_pipeline
from barrierflow.storage import objects
from dag_runs import dag_settings, minute, run_dag, set_mtime, task_logs, xcom
from operations import LANDING_ENV, write_landing
from reference.sensor_stats_reference import run_reference
from sensor_check import assert_matches_reference

pytestmark = pytest.mark.slow


def test_reprocessing_replays_each_interval_in_order_with_the_schedule_held(
    tmp_path: Path, warehouse: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    landing = write_landing(tmp_path, files=5, seed=43)
    files = sorted(landing.glob("*.jsonl"))
    start = minute(2026, 1, 5, 10, 0)
    # Two files in 10:00-10:01, one in 10:01-10:02, none in 10:02-10:03, two in 10:03-10:04.
    for path, seconds in zip(files, (10, 20, 90, 185, 220)):
        set_mtime(path, start + timedelta(seconds=seconds))
    # The history on the warm engine. The replay: on a local warehouse as one spark-submit application
    # per epoch, on S3 on the warm engine (as the browser test replays through the reprocess DAG's form).
    replay_mode = SPARK_SUBMIT_MODE if objects.is_local(warehouse) else CONNECT_MODE
    settings = dag_settings(warehouse)
    env = {LANDING_ENV: str(landing)}
    epochs = build_pipeline_dag("sensor_stats", settings, environ=env)
    conf = {"max_files_per_epoch": 10}
    run_dag(epochs, start + timedelta(minutes=1), conf)
    assert (
        run_dag(build_savepoint_dag("sensor_stats", settings, environ=env), start, {"savepoint_name": "after-first"}).state
        == "success"
    )
    for k in (2, 3, 4):
        assert run_dag(epochs, start + timedelta(minutes=k), conf).state == "success"
    history = [files[:2], files[2:3], files[3:]]
    assert_matches_reference(warehouse, run_reference(history, 30))
    task_logs(caplog, capfd)

    reprocess = build_reprocess_dag("sensor_stats", dag_settings(warehouse, process_mode=replay_mode), environ=env)
    run = run_dag(reprocess, start + timedelta(minutes=10), {"savepoint": "after-first", "epoch": None})
    assert run.state == "success", run.tasks
    out = task_logs(caplog, capfd)
    # Reported beforehand: the restore point and one epoch per interval holding input.
    assert "restore savepoint after-first (epoch 1, arrival cut-off 2026-01-05T10:01:00+00:00), then replay 2 epoch(s)" in out
    assert f"epoch 2: interval ending 2026-01-05T10:02:00+00:00: readings: 1 file(s) {files[2].name}" in out
    assert f"epoch 3: interval ending 2026-01-05T10:04:00+00:00: readings: 2 file(s) {files[3].name} .. {files[4].name}" in out
    result = xcom(run, "reprocess")
    assert [(e["epoch"], e["arrival_cutoff_ms"]) for e in result["replayed"]] == [
        (2, int((start + timedelta(minutes=2)).timestamp() * 1000)),
        (3, int((start + timedelta(minutes=4)).timestamp() * 1000)),
    ]

    coordinator = CheckpointCoordinator(get_pipeline("sensor_stats"), {"landing_dir": str(landing)}, str(warehouse))
    lineage = coordinator.current_lineage()["lineage_id"]
    assert lineage == result["restored"]["lineage_id"] != result["restored"]["previous_lineage_id"]
    done = [r.epoch for r in coordinator.log.lineage_records(lineage) if r.status is EpochStatus.COMPLETED]
    assert sorted(done) == [1, 2, 3] and coordinator.held_by() is None  # the hold is released
    # The rewound sinks hold exactly the interval-by-interval history again, written once.
    assert_matches_reference(warehouse, run_reference(history, 30))
    # The schedule takes over: its next run has nothing left to do.
    assert run_dag(epochs, start + timedelta(minutes=11), conf).state_of("process") == "skipped"
