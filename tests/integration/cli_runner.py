"""Run the real ``barrierflow`` CLI in a subprocess (what a crash test kills)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

__all__ = ["barrierflow_cmd", "run_cli", "cli_env"]


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


def run_sensor_stats(
    warehouse: Path, landing: Path, fault: str | None = None, extra: Sequence[str] = (), master: str = "local[2]"
) -> subprocess.CompletedProcess[str]:
    cmd = barrierflow_cmd(
        "run", "sensor_stats", "--warehouse", str(warehouse),
        "--param", f"landing_dir={landing}", "--param", "max_files_per_epoch=2", "--until-caught-up", *extra,
    )
    return subprocess.run(cmd, env=cli_env(fault, master), capture_output=True, text=True, timeout=600)


run_cli = run_sensor_stats
