"""barrierflow.operators.timers: when a key group's timers fire, and what it stores, without Spark.

Each test hands one key group's records and stored state (timers included)
to the process operator's key-group function, with the epoch's clocks, and
checks the emitted rows and the timer rows it stages against the steps in
the timers module's docstring; the last test compares several epochs with
a plain-Python reference of the same function.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pyarrow as pa
import pytest

from barrierflow.api.state import ValueStateDescriptor
from barrierflow.core.errors import PipelineDefinitionError, UserFunctionError
from barrierflow.operators.process import (
    _TIMER_DOMAIN,
    _TIMER_TS,
    KeyedContext,
    KeyedProcess,
    KeyedProcessFunction,
    _run_key_group,
    _state_column,
)
from barrierflow.operators.timers import TIMER_STATE, EpochClocks, TimeDomain, to_micros
from barrierflow.state.spec import KEY_GROUP

T0 = datetime(2024, 3, 1, tzinfo=timezone.utc)
US = pa.timestamp("us", tz="UTC")
Out = Callable[[dict[str, Any]], None]


def us(seconds: float) -> int:
    return to_micros(T0 + timedelta(seconds=seconds), "test")


class Inactivity(KeyedProcessFunction):
    """Emits "idle" when a user has no record for 10 s of event time (the last record's timer replaces the one before).

    A firing also registers a reminder 5 s later, which fires in the same
    epoch if the watermark has passed it (a cascade).
    """

    last = ValueStateDescriptor("last", US)
    output_schema = pa.schema([("user", pa.string()), ("what", pa.string()), ("at", US), ("watermark", US)])

    def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Out) -> None:
        last, timers = ctx.get_state(self.last), ctx.timer_service()
        if last.value() is not None:
            timers.delete_event_time_timer(last.value() + timedelta(seconds=10))
        last.update(record["ts"])
        timers.register_event_time_timer(record["ts"] + timedelta(seconds=10))
        out({"user": record["user"], "what": "seen", "at": record["ts"], "watermark": timers.current_watermark()})

    def on_timer(self, timestamp: datetime, ctx: KeyedContext, out: Out) -> None:
        assert ctx.time_domain is TimeDomain.EVENT_TIME
        last, timers = ctx.get_state(self.last), ctx.timer_service()
        if last.value() is not None:
            out({"user": ctx.key[0], "what": "idle", "at": timestamp, "watermark": timers.current_watermark()})
            last.clear()
            timers.register_event_time_timer(timestamp + timedelta(seconds=5))
        else:
            out({"user": ctx.key[0], "what": "reminder", "at": timestamp, "watermark": timers.current_watermark()})


def _records(rows: list[tuple[str, float]]) -> pa.Table:
    return pa.table(
        {
            "user": pa.array([u for u, _ in rows], pa.string()),
            "ts": pa.array([T0 + timedelta(seconds=s) for _, s in rows], US),
            "_seq": pa.array(range(len(rows)), pa.int64()),
            KEY_GROUP: pa.array([7] * len(rows), pa.int32()),
        }
    )


def _state(fn: KeyedProcessFunction, last: dict[str, float], timers: list[tuple[str, TimeDomain, int]]) -> pa.Table:
    """Stored state as the operator hands it over: one row per state value, one per timer."""
    names = [d.name for d in fn.state_descriptors]
    rows: list[dict[str, Any]] = [
        {"user": u, KEY_GROUP: 7, _state_column("last"): T0 + timedelta(seconds=s)} for u, s in last.items()
    ]
    rows += [{"user": u, KEY_GROUP: 7, _TIMER_DOMAIN: d.value, _TIMER_TS: ts} for u, d, ts in timers]
    schema = pa.schema(
        [("user", pa.string()), (KEY_GROUP, pa.int32()), *[(_state_column(n), d.value_type) for n, d in zip(names, fn.state_descriptors)],
         (_TIMER_DOMAIN, pa.string()), (_TIMER_TS, pa.int64())]
    )  # fmt: skip
    return pa.Table.from_pylist(rows, schema=schema)


def _out_schema(fn: KeyedProcessFunction) -> pa.Schema:
    return pa.schema(
        [
            ("_kind", pa.string()), ("user", pa.string()), (KEY_GROUP, pa.int32()),
            *[(_state_column(d.name), d.value_type) for d in fn.state_descriptors],
            (_TIMER_DOMAIN, pa.string()), (_TIMER_TS, pa.int64()), ("_deleted", pa.bool_()),
            *[(f"_out_{f.name}", f.type) for f in fn.output_schema],
        ]
    )  # fmt: skip


def _run(fn: KeyedProcessFunction, records: pa.Table, state: pa.Table, clocks: EpochClocks) -> tuple[list[tuple[Any, ...]], dict[tuple[str, str, int], bool]]:
    """Emitted rows as (user, what, seconds, watermark seconds), and the timer rows staged: (user, domain, ts) -> deleted."""
    out = _run_key_group(fn, ["user"], records, state, _out_schema(fn), clocks).to_pylist()

    def secs(value: datetime | None) -> float | None:
        return None if value is None else (value - T0).total_seconds()

    emitted = [(r["user"], r["_out_what"], secs(r["_out_at"]), secs(r["_out_watermark"])) for r in out if r["_kind"] == "_out"]
    timers = {(r["user"], r[_TIMER_DOMAIN], r[_TIMER_TS]): r["_deleted"] for r in out if r["_kind"] == TIMER_STATE}
    return emitted, timers


def test_records_see_the_previous_watermark_then_due_timers_fire_in_order_with_cascades() -> None:
    fn = Inactivity()
    records = _records([("a", 0), ("b", 3), ("a", 4), ("b", 30)])
    # W(n-1) = 1 s, W(n) = 20 s: a's timer at 14 s fires (its 10 s timer was replaced), then the
    # reminder it registers at 19 s fires too; b's at 40 s stays (its 13 s timer was deleted).
    emitted, timers = _run(fn, records, _state(fn, {}, []), EpochClocks(3, 0, us(1), us(20)))
    assert emitted == [
        ("a", "seen", 0, 1), ("a", "seen", 4, 1), ("a", "idle", 14, 20), ("a", "reminder", 19, 20),
        ("b", "seen", 3, 1), ("b", "seen", 30, 1),
    ]  # fmt: skip
    # Only the timer left at the end is stored; ones registered and gone within the epoch leave no row.
    assert timers == {("b", "event_time", us(40)): False}


def test_a_key_without_records_fires_its_stored_due_timer_with_its_state() -> None:
    fn = Inactivity()
    state = _state(fn, {"c": 5}, [("c", TimeDomain.EVENT_TIME, us(15)), ("d", TimeDomain.EVENT_TIME, us(99))])
    emitted, timers = _run(fn, _records([]), state, EpochClocks(4, 0, us(10), us(22)))
    # The reminder the firing registers at 20 s is due too (W = 22); d's timer is not due: d is not run.
    assert emitted == [("c", "idle", 15, 22), ("c", "reminder", 20, 22)]
    # The fired timer is removed; the reminder came and went within the epoch, so it leaves no row.
    assert timers == {("c", "event_time", us(15)): True}


def test_no_key_group_work_without_records_or_due_timers() -> None:
    fn = Inactivity()
    state = _state(fn, {"c": 5}, [("c", TimeDomain.EVENT_TIME, us(15))])
    assert _run(fn, _records([]), state, EpochClocks(4, 0, us(10), us(14))) == ([], {})


def test_without_a_watermark_event_time_timers_never_fire() -> None:
    fn = Inactivity()
    emitted, timers = _run(fn, _records([("a", 0)]), _state(fn, {}, []), EpochClocks(1, 0, None, None))
    assert [e[1] for e in emitted] == ["seen"]
    assert timers == {("a", "event_time", us(10)): False}


class Reminders(KeyedProcessFunction):
    """Processing-time and event-time timers from one record's fields; deletes on request."""

    output_schema = pa.schema([("user", pa.string()), ("domain", pa.string()), ("at", US)])

    def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Out) -> None:
        timers = ctx.timer_service()
        for ms in record["processing"]:
            timers.register_processing_time_timer(ms)  # int: milliseconds, as Flink's
        for seconds in record["event"]:
            timers.register_event_time_timer(T0 + timedelta(seconds=seconds))
        for seconds in record["forget"]:
            timers.delete_event_time_timer(T0 + timedelta(seconds=seconds))

    def on_timer(self, timestamp: datetime, ctx: KeyedContext, out: Out) -> None:
        assert ctx.time_domain is not None
        out({"user": ctx.key[0], "domain": ctx.time_domain.value, "at": timestamp})
        if ctx.time_domain is TimeDomain.PROCESSING_TIME and timestamp == T0 + timedelta(seconds=1):
            ctx.timer_service().register_event_time_timer(T0)  # due: fires right after, before the next processing-time timer


def test_event_time_timers_fire_before_processing_time_timers_and_deletes_and_duplicates_hold() -> None:
    fn = Reminders()
    p_ms = us(2) // 1000
    records = pa.table(
        {
            "user": ["a", "a"],
            "processing": [[us(2) // 1000, us(1) // 1000, us(3) // 1000], [us(1) // 1000]],
            "event": [[5.0, 4.0, 50.0], [4.0]],
            "forget": [[], [5.0, 77.0]],
            "_seq": pa.array([0, 1], pa.int64()),
            KEY_GROUP: pa.array([7, 7], pa.int32()),
        }
    )
    stored = _state(fn, {}, [("a", TimeDomain.EVENT_TIME, us(6)), ("a", TimeDomain.EVENT_TIME, us(60))])
    out = _run_key_group(fn, ["user"], records, stored, _out_schema(fn), EpochClocks(2, p_ms, us(0), us(10))).to_pylist()
    fired = [(r["_out_domain"], (r["_out_at"] - T0).total_seconds()) for r in out if r["_kind"] == "_out"]
    assert fired == [
        ("event_time", 4), ("event_time", 6),  # 5 s was deleted; 4 s registered twice fires once
        ("processing_time", 1), ("event_time", 0), ("processing_time", 2),  # 3 s is after P(n)
    ]  # fmt: skip
    timers = {(r[_TIMER_DOMAIN], r[_TIMER_TS]): r["_deleted"] for r in out if r["_kind"] == TIMER_STATE}
    assert timers == {("event_time", us(6)): True, ("event_time", us(50)): False, ("processing_time", us(3)): False}


def test_timer_misuse_is_a_clear_error() -> None:
    class NoOnTimer(KeyedProcessFunction):
        output_schema = pa.schema([("user", pa.string())])

        def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Out) -> None:
            ctx.timer_service().register_event_time_timer(record["ts"])

    assert not NoOnTimer.uses_timers() and Inactivity.uses_timers()
    with pytest.raises(PipelineDefinitionError, match="does not implement on_timer"):
        _run_key_group(NoOnTimer(), ["user"], _records([("a", 0)]), pa.table({"user": pa.array([], pa.string()), KEY_GROUP: pa.array([], pa.int32())}),
                       pa.schema([("_kind", pa.string()), ("user", pa.string()), (KEY_GROUP, pa.int32()), ("_deleted", pa.bool_()), ("_out_user", pa.string())]),
                       EpochClocks(1, 0, None, None))  # fmt: skip

    class Naive(Inactivity):
        def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Out) -> None:
            ctx.timer_service().register_event_time_timer(datetime(2024, 1, 1))

    with pytest.raises(UserFunctionError, match="no time zone"):
        _run(Naive(), _records([("a", 0)]), _state(Naive(), {}, []), EpochClocks(1, 0, None, None))

    class NamedTimers(Inactivity):
        timers = ValueStateDescriptor("timers", pa.int64())

    with pytest.raises(PipelineDefinitionError, match="'timers' is the table of the function's timers"):
        KeyedProcess(operator_id="p", parent=None, key=("user",), function=NamedTimers())
    assert [s.name for s in KeyedProcess(operator_id="p", parent=None, key=("user",), function=Inactivity()).state_specs()] == ["last", "timers"]


def _reference(epochs: list[tuple[list[tuple[str, float]], float]]) -> list[tuple[str, str, float]]:
    """Plain Python: Inactivity's outputs over epochs of (records, W(n) in seconds), written from its description."""
    last: dict[str, float] = {}
    pending: dict[str, set[float]] = {}
    out = []
    for records, watermark in epochs:
        for user, ts in sorted(records, key=lambda r: r[0]):  # stable: arrival order per user
            if user in last:
                pending[user].discard(last[user] + 10)
            last[user] = ts
            pending.setdefault(user, set()).add(ts + 10)
            out.append((user, "seen", ts))
        for user in sorted(pending):
            while due := [t for t in pending[user] if t <= watermark]:
                t = min(due)
                pending[user].discard(t)
                if user in last:
                    out.append((user, "idle", t))
                    del last[user]
                    pending[user].add(t + 5)
                else:
                    out.append((user, "reminder", t))
    return out


def test_several_epochs_match_a_plain_python_reference() -> None:
    rng = random.Random(11)
    fn = Inactivity()
    epochs, clock = [], 0.0
    for _ in range(6):
        records = [(rng.choice("pqrs"), clock + rng.randrange(0, 20)) for _ in range(rng.randrange(0, 6))]
        clock += 12
        epochs.append((records, clock))
    last: dict[str, float] = {}
    timers: set[tuple[str, str, int]] = set()
    got = []
    previous: float | None = None
    for n, (rows, watermark) in enumerate(epochs, start=1):
        state = _state(fn, last, [(u, TimeDomain(d), ts) for u, d, ts in sorted(timers)])
        out = _run_key_group(fn, ["user"], _records(rows), state, _out_schema(fn),
                             EpochClocks(n, 0, None if previous is None else us(previous), us(watermark))).to_pylist()  # fmt: skip
        previous = watermark
        for r in out:  # the epoch's output and state changes, applied as a commit would
            if r["_kind"] == "_out":
                got.append((r["user"], r["_out_what"], (r["_out_at"] - T0).total_seconds()))
            elif r["_kind"] == "last":
                if r["_deleted"]:
                    last.pop(r["user"], None)
                else:
                    last[r["user"]] = (r[_state_column("last")] - T0).total_seconds()
            elif r["_kind"] == TIMER_STATE:
                (timers.discard if r["_deleted"] else timers.add)((r["user"], r[_TIMER_DOMAIN], r[_TIMER_TS]))
    assert sorted(got) == sorted(_reference(epochs))
    assert any(what == "reminder" for _, what, _ in got)  # the input exercises cascades
