"""Keyed process functions: user Python with per-key state, batched per key group.

The epoch's records and the stored state are cogrouped by key group and
handed to one Python call per key group as Arrow tables (never one call per
key); inside, the runtime walks the keys in order and scopes the state
handles to the current key, as Flink does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import groupby
from typing import TYPE_CHECKING, Any, Callable, ClassVar
from zoneinfo import ZoneInfo

import pyarrow as pa

from barrierflow.errors import PipelineDefinitionError
from barrierflow.operators.base import Node, key_group_column, position_columns, ship_user_code
from barrierflow.state.descriptors import StateDescriptor
from barrierflow.state.keyed import State, state_for
from barrierflow.state.spec import KEY_GROUP, StateSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["KeyedProcessFunction", "KeyedContext", "KeyedProcess"]


class KeyedContext:
    """What a process function sees for the current key."""

    def __init__(self, key: tuple[Any, ...], epoch: int, processing_time_ms: int, states: dict[str, State]) -> None:
        self.key = key
        self.epoch = epoch
        self.processing_time_ms = processing_time_ms
        self._states = states

    def get_state(self, descriptor: StateDescriptor) -> Any:
        try:
            return self._states[descriptor.name]
        except KeyError:
            raise PipelineDefinitionError(
                f"state {descriptor.name!r} is not declared by the process function: declare it as a class "
                f"attribute, e.g. {descriptor.name} = {type(descriptor).__name__}({descriptor.name!r}, ...)"
            ) from None


class KeyedProcessFunction:
    """Subclass and implement :meth:`process_element`; emit rows with ``out``.

    The per-key state it uses is every :class:`StateDescriptor` among its
    class attributes (``total = ValueStateDescriptor("total", pa.int64())``),
    inherited ones included; the state's name (its table) is the
    descriptor's, not the attribute's. ``state_descriptors`` is then
    collected for you; a tuple given there is still read, and must agree.
    ``output_schema`` is a pyarrow schema of the emitted rows.
    """

    state_descriptors: ClassVar[tuple[StateDescriptor, ...]] = ()
    output_schema: pa.Schema = pa.schema([])

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.state_descriptors = _declared_states(cls)

    def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Callable[[dict[str, Any]], None]) -> None:
        raise NotImplementedError


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


def _state_column(name: str) -> str:
    return f"state_{name}"


@dataclass
class KeyedProcess(Node):
    key: tuple[str, ...] = ()
    function: KeyedProcessFunction | None = None

    def __post_init__(self) -> None:
        if self.function is None:
            raise PipelineDefinitionError(f"process {self.operator_id}: a KeyedProcessFunction is required")
        names = [d.name for d in self.function.state_descriptors]
        if len(names) != len(set(names)):
            raise PipelineDefinitionError(f"process {self.operator_id}: duplicate state names {names}")

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

    def state_specs(self) -> list[StateSpec]:
        assert self.function is not None
        return [self._spec(d) for d in self.function.state_descriptors]

    def apply(self, ctx: Any, df: "DataFrame") -> "DataFrame":
        """Run the function over every key group the epoch touches; stage state changes.

        Returns the emitted rows; executors write them and the state changes.
        """
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema, from_arrow_type

        fn = self.function
        assert fn is not None
        ship_user_code(fn)
        key_types = ctx.arrow_types(df, self.key)
        descriptors = fn.state_descriptors
        specs = [self._spec(d, key_types) for d in descriptors]
        keyed = df.withColumn(KEY_GROUP, key_group_column(self.key, ctx.key_groups))
        # All descriptors' live state, side by side in one wide frame.
        state_frames = []
        for d, spec in zip(descriptors, specs):
            live = ctx.state.read(spec, keyed)
            cols = [F.col(k) for k in self.key] + [F.col(KEY_GROUP)]
            for other in descriptors:
                if other.name == d.name:
                    cols.append(F.col("value").alias(_state_column(other.name)))
                else:
                    cols.append(F.lit(None).cast(from_arrow_type(other.value_type)).alias(_state_column(other.name)))
            state_frames.append(live.select(*cols))
        if state_frames:
            state_df = state_frames[0]
            for other_df in state_frames[1:]:
                state_df = state_df.unionByName(other_df)
        else:
            state_df = keyed.select(*self.key, KEY_GROUP).limit(0)

        key_fields = [pa.field(k, key_types[k]) for k in self.key]
        out_schema = pa.schema(
            [
                pa.field("_kind", pa.string()),
                *key_fields,
                pa.field(KEY_GROUP, pa.int32()),
                *[pa.field(_state_column(d.name), d.value_type) for d in descriptors],
                pa.field("_deleted", pa.bool_()),
                *[pa.field(f"_out_{f.name}", f.type) for f in fn.output_schema],
            ]
        )
        key_names = list(self.key)
        epoch, processing_time_ms = ctx.epoch, ctx.processing_time_ms

        def run_group(records: pa.Table, state: pa.Table) -> pa.Table:
            return _run_key_group(fn, key_names, records, state, out_schema, epoch, processing_time_ms)

        result = keyed.groupBy(KEY_GROUP).cogroup(state_df.groupBy(KEY_GROUP)).applyInArrow(
            run_group, from_arrow_schema(out_schema)
        )
        # Computed once (cached on the executors): the state changes and the
        # emitted rows are both written from it.
        result = ctx.persist(result)
        for d, spec in zip(descriptors, specs):
            changes = result.where(F.col("_kind") == F.lit(d.name)).withColumnRenamed(_state_column(d.name), "value")
            ctx.state.stage(spec, changes)
        outputs = result.where(F.col("_kind") == F.lit("_out"))
        return ctx.cached_view(outputs.select(*[F.col(f"_out_{f.name}").alias(f.name) for f in fn.output_schema]))

    def describe(self) -> dict[str, Any]:
        assert self.function is not None
        return {
            **super().describe(),
            "key": list(self.key),
            "function": type(self.function).__qualname__,
            "states": {d.name: d.signature() for d in self.function.state_descriptors},
        }


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
    fn: KeyedProcessFunction,
    key_names: list[str],
    records: pa.Table,
    state: pa.Table,
    out_schema: pa.Schema,
    epoch: int,
    processing_time_ms: int,
) -> pa.Table:
    """Process one key group: every key's records in arrival order, with its state.

    Column-wise: the records are sorted by key and arrival and converted to
    Python once per column; each key's run of records is handed to the
    function with its state handles.
    """
    descriptors = fn.state_descriptors
    if not records.num_rows:
        return out_schema.empty_table()  # state of keys this epoch did not touch: unchanged
    stored: dict[tuple[Any, ...], dict[str, Any]] = {}
    if state.num_rows:
        state_keys = list(zip(*(state.column(k).to_pylist() for k in key_names)))
        for d in descriptors:
            for key, value in zip(state_keys, _python_values(state.column(_state_column(d.name)))):
                if value is not None:
                    stored.setdefault(key, {})[d.name] = value
    order = [*key_names, *position_columns(records.column_names)]
    records = records.sort_by([(c, "ascending") for c in order])
    kg = records.column(KEY_GROUP)[0].as_py()
    user_names = [name for name in records.column_names if not name.startswith("_")]
    user_rows = [dict(zip(user_names, values)) for values in zip(*(_python_values(records.column(n)) for n in user_names))]
    keys = list(zip(*(records.column(k).to_pylist() for k in key_names)))
    rows_out: list[dict[str, Any]] = []
    # Sorted by key: each key's records are one run.
    for key, run in groupby(range(len(keys)), key=keys.__getitem__):
        known = stored.get(key, {})
        handles = {d.name: state_for(d, known.get(d.name)) for d in descriptors}
        kctx = KeyedContext(key, epoch, processing_time_ms, handles)
        emitted: list[dict[str, Any]] = []
        for i in run:
            fn.process_element(user_rows[i], kctx, emitted.append)
        base = dict(zip(key_names, key))
        for row in emitted:
            rows_out.append({"_kind": "_out", **base, KEY_GROUP: kg, **{f"_out_{k}": v for k, v in row.items()}})
        for name, handle in handles.items():
            if handle.dirty:
                value = handle.stored
                rows_out.append(
                    {"_kind": name, **base, KEY_GROUP: kg, _state_column(name): value, "_deleted": value is None}
                )
    return pa.Table.from_pylist(rows_out, schema=out_schema)
