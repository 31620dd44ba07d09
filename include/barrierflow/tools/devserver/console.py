"""The launcher's console: its own messages and its children's output, each line prefixed by its source."""

from __future__ import annotations

import subprocess

__all__ = ["say", "pump"]


def say(message: str) -> None:
    """Print one of the launcher's own messages (``barrierflow | ...``)."""
    print(f"barrierflow | {message}", flush=True)


def pump(name: str, proc: subprocess.Popen[bytes]) -> None:
    """Copy ``proc``'s output to this process's, each line prefixed by ``name``, until it closes."""
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.decode("utf-8", errors="replace").rstrip()
        if line:
            print(f"{name:13} | {line}", flush=True)
