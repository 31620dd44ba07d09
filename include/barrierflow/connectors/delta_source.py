"""A Delta-table source whose offsets are table versions.

Epoch n reads the rows added by the commits after the previous barrier's
version up to and including this barrier's version. Only appends are
supported, as in Spark's Delta streaming source without ``ignoreChanges``:
a commit that removes data files is refused with a clear error, and so is
one that changes the schema other than by adding columns or widening types.
Rows with a null or empty key are dead letters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import pyarrow as pa

from barrierflow.connectors.dead_letters import checked_rows
from barrierflow.connectors.schema_check import schema_mismatches
from barrierflow.connectors.source import Backlog, RecordCounter, SourceBatch
from barrierflow.core.errors import BlockedInputError, PipelineDefinitionError, SourceError
from barrierflow.execution.table_files import ROW_INDEX_COLUMN, read_parquet_files
from barrierflow.storage.delta import add_actions, live_paths
from barrierflow.storage.objects import join_uri, normalize_uri

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DeltaSource"]


@dataclass(frozen=True)
class DeltaSource:
    source_id: str
    table_uri: str
    max_versions_per_epoch: int = 10

    def __post_init__(self) -> None:
        if self.max_versions_per_epoch < 1:
            raise PipelineDefinitionError(f"source {self.source_id}: max_versions_per_epoch must be >= 1")

    def _table(self, version: int | None = None) -> Any:
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError, TableNotFoundError

        try:
            return DeltaTable(normalize_uri(self.table_uri), version=version)
        except TableNotFoundError:
            raise SourceError(f"source {self.source_id}: no Delta table at {self.table_uri}") from None
        except DeltaError as exc:
            raise SourceError(f"source {self.source_id}: cannot read {self.table_uri}: {exc}") from exc

    def plan(
        self, start: Mapping[str, Any] | None, arrival_cutoff_ms: int | None, counter: RecordCounter | None = None
    ) -> dict[str, Any]:
        table = self._table()
        begin = start["version"] if start else -1
        latest = table.version()
        if arrival_cutoff_ms is not None:
            eligible = [h["version"] for h in table.history() if h["timestamp"] <= arrival_cutoff_ms]
            latest = min(latest, max(eligible, default=-1))
        end = min(latest, begin + self.max_versions_per_epoch)
        return {"version": max(begin, end), "from_version": begin}

    def earliest_arrival_ms(self, start: Mapping[str, Any] | None, arrival_cutoff_ms: int | None) -> int | None:
        """Commit time of the first version after ``start``, if it was committed by the cut-off."""
        begin = start["version"] if start else -1
        times = [
            h["timestamp"]
            for h in self._table().history()
            if h["version"] > begin and (arrival_cutoff_ms is None or h["timestamp"] <= arrival_cutoff_ms)
        ]
        return min(times) if times else None

    def has_records(self, end: Mapping[str, Any]) -> bool:
        return end["version"] > end["from_version"]

    def backlog(self, end: Mapping[str, Any] | None) -> Backlog:
        """Data files the table's versions after ``end`` added, and when the first of those versions was committed."""
        table = self._table()
        done = end["version"] if end else -1
        if table.version() <= done:
            return Backlog()
        actions = add_actions(table)
        sizes = dict(zip(actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist()))
        waiting = set(sizes) - (live_paths(self._table(done)) if done >= 0 else set())
        oldest = min((h["timestamp"] for h in table.history() if h["version"] > done), default=None)
        return Backlog(len(waiting), sum(sizes[p] or 0 for p in waiting), oldest)

    def describe(self) -> dict[str, Any]:
        return {"type": "delta", "id": self.source_id, "table_uri": self.table_uri}

    def _files_added(self, version: int) -> list[str]:
        """Data files version ``version`` added, after checking it neither removed files nor broke the schema."""
        table = self._table(version)
        after = live_paths(table)
        if version == 0:
            return sorted(after)
        previous = self._table(version - 1)
        mismatches = schema_mismatches(_schema(previous), _schema(table), absent_nullable_ok=False)
        if mismatches:
            raise BlockedInputError(
                f"source {self.source_id}: version {version} of {self.table_uri} changed the table's schema "
                f"incompatibly: {'; '.join(m.describe() for m in mismatches)}. A Delta source reads added columns "
                "and widened types only; write the new schema to a new table and restore the pipeline from a "
                "savepoint with its source pointed there"
            )
        removed = live_paths(previous) - after
        if removed:
            raise BlockedInputError(
                f"source {self.source_id}: version {version} of {self.table_uri} removed "
                f"{len(removed)} file(s); a Delta source must be append-only"
            )
        return sorted(after - live_paths(previous))

    def read(
        self, spark: "SparkSession", end: Mapping[str, Any], parallelism: int, source_index: int = 0, ordered: bool = True,
        keys: Mapping[str, str] | None = None,
    ) -> SourceBatch:
        """The rows the versions after the last barrier's added, in commit order; null or empty keys are dead letters."""
        from pyspark.sql import functions as F

        base = normalize_uri(self.table_uri)
        schema = _schema(self._table(end["version"]))
        # Arrival order: commit version, then file path, then row in the file.
        added = [path for v in range(end["from_version"] + 1, end["version"] + 1) for path in self._files_added(v)]
        frames = [
            read_parquet_files(spark, [join_uri(base, path)], schema, with_row_index=True).select(
                *schema.names, F.lit(fidx).alias("_fidx"), (F.col(ROW_INDEX_COLUMN) + 1).alias("_line")
            )
            for fidx, path in enumerate(added)
        ]
        # Delta writers enforce NOT NULL columns: only keys need checking.
        return checked_rows(
            spark, frames, pa.schema([f.with_nullable(True) for f in schema]),
            {k: op for k, op in (keys or {}).items() if k in schema.names},
            source_id=self.source_id, names=added, source_index=source_index,
        )


def _schema(table: Any) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())
