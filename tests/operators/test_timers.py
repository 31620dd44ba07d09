"""barrierflow.operators.timers: when a key's timers fire, and what the timer table keeps, through the process kernel.

Each test hands the kernel of a keyed process function records and stored
state (timers included), with the epoch's clocks, and checks the emitted
rows and the timer rows it stages against the steps in the timers module's
docstring; the last test compares several epochs with a plain-Python
reference of the same function. (Moved from tests/unit/test_timer_firing.py:
the same assertions, run through ``KeyedProcess.run``; every key is put in
key group 7, as there, so keys run in key order.)
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, NamedTuple

import pyarrow as pa
import pytest

from barrierflow.api.functions import KeyedContext, KeyedProcessFunction
from barrierflow.api.state import ValueStateDescriptor
from barrierflow.api.timers import TimeDomain, to_micros
from barrierflow.core.columns import KEY_GROUP
from barrierflow.core.errors import PipelineDefinitionError, UserFunctionError
from barrierflow.operators.process import KeyedProcess
from barrierflow.operators.timers import TIMER_DOMAIN, TIMER_STATE, TIMER_TIMESTAMP, due_timer_mask, timer_spec
from harness import KernelRun, live_state, node_specs, run_both, run_kernel, upstream

# run_both's split: 4 tasks of the 8 key groups (execution.exchange.owner_of routes a key group to another
# task than key_group_ranges gives it when the tasks do not divide the key groups: reported to the lead).
TASKS = 4
T0 = datetime(2024, 3, 1, tzinfo=timezone.utc)
US = pa.timestamp("us", tz="UTC")
Out = Callable[[dict[str, Any]], None]


class EpochClocks(NamedTuple):
    """The epoch's number and clocks, as its keys see them: P(n), W(n-1) and W(n)."""

    epoch: int
    processing_time_ms: int
    watermark_prev_us: int | None = None
    watermark_us: int | None = None


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


def _node(fn: KeyedProcessFunction) -> KeyedProcess:
    return KeyedProcess(operator_id="p", parent=upstream(), key=("user",), function=fn)


def _state(fn: KeyedProcessFunction, last: dict[str, float], timers: list[tuple[str, TimeDomain, int]]) -> dict[str, pa.Table]:
    """Stored state as the operator's tables hold it: one row per state value (``last``), one per timer."""
    tables = {}
    if any(d.name == "last" for d in fn.state_descriptors):
        tables["p__last"] = pa.Table.from_pylist(
            [
                {"user": u, KEY_GROUP: 7, "value": T0 + timedelta(seconds=s), "_deleted": False, "_epoch": 0}
                for u, s in last.items()
            ]
        )
    tables["p__timers"] = pa.table({
        "user": pa.array([u for u, _, _ in timers], pa.string()),
        KEY_GROUP: pa.array([7] * len(timers), pa.int32()),
        TIMER_DOMAIN: pa.array([d.value for _, d, _ in timers], pa.string()),
        TIMER_TIMESTAMP: pa.array([ts for _, _, ts in timers], pa.int64()).cast(US),
    })  # fmt: skip
    return tables


def _kernel(fn: KeyedProcessFunction, records: pa.Table, state: dict[str, pa.Table], clocks: EpochClocks) -> KernelRun:
    return run_kernel(
        _node(fn), [records], state=state, epoch=clocks.epoch, processing_time_ms=clocks.processing_time_ms,
        watermark_prev_us=clocks.watermark_prev_us, watermark_us=clocks.watermark_us,
    )  # fmt: skip


def _timer_rows(run: KernelRun) -> list[dict[str, Any]]:
    """The timer changes staged, their timestamps in microseconds."""
    changes = run.changes["p__timers"]
    return changes.set_column(changes.column_names.index(TIMER_TIMESTAMP), TIMER_TIMESTAMP,
                              changes.column(TIMER_TIMESTAMP).cast(pa.int64())).to_pylist()  # fmt: skip


def _run(
    fn: KeyedProcessFunction, records: pa.Table, state: dict[str, pa.Table], clocks: EpochClocks
) -> tuple[list[tuple[Any, ...]], dict[tuple[str, str, int], bool]]:
    """Emitted rows as (user, what, seconds, watermark seconds), and the timer rows staged: (user, domain, ts) -> deleted."""
    run = _kernel(fn, records, state, clocks)

    def secs(value: datetime | None) -> float | None:
        return None if value is None else (value - T0).total_seconds()

    emitted = [(r["user"], r["what"], secs(r["at"]), secs(r["watermark"])) for r in run.output.to_pylist()]
    timers = {(r["user"], r[TIMER_DOMAIN], r[TIMER_TIMESTAMP]): r["_deleted"] for r in _timer_rows(run)}
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
    run = _kernel(fn, records, stored, EpochClocks(2, p_ms, us(0), us(10)))
    fired = [(r["domain"], (r["at"] - T0).total_seconds()) for r in run.output.to_pylist()]
    assert fired == [
        ("event_time", 4), ("event_time", 6),  # 5 s was deleted; 4 s registered twice fires once
        ("processing_time", 1), ("event_time", 0), ("processing_time", 2),  # 3 s is after P(n)
    ]  # fmt: skip
    timers = {(r[TIMER_DOMAIN], r[TIMER_TIMESTAMP]): r["_deleted"] for r in _timer_rows(run)}
    assert timers == {("event_time", us(6)): True, ("event_time", us(50)): False, ("processing_time", us(3)): False}


def test_timer_misuse_is_a_clear_error() -> None:
    class NoOnTimer(KeyedProcessFunction):
        output_schema = pa.schema([("user", pa.string())])

        def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Out) -> None:
            ctx.timer_service().register_event_time_timer(record["ts"])

    assert not NoOnTimer.uses_timers() and Inactivity.uses_timers()
    with pytest.raises(PipelineDefinitionError, match="does not implement on_timer"):
        _kernel(NoOnTimer(), _records([("a", 0)]), {}, EpochClocks(1, 0, None, None))

    class Naive(Inactivity):
        def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Out) -> None:
            ctx.timer_service().register_event_time_timer(datetime(2024, 1, 1))

    with pytest.raises(UserFunctionError, match="no time zone"):
        _run(Naive(), _records([("a", 0)]), _state(Naive(), {}, []), EpochClocks(1, 0, None, None))

    class NamedTimers(Inactivity):
        timers = ValueStateDescriptor("timers", pa.int64())

    with pytest.raises(PipelineDefinitionError, match="'timers' is the table of the function's timers"):
        KeyedProcess(operator_id="p", parent=None, key=("user",), function=NamedTimers())
    assert [s.name for s in KeyedProcess(operator_id="p", parent=None, key=("user",), function=Inactivity()).state_specs()] == [
        "last",
        "timers",
    ]


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
        run = _kernel(fn, _records(rows), state, EpochClocks(n, 0, None if previous is None else us(previous), us(watermark)))
        previous = watermark
        # The epoch's output and state changes, applied as a commit would.
        got += [(r["user"], r["what"], (r["at"] - T0).total_seconds()) for r in run.output.to_pylist()]
        for r in run.changes["p__last"].to_pylist():
            if r["_deleted"]:
                last.pop(r["user"], None)
            else:
                last[r["user"]] = (r["value"] - T0).total_seconds()
        for r in _timer_rows(run):
            (timers.discard if r["_deleted"] else timers.add)((r["user"], r[TIMER_DOMAIN], r[TIMER_TIMESTAMP]))
    assert sorted(got) == sorted(_reference(epochs))
    assert any(what == "reminder" for _, what, _ in got)  # the input exercises cascades


# -- contract: the timer table and due timers across placements -----------------------------------------------


def test_the_timer_table_is_keyed_by_the_key_then_domain_and_timestamp() -> None:
    spec = timer_spec("p", (pa.field("user", pa.int64()),))
    assert spec.table_name == "p__timers" and spec.name == TIMER_STATE
    assert spec.arrow_schema().names == [
        "user",
        "timer_domain",
        "timer_timestamp",
        "_key_group",
        "_updated_at_ms",
        "_deleted",
        "_epoch",
    ]
    assert spec.arrow_schema().field(TIMER_TIMESTAMP).type == US
    with pytest.raises(PipelineDefinitionError, match="clash with the timer table's own columns"):
        timer_spec("p", (pa.field("timer_domain", pa.string()),))


def test_due_timers_are_event_time_at_or_below_w_n_and_processing_time_at_or_below_p_n() -> None:
    timers = pa.table({
        TIMER_DOMAIN: ["event_time", "event_time", "processing_time", "processing_time"],
        TIMER_TIMESTAMP: pa.array([10, 11, 2_000, 2_001], pa.int64()).cast(US),
    })  # fmt: skip
    assert due_timer_mask(timers, 10, 2).to_pylist() == [True, False, True, False]
    assert due_timer_mask(timers, None, 2).to_pylist() == [False, False, True, False]


def test_keys_of_many_key_groups_fire_their_due_timers_in_whichever_task_holds_them() -> None:
    """A key with only a due timer runs in the task holding its key group; nothing is lost or doubled across placements."""
    fn = Inactivity()
    node = _node(fn)
    records = _records([("u0", 0.0)]).drop_columns([KEY_GROUP])
    [last_spec, timer_table] = node_specs(node, [records]).values()
    # Two epochs: users u0..u9 seen in the first (W(1) = 1 s), then only u0 in the second (W(2) = 30 s).
    first = run_both(node, tasks=TASKS, inputs=[_records([(f"u{i}", float(i)) for i in range(10)]).drop_columns([KEY_GROUP])],
                     epoch=1, watermark_us=us(1))  # fmt: skip
    state = {
        last_spec.table_name: live_state(last_spec, None, first.changes[last_spec.table_name], epoch=1),
        timer_table.table_name: live_state(timer_table, None, first.changes[timer_table.table_name], epoch=1),
    }
    second = run_both(node, tasks=TASKS, inputs=[_records([("u0", 25.0)]).drop_columns([KEY_GROUP])], state=state, epoch=2,
                      watermark_prev_us=us(1), watermark_us=us(30))  # fmt: skip
    whats = sorted((r["user"], r["what"], (r["at"] - T0).total_seconds()) for r in second.output.to_pylist())
    # Users 1-9: idle at i + 10 s, then a reminder 5 s later if still <= 30 s. User 0 saw a record at 25 s.
    expected = [("u0", "seen", 25.0)]
    for i in range(1, 10):
        expected.append((f"u{i}", "idle", i + 10.0))
        if i + 15 <= 30:
            expected.append((f"u{i}", "reminder", i + 15.0))
    assert whats == sorted(expected)
    changes = _timer_rows(second)
    # Every reminder came and went within the epoch: only u0's new timer is left; the fired ones and u0's replaced one go.
    assert {(r["user"], r[TIMER_TIMESTAMP]) for r in changes if not r["_deleted"]} == {("u0", us(35))}
    assert {(r["user"], r[TIMER_TIMESTAMP]) for r in changes if r["_deleted"]} == {(f"u{i}", us(i + 10)) for i in range(10)}
