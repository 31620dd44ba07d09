"""The ``heap`` state backend: every live row of a task's key groups kept on its host between epochs.

As Flink's HashMap backend, a task keeps every live row of its key groups after the epoch, named by the state files they equal:
the snapshot's files that may hold its key groups plus the files it staged (only those, after a compaction). The next epoch's task
for the same key groups uses them when the table's snapshot is exactly those files; otherwise (a failed commit, a restore, a
rescale, another host) it reads the files as ``delta`` does. Correct by construction: Delta data files never change.

The copy is kept in the worker's memory and saved for the host's other workers (:func:`barrierflow.state.files.save_on_host`), at
most ``BARRIERFLOW_RESIDENT_STATE_ROWS`` live rows.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable

import pyarrow as pa

from barrierflow.core.settings import HEAP_STATE_ROWS
from barrierflow.state.files import save_on_host, take_from_host
from barrierflow.state.spec import KeyGroups, StateTablePlan
from barrierflow.storage.objects import join_uri

__all__ = ["lookup", "keep"]

# (table URI, key groups) -> (the file URIs the rows equal, the rows): this worker's copies.
_copies: dict[tuple[str, int, int], tuple[frozenset[str], pa.Table]] = {}


def _name(uri: str, groups: "KeyGroups", files: Iterable[str]) -> str:
    digest = hashlib.sha256("\0".join([uri, str(groups.low), str(groups.high), *sorted(files)]).encode()).hexdigest()
    return f"heap-{digest[:40]}"


def _relevant(plan: "StateTablePlan", groups: "KeyGroups") -> frozenset[str]:
    """The snapshot's files that may hold rows of ``groups`` (by their key-group statistics): what the copy must equal."""
    return frozenset(
        f.uri for f in plan.files if f.low is None or f.high is None or (f.low <= groups.high and f.high >= groups.low)
    )


def lookup(plan: "StateTablePlan", groups: "KeyGroups") -> pa.Table | None:
    """The live rows of ``groups`` kept after the epoch before, if they are exactly those of the snapshot's files holding them."""
    files = _relevant(plan, groups)
    held = _copies.get((plan.uri, groups.low, groups.high))
    if held is not None and held[0] == files:
        return held[1]
    rows = take_from_host(_name(plan.uri, groups, files), plan.spec.arrow_schema())
    if rows is not None:
        _copies[(plan.uri, groups.low, groups.high)] = (files, rows)
    return rows


def keep(plan: "StateTablePlan", groups: "KeyGroups", live: pa.Table, written: list[dict[str, Any]]) -> None:
    """Keep ``live``, the rows of ``groups`` after the epoch, named by the files they will equal once it commits."""
    limit = HEAP_STATE_ROWS.value()
    key = (plan.uri, groups.low, groups.high)
    if limit == 0 or live.num_rows > limit:
        _copies.pop(key, None)
        return
    # Its staged files hold its key groups only (clustered by range); the other tasks' hold theirs.
    staged = {join_uri(plan.uri, f["path"]) for f in written}
    files = frozenset(staged if plan.compact else _relevant(plan, groups) | staged)
    _copies[key] = (files, live)
    save_on_host(_name(plan.uri, groups, files), live)
