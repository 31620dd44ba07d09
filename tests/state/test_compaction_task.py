"""barrierflow.state.table.TaskStateTable.finish of a compacting epoch: a task's share of the compaction equals a plain-Python one.

The epoch that compacts a state table (``StateTablePlan(compact=True)``)
has every task holding key groups write every live row of its key groups
after the epoch's changes, clustered by key-group range; the commit then
replaces every file of the snapshot with them. The snapshot here is a real
Delta table (``write_deltalake``, one append per epoch), read through its
add actions as the driver plans it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from barrierflow.core.columns import KEY_GROUP
from barrierflow.state import files as worker_cache
from barrierflow.state.snapshots import state_files
from barrierflow.state.spec import KeyGroups, StateSpec, StateTablePlan
from barrierflow.state.table import TaskStateTable
from barrierflow.storage.delta import add_actions
from barrierflow.storage.layout import COMPACTED_DIR

SPEC = StateSpec(
    operator_id="timers",
    name="pending",
    key_fields=(pa.field("order_id", pa.string()),),
    # A list column, as a list state's: the task carries nested values.
    value_fields=(pa.field("amount", pa.float64()), pa.field("times", pa.list_(pa.int64()))),
    ttl_ms=1_000,
)
SCHEMA = SPEC.arrow_schema()
KEY_GROUPS, PARTITIONS = 16, 2
NOW, EPOCH = 10_500, 9
CHANGE_SCHEMA = pa.schema([f for f in SCHEMA if f.name not in ("_updated_at_ms", "_epoch")])
# The key groups of each task: the whole table in one task, or two tasks of one key-group range each.
TASKS = {"one task": [KeyGroups.all(KEY_GROUPS)], "two tasks": [KeyGroups(0, 7, KEY_GROUPS), KeyGroups(8, 15, KEY_GROUPS)]}


@pytest.fixture(autouse=True)
def empty_cache() -> Iterator[None]:
    worker_cache.clear()
    yield
    worker_cache.clear()


def _group(key: str) -> int:
    return int(key[1:]) % KEY_GROUPS


def _row(key: str, epoch: int, rnd: random.Random) -> dict[str, Any]:
    return {
        "order_id": key, KEY_GROUP: _group(key), "amount": rnd.random(), "times": [rnd.randrange(9)] * rnd.randrange(3),
        "_updated_at_ms": rnd.choice([9_000, 10_000]), "_deleted": rnd.random() < 0.2, "_epoch": epoch,
    }  # fmt: skip


def _append(uri: str, rows: list[dict[str, Any]]) -> None:
    """One epoch's changes committed to the state table, clustered by key group as tasks stage them."""
    rows = sorted(rows, key=lambda r: r[KEY_GROUP])
    write_deltalake(uri, pa.Table.from_pylist(rows, schema=SCHEMA), mode="append")


def _reference(stored: list[dict[str, Any]], changes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every live key once: a changed key's change unless deleted; else its latest stored row, unless deleted or expired."""
    latest: dict[str, dict[str, Any]] = {}
    for r in stored:
        if r["order_id"] not in latest or r["_epoch"] > latest[r["order_id"]]["_epoch"]:
            latest[r["order_id"]] = r
    live = {k: r for k, r in latest.items() if not r["_deleted"] and r["_updated_at_ms"] + 1_000 > NOW}
    for c in changes:
        live.pop(c["order_id"], None)
        if not c["_deleted"]:
            live[c["order_id"]] = {**c, "_updated_at_ms": NOW, "_epoch": EPOCH}
    return live


def _compact(uri: str, changes: list[dict[str, Any]], tasks: list[KeyGroups]) -> list[dict[str, Any]]:
    """Each task's share of the compaction (its key groups' changes staged, then finished); every staged file's description."""
    files = tuple(state_files(uri, add_actions(DeltaTable(uri))))
    plan = StateTablePlan(SPEC, uri, files, compact=True)
    described: list[dict[str, Any]] = []
    for groups in tasks:
        table = TaskStateTable(plan, groups, EPOCH, NOW)
        mine = [c for c in changes if groups.low <= c[KEY_GROUP] <= groups.high]
        if mine:
            table.stage(pa.Table.from_pylist(mine, schema=CHANGE_SCHEMA))
        described += table.finish("_staging/c", PARTITIONS)
    return described


@pytest.mark.parametrize("tasks", TASKS.values(), ids=TASKS.keys())
def test_compacted_rows_equal_the_reference_one_file_per_range(tmp_path: Path, tasks: list[KeyGroups]) -> None:
    rnd = random.Random(11)
    uri = str(tmp_path / "state")
    keys = [f"o{i}" for i in range(300)]
    stored: list[dict[str, Any]] = []
    for epoch in range(1, 5):
        rows = [_row(k, epoch, rnd) for k in rnd.sample(keys, 120)]
        stored += rows
        _append(uri, rows)
    changes = [
        {k: v for k, v in _row(k, EPOCH, rnd).items() if k not in ("_updated_at_ms", "_epoch")}
        for k in rnd.sample(keys + ["o900", "o901"], 90)
    ]
    described = _compact(uri, changes, tasks)

    written = [pq.read_table(Path(uri) / d["path"]) for d in described]
    rows = [r for t in written for r in t.to_pylist()]
    expected = _reference(stored, changes)
    assert {r["order_id"]: r for r in rows} == expected
    assert len(rows) == len(expected) == sum(d["rows"] for d in described)
    assert all(d["path"].startswith(f"_staging/c/{COMPACTED_DIR}/") for d in described)  # the compaction's directory
    assert all(t.schema == SCHEMA for t in written)
    # Each file lies in one key-group range, sorted by key group; its description counts its rows.
    for table, d in zip(written, described):
        groups = table.column(KEY_GROUP).to_pylist()
        assert groups == sorted(groups) and len({g * PARTITIONS // KEY_GROUPS for g in groups}) == 1
        assert d["rows"] == table.num_rows
        assert json.loads(d["stats"])["minValues"][KEY_GROUP] == groups[0]
    assert len(described) == PARTITIONS


@pytest.mark.parametrize("tasks", TASKS.values(), ids=TASKS.keys())
def test_an_epoch_without_changes_still_compacts(tmp_path: Path, tasks: list[KeyGroups]) -> None:
    rnd = random.Random(3)
    uri = str(tmp_path / "state")
    stored = [_row(f"o{i}", 1, rnd) for i in range(50)] + [_row(f"o{i}", 2, rnd) for i in range(0, 50, 3)]
    _append(uri, stored[:50])
    _append(uri, stored[50:])
    described = _compact(uri, [], tasks)
    rows = [r for d in described for r in pq.read_table(Path(uri) / d["path"]).to_pylist()]
    assert {r["order_id"]: r for r in rows} == _reference(stored, []) and sum(d["rows"] for d in described) == len(rows) > 0
