"""Run the real ``barrierflow`` CLI in a subprocess (what a crash test kills)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

__all__ = [
    "barrierflow_cmd",
    "run_cli",
    "run_pipeline",
    "run_sensor_stats",
    "cli_env",
    "kill_runs_at_random_times",
    "sensor_stats_tables_per_epoch",
    "tables_per_epoch",
]


def barrierflow_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "barrierflow", *args]


def cli_env(fault: str | None = None, master: str = "local[2]") -> dict[str, str]:
    # A classic Spark in the CLI's own process (the test process itself uses the engine).
    drop = ("BARRIERFLOW_FAULT", "BARRIERFLOW_SPARK_REMOTE", "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["BARRIERFLOW_SPARK_MASTER"] = master
    if fault:
        env["BARRIERFLOW_FAULT"] = fault
    return env


def run_pipeline(
    pipeline: str,
    warehouse: Path | str,
    landing: Path | str,
    fault: str | None = None,
    extra: Sequence[str] = (),
    master: str = "local[2]",
    remote: str | None = None,
    epochs: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """``barrierflow run <pipeline>`` until caught up (or ``epochs`` epochs): on a Spark of its own (``master``), or on the engine at ``remote``."""
    cmd = barrierflow_cmd(
        "run",
        pipeline,
        "--warehouse",
        str(warehouse),
        "--param",
        f"landing_dir={landing}",
        "--param",
        "max_files_per_epoch=2",
        *(("--epochs", str(epochs)) if epochs is not None else ("--until-caught-up",)),
        *extra,
        *(("--remote", remote) if remote else ()),
    )
    return subprocess.run(cmd, env=cli_env(fault, master), capture_output=True, text=True, timeout=600)


def run_sensor_stats(warehouse: Path | str, landing: Path | str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return run_pipeline("sensor_stats", warehouse, landing, **kw)


run_cli = run_sensor_stats


def kill_runs_at_random_times(
    warehouse: Path | str,
    landing: Path | str,
    runs: int,
    rng: random.Random,
    *,
    seconds: tuple[float, float],
    max_files_per_epoch: int,
    master: str = "local[2]",
    pipeline: str = "sensor_stats",
    remote: str | None = None,
    by_epoch: int | None = None,
) -> None:
    """Start ``run <pipeline>`` ``runs`` times, each killed after a random time (the driver and its JVM; at ``remote`` the client only).

    ``by_epoch``: killed sooner if that epoch completes first, so that a
    fast run still leaves the later epochs to what the test does next.
    """
    from barrierflow.checkpointing.checkpoint_log import CheckpointLog
    from barrierflow.storage.layout import PipelineLayout

    log = CheckpointLog(PipelineLayout.of(str(warehouse), pipeline))

    def completed() -> bool:
        return by_epoch is not None and any(r.epoch >= by_epoch and r.status.value == "COMPLETED" for r in log.records())

    for _ in range(runs):
        proc = subprocess.Popen(
            barrierflow_cmd(
                "run", pipeline, "--warehouse", str(warehouse), "--param", f"landing_dir={landing}",
                "--param", f"max_files_per_epoch={max_files_per_epoch}", "--until-caught-up",
                *(("--remote", remote) if remote else ()),
            ),
            env=cli_env(master=master), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        kill_at = time.monotonic() + rng.uniform(*seconds)
        while time.monotonic() < kill_at and not completed():
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)  # as a lost machine would
        proc.wait()


def tables_per_epoch(pipeline: str) -> int:
    """Each sink and side output, the dead letters, each state table of a product pipeline."""
    from barrierflow.plan.registry import get_pipeline

    pipe = get_pipeline(pipeline).build({"landing_dir": "/unused"})
    return len(pipe.sinks) + len(pipe.side_output_names()) + 1 + len(pipe.state_specs())


def sensor_stats_tables_per_epoch() -> int:
    return tables_per_epoch("sensor_stats")
