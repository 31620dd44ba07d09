"""Event-time windows (tumbling, sliding, session) that fire when the watermark passes their end (README "Windows").

The window assigners are :mod:`barrierflow.api.windows`' (importable from here too). A session record opens its own window
``[ts, ts + gap)``; windows that overlap or touch merge, as Flink's (two records exactly ``gap`` apart are one session), also
across epochs: a record may bridge two stored sessions into one.

With W(n-1) the watermark at the start of epoch n, W(n) the one at its end and L the allowed lateness (default 0, as Flink's
``allowedLateness``), epoch n does:

1. Assign each record its windows (a session: its own ``[ts, ts + gap)``).
2. Late records. A window is late when ``end + L <= W(n-1)``: its state was cleared, or would have been. A record all of whose
   windows are late (a session's: its own window, unlike Flink not the stored session it would merge with) goes to ``late_output``
   if the window declares one, else it is dropped and counted. A record that is not late joins only its windows that are not late
   (sliding windows).
3. Fold the epoch's other records into the pending windows of their key. Every window keeps its values in arrival order: earlier
   epochs first, then by arrival position within the epoch, so every aggregate (floating sums and percentiles included) is exact
   and never depends on parallelism, on partitioning, or on how the input was cut into epochs. A session keeps each value with its
   arrival (epoch, position among the epoch's records of its key) so that merged sessions interleave their values in arrival order
   too; stored sessions and the epoch's windows merge per key as gaps and islands (sorted by start, a window opens a new session
   when it starts after the end of every window of its key before it).
4. Fire. Every window with ``end <= W(n)`` that has not fired yet, or that got records in step 3 (late for a fired window but
   within L), emits one row: the key, ``window_start``, ``window_end`` and the aggregates of all its values so far; a window fires
   at most once per epoch.
5. Purge a window's state once ``end + L <= W(n)``; with L = 0 that is when it fires, so each window fires once and the state
   holds unfired windows only (the state table and output columns of windows without lateness).
6. With L > 0, rows carry ``is_update``: whether a row for this key and ``window_start`` was emitted before (this one replaces
   it). A fired session that a late record merges into one with an earlier start no longer exists under its own start: a
   retraction row is emitted for it (its key, ``window_start``, ``window_end``, null aggregates, ``is_update`` and ``retracted``
   true; sessions with L > 0 carry ``retracted``, false on every other row), so an upsert sink keyed by ``(*key, "window_start")``
   marks it replaced.
7. Stage the state changes only: windows that got records, fired for the first time (with L > 0) or were purged, and the
   tombstones of sessions merged into another; never a window created and purged in one epoch.

Records, keys and values, as Spark's SQL treats them:

- A record whose event time is null belongs to no window: it is dropped and counted (neither late nor on time).
- A null key is a key like any other; float keys are grouped as Spark groups them, -0.0 as 0.0 and every NaN as one.
- The aggregated column (any integer, float or decimal) is cast to a double as Spark casts it (a long to the nearest double, a
  decimal correctly rounded); a count alone keeps 0.0 per record. A null value stays in its window: ``Count`` counts it, ``Sum``
  and ``Avg`` of a window holding one are null, ``Min``/``Max`` skip it, ``Percentile`` sorts it last.
- Of a window's values in arrival order: ``Count`` their number (a long); ``Sum`` the left fold ``((0.0 + v1) + v2) + ...`` in
  IEEE doubles; ``Avg`` that sum over the count; ``Min``/``Max`` the least or greatest in Spark's order of doubles (NaN above
  every number, -0.0 equal to 0.0: the first in arrival order of equal ones); ``Percentile`` the value at 1-based position
  ``ceil(q * n)`` of the values sorted ascending in that order (nulls last; equal ones in arrival order).
- Arrival order within an epoch is by arrival position (``_seq``, then sub-positions), a null position first, as Spark sorts
  ascending; records of equal positions (null ones) by value (null first, NaN last).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, ClassVar, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.api.aggregations import Aggregation, Avg, Count, Max, Min, Percentile, Sum
from barrierflow.api.windows import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WindowAssigner,
    micros,
)
from barrierflow.core.arrow import as_double, conform
from barrierflow.core.columns import DELETED, EPOCH, KEY_GROUP, UPDATED_AT, position_columns, user_columns
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.base import (
    Node,
    Task,
    check_event_time,
    check_numeric_columns,
    folded_sums,
    key_fields,
    key_ids,
    with_key_group,
)
from barrierflow.operators.join_buffer import INT64_MAX, aligned_windows, at_most, bools, event_time_us, ints, ranks
from barrierflow.state.spec import StateSpec

__all__ = [
    "TumblingEventTimeWindows", "SlidingEventTimeWindows", "EventTimeSessionWindows", "WindowAssigner", "AlignedWindow",
    "SessionWindow", "window_node",
]  # fmt: skip

_ONE_US = timedelta(microseconds=1)
# The value one session element keeps: its arrival and the aggregated column.
_SESSION_VALUE = pa.struct([pa.field("epoch", pa.int64()), pa.field("position", pa.int64()), pa.field("value", pa.float64())])
_TIMESTAMP = pa.timestamp("us", tz="UTC")
_AGGREGATIONS = (Count, Sum, Min, Max, Avg, Percentile)


@dataclass(frozen=True)
class _Records:
    """The epoch's records that are on time (after steps 1-2), as the kernels fold them."""

    rows: pa.Table  # key columns and KEY_GROUP
    ts: np.ndarray  # event time, microseconds
    values: np.ndarray  # the aggregated column as doubles (a null as 0.0)
    valid: np.ndarray  # whether each value is not null
    arrival: np.ndarray  # each record's rank in arrival order

    def value_array(self, rows: np.ndarray) -> pa.Array:
        return pa.array(self.values[rows], pa.float64(), mask=~self.valid[rows])


@dataclass(frozen=True)
class _Pending:
    """The windows after step 3, one element of each array per window."""

    head: np.ndarray  # a row of the window (of the stored rows, then the epoch's): its key and key group
    start: np.ndarray
    end: np.ndarray
    touched: np.ndarray  # whether the epoch added values to it
    fired: np.ndarray  # whether it fired before (with L > 0)
    kept: np.ndarray  # whether a stored row holds it under its start
    of_row: np.ndarray  # the window of each stored row, then of each of the epoch's


@dataclass
class _Window(Node):
    """What every window operator shares: aggregations, lateness, the late side output, output columns, steps 3-7."""

    key: tuple[str, ...] = ()
    aggregations: tuple[Aggregation, ...] = ()
    late_output: str | None = None
    allowed_lateness: timedelta = timedelta(0)
    assigner: WindowAssigner = TumblingEventTimeWindows(timedelta(minutes=1))

    uses_watermark = True
    table: ClassVar[str]  # the state table's name, and its columns beside the key, window_start and fired
    window_fields: ClassVar[tuple[pa.Field, ...]]
    update_columns: ClassVar[tuple[str, ...]] = ("is_update",)  # step 6's columns

    def key_output(self) -> tuple[str, ...]:
        return self.key

    def __post_init__(self) -> None:
        unknown = [a for a in self.aggregations if not isinstance(a, _AGGREGATIONS)]
        if unknown:
            raise PipelineDefinitionError(
                f"window {self.operator_id}: {unknown[0]!r} is not an aggregation a window computes; give Count(), "
                "Sum(column), Min(column), Max(column), Avg(column) or Percentile(column, q=...)"
            )
        columns = {a.value_column for a in self.aggregations if a.value_column is not None}
        if len(columns) > 1:
            raise PipelineDefinitionError(
                f"window {self.operator_id}: all aggregations must read the same column, got {sorted(columns, key=str)}"
            )
        micros(f"window {self.operator_id}: allowed_lateness", self.allowed_lateness, positive=False)

    @property
    def lateness_us(self) -> int:
        return self.allowed_lateness // _ONE_US

    @property
    def value_column(self) -> str | None:
        return next((a.value_column for a in self.aggregations if a.value_column is not None), None)

    def extra_output_columns(self) -> tuple[str, ...]:
        """Columns beyond key, window bounds and aggregates (step 6): none with L = 0, so outputs stay as they were."""
        return self.update_columns if self.lateness_us > 0 else ()

    # -- what it declares from its input's schema

    def state_specs(self, inputs: Sequence[pa.Schema] | None = None) -> list[StateSpec]:
        """The window table: the key, ``window_start``, then the window's values (and ``fired`` with lateness, step 5)."""
        fired = (pa.field("fired", pa.bool_()),) if self.lateness_us > 0 else ()  # windows that fired stay until purged
        keys = (*key_fields(self.key, inputs[0] if inputs else None), pa.field("window_start", _TIMESTAMP))
        return [
            StateSpec(operator_id=self.operator_id, name=self.table, key_fields=keys, value_fields=(*self.window_fields, *fired))
        ]

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        (schema,) = inputs
        missing = [k for k in self.key if k not in schema.names]
        if missing:
            raise PipelineDefinitionError(
                f"window {self.operator_id}: its key column {missing[0]!r} is not among its input's columns {user_columns(schema.names)}"
            )
        check_event_time(f"window {self.operator_id}", schema, self.assigner.time_column)
        check_numeric_columns(f"window {self.operator_id}", self.aggregations, schema)
        return pa.schema(
            [
                *(schema.field(k) for k in self.key),
                pa.field("window_start", _TIMESTAMP),
                pa.field("window_end", _TIMESTAMP),
                *(pa.field(a.name, pa.int64() if isinstance(a, Count) else pa.float64()) for a in self.aggregations),
                *(pa.field(c, pa.bool_()) for c in self.extra_output_columns()),
            ]
        )

    def side_outputs(self) -> list[str]:
        return [self.late_output] if self.late_output else []

    def side_output_schemas(self, inputs: Sequence[pa.Schema]) -> dict[str, pa.Schema]:
        """Step 2's side output: the late records' user columns."""
        (schema,) = inputs
        users = pa.schema([f for f in schema if f.name in user_columns(schema.names)])
        return {self.late_output: users} if self.late_output else {}

    # -- what both kernels share

    def _on_time(self, task: Task, records: pa.Table, latest_start: Callable[[np.ndarray], np.ndarray], span: int) -> _Records:
        """Steps 1-2 for every record: its event time, late ones to the side output (or dropped and counted), the others.
        ``latest_start``: the start of a record's latest window from its event time; ``span``: how long that window is (a size or
        a gap)."""
        records = with_key_group(records, self.key, task.key_groups)
        # Step 1. A record without an event time has no window (Spark's unix_micros(null) is null: every test on it fails).
        ts, timed = event_time_us(records[self.assigner.time_column])
        if not timed.all():
            task.count(f"window {self.operator_id} dropped {{n}} record(s) without an event time", int((~timed).sum()))
            records, ts = records.filter(pa.array(timed)), ts[timed]
        # Step 2. A record is late when its latest window is: its end + L at or before W(n-1).
        wm_prev = task.watermark_prev_us
        late = np.zeros(len(ts), bool) if wm_prev is None else at_most(latest_start(ts), wm_prev - span - self.lateness_us)
        if self.late_output:  # emitted every epoch, empty or not: the side output's table exists from the first
            task.emit(self.late_output, records.filter(pa.array(late)).select(user_columns(records.column_names)))
        elif late.any():
            task.count(f"window {self.operator_id} dropped {{n}} late record(s) (no late_output declared)", int(late.sum()))
        on_time = records.filter(pa.array(~late))
        # The aggregated column as Spark's cast(... as double) (as_double), 0.0 per record without one; a null as 0.0.
        column = self.value_column
        doubles = as_double(on_time[column]) if column is not None else pa.array(np.zeros(on_time.num_rows))
        values = np.asarray(pc.fill_null(doubles, 0.0).to_numpy(zero_copy_only=False), np.float64)
        valid = bools(pc.is_valid(doubles))
        return _Records(on_time.select([*self.key, KEY_GROUP]), ts[~late], values, valid, _arrival_ranks(on_time, values, valid))

    def _rows(self, key_columns: list[pa.Array], rows: np.ndarray, start: np.ndarray, **columns: Any) -> dict[str, Any]:
        """Windows' columns: the key of ``rows`` (of the stored rows, then the epoch's), ``window_start``, then ``columns``."""
        keys = {k: c.take(pa.array(rows, pa.int64())) for k, c in zip(self.key, key_columns)}
        return {**keys, "window_start": _timestamps(start), **columns}

    def _emit(
        self, task: Task, spec: StateSpec, schema: pa.Schema, stored: pa.Table, key_columns: list[pa.Array],
        groups: np.ndarray, windows: _Pending, reach: tuple[np.ndarray, int], new_values: pa.Array, new_order: np.ndarray,
        tombstones: dict[str, Any] | None = None,
    ) -> pa.Table:  # fmt: skip
        """Steps 3-7 for the pending windows: the fired windows' rows; their state changes (and ``tombstones``) staged. ``reach``:
        the bound that with W(n) and L decides a window's firing and purge (its start and its size, or its end and 0);
        ``new_values``: the value each of the epoch's rows adds (``new_order``: its arrival)."""
        w, m, lateness = windows, stored.num_rows, self.lateness_us
        # Steps 4-5.
        fires, purged = np.zeros(len(w.start), bool), np.zeros(len(w.start), bool)
        if task.watermark_us is not None:
            fires = at_most(reach[0], task.watermark_us - reach[1]) & (w.touched | ~w.fired)
            purged = at_most(reach[0], task.watermark_us - reach[1] - lateness)
        # Step 7's changes: new values, a first firing (kept, with L > 0) or a purge (a tombstone), never a window never stored
        # and purged.
        changed = (w.touched | fires | purged) & (w.kept | ~purged)
        # Step 3's values of the windows that change or fire, in arrival order.
        needed = np.flatnonzero(changed | fires)
        slot = np.full(len(w.start), -1, np.int64)
        slot[needed] = np.arange(len(needed))
        old_rows = np.flatnonzero(slot[w.of_row[:m]] >= 0)
        old_lists = stored["window_values"].combine_chunks().take(pa.array(old_rows, pa.int64()))
        old = pc.list_flatten(old_lists).cast(new_values.type)
        new = np.flatnonzero(slot[w.of_row[m:]] >= 0)
        parents = np.concatenate([slot[w.of_row[old_rows]][ints(pc.list_parent_indices(old_lists))], slot[w.of_row[m + new]]])
        elements = pa.concat_arrays([old, new_values.take(pa.array(new, pa.int64()))])
        if pa.types.is_struct(elements.type):  # sessions: by (epoch, position), unique per key
            arrival = [ints(pc.fill_null(elements.field(f), 0)) for f in ("epoch", "position")]
        else:  # a window's stored values, then the epoch's by arrival
            arrival = [np.arange(len(elements)) >= len(old), np.concatenate([np.arange(len(old)), new_order[new]])]
        elements = elements.take(pa.array(np.lexsort((*reversed(arrival), parents)), pa.int64()))
        offsets = np.concatenate([[0], np.cumsum(np.bincount(parents, minlength=len(needed)))])
        lists = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), elements)
        # Step 7.
        staged = np.flatnonzero(changed)
        state = self._rows(key_columns, w.head[staged], w.start[staged], window_end=_timestamps(w.end[staged]))
        state.update({KEY_GROUP: groups[w.head[staged]], "window_values": lists.take(pa.array(slot[staged]))})
        state.update({"fired": (w.fired | fires)[staged], DELETED: purged[staged]})
        task.state(spec).stage(pa.concat_tables([_changes(spec, c) for c in (state, tombstones) if c is not None]))
        # Steps 4 and 6.
        firing = np.flatnonzero(fires)
        out = self._rows(key_columns, w.head[firing], w.start[firing], window_end=_timestamps(w.end[firing]))
        out.update(is_update=w.fired[firing], retracted=np.zeros(len(firing), bool))
        values = elements.field("value") if pa.types.is_struct(elements.type) else elements
        value_lists = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)
        out.update(zip((a.name for a in self.aggregations), _results(self.aggregations, value_lists, slot[firing])))
        return conform(pa.table(out), schema)


@dataclass
class AlignedWindow(_Window):
    """Tumbling and sliding windows: windows aligned to the Unix epoch, keyed by their start."""

    assigner: TumblingEventTimeWindows | SlidingEventTimeWindows = TumblingEventTimeWindows(timedelta(minutes=1))

    table: ClassVar[str] = "pending_windows"
    window_fields: ClassVar[tuple[pa.Field, ...]] = (pa.field("window_values", pa.list_(pa.float64())),)

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        """Steps 1-7 of the module docstring; returns the fired windows' rows."""
        (records,) = inputs
        schema, [spec] = self.output_schema([records.schema]), self.state_specs([records.schema])
        size, slide, wp = self.assigner.size_us, self.assigner.slide_us, task.watermark_prev_us
        # Steps 1-2. A record's latest window starts at ts - pmod(ts, slide) (numpy's % is a floor modulo); it belongs to every
        # window holding ts that is not late itself.
        epoch = self._on_time(task, records, lambda ts: ts - ts % slide, size)
        after = None if wp is None else wp - size - self.lateness_us
        rows, starts = aligned_windows(self.assigner, epoch.ts, np.ones(len(epoch.ts), bool), after)
        # Step 3. The stored windows (every live one of the task's key groups) and the epoch's elements, sorted by window, a
        # window's stored row first, then its new values by arrival.
        stored = task.state(spec).every_live_row()
        m = stored.num_rows
        key_columns, ids = _key_ids([stored, epoch.rows.take(pa.array(rows, pa.int64()))], self.key)
        start = np.concatenate([event_time_us(stored["window_start"])[0], starts])
        arrival = np.concatenate([np.zeros(m, np.int64), epoch.arrival[rows]])
        order = np.lexsort((arrival, np.arange(len(start)) >= m, start, ids))
        heads = _heads([ids[order], start[order]])
        window = np.empty(len(start), np.int64)
        window[order] = np.cumsum(heads) - 1
        first = order[heads]  # each window's first row: its stored one if any
        has_old, touched, fired = (np.zeros(len(first), bool) for _ in range(3))
        has_old[window[:m]] = True
        touched[window[m:]] = True
        if self.lateness_us > 0:
            fired[window[:m]] = bools(pc.fill_null(stored["fired"], False))
        window_start = start[first]
        pending = _Pending(first, window_start, window_start + size, touched, fired, has_old, window)
        groups = np.concatenate([ints(stored[KEY_GROUP]), ints(epoch.rows[KEY_GROUP])[rows]])
        return self._emit(
            task, spec, schema, stored, key_columns, groups, pending, (window_start, size), epoch.value_array(rows), arrival[m:]
        )


@dataclass
class SessionWindow(_Window):
    """Session windows: per key, sessions merged across epochs (steps 3 and 6 of the module docstring)."""

    assigner: EventTimeSessionWindows = EventTimeSessionWindows(timedelta(minutes=1))

    table: ClassVar[str] = "sessions"
    window_fields: ClassVar[tuple[pa.Field, ...]] = (
        pa.field("window_end", _TIMESTAMP),
        pa.field("window_values", pa.list_(_SESSION_VALUE)),
    )
    update_columns: ClassVar[tuple[str, ...]] = ("is_update", "retracted")

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        """Steps 1-7 of the module docstring for sessions; returns fired sessions and retractions."""
        (records,) = inputs
        schema, [spec] = self.output_schema([records.schema]), self.state_specs([records.schema])
        gap = self.assigner.gap_us
        # Steps 1-2. Each record's own window [ts, ts + gap) decides its lateness.
        epoch = self._on_time(task, records, lambda ts: ts, gap)
        n = len(epoch.ts)
        stored = task.state(spec).every_live_row()
        m = stored.num_rows
        key_columns, ids = _key_ids([stored, epoch.rows], self.key)
        # Step 3. Each record a one-value window, tagged with its arrival: its rank (from 1) among its key's on-time records of
        # the epoch by arrival.
        rank = ranks(ids[m:], np.lexsort((epoch.arrival, ids[m:])))
        # Gaps and islands: the stored sessions and the epoch's windows of a key sorted by (start, end, rank).
        start = np.concatenate([event_time_us(stored["window_start"])[0], epoch.ts])
        end = np.concatenate([event_time_us(stored["window_end"])[0], _plus(epoch.ts, gap, self.operator_id)])
        was_fired = np.zeros(m + n, bool)
        if self.lateness_us > 0:
            was_fired[:m] = bools(pc.fill_null(stored["fired"], False))
        order = np.lexsort((np.concatenate([np.zeros(m, np.int64), rank]), end, start, ids))
        sorted_start, sorted_end, is_stored = start[order], end[order], order < m
        island, heads = _islands(_heads([ids[order]]), sorted_start, sorted_end)
        session_start = sorted_start[heads]
        session_end = np.maximum.reduceat(sorted_end, heads) if len(heads) else sorted_end[heads]
        # The stored session of the island's start, if any, is overwritten; the others merged into it are tombstoned.
        own = is_stored & (sorted_start == session_start[island])
        merged = order[is_stored & ~own]
        of_row = np.empty(m + n, np.int64)
        of_row[order] = island
        fired = _any_of(own & was_fired[order], heads)
        pending = _Pending(
            order[heads], session_start, session_end, _any_of(~is_stored, heads), fired, _any_of(own, heads), of_row
        )
        groups = np.concatenate([ints(stored[KEY_GROUP]), ints(epoch.rows[KEY_GROUP])])
        arrivals = [pa.array(np.full(n, task.epoch, np.int64)), pa.array(rank), epoch.value_array(np.arange(n))]
        new_values = pa.StructArray.from_arrays(arrivals, fields=list(_SESSION_VALUE))
        tombstones = self._rows(
            key_columns, merged, start[merged], **{KEY_GROUP: groups[merged], DELETED: np.ones(len(merged), bool)}
        )
        emitted = self._emit(
            task, spec, schema, stored, key_columns, groups, pending, (session_end, 0), new_values, rank, tombstones
        )
        if self.lateness_us == 0:
            return emitted
        # Step 6: the retractions of fired sessions merged into another.
        retracted = merged[was_fired[merged]]
        yes = np.ones(len(retracted), bool)
        retractions = self._rows(key_columns, retracted, start[retracted], window_end=_timestamps(end[retracted]))
        return pa.concat_tables([emitted, conform(pa.table({**retractions, "is_update": yes, "retracted": yes}), schema)])


def window_node(
    operator_id: str,
    parent: Node,
    key: tuple[str, ...],
    assigner: WindowAssigner,
    aggregations: tuple[Aggregation, ...],
    late_output: str | None,
    allowed_lateness: timedelta,
) -> _Window:
    """The window operator for ``assigner``."""
    if isinstance(assigner, (TumblingEventTimeWindows, SlidingEventTimeWindows)):
        return AlignedWindow(operator_id, parent, key, aggregations, late_output, allowed_lateness, assigner)
    if isinstance(assigner, EventTimeSessionWindows):
        return SessionWindow(operator_id, parent, key, aggregations, late_output, allowed_lateness, assigner)
    raise PipelineDefinitionError(
        f"window {operator_id!r}: {assigner!r} is not a window assigner; give TumblingEventTimeWindows.of(size), "
        "SlidingEventTimeWindows.of(size, slide) or EventTimeSessionWindows.with_gap(gap)"
    )


# -- records, keys and values -----------------------------------------------------------------------


def _key_ids(parts: Sequence[pa.Table], key: Sequence[str]) -> tuple[list[pa.Array], np.ndarray]:
    """The key columns of ``parts`` one after another, as Spark groups them (-0.0 as 0.0, one NaN), and each row's key id."""
    keys, ids = key_ids(parts, key)
    every = pa.array(np.concatenate(ids), pa.int64())
    columns = []
    for column in keys.columns:
        if pa.types.is_floating(column.type):
            zero, nan = pa.scalar(0.0, column.type), pa.scalar(float("nan"), column.type)
            column = pc.if_else(pc.is_nan(column), nan, pc.if_else(pc.equal(column, zero), zero, column))
        columns.append(column.take(every))
    return columns, every.to_numpy()


def _arrival_ranks(rows: pa.Table, values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Each record's rank in arrival order: by its positions (a null first), then (equal positions) by value. Values as Spark's
    struct order compares them: null first, NaN last; of equal ones (-0.0 and 0.0) the bits decide, so the order never depends on
    how the records were given."""
    keys: list[np.ndarray] = []  # most significant first
    for name in position_columns(rows.column_names):
        keys += [bools(pc.is_valid(rows[name])), ints(pc.fill_null(rows[name], 0))]
    nan = np.isnan(values)
    keys += [valid, nan, np.where(nan, 0.0, values), values.view(np.int64)]
    order = np.lexsort(keys[::-1])
    ranked = np.empty(len(order), np.int64)
    ranked[order] = np.arange(len(order))
    return ranked


def _plus(values: np.ndarray, span: int, operator_id: str) -> np.ndarray:
    """Window ends: ``values + span``, refusing one past the largest timestamp (where Spark's arithmetic overflows too)."""
    if len(values) and int(values.max()) > INT64_MAX - span:
        raise PipelineDefinitionError(
            f"window {operator_id}: a window starting at {int(values.max())} us would end past the largest timestamp; "
            "give a smaller size or gap"
        )
    return values + np.int64(span)


# -- gaps and islands ---------------------------------------------------------------------------------


def _heads(columns: list[np.ndarray]) -> np.ndarray:
    """Whether each of the sorted rows starts a new value of ``columns`` (the first row always does)."""
    heads = np.zeros(len(columns[0]), bool)
    heads[:1] = True
    for column in columns:
        heads[1:] |= column[1:] != column[:-1]
    return heads


def _islands(new_key: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gaps and islands of windows sorted by key, start: each window's island and each island's first window. A window opens an
    island when it starts a key or starts after the greatest end of its key's windows before it (touching ones merge, as in
    Flink). That greatest end is one running maximum over all keys of (key's index, end's rank among all ends): each key's values
    exceed every earlier key's, so it restarts at every key."""
    opens = new_key.copy()
    if len(end) > 1:
        ends, end_rank = np.unique(end, return_inverse=True)
        reach = np.maximum.accumulate((np.cumsum(new_key) - 1) * len(ends) + end_rank.reshape(-1))
        opens[1:] |= start[1:] > ends[reach[:-1] % len(ends)]
    return np.cumsum(opens) - 1, np.flatnonzero(opens)


def _any_of(mask: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """Whether any element of each run of ``mask`` starting at ``heads`` (to the next head) is true."""
    return np.logical_or.reduceat(mask, heads) if len(heads) else np.zeros(0, bool)


# -- the aggregates ---------------------------------------------------------------------------------------


def _results(aggregations: Sequence[Aggregation], lists: pa.ListArray, windows: np.ndarray) -> list[pa.Array]:
    """Each aggregation of the lists at ``windows`` (each a window's values in arrival order), as the module docstring defines it."""
    taken = lists.take(pa.array(windows, pa.int64()))
    counts = ints(pc.fill_null(pc.list_value_length(taken), 0))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    flat = pc.list_flatten(taken)
    valid = bools(pc.is_valid(flat))
    values = np.asarray(pc.fill_null(flat, 0.0).to_numpy(zero_copy_only=False), np.float64)
    nulls = np.concatenate([[0], np.cumsum(~valid)])
    has_null = (nulls[offsets[1:]] - nulls[offsets[:-1]]) > 0
    empty = counts == 0
    window = np.repeat(np.arange(len(counts)), counts)
    index = np.arange(len(values))
    nan = np.isnan(values)
    numbers = np.where(nan, 0.0, values)
    ascending: np.ndarray | None = None
    results: list[pa.Array] = []
    for agg in aggregations:
        if isinstance(agg, Count):
            results.append(pa.array(counts, pa.int64()))
        elif isinstance(agg, (Sum, Avg)):
            sums = folded_sums(offsets, values)
            if isinstance(agg, Avg):
                sums = sums / np.where(empty, 1, counts)
            results.append(pa.array(sums, pa.float64(), mask=has_null | (empty & isinstance(agg, Avg))))
        elif isinstance(agg, Max):
            # Nulls last, NaN above every number, then descending; equal ones in arrival order: the first is the greatest.
            descending = np.lexsort((index, -numbers, ~nan, ~valid, window))
            results.append(_picked(values, valid, descending, offsets[:-1], ~empty))
        else:
            if ascending is None:  # nulls last, NaN above every number; equal ones in arrival order
                ascending = np.lexsort((index, numbers, nan, ~valid, window))
            if isinstance(agg, Min):
                results.append(_picked(values, valid, ascending, offsets[:-1], ~empty))
            else:
                assert isinstance(agg, Percentile)
                distinct, inverse = np.unique(counts, return_inverse=True)
                ranked = np.array([agg.rank(int(c)) for c in distinct], np.int64)[inverse.reshape(-1)]
                results.append(_picked(values, valid, ascending, offsets[:-1] + ranked - 1, ~empty))
    return results


def _picked(values: np.ndarray, valid: np.ndarray, order: np.ndarray, at: np.ndarray, present: np.ndarray) -> pa.Array:
    """The value at sorted position ``at`` of each window (where ``present``): null if the window is empty or it is null."""
    picked, found = np.zeros(len(at)), np.zeros(len(at), bool)
    rows = order[at[present]]
    picked[present], found[present] = values[rows], valid[rows]
    return pa.array(picked, pa.float64(), mask=~found)


# -- Arrow ----------------------------------------------------------------------------------------------------


def _changes(spec: StateSpec, columns: dict[str, Any]) -> pa.Table:
    """State changes in the table's columns (key columns, key group, values, ``_deleted``); a value not given is null."""
    return conform(pa.table(columns), pa.schema([f for f in spec.arrow_schema() if f.name not in (UPDATED_AT, EPOCH)]))


def _timestamps(us: np.ndarray) -> pa.Array:
    return pa.array(us, pa.int64()).cast(_TIMESTAMP)
