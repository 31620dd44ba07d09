"""A warehouse and landing prefix on S3 (moto's server on loopback), behind a fault-injecting proxy, under kill -9.

Everything durable lives on ``s3://``: the landing files, every table, the
checkpoint log, the lineages, barriers, manifests and the epoch lease. The
CLI runs with executors in their own JVMs (``local-cluster``), all of them
reaching S3 only through ``tests/s3_fault_proxy.py`` (5xx before and after a
request took effect, dropped answers, resets, delays), as a deployment's
driver and executors reach their endpoint. A run that a fault or a kill ends
is simply run again, as a scheduler would. Afterwards maintenance leaves
only the files the tables still read.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import Any

import boto3
import pytest

from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
from barrierflow.operations.maintenance import run_maintenance
from barrierflow.plan.registry import get_pipeline
from cli_runner import kill_runs_at_random_times, run_sensor_stats
from maintenance_check import unreferenced_files
from s3_fault_proxy import FaultProxy
from s3_server import aws_env
from sensor_check import assert_matches_reference, assert_nothing_staged_visible, reference_for, table_snapshot

pytestmark = pytest.mark.slow

EXECUTORS_IN_OWN_JVMS = "local-cluster[2,1,1024]"


def test_sensor_stats_on_s3_under_faults_and_kill_minus_nine_matches_the_reference(
    s3_server: Any, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = tmp_path / "generated"
    write_sensor_files(local, SensorStreamSpec(n_files=4, records_per_file=60, seed=41, late_rate=0.05))
    bucket = s3_bucket.removeprefix("s3://")
    client = boto3.session.Session().client("s3")
    for path in sorted(local.iterdir()):  # landed in name order, as a producer would
        client.put_object(Bucket=bucket, Key=f"landing/{path.name}", Body=path.read_bytes())
    proxy = FaultProxy(s3_server.endpoint, rate=0.1, seed=7)
    monkeypatch.setenv("AWS_ENDPOINT_URL", aws_env(proxy.endpoint)["AWS_ENDPOINT_URL"])
    landing, warehouse = f"{s3_bucket}/landing", f"{s3_bucket}/warehouse"
    run = dict(master=EXECUTORS_IN_OWN_JVMS)
    started = time.monotonic()
    try:
        # 1. Killed between two tables' first commits (epoch 1: some tables exist, others not), leaving
        #    epoch 2 for the run killed at random.
        crashed = run_sensor_stats(warehouse, landing, fault="commit.after_delta_commit:2", **run)
        assert crashed.returncode in (-signal.SIGKILL, 1), crashed.stderr[-2000:]  # 1: a fault ended it first
        print(f"\n{time.monotonic() - started:.0f} s: killed between commits (rc {crashed.returncode})\n{crashed.stdout[-600:]}")
        # 2. Killed (the driver, its JVM and the executors' JVMs) at a random time.
        kill_runs_at_random_times(warehouse, landing, 1, random.Random(2026), seconds=(20.0, 40.0), max_files_per_epoch=2, **run)
        print(f"{time.monotonic() - started:.0f} s: a run killed at a random time")
        # 3. Run again until a run ends well (each retry is what a scheduler would do).
        failures = []
        for _ in range(6):
            final = run_sensor_stats(warehouse, landing, **run)
            print(f"{time.monotonic() - started:.0f} s: a run ended with {final.returncode}\n{final.stdout[-600:]}")
            if final.returncode == 0:
                break
            failures.append(final.stderr.strip().splitlines()[-1:])
        assert final.returncode == 0, (failures, final.stderr[-2000:])
    finally:
        proxy.stop()
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    # No duplicate, no loss, no state difference: every output and state equals the reference.
    assert_matches_reference(warehouse, reference_for(local, 2))
    assert_nothing_staged_visible(warehouse)
    assert sum(proxy.faults.values()) > 0 and proxy.retries > 0
    # Maintenance leaves exactly the files the current and the retained versions read.
    params = {"landing_dir": landing, "max_files_per_epoch": 2}
    report = run_maintenance(
        get_pipeline("sensor_stats"), warehouse, retained_checkpoints=1, vacuum_retention_hours=0, params=params
    )
    coordinator = CheckpointCoordinator(get_pipeline("sensor_stats"), params, warehouse, spark_factory=lambda: None)
    left = unreferenced_files(coordinator, report.retained_epochs)
    assert left == {}, {name: sorted(paths)[:3] for name, paths in left.items()}
    rows = sum(len(rows) for rows in table_snapshot(warehouse).values())
    print(
        f"faults injected {dict(proxy.faults)}, requests retried {proxy.retries}, requests forwarded {proxy.forwarded}, "
        f"failed runs {len(failures)}; duplicates 0, losses 0, state differences 0 ({rows} output rows and the state "
        f"equal the reference); maintenance deleted {sum(report.vacuumed_files.values())} files, unreferenced files left 0"
    )
