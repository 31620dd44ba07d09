"""The small rules on Arrow tables that many parts share, each in one place (conforming, key matching, changelogs, order)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.core.columns import DELETED, EPOCH, position_columns

__all__ = [
    "as_double", "conform", "null_safe_keys", "rows_with_keys", "rows_without_keys", "latest_rows", "after_changes",
    "in_arrival_order", "row_numbers",
]  # fmt: skip


def conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` with exactly ``schema``'s columns, in its order and types; a column ``rows`` lack reads null."""
    columns = [rows[f.name] if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type) for f in schema]
    return pa.Table.from_arrays(columns, names=schema.names).cast(schema)


def row_numbers(n: int) -> pa.Array:
    return pa.array(np.arange(n, dtype=np.int64))


def null_safe_keys(table: pa.Table, key_columns: Sequence[str], all_flags: bool = False) -> pa.Table:
    """The key columns as keys compare: null-safe for Arrow's join (which never matches nulls), -0.0 as 0.0.

    Each column with nulls (every column, with ``all_flags``) gets a null flag ``_null_<name>`` and its nulls filled; a float
    column's -0.0 becomes 0.0 (one key, as its key group says).
    """
    columns = {}
    for name in key_columns:
        column = table[name]
        if pa.types.is_floating(column.type):
            column = pc.if_else(pc.equal(column, 0), pa.scalar(0.0, column.type), column)
        if column.null_count or all_flags:
            columns[f"_null_{name}"] = pc.is_null(column)
            column = pc.fill_null(column, _filler(column.type))
        columns[name] = column
    return pa.table(columns)


def _filler(type_: pa.DataType) -> pa.Scalar:
    """A value of ``type_`` standing in for nulls (beside their null flag, its value never matters)."""
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return pa.scalar("", type_)
    if pa.types.is_binary(type_) or pa.types.is_large_binary(type_):
        return pa.scalar(b"", type_)
    if pa.types.is_boolean(type_):
        return pa.scalar(False)
    if pa.types.is_date32(type_) or pa.types.is_time32(type_):
        return pa.scalar(0, pa.int32()).cast(type_)
    if pa.types.is_floating(type_):
        return pa.scalar(0.0, type_)
    if pa.types.is_decimal(type_):
        return pa.scalar(0, pa.int8()).cast(type_)
    return pa.scalar(0, pa.int64()).cast(type_)  # integers, timestamps, dates in ms, durations


def _matched(rows: pa.Table, keys: pa.Table, key_columns: Sequence[str]) -> np.ndarray:
    """For each row of ``rows``, whether its key is among ``keys``' (null keys match each other)."""
    found = np.zeros(rows.num_rows, dtype=bool)
    if not rows.num_rows or not keys.num_rows:
        return found
    left = null_safe_keys(rows, key_columns, all_flags=True)
    right = null_safe_keys(keys, key_columns, all_flags=True)
    names = left.column_names
    # Joined on the keys and a row number, then taken: Arrow's join carries no nested columns. A semi join emits a row once
    # however many keys match it, so ``keys`` need not be distinct.
    numbered = left.append_column("_row", row_numbers(rows.num_rows))
    hit = numbered.join(right.select(names), keys=names, join_type="left semi", use_threads=False)["_row"]
    found[hit.to_numpy()] = True
    return found


def rows_with_keys(rows: pa.Table, keys: pa.Table, key_columns: Sequence[str]) -> pa.Table:
    """Those of ``rows`` whose key is among ``keys``', in their order."""
    return rows.filter(pa.array(_matched(rows, keys, key_columns)))


def rows_without_keys(rows: pa.Table, keys: pa.Table, key_columns: Sequence[str]) -> pa.Table:
    """Those of ``rows`` whose key is not among ``keys``', in their order."""
    if not keys.num_rows:
        return rows
    return rows.filter(pa.array(~_matched(rows, keys, key_columns)))


def latest_rows(changelog: pa.Table, key_columns: Sequence[str]) -> pa.Table:
    """One row per key of a changelog, the one with the highest ``_epoch``, in key order; tombstones dropped."""
    n = changelog.num_rows
    keys = null_safe_keys(changelog, key_columns)
    numbered = keys.append_column("_epoch_desc", pc.negate(changelog[EPOCH]))
    ordered = numbered.append_column("_row", row_numbers(n)).sort_by([(c, "ascending") for c in numbered.column_names])
    ordered = ordered.append_column("_at", row_numbers(n))
    # Each key's first row in that order, taken in that order (Arrow's groups come in an order of their own).
    firsts = ordered.group_by(keys.column_names, use_threads=False).aggregate([("_at", "min")])["_at_min"]
    kept = changelog.take(ordered["_row"].take(np.sort(firsts.to_numpy())))
    return kept.filter(pc.invert(kept[DELETED]))


def after_changes(live: pa.Table, changes: pa.Table, key_columns: Sequence[str]) -> pa.Table:
    """The live rows after ``changes``: the live rows of keys they leave alone, then the changed keys not deleted."""
    kept = rows_without_keys(live, changes, key_columns)
    return pa.concat_tables([kept, changes.filter(pc.invert(changes[DELETED])).cast(live.schema)])


def in_arrival_order(rows: pa.Table) -> pa.Table:
    """``rows`` sorted by their arrival positions (``_seq``, then sub-positions); as they are without any."""
    order = position_columns(rows.column_names)
    return rows.sort_by([(c, "ascending") for c in order]) if order else rows


def as_double(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """A numeric column as doubles, as Spark's ``cast(... as double)``; nulls stay null.

    A long rounds to the nearest double (Java's ``(double)``); a decimal is correctly rounded, as ``BigDecimal.doubleValue``
    (Arrow's direct cast is not, so it goes through the decimal's exact text).
    """
    if pa.types.is_decimal(column.type):
        return pc.cast(pc.cast(column, pa.string()), pa.float64())
    return pc.cast(column, pa.float64(), safe=False)
