"""A state table as a task's kernel sees it: the live rows of its keys as of epoch n-1, and the changes it stages.

The driver plans each state table for an epoch (:class:`StateTablePlan`):
its snapshot's files as of the last completed epoch, and whether the epoch
compacts it. A task's :class:`TaskStateTable` reads only the task's key
groups, through the pipeline's state backend (results are the same):

- ``delta``: the snapshot's files, read per key group through the Python
  worker's cache (:mod:`barrierflow.state.files`), as RocksDB serves reads;
- ``heap``: every live row of the task's key groups kept on its host
  between epochs (:mod:`barrierflow.state.heap`), used while it is exactly
  the snapshot's (the same files), else read as ``delta`` reads them.

:meth:`TaskStateTable.finish` writes the task's changes as staged files
clustered by key group or, when the epoch compacts the table (its commit
removes every file of the snapshot), every live row of the task's key
groups after the epoch.
"""

from __future__ import annotations

from typing import Any, Protocol

import pyarrow as pa

from barrierflow.core.arrow import after_changes, conform, rows_with_keys
from barrierflow.core.columns import EPOCH, KEY_GROUP, UPDATED_AT
from barrierflow.core.errors import CheckpointError
from barrierflow.state import heap
from barrierflow.state.files import every_live_row, live_rows_of, unexpired
from barrierflow.state.spec import KeyGroups, StateSpec, StateTablePlan
from barrierflow.storage.layout import COMPACTED_DIR
from barrierflow.storage.staging import write_partition

__all__ = ["StateTable", "TaskStateTable"]


class StateTable(Protocol):
    """One state table as a kernel uses it."""

    spec: StateSpec

    def live_rows(self, keys: pa.Table) -> pa.Table:
        """The live rows (the table's schema) of the keys of ``keys`` as of epoch n-1.

        ``keys`` holds :data:`KEY_GROUP` and the key columns, or only their
        first ones: then every row whose first key columns match.
        """
        ...

    def every_live_row(self) -> pa.Table:
        """Every live row of the task's key groups as of epoch n-1."""
        ...

    def stage(self, changes: pa.Table) -> None:
        """The epoch's changed keys: key columns, :data:`KEY_GROUP`, value columns, ``_deleted`` (once per table and task)."""
        ...


class TaskStateTable:
    """:class:`StateTable` for the key groups of one task."""

    def __init__(self, plan: StateTablePlan, groups: KeyGroups, epoch: int, processing_time_ms: int) -> None:
        self.spec = plan.spec
        self.plan = plan
        self.groups = KeyGroups.all(groups.total) if plan.whole else groups
        self.epoch = epoch
        self.processing_time_ms = processing_time_ms
        self.schema = plan.spec.arrow_schema()
        self._changes: pa.Table | None = None
        resident = heap.lookup(plan, self.groups) if plan.backend == "heap" else None
        self._every: pa.Table | None = None if resident is None else unexpired(resident, self.spec.ttl_ms, processing_time_ms)

    def live_rows(self, keys: pa.Table) -> pa.Table:
        if self._every is not None:
            names = [c for c in self.spec.key_columns if c in keys.column_names]
            return rows_with_keys(
                self._every, conform(keys.select(names), pa.schema([self.schema.field(n) for n in names])), names
            )
        return live_rows_of(self.plan.files, self.schema, self.spec.key_columns, self.spec.ttl_ms, self.processing_time_ms, keys)

    def every_live_row(self) -> pa.Table:
        if self._every is None:
            self._every = every_live_row(
                self.plan.files, self.schema, self.spec.key_columns, self.spec.ttl_ms, self.processing_time_ms, list(self.groups)
            )
        return self._every

    def stage(self, changes: pa.Table) -> None:
        if self._changes is not None:
            raise CheckpointError(f"state table {self.spec.table_name} staged twice in one task of epoch {self.epoch}")
        n = changes.num_rows
        rows = changes.append_column(UPDATED_AT, pa.repeat(pa.scalar(self.processing_time_ms, pa.int64()), n))
        rows = rows.append_column(EPOCH, pa.repeat(pa.scalar(self.epoch, pa.int64()), n))
        self._changes = conform(rows.drop_columns([c for c in rows.column_names if c not in self.schema.names]), self.schema)

    def finish(self, prefix: str, ranges: int) -> list[dict[str, Any]]:
        """Write the task's changes (or its share of a compaction); the staged files' descriptions.

        ``ranges``: how many key-group ranges the table's files are clustered by.
        """
        changes = self._changes if self._changes is not None else self.schema.empty_table()
        rows = changes
        after = None
        if self.plan.compact or self.plan.backend == "heap":
            after = after_changes(self.every_live_row(), changes, self.spec.key_columns)
            if self.plan.compact:
                rows, prefix = after, f"{prefix}/{COMPACTED_DIR}"
        described = write_partition(self.plan.uri, prefix, self.schema, (ranges, self.groups.total), rows.sort_by(KEY_GROUP))
        if self.plan.backend == "heap" and after is not None:
            heap.keep(self.plan, self.groups, after, described)
        return described
