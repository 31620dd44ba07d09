"""The broadcast state pattern, as Flink's ``KeyedBroadcastProcessFunction``.

A low-volume stream (rules, thresholds) is broadcast with the map states it
fills, ``rules.broadcast(THRESHOLDS)``, and connected to a keyed stream:
``payments.key_by("country").connect(broadcast).process("flag", fn)``.
``fn.process_broadcast_element`` updates the broadcast state;
``fn.process_element`` reads it (read-only) beside its keyed state and
timers. Within epoch n:

1. Alignment: both inputs' records up to barrier n are processed in epoch n.
2. Broadcast side first: epoch n's broadcast records run
   ``process_broadcast_element`` in arrival order (``_seq``), on the driver
   (a broadcast stream is low-volume: more than
   :data:`MAX_BROADCAST_RECORDS` records in one epoch is an error), starting
   from the broadcast state committed by epoch n-1. They may emit rows.
3. Then the keyed side, exactly as a :class:`KeyedProcessFunction`
   (per key, records in arrival order, then due timers), every key reading
   the broadcast state as step 2 left it. So results depend neither on
   parallelism nor on how the two inputs interleave within the epoch (Flink
   applies them in arrival order, which differs between instances).
4. Broadcast state is one Delta table per map state descriptor,
   ``<operator>__<name>`` (``map_key``, ``map_value``), staged and committed
   with the epoch and kept by savepoints. Every key group reads it whole,
   as every Flink instance holds a copy: rescaling redistributes nothing.
   A map state grown past ``MAX_DRIVER_STATE_ELEMENTS`` (1,000,000)
   entries fails the epoch, saying so.
5. Watermark: the keyed side's (a broadcast stream usually carries none,
   and would otherwise hold every timer back).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.api.state import MapStateDescriptor
from barrierflow.connectors.source import SEQ
from barrierflow.core.errors import PipelineDefinitionError, UserFunctionError
from barrierflow.operators.base import Node, check_driver_state_size, position_columns, user_columns
from barrierflow.operators.process import KeyedContext, KeyedFunction, KeyedProcess, KeyedProcessFunction
from barrierflow.state.spec import KEY_GROUP, StateSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "KeyedBroadcastProcessFunction",
    "BroadcastContext",
    "ReadOnlyBroadcastState",
    "BroadcastState",
    "KeyedBroadcastProcess",
    "MAX_BROADCAST_RECORDS",
]

MAX_BROADCAST_RECORDS = 100_000


class ReadOnlyBroadcastState:
    """A broadcast map state as the keyed side sees it (3.): read, never written."""

    def __init__(self, values: Mapping[Any, Any]) -> None:
        self._values = values

    def get(self, key: Any) -> Any:
        return self._values.get(key)

    def contains(self, key: Any) -> bool:
        return key in self._values

    def items(self) -> Iterator[tuple[Any, Any]]:
        return iter(dict(self._values).items())

    def keys(self) -> Iterator[Any]:
        return iter(list(self._values))


class BroadcastState(ReadOnlyBroadcastState):
    """A broadcast map state as the broadcast side sees it (2.)."""

    def __init__(self, values: dict[Any, Any]) -> None:
        super().__init__(values)
        self._writable = values

    def put(self, key: Any, value: Any) -> None:
        self._writable[key] = value

    def remove(self, key: Any) -> None:
        self._writable.pop(key, None)

    def clear(self) -> None:
        self._writable.clear()


class BroadcastContext:
    """What ``process_broadcast_element`` sees: the broadcast states (writable) and the epoch's clocks."""

    def __init__(self, states: dict[str, BroadcastState], epoch: int, processing_time_ms: int, watermark_us: int | None) -> None:
        self._states = states
        self.epoch = epoch
        self.processing_time_ms = processing_time_ms
        self._watermark_us = watermark_us

    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> BroadcastState:
        return _lookup(self._states, descriptor)

    def current_watermark(self) -> int | None:
        """W(n-1) in microseconds (None before any event time), as the keyed records of the epoch see it."""
        return self._watermark_us

    def current_processing_time(self) -> int:
        return self.processing_time_ms


def _lookup(states: Mapping[str, Any], descriptor: MapStateDescriptor) -> Any:
    state = states.get(getattr(descriptor, "name", None))  # type: ignore[arg-type]
    if state is None:
        raise PipelineDefinitionError(
            f"broadcast state {getattr(descriptor, 'name', descriptor)!r} is not one the stream was broadcast with: "
            f"declare it in rules.broadcast(...); broadcast here: {sorted(states)}"
        )
    return state


class KeyedBroadcastProcessFunction(KeyedFunction):
    """Subclass and implement :meth:`process_element` and :meth:`process_broadcast_element`.

    ``process_element`` is a :class:`KeyedProcessFunction`'s (keyed state,
    timers, ``on_timer``), and ``ctx.get_broadcast_state(descriptor)`` gives
    a read-only view of a broadcast state. ``process_broadcast_element``
    gets a :class:`BroadcastContext`, whose broadcast states it may change.
    Both emit rows of ``output_schema`` with ``out``.
    """

    def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Callable[[dict[str, Any]], None]) -> None:
        raise NotImplementedError

    def process_broadcast_element(
        self, record: dict[str, Any], ctx: BroadcastContext, out: Callable[[dict[str, Any]], None]
    ) -> None:
        raise NotImplementedError

    # The keyed side runs as a KeyedProcessFunction's records do.
    element_calls = KeyedProcessFunction.element_calls


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

    def state_specs(self) -> list[StateSpec]:
        return [*super().state_specs(), *(_spec(self.operator_id, d) for d in self.descriptors)]

    def apply_inputs(self, ctx: Any, frames: Sequence["DataFrame"]) -> "DataFrame":
        """Steps 2-3 of the module docstring; returns the emitted rows of both sides."""
        keyed, broadcast = frames
        fn = self.function
        assert isinstance(fn, KeyedBroadcastProcessFunction)
        records = _broadcast_records(self.operator_id, broadcast)
        before = {d.name: _map_of(ctx.state.read_arrow(_spec(self.operator_id, d), [0])) for d in self.descriptors}
        states = {name: BroadcastState(dict(stored)) for name, stored in before.items()}
        bctx = BroadcastContext(states, ctx.epoch, ctx.processing_time_ms, ctx.watermark_prev_us)
        emitted: list[dict[str, Any]] = []
        for record in records:  # 2.
            fn.process_broadcast_element(record, bctx, emitted.append)
        for d in self.descriptors:
            check_driver_state_size(self.operator_id, d.name, len(states[d.name]._writable))
            _stage_changes(ctx, _spec(self.operator_id, d), before[d.name], states[d.name]._writable)
        # 3. The keyed side, with the broadcast state as step 2 left it (shipped with the function).
        view = {name: ReadOnlyBroadcastState(dict(state._writable)) for name, state in states.items()}
        keyed_fn = copy.copy(fn)
        keyed_fn.broadcast_view = lambda: view  # type: ignore[method-assign]
        out = self.process_records(ctx, keyed, keyed_fn)
        if not emitted:
            return out
        rows = _emitted_table(self.operator_id, emitted, fn.output_schema)
        return out.unionByName(ctx.frame(rows))

    # -- the chained form (barrierflow.execution.chained_region): apply_inputs in one task

    def chained_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema | None:
        keyed, broadcast = inputs
        assert self.function is not None
        if SEQ not in broadcast.names:
            return None  # no arrival position: Spark's path raises the error
        return self._chained_output(keyed, self.function)

    def chained_state_specs(self, inputs: Sequence[pa.Schema]) -> list[StateSpec]:
        return [*super().chained_state_specs(inputs), *(_spec(self.operator_id, d) for d in self.descriptors)]

    def apply_chained(self, task: Any, inputs: Sequence[pa.Table]) -> pa.Table:
        """Steps 2-3 as :meth:`apply_inputs` runs them, the broadcast state read with ``task.every_live_row``.

        Whatever Spark's path would fail the epoch on (a user function's
        error, too many broadcast records or map entries, a put or an emitted
        row that does not fit) declines before anything is staged: Spark's
        path then raises its own error.
        """
        from barrierflow.execution.chained_region import RegionDeclined

        keyed, broadcast = inputs
        fn = self.function
        assert isinstance(fn, KeyedBroadcastProcessFunction)
        if broadcast.num_rows > MAX_BROADCAST_RECORDS:
            raise RegionDeclined(f"broadcast process {self.operator_id}: more than {MAX_BROADCAST_RECORDS} broadcast records")
        specs = {d.name: _spec(self.operator_id, d) for d in self.descriptors}
        before = {}
        for name, spec in specs.items():  # the state epoch n-1 committed, in key group 0 as read_arrow reads it
            stored = task.every_live_row(spec)
            before[name] = _map_of(stored.filter(pc.equal(stored.column(KEY_GROUP), 0)))
        states = {name: BroadcastState(dict(stored)) for name, stored in before.items()}
        bctx = BroadcastContext(states, task.epoch, task.processing_time_ms, task.watermark_prev_us)
        emitted: list[dict[str, Any]] = []
        try:
            for record in _ordered_records(broadcast):  # 2.
                fn.process_broadcast_element(record, bctx, emitted.append)
            changes = {}
            for name, spec in specs.items():
                check_driver_state_size(self.operator_id, name, len(states[name]._writable))
                changes[name] = _changes(spec, before[name], states[name]._writable, task.processing_time_ms, task.epoch)
            rows = _emitted_table(self.operator_id, emitted, fn.output_schema) if emitted else None
        except Exception as exc:  # noqa: BLE001 - the user's function failed: Spark's path raises it, as its error
            raise RegionDeclined(f"broadcast process {self.operator_id}: {type(exc).__name__}: {exc}") from exc
        broadcast_rows = None if rows is None else self.chained_rows(rows, fn)
        # 3. The keyed side, with the broadcast state as step 2 left it.
        view = {name: ReadOnlyBroadcastState(dict(state._writable)) for name, state in states.items()}
        keyed_fn = copy.copy(fn)
        keyed_fn.broadcast_view = lambda: view  # type: ignore[method-assign]
        out = self.process_chained(task, keyed, keyed_fn)
        for name, spec in specs.items():
            task.stage(spec, changes[name].drop_columns(["_updated_at_ms", "_epoch"]))
        return out if broadcast_rows is None else pa.concat_tables([out, broadcast_rows])

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "broadcast_states": {d.name: d.signature() for d in self.descriptors}}


def _map_of(stored: pa.Table) -> dict[Any, Any]:
    """A broadcast state's map from its table's live rows."""
    return dict(zip(stored.column("map_key").to_pylist(), stored.column("map_value").to_pylist()))


def _broadcast_records(operator_id: str, broadcast: "DataFrame") -> list[dict[str, Any]]:
    """The epoch's broadcast records, in arrival order, on the driver (2.)."""
    columns = user_columns(broadcast)
    order = position_columns(broadcast.columns)
    missing = [c for c in order if c not in broadcast.columns]
    if missing:
        raise PipelineDefinitionError(
            f"broadcast process {operator_id!r}: the broadcast stream carries no arrival position ({missing}), so the "
            "order of its records is unknown; broadcast a stream straight from its source or its stateless operators"
        )
    table = broadcast.select(*columns, *order).limit(MAX_BROADCAST_RECORDS + 1).toArrow()
    if table.num_rows > MAX_BROADCAST_RECORDS:
        raise UserFunctionError(
            f"broadcast process {operator_id!r}: the broadcast stream holds more than {MAX_BROADCAST_RECORDS} records "
            "in this epoch; a broadcast stream is for low-volume input (rules, thresholds), read whole by every key "
            "group: key the high-volume stream instead"
        )
    return _ordered_records(table)


def _ordered_records(table: pa.Table) -> list[dict[str, Any]]:
    """The broadcast records of ``table`` (user and position columns) as dicts of their user columns, in arrival order (2.)."""
    order = position_columns(table.column_names)
    users = [c for c in table.column_names if not c.startswith("_")]
    return table.sort_by([(c, "ascending") for c in order]).select(users).to_pylist()


def _stage_changes(ctx: Any, spec: StateSpec, before: Mapping[Any, Any], after: Mapping[Any, Any]) -> None:
    """(4.) Stage the rows for the map keys step 2 put, changed or removed."""
    ctx.state.stage_arrow(spec, _changes(spec, before, after, ctx.processing_time_ms, ctx.epoch))


def _changes(
    spec: StateSpec, before: Mapping[Any, Any], after: Mapping[Any, Any], processing_time_ms: int, epoch: int
) -> pa.Table:
    """(4.) Rows for the map keys step 2 put, changed or removed."""
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
        {"map_key": k, KEY_GROUP: 0, "map_value": v, "_updated_at_ms": processing_time_ms, "_deleted": deleted, "_epoch": epoch}
        for k, v, deleted in changed
    ]
    try:
        return pa.Table.from_pylist(rows, schema=spec.arrow_schema())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
        raise UserFunctionError(
            f"broadcast state {spec.name!r} of {spec.operator_id!r}: a key or value put does not fit its declared "
            f"types ({spec.key_fields[0].type} -> {spec.value_fields[0].type}): {exc}"
        ) from None


def _emitted_table(operator_id: str, rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    declared = set(schema.names)
    for row in rows:
        if set(row) != declared:
            raise UserFunctionError(
                f"broadcast process {operator_id!r}: process_broadcast_element emitted {sorted(row)}, not the columns "
                f"of its output_schema {schema.names}"
            )
    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
        raise UserFunctionError(f"broadcast process {operator_id!r}: an emitted row does not fit output_schema: {exc}") from None
