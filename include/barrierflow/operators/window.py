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
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa

from barrierflow.errors import PipelineDefinitionError
from barrierflow.operators.aggregate import Aggregation
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
