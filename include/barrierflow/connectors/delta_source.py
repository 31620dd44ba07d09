"""A Delta-table source whose offsets are table versions.

Epoch n reads the rows the commits after the previous barrier's version, up to this barrier's, added. Only appends are read (as by
Spark's Delta streaming source without ``ignoreChanges``): a commit removing data files is refused, as is one changing the schema
other than by adding columns or widening types. Rows with null or empty keys are dead letters. The driver reads only the Delta
log: the table's schema and, per epoch, the files its versions added (by version, then path). Tasks read those files with pyarrow,
each file's rows in order, widened to the table's schema, a column a file lacks null, a partition column its add action's value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from barrierflow.connectors.schema_check import read_as, schema_mismatches
from barrierflow.connectors.source import Backlog, FileRange, RecordCounter, Split, checked_rows, gathered, open_file, packed
from barrierflow.core.errors import BlockedInputError, PipelineDefinitionError, SourceError, StorageError
from barrierflow.storage.delta import add_actions, live_paths, open_table
from barrierflow.storage.objects import join_uri, normalize_uri

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
        try:
            table = open_table(normalize_uri(self.table_uri), version)
        except StorageError as exc:
            raise SourceError(f"source {self.source_id}: cannot read {self.table_uri}: {exc.__cause__}") from exc
        if table is None:
            raise SourceError(f"source {self.source_id}: no Delta table at {self.table_uri}")
        return table

    def plan(
        self, start: Mapping[str, Any] | None, arrival_cutoff_ms: int | None, counter: RecordCounter | None = None
    ) -> dict[str, Any]:
        table = self._table()
        begin = start["version"] if start else -1
        latest = table.version()
        if arrival_cutoff_ms is not None:
            latest = min(latest, max((h["version"] for h in table.history() if h["timestamp"] <= arrival_cutoff_ms), default=-1))
        return {"version": max(begin, min(latest, begin + self.max_versions_per_epoch)), "from_version": begin}

    def earliest_arrival_ms(self, start: Mapping[str, Any] | None, arrival_cutoff_ms: int | None) -> int | None:
        """Commit time of the first version after ``start``, if it was committed by the cut-off."""
        begin, cutoff = start["version"] if start else -1, math.inf if arrival_cutoff_ms is None else arrival_cutoff_ms
        return min(
            (h["timestamp"] for h in self._table().history() if h["version"] > begin and h["timestamp"] <= cutoff), default=None
        )

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

    def _files_added(self, version: int) -> list[tuple[str, int, tuple[tuple[str, Any], ...]]]:
        """(path, size, partition values) of each data file ``version`` added, by path.

        Refused (:class:`BlockedInputError`): a version removing files, or changing the schema beyond new columns or wider types.
        """
        table = self._table(version)
        after = _data_files(table)
        before: set[str] = set()
        if version > 0:
            previous = self._table(version - 1)
            mismatches = schema_mismatches(_schema(previous), _schema(table), absent_nullable_ok=False)
            if mismatches:
                raise BlockedInputError(
                    f"source {self.source_id}: version {version} of {self.table_uri} changed the table's schema "
                    f"incompatibly: {'; '.join(m.describe() for m in mismatches)}. A Delta source reads added columns "
                    "and widened types only; write the new schema to a new table and restore the pipeline from a "
                    "savepoint with its source pointed there"
                )
            before = live_paths(previous)
            removed = before - set(after)
            if removed:
                raise BlockedInputError(
                    f"source {self.source_id}: version {version} of {self.table_uri} removed "
                    f"{len(removed)} file(s); a Delta source must be append-only"
                )
        return [(path, *after[path]) for path in sorted(set(after) - before)]

    def record_schema(self, end: Mapping[str, Any] | None = None) -> pa.Schema:
        """The table's schema at the epoch's last version (``end``; else the current one), nullable (Delta writers enforce NOT NULL)."""
        version = end.get("version") if end and end.get("version", -1) >= 0 else None
        return pa.schema([f.with_nullable(True) for f in _schema(self._table(version))])

    def splits(self, end: Mapping[str, Any], source_index: int, split_bytes: int | None) -> list[Split]:
        """The data files the barrier's versions added (:meth:`_files_added`), in commit order, packed into splits.

        A file's ``file_index`` is its position among the epoch's added files; a split's ``parts``: the record schema
        planned with, each file's partition values.
        """
        if not end or end.get("version", -1) <= end.get("from_version", -1):
            return []
        base = normalize_uri(self.table_uri)
        added = [entry for v in range(end["from_version"] + 1, end["version"] + 1) for entry in self._files_added(v)]
        schema = self.record_schema(end)
        files = [  # an add action's path is URI-encoded, relative to the table (or absolute)
            FileRange(p, unquote(p) if "://" in p else join_uri(base, unquote(p)), size, i)
            for i, (p, size, _) in enumerate(added)
        ]
        groups = packed(files, split_bytes)
        return [Split(source_index, tuple(g), parts=(schema, tuple(added[f.file_index][2] for f in g))) for g in groups]

    def read(self, split: Split, keys: Mapping[str, str]) -> tuple[pa.Table, pa.Table]:
        """A task's rows of its data files, in order, as the record schema (then ``_seq``); null or empty keys are dead letters."""
        schema, partitions = split.parts
        keys = {k: op for k, op in keys.items() if k in schema.names}
        parts = []
        for part, partition in zip(split.files, partitions):
            constants = {name: pa.scalar(value, schema.field(name).type) for name, value in partition if name in schema.names}
            keep = f"a Delta source's epoch reads the files its versions added (was {self.table_uri} vacuumed?)"
            with open_file(self.source_id, part, "data file", keep, "a Delta table's data files never change") as handle:
                try:
                    parquet = pq.ParquetFile(handle)
                    stored = pa.schema([f for f in schema if f.name not in constants])
                    mismatches = schema_mismatches(stored, parquet.schema_arrow, absent_nullable_ok=True)
                    if mismatches:
                        raise SourceError(
                            f"source {self.source_id}: data file {part.name} of {self.table_uri} does not read as the table's schema: "
                            + "; ".join(m.describe() for m in mismatches)
                        )
                    rows = read_as(parquet, schema, constants=constants)
                except (OSError, pa.ArrowException) as exc:
                    raise SourceError(
                        f"source {self.source_id}: cannot read data file {part.name} of {self.table_uri}: {exc}"
                    ) from exc
            # Delta writers enforce NOT NULL columns: only keys need checking.
            parts.append(checked_rows(self.source_id, part, rows, schema, keys, split.source_index))
        return gathered(schema, parts)


def _data_files(table: Any) -> dict[str, tuple[int, tuple[tuple[str, Any], ...]]]:
    """Path -> (size, partition values) of a snapshot's live data files."""
    columns = [f"partition.{name}" for name in table.metadata().partition_columns]
    return {
        row["path"]: (int(row["size_bytes"]), tuple((c.removeprefix("partition."), row[c]) for c in columns))
        for row in add_actions(table).select(["path", "size_bytes", *columns]).to_pylist()
    }


def _schema(table: Any) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())
