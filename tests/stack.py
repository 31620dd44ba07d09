"""The ``make run`` stack (``python -m barrierflow.tools.devserver``) as a test fixture helper.

:func:`running_stack` starts exactly what ``make run`` starts (PostgreSQL,
the Spark engine, Airflow's API server, scheduler with its LocalExecutor,
triggerer and DAG processor) on free ports of 127.0.0.1 with a temporary
AIRFLOW_HOME, warehouse (or a given one, e.g. on S3) and landing directory, and stops it (Ctrl-C, i.e.
SIGINT, then SIGKILL of whatever is left of its process tree) at the end.
The browser tests and the real-scheduler tests use it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from barrierflow.tools.devserver import DEFAULT_PASSWORD, DEFAULT_USER, ApiClient, free_port

__all__ = ["DevServer", "running_stack", "until", "ROOT"]

ROOT = Path(__file__).resolve().parents[1]
SERVER_START_TIMEOUT_S = 420.0
SERVER_STOP_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class DevServer:
    url: str
    user: str
    password: str
    warehouse: str  # a local path or an s3:// URI
    landing: Path
    home: Path
    log: Path
    api: ApiClient


def _descendants(pid: int) -> list[Any]:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C for the dev server (it stops Airflow itself), then kill whatever is left of its tree."""
    import psutil

    tree = _descendants(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=SERVER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass

    def alive(p: Any) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    leftovers = [p for p in tree if alive(p)]
    if proc.poll() is None:
        leftovers.append(psutil.Process(proc.pid))
    for p in leftovers:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(leftovers, timeout=10)
    if proc.poll() is None:
        proc.wait(timeout=10)
    assert not leftovers, f"the dev server left processes behind: {[p.pid for p in leftovers]}"


@contextmanager
def running_stack(
    log: Path,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    warehouse: str | None = None,
) -> Iterator[DevServer]:
    """The stack with the devserver's extra ``args``, up (its API answering) for the ``with`` body.

    ``warehouse``: where the stack keeps it (a local temporary directory by
    default); an ``s3://`` one is reached through the AWS environment, which
    the stack inherits.
    """
    import pytest

    base = Path(tempfile.mkdtemp(prefix="barrierflow-stack-"))
    port = free_port()
    home, landing = base / "airflow", base / "landing"
    warehouse = warehouse or str(base / "warehouse")
    landing.mkdir(parents=True)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    environ.update(env or {})
    command = [
        sys.executable,
        "-m",
        "barrierflow.tools.devserver",
        "--port",
        str(port),
        "--home",
        str(home),
        "--warehouse",
        warehouse,
        "--landing",
        str(landing),
        "--engine-port",
        "0",
        "--ready-timeout",
        str(SERVER_START_TIMEOUT_S),
        *args,
    ]
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=environ, cwd=str(ROOT), start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    # Generous: under CI load the API server can take tens of seconds to answer its first requests.
    api = ApiClient(url, DEFAULT_USER, DEFAULT_PASSWORD, timeout_s=60)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while not api.healthy():
            if proc.poll() is not None:
                pytest.fail(f"the dev server exited with {proc.returncode}; see {log}")
            if time.monotonic() > deadline:
                pytest.fail(f"the dev server did not answer within {SERVER_START_TIMEOUT_S:.0f} s; see {log}")
            time.sleep(2)
        print(f"\ndev server up on {url} after {time.monotonic() - started:.0f} s (log: {log})")
        yield DevServer(url, DEFAULT_USER, DEFAULT_PASSWORD, warehouse, landing, home, log, api)
    finally:
        _stop(proc)
        shutil.rmtree(base, ignore_errors=True)


def until(what: str, condition: Any, timeout_s: float, poll_s: float = 2.0) -> Any:
    """Poll ``condition`` until it returns something true (returned), or fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last_error: OSError | None = None
    while True:
        try:
            value = condition()
        except OSError as exc:  # a request that timed out on a loaded machine: ask again
            value, last_error = None, exc
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what} (last error: {last_error!r})")
        time.sleep(poll_s)
