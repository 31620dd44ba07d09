"""Process + pre-commit of one epoch on the driver, up to its vote.

The driver never reads a record: it plans the epoch, runs the tasks (:mod:`barrierflow.execution.runner`),
collects the descriptions of the files they staged, and votes with a manifest."""

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
    """The driver's side of one epoch: barrier, clocks, the restore point it builds on, the tables it stages. Epoch n-1's
    completed checkpoint is a future (n may start while n-1 commits): what depends on it goes through :meth:`restore_point`."""

    def __init__(
        self, spark: "SparkSession | None", layout: PipelineLayout, pipeline: Pipeline, barrier: Barrier,
        restore_point: "Future[CheckpointRecord | None]", on_restore: Callable[[], None] | None = None,
    ) -> None:  # fmt: skip
        self.spark, self.layout, self.pipeline, self.barrier = spark, layout, pipeline, barrier
        self.epoch = barrier.epoch
        self.attempt_id = uuid.uuid4().hex[:12]  # per process attempt: unique staging names
        self.app_id = app_id(pipeline.name, barrier.lineage_id)
        self.key_groups = pipeline.key_groups
        self.processing_time_ms = barrier.processing_time_ms
        self.staging_prefix = layout.staging_prefix(barrier.lineage_id, barrier.epoch, self.attempt_id)
        self._restore_point, self._on_restore, self._restored = restore_point, on_restore, False
        self._last_completed: CheckpointRecord | None = None
        # W(n) and the largest event time, as the epoch's tasks observed them (set by the runner).
        self.max_event_time_us: int | None = None
        self.watermark_us: int | None = None
        self.state_tables: EpochStateTables | None = None
        # Phase times (ms): waiting for epoch n-1 to complete, and for staged writes after computing.
        self.wait_ms, self.stage_ms = 0, 0
        self._lock = threading.RLock()
        self._staging: dict[str, tuple[str, Future[TableCommit]]] = {}  # name -> (URI, commit)
        self._on_release: list[Callable[[], None]] = []

    def restore_point(self) -> CheckpointRecord | None:
        """Epoch n-1's completed checkpoint (None before the first), once completed."""
        with self._lock:
            if not self._restored:
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

    def started_on_state(self) -> None:
        """Restored, the epoch starts its jobs on state: the first call runs ``on_restore`` (barrier n+1 follows, behind them)."""
        self.restore_point()
        on_restore, self._on_restore = self._on_restore, None  # the epoch's own thread: the runner's, then process_epoch's
        if on_restore is not None:
            on_restore()

    def stage(
        self, *, name: str, uri: str, kind: TableKind, data: pa.Table, primary_key: tuple[str, ...] = (),
        sort_by: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        """A table's share of the epoch that the driver holds already (a few rows)."""
        staged = self.stage_files(name=name, uri=uri, kind=kind, schema=data.schema, primary_key=primary_key)
        try:
            staged.set_result((write_parquet(uri, self.staging_prefix, data, sort_by=sort_by), ()))
        except BaseException as exc:
            staged.set_exception(exc)
            raise

    def stage_files(
        self, *, name: str, uri: str, kind: TableKind, schema: pa.Schema, primary_key: tuple[str, ...] = (),
        base_version: int | None = None, removes: tuple[str, ...] = (), table_schema: pa.Schema | None = None,
    ) -> "Future[Staged]":  # fmt: skip
        """A table the tasks will write, registered first (an error aborts its staging directory). The runner completes the
        returned future with what the tasks staged (and the stored files they replace)."""
        staged: Future[Staged] = Future()
        commit: Future[TableCommit] = Future()

        def described(done: "Future[Staged]") -> None:
            try:
                files, replaced = done.result()  # the tasks' error, if any
                commit.set_result(TableCommit(
                    name=name, uri=uri, kind=kind, schema_json=schema_json_of(schema), partition_by=(),
                    adds=tuple(sorted(files, key=lambda f: f.path)), removes=tuple(sorted({*removes, *replaced})),
                    base_version=base_version, primary_key=primary_key,
                    table_schema_json=schema_json_of(table_schema) if table_schema is not None else None,
                ))  # fmt: skip
            except BaseException as exc:
                commit.set_exception(exc)

        staged.add_done_callback(described)
        with self._lock:
            if name in self._staging:
                raise CheckpointError(f"table {name} staged twice in epoch {self.epoch}")
            # In registration order: the runner registers in pipeline order, so the manifest does not depend on timing.
            self._staging[name] = (uri, commit)
        return staged

    def commits(self) -> dict[str, TableCommit]:
        """Every table staged, in registration order; waits for files still being written."""
        waiting = time.monotonic()
        done = {name: future.result() for name, (_, future) in self._staging.items()}
        self.stage_ms += int((time.monotonic() - waiting) * 1000)
        return done

    def discard_staged(self) -> None:
        """Delete this attempt's staged files, once writes in flight have ended."""
        for uri, future in self._staging.values():
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
    spark: "SparkSession | None", layout: PipelineLayout, pipe: Pipeline, barrier: Barrier,
    restore_point: "Future[CheckpointRecord | None]", on_restore: Callable[[], None] | None = None,
    compute: Compute | None = None,
) -> Manifest:  # fmt: skip
    """Compute epoch ``barrier.epoch`` and vote; returns the manifest that won.

    ``compute`` stages the tables and returns the rows read (tests' stand-in for :func:`barrierflow.execution.runner.run_epoch`).

    1. Compute the epoch: every table staged.
    2. Wait for the restore point: no vote before epoch n-1 completed.
    3. Write the manifest put-if-absent; an earlier attempt's durable one wins and this attempt's staged files are discarded."""
    started = time.monotonic()
    ctx = EpochContext(spark, layout, pipe, barrier, restore_point, on_restore)
    try:
        rows_in = (compute or run_epoch)(ctx)  # 1.
        ctx.commits()  # every staged file written (or its error raised) before the fault point
        faults.maybe_fail("process.after_stage")
        ctx.started_on_state()  # 2. (the runner said so already, unless it failed first)
    except BaseException:
        # E.g. epoch n-1 failed to complete: this attempt can never vote.
        ctx.discard_staged()
        raise
    finally:
        ctx.release()
    staged = ctx.commits()
    commits = tuple(staged.values())
    manifest = Manifest(
        pipeline=pipe.name, lineage_id=barrier.lineage_id, epoch=barrier.epoch, attempt_id=ctx.attempt_id, tables=commits,
        max_event_time_us=ctx.max_event_time_us, watermark_us=ctx.watermark_us, rows_in=rows_in,
        rows_out=sum(c.rows for c in commits if c.kind is TableKind.SINK),
        dead_letters=staged["dead_letter"].rows if "dead_letter" in staged else 0,
        process_ms=int((time.monotonic() - started) * 1000), phase_ms={"wait": ctx.wait_ms, "stage": ctx.stage_ms},
    )  # fmt: skip
    faults.maybe_fail("process.before_manifest")  # 3.
    uri = layout.manifest(barrier.lineage_id, barrier.epoch)
    if objects.write_json_if_absent(uri, manifest.to_json()):
        faults.maybe_fail("process.after_manifest")
        return manifest
    # Another attempt voted first: its file set is the only one that may commit.
    winner = objects.read_json(uri)
    assert winner is not None  # the conditional write above lost to it
    ctx.discard_staged()
    return Manifest.from_json(winner)
