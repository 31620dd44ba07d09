"""Keyed process functions: user Python with per-key state and timers, over the epoch's Arrow records.

``stream.key_by(k).process(id, fn)`` runs a
:class:`~barrierflow.api.functions.KeyedProcessFunction`. Within epoch n, in
every task (each holding some key groups, and every record of their keys):

1. Keys. The keys run are those of the task's records (a key of any type
   that has a key group, null included) and those holding a timer due this
   epoch (:mod:`barrierflow.operators.timers` 2.-3.), with or without a
   record; by key group, then by key.
2. State. Each declared state is the table ``<operator_id>__<name>`` (the
   key columns, ``value`` of the descriptor's type as declared, its TTL);
   the live rows of the keys run are read once, the stored timers of those
   keys too, and handed to the function as handles scoped to the current
   key, as Flink does.
3. Per key: its records in arrival order (``_seq``, then sub-positions; an
   input without positions: by its columns), then its due timers: steps
   1.-4. of :mod:`barrierflow.operators.timers`.
4. Changes. The handles a key changed are staged (one cleared, or emptied:
   a tombstone), and its timers added and removed; what the function
   emitted is the output, in its ``output_schema``.
5. Errors. An exception of the function, a state value or emitted row that
   does not fit its declared type, or a null emitted in a column declared
   not null fails the epoch with a :class:`~barrierflow.core.errors.UserFunctionError`
   naming the operator (and the key); a retry replays the same barrier.

The same per-key loop runs a co-process function's two inputs
(:mod:`barrierflow.operators.co_process`) and a broadcast process
function's keyed side (:mod:`barrierflow.operators.broadcast`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable, ClassVar, Mapping, Sequence
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.api.functions import Emit, KeyedContext, KeyedFunction, KeyedProcessFunction, declared_states
from barrierflow.api.keyed_state import state_for
from barrierflow.api.state import EVEN_SPLIT, ListStateDescriptor, StateDescriptor
from barrierflow.core.columns import DELETED, KEY_GROUP, position_columns, user_columns
from barrierflow.core.errors import PipelineDefinitionError, UserFunctionError
from barrierflow.operators.base import Node, Task, with_key_group
from barrierflow.operators.timers import (
    TIMER_DOMAIN,
    TIMER_STATE,
    TIMER_TIMESTAMP,
    EpochClocks,
    TimeDomain,
    TimerService,
    due_timer_mask,
    from_micros,
    timer_spec,
)
from barrierflow.state.spec import StateSpec

# Importable from here as before (barrierflow/__init__.py, plan/pipeline.py).
__all__ = [
    "KeyedFunction", "KeyedProcessFunction", "KeyedContext", "KeyedProcess", "Element", "declared_states",
    "python_values", "rows_table", "key_ids",
]  # fmt: skip

# A function's method for one record: (record, ctx, out).
Element = Callable[[dict[str, Any], KeyedContext, Emit], None]


@dataclass
class KeyedProcess(Node):
    key: tuple[str, ...] = ()
    function: KeyedFunction | None = None

    # The kind of function this operator runs, and how to get one to run it otherwise.
    function_type: ClassVar[type[KeyedFunction]] = KeyedProcessFunction
    other_use: ClassVar[str] = (
        "a KeyedCoProcessFunction runs on two connected keyed streams: a.key_by(k).connect(b.key_by(k)).process(...)"
    )
    # How its errors name it.
    what: ClassVar[str] = "process"

    def __post_init__(self) -> None:
        if not isinstance(self.function, self.function_type):
            got = "none" if self.function is None else f"a {type(self.function).__qualname__}"
            raise PipelineDefinitionError(
                f"process {self.operator_id}: a {self.function_type.__name__} (an instance of a subclass) is required, "
                f"got {got}; {self.other_use}"
            )
        names = [d.name for d in self.function.state_descriptors]
        union = [
            d.name
            for d in self.function.state_descriptors
            if isinstance(d, ListStateDescriptor) and d.redistribution != EVEN_SPLIT
        ]
        if union:
            raise PipelineDefinitionError(
                f"process {self.operator_id}: list state(s) {union} declare redistribution, which only operator "
                "state has (a non-keyed bf.ProcessFunction's, redistributed among subtasks); keyed state moves "
                "with its key group: drop redistribution=..."
            )
        if len(names) != len(set(names)):
            raise PipelineDefinitionError(f"process {self.operator_id}: duplicate state names {names}")
        if self.function.uses_timers() and TIMER_STATE in names:
            raise PipelineDefinitionError(
                f"process {self.operator_id}: state name {TIMER_STATE!r} is the table of the function's timers "
                "(it implements on_timer): give the state another name"
            )

    @property
    def uses_watermark(self) -> bool:  # type: ignore[override]
        return self.function is not None and self.function.uses_timers()

    # -- what it declares ----------------------------------------------------

    def _key_types(self, inputs: Sequence[pa.Schema] | None) -> dict[str, pa.DataType]:
        """The key columns' types: the (first) keyed input's; strings without inputs (the untyped default)."""
        if not inputs:
            return {}
        schema = inputs[0]
        return {k: schema.field(k).type for k in self.key if k in schema.names}

    def _spec(self, descriptor: StateDescriptor, key_types: Mapping[str, pa.DataType] | None = None) -> StateSpec:
        """(2.) A declared state's table."""
        types = key_types or {}
        ttl = descriptor.ttl
        return StateSpec(
            operator_id=self.operator_id,
            name=descriptor.name,
            key_fields=tuple(pa.field(k, types.get(k, pa.string())) for k in self.key),
            value_fields=(pa.field("value", descriptor.value_type),),
            ttl_ms=ttl.ttl_ms if ttl else None,
        )

    def _timer_spec(self, key_types: Mapping[str, pa.DataType] | None = None) -> StateSpec | None:
        assert self.function is not None
        if not self.function.uses_timers():
            return None
        types = key_types or {}
        return timer_spec(self.operator_id, tuple(pa.field(k, types.get(k, pa.string())) for k in self.key))

    def keyed_state_specs(self, inputs: Sequence[pa.Schema] | None = None) -> list[StateSpec]:
        """The declared states' tables, then the timers' (if the function implements ``on_timer``)."""
        assert self.function is not None
        types = self._key_types(inputs)
        timers = self._timer_spec(types)
        return [self._spec(d, types) for d in self.function.state_descriptors] + ([timers] if timers else [])

    def state_specs(self, inputs: Sequence[pa.Schema] | None = None) -> list[StateSpec]:
        return self.keyed_state_specs(inputs)

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        assert self.function is not None
        return self.function.output_schema

    # -- the kernel ------------------------------------------------------------

    def side_keys(self) -> tuple[tuple[str, ...], ...]:
        """Each keyed input's key columns (the first input's name the state's key columns)."""
        return (self.key,)

    def elements(self, fn: KeyedFunction) -> list[Element]:
        """The method each keyed input's records are handed to."""
        assert isinstance(fn, KeyedProcessFunction)
        return [fn.process_element]

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        (records,) = inputs
        return self.run_keyed(task, [records], {})

    def run_keyed(self, task: Task, sides: Sequence[pa.Table], broadcast: Mapping[str, Any]) -> pa.Table:
        """Steps 1-5 over the records of each keyed input (``sides``), the keyed side reading ``broadcast``."""
        fn = self.function
        assert fn is not None
        key = list(self.key)
        key_types = {k: sides[0].schema.field(k).type for k in key}
        descriptors = fn.state_descriptors
        specs = [self._spec(d, key_types) for d in descriptors]
        timers = self._timer_spec(key_types)
        keyed = [with_key_group(rows, names, task.key_groups) for rows, names in zip(sides, self.side_keys())]
        # 1. The keys of the records (named as the first input's), and those holding a due timer.
        key_parts = [
            rows.select([*names, KEY_GROUP]).rename_columns([*key, KEY_GROUP]) for rows, names in zip(keyed, self.side_keys())
        ]
        every_timer = None
        if timers is not None:
            every_timer = task.state(timers).every_live_row()
            key_parts.append(
                every_timer.filter(due_timer_mask(every_timer, task.watermark_us, task.processing_time_ms)).select(
                    [*key, KEY_GROUP]
                )
            )
        keys, part_ids = key_ids(key_parts, [KEY_GROUP, *key])
        record_ids = part_ids[: len(keyed)]
        count = keys.num_rows
        # 2. The state of those keys: each state's value per key, each key's stored timers.
        stored: dict[str, list[Any]] = {}
        for d, spec in zip(descriptors, specs):
            live = task.state(spec).live_rows(keys)
            values: list[Any] = [None] * count
            for i, value in zip(_ids_in(keys, live, key), python_values(live.column("value"))):
                if i >= 0:
                    values[i] = value
            stored[d.name] = values
        stored_timers: list[set[tuple[TimeDomain, int]]] = [set() for _ in range(count)]
        if every_timer is not None:
            stamps = pc.cast(every_timer.column(TIMER_TIMESTAMP), pa.int64()).to_pylist()
            for i, domain, ts in zip(_ids_in(keys, every_timer, key), every_timer.column(TIMER_DOMAIN).to_pylist(), stamps):
                if i >= 0:  # a timer of a key run
                    stored_timers[i].add((TimeDomain(domain), ts))
        # 3. Each key's records in arrival order: their input and row, as one run per key.
        sides_of, rows_of, starts = _processing_order(keyed, record_ids, count)
        records = [_records(rows) for rows in keyed]
        elements = self.elements(fn)
        clocks = EpochClocks(task.epoch, task.processing_time_ms, task.watermark_prev_us, task.watermark_us)
        key_values = list(zip(*(python_values(keys.column(k)) for k in key))) if count else []
        emitted: list[dict[str, Any]] = []
        changed: dict[str, tuple[list[int], list[Any]]] = {d.name: ([], []) for d in descriptors}
        timer_changes: list[tuple[int, str, int, bool]] = []
        current: tuple[Any, ...] | None = None
        try:
            for i in range(count):
                current = key_values[i]
                handles = {d.name: state_for(d, stored[d.name][i]) for d in descriptors}
                before = stored_timers[i]
                service = TimerService(
                    clocks.watermark_prev_us, clocks.processing_time_ms, set(before), enabled=timers is not None
                )
                ctx = KeyedContext(current, clocks.epoch, clocks.processing_time_ms, handles, service, broadcast)
                for j in range(starts[i], starts[i + 1]):  # timers 1.: records, at W(n-1)
                    side = sides_of[j]
                    elements[side](records[side][rows_of[j]], ctx, emitted.append)
                if timers is not None:  # timers 2.-3.: due timers, at W(n)
                    service.watermark_us = clocks.watermark_us
                    while (timer := clocks.next_due(service.timers)) is not None:
                        service.timers.discard(timer)
                        ctx.time_domain = timer[0]
                        fn.on_timer(from_micros(timer[1]), ctx, emitted.append)
                    ctx.time_domain = None
                # 4. Changed handles; timers 4.: the key's timers registered and removed.
                for name, handle in handles.items():
                    if handle.dirty:
                        changed[name][0].append(i)
                        changed[name][1].append(handle.stored)
                for (domain, ts), deleted in sorted(
                    [*((t, False) for t in service.timers - before), *((t, True) for t in before - service.timers)],
                    key=lambda change: (change[0][0].value, change[0][1]),
                ):
                    timer_changes.append((i, domain.value, ts, deleted))
        except (PipelineDefinitionError, UserFunctionError) as exc:  # 5. the API's own errors, with where they happened
            raise type(exc)(f"{self.what} {self.operator_id!r} (key {current!r}): {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - 5. the user's function failed: the epoch fails, naming it
            raise UserFunctionError(
                f"{self.what} {self.operator_id!r}: the function raised {type(exc).__name__}: {exc} (key {current!r})"
            ) from exc
        # 4. Staged: every state's changed keys, the timers' changes; the output.
        for d, spec in zip(descriptors, specs):
            ids, values = changed[d.name]
            rows = keys.take(pa.array(ids, pa.int64()))
            value = _typed(values, d.value_type, f"{self.what} {self.operator_id!r}: state {d.name!r}")
            task.state(spec).stage(
                rows.append_column("value", value).append_column(DELETED, pa.array([v is None for v in values], pa.bool_()))
            )
        if timers is not None:
            rows = keys.take(pa.array([c[0] for c in timer_changes], pa.int64()))
            rows = rows.append_column(TIMER_DOMAIN, pa.array([c[1] for c in timer_changes], pa.string()))
            rows = rows.append_column(
                TIMER_TIMESTAMP, pa.array([c[2] for c in timer_changes], pa.int64()).cast(pa.timestamp("us", tz="UTC"))
            )
            task.state(timers).stage(rows.append_column(DELETED, pa.array([c[3] for c in timer_changes], pa.bool_())))
        return rows_table(f"{self.what} {self.operator_id!r}", emitted, fn.output_schema)

    def describe(self) -> dict[str, Any]:
        assert self.function is not None
        return {
            **super().describe(),
            "key": list(self.key),
            "function": type(self.function).__qualname__,
            "states": {d.name: d.signature() for d in self.function.state_descriptors},
            "timers": self.function.uses_timers(),
        }


def rows_table(label: str, rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Emitted ``rows`` (dicts; a column missing reads null, one not declared is left out) as a table of ``schema``.

    A value of the wrong type, or a null in a column declared not null, is
    the function's error: :class:`UserFunctionError` naming the column.
    """
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


def _typed(values: list[Any], type_: pa.DataType, label: str) -> pa.Array:
    """State values as an array of their declared type, or the function's error."""
    try:
        return pa.array(values, type_)
    except Exception as exc:  # noqa: BLE001 - the values came from the user's function
        raise UserFunctionError(f"{label}: a value does not fit its declared type {type_}: {type(exc).__name__}: {exc}") from None


def python_values(column: "pa.ChunkedArray | pa.Array") -> list[Any]:
    """``column.to_pylist()``, faster for UTC microsecond timestamps (event times).

    pyarrow builds each zone-aware datetime through the zone database, about
    ten times slower than adding the offset to the epoch; the objects are the
    same (``tzinfo`` is ``zoneinfo.ZoneInfo("UTC")`` either way).
    """
    kind = column.type
    if pa.types.is_timestamp(kind) and kind.unit == "us" and kind.tz == "UTC":
        epoch, delta = _UTC_EPOCH, timedelta
        return [None if v is None else epoch + delta(microseconds=v) for v in column.cast(pa.int64()).to_pylist()]
    return column.to_pylist()


_UTC_EPOCH = datetime(1970, 1, 1, tzinfo=ZoneInfo("UTC"))


def _records(rows: pa.Table) -> list[dict[str, Any]]:
    """Each row as the function gets it: a dict of its user columns (converted column by column)."""
    names = user_columns(rows.column_names)
    return (
        [dict(zip(names, values)) for values in zip(*(python_values(rows.column(n)) for n in names))]
        if names
        else [{} for _ in range(rows.num_rows)]
    )


def _comparable(rows: pa.Table, columns: Sequence[str]) -> pa.Table:
    """``columns`` made comparable as keys: a null flag, then a NaN flag, before a column holding any (filled)."""
    names, arrays = [], []
    for name in columns:
        column = rows.column(name)
        if column.null_count:
            valid = pc.drop_null(column)
            names.append(f"_null_{name}")
            arrays.append(pc.is_null(column))
            # Filled with one of its own values (any type has one), or dropped when all null: the flag says all.
            if not len(valid):
                continue
            column = pc.fill_null(column, valid[0])
        if pa.types.is_floating(column.type):
            nan = pc.is_nan(column)
            if pc.any(nan).as_py():
                names.append(f"_nan_{name}")
                arrays.append(nan)
                column = pc.if_else(nan, pa.scalar(0, column.type), column)
        names.append(name)
        arrays.append(column)
    return pa.table(arrays, names=names)


def key_ids(parts: Sequence[pa.Table], columns: Sequence[str]) -> tuple[pa.Table, list[np.ndarray]]:
    """The distinct values of ``columns`` among ``parts``' rows, sorted (nulls last), and each part's rows' index among them.

    Nulls equal nulls and NaN equals NaN, as Spark groups keys.
    """
    schema = pa.schema([f.with_nullable(True) for f in parts[0].select(list(columns)).schema])
    every = pa.concat_tables([p.select(list(columns)).cast(schema) for p in parts])
    n = every.num_rows
    offsets = np.cumsum([0, *(p.num_rows for p in parts)])
    if not n:
        return every, [np.zeros(0, np.int64) for _ in parts]
    comparable = _comparable(every, columns)
    order = pc.sort_indices(comparable, sort_keys=[(c, "ascending") for c in comparable.column_names]).to_numpy()
    ordered = comparable.take(pa.array(order))
    first = np.ones(n, dtype=bool)
    if n > 1:
        changed = np.zeros(n - 1, dtype=bool)
        for name in ordered.column_names:  # a row starts a new value when any column differs from the row before
            col = ordered.column(name).combine_chunks()
            changed |= pc.fill_null(pc.not_equal(col.slice(1), col.slice(0, n - 1)), True).to_numpy(zero_copy_only=False)
        first[1:] = changed
    ids = np.empty(n, dtype=np.int64)
    ids[order] = np.cumsum(first) - 1
    distinct = every.take(pa.array(order[first]))
    return distinct, [ids[offsets[i] : offsets[i + 1]] for i in range(len(parts))]


def _ids_in(keys: pa.Table, rows: pa.Table, key: Sequence[str]) -> np.ndarray:
    """Each of ``rows``' index among ``keys`` (distinct, as :func:`key_ids` made them) by its key columns; -1 if absent."""
    if not rows.num_rows:
        return np.zeros(0, np.int64)
    _, (of_keys, of_rows) = key_ids([keys.select(list(key)), rows.select(list(key))], key)
    position = np.full(int(max(of_keys.max(initial=-1), of_rows.max(initial=-1))) + 1, -1, dtype=np.int64)
    position[of_keys] = np.arange(len(of_keys))
    return position[of_rows]


def _processing_order(sides: Sequence[pa.Table], ids: Sequence[np.ndarray], count: int) -> tuple[list[int], list[int], list[int]]:
    """(3.) The records of every input, by key then arrival: each one's input and row, and where each key's run starts.

    Arrival: the positions any input carries (one it lacks is 0), then the
    input's index (a record reaching both inputs runs on the first first).
    Without any position, a single input's records order by their columns.
    """
    carried = position_columns(list(dict.fromkeys(c for rows in sides for c in rows.column_names)))
    fallback: list[str] = []
    if not carried and len(sides) == 1:
        fallback = [f.name for f in sides[0].schema if f.name in user_columns(sides[0].column_names) and _sortable(f.type)]
    parts = []
    for side, (rows, of_rows) in enumerate(zip(sides, ids)):
        n = rows.num_rows
        columns: dict[str, Any] = {"_id": pa.array(of_rows, pa.int64())}
        for c in carried:
            columns[c] = rows.column(c).cast(pa.int64()) if c in rows.column_names else pa.repeat(pa.scalar(0, pa.int64()), n)
        columns["_side"] = pa.repeat(pa.scalar(side, pa.int32()), n)
        columns.update({f"_by_{c}": rows.column(c) for c in fallback})
        columns["_row"] = pa.array(np.arange(n, dtype=np.int64))
        parts.append(pa.table(columns))
    table = pa.concat_tables(parts)
    table = table.sort_by([(c, "ascending") for c in ["_id", *carried, "_side", *(f"_by_{c}" for c in fallback), "_row"]])
    key_of = table.column("_id").to_numpy()
    starts = np.searchsorted(key_of, np.arange(count + 1), side="left").tolist()
    return table.column("_side").to_pylist(), table.column("_row").to_pylist(), starts


def _sortable(type_: pa.DataType) -> bool:
    return not (pa.types.is_nested(type_) or pa.types.is_dictionary(type_) or pa.types.is_null(type_))
