"""Which column types read as which: widening only, never a coercion."""

from __future__ import annotations

import pyarrow as pa
import pytest

from barrierflow.connectors.schema_check import ColumnMismatch, schema_mismatches, widens


@pytest.mark.parametrize(
    ("actual", "expected", "reads"),
    [
        (pa.int32(), pa.int64(), True),
        (pa.int64(), pa.int32(), False),
        (pa.uint32(), pa.int64(), True),
        (pa.uint64(), pa.int64(), False),
        (pa.float32(), pa.float64(), True),
        (pa.int32(), pa.float64(), True),
        (pa.int64(), pa.float64(), False),  # not every long is a double
        (pa.float64(), pa.int64(), False),
        (pa.large_string(), pa.string(), True),
        (pa.string(), pa.float64(), False),
        (pa.int64(), pa.string(), False),
        (pa.decimal128(10, 2), pa.decimal128(12, 3), True),
        (pa.decimal128(10, 2), pa.decimal128(10, 3), False),  # one integer digit fewer
        (pa.timestamp("us", "UTC"), pa.timestamp("us", "UTC"), True),
        (pa.timestamp("ns"), pa.timestamp("us", "UTC"), False),
    ],
)
def test_a_type_reads_only_as_itself_or_a_wider_type_of_its_kind(actual: pa.DataType, expected: pa.DataType, reads: bool) -> None:
    assert widens(actual, expected) is reads


def test_mismatches_name_each_column_that_cannot_be_filled() -> None:
    expected = pa.schema(
        [
            pa.field("id", pa.string(), nullable=False),
            pa.field("note", pa.string()),
            pa.field("amount", pa.float64()),
            pa.field("n", pa.int64()),
        ]
    )
    actual = pa.schema([pa.field("amount", pa.string()), pa.field("n", pa.int16()), pa.field("extra", pa.binary())])
    found = schema_mismatches(expected, actual, absent_nullable_ok=True)
    assert found == [ColumnMismatch("id", pa.string(), None), ColumnMismatch("amount", pa.float64(), pa.string())]
    assert [m.describe() for m in found] == ["column id (string) is missing", "column amount is string, not double"]
    # A Delta version may not drop even a nullable column.
    assert [m.column for m in schema_mismatches(expected, actual, absent_nullable_ok=False)] == ["id", "note", "amount"]
    twice = pa.schema([pa.field("n", pa.int64()), pa.field("n", pa.int64())])
    assert [m.describe() for m in schema_mismatches(pa.schema([pa.field("n", pa.int64())]), twice, absent_nullable_ok=True)] == [
        "column n appears more than once"
    ]
