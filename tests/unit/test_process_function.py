"""barrierflow.operators.process: one key group's run of a keyed process function, without Spark."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pyarrow as pa
import pytest

from barrierflow.api.state import ListStateDescriptor
from barrierflow.operators.process import KeyedContext, KeyedProcessFunction, _python_values, _run_key_group, _state_column
from barrierflow.operators.timers import EpochClocks
from barrierflow.state.spec import KEY_GROUP

T0 = datetime(2023, 11, 14, tzinfo=timezone.utc)


class KeepLastTwo(KeyedProcessFunction):
    """Emits each reading with the two before it (from state), keeps the last two."""

    last_two = ListStateDescriptor("last_two", pa.float64())
    state_descriptors = (last_two,)
    output_schema = pa.schema([("event_id", pa.string()), ("ts", pa.timestamp("us", tz="UTC")), ("before", pa.list_(pa.float64()))])

    def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Callable[[dict[str, Any]], None]) -> None:
        state = ctx.get_state(self.last_two)
        before = state.get()
        out({"event_id": record["event_id"], "ts": record["ts"], "before": before})
        state.update([*before[-1:], record["temperature"]])


def _out_schema(fn: KeyedProcessFunction) -> pa.Schema:
    return pa.schema(
        [
            ("_kind", pa.string()), ("sensor_id", pa.string()), (KEY_GROUP, pa.int32()),
            (_state_column("last_two"), pa.list_(pa.float64())), ("_deleted", pa.bool_()),
            *[(f"_out_{f.name}", f.type) for f in fn.output_schema],
        ]
    )  # fmt: skip


def test_each_key_sees_its_records_in_arrival_order_with_its_stored_state() -> None:
    rng = random.Random(5)
    n = 400
    records = pa.table(
        {
            "event_id": [f"e{i}" for i in range(n)],
            "sensor_id": [rng.choice(["a", "b", "c", "d"]) for _ in range(n)],
            "ts": pa.array([T0 + timedelta(microseconds=rng.randrange(10**9)) for _ in range(n)], pa.timestamp("us", tz="UTC")),
            "temperature": [rng.random() for _ in range(n)],
            "_seq": pa.array(rng.sample(range(10 * n), n), pa.int64()),
            KEY_GROUP: pa.array([3] * n, pa.int32()),
        }
    )
    stored = {"a": [1.0, 2.0], "e": [9.0, 9.5]}  # "e" has state but no records: left unchanged
    state = pa.table(
        {"sensor_id": list(stored), KEY_GROUP: pa.array([3] * len(stored), pa.int32()),
         _state_column("last_two"): pa.array(list(stored.values()), pa.list_(pa.float64()))}
    )  # fmt: skip
    fn = KeepLastTwo()
    out = _run_key_group(fn, ["sensor_id"], records, state, _out_schema(fn), EpochClocks(2, 0)).to_pylist()

    # Reference: plain Python over the rows in (key, arrival) order.
    expected_out, last = [], {k: list(v) for k, v in stored.items()}
    for row in sorted(records.to_pylist(), key=lambda r: (r["sensor_id"], r["_seq"])):
        before = last.get(row["sensor_id"], [])
        expected_out.append((row["sensor_id"], row["event_id"], row["ts"], before))
        last[row["sensor_id"]] = [*before[-1:], row["temperature"]]
    emitted = [(r["sensor_id"], r["_out_event_id"], r["_out_ts"], r["_out_before"] or []) for r in out if r["_kind"] == "_out"]
    assert emitted == expected_out
    changed = {r["sensor_id"]: r[_state_column("last_two")] for r in out if r["_kind"] == "last_two"}
    assert changed == {k: v for k, v in last.items() if k != "e"}
    assert all(r[KEY_GROUP] == 3 for r in out)


def test_a_key_group_without_records_emits_nothing() -> None:
    fn = KeepLastTwo()
    records = pa.table({"event_id": pa.array([], pa.string()), "sensor_id": pa.array([], pa.string()), "_seq": pa.array([], pa.int64()),
                        KEY_GROUP: pa.array([], pa.int32())})  # fmt: skip
    state = pa.table({"sensor_id": ["a"], KEY_GROUP: pa.array([1], pa.int32()), _state_column("last_two"): pa.array([[1.0]], pa.list_(pa.float64()))})
    assert _run_key_group(fn, ["sensor_id"], records, state, _out_schema(fn), EpochClocks(1, 0)).num_rows == 0


@pytest.mark.parametrize(
    "array",
    [
        pa.array([0, None, 1_700_000_000_123_456, -1, 253_402_300_799_999_999], pa.timestamp("us", tz="UTC")),
        pa.array([0, None, 1_700_000_000_123_456], pa.timestamp("us", tz="Europe/Paris")),
        pa.array([0, None, 1_700_000_000_123], pa.timestamp("ms", tz="UTC")),
        pa.array([0, None, 5], pa.timestamp("us")),
        pa.chunked_array([pa.array([1, 2], pa.timestamp("us", tz="UTC")), pa.array([None], pa.timestamp("us", tz="UTC"))]),
    ],
)
def test_python_values_are_those_of_to_pylist(array: Any) -> None:
    values, expected = _python_values(array), array.to_pylist()
    assert values == expected
    assert [getattr(v, "tzinfo", None) for v in values] == [getattr(v, "tzinfo", None) for v in expected]
