"""Landing files on S3 (moto's server on loopback): listed with their arrival time, read by executors, exactly once.

The warehouse stays local in this release; the landing prefix is ``s3://``.
The CLI runs with the AWS environment pointing at the test endpoint, as a
user's driver and executors would.
"""

from __future__ import annotations

import signal
from pathlib import Path

import boto3
import pytest

from barrierflow.datagen import SensorStreamSpec, write_sensor_files
from barrierflow.registry import get_pipeline
from cli_runner import run_sensor_stats
from sensor_check import assert_matches_reference, assert_nothing_staged_visible, reference_for

pytestmark = pytest.mark.slow


def _upload(local: Path, prefix: str) -> None:
    """Every file of ``local`` under ``prefix`` (``s3://bucket/key``), in name order, as a producer would land them."""
    bucket, _, key = prefix.removeprefix("s3://").partition("/")
    client = boto3.session.Session().client("s3")
    for path in sorted(local.iterdir()):
        client.put_object(Bucket=bucket, Key=f"{key}/{path.name}", Body=path.read_bytes())


def _tables_per_epoch() -> int:
    pipe = get_pipeline("sensor_stats").build({"landing_dir": "/unused"})
    return len(pipe.sinks) + len(pipe.side_output_names()) + 1 + len(pipe.state_specs())


def test_sensor_stats_from_an_s3_landing_prefix_survives_a_kill_and_matches_the_reference(
    s3_bucket: str, tmp_path: Path
) -> None:
    local = tmp_path / "generated"
    write_sensor_files(local, SensorStreamSpec(n_files=4, records_per_file=60, seed=41, late_rate=0.05))
    landing = f"{s3_bucket}/landing"
    _upload(local, landing)
    warehouse = tmp_path / "wh"
    # Killed between two tables' commits of epoch 2, then resumed from the same S3 files.
    crashed = run_sensor_stats(warehouse, landing, fault=f"commit.after_delta_commit:{_tables_per_epoch() + 2}")  # type: ignore[arg-type]
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    resumed = run_sensor_stats(warehouse, landing)  # type: ignore[arg-type]
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_matches_reference(warehouse, reference_for(local, 2))
    assert_nothing_staged_visible(warehouse)
