"""Key groups are Spark's ``pmod(xxhash64(keys), G)`` (``core.keys``' documented promise), checked against Spark itself.

State written by one release is found by the next, and by a reader computing key groups with Spark, only if barrierflow's
vectorised hash equals Spark's for every key type it accepts. (Replaces the chained-vs-Spark-plan key group test.)
"""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import pyarrow as pa
import pyspark.sql.functions as F

from barrierflow.core.keys import key_groups

GROUPS = 128


def _keys() -> pa.Table:
    n = 7
    return pa.table(
        {
            "b": pa.array([True, False, None, True, False, True, None]),
            "i8": pa.array([0, -1, 127, -128, None, 5, 1], pa.int8()),
            "i16": pa.array([0, -1, 32767, -32768, None, 300, 2], pa.int16()),
            "i32": pa.array([0, -1, 2**31 - 1, -(2**31), None, 123456, 3], pa.int32()),
            "i64": pa.array([0, -1, 2**63 - 1, -(2**63), None, 10**12, 4], pa.int64()),
            "f32": pa.array([0.0, -0.0, float("nan"), float("inf"), None, 1.5, -2.25], pa.float32()),
            "f64": pa.array([0.0, -0.0, float("nan"), float("-inf"), None, 1e300, 0.1], pa.float64()),
            "dec": pa.array(
                [decimal.Decimal(x) if x else None for x in ("0.00", "-1.25", "99999999.99", None, "3.14", "1", "-0.01")],
                pa.decimal128(10, 2),
            ),
            "d": pa.array(
                [
                    dt.date(1970, 1, 1),
                    dt.date(1969, 12, 31),
                    dt.date(2024, 2, 29),
                    None,
                    dt.date(1, 1, 1),
                    dt.date(9999, 12, 31),
                    dt.date(2000, 1, 1),
                ]
            ),
            "ts": pa.array([0, -1, 1_700_000_000_123_456, None, 1, 2**40, -(2**40)], pa.timestamp("us", tz="UTC")),
            "s": pa.array(["", "a", "sensor-1", "üñïçødé 🌍", None, "x" * 100, "a,b"], pa.string()),
            "bin": pa.array([b"", b"\x00", b"\xff\xfe", None, b"abc", b"x" * 33, b"\x01\x02"], pa.binary()),
        }
    ).slice(0, n)


def test_key_groups_are_sparks_for_every_accepted_key_type(spark: Any) -> None:
    keys = _keys()
    frame = spark.createDataFrame(keys)
    columns = keys.column_names
    # One key column at a time, then all folded left to right, as a multi-column key_by hashes them.
    shapes = [[c] for c in columns] + [columns]
    expected = frame.select(*[F.pmod(F.xxhash64(*shape), F.lit(GROUPS)).alias(f"g{i}") for i, shape in enumerate(shapes)])
    rows = expected.collect()
    for i, shape in enumerate(shapes):
        ours = key_groups(keys.select(shape), GROUPS).to_pylist()
        sparks = [row[f"g{i}"] for row in rows]
        assert ours == sparks, f"key groups of {shape} differ from Spark's"
