"""Running aggregates per key: count, sum, min, max and average over all records so far.

Each key keeps one row of accumulators in ``<operator_id>__accumulators``: ``count``, then ``sum_<c>``, ``min_<c>``, ``max_<c>``
as the aggregations need them (``Sum("v")`` and ``Avg("v")`` share ``sum_v``). Epoch n:

1. Aggregates its records per key, as doubles: how many, each summed column's exact sum (below), each min/max column's least and
   greatest value (nulls skipped; NaN above every number; -0.0 below 0.0).
2. Reads the touched keys' accumulators as of epoch n-1.
3. Merges: ``count + n``; ``sum + epoch sum`` (one IEEE addition); the least/greatest of the stored value and the epoch's, the
   stored on a tie.
4. Stages them and emits one row per touched key: the key, then each aggregation's running result (``Avg`` = sum / count).

Results never depend on record order or parallelism: a key's epoch sum is the exact sum of its values' decimal forms (the shortest
reading back as the double), rounded once, by the first method that applies:

a. all whole millionths below 1e9: their integer sum (exact below 2**53) / 1e6;
b. all of at most 18 decimals, the largest times the count below 1e19: their exact ``decimal(38,18)`` sum;
c. otherwise (NaN, infinities, out of range): the values sorted ascending (NaN last), folded from 0.0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.api.aggregations import Aggregation, Avg, Count, Max, Min, Sum
from barrierflow.core.arrow import as_double
from barrierflow.core.columns import DELETED, KEY_GROUP
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.base import Node, Task, check_numeric_columns, folded_sums, ids_in, key_fields, key_ids, with_key_group
from barrierflow.state.spec import StateSpec

__all__ = ["RunningAggregate", "accumulator_columns", "epoch_sums"]

MICRO = 1e6
MICRO_VALUE_BOUND = 1e9
MICRO_SUM_BOUND = 2**53
LONG_BOUND = 9e18
DECIMAL_SUM_BOUND = 1e19
_SIGN = np.int64(0x7FFFFFFFFFFFFFFF)


def _accumulator(agg: Aggregation) -> tuple[str, str | None, str]:
    """The accumulator ``(name, column, kind)`` an aggregation reads."""
    kind = next(k for t, k in ((Count, "count"), ((Sum, Avg), "sum"), (Min, "min"), (Max, "max")) if isinstance(agg, t))
    return (kind, None, kind) if kind == "count" else (f"{kind}_{agg.value_column}", agg.value_column, kind)


def accumulator_columns(aggregations: Sequence[Aggregation]) -> list[tuple[str, str | None, str]]:
    """The state's accumulators ``(name, column, kind)``: the count first, then each aggregation's, once by name."""
    return list(dict.fromkeys([("count", None, "count"), *map(_accumulator, aggregations)]))


@dataclass
class RunningAggregate(Node):
    key: tuple[str, ...] = ()
    aggregations: tuple[Aggregation, ...] = ()

    def __post_init__(self) -> None:
        for agg in self.aggregations:
            if not isinstance(agg, (Count, Sum, Min, Max, Avg)):
                raise PipelineDefinitionError(
                    f"{self.operator_id}: running aggregates support Count, Sum, Min, Max, Avg; "
                    f"got {type(agg).__name__} (it needs every value: use it in a window)"
                )

    def state_specs(self, inputs: Sequence[pa.Schema] | None = None) -> list[StateSpec]:
        values = tuple(
            pa.field(n, pa.int64() if n == "count" else pa.float64()) for n, *_ in accumulator_columns(self.aggregations)
        )
        return [StateSpec(self.operator_id, "accumulators", key_fields(self.key, inputs[0] if inputs else None), values)]

    def unique_by(self) -> tuple[str, ...]:
        return self.key  # one row per touched key

    def key_output(self) -> tuple[str, ...]:
        return self.key

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        (schema,) = inputs
        check_numeric_columns(self.operator_id, self.aggregations, schema)
        results = [pa.field(agg.name, pa.int64() if isinstance(agg, Count) else pa.float64()) for agg in self.aggregations]
        return pa.schema([*(schema.field(k) for k in self.key), *results])

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        (records,) = inputs
        [spec] = self.state_specs([records.schema])
        key = [KEY_GROUP, *self.key]
        records = with_key_group(records, self.key, task.key_groups)
        keys, (group_of,) = key_ids([records.select(key)], key)  # 1. the epoch's keys, each record's among them
        n = keys.num_rows
        prior = task.state(spec).live_rows(keys)  # 2.
        at = np.full(n, -1, dtype=np.int64)
        at[ids_in(keys, prior, self.key)] = np.arange(prior.num_rows)
        prior = prior.take(pa.array(at, mask=at < 0))  # each key's row, null if none
        columns: dict[str, Any] = {k: keys[k] for k in [*self.key, KEY_GROUP]}
        for name, column, kind in accumulator_columns(self.aggregations):  # 1. and 3.
            if kind == "count":
                columns[name] = pc.add(pc.fill_null(prior[name], 0), pa.array(np.bincount(group_of, minlength=n)))
            elif kind == "sum":
                columns[name] = pc.add(pc.fill_null(prior[name], 0.0), epoch_sums(as_double(records[column]), group_of, n))
            else:
                least = kind == "min"
                columns[name] = _merged(prior[name], _extremes(as_double(records[column]), group_of, n, least), least)
        columns[DELETED] = pa.repeat(pa.scalar(False), n)
        state = pa.table(columns).cast(pa.schema([spec.arrow_schema().field(c) for c in columns]))
        task.state(spec).stage(state)  # 4. the new accumulators; each aggregation's running result (Avg = sum / count)
        out = {k: state[k] for k in self.key}
        for agg in self.aggregations:
            accumulator = state[_accumulator(agg)[0]]
            out[agg.name] = pc.divide(accumulator, pc.cast(state["count"], pa.float64())) if isinstance(agg, Avg) else accumulator
        return pa.table(out)


def _doubles(values: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Doubles as numpy: the values (nulls as 0.0) and whether each is valid."""
    filled = pc.fill_null(values, 0.0).to_numpy(zero_copy_only=False)
    return np.asarray(filled, dtype=np.float64), np.asarray(pc.is_valid(values).to_numpy(zero_copy_only=False), dtype=bool)


@np.errstate(invalid="ignore", over="ignore")  # NaN and infinities are values (method c)
def epoch_sums(values: pa.ChunkedArray | pa.Array, group_of: np.ndarray, groups: int) -> pa.Array:
    """Each group's exact sum of its non-null ``values`` (methods a-c of the module docstring), as doubles. Vector operations, no
    Python call per group or value: the values sorted by group, each method reducing the slices of the groups it applies to (c's
    sorted ascending within each, NaN last; a's and b's sums are exact in any order)."""
    v, valid = _doubles(values)
    of = group_of[valid]
    order = np.argsort(of)  # any order within a group: c sorts its own below
    v, of = v[valid][order], of[order]
    starts = np.flatnonzero(np.diff(of, prepend=-1))
    counts = np.diff(starts, append=len(v))
    sums = np.zeros(groups)
    # a. Micro-units.
    scaled = np.rint(v * MICRO)
    micro = np.isfinite(v) & (np.abs(v) < MICRO_VALUE_BOUND) & (scaled / MICRO == v)
    units = np.where(micro, scaled, 0).astype(np.int64)
    total = np.add.reduceat(units, starts)
    a = np.logical_and.reduceat(micro, starts) & (np.abs(total) < MICRO_SUM_BOUND)
    a &= np.maximum.reduceat(np.abs(units), starts).astype(np.float64) * counts < LONG_BOUND
    sums[of[starts[a]]] = total[a] / MICRO
    # b. Arrow's text of a double is its shortest decimal form (repr's digits), Arrow's decimal sum exact.
    b = ~a & np.logical_and.reduceat(np.isfinite(v), starts)
    b &= np.maximum.reduceat(np.abs(v), starts) * counts < DECIMAL_SUM_BOUND  # so each value below 1e19
    in_b = np.repeat(b, counts)
    text = pc.cast(pa.array(v[in_b]), pa.string())
    form = pc.extract_regex(text, r"^-?\d*(?:\.(?P<fraction>\d+))?(?:e\+?(?P<exponent>-?\d+))?$")
    decimals = pc.subtract(
        pc.utf8_length(form.field("fraction")), pc.cast(pc.replace_substring_regex(form.field("exponent"), "^$", "0"), pa.int32())
    )
    fits = np.ones(len(v), dtype=bool)
    fits[in_b] = pc.less_equal(decimals, 18).to_numpy(zero_copy_only=False)
    b &= np.logical_and.reduceat(fits, starts)
    kept = np.repeat(b, counts)
    forms = pa.table({"of": of[kept], "form": pc.cast(text.filter(kept[in_b]), pa.decimal128(38, 18))})
    exact = forms.group_by("of").aggregate([("form", "sum")])
    sums[exact["of"].to_numpy()] = as_double(exact["form_sum"]).to_numpy()  # rounded once
    c = ~a & ~b  # c.
    in_c = np.repeat(c, counts)
    ascending = np.lexsort((v[in_c], of[in_c]))
    sums[of[starts[c]]] = folded_sums(np.concatenate([[0], np.cumsum(counts[c])]), v[in_c][ascending])
    return pa.array(sums, pa.float64())


def _extremes(values: pa.ChunkedArray | pa.Array, group_of: np.ndarray, groups: int, least: bool) -> pa.Array:
    """Each group's least (or greatest) non-null value, NaN above every number, -0.0 below 0.0: the doubles' total order."""
    v, valid = _doubles(values)
    bits = np.where(np.isnan(v), np.nan, v).view(np.int64)  # one NaN, positive: above +inf
    order = bits ^ ((bits >> 63) & _SIGN)  # as integers in the doubles' order (the map is its own inverse)
    out = np.full(groups, np.iinfo(np.int64).max if least else np.iinfo(np.int64).min)
    (np.minimum if least else np.maximum).at(out, group_of[valid], order[valid])
    found = np.zeros(groups, dtype=bool)
    found[group_of[valid]] = True
    return pa.array((out ^ ((out >> 63) & _SIGN)).view(np.float64), pa.float64(), mask=~found)


def _merged(prev: pa.ChunkedArray, value: pa.ChunkedArray, least: bool) -> pa.ChunkedArray:
    """``least`` (else ``greatest``) of ``prev`` and ``value`` as Spark's: nulls skipped, NaN above all, ``prev`` on a tie."""
    nan = pc.is_nan(prev)
    if least:
        better = pc.or_kleene(nan, pc.less(value, prev))
    else:
        better = pc.and_kleene(pc.invert(nan), pc.or_kleene(pc.is_nan(value), pc.greater(value, prev)))
    take = pc.or_kleene(pc.is_null(prev), pc.and_kleene(pc.is_valid(value), better))
    return pc.if_else(pc.fill_null(take, False), value, prev)
