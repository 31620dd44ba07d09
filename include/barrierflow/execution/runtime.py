"""Process + pre-commit of one epoch: the PySpark job behind a barrier.

Reads exactly the records between barrier n-1 and barrier n, restores the
keyed state it needs as of the last completed epoch, runs the operators,
stages every table's files (invisible) and writes the manifest put-if-absent.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, Callable, Mapping

import pyarrow as pa

from barrierflow.checkpointing.checkpoint import Barrier, CheckpointRecord, Manifest, StagedFile, TableCommit, TableKind, app_id
from barrierflow.connectors.delta_sink import DEAD_LETTER_SCHEMA, DeltaSink
from barrierflow.connectors.source import planned_bytes
from barrierflow.core import faults
from barrierflow.core.errors import CheckpointError, FencedError, PipelineDefinitionError
from barrierflow.execution.chained_region import chained_region, run_region
from barrierflow.execution.chaining import chain_of, run_chained
from barrierflow.execution.spark import describe_jobs, observation_done
from barrierflow.operators.key_check import split_computed_keys
from barrierflow.operators.operator_state import stage_source_offsets
from barrierflow.operators.watermark import combined_watermark
from barrierflow.plan.pipeline import Node, Pipeline, SourceNode
from barrierflow.state import resident
from barrierflow.state.delta_backend import DeltaStateBackend
from barrierflow.state.spec import KEY_GROUP
from barrierflow.storage import objects
from barrierflow.storage.delta import schema_json_of
from barrierflow.storage.layout import PipelineLayout
from barrierflow.storage.staging import stage_compaction, stage_frame, with_constants, write_parquet

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from barrierflow.state.worker_cache import StateLookup

__all__ = [
    "EpochContext", "Compute", "process_epoch", "completed_future", "check_follows", "epoch_parallelism", "wait_for_releases",
]

_log = logging.getLogger(__name__)

# Operators of independent branches run as concurrent Spark jobs (one thread
# each). Most of a small epoch's time is per-job latency (planning, scheduling,
# the round trip to the engine), which branches overlap; a big epoch's jobs
# share the executors as any concurrent jobs do.
MAX_CONCURRENT_OPERATORS = 4
# Epochs of at most this many input lines write each table from one task.
SINGLE_TASK_ROWS = 20_000
# A bigger epoch gets a shuffle partition per this many bytes of planned input
# when that is more than the pipeline's parallelism: a bulk load run at the
# parallelism of steady epochs aggregates and spills partitions too big for
# one task's memory (16M keys at parallelism 2 exhausted a 1 GiB driver).
INPUT_BYTES_PER_PARTITION = 32 * 1024 * 1024


def epoch_parallelism(parallelism: int, input_bytes: int) -> int:
    """The epoch's shuffle partitions: the pipeline's parallelism, more for big input."""
    return max(parallelism, -(-input_bytes // INPUT_BYTES_PER_PARTITION))


# The shuffle partitions are a session setting, and epochs overlap on one
# session (the next epoch reads its input while this one computes): the
# session holds the largest parallelism among the epochs computing on it, so
# a small epoch never shrinks a bulk epoch's shuffles mid-way.
_computing_lock = threading.Lock()
_computing: dict[int, list[int]] = {}  # id(session) -> parallelism of each epoch computing on it


def _set_shuffle_partitions(spark: "SparkSession", parallelism: int, computing: bool) -> None:
    with _computing_lock:
        epochs = _computing.setdefault(id(spark), [])
        if computing:
            epochs.append(parallelism)
        else:
            epochs.remove(parallelism)
        if epochs:
            spark.conf.set("spark.sql.shuffle.partitions", str(max(epochs)))
        else:
            del _computing[id(spark)]


class EpochContext:
    """Everything an operator may use while computing one epoch.

    The epoch builds on the completed checkpoint of epoch n-1, handed in as
    a future: with two concurrent checkpoints, epoch n starts reading its
    input while epoch n-1 still commits. Everything that depends on n-1
    (state, sinks' tables, the previous watermark, the vote) goes through
    :meth:`restore_point`, which waits for it.
    """

    def __init__(
        self,
        spark: "SparkSession",
        layout: PipelineLayout,
        pipeline: Pipeline,
        barrier: Barrier,
        restore_point: "Future[CheckpointRecord | None]",
        on_restore: Callable[[], None] | None = None,
        keep_state_copies: bool = False,
    ) -> None:
        self.spark = spark
        self.layout = layout
        self.pipeline = pipeline
        self.barrier = barrier
        self.epoch = barrier.epoch
        self.attempt_id = uuid.uuid4().hex[:12]  # per process attempt: unique staging names
        self.app_id = app_id(pipeline.name, barrier.lineage_id)
        self.key_groups = pipeline.key_groups
        # Results never depend on it (state is split by key group, not partition).
        self.parallelism = epoch_parallelism(pipeline.parallelism, planned_bytes(barrier.end_offsets))
        self.processing_time_ms = barrier.processing_time_ms
        # Whether this process commits the epoch itself (the CLI loop), so a
        # copy of state kept for the next epoch can ever be used.
        self.keep_state_copies = keep_state_copies
        self._restore_point = restore_point
        self._on_restore = on_restore
        self._restored = False
        self._last_completed: CheckpointRecord | None = None
        self._max_event_time_us: int | None = None
        self._watermark_us: int | None = None
        self._assigner_watermarks: dict[str, int | None] = {}
        self.staging_prefix = ""
        # Phase times (ms): waiting for epoch n-1 to complete, and for staged writes after computing.
        self.wait_ms = 0
        self.stage_ms = 0
        # The epoch's input records and dead letters, once every source has
        # counted them before the operators run (None: not known up front).
        self.rows_read: int | None = None
        # Operators of independent branches run in threads (see _apply_operators).
        self._lock = threading.RLock()
        self._node = threading.local()
        self._staging: dict[str, tuple[tuple[int, int], str, Future[TableCommit]]] = {}
        self.state = DeltaStateBackend(self)
        self._persisted: list["DataFrame"] = []
        # id -> frame: frames cached this epoch, and views of them (see cached_view).
        self._cached: dict[int, "DataFrame"] = {}
        self._frames: dict[int, tuple[pa.Table, "DataFrame"]] = {}
        self._touched: dict[int, tuple["DataFrame", list[int]]] = {}
        # Each source's files by their index in ``_seq`` and the sources read unordered (without
        # ``_seq``), for dead letters found before keyed operators (operators.key_check).
        self.source_files: dict[int, tuple[str, ...]] = {}
        self.unordered_sources: set[str] = set()
        self._key_dead_letters: list[tuple[tuple[int, int], "DataFrame", bool]] = []
        # Run by release(): e.g. deleting a chained region's exchange files, read until the tables are staged.
        self._on_release: list[Callable[[], None]] = []

    # -- the completed checkpoint this epoch builds on ------------------------

    def restore_point(self) -> CheckpointRecord | None:
        """The completed checkpoint of epoch n-1 (None before the first); waits until it completed.

        The first call ends the epoch's state-independent work: ``on_restore``
        tells the coordinator, which may then inject the next barrier.
        """
        with self._lock:
            if not self._restored:
                if self._on_restore is not None:
                    self._on_restore()
                waiting = time.monotonic()
                record = self._restore_point.result()
                self.wait_ms += int((time.monotonic() - waiting) * 1000)
                _log.info("epoch %d: restore point after %.0f ms", self.epoch, (time.monotonic() - waiting) * 1000)
                check_follows(self.epoch, record)
                self._last_completed = record
                self._max_event_time_us = record.max_event_time_us if record else None
                self._watermark_us = record.watermark_us if record else None
                self._restored = True
            return self._last_completed

    @property
    def last_completed_epoch(self) -> int | None:
        record = self.restore_point()
        return record.epoch if record else None

    @property
    def watermark_prev_us(self) -> int | None:
        """W(n-1), the watermark at the start of this epoch."""
        record = self.restore_point()
        return record.watermark_us if record else None

    @property
    def max_event_time_us(self) -> int | None:
        self.restore_point()
        return self._max_event_time_us

    @property
    def watermark_us(self) -> int | None:
        """W(n) as observed so far in this epoch."""
        self.restore_point()
        return self._watermark_us

    # -- helpers for operators ----------------------------------------------

    def persist(self, df: "DataFrame") -> "DataFrame":
        """Cache a frame read more than once (parsing and state reads run once).

        A frame that is already cached, or a view of one (:meth:`cached_view`),
        is returned as it is: a second cache of the same rows would cost
        building and reading it and save nothing.
        """
        from pyspark import StorageLevel

        if self.is_cached(df):
            return df
        df = df.persist(StorageLevel.MEMORY_AND_DISK)
        self._persisted.append(df)
        return self.cached_view(df)

    def cached_view(self, df: "DataFrame") -> "DataFrame":
        """Mark ``df``, a projection or filter of a frame this epoch cached, as needing no cache of its own.

        Operators return such views (their output is computed once whatever
        reads it), so a watermark or a fan-out to several operators does not
        cache it again.
        """
        self._cached[id(df)] = df  # the reference keeps the id from being reused
        return df

    def is_cached(self, df: "DataFrame") -> bool:
        """Whether ``df`` is a frame this epoch cached, or a view of one (:meth:`cached_view`)."""
        return self._cached.get(id(df)) is df

    def add_key_dead_letters(self, node: Node, index: int, rows: "DataFrame", probe: bool) -> None:
        """Dead letters of input ``index`` of ``node``: rows whose computed key is null or empty (:mod:`barrierflow.operators.key_check`).

        ``probe``: the rows lack their file and line (an unordered read), so
        any of them means the epoch is computed again with ordered reads.
        """
        with self._lock:
            position = next(i for i, n in enumerate(self.pipeline.nodes) if n is node)
            self._key_dead_letters.append(((position, index), rows, probe))

    def key_dead_letters(self) -> list[tuple["DataFrame", bool]]:
        """What :meth:`add_key_dead_letters` got, in pipeline order (whatever order concurrent operators ran in)."""
        with self._lock:
            return [(rows, probe) for _, rows, probe in sorted(self._key_dead_letters, key=lambda entry: entry[0])]

    def track(self, *frames: "DataFrame") -> None:
        """Release these (already persisted) frames at the end of the epoch."""
        self._persisted.extend(frames)

    def touched_key_groups(self, keyed: "DataFrame") -> list[int]:
        """The key groups among ``keyed``'s rows: one small job per frame and epoch, whatever number of state tables it reads."""
        with self._lock:
            entry = self._touched.get(id(keyed))
        if entry is None or entry[0] is not keyed:
            entry = (keyed, sorted(r[0] for r in keyed.select(KEY_GROUP).distinct().collect()))
            with self._lock:
                self._touched[id(keyed)] = entry
        return entry[1]

    def arrow_schema(self, df: "DataFrame") -> pa.Schema:
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = to_arrow_schema(df.schema, timezone="UTC", prefers_large_types=False)
        # Delta timestamps are UTC instants; make the zone explicit.
        return pa.schema(
            [
                pa.field(f.name, pa.timestamp("us", tz="UTC"), f.nullable) if pa.types.is_timestamp(f.type) else f
                for f in schema
            ]
        )

    def arrow_types(self, df: "DataFrame", columns: tuple[str, ...]) -> dict[str, pa.DataType]:
        # The frame's own schema: PySpark caches it on the frame, and operators
        # of sibling branches share their input frame (one analysis, not one each).
        schema = self.arrow_schema(df)
        missing = [name for name in columns if schema.get_field_index(name) < 0]
        if missing:
            raise PipelineDefinitionError(f"column(s) {missing} are not in the input; it has {schema.names}")
        return {name: schema.field(name).type for name in columns}

    def to_arrow(self, df: "DataFrame", schema: pa.Schema) -> pa.Table:
        table = df.toArrow()
        if table.num_rows == 0 and table.num_columns == 0:
            return schema.empty_table()
        return table.select(schema.names).cast(schema)

    def frame(self, rows: "DataFrame | pa.Table") -> "DataFrame":
        """``rows`` as a Spark frame; an Arrow table is converted once per epoch."""
        if not isinstance(rows, pa.Table):
            return rows
        with self._lock:
            entry = self._frames.get(id(rows))
            if entry is None or entry[0] is not rows:
                entry = (rows, self.spark.createDataFrame(rows))
                self._frames[id(rows)] = entry
            return entry[1]

    def observe_event_time(self, max_us: int | None, out_of_orderness_us: int) -> None:
        """Advance W(n) = max event time so far - out-of-orderness."""
        self.restore_point()
        with self._lock:
            if max_us is not None:
                self._max_event_time_us = max(max_us, self._max_event_time_us or max_us)
            if self._max_event_time_us is not None:
                self._watermark_us = self._max_event_time_us - out_of_orderness_us

    def observe_assigner(self, assigner_id: str, max_us: int | None, out_of_orderness_us: int) -> None:
        """One of several assigners' maximum event time so far (see :mod:`barrierflow.operators.watermark`).

        W(n) is the minimum of the assigners' watermarks once every assigner
        of the pipeline has reported (event-time operators run after all of them).
        """
        self.restore_point()
        with self._lock:
            self._assigner_watermarks[assigner_id] = None if max_us is None else max_us - out_of_orderness_us
            if max_us is not None:
                self._max_event_time_us = max(max_us, self._max_event_time_us or max_us)
            complete, watermark = combined_watermark(self._assigner_watermarks, self.pipeline.watermark_assigner_ids())
            if complete:
                self._watermark_us = watermark

    def emit(self, name: str, df: "DataFrame") -> None:
        """A side output (e.g. late records), committed as an append sink."""
        DeltaSink.append(name).pre_commit(self, df)

    def stage(
        self,
        *,
        name: str,
        uri: str,
        kind: TableKind,
        data: "DataFrame | pa.Table",
        schema: pa.Schema | None = None,
        sort_by: tuple[str, ...] = (),
        by_key_group: bool = False,
        removes: tuple[str, ...] = (),
        base_version: int | None = None,
        primary_key: tuple[str, ...] = (),
        prefix: str | None = None,
        constants: Mapping[str, Any] | None = None,
        table_schema: pa.Schema | None = None,
        ranged: bool = False,
        compacting: "StateLookup | None" = None,
    ) -> None:
        """Write a table's share of the epoch under the staging prefix, in the background.

        A Spark frame is written by the executors (:func:`stage_frame`; the
        driver gets file descriptions only), clustered by key group if
        ``by_key_group``; ``schema`` is the files' schema (the frame's own if
        omitted). A ``pyarrow.Table`` (rows an operator already holds) is
        written here. Either way the write runs while the epoch goes on;
        :meth:`commits` waits for it. ``prefix`` is a directory inside the
        staging prefix (deleted with it on abort); the staging prefix itself
        by default. ``constants`` are columns of ``schema`` with one value in
        every row, added by the writer (see :func:`stage_frame`); ``data``
        lacks them. ``table_schema``: a sink widening's new table schema
        (``data`` then holds the table's stored rows too, and ``removes`` is
        every live file; see :class:`TableCommit`). ``ranged``: with
        ``by_key_group``, ``data`` already lies in the tasks of its key-group
        ranges (:func:`stage_frame`). ``compacting``: a small state table's
        snapshot files, compacted with ``data`` (its changes) in one task
        (:func:`~barrierflow.storage.staging.stage_compaction`); ``removes`` are then
        those files.
        """
        prefix = prefix or self.staging_prefix
        if not prefix.startswith(self.staging_prefix):
            raise CheckpointError(f"table {name} staged outside the attempt's staging directory: {prefix}")
        if isinstance(data, pa.Table):
            file_schema = schema or data.schema
        else:
            file_schema = schema or self.arrow_schema(data)
        parallelism, key_groups = self.parallelism, self.key_groups
        # A small epoch's own rows are written by one task per table: on a
        # few thousand rows a shuffle and a task per partition cost more than
        # the write. Rewrites of stored files (``removes``) keep the parallelism.
        tasks = 1 if not removes and self.rows_read is not None and self.rows_read <= SINGLE_TASK_ROWS else None

        def write() -> TableCommit:
            describe_jobs(self.spark, f"epoch {self.epoch}: stage {name}")
            if isinstance(data, pa.Table):
                table = with_constants(data, constants or {}, file_schema)
                files = write_parquet(uri, prefix, table, sort_by=(KEY_GROUP,) if by_key_group else sort_by)
            elif compacting is not None:
                files = stage_compaction(
                    data, compacting, uri, prefix, partitions=parallelism, key_groups=key_groups, constants=constants
                )
            else:
                files = stage_frame(
                    data,
                    uri,
                    prefix,
                    file_schema,
                    partitions=parallelism,
                    sort_by=sort_by,
                    key_groups=key_groups if by_key_group else None,
                    tasks=tasks,
                    constants=constants,
                    ranged=ranged,
                )
            return TableCommit(
                name=name,
                uri=uri,
                kind=kind,
                schema_json=schema_json_of(file_schema),
                partition_by=(),
                adds=tuple(files),
                removes=removes,
                base_version=base_version,
                primary_key=primary_key,
                table_schema_json=schema_json_of(table_schema) if table_schema is not None else None,
            )

        self._register(name, uri, _staging_pool().submit(write))

    def stage_files(
        self,
        *,
        name: str,
        uri: str,
        kind: TableKind,
        files: "Future[list[StagedFile]]",
        schema: pa.Schema,
        primary_key: tuple[str, ...] = (),
        removes: tuple[str, ...] = (),
        base_version: int | None = None,
    ) -> None:
        """A table's share of the epoch, written under the staging prefix by a task of the caller's (``files``, once it has).

        Registered before the task writes, so that an error aborts the
        table's staging directory as for :meth:`stage` (whose ``removes``
        and ``base_version`` these are).
        """
        commit: Future[TableCommit] = Future()

        def described(done: "Future[list[StagedFile]]") -> None:
            error = done.exception()
            if error is not None:
                commit.set_exception(error)
                return
            commit.set_result(
                TableCommit(
                    name=name, uri=uri, kind=kind, schema_json=schema_json_of(schema), partition_by=(),
                    adds=tuple(sorted(done.result(), key=lambda f: f.path)), removes=removes, base_version=base_version,
                    primary_key=primary_key,
                )
            )

        files.add_done_callback(described)
        self._register(name, uri, commit)

    def _register(self, name: str, uri: str, commit: "Future[TableCommit]") -> None:
        with self._lock:
            if name in self._staging:
                raise CheckpointError(f"table {name} staged twice in epoch {self.epoch}")
            # Pipeline order, whatever order concurrent branches staged in: the
            # manifest (and so the commit order) does not depend on thread timing.
            node_index = getattr(self._node, "index", len(self.pipeline.nodes))
            order = (node_index, sum(1 for key, *_ in self._staging.values() if key[0] == node_index))
            self._staging[name] = (order, uri, commit)

    def run_as(self, node_index: int) -> None:
        """Mark the calling thread as running the pipeline's node ``node_index``."""
        self._node.index = node_index

    def commits(self) -> dict[str, TableCommit]:
        """Every table staged so far, in pipeline order; waits for files still being written."""
        waiting = time.monotonic()
        ordered = sorted(self._staging.items(), key=lambda item: item[1][0])
        done = {name: future.result() for name, (_, _, future) in ordered}
        self.stage_ms += int((time.monotonic() - waiting) * 1000)
        return done

    def discard_staged(self) -> None:
        """Delete this attempt's staged files, once writes in flight have ended."""
        for _, uri, future in self._staging.values():
            wait([future])
            DeltaSink.abort(uri, self.staging_prefix)
        self._staging.clear()

    def release(self) -> None:
        """Drop the epoch's caches; give its snapshots of the state tables back (:meth:`DeltaStateBackend.release`).

        Each unpersist is a round trip in which the engine analyses the
        cached plan again (tens to hundreds of milliseconds on a busy
        engine). In the run loop (``keep_state_copies``) they run after the
        vote, in the background, instead of delaying it; the loop waits for
        them before it returns (:func:`wait_for_releases`), and a second
        attempt at the same epoch waits for them first (its frames may have
        the same plans, and a late unpersist would drop its caches).
        Elsewhere (an Airflow task, which ends with ``os._exit``: a pending
        unpersist would be lost and the cache left on a shared engine) they
        run here.
        """
        callbacks = list(reversed(self._on_release))
        self._on_release.clear()
        if self._persisted and self.keep_state_copies:
            with _pool_lock:
                _unpersisting[(self.app_id, self.epoch)] = _releases.submit(_unpersist_all, self.epoch, list(self._persisted), callbacks)
        else:
            _unpersist_all(self.epoch, self._persisted, callbacks)
        self._persisted.clear()
        self._cached.clear()
        self._frames.clear()
        self.state.release()

    def on_release(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the epoch's caches are released (e.g. delete files its frames read until then)."""
        self._on_release.append(callback)


_pool: ThreadPoolExecutor | None = None
# One thread: releases are cleanup and may wait; no thread starts before the first.
_releases = ThreadPoolExecutor(max_workers=1, thread_name_prefix="barrierflow-release")
# (pipeline and lineage, epoch) -> the unpersists of the epoch's last attempt in this process
_unpersisting: dict[tuple[str, int], Future[None]] = {}
_pool_lock = threading.Lock()


def _after_releases(app_id: str, epoch: int) -> None:
    """Wait for the unpersists of an earlier attempt at ``epoch`` in this process (see :meth:`EpochContext.release`)."""
    with _pool_lock:
        pending = _unpersisting.pop((app_id, epoch), None)
        for done in [e for e, future in _unpersisting.items() if future.done()]:
            del _unpersisting[done]
    if pending is not None:
        pending.result()


def wait_for_releases() -> None:
    """Wait until every epoch's caches released in the background are gone (see :meth:`EpochContext.release`)."""
    with _pool_lock:
        pending = list(_unpersisting.values())
        _unpersisting.clear()
    wait(pending)


def _unpersist_all(epoch: int, frames: list["DataFrame"], then: list[Callable[[], None]] = []) -> None:  # noqa: B006 - never mutated
    # Newest first: a frame cached from another is released before it. Spark
    # rebuilds (plans again) every cached frame still built on one it uncaches.
    for done, df in enumerate(reversed(frames)):
        try:
            df.unpersist()
        except Exception as exc:  # noqa: BLE001 - the epoch's outcome stands either way
            # Most likely the engine is gone, and its caches with it: each further call
            # would only wait out the client's retries (about 20 s) again.
            _log.warning("epoch %d: releasing its cached frames failed, %d left as they are: %s", epoch, len(frames) - done, exc)
            break
    for callback in then:
        try:
            callback()
        except Exception as exc:  # noqa: BLE001 - as above
            _log.warning("epoch %d: after releasing its cached frames: %s", epoch, exc)


def _staging_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:  # two epochs may stage at once
        if _pool is None:
            # Each write of a frame is a Spark job; concurrent jobs overlap their latency.
            _pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="barrierflow-stage")
        return _pool


def check_follows(epoch: int, last: CheckpointRecord | None) -> None:
    """Epoch ``epoch`` may only build on the completed checkpoint of epoch ``epoch - 1``."""
    completed = last.epoch if last else 0
    if completed != epoch - 1:
        raise FencedError(f"epoch {epoch} cannot run: the last completed epoch is {completed}")


def completed_future(record: CheckpointRecord | None) -> "Future[CheckpointRecord | None]":
    """A restore point that is already known (the last completed checkpoint at recovery)."""
    future: Future[CheckpointRecord | None] = Future()
    future.set_result(record)
    return future


# Stages every table of one epoch through the context (its second argument:
# ordered reads only); returns the rows read.
Compute = Callable[["EpochContext", bool], int]


class _OrderedReadRequired(Exception):
    """An unordered read met a bad line, or bytes the JSON reader reads differently: the epoch is recomputed with ordered reads."""


def process_epoch(
    spark: "SparkSession",
    layout: PipelineLayout,
    pipe: Pipeline,
    barrier: Barrier,
    restore_point: "Future[CheckpointRecord | None]",
    on_restore: Callable[[], None] | None = None,
    compute: "Compute | None" = None,
    keep_state_copies: bool = False,
) -> Manifest:
    """Compute epoch ``barrier.epoch`` and vote with a manifest (put-if-absent).

    ``restore_point`` resolves to the completed checkpoint of epoch n-1
    (see :meth:`EpochContext.restore_point`). ``compute`` stages the
    epoch's tables through the context and returns the rows read: the
    pipeline's operators on Spark by default; the protocol tests give a
    Spark-free stand-in, so that steps 2-3 are tested as they run.
    ``keep_state_copies``: this process commits the epoch itself, so state
    kept on the executors for the next epoch can be used (see
    :mod:`barrierflow.state.resident`).

    1. Compute the epoch (:func:`_compute`): chained (two Python tasks,
       :mod:`barrierflow.execution.chaining`) where the pipeline's shape allows and
       the tasks do not decline, else on Spark. Sources whose consumers do not
       need arrival order are read unordered; if such a read met a bad line
       (or its files' executor-side byte check failed), the attempt's staged
       files are deleted and the epoch is computed again with ordered reads,
       which produce the dead letters.
    2. Wait for the restore point: no vote before epoch n-1 completed.
    3. Write the manifest put-if-absent. Returns the manifest that won: this
       attempt's, or an earlier attempt's if one was already durable (then
       this attempt's staged files are discarded).
    """
    started = time.monotonic()
    compute = compute or _compute
    ctx = EpochContext(spark, layout, pipe, barrier, restore_point, on_restore, keep_state_copies)
    try:
        try:
            rows_in = compute(ctx, False)
        except _OrderedReadRequired:
            ctx.discard_staged()
            _log.info("epoch %d: bad or irregular input lines; computing again with ordered reads", barrier.epoch)
            ctx = EpochContext(spark, layout, pipe, barrier, restore_point, on_restore, keep_state_copies)
            rows_in = compute(ctx, True)
        ctx.restore_point()
    except BaseException:
        # E.g. epoch n-1 failed to complete: this attempt can never vote.
        ctx.discard_staged()
        # A copy on the executors may be what failed (a lost block): the
        # next attempt reads the tables.
        resident.executors.discard()
        raise
    staged = ctx.commits()
    commits = tuple(staged.values())
    manifest = Manifest(
        pipeline=pipe.name,
        lineage_id=barrier.lineage_id,
        epoch=barrier.epoch,
        attempt_id=ctx.attempt_id,
        tables=commits,
        max_event_time_us=ctx.max_event_time_us,
        watermark_us=ctx.watermark_us,
        rows_in=rows_in,
        rows_out=sum(c.rows for c in commits if c.kind is TableKind.SINK),
        dead_letters=staged["dead_letter"].rows,
        process_ms=int((time.monotonic() - started) * 1000),
        phase_ms={"wait": ctx.wait_ms, "stage": ctx.stage_ms},
    )
    faults.maybe_fail("process.before_manifest")
    uri = layout.manifest(barrier.lineage_id, barrier.epoch)
    if objects.write_json_if_absent(uri, manifest.to_json()):
        faults.maybe_fail("process.after_manifest")
        return manifest
    # Another attempt voted first: its file set is the only one that may commit.
    winner_doc = objects.read_json(uri)
    assert winner_doc is not None  # the file exists: the conditional write above lost to it
    winner = Manifest.from_json(winner_doc)
    ctx.discard_staged()
    return winner


def _compute(ctx: EpochContext, ordered_only: bool) -> int:
    """Run every node of the pipeline and stage every table; returns rows in."""
    pipe, barrier, spark = ctx.pipeline, ctx.barrier, ctx.spark
    ctx.staging_prefix = ctx.layout.staging_prefix(barrier.lineage_id, barrier.epoch, ctx.attempt_id)
    _after_releases(ctx.app_id, barrier.epoch)
    _set_shuffle_partitions(spark, ctx.parallelism, computing=True)
    if ctx.parallelism != pipe.parallelism:
        _log.info("epoch %d: %d shuffle partitions for its input (parallelism %d)", barrier.epoch, ctx.parallelism, pipe.parallelism)
    try:
        # Chained (two Python tasks) where the pipeline's shape allows and they do not decline.
        chain = None if ordered_only else chain_of(pipe)
        chained = run_chained(ctx, chain) if chain is not None else None
        if chained is None:
            rows_in, dead_letters = _run_operators(ctx, ordered_only)
        else:
            rows_in, dead_letters = chained, []
        tail_started = time.monotonic()
        describe_jobs(spark, f"epoch {barrier.epoch}: dead letters")
        # Unordered reads have no dead letters (a bad line, or a bad computed key, forces an ordered read).
        if dead_letters:
            dead_df = dead_letters[0]
            for other in dead_letters[1:]:
                dead_df = dead_df.unionByName(other)
            dead_rows: "DataFrame | pa.Table" = dead_df
        else:
            dead_rows = DEAD_LETTER_SCHEMA.empty_table()  # its ``_epoch`` is replaced by the constant
        if dead_letters is not None:  # None: a chained region that is the whole pipeline staged them
            ctx.stage(
                name="dead_letter",
                uri=ctx.layout.dead_letter,
                kind=TableKind.DEAD_LETTER,
                data=dead_rows,
                schema=DEAD_LETTER_SCHEMA,
                constants={"_epoch": barrier.epoch},
            )
        # Each source's snapshot: its offsets state holds barrier n's end offsets. Last, as it
        # waits for epoch n-1 (its state) while the dead letters are written.
        stage_source_offsets(ctx)
        ctx.commits()  # every staged file written (or its error raised) before the fault point
        _log.info("epoch %d: dead letters took %.0f ms", barrier.epoch, (time.monotonic() - tail_started) * 1000)
        faults.maybe_fail("process.after_stage")
    finally:
        _set_shuffle_partitions(spark, ctx.parallelism, computing=False)
        ctx.release()
    return rows_in


def _run_operators(ctx: EpochContext, ordered_only: bool) -> tuple[int, list["DataFrame"] | None]:
    """Read every source and apply every operator (a chained front in one task, the rest on Spark).

    Returns rows in and the dead letters' frames (None: a chained region
    that is the whole pipeline staged them).
    """
    pipe = ctx.pipeline
    outputs: dict[int, "DataFrame | pa.Table"] = {}
    dead_letters: list["DataFrame"] = []
    observed: list[tuple[Any, "DataFrame", "Future[bool] | None"]] = []
    region = chained_region(ctx)
    in_region = {id(node) for node in region.nodes} if region is not None else set()
    # The chained front runs after the other sources are read: it waits for epoch n-1's state.
    sources = [node for node in pipe.sources if id(node) not in in_region]
    rows_in = _read_sources(ctx, sources, ordered_only, outputs, dead_letters, observed)
    if region is not None:
        chained = run_region(ctx, region)
        if chained is None:  # declined: its sources are read on Spark too
            in_region = set()
            sources = [node for node in region.nodes if isinstance(node, SourceNode)]
            rows_in += _read_sources(ctx, sources, ordered_only, outputs, dead_letters, observed)
        else:
            frames, region_rows, region_dead = chained
            if region_dead is None:  # the whole pipeline: nothing is left to Spark
                ctx.rows_read = rows_in + region_rows
                return rows_in + region_rows, None
            outputs.update(frames)
            rows_in += region_rows
            dead_letters.append(region_dead)
    if not observed:
        ctx.rows_read = rows_in
    _apply_operators(ctx, outputs, skip=in_region)
    for observation, records, plain_input in observed:
        metrics = _metrics(observation, records)
        if metrics["bad"] or (plain_input is not None and not plain_input.result()):
            raise _OrderedReadRequired()
        rows_in += metrics["good"]
    key_dead_letters = ctx.key_dead_letters()
    # Without their file and line: computed again with ordered reads, as for a bad line (rare; a cached frame).
    if any(probe and not rows.isEmpty() for rows, probe in key_dead_letters):
        raise _OrderedReadRequired()
    dead_letters += [rows for rows, _ in key_dead_letters]
    return rows_in, dead_letters


def _read_sources(
    ctx: EpochContext,
    sources: list[SourceNode],
    ordered_only: bool,
    outputs: dict[int, "DataFrame | pa.Table"],
    dead_letters: list["DataFrame"],
    observed: list[tuple[Any, "DataFrame", "Future[bool] | None"]],
) -> int:
    """Read ``sources`` on Spark into ``outputs`` and ``dead_letters`` (an unordered read into ``observed``); the rows counted."""
    pipe, barrier, spark = ctx.pipeline, ctx.barrier, ctx.spark
    rows_in = 0
    for node in sources:
        describe_jobs(spark, f"epoch {barrier.epoch}: read {node.operator_id}")
        assert node.source is not None
        source_index = pipe.sources.index(node)
        ordered = ordered_only or any(pipe.needs_arrival_order(child) for child in pipe.children(node))
        batch = node.source.read(
            spark, barrier.end_offsets[node.source.source_id], ctx.parallelism, source_index, ordered=ordered,
            keys=pipe.source_keys(node),
        )
        ctx.source_files[source_index] = batch.files
        if batch.observation is not None:
            ctx.unordered_sources.add(node.operator_id)
            # Counted (and its bytes checked) while the operators run; checked once they have.
            records = batch.records
            observed.append((batch.observation, records, batch.plain_input))
        else:
            assert batch.dead_letters is not None
            ctx.track(*batch.shared)
            # Sources that share a cached parse need no second cache.
            records = ctx.cached_view(batch.records) if batch.shared else ctx.persist(batch.records)
            dead = batch.dead_letters if batch.shared else ctx.persist(batch.dead_letters)
            read_started = time.monotonic()
            rows_in += _count_both(records, dead)
            _log.info("epoch %d: reading %s took %.0f ms", barrier.epoch, node.operator_id, (time.monotonic() - read_started) * 1000)
            dead_letters.append(dead)
        outputs[id(node)] = records
        faults.maybe_fail("process.after_read")
    return rows_in


def _apply_operators(ctx: EpochContext, outputs: dict[int, "DataFrame | pa.Table"], skip: "set[int] | None" = None) -> None:
    """Apply every operator once its input is in ``outputs``; independent branches run concurrently.

    Each operator runs in a worker thread as soon as its inputs' outputs are
    ready (at most :data:`MAX_CONCURRENT_OPERATORS` at a time). After an
    error no further operator starts; those running finish, then the first
    error is raised.
    """
    pipe = ctx.pipeline
    index = {id(node): i for i, node in enumerate(pipe.nodes)}
    # ``skip``: nodes already computed (a chained front); those others consume are in ``outputs``.
    waiting = [node for node in pipe.nodes if not isinstance(node, SourceNode) and id(node) not in (skip or set())]
    # Reads of each node's output: a union of a stream with itself reads it twice.
    fan_out = {id(node): sum(1 for n in pipe.nodes for i in n.inputs() if i is node) for node in pipe.nodes}
    # Keys no source checked (computed upstream), per input: checked before the operator consumes them.
    computed_keys: dict[int, dict[int, list[tuple[str, str]]]] = {id(node): {} for node in pipe.nodes}
    for node in waiting:
        for i, column, computed_by in pipe.computed_keys(node):
            computed_keys[id(node)].setdefault(i, []).append((column, computed_by))

    def apply(node: Node) -> "DataFrame | pa.Table":
        ctx.run_as(index[id(node)])
        describe_jobs(ctx.spark, f"epoch {ctx.epoch}: {node.operator_id}")
        started = time.monotonic()
        inputs = [outputs[id(i)] for i in node.inputs()]
        inputs = [rows if node.accepts_arrow else ctx.frame(rows) for rows in inputs]
        for i, keys in computed_keys[id(node)].items():
            inputs[i] = split_computed_keys(ctx, node, i, ctx.frame(inputs[i]), keys)
        df = node.apply_inputs(ctx, inputs)
        if fan_out[id(node)] > 1 and not isinstance(df, pa.Table):
            df = ctx.persist(df)
        _log.info("epoch %d: %s took %.0f ms", ctx.epoch, node.operator_id, (time.monotonic() - started) * 1000)
        return df

    running: dict[Future[Any], Node] = {}
    error: BaseException | None = None
    with ThreadPoolExecutor(max_workers=MAX_CONCURRENT_OPERATORS, thread_name_prefix="barrierflow-operator") as pool:
        while True:
            if error is None:
                # Alignment: a multi-input operator runs once every input's epoch-n output is there.
                ready = [node for node in waiting if all(id(i) in outputs for i in node.inputs())]
                for node in ready:
                    waiting.remove(node)
                    running[pool.submit(apply, node)] = node
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                node = running.pop(future)
                try:
                    outputs[id(node)] = future.result()
                except BaseException as exc:  # the first error wins; the others are logged
                    if error is None:
                        error = exc
                    else:
                        _log.warning("epoch %d: %s also failed: %s", ctx.epoch, node.operator_id, exc)
    if error is not None:
        raise error
    if waiting:
        raise CheckpointError(f"operators {[n.operator_id for n in waiting]} have no input in the pipeline")


def _count_both(records: "DataFrame", dead: "DataFrame") -> int:
    """Rows of both frames in one Spark job, which also fills both caches (two counts were two jobs)."""
    from pyspark.sql import functions as F

    one = F.lit(1).alias("_row")
    return records.select(one).unionByName(dead.select(one)).count()


def _metrics(observation: Any, records: "DataFrame") -> dict[str, int]:
    """An unordered read's counts; computes the records if no operator did."""
    if not observation_done(observation):
        records.count()
    return observation.get
