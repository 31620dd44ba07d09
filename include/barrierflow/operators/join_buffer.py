"""What the event-time operators share: the joins' buffers, late records and joined rows; keys, times, windows.

An interval join (:mod:`barrierflow.operators.interval_join`) and a window join (:mod:`barrierflow.operators.window_join`) take
two inputs, each KEYED by its own key columns (as many, of the same types pairwise): the kernel sees every record of its keys from
both sides. Each side's records wait in a state table until the watermark passes the last time they can join (keyed state: staged
with the epoch, kept by savepoints, redistributed by key group on rescale):

- ``<operator_id>__left`` / ``<operator_id>__right``: the key columns (named as the left side's, typed as its), any columns of the
  join's own (a window's ``window_start``), ``record_epoch`` (the epoch the record arrived in) and ``record_index`` (its rank
  among its key's records of that epoch, by event time, then by its JSON's bytes: identical records are interchangeable, so the
  rank is deterministic), then ``event_time_us`` and ``record``, the record's user columns as JSON (:func:`record_json`).

A joined row holds the key columns, the join's own columns, then the left record's other columns and the right's, a name on both
sides becoming ``left_<name>`` / ``right_<name>`` (:func:`output_columns`). The epoch's own records go into it as they arrived; a
buffered one as its JSON reads back (:func:`record_values`).

A record with a null key or event time (one a source could not make a dead letter) can join nothing: it counts as late. Late
records go to the side's late output if declared (the side's user columns), else they are dropped and counted
(``late records dropped by <operator_id>``).

**The buffered record's JSON** is one object, the fields in column order, a null field left out: strings, numbers and booleans as
JSON writes them (a float as the shortest digits reading back as it, NaN and infinities as the strings ``"NaN"``, ``"Infinity"``,
``"-Infinity"``; a decimal as its digits), timestamps as ISO text with six decimals (in UTC, ``Z``, for one with a time zone) and
dates as ``"2024-05-01"`` (any year), binaries as base64, lists as arrays, structs as objects, maps as objects keyed by the key's
text (a time's microseconds, a date's days). Other Arrow types (times, durations, intervals, unions) have none: a join refuses
them when the pipeline is planned. A record reads back as it was written, to the microsecond
(``tests/operators/test_join_buffer.py``). Reading takes each field by name, as Spark's ``from_json``: a field the JSON lacks or
holds as another type reads null (but a string takes any value's text, a timestamp a number of seconds), so the records earlier
releases buffered with Spark's ``to_json`` (Java's digits, ``1.0E-5``; a year ``+10000``) read back too.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from typing import Any, Callable, ClassVar, Literal, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.api.windows import SlidingEventTimeWindows, TumblingEventTimeWindows
from barrierflow.core.arrow import conform
from barrierflow.core.columns import DELETED, KEY_GROUP, user_columns
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.base import Exchange, Node, Task, key_fields, key_ids, with_key_group
from barrierflow.state.spec import StateSpec

__all__ = [
    "SIDES", "BUFFER_COLUMNS", "INT64_MIN", "INT64_MAX", "TwoSidedJoin", "SideRecords", "output_columns", "record_json",
    "record_values", "side_records", "side_candidates", "stage_buffer", "matches", "ranks", "event_time_us",
    "greater_than", "at_most", "due_rows", "aligned_windows", "ints", "bools",
]  # fmt: skip

SIDES = ("left", "right")
# The buffer's own columns beside the key columns (no key column may take these names).
BUFFER_COLUMNS = ("record_epoch", "record_index", "event_time_us", "record")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Event times and window sizes within which window arithmetic never leaves a long (years -73,000 to 73,000).
_SAFE = 2**61


def output_columns(
    key: Sequence[str], left: Sequence[str], right: Sequence[str], right_key: Sequence[str], reserved: Sequence[str] = ()
) -> list[tuple[str, str, str]]:
    """The joined row's columns as (side, column of that side's record, output name); key columns from the left. Records' other
    columns keep their names; one on both sides becomes ``left_<name>`` and ``right_<name>``. ``reserved`` are the join's own
    output columns (a window's start and end), which no record column may take."""
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
            merged = schemas.get(name, pa.schema([]))
            for field in (f.with_nullable(True) for f in schema if f.name in user_columns(schema.names)):
                if field.name not in merged.names:
                    merged = merged.append(field)
                elif merged.field(field.name).type != field.type:
                    raise PipelineDefinitionError(
                        f"{self.what}: both sides' late records go to {name!r}, but their column {field.name!r} is "
                        f"{merged.field(field.name).type} on the left and {field.type} on the right; give each side its own late output"
                    )
            schemas[name] = merged
        return schemas

    def state_specs(self, inputs: Sequence[pa.Schema] | None = None) -> list[StateSpec]:
        """The buffer tables ``<operator_id>__left`` / ``__right`` (see the module docstring)."""
        keys = (*key_fields(self.key, inputs[0] if inputs else None), *self.own_fields)
        return [
            StateSpec(
                operator_id=self.operator_id,
                name=side,
                key_fields=(*keys, pa.field("record_epoch", pa.int64()), pa.field("record_index", pa.int64())),
                value_fields=(pa.field("event_time_us", pa.int64()), pa.field("record", pa.string())),
            )
            for side in SIDES
        ]

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
        if len(self.key) != len(self.other_key) or not self.key:
            raise PipelineDefinitionError(
                f"{self.what}: the inputs are keyed by {list(self.key)} and {list(self.other_key)}; two joined streams "
                "need as many key columns, of the same types, in the same order"
            )
        for side, schema, key, time in zip(SIDES, inputs, (self.key, self.other_key), self.time_columns):
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
                if not field.name.startswith("_") and not all(map(_has_json_form, _leaves(field.type))):
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

    def send_late(self, task: Task, sides: Sequence[SideRecords], inputs: Sequence[pa.Schema]) -> None:
        """Late records to their side's late output (every epoch, empty or not), else dropped and counted."""
        schemas = self.side_output_schemas(inputs)
        for label, side, name in zip(SIDES, sides, self.late_outputs):
            if name:
                task.emit(name, conform(side.late, schemas[name]))
            elif side.late.num_rows:
                task.count(f"{self.what} dropped {{n}} late {label} record(s) (no late output declared)", side.late.num_rows)

    def joined(
        self, schema: pa.Schema, inputs: Sequence[pa.Table], fresh: Sequence[tuple[np.ndarray, int]],
        candidates: Sequence[pa.Table], pairs: tuple[np.ndarray, np.ndarray], own: Sequence[pa.Array] = (),
    ) -> pa.Table:  # fmt: skip
        """The output rows of ``pairs`` (candidate rows per side): the left record's key columns, the join's ``own`` columns, then
        both records' other columns. ``fresh``: per side, the input row of each of its first candidates (the epoch's records) and
        how many those are."""
        values = [
            _candidate_values(records, rows, candidate, n, at)
            for records, (rows, n), candidate, at in zip(inputs, fresh, candidates, pairs)
        ]
        users = [user_columns(t.column_names) for t in inputs]
        columns = output_columns(self.key, users[0], users[1], self.other_key, reserved=[f.name for f in self.own_output_fields])
        arrays = [candidates[0][k].take(pa.array(pairs[0], pa.int64())) for k in self.key]
        arrays += [*own, *(values[SIDES.index(side)][column] for side, column, _ in columns[len(self.key) :])]
        return pa.Table.from_arrays([a.cast(f.type) for a, f in zip(arrays, schema)], schema=schema)


# -- the epoch's records of one side, the buffered ones -----------------------------------------------------------------


@dataclass
class SideRecords:
    """One side's records of the epoch: those that may join, in the buffer's form, and the late ones."""

    fresh: pa.Table  # key columns (the left's names), KEY_GROUP, record_epoch, record_index, event_time_us, record
    rows: np.ndarray  # each fresh record's row in the input
    late: pa.Table  # the late records' user columns


def side_records(
    task: Task, records: pa.Table, key: Sequence[str], theirs: Sequence[str], ts_us: np.ndarray, late: np.ndarray
) -> SideRecords:
    """The side's records split into those that may join (in the buffer's form) and the ``late`` ones (a null key too)."""
    late = np.array(late, dtype=bool, copy=True)
    for column in theirs:
        late |= bools(pc.is_null(records[column]))
    users = user_columns(records.column_names)
    rows = np.flatnonzero(~late)
    kept = with_key_group(records, theirs, task.key_groups).take(pa.array(rows, pa.int64()))
    columns: dict[str, Any] = {k: kept[t] for k, t in zip(key, theirs)}
    columns[KEY_GROUP] = kept[KEY_GROUP]
    columns["record_epoch"] = pa.repeat(pa.scalar(task.epoch, pa.int64()), kept.num_rows)
    columns["event_time_us"] = pa.array(ts_us[rows], pa.int64())
    columns["record"] = record_json(kept, [records.schema.field(c) for c in users])
    fresh = pa.table(columns)
    # record_index: 1, 2... per key, by event time, then the JSON's bytes (as Spark's row_number() over them did).
    _, (ids,) = key_ids([fresh], key)
    order = pc.sort_indices(
        pa.table({"_id": ids, "t": fresh["event_time_us"], "r": fresh["record"]}),
        sort_keys=[("_id", "ascending"), ("t", "ascending"), ("r", "ascending")],
    )
    fresh = fresh.append_column("record_index", pa.array(ranks(ids, ints(order))))
    return SideRecords(fresh, rows, records.filter(pa.array(late)).select(users))


def side_candidates(task: Task, spec: StateSpec, fresh: pa.Table, read: bool, keep: Callable[[pa.Table], np.ndarray]) -> pa.Table:
    """A side's candidates in the buffer's columns: its ``fresh`` records, then those buffered in the task's key groups
    that ``keep`` marks (none unless ``read``)."""
    schema = spec.arrow_schema()
    columns = pa.schema([schema.field(c) for c in (*spec.key_columns, KEY_GROUP, *spec.value_columns)])
    stored = task.state(spec).every_live_row().select(columns.names).cast(columns) if read else columns.empty_table()
    if stored.num_rows:
        stored = stored.filter(pa.array(keep(stored)))
    return pa.concat_tables([fresh.select(columns.names).cast(columns), stored])


def stage_buffer(task: Task, spec: StateSpec, candidates: pa.Table, fresh: int, leaving: np.ndarray) -> None:
    """The buffer after the epoch: the ``fresh`` first candidates not ``leaving`` added, buffered ones leaving deleted."""
    is_new = np.arange(candidates.num_rows) < fresh
    changed = is_new != leaving
    task.state(spec).stage(candidates.filter(pa.array(changed)).append_column(DELETED, pa.array(~is_new[changed])))


def matches(lefts: pa.Table, rights: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """``_l`` and ``_r`` of each pair of a row of ``lefts`` and one of ``rights`` equal in their other columns, by ``_l`` then ``_r``."""
    on = [c for c in lefts.column_names if c != "_l"]
    joined = lefts.join(rights, keys=on, join_type="inner", use_threads=False)
    left, right = ints(joined["_l"]), ints(joined["_r"])
    order = np.lexsort((right, left))
    return left[order], right[order]


def _candidate_values(records: pa.Table, rows_of_fresh: np.ndarray, candidates: pa.Table, fresh: int, at: np.ndarray) -> pa.Table:
    """The user columns of one side's candidates at rows ``at``: an epoch's record (a row before ``fresh``) as its input row, a
    buffered one as its JSON reads back (once however many pairs it is in)."""
    fields = [records.schema.field(c) for c in user_columns(records.column_names)]
    schema = pa.schema([f.with_nullable(True) for f in fields])
    is_new = at < fresh
    stored, inverse = np.unique(at[~is_new], return_inverse=True)
    read = record_values(candidates["record"].take(pa.array(stored, pa.int64())), fields)
    index = np.full(len(at), records.num_rows, np.int64)
    index[is_new] = rows_of_fresh[at[is_new]]
    index[~is_new] += inverse.reshape(-1)
    return pa.concat_tables([conform(records.select(schema.names), schema), read]).take(pa.array(index))


# -- keys, times, windows ---------------------------------------------------------------------------------------------


def ints(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), np.int64)


def bools(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), bool)


def ranks(ids: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Each row's rank (from 1) among the rows of its id, in ``order`` (a permutation sorting the rows by id first)."""
    n = len(order)
    sorted_ids, heads = ids[order], np.ones(n, bool)
    heads[1:] = sorted_ids[1:] != sorted_ids[:-1]
    positions = np.arange(n, dtype=np.int64)
    ranked = np.empty(n, np.int64)
    ranked[order] = positions - np.maximum.accumulate(np.where(heads, positions, 0)) + 1
    return ranked


def event_time_us(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A timestamp (or int64) column in microseconds since the Unix epoch (a null as 0), and whether each is not null."""
    if pa.types.is_timestamp(column.type):
        column = pc.cast(column, pa.timestamp("us", tz=column.type.tz), safe=False).cast(pa.int64())
    return ints(pc.fill_null(column, 0)), bools(pc.is_valid(column))


def greater_than(values: np.ndarray, bound: int) -> np.ndarray:
    """``values > bound`` exactly, ``bound`` any Python int (beyond a long too)."""
    if bound < INT64_MIN:
        return np.ones(len(values), dtype=bool)
    if bound >= INT64_MAX:
        return np.zeros(len(values), dtype=bool)
    return values > np.int64(bound)


def at_most(values: np.ndarray, bound: int) -> np.ndarray:
    return ~greater_than(values, bound)


def due_rows(times: pa.ChunkedArray, through: int | None) -> np.ndarray:
    """Rows whose ``times`` (event times, window starts) are at or before ``through``; none without it (no watermark)."""
    if through is None:
        return np.zeros(len(times), dtype=bool)
    values, valid = event_time_us(times)
    return valid & at_most(values, through)


def aligned_windows(
    assigner: TumblingEventTimeWindows | SlidingEventTimeWindows, ts: np.ndarray, valid: np.ndarray, after: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """The windows of each valid record starting after ``after`` (None: all), as (row, start) pairs by row, then start. Exact
    whatever the timestamps: a window that would begin before the earliest microsecond a long holds is left out."""
    size, slide = assigner.size_us, assigner.slide_us
    safe = valid & (ts >= -_SAFE) & (ts <= _SAFE) if size <= _SAFE else np.zeros(len(ts), dtype=bool)
    at = np.flatnonzero(safe)
    t = ts[at]
    last = t - np.mod(t, slide)  # the latest window's start (a floor modulo, as Spark's pmod)
    rows, starts = [], []
    for j in range(-(-size // slide)):
        start = last - j * slide
        holds = start > t - size  # a window holds t while its start is after t - size
        if after is not None:
            holds &= greater_than(start, after)
        rows.append(at[holds])
        starts.append(start[holds])
    for i in np.flatnonzero(valid & ~safe):  # event times near a long's ends: exact, in Python integers
        exact = [s for s, _ in assigner.windows(int(ts[i])) if s >= INT64_MIN and (after is None or s > after)]
        rows.append(np.full(len(exact), i, dtype=np.int64))
        starts.append(np.array(exact, dtype=np.int64))
    row, begins = np.concatenate(rows), np.concatenate(starts)
    order = np.lexsort((begins, row))
    return row[order], begins[order]


# -- a record as JSON (see the module docstring) -----------------------------------------------------------------------


def _leaves(type_: pa.DataType) -> list[pa.DataType]:
    """The types of a column's values, dictionaries, lists, maps and structs unwrapped."""
    if pa.types.is_dictionary(type_):
        return _leaves(type_.value_type)
    if pa.types.is_map(type_):
        return [*_leaves(type_.key_type), *_leaves(type_.item_type)]
    if _is_list(type_):
        return _leaves(type_.value_type)
    if pa.types.is_struct(type_):
        return [t for f in type_ for t in _leaves(f.type)]
    return [type_]


def _has_json_form(type_: pa.DataType) -> bool:
    """Whether values of this (unwrapped) type can be buffered as JSON (see the module docstring)."""
    return (
        pa.types.is_null(type_) or pa.types.is_boolean(type_) or pa.types.is_integer(type_) or pa.types.is_floating(type_)
        or pa.types.is_decimal(type_) or _is_string(type_) or _is_binary(type_) or pa.types.is_date(type_)
        or pa.types.is_timestamp(type_)
    )  # fmt: skip


def _is_string(type_: pa.DataType) -> bool:
    return pa.types.is_string(type_) or pa.types.is_large_string(type_) or pa.types.is_string_view(type_)


def _is_binary(type_: pa.DataType) -> bool:
    return (
        pa.types.is_binary(type_) or pa.types.is_large_binary(type_) or pa.types.is_binary_view(type_)
        or pa.types.is_fixed_size_binary(type_)
    )  # fmt: skip


def _is_list(type_: pa.DataType) -> bool:
    return pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_)


def _array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


_ENCODE = json.JSONEncoder(ensure_ascii=False).encode


def record_json(records: pa.Table, fields: Sequence[pa.Field]) -> pa.Array:
    """Each row's ``fields`` as one JSON object (see the module docstring)."""
    return _json(pa.StructArray.from_arrays([_array(records[f.name]) for f in fields], names=[f.name for f in fields]))


# Python's json escapes (ensure_ascii=False): these, a backslash and a double quote; everything else as it is.
_CONTROL_ESCAPES = {**{chr(c): f"\\u{c:04x}" for c in range(0x20)}, "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _strings(texts: pa.Array) -> pa.Array:
    """Strings as JSON string literals, escaped as :data:`_ENCODE` escapes them, on the whole column at once."""
    texts = texts.cast(pa.string())
    escaped = pc.replace_substring(pc.replace_substring(texts, "\\", "\\\\"), '"', '\\"')
    if pc.any(pc.match_substring_regex(texts, r"[\x00-\x1f]")).as_py():
        for control, escape in _CONTROL_ESCAPES.items():
            escaped = pc.replace_substring(escaped, control, escape)
    return pc.binary_join_element_wise('"', escaped, '"', "")


def _json(column: pa.Array) -> pa.Array:
    """One column's values as JSON text (null where the value is null)."""
    type_ = column.type
    if pa.types.is_dictionary(type_):
        return _json(column.dictionary_decode())
    if pa.types.is_null(type_):
        return pa.nulls(len(column), pa.string())
    if _is_string(type_):
        return _strings(column)
    if pa.types.is_boolean(type_) or pa.types.is_integer(type_) or pa.types.is_decimal(type_):
        return column.cast(pa.string())  # digits, true/false
    if pa.types.is_floating(type_):  # the shortest digits reading back as the double; NaN and infinities as strings
        text = pc.replace_substring_regex(column.cast(pa.float64()).cast(pa.string()), "^(-?)inf$", r'"\1Infinity"')
        return pc.replace_substring_regex(pc.replace_substring(text, "nan", '"NaN"'), "^-0$", "-0.0")
    if _is_binary(type_):
        return _strings(pa.array([None if v is None else base64.b64encode(v).decode("ascii") for v in column.to_pylist()]))
    if pa.types.is_timestamp(type_) or pa.types.is_date(type_):  # ISO text, any year; with a time zone, in UTC
        unit: Literal["D", "us"] = "us" if pa.types.is_timestamp(type_) else "D"
        text = np.datetime_as_string(_ticks(column).astype(f"datetime64[{unit}]"), unit=unit)
        end = 'Z"' if unit == "us" and type_.tz is not None else '"'
        return pc.if_else(column.is_valid(), pc.binary_join_element_wise('"', pa.array(text, pa.string()), end, ""), None)
    if pa.types.is_map(type_):
        entries = column.cast(pa.list_(pa.struct([type_.key_field, type_.item_field])))
        flat = _array(pc.list_flatten(entries))
        keys, items = _array(pc.struct_field(flat, [0])), _array(pc.struct_field(flat, [1]))
        pairs = pc.binary_join_element_wise(_strings(_key_text(keys)), pc.fill_null(_json(items), "null"), ":")
        return _joined_lists(entries, pairs, "{", "}")
    if _is_list(type_):
        return _joined_lists(column, pc.fill_null(_json(_array(pc.list_flatten(column))), "null"), "[", "]")
    if pa.types.is_struct(type_):
        # Each field as ',"name":value', or nothing when null; the first comma then dropped. (Arrow's join skipping nulls would
        # drop the rows whose fields are all null.)
        parts = [
            pc.fill_null(pc.binary_join_element_wise(f",{_ENCODE(f.name)}:", _json(_array(pc.struct_field(column, [i]))), ""), "")
            for i, f in enumerate(type_)
        ]
        body = pc.utf8_slice_codeunits(pc.binary_join_element_wise(*parts, "", ""), 1)  # (an empty struct's: "")
        return pc.if_else(column.is_valid(), pc.binary_join_element_wise("{", body, "}", ""), None)
    raise PipelineDefinitionError(f"a column of type {type_} has no JSON form")


def _ticks(column: pa.Array) -> np.ndarray:
    """A timestamp's microseconds since the Unix epoch, a date's days (a null as 0)."""
    if pa.types.is_timestamp(column.type):
        return event_time_us(column)[0]
    return ints(pc.fill_null(column.cast(pa.date32()).cast(pa.int32()), 0))


def _joined_lists(column: pa.Array, values: pa.Array, opening: str, closing: str) -> pa.Array:
    """Each list's (or map's) element texts ``values`` joined by commas between ``opening`` and ``closing``."""
    offsets = np.concatenate([[0], np.cumsum(ints(pc.fill_null(pc.list_value_length(column), 0)))])
    lists = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values)
    joined = pc.binary_join_element_wise(opening, pc.binary_join(lists, ","), closing, "")
    return pc.if_else(column.is_valid(), joined, pa.scalar(None, pa.string()))


def _key_text(keys: pa.Array) -> pa.Array:
    """Map keys as text, as Spark's ``toString`` of its internal value (a timestamp's microseconds, a date's days)."""
    type_ = keys.type
    if pa.types.is_dictionary(type_):
        return _key_text(keys.dictionary_decode())
    if _is_string(type_):
        return keys.cast(pa.string())
    if pa.types.is_timestamp(type_) or pa.types.is_date(type_):
        return pa.array(_ticks(keys)).cast(pa.string())
    text = _json(keys)
    return pc.utf8_trim(text, '"') if pa.types.is_floating(type_) or _is_binary(type_) else text


# -- a buffered record read back ----------------------------------------------------------------------------------------


def record_values(records: pa.Array | pa.ChunkedArray, fields: Sequence[pa.Field]) -> pa.Table:
    """Buffered records' fields (nullable), each read by name from its JSON as Spark's ``from_json`` reads it."""
    texts = records.to_pylist()
    parse_float = Decimal if any(pa.types.is_decimal(t) for f in fields for t in _leaves(f.type)) else None
    try:  # one parse for all: each record is one JSON object, so the array has one element per record
        parsed = json.loads(f"[{','.join('null' if t is None else t for t in texts)}]", parse_float=parse_float)
        if len(parsed) != len(texts):
            raise ValueError("not one value per record")
    except ValueError:
        parsed = [_loads(t, parse_float) for t in texts]
    objects = [p if isinstance(p, dict) else None for p in parsed]
    schema = pa.schema([f.with_nullable(True) for f in fields])
    columns = [_from_json([None if o is None else o.get(f.name) for o in objects], f.type) for f in fields]
    return pa.Table.from_arrays(columns, schema=schema)


def _loads(text: str | None, parse_float: Any) -> Any:
    try:
        return None if text is None else json.loads(text, parse_float=parse_float)
    except ValueError:
        return None


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
    if pa.types.is_date(type_) or pa.types.is_timestamp(type_):
        return _times(values, type_)
    if pa.types.is_map(type_):
        dicts = [v if isinstance(v, dict) else None for v in values]
        keys = [k for v in dicts if v for k in v]
        offsets = np.concatenate([[0], np.cumsum([len(v) if v else 0 for v in dicts], dtype=np.int64)])
        return pa.MapArray.from_arrays(
            pa.array(offsets, pa.int32()),
            _key_values(keys, type_.key_type),
            _from_json([i for v in dicts if v for i in v.values()], type_.item_type),
            type=type_,
            mask=pa.array([v is None for v in dicts], pa.bool_()),
        )
    if _is_list(type_):
        lists = [v if isinstance(v, list) else None for v in values]
        offsets = np.concatenate([[0], np.cumsum([len(v) if v else 0 for v in lists], dtype=np.int64)])
        inner = _from_json([x for v in lists if v for x in v], type_.value_type)
        mask = pa.array([v is None for v in lists], pa.bool_())
        return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), inner, mask=mask).cast(type_)
    if pa.types.is_struct(type_):
        children = [_from_json([v.get(f.name) if isinstance(v, dict) else None for v in values], f.type) for f in type_]
        return pa.StructArray.from_arrays(
            children, fields=list(type_), mask=pa.array([not isinstance(v, dict) for v in values], pa.bool_())
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
    return _NON_NUMBERS.get(value) if isinstance(value, str) else None


_DECIMALS = Context(prec=100, rounding=ROUND_HALF_UP)  # beyond the 76 digits of the widest decimal


def _decimal(value: Any, type_: pa.DataType) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        return None
    try:
        number = Decimal(str(value)).quantize(Decimal(1).scaleb(-type_.scale), context=_DECIMALS)
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


def _times(values: list[Any], type_: pa.DataType) -> pa.Array:
    """Dates and timestamps from ISO text (any year NumPy reads); a timestamp also from a number of seconds, as Spark reads one."""
    unit: Literal["D", "us"] = "D" if pa.types.is_date(type_) else "us"
    target = pa.date32() if unit == "D" else pa.timestamp("us", tz=None if type_.tz is None else "UTC")
    texts = [v if isinstance(v, str) else None for v in values]
    try:
        parsed = pa.array(texts, pa.string()).cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # a year beyond 9999, a sign: NumPy's reading, one by one
        parsed = pa.array([_iso_value(t, unit) for t in texts], target)
    numbers = [int(v * 1_000_000) if isinstance(v, (int, float, Decimal)) and not isinstance(v, bool) else None for v in values]
    if unit == "us" and any(n is not None for n in numbers):
        parsed = pc.coalesce(parsed, pa.array(numbers, pa.int64()).cast(target))
    return parsed.cast(type_, safe=False)


def _iso_value(text: str | None, unit: Literal["D", "us"]) -> int | None:
    body = (text or "").removeprefix("+").removesuffix("Z")
    try:
        return None if text is None else int(np.datetime64(body, unit).astype(np.int64))
    except ValueError:
        return None


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
