"""The keyed broadcast process kernel: broadcast records first in every task, then the keyed side reading their state.

Checked against a plain-Python reference of the module's steps 2-4, in one
task and split across tasks (the broadcast input whole in each, the
broadcast state read whole by each, the first task's changes staged).
"""

from __future__ import annotations

from typing import Any, Callable

import pyarrow as pa
import pytest

from barrierflow.api.functions import BroadcastContext, KeyedBroadcastProcessFunction, KeyedContext
from barrierflow.api.state import MapStateDescriptor, ValueStateDescriptor
from barrierflow.core.errors import PipelineDefinitionError, UserFunctionError
from barrierflow.core.settings import MAX_BROADCAST_RECORDS
from barrierflow.operators.base import Exchange
from barrierflow.operators.broadcast import KeyedBroadcastProcess
from harness import live_state, node_specs, run_both, run_kernel, upstream

# run_both's split: 4 tasks of the 8 key groups (execution.exchange.owner_of routes a key group to another
# task than key_group_ranges gives it when the tasks do not divide the key groups: reported to the lead).
TASKS = 4
LIMITS = MapStateDescriptor("limits", pa.string(), pa.float64())
PAYMENTS = pa.schema([("id", pa.string()), ("country", pa.string()), ("amount", pa.float64()), ("_seq", pa.int64())])
RULES = pa.schema([("country", pa.string()), ("limit", pa.float64()), ("_seq", pa.int64())])
Out = Callable[[dict[str, Any]], None]


class FlagLarge(KeyedBroadcastProcessFunction):
    """Payments above their country's limit are flagged, counted per country; a limit set is announced (broadcast side)."""

    flagged = ValueStateDescriptor("flagged", pa.int64())
    output_schema = pa.schema([("id", pa.string()), ("country", pa.string()), ("flagged", pa.int64()), ("limit", pa.float64())])

    def process_broadcast_element(self, record: dict[str, Any], ctx: BroadcastContext, out: Out) -> None:
        limits = ctx.get_broadcast_state(LIMITS)
        if record["limit"] is None:
            limits.remove(record["country"])
        else:
            limits.put(record["country"], record["limit"])
            out({"id": None, "country": record["country"], "flagged": None, "limit": record["limit"]})

    def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Out) -> None:
        limit = ctx.get_broadcast_state(LIMITS).get(ctx.key[0])
        if limit is not None and record["amount"] > limit:
            flagged = ctx.get_state(self.flagged)
            flagged.update((flagged.value() or 0) + 1)
            out({"id": record["id"], "country": ctx.key[0], "flagged": flagged.value(), "limit": limit})


def _node(fn: KeyedBroadcastProcessFunction | None = None) -> KeyedBroadcastProcess:
    return KeyedBroadcastProcess(
        operator_id="flag", parent=upstream("payments"), key=("country",), function=fn or FlagLarge(),
        broadcast=upstream("rules"), descriptors=(LIMITS,),
    )  # fmt: skip


def _tables(rules: list[tuple[str, float | None]], payments: list[tuple[str, str | None, float]]) -> list[pa.Table]:
    # Arrival: given in reverse order of _seq, so the kernel must sort.
    n, m = len(payments), len(rules)
    return [
        pa.Table.from_pylist(
            [{"id": i, "country": c, "amount": a, "_seq": n - k} for k, (i, c, a) in enumerate(payments)], schema=PAYMENTS
        ),
        pa.Table.from_pylist([{"country": c, "limit": v, "_seq": m - k} for k, (c, v) in enumerate(rules)], schema=RULES),
    ]


EPOCHS: list[tuple[list[tuple[str, float | None]], list[tuple[str, str | None, float]]]] = [
    ([("de", 100.0), ("fr", 50.0)], [("p1", "de", 150.0), ("p2", "fr", 20.0), ("p3", "it", 999.0), ("p4", "fr", 60.0)]),
    ([("it", 500.0), ("de", 200.0)], [("p5", "de", 150.0), ("p6", "it", 999.0), ("p7", "nl", 5.0), ("p8", "de", 250.0)]),
    ([("fr", None)], [("p9", "fr", 60.0), ("p10", "it", 501.0), ("p11", "de", 201.0), ("p12", "es", 1.0)]),
    ([("fr", 70.0), ("fr", 10.0)], [("p12", "fr", 60.0), ("p13", "fr", 80.0), ("p14", "it", 100.0)]),
]


def _reference() -> tuple[list[list[dict[str, Any]]], dict[str, int], dict[str, float]]:
    """Per epoch the emitted rows; then the flagged counts and the limits left: (2.) rules in arrival order, then (3.)."""
    limits: dict[str, float] = {}
    flagged: dict[str, int] = {}
    outputs = []
    for rules, payments in EPOCHS:
        out = []
        for country, limit in reversed(rules):  # arrival order: the last given arrived first
            if limit is None:
                limits.pop(country, None)
            else:
                limits[country] = limit
                out.append({"id": None, "country": country, "flagged": None, "limit": limit})
        for payment_id, country, amount in reversed(payments):
            if country in limits and amount > limits[country]:
                flagged[country] = flagged.get(country, 0) + 1
                out.append({"id": payment_id, "country": country, "flagged": flagged[country], "limit": limits[country]})
        outputs.append(out)
    return outputs, flagged, limits


def test_broadcast_records_run_first_in_every_task_and_the_keyed_side_reads_their_state_over_epochs() -> None:
    node = _node()
    assert node.exchanges() == (Exchange.KEYED, Exchange.BROADCAST)
    assert node.input_keys() == (("country",), ())
    assert node.broadcast_state_names == ("limits",)
    specs = node_specs(node, _tables([], []))
    assert sorted(specs) == ["flag__flagged", "flag__limits"]
    expected, flagged, limits = _reference()
    state: dict[str, pa.Table] = {}
    for n, ((rules, payments), out) in enumerate(zip(EPOCHS, expected), start=1):
        run = run_both(node, tasks=TASKS, inputs=_tables(rules, payments), state=state, epoch=n, whole=["flag__limits"])
        assert sorted(run.output.to_pylist(), key=repr) == sorted(out, key=repr)
        state = {name: live_state(spec, state.get(name), run.changes[name], epoch=n) for name, spec in specs.items()}
    assert {r["country"]: r["value"] for r in state["flag__flagged"].to_pylist()} == flagged
    assert {r["map_key"]: r["map_value"] for r in state["flag__limits"].to_pylist()} == limits
    assert set(state["flag__limits"].column("_key_group").to_pylist()) == {0}


def test_the_broadcast_state_table_is_as_before() -> None:
    spec = node_specs(_node(), _tables([], []))["flag__limits"]
    assert spec.arrow_schema().names == ["map_key", "_key_group", "map_value", "_updated_at_ms", "_deleted", "_epoch"]
    assert spec.signature() == {"keys": ["map_key:string"], "values": ["map_value:double"]}
    assert [s.table_name for s in _node().state_specs()] == ["flag__flagged", "flag__limits"]


def test_the_broadcast_side_s_rows_come_once_whatever_the_number_of_tasks() -> None:
    run = run_both(_node(), tasks=TASKS, inputs=_tables([("de", 1.0), ("fr", 2.0)], []), whole=["flag__limits"])
    assert sorted(r["country"] for r in run.output.to_pylist()) == ["de", "fr"]


def test_a_broadcast_stream_without_arrival_positions_is_refused_when_planned() -> None:
    keyed, rules = _tables([], [])
    assert _node().output_schema([keyed.schema, rules.schema]) == FlagLarge.output_schema
    with pytest.raises(PipelineDefinitionError, match="the broadcast stream carries no arrival position"):
        _node().output_schema([keyed.schema, rules.schema.remove(2)])


def test_too_many_broadcast_records_or_a_bad_put_or_row_fail_the_epoch() -> None:
    many = pa.table({"country": pa.array(["x"] * (MAX_BROADCAST_RECORDS + 1)), "limit": pa.array([1.0] * (MAX_BROADCAST_RECORDS + 1)),
                     "_seq": pa.array(range(MAX_BROADCAST_RECORDS + 1), pa.int64())})  # fmt: skip
    keyed, _ = _tables([], [])
    with pytest.raises(UserFunctionError, match=f"holds more than {MAX_BROADCAST_RECORDS} records"):
        run_kernel(_node(), [keyed, many])

    class BadPut(FlagLarge):
        def process_broadcast_element(self, record: dict[str, Any], ctx: BroadcastContext, out: Out) -> None:
            ctx.get_broadcast_state(LIMITS).put(record["country"], "high")

    with pytest.raises(UserFunctionError, match=r"does not fit its declared types \(string -> double\)"):
        run_kernel(_node(BadPut()), _tables([("de", 1.0)], []))

    class BadRow(FlagLarge):
        def process_broadcast_element(self, record: dict[str, Any], ctx: BroadcastContext, out: Out) -> None:
            out({"country": record["country"]})

    with pytest.raises(UserFunctionError, match=r"emitted \['country'\], not the columns of its output_schema"):
        run_kernel(_node(BadRow()), _tables([("de", 1.0)], []))

    class Raising(FlagLarge):
        def process_broadcast_element(self, record: dict[str, Any], ctx: BroadcastContext, out: Out) -> None:
            raise RuntimeError("boom")

    with pytest.raises(UserFunctionError, match=r"broadcast process 'flag': process_broadcast_element raised RuntimeError: boom"):
        run_kernel(_node(Raising()), _tables([("de", 1.0)], []))

    class Writes(FlagLarge):
        def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Out) -> None:
            ctx.get_broadcast_state(LIMITS).put("x", 1.0)  # the keyed side's view is read-only

    with pytest.raises(UserFunctionError, match="AttributeError"):
        run_kernel(_node(Writes()), _tables([], [("p", "de", 1.0)]))
