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
   window declares one, else it is dropped and the number dropped is logged.
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
   gaps and islands (window functions over their union, sorted by start).
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

The chained form (:mod:`barrierflow.execution.chained_region`: a small epoch's front in
one Python task) follows the same steps on Arrow tables and gives the same
rows, values and state: it reads every live window and keeps those the
Spark path's pruned read would (the key groups the epoch's records touch,
and the windows the watermark reaches; the others change nothing), and folds
each window's values in arrival order as :meth:`Aggregation.result` does
(:func:`_chained_results`). A window runs on Spark instead with a
percentile or another aggregation the chained form does not compute, a key
that is not a string or a long (Spark's key group), a time column that is not
a UTC timestamp or a value column that is not a number; and the whole epoch
does when a key, timestamp or arrival position is null, or when late records
would be dropped without a side output (the Spark path logs their number on
the driver).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.aggregate import Aggregation, Avg, Count, Max, Min, Sum
from barrierflow.operators.base import Node, key_group_column, position_columns, position_order, user_columns
from barrierflow.state.spec import KEY_GROUP, DueRows, StateSpec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

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

_log = logging.getLogger(__name__)

_ONE_US = timedelta(microseconds=1)
# The value one session element keeps: its arrival and the aggregated column.
_SESSION_VALUE = pa.struct([pa.field("epoch", pa.int64()), pa.field("position", pa.int64()), pa.field("value", pa.float64())])
_TIMESTAMP = pa.timestamp("us", tz="UTC")
# The chained form: aggregations whose window result it computes as Spark does
# (_chained_results), key types whose key group it computes (chaining.spark_key_groups),
# value columns whose cast to double it makes as Spark does.
_CHAINED_AGGREGATIONS = (Count, Sum, Min, Max, Avg)
_CHAINED_KEY_TYPES = (pa.string(), pa.int64())
_CHAINED_VALUE_TYPES = (pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.float32(), pa.float64())
# Sizes, gaps and lateness beyond this are left to Spark: with any timestamp Spark holds
# (years 1 to 9999, below 2**58 microseconds), window bounds then never overflow a long.
_CHAINED_MAX_SPAN_US = 2**61


def _micros(what: str, value: Any, *, positive: bool) -> int:
    """``value`` (a timedelta) in whole microseconds; refuses what no window can use."""
    if not isinstance(value, timedelta):
        raise PipelineDefinitionError(f"{what} must be a datetime.timedelta, got {value!r}")
    us = value // _ONE_US  # exact integer arithmetic (no float seconds)
    if positive and us <= 0:
        raise PipelineDefinitionError(f"{what} must be a positive timedelta, got {value!r}")
    if not positive and us < 0:
        raise PipelineDefinitionError(f"{what} must be zero or a positive timedelta, got {value!r}")
    return us


def _check_time_column(what: str, column: Any) -> None:
    if not isinstance(column, str) or not column:
        raise PipelineDefinitionError(f"{what}: time_column must be a column name, got {column!r}")


class WindowAssigner:
    """Which event-time windows a record belongs to (step 1 of the module docstring)."""

    time_column: str
    kind: ClassVar[str]

    def windows(self, ts_us: int) -> list[tuple[int, int]]:
        """The ``(start_us, end_us)`` windows of a record at ``ts_us`` (before any merge), latest start first."""
        raise NotImplementedError


@dataclass(frozen=True)
class TumblingEventTimeWindows(WindowAssigner):
    size: timedelta
    time_column: str = "ts"

    kind: ClassVar[str] = "tumbling"

    def __post_init__(self) -> None:
        _micros("tumbling window size", self.size, positive=True)
        _check_time_column("tumbling window", self.time_column)

    @classmethod
    def of(cls, size: timedelta, time_column: str = "ts") -> "TumblingEventTimeWindows":
        return cls(size, time_column)

    @property
    def size_us(self) -> int:
        return self.size // _ONE_US

    @property
    def slide_us(self) -> int:
        return self.size_us

    def windows(self, ts_us: int) -> list[tuple[int, int]]:
        start = ts_us - ts_us % self.size_us  # Python's % is a floor modulo, as Spark's pmod
        return [(start, start + self.size_us)]


@dataclass(frozen=True)
class SlidingEventTimeWindows(WindowAssigner):
    size: timedelta
    slide: timedelta
    time_column: str = "ts"

    kind: ClassVar[str] = "sliding"

    def __post_init__(self) -> None:
        size = _micros("sliding window size", self.size, positive=True)
        slide = _micros("sliding window slide", self.slide, positive=True)
        if slide > size:
            raise PipelineDefinitionError(
                f"sliding window slide {self.slide} is larger than its size {self.size}: records between two windows "
                "would belong to none; give a slide at most the size (equal: tumbling windows)"
            )
        _check_time_column("sliding window", self.time_column)

    @classmethod
    def of(cls, size: timedelta, slide: timedelta, time_column: str = "ts") -> "SlidingEventTimeWindows":
        return cls(size, slide, time_column)

    @property
    def size_us(self) -> int:
        return self.size // _ONE_US

    @property
    def slide_us(self) -> int:
        return self.slide // _ONE_US

    @property
    def windows_per_record(self) -> int:
        return math.ceil(self.size_us / self.slide_us)

    def windows(self, ts_us: int) -> list[tuple[int, int]]:
        last = ts_us - ts_us % self.slide_us
        starts = [last - k * self.slide_us for k in range(self.windows_per_record)]
        return [(s, s + self.size_us) for s in starts if s + self.size_us > ts_us]


@dataclass(frozen=True)
class EventTimeSessionWindows(WindowAssigner):
    gap: timedelta
    time_column: str = "ts"

    kind: ClassVar[str] = "session"

    def __post_init__(self) -> None:
        _micros("session window gap", self.gap, positive=True)
        _check_time_column("session window", self.time_column)

    @classmethod
    def with_gap(cls, gap: timedelta, time_column: str = "ts") -> "EventTimeSessionWindows":
        return cls(gap, time_column)

    @property
    def gap_us(self) -> int:
        return self.gap // _ONE_US

    def windows(self, ts_us: int) -> list[tuple[int, int]]:
        return [(ts_us, ts_us + self.gap_us)]


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
        columns = {a.value_column for a in self.aggregations if a.value_column is not None}
        if len(columns) > 1:
            raise PipelineDefinitionError(
                f"window {self.operator_id}: all aggregations must read the same column, got {sorted(columns, key=str)}"
            )
        _micros(f"window {self.operator_id}: allowed_lateness", self.allowed_lateness, positive=False)

    @property
    def lateness_us(self) -> int:
        return self.allowed_lateness // _ONE_US

    @property
    def value_column(self) -> str | None:
        return next((a.value_column for a in self.aggregations if a.value_column is not None), None)

    def extra_output_columns(self) -> tuple[str, ...]:
        """Columns beyond key, window bounds and aggregates (step 6): none with L = 0, so outputs stay as they were."""
        return ("is_update",) if self.lateness_us > 0 else ()

    def side_outputs(self) -> list[str]:
        return [self.late_output] if self.late_output else []

    def _value(self) -> "Column":
        from pyspark.sql import functions as F

        return F.col(self.value_column).cast("double") if self.value_column else F.lit(0.0)

    def _split_late(self, ctx: Any, windowed: "DataFrame", user: list[str]) -> "DataFrame":
        """Step 2: late records (``_late``) to the side output, or dropped and counted; returns the others."""
        from pyspark.sql import functions as F

        if self.late_output:  # emitted every epoch, empty or not: the side output's table exists from the first
            windowed = ctx.persist(windowed)
            ctx.emit(self.late_output, windowed.where("_late").select(*user))
        elif ctx.watermark_prev_us is not None:  # before the first watermark nothing is late
            windowed = ctx.persist(windowed)
            dropped = windowed.where("_late").count()  # a job on the cached rows; the drop is never silent
            if dropped:
                _log.warning(
                    "epoch %d: window %s dropped %d late record(s) (no late_output declared)", ctx.epoch, self.operator_id, dropped
                )
        return windowed.where(~F.col("_late")).drop("_late")

    def _firing(self, ctx: Any, end_us: "Column", touched: "Column", fired: "Column") -> tuple["Column", "Column"]:
        """Steps 4-5: whether a window fires, whether its state is purged (W(n) unknown: neither)."""
        from pyspark.sql import functions as F

        wm = ctx.watermark_us
        if wm is None:
            return F.lit(False), F.lit(False)
        fires = (end_us <= F.lit(wm)) & (touched | ~fired)
        purged = end_us + F.lit(self.lateness_us) <= F.lit(wm)
        return fires, purged

    def _due(self, ctx: Any, shortest_us: int) -> DueRows | None:
        """The stored windows the watermark reaches this epoch: a window at least ``shortest_us`` long fires
        or is purged only when it ends at or before W(n), so it starts at or before W(n) - ``shortest_us``."""
        wm = ctx.watermark_us
        return None if wm is None else DueRows("window_start", wm - shortest_us)

    def _spec(self, key_types: dict[str, pa.DataType] | None = None) -> StateSpec:
        raise NotImplementedError

    def state_specs(self) -> list[StateSpec]:
        return [self._spec()]

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
                pa.field("window_start", pa.timestamp("us", tz="UTC")),
            ),
            value_fields=tuple(values),
        )

    def _results(self, values: "Column") -> list["Column"]:
        """Each aggregation over ``values`` (an array in arrival order), unnamed."""
        from pyspark.sql import functions as F

        return [a.result(values, F.size(values)) for a in self.aggregations]

    # -- the chained form (the module docstring's last paragraph)

    def _chained_output(self, schema: pa.Schema, time_column: str, span_us: int) -> pa.Schema | None:
        """The output's schema as the Spark path's frame has it; None where the chained form declines this configuration.

        ``span_us``: how far a window reaches past a record's timestamp (its size or gap).
        """
        if any(type(a) not in _CHAINED_AGGREGATIONS for a in self.aggregations):
            return None
        if any(k not in schema.names or schema.field(k).type not in _CHAINED_KEY_TYPES for k in self.key):
            return None
        if time_column not in schema.names or schema.field(time_column).type != _TIMESTAMP or "_seq" not in schema.names:
            return None
        value = self.value_column
        if value is not None and (value not in schema.names or schema.field(value).type not in _CHAINED_VALUE_TYPES):
            return None
        if span_us + self.lateness_us > _CHAINED_MAX_SPAN_US:
            return None
        results = [pa.field(a.name, pa.int64() if isinstance(a, Count) else pa.float64()) for a in self.aggregations]
        return pa.schema(
            [
                *(schema.field(k) for k in self.key),
                pa.field("window_start", _TIMESTAMP),
                pa.field("window_end", _TIMESTAMP),
                *results,
                *(pa.field(c, pa.bool_()) for c in self.extra_output_columns()),
            ]
        )

    def chained_state_specs(self, inputs: Sequence[pa.Schema]) -> list[StateSpec]:
        (schema,) = inputs
        return [self._spec({k: schema.field(k).type for k in self.key})]

    def chained_side_outputs(self, inputs: Sequence[pa.Schema]) -> dict[str, pa.Schema]:
        """Step 2's side output: the records' user columns, as :meth:`_split_late` emits them."""
        (schema,) = inputs
        return {self.late_output: pa.schema([f for f in schema if not f.name.startswith("_")])} if self.late_output else {}

    def _chained_times(self, records: pa.Table, time_column: str) -> np.ndarray:
        """Each record's timestamp in microseconds (``unix_micros``); declines a null key, timestamp or position."""
        from barrierflow.execution.chained_region import RegionDeclined

        for name in (*self.key, time_column, *position_columns(records.column_names)):
            if records[name].null_count:
                raise RegionDeclined(f"window {self.operator_id}: a record with a null {name}")
        return np.asarray(records[time_column].cast(pa.int64()).to_numpy(), dtype=np.int64)

    def _chained_values(self, records: pa.Table) -> pa.Array:
        """Each record's value as a double, as :meth:`_value` casts it (0.0 for a count alone)."""
        if self.value_column is None:
            return pa.array(np.zeros(records.num_rows), pa.float64())
        return records[self.value_column].cast(pa.float64(), safe=False).combine_chunks()

    def _chained_split_late(self, task: Any, records: pa.Table, late: np.ndarray) -> pa.Table:
        """Step 2 as :meth:`_split_late`: late records' user columns to the side output; returns the others.

        Late records dropped without a side output are declined: the Spark
        path logs how many on the driver, which a task cannot.
        """
        from barrierflow.execution.chained_region import RegionDeclined

        mask = pa.array(late, pa.bool_())
        if self.late_output:
            task.emit(self.late_output, records.filter(mask).select([c for c in records.column_names if not c.startswith("_")]))
        elif late.any():
            raise RegionDeclined(f"window {self.operator_id}: {int(late.sum())} late record(s) to drop and log")
        return records.filter(pc.invert(mask))

    def _chained_firing(
        self, task: Any, end_us: np.ndarray, touched: np.ndarray, fired: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Steps 4-5 as :meth:`_firing`: whether each window fires, whether its state is purged."""
        wm = task.watermark_us
        if wm is None:
            return np.zeros(len(end_us), bool), np.zeros(len(end_us), bool)
        return (end_us <= wm) & (touched | ~fired), end_us + self.lateness_us <= wm

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

    def _spec(self, key_types: dict[str, pa.DataType] | None = None) -> StateSpec:
        return self._state_spec("pending_windows", [pa.field("window_values", pa.list_(pa.float64()))], key_types)

    def apply(self, ctx: Any, df: "DataFrame") -> "DataFrame":
        """Steps 1-7 of the module docstring; returns the fired windows (executors write them and the state changes)."""
        from pyspark.sql import functions as F

        spec = self._spec(ctx.arrow_types(df, self.key))
        size, slide, lateness = self.assigner.size_us, self.assigner.slide_us, self.lateness_us
        ts_us = F.unix_micros(F.col(self.assigner.time_column))
        # Step 1. The latest window's start; a sliding record also belongs to
        # the ones before it that still hold its timestamp.
        last_start = ts_us - F.pmod(ts_us, F.lit(slide))
        windowed = df.withColumn("_start_us", last_start)
        # Step 2. A record is late when its latest window is.
        prev_wm = ctx.watermark_prev_us
        is_late = (F.col("_start_us") + F.lit(size + lateness)) <= F.lit(prev_wm) if prev_wm is not None else F.lit(False)
        on_time = self._split_late(ctx, windowed.withColumn("_late", is_late), user_columns(df))
        if slide != size:
            count = -(-size // slide)  # windows per record at most: ceil(size / slide)
            starts = F.sequence(F.col("_start_us") - F.lit((count - 1) * slide), F.col("_start_us"), F.lit(slide))
            floor = ts_us - F.lit(size)  # a window holds ts while start > ts - size
            if prev_wm is not None:  # and is not late itself (step 2)
                floor = F.greatest(floor, F.lit(prev_wm - size - lateness))
            on_time = on_time.withColumn("_start_us", F.explode(F.filter(starts, lambda s: s > floor)))
        # Step 3.
        epoch_windows = on_time.groupBy(*self.key, "_start_us").agg(
            F.array_sort(F.collect_list(F.struct(*position_columns(df.columns), self._value().alias("v")))).alias("_vals")
        ).select(
            *self.key,
            F.timestamp_micros("_start_us").alias("window_start"),
            F.col("_vals.v").alias("_new_values"),
        )
        # The pending windows this epoch may change: those of the key groups its
        # records touch, and those the watermark fires or purges (end <= W(n)), touched or not.
        groups = on_time.select(key_group_column(self.key, ctx.key_groups).alias(KEY_GROUP))
        stored = ctx.state.read(spec, groups, due=self._due(ctx, size))
        fired_before = F.col("fired") if lateness > 0 else F.lit(False)
        pending = stored.select(*self.key, "window_start", F.col("window_values").alias("_old_values"), fired_before.alias("_fired"))
        keys = [*self.key, "window_start"]
        merged = pending.join(epoch_windows, on=keys, how="full_outer").withColumn(
            "window_values", F.concat(F.coalesce("_old_values", F.array()), F.coalesce("_new_values", F.array()))
        )
        window_end = F.timestamp_micros(F.unix_micros(F.col("window_start")) + F.lit(size))
        merged = merged.withColumn("window_end", window_end)
        touched = F.col("_new_values").isNotNull()
        fired = F.coalesce(F.col("_fired"), F.lit(False))
        # Steps 4-5.
        fires, purged = self._firing(ctx, F.unix_micros(F.col("window_end")), touched, fired)
        merged = merged.withColumn("_fires", fires).withColumn("_purged", purged)
        # Step 7. A state change: new values, a first firing (kept, with L > 0)
        # or a purge (a tombstone), never for a window never stored and purged.
        fires, purged = F.col("_fires"), F.col("_purged")
        changed = (touched | fires | purged) & (F.col("_old_values").isNotNull() | ~purged)
        state_values = [F.col("window_values")]
        if lateness > 0:
            state_values.append((fired | fires).alias("fired"))
        outputs = [F.col("window_end"), *[r.alias(a.name) for a, r in zip(self.aggregations, self._results(F.col("window_values")))]]
        if lateness > 0:  # step 6
            outputs.append((fires & fired).alias("is_update"))
        # Computed once (cached on the executors): the state changes and the
        # fired windows are both written from it.
        rows = ctx.persist(
            merged.where(changed | fires).select(
                *keys,
                key_group_column(self.key, ctx.key_groups).alias(KEY_GROUP),
                *state_values,
                purged.alias("_deleted"),
                changed.alias("_changed"),
                fires.alias("_fires"),
                *outputs,
            )
        )
        ctx.state.stage(spec, rows.where("_changed"))
        names = [*self.key, "window_start", "window_end", *[a.name for a in self.aggregations], *self.extra_output_columns()]
        return ctx.cached_view(rows.where("_fires").select(*names))

    def chained_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema | None:
        (schema,) = inputs
        return self._chained_output(schema, self.assigner.time_column, self.assigner.size_us)

    def apply_chained(self, task: Any, inputs: Sequence[pa.Table]) -> pa.Table:
        """:meth:`apply` in one task: steps 1-7 of the module docstring on Arrow tables."""
        (records,) = inputs
        [spec] = self.chained_state_specs([records.schema])
        key = list(self.key)
        size, slide, lateness = self.assigner.size_us, self.assigner.slide_us, self.lateness_us
        wm_prev, wm = task.watermark_prev_us, task.watermark_us
        # Step 1. The latest window's start (numpy's % is a floor modulo, as Spark's pmod).
        ts = self._chained_times(records, self.assigner.time_column)
        last = ts - ts % slide
        # Step 2. A record is late when its latest window is.
        late = last + (size + lateness) <= wm_prev if wm_prev is not None else np.zeros(len(ts), bool)
        on_time = self._chained_split_late(task, records, late)
        ts, last = ts[~late], last[~late]
        n = on_time.num_rows
        if slide != size:  # every window that holds ts (start > ts - size) and is not late itself
            count = -(-size // slide)
            floor = ts - size if wm_prev is None else np.maximum(ts - size, wm_prev - size - lateness)
            rows = np.repeat(np.arange(n), count)
            starts = np.repeat(last, count) - np.tile(np.arange(count, dtype=np.int64) * slide, n)
            keep = starts > floor[rows]
            rows, starts = rows[keep], starts[keep]
        else:
            rows, starts = np.arange(n), last
        # Step 3. The epoch's windows, each with its values in arrival order.
        positions = position_columns(on_time.column_names)
        groups = task.key_groups_of(on_time.select(key))
        exploded = (
            on_time.select([*key, *positions])
            .take(_indices(rows))
            .append_column("_start", pa.array(starts, pa.int64()))
            .append_column("_value", self._chained_values(on_time).take(_indices(rows)))
            .append_column(KEY_GROUP, groups.take(_indices(rows)))
            .sort_by([(c, "ascending") for c in [*key, "_start", *positions]])
        )
        firsts = np.flatnonzero(_segment_starts(exploded, [*key, "_start"]))
        new_offsets = np.append(firsts, exploded.num_rows)
        epoch_windows = exploded.select([*key, "_start", KEY_GROUP]).take(_indices(firsts))
        epoch_windows = epoch_windows.append_column("_new", pa.array(np.arange(len(firsts)), pa.int64()))
        # The pending windows this epoch may change: those of the key groups its records
        # touch and those the watermark reaches (the Spark path's pruned read; no other changes).
        stored = task.every_live_row(spec)
        relevant = pc.is_in(stored[KEY_GROUP], value_set=pc.unique(groups))
        if wm is not None:
            relevant = pc.or_(relevant, pc.less_equal(stored["window_start"].cast(pa.int64()), wm - size))
        stored = stored.filter(relevant)
        pending = stored.select(key).append_column("_start", stored["window_start"].cast(pa.int64()))
        pending = pending.append_column("_old", pa.array(np.arange(stored.num_rows), pa.int64()))
        merged = pending.join(epoch_windows, keys=[*key, "_start"], join_type="full outer")
        merged = merged.sort_by([(c, "ascending") for c in [*key, "_start"]])
        has_old, touched = _bools(pc.is_valid(merged["_old"])), _bools(pc.is_valid(merged["_new"]))
        old = _ints(pc.fill_null(merged["_old"], 0))[has_old]
        new = _ints(pc.fill_null(merged["_new"], 0))[touched]
        key_group = np.zeros(merged.num_rows, np.int32)
        key_group[has_old] = _ints(stored[KEY_GROUP].take(_indices(old)))
        key_group[touched] = _ints(merged[KEY_GROUP].filter(pa.array(touched)))
        fired = np.zeros(merged.num_rows, bool)
        if lateness > 0:
            fired[has_old] = _bools(pc.fill_null(stored["fired"].take(_indices(old)), False))
        # concat(stored values, the epoch's values).
        old_lists = stored["window_values"].combine_chunks().take(_indices(old))
        old_parents = np.flatnonzero(has_old)[_ints(pc.list_parent_indices(old_lists))]
        new_parents, new_elements = _spans(np.flatnonzero(touched), new_offsets[new], new_offsets[new + 1])
        parents = np.concatenate([old_parents, new_parents])
        part = np.concatenate([np.zeros(len(old_parents), np.int64), np.ones(len(new_parents), np.int64)])
        new_values = exploded["_value"].combine_chunks().take(_indices(new_elements))
        elements = pa.concat_arrays([pc.list_flatten(old_lists), new_values])
        offsets, values = _lists(merged.num_rows, parents, [part, np.arange(len(parents))], elements)
        window_values = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)
        start = _ints(merged["_start"])
        end = start + size
        # Steps 4-5.
        fires, purged = self._chained_firing(task, end, touched, fired)
        # Step 7. A state change: new values, a first firing (kept, with L > 0)
        # or a purge (a tombstone), never for a window never stored and purged.
        changed = _indices(np.flatnonzero((touched | fires | purged) & (has_old | ~purged)))
        state: dict[str, Any] = {k: merged[k].take(changed) for k in key}
        state["window_start"] = _timestamps(start[changed])
        state[KEY_GROUP] = pa.array(key_group[changed], pa.int32())
        state["window_values"] = window_values.take(changed)
        if lateness > 0:
            state["fired"] = pa.array((fired | fires)[changed], pa.bool_())
        state["_deleted"] = pa.array(purged[changed], pa.bool_())
        task.stage(spec, pa.table(state))
        # Steps 4 and 6.
        firing = np.flatnonzero(fires)
        out: dict[str, Any] = {k: merged[k].take(_indices(firing)) for k in key}
        out["window_start"], out["window_end"] = _timestamps(start[firing]), _timestamps(end[firing])
        out.update(zip((a.name for a in self.aggregations), _chained_results(self.aggregations, offsets, values, firing)))
        if lateness > 0:
            out["is_update"] = pa.array(fired[firing], pa.bool_())
        return pa.table(out)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "assigner": self.assigner.kind, "size_us": self.assigner.size_us, "slide_us": self.assigner.slide_us}


# The operator tumbling windows always had (kept for imports of it).
TumblingWindow = AlignedWindow


@dataclass
class SessionWindow(_Window):
    """Session windows: per key, sessions merged across epochs (steps 3 and 6 of the module docstring)."""

    assigner: EventTimeSessionWindows = EventTimeSessionWindows(timedelta(minutes=1))

    def extra_output_columns(self) -> tuple[str, ...]:
        return ("is_update", "retracted") if self.lateness_us > 0 else ()

    def _spec(self, key_types: dict[str, pa.DataType] | None = None) -> StateSpec:
        values = [pa.field("window_end", pa.timestamp("us", tz="UTC")), pa.field("window_values", pa.list_(_SESSION_VALUE))]
        return self._state_spec("sessions", values, key_types)

    def apply(self, ctx: Any, df: "DataFrame") -> "DataFrame":
        """Steps 1-7 of the module docstring for sessions; returns fired sessions and retractions."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_type

        spec = self._spec(ctx.arrow_types(df, self.key))
        gap, lateness = self.assigner.gap_us, self.lateness_us
        ts_us = F.unix_micros(F.col(self.assigner.time_column))
        # Step 1.
        windowed = df.withColumn("_start_us", ts_us)
        # Step 2. Lateness of the record's own window [ts, ts + gap).
        prev_wm = ctx.watermark_prev_us
        is_late = (F.col("_start_us") + F.lit(gap + lateness)) <= F.lit(prev_wm) if prev_wm is not None else F.lit(False)
        on_time = self._split_late(ctx, windowed.withColumn("_late", is_late), user_columns(df))
        # Step 3. Each record a one-value window, tagged with its arrival: its
        # rank among its key's records of the epoch (positions are unique).
        rank = F.row_number().over(Window.partitionBy(*self.key).orderBy(*position_order(df.columns)))
        value = F.struct(F.lit(ctx.epoch).cast("long").alias("epoch"), rank.cast("long").alias("position"), self._value().alias("value"))
        records = on_time.select(
            *self.key,
            "_start_us",
            (F.col("_start_us") + F.lit(gap)).alias("_end_us"),
            F.array(value).alias("_values"),
            F.lit(False).alias("_stored"),
            F.lit(False).alias("_fired"),
            rank.cast("long").alias("_tie"),
        )
        # The stored sessions this epoch may change: those of the key groups its records touch
        # (merging), and those the watermark fires or purges, touched or not (their end, and so
        # their start plus the gap, at or before W(n)).
        groups = on_time.select(key_group_column(self.key, ctx.key_groups).alias(KEY_GROUP))
        stored = ctx.state.read(spec, groups, due=self._due(ctx, gap)).select(
            *self.key,
            F.unix_micros("window_start").alias("_start_us"),
            F.unix_micros("window_end").alias("_end_us"),
            F.col("window_values").alias("_values"),
            F.lit(True).alias("_stored"),
            (F.coalesce(F.col("fired"), F.lit(False)) if lateness > 0 else F.lit(False)).alias("_fired"),
            F.lit(0).cast("long").alias("_tie"),
        )
        # Gaps and islands: sorted by start, a window opens a new session
        # when it starts after the end of every window before it (touching ones merge, as in Flink).
        by_start = Window.partitionBy(*self.key).orderBy("_start_us", "_end_us", "_tie")
        before = F.max("_end_us").over(by_start.rowsBetween(Window.unboundedPreceding, -1))
        opens = (before.isNull() | (F.col("_start_us") > before)).cast("long")
        islands = stored.unionByName(records).withColumn("_opens", opens).withColumn(
            "_island", F.sum("_opens").over(by_start.rowsBetween(Window.unboundedPreceding, Window.currentRow))
        )
        component = F.struct(F.col("_start_us").alias("start"), F.col("_end_us").alias("end"), F.col("_fired").alias("fired"))
        sessions = islands.groupBy(*self.key, "_island").agg(
            F.min("_start_us").alias("_start_us"),
            F.max("_end_us").alias("_end_us"),
            # Arrival order: (epoch, position) is unique per key, so the sort never compares values.
            F.array_sort(F.flatten(F.collect_list("_values"))).alias("window_values"),
            (F.max((~F.col("_stored")).cast("int")) > 0).alias("_touched"),
            F.collect_list(F.when(F.col("_stored"), component)).alias("_components"),
        )
        start = F.col("_start_us")
        same = F.filter("_components", lambda c: c["start"] == start)
        sessions = sessions.select(
            *self.key,
            "_start_us",
            "_end_us",
            "window_values",
            "_touched",
            (F.size(same) > 0).alias("_kept"),  # the stored session of this start, if any, is overwritten
            F.exists(same, lambda c: c["fired"]).alias("_fired"),
            F.filter("_components", lambda c: c["start"] != start).alias("_merged"),  # tombstoned (step 7)
        )
        # Steps 4-5.
        fires, purged = self._firing(ctx, F.col("_end_us"), F.col("_touched"), F.col("_fired"))
        sessions = ctx.persist(sessions.withColumn("_fires", fires).withColumn("_purged", purged))
        touched, fired, fires, purged = F.col("_touched"), F.col("_fired"), F.col("_fires"), F.col("_purged")
        window_start = F.timestamp_micros(F.col("_start_us")).alias("window_start")
        window_end = F.timestamp_micros(F.col("_end_us")).alias("window_end")
        key_group = key_group_column(self.key, ctx.key_groups).alias(KEY_GROUP)
        # Step 7.
        changed = (touched | fires | purged) & (F.col("_kept") | ~purged)
        state_values = [window_end, F.col("window_values")]
        if lateness > 0:
            state_values.append((fired | fires).alias("fired"))
        updates = sessions.where(changed).select(*self.key, window_start, key_group, *state_values, purged.alias("_deleted"))
        gone = sessions.select(*self.key, F.explode("_merged").alias("_c"))
        tombstones = gone.select(
            *self.key,
            F.timestamp_micros(F.col("_c.start")).alias("window_start"),
            key_group,
            *[F.lit(None).cast(from_arrow_type(f.type)).alias(f.name) for f in spec.value_fields],
            F.lit(True).alias("_deleted"),
        )
        ctx.state.stage(spec, updates.unionByName(tombstones))
        # Steps 4 and 6.
        emitted = sessions.where(fires).select(
            *self.key, "_start_us", "_end_us", F.col("window_values.value").alias("_v"), fired.alias("is_update"), F.lit(False).alias("retracted")
        )
        if lateness > 0:
            retractions = gone.where(F.col("_c.fired")).select(
                *self.key,
                F.col("_c.start").alias("_start_us"),
                F.col("_c.end").alias("_end_us"),
                F.lit(None).cast("array<double>").alias("_v"),
                F.lit(True).alias("is_update"),
                F.lit(True).alias("retracted"),
            )
            emitted = emitted.unionByName(retractions)
        results = [F.when(~F.col("retracted"), r).alias(a.name) for a, r in zip(self.aggregations, self._results(F.col("_v")))]
        out = emitted.select(*self.key, window_start, window_end, *results, *self.extra_output_columns())
        return ctx.cached_view(out)

    def chained_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema | None:
        (schema,) = inputs
        return self._chained_output(schema, self.assigner.time_column, self.assigner.gap_us)

    def apply_chained(self, task: Any, inputs: Sequence[pa.Table]) -> pa.Table:
        """:meth:`apply` in one task: steps 1-7 of the module docstring for sessions, on Arrow tables."""
        (records,) = inputs
        [spec] = self.chained_state_specs([records.schema])
        key = list(self.key)
        gap, lateness, wm = self.assigner.gap_us, self.lateness_us, task.watermark_us
        # Step 1.
        ts = self._chained_times(records, self.assigner.time_column)
        # Step 2. Lateness of the record's own window [ts, ts + gap).
        late = ts + (gap + lateness) <= task.watermark_prev_us if task.watermark_prev_us is not None else np.zeros(len(ts), bool)
        on_time = self._chained_split_late(task, records, late)
        ts = ts[~late]
        n = on_time.num_rows
        # Step 3. Each record a one-value window, tagged with its arrival: its
        # rank among its key's records of the epoch (row_number by position).
        arrival = [*key, *position_columns(on_time.column_names)]
        by_arrival = pc.sort_indices(on_time, sort_keys=[(c, "ascending") for c in arrival])
        firsts = _segment_starts(on_time.select(key).take(by_arrival), key)
        rank = np.empty(n, np.int64)
        rank[_ints(by_arrival)] = np.arange(n) - np.maximum.accumulate(np.where(firsts, np.arange(n), 0)) + 1
        groups = task.key_groups_of(on_time.select(key))
        # The stored sessions this epoch may change: those of the key groups its records
        # touch and those the watermark reaches (the Spark path's pruned read; no other changes).
        stored = task.every_live_row(spec)
        relevant = pc.is_in(stored[KEY_GROUP], value_set=pc.unique(groups))
        if wm is not None:
            relevant = pc.or_(relevant, pc.less_equal(stored["window_end"].cast(pa.int64()), wm))
        stored = stored.filter(relevant)
        m = stored.num_rows
        # Gaps and islands: stored sessions and the epoch's windows of a key sorted by (start, end, tie).
        fired_before = _bools(pc.fill_null(stored["fired"], False)) if lateness > 0 else np.zeros(m, bool)
        stored_start, stored_end = _ints(stored["window_start"].cast(pa.int64())), _ints(stored["window_end"].cast(pa.int64()))
        stored_keys, untied = [stored[k] for k in key], np.zeros(m, np.int64)
        before = _session_windows(key, stored_keys, stored_start, stored_end, untied, True, fired_before, stored[KEY_GROUP])
        epoch_windows = _session_windows(key, [on_time[k] for k in key], ts, ts + gap, rank, False, np.zeros(n, bool), groups)
        windows = pa.concat_tables([before, epoch_windows]).sort_by([(c, "ascending") for c in [*key, "_start", "_end", "_tie"]])
        start, end, row = _ints(windows["_start"]), _ints(windows["_end"]), _ints(windows["_row"])
        is_stored, was_fired = _bools(windows["_stored"]), _bools(windows["_fired"])
        island, heads = _islands(_segment_starts(windows, key), start, end)
        session_start, session_end = start[heads], np.maximum.reduceat(end, heads) if len(heads) else end[heads]
        touched = _any_of(~is_stored, heads)
        # The stored session of the island's start, if any, is overwritten; the others merged into it are tombstoned.
        own = is_stored & (start == session_start[island])
        kept, fired = _any_of(own, heads), _any_of(own & was_fired, heads)
        merged = np.flatnonzero(is_stored & ~own)
        # Steps 4-5.
        fires, purged = self._chained_firing(task, session_end, touched, fired)
        changed = np.flatnonzero((touched | fires | purged) & (kept | ~purged))
        # The values of the sessions that change or fire, in arrival order ((epoch, position) is unique per key).
        wanted = np.zeros(len(heads), bool)
        wanted[changed] = True
        wanted[fires] = True
        from_stored = np.flatnonzero(is_stored & wanted[island])
        from_epoch = np.flatnonzero(~is_stored & wanted[island])
        stored_lists = stored["window_values"].combine_chunks().take(_indices(row[from_stored]))
        epoch_rows = _indices(row[from_epoch])
        epoch_values = pa.StructArray.from_arrays(
            [
                pa.repeat(pa.scalar(task.epoch, pa.int64()), len(epoch_rows)),
                pa.array(rank).take(epoch_rows),
                self._chained_values(on_time).take(epoch_rows),
            ],
            fields=list(_SESSION_VALUE),
        )
        elements = pa.concat_arrays([pc.list_flatten(stored_lists).cast(_SESSION_VALUE), epoch_values])
        parents = np.concatenate([island[from_stored][_ints(pc.list_parent_indices(stored_lists))], island[from_epoch]])
        arrivals = [_ints(elements.field("epoch")), _ints(elements.field("position"))]
        offsets, values = _lists(len(heads), parents, arrivals, elements)
        window_values = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)
        sessions = windows.select([*key, KEY_GROUP]).take(_indices(heads))
        # Step 7. The changed sessions, and the tombstones of those merged into another.
        updates: dict[str, Any] = {k: sessions[k].take(_indices(changed)) for k in key}
        updates["window_start"] = _timestamps(session_start[changed])
        updates[KEY_GROUP] = sessions[KEY_GROUP].take(_indices(changed))
        updates["window_end"] = _timestamps(session_end[changed])
        updates["window_values"] = window_values.take(_indices(changed))
        if lateness > 0:
            updates["fired"] = pa.array((fired | fires)[changed], pa.bool_())
        updates["_deleted"] = pa.array(purged[changed], pa.bool_())
        tombstones: dict[str, Any] = {k: windows[k].take(_indices(merged)) for k in key}
        tombstones["window_start"] = _timestamps(start[merged])
        tombstones[KEY_GROUP] = windows[KEY_GROUP].take(_indices(merged))
        tombstones.update((f.name, pa.nulls(len(merged), f.type)) for f in spec.value_fields)
        tombstones["_deleted"] = pa.repeat(pa.scalar(True), len(merged))
        changes = pa.schema([f for f in spec.arrow_schema() if f.name not in ("_updated_at_ms", "_epoch")])
        task.stage(spec, pa.concat_tables([pa.table(updates).cast(changes), pa.table(tombstones).cast(changes)]))
        # Steps 4 and 6: the fired sessions, then (with L > 0) the retractions of fired sessions merged into another.
        firing = np.flatnonzero(fires)
        out: dict[str, Any] = {k: sessions[k].take(_indices(firing)) for k in key}
        out["window_start"], out["window_end"] = _timestamps(session_start[firing]), _timestamps(session_end[firing])
        results = _chained_results(self.aggregations, offsets, values.field("value"), firing)
        out.update(zip((a.name for a in self.aggregations), results))
        if lateness == 0:
            return pa.table(out)
        out["is_update"] = pa.array(fired[firing], pa.bool_())
        out["retracted"] = pa.repeat(pa.scalar(False), len(firing))
        emitted = pa.table(out)
        retracted = merged[was_fired[merged]]
        retractions: dict[str, Any] = {k: windows[k].take(_indices(retracted)) for k in key}
        retractions["window_start"], retractions["window_end"] = _timestamps(start[retracted]), _timestamps(end[retracted])
        retractions.update((a.name, pa.nulls(len(retracted), emitted.schema.field(a.name).type)) for a in self.aggregations)
        retractions["is_update"] = retractions["retracted"] = pa.repeat(pa.scalar(True), len(retracted))
        return pa.concat_tables([emitted, pa.table(retractions).cast(emitted.schema)])

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "assigner": self.assigner.kind, "gap_us": self.assigner.gap_us}


def _session_windows(
    key: list[str],
    keys: list[Any],
    start: np.ndarray,
    end: np.ndarray,
    tie: np.ndarray,
    stored: bool,
    fired: np.ndarray,
    key_group: Any,
) -> pa.Table:
    """Windows for the gaps and islands of :meth:`SessionWindow.apply_chained`, ``_row`` their index in their own table."""
    n = len(start)
    columns = dict(zip(key, keys))
    columns.update(
        {
            "_start": pa.array(start, pa.int64()),
            "_end": pa.array(end, pa.int64()),
            "_tie": pa.array(tie, pa.int64()),
            "_stored": pa.array(np.full(n, stored), pa.bool_()),
            "_fired": pa.array(fired, pa.bool_()),
            KEY_GROUP: key_group,
            "_row": pa.array(np.arange(n), pa.int64()),
        }
    )
    return pa.table(columns)


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


def _segment_starts(table: pa.Table, columns: list[str]) -> np.ndarray:
    """Whether each row of ``table`` (sorted by ``columns`` first, none null) starts a new value of ``columns``."""
    n = table.num_rows
    starts = np.ones(n, bool)
    if n > 1:
        differs = np.zeros(n - 1, bool)
        for c in columns:
            column = table[c].combine_chunks()
            differs |= np.asarray(pc.not_equal(column.slice(1), column.slice(0, n - 1)).to_numpy(zero_copy_only=False), bool)
        starts[1:] = differs
    return starts


def _spans(parents: np.ndarray, begins: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The elements ``begins[i]:ends[i]`` of each span ``i``, in order: each one's ``parents[i]`` and its index."""
    lengths = ends - begins
    firsts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.repeat(parents, lengths), np.arange(int(lengths.sum()), dtype=np.int64) - firsts + np.repeat(begins, lengths)


def _lists(n: int, parents: np.ndarray, order: list[np.ndarray], elements: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """``n`` lists, element ``i`` of ``elements`` in list ``parents[i]``, each list sorted by ``order`` (keys,
    most significant first, that tell every two elements of a list apart): the lists' offsets and their elements."""
    sort = np.lexsort((*reversed(order), parents)) if len(parents) else np.zeros(0, np.int64)
    counts = np.bincount(parents, minlength=n) if len(parents) else np.zeros(n, np.int64)
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), elements.take(pa.array(sort, pa.int64()))


def _timestamps(us: np.ndarray) -> pa.Array:
    return pa.array(us, pa.int64()).cast(_TIMESTAMP)


def _indices(rows: np.ndarray) -> pa.Array:
    return pa.array(rows, pa.int64())


def _ints(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(values.to_numpy(), np.int64)


def _bools(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), bool)


def _less(x: float, y: float) -> bool:
    """Spark's order of doubles (``SQLOrderingUtil.compareDoubles``): NaN above every number, 0.0 and -0.0 equal."""
    return x != y and not math.isnan(x) and (math.isnan(y) or x < y)


def _extreme(values: list[float | None], better: Callable[[float, float], bool]) -> float | None:
    """``array_min``/``array_max``: nulls skipped; a value replaces the one kept only if strictly better
    (the first of equal values stays)."""
    kept: float | None = None
    for x in values:
        if x is not None and (kept is None or better(x, kept)):
            kept = x
    return kept


def _folded_sum(values: list[float | None]) -> float | None:
    """``aggregate(values, 0.0, (acc, x) -> acc + x)``: IEEE additions in arrival order; a null makes it null."""
    total = 0.0
    for x in values:
        if x is None:
            return None
        total = total + x
    return total


def _chained_results(
    aggregations: tuple[Aggregation, ...], offsets: np.ndarray, values: pa.Array, windows: np.ndarray
) -> list[pa.Array]:
    """Each aggregation of the ``windows`` (indices; window ``w`` holds ``values[offsets[w]:offsets[w + 1]]``
    in arrival order) as :meth:`Aggregation.result` computes it in Spark, bit for bit."""
    held = values.to_pylist()
    lists = [held[offsets[w] : offsets[w + 1]] for w in windows]
    results: list[pa.Array] = []
    for a in aggregations:
        if isinstance(a, Count):  # size(values)
            results.append(pa.array([len(v) for v in lists], pa.int64()))
        elif isinstance(a, Sum):
            results.append(pa.array([_folded_sum(v) for v in lists], pa.float64()))
        elif isinstance(a, Avg):  # the folded sum over the count (a double division)
            sums = [_folded_sum(v) for v in lists]
            results.append(pa.array([None if s is None else s / len(v) for s, v in zip(sums, lists)], pa.float64()))
        elif isinstance(a, Min):
            results.append(pa.array([_extreme(v, _less) for v in lists], pa.float64()))
        elif isinstance(a, Max):
            results.append(pa.array([_extreme(v, lambda x, kept: _less(kept, x)) for v in lists], pa.float64()))
        else:
            raise AssertionError(f"{a!r} has no chained form")  # refused by _chained_output
    return results


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
