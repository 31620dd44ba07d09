"""The broadcast state pattern, as Flink's ``KeyedBroadcastProcessFunction``.

A low-volume stream (rules, thresholds) is broadcast with the map states it
fills, ``rules.broadcast(THRESHOLDS)``, and connected to a keyed stream:
``payments.key_by("country").connect(broadcast).process("flag", fn)``.
``fn.process_broadcast_element`` updates the broadcast state;
``fn.process_element`` reads it (read-only) beside its keyed state and
timers. Within epoch n:

1. Alignment: both inputs' records up to barrier n are processed in epoch n.
2. Broadcast side first: every task gets all of epoch n's broadcast records
   and runs ``process_broadcast_element`` on them in arrival order
   (``_seq``), identically, starting from the broadcast state committed by
   epoch n-1 (a broadcast stream is low-volume: more than
   :data:`MAX_BROADCAST_RECORDS` records in one epoch is an error). They may
   emit rows: the first task's output carries them, once.
3. Then the keyed side, exactly as a :class:`KeyedProcessFunction`
   (per key, records in arrival order, then due timers), every key reading
   the broadcast state as step 2 left it. So results depend neither on
   parallelism nor on how the two inputs interleave within the epoch (Flink
   applies them in arrival order, which differs between instances).
4. Broadcast state is one Delta table per map state descriptor,
   ``<operator>__<name>`` (``map_key``, ``map_value``, all in key group 0),
   staged and committed with the epoch and kept by savepoints. Every task
   reads it whole (the node's ``broadcast_state_names``), as every Flink
   instance holds a copy, and the first task's changes are the ones staged:
   rescaling redistributes nothing. A map state grown past
   ``MAX_HELD_STATE_ELEMENTS`` (1,000,000) entries fails the epoch, saying so.
5. Watermark: the keyed side's (a broadcast stream usually carries none,
   and would otherwise hold every timer back).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.api.functions import (
    BroadcastContext,
    BroadcastState,
    KeyedBroadcastProcessFunction,
    KeyedFunction,
    ReadOnlyBroadcastState,
)
from barrierflow.api.state import MapStateDescriptor
from barrierflow.core.arrow import in_arrival_order
from barrierflow.core.columns import DELETED, EPOCH, KEY_GROUP, SEQ, UPDATED_AT, user_columns
from barrierflow.core.errors import PipelineDefinitionError, UserFunctionError
from barrierflow.core.settings import MAX_BROADCAST_RECORDS
from barrierflow.operators.base import Exchange, Node, Task, check_held_state_size
from barrierflow.operators.process import Element, KeyedProcess, python_values, rows_table
from barrierflow.state.spec import StateSpec

# The function and contexts are importable from here as before (barrierflow/__init__.py, plan/pipeline.py).
__all__ = [
    "KeyedBroadcastProcessFunction",
    "BroadcastContext",
    "ReadOnlyBroadcastState",
    "BroadcastState",
    "KeyedBroadcastProcess",
    "MAX_BROADCAST_RECORDS",
]


def _spec(operator_id: str, descriptor: MapStateDescriptor) -> StateSpec:
    """(4.) The broadcast state's table: one row per map key, all in key group 0."""
    return StateSpec(
        operator_id=operator_id,
        name=descriptor.name,
        key_fields=(pa.field("map_key", descriptor.key_type),),
        value_fields=(pa.field("map_value", descriptor.map_value_type),),
    )


@dataclass
class KeyedBroadcastProcess(KeyedProcess):
    """A keyed process operator over ``parent`` keyed by ``key``, reading the broadcast state ``broadcast`` fills."""

    broadcast: Node | None = None
    descriptors: tuple[MapStateDescriptor, ...] = ()

    function_type: ClassVar[type[KeyedFunction]] = KeyedBroadcastProcessFunction
    other_use: ClassVar[str] = "a KeyedProcessFunction runs on one keyed stream: a.key_by(k).process(...)"
    what: ClassVar[str] = "broadcast process"

    def __post_init__(self) -> None:
        super().__post_init__()
        assert self.function is not None
        wrong = [d for d in self.descriptors if not isinstance(d, MapStateDescriptor)]
        if not self.descriptors or wrong:
            raise PipelineDefinitionError(
                f"broadcast process {self.operator_id}: a stream is broadcast with MapStateDescriptors "
                f"(rules.broadcast(bf.MapStateDescriptor('rules', ...))), got {list(self.descriptors)!r}"
            )
        keyed = {d.name for d in self.function.state_descriptors}
        names = [d.name for d in self.descriptors]
        clash = sorted(keyed.intersection(names)) + sorted({n for n in names if names.count(n) > 1})
        if clash:
            raise PipelineDefinitionError(
                f"broadcast process {self.operator_id}: state name(s) {clash} are used twice (keyed and broadcast "
                "state, or two broadcast states); each names its own table: give each its own name"
            )

    def inputs(self) -> tuple[Node, ...]:
        assert self.parent is not None and self.broadcast is not None
        return (self.parent, self.broadcast)

    def keyed_inputs(self) -> list[tuple[Node, tuple[str, ...]]]:
        assert self.parent is not None
        return [(self.parent, self.key)]

    def exchanges(self) -> tuple[Exchange, ...]:
        return (Exchange.KEYED, Exchange.BROADCAST)  # (2.) every task gets every broadcast record

    def input_keys(self) -> tuple[tuple[str, ...], ...]:
        return (self.key, ())

    @property
    def broadcast_state_names(self) -> tuple[str, ...]:
        """(4.) Its states read whole by every task (the first task's changes staged)."""
        return tuple(d.name for d in self.descriptors)

    def state_specs(self, inputs: Sequence[pa.Schema] | None = None) -> list[StateSpec]:
        return [*self.keyed_state_specs(inputs[:1] if inputs else None), *(_spec(self.operator_id, d) for d in self.descriptors)]

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        _, broadcast = inputs
        if SEQ not in broadcast.names:  # (2.)
            raise PipelineDefinitionError(
                f"broadcast process {self.operator_id!r}: the broadcast stream carries no arrival position ([{SEQ!r}]), so the "
                "order of its records is unknown; broadcast a stream straight from its source or its stateless operators"
            )
        return super().output_schema(inputs)

    def elements(self, fn: KeyedFunction) -> list[Element]:
        assert isinstance(fn, KeyedBroadcastProcessFunction)
        return [fn.process_element]

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        """Steps 2-4 of the module docstring; returns the rows both sides emitted."""
        keyed, broadcast = inputs
        fn = self.function
        assert isinstance(fn, KeyedBroadcastProcessFunction)
        label = f"broadcast process {self.operator_id!r}"
        # 2. The epoch's broadcast records, in arrival order, from the state epoch n-1 committed.
        if broadcast.num_rows > MAX_BROADCAST_RECORDS:
            raise UserFunctionError(
                f"{label}: the broadcast stream holds more than {MAX_BROADCAST_RECORDS} records "
                "in this epoch; a broadcast stream is for low-volume input (rules, thresholds), read whole by every key "
                "group: key the high-volume stream instead"
            )
        specs = {d.name: _spec(self.operator_id, d) for d in self.descriptors}
        before = {}
        for name, spec in specs.items():
            stored = task.state(spec).every_live_row()
            before[name] = _map_of(stored.filter(pc.equal(stored.column(KEY_GROUP), 0)))
        states = {name: BroadcastState(dict(stored)) for name, stored in before.items()}
        bctx = BroadcastContext(states, task.epoch, task.processing_time_ms, task.watermark_prev_us)
        emitted: list[dict[str, Any]] = []
        try:
            for record in _ordered_records(broadcast):
                fn.process_broadcast_element(record, bctx, emitted.append)
        except (PipelineDefinitionError, UserFunctionError) as exc:
            raise type(exc)(f"{label}: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - the user's function failed: the epoch fails, naming it
            raise UserFunctionError(f"{label}: process_broadcast_element raised {type(exc).__name__}: {exc}") from exc
        # 4. Every task stages the same changes; the first task's are written.
        for name, spec in specs.items():
            after = states[name].snapshot()
            check_held_state_size(self.operator_id, name, len(after))
            changes = _changes(spec, before[name], after, task.processing_time_ms, task.epoch)
            task.state(spec).stage(changes.drop_columns([UPDATED_AT, EPOCH]))
        broadcast_rows = _emitted_table(self.operator_id, emitted, fn.output_schema)
        # 3. The keyed side, with the broadcast state as step 2 left it.
        view = {name: ReadOnlyBroadcastState(state.snapshot()) for name, state in states.items()}
        out = self.run_keyed(task, [keyed], view)
        if not broadcast_rows.num_rows or not task.first_task:
            return out
        return pa.concat_tables([out, broadcast_rows])  # (2.) once: in the first task's output

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "broadcast_states": {d.name: d.signature() for d in self.descriptors}}


def _map_of(stored: pa.Table) -> dict[Any, Any]:
    """A broadcast state's map from its table's live rows."""
    return dict(zip(python_values(stored.column("map_key")), python_values(stored.column("map_value"))))


def _ordered_records(table: pa.Table) -> list[dict[str, Any]]:
    """The broadcast records of ``table`` as dicts of their user columns, in arrival order (2.)."""
    ordered = in_arrival_order(table)
    names = user_columns(ordered.column_names)
    return (
        [dict(zip(names, values)) for values in zip(*(python_values(ordered.column(n)) for n in names))]
        if names
        else [{} for _ in range(ordered.num_rows)]
    )


def _changes(
    spec: StateSpec, before: Mapping[Any, Any], after: Mapping[Any, Any], processing_time_ms: int, epoch: int
) -> pa.Table:
    """(4.) Rows for the map keys step 2 put, changed or removed (the table's schema, written by ``epoch``)."""
    if None in after:
        raise UserFunctionError(
            f"broadcast state {spec.name!r} of {spec.operator_id!r}: process_broadcast_element put a null key; "
            "a broadcast map state's keys are not null"
        )
    changed = [(k, v, False) for k, v in after.items() if k not in before or before[k] != v]
    changed += [(k, None, True) for k in before if k not in after]
    # Staged even when nothing changed: an epoch's cut (what queries and savepoints read)
    # names only the tables the epoch committed.
    rows = [
        {"map_key": k, KEY_GROUP: 0, "map_value": v, UPDATED_AT: processing_time_ms, DELETED: deleted, EPOCH: epoch}
        for k, v, deleted in changed
    ]
    try:
        return pa.Table.from_pylist(rows, schema=spec.arrow_schema())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        raise UserFunctionError(
            f"broadcast state {spec.name!r} of {spec.operator_id!r}: a key or value put does not fit its declared "
            f"types ({spec.key_fields[0].type} -> {spec.value_fields[0].type}): {exc}"
        ) from None


def _emitted_table(operator_id: str, rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """(2.) The broadcast side's emitted rows: exactly the columns of ``output_schema``."""
    declared = set(schema.names)
    for row in rows:
        if not isinstance(row, Mapping) or set(row) != declared:
            got = sorted(row) if isinstance(row, Mapping) else repr(row)
            raise UserFunctionError(
                f"broadcast process {operator_id!r}: process_broadcast_element emitted {got}, not the columns "
                f"of its output_schema {schema.names}"
            )
    return rows_table(f"broadcast process {operator_id!r}", rows, schema)
