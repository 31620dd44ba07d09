"""Keyed state kept in Delta tables, one per (operator, state name).

Incremental checkpoints: an epoch appends only the keys it changed, one row
per key with the epoch that wrote it (a tombstone for a cleared key); the
current value of a key is its row with the highest ``_epoch``. Files are
sorted by key group, so Parquet statistics let an epoch read only the key
groups it touches, and, for state that event time bounds, the rows the
watermark reaches (:class:`~barrierflow.state.spec.DueRows`, skipped by the
statistics of their time column). :func:`compact` rewrites a table to one
live row per key.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.checkpointing.checkpoint import TableKind
from barrierflow.core.errors import CheckpointError
from barrierflow.execution.table_files import read_parquet_files
from barrierflow.state import resident
from barrierflow.state.spec import KEY_GROUP, DueRows, StateSpec
from barrierflow.state.worker_cache import (
    StateFile,
    StateLookup,
    cache_limit_bytes,
    combine_with_live_rows,
    latest_rows,
    lookup_keys,
    unexpired,
)
from barrierflow.storage.delta import add_actions, borrow_snapshot, counted_rows, give_back, latest_snapshot, stored_rows
from barrierflow.storage.layout import COMPACTED_DIR
from barrierflow.storage.objects import join_uri

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from barrierflow.execution.runtime import EpochContext

__all__ = ["DeltaStateBackend", "BROADCAST_KEYS", "worth_matching", "joinable", "live_row_chunks", "stored_batches", "needs_compaction", "compact"]

# Below this many files, listing the touched key groups costs more than it saves.
_PRUNE_MIN_FILES = 4
# A read with due rows (windows, timers, join buffers: state event time bounds)
# below this many stored rows reads them all: cheaper than the touched key groups' job.
_DUE_PRUNE_MIN_ROWS = 100_000
# More files than this and a table is compacted whatever its row counts.
_MAX_FILES = 32
# An epoch's keys up to this many are broadcast to the state read's tasks
# (Spark's broadcast join: a few tens of MB at most); more are shuffled.
BROADCAST_KEYS = 500_000
# Stored rows below which a state read is not matched against the epoch's keys
# (:func:`worth_matching`): a broadcast job costs ~0.1-0.3 s.
_MATCH_KEYS_MIN_ROWS = 200_000
# The same for a lookup in the Python workers' cache, which costs a shuffle of
# the keys but no scan of the files it already holds.
_LOOKUP_MIN_ROWS = 50_000
# A table compacts in one Python task while its stored rows and the epoch's
# input rows are at most this many (the task holds them all, as Arrow).
TASK_COMPACTION_ROWS = 1_000_000
# Rows a driver-side pass over a whole table (savepoint, restore, maintenance
# compaction) holds at once: its memory stays bounded whatever the state's size.
CHUNK_ROWS = 1_000_000


class DeltaStateBackend:
    """Reads state as of the last completed epoch and stages this epoch's changes.

    Every method first waits for that epoch to complete (``ctx.restore_point``).
    """

    def __init__(self, ctx: "EpochContext") -> None:
        self._ctx = ctx
        # Per state table read whole on the driver: its snapshot and live rows.
        self._bases: dict[str, tuple[resident.Snapshot, pa.Table]] = {}
        # Per state table read whole on the executors: the snapshot read.
        self._live_bases: dict[str, resident.Snapshot] = {}
        # Per state table's URI: the snapshot this epoch reads and stages against, borrowed from the process (:meth:`release`).
        self._tables: dict[str, Any] = {}

    def _open(self, spec: StateSpec) -> Any:
        """The state table as of the last completed epoch, or None before its first commit.

        Opened once per epoch: reads and staging see one snapshot, and an
        object store is asked for the log once rather than per call.
        """
        ctx = self._ctx
        uri = ctx.layout.state_table(spec.operator_id, spec.name)
        if uri in self._tables:
            return self._tables[uri]
        last = ctx.last_completed_epoch  # waits for epoch n-1 to complete
        table = borrow_snapshot(uri)
        if table is None:
            self._tables[uri] = None
            return None
        committed = table.transaction_version(ctx.app_id)
        if committed is not None and last is not None and committed > last:
            raise CheckpointError(
                f"state table {spec.table_name} holds epoch {committed}, newer than the last "
                f"completed epoch {last}: run recovery first"
            )
        self._tables[uri] = table
        return table

    def release(self) -> None:
        """Give the epoch's snapshots back once its files are staged: its commits, and the next epoch, bring them up to date.

        The epoch only read them, so they go back after an error too.
        """
        for uri, table in self._tables.items():
            if table is not None:
                give_back(uri, table)
        self._tables.clear()

    def _files(
        self, spec: StateSpec, touched: "DataFrame | list[int] | None", due: DueRows | None = None
    ) -> tuple[list[StateFile], int | None, "_Selection | None"]:
        """The files a read of ``spec`` covers, the rows they hold (None: unknown), and the rows to keep of them (None: all)."""
        ctx = self._ctx
        uri = ctx.layout.state_table(spec.operator_id, spec.name)
        table = self._open(spec)
        if table is None:
            return [], 0, None
        actions = add_actions(table)
        rows = actions.column("num_records").to_pylist()
        files = self._state_files(uri, actions)
        stored = counted_rows(rows)
        small = len(files) < _PRUNE_MIN_FILES or (due is not None and (stored is None or stored < _DUE_PRUNE_MIN_ROWS))
        if (touched is None and due is None) or small or f"min.{KEY_GROUP}" not in actions.column_names:
            return files, stored, None
        if due is not None and due.column not in spec.arrow_schema().names:
            raise ValueError(f"due rows of {spec.table_name} by {due.column!r}: no such column in {spec.arrow_schema().names}")
        wanted = [] if touched is None else touched if isinstance(touched, list) else ctx.touched_key_groups(touched)
        earliest = _minimums(actions, due.column) if due is not None else [None] * len(files)
        out, kept_rows = [], []
        for file, n, first in zip(files, rows, earliest):
            # File skipping on statistics: read a file only if it may hold one of the
            # key groups this epoch touches, or a row that event time has reached.
            if file.holds(wanted) or (due is not None and (first is None or first <= due.through_us)):
                out.append(file)
                kept_rows.append(n)
        return out, counted_rows(kept_rows), _Selection(wanted, due)

    def read(
        self,
        spec: StateSpec,
        touched: "DataFrame | list[int] | None" = None,
        *,
        keys: "DataFrame | None" = None,
        key_count: int | None = None,
        due: DueRows | None = None,
    ) -> "DataFrame":
        """Live rows (latest per key, not deleted, not expired) of ``spec``.

        ``touched`` (the epoch's keyed records, or the key groups they fall
        in) lets the read skip files of key groups the epoch does not touch,
        once a table has enough files for that to pay off; without it every
        key group is read. ``keys`` (the epoch's distinct keys, ``key_count``
        of them) restricts the read to those keys: stored rows are matched
        against them as they are scanned, before any shuffle, so an epoch
        that touches 1% of the keys shuffles and merges 1% of the state.
        Up to :data:`BROADCAST_KEYS` keys are sent to every task whole (and
        the rows read are then small enough to be joined the same way, see
        :func:`joinable`). When ``keys`` carry their key group, the match is
        done in the Python workers' cache of the state files instead
        (:meth:`_lookup_in_workers`), unless it is turned off or the table
        has nested columns. ``due`` adds the rows event time has reached
        (:class:`DueRows`), whatever their key group; given alone, the read
        takes only those (a table small enough is read whole either way).
        """
        files, stored, selection = self._files(spec, touched, due)
        cached = keys is not None and KEY_GROUP in keys.columns and _worker_cache_serves(spec, files)
        if key_count is not None and not worth_matching(stored, key_count, cached=cached):
            keys, cached = None, False
        if cached:
            assert keys is not None  # cached only with keys
            live = self._lookup_in_workers(spec, files, keys)
        else:
            live = self._latest(spec, [f.uri for f in files], keep_expired=False, selection=selection, keys=keys, key_count=key_count)
        return live.drop("_deleted", "_epoch")

    def lookup_files(self, spec: StateSpec, touched: list[int], key_count: int) -> list[StateFile] | None:
        """The files of ``spec`` to look ``key_count`` keys up in, in the Python workers' cache; None where :meth:`read` scans instead.

        The same choice as :meth:`read`'s for keys that carry their key group.
        """
        files, stored, _ = self._files(spec, touched)
        if _worker_cache_serves(spec, files) and worth_matching(stored, key_count, cached=True):
            return files
        return None

    def may_chain(self, spec: StateSpec, max_rows: int) -> bool:
        """Whether ``spec``'s table, as last committed, could take a chained epoch: it holds at most ``max_rows`` rows (or does not exist yet).

        Does not wait for epoch n-1 (a chained epoch reads its input first),
        nor bring the snapshot up to date (:meth:`chainable_files` does, and
        decides, once it has completed).
        """
        uri = self._ctx.layout.state_table(spec.operator_id, spec.name)
        table = borrow_snapshot(uri, current=False)
        if table is None:
            return True  # the chained epoch creates it, or epoch n-1 does
        try:
            stored = stored_rows(table)
        finally:
            give_back(uri, table)
        return stored is not None and stored <= max_rows

    def chainable_files(self, spec: StateSpec, max_rows: int) -> tuple[list[StateFile], int, tuple[str, ...], int | None] | None:
        """Every file of ``spec``'s table for a chained epoch (:mod:`barrierflow.execution.chaining`) to read; or None.

        With the files come the rows they hold, and what a compaction in the same commit removes
        and the version it is based on (``()`` and None when none is due,
        see :meth:`stage`); no files before the table's first commit. None
        (the epoch runs on Spark) when it holds more than ``max_rows``
        stored rows, has another schema than ``spec``'s or cannot be served
        by the Python workers' cache (``BARRIERFLOW_WORKER_STATE_CACHE_MB=0``).
        """
        table = self._open(spec)
        if table is None:
            return [], 0, (), None  # the epoch's commit creates it
        files, stored, _ = self._files(spec, None)
        if stored is None or stored > max_rows:
            return None
        # Nested columns too: a task looks keys up by row number (``worker_cache.live_rows_of``).
        if pa.schema(table.schema().to_arrow()) != spec.arrow_schema() or cache_limit_bytes() <= 0:
            return None
        actions = add_actions(table)
        if not _needs_compaction(actions):
            return files, stored, (), None
        return files, stored, tuple(sorted(actions.column("path").to_pylist())), table.version()

    def with_live_rows(
        self, spec: StateSpec, files: list[StateFile], rows: "DataFrame", combine: Callable[[pa.Table, pa.Table], pa.Table], schema: Any
    ) -> "DataFrame":
        """``combine(task rows, their keys' live rows)`` in the Python workers, per key-group range (:func:`combine_with_live_rows`).

        ``rows`` (key columns and :data:`KEY_GROUP`) go to the task of their
        key-group range, which looks their keys up in ``files``
        (:meth:`lookup_files`); ``combine`` runs there and returns rows of
        ``schema`` (a Spark ``StructType``). They stay in that task's range:
        stage them with ``ranged=True``.
        """
        from barrierflow.storage.staging import by_key_group_range

        wanted = by_key_group_range(rows, self._ctx.parallelism, self._ctx.key_groups)
        return wanted.mapInArrow(partial(combine_with_live_rows, self.lookup_of(spec, files), combine), schema)

    def lookup_of(self, spec: StateSpec, files: list[StateFile]) -> StateLookup:
        """What a task of :meth:`_lookup_in_workers` or :meth:`with_live_rows` needs to read ``files``."""
        ctx = self._ctx
        return StateLookup(
            files=tuple(files),
            schema=spec.arrow_schema(),
            key_columns=tuple(spec.key_columns),
            ttl_ms=spec.ttl_ms,
            processing_time_ms=ctx.processing_time_ms,
        )

    def _lookup_in_workers(self, spec: StateSpec, files: list[StateFile], keys: "DataFrame") -> "DataFrame":
        """The live rows of ``files`` for ``keys``, looked up in the Python workers' cache of state files.

        The epoch's distinct keys are sent to the task of their key-group
        range (the ranges the files are written in), which matches them
        against the rows of its range's files, read once per worker and
        kept (:mod:`barrierflow.state.worker_cache`). Same rows as the scan.
        """
        from pyspark.sql.pandas.types import from_arrow_schema

        from barrierflow.storage.staging import by_key_group_range

        ctx = self._ctx
        wanted = by_key_group_range(keys.select(*spec.key_columns, KEY_GROUP), ctx.parallelism, ctx.key_groups)
        return wanted.mapInArrow(partial(lookup_keys, self.lookup_of(spec, files)), from_arrow_schema(spec.arrow_schema()))

    def read_whole(self, spec: StateSpec, added_keys: int) -> "DataFrame | None":
        """Every live row of ``spec`` on the executors, for an epoch adding up to ``added_keys`` keys; or None.

        The rows keep ``_updated_at_ms`` and ``_epoch`` (``_deleted`` is
        dropped: all are live). They
        come from the executors' copy (:data:`resident.executors`) when it is
        exactly the table's current snapshot, else from the table's files.
        ``None`` when there is no copy and the table could hold more live
        rows after this epoch (stored rows plus ``added_keys``) than
        ``BARRIERFLOW_CACHED_STATE_ROWS``, or this process does not commit
        the epoch (an Airflow task: no later epoch here could use a copy):
        the epoch then reads only its keys (:meth:`read`) and keeps no copy.
        """
        from pyspark.sql import functions as F

        ctx = self._ctx
        uri = ctx.layout.state_table(spec.operator_id, spec.name)
        table = self._open(spec)
        snapshot = resident.Snapshot.of(table)
        live = resident.executors.lookup(uri, snapshot)
        if live is not None and live.sparkSession is not ctx.spark:
            live = None  # made in another session (a restarted engine, say): not usable here
        if live is not None:
            if spec.ttl_ms is not None:
                live = live.where(F.col("_updated_at_ms") + F.lit(spec.ttl_ms) > F.lit(ctx.processing_time_ms))
        elif not ctx.keep_state_copies:
            return None  # a task that does not commit: no later epoch here could use a copy
        elif (stored_rows(table) if table is not None else 0) + added_keys > resident.executors.max_rows():
            return None
        else:
            files = self._table_files(spec, table) if table is not None else []
            live = self._latest(spec, files, keep_expired=False).drop("_deleted")
        self._live_bases[spec.table_name] = snapshot
        return live

    def _table_files(self, spec: StateSpec, table: Any) -> list[str]:
        uri = self._ctx.layout.state_table(spec.operator_id, spec.name)
        return [join_uri(uri, p) for p in add_actions(table).column("path").to_pylist()]

    def _latest(
        self,
        spec: StateSpec,
        files: list[str],
        *,
        keep_expired: bool,
        selection: "_Selection | None" = None,
        keys: "DataFrame | None" = None,
        key_count: int | None = None,
    ) -> "DataFrame":
        """The latest row per key of ``files`` (every column), tombstones dropped; on the executors.

        A generation (the files one epoch or one compaction wrote, which share
        a directory) holds each key at most once, so files of one generation
        need no aggregation. Otherwise the rows are grouped by key: with one
        ``max_by`` per column when every column is fixed-width (Spark then
        aggregates in a hash map), else one ``max_by`` of a struct (a sort).
        """
        from pyspark.sql import functions as F

        ctx = self._ctx
        schema = spec.arrow_schema()
        df = read_parquet_files(ctx.spark, files, schema)
        if files and selection is not None:
            df = df.where(selection.condition(schema))
        key_columns = spec.key_columns
        small = key_count is not None and key_count <= BROADCAST_KEYS
        if keys is not None:
            wanted = keys.select(*key_columns)
            df = df.join(F.broadcast(wanted) if small else wanted, on=key_columns, how="left_semi")
        # The files' columns, known here: df.columns would ask the engine to analyse the plan.
        columns = schema.names
        rest = [c for c in columns if c not in key_columns]
        table_uri = ctx.layout.state_table(spec.operator_id, spec.name)
        if len(_generations(files)) <= 1 and _written_by_barrierflow(table_uri, files):
            latest = df
        elif all(_fixed_width(schema.field(c).type) for c in rest):
            latest = df.groupBy(*key_columns).agg(
                *[F.max_by(c, "_epoch").alias(c) for c in rest if c != "_epoch"], F.max("_epoch").alias("_epoch")
            )
        else:
            latest = df.groupBy(*key_columns).agg(F.max_by(F.struct(*rest), F.col("_epoch")).alias("_s")).select(*key_columns, "_s.*")
        live = latest.where(~F.col("_deleted")).select(*columns)
        if spec.ttl_ms is not None and not keep_expired:
            live = live.where(F.col("_updated_at_ms") + F.lit(spec.ttl_ms) > F.lit(ctx.processing_time_ms))
        return live

    def read_arrow(self, spec: StateSpec, key_groups: list[int]) -> pa.Table:
        """Live rows of ``spec`` in ``key_groups``, on the driver (``spec.arrow_schema()`` columns).

        For operators that merge collected rows on the driver. The rows come
        from the resident copy when it is exactly the table's current
        snapshot (:mod:`barrierflow.state.resident`), else from the table's
        files, read whole when small enough to keep resident for the next
        epoch and only for ``key_groups`` otherwise.
        """
        ctx = self._ctx
        uri = ctx.layout.state_table(spec.operator_id, spec.name)
        table = self._open(spec)
        snapshot = resident.Snapshot.of(table)
        live = resident.lookup(uri, snapshot)
        whole = True
        if live is None and table is None:
            live = spec.arrow_schema().empty_table()
        elif live is None:
            whole = stored_rows(table) <= resident.max_rows()
            selected = None if whole else pc.field(KEY_GROUP).isin(key_groups)
            stored = table.to_pyarrow_dataset().to_table(filter=selected)
            live = latest_rows(stored.select(spec.arrow_schema().names).cast(spec.arrow_schema()), spec.key_columns)
        if whole:  # the base a resident copy for the next epoch starts from
            self._bases[spec.table_name] = (snapshot, live)
        rows = live.filter(pc.is_in(live[KEY_GROUP], pa.array(key_groups, pa.int32())))
        return unexpired(rows, spec.ttl_ms, ctx.processing_time_ms)

    def stage(
        self,
        spec: StateSpec,
        changes: "DataFrame",
        *,
        live: "DataFrame | None" = None,
        live_rows: int = 0,
        constants: Mapping[str, Any] | None = None,
        ranged: bool = False,
    ) -> None:
        """Stage changed keys: ``changes`` has keys, key group, values and ``_deleted``.

        ``constants``: value columns with one value for every changed key
        (``changes`` then lacks them), written as the epoch's processing time
        and number are: by the writer, never as literals of the Spark plan.

        ``live`` (after :meth:`read_whole`): every live row after this epoch,
        ``live_rows`` of them, materialized on the executors with
        ``_updated_at_ms`` and ``_epoch``. It becomes the executors' copy for
        the next epoch once this one commits, and a compaction writes it
        rather than reading the table again.

        Executors write the rows, clustered by key group; the driver gets
        file descriptions only. ``ranged``: ``changes`` already lie in the
        tasks of their key-group ranges (:meth:`with_live_rows`), so the
        write needs no shuffle. When the table's changelog has outgrown its
        compacted base (:func:`needs_compaction`), the epoch compacts it in
        the same commit: executors write every live key once (this epoch's
        changes applied, tombstones and expired rows dropped; one Python task
        does it for a small table, :meth:`_compacts_in_a_task`) and the commit
        removes every file of the snapshot the epoch read. A concurrent
        writer cannot slip in between: the commit refuses removes that are
        no longer live.
        """
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_type

        ctx = self._ctx
        table = self._open(spec)
        written = {**(constants or {}), "_updated_at_ms": ctx.processing_time_ms, "_epoch": ctx.epoch}
        rows = changes.select(
            *spec.key_columns,
            F.col(KEY_GROUP).cast("int").alias(KEY_GROUP),
            *[c for c in spec.value_columns if c not in written],
            F.col("_deleted").cast("boolean"),
        )
        removes: tuple[str, ...] = ()
        base_version = None
        prefix = None
        actions = add_actions(table) if table is not None else None
        uri = ctx.layout.state_table(spec.operator_id, spec.name)
        if live is not None:
            resident.executors.stage(uri, self._live_bases[spec.table_name], ctx.attempt_id, live, live_rows)
        compacting = None
        if actions is not None and _needs_compaction(actions):
            # The commit removes every file of the snapshot and adds the live rows, rewritten.
            removes = tuple(sorted(actions.column("path").to_pylist()))
            base_version = table.version()
            prefix = f"{ctx.staging_prefix}/{COMPACTED_DIR}"
        if removes and live is None and self._compacts_in_a_task(actions):
            # A small table: one Python task merges the changes into its live rows.
            compacting = self.lookup_of(spec, self._state_files(uri, actions))
        elif removes:
            # The changes meet stored rows, which have their own values of these columns.
            types = spec.arrow_schema()
            rows = rows.select(
                "*", *[F.lit(v).cast(from_arrow_type(types.field(c).type)).alias(c) for c, v in written.items()]
            ).select(*types.names)
            written = {}
            keys = spec.key_columns
            if live is not None:
                rows = live.select(*[F.lit(False).alias(c) if c == "_deleted" else F.col(c) for c in rows.columns])
            else:
                stored = self._latest(spec, self._table_files(spec, table), keep_expired=False)
                kept = stored.join(rows.select(*keys), on=keys, how="left_anti")
                rows = kept.select(*rows.columns).unionByName(rows.where(~F.col("_deleted")))
        ctx.stage(
            name=spec.table_name,
            uri=uri,
            kind=TableKind.STATE,
            data=rows,
            schema=spec.arrow_schema(),
            by_key_group=True,
            removes=removes,
            base_version=base_version,
            primary_key=tuple(spec.key_columns),
            prefix=prefix,
            constants=written,
            ranged=ranged and not removes,  # a compaction's rows are a union: not in ranges
            compacting=compacting,
        )

    def _compacts_in_a_task(self, actions: pa.Table) -> bool:
        """Whether a compaction due this epoch of the table with ``actions`` runs in one Python task (:func:`~barrierflow.storage.staging.stage_compaction`).

        When its stored rows and the epoch's input rows (which bound its
        changes) are at most :data:`TASK_COMPACTION_ROWS` together: a
        compaction planned on Spark costs a scan, an aggregation, an
        anti-join and a repartition, each with its shuffle and tasks,
        however few the rows.
        """
        stored = counted_rows(actions.column("num_records").to_pylist())
        epoch_rows = self._ctx.rows_read
        return stored is not None and epoch_rows is not None and stored + epoch_rows <= TASK_COMPACTION_ROWS

    def _state_files(self, uri: str, actions: pa.Table) -> list[StateFile]:
        """The snapshot's files as the Python workers' cache reads them."""
        paths = actions.column("path").to_pylist()
        sizes = actions.column("size_bytes").to_pylist()
        with_stats = f"min.{KEY_GROUP}" in actions.column_names
        lows = actions.column(f"min.{KEY_GROUP}").to_pylist() if with_stats else [None] * len(paths)
        highs = actions.column(f"max.{KEY_GROUP}").to_pylist() if with_stats else [None] * len(paths)
        return [StateFile(join_uri(uri, p), size, low, high) for p, size, low, high in zip(paths, sizes, lows, highs)]

    def stage_arrow(self, spec: StateSpec, data: pa.Table) -> None:
        """Stage state rows merged on the driver (the heap backend), in :meth:`StateSpec.arrow_schema` form.

        If :meth:`read_arrow` read the whole table, the live rows after this
        epoch stay resident, pending its commit.
        """
        ctx = self._ctx
        ctx.restore_point()
        uri = ctx.layout.state_table(spec.operator_id, spec.name)
        base = self._bases.get(spec.table_name)
        if base is not None:
            snapshot, live = base
            # Joined on the keys and a row number only: Arrow's join carries no nested (list, struct) columns.
            numbered = live.select(spec.key_columns).append_column("_row", pa.array(range(live.num_rows), pa.int64()))
            kept = numbered.join(data.select(spec.key_columns), keys=spec.key_columns, join_type="left anti")
            unchanged = live.take(kept["_row"])
            changed = data.filter(pc.invert(data["_deleted"]))
            resident.stage(uri, snapshot, ctx.attempt_id, pa.concat_tables([unchanged.select(data.schema.names), changed]))
        ctx.stage(
            name=spec.table_name,
            uri=uri,
            kind=TableKind.STATE,
            data=data,
            by_key_group=True,
            primary_key=tuple(spec.key_columns),
        )


def joinable(rows: "DataFrame", key_count: int) -> "DataFrame":
    """``rows`` read for ``key_count`` keys, hinted for a broadcast join when that is few enough.

    Spark estimates a filtered read at the size of the whole table, so it
    would shuffle both sides of the join; at most one row per key is small.
    """
    from pyspark.sql import functions as F

    return F.broadcast(rows) if key_count <= BROADCAST_KEYS else rows


def live_row_chunks(table: Any, key_columns: list[str], *, max_rows: int = CHUNK_ROWS) -> Iterator[pa.Table]:
    """The live rows of a state table snapshot, one range of key groups at a time.

    For passes over a whole table outside an epoch (savepoint, restore,
    maintenance compaction): every key lies in one key group, so the latest
    row per key is found within its range, and the driver holds about
    ``max_rows`` stored rows at once (files are clustered by key group, so a
    range's read skips the other files and row groups on their statistics).
    Ranges come in ascending key-group order; empty ones are skipped.
    """
    actions = add_actions(table)
    stored = sum(n or 0 for n in actions.column("num_records").to_pylist())
    dataset = table.to_pyarrow_dataset()
    lows = actions.column(f"min.{KEY_GROUP}").to_pylist() if f"min.{KEY_GROUP}" in actions.column_names else []
    highs = actions.column(f"max.{KEY_GROUP}").to_pylist() if f"max.{KEY_GROUP}" in actions.column_names else []
    if stored <= max_rows or not lows or None in lows or None in highs:
        yield latest_rows(dataset.to_table(), key_columns)
        return
    low, high = min(lows), max(highs) + 1
    chunks = min(math.ceil(stored / max_rows), high - low)
    bounds = [low + (high - low) * i // chunks for i in range(chunks + 1)]
    for start, end in zip(bounds, bounds[1:]):
        selected = (pc.field(KEY_GROUP) >= start) & (pc.field(KEY_GROUP) < end)
        live = latest_rows(dataset.to_table(filter=selected), key_columns)
        if live.num_rows:
            yield live


def stored_batches(table: Any, *, max_rows: int = CHUNK_ROWS) -> Iterator[pa.Table]:
    """Every stored row of a table snapshot, at most about ``max_rows`` at a time."""
    pending: list[pa.RecordBatch] = []
    held = 0
    for batch in table.to_pyarrow_dataset().to_batches():
        pending.append(batch)
        held += batch.num_rows
        if held >= max_rows:
            yield pa.Table.from_batches(pending)
            pending, held = [], 0
    if pending:
        yield pa.Table.from_batches(pending)


def needs_compaction(uri: str) -> bool:
    """Whether the state table at ``uri`` should be compacted (:func:`_needs_compaction`).

    Through this process's latest snapshot: called right after the epoch's
    commit, which left it one listing away from current.
    """
    with latest_snapshot(uri) as table:
        return table is not None and _needs_compaction(add_actions(table))


def _generations(paths: list[str]) -> set[str]:
    """The directories of ``paths``: one per generation (see :func:`_needs_compaction`)."""
    return {path.rsplit("/", 1)[0] if "/" in path else "" for path in paths}


def _written_by_barrierflow(table_uri: str, paths: list[str]) -> bool:
    """Whether every file lies in a directory barrierflow writes (``_staging``, ``_compacted``, ``_restored``).

    Only those hold each key at most once per directory; another writer
    (a ``DELETE`` by delta-rs or Spark, say) may rewrite rows of several
    generations into one file at the table's root.
    """
    prefix = table_uri.rstrip("/") + "/"
    return all(p.startswith(prefix) and p[len(prefix) :].startswith("_") and "/" in p[len(prefix) :] for p in paths)


def _worker_cache_serves(spec: StateSpec, files: list[StateFile]) -> bool:
    """Whether the Python workers' cache can serve a read of ``files`` (it is on, and ``spec``'s columns are all scalars)."""
    return bool(files) and _cacheable(spec) and cache_limit_bytes() > 0


def _cacheable(spec: StateSpec) -> bool:
    """Whether every column of ``spec`` is a scalar Arrow's hash join carries (no lists or structs)."""
    return all(not pa.types.is_nested(f.type) for f in spec.arrow_schema())


def _fixed_width(data_type: pa.DataType) -> bool:
    return pa.types.is_integer(data_type) or pa.types.is_floating(data_type) or pa.types.is_boolean(data_type)


def _needs_compaction(actions: pa.Table) -> bool:
    """Size-tiered policy: compact once the changelog outgrows the compacted base.

    Files written together (one epoch's changes, or one compaction) share a
    directory: a generation. The base is the largest generation (the last
    compaction, or the first epoch's bulk load); later epochs add small
    ones. Reads stay within ~2x the live rows, and compaction's full rewrite
    is amortised over many epochs when few keys change. More than
    :data:`_MAX_FILES` files are compacted whatever their row counts.
    """
    paths = actions.column("path").to_pylist()
    rows = [n or 0 for n in actions.column("num_records").to_pylist()]
    generations: dict[str, int] = {}
    for path, n in zip(paths, rows):
        directory = path.rsplit("/", 1)[0] if "/" in path else ""
        generations[directory] = generations.get(directory, 0) + n
    if len(generations) <= 1:
        return False
    return len(paths) > _MAX_FILES or sum(rows) > 2 * max(generations.values())


def compact(spec: StateSpec, uri: str, app: str, epoch: int, attempt_id: str) -> int | None:
    """Rewrite a state table to one live row per key; returns the new version.

    A maintenance commit (``dataChange=false``) without an app transaction:
    the logical content is unchanged, so readers and the consistent cut are
    unaffected. Called between epochs, under the pipeline's epoch lease.
    """
    with latest_snapshot(uri) as table:
        return None if table is None else _compact(spec, uri, table, epoch, attempt_id)


def _compact(spec: StateSpec, uri: str, table: Any, epoch: int, attempt_id: str) -> int | None:
    """:func:`compact` on ``table``, the latest snapshot of the table at ``uri``."""
    from deltalake import CommitProperties
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import AddAction, RemoveAction

    from barrierflow.storage.delta import live_paths
    from barrierflow.storage.staging import write_parquet

    paths = sorted(live_paths(table))
    if len(paths) <= 1:
        return None
    before = resident.Snapshot.of(table)
    live = resident.lookup(uri, before)
    chunks = [live] if live is not None else live_row_chunks(table, spec.key_columns)
    staged = []
    for chunk in chunks:  # ascending key-group ranges: the files stay clustered
        compacted = chunk.select(spec.arrow_schema().names).cast(spec.arrow_schema())
        staged += write_parquet(uri, f"{COMPACTED_DIR}/{epoch:010d}-{attempt_id}", compacted, sort_by=(KEY_GROUP,))
    now = time.time_ns() // 1_000_000
    actions: list[Any] = [
        AddAction(path=f.path, size=f.size, partition_values={}, modification_time=now, data_change=False, stats=f.stats)
        for f in staged
    ]
    actions += [RemoveAction(path=p, data_change=False, deletion_timestamp=now) for p in paths]
    try:
        table.create_write_transaction(
            actions,
            mode="append",
            schema=table.schema(),
            commit_properties=CommitProperties(
                custom_metadata={"barrierflow.operation": "compact", "barrierflow.after_epoch": epoch},
                max_commit_retries=0,
            ),
        )
    except CommitFailedError:
        return None  # someone else moved the table; compaction is best effort
    # No retries (``max_commit_retries=0``): the commit is the version after the snapshot's.
    version = table.version() + 1
    resident.advance(uri, before, version)
    return version


def worth_matching(stored_rows: int | None, key_count: int, *, cached: bool = False) -> bool:
    """Whether a state read should be matched against the epoch's ``key_count`` keys.

    While scanning: only when the files read hold over
    :data:`_MATCH_KEYS_MIN_ROWS` rows and over four per key (or their count
    is unknown); below that the match costs a broadcast job and saves less
    than it costs. In the workers' cache (``cached``): once the files hold
    over :data:`_LOOKUP_MIN_ROWS` rows and more rows than there are keys,
    since the scan it replaces (every stored row read and aggregated every
    epoch) grows with the state and the lookup only with the keys. Results
    are the same either way.
    """
    if stored_rows is None:
        return True
    if cached:
        return stored_rows > max(_LOOKUP_MIN_ROWS, key_count)
    return stored_rows > max(_MATCH_KEYS_MIN_ROWS, 4 * key_count)


@dataclass(frozen=True)
class _Selection:
    """The rows a pruned read keeps of the files it reads: those of ``key_groups``, and the ``due`` ones."""

    key_groups: list[int]
    due: DueRows | None

    def condition(self, schema: pa.Schema) -> Any:
        from pyspark.sql import functions as F

        keep = F.col(KEY_GROUP).isin(self.key_groups) if self.key_groups else F.lit(False)
        if self.due is not None:
            column = F.col(self.due.column)
            if pa.types.is_timestamp(schema.field(self.due.column).type):
                column = F.unix_micros(column)
            keep = keep | (column <= F.lit(self.due.through_us))
        return keep


def _minimums(actions: pa.Table, column: str) -> list[int | None]:
    """Each file's smallest ``column`` value in microseconds (a timestamp's, or the integer), None where unknown."""
    name = f"min.{column}"
    if name not in actions.column_names:
        return [None] * actions.num_rows
    values = actions.column(name)
    if pa.types.is_timestamp(values.type):
        values = values.cast(pa.timestamp("us", tz=values.type.tz)).cast(pa.int64())
    return [None if v is None else int(v) for v in values.to_pylist()]

