"""The deduplication kernel: the first record of each key by arrival position, unless an earlier epoch saw it."""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa

from barrierflow.core.keys import key_groups
from barrierflow.operators.dedup import Deduplicate
from harness import live_state, run_both, run_kernel, upstream

RECORDS = pa.schema([("id", pa.string()), ("v", pa.int64()), ("_seq", pa.int64())])


def _records(rows: list[tuple[str, int, int]]) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "v": v, "_seq": s} for i, v, s in rows], schema=RECORDS)


def test_keeps_the_first_record_of_each_key_by_arrival_whatever_the_order_given() -> None:
    node = Deduplicate(operator_id="dedup", parent=upstream(), key=("id",))
    records = _records([("b", 2, 30), ("a", 1, 20), ("b", 3, 10), ("c", 4, 40), ("a", 5, 5)])
    run = run_both(node, [records])
    assert run.output.to_pylist() == [
        {"id": "a", "v": 5, "_seq": 5}, {"id": "b", "v": 3, "_seq": 10}, {"id": "c", "v": 4, "_seq": 40},
    ]  # fmt: skip
    staged = run.changes["dedup__seen"]
    assert sorted(staged["id"].to_pylist()) == ["a", "b", "c"]
    assert set(staged["first_epoch"].to_pylist()) == {1} and not any(staged["_deleted"].to_pylist())
    assert staged["_key_group"].to_pylist() == key_groups(staged.select(["id"]), 8).to_pylist()


def test_drops_keys_an_earlier_epoch_saw_and_takes_them_again_once_expired() -> None:
    node = Deduplicate(operator_id="dedup", parent=upstream(), key=("id",), ttl=timedelta(seconds=10))
    [spec] = node.state_specs([RECORDS])
    first = run_kernel(node, [_records([("a", 1, 1), ("b", 2, 2)])], epoch=1, processing_time_ms=1_000)
    state = {spec.table_name: live_state(spec, None, first.changes[spec.table_name], epoch=1, processing_time_ms=1_000)}
    second = run_both(node, [_records([("a", 3, 1), ("c", 4, 2)])], state=state, epoch=2, processing_time_ms=5_000)
    assert second.output["id"].to_pylist() == ["c"]
    # Past the TTL (10 s after it was written) a key is new again.
    third = run_both(node, [_records([("a", 5, 1), ("b", 6, 2)])], state=state, epoch=3, processing_time_ms=11_001)
    assert third.output["id"].to_pylist() == ["a", "b"]


def test_a_key_of_several_columns_and_types() -> None:
    node = Deduplicate(operator_id="dedup", parent=upstream(), key=("id", "n"))
    schema = pa.schema([("id", pa.string()), ("n", pa.int32()), ("_seq", pa.int64())])
    records = pa.Table.from_pylist(
        [{"id": "a", "n": 1, "_seq": 1}, {"id": "a", "n": 2, "_seq": 2}, {"id": "a", "n": 1, "_seq": 3}], schema=schema
    )
    run = run_both(node, [records])
    assert run.output["_seq"].to_pylist() == [1, 2]
