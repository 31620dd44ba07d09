"""Running aggregates per key: count, sum, min, max and average over all records so far.

Each key keeps one state row of accumulators (the table
``<operator_id>__accumulators``): ``count``, then per aggregated column
``sum_<c>``, ``min_<c>``, ``max_<c>`` as the declared aggregations need them
(``Sum("v")`` and ``Avg("v")`` share one ``sum_v``). Epoch n:

1. Aggregates its records per key: how many, the exact sum of each summed
   column (below), the least and greatest value of each min/max column
   (nulls skipped; NaN above every number; of -0.0 and 0.0, -0.0 is the
   least), all as doubles.
2. Reads the touched keys' accumulators as of epoch n-1.
3. Merges: ``count + n``; ``sum + epoch sum`` (one IEEE addition of the
   rounded exact epoch sum); ``least``/``greatest`` of the stored value and
   the epoch's, the stored one kept on a tie.
4. Stages the touched keys' new accumulators and emits one row per touched
   key: the key, then each aggregation's running result (``Avg`` = sum /
   count, an IEEE division).

Results never depend on record order, partitioning or parallelism: running
sums need no arrival order. An epoch's sum per key is the exact sum of the
values' decimal forms (the shortest decimal that reads back as the double),
rounded once to a double. Which exact method a key uses depends only on its
epoch's values:

a. Micro-units: every value is below 1e9 in magnitude and a whole number of
   millionths (``rint(v * 1e6) / 1e6 == v``): integer sum of the
   millionths, exact while it stays below 2**53, then one IEEE division.
b. Otherwise ``decimal(38,18)``: every value's decimal form has at most 18
   decimals and is below 1e20, and the largest times the count stays below
   1e19: their exact decimal sum.
c. Otherwise (a value outside that range, NaN or an infinity, or values so
   large that a partial sum could overflow): the epoch's values sorted
   ascending (NaN last) and folded from 0.0.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Context, Decimal
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.api.aggregations import Aggregation, Avg, Count, Max, Min, Percentile, Sum, named_aggregations
from barrierflow.core.arrow import as_double, null_safe_keys, row_numbers
from barrierflow.core.columns import DELETED, KEY_GROUP
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.base import Node, Task, with_key_group
from barrierflow.state.spec import StateSpec

__all__ = [
    "RunningAggregate", "Aggregation", "Count", "Sum", "Min", "Max", "Avg", "Percentile", "named_aggregations",
    "accumulator_columns", "epoch_sums",
]  # fmt: skip

MICRO = 1e6
MICRO_VALUE_BOUND = 1e9
MICRO_SUM_BOUND = 2**53
LONG_BOUND = 9e18
_DECIMAL_VALUE_BOUND = Decimal(10) ** 20
_DECIMAL_SUM_BOUND = 1e19
_EXACT = Context(prec=60)


def accumulator_columns(aggregations: Sequence[Aggregation]) -> list[tuple[str, str | None, str]]:
    """The state's accumulators ``(name, column, kind)``: the count first, then each aggregation's, once by name."""
    seen: dict[str, tuple[str, str | None, str]] = {"count": ("count", None, "count")}
    for agg in aggregations:
        column = agg.value_column
        if isinstance(agg, Count):
            continue
        if isinstance(agg, (Sum, Avg)):
            seen.setdefault(f"sum_{column}", (f"sum_{column}", column, "sum"))
        elif isinstance(agg, Min):
            seen.setdefault(f"min_{column}", (f"min_{column}", column, "min"))
        elif isinstance(agg, Max):
            seen.setdefault(f"max_{column}", (f"max_{column}", column, "max"))
    return list(seen.values())


@dataclass
class RunningAggregate(Node):
    key: tuple[str, ...] = ()
    aggregations: tuple[Aggregation, ...] = ()

    # Arrival order never matters here: sums are exact (see the module docstring).
    needs_arrival_order = False

    def __post_init__(self) -> None:
        for agg in self.aggregations:
            if not isinstance(agg, (Count, Sum, Min, Max, Avg)):
                raise PipelineDefinitionError(
                    f"{self.operator_id}: running aggregates support Count, Sum, Min, Max, Avg; "
                    f"got {type(agg).__name__} (it needs every value: use it in a window)"
                )

    def state_spec(self, key_types: dict[str, pa.DataType] | None = None) -> StateSpec:
        """The accumulators' table, its keys typed by ``key_types`` (string where not given)."""
        types = key_types or {}
        return StateSpec(
            operator_id=self.operator_id,
            name="accumulators",
            key_fields=tuple(pa.field(k, types.get(k, pa.string())) for k in self.key),
            value_fields=tuple(
                pa.field(name, pa.int64() if kind == "count" else pa.float64())
                for name, _, kind in accumulator_columns(self.aggregations)
            ),
        )

    def state_specs(self, inputs: Sequence[pa.Schema] | None = None) -> list[StateSpec]:
        if not inputs:
            return [self.state_spec()]
        (schema,) = inputs
        return [self.state_spec({k: schema.field(k).type for k in self.key})]

    def unique_by(self) -> tuple[str, ...]:
        return self.key  # one row per touched key

    def key_output(self) -> tuple[str, ...]:
        return self.key

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        (schema,) = inputs
        for agg in self.aggregations:
            column = agg.value_column
            if column is not None and (column not in schema.names or not _numeric(schema.field(column).type)):
                found = schema.field(column).type if column in schema.names else "no such column"
                raise PipelineDefinitionError(
                    f"{self.operator_id}: {type(agg).__name__}({column!r}) needs a numeric column (found: {found})"
                )
        fields = [schema.field(k) for k in self.key]
        fields += [pa.field(agg.name, pa.int64() if isinstance(agg, Count) else pa.float64()) for agg in self.aggregations]
        return pa.schema(fields)

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        (records,) = inputs
        [spec] = self.state_specs([records.schema])
        accumulators = accumulator_columns(self.aggregations)
        epoch = _epoch_aggregates(self.key, accumulators, with_key_group(records, self.key, task.key_groups))  # 1.
        table = task.state(spec)
        prior = table.live_rows(epoch.select([*self.key, KEY_GROUP]))  # 2.
        state = _merged(self.key, accumulators, spec, epoch, prior)  # 3.
        table.stage(state)  # 4.
        return self.outputs(state)

    def outputs(self, state: pa.Table) -> pa.Table:
        """The output columns of state rows: the key, each aggregation's running result."""
        columns: dict[str, Any] = {k: state[k] for k in self.key}
        for agg in self.aggregations:
            if isinstance(agg, Count):
                columns[agg.name] = state["count"]
            elif isinstance(agg, Avg):
                columns[agg.name] = pc.divide(state[f"sum_{agg.value_column}"], pc.cast(state["count"], pa.float64()))
            else:
                kind = "sum" if isinstance(agg, Sum) else "min" if isinstance(agg, Min) else "max"
                columns[agg.name] = state[f"{kind}_{agg.value_column}"]
        return pa.table(columns)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "key": list(self.key), "aggregations": [a.name for a in self.aggregations]}


def _numeric(type_: pa.DataType) -> bool:
    return pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_decimal(type_)


def _epoch_aggregates(key: tuple[str, ...], accumulators: list[tuple[str, str | None, str]], records: pa.Table) -> pa.Table:
    """Step 1: one row per key of the epoch: the key, its key group, ``_n`` and ``_e_<accumulator>``."""
    names = list(key)
    keys = null_safe_keys(records, names)
    group_names = keys.column_names
    table = keys.append_column(KEY_GROUP, records[KEY_GROUP]).append_column("_row", row_numbers(records.num_rows))
    specs: list[tuple[str, str]] = [(KEY_GROUP, "min"), ("_row", "min"), ("_row", "count")]
    values = {column: as_double(records[column]) for _, column, _ in accumulators if column is not None}
    grouped = table.group_by(group_names, use_threads=False).aggregate(specs)
    # Keys in order of their first record (deterministic, whatever the partitioning).
    order = pc.sort_indices(grouped["_row_min"])
    grouped = grouped.take(order)
    first_rows = grouped["_row_min"]
    out: dict[str, Any] = {k: records[k].take(first_rows) for k in names}
    out[KEY_GROUP] = grouped[f"{KEY_GROUP}_min"]
    out["_n"] = grouped["_row_count"]
    # Each record's position among the epoch's keys, for the per-key folds below.
    group_of = _group_index(table, group_names, grouped)
    for name, column, kind in accumulators:
        if column is None:
            continue
        if kind == "sum":
            out[f"_e_{name}"] = epoch_sums(values[column], group_of, grouped.num_rows)
        else:
            out[f"_e_{name}"] = _extremes(values[column], group_of, grouped.num_rows, kind)
    return pa.table(out)


def _group_index(table: pa.Table, group_names: list[str], grouped: pa.Table) -> np.ndarray:
    """Each row's index among ``grouped``'s keys."""
    index = grouped.select(group_names).append_column("_g", row_numbers(grouped.num_rows))
    joined = table.select([*group_names, "_row"]).join(index, keys=group_names, join_type="left outer", use_threads=False)
    out = np.empty(table.num_rows, dtype=np.int64)
    out[joined["_row"].to_numpy()] = joined["_g"].to_numpy()
    return out


def epoch_sums(values: pa.ChunkedArray | pa.Array, group_of: np.ndarray, groups: int) -> pa.Array:
    """Each group's exact sum of its non-null ``values`` (methods a-c of the module docstring), as doubles."""
    v = np.asarray(pc.fill_null(values, 0.0).to_numpy(zero_copy_only=False), dtype=np.float64)
    valid = np.asarray(pc.is_valid(values).to_numpy(zero_copy_only=False), dtype=bool)
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = np.rint(v * MICRO)
        exact = valid & np.isfinite(v) & (np.abs(v) < MICRO_VALUE_BOUND) & (scaled / MICRO == v)
    units = np.where(exact, scaled, 0).astype(np.int64)
    # a. Micro-units: per group the integer sum, the largest magnitude, and whether every value was exact.
    total = np.zeros(groups, dtype=np.int64)
    np.add.at(total, group_of, units)
    largest = np.zeros(groups, dtype=np.int64)
    np.maximum.at(largest, group_of, np.abs(units))
    count = np.bincount(group_of, minlength=groups)
    inexact = np.zeros(groups, dtype=bool)
    np.logical_or.at(inexact, group_of, valid & ~exact)
    inexact |= largest.astype(np.float64) * count >= LONG_BOUND
    inexact |= np.abs(total) >= MICRO_SUM_BOUND
    sums = total.astype(np.float64) / MICRO
    for g in np.flatnonzero(inexact):
        members = v[(group_of == g) & valid]
        sums[g] = _fallback_sum(members.tolist())
    return pa.array(sums, pa.float64())


def _fallback_sum(values: list[float]) -> float:
    """Methods b and c for one key's values."""
    decimals = []
    for value in values:
        if value != value or value in (float("inf"), float("-inf")):
            break
        exact = Decimal(repr(value))
        if exact.as_tuple().exponent < -18 or abs(exact) >= _DECIMAL_VALUE_BOUND:  # type: ignore[operator]
            break
        decimals.append(exact)
    else:
        largest = max((abs(v) for v in values), default=0.0)
        if largest * len(values) < _DECIMAL_SUM_BOUND:
            return float(_EXACT.create_decimal(sum(decimals, Decimal(0))))  # b.
    total = 0.0  # c.
    for value in sorted(values, key=lambda x: (x != x, x)):  # NaN last
        total += value
    return total


def _extremes(values: pa.ChunkedArray | pa.Array, group_of: np.ndarray, groups: int, kind: str) -> pa.Array:
    """Each group's least (``min``) or greatest (``max``) non-null value; NaN above every number; -0.0 below 0.0."""
    v = np.asarray(pc.fill_null(values, 0.0).to_numpy(zero_copy_only=False), dtype=np.float64)
    valid = np.asarray(pc.is_valid(values).to_numpy(zero_copy_only=False), dtype=bool)
    nan = np.isnan(v) & valid
    numbers = valid & ~nan
    has_number = np.zeros(groups, dtype=bool)
    np.logical_or.at(has_number, group_of, numbers)
    has_nan = np.zeros(groups, dtype=bool)
    np.logical_or.at(has_nan, group_of, nan)
    if kind == "min":
        out = np.full(groups, np.inf)
        np.minimum.at(out, group_of[numbers], v[numbers])
        negative_zero = np.zeros(groups, dtype=bool)
        np.logical_or.at(negative_zero, group_of[numbers], (v[numbers] == 0) & np.signbit(v[numbers]))
        out = np.where((out == 0) & negative_zero, -0.0, out)
        out = np.where(has_number, out, np.nan)
    else:
        out = np.full(groups, -np.inf)
        np.maximum.at(out, group_of[numbers], v[numbers])
        positive_zero = np.zeros(groups, dtype=bool)
        np.logical_or.at(positive_zero, group_of[numbers], (v[numbers] == 0) & ~np.signbit(v[numbers]))
        out = np.where((out == 0) & positive_zero, 0.0, out)
        out = np.where(has_nan, np.nan, out)
    return pa.array(out, pa.float64(), mask=~(has_number | has_nan))


def _merged(
    key: tuple[str, ...], accumulators: list[tuple[str, str | None, str]], spec: StateSpec, epoch: pa.Table, prior: pa.Table
) -> pa.Table:
    """Step 3: the touched keys' accumulators after the epoch (key columns, key group, values, ``_deleted``)."""
    names = list(key)
    previous = prior.select([*names, *[n for n, _, _ in accumulators]])
    previous = previous.rename_columns([*names, *[f"_prev_{n}" for n, _, _ in accumulators]])
    typed = epoch
    for k in names:  # the epoch's keys as the state table types them, for the join
        typed = typed.set_column(typed.schema.get_field_index(k), k, typed[k].cast(spec.arrow_schema().field(k).type))
    typed = typed.append_column("_order", row_numbers(typed.num_rows))
    merged = typed.join(previous, keys=names, join_type="left outer", use_threads=False).sort_by("_order")
    columns: dict[str, Any] = {k: merged[k] for k in names}
    columns[KEY_GROUP] = merged[KEY_GROUP]
    for name, _, kind in accumulators:
        prev = merged[f"_prev_{name}"]
        if kind == "count":
            columns[name] = pc.add(pc.fill_null(prev, 0), merged["_n"])
        elif kind == "sum":
            columns[name] = pc.add(pc.fill_null(prev, 0.0), pc.fill_null(merged[f"_e_{name}"], 0.0))
        elif kind == "min":
            columns[name] = _least(prev, merged[f"_e_{name}"])
        else:
            columns[name] = _greatest(prev, merged[f"_e_{name}"])
    columns[DELETED] = pa.repeat(pa.scalar(False), merged.num_rows)
    schema = spec.arrow_schema()
    return pa.table(columns).cast(
        pa.schema([schema.field(n) for n in [*names, KEY_GROUP, *(a for a, _, _ in accumulators), DELETED]])
    )


def _least(prev: pa.ChunkedArray, value: pa.ChunkedArray) -> pa.ChunkedArray:
    """``least(prev, value)`` on doubles: nulls skipped, NaN above every number, ``prev`` on a tie."""
    take_value = pc.or_kleene(
        pc.is_null(prev),
        pc.and_kleene(pc.is_valid(value), pc.or_kleene(pc.is_nan(prev), pc.less(value, prev))),
    )
    return pc.if_else(pc.fill_null(take_value, False), value, prev)


def _greatest(prev: pa.ChunkedArray, value: pa.ChunkedArray) -> pa.ChunkedArray:
    """``greatest(prev, value)`` on doubles: nulls skipped, NaN above every number, ``prev`` on a tie."""
    take_value = pc.or_kleene(
        pc.is_null(prev),
        pc.and_kleene(
            pc.is_valid(value),
            pc.and_kleene(pc.invert(pc.is_nan(prev)), pc.or_kleene(pc.is_nan(value), pc.greater(value, prev))),
        ),
    )
    return pc.if_else(pc.fill_null(take_value, False), value, prev)
