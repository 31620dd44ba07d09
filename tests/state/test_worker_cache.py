"""barrierflow.state.files, the Python worker's cache of state files: keyed reads equal a plain-Python reading of the files."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from barrierflow.core.arrow import rows_without_keys
from barrierflow.core.columns import KEY_GROUP
from barrierflow.core.errors import ConfigurationError
from barrierflow.core.settings import WORKER_STATE_CACHE_MB
from barrierflow.state import files as worker_cache
from barrierflow.state.files import StateFile, cache_limit_bytes, save_on_host, take_from_host
from barrierflow.state.spec import KeyGroups, StateSpec, StateTablePlan
from barrierflow.state.table import TaskStateTable

CACHE_ENV = WORKER_STATE_CACHE_MB.env

SPEC = StateSpec(
    operator_id="totals",
    name="accumulators",
    key_fields=(pa.field("sensor_id", pa.string()),),
    value_fields=(pa.field("count", pa.int64()),),
    ttl_ms=1_000,
)
SCHEMA = SPEC.arrow_schema()


@pytest.fixture(autouse=True)
def empty_cache() -> Any:
    worker_cache.clear()
    yield
    worker_cache.clear()


def _write(path: Path, rows: list[dict[str, Any]], *, sort: bool = True) -> StateFile:
    if sort:
        rows = sorted(rows, key=lambda r: r[KEY_GROUP])
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path, row_group_size=7)
    groups = [r[KEY_GROUP] for r in rows]
    return StateFile(str(path), path.stat().st_size, min(groups), max(groups))


def _row(key: str, count: int, epoch: int, *, deleted: bool = False, updated: int = 10_000) -> dict[str, Any]:
    return {
        "sensor_id": key, KEY_GROUP: int(key[1:]) % 8, "count": count,
        "_updated_at_ms": updated, "_deleted": deleted, "_epoch": epoch,
    }  # fmt: skip


def _reference(files: list[list[dict[str, Any]]], keys: set[str], now: int) -> dict[str, int]:
    """Latest row per key by epoch over every file's rows; tombstones and expired rows dropped."""
    latest: dict[str, dict[str, Any]] = {}
    for rows in files:
        for r in rows:
            if r["sensor_id"] in keys and (r["sensor_id"] not in latest or r["_epoch"] > latest[r["sensor_id"]]["_epoch"]):
                latest[r["sensor_id"]] = r
    return {k: r["count"] for k, r in latest.items() if not r["_deleted"] and r["_updated_at_ms"] + 1_000 > now}


def _live_rows(files: list[StateFile], keys: pa.Table, now: int) -> pa.Table:
    """A task's read of ``keys`` through the ``delta`` backend (the worker's cache)."""
    return TaskStateTable(StateTablePlan(SPEC, "unused", tuple(files), False), KeyGroups.all(8), 1, now).live_rows(keys)


def _lookup(files: list[StateFile], keys: set[str], now: int = 10_500) -> dict[str, int]:
    wanted = pa.Table.from_pylist(
        [{"sensor_id": k, KEY_GROUP: int(k[1:]) % 8} for k in sorted(keys)],
        schema=pa.schema([pa.field("sensor_id", pa.large_string()), pa.field(KEY_GROUP, pa.int64())]),
    )
    out = _live_rows(files, wanted, now)
    assert out.schema == SCHEMA
    result = dict(zip(out["sensor_id"].to_pylist(), out["count"].to_pylist()))
    assert len(result) == out.num_rows  # one row per key
    return result


def test_lookups_equal_the_reference_cold_warm_and_after_files_change(tmp_path: Path) -> None:
    rnd = random.Random(5)
    keys = [f"s{i}" for i in range(200)]
    contents: list[list[dict[str, Any]]] = []
    files: list[StateFile] = []
    for epoch in range(1, 6):
        rows = [
            _row(k, rnd.randrange(100), epoch, deleted=rnd.random() < 0.1, updated=rnd.choice([9_000, 10_000]))
            for k in rnd.sample(keys, 60)
        ]
        contents.append(rows)
        files.append(_write(tmp_path / f"e{epoch}.parquet", rows, sort=epoch % 2 == 0))
        for _ in range(3):  # cold, then warm (and partly warm after the new file)
            wanted = set(rnd.sample(keys, 50)) | {"s999"}
            assert _lookup(files, wanted) == _reference(contents, wanted, 10_500)
    # A compaction: the snapshot's files replaced by one; the old ones are never read again.
    live = _reference(contents, set(keys), 0)
    compacted = [r for r in (_row(k, v, 9) for k, v in live.items())]
    assert _lookup([_write(tmp_path / "c.parquet", compacted)], set(keys), now=0) == live


def test_records_without_a_live_key_are_kept_in_their_order(tmp_path: Path) -> None:
    rnd = random.Random(7)
    contents = [
        [
            _row(f"s{i}", i, epoch, deleted=rnd.random() < 0.2, updated=rnd.choice([9_000, 10_000]))
            for i in rnd.sample(range(100), 40)
        ]
        for epoch in (1, 2)
    ]
    files = [_write(tmp_path / f"e{n}.parquet", rows) for n, rows in enumerate(contents)]
    # A deduplication's records: other columns too (a nested one), some keys twice, in arrival order.
    keys = [f"s{rnd.randrange(120)}" for _ in range(150)]
    records = pa.RecordBatch.from_pylist(
        [{"sensor_id": k, "payload": {"n": n}, KEY_GROUP: int(k[1:]) % 8} for n, k in enumerate(keys)],
        # The key typed as the state's key (the planner types a state's keys from its input's schema).
        schema=pa.schema([("sensor_id", pa.string()), ("payload", pa.struct([("n", pa.int64())])), (KEY_GROUP, pa.int32())]),
    )
    # A deduplication's anti-join, batch by batch: the live rows of a batch's keys, then its records without them.
    batches = [pa.Table.from_batches([b]) for b in (records.slice(0, 70), records.slice(70))]
    out = pa.concat_tables([rows_without_keys(b, _live_rows(files, b, 10_500), SPEC.key_columns) for b in batches])
    live = _reference(contents, set(keys), 10_500)
    assert out.to_pylist() == [r for r in records.to_pylist() if r["sensor_id"] not in live]
    assert 0 < out.num_rows < records.num_rows  # both cases occur


def test_a_cached_file_is_not_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = _write(tmp_path / "a.parquet", [_row(f"s{i}", i, 1) for i in range(40)])
    first = _lookup([file], {"s1", "s2"})
    reads: list[Any] = []
    real = worker_cache.arrow_filesystem  # opened once per read of a file
    monkeypatch.setattr(worker_cache, "arrow_filesystem", lambda *a, **kw: reads.append(a) or real(*a, **kw))
    assert _lookup([file], {"s1", "s2"}) == first == {"s1": 1, "s2": 2}
    assert reads == []
    _lookup([file], {"s3"})  # key group 3: not cached yet, read
    assert len(reads) == 1


def test_the_cache_is_bounded_and_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = _write(tmp_path / "a.parquet", [_row(f"s{i}", i, 1) for i in range(4000)])
    monkeypatch.setenv(CACHE_ENV, "0")
    assert cache_limit_bytes() == 0
    assert _lookup([file], {"s1"}) == {"s1": 1}
    assert worker_cache._held_bytes == 0
    monkeypatch.setenv(CACHE_ENV, "lots")
    with pytest.raises(ConfigurationError, match=CACHE_ENV):
        cache_limit_bytes()
    monkeypatch.setattr(worker_cache, "cache_limit_bytes", lambda: 20_000)
    assert _lookup([file], {f"s{i}" for i in range(8)}) == {f"s{i}": i for i in range(8)}
    assert 0 < worker_cache._held_bytes <= 20_000


def test_big_reads_are_shared_with_the_other_workers_of_the_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_cache, "HOST_CACHE_MIN_ROWS", 10)
    monkeypatch.setattr(worker_cache, "_host_dir", lambda: str(tmp_path / "host"))
    rows = [_row(f"s{i}", i, 1) for i in range(400)]
    file = _write(tmp_path / "a.parquet", rows)
    wanted = {f"s{i}" for i in range(0, 400, 3)}
    expected = _reference([rows], wanted, 10_500)
    assert _lookup([file], wanted) == expected
    assert len(list((tmp_path / "host").glob("*.arrow"))) == 1  # one read of the file: one entry
    worker_cache.clear()  # another worker of the host: its own memory is empty

    def no_parquet(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the Parquet file was read again")

    monkeypatch.setattr(worker_cache.ds, "dataset", no_parquet)
    assert _lookup([file], wanted) == expected
    # Bounded: entries beyond the limit go, least recently used first.
    (first,) = (tmp_path / "host").glob("*.arrow")
    monkeypatch.undo()
    monkeypatch.setattr(worker_cache, "HOST_CACHE_MIN_ROWS", 10)
    monkeypatch.setattr(worker_cache, "_host_dir", lambda: str(tmp_path / "host"))
    monkeypatch.setattr(worker_cache, "cache_limit_bytes", lambda: first.stat().st_size * 3 // 2)
    other = _write(tmp_path / "b.parquet", [_row(f"s{i}", i + 1, 2) for i in range(400)])
    worker_cache.clear()
    assert _lookup([file, other], wanted) == {k: v + 1 for k, v in expected.items()}
    (kept,) = (tmp_path / "host").glob("*.arrow")
    assert kept != first


def test_a_host_directory_others_can_write_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_cache, "HOST_CACHE_MIN_ROWS", 10)
    host = tmp_path / "host"
    host.mkdir(mode=0o777)
    host.chmod(0o777)
    monkeypatch.setattr(worker_cache, "_host_dir", lambda: str(host))
    rows = [_row(f"s{i}", i, 1) for i in range(100)]
    assert _lookup([_write(tmp_path / "a.parquet", rows)], {"s1"}) == {"s1": 1}
    assert list(host.iterdir()) == []


def test_a_table_saved_on_the_host_is_taken_once_in_its_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the heap backend keeps for the host's other workers (state.heap): taken by the next task, then gone."""
    monkeypatch.setattr(worker_cache, "_host_dir", lambda: str(tmp_path / "host"))
    rows = pa.Table.from_pylist([_row(f"s{i}", i, 1) for i in range(5)], schema=SCHEMA)
    assert save_on_host("copy-a", rows)
    assert take_from_host("copy-a", SCHEMA).equals(rows)
    assert take_from_host("copy-a", SCHEMA) is None  # taken: removed from the host
    assert take_from_host("copy-b", SCHEMA) is None  # never saved
    assert save_on_host("copy-c", rows)
    other = pa.schema([f.with_type(pa.large_string()) if f.name == "sensor_id" else f for f in SCHEMA])
    assert take_from_host("copy-c", other) is None  # saved in another schema: not these rows
