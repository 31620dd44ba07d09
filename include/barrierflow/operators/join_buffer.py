"""What the two-input event-time joins share: late records, records buffered in state, joined rows.

An interval join (:mod:`barrierflow.operators.interval_join`) and a window
join (:mod:`barrierflow.operators.window_join`) take two inputs, each KEYED
by its own key columns (as many, of the same types pairwise): the kernel
sees every record of its keys from both sides. Each side's records wait in a
state table until the watermark passes the last time they can join:

- ``<operator_id>__left`` / ``<operator_id>__right``: the key columns (named
  as the left side's, typed as its), any columns of the join's own (a
  window's ``window_start``), ``record_epoch`` (the epoch the record
  arrived in) and ``record_index`` (its rank among its key's records of that
  epoch, by event time, then by its JSON's bytes: identical records are
  interchangeable, so the rank is deterministic), then ``event_time_us`` and
  ``record``, the record's user columns as JSON (:func:`record_json`).

A joined row holds the key columns, the join's own columns, then the left
record's other columns and the right's, a name on both sides becoming
``left_<name>`` / ``right_<name>`` (:func:`output_columns`). The epoch's own
records go into it as they arrived; a buffered one as its JSON reads back
(:func:`record_values`).

A record with a null key or event time (one a source could not make a dead
letter) can join nothing: it counts as late. Late records go to the side's
late output if declared (the side's user columns), else they are dropped
and counted (``late records dropped by <operator_id>``).

**The buffered record's JSON** is the text Spark's
``to_json(struct(<user columns>), {timestampFormat: "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
timestampNTZFormat: "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"})`` wrote in earlier
releases (warehouses and savepoints hold it), byte for byte for the types a
record of those releases could hold:

- one object, the fields in column order, a null field left out (also in
  nested structs); no whitespace;
- strings: UTF-8 as is, with Jackson's escapes: ``\\"``, ``\\\\``, ``\\b``,
  ``\\t``, ``\\n``, ``\\f``, ``\\r``, other characters below U+0020 as
  ``\\u00XX`` (uppercase hex);
- integers as digits; booleans ``true`` / ``false``;
- doubles and floats as Java's ``Double.toString`` / ``Float.toString``
  (shortest digits that read back exactly: ``12.5``, ``1.0``, ``-0.0``,
  ``1.0E7``, ``1.5E-5``), NaN and infinities as the strings ``"NaN"``,
  ``"Infinity"``, ``"-Infinity"``. Outside ``[1e-3, 1e7)`` a JDK before 19
  may have printed a longer digit string for a few values; both read back
  as the same number;
- decimals as Java's ``BigDecimal.toString`` (``123.45``, ``1E-8``);
- timestamps with a time zone as UTC ``"2024-05-01T12:00:00.123456Z"``,
  without one ``"2024-05-01T12:00:00.123456"`` (always six decimals; a year
  after 9999 with a plus sign, ``+10000``, as Java's ``yyyy``; years before 1
  in NumPy's astronomical form, ``0000``, ``-001``, which Spark never held);
  dates ``"2024-05-01"``;
- binaries as base64 strings (with padding);
- lists ``[...]`` (a null element as ``null``), structs as objects, maps as
  objects whose names are the keys as text (a null value as ``null``).

Other Arrow types (times, durations, intervals, unions) have no such form:
a join refuses them when the pipeline is planned. Reading a buffered record
takes each field by name, as Spark's ``from_json``: a field the JSON lacks
or holds as another type reads null.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any, ClassVar, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.core.arrow import conform
from barrierflow.core.columns import KEY_GROUP, user_columns
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.base import Exchange, Node, Task, with_key_group
from barrierflow.state.spec import StateSpec

__all__ = [
    "SIDES", "BUFFER_COLUMNS", "TwoSidedJoin", "SideRecords", "buffer_spec", "output_columns", "record_json", "record_values",
    "side_records", "send_late", "key_ids", "event_time_us", "buffered_rows", "buffer_columns", "joined_values", "greater_than", "at_most",
    "INT64_MIN", "INT64_MAX",
]  # fmt: skip

SIDES = ("left", "right")
# The buffer's own columns beside the key columns (no key column may take these names).
BUFFER_COLUMNS = ("record_epoch", "record_index", "event_time_us", "record")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


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
    # Columns of the join's own in its output, after the key columns (a window's start and end).
    own_output_fields: ClassVar[tuple[pa.Field, ...]] = ()
    kind: ClassVar[str] = "join"

    @property
    def what(self) -> str:
        return f"{self.kind} {self.operator_id!r}"

    # -- the graph

    def inputs(self) -> tuple[Node, ...]:
        assert self.parent is not None and self.other is not None
        return (self.parent, self.other)

    def keyed_inputs(self) -> list[tuple[Node, tuple[str, ...]]]:
        # A null event time is checked at the sources as a null key is (a dead letter there).
        return [(node, (*key, time)) for node, key, time in zip(self.inputs(), (self.key, self.other_key), self.time_columns)]

    def exchanges(self) -> tuple[Exchange, ...]:
        return (Exchange.KEYED, Exchange.KEYED)

    def input_keys(self) -> tuple[tuple[str, ...], ...]:
        return (tuple(self.key), tuple(self.other_key))  # by key only: the event time is no part of the key group

    def key_output(self) -> tuple[str, ...]:
        return self.key  # a pair's key columns, named as the left side's

    # -- what it declares

    def side_outputs(self) -> list[str]:
        return list(dict.fromkeys(name for name in self.late_outputs if name))

    def side_output_schemas(self, inputs: Sequence[pa.Schema]) -> dict[str, pa.Schema]:
        """Each declared late output: its side's user columns, nullable (one named by both sides: the left's, then the right's others)."""
        schemas: dict[str, pa.Schema] = {}
        for name, schema in zip(self.late_outputs, inputs):
            if not name:
                continue
            fields = [f.with_nullable(True) for f in schema if f.name in user_columns(schema.names)]
            if name not in schemas:
                schemas[name] = pa.schema(fields)
                continue
            merged = schemas[name]
            for field in fields:
                if field.name not in merged.names:
                    merged = merged.append(field)
                elif merged.field(field.name).type != field.type:
                    raise PipelineDefinitionError(
                        f"{self.what}: both sides' late records go to {name!r}, but their column {field.name!r} is "
                        f"{merged.field(field.name).type} on the left and {field.type} on the right; give each side its own late output"
                    )
            schemas[name] = merged
        return schemas

    def _spec(self, side: str, key_types: dict[str, pa.DataType] | None = None) -> StateSpec:
        return buffer_spec(self.operator_id, side, self.key, self.own_fields, key_types)

    def state_specs(self, inputs: Sequence[pa.Schema] | None = None) -> list[StateSpec]:
        types = None
        if inputs:
            types = {k: inputs[0].field(k).type for k in self.key if k in inputs[0].names}
        return [self._spec(side, types) for side in SIDES]

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        """The key columns (the left's), the join's own columns, then both records' other columns, all nullable."""
        self._check_inputs(inputs)
        users = [user_columns(schema.names) for schema in inputs]
        columns = output_columns(self.key, users[0], users[1], self.other_key, reserved=[f.name for f in self.own_output_fields])
        fields = [inputs[0].field(k).with_nullable(True) for k in self.key]
        fields += [f.with_nullable(True) for f in self.own_output_fields]
        fields += [
            inputs[SIDES.index(side)].field(c).with_name(name).with_nullable(True) for side, c, name in columns[len(self.key) :]
        ]
        lowered = [f.name.lower() for f in fields]
        clashes = sorted({f.name for f in fields if lowered.count(f.name.lower()) > 1})
        if clashes:
            raise PipelineDefinitionError(
                f"{self.what}: output columns {clashes} differ only in case (tables resolve names ignoring case); "
                "rename them upstream with select or map"
            )
        return pa.schema(fields)

    def _check_inputs(self, inputs: Sequence[pa.Schema]) -> None:
        """Refuses inputs the join cannot take: missing columns, keys of other types, event times that are not timestamps."""
        if len(inputs) != 2:
            raise PipelineDefinitionError(f"{self.what}: takes two inputs, got {len(inputs)}")
        keys = (self.key, self.other_key)
        if len(self.key) != len(self.other_key) or not self.key:
            raise PipelineDefinitionError(
                f"{self.what}: the inputs are keyed by {list(self.key)} and {list(self.other_key)}; two joined streams "
                "need as many key columns, of the same types, in the same order"
            )
        for index, (schema, key, time) in enumerate(zip(inputs, keys, self.time_columns)):
            side = SIDES[index]
            names = schema.names
            duplicated = sorted({n for n in names if names.count(n) > 1})
            if duplicated:
                raise PipelineDefinitionError(f"{self.what}: the {side} input has columns {duplicated} twice")
            for column in (*key, time):
                if column not in names or column.startswith("_"):
                    raise PipelineDefinitionError(
                        f"{self.what}: the {side} input has no column {column!r} (columns: {user_columns(names)})"
                    )
            if len(set(key)) != len(key):
                raise PipelineDefinitionError(f"{self.what}: the {side} key {list(key)} names a column twice")
            if not pa.types.is_timestamp(schema.field(time).type):
                raise PipelineDefinitionError(
                    f"{self.what}: the {side} input's event time {time!r} must be a timestamp, found {schema.field(time).type}"
                )
            for field in schema:
                if not field.name.startswith("_") and not _has_json_form(field.type):
                    raise PipelineDefinitionError(
                        f"{self.what}: the {side} input's column {field.name!r} is of type {field.type}, which a join cannot "
                        "buffer (records wait in state as JSON); convert it upstream (e.g. to a string or a number)"
                    )
        differ = [
            f"{a} is {inputs[0].field(a).type} but {b} is {inputs[1].field(b).type}"
            for a, b in zip(self.key, self.other_key)
            if inputs[0].field(a).type != inputs[1].field(b).type
        ]
        if differ:
            raise PipelineDefinitionError(
                f"{self.what}: the key columns of the two inputs differ in type ({'; '.join(differ)}); "
                "joined keyed streams need keys of the same types, in the same order"
            )
        own = [f.name for f in self.own_fields]
        taken = sorted(set(self.key) & {*BUFFER_COLUMNS, *own})
        if taken:
            raise PipelineDefinitionError(
                f"{self.what}: key columns {taken} are named like the join's buffer columns {[*own, *BUFFER_COLUMNS]}; "
                "rename them upstream with select or map"
            )

    # -- shared kernel steps

    def late_schemas(self, inputs: Sequence[pa.Schema]) -> list[pa.Schema | None]:
        schemas = self.side_output_schemas(inputs)
        return [schemas[name] if name else None for name in self.late_outputs]


# -- the epoch's records of one side ------------------------------------------------------------------------------------


@dataclass
class SideRecords:
    """One side's records of the epoch: those that may join, in the buffer's form, and the late ones."""

    fresh: pa.Table  # key columns (the left's names), KEY_GROUP, record_epoch, record_index, event_time_us, record
    rows: np.ndarray  # each fresh record's row in the input
    late: pa.Table  # the late records' user columns


def event_time_us(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A timestamp column in microseconds since the Unix epoch, and whether each is not null."""
    micros = pc.cast(column, pa.timestamp("us", tz=column.type.tz), safe=False).cast(pa.int64())
    valid = np.asarray(pc.is_valid(micros).to_numpy(zero_copy_only=False), dtype=bool)
    values = np.asarray(pc.fill_null(micros, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    return values, valid


def side_records(
    task: Task, records: pa.Table, key: Sequence[str], theirs: Sequence[str], ts_us: np.ndarray, late: np.ndarray
) -> SideRecords:
    """The side's records split into those that may join (in the buffer's form) and the late ones.

    ``late`` marks records that can no longer join; a null key is late too.
    ``record_index`` ranks a key's fresh records by event time, then by their
    JSON's bytes, as Spark's ``row_number()`` over them did.
    """
    late = np.array(late, dtype=bool, copy=True)
    for column in theirs:
        late |= np.asarray(pc.is_null(records[column]).to_numpy(zero_copy_only=False), dtype=bool)
    users = user_columns(records.column_names)
    late_rows = records.filter(pa.array(late)).select(users)
    rows = np.flatnonzero(~late).astype(np.int64)
    kept = with_key_group(records, theirs, task.key_groups).take(pa.array(rows))
    n = kept.num_rows
    columns: dict[str, Any] = {k: kept[t] for k, t in zip(key, theirs)}
    columns[KEY_GROUP] = kept[KEY_GROUP]
    columns["record_epoch"] = pa.repeat(pa.scalar(task.epoch, pa.int64()), n)
    columns["event_time_us"] = pa.array(ts_us[rows], pa.int64())
    columns["record"] = record_json(kept, [records.schema.field(c) for c in users])
    fresh = pa.table(columns)
    fresh = fresh.append_column("record_index", _record_ranks(fresh, key))
    return SideRecords(fresh, rows, late_rows)


def _record_ranks(fresh: pa.Table, key: Sequence[str]) -> pa.Array:
    """``record_index``: 1, 2... per key, by ``event_time_us`` then ``record`` (by bytes, as Spark compares strings)."""
    n = fresh.num_rows
    if not n:
        return pa.array([], pa.int64())
    (ids,) = key_ids([fresh], key)
    order = pc.sort_indices(
        pa.table({"_id": ids, "t": fresh["event_time_us"], "r": fresh["record"]}),
        sort_keys=[("_id", "ascending"), ("t", "ascending"), ("r", "ascending")],
    ).to_numpy()
    sorted_ids = ids[order]
    starts = np.ones(n, dtype=bool)
    starts[1:] = sorted_ids[1:] != sorted_ids[:-1]
    positions = np.arange(n, dtype=np.int64)
    first = np.maximum.accumulate(np.where(starts, positions, 0))
    ranks = np.empty(n, dtype=np.int64)
    ranks[order] = positions - first + 1
    return pa.array(ranks)


def send_late(task: Task, node: TwoSidedJoin, sides: Sequence[SideRecords], schemas: Sequence[pa.Schema | None]) -> None:
    """Late records to their side's late output (every epoch, empty or not), else dropped and counted."""
    for label, side, name, schema in zip(("left", "right"), sides, node.late_outputs, schemas):
        if name and schema is not None:
            task.emit(name, conform(side.late, schema))
        elif side.late.num_rows:
            task.count(
                f"{node.kind} {node.operator_id!r} dropped {{n}} late {label} record(s) (no late output declared)",
                side.late.num_rows,
            )


def buffered_rows(task: Task, spec: StateSpec, read: bool) -> pa.Table:
    """Every buffered row of the task's key groups (the buffer's columns), or none when ``read`` is false."""
    columns = buffer_columns(spec)
    if not read:
        return columns.empty_table()
    return task.state(spec).every_live_row().select(columns.names).cast(columns)


def buffer_columns(spec: StateSpec) -> pa.Schema:
    schema = spec.arrow_schema()
    return pa.schema([schema.field(c) for c in (*spec.key_columns, KEY_GROUP, *spec.value_columns)])


# -- keys, times ------------------------------------------------------------------------------------------------------


def key_ids(tables: Sequence[pa.Table], key: Sequence[str]) -> list[np.ndarray]:
    """Dense ids of each row's key across ``tables`` (the same key columns and types; no null keys).

    Equal ids for keys Spark's equality takes as equal: -0.0 and 0.0, any NaN and NaN.
    """
    sizes = [t.num_rows for t in tables]
    total = sum(sizes)
    ids = np.zeros(total, dtype=np.int64)
    if total:
        for name in key:
            column = pa.chunked_array([c for t in tables for c in t[name].chunks], type=tables[0].schema.field(name).type)
            array = column.combine_chunks()
            if pa.types.is_floating(array.type):
                zero = pa.scalar(0, array.type)
                array = pc.if_else(pc.equal(array, zero), zero, array)  # -0.0 as 0.0
                array = pc.if_else(pc.is_nan(array), pa.scalar(float("nan"), array.type), array)
            codes = np.asarray(pc.dictionary_encode(array).indices.to_numpy(zero_copy_only=False), dtype=np.int64)
            ids = np.unique(ids * (int(codes.max()) + 1) + codes, return_inverse=True)[1].astype(np.int64).reshape(-1)
    bounds = np.cumsum([0, *sizes])
    return [ids[bounds[i] : bounds[i + 1]] for i in range(len(tables))]


def greater_than(values: np.ndarray, bound: int) -> np.ndarray:
    """``values > bound`` exactly, ``bound`` any Python int (beyond a long too)."""
    if bound < INT64_MIN:
        return np.ones(len(values), dtype=bool)
    if bound >= INT64_MAX:
        return np.zeros(len(values), dtype=bool)
    return values > np.int64(bound)


def at_most(values: np.ndarray, bound: int) -> np.ndarray:
    return ~greater_than(values, bound)


# -- joined rows ------------------------------------------------------------------------------------------------------


def joined_values(
    records: pa.Table, rows_of_fresh: np.ndarray, candidates: pa.Table, fresh_count: int, at: np.ndarray
) -> pa.Table:
    """The user columns of one side's candidates at rows ``at``: an epoch's record (a row before ``fresh_count``)
    as its input row, a buffered one as its JSON reads back (once however many pairs it is in)."""
    fields = [records.schema.field(c) for c in user_columns(records.column_names)]
    schema = pa.schema([f.with_nullable(True) for f in fields])
    is_new = at < fresh_count
    new_rows = rows_of_fresh[at[is_new]]
    stored, inverse = np.unique(at[~is_new], return_inverse=True)
    parts = pa.concat_tables(
        [
            conform(records.select(schema.names).take(pa.array(new_rows, pa.int64())), schema),
            record_values(candidates["record"].take(pa.array(stored, pa.int64())), fields).take(
                pa.array(inverse.reshape(-1).astype(np.int64))
            ),
        ]
    )
    placed = np.concatenate([np.flatnonzero(is_new), np.flatnonzero(~is_new)])
    order = np.empty(len(placed), dtype=np.int64)
    order[placed] = np.arange(len(placed), dtype=np.int64)
    return parts.take(pa.array(order))


# -- a record as JSON (see the module docstring) -----------------------------------------------------------------------

_JSON_ESCAPES = {
    **{c: f"\\u{c:04X}" for c in range(0x20)}, 0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r",
    0x22: '\\"', 0x5C: "\\\\",
}  # fmt: skip
_CONTROL = r"[\x00-\x1f]"
# Java prints a double or float in [1e-3, 1e7) in plain notation, others as d.dddE<n>.
_PLAIN = (1e-3, 1e7)


def _has_json_form(type_: pa.DataType) -> bool:
    """Whether a column of this type can be buffered as JSON (see the module docstring)."""
    if pa.types.is_dictionary(type_):
        return _has_json_form(type_.value_type)
    if pa.types.is_map(type_):
        return _has_json_form(type_.key_type) and _has_json_form(type_.item_type)
    if pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_):
        return _has_json_form(type_.value_type)
    if pa.types.is_struct(type_):
        return all(_has_json_form(type_.field(i).type) for i in range(type_.num_fields))
    return (
        pa.types.is_null(type_)
        or pa.types.is_boolean(type_)
        or pa.types.is_integer(type_)
        or pa.types.is_floating(type_)
        or pa.types.is_decimal(type_)
        or _is_string(type_)
        or _is_binary(type_)
        or pa.types.is_date(type_)
        or pa.types.is_timestamp(type_)
    )


def _is_string(type_: pa.DataType) -> bool:
    return pa.types.is_string(type_) or pa.types.is_large_string(type_) or pa.types.is_string_view(type_)


def _is_binary(type_: pa.DataType) -> bool:
    return (
        pa.types.is_binary(type_) or pa.types.is_large_binary(type_) or pa.types.is_binary_view(type_)
        or pa.types.is_fixed_size_binary(type_)
    )  # fmt: skip


def _array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column


def record_json(records: pa.Table, fields: Sequence[pa.Field]) -> pa.Array:
    """Each row's ``fields`` as one JSON object (see the module docstring): in order, null fields left out."""
    return _object_json([records[f.name] for f in fields], [f.name for f in fields], records.num_rows)


def _object_json(columns: Sequence[pa.Array | pa.ChunkedArray], names: Sequence[str], n: int) -> pa.Array:
    if not columns:
        return pa.repeat(pa.scalar("{}"), n)
    # Each field as ',"name":value', or nothing when null; the first comma then dropped. (Arrow's join
    # skipping nulls would drop the rows whose fields are all null.)
    parts = [
        pc.fill_null(pc.binary_join_element_wise(f",{_json_string(name)}:", _json(_array(c)), ""), "")
        for c, name in zip(columns, names)
    ]
    body = pc.utf8_slice_codeunits(pc.binary_join_element_wise(*parts, ""), 1)
    return pc.binary_join_element_wise("{", body, "}", "")


def _json_string(value: str) -> str:
    return f'"{value.translate(_JSON_ESCAPES)}"'


def _json_strings(column: pa.Array) -> pa.Array:
    """Strings as JSON string literals (Jackson's escapes)."""
    escaped = pc.replace_substring(pc.replace_substring(column, "\\", "\\\\"), '"', '\\"')
    if pc.any(pc.match_substring_regex(column, _CONTROL)).as_py():
        for code in range(0x20):
            escaped = pc.replace_substring(escaped, chr(code), _JSON_ESCAPES[code])
    return pc.binary_join_element_wise('"', escaped, '"', "")


def _json(column: pa.Array) -> pa.Array:
    """One column's values as JSON text (null where the value is null)."""
    type_ = column.type
    n = len(column)
    if pa.types.is_dictionary(type_):
        return _json(column.cast(type_.value_type))
    if pa.types.is_null(type_):
        return pa.nulls(n, pa.string())
    if _is_string(type_):
        return _json_strings(column.cast(pa.string()))
    if pa.types.is_boolean(type_) or pa.types.is_integer(type_) or pa.types.is_decimal(type_):
        return column.cast(pa.string())  # digits, true/false; a decimal as BigDecimal.toString
    if pa.types.is_floating(type_):
        return _json_floats(column)
    if _is_binary(type_):
        texts = [None if v is None else f'"{base64.b64encode(v).decode("ascii")}"' for v in column.to_pylist()]
        return pa.array(texts, pa.string())
    if pa.types.is_date(type_):
        days = np.asarray(pc.fill_null(column.cast(pa.date32()).cast(pa.int32()), 0).to_numpy(zero_copy_only=False))
        text = _iso(np.datetime_as_string(days.astype("datetime64[D]"), unit="D"))
        return _quoted(text, "", column)
    if pa.types.is_timestamp(type_):
        micros, _ = event_time_us(column)
        text = _iso(np.datetime_as_string(micros.astype("datetime64[us]"), unit="us"))
        return _quoted(text, "Z" if type_.tz is not None else "", column)
    if pa.types.is_map(type_):
        return _json_map(column)
    if pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_):
        values = pc.fill_null(_json(_array(pc.list_flatten(column))), "null")
        return _joined_lists(column, values, "[", "]")
    if pa.types.is_struct(type_):
        children = [pc.struct_field(column, [i]) for i in range(type_.num_fields)]
        body = _object_json(children, [type_.field(i).name for i in range(type_.num_fields)], n)
        return pc.if_else(column.is_valid(), body, pa.scalar(None, pa.string()))
    raise PipelineDefinitionError(f"a column of type {type_} has no JSON form")


def _iso(text: np.ndarray) -> np.ndarray:
    """NumPy's ISO dates as Java's ``yyyy`` prints them: a year after 9999 with a plus sign."""
    long_year = np.char.find(text.astype(str), "-", 1) > 4
    return np.where(long_year & (np.char.find(text.astype(str), "-") != 0), np.char.add("+", text), text)


def _quoted(text: np.ndarray, suffix: str, column: pa.Array) -> pa.Array:
    values = pa.array(text.astype(str), pa.string())
    quoted = pc.binary_join_element_wise('"', values, f'{suffix}"', "")
    return pc.if_else(column.is_valid(), quoted, pa.scalar(None, pa.string()))


def _json_floats(column: pa.Array) -> pa.Array:
    """Doubles and floats as Java's ``Double.toString`` / ``Float.toString``; NaN and infinities as strings."""
    single = not pa.types.is_float64(column.type)
    if pa.types.is_float16(column.type):
        column = column.cast(pa.float32())
    values = np.asarray(pc.fill_null(column, 0.0).to_numpy(zero_copy_only=False), dtype=np.float64)
    text = column.cast(pa.string())  # shortest digits that read back exactly (plain in Java's plain range)
    text = pc.if_else(pc.match_substring(text, "."), text, pc.binary_join_element_wise(text, ".0", ""))
    size = np.abs(values)
    finite = np.isfinite(values)
    plain = (values == 0) | ((size >= _PLAIN[0]) & (size < _PLAIN[1]))
    other = np.flatnonzero(~(plain & finite) & np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool))
    if not len(other):
        return text
    mask = np.zeros(len(values), dtype=bool)
    mask[other] = True
    fixed = pa.array([_java_float(float(v), single) for v in values[other]], pa.string())  # only values outside the plain range
    return pc.replace_with_mask(text, pa.array(mask), fixed)


def _java_float(value: float, single: bool) -> str:
    """Java's text of a double (or float) outside its plain range: ``d.dddE<n>``; NaN and infinities as JSON strings."""
    if value != value:
        return '"NaN"'
    if value in (float("inf"), float("-inf")):
        return '"Infinity"' if value > 0 else '"-Infinity"'
    shortest = str(np.float32(value)) if single else repr(value)
    sign, digits, exponent = Decimal(shortest).normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    return f"{'-' if sign else ''}{text[0]}.{text[1:] or '0'}E{len(text) - 1 + exponent}"


def _joined_lists(column: pa.Array, values: pa.Array, opening: str, closing: str) -> pa.Array:
    """Each list's (or map's) element texts ``values`` joined by commas between ``opening`` and ``closing``."""
    lengths = np.asarray(pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    lists = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values)
    joined = pc.binary_join_element_wise(opening, pc.binary_join(lists, ","), closing, "")
    return pc.if_else(column.is_valid(), joined, pa.scalar(None, pa.string()))


def _entries(column: pa.Array) -> pa.Array:
    """A map column as a list of (key, value) structs."""
    type_ = column.type
    return column.cast(pa.list_(pa.struct([type_.key_field, type_.item_field])))


def _json_map(column: pa.Array) -> pa.Array:
    entries = _entries(column)
    flat = _array(pc.list_flatten(entries))
    keys, items = _array(pc.struct_field(flat, [0])), _array(pc.struct_field(flat, [1]))
    names = _json_strings(_key_text(keys))
    pairs = pc.binary_join_element_wise(names, pc.fill_null(_json(items), "null"), ":")
    return _joined_lists(entries, pairs, "{", "}")


def _key_text(keys: pa.Array) -> pa.Array:
    """Map keys as text, as Spark's ``toString`` of its internal value (a timestamp's microseconds, a date's days)."""
    type_ = keys.type
    if pa.types.is_dictionary(type_):
        return _key_text(keys.cast(type_.value_type))
    if _is_string(type_):
        return keys.cast(pa.string())
    if pa.types.is_timestamp(type_):
        return pa.array(event_time_us(keys)[0], pa.int64()).cast(pa.string())
    if pa.types.is_date(type_):
        return keys.cast(pa.date32()).cast(pa.int32()).cast(pa.string())
    text = _json(keys)
    return pc.utf8_trim(text, '"') if pa.types.is_floating(type_) or _is_binary(type_) else text


# -- a buffered record read back ----------------------------------------------------------------------------------------


def record_values(records: pa.Array | pa.ChunkedArray, fields: Sequence[pa.Field]) -> pa.Table:
    """Buffered records' fields (nullable), each read by name from its JSON as Spark's ``from_json`` reads it."""
    texts = records.to_pylist()
    decimals = any(_has_decimal(f.type) for f in fields)
    objects = _parse(texts, decimals)
    schema = pa.schema([f.with_nullable(True) for f in fields])
    columns = [_from_json([None if o is None else o.get(f.name) for o in objects], f.type) for f in fields]
    return pa.Table.from_arrays(columns, schema=schema)


def _parse(texts: list[str | None], decimals: bool) -> list[dict[str, Any] | None]:
    parse_float = Decimal if decimals else None
    try:  # one parse for all: each record is one JSON object, so the array has one element per record
        parsed = json.loads(f"[{','.join('null' if t is None else t for t in texts)}]", parse_float=parse_float)
        if len(parsed) != len(texts):
            raise ValueError("not one value per record")
    except ValueError:
        parsed = []
        for text in texts:
            try:
                parsed.append(None if text is None else json.loads(text, parse_float=parse_float))
            except ValueError:
                parsed.append(None)
    return [p if isinstance(p, dict) else None for p in parsed]


def _has_decimal(type_: pa.DataType) -> bool:
    if pa.types.is_decimal(type_):
        return True
    if pa.types.is_dictionary(type_):
        return _has_decimal(type_.value_type)
    if pa.types.is_map(type_):
        return _has_decimal(type_.key_type) or _has_decimal(type_.item_type)
    if pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_):
        return _has_decimal(type_.value_type)
    if pa.types.is_struct(type_):
        return any(_has_decimal(type_.field(i).type) for i in range(type_.num_fields))
    return False


_NON_NUMBERS = {"NaN": float("nan"), "Infinity": float("inf"), "+Infinity": float("inf"), "-Infinity": float("-inf"),
                "INF": float("inf"), "+INF": float("inf"), "-INF": float("-inf")}  # fmt: skip


def _from_json(values: list[Any], type_: pa.DataType) -> pa.Array:
    """Parsed JSON values as an array of ``type_`` (a value of another kind reads null)."""
    if pa.types.is_dictionary(type_):
        return _from_json(values, type_.value_type).cast(type_)
    if pa.types.is_null(type_):
        return pa.nulls(len(values))
    if _is_string(type_):
        return pa.array([_text(v) for v in values], pa.string()).cast(type_)
    if pa.types.is_boolean(type_):
        return pa.array([v if isinstance(v, bool) else None for v in values], pa.bool_())
    if pa.types.is_integer(type_):
        info = np.iinfo(type_.to_pandas_dtype())
        ints = [v if isinstance(v, int) and not isinstance(v, bool) and info.min <= v <= info.max else None for v in values]
        return pa.array(ints, type_)
    if pa.types.is_floating(type_):
        return pa.array([_float(v) for v in values], pa.float64()).cast(type_, safe=False)
    if pa.types.is_decimal(type_):
        return pa.array([_decimal(v, type_) for v in values], type_)
    if _is_binary(type_):
        return pa.array([_binary(v) for v in values], pa.binary()).cast(type_)
    if pa.types.is_date(type_):
        texts = [v if isinstance(v, str) else None for v in values]
        return _cast_texts(texts, pa.date32()).cast(type_)
    if pa.types.is_timestamp(type_):
        return _timestamps(values, type_)
    if pa.types.is_map(type_):
        offsets, keys, items, mask = [0], [], [], []
        for v in values:
            if isinstance(v, dict):
                keys += list(v)
                items += list(v.values())
            offsets.append(len(keys))
            mask.append(not isinstance(v, dict))
        key_array = _key_values(keys, type_.key_type)
        return pa.MapArray.from_arrays(
            pa.array(offsets, pa.int32()),
            key_array,
            _from_json(items, type_.item_type),
            type=type_,
            mask=pa.array(mask, pa.bool_()),
        )
    if pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_):
        offsets, flat, mask = [0], [], []
        for v in values:
            if isinstance(v, list):
                flat += v
            offsets.append(len(flat))
            mask.append(not isinstance(v, list))
        inner = _from_json(flat, type_.value_type)
        lists = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), inner, mask=pa.array(mask, pa.bool_()))
        return lists.cast(type_)
    if pa.types.is_struct(type_):
        fields = [type_.field(i) for i in range(type_.num_fields)]
        children = [_from_json([v.get(f.name) if isinstance(v, dict) else None for v in values], f.type) for f in fields]
        return pa.StructArray.from_arrays(
            children, fields=fields, mask=pa.array([not isinstance(v, dict) for v in values], pa.bool_())
        )
    raise PipelineDefinitionError(f"a column of type {type_} has no JSON form")


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float, Decimal)):
        return float(value)
    if isinstance(value, str):
        return _NON_NUMBERS.get(value)
    return None


def _decimal(value: Any, type_: pa.DataType) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        return None
    try:
        number = Decimal(str(value)).quantize(Decimal(1).scaleb(-type_.scale), rounding=ROUND_HALF_UP)
    except InvalidOperation:
        return None
    return number if len(number.as_tuple().digits) <= type_.precision else None


def _binary(value: Any) -> bytes | None:
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        return None


def _cast_texts(texts: list[str | None], type_: pa.DataType) -> pa.Array:
    """ISO texts as ``type_`` (a date, or a timestamp in microseconds); one that does not read reads null."""
    array = pa.array(texts, pa.string())
    try:
        return array.cast(type_)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    values = []
    for text in texts:
        values.append(None if text is None else _iso_value(text, type_))
    return pa.array(values, type_)


def _iso_value(text: str, type_: pa.DataType) -> Any:
    """One ISO text NumPy reads (years beyond four digits, a sign); None if it does not read."""
    body = text[1:] if text.startswith("+") else text
    body = body[:-1] if body.endswith("Z") else body
    try:
        if pa.types.is_date(type_):
            return int(np.datetime64(body, "D").astype(np.int64))
        return int(np.datetime64(body, "us").astype(np.int64))
    except ValueError:
        return None


def _timestamps(values: list[Any], type_: pa.DataType) -> pa.Array:
    zoned = type_.tz is not None
    target = pa.timestamp("us", tz="UTC") if zoned else pa.timestamp("us")
    texts = [v if isinstance(v, str) else None for v in values]
    parsed = _cast_texts(texts, target)
    # A number: seconds since the Unix epoch, as Spark reads one.
    numbers = [int(v * 1_000_000) if isinstance(v, (int, float, Decimal)) and not isinstance(v, bool) else None for v in values]
    if any(n is not None for n in numbers):
        parsed = pc.coalesce(parsed, pa.array(numbers, pa.int64()).cast(target))
    return parsed.cast(type_, safe=False)


def _key_values(keys: list[str], type_: pa.DataType) -> pa.Array:
    """Map keys from their text (:func:`_key_text`)."""
    if pa.types.is_dictionary(type_):
        return _key_values(keys, type_.value_type).cast(type_)
    if _is_string(type_):
        return pa.array(keys, pa.string()).cast(type_)
    if pa.types.is_timestamp(type_):
        return pa.array([int(k) for k in keys], pa.int64()).cast(pa.timestamp("us", tz=type_.tz)).cast(type_, safe=False)
    if pa.types.is_date(type_):
        return pa.array([int(k) for k in keys], pa.int32()).cast(pa.date32()).cast(type_)
    if pa.types.is_floating(type_):
        return _from_json([_NON_NUMBERS[k] if k in _NON_NUMBERS else float(k) for k in keys], type_)
    if _is_binary(type_):
        return _from_json(keys, type_)
    return _from_json([json.loads(k, parse_float=Decimal) for k in keys], type_)
