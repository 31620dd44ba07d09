"""barrierflow.execution.exchange: key-group ranges as Flink assigns them, rows partitioned by receiver, Arrow exchange files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import xxhash

from barrierflow.core.columns import KEY_GROUP
from barrierflow.execution.exchange import key_group_ranges, owner_of, partition, read_exchange, write_exchange
from barrierflow.operators.base import Exchange
from barrierflow.plan.planner import Edge


def _kg(key: str, groups: int) -> int:
    """Spark's ``pmod(xxhash64(key), groups)`` of a string key, from the xxhash library."""
    h = xxhash.xxh64_intdigest(key.encode(), 42)
    return (h - 2**64 if h >= 2**63 else h) % groups


def _bounds(tasks: int, total: int) -> list[tuple[int, int]]:
    return [(r.low, r.high) for r in key_group_ranges(tasks, total)]


def test_key_group_ranges_are_flinks() -> None:
    # KeyGroupRangeAssignment: task t holds ceil(t * G / n) .. floor(((t + 1) * G - 1) / n).
    assert _bounds(1, 128) == [(0, 127)]
    assert _bounds(3, 128) == [(0, 42), (43, 85), (86, 127)]
    assert _bounds(4, 16) == [(0, 3), (4, 7), (8, 11), (12, 15)]
    assert _bounds(5, 3) == [(0, 0), (1, 1), (2, 1), (2, 2), (3, 2)]  # more tasks than key groups: some hold none
    assert all(r.total == 128 for r in key_group_ranges(3, 128))


@pytest.mark.parametrize("tasks, total", [(1, 8), (2, 16), (3, 128), (7, 128), (5, 3), (128, 128)])
def test_every_key_group_has_exactly_one_owner_the_task_whose_range_holds_it(tasks: int, total: int) -> None:
    ranges = key_group_ranges(tasks, total)
    owners = owner_of(np.arange(total), tasks, total)
    for g in range(total):
        holding = [t for t, r in enumerate(ranges) if r.low <= g <= r.high]
        assert holding == [owners[g]]


def _rows(keys: list[str]) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.string()), "n": pa.array(range(len(keys)), pa.int64())})


def test_a_keyed_edge_sends_each_row_to_the_owner_of_its_key_group_in_arrival_order() -> None:
    keys = [f"key-{i % 13}" for i in range(60)]
    edge = Edge(0, 1, 0, Exchange.KEYED, ("k",))
    parts = partition(_rows(keys), edge, 16, 3)
    assert sorted(parts) == [0, 1, 2]  # every receiver gets a table, empty or not
    ranges = key_group_ranges(3, 16)
    for t, part in parts.items():
        expected = [(k, n) for n, k in enumerate(keys) if ranges[t].low <= _kg(k, 16) <= ranges[t].high]
        assert list(zip(part["k"].to_pylist(), part["n"].to_pylist())) == expected
        assert part[KEY_GROUP].to_pylist() == [_kg(k, 16) for k, _ in expected]


def test_a_keyed_edge_keeps_key_groups_the_rows_carry() -> None:
    rows = _rows(["a", "b", "c", "d"]).append_column(KEY_GROUP, pa.array([15, 0, 8, 7], pa.int32()))
    parts = partition(rows, Edge(0, 1, 0, Exchange.KEYED, ("k",)), 16, 2)
    assert parts[0]["k"].to_pylist() == ["b", "d"] and parts[1]["k"].to_pylist() == ["a", "c"]


def test_a_keyed_edge_with_nothing_to_send() -> None:
    parts = partition(_rows([]), Edge(0, 1, 0, Exchange.KEYED, ("k",)), 8, 2)
    assert {t: p.num_rows for t, p in parts.items()} == {0: 0, 1: 0}


def test_broadcast_sends_everything_everywhere_and_global_to_task_0() -> None:
    rows = _rows(["a", "b"])
    broadcast = partition(rows, Edge(0, 1, 1, Exchange.BROADCAST), 8, 3)
    assert sorted(broadcast) == [0, 1, 2] and all(p.equals(rows) for p in broadcast.values())
    to_one = partition(rows, Edge(0, 1, 0, Exchange.GLOBAL), 8, 3)
    assert list(to_one) == [0] and to_one[0].equals(rows)


def test_exchange_files_round_trip_in_sender_order(tmp_path: Path) -> None:
    edge = Edge(2, 5, 1, Exchange.KEYED, ("k",))
    assert edge.name == "2-5-1"
    directory = str(tmp_path / "_exchange")
    first = _rows(["a", "b"]).append_column(KEY_GROUP, pa.array([1, 2], pa.int32()))
    second = _rows(["c"]).append_column(KEY_GROUP, pa.array([3], pa.int32()))
    uris = [write_exchange(directory, edge, 0, 1, first), write_exchange(directory, edge, 1, 1, second)]
    assert uris == [f"{directory}/2-5-1/0-1.arrow", f"{directory}/2-5-1/1-1.arrow"]
    assert all(Path(u).is_file() for u in uris)
    schema = pa.schema([("k", pa.string()), ("n", pa.int64())])
    read = read_exchange(uris, schema, edge)
    assert read["k"].to_pylist() == ["a", "b", "c"] and read[KEY_GROUP].to_pylist() == [1, 2, 3]
    assert read_exchange(uris[::-1], schema, edge)["k"].to_pylist() == ["c", "a", "b"]


def test_no_exchange_files_read_as_no_rows_of_the_edges_schema() -> None:
    schema = pa.schema([("k", pa.string()), ("n", pa.int64())])
    keyed = read_exchange((), schema, Edge(0, 1, 0, Exchange.KEYED, ("k",)))
    assert keyed.num_rows == 0 and keyed.schema == schema.append(pa.field(KEY_GROUP, pa.int32()))
    forwarded = read_exchange([], schema, Edge(0, 1, 0, Exchange.GLOBAL))
    assert forwarded.num_rows == 0 and forwarded.schema == schema
