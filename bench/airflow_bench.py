"""``make bench-airflow``: the real ``make run`` stack, measured as a user lives with it.

For each ``process`` mode (``connect``: the warm engine, the default;
``spark-submit``: a new Spark application per epoch), one after the other
(never both at once on a 2-core machine), this starts ``python -m
barrierflow.tools.devserver`` exactly as ``make run`` does (its own temporary
Airflow home, warehouse and landing directory, free ports), lets the
generator and the schedule run for ``--minutes`` (6 by default), then reads:

- from Airflow's REST API: every run of ``barrierflow_sensor_stats`` (state,
  start, end) and every task instance (duration; medians per task are printed);
- from the warehouse: the checkpoint log (each COMPLETED epoch, when, and the
  files its barrier took);
- from the landing directory: each file's arrival time (modification time).

and prints, per mode: completed epochs, median DAG-run duration, median
``process`` duration, seconds from the URL being printed to the first
completed epoch, end-to-end latency per input file (arrival to its epoch's
COMPLETED record; median and p90), and the backlog (files landed but in no
completed epoch) when the first and when the last epoch completed (the same
phase of the one-minute schedule, so the two compare), its largest value at
any epoch's completion, and at the end (which also counts the files of the
interval still open, 0 to 12 depending on when in the minute the run ends).
The last line is machine-readable, one ``key=value`` per figure and mode.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DAG_ID = "barrierflow_sensor_stats"
MODES = ("connect", "spark-submit")


@dataclass(frozen=True)
class Figures:
    mode: str
    epochs: int
    runs: int
    median_run_s: float | None
    median_process_s: float | None
    url_to_first_epoch_s: float | None
    latency_median_s: float | None
    latency_p90_s: float | None
    backlog_first: int | None
    backlog_last: int | None  # at the last completed epoch: the same phase of the schedule as backlog_first
    backlog_max: int | None  # the largest backlog at any epoch's completion
    backlog_end: int
    task_medians: dict[str, float]  # median duration of each task that ran (success), by task id


def _ts(text: str | None) -> float | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _p90(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, -(-9 * len(ordered) // 10) - 1))]  # nearest rank


def start_stack(
    work: Path, mode: str, log_path: Path, extra_args: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """``make run``'s stack in ``work`` on free ports; (its process, {"port", "url_at"})."""
    from barrierflow.tools.devserver import free_port

    port, engine_port = free_port(), free_port()
    env = {**os.environ, "BARRIERFLOW_PROCESS_MODE": mode, "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable, "-m", "barrierflow.tools.devserver", "--port", str(port), "--engine-port", str(engine_port),
        "--home", str(work / "airflow"), "--warehouse", str(work / "warehouse"), "--landing", str(work / "landing"),
        *extra_args,
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    info: dict[str, Any] = {"port": port, "url_at": None}
    log = log_path.open("w")

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            if info["url_at"] is None and "Airflow UI:" in line:
                info["url_at"] = time.time()

    threading.Thread(target=pump, daemon=True).start()
    return proc, info


def stop_stack(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _api_figures(port: int) -> tuple[list[float], list[float], int]:
    from barrierflow.tools.devserver import ApiClient

    client = ApiClient(f"http://127.0.0.1:{port}", "admin", "admin", timeout_s=30)
    _, runs = client.get(f"/api/v2/dags/{DAG_ID}/dagRuns?limit=1000")
    run_s = []
    for run in runs.get("dag_runs", []):
        start, end = _ts(run.get("start_date")), _ts(run.get("end_date"))
        if run.get("state") == "success" and start and end:
            run_s.append(end - start)
    _, tis = client.get(f"/api/v2/dags/{DAG_ID}/dagRuns/~/taskInstances?limit=1000")
    durations: dict[str, list[float]] = {}
    for ti in tis.get("task_instances", []):
        if ti.get("state") == "success" and ti.get("duration") is not None:
            durations.setdefault(ti["task_id"], []).append(float(ti["duration"]))
    return run_s, durations, len(runs.get("dag_runs", []))


def _epochs(warehouse: Path) -> list[tuple[float, list[str]]]:
    """(completed at, files) of every COMPLETED epoch of the current lineage, in order."""
    from barrierflow.checkpointing.checkpoint import EpochStatus
    from barrierflow.checkpointing.checkpoint_log import CheckpointLog
    from barrierflow.storage.layout import PipelineLayout

    layout = PipelineLayout.of(str(warehouse), "sensor_stats")
    records = [r for r in CheckpointLog(layout).records() if r.status is EpochStatus.COMPLETED]
    out = []
    for record in sorted(records, key=lambda r: r.recorded_at_us):
        files = [f[0] for f in (record.offsets_json().get("readings") or {}).get("files") or []]
        out.append((record.recorded_at_us / 1e6, files))
    return out


def _backlog(arrivals: dict[str, float], epochs: list[tuple[float, list[str]]], at: float) -> int:
    consumed = {name for done, files in epochs if done <= at for name in files}
    return sum(1 for name, arrived in arrivals.items() if arrived <= at and name not in consumed)


def measure(mode: str, minutes: float, keep: Path | None) -> Figures:
    work = Path(tempfile.mkdtemp(prefix=f"bench-airflow-{mode}-"))
    log_path = (keep or work) / f"stack-{mode}.log"
    print(f"[{mode}] starting the make-run stack in {work} (log {log_path}) for {minutes:g} min", flush=True)
    proc, info = start_stack(work, mode, log_path)
    try:
        deadline = time.time() + 600
        while info["url_at"] is None and time.time() < deadline and proc.poll() is None:
            time.sleep(0.5)
        if info["url_at"] is None:
            raise SystemExit(f"[{mode}] the stack printed no URL (see {log_path})")
        time.sleep(minutes * 60)
        end = time.time()
        run_s, durations, runs = _api_figures(info["port"])
    finally:
        stop_stack(proc)
    landing = work / "landing"
    arrivals = {p.name: p.stat().st_mtime for p in landing.glob("*.jsonl")}
    epochs = [(done, files) for done, files in _epochs(work / "warehouse") if done <= end]
    latencies = [done - arrivals[name] for done, files in epochs for name in files if name in arrivals]
    first = epochs[0][0] if epochs else None
    figures = Figures(
        mode=mode,
        epochs=len(epochs),
        runs=runs,
        median_run_s=_median(run_s),
        median_process_s=_median(durations.get("process", [])),
        url_to_first_epoch_s=first - info["url_at"] if first is not None else None,
        latency_median_s=_median(latencies),
        latency_p90_s=_p90(latencies),
        backlog_first=_backlog(arrivals, epochs, first) if first is not None else None,
        backlog_last=_backlog(arrivals, epochs, epochs[-1][0]) if epochs else None,
        backlog_max=max(_backlog(arrivals, epochs, done) for done, _ in epochs) if epochs else None,
        backlog_end=_backlog(arrivals, epochs, end),
        task_medians={task: statistics.median(values) for task, values in sorted(durations.items())},
    )
    if keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return figures


def _fmt(value: float | int | None, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:.1f}{unit}" if isinstance(value, float) else f"{value}{unit}"


def report(results: list[Figures]) -> None:
    rows = [
        ("completed epochs", lambda f: _fmt(f.epochs)),
        ("DAG runs", lambda f: _fmt(f.runs)),
        ("median DAG-run duration (target <= 8 s)", lambda f: _fmt(f.median_run_s, " s")),
        ("median process task (target <= 4 s)", lambda f: _fmt(f.median_process_s, " s")),
        ("URL -> first completed epoch (target <= 60 s)", lambda f: _fmt(f.url_to_first_epoch_s, " s")),
        ("end-to-end latency median", lambda f: _fmt(f.latency_median_s, " s")),
        ("end-to-end latency p90 (target <= 120 s)", lambda f: _fmt(f.latency_p90_s, " s")),
        ("backlog at first epoch (files)", lambda f: _fmt(f.backlog_first)),
        ("backlog at last epoch (files; target <= first)", lambda f: _fmt(f.backlog_last)),
        ("largest backlog at an epoch (files)", lambda f: _fmt(f.backlog_max)),
        ("backlog at end (files, with the open interval's)", lambda f: _fmt(f.backlog_end)),
    ]
    for task in sorted({t for f in results for t in f.task_medians}):
        rows.append((f"median {task} task (successful runs)", lambda f, t=task: _fmt(f.task_medians.get(t), " s")))
    width = max(len(r[0]) for r in rows)
    print(f"{'':{width}}  " + "  ".join(f"{f.mode:>14}" for f in results))
    for label, cell in rows:
        print(f"{label:{width}}  " + "  ".join(f"{cell(f):>14}" for f in results))
    parts = []
    for f in results:
        key = re.sub(r"[^a-z]", "_", f.mode)
        parts += [
            f"{key}_epochs={f.epochs}",
            f"{key}_median_run_s={_fmt(f.median_run_s)}",
            f"{key}_median_process_s={_fmt(f.median_process_s)}",
            f"{key}_first_epoch_s={_fmt(f.url_to_first_epoch_s)}",
            f"{key}_latency_p90_s={_fmt(f.latency_p90_s)}",
            f"{key}_backlog_first={_fmt(f.backlog_first)}",
            f"{key}_backlog_last={_fmt(f.backlog_last)}",
            f"{key}_backlog_end={f.backlog_end}",
        ]
    print(" ".join(parts), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=6.0, help="how long each stack runs (default 6)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--keep", type=Path, help="keep the stacks' logs here (and their directories)")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"unknown mode(s) {unknown}: allowed are {', '.join(MODES)}")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    results = [measure(mode, args.minutes, args.keep) for mode in modes]
    report(results)
    json.dump([f.__dict__ for f in results], sys.stderr)
    print(file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
