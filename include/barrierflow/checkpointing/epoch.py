"""Process + pre-commit of one epoch on the driver: the job behind a barrier, up to its vote.

The driver never reads a record: it plans the epoch (which tasks read which
input, which state and sink files each table's commit builds on), runs the
tasks (:mod:`barrierflow.execution.runner`), collects the descriptions of
the files they staged, and votes with a manifest written put-if-absent.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import Future, wait
from typing import TYPE_CHECKING, Callable

import pyarrow as pa

from barrierflow.checkpointing.checkpoint import Barrier, CheckpointRecord, Manifest, app_id
from barrierflow.connectors.delta_sink import abort
from barrierflow.core import faults
from barrierflow.core.errors import CheckpointError, FencedError
from barrierflow.execution.runner import run_epoch
from barrierflow.plan.pipeline import Pipeline
from barrierflow.state.snapshots import EpochStateTables
from barrierflow.storage import objects
from barrierflow.storage.commits import StagedFile, TableCommit, TableKind
from barrierflow.storage.delta import schema_json_of
from barrierflow.storage.layout import PipelineLayout
from barrierflow.storage.staging import write_parquet

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["EpochContext", "Compute", "process_epoch", "completed_future", "check_follows", "Staged"]

_log = logging.getLogger(__name__)

# What a table's tasks staged: the files, and the stored files (relative paths) they replace.
Staged = tuple[list[StagedFile], tuple[str, ...]]


class EpochContext:
    """The driver's side of one epoch: its barrier and clocks, the restore point it builds on, and the tables it stages.

    The epoch builds on the completed checkpoint of epoch n-1, handed in as
    a future: with two concurrent checkpoints, epoch n starts on its input
    while epoch n-1 still commits. Everything that depends on n-1 (state,
    sinks' tables, the previous watermark, the vote) goes through
    :meth:`restore_point`, which waits for it.
    """

    def __init__(
        self,
        spark: "SparkSession | None",
        layout: PipelineLayout,
        pipeline: Pipeline,
        barrier: Barrier,
        restore_point: "Future[CheckpointRecord | None]",
        on_restore: Callable[[], None] | None = None,
    ) -> None:
        self.spark = spark
        self.layout = layout
        self.pipeline = pipeline
        self.barrier = barrier
        self.epoch = barrier.epoch
        self.attempt_id = uuid.uuid4().hex[:12]  # per process attempt: unique staging names
        self.app_id = app_id(pipeline.name, barrier.lineage_id)
        self.key_groups = pipeline.key_groups
        self.processing_time_ms = barrier.processing_time_ms
        self.staging_prefix = layout.staging_prefix(barrier.lineage_id, barrier.epoch, self.attempt_id)
        self._restore_point = restore_point
        self._on_restore = on_restore
        self._restored = False
        self._last_completed: CheckpointRecord | None = None
        # W(n) and the largest event time, as the epoch's tasks observed them (set by the runner).
        self.max_event_time_us: int | None = None
        self.watermark_us: int | None = None
        self.state_tables: EpochStateTables | None = None
        # Phase times (ms): waiting for epoch n-1 to complete, and for staged writes after computing.
        self.wait_ms = 0
        self.stage_ms = 0
        self._lock = threading.RLock()
        self._staging: dict[str, tuple[int, str, Future[TableCommit]]] = {}
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
                check_follows(self.epoch, record)
                self._last_completed = record
                self.max_event_time_us = record.max_event_time_us if record else None
                self.watermark_us = record.watermark_us if record else None
                self.state_tables = EpochStateTables(self.app_id, record.epoch if record else None, self.pipeline.state_backend)
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

    # -- staging -------------------------------------------------------------

    def stage(
        self,
        *,
        name: str,
        uri: str,
        kind: TableKind,
        data: pa.Table,
        primary_key: tuple[str, ...] = (),
        sort_by: tuple[str, ...] = (),
    ) -> None:
        """A table's share of the epoch that the driver holds already (a few rows: source offsets, watermark maxima)."""
        commit: Future[TableCommit] = Future()
        self._register(name, uri, commit)
        try:
            files = write_parquet(uri, self.staging_prefix, data, sort_by=sort_by)
            commit.set_result(_commit(name, uri, kind, data.schema, (files, ()), primary_key, None, None))
        except BaseException as exc:
            commit.set_exception(exc)
            raise

    def stage_files(
        self,
        *,
        name: str,
        uri: str,
        kind: TableKind,
        schema: pa.Schema,
        primary_key: tuple[str, ...] = (),
        base_version: int | None = None,
        removes: tuple[str, ...] = (),
        table_schema: pa.Schema | None = None,
    ) -> "Future[Staged]":
        """A table the epoch's tasks write, registered before they do: an error aborts its staging directory.

        Returns the future the runner completes with what the tasks staged
        (files, and the stored files they replace besides ``removes``).
        """
        staged: Future[Staged] = Future()
        commit: Future[TableCommit] = Future()

        def described(done: "Future[Staged]") -> None:
            error = done.exception()
            if error is not None:
                commit.set_exception(error)
                return
            files, replaced = done.result()
            commit.set_result(
                _commit(name, uri, kind, schema, (files, (*removes, *replaced)), primary_key, base_version, table_schema)
            )

        staged.add_done_callback(described)
        self._register(name, uri, commit)
        return staged

    def _register(self, name: str, uri: str, commit: "Future[TableCommit]") -> None:
        with self._lock:
            if name in self._staging:
                raise CheckpointError(f"table {name} staged twice in epoch {self.epoch}")
            # In registration order: the runner registers in pipeline order, so the manifest does not depend on timing.
            self._staging[name] = (len(self._staging), uri, commit)

    def commits(self) -> dict[str, TableCommit]:
        """Every table staged, in registration order; waits for files still being written."""
        waiting = time.monotonic()
        ordered = sorted(self._staging.items(), key=lambda item: item[1][0])
        done = {name: future.result() for name, (_, _, future) in ordered}
        self.stage_ms += int((time.monotonic() - waiting) * 1000)
        return done

    def discard_staged(self) -> None:
        """Delete this attempt's staged files, once writes in flight have ended."""
        for _, uri, future in self._staging.values():
            wait([future])
            abort(uri, self.staging_prefix)
        self._staging.clear()

    def on_release(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the epoch's files are staged (e.g. delete its exchange files)."""
        self._on_release.append(callback)

    def release(self) -> None:
        """Give the epoch's snapshots of its state tables back; run what waited for the staging to end."""
        for callback in reversed(self._on_release):
            try:
                callback()
            except Exception as exc:  # noqa: BLE001 - cleanup; the epoch's outcome stands either way
                _log.warning("epoch %d: after staging: %s", self.epoch, exc)
        self._on_release.clear()
        if self.state_tables is not None:
            self.state_tables.release()


def _commit(
    name: str, uri: str, kind: TableKind, schema: pa.Schema, staged: Staged, primary_key: tuple[str, ...],
    base_version: int | None, table_schema: pa.Schema | None,
) -> TableCommit:  # fmt: skip
    files, removes = staged
    return TableCommit(
        name=name, uri=uri, kind=kind, schema_json=schema_json_of(schema), partition_by=(),
        adds=tuple(sorted(files, key=lambda f: f.path)), removes=tuple(sorted(set(removes))), base_version=base_version,
        primary_key=primary_key, table_schema_json=schema_json_of(table_schema) if table_schema is not None else None,
    )  # fmt: skip


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


# Stages every table of one epoch through the context; returns the rows read.
Compute = Callable[[EpochContext], int]


def process_epoch(
    spark: "SparkSession | None",
    layout: PipelineLayout,
    pipe: Pipeline,
    barrier: Barrier,
    restore_point: "Future[CheckpointRecord | None]",
    on_restore: Callable[[], None] | None = None,
    compute: Compute | None = None,
) -> Manifest:
    """Compute epoch ``barrier.epoch`` and vote with a manifest (put-if-absent).

    ``restore_point`` resolves to the completed checkpoint of epoch n-1
    (see :meth:`EpochContext.restore_point`). ``compute`` stages the epoch's
    tables through the context and returns the rows read: the pipeline's
    operators on Spark by default (:func:`barrierflow.execution.runner.run_epoch`);
    the protocol tests give a Spark-free stand-in, so that steps 2-3 are
    tested as they run.

    1. Compute the epoch: every table staged.
    2. Wait for the restore point: no vote before epoch n-1 completed.
    3. Write the manifest put-if-absent. Returns the manifest that won: this
       attempt's, or an earlier attempt's if one was already durable (then
       this attempt's staged files are discarded).
    """
    started = time.monotonic()
    ctx = EpochContext(spark, layout, pipe, barrier, restore_point, on_restore)
    try:
        # 1.
        rows_in = (compute or run_epoch)(ctx)
        ctx.commits()  # every staged file written (or its error raised) before the fault point
        faults.maybe_fail("process.after_stage")
        # 2.
        ctx.restore_point()
    except BaseException:
        # E.g. epoch n-1 failed to complete: this attempt can never vote.
        ctx.discard_staged()
        raise
    finally:
        ctx.release()
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
        dead_letters=staged["dead_letter"].rows if "dead_letter" in staged else 0,
        process_ms=int((time.monotonic() - started) * 1000),
        phase_ms={"wait": ctx.wait_ms, "stage": ctx.stage_ms},
    )
    # 3.
    faults.maybe_fail("process.before_manifest")
    uri = layout.manifest(barrier.lineage_id, barrier.epoch)
    if objects.write_json_if_absent(uri, manifest.to_json()):
        faults.maybe_fail("process.after_manifest")
        return manifest
    # Another attempt voted first: its file set is the only one that may commit.
    winner_doc = objects.read_json(uri)
    assert winner_doc is not None  # the file exists: the conditional write above lost to it
    ctx.discard_staged()
    return Manifest.from_json(winner_doc)
