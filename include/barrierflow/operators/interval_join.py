"""Interval join of two keyed streams on event time, as Flink's ``IntervalJoin``.

``a.key_by("k").interval_join(b.key_by("k")).between(lower, upper, operator_id="j")``
joins a record ``l`` of ``a`` with a record ``r`` of ``b`` of the same key when
``l.ts + lower <= r.ts <= l.ts + upper`` (each bound inclusive unless
declared exclusive; an exclusive bound moves by one microsecond, the
timestamps' unit, as Flink's moves by one millisecond). Each side's event
time is the column of the watermark assigner upstream of it. Within epoch n,
with W(n-1) the watermark at its start and W(n) the one at its end:

1. Alignment: both inputs' records up to barrier n are joined in epoch n.
2. Late records: a record whose event time is before W(n-1) can no longer
   join, as Flink drops an element older than the watermark: it goes to the
   side's late output if declared, else it is dropped and counted in the
   log. So does a record with a null key or event time that reaches the
   join (JSON Lines sources make it a dead letter before).
3. Join: every other record of the epoch is paired with the other side's
   records of this epoch and with those kept in state; each pair is emitted
   once, in the epoch in which the later of its two records arrives. Which
   pairs join never depends on the order of records within an epoch, nor on
   parallelism: records of one epoch all see the watermark W(n-1).
4. State cleanup: a left record can join no record arriving later once
   W >= l.ts + upper (if upper > 0, else l.ts), a right record once
   W >= r.ts - lower (if lower < 0, else r.ts), Flink's cleanup times. At
   the end of the epoch, records whose cleanup time is at or below W(n) are
   deleted from state (or never stored); the others are kept in
   ``<operator_id>__left`` and ``<operator_id>__right``: key columns,
   ``record_epoch`` and ``record_index`` (the record's rank among its key's
   records of that epoch, ordered by content), ``event_time_us`` and the
   record as JSON. Staged with the epoch, kept by savepoints and
   redistributed by key group on rescale like all keyed state.
5. Watermark: the join's watermark is the minimum of its inputs': both
   inputs need a watermark assigner upstream, and with several assigners
   the pipeline's watermark is the minimum of theirs
   (:mod:`barrierflow.operators.watermark`).
6. Output: the first side's key columns, then the left record's other
   columns, then the right record's other columns (its key columns, equal
   to the left's, are left out); a column name on both sides becomes
   ``left_<name>`` and ``right_<name>``. Output rows carry no arrival
   position.

A small epoch may run the join in the chained region's task
(:mod:`barrierflow.execution.chained_region`, :meth:`IntervalJoin.apply_chained`):
the same rules on Arrow tables, with the buffers' records written as JSON
exactly as Spark writes them (:func:`~barrierflow.operators.join_buffer.record_json`;
any other epoch runs on Spark).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.join_buffer import (
    SIDES,
    TwoSidedJoin,
    chained_fresh_records,
    chained_key_types,
    chained_late_records,
    chained_output_schema,
    check_key_types,
    fresh_records,
    joined_rows,
    output_columns,
    record_schemas,
    record_values,
)
from barrierflow.state.spec import KEY_GROUP, DueRows, StateSpec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["IntervalBounds", "IntervalJoin"]

_ONE_US = timedelta(microseconds=1)


@dataclass(frozen=True)
class IntervalBounds:
    """``l.ts + lower <= r.ts <= l.ts + upper`` in microseconds, each bound inclusive unless stated."""

    lower_us: int
    upper_us: int
    lower_inclusive: bool = True
    upper_inclusive: bool = True

    @classmethod
    def of(cls, lower: timedelta, upper: timedelta, lower_inclusive: bool = True, upper_inclusive: bool = True) -> "IntervalBounds":
        for name, value in (("lower", lower), ("upper", upper)):
            if not isinstance(value, timedelta):
                raise PipelineDefinitionError(f"interval join: {name} bound must be a datetime.timedelta, got {value!r}")
        bounds = cls(lower // _ONE_US, upper // _ONE_US, lower_inclusive, upper_inclusive)
        if bounds.low > bounds.high:
            raise PipelineDefinitionError(
                f"interval join: lower bound {lower} must not be after upper bound {upper} (with exclusive bounds, "
                "strictly before); the interval of right timestamps a left record joins would be empty"
            )
        return bounds

    @property
    def low(self) -> int:
        """The smallest ``r.ts - l.ts`` that joins (an exclusive bound moves by one microsecond)."""
        return self.lower_us if self.lower_inclusive else self.lower_us + 1

    @property
    def high(self) -> int:
        return self.upper_us if self.upper_inclusive else self.upper_us - 1

    def joins(self, left_us: int, right_us: int) -> bool:
        """(3.) Whether records at these event times pair."""
        return self.low <= right_us - left_us <= self.high

    def cleanup_us(self, side: str, ts_us: int) -> int:
        """(4.) The watermark at which a record of ``side`` at ``ts_us`` leaves state."""
        if side == "left":
            return ts_us + self.high if self.high > 0 else ts_us
        return ts_us - self.low if self.low < 0 else ts_us


@dataclass
class IntervalJoin(TwoSidedJoin):
    """Joins ``parent`` keyed by ``key`` (left) with ``other`` keyed by ``other_key`` (right) within ``bounds``."""

    bounds: IntervalBounds = IntervalBounds(0, 0)

    def apply_inputs(self, ctx: Any, frames: Sequence["DataFrame"]) -> "DataFrame":
        from pyspark.sql import functions as F

        what = f"interval join {self.operator_id!r}"
        keys = (self.key, self.other_key)
        key_types = check_key_types(ctx, what, frames, keys, self.time_columns)
        specs = [self._spec(side, key_types) for side in SIDES]
        wp, wn = ctx.watermark_prev_us, ctx.watermark_us
        fresh = []
        for index, df in enumerate(frames):
            ts = F.col("_ts")
            late = ts.isNull() if wp is None else (ts.isNull() | (ts < F.lit(wp)))  # (2.)
            fresh.append(
                fresh_records(
                    ctx, what, df, self.key, keys[index], self.time_columns[index], late, self.late_outputs[index], SIDES[index]
                ).drop("_ts")
            )
        # Stored records pair with the epoch's records of their key (either side's), and
        # leave state when the watermark passes them, whether or not their key has records (4.).
        touched = fresh[0].select(KEY_GROUP).unionByName(fresh[1].select(KEY_GROUP))
        candidates = []
        for index, (new, spec) in enumerate(zip(fresh, specs)):
            stored = ctx.state.read(spec, touched, due=self._due(index, wn))
            candidates.append(ctx.persist(new.unionByName(stored.select(*new.columns[:-1], F.lit(False).alias("_new")))))

        # (3.) pairs with at least one record of this epoch
        left, right = (c.alias(side) for c, side in zip(candidates, SIDES))
        gap = F.col("right.event_time_us") - F.col("left.event_time_us")
        condition = [F.col(f"left.{k}") == F.col(f"right.{k}") for k in self.key] + [
            gap >= F.lit(self.bounds.low),
            gap <= F.lit(self.bounds.high),
            F.col("left._new") | F.col("right._new"),
        ]
        out = joined_rows(left.join(right, on=condition, how="inner"), self.key, (), record_schemas(frames), self.other_key)  # (6.)

        # (4.) state after the epoch: new records still joinable at W(n) added, stored ones no longer joinable deleted
        for index, (candidate, spec) in enumerate(zip(candidates, specs)):
            keep = F.lit(True) if wn is None else self._cleanup(index, F.col("event_time_us")) > F.lit(wn)
            changes = candidate.where((F.col("_new") & keep) | (~F.col("_new") & ~keep)).withColumn("_deleted", ~F.col("_new"))
            ctx.state.stage(spec, changes)
        return out

    def _due(self, index: int, watermark_us: int | None) -> DueRows | None:
        """(4.) The stored records of side ``index`` whose cleanup time W(n) reaches (:meth:`_cleanup`, inverted)."""
        if watermark_us is None:
            return None
        low, high = self.bounds.low, self.bounds.high
        shift = (high if high > 0 else 0) if index == 0 else (-low if low < 0 else 0)
        return DueRows("event_time_us", watermark_us - shift)

    def _cleanup(self, index: int, ts: "Column") -> "Column":
        """(4.) A record's cleanup time as a Spark expression (the same rule as :meth:`IntervalBounds.cleanup_us`)."""
        from pyspark.sql import functions as F

        low, high = self.bounds.low, self.bounds.high
        if index == 0:
            return ts + F.lit(high) if high > 0 else ts
        return ts - F.lit(low) if low < 0 else ts

    # -- the chained form (barrierflow.execution.chained_region): the same epoch on Arrow tables, in one task

    def chained_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema | None:
        if chained_key_types(inputs, (self.key, self.other_key), self.time_columns) is None:
            return None
        declared = [name for name in self.late_outputs if name]
        if len(set(declared)) != len(declared):
            return None  # both sides' late records in one table: left to Spark
        return chained_output_schema(inputs, self.key, self.other_key)  # (6.)

    def chained_state_specs(self, inputs: Sequence[pa.Schema]) -> list[StateSpec]:
        key_types = chained_key_types(inputs, (self.key, self.other_key), self.time_columns)
        return [self._spec(side, key_types) for side in SIDES]

    def chained_side_outputs(self, inputs: Sequence[pa.Schema]) -> dict[str, pa.Schema]:
        """(2.) Each declared late output: its side's user columns, as :func:`fresh_records` emits them.

        Nullable, as Spark's file sources read every column (a source's
        declared non-null columns are checked before, as dead letters).
        """
        return {
            name: pa.schema([f.with_nullable(True) for f in schema if not f.name.startswith("_")])
            for name, schema in zip(self.late_outputs, inputs)
            if name
        }

    def apply_chained(self, task: Any, inputs: Sequence[pa.Table]) -> pa.Table:
        """:meth:`apply_inputs` in one task: the same late records, pairs and buffer changes.

        Every check that may decline the epoch runs before anything is staged or emitted.
        """
        from barrierflow.execution.chained_region import RegionDeclined

        what = f"interval join {self.operator_id!r}"
        schemas = [t.schema for t in inputs]
        schema = self.chained_schema(schemas)
        assert schema is not None  # the region takes the join only with a chained form
        keys = (self.key, self.other_key)
        specs = self.chained_state_specs(schemas)
        wp, wn = task.watermark_prev_us, task.watermark_us
        fresh, late = [], []
        for index, records in enumerate(inputs):
            ts = records[self.time_columns[index]].cast(pa.int64())
            too_late = pc.is_null(ts) if wp is None else pc.or_kleene(pc.is_null(ts), pc.less(ts, wp))  # (2.)
            new, old = chained_fresh_records(task, records, self.key, keys[index], self.time_columns[index], too_late)
            fresh.append(new)
            late.append(old)
        # Each side's candidates: the epoch's records first, then every stored one (those of the
        # epoch's keys pair, those the watermark passes leave state, whatever their key (4.)).
        candidates = []
        for new, spec in zip(fresh, specs):
            columns = pa.schema([spec.arrow_schema().field(c) for c in (*spec.key_columns, KEY_GROUP, *spec.value_columns)])
            stored = task.every_live_row(spec).select(columns.names).cast(columns)
            candidates.append(pa.concat_tables([new.select(columns.names).cast(columns), stored]))
            if candidates[-1]["event_time_us"].null_count:
                raise RegionDeclined(f"{what}: a stored record without an event time")
        left_rows, right_rows = self._chained_pairs(candidates, [t.num_rows for t in fresh])
        # (6.) the key columns of the left record, then both records' columns as joined_rows reads them
        values = [
            _records_at(records, new, candidate, rows, [f for f in records.schema if not f.name.startswith("_")])
            for records, new, candidate, rows in zip(inputs, fresh, candidates, (left_rows, right_rows))
        ]
        users = [[n for n in t.column_names if not n.startswith("_")] for t in inputs]
        columns = output_columns(self.key, users[0], users[1], self.other_key)
        arrays = [candidates[0][k].take(pa.array(left_rows)) for k in self.key]
        arrays += [values[SIDES.index(side)][column] for side, column, _ in columns[len(self.key) :]]
        out = pa.Table.from_arrays([a.cast(f.type) for a, f in zip(arrays, schema)], schema=schema)
        # (4.) state after the epoch: new records still joinable at W(n) added, stored ones no longer joinable deleted
        changes = []
        for index, (new, candidate) in enumerate(zip(fresh, candidates)):
            is_new = np.arange(candidate.num_rows) < new.num_rows
            keep = np.ones(candidate.num_rows, dtype=bool)
            if wn is not None:
                cleanup = self._chained_cleanup(index, candidate["event_time_us"], what)
                keep = np.asarray(pc.greater(cleanup, wn).to_numpy(zero_copy_only=False), dtype=bool)
            changed = (is_new & keep) | (~is_new & ~keep)
            changes.append(candidate.filter(pa.array(changed)).append_column("_deleted", pa.array(~is_new[changed], pa.bool_())))
        for spec, change in zip(specs, changes):
            task.stage(spec, change)
        for index, rows in enumerate(late):
            chained_late_records(task, what, rows, self.late_outputs[index], SIDES[index])
        return out

    def _chained_pairs(self, candidates: Sequence[pa.Table], news: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(3.) The rows of the left and right candidates that pair, by left row then right row.

        Each side's candidates are its ``news`` records of the epoch, then its
        stored ones: a pair has the same key, ``low <= r.ts - l.ts <= high``,
        and at least one record of this epoch (stored pairs joined before).
        """
        from barrierflow.execution.chained_region import RegionDeclined

        key = list(self.key)
        left, right = candidates

        def numbered(rows: pa.Table, start: int, stop: int, name: str) -> pa.Table:
            numbers = pa.array(np.arange(start, stop, dtype=np.int64))
            return rows.select(key).slice(start, stop - start).append_column(name, numbers)

        def same_key(lefts: tuple[int, int], rights: tuple[int, int]) -> pa.Table:
            numbers = numbered(right, *rights, "_r")
            return numbered(left, *lefts, "_l").join(numbers, keys=key, join_type="inner", use_threads=False)

        # New left x every right, stored left x new right: never two stored records.
        halves = [same_key((0, news[0]), (0, right.num_rows)), same_key((news[0], left.num_rows), (0, news[1]))]
        lefts = np.concatenate([np.asarray(h["_l"].to_numpy(), dtype=np.int64) for h in halves])
        rights = np.concatenate([np.asarray(h["_r"].to_numpy(), dtype=np.int64) for h in halves])
        try:
            gap = pc.subtract_checked(right["event_time_us"].take(pa.array(rights)), left["event_time_us"].take(pa.array(lefts)))
        except pa.ArrowInvalid:
            raise RegionDeclined(f"interval join {self.operator_id!r}: event times too far apart for a long") from None
        gaps = np.asarray(gap.to_numpy(), dtype=np.int64)
        joined = (gaps >= self.bounds.low) & (gaps <= self.bounds.high)
        lefts, rights = lefts[joined], rights[joined]
        order = np.lexsort((rights, lefts))
        return lefts[order], rights[order]

    def _chained_cleanup(self, index: int, ts: Any, what: str) -> Any:
        """(4.) :meth:`_cleanup` on an Arrow column (declined where Spark's long arithmetic would overflow)."""
        from barrierflow.execution.chained_region import RegionDeclined

        low, high = self.bounds.low, self.bounds.high
        try:
            if index == 0:
                return pc.add_checked(ts, high) if high > 0 else ts
            return pc.subtract_checked(ts, low) if low < 0 else ts
        except pa.ArrowInvalid:
            raise RegionDeclined(f"{what}: a cleanup time beyond a long") from None

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "inputs": [n.operator_id for n in self.inputs()],
            "key": list(self.key),
            "other_key": list(self.other_key),
            "lower_us": self.bounds.lower_us,
            "upper_us": self.bounds.upper_us,
            "lower_inclusive": self.bounds.lower_inclusive,
            "upper_inclusive": self.bounds.upper_inclusive,
            "time_columns": list(self.time_columns),
            "late_outputs": list(self.late_outputs),
        }


def _records_at(records: pa.Table, fresh: pa.Table, candidates: pa.Table, rows: np.ndarray, fields: list[pa.Field]) -> pa.Table:
    """The records at ``rows`` of one side's candidates, as ``from_json`` reads their JSON (:func:`joined_rows`).

    An epoch's record (a row before ``len(fresh)``) is its input row: its
    JSON reads back as that row's values. A stored one is read from its JSON,
    once however many records it pairs with.
    """
    schema = pa.schema([f.with_nullable(True) for f in fields])
    is_new = rows < fresh.num_rows
    new_rows = fresh["_row"].take(pa.array(rows[is_new]))
    stored, pairs = np.unique(rows[~is_new], return_inverse=True)
    parts = pa.concat_tables(
        [
            records.select(schema.names).take(new_rows).cast(schema),
            record_values(candidates["record"].take(pa.array(stored)), fields).take(pa.array(pairs.astype(np.int64))),
        ]
    )
    placed = np.concatenate([np.flatnonzero(is_new), np.flatnonzero(~is_new)])
    inverse = np.empty(len(placed), dtype=np.int64)
    inverse[placed] = np.arange(len(placed), dtype=np.int64)
    return parts.take(pa.array(inverse))
