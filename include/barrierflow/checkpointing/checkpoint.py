"""Value objects of the checkpoint protocol: barriers, manifests (votes) and checkpoint-log records."""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from barrierflow.storage.commits import TableCommit, TableKind

__all__ = ["EpochStatus", "Barrier", "Manifest", "CheckpointRecord", "app_id"]


class EpochStatus(str, enum.Enum):
    """Where an epoch stands in the two-phase commit."""

    PLANNED = "PLANNED"  # barrier written: offsets fixed, nothing processed
    PRE_COMMITTED = "PRE_COMMITTED"  # manifest written: the vote
    COMPLETED = "COMPLETED"  # every table committed: the completed checkpoint
    ABORTED = "ABORTED"  # an attempt failed before its vote (the message says why); the epoch is retried


# The attempt id of a restore point's COMPLETED row: recorded by a restore, not computed.
RESTORE_ATTEMPT_PREFIX = "restore-"


def app_id(pipeline: str, lineage_id: str) -> str:
    """The Delta app-transaction id of one lineage of a pipeline."""
    return f"barrierflow:{pipeline}:{lineage_id}"


@dataclass(frozen=True)
class Barrier:
    """Barrier n: the end offsets of every source for epoch n (and a copy of the start offsets: a replay needs nothing else).
    Epoch n stages ``end_offsets`` into each source's offsets state (``operator_state`` 8.): what a restore starts from. Barriers
    written before the defaulted fields read with the defaults."""

    pipeline: str
    lineage_id: str
    epoch: int
    start_offsets: Mapping[str, Any]
    end_offsets: Mapping[str, Any]
    processing_time_ms: int  # deterministic "now" of the epoch (TTL, timers)
    planned_at: str
    attempt_id: str
    params: Mapping[str, Any] = field(default_factory=dict)
    arrival_cutoff_ms: int | None = None  # input that arrived by then (None: all)
    planned_by: str = ""  # the run that planned it: an Airflow run (dag_id:run_id) or a command
    # Informational: per source, the input left waiting (Backlog.to_json()); {} when unknown.
    backlog: Mapping[str, Any] = field(default_factory=dict)
    plan_ms: int | None = None  # how long planning took (listing sources, measuring the backlog)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Barrier":
        return cls(**doc)


@dataclass(frozen=True)
class Manifest:
    """The vote of epoch n: every table's staged files and the epoch's metrics; the first durable one commits."""

    pipeline: str
    lineage_id: str
    epoch: int
    attempt_id: str
    tables: tuple[TableCommit, ...]
    max_event_time_us: int | None  # max event time seen so far (watermark basis)
    watermark_us: int | None  # W(n)
    rows_in: int
    rows_out: int
    dead_letters: int
    process_ms: int
    # Parts of process_ms: "wait" for epoch n-1 to complete (Flink's alignment), "stage" for staged writes.
    phase_ms: Mapping[str, int] = field(default_factory=dict)

    @property
    def bytes_written(self) -> int:
        return sum(t.bytes for t in self.tables)

    @property
    def state_bytes_written(self) -> int:
        return sum(t.bytes for t in self.tables if t.kind is TableKind.STATE)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "tables": [t.to_json() for t in self.tables]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Manifest":
        return cls(**{**doc, "tables": tuple(TableCommit.from_json(t) for t in doc["tables"])})


@dataclass(frozen=True)
class CheckpointRecord:
    """One row of the checkpoint log (a Delta table that people can query)."""

    pipeline: str
    lineage_id: str
    epoch: int
    status: EpochStatus
    attempt_id: str
    recorded_at_us: int
    offsets: str = "{}"  # JSON: end offsets per source
    watermark_us: int | None = None
    max_event_time_us: int | None = None
    rows_in: int | None = None
    rows_out: int | None = None
    dead_letters: int | None = None
    bytes_written: int | None = None
    state_bytes_written: int | None = None
    duration_ms: int | None = None  # barrier to completion; neighbours overlap with two concurrent checkpoints
    table_versions: str = "{}"  # JSON: table name -> Delta version (the consistent cut)
    message: str = ""
    arrival_cutoff_ms: int | None = None  # the barrier's
    # Input the barrier left waiting (all sources; per source in ``backlog``) and how long the oldest had waited.
    backlog_files: int | None = None
    backlog_bytes: int | None = None
    input_lag_ms: int | None = None
    backlog: str = "{}"  # JSON: source -> Backlog.to_json()
    planned_by: str = ""  # the barrier's
    # JSON: phase -> ms: barrier (planning), process (computing), wait (for epoch n-1), stage (writes), commit.
    phase_ms: str = "{}"

    def offsets_json(self) -> dict[str, Any]:
        return json.loads(self.offsets)

    def versions(self) -> dict[str, int]:
        return json.loads(self.table_versions)

    def phases(self) -> dict[str, int]:
        return json.loads(self.phase_ms)
