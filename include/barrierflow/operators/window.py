"""Event-time windows (tumbling, sliding, session) that fire when the watermark passes their end.

Window assigners, all in event time (microseconds since the Unix epoch, in UTC):

- :class:`TumblingEventTimeWindows` ``.of(size)``: the window
  ``[k * size, (k + 1) * size)`` holding the record's timestamp.
- :class:`SlidingEventTimeWindows` ``.of(size, slide)``: every window
  ``[k * slide, k * slide + size)`` holding it (``ceil(size / slide)`` of
  them at most; aligned to the Unix epoch, as Flink's with offset 0). A
  slide larger than the size is refused: records between two windows would
  belong to none and vanish.
- :class:`EventTimeSessionWindows` ``.with_gap(gap)``: per key, records
  at most ``gap`` apart form one session ``[first ts, last ts + gap)``.
  Each record opens its own window ``[ts, ts + gap)``; windows that overlap
  or touch merge, as Flink's (``TimeWindow.intersects``: two records exactly
  ``gap`` apart are one session), also across epochs: a record may bridge
  two stored sessions into one.

With W(n-1) the watermark at the start of epoch n, W(n) the one at its end
and L the allowed lateness (a ``timedelta``, default 0, as Flink's
``allowedLateness``), epoch n does:

1. Assign each record its windows (a session: its own ``[ts, ts + gap)``).
2. Late records. A window is late when ``end + L <= W(n-1)``: its state was
   cleared, or would have been. A record all of whose windows are late (for
   a session: its own window) goes to the side output ``late_output`` if the
   window declares one, else it is dropped and the number dropped is logged
   (the epoch's counter ``late records dropped by window <operator id>``).
   A record that is not late joins only its windows that are not late
   (sliding windows). Unlike Flink, a session record's lateness depends on
   its own window alone, not on the stored session it would merge with.
3. Fold the epoch's other records into the pending windows of their key.
   Every window keeps its values in arrival order: earlier epochs first,
   then by arrival position within the epoch. So every aggregate (floating
   sums and percentiles included) is exact and never depends on parallelism,
   on partitioning, or on how the input was cut into epochs. Sessions keep
   each value with its arrival (epoch, position within the epoch's records
   of its key) so that merged sessions interleave their values in arrival
   order too; stored sessions and the epoch's windows are merged per key as
   gaps and islands (their union sorted by start: a window opens a new
   session when it starts after the end of every window of its key before it).
4. Fire. Every window with ``end <= W(n)`` that has not fired yet, or that
   got records in step 3 (records late for a fired window but within L),
   emits one row: the key, ``window_start``, ``window_end`` and the
   aggregates of all its values so far. A window fires at most once per
   epoch, with every record the epoch added to it.
5. Purge a window's state once ``end + L <= W(n)``; with L = 0 that is when
   it fires, so each window fires once and the state holds unfired windows
   only (the behaviour, state table and output columns of windows before
   allowed lateness existed).
6. With L > 0, rows carry ``is_update``: whether a row for this key and
   ``window_start`` was emitted before (this one replaces it).
   ``DeltaSink.upsert(name, key=(*key, "window_start"))`` then keeps the
   latest result of every window. A session that a late record merges into
   another session with an earlier start no longer exists under its own
   start: if it had fired, a retraction row is emitted for it (its key,
   ``window_start`` and ``window_end``, null aggregates, ``is_update`` true,
   ``retracted`` true; session windows with L > 0 carry ``retracted``,
   false on every other row), so an upsert sink marks it replaced; a reader
   of the latest results filters ``not retracted``.
7. Stage the state changes only: windows that got records, fired for the
   first time (with L > 0) or were purged, and the tombstones of sessions
   merged into another. A window created and purged in the same epoch is
   never written.

Records, keys and values, as Spark's SQL treats them:

- A record whose event time is null belongs to no window: it is dropped
  (neither late nor on time; counted as ``records without an event time
  dropped by window <operator id>``).
- A null key is a key like any other (its windows are its own); float keys
  are grouped as Spark groups them, -0.0 as 0.0 and every NaN as one.
- The aggregated column (any integer, float or decimal) is cast to a double
  as Spark casts it (a long to the nearest double, a decimal correctly
  rounded); a count alone keeps 0.0 per record. A null value stays in its
  window: ``Count`` counts it, ``Sum`` and ``Avg`` of a window holding one are
  null, ``Min``/``Max`` skip it, ``Percentile`` sorts it last.
- The aggregates of a window's values ``v`` in arrival order: ``Count`` the
  number of values (a long); ``Sum`` the left fold ``((0.0 + v1) + v2) + ...``
  in IEEE doubles; ``Avg`` that sum over the count; ``Min``/``Max`` the least
  or greatest value in Spark's order of doubles (NaN above every number,
  -0.0 equal to 0.0: the first in arrival order of equal ones); ``Percentile``
  the value at 1-based position ``ceil(q * n)`` of the values sorted
  ascending in that order (nulls last; equal ones in arrival order).
- Arrival order within an epoch is by arrival position (``_seq``, then
  sub-positions), a null position first, as Spark sorts ascending; records
  of equal positions (null ones) by value (null first, NaN last).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Sequence

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
from barrierflow.operators.base import Node, Task, with_key_group
from barrierflow.state.spec import StateSpec

__all__ = [
    "TumblingEventTimeWindows",
    "SlidingEventTimeWindows",
    "EventTimeSessionWindows",
    "WindowAssigner",
    "AlignedWindow",
    "TumblingWindow",
    "SessionWindow",
    "window_node",
]

_ONE_US = timedelta(microseconds=1)
# The value one session element keeps: its arrival and the aggregated column.
_SESSION_VALUE = pa.struct([pa.field("epoch", pa.int64()), pa.field("position", pa.int64()), pa.field("value", pa.float64())])
_TIMESTAMP = pa.timestamp("us", tz="UTC")
_AGGREGATIONS = (Count, Sum, Min, Max, Avg, Percentile)
_LONG = np.iinfo(np.int64)
# Sums fold a window's values column by column for windows up to this many values, one window at a time beyond.
_FOLD_COLUMNS = 32


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


@dataclass
class _Window(Node):
    """What every window operator shares: aggregations, lateness, the late side output, output columns."""

    key: tuple[str, ...] = ()
    aggregations: tuple[Aggregation, ...] = ()
    late_output: str | None = None
    allowed_lateness: timedelta = timedelta(0)

    uses_watermark = True

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

    @property
    def time_column(self) -> str:
        raise NotImplementedError

    def extra_output_columns(self) -> tuple[str, ...]:
        """Columns beyond key, window bounds and aggregates (step 6): none with L = 0, so outputs stay as they were."""
        return ("is_update",) if self.lateness_us > 0 else ()

    # -- what it declares from its input's schema

    def _spec(self, key_types: dict[str, pa.DataType] | None = None) -> StateSpec:
        raise NotImplementedError

    def state_specs(self, inputs: Sequence[pa.Schema] | None = None) -> list[StateSpec]:
        if not inputs:
            return [self._spec()]
        (schema,) = inputs
        return [self._spec({k: schema.field(k).type for k in self.key if k in schema.names})]

    def _state_spec(self, name: str, values: list[pa.Field], key_types: dict[str, pa.DataType] | None) -> StateSpec:
        """The window table: the key, ``window_start``, then ``values`` (and ``fired`` with lateness, step 5)."""
        types = key_types or {}
        if self.lateness_us > 0:  # windows that fired stay until purged
            values = [*values, pa.field("fired", pa.bool_())]
        return StateSpec(
            operator_id=self.operator_id,
            name=name,
            key_fields=(
                *(pa.field(k, types.get(k, pa.string())) for k in self.key),
                pa.field("window_start", _TIMESTAMP),
            ),
            value_fields=tuple(values),
        )

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        (schema,) = inputs
        missing = [k for k in self.key if k not in schema.names]
        if missing:
            raise PipelineDefinitionError(
                f"window {self.operator_id}: its key column {missing[0]!r} is not among its input's columns {user_columns(schema.names)}"
            )
        time = self.time_column
        if time not in schema.names or not pa.types.is_timestamp(schema.field(time).type):
            found = schema.field(time).type if time in schema.names else "no such column"
            raise PipelineDefinitionError(
                f"window {self.operator_id}: its event-time column {time!r} must be a timestamp "
                f"(found: {found}; columns: {user_columns(schema.names)})"
            )
        for agg in self.aggregations:
            column = agg.value_column
            if column is not None and (column not in schema.names or not _numeric(schema.field(column).type)):
                found = schema.field(column).type if column in schema.names else "no such column"
                raise PipelineDefinitionError(
                    f"window {self.operator_id}: {type(agg).__name__}({column!r}) needs a numeric column (found: {found})"
                )
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
        return (
            {self.late_output: pa.schema([f for f in schema if f.name in user_columns(schema.names)])} if self.late_output else {}
        )

    # -- what both kernels share

    def _on_time(self, task: Task, records: pa.Table, latest_start: Callable[[np.ndarray], np.ndarray], span: int) -> _Records:
        """Steps 1-2 for every record: its event time, late ones to the side output (or dropped and counted), the others.

        ``latest_start``: the start of a record's latest window from its event
        time; ``span``: how long that window is (a size or a gap).
        """
        records = with_key_group(records, self.key, task.key_groups)
        # Step 1. A record without an event time has no window (Spark's unix_micros(null) is null: every test on it fails).
        timed = pc.is_valid(records[self.time_column])
        untimed = records.num_rows - pc.sum(timed).as_py() if records.num_rows else 0
        if untimed:
            task.count(f"window {self.operator_id} dropped {{n}} record(s) without an event time", untimed)
            records = records.filter(timed)
        ts = _micros(records[self.time_column])
        # Step 2. A record is late when its latest window is: its end + L at or before W(n-1).
        wm_prev = task.watermark_prev_us
        late = np.zeros(len(ts), bool) if wm_prev is None else _at_most(latest_start(ts), wm_prev - span - self.lateness_us)
        if self.late_output:  # emitted every epoch, empty or not: the side output's table exists from the first
            task.emit(self.late_output, records.filter(pa.array(late)).select(user_columns(records.column_names)))
        elif late.any():
            task.count(f"window {self.operator_id} dropped {{n}} late record(s) (no late_output declared)", int(late.sum()))
        on_time = records.filter(pa.array(~late))
        column = on_time[self.value_column] if self.value_column is not None else None
        values, valid = _doubles(column, on_time.num_rows)
        return _Records(
            rows=on_time.select([*self.key, KEY_GROUP]),
            ts=ts[~late],
            values=values,
            valid=valid,
            arrival=_arrival_ranks(on_time, values, valid),
        )

    def _firing(
        self, task: Task, reach: np.ndarray, span: int, touched: np.ndarray, fired: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Steps 4-5: whether each window (ending at ``reach + span``) fires, whether its state is purged."""
        wm = task.watermark_us
        if wm is None:
            return np.zeros(len(touched), bool), np.zeros(len(touched), bool)
        fires = _at_most(reach, wm - span) & (touched | ~fired)
        return fires, _at_most(reach, wm - span - self.lateness_us)

    def _outputs(self, columns: dict[str, Any], lists: pa.ListArray, firing: np.ndarray, schema: pa.Schema) -> pa.Table:
        """Steps 4 and 6: the fired windows' rows, each aggregate computed from ``lists`` (their values in arrival order)."""
        columns.update(zip((a.name for a in self.aggregations), _results(self.aggregations, lists, firing)))
        return conform(pa.table(columns), schema)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "key": list(self.key),
            "aggregations": [a.name for a in self.aggregations],
            "late_output": self.late_output,
            "allowed_lateness_us": self.lateness_us,
        }


@dataclass
class AlignedWindow(_Window):
    """Tumbling and sliding windows: windows aligned to the Unix epoch, keyed by their start."""

    assigner: TumblingEventTimeWindows | SlidingEventTimeWindows = TumblingEventTimeWindows(timedelta(minutes=1))

    @property
    def time_column(self) -> str:
        return self.assigner.time_column

    def _spec(self, key_types: dict[str, pa.DataType] | None = None) -> StateSpec:
        return self._state_spec("pending_windows", [pa.field("window_values", pa.list_(pa.float64()))], key_types)

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        """Steps 1-7 of the module docstring; returns the fired windows' rows."""
        (records,) = inputs
        schema = self.output_schema([records.schema])
        [spec] = self.state_specs([records.schema])
        key = list(self.key)
        size, slide, lateness = self.assigner.size_us, self.assigner.slide_us, self.lateness_us
        # Steps 1-2. A record's latest window starts at ts - pmod(ts, slide) (numpy's % is a floor modulo).
        epoch = self._on_time(task, records, lambda ts: ts - ts % slide, size)
        ts = epoch.ts
        last = ts - ts % slide
        n = len(ts)
        if slide != size:  # step 1: every window holding ts (start > ts - size) and (step 2) not late itself
            count = -(-size // slide)
            floor = ts - size
            if task.watermark_prev_us is not None:
                floor = np.maximum(floor, _clamped(task.watermark_prev_us - size - lateness))
            rows = np.repeat(np.arange(n), count)
            starts = np.repeat(last, count) - np.tile(np.arange(count, dtype=np.int64) * slide, n)
            keep = starts > floor[rows]
            rows, starts = rows[keep], starts[keep]
        else:
            rows, starts = np.arange(n), last
        # Step 3. The stored windows (every live one of the task's key groups) and the epoch's elements,
        # sorted by window, a window's stored row first, then its new values by arrival.
        stored = task.state(spec).every_live_row()
        m, e = stored.num_rows, len(rows)
        key_columns, codes = _keys(stored, epoch.rows.take(_indices(rows)), key)
        start = np.concatenate([_micros(stored["window_start"]), starts])
        from_epoch = np.arange(m + e) >= m
        arrival = np.concatenate([np.zeros(m, np.int64), epoch.arrival[rows]])
        order = np.lexsort((arrival, from_epoch, start, *reversed(codes)))
        heads = _heads([*(c[order] for c in codes), start[order]], m + e)
        window = np.empty(m + e, np.int64)
        window[order] = np.cumsum(heads) - 1
        first = order[heads]  # each window's first row: its stored one if any
        w = len(first)
        has_old, touched = np.zeros(w, bool), np.zeros(w, bool)
        has_old[window[:m]] = True
        touched[window[m:]] = True
        window_start = start[first]
        groups = np.concatenate([_ints(stored[KEY_GROUP]), _ints(epoch.rows[KEY_GROUP])[rows]])[first]
        fired = np.zeros(w, bool)
        if lateness > 0:
            fired[window[:m]] = _bools(pc.fill_null(stored["fired"], False))
        # Steps 4-5.
        fires, purged = self._firing(task, window_start, size, touched, fired)
        # Step 7's changes: new values, a first firing (kept, with L > 0) or a purge (a tombstone),
        # never a window never stored and purged.
        changed = (touched | fires | purged) & (has_old | ~purged)
        # Step 3's values of the windows that change or fire: the stored ones, then the epoch's by arrival.
        needed = np.flatnonzero(changed | fires)
        slot = np.full(w, -1, np.int64)
        slot[needed] = np.arange(len(needed))
        old_rows = np.flatnonzero(slot[window[:m]] >= 0)
        old_lists = _array(stored["window_values"]).take(_indices(old_rows))
        old_values = pc.list_flatten(old_lists)
        old_parents = slot[window[old_rows]][_ints(pc.list_parent_indices(old_lists))]
        new = np.flatnonzero(slot[window[m:]] >= 0)
        parents = np.concatenate([old_parents, slot[window[m + new]]])
        part = np.concatenate([np.zeros(len(old_parents), np.int64), np.ones(len(new), np.int64)])
        within = np.concatenate([np.arange(len(old_parents), dtype=np.int64), epoch.arrival[rows[new]]])
        elements = pa.concat_arrays([old_values.cast(pa.float64()), epoch.value_array(rows[new])])
        offsets, values = _lists(len(needed), parents, [part, within], elements)
        window_values = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)
        # Step 7.
        staged = np.flatnonzero(changed)
        state: dict[str, Any] = {k: key_columns[i].take(_indices(first[staged])) for i, k in enumerate(key)}
        state["window_start"] = _timestamps(window_start[staged])
        state[KEY_GROUP] = pa.array(groups[staged], pa.int32())
        state["window_values"] = window_values.take(_indices(slot[staged]))
        if lateness > 0:
            state["fired"] = pa.array((fired | fires)[staged], pa.bool_())
        state[DELETED] = pa.array(purged[staged], pa.bool_())
        task.state(spec).stage(_changes(spec, state))
        # Steps 4 and 6.
        firing = np.flatnonzero(fires)
        out: dict[str, Any] = {k: key_columns[i].take(_indices(first[firing])) for i, k in enumerate(key)}
        out["window_start"] = _timestamps(window_start[firing])
        out["window_end"] = _timestamps(_plus(window_start[firing], size, self.operator_id))
        if lateness > 0:
            out["is_update"] = pa.array(fired[firing], pa.bool_())
        return self._outputs(out, window_values, slot[firing], schema)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "assigner": self.assigner.kind,
            "size_us": self.assigner.size_us,
            "slide_us": self.assigner.slide_us,
        }


# The operator tumbling windows always had (kept for imports of it).
TumblingWindow = AlignedWindow


@dataclass
class SessionWindow(_Window):
    """Session windows: per key, sessions merged across epochs (steps 3 and 6 of the module docstring)."""

    assigner: EventTimeSessionWindows = EventTimeSessionWindows(timedelta(minutes=1))

    @property
    def time_column(self) -> str:
        return self.assigner.time_column

    def extra_output_columns(self) -> tuple[str, ...]:
        return ("is_update", "retracted") if self.lateness_us > 0 else ()

    def _spec(self, key_types: dict[str, pa.DataType] | None = None) -> StateSpec:
        values = [pa.field("window_end", _TIMESTAMP), pa.field("window_values", pa.list_(_SESSION_VALUE))]
        return self._state_spec("sessions", values, key_types)

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        """Steps 1-7 of the module docstring for sessions; returns fired sessions and retractions."""
        (records,) = inputs
        schema = self.output_schema([records.schema])
        [spec] = self.state_specs([records.schema])
        key = list(self.key)
        gap, lateness = self.assigner.gap_us, self.lateness_us
        # Steps 1-2. Each record's own window [ts, ts + gap) decides its lateness.
        epoch = self._on_time(task, records, lambda ts: ts, gap)
        ts = epoch.ts
        n = len(ts)
        stored = task.state(spec).every_live_row()
        m = stored.num_rows
        key_columns, codes = _keys(stored, epoch.rows, key)
        # Step 3. Each record a one-value window, tagged with its arrival: its
        # rank (from 1) among its key's on-time records of the epoch by arrival.
        by_arrival = np.lexsort((epoch.arrival, *reversed([c[m:] for c in codes])))
        new_key = _heads([c[m:][by_arrival] for c in codes], n)
        rank = np.empty(n, np.int64)
        rank[by_arrival] = np.arange(n) - np.maximum.accumulate(np.where(new_key, np.arange(n), 0)) + 1
        # Gaps and islands: the stored sessions and the epoch's windows of a key sorted by (start, end, rank).
        start = np.concatenate([_micros(stored["window_start"]), ts])
        end = np.concatenate([_micros(stored["window_end"]), _plus(ts, gap, self.operator_id)])
        tie = np.concatenate([np.zeros(m, np.int64), rank])
        was_fired = np.zeros(m + n, bool)
        if lateness > 0:
            was_fired[:m] = _bools(pc.fill_null(stored["fired"], False))
        order = np.lexsort((tie, end, start, *reversed(codes)))
        sorted_start, sorted_end, is_stored = start[order], end[order], order < m
        island, heads = _islands(_heads([c[order] for c in codes], m + n), sorted_start, sorted_end)
        session_start = sorted_start[heads]
        session_end = np.maximum.reduceat(sorted_end, heads) if len(heads) else sorted_end[heads]
        touched = _any_of(~is_stored, heads)
        # The stored session of the island's start, if any, is overwritten; the others merged into it are tombstoned.
        own = is_stored & (sorted_start == session_start[island])
        kept, fired = _any_of(own, heads), _any_of(own & was_fired[order], heads)
        merged = order[is_stored & ~own]
        # Steps 4-5.
        fires, purged = self._firing(task, session_end, 0, touched, fired)
        changed = (touched | fires | purged) & (kept | ~purged)
        # The values of the sessions that change or fire, in arrival order ((epoch, position) is unique per key).
        needed = np.flatnonzero(changed | fires)
        slot = np.full(len(heads), -1, np.int64)
        slot[needed] = np.arange(len(needed))
        row_island = np.empty(m + n, np.int64)
        row_island[order] = island
        old_rows = np.flatnonzero(slot[row_island[:m]] >= 0)
        old_lists = _array(stored["window_values"]).take(_indices(old_rows))
        old_parents = slot[row_island[old_rows]][_ints(pc.list_parent_indices(old_lists))]
        new = np.flatnonzero(slot[row_island[m:]] >= 0)
        new_values = pa.StructArray.from_arrays(
            [pa.array(np.full(len(new), task.epoch, np.int64)), pa.array(rank[new], pa.int64()), epoch.value_array(new)],
            fields=list(_SESSION_VALUE),
        )
        elements = pa.concat_arrays([pc.list_flatten(old_lists).cast(_SESSION_VALUE), new_values])
        parents = np.concatenate([old_parents, slot[row_island[m + new]]])
        arrivals = [_ints(pc.fill_null(elements.field(f), 0)) for f in ("epoch", "position")]
        offsets, values = _lists(len(needed), parents, arrivals, elements)
        window_values = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)
        head_rows = order[heads]
        groups = np.concatenate([_ints(stored[KEY_GROUP]), _ints(epoch.rows[KEY_GROUP])])
        # Step 7. The changed sessions, and the tombstones of those merged into another.
        staged = np.flatnonzero(changed)
        updates: dict[str, Any] = {k: key_columns[i].take(_indices(head_rows[staged])) for i, k in enumerate(key)}
        updates["window_start"] = _timestamps(session_start[staged])
        updates[KEY_GROUP] = pa.array(groups[head_rows[staged]], pa.int32())
        updates["window_end"] = _timestamps(session_end[staged])
        updates["window_values"] = window_values.take(_indices(slot[staged]))
        if lateness > 0:
            updates["fired"] = pa.array((fired | fires)[staged], pa.bool_())
        updates[DELETED] = pa.array(purged[staged], pa.bool_())
        tombstones: dict[str, Any] = {k: key_columns[i].take(_indices(merged)) for i, k in enumerate(key)}
        tombstones["window_start"] = _timestamps(start[merged])
        tombstones[KEY_GROUP] = pa.array(groups[merged], pa.int32())
        tombstones.update((f.name, pa.nulls(len(merged), f.type)) for f in spec.value_fields)
        tombstones[DELETED] = pa.array(np.ones(len(merged), bool))
        task.state(spec).stage(pa.concat_tables([_changes(spec, updates), _changes(spec, tombstones)]))
        # Steps 4 and 6: the fired sessions, then (with L > 0) the retractions of fired sessions merged into another.
        firing = np.flatnonzero(fires)
        out: dict[str, Any] = {k: key_columns[i].take(_indices(head_rows[firing])) for i, k in enumerate(key)}
        out["window_start"] = _timestamps(session_start[firing])
        out["window_end"] = _timestamps(session_end[firing])
        if lateness > 0:
            out["is_update"] = pa.array(fired[firing], pa.bool_())
            out["retracted"] = pa.array(np.zeros(len(firing), bool))
        value_lists = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values.field("value"))
        emitted = self._outputs(out, value_lists, slot[firing], schema)
        if lateness == 0:
            return emitted
        retracted = merged[was_fired[merged]]
        retractions: dict[str, Any] = {k: key_columns[i].take(_indices(retracted)) for i, k in enumerate(key)}
        retractions["window_start"], retractions["window_end"] = _timestamps(start[retracted]), _timestamps(end[retracted])
        retractions["is_update"] = retractions["retracted"] = pa.array(np.ones(len(retracted), bool))
        return pa.concat_tables([emitted, conform(pa.table(retractions), schema)])

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "assigner": self.assigner.kind, "gap_us": self.assigner.gap_us}


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
    common: dict[str, Any] = {
        "operator_id": operator_id,
        "parent": parent,
        "key": key,
        "aggregations": aggregations,
        "late_output": late_output,
        "allowed_lateness": allowed_lateness,
    }
    if isinstance(assigner, (TumblingEventTimeWindows, SlidingEventTimeWindows)):
        return AlignedWindow(**common, assigner=assigner)
    if isinstance(assigner, EventTimeSessionWindows):
        return SessionWindow(**common, assigner=assigner)
    raise PipelineDefinitionError(
        f"window {operator_id!r}: {assigner!r} is not a window assigner; give TumblingEventTimeWindows.of(size), "
        "SlidingEventTimeWindows.of(size, slide) or EventTimeSessionWindows.with_gap(gap)"
    )


# -- records, keys and values -----------------------------------------------------------------------


def _numeric(type_: pa.DataType) -> bool:
    return pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_decimal(type_)


def _doubles(column: pa.ChunkedArray | None, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Spark's ``cast(column as double)`` (0.0 per record without a column): the values (a null as 0.0), and which are not null.

    A long rounds to the nearest double (Java's ``(double)``); a decimal is
    correctly rounded, as ``BigDecimal.doubleValue`` (Arrow's direct cast is
    not: it goes through its exact decimal text instead).
    """
    if column is None:
        return np.zeros(n), np.ones(n, bool)
    doubles = as_double(column)
    valid = _bools(pc.is_valid(doubles))
    return np.asarray(pc.fill_null(doubles, 0.0).to_numpy(zero_copy_only=False), np.float64), valid


def _arrival_ranks(rows: pa.Table, values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Each record's rank in arrival order: by its positions (a null first), then (equal positions) by value.

    Values as Spark's struct order compares them: null first, NaN last; of
    equal ones (-0.0 and 0.0) the bits decide, so the order never depends on
    how the records were given.
    """
    keys: list[np.ndarray] = []  # most significant first
    for name in position_columns(rows.column_names):
        keys += [_bools(pc.is_valid(rows[name])), _ints(pc.fill_null(rows[name], 0))]
    nan = np.isnan(values)
    keys += [valid, nan, np.where(nan, 0.0, values), values.view(np.int64)]
    order = np.lexsort(keys[::-1])
    ranks = np.empty(len(order), np.int64)
    ranks[order] = np.arange(len(order))
    return ranks


def _keys(stored: pa.Table, epoch: pa.Table, key: list[str]) -> tuple[list[pa.Array], list[np.ndarray]]:
    """The key columns of the stored rows then the epoch's, and each one's codes (equal values, nulls included, equal codes).

    Floats as Spark groups them (``NormalizeFloatingNumbers``): -0.0 as 0.0, every NaN the same NaN.
    """
    columns, codes = [], []
    for name in key:
        type_ = epoch.schema.field(name).type
        column = pa.chunked_array([*stored[name].cast(type_).chunks, *epoch[name].chunks], type=type_).combine_chunks()
        if pa.types.is_floating(type_):
            zero, nan = pa.scalar(0.0, type_), pa.scalar(float("nan"), type_)
            column = pc.if_else(pc.is_nan(column), nan, pc.if_else(pc.equal(column, zero), zero, column))
        columns.append(column)
        codes.append(_ints(pc.dictionary_encode(column, null_encoding="encode").indices))
    return columns, codes


def _micros(column: pa.ChunkedArray) -> np.ndarray:
    """A timestamp column (not null) in microseconds since the Unix epoch (``unix_micros``)."""
    us = pc.cast(column, pa.timestamp("us", tz=column.type.tz), safe=False)
    return _ints(pc.cast(us, pa.int64()))


def _at_most(values: np.ndarray, bound: int) -> np.ndarray:
    """``values <= bound``, the bound computed in Python's unbounded integers (beyond a long: every value or none)."""
    if bound >= _LONG.max:
        return np.ones(len(values), bool)
    if bound < _LONG.min:
        return np.zeros(len(values), bool)
    return values <= bound


def _clamped(value: int) -> int:
    return max(min(value, int(_LONG.max)), int(_LONG.min))


def _plus(values: np.ndarray, span: int, operator_id: str) -> np.ndarray:
    """Window ends: ``values + span``, refusing one past the largest timestamp (where Spark's arithmetic overflows too)."""
    if not len(values):
        return values.copy()
    if int(values.max()) > int(_LONG.max) - span:
        raise PipelineDefinitionError(
            f"window {operator_id}: a window starting at {int(values.max())} us would end past the largest timestamp; "
            "give a smaller size or gap"
        )
    return values + np.int64(span)


# -- gaps and islands, lists ----------------------------------------------------------------------------


def _heads(columns: list[np.ndarray], n: int) -> np.ndarray:
    """Whether each of ``n`` sorted rows starts a new value of ``columns`` (the first row always does)."""
    heads = np.ones(n, bool)
    if n > 1:
        differs = np.zeros(n - 1, bool)
        for column in columns:
            differs |= column[1:] != column[:-1]
        heads[1:] = differs
    return heads


def _islands(new_key: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gaps and islands of windows sorted by key, start: each window's island and each island's first window.

    A window opens an island when it starts a key or starts after the greatest
    end of its key's windows before it (touching ones merge, as in Flink). That
    greatest end is one running maximum over all keys of (key's index, end's
    rank among all ends): each key's values exceed every earlier key's, so it
    restarts at every key.
    """
    opens = new_key.copy()
    if len(end) > 1:
        ends, end_rank = np.unique(end, return_inverse=True)
        reach = np.maximum.accumulate((np.cumsum(new_key) - 1) * len(ends) + end_rank.reshape(-1))
        opens[1:] |= start[1:] > ends[reach[:-1] % len(ends)]
    return np.cumsum(opens) - 1, np.flatnonzero(opens)


def _any_of(mask: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """Whether any element of each run of ``mask`` starting at ``heads`` (to the next head) is true."""
    return np.logical_or.reduceat(mask, heads) if len(heads) else np.zeros(0, bool)


def _lists(n: int, parents: np.ndarray, order: list[np.ndarray], elements: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """``n`` lists, element ``i`` of ``elements`` in list ``parents[i]``, each list sorted by ``order`` (keys,
    most significant first, that tell every two elements of a list apart): the lists' offsets and their elements."""
    sort = np.lexsort((*reversed(order), parents)) if len(parents) else np.zeros(0, np.int64)
    counts = np.bincount(parents, minlength=n) if len(parents) else np.zeros(n, np.int64)
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), elements.take(pa.array(sort, pa.int64()))


# -- the aggregates ---------------------------------------------------------------------------------------


def _results(aggregations: Sequence[Aggregation], lists: pa.ListArray, windows: np.ndarray) -> list[pa.Array]:
    """Each aggregation of the lists at ``windows`` (each a window's values in arrival order), as the module docstring defines it."""
    taken = lists.take(_indices(windows))
    counts = _ints(pc.fill_null(pc.list_value_length(taken), 0))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    flat = pc.list_flatten(taken)
    valid = _bools(pc.is_valid(flat))
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
            sums = _folded_sums(offsets, values)
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
                ranks = np.array([agg.rank(int(c)) for c in distinct], np.int64)[inverse.reshape(-1)]
                results.append(_picked(values, valid, ascending, offsets[:-1] + ranks - 1, ~empty))
    return results


def _picked(values: np.ndarray, valid: np.ndarray, order: np.ndarray, at: np.ndarray, present: np.ndarray) -> pa.Array:
    """The value at sorted position ``at`` of each window (where ``present``): null if the window is empty or it is null."""
    picked, found = np.zeros(len(at)), np.zeros(len(at), bool)
    rows = order[at[present]]
    picked[present], found[present] = values[rows], valid[rows]
    return pa.array(picked, pa.float64(), mask=~found)


def _folded_sums(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each window's left fold ``((0.0 + v1) + v2) + ...`` in IEEE doubles (``aggregate(values, 0.0, (a, x) -> a + x)``).

    Windows of up to :data:`_FOLD_COLUMNS` values add their j-th value all at
    once, column by column; a longer window folds alone (``cumsum`` adds in
    order, never pairwise).
    """
    counts = np.diff(offsets)
    sums = np.zeros(len(counts))
    starts = offsets[:-1]
    short = np.flatnonzero(counts <= _FOLD_COLUMNS)
    short = short[np.argsort(-counts[short], kind="stable")]  # longest first: those with a j-th value are a prefix
    lengths = counts[short]
    for j in range(int(lengths[0]) if len(short) else 0):
        active = short[: int(np.count_nonzero(lengths > j))]
        sums[active] = sums[active] + values[starts[active] + j]
    for w in np.flatnonzero(counts > _FOLD_COLUMNS):
        sums[w] = np.cumsum(np.concatenate([[0.0], values[starts[w] : offsets[w + 1]]]))[-1]
    return sums


# -- Arrow and NumPy ------------------------------------------------------------------------------------------


def _changes(spec: StateSpec, columns: dict[str, Any]) -> pa.Table:
    """State changes in the table's columns (key columns, key group, values, ``_deleted``)."""
    schema = pa.schema([f for f in spec.arrow_schema() if f.name not in (UPDATED_AT, EPOCH)])
    return pa.table({f.name: columns[f.name] for f in schema}).cast(schema)


def _array(column: pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks()


def _timestamps(us: np.ndarray) -> pa.Array:
    return pa.array(us, pa.int64()).cast(_TIMESTAMP)


def _indices(rows: np.ndarray) -> pa.Array:
    return pa.array(rows, pa.int64())


def _ints(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), np.int64)


def _bools(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), bool)
