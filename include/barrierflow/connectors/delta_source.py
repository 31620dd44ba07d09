"""A Delta-table source whose offsets are table versions.

Epoch n reads the rows added by the commits after the previous barrier's
version up to and including this barrier's version. Only appends are
supported, as in Spark's Delta streaming source without ``ignoreChanges``:
a commit that removes data files is refused with a clear error, and so is
one that changes the schema other than by adding columns or widening types.
Rows with a null or empty key are dead letters.

The driver reads only the Delta log: the table's schema
(:meth:`DeltaSource.record_schema`) and, per epoch, the data files its
versions added (:meth:`DeltaSource.splits`, in commit order: version, then
path). Tasks read those Parquet files with pyarrow (:meth:`DeltaSource.read`):
each file's rows in order, widened to the table's schema, a column a file
lacks (added later) null, a partition column its add action's value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from barrierflow.connectors.schema_check import read_as, schema_mismatches
from barrierflow.connectors.source import (
    Backlog,
    FileRange,
    RecordCounter,
    Split,
    checked_rows,
    no_dead_letters,
    open_file,
    packed,
)
from barrierflow.core.columns import SEQ
from barrierflow.core.errors import BlockedInputError, PipelineDefinitionError, SourceError
from barrierflow.storage.delta import add_actions, live_paths
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

    def _files_added(self, version: int) -> list[tuple[str, int, tuple[tuple[str, Any], ...]]]:
        """(path, size, partition values) of each data file version ``version`` added, by path.

        Refuses (:class:`BlockedInputError`) a version that changed the
        schema other than by adding columns or widening types, or that
        removed files.
        """
        table = self._table(version)
        after = _data_files(table)
        if version == 0:
            return [(path, *after[path]) for path in sorted(after)]
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
        """The table's schema as of the epoch's last version (``end``; else its current one), every column nullable.

        A Delta writer enforces NOT NULL itself. Rows of earlier versions read
        as it: a column added since is null there, a widened one widened.
        """
        version = end.get("version") if end and end.get("version", -1) >= 0 else None
        return pa.schema([f.with_nullable(True) for f in _schema(self._table(version))])

    def splits(self, end: Mapping[str, Any], source_index: int, split_bytes: int | None) -> list[Split]:
        """The data files the barrier's versions added, in commit order, packed into splits of about ``split_bytes``.

        Reads the Delta log only (and refuses removes and incompatible
        schema changes, :meth:`_files_added`). A file's ``file_index`` is its
        position among the epoch's added files (its rows' ``_seq``); a split's
        ``parts`` hold what its tasks need besides the files: the record
        schema and each file's partition values.
        """
        if not end or end.get("version", -1) <= end.get("from_version", -1):
            return []
        base = normalize_uri(self.table_uri)
        added = [entry for v in range(end["from_version"] + 1, end["version"] + 1) for entry in self._files_added(v)]
        schema = self.record_schema(end)
        files = [FileRange(path, _data_file_uri(base, path), size, i) for i, (path, size, _) in enumerate(added)]
        partitions = {i: values for i, (_, _, values) in enumerate(added)}
        return [
            Split(source_index, tuple(group), parts=(_DeltaRead(schema, tuple(partitions[f.file_index] for f in group)),))
            for group in packed(files, split_bytes)
        ]

    def read(self, split: Split, keys: Mapping[str, str]) -> tuple[pa.Table, pa.Table]:
        """A task's rows of its data files, in order, as the record schema (then ``_seq``); null or empty keys are dead letters."""
        how = next((p for p in split.parts if isinstance(p, _DeltaRead)), None)
        schema = how.schema if how is not None else self.record_schema()
        keys = {k: op for k, op in keys.items() if k in schema.names}
        records, dead = [], []
        for i, part in enumerate(split.files):
            constants = {}
            if how is not None:
                constants = {
                    name: pa.scalar(value, schema.field(name).type) for name, value in how.partitions[i] if name in schema.names
                }
            with open_file(
                self.source_id,
                part,
                "data file",
                keep=f"a Delta source's epoch reads the files its versions added (was {self.table_uri} vacuumed?)",
                never_changes="a Delta table's data files never change",
            ) as handle:
                try:
                    parquet = pq.ParquetFile(handle)
                    mismatches = schema_mismatches(
                        pa.schema([f for f in schema if f.name not in constants]), parquet.schema_arrow, absent_nullable_ok=True
                    )
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
            lines = np.arange(1, rows.num_rows + 1, dtype=np.int64)
            # Delta writers enforce NOT NULL columns: only keys need checking.
            got, lost = checked_rows(self.source_id, part, rows, schema, keys, lines, split.source_index)
            records.append(got)
            dead.append(lost)
        out = schema.append(pa.field(SEQ, pa.int64()))
        return (
            pa.concat_tables(records) if records else out.empty_table(),
            pa.concat_tables(dead) if dead else no_dead_letters(),
        )


@dataclass(frozen=True)
class _DeltaRead:
    """What a split's tasks need besides its files: the schema the driver planned with, each file's partition values."""

    schema: pa.Schema
    partitions: tuple[tuple[tuple[str, Any], ...], ...]


def _data_file_uri(base: str, path: str) -> str:
    """A data file's location: an add action's path is URI-encoded, relative to the table (or absolute)."""
    decoded = unquote(path)
    return decoded if "://" in path else join_uri(base, decoded)


def _data_files(table: Any) -> dict[str, tuple[int, tuple[tuple[str, Any], ...]]]:
    """Path -> (size, partition values) of a snapshot's live data files."""
    actions = add_actions(table)
    columns = [f"partition.{name}" for name in table.metadata().partition_columns]
    return {
        row["path"]: (int(row["size_bytes"]), tuple((c[len("partition.") :], row[c]) for c in columns))
        for row in actions.select(["path", "size_bytes", *columns]).to_pylist()
    }


def _schema(table: Any) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())
