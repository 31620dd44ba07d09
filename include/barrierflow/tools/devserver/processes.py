"""The processes of ``make run``: Airflow's components as children, their prefixed output, and the routine that stops them
(a *child subreaper*, :func:`become_subreaper`, keeps the processes that left their group among its descendants)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import psutil

from barrierflow.tools.devserver.environment import HOST

__all__ = ["AirflowProcesses", "become_subreaper", "descendant_pids", "reap_orphans", "stop_process_tree", "say", "pump"]

_PR_SET_CHILD_SUBREAPER = 36


def say(message: str) -> None:
    """Print one of the launcher's own messages (``barrierflow | ...``)."""
    print(f"barrierflow | {message}", flush=True)


def pump(name: str, proc: subprocess.Popen[bytes]) -> None:
    """Copy ``proc``'s output to this process's, each line prefixed by ``name``, until it closes."""
    assert proc.stdout is not None
    for raw in proc.stdout:
        if line := raw.decode("utf-8", errors="replace").rstrip():
            print(f"{name:13} | {line}", flush=True)


def become_subreaper() -> None:
    """Make orphaned descendants re-parent to this process (Linux), so none escapes shutdown."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _tree_pids(roots: Sequence[int]) -> set[int]:
    """``roots`` and all their descendants."""
    return {pid for root in roots for pid in (root, *(p.pid for p in _descendants(root)))}


def descendant_pids() -> set[int]:
    """Pids of every live descendant of this process (a baseline for :func:`stop_process_tree`)."""
    return {p.pid for p in _descendants(os.getpid())}


def reap_orphans(keep: set[int] | frozenset[int] = frozenset()) -> None:
    """Wait for exited children (orphans re-parented to this subreaper), except ``keep``: pids whose ``Popen`` waits."""
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error, OSError):
            if child.pid not in keep and child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_process_tree(
    procs: Sequence[subprocess.Popen[Any]] = (),
    *,
    baseline: set[int] | frozenset[int] = frozenset(),
    spared: Sequence[int] = (),
    grace_s: float = 25.0,
    term_s: float = 10.0,
    first_signal: int = signal.SIGTERM,
) -> list[int]:
    """Stop ``procs`` and every other process this one started. Returns the pids that needed SIGKILL.

    1. ``first_signal`` (SIGTERM: every Airflow component shuts down gracefully on it) to each of
       ``procs``, in their order, then up to ``grace_s`` in all for them to exit;
    2. SIGTERM to every live descendant of this process except ``baseline`` (those that existed before
       ``procs`` started) and the trees of ``spared`` (the metadata database; the API server while the
       rest stops); those alive at the start are tracked even if they leave the tree;
    3. SIGKILL after ``term_s`` to those still alive or that appeared meanwhile; then ``procs`` and exited orphans are reaped."""

    def targets() -> dict[int, psutil.Process]:
        keep = set(baseline) | _tree_pids(spared)  # again each time: the database forks a process per connection
        return {p.pid: p for p in _descendants(os.getpid()) if p.pid not in keep}

    def alive() -> list[psutil.Process]:
        tracked.update(targets())
        return [p for p in tracked.values() if _running(p)]

    tracked = targets()

    # 1.
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                proc.send_signal(first_signal)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    # 2.
    rest = alive()
    for p in rest:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    # 3.
    _, still = psutil.wait_procs(rest, timeout=term_s)
    killed = []
    for p in {q.pid: q for q in [*still, *alive()]}.values():
        with contextlib.suppress(psutil.Error):
            p.kill()
            killed.append(p.pid)
    psutil.wait_procs(still, timeout=5)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    reap_orphans(keep=set(baseline) | _tree_pids(spared))
    return killed


class AirflowProcesses:
    """The Airflow components as child processes (each in its own session), output prefixed by name."""

    COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("dag-processor", ("dag-processor",)),
        ("scheduler", ("scheduler", "--skip-serve-logs")),
        ("triggerer", ("triggerer", "--skip-serve-logs")),
    )
    STOP_ORDER = ("scheduler", "dag-processor", "triggerer")

    def __init__(self, env: Mapping[str, str], cwd: Path, port: int) -> None:
        self.env = dict(env)
        self.cwd = cwd
        self.port = port
        airflow = Path(sys.executable).with_name("airflow")
        self.airflow = str(airflow) if airflow.exists() else "airflow"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._threads: list[threading.Thread] = []
        self.spared: list[int] = []  # process trees outliving the stop (the metadata database)

    def _spawn(self, name: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
        # Own session: a terminal's Ctrl-C reaches only this launcher, which stops the components in order.
        proc = subprocess.Popen(
            [self.airflow, *args],
            env=self.env,
            cwd=str(self.cwd),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._pump(name, proc)
        return proc

    def _pump(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        thread = threading.Thread(target=pump, args=(name, proc), name=f"out-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def adopt(self, name: str, proc: subprocess.Popen[bytes] | None) -> None:
        """Watch and stop ``proc`` (started elsewhere, e.g. the Spark engine) like a component."""
        if proc is None:
            return
        self.procs[name] = proc
        if proc.stdout is not None:
            self._pump(name, proc)

    def migrate(self, timeout_s: float = 600.0) -> int:
        """``airflow db migrate`` (creates the database the first time); its exit code."""
        self.procs["db"] = self._spawn("db", ("db", "migrate"))
        try:
            return self.procs["db"].wait(timeout=timeout_s)
        finally:
            del self.procs["db"]

    def start_api_server(self) -> None:
        self.procs["api-server"] = self._spawn("api-server", ("api-server", "--host", HOST, "--port", str(self.port)))

    def start_components(self, *names: str) -> None:
        for name, args in self.COMPONENTS:
            if name in names:
                self.procs[name] = self._spawn(name, args)

    def exited(self) -> tuple[str, int] | None:
        """The first component that exited, with its exit code."""
        return next(((name, code) for name, proc in self.procs.items() if (code := proc.poll()) is not None), None)

    def reap_orphans(self) -> None:
        """Wait for exited orphans re-parented to this process (never for the components: their Popen waits)."""
        reap_orphans(keep={p.pid for p in self.procs.values()})

    def stop(self, baseline: set[int] | frozenset[int], grace_s: float = 5.0) -> list[int]:
        """Stop in an order that lets running tasks report their end to the API server; the pids SIGKILLed.

        Two calls of :func:`stop_process_tree`, ``spared`` trees (the metadata database) and ``baseline`` left alone:

        1. the components in ``STOP_ORDER``, then the others but the API server (the engine); then every
           other process outside the API server's tree (a task supervisor forwards SIGTERM to its task,
           which reports the interruption through the API server); SIGKILL after 10 s;
        2. the API server, then whatever is left of the process tree; SIGKILL after 5 s."""
        api = self.procs.get("api-server")
        first = [self.procs[name] for name in self.STOP_ORDER if name in self.procs]
        others = [p for n, p in self.procs.items() if n != "api-server" and n not in self.STOP_ORDER]
        spared = [*([api.pid] if api is not None else []), *self.spared]
        killed = stop_process_tree([*first, *others], baseline=baseline, spared=spared, grace_s=grace_s, term_s=10.0)
        killed += stop_process_tree(
            [api] if api is not None else [], baseline=baseline, spared=self.spared, grace_s=grace_s, term_s=5.0
        )
        for thread in self._threads:
            thread.join(timeout=2)
        return killed
