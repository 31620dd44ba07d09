"""Whether rows written with one schema can be read as another, and reading them so (landing Parquet files, Delta tables).

A column reads as a wider type of its kind (Delta's and Spark's type widening: a larger integer, ``float`` to ``double``, an
integer of up to 32 bits to ``double``, a decimal with room for every value), never a narrower or other one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
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
    t, a, e = pa.types, actual, expected
    return (
        a == e
        or all(t.is_string(x) or t.is_large_string(x) for x in (a, e))
        or all(t.is_binary(x) or t.is_large_binary(x) for x in (a, e))
        or (t.is_signed_integer(a) and t.is_signed_integer(e) and a.bit_width <= e.bit_width)
        or (t.is_unsigned_integer(a) and t.is_signed_integer(e) and a.bit_width < e.bit_width)
        or (t.is_floating(a) and t.is_floating(e) and a.bit_width <= e.bit_width)
        or (t.is_integer(a) and a.bit_width <= 32 and t.is_float64(e))
        or (t.is_decimal(a) and t.is_decimal(e) and e.scale >= a.scale and e.precision - e.scale >= a.precision - a.scale)
    )


def schema_mismatches(expected: pa.Schema, actual: pa.Schema, *, absent_nullable_ok: bool) -> list[ColumnMismatch]:
    """The columns of ``expected`` that rows of ``actual`` cannot fill (others of ``actual`` are ignored).

    An absent column is one unless ``absent_nullable_ok`` and it is nullable (it then reads null, as in Spark's readers).
    """
    mismatches = []
    for field in expected:
        found = [actual.field(i).type for i in actual.get_all_field_indices(field.name)]
        if len(found) > 1 or (found and not widens(found[0], field.type)) or not (found or absent_nullable_ok and field.nullable):
            mismatches.append(ColumnMismatch(field.name, field.type, found[0] if len(found) == 1 else None, len(found) > 1))
    return mismatches


def read_as(
    parquet: pq.ParquetFile,
    schema: pa.Schema,
    from_row: int = 0,
    to_row: int | None = None,
    constants: Mapping[str, pa.Scalar] | None = None,
) -> pa.Table:
    """Rows ``[from_row, to_row)`` (from 0) of a Parquet file as ``schema``, reading only the row groups and columns needed.

    A column the file holds is widened (after :func:`schema_mismatches`: a cast losing a value raises); one it lacks is
    its value in ``constants`` (a Delta data file's partition value) or null.
    """
    found, meta, constants = parquet.schema_arrow, parquet.metadata, constants or {}
    present = [f.name for f in schema if f.name in found.names and f.name not in constants]
    stop = meta.num_rows if to_row is None else min(to_row, meta.num_rows)
    bounds = np.cumsum([0] + [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
    groups = [g for g in range(meta.num_row_groups) if bounds[g] < stop and bounds[g + 1] > from_row]
    if groups:
        table = parquet.read_row_groups(groups, columns=present, use_threads=False)
        table = table.slice(from_row - int(bounds[groups[0]]), max(0, stop - from_row))
    else:
        table = found.empty_table().select(present)
    n = table.num_rows
    filled = {f.name: pa.repeat(constants[f.name].cast(f.type), n) for f in schema if f.name in constants}
    columns = [table[f.name].cast(f.type) if f.name in present else filled.get(f.name, pa.nulls(n, f.type)) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)
