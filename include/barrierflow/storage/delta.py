"""Committing staged Parquet files to Delta tables exactly once.

Every add action comes from the writer's own description of its file (path, size, row count, statistics; see
:mod:`barrierflow.storage.staging`), never from listing a directory.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from typing import Iterator, Sequence

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Field, Schema, Transaction
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from barrierflow.core import faults
from barrierflow.core.errors import CommitConflictError, FencedError, StorageError
from barrierflow.storage.commits import Fence, TableCommit

__all__ = [
    "commit_epoch_table", "check_fence", "fence_transaction", "raise_fence", "committed_version", "open_table",
    "latest_snapshot", "borrow_snapshot", "give_back", "live_paths", "add_actions", "stored_rows", "counted_rows",
    "schema_json_of", "TABLE_CONFIGURATION",
]  # fmt: skip

_MAX_COMMIT_ATTEMPTS = 5
# Properties of every table barrierflow creates. Opening a table replays the commits since its last
# checkpoint: with Delta's default interval of 100, opens and appends grew from ~11 to ~50 ms.
TABLE_CONFIGURATION = {"delta.checkpointInterval": "10"}


def open_table(uri: str, version: int | None = None) -> DeltaTable | None:
    """The Delta table at ``uri`` (at ``version``), or None if it does not exist."""
    try:
        return DeltaTable(uri, version=version)
    except TableNotFoundError:
        return None
    except DeltaError as exc:
        raise StorageError(f"cannot open Delta table {uri}: {exc}") from exc


# Snapshots of tables this process read, each lent to one caller at a time (:func:`borrow_snapshot`).
_SNAPSHOTS: "OrderedDict[str, DeltaTable]" = OrderedDict()
_SNAPSHOTS_LOCK = threading.Lock()
_MAX_SNAPSHOTS = 64


def borrow_snapshot(uri: str, *, current: bool = True) -> DeltaTable | None:
    """The latest snapshot of the table at ``uri`` (None if it does not exist), this caller's alone until :func:`give_back`.

    A snapshot read before is brought up to date (one listing, plus any new commits) rather than opened again (its log from the
    last checkpoint on: on S3, a dozen requests or more). ``current=False``: as it is, for estimates.
    """
    with _SNAPSHOTS_LOCK:
        table = _SNAPSHOTS.pop(uri, None)
    if table is not None and current:
        try:
            table.update_incremental()
        except DeltaError:
            table = None
    return table if table is not None else open_table(uri)


def give_back(uri: str, table: DeltaTable) -> None:
    """Return a snapshot from :func:`borrow_snapshot` for the next caller (who brings it up to date)."""
    with _SNAPSHOTS_LOCK:
        _SNAPSHOTS[uri] = table
        while len(_SNAPSHOTS) > _MAX_SNAPSHOTS:
            _SNAPSHOTS.popitem(last=False)


@contextmanager
def latest_snapshot(uri: str) -> Iterator[DeltaTable | None]:
    """:func:`borrow_snapshot` for the ``with`` block; on an error the snapshot is dropped (the next caller opens the table)."""
    table = borrow_snapshot(uri)
    yield table
    if table is not None:
        give_back(uri, table)


def schema_json_of(schema: pa.Schema) -> str:
    return Schema.from_arrow(schema).to_json()


def add_actions(table: DeltaTable) -> pa.Table:
    """The live files of a Delta snapshot, with flattened statistics."""
    return pa.table(table.get_add_actions(flatten=True))


def live_paths(table: DeltaTable) -> set[str]:
    return set(add_actions(table).column("path").to_pylist())


def stored_rows(table: DeltaTable) -> int:
    """Rows in the snapshot's live files (from the log's statistics, no data read)."""
    return sum(n or 0 for n in add_actions(table).column("num_records").to_pylist())


def counted_rows(num_records: Sequence[int | None]) -> int | None:
    """Rows in files by their add-actions' ``num_records``; None when any file has no statistics."""
    return None if any(n is None for n in num_records) else sum(n for n in num_records if n is not None)


def committed_version(uri: str, app: str, epoch: int, table: DeltaTable | None = None) -> int | None:
    """The table version holding the commit of ``epoch`` for ``app``, if any (``table``: the table at ``uri``, already open)."""
    table = table or open_table(uri)
    if table is None:
        return None
    current = table.transaction_version(app)
    if current is None or current < epoch:
        return None
    limit = 4  # newest first, widening the window: the commit is almost always the latest
    while True:
        entries = table.history(limit=limit)
        for entry in entries:
            if entry.get("barrierflow.app_id") == app and entry.get("barrierflow.epoch") == epoch:
                return int(entry["version"])
        if len(entries) < limit:
            break
        limit *= 8
    return table.version()  # committed by a later epoch only (history trimmed): the table is past it, all callers need to know


def commit_epoch_table(commit: TableCommit, app: str, epoch: int, attempt_id: str, fence: Fence | None = None) -> int:
    """Commit one table's share of epoch ``epoch`` with the fencing token ``fence``; idempotent. Returns its version.

    Protocol (each step safe to retry):
      1. Open the latest snapshot. If its app transaction for ``app`` is >= ``epoch``, the epoch is committed (by us or another
         attempt): return its version. If the table holds a fencing token above ``fence`` (a restore, a newer epoch), refuse.
      2. Check every file the manifest removes is still live; if not, the table moved under the epoch (a zombie of an older
         epoch): fence it. A sink widening (``table_schema_json``) rewrote every live file: its removes must equal the live files.
      3. Commit adds + removes in one Delta transaction carrying the app transactions ``(app, epoch)`` and ``fence``, and commit
         metadata tracing the epoch. A sink widening is an overwrite (the write mode that may change the schema): it removes every
         live file (step 2: the rewritten ones) and writes the widened schema as the commit's metaData. No automatic retry: a
         commit landing first makes this one fail, so two attempts never both commit, and no token can be raised between step 1's
         check and this commit. The commit that returns is the version after the snapshot read (or 0).
      4. On any commit error, go back to step 1: re-read before deciding.
    """
    metadata = {
        "barrierflow.app_id": app,
        "barrierflow.epoch": epoch,
        "barrierflow.attempt_id": attempt_id,
        "barrierflow.table": commit.name,
    }
    transactions = [Transaction(app, epoch), *([fence_transaction(fence)] if fence is not None else [])]
    properties = CommitProperties(custom_metadata=metadata, app_transactions=transactions, max_commit_retries=0)
    last_error: Exception | None = None
    for _ in range(_MAX_COMMIT_ATTEMPTS):
        with latest_snapshot(commit.uri) as table:
            version = _committed_before(commit, table, app, epoch, fence)
            if version is not None:
                return version
            try:
                return _commit_once(commit, table, epoch, properties)
            except (CommitFailedError, DeltaError, OSError) as exc:
                last_error = exc  # Step 4: a concurrent writer may have won; decide after re-reading
        time.sleep(0.05)
    raise CommitConflictError(
        f"could not commit epoch {epoch} to table {commit.name} after {_MAX_COMMIT_ATTEMPTS} attempts: {last_error}"
    )


def _committed_before(commit: TableCommit, table: DeltaTable | None, app: str, epoch: int, fence: Fence | None) -> int | None:
    """Step 1 of :func:`commit_epoch_table`: the version already holding the epoch, if any; refuses a fenced commit."""
    if table is None:
        return None
    version = committed_version(commit.uri, app, epoch, table)
    if version is None and fence is not None:
        check_fence(table, commit.name, fence, f"epoch {epoch}")
    return version


def _commit_once(commit: TableCommit, table: DeltaTable | None, epoch: int, properties: CommitProperties) -> int:
    """Steps 2-3 of :func:`commit_epoch_table` on the snapshot step 1 read; returns the new version."""
    adds = [
        AddAction(path=f.path, size=f.size, partition_values=dict(f.partition_values), modification_time=_now_ms(),
                  data_change=commit.data_change, stats=f.stats)
        for f in commit.adds
    ]  # fmt: skip
    schema = Schema.from_json(commit.schema_json)
    widened = Schema.from_json(commit.table_schema_json) if commit.table_schema_json is not None else None
    if table is None:
        if commit.removes:
            raise FencedError(f"table {commit.name} does not exist but epoch {epoch} removes files from it")
        faults.maybe_fail("commit.before_delta_commit")
        create_table_with_add_actions(
            commit.uri, widened or schema, adds, mode="error", partition_by=list(commit.partition_by) or None,
            configuration=TABLE_CONFIGURATION, commit_properties=properties,
        )  # fmt: skip
    else:
        if commit.removes or widened is not None:  # Step 2.
            live = live_paths(table)
            missing = set(commit.removes) - live
            if missing:
                raise FencedError(
                    f"epoch {epoch} of table {commit.name} would remove files that are no "
                    f"longer live ({sorted(missing)[:3]}...): a newer commit replaced them"
                )
            if widened is not None and live != set(commit.removes):
                raise FencedError(
                    f"epoch {epoch} widens table {commit.name} by rewriting the {len(commit.removes)} file(s) live at "
                    f"version {commit.base_version}, but the table has {len(live - set(commit.removes))} other live "
                    "file(s): a newer commit added them"
                )
        faults.maybe_fail("commit.before_delta_commit")
        if widened is None:
            _add_new_columns(table, commit.name, schema)
            removes = [RemoveAction(path=p, data_change=commit.data_change, deletion_timestamp=_now_ms()) for p in commit.removes]
        else:
            removes = []  # the overwrite removes every live file itself: the rewritten ones (step 2)
        table.create_write_transaction(  # step 3
            [*adds, *removes], mode="append" if widened is None else "overwrite", schema=widened or schema,
            partition_by=list(commit.partition_by) or None, commit_properties=properties,
        )  # fmt: skip
    faults.maybe_fail("commit.after_delta_commit")
    # No retries (``max_commit_retries=0``): the version after the one read, or the table's first.
    return 0 if table is None else table.version() + 1


def _add_new_columns(table: DeltaTable, name: str, schema: Schema) -> None:
    """Give a table the columns its new files carry (a commit of its own), nullable: earlier rows have none.

    An append keeps the table's schema, so a new column would stay invisible.
    What may change is checked before the vote (:mod:`barrierflow.core.schema_evolution`).
    """
    existing = {f.name for f in table.schema().fields}
    missing = [Field(f.name, f.type, nullable=True, metadata=f.metadata) for f in schema.fields if f.name not in existing]
    if missing:
        table.alter.add_columns(missing)


def fence_transaction(fence: Fence) -> Transaction:
    """The Delta app transaction that records ``fence`` in a commit."""
    return Transaction(fence.app_id, fence.version)


def check_fence(table: DeltaTable, name: str, fence: Fence, what: str) -> None:
    """Raise :class:`FencedError` if ``table`` holds a fencing token above ``fence``."""
    held = table.transaction_version(fence.app_id)
    if held is not None and held > fence.version:
        raise FencedError(
            f"{what} cannot commit to table {name}: the table holds fencing token "
            f"{Fence.from_version(fence.pipeline, held)}, above this commit's {fence}; a restore or a newer epoch "
            "has committed there since"
        )


def raise_fence(uri: str, fence: Fence, attempts: int = _MAX_COMMIT_ATTEMPTS) -> None:
    """Make the table at ``uri`` hold at least ``fence`` (an empty commit); idempotent, an absent table is skipped."""
    last: Exception | None = None
    for _ in range(attempts):
        with latest_snapshot(uri) as table:
            if table is None or (table.transaction_version(fence.app_id) or -1) >= fence.version:
                return
            metadata = {"barrierflow.operation": "fence", "barrierflow.fence": str(fence)}
            properties = CommitProperties(
                custom_metadata=metadata, app_transactions=[fence_transaction(fence)], max_commit_retries=0
            )
            try:
                table.create_write_transaction([], mode="append", schema=table.schema(), commit_properties=properties)
                return
            except DeltaError as exc:  # a commit landed first (maybe a zombie's): the next attempt reads it
                last = exc
        time.sleep(0.05)
    raise CommitConflictError(f"cannot raise the fencing token of table {uri} to {fence}: {last}")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
