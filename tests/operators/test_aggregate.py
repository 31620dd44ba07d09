"""The running aggregate's kernel: exact epoch sums, least/greatest, carried across epochs."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pyarrow as pa

from barrierflow.api.aggregations import Avg, Count, Max, Min, Sum
from barrierflow.operators.aggregate import RunningAggregate, epoch_sums
from harness import live_state, run_both, upstream

RECORDS = pa.schema([("k", pa.string()), ("v", pa.float64()), ("_seq", pa.int64())])


def _node() -> RunningAggregate:
    return RunningAggregate(
        operator_id="totals", parent=upstream(), key=("k",),
        aggregations=(Count(name="n"), Sum("v", "total"), Min("v", "low"), Max("v", "high"), Avg("v", "mean")),
    )  # fmt: skip


def _records(rows: list[tuple[str | None, float | None]]) -> pa.Table:
    return pa.Table.from_pylist([{"k": k, "v": v, "_seq": i} for i, (k, v) in enumerate(rows)], schema=RECORDS)


def test_one_row_per_touched_key_with_its_running_results_across_epochs() -> None:
    node = _node()
    [spec] = node.state_specs([RECORDS])
    first = run_both(node, [_records([("a", 1.5), ("b", 2.0), ("a", 2.5), ("b", None)])])
    assert sorted(first.output.to_pylist(), key=lambda r: r["k"]) == [
        {"k": "a", "n": 2, "total": 4.0, "low": 1.5, "high": 2.5, "mean": 2.0},
        {"k": "b", "n": 2, "total": 2.0, "low": 2.0, "high": 2.0, "mean": 1.0},
    ]
    state = {spec.table_name: live_state(spec, None, first.changes[spec.table_name], epoch=1)}
    second = run_both(node, [_records([("a", -3.0), ("c", 7.25)])], state=state, epoch=2)
    assert sorted(second.output.to_pylist(), key=lambda r: r["k"]) == [
        {"k": "a", "n": 3, "total": 1.0, "low": -3.0, "high": 2.5, "mean": 1 / 3},
        {"k": "c", "n": 1, "total": 7.25, "low": 7.25, "high": 7.25, "mean": 7.25},
    ]
    assert sorted(second.changes[spec.table_name]["k"].to_pylist()) == ["a", "c"]  # only the touched keys


def _exact(values: list[float]) -> float:
    """The reference: the exact sum of the values' decimal forms, rounded once (methods a and b)."""
    return float(sum((Fraction(Decimal(repr(v))) for v in values), Fraction(0)))


def test_epoch_sums_are_exact_over_decimal_forms_whatever_the_order() -> None:
    rng = np.random.default_rng(7)
    groups = 50
    values = np.array(
        [round(x, int(d)) for x, d in zip(rng.uniform(-1000, 1000, 5000), rng.integers(0, 9, 5000))]
    )  # micro-units or decimals
    group_of = rng.integers(0, groups, 5000)
    sums = epoch_sums(pa.array(values), group_of, groups).to_pylist()
    for g in range(groups):
        assert sums[g] == _exact(values[group_of == g].tolist())
    shuffled = rng.permutation(5000)
    assert epoch_sums(pa.array(values[shuffled]), group_of[shuffled], groups).to_pylist() == sums
    tie = [2.2890886271259453e18, -7.140037111863804e17, -1.5120810368510164e18, 1e-18]  # needs 35 digits, not 28
    assert epoch_sums(pa.array(tie), np.zeros(4, dtype=np.int64), 1).to_pylist() == [_exact(tie)]


def test_values_outside_the_decimal_range_are_folded_sorted_ascending() -> None:
    values = [1e-25, 1.0, 3e30, -3e30, math.nan, 2.0]
    [total] = epoch_sums(pa.array(values[:4] + [2.0]), np.zeros(5, dtype=np.int64), 1).to_pylist()
    assert total == ((((0.0 + -3e30) + 1e-25) + 1.0) + 2.0) + 3e30
    [with_nan] = epoch_sums(pa.array(values), np.zeros(6, dtype=np.int64), 1).to_pylist()
    assert math.isnan(with_nan)
    many = [1e16, *[1.0] * 70, 1e-25]  # a long slice; descending, each 1.0 would be lost
    [folded] = epoch_sums(pa.array(many), np.zeros(len(many), dtype=np.int64), 1).to_pylist()
    assert folded == 1e16 + 70


def test_min_and_max_skip_nulls_and_put_nan_above_every_number() -> None:
    node = _node()
    run = run_both(node, [_records([("a", math.nan), ("a", 1.0), ("b", math.nan), ("c", -0.0), ("c", 0.0)])])
    rows = {r["k"]: r for r in run.output.to_pylist()}
    assert rows["a"]["low"] == 1.0 and math.isnan(rows["a"]["high"])
    assert math.isnan(rows["b"]["low"]) and math.isnan(rows["b"]["high"])
    assert math.copysign(1, rows["c"]["low"]) == -1 and math.copysign(1, rows["c"]["high"]) == 1


def test_null_and_integer_keys_are_keys_like_any_other() -> None:
    node = RunningAggregate(operator_id="per_n", parent=upstream(), key=("n",), aggregations=(Count(),))
    schema = pa.schema([("n", pa.int32()), ("_seq", pa.int64())])
    records = pa.Table.from_pylist([{"n": 1, "_seq": 1}, {"n": None, "_seq": 2}, {"n": None, "_seq": 3}], schema=schema)
    run = run_both(node, [records])
    assert sorted(run.output.to_pylist(), key=repr) == sorted([{"n": 1, "count": 1}, {"n": None, "count": 2}], key=repr)
