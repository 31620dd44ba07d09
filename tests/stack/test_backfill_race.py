"""A backfill raced by the live schedule, on the real stack (scheduler, LocalExecutor, PostgreSQL).

Input lands in four past one-minute intervals while the pipeline DAG is
unpaused and scheduled every minute. A backfill of those intervals is
created late in a minute, with ``max_active_runs=1``, and paused through the
REST API so that the scheduled run of the next minute (a later interval,
whose arrival cut-off covers all that input) is certain to become ready while
backfill runs of earlier intervals are still queued, however loaded the
machine. Once that run reports it is waiting for them, the backfill is
unpaused. The scheduled run must wait for them: every file lands in the epoch
of its arrival interval, each epoch is planned and processed once by the
backfill run of its interval, and the sinks equal the interval-by-interval
history computed by the reference implementation. On a local and an
``s3://`` warehouse (``stack_warehouse``).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from barrierflow.checkpointing.checkpoint import EpochStatus
from barrierflow.checkpointing.checkpoint_log import CheckpointLog
from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
from barrierflow.storage import objects
from barrierflow.storage.layout import PipelineLayout
from integration.sensor_check import assert_matches_reference, assert_one_commit_per_table_per_epoch
from reference.sensor_stats_reference import run_reference
from stack import ROOT, running_stack, until

pytestmark = [pytest.mark.slow, pytest.mark.stack_store("local", "s3"), pytest.mark.timeout(1800)]

DAG_ID = "barrierflow_sensor_stats"
# Files per interval: an empty interval in between, as a backfill range may hold.
PER_INTERVAL = [2, 0, 1, 1]


def _task_log(home: Path, run_id: str, task_id: str) -> str:
    path = home / "logs" / f"dag_id={DAG_ID}" / f"run_id={run_id}" / f"task_id={task_id}" / "attempt=1.log"
    return "\n".join(str(json.loads(line).get("event", "")) for line in path.read_text().splitlines() if line.strip())


def test_a_scheduled_run_waits_for_a_backfill_of_earlier_intervals(
    tmp_path: Path, stack_store: str, stack_warehouse: str | None
) -> None:
    artifacts = ROOT / "test-artifacts" / "stack"
    artifacts.mkdir(parents=True, exist_ok=True)
    log = artifacts / f"backfill-race-{stack_store}.log"
    with running_stack(log, ["--interval", "0", "--warm-up-epochs", "0"], warehouse=stack_warehouse) as stack:
        api = stack.api
        until(
            "the DAG to be parsed and unpaused",
            lambda: (api.get(f"/api/v2/dags/{DAG_ID}")[1] or {}).get("is_paused") is False,
            300,
        )

        def runs() -> list[dict[str, Any]]:
            return (api.get(f"/api/v2/dags/{DAG_ID}/dagRuns?limit=100&order_by=logical_date")[1] or {}).get("dag_runs", [])

        # The input is generated aside, then lands (a rename) in past intervals late in a minute, once
        # no run is active: a scheduled run still evaluating its barrier on a loaded machine would
        # rightly plan input that lands before the backfill exists.
        incoming = stack.landing.parent / "incoming"
        spec = SensorStreamSpec(n_files=sum(PER_INTERVAL), records_per_file=40, seed=61, late_rate=0.05)
        files = write_sensor_files(incoming, spec)

        def quiet_late_in_a_minute() -> bool:
            return 35 <= datetime.now(timezone.utc).second <= 45 and not [
                r for r in runs() if r["state"] in ("queued", "running")
            ]

        until("no active run, late in a minute", quiet_late_in_a_minute, 300, poll_s=1)
        landed_at = datetime.now(timezone.utc)
        first = (landed_at - timedelta(minutes=30)).replace(second=0, microsecond=0)
        epochs: list[list[Path]] = []
        for k, count in enumerate(PER_INTERVAL):
            chunk = [stack.landing / p.name for p in files[sum(PER_INTERVAL[:k]) : sum(PER_INTERVAL[: k + 1])]]
            for i, path in enumerate(chunk):
                at = (first + timedelta(minutes=k, seconds=10 + 15 * i)).timestamp()
                os.utime(incoming / path.name, (at, at))
                (incoming / path.name).rename(path)
            if chunk:
                epochs.append(chunk)
        last = first + timedelta(minutes=len(PER_INTERVAL) - 1)  # --to-date is inclusive: the last interval's start
        status, backfill = api.post(
            "/api/v2/backfills",
            {"dag_id": DAG_ID, "from_date": first.isoformat(), "to_date": last.isoformat(), "max_active_runs": 1},
        )
        assert status == 200, backfill
        # Held until the raced run waits: its first run may start, the rest stay queued.
        status, paused = api.put(f"/api/v2/backfills/{backfill['id']}/pause")
        assert status == 200 and paused["is_paused"], paused
        raced_at = (datetime.now(timezone.utc) + timedelta(minutes=1)).replace(second=0, microsecond=0)
        # Else a scheduled run may have started between the landing and the backfill: no race to test.
        assert raced_at == (landed_at + timedelta(minutes=1)).replace(second=0, microsecond=0), (
            f"landing at {landed_at:%H:%M:%S} and creating the backfill slipped past a minute boundary"
        )

        def raced_run_waits() -> bool:
            raced = [r for r in runs() if r["run_type"] == "scheduled" and r.get("run_after", "") >= raced_at.isoformat()[:19]]
            try:
                log = _task_log(stack.home, raced[0]["dag_run_id"], "barrier") if raced else ""
            except (OSError, ValueError):
                return False  # the task has not started, or is mid-way through a line
            return "waiting for the earlier run backfill__" in log and "(queued)" in log

        # Minutes on a loaded machine: the raced run may first queue behind the backfill's first run.
        until("the scheduled run to wait for the paused backfill's queued runs", raced_run_waits, 600)
        status, resumed = api.put(f"/api/v2/backfills/{backfill['id']}/unpause")
        assert status == 200 and not resumed["is_paused"], resumed

        def settled() -> list[dict[str, Any]] | None:
            all_runs = runs()
            backfill_runs = [r for r in all_runs if r["run_type"] == "backfill"]
            raced = [r for r in all_runs if r["run_type"] == "scheduled" and r.get("run_after", "") >= raced_at.isoformat()[:19]]
            done = ("success", "failed")
            if len(backfill_runs) == len(PER_INTERVAL) and raced and all(r["state"] in done for r in backfill_runs + raced[:1]):
                return all_runs
            return None

        all_runs = until("the backfill and the raced scheduled run to finish", settled, 480, poll_s=3)

        backfill_runs = [r for r in all_runs if r["run_type"] == "backfill"]
        assert [r["state"] for r in backfill_runs] == ["success"] * len(PER_INTERVAL), backfill_runs
        raced = next(r for r in all_runs if r["run_type"] == "scheduled" and r["run_after"] >= raced_at.isoformat()[:19])
        assert raced["state"] == "success", raced
        # The scheduled run was ready while backfill runs of earlier intervals were queued, and waited for them.
        barrier_log = _task_log(stack.home, raced["dag_run_id"], "barrier")
        assert "waiting for the earlier run backfill__" in barrier_log and "(queued)" in barrier_log, barrier_log
        assert "no new input up to" in barrier_log, barrier_log

        # One epoch per interval holding input, each planned by that interval's backfill run.
        layout = PipelineLayout.of(stack.warehouse, "sensor_stats")
        completed = sorted(
            (r for r in CheckpointLog(layout).records() if r.status is EpochStatus.COMPLETED), key=lambda r: r.epoch
        )
        expected_cutoffs = [int((first + timedelta(minutes=k + 1)).timestamp() * 1000) for k, n in enumerate(PER_INTERVAL) if n]
        assert [r.arrival_cutoff_ms for r in completed] == expected_cutoffs
        assert [[f[0] for f in r.offsets_json()["readings"]["files"]] for r in completed] == [[p.name for p in e] for e in epochs]
        owners = {r["logical_date"][:16]: r["dag_run_id"] for r in backfill_runs}
        for record in completed:
            barrier = objects.read_json(layout.barrier(record.lineage_id, record.epoch))
            interval_start = datetime.fromtimestamp(record.arrival_cutoff_ms / 1000 - 60, tz=timezone.utc)
            assert barrier["planned_by"] == f"{DAG_ID}:{owners[interval_start.isoformat()[:16]]}", barrier["planned_by"]
        waits = [line for line in barrier_log.splitlines() if "waiting for the earlier run" in line]
        print(f"\nscheduled run {raced['dag_run_id']} waited for: {waits}")
        print(f"epochs: {[(r.epoch, len(r.offsets_json()['readings']['files'])) for r in completed]} (epoch, files)")
        # The sinks are those of the interval-by-interval history (each epoch processed once).
        assert_matches_reference(stack.warehouse, run_reference(epochs, 30))
        assert_one_commit_per_table_per_epoch(stack.warehouse, len(epochs))
