"""The warm engine dies mid-epoch: the next run, on a new engine, ends exactly once.

``barrierflow run --remote`` drives epochs on its own Spark Connect engine
(not the test process's shared one); the engine's whole process group is
SIGKILLed once epoch 2's barrier is recorded and before its vote, the run
fails naming the engine's address, and a run against a fresh engine on the
same address (warmed up first, as ``make run``'s is, its throwaway files
removed; checked once, with the local warehouse) recovers (replaying the
recorded barrier) to the reference's output with one Delta commit per table
per epoch.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from pathlib import Path

import pytest

from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
from barrierflow.execution.engine import EngineConfig, LocalEngine
from barrierflow.storage import objects
from barrierflow.storage.layout import PipelineLayout
from barrierflow.tools.devserver import free_port
from cli_runner import barrierflow_cmd, cli_env
from sensor_check import (
    assert_matches_reference,
    assert_nothing_staged_visible,
    assert_one_commit_per_table_per_epoch,
    reference_for,
)

pytestmark = pytest.mark.slow


def _run_cmd(warehouse: str, landing: Path, address: str) -> list[str]:
    return barrierflow_cmd(
        "run",
        "sensor_stats",
        "--warehouse",
        str(warehouse),
        "--param",
        f"landing_dir={landing}",
        "--param",
        "max_files_per_epoch=1",
        "--until-caught-up",
        "--remote",
        address,
    )


def _epoch_files(warehouse: str, name: str) -> list[str]:
    """The checkpoint documents ``name`` of every epoch (``<lineage>/<epoch>/<name>``), on either store."""
    epochs = objects.join_uri(PipelineLayout.of(warehouse, "sensor_stats").checkpoint_log, "_epochs")
    return sorted(f.path for f in objects.walk(epochs) if f.path.count("/") == 2 and f.path.endswith(f"/{name}"))


def test_engine_killed_mid_epoch_then_the_next_run_recovers_exactly_once(tmp_path: Path, warehouse: str) -> None:
    landing = tmp_path / "landing"
    write_sensor_files(landing, SensorStreamSpec(n_files=4, records_per_file=40, seed=71, late_rate=0.05))
    config = EngineConfig(port=free_port(), master="local[2]", driver_memory="1g")
    env = {k: v for k, v in cli_env().items() if k != "BARRIERFLOW_SPARK_MASTER"}

    with (tmp_path / "engine-1.log").open("wb") as log:
        engine = LocalEngine(config, log=log).start(wait_s=300)
        run = subprocess.Popen(
            _run_cmd(warehouse, landing, config.address), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            deadline = time.monotonic() + 300
            while len(_epoch_files(warehouse, "barrier.json")) < 2 and run.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05 if objects.is_local(warehouse) else 0.2)
            votes = len(_epoch_files(warehouse, "manifest.json"))
            engine.kill()  # the JVM and its Python workers, mid-epoch
            out, _ = run.communicate(timeout=300)
        finally:
            engine.kill()
            if run.poll() is None:
                run.kill()
    assert len(_epoch_files(warehouse, "barrier.json")) >= 2 and votes < 4, out[-3000:]
    assert run.returncode != 0, out[-3000:]
    assert config.address in out, out[-3000:]  # the failure names the engine

    # The new engine warms up (as make run's does) before the run recovers on it. The warm-up runs on
    # a throwaway local warehouse whatever the pipeline's store: one variant checks it.
    warm_up = objects.is_local(warehouse)
    warmed = dataclasses.replace(config, warm_up_epochs=int(warm_up), warm_up_session="sensor_stats")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    with (
        (tmp_path / "engine-2.log").open("wb") as log,
        LocalEngine(warmed, log=log, env={**os.environ, "TMPDIR": str(scratch)}) as engine,
    ):
        if warm_up:
            warm, said = engine.wait_warm(300)
            assert warm and "warmed up with 1 epoch(s)" in said, said
            assert list(scratch.iterdir()) == []  # its throwaway warehouse and input are gone
        again = subprocess.run(_run_cmd(warehouse, landing, config.address), env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert_matches_reference(warehouse, reference_for(landing, 1))
    assert_one_commit_per_table_per_epoch(warehouse, 4)
    assert_nothing_staged_visible(warehouse)
