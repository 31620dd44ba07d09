"""Running aggregates per key, as native Spark expressions.

Results never depend on how Spark partitions the data, so changing the
parallelism between epochs gives bit-identical state. Running sums get
there without ordering records: an epoch's sum per key is the exact sum of
the values' decimal forms, rounded once to a double and added to the stored
sum. Which exact method a key uses depends only on its epoch's values:

1. Micro-units: every value is below 1e9 in magnitude and a whole number of
   millionths (``rint(v * 1e6) / 1e6 == v``): integer sum of the
   millionths, exact while it stays below 2**53, then one IEEE division.
   (``rint`` rounds half to even, cheaply; a value whose ``v * 1e6`` is a
   tie is never a whole number of millionths, so the rounding mode of ties
   cannot matter.)
2. Otherwise ``decimal(38,18)`` (every double between 1e-18 and 1e20 that
   is written with at most 18 decimals), in a second, small job over only
   those keys.
3. A value outside that range, or values so large that a partial sum could
   overflow it: the epoch's values folded sorted ascending.

Window aggregates (:meth:`Aggregation.result`) fold a window's values in
arrival order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.execution.spark import local_checkpoint, session_cached
from barrierflow.operators.base import Node, key_group_column
from barrierflow.state.delta_backend import joinable
from barrierflow.state.spec import KEY_GROUP, StateSpec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "Accumulator", "Aggregation", "Count", "Sum", "Min", "Max", "Avg", "Percentile", "RunningAggregate", "named_aggregations", "merged_in_task",
    "MICRO", "MICRO_VALUE_BOUND", "MICRO_SUM_BOUND", "LONG_BOUND",
]

_EXACT_SUM_TYPE = "decimal(38,18)"
# Below the type's 1e20 limit by a margin, so no partial sum can overflow.
_EXACT_SUM_BOUND = 1e19
# Micro-units: values below 1e9 have |round(v * 1e6)| < 1e15, an exact
# integer double; integer sums stay exact as doubles below 2**53, and a
# long partial sum cannot overflow while n x max|units| < 9e18.
MICRO = 1e6
MICRO_VALUE_BOUND = 1e9
MICRO_SUM_BOUND = float(2**53)
LONG_BOUND = 9e18


@dataclass(frozen=True)
class Accumulator:
    """One state column of a running aggregate and how an epoch's records fold into it.

    The epoch's aggregates (:meth:`epoch_aggregates`) are computed per key
    natively; :meth:`merged` (Spark) and :meth:`merged_arrow` (the heap
    backend, same IEEE arithmetic) combine them with the stored value
    ``_prev_<name>``.
    """

    column: str | None

    # Whether the epoch's value is an exact sum that may need the fallback
    # methods 2-3 of the module docstring (a ``_inexact_<column>`` flag).
    exact_sum: ClassVar[bool] = False
    # The aggregate that alone computes the epoch's value ("min", "max": Spark's and
    # Arrow's name alike); None where it takes more (the count, an exact sum).
    kind: ClassVar[str | None] = None
    type: ClassVar[pa.DataType] = pa.float64()

    @property
    def name(self) -> str:
        raise NotImplementedError

    @property
    def source(self) -> str:
        assert self.column is not None  # only the count reads no column
        return self.column

    def epoch_aggregates(self) -> list["Column"]:
        return []

    def epoch_fields(self) -> list[pa.Field]:
        """The columns :meth:`epoch_aggregates` computes, by name and type (a chained read task computes the same)."""
        return []

    def merged(self, flagged: bool) -> "Column":
        raise NotImplementedError

    def merged_arrow(self, merged: pa.Table) -> pa.ChunkedArray:
        raise NotImplementedError

    def flagged_keys(self, merged: pa.Table, key: tuple[str, ...]) -> pa.Table | None:
        """Keys whose epoch value the heap merge left out (for :func:`_fallback_sums`)."""
        return None


@dataclass(frozen=True)
class _CountAccumulator(Accumulator):
    column: str | None = None
    type: ClassVar[pa.DataType] = pa.int64()

    @property
    def name(self) -> str:
        return "count"

    def merged(self, flagged: bool) -> "Column":
        from pyspark.sql import functions as F

        return F.coalesce(F.col("_prev_count"), F.lit(0).cast("long")) + F.col("_n")

    def merged_arrow(self, merged: pa.Table) -> pa.ChunkedArray:
        return pc.add(pc.fill_null(merged["_prev_count"], 0), merged["_n"])


@dataclass(frozen=True)
class _SumAccumulator(Accumulator):
    exact_sum: ClassVar[bool] = True

    @property
    def name(self) -> str:
        return f"sum_{self.column}"

    def epoch_aggregates(self) -> list["Column"]:
        from pyspark.sql import functions as F

        col = self.source
        value = F.col(col).cast("double")
        scaled = F.rint(value * F.lit(MICRO))
        exact = (F.abs(value) < F.lit(MICRO_VALUE_BOUND)) & (scaled / F.lit(MICRO) == value)
        units = F.when(exact, scaled.cast("long"))
        # try_sum: a key large enough to overflow is flagged below, never raises.
        total = F.try_sum(units)
        bound = F.max(F.abs(units)).cast("double") * F.count(F.lit(1))  # n >= the exact values
        inexact = (
            (F.count_if(value.isNotNull() & ~F.coalesce(exact, F.lit(False))) > 0)
            | F.coalesce(bound >= F.lit(LONG_BOUND), F.lit(False))
            | F.coalesce(F.abs(total).cast("double") >= F.lit(MICRO_SUM_BOUND), F.lit(False))
        )
        # Below 2**53 the integer is an exact double: one correctly rounded division.
        epoch_sum, flag = self.epoch_fields()
        return [(total.cast("double") / F.lit(MICRO)).alias(epoch_sum.name), inexact.alias(flag.name)]

    def epoch_fields(self) -> list[pa.Field]:
        return [pa.field(f"_esum_{self.source}", pa.float64()), pa.field(f"_inexact_{self.source}", pa.bool_())]

    def merged(self, flagged: bool) -> "Column":
        from pyspark.sql import functions as F

        col = self.source
        epoch_sum = F.coalesce(F.col(f"_esum_{col}"), F.lit(0.0))
        if flagged:
            epoch_sum = F.when(F.col(f"_inexact_{col}"), F.col(f"_fsum_{col}")).otherwise(epoch_sum)
        return F.coalesce(F.col(f"_prev_{self.name}"), F.lit(0.0)) + epoch_sum

    def merged_arrow(self, merged: pa.Table) -> pa.ChunkedArray:
        # A flagged key's epoch sum is 0.0 here; _patch_sums adds its fallback sum.
        col = self.source
        epoch_sum = pc.if_else(merged[f"_inexact_{col}"], 0.0, pc.fill_null(merged[f"_esum_{col}"], 0.0))
        return pc.add(pc.fill_null(merged[f"_prev_{self.name}"], 0.0), epoch_sum)

    def flagged_keys(self, merged: pa.Table, key: tuple[str, ...]) -> pa.Table:
        return merged.filter(merged[f"_inexact_{self.source}"]).select(list(key))


@dataclass(frozen=True)
class _ExtremeAccumulator(Accumulator):
    """The least or greatest value: Spark's ``min``/``max`` over the epoch, ``least``/``greatest`` with the stored one."""

    kind: ClassVar[str]  # "min" or "max": Spark's and Arrow's aggregate, and the column's prefix
    merge: ClassVar[str]  # "least" or "greatest": Spark's function merging with the stored value

    @property
    def name(self) -> str:
        return f"{self.kind}_{self.column}"

    def epoch_aggregates(self) -> list["Column"]:
        from pyspark.sql import functions as F

        return [getattr(F, self.kind)(F.col(self.source).cast("double")).alias(self.epoch_fields()[0].name)]

    def epoch_fields(self) -> list[pa.Field]:
        return [pa.field(f"_e{self.kind}_{self.source}", pa.float64())]

    def merged(self, flagged: bool) -> "Column":
        from pyspark.sql import functions as F

        return getattr(F, self.merge)(F.col(f"_prev_{self.name}"), F.col(f"_e{self.kind}_{self.source}"))

    def merged_arrow(self, merged: pa.Table) -> pa.ChunkedArray:
        return self.merge_arrow(merged[f"_prev_{self.name}"], merged[f"_e{self.kind}_{self.source}"])

    def merge_arrow(self, prev: pa.ChunkedArray, value: pa.ChunkedArray) -> pa.ChunkedArray:
        """:attr:`merge` on Arrow, with Spark's NaN ordering."""
        raise NotImplementedError


@dataclass(frozen=True)
class _MinAccumulator(_ExtremeAccumulator):
    kind: ClassVar[str] = "min"
    merge: ClassVar[str] = "least"

    def merge_arrow(self, prev: pa.ChunkedArray, value: pa.ChunkedArray) -> pa.ChunkedArray:
        return _least(prev, value)


@dataclass(frozen=True)
class _MaxAccumulator(_ExtremeAccumulator):
    kind: ClassVar[str] = "max"
    merge: ClassVar[str] = "greatest"

    def merge_arrow(self, prev: pa.ChunkedArray, value: pa.ChunkedArray) -> pa.ChunkedArray:
        return _greatest(prev, value)


@dataclass(frozen=True)
class Aggregation:
    """An aggregate over one column; ``name`` is its output column.

    Each aggregation says what it keeps as a running aggregate
    (:meth:`accumulators`, state columns shared by name: ``Sum("v")`` and
    ``Avg("v")`` keep one ``sum_v``), how its result follows from them
    (:meth:`running_result`, :meth:`running_result_arrow`), and how a
    window computes it from the window's values (:meth:`result`).
    """

    column: str | None
    name: str

    @property
    def value_column(self) -> str | None:
        """The column whose values it aggregates (None: it only counts records)."""
        return self.column

    def accumulators(self) -> tuple[Accumulator, ...]:
        """State columns of a running aggregate; empty: it cannot run as one."""
        return ()

    def running_result(self) -> "Column":
        """Its value from the state row's accumulator columns (Spark)."""
        from pyspark.sql import functions as F

        return F.col(self.accumulators()[0].name)

    def running_result_arrow(self, state: pa.Table) -> pa.ChunkedArray:
        """Its value from the state rows' accumulator columns (Arrow: same arithmetic as Spark)."""
        return state[self.accumulators()[0].name]

    def result(self, values: "Column", count: "Column") -> "Column":
        """The aggregate from an array of values in arrival order (windows)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Count(Aggregation):
    column: str | None = None
    name: str = "count"

    @property
    def value_column(self) -> str | None:
        return None

    def accumulators(self) -> tuple[Accumulator, ...]:
        return (_CountAccumulator(),)

    def result(self, values: "Column", count: "Column") -> "Column":
        return count.cast("long")


def _fold_sum(values: "Column", start: "Column") -> "Column":
    from pyspark.sql import functions as F

    return F.aggregate(values, start.cast("double"), lambda acc, x: acc + x)


@dataclass(frozen=True)
class Sum(Aggregation):
    name: str = "sum"

    def accumulators(self) -> tuple[Accumulator, ...]:
        return (_SumAccumulator(self.column),)

    def result(self, values: "Column", count: "Column") -> "Column":
        from pyspark.sql import functions as F

        return _fold_sum(values, F.lit(0.0))


@dataclass(frozen=True)
class Min(Aggregation):
    name: str = "min"

    def accumulators(self) -> tuple[Accumulator, ...]:
        return (_MinAccumulator(self.column),)

    def result(self, values: "Column", count: "Column") -> "Column":
        from pyspark.sql import functions as F

        return F.array_min(values)


@dataclass(frozen=True)
class Max(Aggregation):
    name: str = "max"

    def accumulators(self) -> tuple[Accumulator, ...]:
        return (_MaxAccumulator(self.column),)

    def result(self, values: "Column", count: "Column") -> "Column":
        from pyspark.sql import functions as F

        return F.array_max(values)


@dataclass(frozen=True)
class Avg(Aggregation):
    name: str = "avg"

    def accumulators(self) -> tuple[Accumulator, ...]:
        return (_SumAccumulator(self.column), _CountAccumulator())

    def running_result(self) -> "Column":
        from pyspark.sql import functions as F

        total, count = self.accumulators()
        return F.col(total.name) / F.col(count.name).cast("double")

    def running_result_arrow(self, state: pa.Table) -> pa.ChunkedArray:
        total, count = self.accumulators()
        return pc.divide(state[total.name], pc.cast(state[count.name], pa.float64()))

    def result(self, values: "Column", count: "Column") -> "Column":
        from pyspark.sql import functions as F

        return _fold_sum(values, F.lit(0.0)) / count


@dataclass(frozen=True)
class Percentile(Aggregation):
    """Nearest-rank percentile: sorted ascending, 1-based position ceil(q x n).

    Windows only: a running percentile would need every value ever seen.
    """

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


def named_aggregations(
    operator_id: str,
    positional: tuple[Aggregation, ...],
    named: Mapping[str, Aggregation],
    reserved: tuple[str, ...] = (),
) -> tuple[Aggregation, ...]:
    """The aggregations of one operator, each under its output column.

    Positional ones keep their own ``name`` (``Sum("v", "total")``, or the
    class's default); a keyword names its aggregation (``total=Sum("v")``).
    Output columns must be unique, not start with ``_`` (the engine's) and
    not clash with ``reserved`` (the key and, for windows, the window's
    columns).
    """
    given = [*positional, *named.values()]
    wrong = [f"{a!r}" for a in given if not isinstance(a, Aggregation)]
    if wrong:
        raise PipelineDefinitionError(
            f"{operator_id}: {', '.join(wrong)} is not an aggregation; give Count(), Sum(column), Min(column), "
            "Max(column), Avg(column) or Percentile(column, q=...)"
        )
    aggregations = (*positional, *(replace(agg, name=name) for name, agg in named.items()))
    if not aggregations:
        raise PipelineDefinitionError(f"{operator_id}: no aggregation given, e.g. aggregate({operator_id!r}, count=Count())")
    names = [a.name for a in aggregations]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise PipelineDefinitionError(
            f"{operator_id}: output column(s) {duplicates} named more than once; name each aggregation by keyword, "
            f"e.g. total_a=Sum('a'), total_b=Sum('b')"
        )
    bad = sorted({n for n in names if not n or n.startswith("_") or n in reserved})
    if bad:
        raise PipelineDefinitionError(
            f"{operator_id}: output column(s) {bad} are not allowed: a name must not be empty, start with _ "
            f"(the engine's columns) or be one of {list(reserved)}"
        )
    return aggregations


@dataclass
class RunningAggregate(Node):
    key: tuple[str, ...] = ()
    aggregations: tuple[Aggregation, ...] = ()

    def __post_init__(self) -> None:
        for agg in self.aggregations:
            if not agg.accumulators():
                raise PipelineDefinitionError(
                    f"{self.operator_id}: running aggregates support Count, Sum, Min, Max, Avg; "
                    f"got {type(agg).__name__} (it needs every value: use it in a window)"
                )

    def state_accumulators(self) -> list[Accumulator]:
        """The state columns: the count first (every key has one), then each aggregation's, once by name."""
        seen: dict[str, Accumulator] = {}
        for acc in (_CountAccumulator(), *(acc for agg in self.aggregations for acc in agg.accumulators())):
            seen.setdefault(acc.name, acc)
        return list(seen.values())

    def state_spec(self, key_types: dict[str, pa.DataType] | None = None) -> StateSpec:
        """The accumulators' table, its keys typed by ``key_types`` (string where not given)."""
        types = key_types or {}
        return StateSpec(
            operator_id=self.operator_id,
            name="accumulators",
            key_fields=tuple(pa.field(k, types.get(k, pa.string())) for k in self.key),
            value_fields=tuple(pa.field(acc.name, acc.type) for acc in self.state_accumulators()),
        )

    def state_specs(self) -> list[StateSpec]:
        return [self.state_spec()]

    # Arrival order never matters here: sums are exact (see the module docstring).
    needs_arrival_order = False

    def unique_by(self) -> tuple[str, ...]:
        return self.key  # one row per touched key

    def key_output(self) -> tuple[str, ...]:
        return self.key

    def apply(self, ctx: Any, df: "DataFrame") -> "DataFrame | pa.Table":
        """Fold the epoch's records into each touched key's accumulators.

        On the executors (the ``delta`` state backend) unless the pipeline
        chose the ``heap`` backend (:meth:`_apply_on_driver`).

        1. Aggregate the epoch per key natively (count, exact sums in
           micro-units with the flags of keys that need another method, min,
           max); cached, and one small job returns the count of flagged
           keys and the key groups touched.
        2. Join with the touched keys' prior accumulators, read from the
           state table for the touched key groups and keys only; or, while
           the whole live state fits the executors' copy, with every live
           row (:meth:`_merge_whole`).
        3. Merge with Spark's own double arithmetic; flagged keys get their
           epoch sum from :func:`_fallback_sum_frame`.
        4. Stage the changed keys as this epoch's state rows (written by the
           executors); return the output columns of the same cached rows.

        Where the keys are looked up in the Python workers' cache of state
        files and no key is flagged, steps 2-3 run in the tasks that look
        them up (:meth:`DeltaStateBackend.with_live_rows`).
        """
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema

        spec = self.state_spec(ctx.arrow_types(df, self.key))
        keyed = df.withColumn(KEY_GROUP, key_group_column(self.key, ctx.key_groups))
        aggregates = session_cached(("running_aggregate", self.aggregations), self._epoch_aggregates)
        if ctx.pipeline.state_backend == "heap":
            return self._apply_on_driver(ctx, spec, keyed, aggregates)
        # Step 1. Grouped by the key alone (its key group follows from it), so
        # the epoch is partitioned as the state read is and the join needs no
        # further shuffle.
        epoch = ctx.persist(
            df.groupBy(*self.key).agg(*aggregates).withColumn(KEY_GROUP, key_group_column(self.key, ctx.key_groups))
        )
        sums = [acc.source for acc in self.state_accumulators() if acc.exact_sum]
        flags = [F.col(f"_inexact_{col}") for col in sums]
        any_flag = F.lit(False)
        for flag in flags:
            any_flag = any_flag | flag
        summary = epoch.agg(
            F.count(F.lit(1)).alias("keys"), F.count_if(any_flag).alias("flagged"), F.collect_set(KEY_GROUP).alias("groups")
        ).first()
        flagged = summary["flagged"] if flags else 0
        # Step 2.
        whole = ctx.state.read_whole(spec, summary["keys"])
        if whole is not None:
            return self._merge_whole(ctx, spec, epoch, keyed, whole, flagged)
        groups = sorted(summary["groups"])
        files = None if flagged else ctx.state.lookup_files(spec, groups, summary["keys"])
        if files is not None:
            # Steps 2-3 in the tasks that look the keys up (the heap backend's
            # arithmetic, :meth:`_merge`): no join stage after the lookup, and
            # the state rows stay in their key-group ranges for the write.
            merge = partial(merged_in_task, self.key, self.state_accumulators(), spec.arrow_schema(), ctx.processing_time_ms, ctx.epoch)
            state = ctx.persist(ctx.state.with_live_rows(spec, files, epoch, merge, from_arrow_schema(spec.arrow_schema())))
            # Step 4.
            ctx.state.stage(spec, state, ranged=True)
            return ctx.cached_view(state.select(*self._outputs()))
        prior = ctx.state.read(spec, groups, keys=epoch, key_count=summary["keys"])
        previous = joinable(
            prior.select(*self.key, *[F.col(acc.name).alias(f"_prev_{acc.name}") for acc in self.state_accumulators()]), summary["keys"]
        )
        merged = epoch.join(previous, on=list(self.key), how="left")
        if flagged:
            for col in sums:
                merged = merged.join(_fallback_sum_frame(keyed, self.key, col, epoch), on=list(self.key), how="left")
        # Step 3.
        columns = [*[F.col(k) for k in self.key], F.col(KEY_GROUP)]
        columns += [value.alias(name) for name, value in self._merged_values(flagged)]
        state = ctx.persist(merged.select(*columns, F.lit(False).alias("_deleted")))
        # Step 4.
        ctx.state.stage(spec, state)
        return ctx.cached_view(state.select(*self._outputs()))

    def _merge_whole(
        self, ctx: Any, spec: StateSpec, epoch: "DataFrame", keyed: "DataFrame", live: "DataFrame", flagged: int
    ) -> "DataFrame":
        """Steps 2-4 when every live row fits the executors' copy (:meth:`DeltaStateBackend.read_whole`).

        The epoch's aggregates are joined with every live row (a full outer
        join), so the result is the whole live state after this epoch: it is
        materialized once on the executors (a local checkpoint), the changed
        keys are staged and emitted from it, and it is kept for the next
        epoch, which then reads no file. Values are those of the other path.
        """
        from pyspark.sql import functions as F

        accs = self.state_accumulators()
        previous = live.select(
            *self.key,
            F.col(KEY_GROUP).alias("_prev_group"),
            *[F.col(acc.name).alias(f"_prev_{acc.name}") for acc in accs],
            F.col("_updated_at_ms").alias("_prev_updated_at_ms"),
            F.col("_epoch").alias("_prev_epoch"),
        )
        merged = epoch.join(previous, on=list(self.key), how="full")
        if flagged:
            for acc in accs:
                if acc.exact_sum:
                    merged = merged.join(_fallback_sum_frame(keyed, self.key, acc.source, epoch), on=list(self.key), how="left")
        touched = F.col("_n").isNotNull()
        columns = [*[F.col(k) for k in self.key], F.coalesce(F.col(KEY_GROUP), F.col("_prev_group")).cast("int").alias(KEY_GROUP)]
        for name, value in self._merged_values(flagged):
            columns.append(F.when(touched, value).otherwise(F.col(f"_prev_{name}")).alias(name))
        columns += [
            F.when(touched, F.lit(ctx.processing_time_ms)).otherwise(F.col("_prev_updated_at_ms")).cast("long").alias("_updated_at_ms"),
            F.when(touched, F.lit(ctx.epoch)).otherwise(F.col("_prev_epoch")).cast("long").alias("_epoch"),
            touched.alias("_touched"),
        ]
        rows = merged.select(*columns)
        after = local_checkpoint(rows)
        kept = after is not None
        if after is None:  # this epoch only (see local_checkpoint)
            after = ctx.persist(rows)
        live_rows = after.count()  # materializes the checkpoint
        state = after.where(F.col("_touched")).select(
            *self.key, KEY_GROUP, *[acc.name for acc in accs], F.lit(False).alias("_deleted")
        )
        if kept:
            ctx.state.stage(spec, state, live=after.drop("_touched"), live_rows=live_rows)
        else:
            ctx.state.stage(spec, state)
        return ctx.cached_view(state.select(*self._outputs()))

    def _merged_values(self, flagged: int) -> list[tuple[str, "Column"]]:
        """Each accumulator after the epoch, from ``_prev_<name>`` and the epoch's aggregates (step 3)."""
        return [(acc.name, acc.merged(bool(flagged))) for acc in self.state_accumulators()]

    def _apply_on_driver(self, ctx: Any, spec: StateSpec, keyed: "DataFrame", aggregates: list["Column"]) -> pa.Table:
        """The heap backend: collect the epoch's aggregates and merge with resident state.

        1. Aggregate the epoch per key natively and collect it once.
        2. Read the touched keys' prior accumulators on the driver (resident
           between epochs, see :mod:`barrierflow.state.resident`).
        3. Merge with the same IEEE double arithmetic Spark would use
           (:func:`_merge`); keys whose sum could not be taken in micro-units
           get their epoch sum from :func:`_fallback_sums`.
        4. Stage the changed keys as this epoch's state rows; emit them as
           Arrow (already on the driver; see ``Node.accepts_arrow``).
        """
        # Step 1.
        aggregated = keyed.groupBy(*self.key, KEY_GROUP).agg(*aggregates)
        epoch = ctx.to_arrow(aggregated, ctx.arrow_schema(aggregated))
        key_groups = pc.unique(epoch[KEY_GROUP]).to_pylist()
        # Step 2.
        prior = ctx.state.read_arrow(spec, key_groups)
        # Step 3.
        state, flagged = self._merge(spec, epoch, prior, ctx.processing_time_ms, ctx.epoch)
        for col, keys in flagged.items():
            if keys.num_rows:
                state = _patch_sums(state, col, _fallback_sums(ctx, keyed, self.key, col, keys), self.key, keys)
        # Step 4.
        ctx.state.stage_arrow(spec, state)
        return self.outputs_arrow(state)

    def _outputs(self) -> list["Column"]:
        """The output columns (Avg = sum / count) of state rows in Spark."""
        from pyspark.sql import functions as F

        return [*[F.col(k) for k in self.key], *[agg.running_result().alias(agg.name) for agg in self.aggregations]]

    def _epoch_aggregates(self) -> list["Column"]:
        from pyspark.sql import functions as F

        return [F.count(F.lit(1)).alias("_n"), *[agg for acc in self.state_accumulators() for agg in acc.epoch_aggregates()]]

    def _merge(
        self, spec: StateSpec, epoch: pa.Table, prior: pa.Table, processing_time_ms: int, epoch_number: int
    ) -> tuple[pa.Table, dict[str, pa.Table]]:
        """New accumulators of the epoch's keys, and per sum column the keys for :func:`_fallback_sums`.

        Arithmetic as Spark's: count + n, double sum + the rounded exact
        epoch sum (0.0 for a flagged key, patched later), and ``least`` /
        ``greatest`` with Spark's NaN ordering (NaN above every number).
        """
        return _merge_rows(self.key, self.state_accumulators(), spec.arrow_schema(), processing_time_ms, epoch_number, epoch, prior)

    def outputs_arrow(self, state: pa.Table) -> pa.Table:
        """The output columns (Avg = sum / count, IEEE division) of the new state rows."""
        columns: dict[str, pa.ChunkedArray] = {k: state[k] for k in self.key}
        columns.update((agg.name, agg.running_result_arrow(state)) for agg in self.aggregations)
        return pa.table(columns)

    def chained_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema | None:
        """The output (keys, then each aggregation's running result) when the epoch can be folded in a task (``chaining.epoch_aggregates``)."""
        from barrierflow.execution.chaining import aggregates_in_a_task

        (schema,) = inputs
        if not all(k in schema.names and schema.field(k).type in (pa.string(), pa.int64()) for k in self.key):
            return None
        if not aggregates_in_a_task(self, schema):
            return None
        state = self.chained_state_specs(inputs)[0].arrow_schema()
        results = [pa.field(agg.name, agg.running_result_arrow(state.empty_table()).type) for agg in self.aggregations]
        return pa.schema([*(state.field(k) for k in self.key), *results])

    def chained_state_specs(self, inputs: Sequence[pa.Schema]) -> list[StateSpec]:
        (schema,) = inputs
        return [self.state_spec({k: schema.field(k).type for k in self.key})]

    def apply_chained(self, task: Any, inputs: Sequence[pa.Table]) -> pa.Table:
        """:meth:`apply`'s steps 1-4 in one task, with the heap backend's arithmetic (:func:`merged_in_task`), which equals Spark's."""
        from barrierflow.execution.chained_region import RegionDeclined
        from barrierflow.execution.chaining import epoch_aggregates

        (records,) = inputs
        [spec] = self.chained_state_specs([records.schema])
        try:  # 1.
            epoch = epoch_aggregates(self, records, task.key_groups)
        except ValueError as exc:  # a key Spark would flag for another summation method
            raise RegionDeclined(f"{self.operator_id}: {exc}") from None
        live = task.live_rows(spec, epoch.select([*self.key, KEY_GROUP]))  # 2.
        state = merged_in_task(self.key, self.state_accumulators(), spec.arrow_schema(), task.processing_time_ms, task.epoch, epoch, live)  # 3.
        task.stage(spec, state.drop_columns(["_updated_at_ms", "_epoch"]))  # 4.
        return self.outputs_arrow(state)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "key": list(self.key), "aggregations": [a.name for a in self.aggregations]}


def _merge_rows(
    key: tuple[str, ...],
    accs: list[Accumulator],
    schema: pa.Schema,
    processing_time_ms: int,
    epoch_number: int,
    epoch: pa.Table,
    prior: pa.Table,
) -> tuple[pa.Table, dict[str, pa.Table]]:
    """:meth:`RunningAggregate._merge` of the keys in ``epoch``, for the state table's ``schema``."""
    previous = prior.select([*key, *[acc.name for acc in accs]]).rename_columns([*key, *[f"_prev_{acc.name}" for acc in accs]])
    merged = epoch.join(previous, keys=list(key), join_type="left outer")
    columns: dict[str, pa.ChunkedArray] = {k: merged[k] for k in key}
    columns[KEY_GROUP] = merged[KEY_GROUP]
    flagged: dict[str, pa.Table] = {}
    for acc in accs:
        columns[acc.name] = acc.merged_arrow(merged)
        keys = acc.flagged_keys(merged, key)
        if keys is not None:
            flagged[acc.source] = keys
    n = merged.num_rows
    columns["_updated_at_ms"] = pa.array([processing_time_ms] * n, pa.int64())
    columns["_deleted"] = pa.array([False] * n, pa.bool_())
    columns["_epoch"] = pa.array([epoch_number] * n, pa.int64())
    return pa.table(columns).cast(schema), flagged


def merged_in_task(
    key: tuple[str, ...], accs: list[Accumulator], schema: pa.Schema, processing_time_ms: int, epoch_number: int,
    epoch: pa.Table, live: pa.Table,
) -> pa.Table:
    """Executor side: a task's epoch aggregates merged with their keys' ``live`` rows (no key flagged: see :meth:`RunningAggregate.apply`)."""
    # The epoch's keys as the state table types them, for the join.
    typed = epoch
    for k in key:
        typed = typed.set_column(typed.schema.get_field_index(k), k, typed[k].cast(schema.field(k).type))
    state, _ = _merge_rows(key, accs, schema, processing_time_ms, epoch_number, typed, live)
    return state


def _fallback_sum_exprs(column: str) -> tuple["Column", "Column", "Column"]:
    """Per key: whether ``column`` needs the sorted fold, its exact decimal sum, its sorted fold."""
    from pyspark.sql import functions as F

    value = F.col(column).cast("double")
    exact = value.try_cast(_EXACT_SUM_TYPE)
    is_exact = exact.isNotNull() & (exact.cast("double") == value)
    bound = F.max(F.when(is_exact, F.abs(value))) * F.count_if(is_exact)
    inexact = (F.count_if(value.isNotNull() & ~is_exact) > 0) | F.coalesce(bound >= F.lit(_EXACT_SUM_BOUND), F.lit(False))
    values = F.array_sort(F.collect_list(value))
    return (
        inexact,
        # try_sum: never raises; a key that could overflow is inexact above.
        F.coalesce(F.try_sum(F.when(is_exact, exact)).cast("double"), F.lit(0.0)),
        F.aggregate(values, F.lit(0.0), lambda acc, x: acc + x),
    )


def _fallback_sum_frame(keyed: "DataFrame", key: tuple[str, ...], column: str, epoch: "DataFrame") -> "DataFrame":
    """``_fsum_<column>`` of the keys ``epoch`` flags for ``column`` (methods 2 and 3 of the module docstring)."""
    from pyspark.sql import functions as F

    wanted = epoch.where(F.col(f"_inexact_{column}")).select(*key)
    inexact, exact_sum, sorted_sum = _fallback_sum_exprs(column)
    return (
        keyed.join(wanted, on=list(key), how="left_semi")
        .groupBy(*key)
        .agg(F.when(inexact, sorted_sum).otherwise(exact_sum).alias(f"_fsum_{column}"))
    )


def _fallback_sums(
    ctx: Any, keyed: "DataFrame", key: tuple[str, ...], column: str, keys: pa.Table
) -> dict[tuple[Any, ...], float]:
    """Epoch sums of ``column`` for ``keys`` (methods 2 and 3 of the module docstring).

    The exact ``decimal(38,18)`` sum, or for a key with a value outside that
    range (or values large enough that a partial sum could overflow it) the
    values folded sorted ascending. Both depend only on the key's values,
    never on how Spark partitioned them.
    """
    from pyspark.sql import functions as F

    wanted = ctx.spark.createDataFrame(keys)
    inexact, exact_sum, sorted_sum = _fallback_sum_exprs(column)
    sums = (
        keyed.join(F.broadcast(wanted), on=list(key), how="left_semi")
        .groupBy(*key)
        .agg(inexact.alias("_inexact"), exact_sum.alias("_exact"), sorted_sum.alias("_sorted"))
    )
    return {tuple(row[k] for k in key): row["_sorted"] if row["_inexact"] else row["_exact"] for row in sums.collect()}


def _patch_sums(
    state: pa.Table, column: str, sums: dict[tuple[Any, ...], float], key: tuple[str, ...], keys: pa.Table
) -> pa.Table:
    """Add the fallback epoch sums of ``keys`` to their (base) ``sum_<column>``.

    The merge left those keys at their prior sum (epoch sum 0.0), so the
    patched value is exactly base + sorted-fold sum.
    """
    name = f"sum_{column}"
    wanted = set(zip(*(keys[k].to_pylist() for k in key)))
    current = state[name].to_pylist()
    rows = zip(*(state[k].to_pylist() for k in key))
    values = [value + sums[row] if row in wanted else value for row, value in zip(rows, current)]
    return state.set_column(state.schema.get_field_index(name), name, pa.array(values, pa.float64()))


def _least(prev: pa.ChunkedArray, value: pa.ChunkedArray) -> pa.ChunkedArray:
    """Spark's ``least(prev, value)`` on doubles: nulls skipped, NaN above every number."""
    take_value = pc.or_kleene(
        pc.is_null(prev),
        pc.and_kleene(pc.is_valid(value), pc.or_kleene(pc.is_nan(prev), pc.less(value, prev))),
    )
    return pc.if_else(pc.fill_null(take_value, False), value, prev)


def _greatest(prev: pa.ChunkedArray, value: pa.ChunkedArray) -> pa.ChunkedArray:
    """Spark's ``greatest(prev, value)`` on doubles: nulls skipped, NaN above every number."""
    take_value = pc.or_kleene(
        pc.is_null(prev),
        pc.and_kleene(
            pc.is_valid(value),
            pc.and_kleene(pc.invert(pc.is_nan(prev)), pc.or_kleene(pc.is_nan(value), pc.greater(value, prev))),
        ),
    )
    return pc.if_else(pc.fill_null(take_value, False), value, prev)
