"""The checkpoint log: a Delta table with one row per epoch status change (``barrierflow checkpoints``).

Rows are blind appends (never conflicting): readers keep the first row per
``(lineage_id, epoch, status)``, and every ABORTED row (each failed attempt)."""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
import time
from datetime import datetime, timezone
from typing import Any, Iterable, overload

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError, TableNotFoundError

from barrierflow.checkpointing.checkpoint import CheckpointRecord, EpochStatus
from barrierflow.core.errors import CheckpointError
from barrierflow.storage.delta import TABLE_CONFIGURATION
from barrierflow.storage.layout import PipelineLayout
from barrierflow.storage.objects import arrow_filesystem, join_uri, list_dir, read_bytes, read_json

__all__ = ["CheckpointLog", "current_lineage_seq", "iso_now", "iso_us", "now_us"]

# One column per CheckpointRecord field, in its order: integers as int64, the rest (status, JSON) as strings.
_SCHEMA = pa.schema([(f.name, pa.int64() if "int" in str(f.type) else pa.string()) for f in dataclasses.fields(CheckpointRecord)])


def now_us() -> int:
    return time.time_ns() // 1000


def iso_now() -> str:
    """The current time as ISO 8601 UTC, for the JSON documents of the warehouse."""
    return datetime.now(timezone.utc).isoformat()


@overload
def iso_us(us: int) -> str: ...
@overload
def iso_us(us: None) -> None: ...
@overload
def iso_us(us: int | None) -> str | None: ...
def iso_us(us: int | None) -> str | None:
    """A microsecond epoch timestamp as ISO 8601 UTC (``...Z``)."""
    if us is None:
        return None
    return datetime.fromtimestamp(us / 1e6, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def current_lineage_seq(layout: PipelineLayout) -> tuple[int, dict[str, Any]]:
    """The pipeline's current lineage: its sequence number (its document's name) and document."""
    names = [n for n in list_dir(layout.lineages) if n.endswith(".json")]
    if not names:
        raise CheckpointError(f"pipeline {layout.pipeline} has no lineage yet: run an epoch first")
    doc = read_json(join_uri(layout.lineages, names[-1]))
    assert doc is not None
    return int(names[-1].removesuffix(".json")), doc


def _table_id(uri: str) -> str | None:
    """The id the Delta table at ``uri`` got when created (its first commit's metaData), or None if unknown."""
    first = read_bytes(join_uri(uri, "_delta_log", f"{0:020d}.json"))
    for line in (first or b"").splitlines():
        action = json.loads(line)
        if "metaData" in action:
            return str(action["metaData"].get("id"))
    return None


class CheckpointLog:
    """Append-only record of every epoch's transitions for one pipeline."""

    def __init__(self, layout: PipelineLayout) -> None:
        self._uri = layout.checkpoint_log
        # Rows already read, per live data file: the log only grows, so a read opens just the files added since.
        self._table: DeltaTable | None = None
        self._rows_by_file: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.RLock()  # concurrent checkpoints append and read from two threads

    @classmethod
    def shared(cls, layout: PipelineLayout) -> "CheckpointLog":
        """This process's long-lived reader of ``layout``'s log (a log created anew has a new table id: a new reader)."""
        return _shared_reader(layout, _table_id(layout.checkpoint_log))

    def append(self, record: CheckpointRecord) -> None:
        table = pa.Table.from_pylist([{**dataclasses.asdict(record), "status": record.status.value}], schema=_SCHEMA)
        with self._lock:
            # Through the table read before (delta-rs updates a stale one when it commits): no reopening.
            target = self._table if self._table is not None else self._uri
            try:
                # "merge": a log written before a column existed takes it on (earlier rows read null).
                write_deltalake(target, table, mode="append", schema_mode="merge", configuration=TABLE_CONFIGURATION)
            except DeltaError as exc:
                self._table = None
                raise CheckpointError(f"cannot append to checkpoint log {self._uri}: {exc}") from exc

    def compact(self, min_files: int = 8) -> bool:
        """Rewrite the log's files (one per append) into few, rows and order unchanged (``dataChange=false``); whether it did."""
        if 0 < len(self._rows_by_file) < min_files - 3:
            return False  # this reader's last read knew the live files (an epoch appends about three): no open
        try:
            table = DeltaTable(self._uri)
        except TableNotFoundError:
            return False
        if len(table.file_uris()) < min_files:
            return False
        try:
            table.optimize.compact(commit_properties=CommitProperties(custom_metadata={"barrierflow.operation": "compact"}))
        except DeltaError as exc:
            raise CheckpointError(f"cannot compact checkpoint log {self._uri}: {exc}") from exc
        with self._lock:
            self._table, self._rows_by_file = None, {}
        return True

    def records(self) -> list[CheckpointRecord]:
        """Every distinct transition, in the order it was first recorded."""
        try:
            with self._lock:
                rows = self._rows()
        except TableNotFoundError:
            return []
        except (DeltaError, OSError, pa.ArrowException) as exc:
            self._table = None
            raise CheckpointError(f"cannot read checkpoint log {self._uri}: {exc}") from exc
        seen: set[tuple[str, int, str, int]] = set()
        out: list[CheckpointRecord] = []
        for row in sorted(rows, key=lambda r: r["recorded_at_us"]):
            # Every failure is its own row; other transitions are kept once, as first recorded.
            again = row["recorded_at_us"] if row["status"] == EpochStatus.ABORTED.value else 0
            ident = (row["lineage_id"], row["epoch"], row["status"], again)
            if ident in seen:
                continue
            seen.add(ident)
            row["status"] = EpochStatus(row["status"])
            row["backlog"] = row["backlog"] or "{}"  # rows from before these columns
            row["planned_by"] = row["planned_by"] or ""
            row["phase_ms"] = row["phase_ms"] or "{}"
            out.append(CheckpointRecord(**row))
        return out

    def _rows(self) -> list[dict[str, Any]]:
        """Rows of the table's live files, reading only files not read before (all again once one vanished)."""
        if self._table is None:
            self._table = DeltaTable(self._uri)
        else:
            self._table.update_incremental()
        live = self._table.file_uris()
        fresh = [uri for uri in live if uri not in self._rows_by_file]
        try:
            rows = _read_rows(fresh)
        except FileNotFoundError:
            self._table, self._rows_by_file = DeltaTable(self._uri), {}
            live = fresh = self._table.file_uris()
            rows = _read_rows(fresh)
        self._rows_by_file = {uri: rows[uri] if uri in rows else self._rows_by_file[uri] for uri in live}
        return [dict(row) for uri in live for row in self._rows_by_file[uri]]

    def lineage_records(self, lineage_id: str) -> list[CheckpointRecord]:
        return [r for r in self.records() if r.lineage_id == lineage_id]

    @staticmethod
    def last_completed(records: Iterable[CheckpointRecord]) -> CheckpointRecord | None:
        completed = [r for r in records if r.status is EpochStatus.COMPLETED]
        return max(completed, key=lambda r: r.epoch) if completed else None

    @staticmethod
    def current_status(records: Iterable[CheckpointRecord]) -> dict[tuple[str, int], CheckpointRecord]:
        """Per ``(lineage_id, epoch)``, where it stands: its COMPLETED record once it completed, else the newest."""
        out: dict[tuple[str, int], CheckpointRecord] = {}
        for r in records:
            ident = (r.lineage_id, r.epoch)
            cur = out.get(ident)
            if cur is None or (
                cur.status is not EpochStatus.COMPLETED
                and (r.status is EpochStatus.COMPLETED or r.recorded_at_us >= cur.recorded_at_us)
            ):
                out[ident] = r
        return out


@functools.lru_cache(maxsize=32)
def _shared_reader(layout: PipelineLayout, table_id: str | None) -> CheckpointLog:
    return CheckpointLog(layout)


def _read_rows(uris: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Rows per data file; columns a file predates read as null."""
    out: dict[str, list[dict[str, Any]]] = {uri: [] for uri in uris}
    if not uris:
        return out
    filesystem, _ = arrow_filesystem(uris[0])
    by_path = {arrow_filesystem(uri)[1]: uri for uri in uris}
    dataset = ds.dataset(list(by_path), schema=_SCHEMA, format="parquet", filesystem=filesystem)
    table = dataset.to_table(columns=[*_SCHEMA.names, "__filename"])
    for row in table.to_pylist():
        out[by_path[row.pop("__filename")]].append(row)
    return out
