"""The keyed process kernel: per-key state of every kind, in arrival order, across epochs and placements, and its errors.

The first tests are tests/unit/test_process_function.py's (same assertions,
run through ``KeyedProcess.run``; every record in key group 3, as there).
"""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Callable

import pyarrow as pa
import pytest

from barrierflow.api.functions import KeyedContext, KeyedProcessFunction
from barrierflow.api.state import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from barrierflow.core.columns import KEY_GROUP
from barrierflow.core.errors import PipelineDefinitionError, UserFunctionError
from barrierflow.core.keys import key_groups
from barrierflow.operators.process import KeyedProcess, python_values
from harness import live_state, node_specs, run_both, run_kernel, upstream

# run_both's split: 4 tasks of the 8 key groups (execution.exchange.owner_of routes a key group to another
# task than key_group_ranges gives it when the tasks do not divide the key groups: reported to the lead).
TASKS = 4
T0 = datetime(2023, 11, 14, tzinfo=timezone.utc)
US = pa.timestamp("us", tz="UTC")
Out = Callable[[dict[str, Any]], None]


class KeepLastTwo(KeyedProcessFunction):
    """Emits each reading with the two before it (from state), keeps the last two."""

    last_two = ListStateDescriptor("last_two", pa.float64())
    state_descriptors = (last_two,)
    output_schema = pa.schema(
        [("event_id", pa.string()), ("ts", pa.timestamp("us", tz="UTC")), ("before", pa.list_(pa.float64()))]
    )

    def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Callable[[dict[str, Any]], None]) -> None:
        state = ctx.get_state(self.last_two)
        before = state.get()
        out({"event_id": record["event_id"], "ts": record["ts"], "before": before})
        state.update([*before[-1:], record["temperature"]])


def _node(fn: KeyedProcessFunction, key: tuple[str, ...] = ("sensor_id",)) -> KeyedProcess:
    return KeyedProcess(operator_id="p", parent=upstream(), key=key, function=fn)


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
         "value": pa.array(list(stored.values()), pa.list_(pa.float64()))}
    )  # fmt: skip
    fn = KeepLastTwo()
    run = run_kernel(_node(fn), [records], state={"p__last_two": state}, epoch=2)
    sensor_of = dict(zip(records.column("event_id").to_pylist(), records.column("sensor_id").to_pylist()))

    # Reference: plain Python over the rows in (key, arrival) order.
    expected_out, last = [], {k: list(v) for k, v in stored.items()}
    for row in sorted(records.to_pylist(), key=lambda r: (r["sensor_id"], r["_seq"])):
        before = last.get(row["sensor_id"], [])
        expected_out.append((row["sensor_id"], row["event_id"], row["ts"], before))
        last[row["sensor_id"]] = [*before[-1:], row["temperature"]]
    emitted = [(sensor_of[r["event_id"]], r["event_id"], r["ts"], r["before"] or []) for r in run.output.to_pylist()]
    assert emitted == expected_out
    changes = run.changes["p__last_two"].to_pylist()
    changed = {r["sensor_id"]: r["value"] for r in changes}
    assert changed == {k: v for k, v in last.items() if k != "e"}
    assert all(r[KEY_GROUP] == 3 for r in changes)


def test_a_key_group_without_records_emits_nothing() -> None:
    fn = KeepLastTwo()
    records = pa.table({"event_id": pa.array([], pa.string()), "sensor_id": pa.array([], pa.string()), "_seq": pa.array([], pa.int64()),
                        KEY_GROUP: pa.array([], pa.int32())})  # fmt: skip
    state = pa.table(
        {"sensor_id": ["a"], KEY_GROUP: pa.array([1], pa.int32()), "value": pa.array([[1.0]], pa.list_(pa.float64()))}
    )
    run = run_kernel(_node(fn), [records], state={"p__last_two": state})
    assert run.output.num_rows == 0
    assert run.changes["p__last_two"].num_rows == 0


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
    values, expected = python_values(array), array.to_pylist()
    assert values == expected
    assert [getattr(v, "tzinfo", None) for v in values] == [getattr(v, "tzinfo", None) for v in expected]


# -- contract: every kind of state, across epochs and placements --------------------------------------------------


class Mean:
    def create_accumulator(self) -> list[float]:
        return [0.0, 0.0]

    def add(self, value: float, accumulator: list[float]) -> list[float]:
        return [accumulator[0] + value, accumulator[1] + 1]

    def get_result(self, accumulator: list[float]) -> float:
        return accumulator[0] / accumulator[1]


class EveryState(KeyedProcessFunction):
    """Per key: a count (value), the values seen (list), a count per tag (map), the max (reducing), the mean (aggregating)."""

    count = ValueStateDescriptor("count", pa.int64())
    seen = ListStateDescriptor("seen", pa.int64())
    tags = MapStateDescriptor("tags", pa.string(), pa.int64())
    top = ReducingStateDescriptor("top", max, pa.int64())
    mean = AggregatingStateDescriptor("mean", Mean(), pa.list_(pa.float64()))
    output_schema = pa.schema([("k", pa.string()), ("n", pa.int64()), ("seen", pa.list_(pa.int64())), ("tag_count", pa.int64()),
                               ("top", pa.int64()), ("mean", pa.float64())])  # fmt: skip

    def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Out) -> None:
        count, seen, tags = ctx.get_state(self.count), ctx.get_state(self.seen), ctx.get_state(self.tags)
        top, mean = ctx.get_state(self.top), ctx.get_state(self.mean)
        if record["v"] < 0:  # a negative value resets the key
            for state in (count, seen, tags, top, mean):
                state.clear()
            return
        count.update((count.value() or 0) + 1)
        seen.add(record["v"])
        tags.put(record["tag"], (tags.get(record["tag"]) or 0) + 1)
        top.add(record["v"])
        mean.add(float(record["v"]))
        out({"k": ctx.key[0], "n": count.value(), "seen": seen.get(), "tag_count": tags.get(record["tag"]), "top": top.get(),
             "mean": mean.get()})  # fmt: skip


RECORDS = pa.schema([("k", pa.string()), ("tag", pa.string()), ("v", pa.int64()), ("_seq", pa.int64())])


def _reference(epochs: list[list[tuple[str, str, int, int]]]) -> tuple[list[list[dict[str, Any]]], dict[str, Any]]:
    """Plain Python: each epoch's outputs of EveryState, and each key's state at the end (None: cleared)."""
    state: dict[str, Any] = {}
    outputs = []
    for records in epochs:
        out = []
        for k, tag, v, _ in sorted(records, key=lambda r: (r[0], r[3])):
            if v < 0:
                state[k] = None
                continue
            s = state.get(k) or {"count": 0, "seen": [], "tags": {}, "top": None, "mean": [0.0, 0.0]}
            s["count"] += 1
            s["seen"].append(v)
            s["tags"][tag] = s["tags"].get(tag, 0) + 1
            s["top"] = v if s["top"] is None else max(s["top"], v)
            s["mean"] = [s["mean"][0] + v, s["mean"][1] + 1]
            state[k] = s
            out.append({"k": k, "n": s["count"], "seen": list(s["seen"]), "tag_count": s["tags"][tag], "top": s["top"],
                        "mean": s["mean"][0] / s["mean"][1]})  # fmt: skip
        outputs.append(out)
    return outputs, state


def test_every_kind_of_state_carries_across_epochs_the_same_in_one_task_or_several() -> None:
    rng = random.Random(7)
    epochs = [
        [(rng.choice("abcdefg"), rng.choice("xy"), rng.choice([1, 5, 9, 12, -1]) if i else rng.randrange(20), rng.randrange(10**6))
         for _ in range(30)]
        for i in range(3)
    ]  # fmt: skip
    node = _node(EveryState(), key=("k",))
    specs = node_specs(node, [pa.Table.from_pylist([], schema=RECORDS)])
    assert sorted(specs) == ["p__count", "p__mean", "p__seen", "p__tags", "p__top"]
    state: dict[str, pa.Table] = {}
    expected_outputs, expected_state = _reference(epochs)
    for n, (records, expected) in enumerate(zip(epochs, expected_outputs), start=1):
        table = pa.Table.from_pylist([{"k": k, "tag": t, "v": v, "_seq": s} for k, t, v, s in records], schema=RECORDS)
        run = run_both(node, tasks=TASKS, inputs=[table], state=state, epoch=n)
        assert sorted(run.output.to_pylist(), key=repr) == sorted(expected, key=repr)
        state = {name: live_state(spec, state.get(name), run.changes[name], epoch=n) for name, spec in specs.items()}
    live = {name: {r["k"]: r["value"] for r in table.to_pylist()} for name, table in state.items()}
    for k, s in expected_state.items():
        if s is None:
            assert all(k not in values for values in live.values())  # cleared: tombstones in every table
        else:
            assert live["p__count"][k] == s["count"] and live["p__seen"][k] == s["seen"] and live["p__top"][k] == s["top"]
            assert dict(live["p__tags"][k]) == s["tags"] and live["p__mean"][k] == s["mean"]


def test_state_of_a_key_expires_after_its_ttl_and_is_refreshed_by_a_write() -> None:
    class Counter(KeyedProcessFunction):
        count = ValueStateDescriptor("count", pa.int64(), StateTtlConfig(timedelta(seconds=10)))
        output_schema = pa.schema([("k", pa.string()), ("n", pa.int64())])

        def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Out) -> None:
            count = ctx.get_state(self.count)
            count.update((count.value() or 0) + 1)
            out({"k": ctx.key[0], "n": count.value()})

    node = _node(Counter(), key=("k",))
    [spec] = node.state_specs([RECORDS])
    assert spec.ttl_ms == 10_000
    state: dict[str, pa.Table] = {}
    for n, (at_ms, keys, expected) in enumerate(
        [(0, "ab", [1, 1]), (6_000, "a", [2]), (12_000, "ab", [3, 1])],
        start=1,  # b expired at 10 s; a was written at 6 s
    ):
        table = pa.Table.from_pylist([{"k": k, "tag": "", "v": 0, "_seq": i} for i, k in enumerate(keys)], schema=RECORDS)
        run = run_both(node, tasks=TASKS, inputs=[table], state=state, epoch=n, processing_time_ms=at_ms)
        assert [r["n"] for r in sorted(run.output.to_pylist(), key=lambda r: r["k"])] == expected
        state = {
            spec.table_name: live_state(
                spec, state.get(spec.table_name), run.changes[spec.table_name], epoch=n, processing_time_ms=at_ms
            )
        }


class Echo(KeyedProcessFunction):
    """Emits each record's position among its key's records; checks the context's key is the record's."""

    seen = ValueStateDescriptor("seen", pa.int64())
    output_schema = pa.schema([("n", pa.int64()), ("id", pa.int64())])

    def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Out) -> None:
        names = sorted(k for k in record if k.startswith("k"))
        assert ctx.key == tuple(record[n] for n in names) or any(v != v for v in ctx.key)  # NaN is not equal to itself
        seen = ctx.get_state(self.seen)
        seen.update((seen.value() or 0) + 1)
        out({"n": seen.value(), "id": record["id"]})


@pytest.mark.parametrize(
    ("types", "values"),
    [
        ([pa.int32()], [(1,), (2,), (None,), (1,), (-7,)]),
        ([US], [(T0,), (T0 + timedelta(seconds=1),), (T0,), (None,)]),
        ([pa.date32(), pa.bool_()], [(date(2024, 1, 1), True), (date(2024, 1, 1), False), (None, True), (None, True)]),
        ([pa.decimal128(10, 2), pa.binary()], [(Decimal("1.50"), b"x"), (Decimal("1.50"), b"x"), (Decimal("-2.00"), None)]),
        ([pa.float64()], [(1.5,), (float("nan"),), (float("nan"),), (-0.0,), (0.0,)]),
        ([pa.string(), pa.int64()], [("a", 1), ("a", None), (None, None), ("a", 1), (None, None)]),
    ],
)
def test_any_key_type_with_a_key_group_nulls_and_nans_included_is_one_key_per_value(
    types: list[pa.DataType], values: list[tuple[Any, ...]]
) -> None:
    names = [f"k{i}" for i in range(len(types))]
    schema = pa.schema([*(pa.field(n, t) for n, t in zip(names, types)), ("id", pa.int64()), ("_seq", pa.int64())])
    rows = [{**dict(zip(names, key)), "id": i, "_seq": 100 - i} for i, key in enumerate(values)]  # arrival: last first
    node = _node(Echo(), key=tuple(names))
    run = run_both(node, tasks=TASKS, inputs=[pa.Table.from_pylist(rows, schema=schema)])

    # Reference: one key per distinct value (null = null, NaN = NaN, -0.0 = 0.0), records of a key numbered in arrival order.
    def canon(key: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple("nan" if isinstance(v, float) and v != v else (0.0 if v == 0 and isinstance(v, float) else v) for v in key)

    counts: dict[tuple[Any, ...], int] = {}
    expected = {}
    for i, key in sorted(enumerate(values), key=lambda p: -p[0]):
        counts[canon(key)] = counts.get(canon(key), 0) + 1
        expected[i] = counts[canon(key)]
    assert {r["id"]: r["n"] for r in run.output.to_pylist()} == expected
    [spec] = node.state_specs([schema])
    assert [f.type for f in spec.key_fields] == types
    staged = run.changes["p__seen"]
    assert staged.num_rows == len(counts) and staged.schema.field("k0").type == types[0]
    assert staged.column(KEY_GROUP).to_pylist() == key_groups(staged.select(names), 8).to_pylist()


def test_without_arrival_positions_records_run_in_the_order_of_their_columns() -> None:
    schema = pa.schema([("key", pa.string()), ("id", pa.int64())])
    node = KeyedProcess(operator_id="p", parent=upstream(), key=("key",), function=Echo())
    run = run_both(node, tasks=TASKS, inputs=[pa.Table.from_pylist([{"key": "a", "id": i} for i in (3, 1, 2)], schema=schema)])
    assert [(r["id"], r["n"]) for r in run.output.to_pylist()] == [(1, 1), (2, 2), (3, 3)]


def test_state_and_output_keep_their_declared_arrow_types() -> None:
    class Typed(KeyedProcessFunction):
        small = ValueStateDescriptor("small", pa.uint16())
        text = ValueStateDescriptor("text", pa.large_string())
        output_schema = pa.schema(
            [("k", pa.large_string()), ("n", pa.uint16()), ("at", pa.timestamp("ms")), ("d", pa.decimal128(5, 1))]
        )

        def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Out) -> None:
            ctx.get_state(self.small).update(7)
            ctx.get_state(self.text).update("t")
            out({"k": ctx.key[0], "n": 7, "at": datetime(2024, 1, 1), "d": Decimal("1.5")})

    node = _node(Typed(), key=("k",))
    records = pa.Table.from_pylist([{"k": "a", "tag": "", "v": 1, "_seq": 1}], schema=RECORDS)
    assert node.output_schema([RECORDS]) == Typed.output_schema
    run = run_both(node, tasks=TASKS, inputs=[records])
    assert run.output.schema == Typed.output_schema
    assert run.output.to_pylist() == [{"k": "a", "n": 7, "at": datetime(2024, 1, 1), "d": Decimal("1.5")}]
    specs = node_specs(node, [records])
    assert specs["p__small"].arrow_schema().names == ["k", "_key_group", "value", "_updated_at_ms", "_deleted", "_epoch"]
    assert (
        run.changes["p__small"].column("value").type == pa.uint16()
        and run.changes["p__text"].column("value").type == pa.large_string()
    )


def test_state_tables_are_named_and_typed_as_before() -> None:
    node = _node(EveryState(), key=("k",))
    untyped = {s.table_name: s.signature() for s in node.state_specs()}
    assert untyped["p__count"] == {"keys": ["k:string"], "values": ["value:int64"]}
    assert untyped["p__tags"] == {"keys": ["k:string"], "values": ["value:map<string, int64>"]}
    typed = node.state_specs([pa.schema([("k", pa.int32()), ("_seq", pa.int64())])])
    assert [s.key_fields for s in typed] == [(pa.field("k", pa.int32()),)] * 5


class Failing(KeyedProcessFunction):
    output_schema = pa.schema([("k", pa.string(), False), ("n", pa.int64())])

    def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Out) -> None:
        if record["tag"] == "raise":
            raise ValueError("bad record")
        if record["tag"] == "null":
            out({"k": None, "n": 1})
        elif record["tag"] == "type":
            out({"k": "a", "n": "not a number"})
        elif record["tag"] == "state":
            ctx.get_state(self.count).update("not a number")
        elif record["tag"] == "undeclared":
            ctx.get_state(ValueStateDescriptor("other", pa.int64()))
        else:
            out({"k": ctx.key[0]})  # n missing: null, allowed

    count = ValueStateDescriptor("count", pa.int64())


@pytest.mark.parametrize(
    ("tag", "error", "match"),
    [
        ("raise", UserFunctionError, r"process 'p': the function raised ValueError: bad record \(key \('a',\)\)"),
        (
            "null",
            UserFunctionError,
            r"process 'p': emitted null\(s\) in column\(s\) \['k'\], which its output_schema declares not null",
        ),
        ("type", UserFunctionError, r"process 'p': an emitted row does not fit output_schema"),
        ("state", UserFunctionError, r"process 'p': state 'count': a value does not fit its declared type int64"),
        ("undeclared", PipelineDefinitionError, r"process 'p' \(key \('a',\)\): state 'other' is not declared"),
    ],
)
def test_what_the_function_gets_wrong_fails_the_epoch_naming_the_operator(tag: str, error: type[Exception], match: str) -> None:
    records = pa.Table.from_pylist([{"k": "a", "tag": tag, "v": 1, "_seq": 1}], schema=RECORDS)
    with pytest.raises(error, match=match):
        run_kernel(_node(Failing(), key=("k",)), [records])
    fine = run_kernel(_node(Failing(), key=("k",)), [records.set_column(1, "tag", pa.array(["ok"]))])
    assert fine.output.to_pylist() == [{"k": "a", "n": None}]
