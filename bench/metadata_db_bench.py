"""The Airflow CLI hammering ``make run``'s metadata database while epochs run: PostgreSQL vs SQLite.

For each metadata database (``--metadata-db postgres``, the default of
``make run``, and ``sqlite``), one after the other, this starts the stack
exactly as ``make run`` does, waits for its first completed epoch, then runs
the Airflow CLI against it (``barrierflow airflow``) from ``--threads``
threads for ``--minutes``: writes (``variables set``, ``pools set``) and
reads (``dags list-runs``) and ``backfill create`` of one past interval, while the scheduler, API
server, triggerer, DAG processor and the epoch DAG's tasks use the same
database. It prints, per database, the commands run, those that failed, and
those that failed with ``database is locked``, and the epochs completed
meanwhile. The last line is ``key=value`` per figure.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from airflow_bench import DAG_ID, start_stack, stop_stack  # noqa: E402

COMMANDS = (
    ("variables", "set", "bench_key", "{n}"),
    ("dags", "list-runs", DAG_ID),
    ("pools", "set", "bench_pool", "{n}", "bench"),
    # One past interval each time (no input then: the run is a no-op); what the issue saw fail on SQLite.
    ("backfill", "create", "--dag-id", DAG_ID, "--from-date", "{past}", "--to-date", "{past}"),
)


def _completed_epochs(warehouse: Path) -> int:
    from barrierflow.checkpointing.checkpoint import EpochStatus
    from barrierflow.checkpointing.checkpoint_log import CheckpointLog
    from barrierflow.storage.layout import PipelineLayout

    layout = PipelineLayout.of(str(warehouse), "sensor_stats")
    return sum(1 for r in CheckpointLog(layout).records() if r.status is EpochStatus.COMPLETED)


def measure(db: str, minutes: float, threads: int, keep: Path | None) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"bench-metadata-{db}-"))
    log_path = (keep or work) / f"stack-{db}.log"
    print(f"[{db}] starting the make-run stack in {work} (log {log_path})", flush=True)
    proc, info = start_stack(work, "connect", log_path, ("--metadata-db", db))
    results: list[tuple[str, int, str]] = []
    lock = threading.Lock()
    try:
        deadline = time.time() + 600
        while _completed_epochs_safe(work) == 0 and time.time() < deadline and proc.poll() is None:
            time.sleep(2)
        epochs_before = _completed_epochs_safe(work)
        stop_at = time.time() + minutes * 60

        def hammer(worker: int) -> None:
            n = 0
            while time.time() < stop_at:
                args = COMMANDS[(worker + n) % len(COMMANDS)]
                past = (datetime.now(timezone.utc) - timedelta(days=2, minutes=1000 * worker + n)).replace(second=0, microsecond=0)
                cmd = [sys.executable, "-m", "barrierflow", "airflow", "--home", str(work / "airflow"),
                       *[a.format(n=n, past=past.isoformat()) for a in args]]
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                with lock:
                    results.append((" ".join(args[:2]), done.returncode, done.stdout + done.stderr))
                n += 1

        pool = [threading.Thread(target=hammer, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        epochs = _completed_epochs_safe(work) - epochs_before
    finally:
        stop_stack(proc)
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    failed = [r for r in results if r[1] != 0]
    locked = [r for r in failed if "database is locked" in r[2]]
    for name, code, out in failed[:3]:
        print(f"[{db}] {name} exited {code}: {out.strip().splitlines()[-1] if out.strip() else ''}", flush=True)
    return {"db": db, "commands": len(results), "failed": len(failed), "locked": len(locked), "epochs": epochs}


def _completed_epochs_safe(work: Path) -> int:
    try:
        return _completed_epochs(work / "warehouse")
    except Exception:  # noqa: BLE001 - the log does not exist before the first epoch
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dbs", default="postgres,sqlite")
    parser.add_argument("--keep", type=Path)
    args = parser.parse_args(argv)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    rows = [measure(db.strip(), args.minutes, args.threads, args.keep) for db in args.dbs.split(",") if db.strip()]
    print(f"{'metadata db':12} {'CLI commands':>13} {'failed':>7} {'database is locked':>19} {'epochs meanwhile':>17}")
    for r in rows:
        print(f"{r['db']:12} {r['commands']:>13} {r['failed']:>7} {r['locked']:>19} {r['epochs']:>17}")
    print(" ".join(f"{r['db']}_{k}={r[k]}" for r in rows for k in ("commands", "failed", "locked", "epochs")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
