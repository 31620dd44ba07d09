"""``parse_jsonl_lines`` against the Spark path it stands in for: the same records and dead letters, or a decline.

One Spark collect reads every file of the corpus through ``FileSource._read_jsonl``
(four sources, their rows unioned into one collect): the order stream's
generated files (orders, payments and thresholds with the pipeline's own
schemas and keys), which must never be declined, and hand-written edge
lines, one file each, with a schema of every supported type. An edge line is
either one whose outcome the local parser settles (it must then equal
Spark's) or one it declines, as decided in ``EDGES``.

The tests after it need no Spark: they pin the rules settled there as exact
outputs of tiny inputs (one file with the Spark test: test basenames must
be unique across the suite's directories).
"""

from __future__ import annotations

import datetime
import math
import random
import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from barrierflow.connectors.file_source import FileSource
from barrierflow.connectors.local_jsonl import LocalParseDeclined, parse_jsonl_lines
from barrierflow.connectors.source import SEQ
from barrierflow.demo.order_stream import OrderStreamSpec, write_order_files
from barrierflow.demo.pipelines.orders_payments import ORDER_SCHEMA, PAYMENT_SCHEMA, THRESHOLD_SCHEMA

TS = pa.timestamp("us", tz="UTC")
EDGE_SCHEMA = pa.schema(
    [
        pa.field("k", pa.string()),
        pa.field("s", pa.string()),
        pa.field("q", pa.int64(), nullable=False),
        pa.field("l", pa.int64()),
        pa.field("d", pa.float64()),
        pa.field("b", pa.bool_()),
        pa.field("t", TS),
    ]
)
EDGE_KEYS = {"k": "op_k", "l": "op_l"}
SAME, DECLINED = "same", "declined"


def obj(extra: str = "") -> str:
    """A good record of EDGE_SCHEMA with ``extra`` members (raw JSON text) after its own."""
    return '{"k": "a", "q": 1, "l": 7' + (", " + extra if extra else "") + "}"


# (file bytes, what the local parser does: SAME as Spark, or DECLINED). Spark's outcome of each was looked at once.
EDGES: list[tuple[bytes, str]] = [
    (text.encode("utf-8") + b"\n", decision)
    for text, decision in [
        # doubles: integer and decimal tokens, overflow, NaN family, strings
        (obj('"d": 1'), SAME),
        (obj('"d": -0'), SAME),  # an integer token: 0.0, not -0.0
        (obj('"d": -0.0'), SAME),
        (obj('"d": 1.5e-3'), SAME),
        (obj('"d": 1E+5'), SAME),
        (obj('"d": 1e400'), SAME),  # Infinity
        (obj('"d": 1e-400'), SAME),
        (obj('"d": 9007199254740993'), SAME),  # rounded to nearest even
        (obj('"d": 123456789012345678901234567890'), SAME),
        (obj('"d": 4.9e-324'), SAME),
        (obj('"d": NaN'), SAME),
        (obj('"d": -Infinity'), SAME),
        (obj('"d": +Infinity'), DECLINED),  # Jackson reads it, Python does not
        (obj('"d": INF'), DECLINED),
        (obj('"d": "304.26"'), SAME),  # wrong_type
        (obj('"d": "NaN"'), SAME),
        (obj('"d": "+INF"'), SAME),
        (obj('"d": "-Infinity"'), SAME),
        (obj('"d": "INF"'), SAME),  # wrong_type, unlike "+INF"
        (obj('"d": "nan"'), SAME),
        (obj('"d": ""'), SAME),
        (obj('"d": true'), SAME),
        (obj('"d": {"a": [1, "x"]}'), SAME),
        (obj('"d": null'), SAME),
        # longs
        (obj('"l": 9223372036854775807').replace('"l": 7, ', ""), SAME),
        (obj('"l": 9223372036854775808').replace('"l": 7, ', ""), SAME),  # wrong_type with its digits
        (obj('"l": -9223372036854775809').replace('"l": 7, ', ""), SAME),
        (obj('"l": -0').replace('"l": 7, ', ""), SAME),
        (obj('"l": "5"').replace('"l": 7, ', ""), SAME),
        (obj('"l": 1E+400').replace('"l": 7, ', ""), SAME),  # shown as "Infinity", quoted
        (obj('"l": 1.0').replace('"l": 7, ', ""), DECLINED),  # the JVM prints the double its own way
        (obj('"l": NaN').replace('"l": 7, ', ""), SAME),  # not_json: json_object_keys refuses NaN
        (obj('"l": [1]').replace('"l": 7, ', ""), SAME),
        # booleans
        (obj('"b": false'), SAME),
        (obj('"b": "true"'), SAME),
        (obj('"b": 0'), SAME),
        (obj('"b": 1.5'), DECLINED),
        # strings: any JSON value, as Jackson writes it
        (obj('"s": 123'), SAME),
        (obj('"s": -0'), SAME),
        (obj('"s": 12345678901234567890123'), SAME),
        (obj('"s": true'), SAME),
        (obj('"s": {"a" : 1, "b": [1, "x", null, {}]}'), SAME),
        (obj('"s": {"a": "\\b\\f\\n\\r\\t\\u001f\\u000b\\u0000\\u007f\\"\\\\\\/", "\\u00e9\\n": "\u00e9"}'), SAME),
        (obj('"s": NaN'), SAME),
        (obj('"s": [-Infinity]'), SAME),
        (obj('"s": 1.5'), DECLINED),
        ('{"k": 1.5, "q": 1, "l": 7}', DECLINED),  # a record: its text unknown here
        ('{"k": [2.5], "l": 7}', SAME),  # dead whatever the text: missing_field, not null_key
        ('{"k": 1.5, "q": 1, "l": 7, "d": "x"}', SAME),
        (obj('"s": "\\u00e9\\t"'), SAME),
        (obj('"s": "\\ud83d\\ude00"'), DECLINED),  # any surrogate escape
        (obj('"s": "\\ud800"'), DECLINED),  # a lone one becomes "?" in the JVM
        # timestamps
        (obj('"t": "2026-01-01T02:00:00.051+02:00"'), SAME),
        (obj('"t": "2026-01-01T02:00:00Z"'), SAME),
        (obj('"t": "2026-01-01T02:00:00.1-05:00"'), SAME),
        (obj('"t": "2026-01-01T02:00:00.123456Z"'), SAME),
        (obj('"t": "2026-01-01T02:00:00.999999999+02:30"'), SAME),  # truncated to microseconds
        (obj('"t": "2026-01-01T02:00:00-18:00"'), SAME),
        (obj('"t": "0000-01-01T00:00:00Z"'), SAME),
        (obj('"t": "1582-10-10T00:00:00Z"'), SAME),
        (obj('"t": "2024-02-29T23:59:59+00:00"'), SAME),
        (obj('"t": "2026-02-29T00:00:00Z"'), SAME),  # wrong_type: no such day
        (obj('"t": "2026-13-01T00:00:00Z"'), SAME),
        (obj('"t": "2026-01-01T24:00:00Z"'), SAME),
        (obj('"t": "2026-01-01T02:00:60Z"'), SAME),
        (obj('"t": "2026-01-01T02:00:00+18:01"'), SAME),
        (obj('"t": "2026-01-01T02:00:00+02:60"'), SAME),
        (obj('"t": "yesterday at noon"'), SAME),
        (obj('"t": "now"'), SAME),
        (obj('"t": ""'), SAME),
        (obj('"t": 1700000000'), SAME),  # seconds
        (obj('"t": true'), SAME),
        (obj('"t": "2026-01-01T02:00:00"'), DECLINED),  # read in the session time zone
        (obj('"t": "2026-01-01 02:00:00Z"'), DECLINED),
        (obj('"t": "2026-1-01T02:00:00Z"'), DECLINED),
        (obj('"t": "yesterday at 12"'), DECLINED),
        # several wrong fields, their order, the 100-character cut, wrong before missing
        ('{"k": "a", "q": "1", "l": "x", "d": "y", "b": 1, "t": "z"}', SAME),
        ('{"k": "", "d": "' + "\u00e9" * 150 + '"}', SAME),
        # record checks: required, then keys by name, null then empty
        ("{}", SAME),
        ('{"q": 1, "l": 7}', SAME),
        ('{"k": "", "q": 1, "l": 7}', SAME),
        ('{"k": "a", "q": 1}', SAME),
        ('{"k": null, "l": null}', SAME),
        ('{"K": "a", "q": 1, "l": 7}', SAME),  # names match exactly
        # not objects
        ("garbage", SAME),
        ("[1, 2]", SAME),
        ("  [garbage", SAME),
        ('"a string" x', SAME),
        ('"unterminated', SAME),
        ("42", SAME),
        ("42 x", SAME),
        ("42x", SAME),  # not_json: Jackson wants white space after a root number
        ("42,", SAME),
        ("-0", SAME),
        ("1.5e3", SAME),
        ("null", SAME),
        (" null\t", SAME),
        ("true,", SAME),
        ("false]", SAME),
        ("nullx", SAME),
        ("nul", SAME),
        ("NaN", DECLINED),
        ("'single'", DECLINED),
        ("}", SAME),
        ("\x00", SAME),
        ("\x1c", SAME),  # not White_Space: not blank
        ("\ufeff" + obj(), SAME),  # a byte-order mark is not_json
        ("\u00a0" + obj(), SAME),
        ("\x0b" + obj(), DECLINED),
        # objects Jackson refuses, or reads only partly
        (obj()[:-1], SAME),
        (obj('"t": "2026-01-01T02:0')[:-1], SAME),
        (obj('"d": 1.')[:-1], SAME),
        (obj('"y": [1, 2,]'), SAME),
        (obj('"y": [1, , 2]') + " ", SAME),
        (obj()[:-1] + ",}", SAME),
        ('{k: "a"}', SAME),
        (obj('"q": 01'), SAME),
        (obj('"q": +1'), DECLINED),
        (obj('"s": "\\x"'), SAME),
        (obj('"s": "\\u12"'), SAME),
        (obj("/* c */ \"s\": 1"), SAME),
        ("{'k': 'a', 'q': 1, 'l': 7}", DECLINED),
        (obj('"k": "a\\\'b"').replace('"k": "a", ', ""), DECLINED),
        (obj() + " trailing", SAME),  # what follows the object is ignored
        (obj('"d": "x"') + "{}", SAME),
        (obj('"d": "x"') + " NaN", SAME),
        (obj() + "\x00", SAME),
        ("\t" + obj() + "   ", SAME),
        (obj('"x": 1' + "1" * 398), SAME),
        (obj('"x": 1' + "1" * 998), DECLINED),  # within Jackson's limit, beyond the one here
        (obj('"x": 1' + "1" * 1000), DECLINED),  # 1001 digits: Jackson's limit
        # NaN tokens make a wrong line not_json, and are harmless elsewhere
        (obj('"x": NaN'), SAME),
        (obj('"d": "x", "y": {"z": Infinity}'), SAME),
        # control characters inside strings: from_json refuses them, json_object_keys does not
        (obj('"x": "a\tb"'), SAME),
        (obj('"x": "a\x01", "d": "x"'), SAME),
        ('{"k\x1f": "a", "q": 1, "l": 7}', SAME),
        (obj('"x": "a\x01", "y": NaN'), SAME),
        (obj('"x": "a\x01", "y": [1, 2,]'), SAME),
        (obj('"x": "a",\x01 "y": 1'), SAME),
        # duplicate names
        (obj('"k": "b"'), DECLINED),
        (obj('"x": {"y": 1, "y": 2}'), DECLINED),
        (obj('"d": 2, "d": "x"'), DECLINED),
    ]
] + [
    # whole files: line numbering, blank lines, CR LF, no final newline, invalid UTF-8
    (b'{"k": "a", "q": 1, "l": 7}\r\n\r\n  \r\n\x0c\t\n\xe3\x80\x80\n{"k": "b", "q": 2, "l": 7}\r\r\n' + obj('"d": "x"').encode(), SAME),
    (b"\n\n" + obj().encode() + b"\n\n\n", SAME),
    (b"", SAME),
    (
        b"\n".join(
            [
                obj().encode(),
                b'{"k": "\xef\xbf\xbd", "q": 1, "l": 7}',  # a valid U+FFFD, in an invalid file
                b'{"k": "\x80\xff\xc0\x80", "q": 1, "l": 7}\r',
                b'{"k": "\xe2\x82", "q": 1, "l": 7}',
                b'{"k": "\xf0\x9f\x98", "q": 1, "l": 7, "d": "x"}',
                b'{"k": "\xe0\x80\x80\xf4\x90\x80\x80\xf8\x88\x80\x80\x80", "q": 1, "l": 7}',
                b"  \x80  ",
                obj().encode() + b" \xe2\x82",
            ]
        ),
        SAME,
    ),
    (obj().encode() + b'\n{"k": "\xed\xa0\x80", "q": 1, "l": 7}\n', DECLINED),  # an encoded surrogate
]


def _spark_rows(spark: Any, base: Path, names: list[str], schema: pa.Schema, keys: dict[str, str], tag: str) -> tuple[Any, Any]:
    """The Spark path's records and dead letters of ``names`` as one frame of strings, and its records' schema."""
    from pyspark.sql import functions as F

    ranges = [[name, 0, None, (base / name).stat().st_size] for name in names]
    batch = FileSource(tag, str(base), schema=schema)._read_jsonl(spark, str(base), ranges, source_index=0, parallelism=2, keys=keys)

    def text(f: pa.Field) -> Any:
        column = F.col(f.name)
        if pa.types.is_timestamp(f.type):
            column = F.unix_micros(column)
        elif pa.types.is_floating(f.type):
            column = F.format_string("%a", column)  # exact: Java's hexadecimal double
        return F.when(F.col(f.name).isNull(), F.lit(None)).otherwise(column.cast("string"))

    files = F.array(*[F.lit(name) for name in names])
    records = batch.records.select(
        F.lit(tag).alias("tag"),
        F.element_at(files, (F.shiftright(SEQ, 36) + 1).cast("int")).alias("file"),
        F.col(SEQ).bitwiseAND((1 << 36) - 1).alias("line"),
        F.lit(None).cast("string").alias("raw"),
        F.lit(None).cast("string").alias("reason"),
        F.lit(None).cast("string").alias("detail"),
        F.array(*[text(f) for f in schema]).alias("values"),
    )
    assert batch.dead_letters is not None
    dead = batch.dead_letters.select(
        F.lit(tag).alias("tag"),
        F.col("source_file").alias("file"),
        "line",
        "raw",
        "reason",
        "detail",
        F.lit(None).cast("array<string>").alias("values"),
    )
    return records.unionByName(dead), batch.records.schema


def _spark_value(text: str | None, arrow_type: pa.DataType) -> Any:
    if text is None:
        return None
    if pa.types.is_floating(arrow_type):
        return float.fromhex(text)
    if pa.types.is_boolean(arrow_type):
        return {"true": True, "false": False}[text]
    if pa.types.is_string(arrow_type):
        return text
    return int(text)  # int64, timestamp micros


def _same_value(a: Any, b: Any) -> bool:
    if type(a) is float and type(b) is float:
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    return type(a) is type(b) and a == b


def _local(data: bytes, schema: pa.Schema, keys: dict[str, str]) -> tuple[list[tuple[int, list[Any]]], list[tuple[int, str, str, str]]]:
    records, dead = parse_jsonl_lines(data, schema, keys)
    assert records.schema == pa.schema([pa.field("_line", pa.int64()), *schema])
    assert dead.schema == pa.schema([("_line", pa.int64()), ("_raw", pa.string()), ("_error", pa.string())])
    columns = [records[f.name].cast(pa.int64()) if pa.types.is_timestamp(f.type) else records[f.name] for f in schema]
    values = [column.to_pylist() for column in columns]
    got_records = [(line, [v[i] for v in values]) for i, line in enumerate(records["_line"].to_pylist())]
    got_dead = []
    for line, raw, error in zip(*(dead[c].to_pylist() for c in dead.column_names)):
        reason, detail = error.split(": ", 1)  # as reason_and_detail splits the problem string
        got_dead.append((line, raw, reason, detail))
    return got_records, got_dead


def test_local_parse_equals_the_spark_path_or_declines(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql.pandas.types import from_arrow_type

    landing = tmp_path / "landing"
    written = write_order_files(landing, OrderStreamSpec(n_files=3, orders_per_file=150))
    sources: list[tuple[str, Path, pa.Schema, dict[str, str], dict[str, str]]] = []
    for name, schema, keys in (
        ("orders", ORDER_SCHEMA, {"order_id": "order_dedup"}),
        ("payments", PAYMENT_SCHEMA, {"payment_id": "payment_dedup"}),
        ("thresholds", THRESHOLD_SCHEMA, {}),  # broadcast: no key checked at the source
    ):
        files = {p.name: "generated" for p in written if p.parent.name == name}
        sources.append((name, landing / name, schema, keys, files))
    edges = tmp_path / "edges"
    edges.mkdir()
    decisions = {}
    for i, (data, decision) in enumerate(EDGES):
        (edges / f"edge-{i:03d}.jsonl").write_bytes(data)
        decisions[f"edge-{i:03d}.jsonl"] = decision
    sources.append(("edges", edges, EDGE_SCHEMA, EDGE_KEYS, decisions))

    frames, spark_types = [], {}
    for tag, base, schema, keys, files in sources:
        frame, record_schema = _spark_rows(spark, base, sorted(files), schema, keys, tag)
        frames.append(frame)
        spark_types[tag] = {f.name: f.dataType for f in record_schema.fields if f.name != SEQ}
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    rows = union.collect()  # one collect for the whole corpus

    spark_records: dict[tuple[str, str], list[tuple[int, list[Any]]]] = {}
    spark_dead: dict[tuple[str, str], list[tuple[int, str, str, str]]] = {}
    schemas = {tag: schema for tag, _, schema, _, _ in sources}
    for row in rows:
        where = (row["tag"], row["file"])
        if row["values"] is not None:
            values = [_spark_value(v, f.type) for v, f in zip(row["values"], schemas[row["tag"]])]
            spark_records.setdefault(where, []).append((row["line"], values))
        else:
            spark_dead.setdefault(where, []).append((row["line"], row["raw"], row["reason"], row["detail"]))

    declined, compared, reasons = [], 0, set[str]()
    for tag, base, schema, keys, files in sources:
        assert spark_types[tag] == {f.name: from_arrow_type(f.type) for f in schema}
        for name, decision in files.items():
            try:
                got_records, got_dead = _local((base / name).read_bytes(), schema, keys)
            except LocalParseDeclined as exc:
                declined.append(name)
                assert decision == DECLINED, f"{tag}/{name} declined: {exc}; {(base / name).read_bytes()[:200]!r}"
                continue
            assert decision != DECLINED, f"{tag}/{name} was not declined: {(base / name).read_bytes()[:200]!r}"
            want_records = sorted(spark_records.get((tag, name), []), key=lambda r: r[0])
            want_dead = sorted(spark_dead.get((tag, name), []))
            context = f"{tag}/{name}: {(base / name).read_bytes()[:300]!r}"
            assert got_dead == want_dead, context
            assert [line for line, _ in got_records] == [line for line, _ in want_records], context
            for (line, got), (_, want) in zip(got_records, want_records):
                assert all(_same_value(g, w) for g, w in zip(got, want)), f"{context} line {line}: {got} != {want}"
            compared += 1
            reasons.update(reason for _, _, reason, _ in got_dead)
    assert compared == sum(d == SAME for d in decisions.values()) + sum(len(f) for *_, f in sources[:3])
    assert sorted(declined) == sorted(n for n, d in decisions.items() if d == DECLINED)
    # The corpus reaches every kind of dead letter the generator and the edges make.
    assert reasons >= {"invalid_utf8", "not_json", "not_an_object", "wrong_type", "missing_field", "null_key", "empty_key"}


# -- without Spark: the settled rules as exact outputs ---------------------------

SCHEMA = EDGE_SCHEMA
KEYS = {"l": "op_l", "k": "op_k"}  # given out of order: checked by name
ALL = "k string, s string, q int64 not null, l int64, d double, b bool, t timestamp[us, tz=UTC]"


def parse(data: bytes | str, schema: pa.Schema = SCHEMA, keys: dict[str, str] = KEYS) -> tuple[list[dict[str, Any]], list[tuple[int, str, str]]]:
    records, dead = parse_jsonl_lines(data.encode() if isinstance(data, str) else data, schema, keys)
    return records.to_pylist(), [(r["_line"], r["_raw"], r["_error"]) for r in dead.to_pylist()]


def error_of(line: str) -> str | None:
    records, dead = parse(line + "\n")
    assert len(records) + len(dead) == 1
    return dead[0][2] if dead else None


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, micro: int = 0) -> datetime.datetime:
    return datetime.datetime(year, month, day, hour, minute, second, micro, tzinfo=datetime.timezone.utc)


def test_a_record_has_the_schema_types_and_its_line() -> None:
    line = '{"k": "a", "s": {"x" : [1, true, null, "\\u00e9\\n"]}, "q": -0, "l": 7, "d": 5, "b": false, "t": "2026-01-01T02:00:00.051+02:00", "z": [1.5]}'
    records, dead = parse_jsonl_lines(f"\n{line}\n".encode(), SCHEMA, KEYS)
    assert dead.num_rows == 0
    assert records.schema == pa.schema([pa.field("_line", pa.int64()), *SCHEMA])
    assert records.to_pylist() == [
        {"_line": 2, "k": "a", "s": '{"x":[1,true,null,"é\\n"]}', "q": 0, "l": 7, "d": 5.0, "b": False, "t": utc(2026, 1, 1, 0, 0, 0, 51000)}
    ]


def test_lines_are_numbered_from_one_blank_ones_counted_one_cr_removed() -> None:
    good = '{"k": "a", "q": 1, "l": 7}'
    data = f"\n{good}\r\n \t\r\n\x0c\u3000\u00a0\u2028\n{good}\r\r\n{good[:-1]}\r".encode()
    records, dead = parse(data)
    assert [r["_line"] for r in records] == [2, 5]
    assert dead == [(6, good[:-1], "not_json: not valid JSON")]
    assert parse(f"{good}\n\x1c\n")[1] == [(2, "\x1c", "not_json: not valid JSON")]  # not White_Space
    assert parse(b"") == ([], [])


@pytest.mark.parametrize(
    "line, error",
    [
        ('{"k": "a", "q": 1, "l": 7, "t": "2026-01-01T02:0', "not_json: not valid JSON"),
        ('{"k": "a", "q": 1, "l": 7,}', "not_json: not valid JSON"),
        ('{"k": "a", "q": 01, "l": 7}', "not_json: not valid JSON"),
        ('{"k": "a", "q": 1, "l": 7} trailing', None),
        ('{"k": "a", "q": 1, "l": 7, "d": "x"}{}', "wrong_type: d: x is not double"),
        ("  [garbage", "not_an_object: a JSON array, not an object"),
        ('"a" "b"', "not_an_object: a JSON string, not an object"),
        ("42 x", "not_an_object: a JSON number, boolean or null, not an object"),
        ("42x", "not_json: not valid JSON"),
        ("42]", "not_json: not valid JSON"),
        ("null,", "not_an_object: a JSON number, boolean or null, not an object"),
        ("true\t", "not_an_object: a JSON number, boolean or null, not an object"),
        ("nullx", "not_json: not valid JSON"),
        ("\ufeff{}", "not_json: not valid JSON"),
        ("{}", "missing_field: required field q is missing or null"),
        ('{"k": null, "l": null}', "missing_field: required field q is missing or null"),
        ('{"q": 1, "l": null}', "null_key: key k of operator op_k is missing or null"),
        ('{"k": "", "q": 1, "l": null}', "empty_key: key k of operator op_k is empty"),
        ('{"k": "a", "q": 1}', "null_key: key l of operator op_l is missing or null"),
        ('{"K": "a", "q": 1, "l": 7}', "null_key: key k of operator op_k is missing or null"),
        # A decimal number in a string key: text unknown here, but neither null nor empty.
        ('{"k": [2.5], "l": 7}', "missing_field: required field q is missing or null"),
        ('{"k": 1.5, "q": 1, "l": null}', "null_key: key l of operator op_l is missing or null"),
        (
            '{"k": "", "q": "1", "l": 9223372036854775808, "d": {"a": "\\u001f"}, "b": 1, "t": "2026-02-29T00:00:00Z"}',
            "wrong_type: q: 1 is not int64; l: 9223372036854775808 is not int64; d: {\"a\":\"\\u001F\"} is not double; "
            "b: 1 is not bool; t: 2026-02-29T00:00:00Z is not timestamp[us, tz=UTC]",
        ),
        ('{"k": "a", "q": 1, "l": 7, "d": "' + "é" * 120 + '"}', "wrong_type: d: " + "é" * 100 + " is not double"),
        ('{"k": "a", "q": 1, "l": 1e400}', 'wrong_type: l: "Infinity" is not int64'),
        ('{"k": "a", "q": 1, "l": 7, "d": "INF"}', "wrong_type: d: INF is not double"),
        ('{"k": "a", "q": 1, "l": 7, "t": "yesterday at noon"}', "wrong_type: t: yesterday at noon is not timestamp[us, tz=UTC]"),
        ('{"k": "a", "q": 1, "l": 7, "t": "2026-01-01T02:00:00+18:01"}', "wrong_type: t: 2026-01-01T02:00:00+18:01 is not timestamp[us, tz=UTC]"),
        # json_object_keys refuses NaN tokens: a wrong line holding one is not_json.
        ('{"k": "a", "q": 1, "l": NaN}', "not_json: not valid JSON"),
        ('{"k": "a", "q": 1, "l": 7, "d": "x", "y": [Infinity]}', "not_json: not valid JSON"),
        ('{"k": "a", "q": 1, "l": 7, "y": NaN}', None),
        # A control character in a string: from_json refuses the line, json_object_keys reads it.
        ('{"k": "a\tb", "q": 1, "l": 7}', f"wrong_type: does not match the schema {ALL}"),
        ('{"k": "a\x01", "d": "x"} x', f"wrong_type: does not match the schema {ALL}"),
        ('{"k": "a\x01", "q": 1, "l": 7, "y": NaN}', "not_json: not valid JSON"),
        ('{"k": "a\x01", "q": 1, "l": 7,}', "not_json: not valid JSON"),
        ('{"k": "a",\x01 "q": 1, "l": 7}', "not_json: not valid JSON"),
    ],
)
def test_the_problem_of_a_line(line: str, error: str | None) -> None:
    assert error_of(line) == error


@pytest.mark.parametrize(
    "member, value",
    [
        ('"d": -0', 0.0),
        ('"d": -0.0', -0.0),
        ('"d": 9007199254740993', 9007199254740992.0),
        ('"d": 1e400', math.inf),
        ('"d": "+INF"', math.inf),
        ('"d": "-Infinity"', -math.inf),
        ('"d": "\\u004eaN"', math.nan),
        ('"s": 12345678901234567890123', "12345678901234567890123"),
        ('"s": [NaN, -Infinity]', '["NaN","-Infinity"]'),
        ('"s": {"a": "\\b\\f\\u000b\\u007f/\\/\\""}', '{"a":"\\b\\f\\u000B\x7f//\\""}'),
        ('"t": "2026-01-01T02:00:00.999999999-05:00"', utc(2026, 1, 1, 7, 0, 0, 999999)),
        ('"t": 1700000000', utc(2023, 11, 14, 22, 13, 20)),
        ('"t": "2024-02-29T00:00:00-18:00"', utc(2024, 2, 29, 18)),
    ],
)
def test_a_value_read_as_spark_reads_it(member: str, value: Any) -> None:
    name = member.split('"')[1]
    records, dead = parse('{"k": "a", "q": 1, "l": 7, ' + member + "}\n")
    assert dead == [] and len(records) == 1
    got = records[0][name]
    if isinstance(value, float):
        assert type(got) is float and (math.isnan(got) if math.isnan(value) else (got, math.copysign(1, got)) == (value, math.copysign(1, value)))
    else:
        assert got == value


def test_year_zero_is_read_as_java_time_reads_it() -> None:
    records, _ = parse_jsonl_lines(b'{"k": "a", "q": 1, "l": 7, "t": "0000-01-01T00:00:00Z"}\n', SCHEMA, KEYS)
    assert records["t"].cast(pa.int64()).to_pylist() == [-62167219200000000]


def test_an_invalid_utf8_file_flags_every_line_with_a_replacement() -> None:
    lines = [
        b'{"k": "a", "q": 1, "l": 7}',
        b'{"k": "\xef\xbf\xbd", "q": 1, "l": 7}',  # a valid U+FFFD: flagged too, the file being invalid
        b'{"k": "\x80\xc0\x80\xe2\x82", "q": 1, "l": 7}\r',
        b"  \xf0\x9f\x98  ",
    ]
    records, dead = parse(b"\n".join(lines))
    problem = "invalid_utf8: not valid UTF-8 (shown with U+FFFD replacements)"
    assert [r["_line"] for r in records] == [1]
    assert dead == [
        (2, '{"k": "\ufffd", "q": 1, "l": 7}', problem),
        (3, '{"k": "\ufffd\ufffd\ufffd\ufffd", "q": 1, "l": 7}', problem),
        (4, "  \ufffd  ", problem),
    ]
    # A valid file keeps its U+FFFD.
    assert parse(lines[1] + b"\n")[0][0]["k"] == "\ufffd"


@pytest.mark.parametrize(
    "data",
    [
        b'{"k": "a", "q": 1, "l": 7, "k": "b"}\n',  # a name twice
        b'{"k": "a", "q": 1, "l": 7, "x": {"y": 1, "y": 2}}\n',
        b'{"k": "a", "q": 1, "l": 7, "t": "2026-01-01T02:00:00"}\n',  # no offset: the session time zone
        b'{"k": "a", "q": 1, "l": 7, "t": "2026-01-01 02:00:00Z"}\n',
        b'{"k": "a", "q": 1, "l": 7, "t": 100000000000000}\n',
        b'{"k": "a", "q": 1, "l": 7, "s": 1.5}\n',  # the JVM prints doubles its own way
        b'{"k": "a", "q": 1, "l": 1.0}\n',
        b'{"k": "a", "q": 1, "l": 7, "s": "\\ud83d\\ude00"}\n',
        b"{'k': 'a', 'q': 1, 'l': 7}\n",  # single quotes
        b'{"k": "a", "q": 1, "l": 7, "d": +Infinity}\n',
        b'{"k": "a", "q": 1, "l": 7, "d": -INF}\n',
        b"NaN\n",
        b'\x0b{"k": "a", "q": 1, "l": 7}\n',
        b'{"k": "a", "q": 1, "l": 7, "x": ' + b"1" * 600 + b"}\n",
        b'{"k": "a", "q": 1, "l": 7, "x": "' + b"x" * 40_000 + b'"}\n',
        b'{"k": "\xed\xa0\x80", "q": 1, "l": 7}\n',  # an encoded surrogate: the JVM replaces it otherwise
        b'{"k": "a", "q": 1, "l": 7}\n' * 3 + b'{"k": "a", "q": 1, "l": 7, "d": ' + b"9" * 400 + b"}\n",  # too large for a double
    ],
)
def test_what_is_not_settled_declines(data: bytes) -> None:
    with pytest.raises(LocalParseDeclined):
        parse_jsonl_lines(data, SCHEMA, KEYS)


@pytest.mark.parametrize(
    "schema, keys",
    [
        (pa.schema([pa.field("x", pa.int32())]), {}),
        (pa.schema([pa.field("x", pa.timestamp("us"))]), {}),
        (pa.schema([pa.field("x", pa.timestamp("ms", tz="UTC"))]), {}),
        (pa.schema([pa.field("x", pa.large_string())]), {}),
        (pa.schema([pa.field("x", pa.string())]), {"y": "op"}),
        (pa.schema([pa.field("_raw", pa.string())]), {}),  # a column of the Spark path's own
    ],
)
def test_a_schema_not_handled_declines_at_once(schema: pa.Schema, keys: dict[str, str]) -> None:
    with pytest.raises(LocalParseDeclined):
        parse_jsonl_lines(b"", schema, keys)


def test_timestamps_equal_pythons_reading_of_the_same_instant() -> None:
    """The vectorised reading of rule 6's form, against datetime, over random instants, fractions and offsets."""
    rng = random.Random(7)
    lines, want = [], []
    for _ in range(2000):
        local = datetime.datetime(rng.randrange(1, 9999), 1, 1) + datetime.timedelta(seconds=rng.randrange(366 * 86400))
        micros = rng.randrange(1_000_000)
        digits = rng.randrange(10)
        fraction = "" if digits == 0 else "." + f"{micros:06d}{rng.randrange(1000):03d}"[:digits]
        minutes = rng.choice([0, rng.randrange(-18 * 60, 18 * 60 + 1)])
        zone = "Z" if minutes == 0 and rng.random() < 0.5 else f"{'-' if minutes < 0 else '+'}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
        lines.append(f'{{"t": "{local.strftime("%Y-%m-%dT%H:%M:%S").zfill(19)}{fraction}{zone}"}}')
        kept = int((f"{micros:06d}{0:03d}"[:digits] + "000000")[:6]) if digits else 0
        epoch = (local - datetime.datetime(1970, 1, 1)) // datetime.timedelta(microseconds=1)
        want.append(epoch + kept - minutes * 60_000_000)
    schema = pa.schema([pa.field("t", TS)])
    records, dead = parse_jsonl_lines("\n".join(lines).encode(), schema, {})
    assert dead.num_rows == 0
    assert records["t"].cast(pa.int64()).to_pylist() == want


@pytest.mark.parametrize("k", [0, 3])
def test_generated_files_are_never_declined(tmp_path: Path, k: int) -> None:
    """The order stream's files (every malformed kind, blank lines, duplicates) parse here: none is declined."""
    written = write_order_files(tmp_path, OrderStreamSpec(n_files=k + 1, orders_per_file=1000, seed=k), start_index=k)
    schemas = {
        "orders": (ORDER_SCHEMA, {"order_id": "order_dedup"}),
        "payments": (PAYMENT_SCHEMA, {"payment_id": "payment_dedup"}),
        "thresholds": (THRESHOLD_SCHEMA, {}),
    }
    reasons: set[str] = set()
    for path in written:
        schema, keys = schemas[path.parent.name]
        records, dead = parse_jsonl_lines(path.read_bytes(), schema, keys)
        reasons.update(error.split(": ", 1)[0] for error in dead["_error"].to_pylist())
        if path.parent.name == "orders":
            assert records.num_rows > 900
    assert reasons >= {"not_json", "not_an_object", "wrong_type", "missing_field", "null_key", "empty_key"}
