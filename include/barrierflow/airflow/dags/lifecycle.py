"""The epoch lifecycle as separately retryable steps (what the pipeline DAG's tasks call).

Each function is one step of :class:`~barrierflow.checkpointing.coordinator.CheckpointCoordinator` for the current
epoch, under the epoch lease (waited for, bounded). What a step needs (the pending barrier, the vote) is read from the
warehouse, so each step can be retried alone and the run after a failed one resumes from the last committed epoch.
No Airflow here: the DAG turns a :class:`StepReport` into log lines, a skip, or an asset event."""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Mapping

from barrierflow.airflow.dags.operations import xcom_json
from barrierflow.checkpointing.coordinator import CheckpointCoordinator, Recovery
from barrierflow.checkpointing.intervals import ArrivalBound, airflow_run_of, cutoff_text
from barrierflow.connectors.source import describe_offsets
from barrierflow.core.errors import CheckpointError

__all__ = ["StepReport", "barrier_step", "process_step", "commit_step", "notify_step", "run_epochs"]

_log = logging.getLogger("barrierflow.airflow.dags")


@dataclass(frozen=True)
class StepReport:
    """What a step did, for the task log and the UI (XCom), never read by another step; ``proceed`` is False when the
    rest of the epoch must be skipped (no new input, pipeline stopped)."""

    pipeline: str
    step: str
    message: str
    epoch: int | None = None
    lineage_id: str | None = None
    proceed: bool = True
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return xcom_json(asdict(self))


@contextmanager
def _epoch_lease(coordinator: CheckpointCoordinator, wait_s: float) -> Iterator[None]:
    """Hold the pipeline's epoch lease for one step, waiting up to ``wait_s`` for it."""
    coordinator.acquire_lease(wait_s=wait_s)
    try:
        yield
    finally:
        coordinator.release_lease()


def _stop_reason(coordinator: CheckpointCoordinator) -> str | None:
    if (stop := coordinator.stopped()) is None:
        return None
    name, savepoint, since = coordinator.definition.name, stop.get("savepoint"), stop.get("stopped_at")
    return f"pipeline {name} is stopped with savepoint {savepoint!r} (since {since}): no epoch runs until it is restored"


def _recovery_text(recovery: Recovery) -> str:
    last = recovery.last_completed
    text = (
        f"restore point: epoch {last.epoch} (COMPLETED, watermark_us={last.watermark_us})"
        if last
        else "restore point: none (no epoch completed yet in this lineage)"
    )
    rolled = f"; rolled forward pre-committed epoch(s) {list(recovery.rolled_forward)}" if recovery.rolled_forward else ""
    return text + rolled


def barrier_step(
    coordinator: CheckpointCoordinator,
    bound: ArrivalBound,
    lease_wait_s: float,
    owner_active: Callable[[str], bool] = lambda owner: False,
) -> StepReport:
    """Steps 1 and 2 for the run ``bound.owner``: recover, then plan or replay barrier n.

    0. A pipeline held by another owner (a reprocessing replaying its intervals) plans nothing for this run. A hold whose Airflow
       run has ended is stale and released; a hold of a ``barrierflow`` command stays until that command releases it.
    1. Recover: roll forward a voted epoch; the last COMPLETED epoch is the restore point.
    2. A pending barrier (planned, not committed) belongs to the run that planned it:
       a. this run's own (a retry, or its ``catch_up``): replayed as recorded;
       b. another run's that is still active (only a later run can be, as earlier ones are waited for before this
          step): left to it, and this run does nothing; its input is in that run's epochs;
       c. another run's that has ended without committing it (failed, or a ``barrierflow run``): finished here as
          recorded, with its own cut-off, and said so; this run's input follows in ``catch_up``.
    3. Otherwise plan a barrier within ``bound``: the earliest interval with input (:mod:`barrierflow.checkpointing.intervals`).

    ``proceed=False`` when there is nothing to process."""
    name = coordinator.definition.name
    with _epoch_lease(coordinator, lease_wait_s):
        recovery = coordinator.recover()  # 1
        held = _hold_of_another(coordinator, bound.owner, owner_active)  # 0
        pending = recovery.pending_barrier
        foreign = pending if pending is not None and pending.planned_by != bound.owner else None
        if held is not None or (foreign is not None and owner_active(foreign.planned_by)):  # 0, 2b
            barrier, stop = None, None
        else:  # 2a, 2c, 3
            barrier = coordinator.trigger_checkpoint(recovery, bound)
            stop = _stop_reason(coordinator) if barrier is None else None
    run_cutoff = cutoff_text(bound.cutoff_ms)
    details: dict[str, Any] = {"last_completed_epoch": recovery.last_completed_epoch, "run_cutoff": run_cutoff}
    details["rolled_forward"] = list(recovery.rolled_forward)
    prefix = f"{name} lineage {recovery.lineage_id}: {_recovery_text(recovery)}. "
    if barrier is None:
        last = recovery.last_completed_epoch
        if stop is not None:
            why = stop
        elif held is not None:
            why = (
                f"the pipeline is held by {held['owner']} ({held.get('reason')}, since {held.get('since')}): "
                "it replays the input in interval order, and this run's interval comes after it"
            )
        elif foreign is not None:
            why = (
                f"epoch {foreign.epoch} was planned by run {foreign.planned_by} (arrival cut-off "
                f"{cutoff_text(foreign.arrival_cutoff_ms)}), which is still running: it is that run's to finish, "
                "and input up to this run's cut-off is in its epochs"
            )
        else:
            why = (
                f"no new input up to {run_cutoff}: nothing to do. Input that arrived by then is already covered "
                f"by epoch {last} (the last completed epoch); epoch {last + 1} is not planned"
            )
        details |= {"stopped": stop is not None, "owned_by": foreign.planned_by if foreign else None}
        message = f"{prefix}{why}. Skipping process and commit"
        return StepReport(name, "barrier", message, last, recovery.lineage_id, proceed=False, details=details)
    if pending is None:
        verb = "planned a new barrier"
    elif foreign is not None:
        verb = (
            f"finishing the barrier that run {foreign.planned_by or '(unknown)'} recorded at {foreign.planned_at} and "
            "left uncommitted when it ended, as recorded; this run's own input follows in catch_up"
        )
    else:
        verb = f"replaying the barrier this run recorded at {pending.planned_at}"
    cutoff = cutoff_text(barrier.arrival_cutoff_ms)
    offsets = describe_offsets(barrier.end_offsets)
    message = f"{prefix}epoch {barrier.epoch}: {verb} (epoch's arrival cut-off {cutoff}, this run's {run_cutoff}): {offsets}"
    details |= {"replayed": pending is not None, "planned_by": barrier.planned_by, "attempt_id": barrier.attempt_id}
    details["arrival_cutoff"] = cutoff
    return StepReport(name, "barrier", message, barrier.epoch, recovery.lineage_id, details=details)


def _hold_of_another(coordinator: CheckpointCoordinator, owner: str, active: Callable[[str], bool]) -> dict[str, Any] | None:
    """The hold in force if another owner holds the pipeline (step 0 of :func:`barrier_step`)."""
    hold = coordinator.held_by()
    if hold is None or hold.get("owner") == owner:
        return None
    holder = str(hold.get("owner"))
    if airflow_run_of(holder) is not None and not active(holder):
        coordinator.release_hold(holder)
        _log.warning("released the hold of %s (%s): that run has ended", holder, hold.get("reason"))
        return None
    return hold


def process_step(coordinator: CheckpointCoordinator, lease_wait_s: float) -> StepReport:
    """Step 3: process + pre-commit the planned epoch on the coordinator's Spark (idempotent: the first durable manifest
    wins); a stopped pipeline's planned epoch is not processed."""
    name = coordinator.definition.name
    with _epoch_lease(coordinator, lease_wait_s):
        manifest = coordinator.process_planned()
        stop = _stop_reason(coordinator) if manifest is None else None
    if manifest is None:
        message = f"{stop}; the planned epoch is not processed" if stop else "no planned epoch to process"
        return StepReport(name, "process", message, proceed=False)
    m = manifest
    message = (
        f"epoch {m.epoch} pre-committed by attempt {m.attempt_id}: rows_in={m.rows_in} rows_out={m.rows_out} "
        f"dead_letters={m.dead_letters}, {m.bytes_written} bytes staged in {m.process_ms} ms"
    )
    details = {"attempt_id": m.attempt_id, "process_ms": m.process_ms, "rows_in": m.rows_in}
    return StepReport(name, "process", message, m.epoch, m.lineage_id, details=details)


def commit_step(coordinator: CheckpointCoordinator, lease_wait_s: float) -> StepReport:
    """Step 4: commit the planned epoch from its barrier and vote (idempotent): the coordinator's roll-forward. With no
    epoch pending, this run's epoch is already COMPLETED (by an earlier attempt, or a recover): reported, success."""
    name = coordinator.definition.name
    with _epoch_lease(coordinator, lease_wait_s):
        recovery = coordinator.recover()
        stop = _stop_reason(coordinator)
    pending, record = recovery.pending_barrier, recovery.last_completed
    if pending is not None and not recovery.rolled_forward:
        if stop is not None:
            message = f"{stop}; planned epoch {pending.epoch} is not committed"
            return StepReport(name, "commit", message, pending.epoch, recovery.lineage_id, proceed=False)
        raise CheckpointError(
            f"{name}: epoch {pending.epoch} has no manifest: the process step has not pre-committed it "
            "(no vote); the next run replays its barrier"
        )
    if record is None:
        raise CheckpointError(f"{name}: nothing to commit: no epoch is planned or completed in lineage {recovery.lineage_id}")
    done = "COMPLETED" if recovery.rolled_forward else "is already COMPLETED (committed by an earlier attempt or rolled forward)"
    r, versions = record, record.versions()
    message = (
        f"epoch {r.epoch} {done}: rows_in={r.rows_in} rows_out={r.rows_out} dead_letters={r.dead_letters}; "
        f"Delta versions {json.dumps(versions, sort_keys=True)}"
    )
    details = {"table_versions": versions, "rows_in": r.rows_in, "rows_out": r.rows_out}
    return StepReport(name, "commit", message, r.epoch, r.lineage_id, details=details)


def notify_step(coordinator: CheckpointCoordinator, lease_wait_s: float) -> StepReport:
    """Step 5: post-commit work for the last completed epoch (idempotent)."""
    name = coordinator.definition.name
    with _epoch_lease(coordinator, lease_wait_s):
        last, notified = coordinator.notify_completed()
    if last is None:
        return StepReport(name, "notify", "no completed epoch: nothing to do")
    message = (
        f"epoch {last.epoch}: staging of losing attempts cleaned, state compacted where needed"
        if notified
        else f"epoch {last.epoch} has no manifest in this lineage (a restore point): nothing to clean"
    )
    return StepReport(name, "notify", message, last.epoch, last.lineage_id)


def run_epochs(
    coordinator: CheckpointCoordinator,
    bound: ArrivalBound,
    lease_wait_s: float,
    process: Callable[[], object],
    limit: int | None = None,
    on_report: Callable[[StepReport], object] = lambda report: None,
    owner_active: Callable[[str], bool] = lambda owner: False,
) -> list[StepReport]:
    """Steps 1-5 of up to ``limit`` more epochs (None: until no new input), each step under its own
    lease; ``process`` runs step 3 (the Spark job). Returns the commit reports."""
    committed: list[StepReport] = []
    while limit is None or len(committed) < limit:
        planned = barrier_step(coordinator, bound, lease_wait_s, owner_active)
        on_report(planned)
        if not planned.proceed:
            break
        process()
        commit = commit_step(coordinator, lease_wait_s)
        on_report(commit)
        if not commit.proceed:
            break
        on_report(notify_step(coordinator, lease_wait_s))
        committed.append(commit)
    return committed
