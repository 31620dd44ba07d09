"""Steps 5-9 of a restore, from its durable intent: the new lineage's first consistent cut.

:mod:`barrierflow.operations.restore` does steps 1-4 and writes the intent ``_restoring.json``; :func:`complete_restore` does the
rest, also when ``recover`` finds the intent of a crashed restore (before anything reads state). Each step skips what is done:

  5. replace every state table's content with the restore point's rows (converted to the code's schema when it evolved), in a
     commit carrying the new lineage's app transaction at the restore epoch N;
  6. with ``rewind_sinks``, remove from append sinks and ``dead_letter`` every row of an epoch after N, and set upsert sinks back
     to their rows at N (in the restore point's schema; an absent upsert sink is always seeded), in commits carrying the same app
     transaction; then raise the fencing token (new lineage sequence, N) on every other table with an empty commit: from here on
     no commit of the old lineage lands on any table;
  7. record epoch N COMPLETED in the new lineage, with the restore point's
     offsets, watermark and the tables' versions after steps 5-6;
  8. write the lineage document: from here on the new lineage is current and
     epochs N+1, N+2, ... replay the input after the restore point;
  9. remove the stop marker and the intent.

The app id names the lineage: replayed epochs are never mistaken for the old
lineage's commits, and an old lineage's zombie is fenced."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Iterator, Mapping

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Schema, Transaction
from deltalake.exceptions import DeltaError
from deltalake.transaction import AddAction, create_table_with_add_actions

from barrierflow.checkpointing.checkpoint import RESTORE_ATTEMPT_PREFIX, CheckpointRecord, EpochStatus, app_id
from barrierflow.checkpointing.checkpoint_log import CheckpointLog, current_lineage_seq, iso_now, now_us
from barrierflow.checkpointing.savepoint_format import SavepointMetadata, read_savepoint, snapshot_chunks, snapshot_schema
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

__all__ = ["RestoreResult", "complete_restore", "sink_tables", "state_rows", "table_at"]


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


def complete_restore(
    layout: PipelineLayout, definition: PipelineDefinition, pipe: Pipeline, intent: Mapping[str, Any]
) -> RestoreResult:
    """Steps 5-9 from a durable intent (under the caller's lease); every step skips what is already done."""
    epoch = int(intent["epoch"])
    lineage_id = intent["lineage_id"]
    restored = set(intent["restored_states"])
    evolved = intent.get("evolved_states", {})  # absent in intents written before schema evolution
    savepoint = read_savepoint(intent["savepoint_uri"]) if intent["source"] == "savepoint" else None
    if intent["source"] == "savepoint" and savepoint is None:
        raise SavepointError(f"savepoint at {intent['savepoint_uri']} disappeared during the restore")
    if "lineage_seq" in intent:  # the new lineage's sequence number
        seq = int(intent["lineage_seq"])
    else:  # an intent of an older release: worked out
        seq, current = current_lineage_seq(layout)
        seq = seq if current["lineage_id"] == intent["lineage_id"] else seq + 1
    fence = Fence(pipe.name, seq, epoch)
    commits = _Commits(app_id(pipe.name, lineage_id), lineage_id, fence)
    seeded = set(intent.get("seeded_states", ()))  # absent in intents written before offsets were state
    # Seeded for the parallelism the new lineage runs at: its first epoch then redistributes nothing.
    param = definition.parallelism_param
    parallelism = int(intent["params"].get(param) or pipe.parallelism) if param else pipe.parallelism
    for spec in pipe.state_specs():  # step 5
        name = f"{spec.operator_id}/{spec.name}"
        chunks: Iterable[pa.Table] = ()
        if name in seeded:  # step 2: a source's recorded offsets become its offsets state
            source_id = spec.operator_id
            chunks = [offsets_rows(source_id, intent["offsets"][source_id], parallelism, epoch, now_us() // 1000)]
        elif name in restored:
            chunks = state_rows(layout, intent, savepoint, spec.operator_id, spec.name)
        if name in evolved:
            chunks = (evolve(chunk, spec.arrow_schema()) for chunk in chunks)
        uri = layout.state_table(spec.operator_id, spec.name)
        commits.replace_content(uri, spec.arrow_schema(), chunks, (KEY_GROUP, *spec.key_columns))
    rewound: dict[str, int] = {}
    for sink, mode, uri in sink_tables(layout, pipe):  # step 6
        if mode == "upsert":
            rows = _upsert_rows(layout, intent, savepoint, sink)
            if rows is not None and (intent["rewind_sinks"] or open_table(uri) is None):
                rewound[sink] = commits.replace_content(uri, *rows, ())
        elif intent["rewind_sinks"]:
            rewound[sink] = commits.delete_after(uri)
    tables = _code_tables(layout, pipe)
    # Every table of the pipeline, state the code dropped too.
    for uri in sorted({*tables.values(), *(layout.state_table(op, st) for op, st in layout.state_tables())}):
        try:
            raise_fence(uri, fence)
        except CommitConflictError as exc:
            raise CheckpointError(f"{exc}; run the restore again") from exc
    # Step 7; the epoch directory marks the restore point as a retained checkpoint.
    objects.write_json_if_absent(objects.join_uri(layout.epoch_dir(lineage_id, epoch), "restore.json"), dict(intent))
    log = CheckpointLog(layout)
    done = [r for r in log.lineage_records(lineage_id) if r.status is EpochStatus.COMPLETED and r.epoch == epoch]
    if not done:
        log.append(CheckpointRecord(
            pipeline=pipe.name, lineage_id=lineage_id, epoch=epoch, status=EpochStatus.COMPLETED,
            attempt_id=f"{RESTORE_ATTEMPT_PREFIX}{lineage_id}", recorded_at_us=now_us(),
            offsets=json.dumps(intent["offsets"], sort_keys=True), watermark_us=intent["watermark_us"],
            max_event_time_us=intent["max_event_time_us"], rows_in=0, rows_out=0, dead_letters=0, bytes_written=0,
            state_bytes_written=0, duration_ms=0, table_versions=json.dumps(_current_versions(tables), sort_keys=True),
            message=f"restored from {intent['restored_from']}", arrival_cutoff_ms=intent.get("arrival_cutoff_ms"),
        ))  # fmt: skip
    faults.maybe_fail("restore.before_lineage")
    if current_lineage_seq(layout)[1]["lineage_id"] != lineage_id:  # step 8
        lineage = {
            "lineage_id": lineage_id, "start_epoch": epoch, "start_offsets": intent["offsets"], "started_at": iso_now(),
            "reason": f"restored from {intent['restored_from']}", "previous_lineage_id": intent["previous_lineage_id"],
            "params": intent["params"],
        }  # fmt: skip
        objects.write_json_if_absent(objects.join_uri(layout.lineages, f"{seq:010d}.json"), lineage)
        if current_lineage_seq(layout)[1]["lineage_id"] != lineage_id:
            raise CheckpointError(f"lineage {seq} of {pipe.name} was written concurrently; restore again")
    for marker in (layout.stopped, layout.restoring):  # step 9
        objects.remove_document(marker)
    return RestoreResult(
        pipeline=pipe.name, lineage_id=lineage_id, previous_lineage_id=intent["previous_lineage_id"], epoch=epoch,
        restored_from=intent["restored_from"], restored_states=tuple(intent["restored_states"]),
        dropped_states=tuple(intent["dropped_states"]), empty_states=tuple(intent["empty_states"]),
        evolved_states={name: tuple(changes) for name, changes in evolved.items()}, rewound_sinks=rewound,
        params=intent["params"],
    )  # fmt: skip


def table_at(versions: Mapping[str, int], uri: str, name: str) -> DeltaTable | None:
    """Table ``name`` at ``uri`` as of a checkpoint's ``versions`` (None if it had no table there)."""
    version = versions.get(name)
    return open_table(uri, version) if version is not None else None


def state_rows(
    layout: PipelineLayout, intent: Mapping[str, Any], savepoint: SavepointMetadata | None, op: str, state: str
) -> Iterator[pa.Table]:
    """The state's live rows at the restore point, in chunks of bounded size (none if it had no table)."""
    if savepoint is not None:
        return snapshot_chunks(savepoint, next(s.files for s in savepoint.states if s.operator_id == op and s.state == state))
    table = table_at(intent["table_versions"], layout.state_table(op, state), f"{op}__{state}")
    if table is None:
        return iter(())
    schema = table.to_pyarrow_dataset().schema
    return live_row_chunks(table, schema.names[: schema.get_field_index(KEY_GROUP)])


def _upsert_rows(
    layout: PipelineLayout, intent: Mapping[str, Any], savepoint: SavepointMetadata | None, sink: str
) -> tuple[pa.Schema, Iterator[pa.Table]] | None:
    """The upsert sink's schema and rows at the restore point, in chunks (None if it had no table)."""
    if savepoint is not None:
        files = next((s.files for s in savepoint.sinks if s.name == sink), ())
        schema = snapshot_schema(savepoint, files)
        return (schema, snapshot_chunks(savepoint, files)) if schema is not None else None
    table = table_at(intent["table_versions"], layout.sink_table(sink), sink)
    return (table.to_pyarrow_dataset().schema, stored_batches(table)) if table is not None else None


def sink_tables(layout: PipelineLayout, pipe: Pipeline) -> list[tuple[str, str, str]]:
    """(name, mode, URI) of every sink of the pipeline: its sinks, side outputs (append) and ``dead_letter``."""
    out = [(n.sink.name, n.sink.mode, layout.sink_table(n.sink.name)) for n in pipe.sinks]
    out += [(name, "append", layout.sink_table(name)) for name in pipe.side_output_names()]
    return out + [("dead_letter", "dead_letter", layout.dead_letter)]


@dataclass(frozen=True)
class _Commits:
    """The restore's commits: each carries the app transaction ``(app, fence.epoch)`` and ``fence``; each is idempotent."""

    app: str
    lineage_id: str
    fence: Fence

    def _properties(self, operation: str) -> CommitProperties:
        meta = {"barrierflow.operation": operation, "barrierflow.app_id": self.app, "barrierflow.epoch": self.fence.epoch}
        transactions = [Transaction(self.app, self.fence.epoch), fence_transaction(self.fence)]
        return CommitProperties(custom_metadata=meta, app_transactions=transactions, max_commit_retries=0)

    def replace_content(self, uri: str, schema: pa.Schema, chunks: Iterable[pa.Table], sort_by: tuple[str, ...]) -> int:
        """Make ``chunks`` (written one at a time, each sorted by ``sort_by``) the table's whole content; the rows written."""
        # The process's snapshot of the table: the fence and the restore point's versions read it next (steps 6-7).
        with latest_snapshot(uri) as table:
            if table is not None and (table.transaction_version(self.app) or -1) >= self.fence.epoch:
                return stored_rows(table)
            prefix = f"{RESTORED_DIR}/{self.lineage_id}"
            staged = [f for c in chunks for f in write_parquet(uri, prefix, c.select(schema.names).cast(schema), sort_by=sort_by)]
            now = time.time_ns() // 1_000_000
            adds = [
                AddAction(path=f.path, size=f.size, partition_values={}, modification_time=now, data_change=True, stats=f.stats)
                for f in staged
            ]
            properties, delta_schema = self._properties("restore"), Schema.from_arrow(schema)
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

    def delete_after(self, uri: str) -> int:
        """Remove rows of epochs after the restore epoch in one commit; returns the rows removed."""
        with latest_snapshot(uri) as table:
            if table is None or (table.transaction_version(self.app) or -1) >= self.fence.epoch:
                return 0
            try:
                metrics = table.delete(f"_epoch > {int(self.fence.epoch)}", commit_properties=self._properties("rewind"))
            except DeltaError as exc:
                raise CheckpointError(f"cannot rewind sink {uri}: {exc}; run the restore again") from exc
            return int(metrics.get("num_deleted_rows") or 0)


def _code_tables(layout: PipelineLayout, pipe: Pipeline) -> dict[str, str]:
    """Name (in a checkpoint's cut) -> URI of every table the code declares: state, sinks, side outputs, dead letters."""
    tables = {spec.table_name: layout.state_table(spec.operator_id, spec.name) for spec in pipe.state_specs()}
    return tables | {sink: uri for sink, _, uri in sink_tables(layout, pipe)}


def _current_versions(tables: Mapping[str, str]) -> dict[str, int]:
    versions: dict[str, int] = {}
    for name, uri in tables.items():
        with latest_snapshot(uri) as table:
            if table is not None:
                versions[name] = table.version()
    return versions
