"""Event-time tumbling windows that fire when the watermark passes their end.

A record is late when its window's end is <= W(n-1), the watermark at the
start of its epoch; late records go to a side output, not to windows. At the
end of epoch n every pending window with end <= W(n) fires exactly once and
its state is cleared. Pending windows keep their values in arrival order, so
every aggregate (percentiles included) is exact and deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from barrierflow.errors import PipelineDefinitionError
from barrierflow.operators.aggregate import Aggregation
from barrierflow.operators.base import Node, key_group_column, position_columns, user_columns
from barrierflow.state.spec import KEY_GROUP, StateSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["TumblingEventTimeWindows", "TumblingWindow"]


@dataclass(frozen=True)
class TumblingEventTimeWindows:
    size: timedelta
    time_column: str = "ts"

    @classmethod
    def of(cls, size: timedelta, time_column: str = "ts") -> "TumblingEventTimeWindows":
        return cls(size, time_column)

    @property
    def size_us(self) -> int:
        return int(self.size.total_seconds() * 1_000_000)


@dataclass
class TumblingWindow(Node):
    key: tuple[str, ...] = ()
    assigner: TumblingEventTimeWindows = TumblingEventTimeWindows(timedelta(minutes=1))
    aggregations: tuple[Aggregation, ...] = ()
    late_output: str | None = None

    def __post_init__(self) -> None:
        columns = {a.value_column for a in self.aggregations if a.value_column is not None}
        if len(columns) > 1:
            raise PipelineDefinitionError(
                f"window {self.operator_id}: all aggregations must read the same column, got {sorted(columns, key=str)}"
            )
        if self.assigner.size_us <= 0:
            raise PipelineDefinitionError(f"window {self.operator_id}: size must be positive")

    @property
    def value_column(self) -> str | None:
        return next((a.value_column for a in self.aggregations if a.value_column is not None), None)

    def _spec(self, key_types: dict[str, pa.DataType] | None = None) -> StateSpec:
        types = key_types or {}
        return StateSpec(
            operator_id=self.operator_id,
            name="pending_windows",
            key_fields=(
                *(pa.field(k, types.get(k, pa.string())) for k in self.key),
                pa.field("window_start", pa.timestamp("us", tz="UTC")),
            ),
            value_fields=(pa.field("window_values", pa.list_(pa.float64())),),
        )

    def state_specs(self) -> list[StateSpec]:
        return [self._spec()]

    def side_outputs(self) -> list[str]:
        return [self.late_output] if self.late_output else []

    def apply(self, ctx: Any, df: "DataFrame") -> "DataFrame":
        """Late records to the side output; fold the epoch into pending windows; fire.

        Returns the fired windows; executors write them and the state changes.
        """
        from pyspark.sql import functions as F

        spec = self._spec(ctx.arrow_types(df, self.key))
        size = self.assigner.size_us
        ts_us = F.unix_micros(F.col(self.assigner.time_column))
        start_us = ts_us - F.pmod(ts_us, F.lit(size))
        windowed = df.withColumn("_start_us", start_us)
        prev_wm = ctx.watermark_prev_us
        if prev_wm is not None:
            is_late = (F.col("_start_us") + F.lit(size)) <= F.lit(prev_wm)
        else:
            is_late = F.lit(False)
        windowed = ctx.persist(windowed.withColumn("_late", is_late))
        if self.late_output:
            late = windowed.where("_late").select(*user_columns(df))
            ctx.emit(self.late_output, late)
        on_time = windowed.where(~F.col("_late"))
        value = F.col(self.value_column).cast("double") if self.value_column else F.lit(0.0)
        epoch_windows = on_time.groupBy(*self.key, "_start_us").agg(
            F.array_sort(F.collect_list(F.struct(*position_columns(df.columns), value.alias("v")))).alias("_vals")
        ).select(
            *self.key,
            F.timestamp_micros("_start_us").alias("window_start"),
            F.col("_vals.v").alias("_new_values"),
        )
        # Firing may concern any pending window, touched this epoch or not.
        pending = ctx.state.read(spec).select(*self.key, "window_start", F.col("window_values").alias("_old_values"))
        keys = [*self.key, "window_start"]
        merged = pending.join(epoch_windows, on=keys, how="full_outer").withColumn(
            "window_values", F.concat(F.coalesce("_old_values", F.array()), F.coalesce("_new_values", F.array()))
        )
        wm = ctx.watermark_us
        window_end = F.timestamp_micros(F.unix_micros(F.col("window_start")) + F.lit(size))
        merged = merged.withColumn("window_end", window_end)
        fires = (F.unix_micros(F.col("window_end")) <= F.lit(wm)) if wm is not None else F.lit(False)
        merged = merged.withColumn("_fires", fires)
        # A state change: new values, or a stored window that fires (its tombstone).
        changed = (F.col("_new_values").isNotNull() | F.col("_fires")) & (F.col("_old_values").isNotNull() | ~F.col("_fires"))
        count = F.size("window_values")
        results = [a.result(F.col("window_values"), count).alias(a.name) for a in self.aggregations]
        # Computed once (cached on the executors): the state changes and the
        # fired windows are both written from it.
        rows = ctx.persist(
            merged.where(changed | F.col("_fires")).select(
                *keys,
                key_group_column(self.key, ctx.key_groups).alias(KEY_GROUP),
                "window_values",
                F.col("_fires").alias("_deleted"),
                changed.alias("_changed"),
                "window_end",
                *results,
            )
        )
        ctx.state.stage(spec, rows.where("_changed"))
        return ctx.cached_view(
            rows.where("_deleted").select(*self.key, "window_start", "window_end", *[a.name for a in self.aggregations])
        )

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "key": list(self.key),
            "size_us": self.assigner.size_us,
            "aggregations": [a.name for a in self.aggregations],
            "late_output": self.late_output,
        }
