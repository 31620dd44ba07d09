"""Live state rows kept between the epochs of one process, on the driver or the executors.

Structured Streaming keeps its state store resident in the executors between
batches; this is the same idea, twice over:

- :data:`heap`: Arrow tables on the driver, for running aggregates merged
  there (the ``heap`` state backend). The module-level functions are its.
- :data:`executors`: Spark frames held by the executors (local checkpoints),
  for operators that merge on the executors (the ``delta`` state backend):
  an epoch joins its changes with them instead of reading the table.

Delta stays the only durable copy: recovery, other processes and queries
always read the tables. A resident copy is used only while it provably
equals the table:

1. ``lookup`` returns the rows only for the exact snapshot they were taken
   from: the same Delta table id (a table deleted and created again gets a
   new id) and the same version.
2. An epoch that read its base snapshot (id, version v) and staged changed
   rows leaves a *pending* copy: the base with those keys replaced.
3. ``promote`` makes the pending copy current once the epoch's commit is
   known to be version v + 1 of that table, made from this attempt's files.
   Any other commit in between (a zombie, another process) means the copy is
   dropped and the next epoch reads the table.
4. ``advance`` carries a current copy over a maintenance commit that does
   not change content (compaction), again only from v to v + 1.

Each kind is bounded by rows in all, from an environment variable
(``BARRIERFLOW_RESIDENT_STATE_ROWS``, default 5,000,000, for the heap;
``BARRIERFLOW_CACHED_STATE_ROWS``, default 1,000,000, for the executors;
0 turns a kind off); the least recently used copies go first.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar, cast

import pyarrow as pa

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = [
    "Snapshot", "ResidentCopies", "heap", "executors", "ALL",
    "max_rows", "lookup", "holds", "stage", "promote", "advance", "discard",
]  # fmt: skip

_T = TypeVar("_T")


@dataclass(frozen=True)
class Snapshot:
    """One version of one Delta table: ``table_id`` is the table's metadata id."""

    table_id: str | None
    version: int | None

    @classmethod
    def of(cls, table: "DeltaTable | None") -> "Snapshot":
        if table is None:
            return cls(None, None)
        # deltalake annotates Metadata.id as int; it is the table's id string (a UUID).
        return cls(cast(str, table.metadata().id), table.version())


@dataclass(frozen=True)
class _Copy(Generic[_T]):
    live: _T
    rows: int


@dataclass(frozen=True)
class _Pending(Generic[_T]):
    base: Snapshot
    attempt_id: str
    copy: _Copy[_T]


class ResidentCopies(Generic[_T]):
    """Copies of one kind, bounded by ``env_var`` rows in all; ``release`` frees a dropped copy."""

    def __init__(self, env_var: str, default_rows: int, release: Callable[[_T], None] | None = None) -> None:
        self.env_var = env_var
        self.default_rows = default_rows
        self._release = release
        self._lock = threading.Lock()
        self._current: "OrderedDict[str, tuple[Snapshot, _Copy[_T]]]" = OrderedDict()
        self._pending: dict[str, _Pending[_T]] = {}

    def max_rows(self) -> int:
        """The bound on rows in all, from the environment variable."""
        return int(os.environ.get(self.env_var, self.default_rows))

    def lookup(self, uri: str, snapshot: Snapshot) -> _T | None:
        """Step 1: the live rows of ``uri`` at exactly ``snapshot``, if resident."""
        entry = self.lookup_copy(uri, snapshot)
        return None if entry is None else entry[0]

    def lookup_copy(self, uri: str, snapshot: Snapshot) -> tuple[_T, int] | None:
        """:meth:`lookup` with the copy's row count."""
        with self._lock:
            entry = self._current.get(uri)
            if entry is None or entry[0] != snapshot or snapshot.version is None:
                return None
            self._current.move_to_end(uri)
            return entry[1].live, entry[1].rows

    def holds(self, uri: str) -> bool:
        """Whether some snapshot of ``uri`` is resident (whichever version it is)."""
        with self._lock:
            return uri in self._current

    def stage(self, uri: str, base: Snapshot, attempt_id: str, live: _T, rows: int) -> None:
        """Step 2: the ``rows`` live rows after this attempt's epoch, pending its commit."""
        dropped = []
        with self._lock:
            old = self._pending.pop(uri, None)
            if old is not None and old.copy.live is not live:
                dropped.append(old.copy.live)
            if rows <= self.max_rows():
                self._pending[uri] = _Pending(base, attempt_id, _Copy(live, rows))
            else:
                dropped.append(live)
        self._free(dropped)

    def promote(self, uri: str, attempt_id: str, version: int) -> None:
        """Step 3: the epoch of ``attempt_id`` committed ``uri`` as ``version``."""
        with self._lock:
            pending = self._pending.pop(uri, None)
            current = self._current.pop(uri, None)
        dropped = [] if current is None else [current[1].live]
        try:
            if pending is None:
                return
            expected = 0 if pending.base.version is None else pending.base.version + 1
            if pending.attempt_id != attempt_id or version != expected:
                dropped.append(pending.copy.live)
                return
            ident = pending.base.table_id
            if ident is None:  # the commit created the table: its id is new
                from barrierflow.storage.delta import open_table

                table = open_table(uri)
                ident = cast(str, table.metadata().id) if table is not None else None  # a string, see Snapshot.of
            if ident is None:
                dropped.append(pending.copy.live)
                return
            with self._lock:
                self._current[uri] = (Snapshot(ident, version), pending.copy)
                dropped += self._evict()
        finally:
            self._free(dropped)

    def advance(self, uri: str, before: Snapshot, version: int) -> None:
        """Step 4: a content-preserving commit moved ``uri`` from ``before`` to ``version``."""
        with self._lock:
            entry = self._current.pop(uri, None)
            if entry is None:
                return
            if entry[0] != before or before.version is None or version != before.version + 1:
                dropped = [entry[1].live]
            else:
                self._current[uri] = (Snapshot(before.table_id, version), entry[1])
                return
        self._free(dropped)

    def discard(self, uri: str | None = None) -> None:
        """Forget resident copies (of one table, or all)."""
        with self._lock:
            if uri is None:
                dropped = [c.live for _, c in self._current.values()] + [p.copy.live for p in self._pending.values()]
                self._current.clear()
                self._pending.clear()
            else:
                entry, pending = self._current.pop(uri, None), self._pending.pop(uri, None)
                dropped = ([entry[1].live] if entry else []) + ([pending.copy.live] if pending else [])
        self._free(dropped)

    def _evict(self) -> list[_T]:
        limit = self.max_rows()
        total = sum(copy.rows for _, copy in self._current.values())
        dropped = []
        while self._current and total > limit:
            _, (_, copy) = self._current.popitem(last=False)
            total -= copy.rows
            dropped.append(copy.live)
        return dropped

    def _free(self, copies: list[_T]) -> None:
        if self._release is not None:
            for live in copies:
                self._release(live)


def _unpersist(frame: Any) -> None:
    # A local checkpoint's blocks go with the frame: unpersist now rather
    # than when the JVM (or the Connect server) collects it.
    try:
        frame.unpersist()
    except Exception:  # a stopped session has nothing left to free
        pass


heap: ResidentCopies[pa.Table] = ResidentCopies("BARRIERFLOW_RESIDENT_STATE_ROWS", 5_000_000)
executors: ResidentCopies[Any] = ResidentCopies("BARRIERFLOW_CACHED_STATE_ROWS", 1_000_000, release=_unpersist)
ALL: tuple[ResidentCopies[Any], ...] = (heap, executors)


def max_rows() -> int:
    """The heap's bound on resident rows (``BARRIERFLOW_RESIDENT_STATE_ROWS``)."""
    return heap.max_rows()


def lookup(uri: str, snapshot: Snapshot) -> pa.Table | None:
    """The heap's live rows of ``uri`` at exactly ``snapshot``, if resident."""
    return heap.lookup(uri, snapshot)


def holds(uri: str) -> bool:
    """Whether the heap holds some snapshot of ``uri``."""
    return heap.holds(uri)


def stage(uri: str, base: Snapshot, attempt_id: str, live: pa.Table) -> None:
    """Step 2 on the heap."""
    heap.stage(uri, base, attempt_id, live, live.num_rows)


def promote(uri: str, attempt_id: str, version: int) -> None:
    """Step 3, for both kinds: the epoch of ``attempt_id`` committed ``uri`` as ``version``."""
    for copies in ALL:
        copies.promote(uri, attempt_id, version)


def advance(uri: str, before: Snapshot, version: int) -> None:
    """Step 4, for both kinds."""
    for copies in ALL:
        copies.advance(uri, before, version)


def discard(uri: str | None = None) -> None:
    """Forget resident copies of both kinds (of one table, or all)."""
    for copies in ALL:
        copies.discard(uri)
