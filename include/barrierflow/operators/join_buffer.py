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

The chained form (:mod:`barrierflow.execution.chained_region`) keeps the same buffers on
Arrow tables in one task: :func:`chained_key_types` and
:func:`chained_output_schema` say which inputs it takes,
:func:`chained_fresh_records` and :func:`chained_late_records` do what
:func:`fresh_records` does, and :func:`record_values` reads a buffered record
back as the Spark path's ``from_json`` does. The record's JSON must be
exactly Spark's ``to_json`` (it is stored, and orders ``record_index``): the
chained form takes only the column types and values whose JSON it writes as
Spark does (:func:`record_json`), and leaves any other epoch to Spark.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.base import Node, key_group_column, user_columns
from barrierflow.state.spec import KEY_GROUP, StateSpec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

__all__ = [
    "SIDES", "TwoSidedJoin", "buffer_spec", "check_key_types", "fresh_records", "joined_rows", "output_columns", "record_schemas",
    "chained_key_types", "chained_output_schema", "chained_fresh_records", "chained_late_records", "record_json", "record_values",
]  # fmt: skip

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


# -- the chained form (barrierflow.execution.chained_region): the same buffers on Arrow tables, in one task

# Key types whose Spark key group the chained form computes (``chaining.spark_key_groups``).
_CHAINED_KEY_TYPES = (pa.string(), pa.int64())
_EVENT_TIME = pa.timestamp("us", tz="UTC")
# Record column types whose JSON :func:`record_json` writes as Spark's ``to_json`` does (and :func:`record_values` reads back).
_JSON_TYPES = (pa.string(), pa.int64(), pa.int32(), pa.bool_(), pa.float64(), _EVENT_TIME)
# A double is written as Python's ``repr``: Java's ``Double.toString`` for a zero and a magnitude in [1e-3, 1e7)
# (fixed notation, JDK 17's digits and the shortest ones of later JDKs agree there). Outside it JDK 17 may print
# more digits than the shortest (``9.999999999999999E22`` for 1e23): such a record leaves the epoch to Spark.
_PLAIN_DOUBLES = (1e-3, 1e7)
# Timestamps Spark writes with a four-digit year (UTC, the session's zone): 0001-01-01 to 9999-12-31.
_FIRST_US, _LAST_US = -62_135_596_800_000_000, 253_402_300_799_999_999
_TIMESTAMP_JSON = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z$"
# Jackson's escapes (Spark's JSON writer): the quote, the backslash and the control characters, in uppercase hex.
_JSON_ESCAPES = {
    **{c: f"\\u{c:04X}" for c in range(0x20)}, 0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r",
    0x22: '\\"', 0x5C: "\\\\",
}  # fmt: skip
# The buffer's own columns, which the fresh records hold beside the key columns.
_BUFFER_COLUMNS = frozenset({"event_time_us", "record", "record_epoch", "record_index"})


def _declined(why: str) -> Exception:
    from barrierflow.execution.chained_region import RegionDeclined

    return RegionDeclined(why)


def chained_key_types(
    inputs: Sequence[pa.Schema], keys: Sequence[Sequence[str]], times: Sequence[str]
) -> dict[str, pa.DataType] | None:
    """:func:`check_key_types` on the inputs' Arrow schemas, where the chained form takes them; None: the join runs on Spark.

    Spark raises the errors (a missing column, key columns of different
    types). The chained form takes keys it hashes as Spark does, event times
    as UTC microseconds and records of the types :func:`record_json` writes.
    """
    if len(keys[0]) != len(keys[1]):
        return None
    for schema, key, time in zip(inputs, keys, times):
        names = schema.names
        if len(set(names)) != len(names) or any(f.type not in _JSON_TYPES for f in schema if not f.name.startswith("_")):
            return None
        if time not in names or time.startswith("_") or schema.field(time).type != _EVENT_TIME:
            return None
        if len(set(key)) != len(key) or any(k not in names or k.startswith("_") for k in key):
            return None
        if any(schema.field(k).type not in _CHAINED_KEY_TYPES for k in key):
            return None
    if set(keys[0]) & _BUFFER_COLUMNS or [inputs[0].field(a).type for a in keys[0]] != [inputs[1].field(b).type for b in keys[1]]:
        return None
    return {k: inputs[0].field(k).type for k in keys[0]}


def chained_output_schema(
    inputs: Sequence[pa.Schema], key: Sequence[str], other_key: Sequence[str], own: Sequence[pa.Field] = ()
) -> pa.Schema | None:
    """A joined row's schema as :func:`joined_rows` makes it; None where Spark raises (or resolves names ignoring case).

    The key columns as the first side types them, ``own``, then the records'
    other columns; nullable, as Spark has them (``from_json``'s fields, and
    keys of a union with the stored records).
    """
    users = [[f.name for f in schema if not f.name.startswith("_")] for schema in inputs]
    try:
        columns = output_columns(key, users[0], users[1], other_key, reserved=[f.name for f in own])
    except PipelineDefinitionError:
        return None
    fields = [*(inputs[0].field(k).with_nullable(True) for k in key), *own]
    fields += [inputs[SIDES.index(side)].field(c).with_name(name).with_nullable(True) for side, c, name in columns[len(key) :]]
    names = [f.name.lower() for f in fields]
    return pa.schema(fields) if len(set(names)) == len(names) else None


def _json_string(value: str) -> str:
    return f'"{value.translate(_JSON_ESCAPES)}"'


def _json_strings(column: Any) -> Any:
    """Strings as JSON string literals (vectorised; a column with control characters is escaped value by value)."""
    if pc.any(pc.match_substring_regex(column, r"[\x00-\x1f]")).as_py():
        return pa.array([None if v is None else _json_string(v) for v in column.to_pylist()], pa.string())
    escaped = pc.replace_substring(pc.replace_substring(column, "\\", "\\\\"), '"', '\\"')
    return pc.binary_join_element_wise('"', escaped, '"', "")


def _json_values(column: Any, data_type: pa.DataType, name: str) -> Any:
    """One column's values as Spark's JSON writer prints them (null stays null: the field is left out)."""
    if data_type == pa.string():
        return _json_strings(column)
    if data_type == pa.float64():
        values = np.asarray(pc.fill_null(column, 0.0).to_numpy(zero_copy_only=False), dtype=np.float64)
        size = np.abs(values)
        plain = (values == 0) | ((size >= _PLAIN_DOUBLES[0]) & (size < _PLAIN_DOUBLES[1]))
        if not plain.all():
            raise _declined(f"column {name}: a double Spark's JSON may print with other digits ({values[~plain][0]!r})")
        return pa.array([None if v is None else float.__repr__(v) for v in column.to_pylist()], pa.string())
    if data_type == _EVENT_TIME:
        micros = pc.fill_null(column.cast(pa.int64()), 0)
        if pc.any(pc.or_(pc.less(micros, _FIRST_US), pc.greater(micros, _LAST_US))).as_py():
            raise _declined(f"column {name}: a timestamp outside years 1 to 9999")
        return pc.binary_join_element_wise('"', pc.strftime(column, format="%Y-%m-%dT%H:%M:%S"), 'Z"', "")  # %S: six decimals
    return pc.cast(column, pa.string())  # integers as digits, booleans as true/false


def record_json(records: pa.Table, fields: Sequence[pa.Field]) -> Any:
    """Each row as :func:`fresh_records`' ``to_json(struct(fields), _JSON_OPTIONS)`` writes it: fields in order, nulls left out.

    Declines a value whose JSON it does not write exactly as Spark does.
    """
    parts = [
        pc.binary_join_element_wise(f"{_json_string(f.name)}:", _json_values(records[f.name], f.type, f.name), "")
        for f in fields
    ]
    if not parts:
        return pa.repeat(pa.scalar("{}"), records.num_rows)
    body = pc.binary_join_element_wise(*parts, ",", null_handling="skip")
    return pc.binary_join_element_wise("{", body, "}", "")


def _json_column(values: list[Any], data_type: pa.DataType, name: str) -> pa.Array:
    """One field of parsed records as ``from_json`` reads it with the field's type; declines what it does not read exactly."""
    kinds = set(map(type, values)) - {type(None)}
    try:
        if data_type == pa.string() and kinds <= {str}:
            return pa.array(values, pa.string())
        if data_type == pa.bool_() and kinds <= {bool}:
            return pa.array(values, pa.bool_())
        if pa.types.is_integer(data_type) and kinds <= {int}:
            return pa.array(values, data_type)  # out of range: raises
        if data_type == pa.float64() and kinds <= {int, float}:
            # float(): correctly rounded, as Java's parser
            doubles = pa.array([v if v is None else float(v) for v in values], pa.float64())
            if pc.all(pc.is_finite(doubles)).as_py() is not False:
                return doubles
        if data_type == _EVENT_TIME and kinds <= {str}:
            texts = pa.array(values, pa.string())
            if pc.all(pc.match_substring_regex(texts, _TIMESTAMP_JSON)).as_py() is not False:
                return pc.cast(texts, _EVENT_TIME)  # a day or time out of range: raises
    except (pa.ArrowInvalid, OverflowError):
        pass
    raise _declined(f"a stored record's {name} that the chained form does not read as {data_type}")


def record_values(records: Any, fields: Sequence[pa.Field]) -> pa.Table:
    """Buffered records' columns as :func:`joined_rows`' ``from_json(record, schema, _JSON_OPTIONS)`` reads them (nullable)."""
    texts = records.to_pylist()
    try:  # one parse for all: each record is one JSON object (or null), so the array has one element per record
        parsed = json.loads(f"[{','.join('null' if t is None else t for t in texts)}]")
    except ValueError:
        raise _declined("a stored record that is not JSON") from None
    if len(parsed) != len(texts) or not set(map(type, parsed)) <= {dict, type(None)}:
        raise _declined("a stored record that is not one JSON object")
    schema = pa.schema([f.with_nullable(True) for f in fields])
    columns = [_json_column([None if p is None else p.get(f.name) for p in parsed], f.type, f.name) for f in fields]
    return pa.Table.from_arrays(columns, schema=schema)


def _record_ranks(rows: pa.Table, key: Sequence[str]) -> pa.Array:
    """``record_index``: ``row_number()`` per key by ``event_time_us``, then ``record`` (by bytes, as Spark compares strings)."""
    n = rows.num_rows
    if not n:
        return pa.array([], pa.int64())
    by = [*((k, "ascending") for k in key), ("event_time_us", "ascending"), ("record", "ascending")]
    order = pc.sort_indices(rows, sort_keys=by)
    ordered = rows.select(list(key)).take(order)
    starts = np.zeros(n, dtype=bool)
    starts[0] = True
    for k in key:  # a row starts a key's rows when any key column differs from the row before (no nulls: they are late)
        column = ordered[k].combine_chunks()
        starts[1:] |= np.asarray(pc.not_equal(column.slice(1), column.slice(0, n - 1)).to_numpy(zero_copy_only=False), dtype=bool)
    positions = np.arange(n, dtype=np.int64)
    first = np.maximum.accumulate(np.where(starts, positions, 0))
    ranks = np.empty(n, dtype=np.int64)
    ranks[np.asarray(order.to_numpy(), dtype=np.int64)] = positions - first + 1
    return pa.array(ranks)


def chained_fresh_records(
    task: Any, records: pa.Table, key: Sequence[str], theirs: Sequence[str], time: str, late: Any
) -> tuple[pa.Table, pa.Table]:
    """:func:`fresh_records` on one side's Arrow records: its fresh records and its late ones.

    ``late`` (a boolean per record, never null) marks records that can no
    longer join; a null key is late too. The fresh records have the buffer's
    columns (the key columns named ``key``, ``event_time_us``, ``record``,
    the key group, ``record_epoch``, ``record_index``) and ``_row``, their
    row in ``records``; the late ones the records' user columns
    (:func:`chained_late_records` sends them on).
    """
    users = [f for f in records.schema if not f.name.startswith("_")]
    for column in theirs:
        late = pc.or_(late, pc.is_null(records[column]))
    mask = np.asarray(late.to_numpy(zero_copy_only=False), dtype=bool) if records.num_rows else np.zeros(0, dtype=bool)
    late_rows = records.filter(pa.array(mask)).select([f.name for f in users])
    rows = np.flatnonzero(~mask).astype(np.int64)
    kept = records.take(pa.array(rows))
    fresh = pa.table(
        {
            **{k: kept[t] for k, t in zip(key, theirs)},
            "event_time_us": kept[time].cast(pa.int64()),
            "record": record_json(kept, users),
        }
    )
    fresh = fresh.append_column(KEY_GROUP, task.key_groups_of(fresh.select(list(key))))
    fresh = fresh.append_column("record_epoch", pa.repeat(pa.scalar(task.epoch, pa.int64()), fresh.num_rows))
    fresh = fresh.append_column("record_index", _record_ranks(fresh, key))
    return fresh.append_column("_row", pa.array(rows)), late_rows


def chained_late_records(task: Any, what: str, late: pa.Table, late_output: str | None, side: str) -> None:
    """:func:`fresh_records`' late records: to ``late_output`` if declared (every epoch, empty or not), else dropped and logged.

    The count goes to the log of the Python worker running the task (the
    executor's log), the one place a task logs to.
    """
    if late_output:
        task.emit(late_output, late)
    elif late.num_rows:
        _log.warning("epoch %d: %s dropped %d late %s record(s) (no late output declared)", task.epoch, what, late.num_rows, side)
