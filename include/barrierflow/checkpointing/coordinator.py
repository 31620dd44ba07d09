"""The checkpoint coordinator: the epoch lifecycle of a pipeline.

For epoch n of pipeline P (every step idempotent and safe to retry):

  1. recover: roll forward an epoch whose manifest is durable (commit is idempotent); the last COMPLETED epoch in the
     checkpoint log is the restore point.
  2. barrier: fix every source's end offsets for epoch n, written put-if-absent before any processing; a retry reuses them.
  3. process: the Spark job reads exactly the records between barriers n-1 and n, stages outputs and state (each source's
     offsets state gets barrier n's end offsets), and votes: the first manifest written put-if-absent wins.
  4. commit: one Delta commit per table, side by side, carrying the app transaction (P + lineage, n) and the fencing token
     (lineage sequence, n), skipped where done, refused where a table holds a higher token; then the log records n COMPLETED
     with every table's Delta version (the consistent cut).
  5. notify: remove staged files of attempts that lost the vote; compact the checkpoint log once it has many files.

Two checkpoints in flight (``run(max_concurrent_checkpoints=2)``, README "How an epoch flows"): barrier n+1 follows
from barrier n alone; epoch n+1 touches state, sinks, the previous watermark and its vote only after n completed
(``EpochContext.restore_point``). A restore starts a new lineage; a pipeline stopped with a savepoint plans no barrier
until restored. The epoch lease is checked before each barrier and vote."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from barrierflow.checkpointing.checkpoint import Barrier, CheckpointRecord, EpochStatus, Manifest, app_id
from barrierflow.checkpointing.checkpoint_log import CheckpointLog, current_lineage_seq, iso_now, now_us
from barrierflow.checkpointing.epoch import Compute, check_follows, completed_future, process_epoch
from barrierflow.checkpointing.intervals import ArrivalBound
from barrierflow.checkpointing.lease import EpochLease
from barrierflow.checkpointing.restore_intent import complete_restore
from barrierflow.connectors.file_source import count_records_on_executors
from barrierflow.connectors.source import Backlog, Source
from barrierflow.core import faults
from barrierflow.core.errors import (
    BarrierflowError,
    BlockedInputError,
    CheckpointError,
    EpochInProgressError,
    FencedError,
    PipelineStoppedError,
)
from barrierflow.execution.spark import engine_lost, get_spark
from barrierflow.plan.pipeline import Pipeline, PipelineDefinition
from barrierflow.plan.registry import get_pipeline
from barrierflow.storage import objects
from barrierflow.storage.commits import Fence
from barrierflow.storage.delta import commit_epoch_table
from barrierflow.storage.layout import STAGING_DIR, PipelineLayout

__all__ = ["CheckpointCoordinator", "EpochResult", "Recovery", "backlog_report", "blocked_state", "recorded_params"]

_log = logging.getLogger(__name__)
# Past this many files (about three per epoch) step 5 compacts the checkpoint log: startup reads stay bounded.
LOG_COMPACTION_FILES = 120


@dataclass(frozen=True)
class Recovery:
    lineage_id: str
    last_completed: CheckpointRecord | None
    rolled_forward: tuple[int, ...]
    pending_barrier: Barrier | None

    @property
    def last_completed_epoch(self) -> int:
        return self.last_completed.epoch if self.last_completed else 0


@dataclass(frozen=True)
class EpochResult:
    epoch: int
    record: CheckpointRecord


@dataclass(frozen=True)
class _PendingCheckpoint:
    """An epoch whose barrier is written and whose process + pre-commit runs in a worker."""

    barrier: Barrier
    restore_point: "Future[CheckpointRecord | None]"  # epoch n-1's completed checkpoint
    restoring: threading.Event  # set once the epoch waits for (or has) its restore point
    vote: "Future[tuple[Manifest, bool]]"  # the manifest, and whether this process wrote it
    started: float  # time.monotonic() when the epoch began (its duration's start)


class CheckpointCoordinator:
    """Drives epochs of one pipeline in one warehouse."""

    def __init__(
        self, definition: PipelineDefinition, params: Mapping[str, Any], warehouse: str,
        spark_factory: Callable[[], Any] | None = None, use_lease: bool = True, compute: Compute | None = None,
    ) -> None:  # fmt: skip
        """``compute`` replaces the Spark computation of step 3 (the protocol tests' stub engine)."""
        self.definition = definition
        self._compute = compute
        self.params = definition.resolve(params)
        self.layout = PipelineLayout.of(warehouse, definition.name)
        self.log = CheckpointLog(self.layout)
        self._spark_factory = spark_factory
        self._use_lease = use_lease
        self._lease = EpochLease(self.layout.lease, definition.name)

    @functools.cached_property
    def pipeline(self) -> Pipeline:
        return self.definition.build(self.params)

    def ensure_created(self) -> dict[str, Any]:
        """Create the pipeline's metadata once; key groups never change after."""
        meta = {"name": self.definition.name, "key_groups": self.definition.key_groups, "created_at": iso_now()}
        objects.write_json_if_absent(self.layout.pipeline_meta, meta)
        lineage = {"lineage_id": uuid.uuid4().hex[:12], "start_epoch": 0, "started_at": iso_now(), "reason": "created"}
        objects.write_json_if_absent(objects.join_uri(self.layout.lineages, "0000000000.json"), lineage)
        existing = objects.read_json(self.layout.pipeline_meta)
        assert existing is not None
        if existing["key_groups"] != self.definition.key_groups:
            raise CheckpointError(
                f"pipeline {self.definition.name} was created with {existing['key_groups']} key groups; "
                f"the code now declares {self.definition.key_groups}. Key groups (max parallelism) are "
                "fixed at creation: restore into a new pipeline to change them"
            )
        return existing

    def current_lineage(self) -> dict[str, Any]:
        return self.current_lineage_seq()[1]

    def current_lineage_seq(self) -> tuple[int, dict[str, Any]]:
        return current_lineage_seq(self.layout)

    def app_id(self, lineage_id: str) -> str:
        return app_id(self.definition.name, lineage_id)

    def acquire_lease(self, wait_s: float = 0.0) -> None:
        """Take the pipeline's epoch lease (:mod:`barrierflow.checkpointing.lease`), trying for up to ``wait_s``."""
        if self._use_lease:
            self._lease.acquire(wait_s)

    def check_lease(self) -> None:
        """Raise :class:`~barrierflow.core.errors.LeaseLostError` if this process took the lease and lost it since."""
        if self._use_lease and self._lease.taken:
            self._lease.check()

    def release_lease(self) -> None:
        if self._use_lease:
            self._lease.release()

    def hold(self, owner: str, reason: str) -> dict[str, Any]:
        """Hold the pipeline for ``owner`` (a reprocessing): others' runs plan no epoch. The hold in force (maybe another's)."""
        objects.write_json_if_absent(self.layout.held, {"owner": owner, "reason": reason, "since": iso_now()})
        return self.held_by() or self.hold(owner, reason)

    def held_by(self) -> dict[str, Any] | None:
        """The hold in force (owner, reason, since), or None."""
        return objects.read_json(self.layout.held)

    def release_hold(self, owner: str) -> bool:
        """Release ``owner``'s hold (only its own); whether there was one."""
        mine = (self.held_by() or {}).get("owner") == owner
        if mine:
            objects.remove_document(self.layout.held)
        return mine

    def blocked(self) -> dict[str, Any] | None:
        """Why the pipeline cannot go on (step, epoch, message, since), or None: see :meth:`_attempt`."""
        return blocked_state(self.layout.warehouse, self.definition.name)

    @contextmanager
    def _attempt(self, step: str, lineage_id: str, epoch: int, barrier: Barrier | None = None) -> Iterator[None]:
        """Record how ``step`` of an epoch failed before its vote, then re-raise.

        1. Any failure is an ABORTED row (the error its message; recovery never
           reads it): the staged files are discarded, the epoch retried from its barrier.
        2. A :class:`BlockedInputError` is also the pipeline's blocked state until an
           epoch completes; a spark-submit task reads it to fail without retry."""
        try:
            yield
        except EpochInProgressError:
            raise  # another attempt holds the epoch: nothing failed
        except Exception as exc:
            message = f"{step} failed: {type(exc).__name__}: {exc}"[:4000]
            # 1. The aborted attempt (a bare row when the barrier itself could not be planned).
            try:
                bare = CheckpointRecord(
                    self.definition.name, lineage_id, epoch, EpochStatus.ABORTED, "", now_us(), message=message
                )
                self.log.append(_barrier_record(EpochStatus.ABORTED, barrier, message) if barrier else bare)
            except BarrierflowError as log_error:  # e.g. the store is down: the original error matters
                _log.warning("epoch %d: the failure was not recorded: %s", epoch, log_error)
            # 2. The blocked state.
            if isinstance(exc, BlockedInputError) and (self.blocked() or {}).get("message") != str(exc):
                doc = {"step": step, "lineage_id": lineage_id, "epoch": epoch, "message": str(exc), "since": iso_now()}
                objects.remove_document(self.layout.blocked)
                objects.write_json_if_absent(self.layout.blocked, doc)
            raise

    # -- step 1: recover -------------------------------------------------

    def stopped(self) -> dict[str, Any] | None:
        """The stop marker written by a stop-with-savepoint, or None when running."""
        return objects.read_json(self.layout.stopped)

    def recover(self) -> Recovery:
        faults.maybe_fail("recover.start")
        self.ensure_created()
        intent = objects.read_json(self.layout.restoring)
        if intent is not None:  # a restore crashed half-way: finish it before anything reads state
            complete_restore(self.layout, self.definition, self.pipeline, intent)
        lineage_id = self.current_lineage()["lineage_id"]
        last = CheckpointLog.last_completed(self.log.lineage_records(lineage_id))
        rolled: list[int] = []
        epoch = (last.epoch if last else 0) + 1
        # Pre-committed but not completed: roll forward.
        while (manifest_doc := objects.read_json(self.layout.manifest(lineage_id, epoch))) is not None:
            barrier = self._read_barrier(lineage_id, epoch)
            assert barrier is not None
            last = self.commit(barrier, Manifest.from_json(manifest_doc))
            rolled.append(epoch)
            epoch += 1
        return Recovery(lineage_id, last, tuple(rolled), self._read_barrier(lineage_id, epoch))

    def _read_barrier(self, lineage_id: str, epoch: int) -> Barrier | None:
        doc = objects.read_json(self.layout.barrier(lineage_id, epoch))
        return Barrier.from_json(doc) if doc else None

    # -- step 2: barrier -------------------------------------------------

    def trigger_checkpoint(self, recovery: Recovery, bound: ArrivalBound = ArrivalBound()) -> Barrier | None:
        """Barrier n (reused when it exists); None when no source has new input within ``bound``."""
        stop = self.stopped()
        if stop is not None:
            # Checked first: a stopped pipeline does not even finish a planned epoch (its state stays at the savepoint).
            _log.info("%s", _stopped_message(self.definition.name, stop))
            return None
        if recovery.pending_barrier is not None:
            return recovery.pending_barrier
        return self._inject_barrier(recovery.lineage_id, recovery.last_completed_epoch + 1, bound)

    def _inject_barrier(self, lineage_id: str, epoch: int, bound: ArrivalBound) -> Barrier | None:
        """Barrier ``epoch``, planned from barrier ``epoch - 1``'s end offsets (reused when it exists)."""
        self.check_lease()
        lineage = self.current_lineage()
        if lineage["lineage_id"] != lineage_id:
            raise FencedError(
                f"epoch {epoch} of lineage {lineage_id} cannot start: the pipeline was restored into "
                f"lineage {lineage['lineage_id']}"
            )
        planning = time.monotonic()
        with self._attempt("barrier", lineage_id, epoch):
            start, end, cutoff_ms = self._plan_offsets(lineage, epoch, bound)
        if end is None:
            return None
        # Parameters fixed by a restore (e.g. a new parallelism) hold for the whole lineage.
        params = self.definition.resolve({**self.params, **(lineage.get("params") or {})})
        try:  # the input ``end`` leaves waiting, per source: only reported
            waiting = {s.source_id: s.backlog(end.get(s.source_id)).to_json() for s in self._sources()}
        except BarrierflowError as exc:
            _log.warning("backlog not measured: %s", exc)
            waiting = {}
        barrier = Barrier(
            pipeline=self.definition.name, lineage_id=lineage_id, epoch=epoch, start_offsets=start, end_offsets=end,
            processing_time_ms=int(time.time() * 1000), planned_at=iso_now(), attempt_id=uuid.uuid4().hex[:12],
            params=params, arrival_cutoff_ms=cutoff_ms, planned_by=bound.owner, backlog=waiting,
            plan_ms=int((time.monotonic() - planning) * 1000),
        )  # fmt: skip
        faults.maybe_fail("barrier.before_write")
        uri = self.layout.barrier(lineage_id, epoch)
        if objects.write_json_if_absent(uri, barrier.to_json()):
            self.log.append(_barrier_record(EpochStatus.PLANNED, barrier))
        faults.maybe_fail("barrier.after_write")
        winner = self._read_barrier(lineage_id, epoch)
        assert winner is not None
        return winner

    def _plan_offsets(
        self, lineage: Mapping[str, Any], epoch: int, bound: ArrivalBound
    ) -> tuple[dict[str, Any], dict[str, Any] | None, int | None]:
        """Start offsets, end offsets (None: no source has input) and arrival cut-off of epoch ``epoch``."""
        previous = self._read_barrier(lineage["lineage_id"], epoch - 1) if epoch > 1 else None
        start = dict(previous.end_offsets) if previous else dict(lineage.get("start_offsets") or {})
        return start, *self._plan_from(start, bound)

    def _plan_from(self, start: Mapping[str, Any], bound: ArrivalBound) -> tuple[dict[str, Any] | None, int | None]:
        """End offsets (None: no input) and arrival cut-off (see ``intervals``) of the epoch after ``start``."""
        sources = self._sources()
        cutoff_ms = bound.cutoff_ms
        if bound.schedule is not None:
            arrivals = [s.earliest_arrival_ms(start.get(s.source_id), bound.cutoff_ms) for s in sources]
            waiting = [a for a in arrivals if a is not None]
            if not waiting:
                return None, cutoff_ms
            cutoff_ms = bound.epoch_cutoff_ms(min(waiting))
        def counter(uris: Sequence[str], fmt: str) -> Mapping[str, int]:  # by executor tasks: planning never reads input
            return count_records_on_executors(self._spark(), uris, fmt)

        end = {s.source_id: s.plan(start.get(s.source_id), cutoff_ms, counter) for s in sources}
        has_input = any(s.has_records(end[s.source_id]) for s in sources)
        return (end if has_input else None), cutoff_ms

    def preview_epochs(
        self, start: Mapping[str, Any], bound: ArrivalBound, limit: int = 1000
    ) -> list[tuple[int | None, dict[str, Any]]]:
        """(arrival cut-off, end offsets) of the epochs that would follow ``start`` within ``bound``; records nothing."""
        epochs: list[tuple[int | None, dict[str, Any]]] = []
        offsets = dict(start)
        while len(epochs) < limit:
            end, cutoff_ms = self._plan_from(offsets, bound)
            if end is None:
                break
            epochs.append((cutoff_ms, end))
            offsets = {**offsets, **end}
        return epochs

    def has_new_input(self, bound: ArrivalBound = ArrivalBound()) -> bool:
        """Whether the next epoch would have input now (a planned epoch counts; a stopped pipeline has none); records nothing."""
        if self.stopped() is not None:
            return False
        lineage = self.current_lineage()
        last = CheckpointLog.last_completed(self.log.lineage_records(lineage["lineage_id"]))
        epoch = (last.epoch if last else 0) + 1
        planned = self._read_barrier(lineage["lineage_id"], epoch) is not None
        return planned or self._plan_offsets(lineage, epoch, bound)[1] is not None

    def _sources(self) -> list[Source]:
        return [node.source for node in self.pipeline.sources if node.source is not None]

    def backlog(self) -> dict[str, Backlog]:
        """Per source, the input no barrier of the current lineage has taken yet, measured now."""
        started = objects.exists(self.layout.lineages)
        records = self.log.lineage_records(self.current_lineage()["lineage_id"]) if started else []
        planned = [r for r in records if r.status is not EpochStatus.ABORTED]  # a failed plan has no offsets
        newest = max(planned, key=lambda r: r.epoch).offsets_json() if planned else {}
        return {s.source_id: s.backlog(newest.get(s.source_id)) for s in self._sources()}

    # -- step 3: process + pre-commit -------------------------------------

    def process_planned(self) -> Manifest | None:
        """Step 3 as its own task: recover, then process + pre-commit the planned epoch; the winning manifest. None when no epoch
        is planned or the pipeline is stopped (its state stays exactly at the savepoint)."""
        recovery = self.recover()
        barrier = recovery.pending_barrier
        if barrier is None or self.stopped() is not None:
            return None
        last = recovery.last_completed
        check_follows(barrier.epoch, last)
        manifest, voted = self._vote(barrier, completed_future(last))
        if voted:
            self.log.append(_manifest_record(EpochStatus.PRE_COMMITTED, barrier, manifest, manifest.process_ms))
        return manifest

    def _vote(
        self, barrier: Barrier, restore_point: "Future[CheckpointRecord | None]", on_restore: Callable[[], None] | None = None
    ) -> tuple[Manifest, bool]:
        """Step 3 without the checkpoint-log row: the winning manifest, and whether this call computed it."""
        with self._attempt("process", barrier.lineage_id, barrier.epoch, barrier):
            existing = objects.read_json(self.layout.manifest(barrier.lineage_id, barrier.epoch))
            if existing is not None:
                return Manifest.from_json(existing), False  # never recompute a voted epoch
            self.check_lease()
            spark = self._spark()
            # The barrier's params (a retry replays the same job); per epoch, as the next barrier is planned meanwhile.
            pipe = self.definition.build(barrier.params or self.params)
            try:
                return process_epoch(spark, self.layout, pipe, barrier, restore_point, on_restore, self._compute), True
            except Exception as exc:
                if (lost := engine_lost(spark, exc)) is not None:
                    raise lost from exc
                raise

    def _spark(self) -> Any:
        return self._spark_factory() if self._spark_factory is not None else get_spark(session_name=self.definition.name)

    # -- step 4: commit --------------------------------------------------

    def commit(self, barrier: Barrier, manifest: Manifest, epoch_started: float | None = None) -> CheckpointRecord:
        """Step 4; the duration recorded runs from ``epoch_started`` (time.monotonic), else is processing plus commit time."""
        started = time.monotonic()
        records = self.log.lineage_records(manifest.lineage_id)
        done = [r for r in records if r.epoch == manifest.epoch and r.status is EpochStatus.COMPLETED]
        if done:
            return done[0]
        last = CheckpointLog.last_completed(records)
        if (last.epoch if last else 0) != manifest.epoch - 1:
            raise FencedError(f"epoch {manifest.epoch} cannot commit: the last completed epoch is {last.epoch if last else 0}")
        seq, lineage = self.current_lineage_seq()
        if (current := lineage["lineage_id"]) != manifest.lineage_id:
            raise FencedError(
                f"epoch {manifest.epoch} of lineage {manifest.lineage_id} cannot commit: the pipeline "
                f"was restored into lineage {current}"
            )
        app = self.app_id(manifest.lineage_id)
        # A restore landing after the check above is caught by every table: it raised their tokens.
        fence = Fence(self.definition.name, seq, manifest.epoch)
        # Each table is fenced and idempotent on its own: they commit side by side (delta-rs releases the GIL).
        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="barrierflow-commit") as pool:
            done_at = pool.map(lambda t: commit_epoch_table(t, app, manifest.epoch, manifest.attempt_id, fence), manifest.tables)
            versions = {t.name: version for t, version in zip(manifest.tables, done_at)}
        faults.maybe_fail("commit.before_completed")
        commit_ms = int((time.monotonic() - started) * 1000)
        duration_ms = (
            int((time.monotonic() - epoch_started) * 1000) if epoch_started is not None else manifest.process_ms + commit_ms
        )
        versions_json = json.dumps(versions, sort_keys=True)
        record = _manifest_record(EpochStatus.COMPLETED, barrier, manifest, duration_ms, versions_json, commit_ms)
        self.log.append(record)
        faults.maybe_fail("commit.after_completed")
        # Whatever blocked the pipeline was resolved: an epoch completed.
        objects.remove_document(self.layout.blocked)
        return record

    # -- step 5: notify --------------------------------------------------

    def notify(self, manifest: Manifest) -> None:
        faults.maybe_fail("notify.start")
        # Staged directories of attempts that lost the vote.
        for table in manifest.tables:
            epoch_dir = objects.join_uri(table.uri, STAGING_DIR, manifest.lineage_id, f"{manifest.epoch:010d}")
            for attempt in objects.list_dir(epoch_dir):
                if attempt != manifest.attempt_id:
                    objects.remove_tree(objects.join_uri(epoch_dir, attempt))
        try:
            self.log.compact(min_files=LOG_COMPACTION_FILES)
        except CheckpointError as exc:  # an optimization: the next epoch tries again
            _log.warning("%s", exc)

    def notify_completed(self) -> tuple[CheckpointRecord | None, bool]:
        """Step 5 for the last completed epoch: that record, and whether it was notified (a restore point has no manifest)."""
        lineage_id = self.current_lineage()["lineage_id"]
        last = CheckpointLog.last_completed(self.log.lineage_records(lineage_id))
        if last is None:
            return None, False
        manifest_doc = objects.read_json(self.layout.manifest(lineage_id, last.epoch))
        if manifest_doc is None:
            return last, False
        self.notify(Manifest.from_json(manifest_doc))
        return last, True

    def run(
        self, epochs: int | None = None, until_caught_up: bool = False, on_epoch: Callable[[EpochResult], None] | None = None,
        max_concurrent_checkpoints: int = 2, bound: ArrivalBound = ArrivalBound(),
    ) -> list[EpochResult]:  # fmt: skip
        """Steps 1-5 for ``epochs`` epochs, or until no source has new input within ``bound``. A pipeline held by another owner
        than ``bound.owner`` refuses to run."""
        if epochs is None and not until_caught_up:
            raise CheckpointError("give a number of epochs or until_caught_up=True")
        if max_concurrent_checkpoints not in (1, 2):
            raise CheckpointError(
                f"max_concurrent_checkpoints is {max_concurrent_checkpoints}: allowed are 1 and 2 "
                "(epoch n+1 never votes before epoch n completed, so a third would only wait)"
            )
        stop = self.stopped()
        if stop is not None:
            raise PipelineStoppedError(_stopped_message(self.definition.name, stop))
        hold = self.held_by()
        if hold is not None and hold.get("owner") != bound.owner:
            raise EpochInProgressError(
                f"pipeline {self.definition.name} is held by {hold.get('owner')} ({hold.get('reason')}, since "
                f"{hold.get('since')}): it replays the input in interval order; run again once it has finished "
                f"(if that command died: barrierflow reprocess {self.definition.name} --release-hold)"
            )
        # Long enough for the lease of a holder that died to expire (lease.py, rule 3a).
        self.acquire_lease(wait_s=1.25 * self._lease.ttl_s)
        results: list[EpochResult] = []
        try:
            with ThreadPoolExecutor(max_workers=2, thread_name_prefix="barrierflow-epoch") as workers:
                while (epochs is None or len(results) < epochs) and (current := self._start(workers, bound)):
                    # Chained epochs; when the chain ends, the next round recovers and looks again.
                    while current is not None:
                        following, injection_error = None, None
                        if max_concurrent_checkpoints > 1 and (epochs is None or len(results) + 1 < epochs):
                            try:
                                following = self._inject_next(workers, current, bound)
                            except Exception as exc:  # epoch n still completes; then the error surfaces
                                injection_error = exc
                        record = self._complete(current, following)
                        results.append(EpochResult(record.epoch, record))
                        if on_epoch:
                            on_epoch(results[-1])
                        if injection_error is not None:
                            raise injection_error
                        current = following
        finally:
            self.release_lease()
        return results

    def _start(self, workers: ThreadPoolExecutor, bound: ArrivalBound) -> _PendingCheckpoint | None:
        """Steps 1-2 and the launch of step 3; None when there is no new input."""
        started = time.monotonic()
        recovery = self.recover()
        barrier = self.trigger_checkpoint(recovery, bound)
        if barrier is None:
            return None
        last = recovery.last_completed
        check_follows(barrier.epoch, last)
        # Starting the Spark session is the process's cost: epoch durations leave it out.
        session_started = time.monotonic()
        self._spark()
        started += time.monotonic() - session_started
        return self._launch(workers, barrier, completed_future(last), started)

    def _launch(
        self, workers: ThreadPoolExecutor, barrier: Barrier, restore_point: "Future[CheckpointRecord | None]", started: float
    ) -> _PendingCheckpoint:
        restoring = threading.Event()

        def vote() -> tuple[Manifest, bool]:
            try:
                return self._vote(barrier, restore_point, restoring.set)
            finally:
                restoring.set()  # also when it failed or found a manifest: never leave the coordinator waiting

        return _PendingCheckpoint(barrier, restore_point, restoring, workers.submit(vote), started)

    def _inject_next(
        self, workers: ThreadPoolExecutor, current: _PendingCheckpoint, bound: ArrivalBound
    ) -> _PendingCheckpoint | None:
        """Barrier n+1 and its worker, once epoch n began its state-dependent work."""
        current.restoring.wait()
        if current.vote.done() and current.vote.exception() is not None:
            return None
        started = time.monotonic()
        barrier = self._inject_barrier(current.barrier.lineage_id, current.barrier.epoch + 1, bound)
        return self._launch(workers, barrier, Future(), started) if barrier is not None else None

    def _complete(self, current: _PendingCheckpoint, following: _PendingCheckpoint | None) -> CheckpointRecord:
        """Steps 3 (the log row), 4 and 5 of ``current``; then ``following`` may touch state."""
        barrier = current.barrier
        try:
            waited = time.monotonic()
            manifest, voted = current.vote.result()
            if voted:
                self.log.append(_manifest_record(EpochStatus.PRE_COMMITTED, barrier, manifest, manifest.process_ms))
            processed = time.monotonic()
            record = self.commit(barrier, manifest, current.started)
            committed = time.monotonic()
            self.notify(manifest)
        except BaseException:
            if following is not None:
                following.restore_point.set_exception(
                    CheckpointError(f"epoch {barrier.epoch + 1} stopped before its vote: epoch {barrier.epoch} failed")
                )
                wait([following.vote])  # it stops before its vote; its barrier is reused later
            raise
        if following is not None:
            following.restore_point.set_result(record)
        phases = (processed - current.started, processed - waited, committed - processed, time.monotonic() - committed)
        ms = [1000 * seconds for seconds in phases]
        _log.info("epoch %d: until the vote %.0f ms (last %.0f ms waited), commit %.0f ms, notify %.0f ms", barrier.epoch, *ms)
        return record


def blocked_state(warehouse: str, pipeline: str) -> dict[str, Any] | None:
    """What blocks ``pipeline`` (``step``, ``lineage_id``, ``epoch``, ``message``, ``since``), or None."""
    return objects.read_json(PipelineLayout.of(warehouse, pipeline).blocked)


def backlog_report(warehouse: str, pipeline: str) -> dict[str, Any]:
    """The pipeline's backlog measured now (with its newest barrier's parameters), per source and in all, as JSON;
    ``{"error": ...}`` if it cannot be measured."""
    try:
        coordinator = CheckpointCoordinator(get_pipeline(pipeline), recorded_params(pipeline, warehouse), warehouse)
        measured = coordinator.backlog()
    except BarrierflowError as exc:
        return {"error": str(exc)}
    now_ms = int(time.time() * 1000)
    total = sum(measured.values(), Backlog())

    def doc(b: Backlog) -> dict[str, Any]:
        return {**b.to_json(), "lag_ms": b.lag_ms(now_ms)}

    return {"measured_at_ms": now_ms, "total": doc(total), "sources": {sid: doc(b) for sid, b in sorted(measured.items())}}


def recorded_params(pipeline: str, warehouse: str) -> dict[str, Any]:
    """The parameters the pipeline's newest barrier ran with ({} before the first epoch): the default of operations."""
    root = objects.join_uri(PipelineLayout.of(warehouse, pipeline).checkpoint_log, "_epochs")
    # Retained epochs only (maintenance expires the rest): a bounded listing.
    barriers = [f for f in objects.walk(root) if f.path.endswith("/barrier.json")]
    newest = max(barriers, key=lambda f: f.modified_at) if barriers else None
    doc = objects.read_json(objects.join_uri(root, newest.path)) if newest else None
    return dict(doc.get("params") or {}) if doc else {}


def _stopped_message(name: str, stop: Mapping[str, Any]) -> str:
    return (
        f"pipeline {name} was stopped with savepoint {stop.get('savepoint')!r} at {stop.get('stopped_at')}: "
        f"no epoch runs until it is restored (barrierflow savepoint restore {name} --savepoint {stop.get('savepoint')})"
    )


def _barrier_record(status: EpochStatus, barrier: Barrier, message: str = "") -> CheckpointRecord:
    """A checkpoint-log row of what ``barrier`` planned (PLANNED, or ABORTED with the error before a vote)."""
    return CheckpointRecord(
        pipeline=barrier.pipeline, lineage_id=barrier.lineage_id, epoch=barrier.epoch, status=status,
        attempt_id=barrier.attempt_id, recorded_at_us=now_us(), offsets=json.dumps(barrier.end_offsets, sort_keys=True),
        message=message, arrival_cutoff_ms=barrier.arrival_cutoff_ms, planned_by=barrier.planned_by,
        phase_ms=json.dumps({"barrier": barrier.plan_ms}), **_backlog_columns(barrier),
    )  # fmt: skip


def _manifest_record(
    status: EpochStatus, barrier: Barrier, manifest: Manifest, duration_ms: int, table_versions: str = "{}",
    commit_ms: int | None = None,
) -> CheckpointRecord:  # fmt: skip
    """The row of ``barrier`` with the manifest's attempt and metrics."""
    waited = dict(manifest.phase_ms)
    phases = {"barrier": barrier.plan_ms, "process": manifest.process_ms - sum(waited.values()), **waited}
    return dataclasses.replace(
        _barrier_record(status, barrier), attempt_id=manifest.attempt_id, watermark_us=manifest.watermark_us,
        max_event_time_us=manifest.max_event_time_us, rows_in=manifest.rows_in, rows_out=manifest.rows_out,
        dead_letters=manifest.dead_letters, bytes_written=manifest.bytes_written,
        state_bytes_written=manifest.state_bytes_written, duration_ms=duration_ms, table_versions=table_versions,
        phase_ms=json.dumps({**phases, **({"commit": commit_ms} if commit_ms is not None else {})}),
    )  # fmt: skip


def _backlog_columns(barrier: Barrier) -> dict[str, Any]:
    """The checkpoint-log columns of the input ``barrier`` left waiting (None when it was not measured)."""
    if not barrier.backlog:
        return {}
    total = sum((Backlog.from_json(doc) for doc in barrier.backlog.values()), Backlog())
    return {
        "backlog_files": total.files,
        "backlog_bytes": total.bytes,
        "input_lag_ms": total.lag_ms(barrier.processing_time_ms),
        "backlog": json.dumps(barrier.backlog, sort_keys=True),
    }
