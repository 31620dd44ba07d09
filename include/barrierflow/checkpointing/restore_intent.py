"""Steps 5-9 of a restore, from its durable intent: the new lineage's first consistent cut.

:mod:`barrierflow.operations.restore` resolves and checks a restore point
(steps 1-4) and writes the intent ``_restoring.json``; :func:`complete_restore`
does the rest, and the coordinator's ``recover`` calls
:func:`complete_pending_restore` to roll forward a restore that crashed, before
anything reads state. Each step skips what is already done:

  5. replace every state table's content with the restore point's rows
     (converted to the code's schema when it evolved, or nothing), in a commit
     carrying the new lineage's app transaction at the restore epoch N;
  6. with ``rewind_sinks``, remove from append sinks and ``dead_letter`` every
     row of an epoch after N, and set upsert sinks back to their rows at N
     (an absent upsert sink is always seeded), in commits carrying the same
     app transaction; then raise the fencing token (new lineage sequence, N)
     on every table of the pipeline that steps 5-6 did not commit to: from
     here on no commit of the old lineage lands on any table (``Fence``);
  7. record epoch N COMPLETED in the new lineage, with the restore point's
     offsets, watermark and the tables' versions after steps 5-6;
  8. write the lineage document (the switch: from here on the new lineage is
     current and epochs N+1, N+2, ... replay the input after the restore point);
  9. remove the stop marker and the intent.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Iterator, Mapping

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, Schema, Transaction
from deltalake.exceptions import DeltaError
from deltalake.transaction import AddAction, create_table_with_add_actions

from barrierflow.checkpointing.checkpoint import RESTORE_ATTEMPT_PREFIX, CheckpointRecord, EpochStatus, app_id
from barrierflow.checkpointing.checkpoint_log import CheckpointLog, current_lineage_seq, iso_now, now_us
from barrierflow.checkpointing.savepoint_format import METADATA_FILE, SavepointMetadata, snapshot_chunks
from barrierflow.core import faults
from barrierflow.core.errors import CheckpointError, CommitConflictError, SavepointError
from barrierflow.core.schema_evolution import evolve
from barrierflow.operators.operator_state import offsets_rows
from barrierflow.plan.pipeline import Pipeline, PipelineDefinition
from barrierflow.state.snapshots import live_row_chunks, stored_batches
from barrierflow.state.spec import KEY_GROUP
from barrierflow.storage import objects
from barrierflow.storage.commits import Fence
from barrierflow.storage.delta import (
    TABLE_CONFIGURATION,
    fence_transaction,
    latest_snapshot,
    open_table,
    raise_fence,
    stored_rows,
)
from barrierflow.storage.layout import RESTORED_DIR, PipelineLayout
from barrierflow.storage.staging import write_parquet

__all__ = ["RestoreResult", "complete_restore", "complete_pending_restore", "savepoint_of", "state_rows"]


@dataclass(frozen=True)
class RestoreResult:
    pipeline: str
    lineage_id: str
    previous_lineage_id: str
    epoch: int  # the restore point: the next epoch is epoch + 1
    restored_from: str  # "savepoint <name>" or "epoch <n> of lineage <id>"
    restored_states: tuple[str, ...]
    dropped_states: tuple[str, ...]
    empty_states: tuple[str, ...]
    evolved_states: Mapping[str, tuple[str, ...]]  # restored state whose schema evolved -> what changed
    rewound_sinks: Mapping[str, int]  # sink -> rows removed (append) or rows restored (upsert)
    params: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def complete_pending_restore(layout: PipelineLayout, definition: PipelineDefinition, pipe: Pipeline) -> RestoreResult | None:
    """Roll a crashed restore forward (called by ``recover``, under the caller's lease)."""
    intent = objects.read_json(layout.restoring)
    return complete_restore(layout, definition, pipe, intent) if intent else None


def complete_restore(
    layout: PipelineLayout, definition: PipelineDefinition, pipe: Pipeline, intent: Mapping[str, Any]
) -> RestoreResult:
    """Steps 5-9 from a durable intent; every step skips what is already done."""
    epoch = int(intent["epoch"])
    lineage_id = intent["lineage_id"]
    app = app_id(pipe.name, lineage_id)
    restored = set(intent["restored_states"])
    evolved = intent.get("evolved_states", {})  # absent in intents written before schema evolution
    savepoint = savepoint_of(intent)
    seq = _lineage_seq(layout, intent)
    fence = Fence(pipe.name, seq, epoch)
    seeded = set(intent.get("seeded_states", ()))  # absent in intents written before offsets were state
    # Seeded for the parallelism the new lineage runs at: its first epoch then redistributes nothing.
    param = definition.parallelism_param
    parallelism = int(intent["params"].get(param) or pipe.parallelism) if param else pipe.parallelism
    for spec in pipe.state_specs():  # step 5
        name = f"{spec.operator_id}/{spec.name}"
        chunks: Iterable[pa.Table]
        if name in seeded:  # step 2: a source's recorded offsets become its offsets state
            source_id = spec.operator_id
            chunks = [offsets_rows(source_id, intent["offsets"][source_id], parallelism, epoch, now_us() // 1000)]
        elif name in restored:
            chunks = state_rows(layout, intent, savepoint, spec.operator_id, spec.name)
        else:
            chunks = iter(())
        if name in evolved:
            chunks = (evolve(chunk, spec.arrow_schema()) for chunk in chunks)
        _replace_content(
            layout.state_table(spec.operator_id, spec.name),
            spec.arrow_schema(),
            chunks,
            app,
            epoch,
            lineage_id,
            (KEY_GROUP, *spec.key_columns),
            fence,
        )
    rewound: dict[str, int] = {}
    for sink, mode in _sinks(pipe):  # step 6
        uri = layout.dead_letter if mode == "dead_letter" else layout.sink_table(sink)
        if mode == "upsert":
            rows = _upsert_rows(layout, intent, savepoint, sink)
            if rows is not None and (intent["rewind_sinks"] or open_table(uri) is None):
                rewound[sink] = _replace_content(uri, *rows, app, epoch, lineage_id, (), fence)
        elif intent["rewind_sinks"]:
            rewound[sink] = _delete_after(uri, epoch, app, fence)
    for uri in _table_uris(layout, pipe):
        try:
            raise_fence(uri, fence)
        except CommitConflictError as exc:
            raise CheckpointError(f"{exc}; run the restore again") from exc
    # Step 7; the epoch directory marks the restore point as a retained checkpoint.
    objects.write_json_if_absent(objects.join_uri(layout.epoch_dir(lineage_id, epoch), "restore.json"), dict(intent))
    log = CheckpointLog(layout)
    done = [r for r in log.lineage_records(lineage_id) if r.status is EpochStatus.COMPLETED and r.epoch == epoch]
    if not done:
        log.append(
            CheckpointRecord(
                pipeline=pipe.name,
                lineage_id=lineage_id,
                epoch=epoch,
                status=EpochStatus.COMPLETED,
                attempt_id=f"{RESTORE_ATTEMPT_PREFIX}{lineage_id}",
                recorded_at_us=now_us(),
                offsets=json.dumps(intent["offsets"], sort_keys=True),
                watermark_us=intent["watermark_us"],
                max_event_time_us=intent["max_event_time_us"],
                rows_in=0,
                rows_out=0,
                dead_letters=0,
                bytes_written=0,
                state_bytes_written=0,
                duration_ms=0,
                table_versions=json.dumps(_current_versions(layout, pipe), sort_keys=True),
                message=f"restored from {intent['restored_from']}",
                arrival_cutoff_ms=intent.get("arrival_cutoff_ms"),
            )
        )
    faults.maybe_fail("restore.before_lineage")
    current = current_lineage_seq(layout)[1]
    if current["lineage_id"] != lineage_id:  # step 8
        objects.write_json_if_absent(
            objects.join_uri(layout.lineages, f"{seq:010d}.json"),
            {
                "lineage_id": lineage_id,
                "start_epoch": epoch,
                "start_offsets": intent["offsets"],
                "started_at": iso_now(),
                "reason": f"restored from {intent['restored_from']}",
                "previous_lineage_id": intent["previous_lineage_id"],
                "params": intent["params"],
            },
        )
        if current_lineage_seq(layout)[1]["lineage_id"] != lineage_id:
            raise CheckpointError(f"lineage {seq} of {pipe.name} was written concurrently; restore again")
    for marker in (layout.stopped, layout.restoring):  # step 9
        objects.remove_document(marker)
    return RestoreResult(
        pipeline=pipe.name,
        lineage_id=lineage_id,
        previous_lineage_id=intent["previous_lineage_id"],
        epoch=epoch,
        restored_from=intent["restored_from"],
        restored_states=tuple(intent["restored_states"]),
        dropped_states=tuple(intent["dropped_states"]),
        empty_states=tuple(intent["empty_states"]),
        evolved_states={name: tuple(changes) for name, changes in evolved.items()},
        rewound_sinks=rewound,
        params=intent["params"],
    )


def savepoint_of(intent: Mapping[str, Any]) -> SavepointMetadata | None:
    if intent["source"] != "savepoint":
        return None
    doc = objects.read_json(objects.join_uri(intent["savepoint_uri"], METADATA_FILE))
    if doc is None:
        raise SavepointError(f"savepoint at {intent['savepoint_uri']} disappeared during the restore")
    return SavepointMetadata.from_json(doc, uri=intent["savepoint_uri"])


def state_rows(
    layout: PipelineLayout, intent: Mapping[str, Any], savepoint: SavepointMetadata | None, op: str, state: str
) -> Iterator[pa.Table]:
    """The state's live rows at the restore point, in chunks of bounded size (none if it had no table)."""
    if savepoint is not None:
        snap = next(s for s in savepoint.states if s.operator_id == op and s.state == state)
        return snapshot_chunks(savepoint, snap.files)
    version = intent["table_versions"].get(f"{op}__{state}")
    table = open_table(layout.state_table(op, state), version) if version is not None else None
    if table is None:
        return iter(())
    schema = table.to_pyarrow_dataset().schema
    return live_row_chunks(table, schema.names[: schema.get_field_index(KEY_GROUP)])


def _upsert_rows(
    layout: PipelineLayout, intent: Mapping[str, Any], savepoint: SavepointMetadata | None, sink: str
) -> tuple[pa.Schema, Iterator[pa.Table]] | None:
    """The upsert sink's schema and rows at the restore point, in chunks (None if it had no table)."""
    if savepoint is not None:
        snap = next((s for s in savepoint.sinks if s.name == sink), None)
        if snap is None or not snap.files:
            return None
        first = objects.join_uri(savepoint.uri, snap.files[0])
        filesystem, path = objects.arrow_filesystem(first)
        return pq.read_schema(path, filesystem=filesystem), snapshot_chunks(savepoint, snap.files)
    version = intent["table_versions"].get(sink)
    table = open_table(layout.sink_table(sink), version) if version is not None else None
    if table is None:
        return None
    return table.to_pyarrow_dataset().schema, stored_batches(table)


def _sinks(pipe: Pipeline) -> list[tuple[str, str]]:
    out = [(n.sink.name, n.sink.mode) for n in pipe.sinks]
    out += [(name, "append") for name in pipe.side_output_names()]
    return out + [("dead_letter", "dead_letter")]


def _replace_content(
    uri: str,
    schema: pa.Schema,
    chunks: Iterable[pa.Table],
    app: str,
    epoch: int,
    lineage_id: str,
    sort_by: tuple[str, ...],
    fence: Fence,
) -> int:
    """Make the rows of ``chunks`` the table's whole content in one commit carrying ``(app, epoch)`` and ``fence``; idempotent.

    Chunks are written one at a time (each sorted by ``sort_by``), so the
    process holds one chunk, not the table. Returns the rows written.
    """
    # The process's snapshot of the table: the fence and the restore point's versions read it next (steps 6-7).
    with latest_snapshot(uri) as table:
        if table is not None and (table.transaction_version(app) or -1) >= epoch:
            return stored_rows(table)
        staged = []
        for chunk in chunks:
            staged += write_parquet(uri, f"{RESTORED_DIR}/{lineage_id}", chunk.select(schema.names).cast(schema), sort_by=sort_by)
        now = time.time_ns() // 1_000_000
        adds = [
            AddAction(path=f.path, size=f.size, partition_values={}, modification_time=now, data_change=True, stats=f.stats)
            for f in staged
        ]
        properties = CommitProperties(
            custom_metadata={"barrierflow.operation": "restore", "barrierflow.app_id": app, "barrierflow.epoch": epoch},
            app_transactions=[Transaction(app, epoch), fence_transaction(fence)],
            max_commit_retries=0,
        )
        delta_schema = Schema.from_arrow(schema)
        try:
            if table is None:
                create_table_with_add_actions(
                    uri, delta_schema, adds, mode="error", configuration=TABLE_CONFIGURATION, commit_properties=properties
                )
            else:
                # Overwrite removes every live file itself, and takes the code's schema.
                # ([*adds]: deltalake types this argument as a list of adds and removes, and a list is invariant.)
                table.create_write_transaction([*adds], mode="overwrite", schema=delta_schema, commit_properties=properties)
        except DeltaError as exc:
            raise CheckpointError(f"cannot restore table {uri}: {exc}; run the restore again") from exc
        return sum(f.rows for f in staged)


def _delete_after(uri: str, epoch: int, app: str, fence: Fence) -> int:
    """Remove rows of epochs after ``epoch`` in one commit carrying ``(app, epoch)`` and ``fence``; idempotent."""
    with latest_snapshot(uri) as table:
        if table is None or (table.transaction_version(app) or -1) >= epoch:
            return 0
        properties = CommitProperties(
            custom_metadata={"barrierflow.operation": "rewind", "barrierflow.app_id": app, "barrierflow.epoch": epoch},
            app_transactions=[Transaction(app, epoch), fence_transaction(fence)],
            max_commit_retries=0,
        )
        try:
            metrics = table.delete(f"_epoch > {int(epoch)}", commit_properties=properties)
        except DeltaError as exc:
            raise CheckpointError(f"cannot rewind sink {uri}: {exc}; run the restore again") from exc
        return int(metrics.get("num_deleted_rows") or 0)


def _lineage_seq(layout: PipelineLayout, intent: Mapping[str, Any]) -> int:
    """The new lineage's sequence number: recorded in the intent (intents of older releases: worked out)."""
    if "lineage_seq" in intent:
        return int(intent["lineage_seq"])
    seq, current = current_lineage_seq(layout)
    return seq if current["lineage_id"] == intent["lineage_id"] else seq + 1


def _table_uris(layout: PipelineLayout, pipe: Pipeline) -> list[str]:
    """Every table of the pipeline: the code's state, state the code dropped, sinks, side outputs, dead letters."""
    uris = {layout.state_table(spec.operator_id, spec.name) for spec in pipe.state_specs()}
    uris |= {layout.state_table(op, st) for op, st in layout.state_tables()}
    uris |= {layout.dead_letter if mode == "dead_letter" else layout.sink_table(sink) for sink, mode in _sinks(pipe)}
    return sorted(uris)


def _current_versions(layout: PipelineLayout, pipe: Pipeline) -> dict[str, int]:
    names = {spec.table_name: layout.state_table(spec.operator_id, spec.name) for spec in pipe.state_specs()}
    names.update((sink, layout.dead_letter if mode == "dead_letter" else layout.sink_table(sink)) for sink, mode in _sinks(pipe))
    versions: dict[str, int] = {}
    for name, uri in names.items():
        with latest_snapshot(uri) as table:
            if table is not None:
                versions[name] = table.version()
    return versions
