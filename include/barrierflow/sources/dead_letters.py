"""Why an input line or row is not a record: a stable reason code plus a readable detail.

Every source path sends what is not a record of the pipeline to the
pipeline's ``dead_letter`` table, one row per line (or row) with its file,
line, raw text, ``reason`` (one of :class:`DeadLetterReason`, so
``GROUP BY reason`` gives a short list) and ``detail`` (what exactly was
wrong, for a person). Inside a source, a line's problem travels as one
string, ``"<reason>: <detail>"`` (:func:`problem`), split into the two
columns when the dead letters are projected (:func:`reason_and_detail`).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = ["DeadLetterReason", "problem", "reason_and_detail"]


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


def problem(reason: DeadLetterReason, detail: str) -> str:
    """A line's problem as one string, the way a source carries it to the dead-letter projection."""
    return f"{reason.value}: {detail}"


def reason_and_detail(error: "Column") -> tuple["Column", "Column"]:
    """The ``reason`` and ``detail`` columns of a :func:`problem` string column."""
    from pyspark.sql import functions as F

    return F.substring_index(error, ": ", 1), F.regexp_extract(error, r"^[a-z0-9_]+: ([\s\S]*)$", 1)
