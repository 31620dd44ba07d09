"""Savepoints: self-contained, portable snapshots of a pipeline at a completed epoch.

A savepoint lives at ``<warehouse>/_savepoints/<pipeline>/<name>/``, outside
every table, so vacuum and table rewrites never touch it::

    _savepoint.json                                metadata (written last: the savepoint exists once it does)
    <attempt>/state/<operator>/<state>/part-*.parquet  compacted state: one live row per key
    <attempt>/sinks/<name>/part-*.parquet          upsert sinks' rows at the cut (for rewinds)

The directory holds everything a restore needs (state, the sources'
offsets among it, watermark, key groups, operator ids and state schemas),
so it can be copied into another warehouse's ``_savepoints/<pipeline>/`` (or
restored from any path). The metadata's ``offsets`` are a copy of the
checkpoint record's, which a restore checks the offsets state against (and
uses for a savepoint of a release before offsets were state).

Creating one (:func:`create_savepoint`):
  1. take the pipeline's epoch lease, waiting for a running epoch to finish;
  2. recover (roll forward a pre-committed epoch), so the cut is the last
     completed epoch;
  3. write compacted state and upsert-sink rows of that cut into a directory
     of this attempt (``data-<id>``) inside the savepoint's directory;
  4. write ``_savepoint.json`` put-if-absent: the savepoint exists from then
     on, complete (a crash before leaves files no metadata names, and two
     attempts at one name never mix their files); no rename, so this works
     on object stores as on file systems;
  5. with ``stop``, write the stop marker: no epoch runs until a restore;
  6. release the lease.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from barrierflow.checkpointing.checkpoint import CheckpointRecord
from barrierflow.checkpointing.checkpoint_log import iso_now
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
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
from barrierflow.plan.pipeline import Pipeline, PipelineDefinition
from barrierflow.state.snapshots import live_row_chunks, stored_batches
from barrierflow.storage import objects
from barrierflow.storage.delta import open_table, stored_rows
from barrierflow.storage.layout import PipelineLayout

__all__ = [
    "SavepointMetadata",
    "StateSnapshot",
    "SinkSnapshot",
    "create_savepoint",
    "list_savepoints",
    "load_savepoint",
    "dispose_savepoint",
    "snapshot_chunks",
]


def create_savepoint(
    definition: PipelineDefinition,
    warehouse: str,
    name: str | None = None,
    description: str = "",
    stop: bool = False,
    params: Mapping[str, Any] | None = None,
    lease_wait_s: float = DEFAULT_LEASE_WAIT_S,
) -> SavepointMetadata:
    """Snapshot the last completed epoch; steps 1-6 of the module docstring."""
    name = name or _default_name()
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
        metadata = _write(coordinator.pipeline, layout, record, name, description, stop, coordinator.params)
        if stop:  # step 5
            objects.write_json_if_absent(layout.stopped, {"savepoint": name, "stopped_at": iso_now(), "epoch": record.epoch})
        return metadata
    finally:
        coordinator.release_lease()  # step 6


def _write(
    pipe: Pipeline,
    layout: PipelineLayout,
    record: CheckpointRecord,
    name: str,
    description: str,
    stop: bool,
    params: Mapping[str, Any],
) -> SavepointMetadata:
    """Steps 3-4: the data files under a directory of this attempt, then the metadata, put-if-absent."""
    final_uri = layout.savepoint(name)
    prefix = f"data-{uuid.uuid4().hex[:8]}"
    written = False
    try:
        versions = record.versions()
        states = tuple(
            _snapshot_state(layout, spec.operator_id, spec.name, versions, final_uri, prefix) for spec in pipe.state_specs()
        )
        sinks = tuple(_snapshot_sink(layout, node.sink.name, node.sink.mode, versions, final_uri, prefix) for node in pipe.sinks)
        sinks += tuple(_snapshot_sink(layout, side, "append", versions, final_uri, prefix) for side in pipe.side_output_names())
        sinks += (_snapshot_sink(layout, "dead_letter", "dead_letter", versions, final_uri, prefix),)
        metadata = SavepointMetadata(
            name=name,
            pipeline=pipe.name,
            uri=final_uri,
            epoch=record.epoch,
            lineage_id=record.lineage_id,
            created_at=iso_now(),
            description=description,
            key_groups=pipe.key_groups,
            offsets=record.offsets_json(),
            watermark_us=record.watermark_us,
            max_event_time_us=record.max_event_time_us,
            params=dict(params),
            operators=tuple(pipe.operator_ids()),
            states=states,
            sinks=sinks,
            size_bytes=sum(f.size for f in objects.walk(objects.join_uri(final_uri, prefix))),
            stopped=stop,
            arrival_cutoff_ms=record.arrival_cutoff_ms,
        )
        written = objects.write_json_if_absent(objects.join_uri(final_uri, METADATA_FILE), metadata.to_json())
        if not written:
            raise SavepointError(f"savepoint {name!r} of {pipe.name} was created concurrently; choose another name")
        return metadata
    finally:
        if not written:
            objects.remove_tree(objects.join_uri(final_uri, prefix))


def _snapshot_state(
    layout: PipelineLayout, operator_id: str, state: str, versions: Mapping[str, int], root: str, prefix: str
) -> StateSnapshot:
    table_name = f"{operator_id}__{state}"
    uri = layout.state_table(operator_id, state)
    table = open_table(uri, versions[table_name]) if table_name in versions else None
    if table is None:
        return StateSnapshot(operator_id, state, (), 0, ())
    schema = table.to_pyarrow_dataset().schema
    keys = schema.names[: schema.get_field_index("_key_group")]
    rels: list[str] = []
    rows = 0
    for chunk in live_row_chunks(table, keys):  # bounded memory, whatever the state's size
        rel = f"{prefix}/state/{operator_id}/{state}/part-{len(rels):05d}.parquet"
        _write_parquet([chunk], chunk.schema, objects.join_uri(root, rel))
        rels.append(rel)
        rows += chunk.num_rows
    return StateSnapshot(operator_id, state, state_signature(schema), rows, tuple(rels))


def _snapshot_sink(
    layout: PipelineLayout, name: str, mode: str, versions: Mapping[str, int], root: str, prefix: str
) -> SinkSnapshot:
    uri = layout.dead_letter if mode == "dead_letter" else layout.sink_table(name)
    table = open_table(uri, versions[name]) if name in versions else None
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


def _default_name() -> str:
    return "sp-" + datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
