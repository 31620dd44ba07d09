"""A Delta-table source whose offsets are table versions.

Epoch n reads the rows added by the commits after the previous barrier's
version up to and including this barrier's version. Only appends are
supported, as in Spark's Delta streaming source without ``ignoreChanges``:
a commit that removes data files is refused with a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import pyarrow as pa

from barrierflow.delta_commit import live_paths
from barrierflow.errors import PipelineDefinitionError, SourceError
from barrierflow.sources.base import SEQ, SourceBatch, arrival_seq
from barrierflow.sources.dead_letters import no_dead_letters
from barrierflow.storage import join_uri, normalize_uri
from barrierflow.table_files import ROW_INDEX_COLUMN, read_parquet_files

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

    def plan(self, start: Mapping[str, Any] | None, arrival_cutoff_ms: int | None) -> dict[str, Any]:
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

    def describe(self) -> dict[str, Any]:
        return {"type": "delta", "id": self.source_id, "table_uri": self.table_uri}

    def _files_added(self, version: int) -> list[str]:
        after = live_paths(self._table(version))
        if version == 0:
            return sorted(after)
        before = live_paths(self._table(version - 1))
        removed = before - after
        if removed:
            raise SourceError(
                f"source {self.source_id}: version {version} of {self.table_uri} removed "
                f"{len(removed)} file(s); a Delta source must be append-only"
            )
        return sorted(after - before)

    def read(
        self, spark: "SparkSession", end: Mapping[str, Any], parallelism: int, source_index: int = 0, ordered: bool = True,
        keys: Mapping[str, str] | None = None,
    ) -> SourceBatch:
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema

        base = normalize_uri(self.table_uri)
        schema = pa.schema(self._table(end["version"]).schema().to_arrow())
        frames = []
        # Arrival order: commit version, then file path, then row in the file.
        added = [path for v in range(end["from_version"] + 1, end["version"] + 1) for path in self._files_added(v)]
        for fidx, path in enumerate(added):
            df = read_parquet_files(spark, [join_uri(base, path)], schema, with_row_index=True)
            seq = arrival_seq(source_index, F.lit(fidx), F.col(ROW_INDEX_COLUMN) + 1)
            frames.append(df.select(*schema.names, seq.alias(SEQ)))
        if not frames:
            records = spark.createDataFrame([], from_arrow_schema(schema)).select("*", F.lit(0).cast("long").alias(SEQ))
        else:
            records = frames[0]
            for other in frames[1:]:
                records = records.unionByName(other)
        return SourceBatch(records=records, dead_letters=no_dead_letters(spark))
