"""barrierflow side of the benchmark, driven only through the CLI.

``run_engine`` runs ``python -m barrierflow run bench_running_agg ... --until-caught-up``
over a landing directory (one file per epoch), then reads the checkpoint log
with ``python -m barrierflow checkpoints bench_running_agg --json`` and
derives the figures from the COMPLETED epochs. ``pipeline=`` and
``files_per_epoch=`` run another file-fed pipeline the same way (``sensor_stats``
in ``sensor_stats_bench.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

__all__ = ["PIPELINE", "EngineRunError", "run_engine", "data_epochs", "processing_seconds"]

PIPELINE = "bench_running_agg"
# The benchmark's pipeline is not the product's: registered for the CLI runs (bench/ on PYTHONPATH).
_BENCH_DIR = str(Path(__file__).resolve().parent)
_ENV = {
    "BARRIERFLOW_PIPELINES": "bench_running_agg:bench_running_agg",
    "PYTHONPATH": os.pathsep.join(filter(None, [_BENCH_DIR, os.environ.get("PYTHONPATH")])),
}
WARMUP_EPOCHS = 2
STDERR_TAIL_LINES = 40


class EngineRunError(RuntimeError):
    """A barrierflow CLI subprocess failed; the message ends with its stderr tail."""


def _run_cli(args: list[str], env: Mapping[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``python -m barrierflow ARGS`` (``env`` added to the environment); return the completed process and its wall seconds."""
    command = [sys.executable, "-m", "barrierflow", *args]
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **_ENV, **(env or {})})
    wall_s = time.perf_counter() - started
    if completed.returncode != 0:
        tail = "\n".join(completed.stderr.splitlines()[-STDERR_TAIL_LINES:])
        raise EngineRunError(f"`{' '.join(command)}` exited {completed.returncode}; stderr tail:\n{tail}")
    return completed, wall_s


def _checkpoints(warehouse: str, pipeline: str = PIPELINE, env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The pipeline's checkpoint records, as printed by the ``checkpoints --json`` command."""
    completed, _ = _run_cli(["checkpoints", pipeline, "--warehouse", warehouse, "--json"], env)
    try:
        records = json.loads(completed.stdout)
    except json.JSONDecodeError as error:
        raise EngineRunError(
            f"`checkpoints --json` printed no JSON array ({error}):\n{completed.stdout[:2000]}"
        ) from error
    return sorted(records, key=lambda record: record["epoch"])


def data_epochs(epochs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The epochs that consumed input, in epoch order."""
    return [epoch for epoch in epochs if epoch["rows_in"] > 0]


def _interval(epoch: dict[str, Any]) -> tuple[float, float]:
    """(start, end) of an epoch in seconds: it completed at ``recorded_at`` after ``duration_ms``."""
    end = datetime.fromisoformat(epoch["recorded_at"].replace("Z", "+00:00")).timestamp()
    return end - epoch["duration_ms"] / 1000, end


def processing_seconds(epochs: list[dict[str, Any]]) -> float:
    """Time during which at least one epoch was in progress (the union of their intervals).

    Epochs overlap with two concurrent checkpoints, so summing their
    durations would count the overlap twice; for epochs one after the other
    it is the sum of their durations.
    """
    total, reach = 0.0, float("-inf")
    for start, end in sorted(_interval(epoch) for epoch in epochs):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _figures(epochs: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """Throughput, latency and write-volume figures of the completed epochs."""
    durations = [epoch["duration_ms"] / 1000 for epoch in epochs]
    ends = [_interval(epoch)[1] for epoch in epochs]
    # Completion to completion: an epoch's share of the time once they overlap.
    periods = [later - earlier for earlier, later in zip(ends, ends[1:])][WARMUP_EPOCHS - 1 :]
    events = sum(epoch["rows_in"] for epoch in epochs)
    processing_s = processing_seconds(epochs)
    steady = durations[WARMUP_EPOCHS:] or durations
    return {
        "events": events,
        "epochs": len(epochs),
        "wall_s": wall_s,
        "processing_s": processing_s,
        "startup_s": wall_s - processing_s,
        "events_per_s": events / processing_s if processing_s else 0.0,
        "wall_events_per_s": events / wall_s,
        "steady_epoch_s": statistics.median(periods) if periods else (statistics.median(steady) if steady else 0.0),
        "steady_latency_s": statistics.median(steady) if steady else 0.0,
        "mean_bytes_written": statistics.fmean(e["bytes_written"] for e in epochs) if epochs else 0.0,
    }


def run_engine(
    input_dir: str | Path,
    work_dir: str | Path,
    run_args: tuple[str, ...] = (),
    *,
    pipeline: str = PIPELINE,
    files_per_epoch: int = 1,
    warehouse: str | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run a pipeline (``bench_running_agg`` unless told) over ``input_dir`` into a fresh ``<work_dir>/warehouse``.

    ``events_per_s`` is total ``rows_in`` over the time during which an epoch
    was in progress (:func:`processing_seconds`); ``wall_events_per_s`` uses
    the subprocess wall time, which also covers interpreter/JVM start-up
    (``startup_s`` = wall minus that processing time). ``steady_epoch_s`` is
    the median time between completions after the warm-up epochs,
    ``steady_latency_s`` the median epoch duration. The dict also holds ``warehouse``, the COMPLETED
    epoch records (``completed``) and ``other_records`` (count of non-COMPLETED ones).
    ``run_args`` go to ``barrierflow run`` (e.g. ``--max-concurrent-checkpoints 1``).
    ``pipeline`` must take the ``landing_dir`` and ``max_files_per_epoch``
    parameters (``files_per_epoch``, one by default).
    ``input_dir`` and ``warehouse`` may be ``s3://`` URIs (``env``: the AWS
    environment reaching them; ``warehouse`` defaults to ``<work_dir>/warehouse``).
    Raises :class:`EngineRunError` if either CLI call fails.
    """
    if warehouse is None:
        local = Path(work_dir).resolve() / "warehouse"
        shutil.rmtree(local, ignore_errors=True)
        warehouse = str(local)
    landing = input_dir if str(input_dir).startswith("s3://") else Path(input_dir).resolve()
    _, wall_s = _run_cli([
        "run", pipeline, "--warehouse", warehouse,
        "--param", f"landing_dir={landing}",
        "--param", f"max_files_per_epoch={files_per_epoch}",
        "--until-caught-up", *run_args,
    ], env)  # fmt: skip
    records = _checkpoints(warehouse, pipeline, env)
    completed = [record for record in records if record["status"] == "COMPLETED"]
    return {
        **_figures(completed, wall_s),
        "warehouse": str(warehouse),
        "completed": completed,
        "other_records": len(records) - len(completed),
    }
