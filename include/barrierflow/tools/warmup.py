"""Engine warm-up: a few throwaway epochs of ``sensor_stats`` on a new engine.

A new Spark application runs its first epochs several times slower (the JIT has not compiled Spark's planner yet; each session
starts its Python workers on first use), and small epochs warm it as well as big ones: on 2 cores, 4 epochs of 480 records (~25 s)
brought the first real epochs from 10 s to 2.3-3.1 s. They run over generated local files (so on a ``local[*]`` engine; a cluster
warms on its first epochs) in a temporary warehouse, in session ``session_name`` (the pipeline whose workers to warm), in their
own process (``python -m barrierflow.tools.warmup sc://HOST:PORT``): a Spark Connect client switches its whole process to Connect
mode."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.core.settings import DEFAULT_WARM_UP_EPOCHS
from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
from barrierflow.execution.spark import get_spark
from barrierflow.plan.registry import get_pipeline

__all__ = ["warm_up", "DEFAULT_WARM_UP_EPOCHS", "main"]

_FILES_PER_EPOCH = 12
_RECORDS_PER_FILE = 40


def warm_up(address: str, epochs: int = DEFAULT_WARM_UP_EPOCHS, session_name: str = "sensor_stats") -> list[float]:
    """Run ``epochs`` throwaway epochs on the engine at ``address``; their durations in seconds."""
    work = Path(tempfile.mkdtemp(prefix="barrierflow-warm-up-"))
    try:
        landing = work / "landing"
        write_sensor_files(landing, SensorStreamSpec(n_files=epochs * _FILES_PER_EPOCH, records_per_file=_RECORDS_PER_FILE))
        params = {"landing_dir": str(landing), "max_files_per_epoch": _FILES_PER_EPOCH}
        coordinator = CheckpointCoordinator(
            get_pipeline("sensor_stats"),
            params,
            str(work / "warehouse"),
            spark_factory=lambda: get_spark(remote=address, session_name=session_name),
        )
        results = coordinator.run(epochs=epochs, max_concurrent_checkpoints=1)
        return [(r.record.duration_ms or 0) / 1000 for r in results]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m barrierflow.tools.warmup", description=__doc__.splitlines()[0])
    parser.add_argument("address", help="the engine, sc://HOST:PORT")
    parser.add_argument("--epochs", type=int, default=DEFAULT_WARM_UP_EPOCHS)
    parser.add_argument("--session", default="sensor_stats", help="session (pipeline name) whose workers to warm")
    args = parser.parse_args(argv)
    durations = warm_up(args.address, args.epochs, args.session)
    print(
        f"barrierflow engine: warmed up with {len(durations)} epoch(s) of {_FILES_PER_EPOCH * _RECORDS_PER_FILE} "
        f"records: {', '.join(f'{d:.1f}' for d in durations)} s",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    # delta-rs' runtime threads can abort the interpreter at exit; leave at once.
    os._exit(main())
