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

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["DEAD_LETTER_SCHEMA", "DeadLetterReason", "no_dead_letters", "problem", "reason_and_detail"]

DEAD_LETTER_SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("source_file", pa.string()),
        ("line", pa.int64()),
        ("raw", pa.string()),
        ("reason", pa.string()),  # a DeadLetterReason code
        ("detail", pa.string()),  # what exactly was wrong, for a person
        ("_epoch", pa.int64()),  # set when the epoch stages the table
    ]
)


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


def no_dead_letters(spark: "SparkSession") -> "DataFrame":
    """An empty frame of a source's dead letters (the table's columns but ``_epoch``), for reads that have none."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return spark.createDataFrame([], from_arrow_schema(DEAD_LETTER_SCHEMA.remove(DEAD_LETTER_SCHEMA.get_field_index("_epoch"))))
