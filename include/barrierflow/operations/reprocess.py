"""Reprocessing: restore, then replay every data interval after the restore point, in order.

After fixing a bug, run the input since a savepoint (or retained epoch) again,
so the sinks end up as if the history had run once with the current code:

  1. plan: the epochs the replay will produce from the restore point, one per
     data interval holding input; reported before anything changes;
  2. hold the pipeline: the schedule's runs plan nothing meanwhile;
  3. restore (sinks rewound by default);
  4. replay epochs one interval at a time up to the last ended interval, again
     until nothing is left, so the schedule takes over from the present;
  5. release the hold, also on failure (the schedule then goes on with the replay, as every run cuts its epochs at interval ends).

``replay`` runs step 4: the coordinator's loop in this process by default; the DAG passes its own."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from barrierflow.checkpointing.checkpoint import CheckpointRecord, EpochStatus
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.checkpointing.intervals import ArrivalBound, cutoff_text, previous_interval_end_ms
from barrierflow.connectors.source import describe_offsets
from barrierflow.core.errors import EpochInProgressError
from barrierflow.core.settings import DEFAULT_LEASE_WAIT_S
from barrierflow.operations.restore import RestoreResult, restore, restore_coordinator, restore_point
from barrierflow.plan.pipeline import PipelineDefinition

__all__ = ["PlannedEpoch", "ReprocessPlan", "ReprocessResult", "plan_reprocess", "reprocess"]

# Runs the epochs within a bound until none is left; returns the epochs it completed.
Replay = Callable[[CheckpointCoordinator, ArrivalBound], list[int]]


@dataclass(frozen=True)
class PlannedEpoch:
    """One epoch of a replay: the input of one data interval."""

    arrival_cutoff_ms: int | None
    inputs: Mapping[str, Any]  # end offsets per source (files for a file source)

    def describe(self) -> str:
        return f"interval ending {cutoff_text(self.arrival_cutoff_ms)}: {describe_offsets(self.inputs)}"


@dataclass(frozen=True)
class ReprocessPlan:
    pipeline: str
    restore_epoch: int
    restored_from: str
    restore_cutoff_ms: int | None
    until_ms: int
    epochs: tuple[PlannedEpoch, ...]

    def describe(self) -> list[str]:
        head = (
            f"{self.pipeline}: restore {self.restored_from} (epoch {self.restore_epoch}, arrival cut-off "
            f"{cutoff_text(self.restore_cutoff_ms)}), then replay {len(self.epochs)} epoch(s) up to "
            f"{cutoff_text(self.until_ms)}"
        )
        return [head, *(f"  epoch {self.restore_epoch + i + 1}: {e.describe()}" for i, e in enumerate(self.epochs))]


@dataclass(frozen=True)
class ReprocessResult:
    plan: ReprocessPlan
    restored: RestoreResult
    replayed: tuple[CheckpointRecord, ...] = field(default_factory=tuple)

    def describe(self) -> list[str]:
        lines = [f"restored {self.restored.restored_from} into lineage {self.restored.lineage_id}"]
        lines += [
            f"  epoch {r.epoch} COMPLETED: interval ending {cutoff_text(r.arrival_cutoff_ms)}, rows_in={r.rows_in} "
            f"rows_out={r.rows_out} dead_letters={r.dead_letters}"
            for r in self.replayed
        ]
        lines.append(f"replayed {len(self.replayed)} epoch(s); the schedule goes on from here")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "restored": self.restored.to_json(),
            "planned": [{"arrival_cutoff_ms": e.arrival_cutoff_ms, "inputs": dict(e.inputs)} for e in self.plan.epochs],
            "replayed": [
                {"epoch": r.epoch, "arrival_cutoff_ms": r.arrival_cutoff_ms, "rows_in": r.rows_in} for r in self.replayed
            ],
        }


def plan_reprocess(
    definition: PipelineDefinition, warehouse: str, *, schedule: str | None, savepoint: str | None = None,
    epoch: int | None = None, params: Mapping[str, Any] | None = None, now_ms: int | None = None,
) -> ReprocessPlan:  # fmt: skip
    """Step 1: the restore point and the epochs a replay from it would produce now (records nothing)."""
    coordinator, meta = restore_coordinator(definition, warehouse, savepoint, epoch, params)
    point = restore_point(coordinator, meta, epoch)
    until = _until(schedule, now_ms)
    planned = coordinator.preview_epochs(point["offsets"], ArrivalBound(cutoff_ms=until, schedule=schedule))
    return ReprocessPlan(
        pipeline=definition.name,
        restore_epoch=int(point["epoch"]),
        restored_from=point["restored_from"],
        restore_cutoff_ms=point.get("arrival_cutoff_ms"),
        until_ms=until,
        epochs=tuple(PlannedEpoch(cutoff, end) for cutoff, end in planned),
    )


def reprocess(
    definition: PipelineDefinition, warehouse: str, *, schedule: str | None, owner: str, savepoint: str | None = None,
    epoch: int | None = None, rewind_sinks: bool = True, allow_non_restored_state: bool = False,
    parallelism: int | None = None, params: Mapping[str, Any] | None = None,
    spark_factory: Callable[[], Any] | None = None, replay: Replay | None = None,
    on_plan: Callable[[ReprocessPlan], None] = lambda plan: None, lease_wait_s: float = DEFAULT_LEASE_WAIT_S,
) -> ReprocessResult:  # fmt: skip
    """Steps 1-5 of the module docstring; ``owner`` names this operation in the hold and its barriers."""
    plan = plan_reprocess(definition, warehouse, schedule=schedule, savepoint=savepoint, epoch=epoch, params=params)  # 1
    on_plan(plan)
    coordinator = CheckpointCoordinator(definition, params or {}, warehouse, spark_factory=spark_factory)
    hold = coordinator.hold(owner, f"reprocessing from {plan.restored_from}")  # 2
    if hold.get("owner") != owner:
        raise EpochInProgressError(
            f"pipeline {definition.name} is already held by {hold.get('owner')} ({hold.get('reason')}, since "
            f"{hold.get('since')}); one reprocessing at a time"
        )
    try:
        restored = restore(  # 3
            definition, warehouse, savepoint, epoch, allow_non_restored_state, rewind_sinks, parallelism, params, lease_wait_s
        )
        # The restore may fix parameters (a parallelism) for the new lineage: build anew.
        coordinator = CheckpointCoordinator(definition, params or {}, warehouse, spark_factory=spark_factory)
        run_epochs = replay or (lambda c, bound: [r.epoch for r in c.run(until_caught_up=True, bound=bound)])
        epochs: list[int] = []
        # 4: until the last ended interval, again until nothing is left.
        while done := run_epochs(coordinator, ArrivalBound(cutoff_ms=_until(schedule), schedule=schedule, owner=owner)):
            epochs += done
        records = coordinator.log.lineage_records(restored.lineage_id)
        replayed = sorted(
            (r for r in records if r.epoch in set(epochs) and r.status is EpochStatus.COMPLETED), key=lambda r: r.epoch
        )
        return ReprocessResult(plan=plan, restored=restored, replayed=tuple(replayed))
    finally:
        coordinator.release_hold(owner)  # 5


def _until(schedule: str | None, now_ms: int | None = None) -> int:
    """The replay's arrival cut-off: the end of the last interval that has ended (now, without a schedule)."""
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    return previous_interval_end_ms(schedule, now) if schedule else now
