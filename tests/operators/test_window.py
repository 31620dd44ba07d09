"""The window kernels (tumbling, sliding, session): steps 1-7 of :mod:`barrierflow.operators.window` on Arrow tables.

Hand-computed cases first, then two multi-epoch scenarios (those of
``tests/integration/test_windows.py`` and ``tests/integration/test_chained_windows.py``)
against a plain-Python reference that implements the module docstring
independently: every window a list of values appended in arrival order,
sessions merged one record at a time as Flink's merging window set does.
Every epoch runs with ``run_both``: one task, and tasks split by key-group
range, must agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from functools import partial, reduce
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa
import pytest

from barrierflow.api.aggregations import Aggregation, Avg, Count, Max, Min, Percentile, Sum, named_aggregations
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.core.keys import key_groups
from barrierflow.operators.base import Node
from barrierflow.operators.window import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WindowAssigner,
    window_node,
)
from harness import KernelRun, live_state, run_kernel, upstream
from harness import run_both as run_in_placements

S = 1_000_000  # microseconds per second
TS = pa.timestamp("us", tz="UTC")
RECORDS = pa.schema([("k", pa.string()), ("ts", TS), ("v", pa.float64()), ("_seq", pa.int64())])
NAN = float("nan")
# Four tasks of the harness's 8 key groups: with a task count that does not divide the key groups,
# execution.exchange.owner_of routes some key groups to a task that does not hold them (reported to the lead).
run_both = partial(run_in_placements, tasks=4)
TEN = TumblingEventTimeWindows.of(timedelta(seconds=10))
GAP = EventTimeSessionWindows.with_gap(timedelta(seconds=4))


def _records(rows: Sequence[tuple[Any, ...]], schema: pa.Schema = RECORDS) -> pa.Table:
    """Records ``(k, seconds, v)`` (``_seq`` their 1-based place) or ``(k, seconds, v, seq)``."""
    out = []
    for i, row in enumerate(rows):
        k, t, v = row[:3]
        seq = row[3] if len(row) > 3 else i + 1
        out.append({"k": k, "ts": None if t is None else round(t * S), "v": v, "_seq": seq})
    return pa.Table.from_pylist(out, schema=schema)


def _window(
    assigner: Any, *, lateness: float = 0, late_output: str | None = None, key: tuple[str, ...] = ("k",), **aggregations: Any
) -> Node:
    named = named_aggregations("w", (), aggregations or {"n": Count(), "total": Sum("v")})
    return window_node("w", upstream(), key, assigner, named, late_output, timedelta(seconds=lateness))


def _us(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * S)


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    """Output rows as tuples, window bounds in seconds, floats by repr (NaN, -0.0), sorted."""

    def plain(name: str, value: Any) -> Any:
        if name in ("window_start", "window_end"):
            return value.timestamp()
        return repr(value) if isinstance(value, float) else value

    return sorted((tuple(plain(n, r[n]) for n in table.column_names) for r in table.to_pylist()), key=repr)


def _expected(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Rows ``(k, start, end, *values)`` as :func:`_rows` gives them."""

    def plain(i: int, value: Any) -> Any:
        if i in (1, 2):
            return float(value)
        return repr(value) if isinstance(value, float) else value

    return sorted((tuple(plain(i, x) for i, x in enumerate(r)) for r in rows), key=repr)


def _state(run: KernelRun) -> list[dict[str, Any]]:
    """The staged window changes: key, start (seconds), values, tombstone."""
    (changes,) = run.changes.values()
    rows = []
    for r in changes.to_pylist():
        row = {k: v for k, v in r.items() if k != "_key_group"}
        row["window_start"] = r["window_start"].timestamp()
        if "window_end" in r:
            row["window_end"] = None if r["window_end"] is None else r["window_end"].timestamp()
        rows.append(row)
    return sorted(rows, key=repr)


class Epochs:
    """A window run over several epochs (each by ``run_both``), its state carried as the runtime carries it."""

    def __init__(self, node: Node, schema: pa.Schema = RECORDS) -> None:
        [self.spec] = node.state_specs([schema])
        self.node = node
        self.state: pa.Table | None = None
        self.epoch = 0
        self.watermark: int | None = None

    def run(self, records: pa.Table, watermark: float | None) -> KernelRun:
        """One epoch whose watermark W(n) is ``watermark`` seconds."""
        return self.run_us(records, _us(watermark))

    def run_us(self, records: pa.Table, watermark_us: int | None) -> KernelRun:
        self.epoch += 1
        state = {self.spec.table_name: self.state} if self.state is not None else None
        run = run_both(
            self.node, [records], state=state, epoch=self.epoch, watermark_prev_us=self.watermark, watermark_us=watermark_us
        )
        self.state = live_state(self.spec, self.state, run.changes[self.spec.table_name], epoch=self.epoch)
        self.watermark = watermark_us
        return run

    def live(self) -> list[tuple[Any, float]]:
        assert self.state is not None
        return sorted((r["k"], r["window_start"].timestamp()) for r in self.state.to_pylist())


# -- tumbling and sliding windows --------------------------------------------------------------------------


def test_tumbling_windows_fire_once_the_watermark_passes_their_end() -> None:
    epochs = Epochs(_window(TEN))
    first = epochs.run(_records([("a", 1, 1.0), ("a", 3, 2.0), ("b", 5, 4.0), ("a", 12, 8.0)]), watermark=12)
    assert _rows(first.output) == _expected([("a", 0, 10, 2, 3.0), ("b", 0, 10, 1, 4.0)])
    # Windows created and purged in the same epoch are never written: the state holds a's [10, 20) only.
    assert _state(first) == [{"k": "a", "window_start": 10, "window_values": [8.0], "_deleted": False}]
    staged = first.changes["w__pending_windows"]
    assert staged["_key_group"].to_pylist() == key_groups(staged.select(["k"]), 8).to_pylist()
    # The watermark fires a's pending window though no record of a arrives.
    second = epochs.run(_records([("b", 11, 1.0), ("b", 25, 2.0)]), watermark=25)
    assert _rows(second.output) == _expected([("a", 10, 20, 1, 8.0), ("b", 10, 20, 1, 1.0)])
    assert _state(second) == [
        {"k": "a", "window_start": 10, "window_values": [8.0], "_deleted": True},
        {"k": "b", "window_start": 20, "window_values": [2.0], "_deleted": False},
    ]
    # An empty epoch whose watermark stays: nothing fires, nothing changes.
    third = epochs.run(_records([]), watermark=25)
    assert third.output.num_rows == 0 and _state(third) == []
    assert epochs.live() == [("b", 20)]


def test_before_the_first_watermark_nothing_fires_and_nothing_is_late() -> None:
    node = _window(TEN, late_output="late")
    run = run_both(node, [_records([("a", -5, 1.0), ("a", 3, 2.0)])])
    assert run.output.num_rows == 0 and run.emitted["late"].num_rows == 0
    assert _state(run) == [
        {"k": "a", "window_start": -10, "window_values": [1.0], "_deleted": False},
        {"k": "a", "window_start": 0, "window_values": [2.0], "_deleted": False},
    ]


def test_a_sliding_record_late_for_some_of_its_windows_joins_the_others() -> None:
    sliding = SlidingEventTimeWindows.of(timedelta(seconds=10), timedelta(seconds=5))
    epochs = Epochs(_window(sliding, late_output="late"))
    first = epochs.run(_records([("a", 12, 1.0)]), watermark=16)  # windows [5, 15) and [10, 20)
    assert _rows(first.output) == _expected([("a", 5, 15, 1, 1.0)])
    assert first.emitted["late"].num_rows == 0
    # W(1) = 16: a@9's windows [0, 10) and [5, 15) are both late (side output);
    # a@13's [5, 15) is late, its [10, 20) is not: it joins that one only.
    second = epochs.run(_records([("a", 9, 2.0), ("a", 13, 4.0)]), watermark=20)
    assert _rows(second.output) == _expected([("a", 10, 20, 2, 5.0)])
    assert second.emitted["late"].to_pylist() == [{"k": "a", "ts": _records([("a", 9, 2.0)])["ts"][0].as_py(), "v": 2.0}]
    assert second.emitted["late"].schema == pa.schema([("k", pa.string()), ("ts", TS), ("v", pa.float64())])
    assert _state(second) == [{"k": "a", "window_start": 10, "window_values": [1.0, 4.0], "_deleted": True}]
    assert second.counts == {}


def test_late_records_without_a_side_output_are_dropped_and_counted() -> None:
    for assigner in (TEN, GAP):
        node = _window(assigner)
        run = run_both(
            node, [_records([("a", 1, 1.0), ("b", 2, 2.0), ("a", 30, 3.0)])], watermark_prev_us=20 * S, watermark_us=30 * S
        )
        assert run.counts == {"window w dropped {n} late record(s) (no late_output declared)": 2}
        assert run.emitted == {} and run.output.num_rows == 0
        assert [(r["k"], r["window_start"]) for r in _state(run)] == [("a", 30)]


def test_allowed_lateness_fires_again_marks_updates_and_purges_at_end_plus_lateness() -> None:
    epochs = Epochs(_window(TEN, lateness=5, late_output="late"))
    first = epochs.run(_records([("a", 1, 1.0)]), watermark=10)
    assert _rows(first.output) == _expected([("a", 0, 10, 1, 1.0, False)])
    assert _state(first) == [{"k": "a", "window_start": 0, "window_values": [1.0], "fired": True, "_deleted": False}]
    # Late for the fired window but within the lateness: it fires again, an update.
    second = epochs.run(_records([("a", 2, 2.0)]), watermark=12)
    assert _rows(second.output) == _expected([("a", 0, 10, 2, 3.0, True)])
    # A fired window without new records does not fire again.
    assert _rows(epochs.run(_records([("b", 13, 1.0)]), watermark=13).output) == []
    # end + L = 15 <= W(4): the last update, and the state is purged.
    fourth = epochs.run(_records([("a", 3, 4.0)]), watermark=15)
    assert _rows(fourth.output) == _expected([("a", 0, 10, 3, 7.0, True)])
    assert _state(fourth) == [{"k": "a", "window_start": 0, "window_values": [1.0, 2.0, 4.0], "fired": True, "_deleted": True}]
    # Now the window is late: its record goes to the side output.
    fifth = epochs.run(_records([("a", 4, 8.0)]), watermark=15)
    assert fifth.output.num_rows == 0 and fifth.emitted["late"]["v"].to_pylist() == [8.0]


def test_a_window_purged_without_firing_again_and_one_created_and_purged_at_once() -> None:
    epochs = Epochs(_window(TEN, lateness=5))
    epochs.run(_records([("a", 1, 1.0)]), watermark=10)  # fired, kept until 15
    run = epochs.run(_records([("b", 12, 1.0)]), watermark=30)  # a's purged (no row); b's fires and is purged at once
    assert _rows(run.output) == _expected([("b", 10, 20, 1, 1.0, False)])
    assert _state(run) == [{"k": "a", "window_start": 0, "window_values": [1.0], "fired": True, "_deleted": True}]


# -- aggregations -----------------------------------------------------------------------------------------


ALL: dict[str, Any] = {
    "n": Count(),
    "total": Sum("v"),
    "low": Min("v"),
    "high": Max("v"),
    "mean": Avg("v"),
    "p10": Percentile("v", q=0.1),
    "p25": Percentile("v", q=0.25),
    "p30": Percentile("v", q=0.3),
    "p50": Percentile("v", q=0.5),
    "p90": Percentile("v", q=0.9),
    "p100": Percentile("v", q=1.0),
}


@pytest.mark.parametrize("assigner", [TEN, GAP], ids=["tumbling", "session"])
def test_every_aggregation_hand_computed(assigner: WindowAssigner) -> None:
    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]  # sorted: 1 1 2 3 4 5 6 9
    run = run_both(
        _window(assigner, **ALL), [_records([("a", 1 + i * 0.5, v) for i, v in enumerate(values)])], watermark_us=60 * S
    )
    ((row,),) = [run.output.to_pylist()]
    assert row["n"] == 8 and row["total"] == 31.0 and row["low"] == 1.0 and row["high"] == 9.0 and row["mean"] == 3.875
    # Nearest rank: the ceil(q * 8)-th smallest.
    assert (row["p10"], row["p25"], row["p30"], row["p50"], row["p90"], row["p100"]) == (1.0, 1.0, 2.0, 3.0, 9.0, 9.0)
    assert run.output.schema.field("n").type == pa.int64() and run.output.schema.field("p50").type == pa.float64()


@pytest.mark.parametrize("assigner", [TEN, GAP], ids=["tumbling", "session"])
def test_nulls_nan_and_signed_zeros_as_spark_orders_doubles(assigner: WindowAssigner) -> None:
    aggregations: dict[str, Any] = {**ALL, "p17": Percentile("v", q=1 / 6), "p80": Percentile("v", q=0.8)}
    values = [2.0, NAN, None, -0.0, 0.0, 1.0]  # ascending: -0.0 0.0 1.0 2.0 NaN null
    run = run_both(
        _window(assigner, **aggregations), [_records([("a", 1 + i * 0.5, v) for i, v in enumerate(values)])], watermark_us=60 * S
    )
    (row,) = run.output.to_pylist()
    assert row["n"] == 6  # a null value is counted
    assert row["total"] is None and row["mean"] is None  # a null makes the fold null
    assert math.isnan(row["high"])  # NaN above every number
    assert row["low"] == 0.0 and math.copysign(1, row["low"]) == -1  # -0.0 == 0.0: the first in arrival order
    assert math.copysign(1, row["p17"]) == -1 and row["p50"] == 1.0 and math.isnan(row["p80"])
    assert row["p100"] is None  # nulls sort last
    # Of equal values the first in arrival order: 0.0 before -0.0 here.
    run = run_both(_window(assigner, low=Min("v"), high=Max("v"), p=Percentile("v", q=0.5)), [_records([("a", 1, 0.0), ("a", 2, -0.0)])],
                   watermark_us=60 * S)  # fmt: skip
    (row,) = run.output.to_pylist()
    assert [math.copysign(1, row[c]) for c in ("low", "high", "p")] == [1, 1, 1]
    # Only nulls: count 2, everything else null.
    run = run_both(_window(assigner, **ALL), [_records([("a", 1, None), ("a", 2, None)])], watermark_us=60 * S)
    (row,) = run.output.to_pylist()
    assert row["n"] == 2 and all(row[c] is None for c in ALL if c != "n")


def _fold(values: list[float]) -> float:
    return reduce(lambda acc, x: acc + x, values, 0.0)


def test_sums_fold_in_arrival_order_stored_values_first() -> None:
    epochs = Epochs(_window(TEN, total=Sum("v"), mean=Avg("v")))
    epochs.run(_records([("a", 1, 1e16, 50)]), watermark=0)
    # Given out of order: arrival is by _seq within the epoch, after the stored values.
    run = epochs.run(_records([("a", 3, -1e16, 2), ("a", 2, 1.0, 1), ("a", 4, 1.0, 3)]), watermark=10)
    assert _fold([1e16, 1.0, -1e16, 1.0]) == 1.0 and _fold([1e16, -1e16, 1.0, 1.0]) == 2.0
    assert run.output.to_pylist()[0]["total"] == 1.0 and run.output.to_pylist()[0]["mean"] == 0.25
    assert _state(run)[0]["window_values"] == [1e16, 1.0, -1e16, 1.0]


def test_long_windows_fold_exactly_as_a_left_fold() -> None:
    values = [0.1 * (i % 7) - 1e-3 * i + (1e15 if i % 11 == 0 else 0.0) for i in range(100)]
    records = _records(
        [("a", 1 + i * 0.01, v) for i, v in enumerate(values)] + [("b", 1 + i * 0.01, v) for i, v in enumerate(values[:20])]
    )
    run = run_both(_window(TEN, total=Sum("v")), [records], watermark_us=60 * S)
    totals = {r["k"]: r["total"] for r in run.output.to_pylist()}
    assert totals == {"a": _fold(values), "b": _fold(values[:20])}
    assert math.fsum(values) != _fold(values)  # the order matters for these values


def test_value_columns_are_cast_to_double_as_spark_casts() -> None:
    cases: list[tuple[pa.DataType, list[Any], list[float | None]]] = [
        (pa.int64(), [2**53 + 1, 3], [float(2**53), 3.0]),  # a long to the nearest double
        (pa.int32(), [-7, 5], [-7.0, 5.0]),
        (pa.float32(), [0.1, 2.5], [float(pa.scalar(0.1, pa.float32()).as_py()), 2.5]),
        (
            pa.decimal128(10, 2),
            [Decimal("2.78"), Decimal("-0.01")],
            [2.78, -0.01],
        ),  # correctly rounded (Arrow's cast: 2.7800000000000002)
        (pa.decimal128(38, 18), [Decimal("1.187E-15"), None], [1.187e-15, None]),
    ]
    for type_, given, expected in cases:
        schema = pa.schema([("k", pa.string()), ("ts", TS), ("v", type_), ("_seq", pa.int64())])
        records = pa.Table.from_pylist(
            [{"k": "a", "ts": S * (i + 1), "v": v, "_seq": i} for i, v in enumerate(given)], schema=schema
        )
        run = run_both(_window(TEN, n=Count(), low=Min("v"), high=Max("v")), [records], watermark_us=60 * S)
        assert _state(run) == [] and run.output["n"].to_pylist() == [2]
        kept = [x for x in expected if x is not None]
        assert (run.output["low"][0].as_py(), run.output["high"][0].as_py()) == (min(kept), max(kept)), type_
        epochs = Epochs(_window(TEN, n=Count(), total=Sum("v")), schema)
        epochs.run(records, watermark=None)
        assert epochs.state is not None and epochs.state["window_values"].to_pylist() == [expected], type_


def test_a_count_alone_keeps_zeros() -> None:
    run = run_both(_window(TEN, n=Count()), [_records([("a", 1, None), ("a", 12, 5.0)])], watermark_us=10 * S)
    assert _rows(run.output) == [("a", 0.0, 10.0, 1)]
    assert _state(run) == [{"k": "a", "window_start": 10, "window_values": [0.0], "_deleted": False}]


# -- records, keys and arrival positions --------------------------------------------------------------


def test_records_without_an_event_time_are_dropped_and_counted() -> None:
    for assigner, window in ((TEN, (0, 10)), (GAP, (1, 5))):
        run = run_both(
            _window(assigner, late_output="late"),
            [_records([("a", None, 1.0), ("a", 1, 2.0), ("b", None, 4.0)])],
            watermark_prev_us=0,
            watermark_us=30 * S,
        )
        assert _rows(run.output) == _expected([("a", *window, 1, 2.0)])  # neither late nor in any window
        assert run.emitted["late"].num_rows == 0
        assert run.counts == {"window w dropped {n} record(s) without an event time": 2}


@pytest.mark.parametrize("assigner", [TEN, GAP], ids=["tumbling", "session"])
def test_a_null_key_is_a_key_like_any_other_across_epochs(assigner: WindowAssigner) -> None:
    epochs = Epochs(_window(assigner))
    epochs.run(_records([(None, 1, 1.0), ("a", 1, 2.0)]), watermark=None)
    run = epochs.run(_records([(None, 2, 4.0), ("", 2, 8.0)]), watermark=30)
    assert sorted(((r["k"], r["n"], r["total"]) for r in run.output.to_pylist()), key=repr) == sorted(
        [(None, 2, 5.0), ("a", 1, 2.0), ("", 1, 8.0)], key=repr
    )


def test_keys_of_several_columns_and_types_and_float_keys_grouped_as_spark_groups_them() -> None:
    schema = pa.schema(
        [("k", pa.string()), ("g", pa.int32()), ("x", pa.float64()), ("ts", TS), ("v", pa.float64()), ("_seq", pa.int64())]
    )
    rows = [
        ("a", 1, -0.0, 1.0),
        ("a", 1, 0.0, 2.0),
        ("a", 2, NAN, 4.0),
        ("a", 2, -NAN, 8.0),
        ("a", 2, None, 16.0),
        ("b", 1, 0.0, 32.0),
    ]
    records = pa.Table.from_pylist(
        [{"k": k, "g": g, "x": x, "ts": S, "v": v, "_seq": i} for i, (k, g, x, v) in enumerate(rows)], schema=schema
    )
    node = _window(TEN, key=("k", "g", "x"))
    assert node.output_schema([schema]).field("g").type == pa.int32()
    [spec] = node.state_specs([schema])
    assert [f.type for f in spec.key_fields] == [pa.string(), pa.int32(), pa.float64(), TS]
    run = run_both(node, [records])
    got = sorted((r["k"], r["g"], repr(r["x"]), r["window_values"]) for r in run.changes[spec.table_name].to_pylist())
    assert got == [("a", 1, "0.0", [1.0, 2.0]), ("a", 2, "None", [16.0]), ("a", 2, "nan", [4.0, 8.0]), ("b", 1, "0.0", [32.0])]
    staged = run.changes[spec.table_name]
    assert staged["_key_group"].to_pylist() == key_groups(staged.select(["k", "g", "x"]), 8).to_pylist()


def test_null_arrival_positions_come_first_then_by_value() -> None:
    # Arrival: the null positions first (-1e16, then 1.0: by value), then _seq 1: ((0 - 1e16) + 1) + 1e16 = 0.0.
    records = _records([("a", 1, 1e16, 1), ("a", 2, 1.0, None), ("a", 3, -1e16, None)])
    epochs = Epochs(_window(TEN, total=Sum("v")))
    epochs.run(records, watermark=None)
    assert epochs.state is not None and epochs.state["window_values"].to_pylist() == [[-1e16, 1.0, 1e16]]
    assert _fold([-1e16, 1.0, 1e16]) == 0.0
    assert epochs.run(_records([]), watermark=10).output["total"].to_pylist() == [0.0]


# -- sessions ---------------------------------------------------------------------------------------------


def test_sessions_merge_across_epochs() -> None:
    epochs = Epochs(_window(GAP))
    first = epochs.run(_records([("a", 10, 1.0), ("a", 12, 2.0), ("b", 12, 1.0)]), watermark=12)
    assert first.output.num_rows == 0
    second = epochs.run(_records([("a", 15, 4.0)]), watermark=15)  # [15, 19) overlaps [10, 16): one session [10, 19)
    assert second.output.num_rows == 0
    assert _state(second) == [
        {"k": "a", "window_start": 10, "window_end": 19, "_deleted": False,
         "window_values": [{"epoch": 1, "position": 1, "value": 1.0}, {"epoch": 1, "position": 2, "value": 2.0},
                           {"epoch": 2, "position": 1, "value": 4.0}]},
    ]  # fmt: skip
    third = epochs.run(_records([]), watermark=19)  # b's [12, 16) and a's [10, 19) fire without records
    assert _rows(third.output) == _expected([("a", 10, 19, 3, 7.0), ("b", 12, 16, 1, 1.0)])
    assert [(r["k"], r["_deleted"]) for r in _state(third)] == [("a", True), ("b", True)]
    assert epochs.live() == []


def test_records_exactly_a_gap_apart_are_one_session_and_positions_rank_per_key() -> None:
    run = run_both(_window(GAP), [_records([("b", 30, 1.0), ("a", 4, 2.0), ("a", 0, 4.0), ("a", 9, 8.0)])], watermark_us=20 * S)
    assert _rows(run.output) == _expected([("a", 0, 8, 2, 6.0), ("a", 9, 13, 1, 8.0)])
    (pending,) = [r for r in _state(run) if r["k"] == "b"]
    assert pending["window_values"] == [{"epoch": 1, "position": 1, "value": 1.0}]  # its key's first record


def test_a_record_bridging_two_sessions_merges_them_in_arrival_order() -> None:
    epochs = Epochs(_window(GAP, total=Sum("v"), low=Min("v"), n=Count()))
    epochs.run(_records([("a", 10, 1e16), ("a", 17, 1.0)]), watermark=12)  # [10, 14) and [17, 21)
    run = epochs.run(_records([("a", 14, -1e16)]), watermark=25)  # [14, 18) touches one and overlaps the other
    # Arrival order 1e16, 1.0, -1e16 (not event time 1e16, -1e16, 1.0, which sums to 1.0).
    assert _rows(run.output) == _expected([("a", 10, 21, 0.0, -1e16, 3)])
    assert _state(run) == [
        {"k": "a", "window_start": 10, "window_end": 21, "_deleted": True,
         "window_values": [{"epoch": 1, "position": 1, "value": 1e16}, {"epoch": 1, "position": 2, "value": 1.0},
                           {"epoch": 2, "position": 1, "value": -1e16}]},
        {"k": "a", "window_start": 17, "window_end": None, "window_values": None, "_deleted": True},  # merged into [10, 21): a tombstone
    ]  # fmt: skip


def test_a_record_on_time_inside_a_fired_sessions_gap() -> None:
    # Without lateness the fired session [10, 14) is gone; a@12's own window [12, 16) is not late (16 > W(1) = 14).
    epochs = Epochs(_window(GAP, late_output="late"))
    assert _rows(epochs.run(_records([("a", 10, 1.0)]), watermark=14).output) == _expected([("a", 10, 14, 1, 1.0)])
    run = epochs.run(_records([("a", 12, 2.0)]), watermark=16)
    assert _rows(run.output) == _expected([("a", 12, 16, 1, 2.0)]) and run.emitted["late"].num_rows == 0
    # With lateness it joins the fired session, which fires again as an update.
    epochs = Epochs(_window(GAP, lateness=10))
    epochs.run(_records([("a", 10, 1.0)]), watermark=14)
    run = epochs.run(_records([("a", 12, 2.0)]), watermark=16)
    assert _rows(run.output) == _expected([("a", 10, 16, 2, 3.0, True, False)])


def test_a_fired_session_bridged_into_an_earlier_one_is_retracted() -> None:
    epochs = Epochs(_window(GAP, lateness=10, late_output="late"))
    first = epochs.run(_records([("a", 10, 1.0), ("a", 17, 2.0)]), watermark=21)
    assert _rows(first.output) == _expected([("a", 10, 14, 1, 1.0, False, False), ("a", 17, 21, 1, 2.0, False, False)])
    second = epochs.run(_records([("a", 14, 4.0)]), watermark=22)
    assert _rows(second.output) == _expected(
        [("a", 10, 21, 3, 7.0, True, False), ("a", 17, 21, None, None, True, True)]  # the update, then the retraction
    )
    assert [(r["window_start"], r.get("fired"), r["_deleted"]) for r in _state(second)] == [(10, True, False), (17, None, True)]
    # end + L = 31: purged without firing again.
    third = epochs.run(_records([]), watermark=31)
    assert third.output.num_rows == 0
    assert [(r["window_start"], r["_deleted"], len(r["window_values"])) for r in _state(third)] == [(10, True, 3)]
    # Late now: a@12's own window ends 16, 16 + 10 <= 31.
    assert epochs.run(_records([("a", 12, 8.0)]), watermark=31).emitted["late"]["v"].to_pylist() == [8.0]


# -- declarations ----------------------------------------------------------------------------------------


def test_output_state_and_side_output_schemas() -> None:
    schema = pa.schema([("k", pa.int64()), ("ts", TS), ("v", pa.int32()), ("_seq", pa.int64()), ("_seq_1", pa.int64())])
    node = _window(GAP, lateness=1, late_output="late", n=Count(), p=Percentile("v", q=0.5))
    assert node.output_schema([schema]) == pa.schema(
        [("k", pa.int64()), ("window_start", TS), ("window_end", TS), ("n", pa.int64()), ("p", pa.float64()),
         ("is_update", pa.bool_()), ("retracted", pa.bool_())]
    )  # fmt: skip
    assert node.side_outputs() == ["late"]
    assert node.side_output_schemas([schema]) == {"late": pa.schema([("k", pa.int64()), ("ts", TS), ("v", pa.int32())])}
    [typed] = node.state_specs([schema])
    [untyped] = node.state_specs()
    assert typed.key_fields[0] == pa.field("k", pa.int64()) and untyped.key_fields[0] == pa.field("k", pa.string())
    assert typed.value_fields == untyped.value_fields
    assert _window(TEN).side_output_schemas([schema]) == {} and _window(TEN).side_outputs() == []


@pytest.mark.parametrize(
    ("make", "schema", "match"),
    [
        (lambda: _window(TumblingEventTimeWindows.of(timedelta(seconds=1), time_column="t")), RECORDS, r"event-time column 't' must be a timestamp \(found: no such"),
        (lambda: _window(TumblingEventTimeWindows.of(timedelta(seconds=1), time_column="v")), RECORDS, r"'v' must be a timestamp \(found: double"),
        (lambda: _window(TEN, total=Sum("k")), RECORDS, r"window w: Sum\('k'\) needs a numeric column \(found: string\)"),
        (lambda: _window(TEN, total=Sum("nope")), RECORDS, r"Sum\('nope'\) needs a numeric column \(found: no such column\)"),
        (lambda: _window(TEN, key=("nope",)), RECORDS, r"its key column 'nope' is not among"),
    ],
)  # fmt: skip
def test_impossible_inputs_are_refused_naming_the_window(make: Callable[[], Node], schema: pa.Schema, match: str) -> None:
    with pytest.raises(PipelineDefinitionError, match=match):
        make().output_schema([schema])


def test_aggregations_must_read_one_column() -> None:
    with pytest.raises(PipelineDefinitionError, match=r"all aggregations must read the same column"):
        _window(TEN, a=Sum("v"), b=Sum("w"))


def test_the_node_survives_pickling_detached() -> None:
    import pickle

    node = _window(GAP, lateness=3, late_output="late", **ALL)
    node.parent = None
    copy = pickle.loads(pickle.dumps(node))
    run = run_kernel(copy, [_records([("a", 1, 1.0)])], watermark_us=10 * S)
    assert run.output["n"].to_pylist() == [1]


# -- two multi-epoch scenarios against a plain-Python reference ----------------------------------------------


@dataclass(frozen=True)
class Record:
    k: str
    g: int
    t: int  # microseconds
    v: float


def _aggregate(names: dict[str, Aggregation], values: list[float | None]) -> dict[str, Any]:
    """The module docstring's aggregates, in plain Python (values in arrival order)."""

    def order(x: float) -> tuple[bool, float]:
        return (math.isnan(x), 0.0 if math.isnan(x) else x)  # NaN above every number; -0.0 == 0.0

    present = [x for x in values if x is not None]
    ascending = sorted(present, key=order) + [None] * (len(values) - len(present))  # stable: equal ones in arrival order
    out: dict[str, Any] = {}
    for name, agg in names.items():
        if isinstance(agg, Count):
            out[name] = len(values)
        elif isinstance(agg, (Sum, Avg)):
            total = None if len(present) < len(values) else _fold(present)
            out[name] = total if isinstance(agg, Sum) or total is None else total / len(values)
        elif isinstance(agg, Min):
            out[name] = min(present, key=order) if present else None  # the first of the least
        elif isinstance(agg, Max):
            out[name] = max(present, key=order) if present else None  # the first of the greatest
        else:
            assert isinstance(agg, Percentile)
            out[name] = ascending[math.ceil(Decimal(str(agg.q)) * len(values)) - 1]
    return out


def _watermarks(epochs: list[list[Record]]) -> Iterator[tuple[int, list[Record], int | None, int]]:
    """(epoch, records, W(n-1), W(n)): the highest event time seen so far."""
    high: int | None = None
    for epoch, records in enumerate(epochs, 1):
        prev, high = high, max([r.t for r in records] + ([high] if high is not None else []))
        yield epoch, records, prev, high


def aligned_reference(
    epochs: list[list[Record]], key: Callable[[Record], tuple[Any, ...]], value: Callable[[Record], float], names: dict[str, Aggregation],
    size: int, slide: int, lateness: int,
) -> tuple[list[tuple[Any, ...]], list[tuple[int, Record]], int]:  # fmt: skip
    """Emitted rows (epoch, *key, start, end, *aggregates, [is_update]), late records, windows left."""
    state: dict[tuple[Any, ...], dict[str, Any]] = {}
    rows, late = [], []
    for epoch, records, wm_prev, wm in _watermarks(epochs):
        touched = set()
        for r in records:
            last = r.t - r.t % slide
            starts = [s for s in range(last - size, last + 1, slide) if s <= r.t < s + size]
            live = [s for s in starts if wm_prev is None or s + size + lateness > wm_prev]
            if not live:
                late.append((epoch, r))
                continue
            for s in live:
                state.setdefault((*key(r), s), {"values": [], "fired": False})["values"].append(value(r))
                touched.add((*key(r), s))
        for window, w in sorted(state.items(), key=repr):
            end = window[-1] + size
            if end <= wm and (window in touched or not w["fired"]):
                extra = (w["fired"],) if lateness else ()
                rows.append((epoch, *window, end, *_aggregate(names, w["values"]).values(), *extra))
                w["fired"] = True
            if end + lateness <= wm:
                del state[window]
    return rows, late, len(state)


def session_reference(
    epochs: list[list[Record]], value: Callable[[Record], float], names: dict[str, Aggregation], gap: int, lateness: int
) -> tuple[list[tuple[Any, ...]], list[tuple[int, Record]], int]:
    """Emitted rows (epoch, k, start, end, *aggregates, [is_update, retracted]), late records, sessions left.

    Each record merges into every session it overlaps, one record at a time;
    a session remembers the stored sessions it took in this epoch.
    """
    sessions: dict[str, list[dict[str, Any]]] = {}
    rows, late = [], []
    for epoch, records, wm_prev, wm in _watermarks(epochs):
        for stored in (s for ss in sessions.values() for s in ss):
            stored["taken"], stored["touched"] = [(stored["start"], stored["end"], stored["fired"])], False
        for position, r in enumerate(records):
            if wm_prev is not None and r.t + gap + lateness <= wm_prev:
                late.append((epoch, r))
                continue
            new = {
                "start": r.t,
                "end": r.t + gap,
                "values": [(epoch, position, value(r))],
                "taken": [],
                "touched": True,
                "fired": False,
            }
            keep = []
            for s in sessions.get(r.k, []):
                if s["start"] <= new["end"] and new["start"] <= s["end"]:  # Flink's TimeWindow.intersects
                    new["start"], new["end"] = min(new["start"], s["start"]), max(new["end"], s["end"])
                    new["values"] += s["values"]
                    new["taken"] += s["taken"]
                else:
                    keep.append(s)
            sessions[r.k] = [*keep, new]
        for k in sorted(sessions):
            for s in sorted(sessions[k], key=lambda s: s["start"]):
                fired = any(f for start, _, f in s["taken"] if start == s["start"])
                for start, end, f in sorted(s["taken"]):
                    if f and start != s["start"]:
                        rows.append((epoch, k, start, end, *[None] * len(names), True, True))
                if s["end"] <= wm and (s["touched"] or not fired):
                    values = [v for *_, v in sorted(s["values"], key=lambda x: x[:2])]
                    extra = (fired, False) if lateness else ()
                    rows.append((epoch, k, s["start"], s["end"], *_aggregate(names, values).values(), *extra))
                    fired = True
                s["fired"] = fired
            sessions[k] = [s for s in sessions[k] if s["end"] + lateness > wm]
    return rows, late, sum(len(ss) for ss in sessions.values())


EVENTS = pa.schema([("k", pa.string()), ("g", pa.int64()), ("ts", TS), ("v", pa.float64()), ("_seq", pa.int64())])


def _table(records: list[Record]) -> pa.Table:
    return pa.Table.from_pylist(
        [{"k": r.k, "g": r.g, "ts": r.t, "v": r.v, "_seq": i} for i, r in enumerate(records, 1)], schema=EVENTS
    )


def _canonical(rows: list[tuple[Any, ...]]) -> list[str]:
    return sorted(repr(tuple(repr(x) if isinstance(x, float) else x for x in row)) for row in rows)


def _check(
    node: Node, epochs: list[list[Record]], expected: tuple[list[tuple[Any, ...]], list[tuple[int, Record]], int], dropped: list[int] | None = None
) -> None:  # fmt: skip
    """Runs ``node`` over ``epochs`` and compares its rows, late records and final state with the reference's."""
    rows, late, left = expected
    runner = Epochs(node, EVENTS)
    got_rows: list[tuple[Any, ...]] = []
    got_late: list[tuple[int, Record]] = []
    counts = []
    for epoch, records, _, wm in _watermarks(epochs):
        run = runner.run_us(_table(records), wm)
        out = run.output.to_pylist()
        for r in out:
            r["window_start"], r["window_end"] = round(r["window_start"].timestamp() * S), round(r["window_end"].timestamp() * S)
        got_rows += [(epoch, *r.values()) for r in out]
        for name, table in run.emitted.items():
            got_late += [(epoch, Record(r["k"], r["g"], round(r["ts"].timestamp() * S), r["v"])) for r in table.to_pylist()]
        counts.append(run.counts.get("window w dropped {n} late record(s) (no late_output declared)", 0))
    assert _canonical(got_rows) == _canonical(rows)
    if dropped is None:
        assert sorted(map(repr, got_late)) == sorted(map(repr, late))
    else:
        assert counts == dropped and len(late) == sum(dropped)
    assert runner.state is not None and runner.state.num_rows == left


T0 = 1_767_225_600 * S  # 2026-01-01T00:00:00Z, a multiple of every window size below


def _epochs(data: list[list[tuple[str, int, float, float]]]) -> list[list[Record]]:
    return [[Record(k, g, T0 + round(t * S), v) for k, g, t, v in records] for records in data]


# tests/integration/test_windows.py: W(1) = 26, W(2) = 27, W(3) = 50.
WINDOWS_EPOCHS = _epochs(
    [
        [
            ("a", 0, 13, 0.1),
            ("a", 0, 14, 0.2),
            ("a", 0, 20, 0.3),
            ("b", 0, 6, 2.0),
            ("d", 0, 10, 1.0),
            ("e", 0, 21, 1.5),
            ("a", 0, 26, 0.5),
        ],
        [("a", 0, 17, 0.6), ("b", 0, 3, 9.0), ("a", 0, 27, 1.0)],
        [("a", 0, 15, 7.0), ("a", 0, 5, 3.0), ("a", 0, 12, 0.25), ("c", 0, 50, 1.0)],
    ]
)
# tests/integration/test_chained_windows.py: sums, minima and maxima that depend on arrival order.
CHAINED_EPOCHS = _epochs(
    [
        [
            ("a", 1, 13, 0.1), ("a", 1, 14, 0.2), ("a", 2, 20, 0.3), ("b", 1, 6, 2.0), ("d", 1, 10, 1.0), ("e", 1, 21, 1.5),
            ("n", 1, 1.5, NAN), ("n", 1, 2, -0.0), ("n", 2, 2.25, 0.0), ("n", 1, 3, 1.0),
            ("z", 1, 3, 1e16), ("z", 1, 3.5, 1.0), ("z", 1, 4, -1e16), ("z", 1, 4.5, 1.0),
            ("a", 1, 26.000001, 0.5),
        ],
        [("a", 1, 17, 0.6), ("b", 1, 3, 9.0), ("n", 1, 24, 0.0), ("n", 1, 24.5, -0.0), ("a", 1, 27, 1.0), ("z", 2, 25, 3.0)],
        [("a", 1, 15, 7.0), ("a", 2, 5, 3.0), ("a", 1, 12, 0.25), ("z", 2, 26, 1e16), ("z", 2, 22, 2.0), ("c", 1, 50, 1.0)],
        [("c", 1, 52, 2.0), ("a", 1, 49, 0.5), ("e", 2, 90, 1.0)],
    ]
)  # fmt: skip


def BY_K(r: Record) -> tuple[Any, ...]:
    return (r.k,)


def V(r: Record) -> float:
    return r.v


def _node(
    assigner: Any,
    names: dict[str, Aggregation],
    *,
    lateness: int = 0,
    late_output: str | None = None,
    key: tuple[str, ...] = ("k",),
) -> Node:
    return window_node(
        "w", upstream(), key, assigner, named_aggregations("w", (), names), late_output, timedelta(seconds=lateness)
    )


def test_the_integration_scenario_sliding_and_sessions_with_lateness() -> None:
    names: dict[str, Aggregation] = {"n": Count(), "total": Sum("v")}
    sliding = SlidingEventTimeWindows.of(timedelta(seconds=10), timedelta(seconds=5))
    expected = aligned_reference(WINDOWS_EPOCHS, BY_K, V, names, 10 * S, 5 * S, 10 * S)
    # The data covers the cases of the module docstring.
    rows, late, _ = expected
    assert ("a", T0 + 10 * S, T0 + 20 * S) in {r[1:4] for r in rows if r[-1] and r[0] == 3}  # updated within lateness, twice
    late_times = {(epoch, r.k, r.t - T0) for epoch, r in late}
    assert (3, "a", 12 * S) not in late_times and (3, "a", 5 * S) in late_times  # one window late, or all
    _check(_node(sliding, names, lateness=10, late_output="late"), WINDOWS_EPOCHS, expected)
    sessions = session_reference(WINDOWS_EPOCHS, V, names, 4 * S, 10 * S)
    relative = {(r[0], r[1], (r[2] - T0) // S, (r[3] - T0) // S, *r[4:]) for r in sessions[0]}
    assert (2, "a", 20, 24, None, None, True, True) in relative  # fired session bridged into an earlier one: retracted
    assert (2, "a", 13, 24, 4, _fold([0.1, 0.2, 0.3, 0.6]), True, False) in relative  # arrival order, not event time
    assert _fold([0.1, 0.2, 0.3, 0.6]) != _fold([0.1, 0.2, 0.6, 0.3])
    _check(_node(GAP, names, lateness=10, late_output="late"), WINDOWS_EPOCHS, sessions)
    # Without lateness or side output: late records dropped and counted (2 in epoch 2, 3 in epoch 3).
    _check(_node(GAP, names), WINDOWS_EPOCHS, session_reference(WINDOWS_EPOCHS, V, names, 4 * S, 0), dropped=[0, 2, 3])


CHAINED_ALL: dict[str, Aggregation] = {"n": Count(), "total": Sum("v"), "low": Min("v"), "high": Max("v"), "mean": Avg("v")}


@pytest.mark.parametrize(
    ("name", "make", "reference"),
    [
        (
            "sessions",
            lambda: _node(GAP, CHAINED_ALL, lateness=10, late_output="late"),
            lambda: session_reference(CHAINED_EPOCHS, V, CHAINED_ALL, 4 * S, 10 * S),
        ),
        (
            "strict",
            lambda: _node(GAP, {"n": Count(), "total": Sum("v")}, late_output="late"),
            lambda: session_reference(CHAINED_EPOCHS, V, {"n": Count(), "total": Sum("v")}, 4 * S, 0),
        ),
        (
            "sliding",
            lambda: _node(SlidingEventTimeWindows.of(timedelta(seconds=10), timedelta(seconds=5)), CHAINED_ALL, lateness=10, late_output="late"),
            lambda: aligned_reference(CHAINED_EPOCHS, BY_K, V, CHAINED_ALL, 10 * S, 5 * S, 10 * S),
        ),
        (
            "tumbling",
            lambda: _node(TEN, CHAINED_ALL, late_output="late", key=("k", "g")),
            lambda: aligned_reference(CHAINED_EPOCHS, lambda r: (r.k, r.g), V, CHAINED_ALL, 10 * S, 10 * S, 0),
        ),
        (
            "long_sums",
            lambda: _node(GAP, {"total": Sum("g")}, late_output="late"),
            lambda: session_reference(CHAINED_EPOCHS, lambda r: float(r.g), {"total": Sum("g")}, 4 * S, 0),
        ),
        (
            "percentile",
            lambda: _node(GAP, {"p50": Percentile("v", q=0.5), "p90": Percentile("v", q=0.9)}, late_output="late"),
            lambda: session_reference(CHAINED_EPOCHS, V, {"p50": Percentile("v", q=0.5), "p90": Percentile("v", q=0.9)}, 4 * S, 0),
        ),
    ],
)  # fmt: skip
def test_the_chained_scenario_against_the_reference(name: str, make: Callable[[], Node], reference: Callable[[], Any]) -> None:
    expected = reference()
    if name == "sessions":
        assert any(r[-1] for r in expected[0]) and any(r[-2] and not r[-1] for r in expected[0])  # a retraction and an update
    if name == "tumbling":
        z = [r for r in expected[0] if r[1:3] == ("z", 1)]
        assert [r[6] for r in z] == [1.0]  # (((0.0 + 1e16) + 1.0) + -1e16) + 1.0: arrival order
    assert expected[1], "late records"
    _check(make(), CHAINED_EPOCHS, expected)


def test_records_without_arrival_positions_are_ordered_by_value() -> None:
    schema = pa.schema([("k", pa.string()), ("ts", TS), ("v", pa.float64())])
    records = pa.Table.from_pylist([{"k": "a", "ts": S, "v": v} for v in (1e16, -1e16, 1.0)], schema=schema)
    node = _window(GAP, total=Sum("v"), p=Percentile("v", q=0.5))
    run = run_both(node, [records], watermark_us=60 * S)
    assert run.output.to_pylist()[0]["total"] == _fold([-1e16, 1.0, 1e16]) == 0.0
    assert node.output_schema([schema]).names == ["k", "window_start", "window_end", "total", "p"]
