"""barrierflow.storage.staging.compact_partition: a small state table compacted in one task equals a plain-Python compaction."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from barrierflow.state import worker_cache
from barrierflow.state.spec import KEY_GROUP, StateSpec
from barrierflow.state.worker_cache import StateFile, StateLookup
from barrierflow.storage.staging import compact_partition

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


@pytest.fixture(autouse=True)
def empty_cache() -> Any:
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


def _write(path: Path, rows: list[dict[str, Any]]) -> StateFile:
    rows = sorted(rows, key=lambda r: r[KEY_GROUP])
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
    return StateFile(str(path), path.stat().st_size, rows[0][KEY_GROUP], rows[-1][KEY_GROUP])


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


def _compact(tmp_path: Path, files: list[StateFile], changes: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    lookup = StateLookup(tuple(files), SCHEMA, ("order_id",), SPEC.ttl_ms, NOW)
    batches = pa.Table.from_pylist(changes, schema=CHANGE_SCHEMA).to_batches(max_chunksize=25)
    out = pa.Table.from_batches(
        list(compact_partition(lookup, str(tmp_path), "_staging/c", (PARTITIONS, KEY_GROUPS), {"_updated_at_ms": NOW, "_epoch": EPOCH}, iter(batches)))
    ).to_pylist()
    return out[0], out[1:]


def test_compacted_rows_equal_the_reference_one_file_per_range(tmp_path: Path) -> None:
    rnd = random.Random(11)
    keys = [f"o{i}" for i in range(300)]
    stored: list[dict[str, Any]] = []
    files = []
    for epoch in range(1, 5):
        rows = [_row(k, epoch, rnd) for k in rnd.sample(keys, 120)]
        stored += rows
        files.append(_write(tmp_path / f"e{epoch}.parquet", rows))
    changes = [
        {k: v for k, v in _row(k, EPOCH, rnd).items() if k not in ("_updated_at_ms", "_epoch")}
        for k in rnd.sample(keys + ["o900", "o901"], 90)
    ]
    summary, described = _compact(tmp_path, files, changes)

    written = [pq.read_table(tmp_path / d["path"]) for d in described]
    rows = [r for t in written for r in t.to_pylist()]
    expected = _reference(stored, changes)
    assert {r["order_id"]: r for r in rows} == expected
    assert len(rows) == len(expected) == summary["rows"] and summary["path"] == ""
    assert all(t.schema == SCHEMA for t in written)
    # Each file lies in one key-group range, sorted by key group; its description counts its rows.
    for table, d in zip(written, described):
        groups = table.column(KEY_GROUP).to_pylist()
        assert groups == sorted(groups) and len({g * PARTITIONS // KEY_GROUPS for g in groups}) == 1
        assert d["rows"] == table.num_rows
        assert json.loads(d["stats"])["minValues"][KEY_GROUP] == groups[0]
    assert len(described) == PARTITIONS


def test_an_epoch_without_changes_still_compacts(tmp_path: Path) -> None:
    rnd = random.Random(3)
    stored = [_row(f"o{i}", 1, rnd) for i in range(50)] + [_row(f"o{i}", 2, rnd) for i in range(0, 50, 3)]
    files = [_write(tmp_path / "a.parquet", stored[:50]), _write(tmp_path / "b.parquet", stored[50:])]
    summary, described = _compact(tmp_path, files, [])
    rows = [r for d in described for r in pq.read_table(tmp_path / d["path"]).to_pylist()]
    assert {r["order_id"]: r for r in rows} == _reference(stored, []) and summary["rows"] == len(rows) > 0
