"""Deterministic fault injection for crash-and-resume tests.

``BARRIERFLOW_FAULT="<point>:<n>[:<mode>]"`` (comma-separated for several)
ends the process at the n-th time it crosses ``<point>``. Modes: ``kill``
(default: SIGKILL to itself, as abrupt as a power cut) and ``raise`` (an
:class:`InjectedFault`, which lets Airflow's retries handle it). Points are
named ``<phase>.<where>``; :data:`FAULT_POINTS` lists them.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

from barrierflow.errors import ConfigurationError, InjectedFault

__all__ = ["FAULT_POINTS", "maybe_fail", "ENV_VAR"]

ENV_VAR = "BARRIERFLOW_FAULT"

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
)

_crossings: Counter[str] = Counter()


def _parse(spec: str) -> dict[str, tuple[int, str]]:
    plan: dict[str, tuple[int, str]] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        parts = item.split(":")
        if len(parts) not in (2, 3) or parts[0] not in FAULT_POINTS or not parts[1].isdigit():
            raise ConfigurationError(
                f"{ENV_VAR}={spec!r} is invalid: expected '<point>:<n>[:kill|raise]' "
                f"with a point among {', '.join(FAULT_POINTS)}"
            )
        mode = parts[2] if len(parts) == 3 else "kill"
        if mode not in ("kill", "raise"):
            raise ConfigurationError(f"{ENV_VAR} mode must be 'kill' or 'raise', not {mode!r}")
        plan[parts[0]] = (int(parts[1]), mode)
    return plan


def maybe_fail(point: str) -> None:
    """Count a crossing of ``point`` and fail here if the plan says so."""
    spec = os.environ.get(ENV_VAR)
    if not spec:
        return
    plan = _parse(spec)
    if point not in plan:
        return
    _crossings[point] += 1
    target, mode = plan[point]
    if _crossings[point] != target:
        return
    if mode == "raise":
        raise InjectedFault(f"injected fault at {point} (crossing {target})")
    os.kill(os.getpid(), signal.SIGKILL)
