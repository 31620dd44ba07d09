"""Interval joins and several watermark assigners without Spark: bounds, cleanup times, output names, the declaration."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pytest

import barrierflow as bf
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.interval_join import IntervalBounds, IntervalJoin
from barrierflow.operators.join_buffer import output_columns
from barrierflow.operators.watermark import WatermarkAssigner, WatermarkClock
from barrierflow.plan.pipeline import Pipeline, PipelineBuilder

S = 1_000_000
US = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([pa.field("k", pa.string()), pa.field("ts", US), pa.field("v", pa.float64())])


@pytest.mark.parametrize(
    ("lower_inclusive", "upper_inclusive", "joined"),
    [
        (True, True, [-2, -1, 0, 1, 2, 3]),
        (False, True, [-1, 0, 1, 2, 3]),
        (True, False, [-2, -1, 0, 1, 2]),
        (False, False, [-1, 0, 1, 2]),
    ],
)
def test_bounds_are_inclusive_unless_declared_exclusive_by_one_microsecond(
    lower_inclusive: bool, upper_inclusive: bool, joined: list[int]
) -> None:
    bounds = IntervalBounds.of(timedelta(seconds=-2), timedelta(seconds=3), lower_inclusive, upper_inclusive)
    left = 100 * S
    offsets = [-3, -2, -1, 0, 1, 2, 3, 4]
    assert [o for o in offsets if bounds.joins(left, left + o * S)] == joined
    # An exclusive bound moves by one microsecond, the timestamps' unit.
    assert bounds.joins(left, left - 2 * S + 1) and bounds.joins(left, left + 3 * S - 1)


@pytest.mark.parametrize(
    ("lower", "upper", "left_cleanup", "right_cleanup"),
    [
        (-2, 3, 3, 2),  # left: ts + upper; right: ts - lower
        (1, 3, 3, 0),  # lower > 0: a right record waits for no later left one beyond its own time
        (-3, -1, 0, 3),  # upper < 0: a left record waits for no later right one beyond its own time
        (0, 0, 0, 0),
    ],
)
def test_records_leave_state_when_the_watermark_reaches_flinks_cleanup_time(
    lower: int, upper: int, left_cleanup: int, right_cleanup: int
) -> None:
    bounds = IntervalBounds.of(timedelta(seconds=lower), timedelta(seconds=upper))
    assert 10 * S + bounds.cleanup_shift("left") == (10 + left_cleanup) * S
    assert 10 * S + bounds.cleanup_shift("right") == (10 + right_cleanup) * S
    # Past its cleanup time a record can join no record that is not late (event time >= the watermark).
    for side, ts in (("left", 10 * S), ("right", 10 * S)):
        watermark = ts + bounds.cleanup_shift(side)
        later = range(watermark + 1, watermark + 10 * S, S // 2)
        assert not any(bounds.joins(ts, t) if side == "left" else bounds.joins(t, ts) for t in later)


@pytest.mark.parametrize(
    ("lower", "upper", "inclusive", "match"),
    [
        (timedelta(seconds=2), timedelta(seconds=1), (True, True), "must not be after upper bound"),
        (timedelta(seconds=1), timedelta(seconds=1), (False, True), "must not be after upper bound"),
        (2, timedelta(seconds=1), (True, True), "must be a datetime.timedelta"),
    ],
)
def test_bounds_that_join_nothing_are_refused(lower: Any, upper: timedelta, inclusive: tuple[bool, bool], match: str) -> None:
    with pytest.raises(PipelineDefinitionError, match=match):
        IntervalBounds.of(lower, upper, *inclusive)


def test_output_names_keep_the_left_key_and_prefix_names_on_both_sides() -> None:
    columns = output_columns(("k",), ["k", "ts", "price"], ["uid", "ts", "qty"], ("uid",))
    assert columns == [
        ("left", "k", "k"), ("left", "ts", "left_ts"), ("left", "price", "price"),
        ("right", "ts", "right_ts"), ("right", "qty", "qty"),
    ]  # fmt: skip
    with pytest.raises(PipelineDefinitionError, match=r"\['left_ts'\] would appear twice"):
        output_columns(("k",), ["k", "ts", "left_ts"], ["k", "ts"], ("k",))


def combined_watermark(marks: dict[str, int | None], assigners: set[str]) -> tuple[bool, int | None]:
    """Whether every assigner reported, and the watermark: the assigners' marks folded by the task's watermark clock."""
    clock = WatermarkClock(watermark_prev_us=None, maxima={}, bounds={a: 0 for a in assigners}, tracked=True)
    for assigner, mark in marks.items():
        clock.observe(assigner, mark, 0)
    return clock.complete, clock.watermark_us


def test_the_watermark_is_the_minimum_of_the_assigners_once_all_reported() -> None:
    assigners = {"wa", "wb"}
    assert combined_watermark({"wa": 5}, assigners) == (False, None)
    assert combined_watermark({"wa": 5, "wb": 3}, assigners) == (True, 3)
    assert combined_watermark({"wa": 5, "wb": None}, assigners) == (True, None)  # b saw nothing yet: -infinity


def _build(body: Callable[[PipelineBuilder], None]) -> Pipeline:
    @bf.pipeline("unit_interval")
    def definition(p: PipelineBuilder, params: dict[str, Any]) -> None:
        body(p)

    return definition.build({})


def _sources(p: PipelineBuilder) -> tuple[bf.DataStream, bf.DataStream]:
    a = p.source(bf.FileSource("a", "/nonexistent/a", schema=SCHEMA))
    b = p.source(bf.FileSource("b", "/nonexistent/b", schema=SCHEMA.set(1, pa.field("at", US))))
    return a, b


def test_an_interval_join_of_two_watermarked_sources() -> None:
    def body(p: PipelineBuilder) -> None:
        a, b = _sources(p)
        (a.with_watermark("ts", timedelta(seconds=1)).key_by("k")
          .interval_join(b.with_watermark("at", timedelta(seconds=2)).key_by("k"))
          .between(timedelta(seconds=-1), timedelta(seconds=1), operator_id="j", right_late_output="late_b")
          .sink_to(bf.DeltaSink.append("out")))  # fmt: skip

    pipe = _build(body)
    join = next(n for n in pipe.nodes if isinstance(n, IntervalJoin))
    assert join.time_columns == ("ts", "at")
    assert [s.table_name for s in pipe.state_specs()] == [
        "a__offsets", "b__offsets", "watermark_ts__max_event_time", "watermark_at__max_event_time", "j__left", "j__right"
    ]  # fmt: skip
    assert all(n.tracked for n in pipe.nodes if isinstance(n, WatermarkAssigner))
    a, b = pipe.sources
    # A null key or event time is a dead letter at each source.
    assert pipe.source_keys(a) == {"k": "j", "ts": "j"} and pipe.source_keys(b) == {"k": "j", "at": "j"}
    assert pipe.side_output_names() == ["late_b"]
    assert {n.operator_id for n in pipe.nodes if isinstance(n, WatermarkAssigner)} == {"watermark_ts", "watermark_at"}


def test_one_assigner_keeps_its_maximum_in_the_checkpoint_record() -> None:
    def body(p: PipelineBuilder) -> None:
        a, _ = _sources(p)
        a.with_watermark("ts", timedelta(seconds=1)).sink_to(bf.DeltaSink.append("out"))

    pipe = _build(body)
    assert [s.table_name for s in pipe.state_specs()] == ["a__offsets", "b__offsets"]  # the sources' offsets only
    assert not any(getattr(n, "tracked", False) for n in pipe.nodes)


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("no_watermark", r"interval join 'j': input 2 has no watermark assigner upstream"),
        ("same_column", r"with_watermark\('ts'\): a watermark assigner of column 'ts' exists; give this one an operator_id"),
        ("window_on_one", r"'w' uses event time but watermark assigner\(s\) \['watermark_at'\] are not upstream of it"),
    ],
)
def test_what_event_time_with_several_inputs_refuses(case: str, match: str) -> None:
    def body(p: PipelineBuilder) -> None:
        a, b = _sources(p)
        wa = a.with_watermark("ts", timedelta(seconds=1))
        if case == "no_watermark":
            wa.key_by("k").interval_join(b.key_by("k")).between(timedelta(0), timedelta(seconds=1), operator_id="j")
        elif case == "same_column":
            a.filter("v > 0").with_watermark("ts", timedelta(seconds=1))
        else:
            b.with_watermark("at", timedelta(seconds=1))
            wa.key_by("k").window("w", bf.TumblingEventTimeWindows.of(timedelta(seconds=10)), n=bf.Count())

    with pytest.raises(PipelineDefinitionError, match=match):
        _build(body)


# -- window joins ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("assigner", "ts", "watermark_prev", "starts"),
    [
        (bf.TumblingEventTimeWindows.of(timedelta(seconds=10)), 25, None, [20]),
        (bf.TumblingEventTimeWindows.of(timedelta(seconds=10)), 25, 30, []),  # its window [20, 30) fired: late
        (bf.TumblingEventTimeWindows.of(timedelta(seconds=10)), 20, 29, [20]),
        (bf.SlidingEventTimeWindows.of(timedelta(seconds=10), timedelta(seconds=5)), 27, None, [20, 25]),
        (bf.SlidingEventTimeWindows.of(timedelta(seconds=10), timedelta(seconds=5)), 27, 30, [25]),  # [20, 30) fired
        (bf.SlidingEventTimeWindows.of(timedelta(seconds=10), timedelta(seconds=5)), 25, 35, []),
    ],
)
def test_a_record_joins_in_its_windows_that_have_not_fired(
    assigner: Any, ts: int, watermark_prev: int | None, starts: list[int]
) -> None:
    from barrierflow.operators.join_buffer import aligned_windows

    after = None if watermark_prev is None else watermark_prev * S - assigner.size_us  # not late: ending after W(n-1)
    rows, found = aligned_windows(assigner, np.array([ts * S]), np.array([True]), after)
    assert found.tolist() == [s * S for s in starts] and set(rows.tolist()) <= {0}


def test_a_window_join_of_two_watermarked_sources() -> None:
    from barrierflow.operators.window_join import WindowJoin

    def body(p: PipelineBuilder) -> None:
        a, b = _sources(p)
        (a.with_watermark("ts", timedelta(seconds=1))
          .join(b.with_watermark("at", timedelta(seconds=2)).map(user="k"))
          .where("k").equal_to("user")
          .window(bf.SlidingEventTimeWindows.of(timedelta(seconds=10), timedelta(seconds=5)), operator_id="wj",
                  left_late_output="late_a")
          .sink_to(bf.DeltaSink.append("out")))  # fmt: skip

    pipe = _build(body)
    join = next(n for n in pipe.nodes if isinstance(n, WindowJoin))
    assert (join.key, join.other_key, join.time_columns) == (("k",), ("user",), ("ts", "at"))
    assert [s.table_name for s in pipe.state_specs()][4:] == ["wj__left", "wj__right"]
    assert [f.name for f in pipe.state_specs()[4].key_fields] == ["k", "window_start", "record_epoch", "record_index"]
    a, b = pipe.sources
    assert pipe.source_keys(a) == {"k": "wj", "ts": "wj"} and pipe.source_keys(b) == {"at": "wj"}  # user is computed
    assert pipe.side_output_names() == ["late_a"]


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("session", "is not a window assigner a join can use"),
        ("no_keys", r"give both keys first: a.join\(b\).where\(k\).equal_to\(k\)"),
        ("arity", r"keyed by \['k'\] and \['k', 'v'\]"),
        ("keyed", "is not a stream of this pipeline"),
    ],
)
def test_what_a_window_join_refuses(case: str, match: str) -> None:
    def body(p: PipelineBuilder) -> None:
        a, b = _sources(p)
        a, b = a.with_watermark("ts", timedelta(seconds=1)), b.with_watermark("at", timedelta(seconds=1))
        tumbling = bf.TumblingEventTimeWindows.of(timedelta(seconds=10))
        if case == "session":
            a.join(b).where("k").equal_to("k").window(bf.EventTimeSessionWindows.with_gap(timedelta(seconds=5)), operator_id="wj")
        elif case == "no_keys":
            a.join(b).where("k").window(tumbling, operator_id="wj")
        elif case == "arity":
            a.join(b).where("k").equal_to("k", "v").window(tumbling, operator_id="wj")
        else:
            a.join(b.key_by("k")).where("k").equal_to("k").window(tumbling, operator_id="wj")  # type: ignore[arg-type]

    with pytest.raises(PipelineDefinitionError, match=match):
        _build(body)


def test_window_join_output_columns_leave_the_window_columns_to_the_join() -> None:
    with pytest.raises(PipelineDefinitionError, match=r"\['window_end'\] would appear twice"):
        output_columns(("k",), ["k", "window_end"], ["k", "v"], ("k",), reserved=["window_start", "window_end"])
