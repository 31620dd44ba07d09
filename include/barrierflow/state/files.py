"""Reading a state table's files in a task: the rows of each file cached per key group by the Python worker.

As Flink's RocksDB serves reads from files local to the task, a Python worker keeps the rows of the state files it has read in
memory, per key group: an epoch reads only the files it has not read yet. Correct by construction: Delta data files are immutable
(a path is written once; its size is part of the cache key).

A task reads its keys' live rows (:meth:`barrierflow.state.table.TaskStateTable.live_rows`; every live row of its groups: 2, 4):

1. Collect the task's keys.
2. For each snapshot file whose key-group range meets the task's key groups, take those key groups' cached rows; read the rest in
   one read of the file (filtered to them, so Parquet statistics skip row groups) and cache them per key group.
3. Match: the rows of those key groups that hold one of the keys.
4. Keep the latest row per key by ``_epoch``; drop tombstones, and rows past their TTL at the epoch's processing time.

Spark does not send a key-group range to the same worker every epoch, so a big read is also saved for the host's other workers as
a memory-mapped Arrow IPC file in a per-user temporary directory. Bounded by ``BARRIERFLOW_WORKER_STATE_CACHE_MB`` per worker and
for the host's directory, least recently used first out (README "Where the work runs").
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from barrierflow.core.arrow import conform
from barrierflow.core.columns import KEY_GROUP, UPDATED_AT
from barrierflow.core.settings import HOST_CACHE_MIN_ROWS, WORKER_STATE_CACHE_MB
from barrierflow.storage.objects import arrow_filesystem

__all__ = [
    "StateFile", "stored_rows_of", "save_on_host", "take_from_host", "unexpired", "cache_limit_bytes", "clear",
]  # fmt: skip


@dataclass(frozen=True)
class StateFile:
    """One data file of a state table snapshot: its URI, size and key-group range (None: unknown)."""

    uri: str
    size: int
    low: int | None
    high: int | None

    def holds(self, groups: "set[int] | list[int]") -> set[int]:
        """Those of ``groups`` this file may hold rows of (all of them when its range is unknown)."""
        if self.low is None or self.high is None:
            return set(groups)
        return {g for g in groups if self.low <= g <= self.high}


def cache_limit_bytes() -> int:
    return WORKER_STATE_CACHE_MB.value() * 1024 * 1024


# (file URI, file size, key group) -> that key group's rows of the file, cast to the table's schema.
_cache: "OrderedDict[tuple[str, int, int], pa.Table]" = OrderedDict()
_held_bytes = 0


def clear() -> None:
    """Drop every cached slice (tests; a worker otherwise keeps them until evicted)."""
    global _held_bytes
    _cache.clear()
    _held_bytes = 0


def _remember(key: tuple[str, int, int], rows: pa.Table, limit: int) -> None:
    global _held_bytes
    if rows.nbytes > limit:
        return
    _cache[key] = rows
    _held_bytes += rows.nbytes
    while _held_bytes > limit and _cache:
        _, evicted = _cache.popitem(last=False)
        _held_bytes -= evicted.nbytes


def _by_group(rows: pa.Table) -> dict[int, pa.Table]:
    """``rows`` split by key group (zero-copy slices when already sorted by it, as barrierflow writes them)."""
    if rows.num_rows == 0:
        return {}
    groups = rows[KEY_GROUP].to_numpy()
    if np.any(groups[1:] < groups[:-1]):
        order = np.argsort(groups, kind="stable")
        rows = rows.take(pa.array(order))
        groups = groups[order]
    starts = np.concatenate(([0], np.flatnonzero(groups[1:] != groups[:-1]) + 1))
    ends = np.append(starts[1:], len(groups))
    return {int(groups[s]): rows.slice(int(s), int(e - s)) for s, e in zip(starts, ends)}


def _file_rows(file: StateFile, schema: pa.Schema, groups: set[int], limit: int) -> list[pa.Table]:
    """Step 2 for one file: its rows in ``groups``, from the cache or one filtered read."""
    found, missing = [], []
    for g in sorted(groups):
        key = (file.uri, file.size, g)
        cached = _cache.get(key)
        if cached is None:
            missing.append(g)
        else:
            _cache.move_to_end(key)
            found.append(cached)
    if missing:
        shared = _host_entry(file, missing)
        rows = _read_host_entry(shared, schema) if limit else None
        if rows is None:
            fs, path = arrow_filesystem(file.uri)
            present = ds.dataset(path, format="parquet", filesystem=fs).schema.names
            # Read as the table's types: another writer (delta-rs) may have stored strings as views.
            read_as = pa.schema([schema.field(n) for n in schema.names if n in present])
            dataset = ds.dataset(path, format="parquet", filesystem=fs, schema=read_as)
            rows = conform(dataset.to_table(filter=pc.field(KEY_GROUP).isin(missing)), schema)
            if limit and rows.num_rows >= HOST_CACHE_MIN_ROWS:
                rows = _write_host_entry(shared, rows, limit)
        split = _by_group(rows)
        for g in missing:
            part = split.get(g, schema.empty_table())
            if limit:
                _remember((file.uri, file.size, g), part, limit)
            if part.num_rows:
                found.append(part)
    return found


def _host_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"barrierflow-state-cache-{os.getuid()}")


def _private(directory: str) -> bool:
    """Whether ``directory`` is this user's alone: entries anyone else could write would be trusted as state."""
    st = os.stat(directory, follow_symlinks=False)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def _host_entry(file: StateFile, groups: list[int]) -> str:
    """The host-shared entry's path for ``groups`` of ``file`` (Arrow IPC, see :func:`_write_host_entry`)."""
    digest = hashlib.sha256(f"{file.uri}\0{file.size}\0{','.join(map(str, groups))}".encode()).hexdigest()
    return os.path.join(_host_dir(), f"{digest[:40]}.arrow")


def _read_host_entry(path: str, schema: pa.Schema) -> pa.Table | None:
    """The rows another worker on this host saved for the same file and key groups, memory-mapped; or None."""
    try:
        if not _private(os.path.dirname(path)):
            return None
        with pa.memory_map(path) as source:
            rows = pa.ipc.open_file(source).read_all()
        os.utime(path)  # recently used: evicted last
    except (OSError, pa.ArrowInvalid):
        return None  # not there (or removed meanwhile): read the Parquet file
    return rows if rows.schema.equals(schema) else None


def _write_host_entry(path: str, rows: pa.Table, limit: int) -> pa.Table:
    """Save ``rows`` for the other workers of this host and return them memory-mapped (pages shared, not copied).

    Renamed into place (readers never see a partial entry); the directory is kept under ``limit`` bytes, least recently used out
    (a worker that has one mapped keeps its pages). Best effort: any failure keeps the rows.
    """
    directory = _host_dir()
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if not _private(directory):
            return rows
        partial_path = f"{path}.{os.getpid()}.tmp"
        with pa.OSFile(partial_path, "wb") as sink, pa.ipc.new_file(sink, rows.schema) as writer:
            writer.write_table(rows)
        os.replace(partial_path, path)
        entries = [os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".arrow")]
        stats = sorted(((os.stat(e), e) for e in entries), key=lambda se: se[0].st_mtime)
        total = sum(st.st_size for st, _ in stats)
        for st, entry in stats:
            if total <= limit or entry == path:
                break
            os.remove(entry)
            total -= st.st_size
        with pa.memory_map(path) as source:
            return pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowInvalid):
        return rows


def save_on_host(name: str, rows: pa.Table) -> bool:
    """Save ``rows`` under ``name`` among the host-shared entries for a later task (:func:`take_from_host`); whether saved."""
    return _write_host_entry(os.path.join(_host_dir(), f"{name}.arrow"), rows, cache_limit_bytes()) is not rows


def take_from_host(name: str, schema: pa.Schema) -> pa.Table | None:
    """The rows :func:`save_on_host` saved under ``name`` on this host, removed from it; None if not here."""
    path = os.path.join(_host_dir(), f"{name}.arrow")
    rows = _read_host_entry(path, schema)
    if rows is not None:
        try:
            os.remove(path)  # its pages stay mapped for ``rows``
        except OSError:
            pass
    return rows


def stored_rows_of(files: Sequence[StateFile], schema: pa.Schema, groups: set[int]) -> pa.Table:
    """Step 2: every stored row of ``groups`` in ``files``."""
    limit = cache_limit_bytes()
    stored: list[pa.Table] = []
    for file in files:
        if wanted := file.holds(groups):
            stored += _file_rows(file, schema, wanted, limit)
    return pa.concat_tables(stored) if stored else schema.empty_table()


def unexpired(rows: pa.Table, ttl_ms: int | None, processing_time_ms: int) -> pa.Table:
    """``rows`` whose ``_updated_at_ms`` is within ``ttl_ms`` of the processing time (all of them without a TTL)."""
    if ttl_ms is None or not rows.num_rows:
        return rows
    return rows.filter(pc.greater(pc.add(rows[UPDATED_AT], ttl_ms), processing_time_ms))
