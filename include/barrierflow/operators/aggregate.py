"""Running aggregates per key, as native Spark expressions.

Sums are folded in arrival order starting from the stored sum, so results do
not depend on how Spark partitions the data: changing the parallelism
between epochs gives bit-identical state.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from barrierflow.errors import PipelineDefinitionError
from barrierflow.operators.base import KEY_GROUP, Node, StateSpec, key_group_column

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["Aggregation", "Count", "Sum", "Min", "Max", "Avg", "Percentile", "RunningAggregate"]


@dataclass(frozen=True)
class Aggregation:
    """An aggregate over one column; ``name`` is its output column."""

    column: str | None
    name: str

    def result(self, values: "Column", count: "Column") -> "Column":
        """The aggregate from an array of values in arrival order (windows)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Count(Aggregation):
    column: str | None = None
    name: str = "count"

    def result(self, values: "Column", count: "Column") -> "Column":
        return count.cast("long")


def _fold_sum(values: "Column", start: "Column") -> "Column":
    from pyspark.sql import functions as F

    return F.aggregate(values, start.cast("double"), lambda acc, x: acc + x)


@dataclass(frozen=True)
class Sum(Aggregation):
    name: str = "sum"

    def result(self, values: "Column", count: "Column") -> "Column":
        from pyspark.sql import functions as F

        return _fold_sum(values, F.lit(0.0))


@dataclass(frozen=True)
class Min(Aggregation):
    name: str = "min"

    def result(self, values: "Column", count: "Column") -> "Column":
        from pyspark.sql import functions as F

        return F.array_min(values)


@dataclass(frozen=True)
class Max(Aggregation):
    name: str = "max"

    def result(self, values: "Column", count: "Column") -> "Column":
        from pyspark.sql import functions as F

        return F.array_max(values)


@dataclass(frozen=True)
class Avg(Aggregation):
    name: str = "avg"

    def result(self, values: "Column", count: "Column") -> "Column":
        from pyspark.sql import functions as F

        return _fold_sum(values, F.lit(0.0)) / count


@dataclass(frozen=True)
class Percentile(Aggregation):
    """Nearest-rank percentile: sorted ascending, 1-based position ceil(q x n)."""

    q: float = 0.5
    name: str = "p50"

    def result(self, values: "Column", count: "Column") -> "Column":
        from pyspark.sql import functions as F

        if not 0 < self.q <= 1:
            raise PipelineDefinitionError(f"percentile {self.name}: q must be in (0, 1]")
        frac = Fraction(self.q).limit_denominator(1_000_000)
        # ceil(q*n) in exact integer arithmetic: no floating-point rounding.
        pos = F.floor((F.lit(frac.numerator) * count + F.lit(frac.denominator - 1)) / F.lit(frac.denominator))
        return F.element_at(F.array_sort(values), pos.cast("int"))


@dataclass
class RunningAggregate(Node):
    key: tuple[str, ...] = ()
    aggregations: tuple[Aggregation, ...] = ()

    def __post_init__(self) -> None:
        for agg in self.aggregations:
            if not isinstance(agg, (Count, Sum, Min, Max, Avg)):
                raise PipelineDefinitionError(
                    f"{self.operator_id}: running aggregates support Count, Sum, Min, Max, Avg; "
                    f"got {type(agg).__name__}"
                )

    def _accumulators(self) -> list[tuple[str, str | None, pa.DataType]]:
        # (accumulator column, source column, type); Avg is sum/count.
        out: list[tuple[str, str | None, pa.DataType]] = [("count", None, pa.int64())]
        for agg in self.aggregations:
            if isinstance(agg, (Sum, Avg)):
                out.append((f"sum_{agg.column}", agg.column, pa.float64()))
            elif isinstance(agg, Min):
                out.append((f"min_{agg.column}", agg.column, pa.float64()))
            elif isinstance(agg, Max):
                out.append((f"max_{agg.column}", agg.column, pa.float64()))
        seen: dict[str, tuple[str, str | None, pa.DataType]] = {}
        for acc in out:
            seen.setdefault(acc[0], acc)
        return list(seen.values())

    def _spec(self, key_types: dict[str, pa.DataType] | None = None) -> StateSpec:
        types = key_types or {}
        return StateSpec(
            operator_id=self.operator_id,
            name="accumulators",
            key_fields=tuple(pa.field(k, types.get(k, pa.string())) for k in self.key),
            value_fields=tuple(pa.field(n, t) for n, _, t in self._accumulators()),
        )

    def state_specs(self) -> list[StateSpec]:
        return [self._spec()]

    def apply(self, ctx: Any, df: "DataFrame") -> "DataFrame":
        from pyspark.sql import functions as F

        spec = self._spec(ctx.arrow_types(df, self.key))
        accs = self._accumulators()
        columns = sorted({c for _, c, _ in accs if c})
        keyed = df.withColumn(KEY_GROUP, key_group_column(self.key, ctx.key_groups))
        ordered = F.array_sort(
            F.collect_list(F.struct("_seq", *[F.col(c).cast("double").alias(c) for c in columns]))
        )
        epoch = keyed.groupBy(*self.key, KEY_GROUP).agg(ordered.alias("_vals"))
        prior = ctx.state.read(spec, keyed).drop(KEY_GROUP, "_updated_at_ms")
        prior = prior.select(*self.key, *[F.col(n).alias(f"_prev_{n}") for n, _, _ in accs])
        merged = epoch.join(prior, on=list(self.key), how="left")
        new_cols = []
        for name, col, _ in accs:
            prev = F.col(f"_prev_{name}")
            if name == "count":
                new = F.coalesce(prev, F.lit(0)) + F.size("_vals")
            elif name.startswith("sum_"):
                new = F.aggregate(F.col(f"_vals.{col}"), F.coalesce(prev, F.lit(0.0)), lambda a, x: a + x)
            elif name.startswith("min_"):
                new = F.least(prev, F.array_min(f"_vals.{col}"))
            else:
                new = F.greatest(prev, F.array_max(f"_vals.{col}"))
            new_cols.append(new.cast("long" if name == "count" else "double").alias(name))
        state = ctx.persist(merged.select(*self.key, KEY_GROUP, *new_cols))
        ctx.state.stage(spec, state.withColumn("_deleted", F.lit(False)))
        outputs = []
        for agg in self.aggregations:
            if isinstance(agg, Count):
                outputs.append(F.col("count").alias(agg.name))
            elif isinstance(agg, Sum):
                outputs.append(F.col(f"sum_{agg.column}").alias(agg.name))
            elif isinstance(agg, Avg):
                outputs.append((F.col(f"sum_{agg.column}") / F.col("count")).alias(agg.name))
            elif isinstance(agg, Min):
                outputs.append(F.col(f"min_{agg.column}").alias(agg.name))
            else:
                outputs.append(F.col(f"max_{agg.column}").alias(agg.name))
        return state.select(*self.key, *outputs)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "key": list(self.key), "aggregations": [a.name for a in self.aggregations]}
