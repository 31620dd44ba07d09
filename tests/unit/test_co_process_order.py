"""Keyed co-process functions without Spark: the declaration, the order both sides run in, shared state and timers."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pyarrow as pa
import pytest

import barrierflow as bf
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.co_process import RECORD_COLUMNS, KeyedCoProcess
from barrierflow.operators.process import _TIMER_DOMAIN, _TIMER_TS, _run_key_group, _state_column
from barrierflow.operators.timers import TIMER_STATE, EpochClocks
from barrierflow.plan.pipeline import Pipeline, PipelineBuilder
from barrierflow.state.spec import KEY_GROUP

T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
US = pa.timestamp("us", tz="UTC")
ORDER = pa.struct([("k", pa.string()), ("qty", pa.int64()), ("ts", US)])
PAYMENT = pa.struct([("k", pa.string()), ("amount", pa.float64()), ("ts", US)])
Out = Callable[[dict[str, Any]], None]


def us(seconds: float) -> int:
    """Microseconds since the Unix epoch of ``seconds`` after T0."""
    return int((T0.timestamp() + seconds) * 1_000_000)


class Ledger(bf.KeyedCoProcessFunction):
    """Orders (side 1) and payments (side 2) of a key share one balance; a payment schedules a statement 10 s later."""

    balance = bf.ValueStateDescriptor("balance", pa.float64())
    output_schema = pa.schema([("k", pa.string()), ("what", pa.string()), ("balance", pa.float64())])

    def process_element1(self, record: dict[str, Any], ctx: bf.KeyedContext, out: Out) -> None:
        balance = ctx.get_state(self.balance)
        balance.update((balance.value() or 0.0) - record["qty"])
        out({"k": ctx.key[0], "what": f"order {record['qty']}", "balance": balance.value()})

    def process_element2(self, record: dict[str, Any], ctx: bf.KeyedContext, out: Out) -> None:
        balance = ctx.get_state(self.balance)
        balance.update((balance.value() or 0.0) + record["amount"])
        out({"k": ctx.key[0], "what": f"payment {record['amount']:g}", "balance": balance.value()})
        ctx.timer_service().register_event_time_timer(record["ts"] + timedelta(seconds=10))

    def on_timer(self, timestamp: datetime, ctx: bf.KeyedContext, out: Out) -> None:
        out({"k": ctx.key[0], "what": f"statement at {(timestamp - T0).total_seconds():g}", "balance": ctx.get_state(self.balance).value()})


def _records(rows: list[tuple[int, str, int, float, float]]) -> pa.Table:
    """Rows as the operator hands a key group over: (side, key, _seq, value, seconds), in any order."""
    order = [{"k": k, "qty": int(v), "ts": T0 + timedelta(seconds=s)} if side == 1 else None for side, k, _, v, s in rows]
    payment = [{"k": k, "amount": v, "ts": T0 + timedelta(seconds=s)} if side == 2 else None for side, k, _, v, s in rows]
    return pa.table(
        {
            "k": pa.array([k for _, k, *_ in rows], pa.string()),
            KEY_GROUP: pa.array([3] * len(rows), pa.int32()),
            RECORD_COLUMNS[0]: pa.array(order, ORDER),
            RECORD_COLUMNS[1]: pa.array(payment, PAYMENT),
            "_seq": pa.array([seq for _, _, seq, _, _ in rows], pa.int64()),
            "_seq_1": pa.array([side - 1 for side, *_ in rows], pa.int64()),  # the side: the union's input index
        }
    )


def _state(balances: dict[str, float]) -> pa.Table:
    rows = [{"k": k, KEY_GROUP: 3, _state_column("balance"): b} for k, b in balances.items()]
    schema = pa.schema([("k", pa.string()), (KEY_GROUP, pa.int32()), (_state_column("balance"), pa.float64()),
                        (_TIMER_DOMAIN, pa.string()), (_TIMER_TS, pa.int64())])  # fmt: skip
    return pa.Table.from_pylist(rows, schema=schema)


def _out_schema() -> pa.Schema:
    return pa.schema(
        [("_kind", pa.string()), ("k", pa.string()), (KEY_GROUP, pa.int32()), (_state_column("balance"), pa.float64()),
         (_TIMER_DOMAIN, pa.string()), (_TIMER_TS, pa.int64()), ("_deleted", pa.bool_()),
         *[(f"_out_{f.name}", f.type) for f in Ledger.output_schema]]
    )  # fmt: skip


def test_both_sides_run_per_key_by_arrival_position_side_1_first_at_a_tie_with_shared_state_and_timers() -> None:
    records = _records([
        (2, "a", 5, 10.0, 5), (1, "b", 1, 2, 1), (1, "a", 7, 3, 7), (2, "a", 2, 4.0, 2),
        (2, "b", 4, 1.0, 4), (1, "b", 4, 6, 4),  # the same position on both sides: the order (side 1) first
    ])  # fmt: skip
    out = _run_key_group(Ledger(), ["k"], records, _state({"a": 100.0}), _out_schema(), EpochClocks(2, 0, us(0), us(14))).to_pylist()
    emitted = [(r["k"], r["_out_what"], r["_out_balance"]) for r in out if r["_kind"] == "_out"]
    assert emitted == [
        ("a", "payment 4", 104.0), ("a", "payment 10", 114.0), ("a", "order 3", 111.0),
        ("a", "statement at 12", 111.0),  # W(n) = 14 s passes the first payment's timer only
        ("b", "order 2", -2.0), ("b", "order 6", -8.0), ("b", "payment 1", -7.0),
        ("b", "statement at 14", -7.0),
    ]  # fmt: skip
    states = {r["k"]: r[_state_column("balance")] for r in out if r["_kind"] == "balance"}
    assert states == {"a": 111.0, "b": -7.0}
    timers = {(r["k"], r[_TIMER_TS], r["_deleted"]) for r in out if r["_kind"] == TIMER_STATE}
    assert timers == {("a", us(15), False)}  # left for a later epoch


SCHEMA = pa.schema([pa.field("k", pa.string()), pa.field("ts", US), pa.field("v", pa.float64())])


def _build(body: Callable[[PipelineBuilder], None]) -> Pipeline:
    @bf.pipeline("unit_connect")
    def definition(p: PipelineBuilder, params: dict[str, Any]) -> None:
        body(p)

    return definition.build({})


def _source(p: PipelineBuilder, name: str) -> bf.DataStream:
    return p.source(bf.FileSource(name, f"/nonexistent/{name}", schema=SCHEMA))


def test_connect_keys_each_side_by_its_own_columns_and_checks_each_at_its_source() -> None:
    def body(p: PipelineBuilder) -> None:
        a = _source(p, "a")
        b = _source(p, "b").map(user="k")
        a.key_by("k").connect(b.key_by("user")).process("ledger", Ledger()).sink_to(bf.DeltaSink.append("out"))

    pipe = _build(body)
    node = next(n for n in pipe.nodes if n.operator_id == "ledger")
    assert isinstance(node, KeyedCoProcess)
    assert [n.operator_id for n in node.inputs()] == ["a", "map-1"]
    assert node.describe()["other_key"] == ["user"]
    a, b = pipe.sources
    assert pipe.source_keys(a) == {"k": "ledger"}
    assert pipe.source_keys(b) == {}  # "user" is computed by the map, not read from b
    assert [s.name for s in node.state_specs()] == ["balance", "timers"]  # one state table for both sides
    assert all(pipe.needs_arrival_order(child) for s in pipe.sources for child in pipe.children(s))


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
    def body(p: PipelineBuilder) -> None:
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
