"""Landing files on S3 (moto's server on loopback), read through a fault-injecting proxy, under kill -9: exactly once.

The warehouse stays local in this release; the landing prefix is ``s3://``,
reached through ``tests/s3_fault_proxy.py`` (5xx before and after a request
took effect, dropped answers, resets, delays). The CLI runs with the AWS
environment pointing at the proxy, as a user's driver and executors would
point at their endpoint. A run that a fault or a kill ends is simply run
again, as a scheduler would.
"""

from __future__ import annotations

import random
import signal
from pathlib import Path
from typing import Any

import boto3
import pytest

from barrierflow.datagen import SensorStreamSpec, write_sensor_files
from cli_runner import kill_runs_at_random_times, run_sensor_stats, sensor_stats_tables_per_epoch
from s3_fault_proxy import FaultProxy
from s3_server import aws_env
from sensor_check import assert_matches_reference, assert_nothing_staged_visible, reference_for

pytestmark = pytest.mark.slow


def test_sensor_stats_from_s3_under_faults_and_kill_minus_nine_matches_the_reference(
    s3_server: Any, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = tmp_path / "generated"
    write_sensor_files(local, SensorStreamSpec(n_files=8, records_per_file=60, seed=41, late_rate=0.05))
    bucket = s3_bucket.removeprefix("s3://")
    client = boto3.session.Session().client("s3")
    for path in sorted(local.iterdir()):  # landed in name order, as a producer would
        client.put_object(Bucket=bucket, Key=f"landing/{path.name}", Body=path.read_bytes())
    proxy = FaultProxy(s3_server.endpoint, rate=0.25, seed=7)
    monkeypatch.setenv("AWS_ENDPOINT_URL", aws_env(proxy.endpoint)["AWS_ENDPOINT_URL"])
    landing, warehouse = f"{s3_bucket}/landing", tmp_path / "wh"
    try:
        # 1. Killed between two tables' commits of epoch 2.
        crashed = run_sensor_stats(warehouse, landing, fault=f"commit.after_delta_commit:{sensor_stats_tables_per_epoch() + 2}")  # type: ignore[arg-type]
        assert crashed.returncode in (-signal.SIGKILL, 1), crashed.stderr[-2000:]  # 1: a fault ended it first
        # 2. Killed (the driver and its JVM) at random times.
        kill_runs_at_random_times(warehouse, landing, 2, random.Random(2026), seconds=(8.0, 16.0), max_files_per_epoch=2)
        # 3. Run again until a run ends well (each retry is what a scheduler would do).
        failures = []
        for _ in range(6):
            final = run_sensor_stats(warehouse, landing)  # type: ignore[arg-type]
            if final.returncode == 0:
                break
            failures.append(final.stderr.strip().splitlines()[-1:])
        assert final.returncode == 0, (failures, final.stderr[-2000:])
    finally:
        proxy.stop()
    assert_matches_reference(warehouse, reference_for(local, 2))
    assert_nothing_staged_visible(warehouse)
    assert sum(proxy.faults.values()) > 0
    print(f"faults injected {dict(proxy.faults)}, requests forwarded {proxy.forwarded}, failed runs {len(failures)}")
