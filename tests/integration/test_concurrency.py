"""Concurrent attempts of the same epochs, and the guard that prevents them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from barrierflow.checkpointing.checkpoint_log import CheckpointLog
from barrierflow.checkpointing.lease import EpochLease
from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
from barrierflow.execution.spark import REMOTE_ENV
from barrierflow.storage import objects
from barrierflow.storage.layout import PipelineLayout
from cli_runner import barrierflow_cmd, cli_env, run_sensor_stats
from sensor_check import (
    assert_matches_reference,
    assert_nothing_staged_visible,
    assert_one_commit_per_table_per_epoch,
    reference_for,
)

pytestmark = pytest.mark.slow

_UNGUARDED = textwrap.dedent(
    """
    import sys
    from barrierflow.checkpointing.coordinator import CheckpointCoordinator
    from barrierflow.plan.registry import get_pipeline
    from barrierflow.core.errors import BarrierflowError

    coordinator = CheckpointCoordinator(
        get_pipeline("sensor_stats"),
        {"landing_dir": sys.argv[1], "max_files_per_epoch": 2},
        sys.argv[2],
        use_lease=False,  # bypass the guard: both attempts race on every epoch
    )
    try:
        coordinator.run(until_caught_up=True)
    except BarrierflowError as exc:  # losing a race may fence this attempt
        print("fenced:", exc)
    """
)


def test_two_unguarded_attempts_race_and_output_is_exactly_once(tmp_path: Path, warehouse: str, spark_engine: Any) -> None:
    landing = tmp_path / "landing"
    write_sensor_files(landing, SensorStreamSpec(n_files=6, records_per_file=60, seed=31))
    # Two driver processes on one warm engine, as two Airflow workers would be: they meet in the
    # pipeline's Connect session and race only through the warehouse.
    env = {**cli_env(), REMOTE_ENV: spark_engine.address}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _UNGUARDED, str(landing), str(warehouse)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for proc in procs:
        proc.communicate(timeout=600)
    final = run_sensor_stats(warehouse, landing, remote=spark_engine.address)  # finishes what the racers left
    assert final.returncode == 0, final.stderr[-2000:]
    assert_matches_reference(warehouse, reference_for(landing, 2))
    assert_one_commit_per_table_per_epoch(warehouse, 3)
    assert_nothing_staged_visible(warehouse)


def test_epoch_lease_refuses_a_second_run(tmp_path: Path, warehouse: str, spark_engine: Any) -> None:
    landing = tmp_path / "landing"
    write_sensor_files(landing, SensorStreamSpec(n_files=2, records_per_file=40, seed=32))
    # On the warm engine: the lease is the CLI process's, whichever Spark runs its epochs.
    cmd = barrierflow_cmd(
        "run",
        "sensor_stats",
        "--warehouse",
        warehouse,
        "--param",
        f"landing_dir={landing}",
        "--param",
        "max_files_per_epoch=1",
        "--until-caught-up",
        "--remote",
        spark_engine.address,
    )
    layout = PipelineLayout.of(warehouse, "sensor_stats")
    # Another run holds the lease, heart-beating, for as long as the second one tries (taken here, so
    # the test never depends on how long a real first run takes).
    first = EpochLease(layout.lease, "sensor_stats", owner="another run")
    first.acquire()
    try:
        second = subprocess.run(cmd, env=cli_env(), capture_output=True, text=True, timeout=300)
        assert second.returncode == 1, second.stdout[-2000:]
        assert "never run concurrently" in second.stderr and "another run" in second.stderr, second.stderr[-2000:]
        assert CheckpointLog(layout).records() == []  # refused before planning anything
        assert objects.read_json(layout.lease)["owner"] == "another run"
    finally:
        first.release()
    # Once it is released, the next run takes it, runs the epochs and releases it in turn.
    third = subprocess.run(cmd, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert third.returncode == 0, third.stderr[-2000:]
    released = objects.read_json(layout.lease)
    assert released["released"] is True and released["owner"] != "another run"  # kept: the next holder swaps it
    assert_matches_reference(warehouse, reference_for(landing, 1))
