"""Whether rows written with one schema can be read as another, and reading them so: landing Parquet files, Delta table versions.

A column may be read as a wider type of the same kind (Delta's and Spark's
type widening: a larger integer, ``float`` to ``double``, an integer of up to
32 bits to ``double``, a decimal with room for every value), never as a
narrower or different one: rows are never coerced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["ColumnMismatch", "read_as", "schema_mismatches", "widens"]


@dataclass(frozen=True)
class ColumnMismatch:
    """One column that keeps rows of the ``actual`` schema from being read as the ``expected`` one."""

    column: str
    expected: pa.DataType
    actual: pa.DataType | None  # None: the column is absent
    repeated: bool = False  # the column appears more than once

    def describe(self) -> str:
        if self.repeated:
            return f"column {self.column} appears more than once"
        if self.actual is None:
            return f"column {self.column} ({self.expected}) is missing"
        return f"column {self.column} is {self.actual}, not {self.expected}"


def widens(actual: pa.DataType, expected: pa.DataType) -> bool:
    """Whether every value of type ``actual`` reads unchanged as type ``expected``."""
    t = pa.types
    if actual == expected:
        return True
    if (t.is_string(actual) or t.is_large_string(actual)) and (t.is_string(expected) or t.is_large_string(expected)):
        return True
    if (t.is_binary(actual) or t.is_large_binary(actual)) and (t.is_binary(expected) or t.is_large_binary(expected)):
        return True
    if t.is_signed_integer(actual) and t.is_signed_integer(expected):
        return actual.bit_width <= expected.bit_width
    if t.is_unsigned_integer(actual) and t.is_signed_integer(expected):
        return actual.bit_width < expected.bit_width
    if t.is_floating(actual) and t.is_floating(expected):
        return actual.bit_width <= expected.bit_width
    if t.is_integer(actual) and actual.bit_width <= 32 and t.is_float64(expected):
        return True
    if t.is_decimal(actual) and t.is_decimal(expected):
        return expected.scale >= actual.scale and expected.precision - expected.scale >= actual.precision - actual.scale
    return False


def schema_mismatches(expected: pa.Schema, actual: pa.Schema, *, absent_nullable_ok: bool) -> list[ColumnMismatch]:
    """The columns of ``expected`` that rows of ``actual`` cannot fill; empty when they can all be read.

    Columns of ``actual`` that ``expected`` lacks are ignored. An absent
    column is a mismatch unless ``absent_nullable_ok`` and the expected
    column is nullable (it then reads as null, as Spark's readers do).
    """
    mismatches = []
    for field in expected:
        found = actual.get_all_field_indices(field.name)
        if len(found) > 1:
            mismatches.append(ColumnMismatch(field.name, field.type, None, repeated=True))
        elif not found:
            if not (absent_nullable_ok and field.nullable):
                mismatches.append(ColumnMismatch(field.name, field.type, None))
        elif not widens(actual.field(found[0]).type, field.type):
            mismatches.append(ColumnMismatch(field.name, field.type, actual.field(found[0]).type))
    return mismatches


def read_as(
    parquet: pq.ParquetFile,
    schema: pa.Schema,
    from_row: int = 0,
    to_row: int | None = None,
    constants: Mapping[str, pa.Scalar] | None = None,
) -> pa.Table:
    """Rows ``[from_row, to_row)`` (from 0) of a Parquet file as ``schema``'s columns, in its order and types.

    Only the row groups holding those rows and the columns ``schema`` names
    are read. A column the file holds is widened to the schema's type (the
    caller checked :func:`schema_mismatches` first; a cast that would lose a
    value raises); one it lacks is ``constants``' value (a Delta data file's
    partition value) or null.
    """
    found = parquet.schema_arrow
    present = [f.name for f in schema if f.name in found.names and (constants is None or f.name not in constants)]
    meta = parquet.metadata
    stop = meta.num_rows if to_row is None else min(to_row, meta.num_rows)
    groups, first, start = [], None, 0
    for group in range(meta.num_row_groups):
        rows = meta.row_group(group).num_rows
        if start < stop and start + rows > from_row:
            groups.append(group)
            first = start if first is None else first
        start += rows
    if groups and first is not None:
        table = parquet.read_row_groups(groups, columns=present, use_threads=False)
        table = table.slice(from_row - first, max(0, stop - from_row))
    else:
        table = pa.table({name: pa.array([], found.field(name).type) for name in present})
    n = table.num_rows
    columns = []
    for f in schema:
        if f.name in present:
            columns.append(table[f.name].cast(f.type))
        elif constants is not None and f.name in constants:
            columns.append(pa.repeat(constants[f.name].cast(f.type), n))
        else:
            columns.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(columns, schema=schema)
