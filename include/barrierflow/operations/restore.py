"""Restore: start a new lineage from a savepoint or a retained completed epoch.

:func:`restore` (each step idempotent; a crash is finished by the next
``recover``, which sees the intent):

  1. take the pipeline's epoch lease (never races a running epoch);
  2. resolve the restore point: a savepoint (by name or path) or a completed
     epoch of the current lineage whose checkpoint is still retained. Its
     start offsets are its sources' offsets state (union list state, see
     :mod:`barrierflow.operators.operator_state` 8.), each checked against
     the copy the checkpoint record or savepoint metadata holds (a
     :class:`CheckpointError` when they differ); a restore point written
     before offsets were state has only that copy, which is then used (and
     said so in the log) and seeds the source's offsets state in step 5.
     Offsets state of a source the code no longer has is state that would
     be dropped (step 3), and its offsets start no source;
  3. check it against the current code: key groups must match; state whose
     schema evolved compatibly (added fields, widened types: see
     :mod:`barrierflow.core.schema_evolution`) is restored converted, and said so;
     state that the code no longer declares (or declares with an incompatible
     schema, or without fields it had) would be dropped, state the code
     declares that the restore point lacks would start empty. Either refuses
     with both lists unless ``allow_non_restored_state``;
  4. write the intent ``_restoring.json`` put-if-absent: the new lineage id
     and everything below needs, so a crash is rolled forward, never redone
     differently;
  5. replace every state table's content with the restore point's rows
     (converted to the code's schema when it evolved, or nothing), in a commit carrying the new lineage's app transaction at the
     restore epoch N;
  6. with ``rewind_sinks``, remove from append sinks and ``dead_letter`` every
     row of an epoch after N, and set upsert sinks back to their rows at N
     (in the restore point's schema: an epoch whose output widens a column
     then widens the table, see :mod:`barrierflow.connectors.delta_sink`),
     in commits carrying the same app transaction (an absent upsert sink is
     always seeded: there is nothing to rewind, only a table to make whole);
     then raise the fencing token (new lineage sequence, N) on every table
     of the pipeline that steps 5-6 did not commit to (an empty commit):
     the commits of steps 5-6 carry it already. From here on no commit of
     the old lineage lands on any table (``Fence``);
  7. record epoch N COMPLETED in the new lineage, with step 2's offsets, watermark and
     the tables' versions after steps 5-6: the restore point is the new
     lineage's consistent cut;
  8. write the lineage document (the switch: from here on the new lineage is
     current and epochs N+1, N+2, ... replay the input after the restore point);
  9. remove the stop marker and the intent; release the lease.

Because the app id names the lineage, replayed epochs are never mistaken for
the old lineage's committed ones, and an old lineage's zombie is fenced.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from barrierflow.checkpointing.checkpoint import EpochStatus
from barrierflow.checkpointing.checkpoint_log import iso_now
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.checkpointing.restore_intent import RestoreResult, complete_restore, state_rows
from barrierflow.checkpointing.savepoint_format import SavepointMetadata, load_savepoint
from barrierflow.core import faults
from barrierflow.core.errors import CheckpointError, IncompatibleSavepointError, SavepointError
from barrierflow.core.schema_evolution import ChangeKind, compare_schemas, state_signature
from barrierflow.core.settings import DEFAULT_LEASE_WAIT_S
from barrierflow.operators.operator_state import OFFSETS, restored_offsets
from barrierflow.plan.pipeline import Pipeline, PipelineDefinition
from barrierflow.storage import objects
from barrierflow.storage.delta import open_table
from barrierflow.storage.layout import PipelineLayout

__all__ = [
    "restore",
    "RestoreResult",
    "RestorePoint",
    "describe_restore_point",
    "IncompatibleSavepointError",
    "check_compatibility",
    "Compatibility",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Compatibility:
    """Step 3's answer: state restored (as is, or evolved), dropped, and starting empty; ``operator/state`` names."""

    restored: list[str]
    dropped: list[str]
    empty: list[str]
    evolved: dict[str, list[str]]  # restored state whose schema evolved -> what changed


def check_compatibility(
    pipe: Pipeline,
    key_groups: int,
    saved: Mapping[str, tuple[tuple[str, str], ...]],
    allow_non_restored_state: bool,
    stored_schema: Callable[[str], pa.Schema | None] = lambda name: None,
    seeded: Collection[str] = (),
) -> Compatibility:
    """Step 3, or IncompatibleSavepointError.

    ``seeded``: states the restore point lacks but restores from its record
    (step 2: the offsets of a source written before offsets were state).

    A state whose schema changed is compared field by field
    (:mod:`barrierflow.core.schema_evolution`) with ``stored_schema(name)``, the
    restore point's: added and widened fields restore, converted. Removed
    fields restore without them only with ``allow_non_restored_state``; any
    other change (or a restore point whose schema cannot be read) leaves the
    state dropped and started empty, again only when allowed.
    """
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
    definition: PipelineDefinition,
    warehouse: str,
    savepoint: str | None = None,
    epoch: int | None = None,
    allow_non_restored_state: bool = False,
    rewind_sinks: bool = False,
    parallelism: int | None = None,
    params: Mapping[str, Any] | None = None,
    lease_wait_s: float = DEFAULT_LEASE_WAIT_S,
) -> RestoreResult:
    """Steps 1-9 of the module docstring; give exactly one of ``savepoint`` and ``epoch``."""
    if (savepoint is None) == (epoch is None):
        raise SavepointError("restore needs exactly one of a savepoint (name or path) and a retained epoch")
    if parallelism is not None and (not isinstance(parallelism, int) or parallelism < 1):
        raise SavepointError(f"parallelism must be a positive integer, not {parallelism!r}")
    meta = load_savepoint(definition.name, warehouse, savepoint) if savepoint is not None else None
    if meta is not None:
        # A savepoint carries its parameters, so it restores into an empty warehouse as is.
        params = {**meta.params, **(params or {})}
    coordinator = CheckpointCoordinator(definition, params or {}, warehouse)
    layout = coordinator.layout
    coordinator.acquire_lease(wait_s=lease_wait_s)  # step 1
    try:
        coordinator.recover()  # finishes an earlier crashed restore, rolls epochs forward
        previous = coordinator.current_lineage()["lineage_id"]
        intent = _restore_point(coordinator, meta, epoch)  # step 2
        pipe = coordinator.pipeline
        compatibility = check_compatibility(  # step 3
            pipe,
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


@dataclass(frozen=True)
class RestorePoint:
    """Where a restore would start: its epoch, offsets and arrival cut-off, and the parameters it runs with."""

    epoch: int
    restored_from: str
    offsets: Mapping[str, Any]
    arrival_cutoff_ms: int | None
    params: Mapping[str, Any]


def describe_restore_point(
    definition: PipelineDefinition,
    warehouse: str,
    savepoint: str | None = None,
    epoch: int | None = None,
    params: Mapping[str, Any] | None = None,
) -> RestorePoint:
    """Step 2 of :func:`restore` alone (nothing is written): what a restore from there starts from."""
    if (savepoint is None) == (epoch is None):
        raise SavepointError("restore needs exactly one of a savepoint (name or path) and a retained epoch")
    meta = load_savepoint(definition.name, warehouse, savepoint) if savepoint is not None else None
    merged = {**(meta.params if meta else {}), **(params or {})}
    point = _restore_point(CheckpointCoordinator(definition, merged, warehouse), meta, epoch)
    return RestorePoint(
        epoch=int(point["epoch"]),
        restored_from=point["restored_from"],
        offsets=point["offsets"],
        arrival_cutoff_ms=point.get("arrival_cutoff_ms"),
        params=merged,
    )


def _restore_point(coordinator: CheckpointCoordinator, meta: SavepointMetadata | None, epoch: int | None) -> dict[str, Any]:
    """Step 2: everything about the restore point (a loaded savepoint or an epoch), as a JSON document."""
    layout = coordinator.layout
    if meta is not None:
        point = {
            "source": "savepoint",
            "restored_from": f"savepoint {meta.name}",
            "savepoint_uri": meta.uri,
            "epoch": meta.epoch,
            "key_groups": meta.key_groups,
            "offsets": dict(meta.offsets),
            "watermark_us": meta.watermark_us,
            "max_event_time_us": meta.max_event_time_us,
            "arrival_cutoff_ms": meta.arrival_cutoff_ms,
            "states": {s.name: [list(c) for c in s.schema] for s in meta.states if s.schema},
        }
        return _with_offsets(coordinator, point, meta)
    assert epoch is not None
    lineage_id = coordinator.current_lineage()["lineage_id"]
    records = [r for r in coordinator.log.lineage_records(lineage_id) if r.status is EpochStatus.COMPLETED]
    match = [r for r in records if r.epoch == epoch]
    retained = sorted(r.epoch for r in records if objects.exists(layout.epoch_dir(lineage_id, r.epoch)))
    if not match or epoch not in retained:
        raise SavepointError(
            f"epoch {epoch} is not a retained completed epoch of {coordinator.definition.name}'s current "
            f"lineage {lineage_id}; retained: {_ranges(retained) or 'none'} (or restore a savepoint)"
        )
    record = match[0]
    versions = record.versions()
    states: dict[str, Any] = {}
    for op, st in layout.state_tables():
        name = f"{op}__{st}"
        if name in versions:
            table = open_table(layout.state_table(op, st), versions[name])
            if table is not None:
                states[f"{op}/{st}"] = [list(c) for c in state_signature(pa.schema(table.schema().to_arrow()))]
    point = {
        "source": "epoch",
        "restored_from": f"epoch {epoch} of lineage {lineage_id}",
        "epoch": epoch,
        "key_groups": coordinator.ensure_created()["key_groups"],
        "offsets": record.offsets_json(),
        "watermark_us": record.watermark_us,
        "max_event_time_us": record.max_event_time_us,
        "arrival_cutoff_ms": record.arrival_cutoff_ms,
        "table_versions": versions,
        "states": states,
    }
    return _with_offsets(coordinator, point, None)


def _with_offsets(
    coordinator: CheckpointCoordinator, point: dict[str, Any], savepoint: SavepointMetadata | None
) -> dict[str, Any]:
    """Step 2's offsets: each source's offsets state at the restore point, checked against the recorded copy.

    ``point["offsets"]`` comes in as the recorded copy (checkpoint record or
    savepoint metadata); it goes out as the offsets of the code's sources,
    from their state, or from the copy for a source whose state the restore
    point lacks (``seeded_states``: written by an older release).
    """
    recorded = point["offsets"]
    offsets: dict[str, Any] = {}
    seeded: list[str] = []
    for node in coordinator.pipeline.sources:
        source_id, name = node.operator_id, f"{node.operator_id}/{OFFSETS.name}"
        chunks = (
            list(state_rows(coordinator.layout, point, savepoint, source_id, OFFSETS.name)) if name in point["states"] else []
        )
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
        snap = next((s for s in savepoint.states if s.operator_id == op and s.state == state), None)
        if snap is None or not snap.files:
            return None
        filesystem, path = objects.arrow_filesystem(objects.join_uri(savepoint.uri, snap.files[0]))
        return pq.read_schema(path, filesystem=filesystem)
    version = intent["table_versions"].get(f"{op}__{state}")
    table = open_table(layout.state_table(op, state), version) if version is not None else None
    return pa.schema(table.schema().to_arrow()) if table is not None else None


def _ranges(epochs: list[int]) -> str:
    if not epochs:
        return ""
    return f"{epochs[0]}-{epochs[-1]}" if epochs == list(range(epochs[0], epochs[-1] + 1)) else ", ".join(map(str, epochs))
