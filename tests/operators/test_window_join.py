"""The window join's kernel: windows fire once the watermark passes their end, with every pair of their key's records."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from typing import Any, Sequence

import pyarrow as pa
import pytest

from barrierflow.api.windows import EventTimeSessionWindows, SlidingEventTimeWindows, TumblingEventTimeWindows
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.window import TumblingEventTimeWindows as FromWindowModule
from barrierflow.operators.window_join import WindowJoin
from harness import KernelRun, live_state, node_specs, run_both, upstream

S = 1_000_000
T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
T0_US = int(T0.timestamp()) * S
US = pa.timestamp("us", tz="UTC")
LEFT = pa.schema([("k", pa.string()), ("ts", US), ("v", pa.int64()), ("_seq", pa.int64())])
RIGHT = pa.schema([("k", pa.string()), ("at", US), ("v", pa.int64()), ("_seq", pa.int64())])
Side = list[tuple[str, int, int]]  # (key, seconds after T0, value)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _sides(left: Side, right: Side) -> list[pa.Table]:
    return [
        pa.Table.from_pylist([{"k": k, "ts": _at(s), "v": v, "_seq": i} for i, (k, s, v) in enumerate(left)], schema=LEFT),
        pa.Table.from_pylist([{"k": k, "at": _at(s), "v": v, "_seq": i} for i, (k, s, v) in enumerate(right)], schema=RIGHT),
    ]


def _join(size: int = 10, slide: int | None = None, **kwargs: Any) -> WindowJoin:
    assigner = (
        TumblingEventTimeWindows.of(timedelta(seconds=size)) if slide is None
        else SlidingEventTimeWindows.of(timedelta(seconds=size), timedelta(seconds=slide))
    )  # fmt: skip
    return WindowJoin(
        operator_id="wj", parent=upstream("a"), other=upstream("b"), key=("k",), other_key=("k",), assigner=assigner,
        time_columns=("ts", "at"), **kwargs,
    )  # fmt: skip


def _pairs(run: KernelRun) -> list[tuple[Any, ...]]:
    """(key, window start, window end, left seconds, left v, right seconds, right v) of each joined row, sorted."""
    seconds = lambda t: (t - T0).total_seconds()  # noqa: E731
    return sorted(
        (
            r["k"],
            seconds(r["window_start"]),
            seconds(r["window_end"]),
            seconds(r["ts"]),
            r["left_v"],
            seconds(r["at"]),
            r["right_v"],
        )
        for r in run.output.to_pylist()
    )


def _wm(seconds: float | None) -> int | None:
    return None if seconds is None else T0_US + int(seconds * S)


class Epochs:
    """Runs the join epoch after epoch (run_both each time), carrying its state tables over."""

    def __init__(self, node: WindowJoin) -> None:
        self.node = node
        self.state: dict[str, pa.Table] = {}
        self.epoch = 0
        self.watermark: int | None = None

    def run(self, inputs: Sequence[pa.Table], watermark: float | None = None) -> KernelRun:
        self.epoch += 1
        wn = _wm(watermark) if watermark is not None else self.watermark
        run = run_both(self.node, inputs, state=self.state, epoch=self.epoch, watermark_prev_us=self.watermark, watermark_us=wn)
        for name, spec in node_specs(self.node, inputs).items():
            self.state[name] = live_state(spec, self.state.get(name), run.changes[name], epoch=self.epoch)
        self.watermark = wn
        return run

    def stored(self, side: str) -> list[tuple[Any, ...]]:
        """(key, window start, seconds) of each buffered record of ``side``."""
        rows = self.state.get(f"wj__{side}")
        found = [] if rows is None else rows.to_pylist()
        return sorted((r["k"], (r["window_start"] - T0).total_seconds(), (r["event_time_us"] - T0_US) / S) for r in found)


def test_a_window_fires_once_the_watermark_passes_its_end_with_every_pair_of_its_keys_records() -> None:
    epochs = Epochs(_join(10))
    first = epochs.run(_sides([("a", 1, 1), ("a", 12, 2), ("b", 3, 3)], [("a", 9, 10), ("b", 14, 11)]))
    assert _pairs(first) == []  # no watermark yet: nothing fires
    assert epochs.stored("left") == [("a", 0, 1), ("a", 10, 12), ("b", 0, 3)]
    second = epochs.run(_sides([("a", 5, 4)], [("a", 15, 12)]), watermark=10)
    # [0, 10) fires: its stored and new records of each key pair; b has no right record there.
    assert _pairs(second) == [("a", 0, 10, 1, 1, 9, 10), ("a", 0, 10, 5, 4, 9, 10)]
    assert epochs.stored("left") == [("a", 10, 12)] and epochs.stored("right") == [("a", 10, 15), ("b", 10, 14)]
    assert sorted(second.changes["wj__left"]["_deleted"].to_pylist()) == [True, True]  # a and b's records of [0, 10)
    third = epochs.run(_sides([("a", 19, 5)], [("a", 11, 13)]), watermark=25)
    # [10, 20) fires: stored x stored, stored x new, new x new.
    assert _pairs(third) == [
        ("a", 10, 20, 12, 2, 11, 13), ("a", 10, 20, 12, 2, 15, 12), ("a", 10, 20, 19, 5, 11, 13), ("a", 10, 20, 19, 5, 15, 12),
    ]  # fmt: skip
    assert epochs.stored("left") == epochs.stored("right") == []


def test_a_record_joins_in_each_of_its_sliding_windows() -> None:
    run = run_both(_join(10, 5), _sides([("a", 7, 1)], [("a", 8, 2), ("a", 11, 3)]), watermark_us=_wm(30))
    assert _pairs(run) == [("a", 0, 10, 7, 1, 8, 2), ("a", 5, 15, 7, 1, 8, 2), ("a", 5, 15, 7, 1, 11, 3)]
    assert run.output.schema == pa.schema(
        [("k", pa.string()), ("window_start", US), ("window_end", US), ("ts", US), ("left_v", pa.int64()), ("at", US),
         ("right_v", pa.int64())]
    )  # fmt: skip


def test_records_of_windows_not_yet_complete_wait_and_the_others_are_never_stored() -> None:
    run = run_both(_join(10, 5), _sides([("a", 7, 1)], []), watermark_us=_wm(12))
    # [0, 10) fired (nothing to pair with); [5, 15) waits.
    assert [(r["window_start"], r["_deleted"]) for r in run.changes["wj__left"].to_pylist()] == [(_at(5), False)]
    assert run.changes["wj__right"].num_rows == 0 and run.output.num_rows == 0


def test_records_whose_windows_all_fired_are_late() -> None:
    node = _join(10, 5, late_outputs=(None, "late_b"))
    inputs = _sides([("a", 27, 1), ("a", 24, 2), ("a", 35, 3)], [("a", 29, 10), ("a", 19, 11)])
    inputs[0] = pa.concat_tables(
        [inputs[0], pa.Table.from_pylist([{"k": None, "ts": _at(40), "v": 4}, {"k": "a", "ts": None, "v": 5}], schema=LEFT)]
    )
    run = run_both(node, inputs, watermark_prev_us=_wm(30), watermark_us=_wm(40))
    # W(n-1) = 30: [20, 30) fired already; a record at 27 or 29 joins only in [25, 35); one at 24 or 19 is late.
    assert _pairs(run) == [("a", 25, 35, 27, 1, 29, 10)]
    assert run.emitted["late_b"].to_pylist() == [{"k": "a", "at": _at(19), "v": 11}]
    assert run.counts == {
        "window join 'wj' dropped {n} late left record(s) (no late output declared)": 3
    }  # (a, 24), a null key, a null event time
    assert [(r["window_start"], r["event_time_us"]) for r in run.changes["wj__left"].to_pylist()] == [(_at(35), T0_US + 35 * S)]


def test_keys_compare_as_spark_compares_them() -> None:
    schema = pa.schema([("f", pa.float64()), ("ts", US), ("x", pa.int64())])
    node = WindowJoin(operator_id="wj", parent=upstream("a"), other=upstream("b"), key=("f",), other_key=("f",),
                      assigner=TumblingEventTimeWindows.of(timedelta(seconds=10)), time_columns=("ts", "ts"))  # fmt: skip
    rows = lambda side: pa.Table.from_pylist([{"f": f, "ts": _at(1), "x": x} for f, x in side], schema=schema)  # noqa: E731
    run = run_both(
        node, [rows([(-0.0, 1), (float("nan"), 2)]), rows([(0.0, 10), (float("nan"), 20), (1.0, 30)])], watermark_us=_wm(10)
    )
    assert sorted((r["left_x"], r["right_x"]) for r in run.output.to_pylist()) == [(1, 10), (2, 20)]


def test_pairs_and_state_match_a_plain_python_reference_over_epochs() -> None:
    """Flink's window join epoch by epoch (the reference of tests/integration/test_event_time_joins.py)."""
    size, slide, ooo = 10, 5, (2, 3)
    rng = random.Random(12)
    values = iter(range(1, 10_000))
    epochs = [tuple([(rng.choice("pqr"), 10 * i + rng.randrange(-7, 8), next(values)) for _ in range(rng.randrange(6, 10))]
                    for _ in "lr") for i in range(4)]  # fmt: skip
    buffers: dict[str, list[tuple[str, int, int, int]]] = {"left": [], "right": []}
    seen: dict[str, int | None] = {"left": None, "right": None}
    previous: int | None = None
    runner = Epochs(_join(size, slide))
    total = 0
    for records in epochs:
        pairs = []
        for index, side in enumerate(("left", "right")):
            for key, ts, v in records[index]:
                seen[side] = ts if seen[side] is None else max(seen[side], ts)  # type: ignore[type-var]
                starts = range(ts - ts % slide - size, ts + 1, slide)
                windows = [s for s in starts if s <= ts < s + size and (previous is None or s + size > previous)]
                buffers[side] += [(key, s, ts, v) for s in windows]
        watermark = min(seen[s] - o for s, o in zip(("left", "right"), ooo))  # type: ignore[operator]
        for lk, ls, lts, lv in buffers["left"]:
            for rk, rs, rts, rv in buffers["right"]:
                if lk == rk and ls == rs and ls + size <= watermark:
                    pairs.append((lk, ls, ls + size, lts, lv, rts, rv))
        for side in ("left", "right"):
            buffers[side] = [r for r in buffers[side] if r[1] + size > watermark]
        previous = watermark
        run = runner.run(_sides(list(records[0]), list(records[1])), watermark=watermark)
        assert _pairs(run) == sorted(pairs)
        total += len(pairs)
        for side in ("left", "right"):
            assert runner.stored(side) == sorted((k, s, ts) for k, s, ts, _ in buffers[side])
    assert total > 10


def test_the_output_and_the_buffers() -> None:
    node = _join(10)
    assert node.output_schema([LEFT, RIGHT]).names == ["k", "window_start", "window_end", "ts", "left_v", "at", "right_v"]
    specs = node.state_specs([LEFT, RIGHT])
    assert [s.table_name for s in specs] == ["wj__left", "wj__right"]
    assert [f"{f.name}:{f.type}" for f in specs[0].key_fields] == [
        "k:string", "window_start:timestamp[us, tz=UTC]", "record_epoch:int64", "record_index:int64",
    ]  # fmt: skip
    assert node.input_keys() == (("k",), ("k",))
    with pytest.raises(PipelineDefinitionError, match=r"\['window_end'\] would appear twice"):
        node.output_schema([LEFT.append(pa.field("window_end", pa.int64())), RIGHT])


def test_only_tumbling_and_sliding_windows_join_and_the_window_modules_assigners_are_the_same() -> None:
    with pytest.raises(PipelineDefinitionError, match="is not a window assigner a join can use"):
        WindowJoin(operator_id="wj", parent=upstream(), other=upstream(), key=("k",), other_key=("k",),
                   assigner=EventTimeSessionWindows.with_gap(timedelta(seconds=5)))  # type: ignore[arg-type]  # fmt: skip
    node = WindowJoin(operator_id="wj", parent=upstream(), other=upstream(), key=("k",), other_key=("k",),
                      assigner=FromWindowModule.of(timedelta(seconds=5)))  # fmt: skip
    assert node.assigner.size_us == 5 * S
