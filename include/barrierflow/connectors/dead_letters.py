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
from functools import reduce
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import pyarrow as pa

from barrierflow.connectors.source import SEQ, SourceBatch, arrival_seq

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "DEAD_LETTER_SCHEMA", "DeadLetterReason", "checked_rows", "first_problem", "key_problems", "problem", "reason_and_detail",
    "record_checks", "whole_file_dead_letters",
]

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
    UNREADABLE_FILE = "unreadable_file"  # a whole file: not a readable Parquet file (no valid footer)
    INCOMPATIBLE_SCHEMA = "incompatible_schema"  # a whole file: its schema does not fit the source's
    LATE_FILE = "late_file"  # a whole file: landed behind the stream position (late_files='dead_letter')


def problem(reason: DeadLetterReason, detail: str) -> str:
    """A line's problem as one string, the way a source carries it to the dead-letter projection."""
    return f"{reason.value}: {detail}"


def record_checks(
    column_of: Callable[[str], "Column"], schema: pa.Schema, keys: Mapping[str, str]
) -> list[tuple["Column", str]]:
    """The record-level checks every source applies, in order: ``(is bad, problem string)``.

    A non-nullable field of ``schema`` must not be null (``missing_field``);
    each key of ``keys`` (column -> the operator keyed by it) must not be
    null (``null_key``) nor, for a string key, empty (``empty_key``).
    ``column_of`` gives a field's column (of a parsed struct or a frame).
    """
    checks = [
        (column_of(f.name).isNull(), problem(DeadLetterReason.MISSING_FIELD, f"required field {f.name} is missing or null"))
        for f in schema
        if not f.nullable
    ]
    for name, operator_id in sorted(keys.items()):
        is_string = pa.types.is_string(schema.field(name).type) or pa.types.is_large_string(schema.field(name).type)
        for check, text in key_problems(name, operator_id, is_string):
            checks.append((column_of(name).isNull() if check == "null" else column_of(name) == "", text))
    return checks


def key_problems(name: str, operator_id: str, is_string: bool, note: str = "") -> list[tuple[str, str]]:
    """``(check, problem string)`` of key ``name`` of ``operator_id``: ``"null"``, and ``"empty"`` for a string key.

    ``note`` (e.g. ``" (computed by map-1)"``) ends each detail.
    """
    where = f"key {name} of operator {operator_id}"
    found = [("null", problem(DeadLetterReason.NULL_KEY, f"{where} is missing or null{note}"))]
    if is_string:
        found.append(("empty", problem(DeadLetterReason.EMPTY_KEY, f"{where} is empty{note}")))
    return found


def first_problem(checks: list[tuple["Column", str]], earlier: "Column | None" = None) -> "Column | None":
    """The problem string of the first failing check (after ``earlier``, a ``F.when`` chain), else null."""
    from pyspark.sql import functions as F

    chain = earlier
    for failed, text in checks:
        chain = F.when(failed, F.lit(text)) if chain is None else chain.when(failed, F.lit(text))
    return chain


def reason_and_detail(error: "Column") -> tuple["Column", "Column"]:
    """The ``reason`` and ``detail`` columns of a :func:`problem` string column."""
    from pyspark.sql import functions as F

    return F.substring_index(error, ": ", 1), F.regexp_extract(error, r"^[a-z0-9_]+: ([\s\S]*)$", 1)


def checked_rows(
    spark: "SparkSession",
    frames: Sequence["DataFrame"],
    schema: pa.Schema,
    keys: Mapping[str, str],
    *,
    source_id: str,
    names: Sequence[str],
    source_index: int,
    whole_files: Sequence[tuple[str, str | None, str]] = (),
) -> SourceBatch:
    """A typed source's batch: rows that pass :func:`record_checks` are records, the others dead letters.

    ``frames`` hold the schema's columns plus ``_fidx`` (the file's index
    in ``names``) and ``_line`` (the row's number in its file, from 1).
    ``whole_files`` are files refused whole: ``(name, raw, problem string)``,
    one dead letter each, without a line. A dead row's ``raw`` is the row as
    JSON. Without checks to make, nothing is cached and no row is looked at.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    refused = whole_file_dead_letters(spark, source_id, whole_files)
    if frames:
        rows = reduce(lambda a, b: a.unionByName(b), frames)
    else:
        empty = pa.schema([*schema, pa.field("_fidx", pa.int32()), pa.field("_line", pa.int64())])
        rows = spark.createDataFrame([], from_arrow_schema(empty))
    fields = schema.names
    seq = arrival_seq(source_index, F.col("_fidx"), F.col("_line")).alias(SEQ)
    error = first_problem(record_checks(F.col, schema, keys))
    if error is None:
        return SourceBatch(records=rows.select(*fields, seq), dead_letters=refused, files=tuple(names))
    checked = rows.withColumn("_error", error).persist()
    reason, detail = reason_and_detail(F.col("_error"))
    file_names = F.array(*[F.lit(name) for name in names]) if names else F.array().cast("array<string>")
    dead = checked.where(F.col("_error").isNotNull()).select(
        F.lit(source_id).alias("source"),
        F.element_at(file_names, F.col("_fidx") + 1).alias("source_file"),
        F.col("_line").alias("line"),
        F.to_json(F.struct(*fields)).alias("raw"),
        reason.alias("reason"),
        detail.alias("detail"),
    )
    records = checked.where(F.col("_error").isNull()).select(*fields, seq)
    return SourceBatch(records=records, dead_letters=dead.unionByName(refused), shared=(checked,), files=tuple(names))


def whole_file_dead_letters(
    spark: "SparkSession", source_id: str, whole_files: Sequence[tuple[str, str | None, str]]
) -> "DataFrame":
    """One dead letter per file refused whole, ``(name, raw, problem string)``, without a line."""
    from pyspark.sql.pandas.types import from_arrow_schema

    dead_schema = from_arrow_schema(DEAD_LETTER_SCHEMA.remove(DEAD_LETTER_SCHEMA.get_field_index("_epoch")))
    return spark.createDataFrame([(source_id, name, None, raw, *text.split(": ", 1)) for name, raw, text in whole_files], dead_schema)
