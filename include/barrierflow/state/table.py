"""A state table as a task's kernel sees it: the live rows of its keys as of epoch n-1, and the changes it stages.

A task's :class:`TaskStateTable` reads only the task's key groups of the snapshot the driver planned (:class:`StateTablePlan`),
through the pipeline's state backend (README "Where the work runs, and the two state backends"): ``delta``
(:mod:`barrierflow.state.files`) or ``heap`` (:mod:`barrierflow.state.heap`, else read as ``delta`` reads). Results are the same.
"""

from __future__ import annotations

from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.core.arrow import after_changes, conform, latest_rows, rows_with_keys
from barrierflow.core.columns import EPOCH, KEY_GROUP, UPDATED_AT
from barrierflow.core.errors import CheckpointError
from barrierflow.state import heap
from barrierflow.state.files import stored_rows_of, unexpired
from barrierflow.state.spec import KeyGroups, StateSpec, StateTablePlan
from barrierflow.storage.layout import COMPACTED_DIR
from barrierflow.storage.staging import write_partition

__all__ = ["StateTable", "TaskStateTable"]


class StateTable(Protocol):
    """One state table as a kernel uses it."""

    spec: StateSpec

    def live_rows(self, keys: pa.Table) -> pa.Table:
        """The live rows (the table's schema) of the keys of ``keys`` as of epoch n-1.

        ``keys``: :data:`KEY_GROUP` and the key columns, or only their first ones (then every row whose first key columns match).
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
        """Steps 1-4 of :mod:`barrierflow.state.files` (matched in memory once every live row is held)."""
        names = [c for c in self.spec.key_columns if c in keys.column_names]
        wanted = conform(keys.select(names), pa.schema([self.schema.field(n) for n in names]))  # 1.
        if self._every is not None:
            return rows_with_keys(self._every, wanted, names)
        stored = stored_rows_of(self.plan.files, self.schema, set(pc.unique(keys[KEY_GROUP]).to_pylist()))  # 2.
        return self._live(rows_with_keys(stored, wanted, names))  # 3.

    def every_live_row(self) -> pa.Table:
        if self._every is None:
            self._every = self._live(stored_rows_of(self.plan.files, self.schema, set(self.groups)))
        return self._every

    def _live(self, rows: pa.Table) -> pa.Table:
        return unexpired(latest_rows(rows, self.spec.key_columns), self.spec.ttl_ms, self.processing_time_ms)  # 4.

    def stage(self, changes: pa.Table) -> None:
        if self._changes is not None:
            raise CheckpointError(f"state table {self.spec.table_name} staged twice in one task of epoch {self.epoch}")
        n = changes.num_rows
        rows = changes.append_column(UPDATED_AT, pa.repeat(pa.scalar(self.processing_time_ms, pa.int64()), n))
        rows = rows.append_column(EPOCH, pa.repeat(pa.scalar(self.epoch, pa.int64()), n))
        self._changes = conform(rows.drop_columns([c for c in rows.column_names if c not in self.schema.names]), self.schema)

    def finish(self, prefix: str, ranges: int) -> list[dict[str, Any]]:
        """Write the task's changes (or its share of a compaction: every live row after the epoch); the staged files.

        ``ranges``: how many key-group ranges the table's files are clustered by.
        """
        rows = changes = self._changes if self._changes is not None else self.schema.empty_table()
        after = None
        if self.plan.compact or self.plan.backend == "heap":
            after = after_changes(self.every_live_row(), changes, self.spec.key_columns)
            if self.plan.compact:
                rows, prefix = after, f"{prefix}/{COMPACTED_DIR}"
        described = write_partition(self.plan.uri, prefix, self.schema, (ranges, self.groups.total), rows.sort_by(KEY_GROUP))
        if self.plan.backend == "heap" and after is not None:
            heap.keep(self.plan, self.groups, after, described)
        return described
