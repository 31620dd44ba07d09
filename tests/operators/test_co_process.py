"""Keyed co-process functions: the declaration, the order both sides run in, shared state and timers, across placements.

The first tests are tests/unit/test_co_process_order.py's (same assertions;
the kernel now takes the two inputs' records as they are, every record in
key group 3 as there).
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa
import pytest

import barrierflow as bf
from barrierflow.api.functions import KeyedContext, KeyedCoProcessFunction
from barrierflow.api.state import ValueStateDescriptor
from barrierflow.core.columns import KEY_GROUP
from barrierflow.core.errors import PipelineDefinitionError, UserFunctionError
from barrierflow.operators.base import Exchange
from barrierflow.operators.co_process import KeyedCoProcess
from barrierflow.operators.timers import TIMER_TIMESTAMP
from harness import live_state, node_specs, run_both, run_kernel, upstream

if TYPE_CHECKING:
    from barrierflow.plan.pipeline import Pipeline, PipelineBuilder

# run_both's split: 4 tasks of the 8 key groups (execution.exchange.owner_of routes a key group to another
# task than key_group_ranges gives it when the tasks do not divide the key groups: reported to the lead).
TASKS = 4
T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
US = pa.timestamp("us", tz="UTC")
ORDERS = pa.schema([("k", pa.string()), ("qty", pa.int64()), ("ts", US), ("_seq", pa.int64())])
PAYMENTS = pa.schema([("k", pa.string()), ("amount", pa.float64()), ("ts", US), ("_seq", pa.int64())])
Out = Callable[[dict[str, Any]], None]


def us(seconds: float) -> int:
    """Microseconds since the Unix epoch of ``seconds`` after T0."""
    return int((T0.timestamp() + seconds) * 1_000_000)


class Ledger(KeyedCoProcessFunction):
    """Orders (side 1) and payments (side 2) of a key share one balance; a payment schedules a statement 10 s later."""

    balance = ValueStateDescriptor("balance", pa.float64())
    output_schema = pa.schema([("k", pa.string()), ("what", pa.string()), ("balance", pa.float64())])

    def process_element1(self, record: dict[str, Any], ctx: KeyedContext, out: Out) -> None:
        balance = ctx.get_state(self.balance)
        balance.update((balance.value() or 0.0) - record["qty"])
        out({"k": ctx.key[0], "what": f"order {record['qty']}", "balance": balance.value()})

    def process_element2(self, record: dict[str, Any], ctx: KeyedContext, out: Out) -> None:
        balance = ctx.get_state(self.balance)
        balance.update((balance.value() or 0.0) + record["amount"])
        out({"k": ctx.key[0], "what": f"payment {record['amount']:g}", "balance": balance.value()})
        ctx.timer_service().register_event_time_timer(record["ts"] + timedelta(seconds=10))

    def on_timer(self, timestamp: datetime, ctx: KeyedContext, out: Out) -> None:
        out(
            {
                "k": ctx.key[0],
                "what": f"statement at {(timestamp - T0).total_seconds():g}",
                "balance": ctx.get_state(self.balance).value(),
            }
        )


def _node(key: tuple[str, ...] = ("k",), other_key: tuple[str, ...] = ("k",)) -> KeyedCoProcess:
    return KeyedCoProcess(
        operator_id="ledger",
        parent=upstream("orders"),
        key=key,
        function=Ledger(),
        other=upstream("payments"),
        other_key=other_key,
    )


def _records(rows: list[tuple[int, str, int, float, float]], key_group: int | None = 3) -> list[pa.Table]:
    """Each side's records from (side, key, _seq, value, seconds), in any order; in ``key_group`` (None: their own)."""
    orders = [{"k": k, "qty": int(v), "ts": T0 + timedelta(seconds=s), "_seq": seq} for side, k, seq, v, s in rows if side == 1]
    payments = [{"k": k, "amount": v, "ts": T0 + timedelta(seconds=s), "_seq": seq} for side, k, seq, v, s in rows if side == 2]
    tables = [pa.Table.from_pylist(orders, schema=ORDERS), pa.Table.from_pylist(payments, schema=PAYMENTS)]
    if key_group is None:
        return tables
    return [t.append_column(KEY_GROUP, pa.array([key_group] * t.num_rows, pa.int32())) for t in tables]


def _state(balances: dict[str, float]) -> dict[str, pa.Table]:
    rows = [{"k": k, KEY_GROUP: 3, "value": b} for k, b in balances.items()]
    return {
        "ledger__balance": pa.Table.from_pylist(
            rows, schema=pa.schema([("k", pa.string()), (KEY_GROUP, pa.int32()), ("value", pa.float64())])
        )
    }


def test_both_sides_run_per_key_by_arrival_position_side_1_first_at_a_tie_with_shared_state_and_timers() -> None:
    records = _records([
        (2, "a", 5, 10.0, 5), (1, "b", 1, 2, 1), (1, "a", 7, 3, 7), (2, "a", 2, 4.0, 2),
        (2, "b", 4, 1.0, 4), (1, "b", 4, 6, 4),  # the same position on both sides: the order (side 1) first
    ])  # fmt: skip
    run = run_kernel(_node(), records, state=_state({"a": 100.0}), epoch=2, watermark_prev_us=us(0), watermark_us=us(14))
    emitted = [(r["k"], r["what"], r["balance"]) for r in run.output.to_pylist()]
    assert emitted == [
        ("a", "payment 4", 104.0), ("a", "payment 10", 114.0), ("a", "order 3", 111.0),
        ("a", "statement at 12", 111.0),  # W(n) = 14 s passes the first payment's timer only
        ("b", "order 2", -2.0), ("b", "order 6", -8.0), ("b", "payment 1", -7.0),
        ("b", "statement at 14", -7.0),
    ]  # fmt: skip
    states = {r["k"]: r["value"] for r in run.changes["ledger__balance"].to_pylist()}
    assert states == {"a": 111.0, "b": -7.0}
    timers = {(r["k"], r[TIMER_TIMESTAMP], r["_deleted"]) for r in run.changes["ledger__timers"].to_pylist()}
    assert timers == {("a", T0 + timedelta(seconds=15), False)}  # left for a later epoch (us(15))


SCHEMA = pa.schema([pa.field("k", pa.string()), pa.field("ts", US), pa.field("v", pa.float64())])


def _build(body: Callable[["PipelineBuilder"], None]) -> "Pipeline":
    @bf.pipeline("unit_connect")
    def definition(p: "PipelineBuilder", params: dict[str, Any]) -> None:
        body(p)

    return definition.build({})


def _source(p: "PipelineBuilder", name: str) -> bf.DataStream:
    return p.source(bf.FileSource(name, f"/nonexistent/{name}", schema=SCHEMA))


def test_connect_keys_each_side_by_its_own_columns_and_checks_each_at_its_source() -> None:
    def body(p: "PipelineBuilder") -> None:
        a = _source(p, "a")
        b = _source(p, "b").map(user="k")
        a.key_by("k").connect(b.key_by("user")).process("ledger", Ledger()).sink_to(bf.DeltaSink.append("out"))

    pipe = _build(body)
    node = next(n for n in pipe.nodes if n.operator_id == "ledger")
    assert isinstance(node, KeyedCoProcess)
    assert [n.operator_id for n in node.inputs()] == ["a", "map-1"]
    assert node.other_key == ("user",)
    a, b = pipe.sources
    assert pipe.source_keys(a) == {"k": "ledger"}
    assert pipe.source_keys(b) == {}  # "user" is computed by the map, not read from b
    assert [s.name for s in node.state_specs()] == ["balance", "timers"]  # one state table for both sides


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("unkeyed", "is not a keyed stream of this pipeline"),
        ("arity", r"keyed by \['k'\] and \['k', 'v'\]; two keyed streams combined need as many key columns"),
        ("single_function", "a KeyedCoProcessFunction .* is required, got a KeyedProcessFunction"),
        ("co_function_on_one_stream", "a KeyedProcessFunction .* is required, got a Ledger.*connect"),
        ("one_watermark", r"co-process 'ledger': input\(s\) \[2\] have no watermark upstream.*minimum"),
    ],
)
def test_what_connect_refuses(case: str, match: str) -> None:
    def body(p: "PipelineBuilder") -> None:
        a, b = _source(p, "a"), _source(p, "b")
        if case == "unkeyed":
            a.key_by("k").connect(b)  # type: ignore[arg-type]
        elif case == "arity":
            a.key_by("k").connect(b.key_by("k", "v"))
        elif case == "single_function":
            a.key_by("k").connect(b.key_by("k")).process("ledger", bf.KeyedProcessFunction())  # type: ignore[arg-type]
        elif case == "co_function_on_one_stream":
            a.key_by("k").process("ledger", Ledger())  # type: ignore[arg-type]
        else:
            a.with_watermark("ts", timedelta(seconds=1)).key_by("k").connect(b.key_by("k")).process("ledger", Ledger())

    with pytest.raises(PipelineDefinitionError, match=match):
        _build(body)


# -- contract: both inputs keyed, any placement, several epochs ------------------------------------------------


def test_both_inputs_are_keyed_each_by_its_own_columns() -> None:
    node = _node(other_key=("user",))
    assert node.exchanges() == (Exchange.KEYED, Exchange.KEYED)
    assert node.input_keys() == (("k",), ("user",))


def test_the_key_types_and_arrival_positions_are_checked_when_planned() -> None:
    renamed = pa.schema([("user", pa.string()), ("amount", pa.float64()), ("_seq", pa.int64())])
    assert _node(other_key=("user",)).output_schema([ORDERS, renamed]) == Ledger.output_schema
    retyped = pa.schema([("user", pa.int64()), ("amount", pa.float64()), ("_seq", pa.int64())])
    with pytest.raises(
        PipelineDefinitionError,
        match=r"co-process 'ledger': the key columns of the two inputs differ in type \(k is string but user is int64\)",
    ):
        _node(other_key=("user",)).output_schema([ORDERS, retyped])
    with pytest.raises(PipelineDefinitionError, match=r"co-process 'ledger': an input carries no arrival position \(_seq\)"):
        _node().output_schema([ORDERS, PAYMENTS.remove(PAYMENTS.get_field_index("_seq"))])


def _reference(
    epochs: list[tuple[list[tuple[int, str, int, float, float]], float]],
) -> tuple[list[tuple[str, str, float]], dict[str, float]]:
    """Plain Python: Ledger over epochs of (records, W(n) seconds), from the module's rules (3.)-(4.)."""
    balance: dict[str, float] = {}
    timers: dict[str, set[float]] = {}
    out = []
    for rows, watermark in epochs:
        keys = sorted({k for _, k, *_ in rows} | {k for k, ts in timers.items() if any(t <= watermark for t in ts)})
        for k in keys:
            for side, _, seq, v, s in sorted((r for r in rows if r[1] == k), key=lambda r: (r[2], r[0])):
                if side == 1:
                    balance[k] = balance.get(k, 0.0) - int(v)
                    out.append((k, f"order {int(v)}", balance[k]))
                else:
                    balance[k] = balance.get(k, 0.0) + v
                    out.append((k, f"payment {v:g}", balance[k]))
                    timers.setdefault(k, set()).add(s + 10)
            for t in sorted(t for t in timers.get(k, set()) if t <= watermark):
                timers[k].discard(t)
                out.append((k, f"statement at {t:g}", balance[k]))
    return out, balance


def test_several_epochs_over_many_keys_match_a_reference_in_one_task_or_several() -> None:
    rng = random.Random(3)
    epochs = []
    for n in range(4):
        rows = []
        for seq in range(25):
            k = rng.choice([f"k{i}" for i in range(9)])
            side = rng.choice([1, 2])
            rows.append((side, k, seq, float(rng.randrange(1, 9)), 10.0 * n + rng.randrange(0, 10)))
        epochs.append((rows, 10.0 * n + 5))
    node = _node()
    specs = node_specs(node, _records([], key_group=None))
    state: dict[str, pa.Table] = {}
    got, previous = [], None
    for n, (rows, watermark) in enumerate(epochs, start=1):
        run = run_both(node, tasks=TASKS, inputs=_records(rows, key_group=None), state=state, epoch=n,
                       watermark_prev_us=previous, watermark_us=us(watermark))  # fmt: skip
        previous = us(watermark)
        got += [(r["k"], r["what"], r["balance"]) for r in run.output.to_pylist()]
        state = {name: live_state(spec, state.get(name), run.changes[name], epoch=n) for name, spec in specs.items()}
    expected, balances = _reference(epochs)
    assert sorted(got, key=repr) == sorted(expected, key=repr)
    assert {r["k"]: r["value"] for r in state["ledger__balance"].to_pylist()} == balances


def test_an_error_of_either_side_fails_the_epoch_naming_the_operator() -> None:
    class Broken(Ledger):
        def process_element2(self, record: dict[str, Any], ctx: KeyedContext, out: Out) -> None:
            raise KeyError("nope")

    node = KeyedCoProcess(
        operator_id="ledger", parent=upstream(), key=("k",), function=Broken(), other=upstream(), other_key=("k",)
    )
    with pytest.raises(UserFunctionError, match=r"co-process 'ledger': the function raised KeyError: 'nope' \(key \('a',\)\)"):
        run_kernel(node, _records([(2, "a", 1, 1.0, 1)]))


EVENTS = pa.schema([("user", pa.string()), ("ts", US), ("v", pa.int64()), ("_seq", pa.int64())])
COMMANDS = pa.schema([("uid", pa.string()), ("ts", US), ("action", pa.string()), ("_seq", pa.int64())])


class Tracker(KeyedCoProcessFunction):
    """tests/integration/test_chained_process.py's: timers replaced, deleted, of both domains, firing for quiet keys."""

    total = ValueStateDescriptor("total", pa.int64())
    last = ValueStateDescriptor("last", US)
    blocked = ValueStateDescriptor("blocked", pa.bool_())
    output_schema = pa.schema(
        [("user", pa.string()), ("what", pa.string()), ("at", US), ("total", pa.int64()), ("blocked", pa.bool_())]
    )

    def process_element1(self, record: dict[str, Any], ctx: KeyedContext, out: Out) -> None:
        total, last, timers = ctx.get_state(self.total), ctx.get_state(self.last), ctx.timer_service()
        total.update((total.value() or 0) + record["v"])
        if last.value() is None or record["ts"] > last.value():
            if last.value() is not None:
                timers.delete_event_time_timer(last.value() + timedelta(seconds=30))
            last.update(record["ts"])
            timers.register_event_time_timer(record["ts"] + timedelta(seconds=30))
        out(
            {
                "user": ctx.key[0],
                "what": "event",
                "at": record["ts"],
                "total": total.value(),
                "blocked": ctx.get_state(self.blocked).value(),
            }
        )

    def process_element2(self, record: dict[str, Any], ctx: KeyedContext, out: Out) -> None:
        blocked = ctx.get_state(self.blocked)
        if record["action"] == "block":
            blocked.update(True)
        else:
            blocked.clear()
        ctx.timer_service().register_processing_time_timer(0)  # in the past: fires at the end of this epoch
        ctx.timer_service().register_event_time_timer(record["ts"] + timedelta(seconds=10))

    def on_timer(self, timestamp: datetime, ctx: KeyedContext, out: Out) -> None:
        last = ctx.get_state(self.last).value()
        what = "idle" if last is not None and timestamp == last + timedelta(seconds=30) else str(ctx.time_domain)
        if what == "idle":
            ctx.get_state(self.last).clear()
        out(
            {
                "user": ctx.key[0],
                "what": what,
                "at": timestamp,
                "total": ctx.get_state(self.total).value(),
                "blocked": ctx.get_state(self.blocked).value(),
            }
        )


def test_timers_of_both_domains_are_replaced_deleted_and_fire_for_quiet_keys_across_epochs() -> None:
    node = KeyedCoProcess(
        operator_id="tracker", parent=upstream(), key=("user",), function=Tracker(), other=upstream(), other_key=("uid",)
    )
    at = lambda s: T0 + timedelta(seconds=s)  # noqa: E731
    events = pa.Table.from_pylist([{"user": "a", "ts": at(0), "v": 5, "_seq": 1}, {"user": "a", "ts": at(4), "v": 1, "_seq": 3},
                                   {"user": "b", "ts": at(2), "v": 7, "_seq": 2}], schema=EVENTS)  # fmt: skip
    commands = pa.Table.from_pylist([{"uid": "a", "ts": at(1), "action": "block", "_seq": 2}], schema=COMMANDS)
    specs = node_specs(node, [events, commands])
    first = run_both(node, tasks=TASKS, inputs=[events, commands], epoch=1, processing_time_ms=1_000, watermark_us=us(20))
    epoch_start = datetime(1970, 1, 1, tzinfo=timezone.utc)
    assert sorted(first.output.to_pylist(), key=repr) == sorted([
        {"user": "a", "what": "event", "at": at(0), "total": 5, "blocked": None},
        {"user": "a", "what": "event", "at": at(4), "total": 6, "blocked": True},  # the block (position 2) came between
        {"user": "a", "what": "TimeDomain.EVENT_TIME", "at": at(11), "total": 6, "blocked": True},  # the command's timer, W(1) = 20 s
        {"user": "a", "what": "TimeDomain.PROCESSING_TIME", "at": epoch_start, "total": 6, "blocked": True},
        {"user": "b", "what": "event", "at": at(2), "total": 7, "blocked": None},
    ], key=repr)  # fmt: skip
    left = {(r["user"], r[TIMER_TIMESTAMP]) for r in first.changes["tracker__timers"].to_pylist() if not r["_deleted"]}
    assert left == {("a", at(34)), ("b", at(32))}  # a's 30 s timer was replaced by 34 s within the epoch: no row
    state = {name: live_state(spec, None, first.changes[name], epoch=1) for name, spec in specs.items()}
    # Epoch 2: no record; W(2) = 40 s fires both keys' idle timers.
    empty = [events.schema.empty_table(), commands.schema.empty_table()]
    second = run_both(
        node,
        tasks=TASKS,
        inputs=empty,
        state=state,
        epoch=2,
        processing_time_ms=2_000,
        watermark_prev_us=us(20),
        watermark_us=us(40),
    )
    assert sorted(second.output.to_pylist(), key=repr) == sorted([
        {"user": "a", "what": "idle", "at": at(34), "total": 6, "blocked": True},
        {"user": "b", "what": "idle", "at": at(32), "total": 7, "blocked": None},
    ], key=repr)  # fmt: skip
    assert {(r["user"], r["_deleted"]) for r in second.changes["tracker__timers"].to_pylist()} == {("a", True), ("b", True)}
    assert {(r["user"], r["_deleted"]) for r in second.changes["tracker__last"].to_pylist()} == {("a", True), ("b", True)}
