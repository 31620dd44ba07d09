"""Keyed state reads served from the executors' Python workers: the rows of state files, cached by file.

Structured Streaming and Flink keep keyed state in a store local to the task
(RocksDB) and look an epoch's keys up in it; the durable copy is the
checkpoint. Here the durable copy is the state table's Delta files, and a
Python worker (reused between tasks: ``spark.python.worker.reuse``) keeps the
rows of the files it has read in memory as Arrow, per key group. An epoch's
read of its keys then reads only the files that worker has not read yet (the
small changelog files of the epochs since) and matches the keys in memory
(a hash table on the epoch's keys, probed by the cached rows), instead of
every task scanning and decoding the whole table.

Correct by construction: Delta data files are immutable (a path is written
once, and its size is part of the cache key), so rows cached for a file are
that file's rows for good. The driver passes the files of the snapshot to
read; files a snapshot no longer holds (compacted, restored away) are never
asked for again and age out. Nothing here decides what is live: the same
rule as the scan (latest ``_epoch`` per key, tombstones and expired rows
dropped) runs over the same files' rows.

One task (:func:`lookup_keys`), holding the keys of one key-group range
(or, for :func:`combine_with_live_rows`, the rows of an operator's epoch,
which it then joins with their keys' live rows in the same task):

1. Collect the task's keys.
2. For each file of the snapshot whose key-group range meets the task's key
   groups, take the cached rows of each of those key groups; read the rest
   from the file in one read (filtered to them, so Parquet statistics skip
   row groups) and cache them per key group.
3. Match: the rows of those key groups that hold one of the keys.
4. Keep the latest row per key by ``_epoch``; drop tombstones, and rows
   past their TTL at the epoch's processing time.

Spark does not send a key-group range to the same worker every epoch, so a
big read (a bulk file, a compacted table) is also saved for the host's other
workers as an Arrow IPC file in a per-user temporary directory and memory-
mapped: each big file is read from the warehouse once per host, and its pages
are shared rather than copied into every worker.

Bounded by ``BARRIERFLOW_WORKER_STATE_CACHE_MB`` (default 2048; ``0`` reads
the files every time and caches nothing): per Python worker in memory, and
for the host's directory on disk; the least recently used go first.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from barrierflow.core.errors import ConfigurationError
from barrierflow.state.spec import KEY_GROUP
from barrierflow.storage.objects import arrow_filesystem

__all__ = ["StateFile", "StateLookup", "lookup_keys", "live_rows_of", "every_live_row", "save_on_host", "take_from_host", "combine_with_live_rows", "without_live_keys", "latest_rows", "unexpired", "cache_limit_bytes", "CACHE_ENV", "clear"]

CACHE_ENV = "BARRIERFLOW_WORKER_STATE_CACHE_MB"
_DEFAULT_MB = 2048
# Reads of at least this many rows are also saved for the host's other workers.
_HOST_ENTRY_MIN_ROWS = 100_000


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


@dataclass(frozen=True)
class StateLookup:
    """What a task needs to read ``files``' live rows for its keys (picklable, sent to the executors)."""

    files: tuple[StateFile, ...]
    schema: pa.Schema  # the state table's (``StateSpec.arrow_schema``)
    key_columns: tuple[str, ...]
    ttl_ms: int | None
    processing_time_ms: int


def cache_limit_bytes() -> int:
    raw = os.environ.get(CACHE_ENV, str(_DEFAULT_MB))
    try:
        mb = int(raw)
    except ValueError:
        mb = -1
    if mb < 0:
        raise ConfigurationError(f"{CACHE_ENV}={raw!r}: expected a whole number of MiB (0 turns the cache off)")
    return mb * 1024 * 1024


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
    size = rows.nbytes
    if size > limit:
        return
    _cache[key] = rows
    _held_bytes += size
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


def _file_rows(lookup: StateLookup, file: StateFile, groups: set[int], limit: int) -> list[pa.Table]:
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
        rows = _read_host_entry(shared, lookup.schema) if limit else None
        if rows is None:
            fs, path = arrow_filesystem(file.uri)
            dataset = ds.dataset(path, format="parquet", filesystem=fs)
            names = [n for n in lookup.schema.names if n in dataset.schema.names]
            rows = dataset.to_table(columns=names, filter=pc.field(KEY_GROUP).isin(missing))
            rows = _conform(rows, lookup.schema)
            if limit and rows.num_rows >= _HOST_ENTRY_MIN_ROWS:
                rows = _write_host_entry(shared, rows, limit)
        split = _by_group(rows)
        for g in missing:
            part = split.get(g, lookup.schema.empty_table())
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

    Big reads only (:data:`_HOST_ENTRY_MIN_ROWS`): each Python worker has
    its own memory, and Spark does not send a key-group range to the same
    worker every epoch, so without this every worker would read every big
    file once. Written to a temporary name, then renamed (readers never see
    a partial entry); the directory is kept under ``limit`` bytes by
    deleting the least recently used entries (a worker that has one mapped
    keeps its pages). Best effort: any failure keeps the rows in memory.
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
    """Save ``rows`` under ``name`` for a later task on this host (:func:`take_from_host`); whether it was saved.

    In the directory of the host-shared entries, so a saved table no task
    takes is evicted with them (least recently used first).
    """
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


def _conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` with exactly ``schema``'s columns and types (a column missing from an older file reads as null)."""
    columns = [
        rows[f.name].cast(f.type) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def latest_rows(data: pa.Table, key_columns: list[str]) -> pa.Table:
    """One row per key, the one with the highest ``_epoch``, tombstones dropped."""
    if data.num_rows == 0:
        return data
    ordered = data.sort_by([(k, "ascending") for k in key_columns] + [("_epoch", "descending")])
    n = ordered.num_rows
    changed = None
    for k in key_columns:  # a row starts a new key when any key column differs from the row before
        col = ordered[k].combine_chunks()
        diff = pc.fill_null(pc.not_equal(col.slice(1), col.slice(0, n - 1)), True)
        changed = diff if changed is None else pc.or_(changed, diff)
    first = pa.concat_arrays([pa.array([True]), changed]) if changed is not None else pa.array([True] * n)
    kept = ordered.filter(first)
    return kept.filter(pc.invert(kept["_deleted"]))


def lookup_keys(lookup: StateLookup, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Executor side (``mapInArrow``): the live rows of ``lookup.files`` for the keys in ``batches``."""
    # Step 1.
    parts = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
    if parts:
        yield from live_rows_of(lookup, pa.concat_tables(parts)).to_batches()


def combine_with_live_rows(
    lookup: StateLookup, combine: Callable[[pa.Table, pa.Table], pa.Table], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Executor side (``mapInArrow``): ``combine(rows, live)`` of the task's rows and their keys' live rows in ``lookup.files``.

    The rows hold the key columns and :data:`KEY_GROUP` among any others:
    an operator joins its epoch with its state in the task that looked the
    state up (:func:`without_live_keys`, a running aggregate's merge).
    """
    # Step 1.
    parts = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
    if parts:
        rows = pa.concat_tables(parts)
        yield from combine(rows, live_rows_of(lookup, rows)).to_batches()


def without_live_keys(key_fields: tuple[pa.Field, ...], rows: pa.Table, live: pa.Table) -> pa.Table:
    """Those of ``rows`` whose key has no row in ``live``, unchanged and in their order (a deduplication's anti-join)."""
    if not live.num_rows:
        return rows
    key_columns = [f.name for f in key_fields]
    keys = _conform(rows.select(key_columns), pa.schema(key_fields))
    # Joined on the keys and a row number: Arrow's join carries no nested columns.
    numbered = keys.append_column("_row", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    found = numbered.join(live.select(key_columns), keys=key_columns, join_type="left semi")
    kept = np.ones(rows.num_rows, dtype=bool)
    kept[found["_row"].to_numpy()] = False
    return rows.filter(pa.array(kept))


def live_rows_of(lookup: StateLookup, rows: pa.Table) -> pa.Table:
    """Steps 2-4 for the keys of ``rows`` (which hold the key columns and :data:`KEY_GROUP`)."""
    names = [*lookup.key_columns, KEY_GROUP]
    keys = _conform(rows.select(names), pa.schema([lookup.schema.field(n) for n in names]))
    groups = set(pc.unique(keys[KEY_GROUP]).to_pylist())
    limit = cache_limit_bytes()
    # Step 2.
    stored: list[pa.Table] = []
    for file in lookup.files:
        wanted = file.holds(groups)
        if wanted:
            stored += _file_rows(lookup, file, wanted, limit)
    if not stored:
        return lookup.schema.empty_table()
    # Step 3. Acero builds its hash table on the right side: the task's keys. Joined on the keys
    # and a row number, then taken: Acero's join carries no nested (list, struct) columns.
    key_columns = list(lookup.key_columns)
    unique_keys = keys.select(key_columns).group_by(key_columns).aggregate([])
    candidates = pa.concat_tables(stored)
    numbered = candidates.select(key_columns).append_column("_row", pa.array(np.arange(candidates.num_rows, dtype=np.int64)))
    found = numbered.join(unique_keys, keys=key_columns, join_type="left semi")["_row"]
    matched = candidates.take(pc.take(found, pc.sort_indices(found)))  # in stored order, as the semi-join kept them
    # Step 4.
    live = latest_rows(matched, list(lookup.key_columns))
    return unexpired(live, lookup.ttl_ms, lookup.processing_time_ms)


def every_live_row(lookup: StateLookup, key_groups: int) -> pa.Table:
    """Every live row of ``lookup.files`` (steps 2 and 4 for all key groups: a compaction's rows)."""
    groups = set(range(key_groups))
    limit = cache_limit_bytes()
    stored = [part for file in lookup.files for part in _file_rows(lookup, file, file.holds(groups), limit)]
    if not stored:
        return lookup.schema.empty_table()
    live = latest_rows(pa.concat_tables(stored), list(lookup.key_columns))
    return unexpired(live, lookup.ttl_ms, lookup.processing_time_ms)


def unexpired(rows: pa.Table, ttl_ms: int | None, processing_time_ms: int) -> pa.Table:
    """``rows`` whose ``_updated_at_ms`` is within ``ttl_ms`` of the processing time (all of them without a TTL)."""
    if ttl_ms is None or not rows.num_rows:
        return rows
    return rows.filter(pc.greater(pc.add(rows["_updated_at_ms"], ttl_ms), processing_time_ms))
