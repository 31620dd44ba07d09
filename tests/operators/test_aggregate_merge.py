"""The driver-side merge of running aggregates keeps Spark's least/greatest semantics."""

from __future__ import annotations

import math
from itertools import product

import pyarrow as pa

from barrierflow.operators.aggregate import _merged

_VALUES = [None, math.nan, -1.5, 0.0, 2.0]


def _spark_least(prev: float | None, value: float | None) -> float | None:
    """Spark's ``least``: nulls skipped; NaN above every number; keeps the first unless strictly less."""
    if prev is None:
        return value
    if value is None:
        return prev
    if math.isnan(prev):
        return value
    return value if not math.isnan(value) and value < prev else prev


def _spark_greatest(prev: float | None, value: float | None) -> float | None:
    if prev is None:
        return value
    if value is None or math.isnan(prev):
        return prev
    return value if math.isnan(value) or value > prev else prev


def _same(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and (a == b or (math.isnan(a) and math.isnan(b))))


def test_least_and_greatest_match_spark_on_nulls_and_nan() -> None:
    pairs = list(product(_VALUES, _VALUES))
    prev = pa.chunked_array([pa.array([p for p, _ in pairs], pa.float64())])
    value = pa.chunked_array([pa.array([v for _, v in pairs], pa.float64())])
    least = _merged(prev, value, least=True).to_pylist()
    greatest = _merged(prev, value, least=False).to_pylist()
    for i, (p, v) in enumerate(pairs):
        assert _same(least[i], _spark_least(p, v)), (p, v, least[i])
        assert _same(greatest[i], _spark_greatest(p, v)), (p, v, greatest[i])
