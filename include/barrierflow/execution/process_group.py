"""Stopping a child started in its own session: signal its whole process group, wait, then SIGKILL.

Every long-running child (the engine, PostgreSQL, the topology's services) has its own session: one signal reaches all it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

__all__ = ["stop_group", "kill_group"]


def stop_group(proc: subprocess.Popen[Any], first_signal: int = signal.SIGTERM, grace_s: float = 20.0) -> None:
    """``first_signal`` to ``proc``'s group, up to ``grace_s`` to exit, then SIGKILL to the group."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, first_signal)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
    except ProcessLookupError:
        pass


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL ``proc``'s whole process group (a crash), and reap ``proc``."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
