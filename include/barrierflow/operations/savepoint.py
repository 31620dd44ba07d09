"""Savepoints: self-contained, portable snapshots of a pipeline at a completed epoch.

The format is :mod:`barrierflow.checkpointing.savepoint_format`. :func:`create_savepoint`:
  1. take the epoch lease, waiting for a running epoch;
  2. recover, so the cut is the last completed epoch;
  3. write compacted state and upsert-sink rows of that cut into a directory of
     this attempt (``data-<id>``) in the savepoint's directory;
  4. write ``_savepoint.json`` put-if-absent: the savepoint exists from then on,
     complete (no rename, so object stores work; two attempts never mix files);
  5. with ``stop``, write the stop marker: no epoch runs until a restore;
  6. release the lease.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from barrierflow.checkpointing.checkpoint_log import iso_now
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.checkpointing.restore_intent import sink_tables, table_at
from barrierflow.checkpointing.savepoint_format import (
    METADATA_FILE,
    SavepointMetadata,
    SinkSnapshot,
    StateSnapshot,
    check_name,
    list_savepoints,
    load_savepoint,
    snapshot_chunks,
)
from barrierflow.core.errors import SavepointError
from barrierflow.core.schema_evolution import state_signature
from barrierflow.core.settings import DEFAULT_LEASE_WAIT_S
from barrierflow.plan.pipeline import PipelineDefinition
from barrierflow.state.snapshots import live_row_chunks, stored_batches
from barrierflow.state.spec import KEY_GROUP
from barrierflow.storage import objects
from barrierflow.storage.delta import stored_rows
from barrierflow.storage.layout import PipelineLayout

__all__ = [
    "SavepointMetadata", "StateSnapshot", "SinkSnapshot", "create_savepoint", "list_savepoints", "load_savepoint",
    "dispose_savepoint", "snapshot_chunks",
]  # fmt: skip


def create_savepoint(
    definition: PipelineDefinition, warehouse: str, name: str | None = None, description: str = "", stop: bool = False,
    params: Mapping[str, Any] | None = None, lease_wait_s: float = DEFAULT_LEASE_WAIT_S,
) -> SavepointMetadata:  # fmt: skip
    """Snapshot the last completed epoch; steps 1-6 of the module docstring."""
    name = name or "sp-" + datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    check_name(name)
    coordinator = CheckpointCoordinator(definition, params or {}, warehouse)
    layout = coordinator.layout
    if objects.exists(objects.join_uri(layout.savepoint(name), METADATA_FILE)):
        raise SavepointError(f"savepoint {name!r} of {definition.name} already exists; choose another name")
    coordinator.acquire_lease(wait_s=lease_wait_s)  # step 1
    try:
        recovery = coordinator.recover()  # step 2
        record = recovery.last_completed
        if record is None:
            raise SavepointError(
                f"pipeline {definition.name} has no completed epoch in lineage {recovery.lineage_id}: "
                "run an epoch before taking a savepoint"
            )
        pipe, root = coordinator.pipeline, layout.savepoint(name)
        prefix = f"data-{uuid.uuid4().hex[:8]}"
        written = False
        try:  # step 3: the data files under a directory of this attempt
            versions = record.versions()
            states = tuple(_snapshot_state(layout, s.operator_id, s.name, versions, root, prefix) for s in pipe.state_specs())
            sinks = tuple(
                _snapshot_sink(uri, sink, mode, versions, root, prefix) for sink, mode, uri in sink_tables(layout, pipe)
            )
            metadata = SavepointMetadata(
                name=name, pipeline=pipe.name, uri=root, epoch=record.epoch, lineage_id=record.lineage_id,
                created_at=iso_now(), description=description, key_groups=pipe.key_groups, offsets=record.offsets_json(),
                watermark_us=record.watermark_us, max_event_time_us=record.max_event_time_us,
                params=dict(coordinator.params), operators=tuple(pipe.operator_ids()), states=states, sinks=sinks,
                size_bytes=sum(f.size for f in objects.walk(objects.join_uri(root, prefix))), stopped=stop,
                arrival_cutoff_ms=record.arrival_cutoff_ms,
            )  # fmt: skip
            written = objects.write_json_if_absent(objects.join_uri(root, METADATA_FILE), metadata.to_json())  # step 4
            if not written:
                raise SavepointError(f"savepoint {name!r} of {pipe.name} was created concurrently; choose another name")
        finally:
            if not written:
                objects.remove_tree(objects.join_uri(root, prefix))
        if stop:  # step 5
            objects.write_json_if_absent(layout.stopped, {"savepoint": name, "stopped_at": iso_now(), "epoch": record.epoch})
        return metadata
    finally:
        coordinator.release_lease()  # step 6


def _snapshot_state(
    layout: PipelineLayout, operator_id: str, state: str, versions: Mapping[str, int], root: str, prefix: str
) -> StateSnapshot:
    table = table_at(versions, layout.state_table(operator_id, state), f"{operator_id}__{state}")
    if table is None:
        return StateSnapshot(operator_id, state, (), 0, ())
    schema = table.to_pyarrow_dataset().schema
    rels: list[str] = []
    rows = 0
    # Bounded memory, whatever the state's size.
    for chunk in live_row_chunks(table, schema.names[: schema.get_field_index(KEY_GROUP)]):
        rels.append(f"{prefix}/state/{operator_id}/{state}/part-{len(rels):05d}.parquet")
        rows += _write_parquet([chunk], chunk.schema, objects.join_uri(root, rels[-1]))
    return StateSnapshot(operator_id, state, state_signature(schema), rows, tuple(rels))


def _snapshot_sink(uri: str, name: str, mode: str, versions: Mapping[str, int], root: str, prefix: str) -> SinkSnapshot:
    table = table_at(versions, uri, name)
    if table is None:
        return SinkSnapshot(name, mode, 0)
    if mode != "upsert":
        # Append outputs are rewound by epoch, not copied: the rows count is informative.
        return SinkSnapshot(name, mode, stored_rows(table))
    rel = f"{prefix}/sinks/{name}/part-00000.parquet"
    rows = _write_parquet(stored_batches(table), table.to_pyarrow_dataset().schema, objects.join_uri(root, rel))
    return SinkSnapshot(name, mode, rows, (rel,))


def _write_parquet(chunks: Iterable[pa.Table], schema: pa.Schema, uri: str) -> int:
    """Write ``chunks`` one after the other into one durable file at ``uri``; returns its row count."""
    filesystem, path = objects.arrow_filesystem(uri)
    if objects.is_local(uri):
        filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
    rows = 0
    options = {"compression": "zstd", "coerce_timestamps": "us", "use_deprecated_int96_timestamps": False}
    with pq.ParquetWriter(path, schema, filesystem=filesystem, **options) as writer:
        for chunk in chunks:
            writer.write_table(chunk)
            rows += chunk.num_rows
    objects.sync_file(uri)
    return rows


def dispose_savepoint(pipeline: str, warehouse: str, name: str) -> SavepointMetadata:
    """Delete a savepoint: first its metadata (so it stops existing), then its files."""
    check_name(name)
    metadata = load_savepoint(pipeline, warehouse, name)
    layout = PipelineLayout.of(warehouse, pipeline)
    stop = objects.read_json(layout.stopped)
    if stop and stop.get("savepoint") == name:
        raise SavepointError(
            f"savepoint {name!r} is the one pipeline {pipeline} was stopped with; restore it "
            "(or another savepoint) before disposing of it"
        )
    uri = layout.savepoint(name)
    objects.remove_document(objects.join_uri(uri, METADATA_FILE))
    objects.remove_tree(uri)
    return metadata
