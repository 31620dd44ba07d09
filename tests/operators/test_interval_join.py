"""The interval join's kernel: bounds, pairs emitted once across epochs, late records, cleanup times, buffered records' JSON."""

from __future__ import annotations

import math
import pickle
import random
from dataclasses import replace
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pytest

from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.core.keys import key_groups
from barrierflow.operators.interval_join import IntervalBounds, IntervalJoin
from barrierflow.operators.join_buffer import record_values
from harness import KernelRun, canonical, live_state, node_specs, run_both, run_kernel, upstream

S = 1_000_000
T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
T0_US = int(T0.timestamp()) * S
US = pa.timestamp("us", tz="UTC")
LEFT = pa.schema([("k", pa.string()), ("ts", US), ("v", pa.int64()), ("_seq", pa.int64())])
RIGHT = pa.schema([("k", pa.string()), ("at", US), ("v", pa.int64()), ("_seq", pa.int64())])
Side = list[tuple[str, int, int]]  # (key, seconds after T0, value)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _table(schema: pa.Schema, rows: Sequence[dict[str, Any]]) -> pa.Table:
    numbered = [{**r, "_seq": i + 1} if "_seq" in schema.names else r for i, r in enumerate(rows)]
    return pa.Table.from_pylist(numbered, schema=schema)


def _sides(left: Side, right: Side) -> list[pa.Table]:
    return [
        _table(LEFT, [{"k": k, "ts": _at(s), "v": v} for k, s, v in left]),
        _table(RIGHT, [{"k": k, "at": _at(s), "v": v} for k, s, v in right]),
    ]


def _join(lower: float = -2, upper: float = 3, **kwargs: Any) -> IntervalJoin:
    inclusive = {k: kwargs.pop(k) for k in ("lower_inclusive", "upper_inclusive") if k in kwargs}
    return IntervalJoin(
        operator_id="j", parent=upstream("a"), other=upstream("b"), key=kwargs.pop("key", ("k",)),
        other_key=kwargs.pop("other_key", ("k",)), time_columns=kwargs.pop("time_columns", ("ts", "at")),
        bounds=IntervalBounds.of(timedelta(seconds=lower), timedelta(seconds=upper), **inclusive), **kwargs,
    )  # fmt: skip


def _pairs(run: KernelRun) -> list[tuple[Any, ...]]:
    """(key, left seconds, left v, right seconds, right v) of each joined row, sorted."""
    return sorted(
        (r["k"], (r["ts"] - T0).total_seconds(), r["left_v"], (r["at"] - T0).total_seconds(), r["right_v"])
        for r in run.output.to_pylist()
    )


def _wm(seconds: float | None) -> int | None:
    return None if seconds is None else T0_US + int(seconds * S)


class Epochs:
    """Runs a node epoch after epoch (run_both each time), carrying its state tables over."""

    def __init__(self, node: Any) -> None:
        self.node = node
        self.state: dict[str, pa.Table] = {}
        self.epoch = 0
        self.watermark: int | None = None

    def run(self, inputs: Sequence[pa.Table], watermark: float | None = None, **kwargs: Any) -> KernelRun:
        self.epoch += 1
        wn = _wm(watermark) if watermark is not None else self.watermark
        run = run_both(
            self.node, inputs, state=self.state, epoch=self.epoch, watermark_prev_us=self.watermark, watermark_us=wn, **kwargs
        )
        for name, spec in node_specs(self.node, inputs).items():
            if name in run.changes:
                self.state[name] = live_state(spec, self.state.get(name), run.changes[name], epoch=self.epoch)
        self.watermark = wn
        return run

    def stored(self, side: str) -> list[tuple[Any, ...]]:
        rows = self.state.get(f"j__{side}", pa.table({"k": [], "event_time_us": []})).to_pylist()
        return sorted((r["k"], (r["event_time_us"] - T0_US) / S) for r in rows)


# -- 3. which pairs join ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lower_inclusive", "upper_inclusive", "joined"),
    [
        (True, True, [-2, -1, 0, 1, 2, 3]),
        (False, True, [-1, 0, 1, 2, 3]),
        (True, False, [-2, -1, 0, 1, 2]),
        (False, False, [-1, 0, 1, 2]),
    ],
)
def test_bounds_are_inclusive_unless_declared_exclusive(lower_inclusive: bool, upper_inclusive: bool, joined: list[int]) -> None:
    node = _join(-2, 3, lower_inclusive=lower_inclusive, upper_inclusive=upper_inclusive)
    offsets = [-3, -2, -1, 0, 1, 2, 3, 4]
    right = [("a", 100 + o, o) for o in offsets] + [("a", 100 - 2 + 1e-6, 90), ("a", 100 + 3 - 1e-6, 91), ("b", 100, 99)]
    run = run_both(node, _sides([("a", 100, 1)], right))
    # An exclusive bound moves by one microsecond: just inside either bound joins either way.
    assert sorted(p[4] for p in _pairs(run)) == sorted([*joined, 90, 91])


def test_the_output_is_the_left_key_then_the_left_columns_then_the_right_ones_prefixed_where_shared() -> None:
    left = pa.schema([("k", pa.string()), ("ts", US), ("price", pa.float64())])
    right = pa.schema([("uid", pa.string()), ("ts", US), ("qty", pa.int32()), ("_seq", pa.int64())])
    node = _join(0, 1, other_key=("uid",), time_columns=("ts", "ts"))
    schema = node.output_schema([left, right])
    assert schema == pa.schema(
        [("k", pa.string()), ("left_ts", US), ("price", pa.float64()), ("right_ts", US), ("qty", pa.int32())]
    )
    run = run_both(
        node,
        [_table(left, [{"k": "a", "ts": _at(0), "price": 2.5}]), _table(right, [{"uid": "a", "ts": _at(1), "qty": 3}])],
    )
    assert run.output.schema == schema
    assert run.output.to_pylist() == [{"k": "a", "left_ts": _at(0), "price": 2.5, "right_ts": _at(1), "qty": 3}]


def test_pairs_are_emitted_once_in_the_epoch_of_the_later_record() -> None:
    epochs = Epochs(_join(-2, 3))
    first = epochs.run(_sides([("a", 10, 1), ("b", 10, 2)], []))
    assert _pairs(first) == []
    second = epochs.run(_sides([], [("a", 11, 10), ("b", 30, 11)]))
    assert _pairs(second) == [("a", 10, 1, 11, 10)]
    third = epochs.run(_sides([("a", 12, 3)], [("a", 12, 12)]))
    # The stored pair (10, 11) is not emitted again; each new record pairs with stored and new ones.
    assert _pairs(third) == [("a", 10, 1, 12, 12), ("a", 12, 3, 11, 10), ("a", 12, 3, 12, 12)]


def test_pairs_and_buffers_never_depend_on_the_order_of_records() -> None:
    rng = random.Random(5)
    left = [(rng.choice("abc"), rng.randrange(0, 10), v) for v in range(12)] + [("a", 5, 100), ("a", 5, 100)]
    right = [(rng.choice("abc"), rng.randrange(0, 10), v) for v in range(12)]
    results = []
    for _ in range(4):
        rng.shuffle(left)
        rng.shuffle(right)
        run = run_both(_join(-2, 3), _sides(left, right), watermark_us=_wm(4))
        results.append((canonical(run.output), {n: canonical(c.drop_columns(["_key_group"])) for n, c in run.changes.items()}))
    assert all(r == results[0] for r in results)


def test_keys_compare_as_spark_compares_them_whatever_their_types() -> None:
    schema = pa.schema(
        [("f", pa.float64()), ("i", pa.int32()), ("d", pa.date32()), ("b", pa.bool_()), ("ts", US), ("x", pa.int64())]
    )
    node = _join(0, 0, key=("f", "i", "d", "b"), other_key=("f", "i", "d", "b"), time_columns=("ts", "ts"))
    day = date(2024, 5, 1)

    def rows(side: list[tuple[float, int, bool, int]]) -> pa.Table:
        return _table(schema, [{"f": f, "i": i, "d": day, "b": b, "ts": _at(0), "x": x} for f, i, b, x in side])

    nan = float("nan")
    left = rows([(-0.0, 1, True, 1), (nan, 1, True, 2), (1.5, 2, False, 3), (1.5, 2, True, 4)])
    right = rows([(0.0, 1, True, 10), (nan, 1, True, 20), (1.5, 2, False, 30)])
    run = run_both(node, [left, right])
    assert sorted((r["left_x"], r["right_x"]) for r in run.output.to_pylist()) == [(1, 10), (2, 20), (3, 30)]


# -- 2. late records --------------------------------------------------------------------------------------------------


def test_late_records_go_to_their_sides_late_output_or_are_dropped_and_counted() -> None:
    node = _join(-2, 3, late_outputs=("late_a", None))
    left = [("a", 5, 1), ("a", 10, 2), ("a", 9.999999, 3)]
    right = [("a", 9, 10), ("a", 7, 11), ("b", 2, 12)]
    inputs = _sides(left, right)
    inputs[0] = pa.concat_tables([inputs[0], _table(LEFT, [{"k": None, "ts": _at(10), "v": 4}, {"k": "a", "ts": None, "v": 5}])])
    inputs[1] = pa.concat_tables([inputs[1], _table(RIGHT, [{"k": None, "at": _at(11), "v": 13}])])
    run = run_both(node, inputs, watermark_prev_us=_wm(10), watermark_us=_wm(10))
    # Before W(n-1) = 10 s, or with a null key or event time: late.
    late = run.emitted["late_a"]
    assert late.schema == pa.schema([("k", pa.string()), ("ts", US), ("v", pa.int64())])
    assert sorted(late["v"].to_pylist()) == [1, 3, 4, 5]
    assert run.counts == {"interval join 'j' dropped {n} late right record(s) (no late output declared)": 4}
    assert _pairs(run) == []  # the one record left (a, 10) has no partner left
    assert "late_a" in node.side_outputs() and node.side_output_schemas([LEFT, RIGHT]) == {"late_a": late.schema}


def test_the_late_output_is_written_every_epoch_even_empty() -> None:
    run = run_both(_join(late_outputs=("late_a", "late_b")), _sides([("a", 1, 1)], []))
    assert run.emitted["late_a"].num_rows == 0 and run.emitted["late_b"].num_rows == 0 and run.counts == {}


def test_both_sides_may_share_one_late_output() -> None:
    node = _join(late_outputs=("late", "late"))
    assert node.side_outputs() == ["late"]
    schemas = node.side_output_schemas([LEFT, RIGHT])
    assert schemas == {"late": pa.schema([("k", pa.string()), ("ts", US), ("v", pa.int64()), ("at", US)])}
    run = run_both(node, _sides([("a", 1, 1)], [("b", 2, 2)]), watermark_prev_us=_wm(5), watermark_us=_wm(5))
    assert canonical(run.emitted["late"]) == canonical(
        pa.Table.from_pylist(
            [{"k": "a", "ts": _at(1), "v": 1, "at": None}, {"k": "b", "ts": None, "v": 2, "at": _at(2)}], schema=schemas["late"]
        )
    )


# -- 4. state cleanup -------------------------------------------------------------------------------------------------


def test_records_leave_state_at_flinks_cleanup_times_whether_or_not_their_key_has_records() -> None:
    epochs = Epochs(_join(-2, 3))  # left: ts + 3, right: ts + 2
    epochs.run(_sides([("a", 10, 1)], [("b", 10, 2)]))
    assert epochs.stored("left") == [("a", 10)] and epochs.stored("right") == [("b", 10)]
    run = epochs.run(_sides([], [("c", 20, 3)]), watermark=12)  # right's cleanup time 12 reached, left's 13 not
    assert run.changes["j__right"]["_deleted"].to_pylist() == [False, True]
    assert epochs.stored("left") == [("a", 10)] and epochs.stored("right") == [("c", 20)]
    run = epochs.run(_sides([], []), watermark=13)
    assert run.changes["j__left"].to_pylist()[0]["_deleted"] is True
    assert epochs.stored("left") == []


def test_a_record_whose_cleanup_time_the_watermark_passed_in_its_epoch_joins_but_is_never_stored() -> None:
    epochs = Epochs(_join(-2, 3))
    epochs.run(_sides([("a", 10, 1)], []), watermark=9)
    run = epochs.run(_sides([], [("a", 9.5, 2)]), watermark=20)  # not late (W(n-1) = 9), cleanup 11.5 <= 20
    assert _pairs(run) == [("a", 10, 1, 9.5, 2)]
    assert run.changes["j__right"].num_rows == 0
    assert run.changes["j__left"]["_deleted"].to_pylist() == [True]
    assert epochs.stored("left") == epochs.stored("right") == []


@pytest.mark.parametrize(("lower", "upper", "left_cleanup", "right_cleanup"), [(-2, 3, 3, 2), (1, 3, 3, 0), (-3, -1, 0, 3)])
def test_cleanup_times_shift_by_a_bound_only_on_its_side_of_zero(
    lower: int, upper: int, left_cleanup: int, right_cleanup: int
) -> None:
    for side, cleanup in (("left", left_cleanup), ("right", right_cleanup)):
        for watermark, kept in ((10 + cleanup - 0.000001, True), (10 + cleanup, False)):
            records = _sides([("a", 10, 1)], []) if side == "left" else _sides([], [("a", 10, 1)])
            run = run_both(_join(lower, upper), records, watermark_us=_wm(watermark))
            assert run.changes[f"j__{side}"].num_rows == (1 if kept else 0), (side, watermark)


def test_pairs_state_and_late_rows_match_a_plain_python_reference_over_epochs() -> None:
    """Flink's interval join epoch by epoch (the reference of tests/integration/test_event_time_joins.py)."""
    lower, upper, ooo = -2, 3, (2, 3)
    rng = random.Random(12)
    values = iter(range(1, 10_000))
    epochs = [tuple([(rng.choice("pqr"), 10 * i + rng.randrange(-7, 8), next(values)) for _ in range(rng.randrange(6, 10))]
                    for _ in "lr") for i in range(4)]  # fmt: skip
    high = upper - 1e-6  # the upper bound is exclusive
    state: dict[str, list[tuple[str, int, int]]] = {"left": [], "right": []}
    seen: dict[str, int | None] = {"left": None, "right": None}
    previous: float | None = None
    runner = Epochs(_join(lower, upper, upper_inclusive=False, late_outputs=("late_l", "late_r")))
    for records in epochs:
        fresh, late, pairs = {}, {}, []
        for index, side in enumerate(("left", "right")):
            for _, ts, _ in records[index]:
                seen[side] = ts if seen[side] is None else max(seen[side], ts)  # type: ignore[type-var]
            fresh[side] = [r for r in records[index] if previous is None or r[1] >= previous]
            late[side] = sorted(v for _, ts, v in records[index] if previous is not None and ts < previous)
        for lk, lts, lv in state["left"] + fresh["left"]:
            for rk, rts, rv in state["right"] + fresh["right"]:
                new = (lk, lts, lv) in fresh["left"] or (rk, rts, rv) in fresh["right"]
                if lk == rk and new and lower <= rts - lts <= high:
                    pairs.append((lk, lts, lv, rts, rv))
        watermark = min(seen[s] - o for s, o in zip(("left", "right"), ooo))  # type: ignore[operator]
        cleanup = {"left": lambda ts: ts + high, "right": lambda ts: ts - lower}
        for side in ("left", "right"):
            state[side] = [r for r in state[side] + fresh[side] if cleanup[side](r[1]) > watermark]
        previous = watermark
        run = runner.run(_sides(list(records[0]), list(records[1])), watermark=watermark)
        assert _pairs(run) == sorted(pairs)
        assert sorted(run.emitted["late_l"]["v"].to_pylist()) == late["left"]
        assert sorted(run.emitted["late_r"]["v"].to_pylist()) == late["right"]
        assert runner.stored("left") == sorted((k, ts) for k, ts, _ in state["left"])
        assert runner.stored("right") == sorted((k, ts) for k, ts, _ in state["right"])


# -- the buffered records ---------------------------------------------------------------------------------------------

RECORD = pa.schema([
    ("k", pa.string()), ("n", pa.int64()), ("ts", US), ("v", pa.float64()), ("s", pa.string()), ("flag", pa.bool_()),
])  # fmt: skip


# Records as Spark's to_json wrote them in earlier releases (warehouses and savepoints hold them): they must still read back.
SPARK_WRITTEN = [
    '{"k":"a","n":1,"ts":"2024-05-01T00:00:00.123456Z","v":12.5,"s":"quote \\" and \\\\ back","flag":true}',
    '{"k":"a","n":1,"ts":"2024-05-01T00:00:01.000000Z","v":1234567.25,"s":"tab\\tnew\\nline\\r\\b\\f"}',
    '{"k":"a","n":1,"ts":"2024-05-01T00:00:02.000000Z","v":-0.0,"s":"\\u0001\\u001F ctl","flag":false}',
    '{"k":"q\\"\\\\","n":7,"ts":"2024-05-01T00:00:03.000000Z","v":0.001,"s":"é ü \u2028 😀"}',
    '{"k":"b","n":2,"ts":"2024-05-01T00:00:04.000000Z","v":1.0E7,"s":""}',
    '{"k":"b","n":2,"ts":"2024-05-01T00:00:05.000000Z","v":1.0E-5}',
    '{"k":"b","n":2,"ts":"2024-05-01T00:00:06.000000Z","v":1.0E23}',
    '{"k":"b","n":2,"ts":"2024-05-01T00:00:07.000000Z","v":"NaN"}',
    '{"k":"b","n":2,"ts":"2024-05-01T00:00:08.000000Z","v":"-Infinity"}',
    '{"k":"b","n":2,"ts":"2024-05-01T00:00:09.000000Z","v":100.0}',
    '{"k":"b","n":2,"ts":"2024-05-01T00:00:10.000000Z"}',
]
SPARK_RECORDS = [
    {"k": "a", "n": 1, "ts": _at(0.123456), "v": 12.5, "s": 'quote " and \\ back', "flag": True},
    {"k": "a", "n": 1, "ts": _at(1), "v": 1234567.25, "s": "tab\tnew\nline\r\x08\x0c", "flag": None},
    {"k": "a", "n": 1, "ts": _at(2), "v": -0.0, "s": "\x01\x1f ctl", "flag": False},
    {"k": 'q"\\', "n": 7, "ts": _at(3), "v": 0.001, "s": "é ü \u2028 😀", "flag": None},
    {"k": "b", "n": 2, "ts": _at(4), "v": 1e7, "s": "", "flag": None},
    {"k": "b", "n": 2, "ts": _at(5), "v": 1e-5, "s": None, "flag": None},
    {"k": "b", "n": 2, "ts": _at(6), "v": 1e23, "s": None, "flag": None},
    {"k": "b", "n": 2, "ts": _at(7), "v": float("nan"), "s": None, "flag": None},
    {"k": "b", "n": 2, "ts": _at(8), "v": float("-inf"), "s": None, "flag": None},
    {"k": "b", "n": 2, "ts": _at(9), "v": 100.0, "s": None, "flag": None},
    {"k": "b", "n": 2, "ts": _at(10), "v": None, "s": None, "flag": None},
]


def _exact(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows to compare exactly: a float by its text (NaN equal to NaN, -0.0 unequal to 0.0)."""
    return [{k: repr(v) if isinstance(v, float) else v for k, v in r.items()} for r in rows]


def test_a_buffered_record_reads_back_as_written_and_as_sparks_to_json_wrote_it() -> None:
    node = _join(0, 10, key=("k", "n"), other_key=("k", "n"), time_columns=("ts", "ts"))
    run = run_both(node, [_table(RECORD, SPARK_RECORDS), RECORD.empty_table()])
    buffered = sorted(run.changes["j__left"].to_pylist(), key=lambda r: r["event_time_us"])
    assert [r["event_time_us"] for r in buffered] == [T0_US + int(s * S) for s in (0.123456, *range(1, 11))]
    # What the buffer holds reads back as it was written (tests/operators/test_join_buffer.py: for every type) ...
    written = record_values(pa.array([r["record"] for r in buffered]), list(RECORD))
    assert _exact(written.to_pylist()) == _exact(SPARK_RECORDS)
    # ... and so does what Spark's to_json wrote.
    assert _exact(record_values(pa.array(SPARK_WRITTEN), list(RECORD)).to_pylist()) == _exact(SPARK_RECORDS)


def test_record_index_ranks_a_keys_records_by_time_then_by_their_jsons_bytes() -> None:
    node = _join(0, 10, key=("k", "n"), other_key=("k", "n"), time_columns=("ts", "ts"))
    base = {"k": "a", "n": 1, "v": 1.0, "flag": None}
    rows = [
        {**base, "ts": _at(5), "s": "😀"},  # by UTF-16 this would come first; by UTF-8 bytes it comes after U+FB01
        {**base, "ts": _at(5), "s": "\ufb01"},
        {**base, "ts": _at(1), "s": "z"},
        {**base, "ts": _at(3), "s": "same"},
        {**base, "ts": _at(3), "s": "same"},  # identical: interchangeable, two ranks
        {**base, "n": 2, "ts": _at(9), "s": "other key"},
    ]
    run = run_both(node, [_table(RECORD, rows), RECORD.empty_table()])
    ranks = sorted(
        (r["n"], r["record_index"], r["event_time_us"] - T0_US, r["record"].split('"s":"')[1][:-2])
        for r in run.changes["j__left"].to_pylist()
    )
    assert ranks == [
        (1, 1, 1 * S, "z"), (1, 2, 3 * S, "same"), (1, 3, 3 * S, "same"), (1, 4, 5 * S, "\ufb01"), (1, 5, 5 * S, "😀"),
        (2, 1, 9 * S, "other key"),
    ]  # fmt: skip
    assert set(run.changes["j__left"]["record_epoch"].to_pylist()) == {1}


NESTED = pa.schema([
    ("k", pa.string()), ("ts", US), ("f", pa.float32()), ("dec", pa.decimal128(10, 2)), ("tiny", pa.decimal128(18, 8)),
    ("day", pa.date32()), ("local", pa.timestamp("us")), ("raw", pa.binary()), ("ints", pa.list_(pa.int64())),
    ("point", pa.struct([("x", pa.int32()), ("label", pa.string())])), ("tags", pa.map_(pa.string(), pa.int64())),
    ("i8", pa.int8()), ("far", US),
])  # fmt: skip


def test_records_of_any_column_types_are_buffered_and_read_back_unchanged() -> None:
    node = _join(0, 10, time_columns=("ts", "ts"))
    record = {
        "k": "a", "ts": _at(0), "f": 0.1, "dec": Decimal("12.30"), "tiny": Decimal("0.00000001"), "day": date(2024, 5, 1),
        "local": datetime(2024, 5, 1, 12, 0, 0, 1), "raw": b"\x00\xff", "ints": [1, None, 3],
        "point": {"x": 1, "label": None}, "tags": [("x", 1), ("y", None)], "i8": -5,
        "far": datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc),
    }  # fmt: skip
    empty = {**{n: None for n in NESTED.names}, "k": "a", "ts": _at(1)}
    epochs = Epochs(node)
    first = epochs.run([_table(NESTED, [record, empty]), NESTED.empty_table()])
    assert first.changes["j__left"].num_rows == 2
    # As Spark's to_json wrote them in earlier releases, they read back too.
    spark_written = [
        '{"k":"a","ts":"2024-05-01T00:00:00.000000Z","f":0.1,"dec":12.30,"tiny":1E-8,"day":"2024-05-01",'
        '"local":"2024-05-01T12:00:00.000001","raw":"AP8=","ints":[1,null,3],"point":{"x":1},"tags":{"x":1,"y":null},'
        '"i8":-5,"far":"9999-12-31T23:59:59.999999Z"}',
        '{"k":"a","ts":"2024-05-01T00:00:01.000000Z"}',
    ]
    read = record_values(pa.array(spark_written), list(NESTED)).to_pylist()
    assert read == [{**record, "f": pytest.approx(0.1, rel=1e-7)}, {**{n: None for n in NESTED.names}, "k": "a", "ts": _at(1)}]
    # Read back in a later epoch, when a right record pairs with them.
    second = epochs.run([NESTED.empty_table(), _table(NESTED, [{**empty, "ts": _at(2)}])])
    rows = sorted(second.output.to_pylist(), key=lambda r: r["left_ts"])
    assert len(rows) == 2
    expected = {f"left_{n}" if n != "k" else n: v for n, v in record.items()}
    assert {n: rows[0][n] for n in expected} == {**expected, "left_f": pytest.approx(0.1, rel=1e-7)}
    assert all(v is None for n, v in rows[1].items() if n.startswith("left_") and n != "left_ts")


def test_a_record_spark_buffered_reads_back_as_from_json_reads_it() -> None:
    schema = pa.schema([("k", pa.string()), ("ts", US), ("v", pa.float64()), ("s", pa.string()), ("n", pa.int64())])
    node = _join(-10, 10, time_columns=("ts", "ts"))
    [left_spec, _] = node.state_specs([schema, schema])
    keys = pa.table({"k": ["a", "a"]})
    stored = pa.table({
        "k": ["a", "a"], "record_epoch": [1, 1], "record_index": [1, 2], "_key_group": key_groups(keys, 8),
        "event_time_us": [T0_US, T0_US + S],
        # As Spark's to_json wrote them (a field the schema no longer has; one that is missing; one of another type).
        "record": ['{"k":"a","ts":"2024-05-01T00:00:00.000000Z","v":1.0E-5,"s":"x\\u0001\\"","old":3,"n":7}',
                   '{"k":"a","ts":"2024-05-01T00:00:01.000000Z","v":"NaN","n":"seven"}'],
        "_deleted": [False, False],
    })  # fmt: skip
    state = {left_spec.table_name: live_state(left_spec, None, stored, epoch=1)}
    right = _table(schema, [{"k": "a", "ts": _at(2), "v": 2.0, "s": "r", "n": 1}])
    run = run_both(node, [schema.empty_table(), right], state=state, epoch=2)
    rows = sorted(run.output.to_pylist(), key=lambda r: r["left_ts"])
    assert [(r["left_ts"], r["left_v"], r["left_s"], r["left_n"]) for r in rows[:1]] == [(_at(0), 1e-5, 'x\x01"', 7)]
    assert (
        rows[1]["left_ts"] == _at(1) and math.isnan(rows[1]["left_v"]) and rows[1]["left_s"] is None and rows[1]["left_n"] is None
    )
    assert all((r["right_v"], r["right_n"]) == (2.0, 1) for r in rows)


def test_event_times_and_bounds_beyond_a_long_compare_exactly() -> None:
    bounds = IntervalBounds.of(timedelta(seconds=-3), timedelta(seconds=3))
    lowest, highest = -(2**63), 2**63 - 1
    left = np.array([lowest, highest, lowest, 0, highest - 2 * S], dtype=np.int64)
    right = np.array([highest, lowest, lowest + 3 * S, 3 * S + 1, highest], dtype=np.int64)
    # Gaps beyond a long either way never join; within one, as Python's integers say.
    assert bounds.pairs(left, right).tolist() == [bounds.joins(int(a), int(b)) for a, b in zip(left, right)]
    assert bounds.pairs(left, right).tolist() == [False, False, True, False, True]
    # Bounds of nearly 3 million years: every pair of a key joins, nothing leaves state.
    huge = _join(key=("k",), other_key=("k",))
    huge.bounds = IntervalBounds.of(timedelta(days=-999_999_999), timedelta(days=999_999_999))
    run = run_both(huge, _sides([("a", 0, 1), ("a", 1e9, 2)], [("a", -1e9, 3)]), watermark_us=_wm(2e9))
    assert [(p[2], p[4]) for p in _pairs(run)] == [(1, 3), (2, 3)]
    assert run.changes["j__left"].num_rows == 2 and run.changes["j__right"].num_rows == 1


# -- the node ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda s: s.set(0, pa.field("k", pa.int64())),
            r"key columns of the two inputs differ in type \(k is int64 but k is string\)",
        ),
        (lambda s: s.set(1, pa.field("ts", pa.int64())), "event time 'ts' must be a timestamp"),
        (lambda s: s.append(pa.field("d", pa.duration("s"))), "column 'd' is of type duration"),
        (lambda s: s.remove(0), "the left input has no column 'k'"),
        (lambda s: s.append(pa.field("AT", pa.int64())), r"output columns \['AT', 'at'\] differ only in case"),
    ],
)
def test_what_the_join_refuses_when_the_pipeline_is_planned(change: Any, match: str) -> None:
    with pytest.raises(PipelineDefinitionError, match=match):
        _join().output_schema([change(LEFT), RIGHT])


def test_a_key_named_like_a_buffer_column_is_refused() -> None:
    schema = pa.schema([("record", pa.string()), ("ts", US)])
    with pytest.raises(PipelineDefinitionError, match=r"key columns \['record'\] are named like the join's buffer columns"):
        _join(key=("record",), other_key=("record",), time_columns=("ts", "ts")).output_schema([schema, schema])


def test_state_specs_and_exchanges() -> None:
    node = _join(key=("k",), other_key=("k",))
    left = LEFT.set(0, pa.field("k", pa.int32()))
    right = RIGHT.set(0, pa.field("k", pa.int32()))
    specs = node.state_specs([left, right])
    assert [s.table_name for s in specs] == ["j__left", "j__right"]
    assert [f"{f.name}:{f.type}" for f in specs[0].key_fields] == ["k:int32", "record_epoch:int64", "record_index:int64"]
    assert [f"{f.name}:{f.type}" for f in specs[1].value_fields] == ["event_time_us:int64", "record:string"]
    assert node.state_specs()[0].signature()["keys"][0] == "k:string"  # untyped: as savepoints compare them
    assert node.input_keys() == (("k",), ("k",))
    assert [key for _, key in node.keyed_inputs()] == [("k", "ts"), ("k", "at")]  # null event times: dead letters at the sources


def test_the_node_runs_detached_from_its_graph() -> None:
    node = pickle.loads(pickle.dumps(replace(_join(-2, 3), parent=None, other=None)))
    run = run_kernel(node, _sides([("a", 1, 1)], [("a", 2, 2)]))
    assert _pairs(run) == [("a", 1, 1, 2, 2)]
