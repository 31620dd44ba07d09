"""What the two-input event-time joins share: late records, records buffered in state, joined rows.

An interval join (:mod:`barrierflow.operators.interval_join`) and a window
join (:mod:`barrierflow.operators.window_join`) keep each side's records in a
state table until the watermark passes the last time they can join:
key columns (the left side's names), ``record_epoch`` and ``record_index``
(the record's rank among its key's records of that epoch, by content:
identical records are interchangeable, so the rank is deterministic), any
columns of the join's own (a window's start), ``event_time_us`` and the
record as JSON. A joined row holds the key columns, the join's own columns,
then the left record's other columns and the right's (:func:`output_columns`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

import pyarrow as pa

from barrierflow.errors import PipelineDefinitionError
from barrierflow.operators.base import Node, key_group_column, user_columns
from barrierflow.state.spec import KEY_GROUP, StateSpec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

__all__ = ["SIDES", "TwoSidedJoin", "buffer_spec", "check_key_types", "fresh_records", "joined_rows", "output_columns", "record_schemas"]

_log = logging.getLogger(__name__)
SIDES = ("left", "right")
# JSON of a record kept in state: timestamps to the microsecond (Spark's default format drops digits).
_JSON_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX", "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"}


def buffer_spec(
    operator_id: str, side: str, key: Sequence[str], own: Sequence[pa.Field] = (), key_types: dict[str, pa.DataType] | None = None
) -> StateSpec:
    """The state table ``<operator_id>__<side>`` of buffered records; ``own`` are key columns of the join's (a window's start)."""
    types = key_types or {}
    return StateSpec(
        operator_id=operator_id,
        name=side,
        key_fields=(
            *(pa.field(k, types.get(k, pa.string())) for k in key),
            *own,
            pa.field("record_epoch", pa.int64()),
            pa.field("record_index", pa.int64()),
        ),
        value_fields=(pa.field("event_time_us", pa.int64()), pa.field("record", pa.string())),
    )


@dataclass
class TwoSidedJoin(Node):
    """What both joins are: ``parent`` keyed by ``key`` (left) with ``other`` keyed by ``other_key`` (right), buffered per side."""

    key: tuple[str, ...] = ()
    other: Node | None = None
    other_key: tuple[str, ...] = ()
    time_columns: tuple[str, str] = ("ts", "ts")
    late_outputs: tuple[str | None, str | None] = (None, None)

    needs_arrival_order = False
    uses_watermark = True
    # Key columns of the join's own in the buffer tables (a window's start).
    own_fields: ClassVar[tuple[pa.Field, ...]] = ()

    def inputs(self) -> tuple[Node, ...]:
        assert self.parent is not None and self.other is not None
        return (self.parent, self.other)

    def keyed_inputs(self) -> list[tuple[Node, tuple[str, ...]]]:
        # A null event time is checked at the sources as a null key is (a dead letter there).
        return [(node, (*key, time)) for node, key, time in zip(self.inputs(), (self.key, self.other_key), self.time_columns)]

    def key_output(self) -> tuple[str, ...]:
        return self.key  # a pair's key columns, named as the left side's

    def side_outputs(self) -> list[str]:
        return [name for name in self.late_outputs if name]

    def _spec(self, side: str, key_types: dict[str, pa.DataType] | None = None) -> StateSpec:
        return buffer_spec(self.operator_id, side, self.key, self.own_fields, key_types)

    def state_specs(self) -> list[StateSpec]:
        return [self._spec(side) for side in SIDES]


def check_key_types(ctx: Any, what: str, frames: Sequence["DataFrame"], keys: Sequence[Sequence[str]], times: Sequence[str]) -> dict[str, pa.DataType]:
    """The first side's key types; refuses key columns of different types on the two sides."""
    types = [ctx.arrow_types(df, (*key, time)) for df, key, time in zip(frames, keys, times)]
    differ = [f"{a} is {types[0][a]} but {b} is {types[1][b]}" for a, b in zip(keys[0], keys[1]) if types[0][a] != types[1][b]]
    if differ:
        raise PipelineDefinitionError(
            f"{what}: the key columns of the two inputs differ in type ({'; '.join(differ)}); "
            "joined keyed streams need keys of the same types, in the same order"
        )
    return types[0]


def record_schemas(frames: Sequence["DataFrame"]) -> list["StructType"]:
    from pyspark.sql.types import StructType

    return [StructType([f for f in df.schema.fields if not f.name.startswith("_")]) for df in frames]


def fresh_records(
    ctx: Any,
    what: str,
    df: "DataFrame",
    key: Sequence[str],
    theirs: Sequence[str],
    time: str,
    late: "Column",
    late_output: str | None,
    side: str,
) -> "DataFrame":
    """The epoch's records of one side that are not late, in the buffer's form (plus ``_new`` = true).

    ``late`` (a condition on the record, ``_ts`` its event time in
    microseconds) sends records to ``late_output``, or drops and counts them;
    so does a null key, which no record joins (sources that can tell make it
    a dead letter first).
    The result has the key columns (named ``key``), ``_ts``, ``event_time_us``
    (= ``_ts``), ``record``, the key group, ``record_epoch`` and ``record_index``.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    users = user_columns(df)
    null_key = F.lit(False)
    for column in theirs:
        null_key = null_key | F.col(column).isNull()
    marked = ctx.persist(df.withColumn("_ts", F.unix_micros(F.col(time))).withColumn("_late", late | null_key))
    if late_output:  # emitted every epoch, empty or not: the side output's table exists from the first
        ctx.emit(late_output, marked.where("_late").select(*users))
    else:
        dropped = marked.where("_late").count()  # a job on the cached rows; the drop is never silent
        if dropped:
            _log.warning("epoch %d: %s dropped %d late %s record(s) (no late output declared)", ctx.epoch, what, dropped, side)
    fresh = marked.where(~F.col("_late")).select(
        *[F.col(t).alias(k) for k, t in zip(key, theirs)],
        F.col("_ts"),
        F.col("_ts").alias("event_time_us"),
        F.to_json(F.struct(*[F.col(c) for c in users]), _JSON_OPTIONS).alias("record"),
    )
    return fresh.select(
        "*",
        key_group_column(tuple(key), ctx.key_groups).alias(KEY_GROUP),
        F.lit(ctx.epoch).cast("long").alias("record_epoch"),
        F.row_number().over(Window.partitionBy(*key).orderBy("event_time_us", "record")).cast("long").alias("record_index"),
        F.lit(True).alias("_new"),
    )


def joined_rows(
    pairs: "DataFrame", key: Sequence[str], own: Sequence["Column"], schemas: Sequence["StructType"], other_key: Sequence[str]
) -> "DataFrame":
    """Rows of joined pairs (aliased ``left`` and ``right``): the key columns, ``own`` columns, then both records' columns."""
    from pyspark.sql import functions as F

    parsed = pairs.select(
        *[F.col(f"left.{k}").alias(k) for k in key],
        *own,
        F.from_json(F.col("left.record"), schemas[0], _JSON_OPTIONS).alias("_l"),
        F.from_json(F.col("right.record"), schemas[1], _JSON_OPTIONS).alias("_r"),
    )
    names = [[f.name for f in s.fields] for s in schemas]
    reserved = [c for c in parsed.columns if c not in ("_l", "_r")]
    columns = output_columns(key, names[0], names[1], other_key, reserved=reserved[len(key):])
    return parsed.select(
        *reserved,
        *[F.col(f"{'_l' if side == 'left' else '_r'}.{c}").alias(name) for side, c, name in columns[len(key):]],
    )


def output_columns(
    key: Sequence[str], left: Sequence[str], right: Sequence[str], right_key: Sequence[str], reserved: Sequence[str] = ()
) -> list[tuple[str, str, str]]:
    """The joined row's columns as (side, column of that side's record, output name); key columns from the left.

    Records' other columns keep their names; one on both sides becomes
    ``left_<name>`` and ``right_<name>``. ``reserved`` are the join's own
    output columns (a window's start and end), which no record column may take.
    """
    left_rest = [c for c in left if c not in key]
    right_rest = [c for c in right if c not in right_key]
    both = set(left_rest) & set(right_rest)
    columns = [("left", k, k) for k in key]
    columns += [("left", c, f"left_{c}" if c in both else c) for c in left_rest]
    columns += [("right", c, f"right_{c}" if c in both else c) for c in right_rest]
    names = [*(name for *_, name in columns), *reserved]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise PipelineDefinitionError(
            f"join: output columns {clashes} would appear twice (a column named like a prefixed one, a key or "
            f"one of the join's own columns {list(reserved)}); rename them upstream with select or map"
        )
    return columns
