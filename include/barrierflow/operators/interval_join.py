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
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Sequence

from barrierflow.errors import PipelineDefinitionError
from barrierflow.operators.join_buffer import SIDES, TwoSidedJoin, check_key_types, fresh_records, joined_rows, record_schemas
from barrierflow.state.spec import KEY_GROUP, DueRows

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
