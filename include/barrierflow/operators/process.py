"""Keyed process functions: user Python with per-key state and timers, over the epoch's Arrow records.

``stream.key_by(k).process(id, fn)`` runs a ``KeyedProcessFunction``. In epoch n, every task (holding some key groups, and every
record of their keys):

1. Keys: those of its records (any key type with a key group, null included) and those with a timer due (timers 2.-3.); by key
   group, then key.
2. State: each declared state is the table ``<operator_id>__<name>`` (the key columns, ``value`` of the declared type, its TTL);
   the keys' live rows and timers are read once, handed to the function scoped to the current key.
3. Per key: its records in arrival order (``_seq``, then sub-positions; an input without positions: by its columns), then its due
   timers (timers 1.-4.).
4. The handles a key changed are staged (cleared or emptied: a tombstone), its timers added and removed; the rows emitted are the
   output.
5. An exception of the function, or a state value or emitted row that does not fit its declared type (a null in a not-null column
   included) fails the epoch with a ``UserFunctionError`` naming the operator and key.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import AbstractSet, Any, ClassVar, Mapping, Sequence
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.api.functions import KeyedContext, KeyedFunction, KeyedProcessFunction
from barrierflow.api.keyed_state import HANDLES
from barrierflow.api.state import EVEN_SPLIT, ListStateDescriptor
from barrierflow.api.timers import TimeDomain, TimerService, from_micros
from barrierflow.core.arrow import row_numbers
from barrierflow.core.columns import DELETED, KEY_GROUP, is_engine_column, position_columns, user_columns
from barrierflow.core.errors import PipelineDefinitionError, UserFunctionError
from barrierflow.operators.base import Node, Task, calling_user_code, ids_in, key_fields, key_ids, with_key_group
from barrierflow.operators.timers import TIMER_DOMAIN, TIMER_STATE, TIMER_TIMESTAMP, due_timer_mask, pop_due, timer_spec
from barrierflow.state.spec import StateSpec

# KeyedProcessFunction and KeyedContext stay importable from here (plan/pipeline.py).
__all__ = ["KeyedProcessFunction", "KeyedProcess", "python_values", "python_rows", "rows_table"]

_UTC_EPOCH = datetime(1970, 1, 1, tzinfo=ZoneInfo("UTC"))
_DOMAINS = (TimeDomain.EVENT_TIME.value, TimeDomain.PROCESSING_TIME.value)  # a stored timer's domain, as the service's sets


@dataclass
class KeyedProcess(Node):
    key: tuple[str, ...] = ()
    function: KeyedFunction | None = None

    # The function it runs, how to get one to run otherwise, the methods each keyed input's records go to, its name in errors.
    function_type: ClassVar[type[KeyedFunction]] = KeyedProcessFunction
    other_use: ClassVar[str] = "a KeyedCoProcessFunction runs on two keyed streams: a.key_by(k).connect(b.key_by(k)).process(...)"
    element_methods: ClassVar[tuple[str, ...]] = ("process_element",)
    what: ClassVar[str] = "process"

    def __post_init__(self) -> None:
        if not isinstance(self.function, self.function_type):
            got = "none" if self.function is None else f"a {type(self.function).__qualname__}"
            raise PipelineDefinitionError(
                f"process {self.operator_id}: a {self.function_type.__name__} (an instance of a subclass) is required, "
                f"got {got}; {self.other_use}"
            )
        descriptors = self.function.state_descriptors
        union = [d.name for d in descriptors if isinstance(d, ListStateDescriptor) and d.redistribution != EVEN_SPLIT]
        if union:
            raise PipelineDefinitionError(
                f"process {self.operator_id}: list state(s) {union} declare redistribution, which only operator "
                "state has (a non-keyed bf.ProcessFunction's, redistributed among subtasks); keyed state moves "
                "with its key group: drop redistribution=..."
            )
        if self.function.uses_timers() and TIMER_STATE in [d.name for d in descriptors]:
            raise PipelineDefinitionError(
                f"process {self.operator_id}: state name {TIMER_STATE!r} is the table of the function's timers "
                "(it implements on_timer): give the state another name"
            )

    @property
    def uses_watermark(self) -> bool:  # type: ignore[override]
        return self.function is not None and self.function.uses_timers()

    def state_specs(self, inputs: Sequence[pa.Schema] | None = None) -> list[StateSpec]:
        """(2.) The declared states' tables, then the timers' (with ``on_timer``), keys typed by the first input's."""
        assert self.function is not None
        key = key_fields(self.key, inputs[0] if inputs else None)
        states = [
            StateSpec(self.operator_id, d.name, key, (pa.field("value", d.value_type),), d.ttl.ttl_ms if d.ttl else None)
            for d in self.function.state_descriptors
        ]
        return states + ([timer_spec(self.operator_id, key)] if self.function.uses_timers() else [])

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        assert self.function is not None
        return self.function.output_schema

    def side_keys(self) -> tuple[tuple[str, ...], ...]:
        """Each keyed input's key columns (the first input's name the state's key columns)."""
        return (self.key,)

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        return self.run_keyed(task, inputs, {})

    def run_keyed(self, task: Task, sides: Sequence[pa.Table], broadcast: Mapping[str, Any]) -> pa.Table:
        """Steps 1-5 over the records of each keyed input (``sides``), the keyed side reading ``broadcast``."""
        fn = self.function
        assert fn is not None
        label = f"{self.what} {self.operator_id!r}"
        key = list(self.key)
        descriptors = fn.state_descriptors
        states = KeyedProcess.state_specs(self, [sides[0].schema])  # the keyed states, not a subclass's
        timers = states.pop() if fn.uses_timers() else None
        side_keys = self.side_keys()
        keyed = [with_key_group(rows, names, task.key_groups) for rows, names in zip(sides, side_keys)]
        # 1. The keys of the records (named as the first input's), and those holding a due timer.
        key_parts = [rows.select([*names, KEY_GROUP]).rename_columns([*key, KEY_GROUP]) for rows, names in zip(keyed, side_keys)]
        every_timer = task.state(timers).every_live_row() if timers else None
        watermark_us = task.watermark_us  # W(n): no assigner observes while this operator runs (the clock computes it per call)
        if every_timer is not None:
            due = every_timer.filter(due_timer_mask(every_timer, watermark_us, task.processing_time_ms))
            key_parts.append(due.select([*key, KEY_GROUP]))
        keys, part_ids = key_ids(key_parts, [KEY_GROUP, *key])
        count = keys.num_rows
        # 2. The state of those keys: each state's value per key, each key's stored timers. One handle per state, one timer service
        # and one context, scoped to each key in turn (as Flink's).
        handles = {d.name: HANDLES[type(d)](d, None) for d in descriptors}
        scoped: list[tuple[Any, list[Any]]] = []  # each handle's load, and the values it takes per key
        for d, spec in zip(descriptors, states):
            live = task.state(spec).live_rows(keys)
            scoped.append((handles[d.name].load, values := [None] * count))
            for i, value in zip(ids_in(keys, live, key), python_values(live.column("value"))):
                values[i] = value
        stored_timers: dict[int, tuple[set[int], set[int]]] = {}  # by key (-1: keys not run): event-, processing-time stamps
        if every_timer is not None:
            stamps = pc.cast(every_timer.column(TIMER_TIMESTAMP), pa.int64()).to_pylist()
            for i, domain, ts in zip(ids_in(keys, every_timer, key), every_timer.column(TIMER_DOMAIN).to_pylist(), stamps):
                stored_timers.setdefault(i, (set(), set()))[_DOMAINS.index(domain)].add(ts)
        # 3. Each key's records in arrival order: their input and row, as one run per key.
        sides_of, rows_of, starts = _processing_order(keyed, part_ids[: len(keyed)], count)
        records = [python_rows(rows) for rows in keyed]
        elements = [getattr(fn, name) for name in self.element_methods]
        emitted: list[dict[str, Any]] = []
        emit, clocks = emitted.append, (task.watermark_prev_us, task.processing_time_ms)
        service = TimerService(*clocks, enabled=timers is not None)
        ctx = KeyedContext((), task.epoch, clocks[1], handles, service, broadcast)
        changed: list[tuple[list[int], list[Any]]] = [([], []) for _ in descriptors]  # per state: the keys changed, their values
        timer_changes: list[tuple[int, str, int, bool]] = []
        current: tuple[Any, ...] = ()
        with calling_user_code(label, lambda: f" (key {current!r})"):  # 5. errors name the operator and the key
            for i, current in enumerate(zip(*(python_values(keys.column(k)) for k in key))):
                for load, values in scoped:
                    load(values[i])
                before: tuple[AbstractSet[int], AbstractSet[int]] = stored_timers.get(i) or (frozenset(), frozenset())
                service.watermark_us, service.event_timers, service.processing_timers = clocks[0], set(before[0]), set(before[1])
                ctx.key, ctx.time_domain = current, None
                for j in range(starts[i], starts[i + 1]):  # timers 1.: records, at W(n-1)
                    elements[sides_of[j]](records[sides_of[j]][rows_of[j]], ctx, emit)
                if service.event_timers or service.processing_timers:  # timers 2.-3.: due timers, at W(n)
                    service.watermark_us = watermark_us
                    while (timer := pop_due(service)) is not None:
                        ctx.time_domain = timer[0]
                        fn.on_timer(from_micros(timer[1]), ctx, emit)
                # 4. Changed handles; timers 4.: the key's timers registered and removed.
                for (ids, values), handle in zip(changed, handles.values()):
                    if handle.dirty:
                        ids.append(i)
                        values.append(handle.stored)
                for domain, was, now in zip(_DOMAINS, before, (service.event_timers, service.processing_timers)):
                    if was != now:  # registered: (.., False), removed: (.., True)
                        timer_changes += [(i, domain, t, t in was) for t in now ^ was]
        # 4. Staged: every state's changed keys, the timers' changes; the output.
        for d, spec, (ids, values) in zip(descriptors, states, changed):
            try:
                value = pa.array(values, d.value_type)
            except Exception as exc:  # noqa: BLE001 - the values came from the user's function
                what = f"state {d.name!r}: a value does not fit its declared type {d.value_type}"
                raise UserFunctionError(f"{label}: {what}: {type(exc).__name__}: {exc}") from None
            rows = keys.take(pa.array(ids, pa.int64())).append_column("value", value)
            task.state(spec).stage(rows.append_column(DELETED, pa.array([v is None for v in values], pa.bool_())))
        if timers is not None:
            timer_changes.sort()  # by key, domain and time stamp
            of_key, domains, stamps, deleted = zip(*timer_changes) if timer_changes else ((), (), (), ())
            rows = keys.take(pa.array(of_key, pa.int64())).append_column(TIMER_DOMAIN, pa.array(domains, pa.string()))
            rows = rows.append_column(TIMER_TIMESTAMP, pa.array(stamps, pa.timestamp("us", tz="UTC")))
            task.state(timers).stage(rows.append_column(DELETED, pa.array(deleted, pa.bool_())))
        return rows_table(label, emitted, fn.output_schema)


def rows_table(label: str, rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Emitted ``rows`` (dicts: a column missing reads null, one not declared is left out) as a table of ``schema`` (5.)."""
    try:
        table = pa.Table.from_pylist(rows, schema=schema)
    except Exception as exc:  # noqa: BLE001 - whatever Arrow says of the values, it is the function's row
        raise UserFunctionError(
            f"{label}: an emitted row does not fit output_schema ({schema.names}): {type(exc).__name__}: {exc}"
        ) from None
    nulls = [f.name for f in schema if not f.nullable and table.column(f.name).null_count]
    if nulls:
        raise UserFunctionError(f"{label}: emitted null(s) in column(s) {nulls}, which its output_schema declares not null")
    return table


def python_values(column: "pa.ChunkedArray | pa.Array") -> list[Any]:
    """``column.to_pylist()``, ten times faster for UTC microsecond timestamps (no zone database per value; the same objects)."""
    kind = column.type
    if pa.types.is_timestamp(kind) and kind.unit == "us" and kind.tz == "UTC":
        epoch, delta = _UTC_EPOCH, timedelta
        return [None if v is None else epoch + delta(microseconds=v) for v in column.cast(pa.int64()).to_pylist()]
    return column.to_pylist()


def python_rows(rows: pa.Table) -> list[dict[str, Any]]:
    """Each row as a function gets it: a dict of its user columns (converted column by column)."""
    names = user_columns(rows.column_names)
    columns = [python_values(rows.column(n)) for n in names]
    return [dict(zip(names, values)) for values in zip(*columns)] if names else [{} for _ in range(rows.num_rows)]


def _processing_order(sides: Sequence[pa.Table], ids: Sequence[np.ndarray], count: int) -> tuple[list[int], list[int], list[int]]:
    """(3.) The records of every input, by key then arrival: each one's input and row, and where each key's run starts. Arrival:
    the positions any input carries (0 where it lacks one), then the input (a record reaching both: the first first); without
    positions, a single input's records order by their columns."""
    carried = position_columns(list({c for rows in sides for c in rows.column_names}))
    unsorted = (pa.types.is_nested, pa.types.is_dictionary, pa.types.is_null)  # types Arrow does not sort by
    users = [] if carried or len(sides) > 1 else [f for f in sides[0].schema if not is_engine_column(f.name)]
    fallback = [f.name for f in users if not any(is_type(f.type) for is_type in unsorted)]
    parts = []
    for side, (rows, of_rows) in enumerate(zip(sides, ids)):
        n = rows.num_rows
        columns: dict[str, Any] = {"_id": pa.array(of_rows, pa.int64())}
        for c in carried:
            columns[c] = rows.column(c).cast(pa.int64()) if c in rows.column_names else pa.repeat(pa.scalar(0, pa.int64()), n)
        columns["_side"] = pa.repeat(pa.scalar(side, pa.int32()), n)
        columns.update({f"_by_{c}": rows.column(c) for c in fallback})
        columns["_row"] = row_numbers(n)
        parts.append(pa.table(columns))
    table = pa.concat_tables(parts).sort_by([(c, "ascending") for c in parts[0].column_names])  # in the order they were added
    starts = np.searchsorted(table.column("_id").to_numpy(), np.arange(count + 1), side="left").tolist()
    return table.column("_side").to_pylist(), table.column("_row").to_pylist(), starts
