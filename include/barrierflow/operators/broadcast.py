"""The broadcast state pattern, as Flink's ``KeyedBroadcastProcessFunction``.

A low-volume stream broadcast with the map states it fills is connected to a keyed stream:
``payments.key_by("c").connect(rules.broadcast(D)).process("flag", fn)``; ``fn.process_broadcast_element`` updates the
broadcast state, ``fn.process_element`` reads it beside its keyed state and timers. Epoch n:

1. Alignment: both inputs' records up to barrier n are processed in epoch n.
2. Broadcast side first: every task runs ``process_broadcast_element`` on all the epoch's broadcast records (at most
   :data:`MAX_BROADCAST_RECORDS`) in arrival order, alike, from the state epoch n-1 committed; rows it emits come
   once, in the first task's output.
3. Then the keyed side, as a :class:`KeyedProcessFunction`, every key reading the state step 2 left: results never
   depend on parallelism or on how the inputs interleave (unlike Flink's).
4. Each map state is a table ``<operator>__<name>`` (``map_key``, ``map_value``, key group 0) every task reads whole,
   as every Flink instance holds a copy; the first task's changes are staged, and rescaling moves nothing. More than
   ``MAX_HELD_STATE_ELEMENTS`` entries fail the epoch.
5. Watermark: the keyed side's (a broadcast stream usually has none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import pyarrow as pa

from barrierflow.api.functions import BroadcastContext, BroadcastState, KeyedBroadcastProcessFunction, ReadOnlyBroadcastState
from barrierflow.api.state import MapStateDescriptor
from barrierflow.core.arrow import in_arrival_order
from barrierflow.core.columns import DELETED, EPOCH, SEQ, UPDATED_AT
from barrierflow.core.errors import PipelineDefinitionError, UserFunctionError
from barrierflow.core.settings import MAX_BROADCAST_RECORDS
from barrierflow.operators.base import Exchange, Node, Task, calling_user_code, check_held_state_size, held_state_table
from barrierflow.operators.process import KeyedProcess, python_rows, python_values, rows_table
from barrierflow.state.spec import StateSpec

# Importable from here as before (plan/pipeline.py).
__all__ = ["KeyedBroadcastProcessFunction", "KeyedBroadcastProcess"]


def _spec(operator_id: str, descriptor: MapStateDescriptor) -> StateSpec:
    """(4.) The broadcast state's table: one row per map key, all in key group 0."""
    key, value = (pa.field("map_key", descriptor.key_type),), (pa.field("map_value", descriptor.map_value_type),)
    return StateSpec(operator_id, descriptor.name, key, value)


@dataclass
class KeyedBroadcastProcess(KeyedProcess):
    """A keyed process operator over ``parent`` keyed by ``key``, reading the broadcast state ``broadcast`` fills."""

    broadcast: Node | None = None
    descriptors: tuple[MapStateDescriptor, ...] = ()

    function_type = KeyedBroadcastProcessFunction
    other_use = "a KeyedProcessFunction runs on one keyed stream: a.key_by(k).process(...)"
    what = "broadcast process"

    def __post_init__(self) -> None:
        super().__post_init__()
        assert self.function is not None
        if not self.descriptors or any(not isinstance(d, MapStateDescriptor) for d in self.descriptors):
            raise PipelineDefinitionError(
                f"broadcast process {self.operator_id}: a stream is broadcast with MapStateDescriptors "
                f"(rules.broadcast(bf.MapStateDescriptor('rules', ...))), got {list(self.descriptors)!r}"
            )
        names = self.broadcast_state_names
        clash = sorted({d.name for d in self.function.state_descriptors}.intersection(names))
        clash += sorted({n for n in names if names.count(n) > 1})
        if clash:
            raise PipelineDefinitionError(
                f"broadcast process {self.operator_id}: state name(s) {clash} are used twice (keyed and broadcast "
                "state, or two broadcast states); each names its own table: give each its own name"
            )

    def inputs(self) -> tuple[Node, ...]:
        assert self.parent is not None and self.broadcast is not None
        return (self.parent, self.broadcast)

    def keyed_inputs(self) -> list[tuple[Node, tuple[str, ...]]]:
        return [(self.inputs()[0], self.key)]

    def exchanges(self) -> tuple[Exchange, ...]:
        return (Exchange.KEYED, Exchange.BROADCAST)  # (2.) every task gets every broadcast record

    def input_keys(self) -> tuple[tuple[str, ...], ...]:
        return (self.key, ())

    @property
    def broadcast_state_names(self) -> tuple[str, ...]:
        """(4.) Its states read whole by every task (the first task's changes staged)."""
        return tuple(d.name for d in self.descriptors)

    def state_specs(self, inputs: Sequence[pa.Schema] | None = None) -> list[StateSpec]:
        return [*super().state_specs(inputs), *(_spec(self.operator_id, d) for d in self.descriptors)]

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        _, broadcast = inputs
        if SEQ not in broadcast.names:  # (2.)
            raise PipelineDefinitionError(
                f"broadcast process {self.operator_id!r}: the broadcast stream carries no arrival position ([{SEQ!r}]), so the "
                "order of its records is unknown; broadcast a stream straight from its source or its stateless operators"
            )
        return super().output_schema(inputs)

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        """Steps 2-4 of the module docstring; returns the rows both sides emitted."""
        keyed, broadcast = inputs
        fn = self.function
        assert isinstance(fn, KeyedBroadcastProcessFunction)
        label = f"broadcast process {self.operator_id!r}"
        # 2. The epoch's broadcast records, in arrival order, from the state epoch n-1 committed.
        if broadcast.num_rows > MAX_BROADCAST_RECORDS:
            raise UserFunctionError(
                f"{label}: the broadcast stream holds more than {MAX_BROADCAST_RECORDS} records in this epoch; it is for "
                "low-volume input (rules, thresholds), read whole by every key group: key the high-volume stream instead"
            )
        specs = {d.name: _spec(self.operator_id, d) for d in self.descriptors}
        live = {name: task.state(spec).every_live_row() for name, spec in specs.items()}
        before = {name: dict(zip(python_values(t["map_key"]), python_values(t["map_value"]))) for name, t in live.items()}
        states = {name: BroadcastState(dict(stored)) for name, stored in before.items()}
        bctx = BroadcastContext(states, task.epoch, task.processing_time_ms, task.watermark_prev_us)
        emitted: list[dict[str, Any]] = []
        with calling_user_code(label, what="process_broadcast_element"):
            for record in python_rows(in_arrival_order(broadcast)):
                fn.process_broadcast_element(record, bctx, emitted.append)
        # 4. Every task stages the same changes; the first task's are written.
        for name, spec in specs.items():
            check_held_state_size(self.operator_id, name, len(after := states[name].snapshot()))
            changes = _changes(spec, before[name], after, task.processing_time_ms, task.epoch)
            task.state(spec).stage(changes.drop_columns([UPDATED_AT, EPOCH]))
        columns = fn.output_schema.names
        for row in emitted:  # (2.) exactly the columns of output_schema
            if not isinstance(row, Mapping) or set(row) != set(columns):
                raise UserFunctionError(
                    f"{label}: process_broadcast_element emitted {sorted(row) if isinstance(row, Mapping) else repr(row)}, "
                    f"not the columns of its output_schema {columns}"
                )
        broadcast_rows = rows_table(label, emitted, fn.output_schema)
        # 3. The keyed side, with the broadcast state as step 2 left it.
        out = self.run_keyed(task, [keyed], {name: ReadOnlyBroadcastState(s.snapshot()) for name, s in states.items()})
        return pa.concat_tables([out, broadcast_rows]) if task.first_task else out  # (2.) once: in the first task's output


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
    # Staged even when empty: an epoch's cut (what queries and savepoints read) names only the tables it committed.
    rows = [{"map_key": k, "map_value": v, DELETED: deleted} for k, v, deleted in changed]
    misfit = (
        f"broadcast state {spec.name!r} of {spec.operator_id!r}: a key or value put does not fit its declared "
        f"types ({spec.key_fields[0].type} -> {spec.value_fields[0].type})"
    )
    return held_state_table(spec, rows, epoch, processing_time_ms, misfit)
