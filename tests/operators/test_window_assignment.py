"""Window assigners and window declarations, without Spark: which windows a record joins, what is refused, state and outputs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable

import pyarrow as pa
import pytest

import barrierflow as bf
from barrierflow.operators.window import AlignedWindow, SessionWindow

SCHEMA = pa.schema([("k", pa.string()), ("ts", pa.timestamp("us", tz="UTC")), ("v", pa.float64())])
S = 1_000_000  # microseconds per second


def build(body: Callable[[bf.KeyedStream], Any]) -> bf.Pipeline:
    @bf.pipeline("windows_pipe")
    def definition(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
        body(p.source(bf.FileSource("events", "/nonexistent", schema=SCHEMA)).with_watermark("ts", timedelta(0)).key_by("k"))

    return definition.build({})


# -- assignment ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ts", "expected"),
    [
        (0, [(0, 10)]),
        (9, [(0, 10)]),
        (10, [(10, 20)]),
        (-1, [(-10, 0)]),  # before 1970: still aligned to multiples of the size (a floor, not a truncation)
    ],
)
def test_tumbling_windows_are_aligned_to_the_unix_epoch(ts: int, expected: list[tuple[int, int]]) -> None:
    assigner = bf.TumblingEventTimeWindows.of(timedelta(seconds=10))
    assert assigner.windows(ts * S) == [(a * S, b * S) for a, b in expected]


@pytest.mark.parametrize(
    ("size", "slide", "ts", "expected"),
    [
        (10, 5, 12, [(10, 20), (5, 15)]),
        (10, 5, 10, [(10, 20), (5, 15)]),
        (10, 5, 9, [(5, 15), (0, 10)]),
        # A slide that does not divide the size: ceil(10 / 4) = 3 windows at most, only those holding ts.
        (10, 4, 9, [(8, 18), (4, 14), (0, 10)]),
        (10, 4, 10, [(8, 18), (4, 14)]),
        (10, 4, -1, [(-4, 6), (-8, 2)]),
        (10, 10, 7, [(0, 10)]),  # slide == size: tumbling
    ],
)
def test_sliding_windows_are_every_aligned_window_holding_the_timestamp(
    size: int, slide: int, ts: int, expected: list[tuple[int, int]]
) -> None:
    assigner = bf.SlidingEventTimeWindows.of(timedelta(seconds=size), timedelta(seconds=slide))
    windows = assigner.windows(ts * S)
    assert windows == [(a * S, b * S) for a, b in expected]
    assert all(start <= ts * S < end and start % (slide * S) == 0 for start, end in windows)


def test_a_session_record_opens_its_own_window_of_the_gap() -> None:
    assert bf.EventTimeSessionWindows.with_gap(timedelta(seconds=30)).windows(7 * S) == [(7 * S, 37 * S)]


def test_durations_are_exact_microseconds() -> None:
    """No float seconds: a long size converts exactly."""
    big = timedelta(days=10_000, microseconds=1)
    assert bf.TumblingEventTimeWindows.of(big).size_us == 10_000 * 86_400 * S + 1


# -- declarations refused ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: bf.TumblingEventTimeWindows.of(timedelta(0)), r"tumbling window size must be a positive timedelta, got"),
        (lambda: bf.TumblingEventTimeWindows.of(timedelta(seconds=-1)), "tumbling window size must be a positive timedelta"),
        (lambda: bf.TumblingEventTimeWindows.of(60), r"tumbling window size must be a datetime.timedelta, got 60"),  # type: ignore[arg-type]
        (lambda: bf.SlidingEventTimeWindows.of(timedelta(0), timedelta(seconds=1)), "sliding window size must be a positive"),
        (lambda: bf.SlidingEventTimeWindows.of(timedelta(seconds=10), timedelta(0)), "sliding window slide must be a positive"),
        (
            lambda: bf.SlidingEventTimeWindows.of(timedelta(seconds=10), timedelta(seconds=11)),
            r"slide 0:00:11 is larger than its size 0:00:10: records between two windows would belong to none; "
            r"give a slide at most the size",
        ),
        (lambda: bf.EventTimeSessionWindows.with_gap(timedelta(0)), "session window gap must be a positive timedelta"),
        (lambda: bf.EventTimeSessionWindows.with_gap(timedelta(seconds=1), ""), "time_column must be a column name"),
    ],
)
def test_assigners_refuse_what_no_window_can_use(make: Callable[[], Any], match: str) -> None:
    with pytest.raises(bf.PipelineDefinitionError, match=match):
        make()


def test_lateness_must_be_a_non_negative_timedelta() -> None:
    tumbling = bf.TumblingEventTimeWindows.of(timedelta(minutes=1))
    with pytest.raises(bf.PipelineDefinitionError, match=r"window 'w': allowed_lateness must be zero or positive, got"):
        build(lambda s: s.window("w", tumbling, n=bf.Count(), allowed_lateness=timedelta(seconds=-1)))
    with pytest.raises(
        bf.PipelineDefinitionError, match=r"allowed_lateness must be a datetime.timedelta \(zero or positive\), got 5"
    ):
        build(lambda s: s.window("w", tumbling, n=bf.Count(), allowed_lateness=5))


def test_an_unknown_assigner_is_refused_naming_the_choices() -> None:
    with pytest.raises(
        bf.PipelineDefinitionError, match=r"window 'w': 60 is not a window assigner; give TumblingEventTimeWindows"
    ):
        build(lambda s: s.window("w", 60, n=bf.Count()))


def test_update_columns_are_reserved_only_with_lateness() -> None:
    session = bf.EventTimeSessionWindows.with_gap(timedelta(minutes=1))
    build(lambda s: s.window("w", session, is_update=bf.Count()))  # no lateness: an ordinary name
    with pytest.raises(bf.PipelineDefinitionError, match=r"\['is_update'\] are not allowed"):
        build(lambda s: s.window("w", session, is_update=bf.Count(), allowed_lateness=timedelta(seconds=1)))
    with pytest.raises(bf.PipelineDefinitionError, match=r"\['retracted'\] are not allowed"):
        build(lambda s: s.window("w", session, retracted=bf.Count(), allowed_lateness=timedelta(seconds=1)))


# -- operators, state and outputs ----------------------------------------------------------------------


def test_tumbling_windows_without_lateness_keep_their_state_and_outputs() -> None:
    """State table and output columns exactly as before allowed lateness existed (sensor_stats relies on them)."""
    node = build(lambda s: s.window("w", bf.TumblingEventTimeWindows.of(timedelta(minutes=1)), n=bf.Count())).nodes[2]
    assert isinstance(node, AlignedWindow)
    (spec,) = node.state_specs()
    assert spec.table_name == "w__pending_windows"
    assert spec.key_columns == ["k", "window_start"]
    assert spec.value_fields == (pa.field("window_values", pa.list_(pa.float64())),)
    assert node.extra_output_columns() == ()


def test_lateness_keeps_fired_windows_and_marks_updates() -> None:
    sliding = bf.SlidingEventTimeWindows.of(timedelta(minutes=10), timedelta(minutes=5))
    node = build(lambda s: s.window("w", sliding, n=bf.Count(), allowed_lateness=timedelta(minutes=1))).nodes[2]
    assert isinstance(node, AlignedWindow) and node.lateness_us == 60 * S
    (spec,) = node.state_specs()
    assert spec.value_columns == ["window_values", "fired"]
    assert node.extra_output_columns() == ("is_update",)


def test_session_state_keeps_each_value_with_its_arrival() -> None:
    session = bf.EventTimeSessionWindows.with_gap(timedelta(minutes=1))
    plain = build(lambda s: s.window("w", session, total=bf.Sum("v"), late_output="late")).nodes[2]
    late = build(lambda s: s.window("w", session, total=bf.Sum("v"), allowed_lateness=timedelta(seconds=1))).nodes[2]
    assert isinstance(plain, SessionWindow) and plain.side_outputs() == ["late"]
    (spec,) = plain.state_specs()
    assert spec.table_name == "w__sessions" and spec.key_columns == ["k", "window_start"]
    value = pa.struct([("epoch", pa.int64()), ("position", pa.int64()), ("value", pa.float64())])
    assert spec.value_fields == (pa.field("window_end", pa.timestamp("us", tz="UTC")), pa.field("window_values", pa.list_(value)))
    assert plain.extra_output_columns() == ()
    assert late.state_specs()[0].value_columns == ["window_end", "window_values", "fired"]
    assert late.extra_output_columns() == ("is_update", "retracted")
