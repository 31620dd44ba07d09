"""Maintenance: compaction, checkpoint expiry and vacuum, under the epoch lease.

:func:`run_maintenance`:
  1. take the epoch lease (no running epoch can lose a file);
  2. recover, so the checkpoint log ends at a completed epoch;
  3. compact every state table of several files (``dataChange=false``: the
     content at every version is unchanged) and the checkpoint log;
  4. expire completed checkpoints beyond the newest ``retained_checkpoints`` of the current lineage, and all of earlier lineages:
     their epoch directories go, so they can no longer be restored or queried;
  5. vacuum every table keeping the retained checkpoints' versions, whatever the retention (savepoints live outside every table);
  6. sweep barrierflow's own (``_``) data directories of every table, which delta-rs's vacuum never lists: delete files older than
     the retention that no current or retained version references, except staged files of epochs after the last completed one;
  7. release the lease.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Mapping
from urllib.parse import unquote

from deltalake.exceptions import DeltaError

from barrierflow.api.params import with_placeholders
from barrierflow.checkpointing.checkpoint import EpochStatus
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.core.errors import CheckpointError, ParameterError
from barrierflow.core.settings import DEFAULT_LEASE_WAIT_S
from barrierflow.plan.pipeline import PipelineDefinition
from barrierflow.state.snapshots import compact
from barrierflow.storage import objects
from barrierflow.storage.delta import live_paths, open_table
from barrierflow.storage.layout import DATA_DIRS, STAGING_DIR

__all__ = ["run_maintenance", "MaintenanceReport", "DEFAULT_RETAINED_CHECKPOINTS", "DEFAULT_VACUUM_RETENTION_HOURS"]

DEFAULT_RETAINED_CHECKPOINTS = 10
DEFAULT_VACUUM_RETENTION_HOURS = 168


@dataclass(frozen=True)
class MaintenanceReport:
    pipeline: str
    lineage_id: str
    retained_epochs: tuple[int, ...]
    expired_epochs: tuple[str, ...]  # "<lineage>/<epoch>"
    compacted_tables: tuple[str, ...]
    vacuumed_files: Mapping[str, int]  # table -> files deleted

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def run_maintenance(
    definition: PipelineDefinition, warehouse: str, retained_checkpoints: int = DEFAULT_RETAINED_CHECKPOINTS,
    vacuum_retention_hours: int = DEFAULT_VACUUM_RETENTION_HOURS, params: Mapping[str, Any] | None = None,
    lease_wait_s: float = DEFAULT_LEASE_WAIT_S,
) -> MaintenanceReport:  # fmt: skip
    """Steps 1-7 of the module docstring."""
    if not isinstance(retained_checkpoints, int) or retained_checkpoints < 1:
        raise ParameterError(f"retained_checkpoints must be an integer >= 1, not {retained_checkpoints!r}")
    if not isinstance(vacuum_retention_hours, int) or vacuum_retention_hours < 0:
        raise ParameterError(f"vacuum_retention_hours must be an integer >= 0, not {vacuum_retention_hours!r}")
    # Maintenance reads no input: a source parameter nobody recorded or gave is not needed.
    coordinator = CheckpointCoordinator(definition, with_placeholders(definition.params, params or {}), warehouse)
    layout = coordinator.layout
    coordinator.acquire_lease(wait_s=lease_wait_s)  # step 1
    try:
        recovery = coordinator.recover()  # step 2
        last, lineage_id, pipe = recovery.last_completed, recovery.lineage_id, coordinator.pipeline
        compacted: list[str] = []
        if last is not None:  # step 3
            app = coordinator.app_id(lineage_id)
            for spec in pipe.state_specs():
                uri = layout.state_table(spec.operator_id, spec.name)
                if compact(spec, uri, app, last.epoch, f"maintenance-{uuid.uuid4().hex[:8]}") is not None:
                    compacted.append(spec.table_name)
        if coordinator.log.compact():
            compacted.append("_checkpoints")
        completed = sorted(
            (r for r in coordinator.log.lineage_records(lineage_id) if r.status is EpochStatus.COMPLETED), key=lambda r: r.epoch
        )
        retained = completed[-retained_checkpoints:]
        retained_epochs = {r.epoch for r in retained}
        expired: list[str] = []
        epochs_root = objects.join_uri(layout.checkpoint_log, "_epochs")
        for lineage in objects.list_dir(epochs_root):  # step 4
            for name in objects.list_dir(objects.join_uri(epochs_root, lineage)):
                epoch = int(name)
                if lineage == lineage_id and (epoch in retained_epochs or last is None or epoch > last.epoch):
                    continue  # retained, or an epoch still in flight
                objects.remove_tree(objects.join_uri(epochs_root, lineage, name))
                expired.append(f"{lineage}/{epoch}")
        keep: dict[str, set[int]] = {}
        for record in retained:
            for table_name, version in record.versions().items():
                keep.setdefault(table_name, set()).add(version)
        vacuumed: dict[str, int] = {}
        cutoff = time.time() - vacuum_retention_hours * 3600
        in_flight = (lineage_id, last.epoch if last is not None else 0)
        for table_name, uri in _tables(coordinator):
            table = open_table(uri)
            if table is None:
                continue
            try:  # step 5
                deleted = table.vacuum(
                    retention_hours=vacuum_retention_hours,
                    dry_run=False,
                    enforce_retention_duration=False,
                    keep_versions=sorted(keep.get(table_name, ())) or None,
                )
            except DeltaError as exc:
                raise CheckpointError(f"cannot vacuum {uri}: {exc}") from exc
            # Paths live in the current version or in a retained checkpoint's.
            old = (open_table(uri, version) for version in keep.get(table_name, set()) - {table.version()})
            referenced = {unquote(path) for t in [table, *filter(None, old)] for path in live_paths(t)}
            vacuumed[table_name] = len(deleted) + _sweep(uri, referenced, cutoff, in_flight)  # step 6
        return MaintenanceReport(
            pipeline=definition.name,
            lineage_id=lineage_id,
            retained_epochs=tuple(sorted(retained_epochs)),
            expired_epochs=tuple(expired),
            compacted_tables=tuple(compacted),
            vacuumed_files=vacuumed,
        )
    finally:
        coordinator.release_lease()  # step 7


def _sweep(uri: str, referenced: set[str], cutoff: float, in_flight: tuple[str, int]) -> int:
    """Step 6 for one table: delete unreferenced files of its data directories modified before ``cutoff``."""
    lineage_id, last_epoch = in_flight
    deleted = 0
    for directory in DATA_DIRS:
        root = objects.join_uri(uri, directory)
        for found in objects.walk(root):
            path = f"{directory}/{found.path}"
            if path in referenced or found.modified_at > cutoff:
                continue
            parts = found.path.split("/")
            staged = directory == STAGING_DIR and len(parts) > 2 and parts[0] == lineage_id and parts[1].isdigit()
            if staged and int(parts[1]) > last_epoch:
                continue  # an epoch not completed yet: its files may still be voted on
            objects.remove_document(objects.join_uri(root, found.path))
            deleted += 1
        objects.prune_empty_dirs(root)
    return deleted


def _tables(coordinator: Any) -> list[tuple[str, str]]:
    """Every Delta table of the pipeline: (name in the checkpoint cut, URI)."""
    layout = coordinator.layout
    out = [("_checkpoints", layout.checkpoint_log), ("dead_letter", layout.dead_letter)]
    out += [(f"{op}__{st}", layout.state_table(op, st)) for op, st in layout.state_tables()]
    return out + [(sink, layout.sink_table(sink)) for sink in objects.list_dir(objects.join_uri(layout.root, "sinks"))]
