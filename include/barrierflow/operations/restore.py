"""Restore: start a new lineage from a savepoint or a retained completed epoch.

:func:`restore` (each step idempotent; the next ``recover`` finishes a crashed one):

  1. take the pipeline's epoch lease;
  2. resolve the restore point: a savepoint (by name or path) or a retained completed epoch of the current lineage. Its start
     offsets are its sources' offsets state (:mod:`barrierflow.operators.operator_state` 8.), each checked against the copy in the
     checkpoint record or savepoint metadata (a :class:`CheckpointError` when they differ); a restore point from before offsets
     were state has only the copy, which is used (and logged) and seeds the offsets state in step 5. Offsets state of a source the
     code no longer has is dropped state (step 3) and starts no source;
  3. check it against the code: key groups must match; state whose schema evolved compatibly (added fields, widened types) is
     restored converted; state the code no longer declares (or with an incompatible schema, or without fields it had) would be
     dropped, state the restore point lacks would start empty: either refuses unless ``allow_non_restored_state``;
  4. write the intent ``_restoring.json`` put-if-absent (the new lineage id and
     all steps 5-9 need), so a crash is rolled forward, never redone differently;
  5-9. :mod:`barrierflow.checkpointing.restore_intent`; then release the lease.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping

import pyarrow as pa

from barrierflow.checkpointing.checkpoint import CheckpointRecord, EpochStatus
from barrierflow.checkpointing.checkpoint_log import iso_now
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.checkpointing.restore_intent import RestoreResult, complete_restore, state_rows, table_at
from barrierflow.checkpointing.savepoint_format import SavepointMetadata, load_savepoint, snapshot_schema
from barrierflow.core import faults
from barrierflow.core.errors import CheckpointError, IncompatibleSavepointError, SavepointError
from barrierflow.core.schema_evolution import ChangeKind, compare_schemas, state_signature
from barrierflow.core.settings import DEFAULT_LEASE_WAIT_S
from barrierflow.operators.operator_state import OFFSETS, restored_offsets
from barrierflow.plan.pipeline import Pipeline, PipelineDefinition
from barrierflow.storage import objects
from barrierflow.storage.layout import PipelineLayout

__all__ = ["restore", "RestoreResult", "restore_point", "restore_coordinator", "check_compatibility", "Compatibility"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Compatibility:
    """Step 3's answer: state restored (as is, or evolved), dropped, and starting empty; ``operator/state`` names."""

    restored: list[str]
    dropped: list[str]
    empty: list[str]
    evolved: dict[str, list[str]]  # restored state whose schema evolved -> what changed


def check_compatibility(
    pipe: Pipeline, key_groups: int, saved: Mapping[str, tuple[tuple[str, str], ...]], allow_non_restored_state: bool,
    stored_schema: Callable[[str], pa.Schema | None] = lambda name: None, seeded: Collection[str] = (),
) -> Compatibility:  # fmt: skip
    """Step 3, or IncompatibleSavepointError; ``seeded``: states restored from the record (step 2). A changed schema is compared
    field by field with ``stored_schema(name)``: added and widened fields restore, converted; removed ones only with
    ``allow_non_restored_state``; any other change (or an unreadable schema) drops the state, when allowed."""
    if key_groups != pipe.key_groups:
        raise IncompatibleSavepointError(
            f"the restore point has {key_groups} key groups and pipeline {pipe.name} declares "
            f"{pipe.key_groups}; key groups (max parallelism) never change within a pipeline",
            dropped=[],
            missing=[],
        )
    specs = {f"{s.operator_id}/{s.name}": s for s in pipe.state_specs()}
    current = {n: state_signature(s.arrow_schema()) for n, s in specs.items()}
    seeded = {n for n in seeded if n in current and n not in saved}
    restored = sorted(n for n in current if (n in saved and saved[n] == current[n]) or n in seeded)
    dropped, missing = sorted(set(saved) - set(current)), sorted(set(current) - set(saved) - seeded)
    evolved: dict[str, list[str]] = {}
    for name in sorted(n for n in current if n in saved and saved[n] != current[n]):
        spec, schema = specs[name], stored_schema(name)
        fixed = [f.name for f in spec.arrow_schema() if f.name not in spec.value_columns]  # keys, key group, bookkeeping
        evolution = compare_schemas(schema, spec.arrow_schema(), fixed) if schema is not None else None
        if evolution is not None and (evolution.restorable or (allow_non_restored_state and not evolution.incompatible)):
            restored.append(name)
            evolved[name] = evolution.describe()
            dropped += [f"{name}: {c}" for c in evolution.changes if c.kind is ChangeKind.REMOVED]
        else:
            what = "schema changed" + (": " + "; ".join(evolution.describe()) if evolution is not None else "")
            dropped.append(f"{name} ({what})")
            missing.append(f"{name} ({what})")
    if (dropped or missing) and not allow_non_restored_state:
        lines = [f"the restore point does not match pipeline {pipe.name}'s operators and state:"]
        if dropped:
            lines.append("  would be dropped (in the restore point, not restorable into the code): " + ", ".join(dropped))
        if missing:
            lines.append("  missing (declared by the code, would start empty): " + ", ".join(missing))
        lines.append(
            "added fields (nullable or with a default) and widened types (int to long, float to double) restore; "
            "set allow_non_restored_state to restore anyway"
        )
        raise IncompatibleSavepointError("\n".join(lines), dropped=dropped, missing=missing)
    return Compatibility(sorted(restored), dropped, sorted(set(current) - set(restored)), evolved)


def restore(
    definition: PipelineDefinition, warehouse: str, savepoint: str | None = None, epoch: int | None = None,
    allow_non_restored_state: bool = False, rewind_sinks: bool = False, parallelism: int | None = None,
    params: Mapping[str, Any] | None = None, lease_wait_s: float = DEFAULT_LEASE_WAIT_S,
) -> RestoreResult:  # fmt: skip
    """Steps 1-9 of the module docstring; give exactly one of ``savepoint`` and ``epoch``."""
    if parallelism is not None and (not isinstance(parallelism, int) or parallelism < 1):
        raise SavepointError(f"parallelism must be a positive integer, not {parallelism!r}")
    coordinator, meta = restore_coordinator(definition, warehouse, savepoint, epoch, params)
    layout = coordinator.layout
    coordinator.acquire_lease(wait_s=lease_wait_s)  # step 1
    try:
        coordinator.recover()  # finishes an earlier crashed restore, rolls epochs forward
        previous = coordinator.current_lineage()["lineage_id"]
        intent = restore_point(coordinator, meta, epoch)  # step 2
        compatibility = check_compatibility(  # step 3
            coordinator.pipeline,
            intent["key_groups"],
            {k: tuple(tuple(c) for c in v) for k, v in intent["states"].items()},
            allow_non_restored_state,
            lambda name: _stored_schema(layout, intent, meta, name),
            intent["seeded_states"],
        )
        overrides = {definition.parallelism_param: parallelism} if parallelism and definition.parallelism_param else {}
        intent.update(
            lineage_id=uuid.uuid4().hex[:12],
            lineage_seq=coordinator.current_lineage_seq()[0] + 1,
            previous_lineage_id=previous,
            rewind_sinks=rewind_sinks,
            params=overrides,
            restored_states=compatibility.restored,
            dropped_states=compatibility.dropped,
            empty_states=compatibility.empty,
            evolved_states=compatibility.evolved,
            started_at=iso_now(),
        )
        if not objects.write_json_if_absent(layout.restoring, intent):  # step 4
            raise CheckpointError(f"another restore of {definition.name} started concurrently; retry")
        faults.maybe_fail("restore.after_intent")
        return complete_restore(layout, definition, coordinator.pipeline, intent)
    finally:
        coordinator.release_lease()  # step 9


def restore_coordinator(
    definition: PipelineDefinition, warehouse: str, savepoint: str | None, epoch: int | None, params: Mapping[str, Any] | None
) -> tuple[CheckpointCoordinator, SavepointMetadata | None]:
    """The coordinator of a restore from ``savepoint`` xor ``epoch``, and the savepoint. A savepoint carries its parameters
    (``params`` override them): it restores into an empty warehouse as is."""
    if (savepoint is None) == (epoch is None):
        raise SavepointError("restore needs exactly one of a savepoint (name or path) and a retained epoch")
    meta = load_savepoint(definition.name, warehouse, savepoint) if savepoint is not None else None
    merged = {**(meta.params if meta else {}), **(params or {})}
    return CheckpointCoordinator(definition, merged, warehouse), meta


def restore_point(coordinator: CheckpointCoordinator, meta: SavepointMetadata | None, epoch: int | None) -> dict[str, Any]:
    """Step 2 (nothing is written): everything about the restore point (``meta``, or ``epoch``), as a JSON document."""
    layout = coordinator.layout
    cut: SavepointMetadata | CheckpointRecord
    point: dict[str, Any]
    if meta is not None:
        cut, key_groups, recorded = meta, meta.key_groups, dict(meta.offsets)
        point = {"source": "savepoint", "restored_from": f"savepoint {meta.name}", "savepoint_uri": meta.uri}
        states = {s.name: s.schema for s in meta.states if s.schema}
    else:
        lineage_id = coordinator.current_lineage()["lineage_id"]
        records = [r for r in coordinator.log.lineage_records(lineage_id) if r.status is EpochStatus.COMPLETED]
        match = [r for r in records if r.epoch == epoch]
        retained = sorted(r.epoch for r in records if objects.exists(layout.epoch_dir(lineage_id, r.epoch)))
        if not match or epoch not in retained:
            contiguous = retained and retained == list(range(retained[0], retained[-1] + 1))
            listed = f"{retained[0]}-{retained[-1]}" if contiguous else ", ".join(map(str, retained)) or "none"
            raise SavepointError(
                f"epoch {epoch} is not a retained completed epoch of {coordinator.definition.name}'s current "
                f"lineage {lineage_id}; retained: {listed} (or restore a savepoint)"
            )
        cut, key_groups, recorded = match[0], coordinator.ensure_created()["key_groups"], match[0].offsets_json()
        versions = cut.versions()
        point = {"source": "epoch", "restored_from": f"epoch {epoch} of lineage {lineage_id}", "table_versions": versions}
        tables = {f"{op}/{st}": table_at(versions, layout.state_table(op, st), f"{op}__{st}") for op, st in layout.state_tables()}
        states = {name: state_signature(pa.schema(t.schema().to_arrow())) for name, t in tables.items() if t is not None}
    point.update(epoch=cut.epoch, key_groups=key_groups, offsets=recorded, watermark_us=cut.watermark_us)
    point.update(max_event_time_us=cut.max_event_time_us, arrival_cutoff_ms=cut.arrival_cutoff_ms)
    point["states"] = {name: [list(c) for c in schema] for name, schema in states.items()}
    # The recorded offsets, replaced by the sources' offsets state (kept, and listed as seeded, where it lacks).
    offsets: dict[str, Any] = {}
    seeded: list[str] = []
    for node in coordinator.pipeline.sources:
        source_id, name = node.operator_id, f"{node.operator_id}/{OFFSETS.name}"
        chunks = list(state_rows(layout, point, meta, source_id, OFFSETS.name)) if name in point["states"] else []
        state = restored_offsets(source_id, pa.concat_tables(chunks)) if chunks else None
        if state is not None:
            if source_id in recorded and recorded[source_id] != state:
                raise CheckpointError(
                    f"source {source_id}: the restore point's offsets state holds {json.dumps(state, sort_keys=True)} "
                    f"but its recorded offsets are {json.dumps(recorded[source_id], sort_keys=True)}; one of them was "
                    "changed outside barrierflow: restore another savepoint or retained checkpoint"
                )
            offsets[source_id] = state
        elif source_id in recorded:
            _log.warning(
                "%s: source %s has no offsets state (written by an older release): restoring its recorded offsets",
                point["restored_from"], source_id,
            )  # fmt: skip
            offsets[source_id] = recorded[source_id]
            seeded.append(name)
    return {**point, "offsets": offsets, "seeded_states": seeded}


def _stored_schema(
    layout: PipelineLayout, intent: Mapping[str, Any], savepoint: SavepointMetadata | None, name: str
) -> pa.Schema | None:
    """Step 3: the schema state ``operator/state`` has at the restore point (None if it holds no rows there)."""
    op, state = name.split("/", 1)
    if savepoint is not None:
        files = next((s.files for s in savepoint.states if s.operator_id == op and s.state == state), ())
        return snapshot_schema(savepoint, files)
    table = table_at(intent["table_versions"], layout.state_table(op, state), f"{op}__{state}")
    return pa.schema(table.schema().to_arrow()) if table is not None else None
