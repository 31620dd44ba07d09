"""State tables on the driver: planning an epoch's reads, and passes over whole tables.

Keyed state is kept in Delta tables, one per (operator, state name). An epoch appends one row per key it changed, with its epoch
(a tombstone for a cleared key); a key's value is its row with the highest ``_epoch``. A table whose changelog outgrew its base is
compacted by the epoch that notices (:func:`_needs_compaction`), in its commit; :func:`compact` compacts one between epochs.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from barrierflow.core.arrow import conform, latest_rows
from barrierflow.core.columns import KEY_GROUP
from barrierflow.core.errors import CheckpointError
from barrierflow.core.settings import COMPACTION_MAX_FILES
from barrierflow.state.files import StateFile
from barrierflow.state.spec import StateSpec, StateTablePlan
from barrierflow.storage.delta import add_actions, borrow_snapshot, give_back, latest_snapshot, live_paths, stored_rows
from barrierflow.storage.layout import COMPACTED_DIR
from barrierflow.storage.objects import arrow_filesystem, join_uri
from barrierflow.storage.staging import write_parquet

__all__ = ["EpochStateTables", "state_files", "read_small_table", "live_row_chunks", "stored_batches", "compact"]

CHUNK_ROWS = 1_000_000  # rows a driver-side pass over a whole table (savepoint, restore, maintenance) holds at once


class EpochStateTables:
    """The state tables of one epoch on the driver: each one's plan, and its snapshot (borrowed until :meth:`release`).

    A table holding a newer epoch than the last completed one means recovery has not run: refused. An epoch compacting a table
    removes every file of the snapshot (at its version) and adds the tasks' share of every live row.
    """

    def __init__(self, app_id: str, last_completed_epoch: int | None, backend: str) -> None:
        self.app_id = app_id
        self.last = last_completed_epoch
        self.backend = backend
        self._tables: dict[str, Any] = {}

    def plan(self, spec: StateSpec, uri: str, *, whole: bool = False) -> tuple[StateTablePlan, tuple[str, ...], int | None]:
        """The table's plan for the tasks, and what its commit removes at which base version (``()``, None: nothing)."""
        table = borrow_snapshot(uri)
        self._tables[uri] = table
        if table is None:
            return StateTablePlan(spec, uri, (), False, self.backend, whole), (), None
        committed = table.transaction_version(self.app_id)
        if committed is not None and self.last is not None and committed > self.last:
            raise CheckpointError(
                f"state table {spec.table_name} holds epoch {committed}, newer than the last completed epoch {self.last}: "
                "run recovery first"
            )
        actions = add_actions(table)
        plan = StateTablePlan(spec, uri, tuple(state_files(uri, actions)), _needs_compaction(actions), self.backend, whole)
        if not plan.compact:
            return plan, (), None
        return plan, tuple(sorted(actions.column("path").to_pylist())), table.version()

    def stored_rows(self, uri: str) -> int | None:
        """Rows of the table as this process last saw it, without asking the store (an estimate for placement)."""
        table = borrow_snapshot(uri, current=False)
        if table is None:
            return 0
        try:
            return stored_rows(table)
        finally:
            give_back(uri, table)

    def release(self) -> None:
        """Give the snapshots back once the epoch's files are staged: its commits, and the next epoch, bring them up to date."""
        for uri, table in self._tables.items():
            if table is not None:
                give_back(uri, table)
        self._tables.clear()


def state_files(uri: str, actions: pa.Table) -> list[StateFile]:
    """A snapshot's files as tasks read them: URI, size and key-group range (statistics)."""
    paths, sizes = actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist()
    lows, highs = _group_bounds(actions, "min"), _group_bounds(actions, "max")
    return [StateFile(join_uri(uri, p), size, low, high) for p, size, low, high in zip(paths, sizes, lows, highs)]


def _group_bounds(actions: pa.Table, bound: str) -> list[Any]:
    """Each file's ``min`` or ``max`` key group by its statistics (None: none)."""
    column = f"{bound}.{KEY_GROUP}"
    return actions.column(column).to_pylist() if column in actions.column_names else [None] * actions.num_rows


def read_small_table(uri: str, spec: StateSpec) -> pa.Table:
    """Every live row of a small state table as of its latest snapshot, on the driver (a watermark's maxima, offsets)."""
    with latest_snapshot(uri) as table:
        files = table.file_uris() if table is not None else []
    # File by file: a few small files, where a Delta dataset's set-up (to_pyarrow_table) took 4-5 ms a table.
    parts = [conform(pq.read_table(path, filesystem=fs), spec.arrow_schema()) for fs, path in map(arrow_filesystem, files)]
    return latest_rows(pa.concat_tables(parts) if parts else spec.arrow_schema().empty_table(), spec.key_columns)


def live_row_chunks(table: Any, key_columns: list[str], *, max_rows: int = CHUNK_ROWS) -> Iterator[pa.Table]:
    """The live rows of a state table snapshot, one range of key groups at a time (ascending; empty ones skipped).

    A key lies in one key group, so its latest row is within its range; the driver holds about ``max_rows`` stored rows at once.
    """
    actions = add_actions(table)
    stored = sum(n or 0 for n in actions.column("num_records").to_pylist())
    dataset = table.to_pyarrow_dataset()
    lows, highs = _group_bounds(actions, "min"), _group_bounds(actions, "max")
    if stored <= max_rows or not lows or None in lows or None in highs:
        yield latest_rows(dataset.to_table(), key_columns)
        return
    low, high = min(lows), max(highs) + 1
    chunks = min(math.ceil(stored / max_rows), high - low)
    bounds = [low + (high - low) * i // chunks for i in range(chunks + 1)]
    for start, end in zip(bounds, bounds[1:]):
        selected = (pc.field(KEY_GROUP) >= start) & (pc.field(KEY_GROUP) < end)
        live = latest_rows(dataset.to_table(filter=selected), key_columns)
        if live.num_rows:
            yield live


def stored_batches(table: Any, *, max_rows: int = CHUNK_ROWS) -> Iterator[pa.Table]:
    """Every stored row of a table snapshot, at most about ``max_rows`` at a time."""
    pending: list[pa.RecordBatch] = []
    held = 0
    for batch in table.to_pyarrow_dataset().to_batches():
        pending.append(batch)
        held += batch.num_rows
        if held >= max_rows:
            yield pa.Table.from_batches(pending)
            pending, held = [], 0
    if pending:
        yield pa.Table.from_batches(pending)


def _needs_compaction(actions: pa.Table) -> bool:
    """Size-tiered policy: compact once the changelog outgrows the compacted base.

    Files written together (one epoch's changes, one compaction) share a directory: a generation; the base is the largest one.
    Reads stay within ~2x the live rows; a rewrite is amortised over many epochs when few keys change. More than
    ``COMPACTION_MAX_FILES`` files are compacted anyway.
    """
    paths = actions.column("path").to_pylist()
    rows = [n or 0 for n in actions.column("num_records").to_pylist()]
    generations: Counter[str] = Counter()
    for path, n in zip(paths, rows):
        generations[path.rpartition("/")[0]] += n
    if len(generations) <= 1:
        return False
    return len(paths) > COMPACTION_MAX_FILES or sum(rows) > 2 * max(generations.values())


def compact(spec: StateSpec, uri: str, app: str, epoch: int, attempt_id: str) -> int | None:
    """Rewrite a state table to one live row per key (between epochs, under the epoch lease); returns the new version.

    A maintenance commit (``dataChange=false``, no app transaction): same logical content, for readers and the consistent cut.
    """
    with latest_snapshot(uri) as table:
        paths = sorted(live_paths(table)) if table is not None else []
        if table is None or len(paths) <= 1:
            return None
        schema = spec.arrow_schema()
        staged = []
        for chunk in live_row_chunks(table, spec.key_columns):  # ascending key-group ranges: the files stay clustered
            rows = chunk.select(schema.names).cast(schema)
            staged += write_parquet(uri, f"{COMPACTED_DIR}/{epoch:010d}-{attempt_id}", rows, sort_by=(KEY_GROUP,))
        now = time.time_ns() // 1_000_000
        actions: list[Any] = [
            AddAction(path=f.path, size=f.size, partition_values={}, modification_time=now, data_change=False, stats=f.stats)
            for f in staged
        ]
        actions += [RemoveAction(path=p, data_change=False, deletion_timestamp=now) for p in paths]
        properties = CommitProperties(
            custom_metadata={"barrierflow.operation": "compact", "barrierflow.after_epoch": epoch}, max_commit_retries=0
        )
        try:
            table.create_write_transaction(actions, mode="append", schema=table.schema(), commit_properties=properties)
        except CommitFailedError:
            return None  # someone else moved the table; compaction is best effort
        return int(table.version()) + 1  # no retries (``max_commit_retries=0``): the commit is the version after the snapshot's
