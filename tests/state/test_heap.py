"""barrierflow.state.heap: a task's resident copy of its key groups' live rows serves only the exact snapshot it equals.

Replaces tests/unit/test_resident.py (the copies were then promoted by the
driver after a commit; now a copy is named by the state files it equals,
and a task finds it only when the table's snapshot is exactly those files).

Each test runs epochs on a real Delta state table in ``tmp_path``, as an
epoch does: the driver plans the table from its snapshot (``state_files``),
a task reads and stages through :class:`TaskStateTable` with the ``heap``
backend, and the staged files are committed (``commit_epoch_table``) or not
(a failed attempt). What a task reads is always checked against a
plain-Python reference of the committed changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from barrierflow.core.columns import KEY_GROUP
from barrierflow.core.keys import key_groups
from barrierflow.state import files, heap
from barrierflow.state.snapshots import state_files
from barrierflow.state.spec import KeyGroups, StateSpec, StateTablePlan
from barrierflow.state.table import TaskStateTable
from barrierflow.storage.commits import StagedFile, TableCommit, TableKind
from barrierflow.storage.delta import add_actions, commit_epoch_table, schema_json_of
from barrierflow.storage.layout import COMPACTED_DIR

SPEC = StateSpec(
    operator_id="totals",
    name="accumulators",
    key_fields=(pa.field("k", pa.string()),),
    value_fields=(pa.field("count", pa.int64()),),
)
SCHEMA = SPEC.arrow_schema()
CHANGES = pa.schema([f for f in SCHEMA if f.name not in ("_updated_at_ms", "_epoch")])
GROUPS = 16
ALL = KeyGroups.all(GROUPS)
ROWS_ENV = "BARRIERFLOW_RESIDENT_STATE_ROWS"
NOW = 1_000


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This worker's copies and the file cache start empty; the host's shared directory is the test's own."""
    monkeypatch.setattr(files, "_host_dir", lambda: str(tmp_path / "host"))
    monkeypatch.delenv(ROWS_ENV, raising=False)
    heap._copies.clear()
    files.clear()
    yield
    heap._copies.clear()
    files.clear()


def _group(keys: list[str]) -> pa.Array:
    return key_groups(pa.table({"k": pa.array(keys, pa.string())}), GROUPS)


def _changes(values: dict[str, int | None]) -> pa.Table:
    """A task's changes: ``None`` deletes the key."""
    keys = sorted(values)
    return pa.table(
        {
            "k": pa.array(keys, pa.string()),
            KEY_GROUP: _group(keys),
            "count": pa.array([values[k] for k in keys], pa.int64()),
            "_deleted": [values[k] is None for k in keys],
        },
        schema=CHANGES,
    )


class Table:
    """A state table in ``tmp_path`` and the plain-Python reference of its committed content."""

    def __init__(self, tmp_path: Path, initial: dict[str, int]) -> None:
        self.uri = str(tmp_path / "state" / "totals" / "accumulators")
        self.committed = dict(initial)
        self.epoch = 1
        keys = sorted(initial)
        rows = pa.table(
            {
                "k": pa.array(keys, pa.string()), KEY_GROUP: _group(keys), "count": pa.array([initial[k] for k in keys], pa.int64()),
                "_updated_at_ms": pa.array([0] * len(keys), pa.int64()), "_deleted": [False] * len(keys),
                "_epoch": pa.array([1] * len(keys), pa.int64()),
            },
            schema=SCHEMA,
        ).sort_by(KEY_GROUP)  # fmt: skip
        write_deltalake(self.uri, rows, mode="append")

    def plan(self, *, compact: bool = False) -> StateTablePlan:
        """The driver's plan of the table as of its latest snapshot."""
        return StateTablePlan(SPEC, self.uri, tuple(state_files(self.uri, add_actions(DeltaTable(self.uri)))), compact, "heap")

    def run(
        self, values: dict[str, int | None], *, groups: KeyGroups = ALL, compact: bool = False, plan: StateTablePlan | None = None
    ) -> tuple[TaskStateTable, list[dict[str, Any]]]:
        """One task of the next epoch: reads its keys, stages ``values``' keys of its key groups; its staged files."""
        plan = plan or self.plan(compact=compact)
        task = TaskStateTable(plan, groups, self.epoch + 1, NOW)
        changes = _changes(values)
        changes = changes.filter(
            pc.and_(pc.greater_equal(changes[KEY_GROUP], groups.low), pc.less_equal(changes[KEY_GROUP], groups.high))
        )
        assert _values(task.live_rows(changes.select(["k", KEY_GROUP]))) == {
            k: self.committed[k] for k in changes["k"].to_pylist() if k in self.committed
        }, "the task read its keys as committed"
        task.stage(changes)
        return task, task.finish(f"_staging/e{self.epoch + 1}", 2)

    def commit(self, values: dict[str, int | None], described: list[dict[str, Any]], *, compact: bool = False) -> None:
        """The epoch's commit of the tasks' staged files (a compaction replaces every file of the snapshot)."""
        self.epoch += 1
        snapshot = DeltaTable(self.uri)
        removes = tuple(sorted(add_actions(snapshot).column("path").to_pylist())) if compact else ()
        commit = TableCommit(
            SPEC.table_name, self.uri, TableKind.STATE, schema_json_of(SCHEMA), (), tuple(StagedFile(**d) for d in described),
            removes=removes, base_version=snapshot.version() if compact else None,
        )  # fmt: skip
        commit_epoch_table(commit, "test-app", self.epoch, f"attempt-{self.epoch}")
        for k, v in values.items():
            if v is None:
                self.committed.pop(k, None)
            else:
                self.committed[k] = v

    def epoch_run(self, values: dict[str, int | None], **kwargs: Any) -> None:
        """A task, then the commit of what it staged."""
        _, described = self.run(values, **kwargs)
        self.commit(values, described, compact=kwargs.get("compact", False))

    def read(self, groups: KeyGroups = ALL) -> dict[str, int]:
        """Every live row a task holding ``groups`` reads now (a new plan of the latest snapshot)."""
        task = TaskStateTable(self.plan(), groups, self.epoch + 1, NOW)
        return _values(task.every_live_row())

    def expected(self, groups: KeyGroups = ALL) -> dict[str, int]:
        keys = sorted(self.committed)
        return {k: self.committed[k] for k, g in zip(keys, _group(keys).to_pylist()) if groups.low <= g <= groups.high}


def _values(rows: pa.Table | None) -> dict[str, int]:
    assert rows is not None
    return dict(zip(rows["k"].to_pylist(), rows["count"].to_pylist()))


def _no_file_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on, reading a state file fails the test: what a task reads comes from its resident copy."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a state file was read")

    monkeypatch.setattr(files, "_file_rows", refuse)


def test_a_copy_serves_the_next_epoch_after_its_own_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = Table(tmp_path, {"a": 1, "b": 2, "c": 3})
    values: dict[str, int | None] = {"a": 10, "c": None, "d": 4}
    _, described = table.run(values)
    assert heap.lookup(table.plan(), ALL) is None  # not committed yet: the snapshot is not the files it equals
    table.commit(values, described)
    assert _values(heap.lookup(table.plan(), ALL)) == {"a": 10, "b": 2, "d": 4}
    _no_file_reads(monkeypatch)
    assert table.read() == table.expected() == {"a": 10, "b": 2, "d": 4}
    table.epoch_run({"b": 20, "e": 5})  # the next epoch reads (and keeps) from memory alone
    assert table.read() == {"a": 10, "b": 20, "d": 4, "e": 5}


def test_a_copy_made_for_other_key_groups_does_not_serve(tmp_path: Path) -> None:
    """A rescale: the same snapshot, but the task holds another range of key groups."""
    table = Table(tmp_path, {"a": 1, "b": 2})
    table.epoch_run({"a": 10})
    half = KeyGroups(0, GROUPS // 2 - 1, GROUPS)
    assert heap.lookup(table.plan(), half) is None
    assert table.read(half) == table.expected(half)


def test_a_copy_does_not_serve_after_another_writers_commit(tmp_path: Path) -> None:
    table = Table(tmp_path, {"a": 1, "b": 2})
    table.epoch_run({"a": 10})
    # Someone else commits to the table (a restore, another attempt): its snapshot is no longer the copy's files.
    other = _changes({"b": 99}).append_column("_updated_at_ms", pa.array([0], pa.int64()))
    other = other.append_column("_epoch", pa.array([table.epoch + 1], pa.int64())).select(SCHEMA.names).cast(SCHEMA)
    write_deltalake(table.uri, other, mode="append")
    table.committed["b"] = 99
    table.epoch += 1
    assert heap.lookup(table.plan(), ALL) is None
    assert table.read() == table.expected() == {"a": 10, "b": 99}


def test_the_copy_of_a_failed_commit_never_serves(tmp_path: Path) -> None:
    table = Table(tmp_path, {"a": 1, "b": 2})
    table.epoch_run({"a": 10})
    committed = table.expected()
    table.run({"a": 11, "b": None, "c": 3})  # staged and kept, never committed
    served = heap.lookup(table.plan(), ALL)
    # What serves, if anything, is the copy of the committed epoch before (kept for the host), never the failed one.
    assert served is None or _values(served) == committed
    assert table.read() == committed == {"a": 10, "b": 2}
    table.epoch_run({"b": 20})  # the next attempt builds on the committed state
    assert table.read() == {"a": 10, "b": 20}


def test_a_compacting_epochs_copy_equals_its_compacted_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = Table(tmp_path, {"a": 1, "b": 2, "c": 3})
    table.epoch_run({"a": 10})
    table.epoch_run({"b": None, "d": 4}, compact=True)  # every live row written again; the commit removes the rest
    assert all(f"/{COMPACTED_DIR}/" in f.uri for f in table.plan().files)  # the compaction's files alone
    assert _values(heap.lookup(table.plan(), ALL)) == {"a": 10, "c": 3, "d": 4}
    _no_file_reads(monkeypatch)
    assert table.read() == table.expected()


def test_copies_are_bounded_by_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ROWS_ENV, "3")
    table = Table(tmp_path, {"a": 1, "b": 2})
    table.epoch_run({"c": 3})  # 3 live rows: kept
    assert _values(heap.lookup(table.plan(), ALL)) == {"a": 1, "b": 2, "c": 3}
    table.epoch_run({"d": 4})  # 4 live rows: over the bound, never kept (the older copy goes too)
    assert heap.lookup(table.plan(), ALL) is None
    assert heap._copies == {}
    assert table.read() == table.expected() == {"a": 1, "b": 2, "c": 3, "d": 4}


def test_residency_can_be_turned_off(tmp_path: Path) -> None:
    table = Table(tmp_path, {"a": 1})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ROWS_ENV, "0")
        table.epoch_run({"b": 2})
        assert heap.lookup(table.plan(), ALL) is None
        assert not list((tmp_path / "host").glob("heap-*.arrow"))  # nothing kept for the host either
        assert table.read() == {"a": 1, "b": 2}


def test_the_hosts_other_workers_take_the_copy_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark does not send a key-group range to the same Python worker every epoch: the copy is saved for the host."""
    table = Table(tmp_path, {"a": 1, "b": 2})
    table.epoch_run({"a": 10})
    assert len(list((tmp_path / "host").glob("heap-*.arrow"))) == 1
    heap._copies.clear()  # another worker of the host: its memory holds no copy
    _no_file_reads(monkeypatch)
    assert table.read() == {"a": 10, "b": 2}
    assert not list((tmp_path / "host").glob("heap-*.arrow"))  # taken: this worker holds it now
    assert _values(heap.lookup(table.plan(), ALL)) == {"a": 10, "b": 2}


def test_a_copy_is_read_with_the_tasks_ttl(tmp_path: Path) -> None:
    """A copy holds the rows live after its epoch; a later epoch's processing time expires them as reading the files would."""
    spec = StateSpec(SPEC.operator_id, SPEC.name, SPEC.key_fields, SPEC.value_fields, ttl_ms=500)
    table = Table(tmp_path, {"a": 1})
    table.epoch_run({"b": 2})  # a: updated at 0; b: at NOW
    plan = StateTablePlan(spec, table.uri, table.plan().files, False, "heap")
    assert heap.lookup(plan, ALL) is not None
    later = TaskStateTable(plan, ALL, table.epoch + 1, NOW + 400)  # a expired (0 + 500 <= 1400), b not
    assert _values(later.every_live_row()) == {"b": 2}


def test_each_tasks_copy_serves_after_a_parallel_epochs_commit(tmp_path: Path) -> None:
    table = Table(tmp_path, {f"k{i}": i for i in range(20)})
    values: dict[str, int | None] = {f"k{i}": 100 + i for i in range(20)}
    ranges = [KeyGroups(0, GROUPS // 2 - 1, GROUPS), KeyGroups(GROUPS // 2, GROUPS - 1, GROUPS)]
    plan = table.plan()
    described = [d for groups in ranges for d in table.run(values, groups=groups, plan=plan)[1]]
    assert len(described) == 2  # each task staged its key groups' changes
    table.commit(values, described)
    for groups in ranges:
        assert _values(heap.lookup(table.plan(), groups)) == table.expected(groups)
