"""Interval join of two keyed streams on event time, as Flink's ``IntervalJoin``.

``a.key_by("k").interval_join(b.key_by("k")).between(lower, upper, operator_id="j")``
joins a record ``l`` of ``a`` with a record ``r`` of ``b`` of the same key when
``l.ts + lower <= r.ts <= l.ts + upper`` (each bound inclusive unless
declared exclusive; an exclusive bound moves by one microsecond, the
timestamps' unit, as Flink's moves by one millisecond). Each side's event
time is the column of the watermark assigner upstream of it. Within epoch n,
with W(n-1) the watermark at its start and W(n) the one at its end:

1. Alignment: both inputs' records up to barrier n are joined in epoch n.
2. Late records: a record whose event time is before W(n-1) (or null) can
   no longer join, as Flink drops an element older than the watermark: it
   goes to the side's late output if declared, else it is dropped and
   counted in the log.
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

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Sequence

import pyarrow as pa

from barrierflow.errors import PipelineDefinitionError
from barrierflow.operators.base import Node, key_group_column, user_columns
from barrierflow.state.spec import KEY_GROUP, StateSpec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["IntervalBounds", "IntervalJoin", "output_columns", "SIDES"]

_log = logging.getLogger(__name__)
_ONE_US = timedelta(microseconds=1)
SIDES = ("left", "right")
# JSON of a record kept in state: timestamps to the microsecond (Spark's default format drops digits).
_JSON_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX", "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"}


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


def output_columns(key: Sequence[str], left: Sequence[str], right: Sequence[str], right_key: Sequence[str]) -> list[tuple[str, str, str]]:
    """(6.) The output's columns as (side, column of that side's record, output name); key columns from the left."""
    left_rest = [c for c in left if c not in key]
    right_rest = [c for c in right if c not in right_key]
    both = set(left_rest) & set(right_rest)
    columns = [("left", k, k) for k in key]
    columns += [("left", c, f"left_{c}" if c in both else c) for c in left_rest]
    columns += [("right", c, f"right_{c}" if c in both else c) for c in right_rest]
    names = [name for *_, name in columns]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise PipelineDefinitionError(
            f"interval join: output columns {clashes} would appear twice (a column named like a prefixed one, or "
            "like a key); rename them upstream with select or map"
        )
    return columns


@dataclass
class IntervalJoin(Node):
    """Joins ``parent`` keyed by ``key`` (left) with ``other`` keyed by ``other_key`` (right) within ``bounds``."""

    key: tuple[str, ...] = ()
    other: Node | None = None
    other_key: tuple[str, ...] = ()
    bounds: IntervalBounds = IntervalBounds(0, 0)
    time_columns: tuple[str, str] = ("ts", "ts")
    late_outputs: tuple[str | None, str | None] = (None, None)

    needs_arrival_order = False
    uses_watermark = True

    def inputs(self) -> tuple[Node, ...]:
        assert self.parent is not None and self.other is not None
        return (self.parent, self.other)

    def keyed_inputs(self) -> list[tuple[Node, tuple[str, ...]]]:
        # A null event time is checked at the sources as a null key is (a dead letter there).
        return [(node, (*key, time)) for node, key, time in zip(self.inputs(), (self.key, self.other_key), self.time_columns)]

    def side_outputs(self) -> list[str]:
        return [name for name in self.late_outputs if name]

    def _spec(self, side: str, key_types: dict[str, pa.DataType] | None = None) -> StateSpec:
        types = key_types or {}
        return StateSpec(
            operator_id=self.operator_id,
            name=side,
            key_fields=(
                *(pa.field(k, types.get(k, pa.string())) for k in self.key),
                pa.field("record_epoch", pa.int64()),
                pa.field("record_index", pa.int64()),
            ),
            value_fields=(pa.field("event_time_us", pa.int64()), pa.field("record", pa.string())),
        )

    def state_specs(self) -> list[StateSpec]:
        return [self._spec(side) for side in SIDES]

    def apply_inputs(self, ctx: Any, frames: Sequence["DataFrame"]) -> "DataFrame":
        from pyspark.sql import Window
        from pyspark.sql import functions as F
        from pyspark.sql.types import StructType

        keys = (self.key, self.other_key)
        types = [ctx.arrow_types(df, (*key, time)) for df, key, time in zip(frames, keys, self.time_columns)]
        differ = [f"{a} is {types[0][a]} but {b} is {types[1][b]}" for a, b in zip(*keys) if types[0][a] != types[1][b]]
        if differ:
            raise PipelineDefinitionError(
                f"interval join {self.operator_id!r}: the key columns of the two inputs differ in type ({'; '.join(differ)})"
            )
        specs = [self._spec(side, types[0]) for side in SIDES]
        wp, wn = ctx.watermark_prev_us, ctx.watermark_us
        low, high = self.bounds.low, self.bounds.high
        schemas = [StructType([f for f in df.schema.fields if not f.name.startswith("_")]) for df in frames]
        candidates = []
        for index, (df, key, time, spec) in enumerate(zip(frames, keys, self.time_columns, specs)):
            users = user_columns(df)
            ts = F.unix_micros(F.col(time))
            # (2.)
            late = ts.isNull() if wp is None else (ts.isNull() | (ts < F.lit(wp)))
            marked = ctx.persist(df.withColumn("_late", late))
            self._late(ctx, marked, users, index)
            fresh = marked.where(~F.col("_late")).select(
                *[F.col(theirs).alias(ours) for ours, theirs in zip(self.key, key)],
                ts.alias("event_time_us"),
                F.to_json(F.struct(*[F.col(c) for c in users]), _JSON_OPTIONS).alias("record"),
            )
            fresh = fresh.select(
                "*",
                key_group_column(self.key, ctx.key_groups).alias(KEY_GROUP),
                F.lit(ctx.epoch).cast("long").alias("record_epoch"),
                # Unique within the key and epoch; identical records are interchangeable, so ranking by content is deterministic.
                F.row_number().over(Window.partitionBy(*self.key).orderBy("event_time_us", "record")).cast("long").alias("record_index"),
                F.lit(True).alias("_new"),
            )
            # Every key group: a record leaves state when the watermark passes it, whether or not its key has records (4.).
            stored = ctx.state.read(spec).select(*fresh.columns[:-1], F.lit(False).alias("_new"))
            candidates.append(ctx.persist(fresh.unionByName(stored)))

        # (3.) pairs with at least one record of this epoch
        left, right = (c.alias(side) for c, side in zip(candidates, SIDES))
        condition = [F.col(f"left.{k}") == F.col(f"right.{k}") for k in self.key] + [
            F.col("right.event_time_us") - F.col("left.event_time_us") >= F.lit(low),
            F.col("right.event_time_us") - F.col("left.event_time_us") <= F.lit(high),
            F.col("left._new") | F.col("right._new"),
        ]
        pairs = left.join(right, on=condition, how="inner")
        parsed = pairs.select(
            *[F.col(f"left.{k}").alias(k) for k in self.key],
            F.from_json(F.col("left.record"), schemas[0], _JSON_OPTIONS).alias("_l"),
            F.from_json(F.col("right.record"), schemas[1], _JSON_OPTIONS).alias("_r"),
        )
        names = [[f.name for f in s.fields] for s in schemas]
        columns = output_columns(self.key, names[0], names[1], self.other_key)
        out = parsed.select(
            *[F.col(k) for k in self.key],
            *[F.col(f"{'_l' if side == 'left' else '_r'}.{c}").alias(name) for side, c, name in columns[len(self.key):]],
        )

        # (4.) state after the epoch: new records still joinable at W(n) added, stored ones no longer joinable deleted
        for index, (candidate, spec) in enumerate(zip(candidates, specs)):
            keep = F.lit(True) if wn is None else self._cleanup(index, F.col("event_time_us")) > F.lit(wn)
            changes = candidate.where((F.col("_new") & keep) | (~F.col("_new") & ~keep)).withColumn("_deleted", ~F.col("_new"))
            ctx.state.stage(spec, changes)
        return out

    def _cleanup(self, index: int, ts: "Column") -> "Column":
        """(4.) A record's cleanup time as a Spark expression (the same rule as :meth:`IntervalBounds.cleanup_us`)."""
        from pyspark.sql import functions as F

        low, high = self.bounds.low, self.bounds.high
        if index == 0:
            return ts + F.lit(high) if high > 0 else ts
        return ts - F.lit(low) if low < 0 else ts

    def _late(self, ctx: Any, marked: "DataFrame", users: list[str], index: int) -> None:
        """(2.) Late records to the side's late output, or dropped and counted."""
        name = self.late_outputs[index]
        if name:  # emitted every epoch, empty or not: the side output's table exists from the first
            ctx.emit(name, marked.where("_late").select(*users))
            return
        dropped = marked.where("_late").count()  # a job on the cached rows; the drop is never silent
        if dropped:
            _log.warning(
                "epoch %d: interval join %s dropped %d late %s record(s) (no late output declared)",
                ctx.epoch, self.operator_id, dropped, SIDES[index],
            )

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
