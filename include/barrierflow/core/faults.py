"""Deterministic fault injection for crash-and-resume tests.

``BARRIERFLOW_FAULT="<point>:<n>[:<mode>]"`` (comma-separated for several) ends the process at the n-th time it
crosses ``<point>`` (one of :data:`FAULT_POINTS`). Modes: ``kill`` (default: SIGKILL to itself, as abrupt as a power
cut) and ``raise`` (an :class:`InjectedFault`, which lets Airflow's retries handle it).

Crossings are counted per process unless ``BARRIERFLOW_FAULT_STATE=<dir>`` names a directory: then each point's count
lives in a file there, shared by every process that sets it (under a file lock), so a fault fires once across
retries: an orchestrator's retry of a killed task, a fresh process, sees the crossings before it and passes.
"""

from __future__ import annotations

import fcntl
import os
import signal
import threading
from collections import Counter

from barrierflow.core.errors import ConfigurationError, InjectedFault

__all__ = ["FAULT_POINTS", "maybe_fail", "ENV_VAR", "STATE_ENV_VAR"]

ENV_VAR = "BARRIERFLOW_FAULT"
STATE_ENV_VAR = "BARRIERFLOW_FAULT_STATE"

FAULT_POINTS = (
    "recover.start",
    "barrier.before_write",
    "barrier.after_write",
    "process.after_read",
    "process.after_stage",
    "process.before_manifest",
    "process.after_manifest",
    "commit.before_delta_commit",
    "commit.after_delta_commit",
    "commit.before_completed",
    "commit.after_completed",
    "notify.start",
    "restore.after_intent",
    "restore.before_lineage",
)

_crossings: Counter[str] = Counter()
_crossings_lock = threading.Lock()  # two epochs may be in flight (concurrent checkpoints)


def _parse(spec: str) -> dict[str, tuple[int, str]]:
    plan: dict[str, tuple[int, str]] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        parts = item.split(":")
        if len(parts) not in (2, 3) or parts[0] not in FAULT_POINTS or not parts[1].isdigit():
            raise ConfigurationError(
                f"{ENV_VAR}={spec!r} is invalid: expected '<point>:<n>[:kill|raise]' with a point among {', '.join(FAULT_POINTS)}"
            )
        mode = parts[2] if len(parts) == 3 else "kill"
        if mode not in ("kill", "raise"):
            raise ConfigurationError(f"{ENV_VAR} mode must be 'kill' or 'raise', not {mode!r}")
        plan[parts[0]] = (int(parts[1]), mode)
    return plan


def maybe_fail(point: str) -> None:
    """Count a crossing of ``point`` and fail here if the plan says so."""
    plan = _parse(os.environ.get(ENV_VAR) or "")
    if point not in plan:
        return
    state_dir = os.environ.get(STATE_ENV_VAR)
    if state_dir:
        crossing = _persistent_crossing(state_dir, point)
    else:
        with _crossings_lock:
            _crossings[point] += 1
            crossing = _crossings[point]
    target, mode = plan[point]
    if crossing != target:
        return
    if mode == "raise":
        raise InjectedFault(f"injected fault at {point} (crossing {target})")
    os.kill(os.getpid(), signal.SIGKILL)


def _persistent_crossing(state_dir: str, point: str) -> int:
    """Count one crossing of ``point`` in ``state_dir`` and return the total so far, durable before it returns."""
    path = os.path.join(state_dir, f"{point}.count")
    try:
        os.makedirs(state_dir, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ConfigurationError(f"{STATE_ENV_VAR}={state_dir!r} is not a usable directory: {exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by close
        text = os.read(fd, 64).decode().strip()
        count = (int(text) if text.isdigit() else 0) + 1
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, str(count).encode())
        os.fsync(fd)
        return count
    finally:
        os.close(fd)
