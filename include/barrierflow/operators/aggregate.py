"""Running aggregates per key, as native Spark expressions.

Results never depend on how Spark partitions the data, so changing the
parallelism between epochs gives bit-identical state. Running sums get
there without ordering records: an epoch's sum per key is exact, each value
taken as its decimal form (``decimal(38,18)``, which holds every double
between 1e-18 and 1e20 that is written with at most 18 decimals), rounded
once to a double and added to the stored sum. A key whose epoch has a value
outside that range (or values large enough that a partial sum could
overflow it) instead folds its epoch's values sorted ascending, which is
just as independent of partitioning.
Window aggregates (:meth:`Aggregation.result`) fold a window's values in
arrival order.
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

_EXACT_SUM_TYPE = "decimal(38,18)"
# Below the type's 1e20 limit by a margin, so no partial sum can overflow.
_EXACT_SUM_BOUND = 1e19


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

    # Arrival order never matters here: sums are exact (see the module docstring).
    needs_arrival_order = False

    def apply(self, ctx: Any, df: "DataFrame") -> "DataFrame":
        """Fold the epoch's records into each touched key's accumulators.

        1. Aggregate the epoch per key natively: count, exact decimal sums
           (with counts of values that have no exact decimal form), min, max.
        2. Read the touched keys' prior accumulators and merge.
        3. Collect the new accumulators once; keys whose sum could not be
           exact get their epoch sum from the sorted fold (:func:`_sorted_sums`).
        4. Stage the changed keys as this epoch's state rows; emit them.
        """
        from pyspark.sql import functions as F

        spec = self._spec(ctx.arrow_types(df, self.key))
        accs = self._accumulators()
        sum_columns = [col for name, col, _ in accs if name.startswith("sum_")]
        keyed = df.withColumn(KEY_GROUP, key_group_column(self.key, ctx.key_groups))
        aggregates = [F.count(F.lit(1)).alias("_n")]
        for name, col, _ in accs:
            if name == "count":
                continue
            value = F.col(col).cast("double")
            if name.startswith("sum_"):
                exact = value.try_cast(_EXACT_SUM_TYPE)
                is_exact = exact.isNotNull() & (exact.cast("double") == value)
                aggregates += [
                    # try_sum: keys large enough to overflow are flagged, never raise.
                    F.try_sum(F.when(is_exact, exact)).alias(f"_dsum_{col}"),
                    F.count_if(is_exact).alias(f"_nexact_{col}"),
                    F.max(F.when(is_exact, F.abs(value))).alias(f"_maxabs_{col}"),
                    F.count_if(value.isNotNull() & ~is_exact).alias(f"_ninexact_{col}"),
                ]
            elif name.startswith("min_"):
                aggregates.append(F.min(value).alias(f"_emin_{col}"))
            else:
                aggregates.append(F.max(value).alias(f"_emax_{col}"))
        epoch = ctx.persist(keyed.groupBy(*self.key, KEY_GROUP).agg(*aggregates))
        prior = ctx.state.read(spec, epoch).drop(KEY_GROUP, "_updated_at_ms")
        prior = prior.select(*self.key, *[F.col(n).alias(f"_prev_{n}") for n, _, _ in accs])
        merged = epoch.join(prior, on=list(self.key), how="left")
        columns = []
        for name, col, _ in accs:
            prev = F.col(f"_prev_{name}")
            if name == "count":
                new = F.coalesce(prev, F.lit(0)) + F.col("_n")
            elif name.startswith("sum_"):
                exact_sum = F.when(_inexact(col), F.lit(0.0)).otherwise(F.col(f"_dsum_{col}").cast("double"))
                new = F.coalesce(prev, F.lit(0.0)) + F.coalesce(exact_sum, F.lit(0.0))
            elif name.startswith("min_"):
                new = F.least(prev, F.col(f"_emin_{col}"))
            else:
                new = F.greatest(prev, F.col(f"_emax_{col}"))
            columns.append(new.cast("long" if name == "count" else "double").alias(name))
        extras = []
        for col in sum_columns:
            extras += [
                _inexact(col).alias(f"_inexact_{col}"),
                F.coalesce(F.col(f"_prev_sum_{col}"), F.lit(0.0)).cast("double").alias(f"_base_{col}"),
            ]
        rows = ctx.persist(merged.select(
            *self.key,
            F.col(KEY_GROUP).cast("int").alias(KEY_GROUP),
            *columns,
            F.lit(ctx.processing_time_ms).cast("long").alias("_updated_at_ms"),
            F.lit(False).alias("_deleted"),
            F.lit(ctx.epoch).cast("long").alias("_epoch"),
            *extras,
        ))
        schema = spec.arrow_schema()
        for col in sum_columns:
            schema = schema.append(pa.field(f"_inexact_{col}", pa.bool_())).append(pa.field(f"_base_{col}", pa.float64()))
        table = ctx.to_arrow(rows, schema)
        patched = False
        for col in sum_columns:
            flagged = table.filter(table[f"_inexact_{col}"])
            if flagged.num_rows:
                table = _patch_sums(table, col, _sorted_sums(ctx, keyed, self.key, col, flagged.select(list(self.key))), self.key)
                patched = True
        state = table.select(spec.arrow_schema().names)
        ctx.state.stage_arrow(spec, state)
        out = (ctx.spark.createDataFrame(state) if patched else rows).select(*self.key, *self._outputs())
        # Sinks take the collected rows instead of computing them again.
        ctx.remember_arrow(out, self._outputs_arrow(state))
        return out

    def _outputs(self) -> list["Column"]:
        from pyspark.sql import functions as F

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
        return outputs

    def _outputs_arrow(self, state: pa.Table) -> pa.Table:
        """:meth:`_outputs` computed on the collected state rows (same IEEE arithmetic)."""
        import pyarrow.compute as pc

        columns: dict[str, pa.Array] = {k: state[k] for k in self.key}
        for agg in self.aggregations:
            if isinstance(agg, Count):
                columns[agg.name] = state["count"]
            elif isinstance(agg, Avg):
                columns[agg.name] = pc.divide(state[f"sum_{agg.column}"], pc.cast(state["count"], pa.float64()))
            elif isinstance(agg, Sum):
                columns[agg.name] = state[f"sum_{agg.column}"]
            elif isinstance(agg, Min):
                columns[agg.name] = state[f"min_{agg.column}"]
            else:
                columns[agg.name] = state[f"max_{agg.column}"]
        return pa.table(columns)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "key": list(self.key), "aggregations": [a.name for a in self.aggregations]}


def _inexact(column: str) -> "Column":
    """Whether a key's epoch sum of ``column`` cannot be the exact decimal sum.

    True when a value has no exact decimal form, or when the values are so
    large that some partial sum could leave the decimal range: with
    n x max|x| below 1e19 no partial sum can overflow, whatever the
    partitioning, so the exact sum never depends on it.
    """
    from pyspark.sql import functions as F

    bound = F.col(f"_maxabs_{column}") * F.col(f"_nexact_{column}")
    return (F.col(f"_ninexact_{column}") > 0) | F.coalesce(bound >= F.lit(_EXACT_SUM_BOUND), F.lit(False))


def _sorted_sums(ctx: Any, keyed: "DataFrame", key: tuple[str, ...], column: str, keys: pa.Table) -> dict[tuple[Any, ...], float]:
    """Epoch sums of ``column`` for ``keys``, folded over the values sorted ascending.

    The fallback for keys with a value outside the exact decimal range: the
    sorted order depends only on the values, never on how Spark partitioned
    them, so the result is still the same at any parallelism.
    """
    from pyspark.sql import functions as F

    wanted = ctx.spark.createDataFrame(keys)
    values = F.array_sort(F.collect_list(F.col(column).cast("double")))
    folded = (
        keyed.join(F.broadcast(wanted), on=list(key), how="left_semi")
        .groupBy(*key)
        .agg(F.aggregate(values, F.lit(0.0), lambda acc, x: acc + x).alias("_sum"))
    )
    return {tuple(row[k] for k in key): row["_sum"] for row in folded.collect()}


def _patch_sums(table: pa.Table, column: str, sums: dict[tuple[Any, ...], float], key: tuple[str, ...]) -> pa.Table:
    """Replace ``sum_<column>`` of the flagged rows by base + their sorted-fold sum."""
    name = f"sum_{column}"
    flags = table[f"_inexact_{column}"].to_pylist()
    bases = table[f"_base_{column}"].to_pylist()
    current = table[name].to_pylist()
    keys = list(zip(*(table[k].to_pylist() for k in key)))
    values = [bases[i] + sums[keys[i]] if flags[i] else current[i] for i in range(table.num_rows)]
    return table.set_column(table.schema.get_field_index(name), name, pa.array(values, pa.float64()))
