"""Live state rows kept in the driver between the epochs of one process.

Structured Streaming keeps its state store resident in the executors between
batches; this is the same idea for state that operators merge on the driver
(running aggregates). Delta stays the only durable copy: recovery, other
processes and queries always read the tables. A resident copy is used only
while it provably equals the table:

1. :func:`lookup` returns the rows only for the exact snapshot they were
   taken from: the same Delta table id (a table deleted and created again
   gets a new id) and the same version.
2. An epoch that read its base snapshot (id, version v) and staged changed
   rows leaves a *pending* copy: the base with those keys replaced.
3. :func:`promote` makes the pending copy current once the epoch's commit is
   known to be version v + 1 of that table, made from this attempt's files.
   Any other commit in between (a zombie, another process) means the copy is
   dropped and the next epoch reads the table.
4. :func:`advance` carries a current copy over a maintenance commit that
   does not change content (compaction), again only from v to v + 1.

Copies are bounded by ``BARRIERFLOW_RESIDENT_STATE_ROWS`` rows in all
(default 5,000,000; 0 turns residency off); the least recently used go first.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = ["Snapshot", "max_rows", "lookup", "holds", "stage", "promote", "advance", "discard"]

_DEFAULT_MAX_ROWS = 5_000_000


@dataclass(frozen=True)
class Snapshot:
    """One version of one Delta table: ``table_id`` is the table's metadata id."""

    table_id: str | None
    version: int | None

    @classmethod
    def of(cls, table: "DeltaTable | None") -> "Snapshot":
        if table is None:
            return cls(None, None)
        return cls(table.metadata().id, table.version())


@dataclass(frozen=True)
class _Pending:
    base: Snapshot
    attempt_id: str
    live: pa.Table


_lock = threading.Lock()
_current: "OrderedDict[str, tuple[Snapshot, pa.Table]]" = OrderedDict()
_pending: dict[str, _Pending] = {}


def max_rows() -> int:
    """The bound on resident rows, from ``BARRIERFLOW_RESIDENT_STATE_ROWS``."""
    return int(os.environ.get("BARRIERFLOW_RESIDENT_STATE_ROWS", _DEFAULT_MAX_ROWS))


def lookup(uri: str, snapshot: Snapshot) -> pa.Table | None:
    """The live rows of ``uri`` at exactly ``snapshot``, if resident."""
    with _lock:
        entry = _current.get(uri)
        if entry is None or entry[0] != snapshot or snapshot.version is None:
            return None
        _current.move_to_end(uri)
        return entry[1]


def holds(uri: str) -> bool:
    """Whether some snapshot of ``uri`` is resident (whichever version it is)."""
    with _lock:
        return uri in _current


def stage(uri: str, base: Snapshot, attempt_id: str, live: pa.Table) -> None:
    """Step 2: the live rows after this attempt's epoch, pending its commit."""
    with _lock:
        if live.num_rows > max_rows():
            _pending.pop(uri, None)
            return
        _pending[uri] = _Pending(base, attempt_id, live)


def promote(uri: str, attempt_id: str, version: int) -> None:
    """Step 3: the epoch of ``attempt_id`` committed ``uri`` as ``version``."""
    with _lock:
        pending = _pending.pop(uri, None)
        _current.pop(uri, None)
    if pending is None or pending.attempt_id != attempt_id:
        return
    expected = 0 if pending.base.version is None else pending.base.version + 1
    if version != expected:
        return
    ident = pending.base.table_id
    if ident is None:  # the commit created the table: its id is new
        from barrierflow.delta_commit import open_table

        table = open_table(uri)
        ident = table.metadata().id if table is not None else None
    if ident is None:
        return
    with _lock:
        _current[uri] = (Snapshot(ident, version), pending.live)
        _evict()


def advance(uri: str, before: Snapshot, version: int) -> None:
    """Step 4: a content-preserving commit moved ``uri`` from ``before`` to ``version``."""
    with _lock:
        entry = _current.pop(uri, None)
        if entry is None or entry[0] != before or before.version is None or version != before.version + 1:
            return
        _current[uri] = (Snapshot(before.table_id, version), entry[1])


def discard(uri: str | None = None) -> None:
    """Forget resident copies (of one table, or all)."""
    with _lock:
        if uri is None:
            _current.clear()
            _pending.clear()
        else:
            _current.pop(uri, None)
            _pending.pop(uri, None)


def _evict() -> None:
    limit = max_rows()
    total = sum(live.num_rows for _, live in _current.values())
    while _current and total > limit:
        _, (_, live) = _current.popitem(last=False)
        total -= live.num_rows
