"""Keyed process functions: user Python with per-key state and timers, batched per key group.

The epoch's records and the stored state (timers included) are cogrouped by
key group and handed to one Python call per key group as Arrow tables (never
one call per key); inside, the runtime walks the keys in order and scopes the
state handles and the timer service to the current key, as Flink does. Which
timers fire, and when, is :mod:`barrierflow.operators.timers`'.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import groupby
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Sequence
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.api.keyed_state import State, state_for
from barrierflow.api.state import EVEN_SPLIT, ListStateDescriptor, StateDescriptor
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.base import Node, key_group_column, position_columns, ship_user_code
from barrierflow.operators.timers import (
    TIMER_DOMAIN,
    TIMER_STATE,
    TIMER_TIMESTAMP,
    EpochClocks,
    TimeDomain,
    TimerService,
    due_timer_mask,
    due_timers,
    from_micros,
    timer_spec,
)
from barrierflow.state.spec import KEY_GROUP, DueRows, StateSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["KeyedFunction", "KeyedProcessFunction", "KeyedContext", "KeyedProcess", "Element"]

# A function's method for one record: (record, ctx, out).
Element = Callable[[dict[str, Any], "KeyedContext", Callable[[dict[str, Any]], None]], None]


class KeyedContext:
    """What a process function sees for the current key.

    In ``on_timer``, ``time_domain`` is the firing timer's domain (None in
    ``process_element``).
    """

    def __init__(
        self,
        key: tuple[Any, ...],
        epoch: int,
        processing_time_ms: int,
        states: dict[str, State],
        timers: TimerService | None = None,
        broadcast: Mapping[str, Any] | None = None,
    ) -> None:
        self.key = key
        self.epoch = epoch
        self.processing_time_ms = processing_time_ms
        self._states = states
        self._timers = timers or TimerService(None, processing_time_ms, enabled=False)
        self._broadcast = broadcast or {}
        self.time_domain: TimeDomain | None = None

    def timer_service(self) -> TimerService:
        """The current key's timers, the watermark and the epoch's processing time."""
        return self._timers

    def get_broadcast_state(self, descriptor: StateDescriptor) -> Any:
        """A broadcast state, read-only (a :class:`~barrierflow.operators.broadcast.KeyedBroadcastProcessFunction`'s)."""
        try:
            return self._broadcast[descriptor.name]
        except KeyError:
            raise PipelineDefinitionError(
                f"broadcast state {descriptor.name!r} is not one this function's broadcast stream carries "
                f"(broadcast here: {sorted(self._broadcast) or 'none'}); broadcast a stream with it: "
                "rules.broadcast(descriptor), then keyed.connect(that).process(...)"
            ) from None

    def get_state(self, descriptor: StateDescriptor) -> Any:
        try:
            return self._states[descriptor.name]
        except KeyError:
            raise PipelineDefinitionError(
                f"state {descriptor.name!r} is not declared by the process function: declare it as a class "
                f"attribute, e.g. {descriptor.name} = {type(descriptor).__name__}({descriptor.name!r}, ...)"
            ) from None


def _declared_states(cls: type) -> tuple[StateDescriptor, ...]:
    """The state descriptors of a process function class: its ``state_descriptors`` tuple, then its attributes'.

    One descriptor per state name: the same name declared twice with
    different definitions (two attributes, or an attribute and the tuple)
    is an error, since both would be one state table.
    """
    listed = tuple(cls.__dict__.get("state_descriptors", ()))
    attributes: dict[str, StateDescriptor] = {}
    for klass in reversed(cls.__mro__):  # bases first; a subclass's attribute overrides its base's
        for attr, value in vars(klass).items():
            if isinstance(value, StateDescriptor):
                attributes[attr] = value
    wrong = [d for d in listed if not isinstance(d, StateDescriptor)]
    if wrong:
        raise PipelineDefinitionError(f"{cls.__qualname__}.state_descriptors holds {wrong!r}: give StateDescriptor objects")
    inherited = [d for base in cls.__mro__[1:] for d in getattr(base, "state_descriptors", ())]
    by_name: dict[str, tuple[str, StateDescriptor]] = {}
    for where, descriptor in [
        *((f"state_descriptors[{i}]", d) for i, d in enumerate(listed)),
        *((f"attribute {a}", d) for a, d in attributes.items()),
        *(("an inherited state_descriptors", d) for d in inherited),
    ]:
        seen = by_name.setdefault(descriptor.name, (where, descriptor))
        if seen[1] != descriptor:
            raise PipelineDefinitionError(
                f"{cls.__qualname__}: state {descriptor.name!r} is declared twice, differently ({seen[0]}: "
                f"{seen[1].signature()}, {where}: {descriptor.signature()}); a state name is one state table: "
                "give each state its own name, or declare it once"
            )
    return tuple(d for _, d in by_name.values())


class KeyedFunction:
    """What keyed process functions share: declared state, the output schema, ``on_timer``.

    The per-key state it uses is every :class:`StateDescriptor` among its
    class attributes (``total = ValueStateDescriptor("total", pa.int64())``),
    inherited ones included; the state's name (its table) is the
    descriptor's, not the attribute's. ``state_descriptors`` is then
    collected for you; a tuple given there is still read, and must agree.
    ``output_schema`` is a pyarrow schema of the emitted rows.

    Implement :meth:`on_timer` to use timers: it is called for each timer
    that fires (see :mod:`barrierflow.operators.timers` for when), with the
    timer's timestamp as a UTC datetime, and may emit, use state and
    register or delete timers like the element methods.
    """

    state_descriptors: ClassVar[tuple[StateDescriptor, ...]] = ()
    output_schema: pa.Schema = pa.schema([])

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.state_descriptors = _declared_states(cls)

    def on_timer(self, timestamp: datetime, ctx: KeyedContext, out: Callable[[dict[str, Any]], None]) -> None:
        raise NotImplementedError

    @classmethod
    def uses_timers(cls) -> bool:
        """Whether the function implements ``on_timer`` (then its operator keeps a timer state table)."""
        return cls.on_timer is not KeyedFunction.on_timer

    def element_calls(self, records: pa.Table) -> list[tuple[Element, dict[str, Any]]]:
        """The method to call and the record to give it, for each row of a key group's sorted ``records``."""
        raise NotImplementedError

    def broadcast_view(self) -> Mapping[str, Any]:
        """The broadcast states the keyed side reads (none but for a broadcast process function)."""
        return {}


class KeyedProcessFunction(KeyedFunction):
    """Subclass and implement :meth:`process_element`; emit rows with ``out`` (see :class:`KeyedFunction`)."""

    def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Callable[[dict[str, Any]], None]) -> None:
        raise NotImplementedError

    def element_calls(self, records: pa.Table) -> list[tuple[Element, dict[str, Any]]]:
        names = [name for name in records.column_names if not name.startswith("_")]
        rows = [dict(zip(names, values)) for values in zip(*(_python_values(records.column(n)) for n in names))]
        return [(self.process_element, row) for row in rows]


def _state_column(name: str) -> str:
    return f"state_{name}"


# Key types whose Spark key group a chained task computes (``chaining.spark_key_groups``).
_CHAINED_KEY_TYPES = (pa.string(), pa.int64())

# A timer's columns in the frame handed to a key group (its timestamp in microseconds).
_TIMER_DOMAIN = "_timer_domain"
_TIMER_TS = "_timer_ts"


@dataclass
class KeyedProcess(Node):
    key: tuple[str, ...] = ()
    function: KeyedFunction | None = None

    # The kind of function this operator runs, and how to get one to run it otherwise.
    function_type: ClassVar[type[KeyedFunction]] = KeyedProcessFunction
    other_use: ClassVar[str] = "a KeyedCoProcessFunction runs on two connected keyed streams: a.key_by(k).connect(b.key_by(k)).process(...)"

    def __post_init__(self) -> None:
        if not isinstance(self.function, self.function_type):
            got = "none" if self.function is None else f"a {type(self.function).__qualname__}"
            raise PipelineDefinitionError(
                f"process {self.operator_id}: a {self.function_type.__name__} (an instance of a subclass) is required, "
                f"got {got}; {self.other_use}"
            )
        names = [d.name for d in self.function.state_descriptors]
        union = [d.name for d in self.function.state_descriptors if isinstance(d, ListStateDescriptor) and d.redistribution != EVEN_SPLIT]
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

    def _spec(self, descriptor: StateDescriptor, key_types: dict[str, pa.DataType] | None = None) -> StateSpec:
        types = key_types or {}
        ttl = descriptor.ttl
        return StateSpec(
            operator_id=self.operator_id,
            name=descriptor.name,
            key_fields=tuple(pa.field(k, types.get(k, pa.string())) for k in self.key),
            value_fields=(pa.field("value", descriptor.value_type),),
            ttl_ms=ttl.ttl_ms if ttl else None,
        )

    def _timer_spec(self, key_types: dict[str, pa.DataType] | None = None) -> StateSpec | None:
        assert self.function is not None
        if not self.function.uses_timers():
            return None
        types = key_types or {}
        return timer_spec(self.operator_id, tuple(pa.field(k, types.get(k, pa.string())) for k in self.key))

    def state_specs(self) -> list[StateSpec]:
        assert self.function is not None
        timers = self._timer_spec()
        return [self._spec(d) for d in self.function.state_descriptors] + ([timers] if timers else [])

    def apply(self, ctx: Any, df: "DataFrame") -> "DataFrame":
        """Run the function over every key group the epoch touches; stage state changes.

        Returns the emitted rows; executors write them and the state changes.
        """
        assert self.function is not None
        return self.process_records(ctx, df, self.function)

    def process_records(self, ctx: Any, df: "DataFrame", fn: KeyedFunction) -> "DataFrame":
        """:meth:`apply` with ``fn`` (this operator's function, or a copy carrying what its run needs)."""
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema, from_arrow_type

        ship_user_code(fn)
        key_types = ctx.arrow_types(df, self.key)
        descriptors = fn.state_descriptors
        specs = [self._spec(d, key_types) for d in descriptors]
        timers = self._timer_spec(key_types)
        keyed = df.withColumn(KEY_GROUP, key_group_column(self.key, ctx.key_groups))
        watermark_prev_us, watermark_us = ctx.watermark_prev_us, ctx.watermark_us
        epoch, processing_time_ms = ctx.epoch, ctx.processing_time_ms
        # The key groups to run: those the records touch and those holding a
        # timer due this epoch (a key may fire a timer without any record).
        touched = keyed
        if timers is not None:
            # Due by event time (W(n)) or by processing time (P(n)): the read takes both, then the rule.
            reached = processing_time_ms * 1000 if watermark_us is None else max(watermark_us, processing_time_ms * 1000)
            due = ctx.state.read(timers, due=DueRows(TIMER_TIMESTAMP, reached)).where(due_timers(watermark_us, processing_time_ms))
            touched = keyed.select(KEY_GROUP).unionByName(due.select(KEY_GROUP))
        timer_columns = [_TIMER_DOMAIN, _TIMER_TS] if timers is not None else []

        def nulls(*names: str) -> list[Any]:
            types = {_state_column(d.name): d.value_type for d in descriptors}
            types.update({_TIMER_DOMAIN: pa.string(), _TIMER_TS: pa.int64()})
            return [F.lit(None).cast(from_arrow_type(types[n])).alias(n) for n in names]

        # All descriptors' live state (and the timers), side by side in one wide frame.
        state_frames = []
        for d, spec in zip(descriptors, specs):
            live = ctx.state.read(spec, touched)
            cols = [F.col(k) for k in self.key] + [F.col(KEY_GROUP)]
            for other in descriptors:
                if other.name == d.name:
                    cols.append(F.col("value").alias(_state_column(other.name)))
                else:
                    cols.extend(nulls(_state_column(other.name)))
            state_frames.append(live.select(*cols, *nulls(*timer_columns)))
        if timers is not None:
            stored_timers = ctx.state.read(timers, touched)
            state_frames.append(
                stored_timers.select(
                    *self.key,
                    KEY_GROUP,
                    *nulls(*[_state_column(d.name) for d in descriptors]),
                    F.col(TIMER_DOMAIN).alias(_TIMER_DOMAIN),
                    F.unix_micros(F.col(TIMER_TIMESTAMP)).alias(_TIMER_TS),
                )
            )
        if state_frames:
            state_df = state_frames[0]
            for other_df in state_frames[1:]:
                state_df = state_df.unionByName(other_df)
        else:
            state_df = keyed.select(*self.key, KEY_GROUP).limit(0)

        out_schema = self._group_schema(fn, key_types)
        key_names = list(self.key)
        clocks = EpochClocks(epoch, processing_time_ms, watermark_prev_us, watermark_us)

        def run_group(records: pa.Table, state: pa.Table) -> pa.Table:
            return _run_key_group(fn, key_names, records, state, out_schema, clocks)

        result = keyed.groupBy(KEY_GROUP).cogroup(state_df.groupBy(KEY_GROUP)).applyInArrow(
            run_group, from_arrow_schema(out_schema)
        )
        # Computed once (cached on the executors): the state changes and the
        # emitted rows are both written from it.
        result = ctx.persist(result)
        for d, spec in zip(descriptors, specs):
            changes = result.where(F.col("_kind") == F.lit(d.name)).withColumnRenamed(_state_column(d.name), "value")
            ctx.state.stage(spec, changes)
        if timers is not None:
            timer_changes = result.where(F.col("_kind") == F.lit(TIMER_STATE)).select(
                *self.key,
                KEY_GROUP,
                F.col(_TIMER_DOMAIN).alias(TIMER_DOMAIN),
                F.timestamp_micros(F.col(_TIMER_TS)).alias(TIMER_TIMESTAMP),
                "_deleted",
            )
            ctx.state.stage(timers, timer_changes)
        outputs = result.where(F.col("_kind") == F.lit("_out"))
        return ctx.cached_view(outputs.select(*[F.col(f"_out_{f.name}").alias(f.name) for f in fn.output_schema]))

    def _group_schema(self, fn: KeyedFunction, key_types: Mapping[str, pa.DataType]) -> pa.Schema:
        """What ``_run_key_group`` returns: a state's changes (``_kind``: its name), timer changes and emitted rows (``_out``)."""
        return pa.schema(
            [
                pa.field("_kind", pa.string()),
                *[pa.field(k, key_types[k]) for k in self.key],
                pa.field(KEY_GROUP, pa.int32()),
                *[pa.field(_state_column(d.name), d.value_type) for d in fn.state_descriptors],
                *([pa.field(_TIMER_DOMAIN, pa.string()), pa.field(_TIMER_TS, pa.int64())] if fn.uses_timers() else []),
                pa.field("_deleted", pa.bool_()),
                *[pa.field(f"_out_{f.name}", f.type) for f in fn.output_schema],
            ]
        )

    # -- the chained form (barrierflow.execution.chained_region): process_records on Arrow tables, in one task

    def chained_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema | None:
        (schema,) = inputs
        assert self.function is not None
        return self._chained_output(schema, self.function)

    def _chained_output(self, records: pa.Schema, fn: KeyedFunction) -> pa.Schema | None:
        """The emitted rows' schema as the Spark path's frame has it, when ``records`` can run in a task; else None.

        Declined: a key type whose key group the task does not compute, no
        arrival position (``_run_key_group`` sorts by it), a key clashing with
        the timer table's columns (Spark's path raises that), and a state or
        output type whose values would change through Spark's types (the
        task hands the function values as the state files hold them).
        """
        if "_seq" not in records.names or any(
            k not in records.names or records.field(k).type not in _CHAINED_KEY_TYPES for k in self.key
        ):
            return None
        if fn.uses_timers() and {TIMER_DOMAIN, TIMER_TIMESTAMP} & set(self.key):
            return None
        if any(_spark_typed(pa.schema([pa.field("value", d.value_type)])) is None for d in fn.state_descriptors):
            return None
        return _spark_typed(fn.output_schema)

    def chained_state_specs(self, inputs: Sequence[pa.Schema]) -> list[StateSpec]:
        assert self.function is not None
        # The task carries the function, as process_records' key-group tasks do.
        ship_user_code(self.function)
        key_types = {k: inputs[0].field(k).type for k in self.key}
        timers = self._timer_spec(key_types)
        return [self._spec(d, key_types) for d in self.function.state_descriptors] + ([timers] if timers else [])

    def apply_chained(self, task: Any, inputs: Sequence[pa.Table]) -> pa.Table:
        (records,) = inputs
        assert self.function is not None
        return self.process_chained(task, records, self.function)

    def process_chained(self, task: Any, records: pa.Table, fn: KeyedFunction) -> pa.Table:
        """:meth:`process_records` in a chained task: ``_run_key_group`` per key group, the same inputs, the same changes.

        The key groups run are those the records touch and those holding a
        due timer. A group gets its records and, for the keys it runs (keys
        with records, keys with a due timer), every state's live rows and
        every stored timer: of the whole key group's rows that the Spark path
        reads, ``_run_key_group`` uses no others. A user function's error
        declines the epoch (nothing is staged): Spark's path raises it.
        """
        from barrierflow.execution.chained_region import RegionDeclined

        key_names = list(self.key)
        key_types = {k: records.schema.field(k).type for k in key_names}
        descriptors = fn.state_descriptors
        specs = [self._spec(d, key_types) for d in descriptors]
        timers = self._timer_spec(key_types)
        keyed = records.append_column(KEY_GROUP, task.key_groups_of(records.select(key_names)))
        keys_schema = pa.schema([*(pa.field(k, key_types[k]) for k in key_names), pa.field(KEY_GROUP, pa.int32())])
        touched = keyed.select(keys_schema.names).cast(keys_schema)
        stored_timers = None
        if timers is not None:
            # Due by event time (W(n)) or by processing time (P(n)), whatever their key: their keys run too.
            every_timer = task.every_live_row(timers)
            due = every_timer.filter(due_timer_mask(every_timer, task.watermark_us, task.processing_time_ms))
            touched = pa.concat_tables([touched, due.select(keys_schema.names).cast(keys_schema)])
        touched = touched.group_by(keys_schema.names, use_threads=False).aggregate([])
        if timers is not None:
            stored_timers = every_timer.join(touched.select(key_names), keys=key_names, join_type="left semi")
        # All states' live rows (and the timers) side by side in one wide table, as the Spark path's state frame.
        state_schema = pa.schema(
            [
                *keys_schema,
                *[pa.field(_state_column(d.name), d.value_type) for d in descriptors],
                *([pa.field(_TIMER_DOMAIN, pa.string()), pa.field(_TIMER_TS, pa.int64())] if timers is not None else []),
            ]
        )
        parts, width = [], len(keys_schema)
        for d, spec in zip(descriptors, specs):
            live = task.live_rows(spec, touched)
            parts.append(_wide_rows(state_schema, width, live, {_state_column(d.name): live.column("value")}))
        if stored_timers is not None:
            stamps = pc.cast(stored_timers.column(TIMER_TIMESTAMP), pa.int64())
            timer_columns = {_TIMER_DOMAIN: stored_timers.column(TIMER_DOMAIN), _TIMER_TS: stamps}
            parts.append(_wide_rows(state_schema, width, stored_timers, timer_columns))
        state = pa.concat_tables(parts) if parts else state_schema.empty_table()
        # One call per key group (cogroup's), each given its slice of both tables.
        keyed, state = keyed.sort_by(KEY_GROUP), state.sort_by(KEY_GROUP)
        record_groups = keyed.column(KEY_GROUP).to_numpy()
        state_groups = state.column(KEY_GROUP).to_numpy()
        groups = np.unique(touched.column(KEY_GROUP).to_numpy())
        out_schema = self._group_schema(fn, key_types)
        clocks = EpochClocks(task.epoch, task.processing_time_ms, task.watermark_prev_us, task.watermark_us)
        results = []
        try:
            for kg in groups.tolist():
                r0, r1 = np.searchsorted(record_groups, kg, "left"), np.searchsorted(record_groups, kg, "right")
                s0, s1 = np.searchsorted(state_groups, kg, "left"), np.searchsorted(state_groups, kg, "right")
                group_records, group_state = keyed.slice(r0, r1 - r0), state.slice(s0, s1 - s0)
                results.append(_run_key_group(fn, key_names, group_records, group_state, out_schema, clocks))
        except Exception as exc:  # noqa: BLE001 - the user's function failed: Spark's path raises it, as its error
            raise RegionDeclined(f"process {self.operator_id}: the function raised {type(exc).__name__}: {exc}") from exc
        result = pa.concat_tables(results) if results else out_schema.empty_table()
        kinds = result.column("_kind")
        outputs = result.filter(pc.equal(kinds, "_out"))
        emitted = self.chained_rows(pa.table({f.name: outputs.column(f"_out_{f.name}") for f in fn.output_schema}), fn)
        for d, spec in zip(descriptors, specs):
            changes = result.filter(pc.equal(kinds, d.name))
            values = {"value": changes.column(_state_column(d.name)), "_deleted": changes.column("_deleted")}
            task.stage(spec, pa.table({**{k: changes.column(k) for k in keys_schema.names}, **values}))
        if timers is not None:
            changes = result.filter(pc.equal(kinds, TIMER_STATE))
            values = {
                TIMER_DOMAIN: changes.column(_TIMER_DOMAIN),
                TIMER_TIMESTAMP: pc.cast(changes.column(_TIMER_TS), pa.timestamp("us", tz="UTC")),
                "_deleted": changes.column("_deleted"),
            }
            task.stage(timers, pa.table({**{k: changes.column(k) for k in keys_schema.names}, **values}))
        return emitted

    def chained_rows(self, rows: pa.Table, fn: KeyedFunction) -> pa.Table:
        """Emitted ``rows`` in the output's schema; declined if a column declared not null holds a null (Spark's keeps it)."""
        from barrierflow.execution.chained_region import RegionDeclined

        schema = _spark_typed(fn.output_schema)
        assert schema is not None  # else no chained form
        nulls = [f.name for f in schema if not f.nullable and rows.column(f.name).null_count]
        if nulls:
            raise RegionDeclined(f"process {self.operator_id}: nulls emitted in {nulls}, declared not null")
        return rows.select(schema.names).cast(schema)

    def describe(self) -> dict[str, Any]:
        assert self.function is not None
        return {
            **super().describe(),
            "key": list(self.key),
            "function": type(self.function).__qualname__,
            "states": {d.name: d.signature() for d in self.function.state_descriptors},
            "timers": self.function.uses_timers(),
        }


def _wide_rows(schema: pa.Schema, keys: int, rows: pa.Table, values: Mapping[str, "pa.ChunkedArray"]) -> pa.Table:
    """Rows of the wide state table ``schema`` (its first ``keys`` columns: keys, key group): ``rows``' keys, ``values``."""
    fields = list(schema)
    columns = [rows.column(f.name) for f in fields[:keys]]
    columns += [values[f.name] if f.name in values else pa.nulls(rows.num_rows, f.type) for f in fields[keys:]]
    return pa.table(columns, schema=schema)


def _spark_typed(schema: pa.Schema) -> pa.Schema | None:
    """``schema`` as a Spark frame of it has it in Arrow (``EpochContext.arrow_schema``), or None if a type changes on the way."""
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    try:
        typed = to_arrow_schema(from_arrow_schema(schema), timezone="UTC", prefers_large_types=False)
    except (TypeError, ValueError, NotImplementedError):
        return None  # not a Spark type: the Spark path fails, and says why
    typed = pa.schema([f.with_type(pa.timestamp("us", tz="UTC")) if pa.types.is_timestamp(f.type) else f for f in typed])
    return typed if all(f.type.equals(g.type) for f, g in zip(schema, typed)) else None


def _python_values(column: "pa.ChunkedArray | pa.Array") -> list[Any]:
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


def _run_key_group(
    fn: KeyedFunction,
    key_names: list[str],
    records: pa.Table,
    state: pa.Table,
    out_schema: pa.Schema,
    clocks: EpochClocks,
) -> pa.Table:
    """Process one key group: every key's records in arrival order with its state, then its due timers.

    Column-wise: the records are sorted by key and arrival and converted to
    Python once per column; each key's run of records is handed to the
    function with its state handles. The keys run are those with records
    and those with a timer due this epoch, in key order; for each, the steps
    of :mod:`barrierflow.operators.timers` (records at W(n-1), then event-time
    timers up to W(n), then processing-time timers up to P(n)).
    """
    descriptors = fn.state_descriptors
    broadcast = fn.broadcast_view()
    with_timers = _TIMER_DOMAIN in state.column_names
    stored: dict[tuple[Any, ...], dict[str, Any]] = {}
    stored_timers: dict[tuple[Any, ...], set[tuple[TimeDomain, int]]] = {}
    if state.num_rows:
        state_keys = list(zip(*(state.column(k).to_pylist() for k in key_names)))
        for d in descriptors:
            for key, value in zip(state_keys, _python_values(state.column(_state_column(d.name)))):
                if value is not None:
                    stored.setdefault(key, {})[d.name] = value
        if with_timers:
            domains, stamps = state.column(_TIMER_DOMAIN).to_pylist(), state.column(_TIMER_TS).to_pylist()
            for key, domain, ts in zip(state_keys, domains, stamps):
                if domain is not None:
                    stored_timers.setdefault(key, set()).add((TimeDomain(domain), ts))
    due = {key for key, timers in stored_timers.items() if clocks.any_due(timers)}
    if not records.num_rows and not due:
        return out_schema.empty_table()  # state of keys this epoch did not touch: unchanged
    order = [*key_names, *position_columns(records.column_names)]
    records = records.sort_by([(c, "ascending") for c in order])
    kg = (records if records.num_rows else state).column(KEY_GROUP)[0].as_py()
    calls = fn.element_calls(records)
    keys = list(zip(*(records.column(k).to_pylist() for k in key_names)))
    # Sorted by key: each key's records are one run.
    runs = {key: list(run) for key, run in groupby(range(len(keys)), key=keys.__getitem__)}
    rows_out: list[dict[str, Any]] = []
    for key in sorted(runs.keys() | due):
        known = stored.get(key, {})
        handles = {d.name: state_for(d, known.get(d.name)) for d in descriptors}
        before = stored_timers.get(key, set())
        service = TimerService(clocks.watermark_prev_us, clocks.processing_time_ms, set(before), enabled=with_timers)
        kctx = KeyedContext(key, clocks.epoch, clocks.processing_time_ms, handles, service, broadcast)
        emitted: list[dict[str, Any]] = []
        for i in runs.get(key, ()):  # 1. records, at W(n-1)
            element, record = calls[i]
            element(record, kctx, emitted.append)
        if with_timers:  # 2.-3. due timers, at W(n)
            service.watermark_us = clocks.watermark_us
            while (timer := clocks.next_due(service.timers)) is not None:
                service.timers.discard(timer)
                kctx.time_domain = timer[0]
                fn.on_timer(from_micros(timer[1]), kctx, emitted.append)
            kctx.time_domain = None
        base = dict(zip(key_names, key))
        for row in emitted:
            rows_out.append({"_kind": "_out", **base, KEY_GROUP: kg, **{f"_out_{k}": v for k, v in row.items()}})
        for name, handle in handles.items():
            if handle.dirty:
                value = handle.stored
                rows_out.append(
                    {"_kind": name, **base, KEY_GROUP: kg, _state_column(name): value, "_deleted": value is None}
                )
        # 4. the key's timer state: registered ones added, fired and deleted ones removed.
        for (domain, ts), deleted in [*((t, False) for t in service.timers - before), *((t, True) for t in before - service.timers)]:
            rows_out.append(
                {"_kind": TIMER_STATE, **base, KEY_GROUP: kg, _TIMER_DOMAIN: domain.value, _TIMER_TS: ts, "_deleted": deleted}
            )
    return pa.Table.from_pylist(rows_out, schema=out_schema)
