"""Why an input line or row is not a record: a stable reason code plus a readable detail.

Every source sends what is not a record to the pipeline's ``dead_letter`` table, one row per line (or row):
``reason`` is a :class:`DeadLetterReason` (``GROUP BY reason`` gives a short list), ``detail`` says what exactly
was wrong. Inside a source a problem travels as one string, ``"<reason>: <detail>"`` (:func:`problem`).
"""

from __future__ import annotations

import datetime
import decimal
import enum
import json
import math
from typing import Any, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "DEAD_LETTER_SCHEMA", "DEAD_LETTER_COLUMNS", "DeadLetterReason", "problem", "key_problem", "record_problems",
    "dead_letter_rows", "row_json",
]  # fmt: skip

DEAD_LETTER_SCHEMA = pa.schema([
    ("source", pa.string()), ("source_file", pa.string()), ("line", pa.int64()), ("raw", pa.string()),
    ("reason", pa.string()), ("detail", pa.string()), ("_epoch", pa.int64()),  # _epoch: set when the epoch stages the table
])  # fmt: skip
# The columns a source or a check produces (``_epoch`` is added when the table is staged).
DEAD_LETTER_COLUMNS = tuple(f for f in DEAD_LETTER_SCHEMA if f.name != "_epoch")


class DeadLetterReason(str, enum.Enum):
    """The reason codes of the ``dead_letter`` table (its ``reason`` column)."""

    INVALID_UTF8 = "invalid_utf8"  # the line's bytes are not UTF-8
    NOT_JSON = "not_json"  # not valid JSON
    NOT_AN_OBJECT = "not_an_object"  # valid JSON, but an array, string, number, boolean or null
    WRONG_TYPE = "wrong_type"  # a field's value is not of its schema type (never coerced to null)
    MISSING_FIELD = "missing_field"  # a non-nullable field is absent or null
    NULL_KEY = "null_key"  # a key of deduplicate or key_by is absent or null
    EMPTY_KEY = "empty_key"  # a string key of deduplicate or key_by is empty
    INVALID_RECORD = "invalid_record"  # a line parser refused the line (RecordError without a reason)
    PARSER_FAILED = "parser_failed"  # a line parser raised something other than RecordError
    UNREADABLE_FILE = "unreadable_file"  # a whole file: not a readable Parquet file (no valid footer)
    INCOMPATIBLE_SCHEMA = "incompatible_schema"  # a whole file: its schema does not fit the source's
    LATE_FILE = "late_file"  # a whole file: landed behind the stream position (late_files='dead_letter')


def problem(reason: DeadLetterReason, detail: str) -> str:
    """A line's problem as one string, the way a source carries it to the dead-letter rows."""
    return f"{reason.value}: {detail}"


def key_problem(reason: DeadLetterReason, column: str, operator_id: str, note: str = "") -> str:
    """A key's problem (``null_key`` or ``empty_key``) of key ``column`` of ``operator_id``; ``note`` ends the detail."""
    what = "is missing or null" if reason is DeadLetterReason.NULL_KEY else "is empty"
    return problem(reason, f"key {column} of operator {operator_id} {what}{note}")


def record_problems(records: pa.Table, schema: pa.Schema, keys: Mapping[str, str]) -> list[str | None]:
    """Each record's first problem as a :func:`problem` string (None: a record), by the checks every source applies, in order.

    A non-nullable field of ``schema`` must not be null (``missing_field``); each key of ``keys`` (column -> the operator keyed by
    it, in name order) must not be null (``null_key``) nor, for a string key, empty (``empty_key``).
    """
    missing = DeadLetterReason.MISSING_FIELD
    checks = [
        (pc.is_null(records[f.name]), problem(missing, f"required field {f.name} is missing or null"))
        for f in schema
        if not f.nullable and f.name in records.column_names
    ]
    for name, operator_id in sorted(keys.items()):
        if name in records.column_names:
            column = records[name]
            checks.append((pc.is_null(column), key_problem(DeadLetterReason.NULL_KEY, name, operator_id)))
            if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                empty = pc.fill_null(pc.equal(column, ""), False)
                checks.append((empty, key_problem(DeadLetterReason.EMPTY_KEY, name, operator_id)))
    found: list[str | None] = [None] * records.num_rows
    for failed, text in checks:
        if pc.any(failed).as_py():
            found = [text if hit and now is None else now for now, hit in zip(found, failed.to_pylist())]
    return found


def dead_letter_rows(
    source: str, names: Sequence[str | None], lines: Sequence[int | None], raws: Sequence[str | None], problems: Sequence[str]
) -> pa.Table:
    """Dead-letter rows (without ``_epoch``) of one source: a file name, line, raw text and problem string each."""
    parts = [p.split(": ", 1) for p in problems]
    reasons, details = [p[0] for p in parts], [p[1] if len(p) > 1 else "" for p in parts]
    columns = [[source] * len(parts), list(names), list(lines), list(raws), reasons, details]  # DEAD_LETTER_COLUMNS' order
    return pa.table(columns, schema=pa.schema(DEAD_LETTER_COLUMNS))


def row_json(rows: pa.Table) -> list[str]:
    """Each row as compact JSON: its raw text when a typed row is a dead letter (a Parquet row, a computed key)."""
    plain = ({k: v for k, v in row.items() if v is not None} for row in rows.to_pylist())
    return [json.dumps(row, separators=(",", ":"), default=_json_value, ensure_ascii=False) for row in plain]


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON")
