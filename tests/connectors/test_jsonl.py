"""barrierflow.connectors.jsonl: what makes a JSON Lines line a record or a dead letter (the module's rule, step by step).

Small byte strings, no files, no Spark. Expected values are written by hand,
or (the fuzz test) computed by a plain-Python reference of the rule for a
schema of simple types; the fuzz test also checks that a chunk read as one
block gives exactly what its lines give read one by one.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import random
import re
from typing import Any

import pyarrow as pa
import pytest

from barrierflow.connectors import jsonl
from barrierflow.connectors.jsonl import LINE, ParsedLines, parse_lines, record_schema
from barrierflow.core.errors import PipelineDefinitionError

UTC = datetime.timezone.utc
TS = pa.timestamp("us", tz="UTC")

# The README's clicks (tests/integration/test_dead_letters.py).
EVENT_SCHEMA = pa.schema(
    [pa.field("event_id", pa.string()), pa.field("user_id", pa.string()), pa.field("amount", pa.float64(), nullable=False)]
)
EVENT_KEYS = {"event_id": "dedup", "user_id": "per_user"}


def _parse(
    data: bytes | str | list[str], schema: pa.Schema = EVENT_SCHEMA, keys: dict[str, str] | None = None, **kw: Any
) -> ParsedLines:
    if isinstance(data, list):
        data = "\n".join(data)
    if isinstance(data, str):
        data = data.encode("utf-8")
    return parse_lines(data, schema, keys or {}, **kw)


def _outcome(result: ParsedLines) -> dict[int, Any]:
    """Line number -> its record (without _line, nulls left out) or its problem string."""
    got: dict[int, Any] = {}
    for row in result.records.to_pylist():
        line = row.pop(LINE)
        got[line] = {k: v for k, v in row.items() if v is not None}
    for line, text in zip(result.dead_lines, result.dead_problems):
        assert line not in got, f"line {line} is both a record and a dead letter"
        got[line] = text
    return got


def _one(line: str, schema: pa.Schema = EVENT_SCHEMA, keys: dict[str, str] | None = None) -> Any:
    """The outcome of a single line: its record or its problem (None: blank)."""
    return _outcome(_parse(line, schema, keys)).get(1)


# -- the README's lines ------------------------------------------------------------

LINES: list[tuple[str, str | None]] = [
    ('{"event_id": "a1", "user_id": "u1", "amount": 1.5}', None),
    ("garbage", "not_json"),
    ('{"event_id": "a2", "user_id": "u1"', "not_json"),
    ("[1,2,3]", "not_an_object"),
    ('"a string"', "not_an_object"),
    ("42", "not_an_object"),
    ("{}", "missing_field"),
    ('{"event_id": "b1", "user_id": "u1", "amount": "lots"}', "wrong_type"),
    ('{"event_id": "b2", "user_id": "u2", "amount": true}', "wrong_type"),
    ('{"event_id": "b3", "user_id": "u2", "amount": null}', "missing_field"),
    ('{"event_id": "b4", "user_id": null, "amount": 2}', "null_key"),
    ('{"event_id": "b5", "amount": 2}', "null_key"),
    ('{"event_id": "b6", "user_id": "", "amount": 2}', "empty_key"),
    ('{"event_id": null, "user_id": "u2", "amount": 2}', "null_key"),
    ('{"event_id": "", "user_id": "u2", "amount": 2}', "empty_key"),
    ('{"event_id": "a3", "user_id": "u2", "amount": 4}', None),
    ('{"event_id": "a4", "user_id": "u1", "amount": 2.25, "extra": [1, {"x": 2}]}', None),
    ('{"event_id": "a1", "user_id": "u1", "amount": 100}', None),
]


@pytest.mark.parametrize("dedup", [True, False])
def test_the_readme_lines_are_records_or_dead_letters_with_their_reasons(dedup: bool) -> None:
    keys = EVENT_KEYS if dedup else {"user_id": "per_user"}
    result = _parse([text for text, _ in LINES] + [""], keys=keys)
    faults = {n: reason for n, (_, reason) in enumerate(LINES, start=1) if reason is not None and (dedup or n not in (14, 15))}
    assert {n: p.split(": ", 1)[0] for n, p in zip(result.dead_lines, result.dead_problems)} == faults
    assert result.dead_raw == tuple(LINES[n - 1][0] for n in sorted(faults))
    details = {n: p.split(": ", 1)[1] for n, p in zip(result.dead_lines, result.dead_problems)}
    assert all(details.values())
    assert details[8] == "amount: lots is not double"
    assert details[9] == "amount: true is not double"
    assert details[7] == details[10] == "required field amount is missing or null"
    assert details[11] == details[12] == "key user_id of operator per_user is missing or null"
    assert details[13] == "key user_id of operator per_user is empty"
    assert details[4] == "a JSON array, not an object"
    assert details[2].startswith("not valid JSON") and details[3].startswith("not valid JSON")
    if dedup:
        assert details[14] == "key event_id of operator dedup is missing or null"
        assert details[15] == "key event_id of operator dedup is empty"
    records = result.records.to_pylist()
    expected: list[tuple[int, str | None, str, float]] = [
        (1, "a1", "u1", 1.5),
        (16, "a3", "u2", 4.0),
        (17, "a4", "u1", 2.25),
        (18, "a1", "u1", 100.0),
    ]
    if not dedup:
        expected[1:1] = [(14, None, "u2", 2.0), (15, "", "u2", 2.0)]
    assert [(r[LINE], r["event_id"], r["user_id"], r["amount"]) for r in records] == expected
    assert result.lines == 18  # the final LF ends line 18


# -- lines: LF, CRLF, blank lines, numbering, byte-order mark ----------------------


def test_blank_lines_are_skipped_but_numbered_and_first_line_numbers_the_chunk() -> None:
    data = b'\n  \n\t\r\n{"amount": 1}\n \t \r \n\r\n{"amount": 2}\n\n'
    result = _parse(data, first_line=41)
    assert _outcome(result) == {44: {"amount": 1.0}, 47: {"amount": 2.0}}
    assert result.lines == 8  # the final LF ends line 8, it starts none
    assert _parse(data[:-1]).lines == 7 and _parse(data + b" ").lines == 9
    assert _parse(b"").lines == 0 and _parse(b"\n").lines == 1 and _parse(b"x").lines == 1
    assert _outcome(_parse(b"  \n\t\n\r\n")) == {}


def test_a_line_of_any_white_space_is_blank_but_a_nul_is_not() -> None:
    # Any Unicode white space makes a blank line (a producer's stray NBSP is no record); a NUL is text.
    for text in ("\x0c", "\x0b", "\u00a0", "\u3000", " \u2003\t"):
        assert _parse(text.encode()).dead_lines == () and _parse(text.encode()).records.num_rows == 0, repr(text)
    assert _one("\x00").startswith("not_json: not valid JSON")


def test_crlf_lines_and_a_cr_left_before_the_lf() -> None:
    data = b'{"amount": 1}\r\n[1]\r\n{"amount": 2}\r\r\n\r\n{"amount": 3}\r'
    result = _parse(data)
    assert _outcome(result) == {
        1: {"amount": 1.0},
        2: "not_an_object: a JSON array, not an object",
        3: {"amount": 2.0},  # the CR before CRLF is white space inside the line
        5: {"amount": 3.0},  # a CR ending the data belongs to the terminator too
    }
    assert result.dead_raw == ("[1]",)  # the terminator's CR is not the line's
    assert _parse(b"[1]\r\r\n").dead_raw == ("[1]\r",)


def test_a_byte_order_mark_is_skipped_only_at_the_files_first_byte() -> None:
    bom = b"\xef\xbb\xbf"
    assert _outcome(_parse(bom + b'{"amount": 1}\n' + bom + b'{"amount": 2}')) == {
        1: {"amount": 1.0},
        2: "not_json: not valid JSON: a byte-order mark (only the file's first bytes may hold one) at character 1",
    }
    assert _outcome(_parse(bom + b'{"amount": 1}', file_start=False))[1].startswith("not_json: not valid JSON: a byte-order mark")
    result = _parse(bom + b"\n[]")
    assert _outcome(result) == {2: "not_an_object: a JSON array, not an object"} and result.lines == 2
    assert _parse(bom).lines == 0


# -- 1. invalid_utf8 -------------------------------------------------------------------


def test_bytes_that_are_not_utf8_make_the_line_invalid_utf8_whatever_else_it_holds() -> None:
    data = b'{"amount": 1}\n{"amount": "\xff"}\n[\xc3\x28]\n{"event_id": "\xed\xa0\x80", "amount": 1}\n{"event_id": "\xc3\xa9", "amount": 2}\r\n\x80\r\n'
    result = _parse(data)
    assert _outcome(result) == {
        1: {"amount": 1.0},
        2: "invalid_utf8: not valid UTF-8: invalid start byte at byte 12",
        3: "invalid_utf8: not valid UTF-8: invalid continuation byte at byte 1",
        4: "invalid_utf8: not valid UTF-8: invalid continuation byte at byte 14",  # an encoded surrogate
        5: {"event_id": "é", "amount": 2.0},
        6: "invalid_utf8: not valid UTF-8: invalid start byte at byte 0",
    }
    assert result.dead_raw == ('{"amount": "\ufffd"}', "[\ufffd(]", '{"event_id": "\ufffd\ufffd\ufffd", "amount": 1}', "\ufffd")


# -- 2. not_json -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("garbage", "Expecting value at character 1"),
        ('{"amount": 1', "Expecting ',' delimiter at character 13"),
        ('{"amount": 1} {"amount": 2}', "text after the JSON value at character 15"),  # two objects on a line
        ('{"amount": 1}{"amount": 2}', "text after the JSON value at character 14"),
        ("{} null {}", "text after the JSON value at character 4"),
        ('{"amount": 1} x', "text after the JSON value at character 15"),
        ("{", "Expecting property name enclosed in double quotes at character 2"),  # an object spread over lines
        ("}", "Expecting value at character 1"),
        ('{"amount": NaN}', "NaN is not a JSON value"),
        ('{"amount": -Infinity}', "-Infinity is not a JSON value"),
        ('{"amount": 1, "other": NaN}', "NaN is not a JSON value"),  # also in a field the schema does not name
        ('{"amount": 1, "other": [1, {"x": Infinity}]}', "Infinity is not a JSON value"),
        ('{"amount": 1, "other": Inf}', "Expecting value at character 24"),
        ("NaN", "NaN is not a JSON value"),
        ('{"amount": 1} // c', "text after the JSON value at character 15"),
        ('/* c */ {"amount": 1}', "Expecting value at character 1"),
        ('{"amount": 1,}', "Expecting property name enclosed in double quotes at character 14"),
        ('{"amount": 1, "x": [1,]}', "Expecting value at character 23"),
        ("{'amount': 1}", "Expecting property name enclosed in double quotes at character 2"),
        ('{"amount": 01}', "Expecting ',' delimiter at character 13"),
        ('{"amount": 1.}', "Expecting ',' delimiter at character 13"),
        ('{"amount": +1}', "Expecting value at character 12"),
        ('{"amount": 1, "event_id": "a\tb"}', "Invalid control character at character 29"),
        ('{"amount": 1, "x": "\\x"}', "Invalid \\escape at character 21"),
        ('{"amount": 1, "event_id": "\\ud800"}', "a lone surrogate \\u escape"),
        ('{"amount": 1, "x": "\\udc00x"}', "a lone surrogate \\u escape"),
        ('{"amount": 1, "\\ud83d": 2}', "a lone surrogate \\u escape"),
        ('{"amount": 1, "amount": 2}', "the object names amount twice"),
        ('{"amount": 1, "event_id": "a", "event_id": null}', "the object names event_id twice"),
        ('{"amount": 1, "x": ' + "[" * 500 + "]" * 500 + "}", f"nested more than {jsonl.MAX_DEPTH} levels deep"),
        ("[" * 600 + "]" * 600, f"nested more than {jsonl.MAX_DEPTH} levels deep"),
    ],
)
def test_what_is_not_exactly_one_strict_json_value_is_not_json(line: str, why: str) -> None:
    assert _one(line) == f"not_json: not valid JSON: {why}"


def test_an_object_spread_over_lines_is_a_dead_letter_on_each_of_its_lines() -> None:
    result = _parse(['{"amount": 1}', "{", '  "amount": 2', "}", '{"amount": 3}'])
    assert [n for n, v in _outcome(result).items() if isinstance(v, dict)] == [1, 5]
    assert result.dead_lines == (2, 3, 4) and all(p.startswith("not_json: ") for p in result.dead_problems)


def test_valid_json_that_looks_odd_is_read() -> None:
    line = '{"amount": 1, "x": ' + "[" * 499 + "]" * 499 + "}"  # the outer object makes 500 levels
    assert _one(line) == {"amount": 1.0}
    assert _one('{"amount": 1, "event_id": "NaN, Infinity: -Inf", "x": "[NaN]"}') == {
        "amount": 1.0,
        "event_id": "NaN, Infinity: -Inf",
    }
    assert _one('{"amount": 1, "x": 1, "x": 2, "y": {"z": 1, "z": 2}}') == {"amount": 1.0}  # names the schema does not read
    assert _one('{"amount": 1, "event_id": "\\ud83d\\ude00\\u00e9\\/\\u0000"}') == {"amount": 1.0, "event_id": "😀é/\x00"}
    assert _one(' \t{ "amount" : 1 ,"user_id":"u"\r}\t ') == {"amount": 1.0, "user_id": "u"}
    assert _one('{"amount": 1, "x": 1e400, "y": -0, "z": 123456789012345678901234567890}') == {"amount": 1.0}
    assert _one('{"amount": 1, "event_id": "\u2028\x7f"}') == {"amount": 1.0, "event_id": "\u2028\x7f"}


# -- 3. not_an_object --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "detail"),
    [
        ("[]", "a JSON array, not an object"),
        ('[{"amount": 1}]', "a JSON array, not an object"),
        ('  [{"amount": 1, "amount": 2}]', "a JSON array, not an object"),
        ('"a string"', "a JSON string, not an object"),
        ('""', "a JSON string, not an object"),
        ("42", "a JSON number, boolean or null, not an object"),
        ("-0.5e3", "a JSON number, boolean or null, not an object"),
        ("true", "a JSON number, boolean or null, not an object"),
        ("false", "a JSON number, boolean or null, not an object"),
        ("null", "a JSON number, boolean or null, not an object"),
        (" null\t", "a JSON number, boolean or null, not an object"),
    ],
)
def test_a_json_value_that_is_not_an_object_is_not_an_object(line: str, detail: str) -> None:
    assert _one(line) == f"not_an_object: {detail}"


# -- 4. wrong_type and the conversions ------------------------------------------------------

TYPES = pa.schema(
    [
        pa.field("s", pa.string()),
        pa.field("i", pa.int64()),
        pa.field("d", pa.float64()),
        pa.field("b", pa.bool_()),
        pa.field("t", TS),
        pa.field("day", pa.date32()),
        pa.field("i32", pa.int32()),
        pa.field("f32", pa.float32()),
        pa.field("dec", pa.decimal128(6, 2)),
        pa.field("tags", pa.list_(pa.string())),
        pa.field("st", pa.struct([("a", pa.int64()), ("t", TS)])),
    ]
)


@pytest.mark.parametrize(
    ("value", "read"),
    [
        ('"x"', "x"),
        ("1.50", "1.50"),  # a number as written
        ("-0", "-0"),
        ("1E+5", "1E+5"),
        ("123456789012345678901234567890", "123456789012345678901234567890"),
        ("true", "true"),
        ("false", "false"),
        ('"\\"q\\" \\u00e9"', '"q" é'),
    ],
)
def test_a_string_field_reads_strings_and_numbers_and_booleans_as_their_text(value: str, read: str) -> None:
    assert _one(f'{{"s": {value}}}', TYPES) == {"s": read}
    assert _one(f'{{"tags": ["a", {value}]}}', TYPES) == {"tags": ["a", read]}


@pytest.mark.parametrize(
    ("field", "value", "read"),
    [
        ("i", "-9223372036854775808", -(2**63)),
        ("i", "9223372036854775807", 2**63 - 1),
        ("i", "-0", 0),
        ("d", "7", 7.0),
        ("d", "1.5e-3", 0.0015),
        ("d", "-0.0", -0.0),
        ("d", "4.9e-324", 5e-324),
        ("d", "1e-400", 0.0),
        ("d", "123456789012345678901234567890", 1.2345678901234568e29),
        ("b", "false", False),
        ("i32", "-2147483648", -(2**31)),
        ("f32", "0.5", 0.5),
        ("t", '"2026-01-01T02:00:00Z"', datetime.datetime(2026, 1, 1, 2, tzinfo=UTC)),
        ("t", '"2026-01-01T02:00:00+02:00"', datetime.datetime(2026, 1, 1, 0, tzinfo=UTC)),
        ("t", '"2026-01-01T02:00:00-0130"', datetime.datetime(2026, 1, 1, 3, 30, tzinfo=UTC)),
        ("t", '"2026-01-01 02:00:00.25"', datetime.datetime(2026, 1, 1, 2, 0, 0, 250_000, tzinfo=UTC)),  # no offset: UTC
        ("t", '"2026-01-01"', datetime.datetime(2026, 1, 1, tzinfo=UTC)),  # a date alone
        ("t", '"2026-01-01T02:00"', datetime.datetime(2026, 1, 1, 2, tzinfo=UTC)),
        ("t", '"2026-01-01T02:00:00.123456Z"', datetime.datetime(2026, 1, 1, 2, 0, 0, 123_456, tzinfo=UTC)),
        ("day", '"2024-02-29"', datetime.date(2024, 2, 29)),
        ("dec", "1.25", decimal.Decimal("1.25")),
        ("dec", '"1.25"', decimal.Decimal("1.25")),
        ("st", '{"a": 1, "t": "2026-01-01", "x": [true]}', {"a": 1, "t": datetime.datetime(2026, 1, 1, tzinfo=UTC)}),
    ],
)
def test_values_that_convert(field: str, value: str, read: Any) -> None:
    got = _one(f'{{"{field}": {value}}}', TYPES)
    assert got == {field: read}
    if isinstance(read, float):
        assert math.copysign(1, got[field]) == math.copysign(1, read)


@pytest.mark.parametrize(
    ("field", "value", "detail"),
    [
        ("s", "[1, 2]", "s: [1,2] is not string"),
        ("s", '{"a": "b"}', 's: {"a":"b"} is not string'),
        ("i", "1.0", "i: 1.0 is not int64"),  # no fraction
        ("i", "1e2", "i: 1e2 is not int64"),  # no exponent
        ("i", "9223372036854775808", "i: 9223372036854775808 is not int64"),
        ("i", '"5"', "i: 5 is not int64"),
        ("i", "true", "i: true is not int64"),
        ("d", '"lots"', "d: lots is not double"),
        ("d", '""', "d:  is not double"),
        ("d", "true", "d: true is not double"),
        ("d", "1e400", "d: 1e400 is not double"),  # beyond a double's range
        ("d", "-1e400", "d: -1e400 is not double"),
        ("d", "9" * 400, f"d: {'9' * 100} is not double"),
        ("d", '"NaN"', "d: NaN is not double"),
        ("b", "0", "b: 0 is not bool"),
        ("b", '"true"', "b: true is not bool"),
        ("t", '"yesterday"', "t: yesterday is not timestamp[us, tz=UTC]"),
        ("t", "1700000000", "t: 1700000000 is not timestamp[us, tz=UTC]"),
        ("t", '"2026-02-30T00:00:00Z"', "t: 2026-02-30T00:00:00Z is not timestamp[us, tz=UTC]"),
        ("t", '"2026-01-01T02:00:00.123456789Z"', "t: 2026-01-01T02:00:00.123456789Z is not timestamp[us, tz=UTC]"),
        ("day", '"2026-02-30"', "day: 2026-02-30 is not date32[day]"),
        ("day", '"2026-1-1"', "day: 2026-1-1 is not date32[day]"),
        ("day", '"2026-01-01T00:00:00"', "day: 2026-01-01T00:00:00 is not date32[day]"),
        ("day", "5", "day: 5 is not date32[day]"),
        ("i32", "2147483648", "i32: 2147483648 is not int32"),
        ("f32", "1e39", "f32: 1e39 is not float"),
        ("dec", "1.255", "dec: 1.255 is not decimal128(6, 2)"),
        ("dec", "1234567.5", "dec: 1234567.5 is not decimal128(6, 2)"),
        ("tags", '"a"', "tags: a is not list<item: string>"),
        ("tags", '[{"a": 1}]', 'tags: [{"a":1}] is not list<item: string>'),
        ("st", '{"a": 1.5}', 'st: {"a":1.5} is not struct<a: int64, t: timestamp[us, tz=UTC]>'),
        ("st", '{"t": "noon"}', 'st: {"t":"noon"} is not struct<a: int64, t: timestamp[us, tz=UTC]>'),
    ],
)
def test_values_that_do_not_convert_are_wrong_type_never_null(field: str, value: str, detail: str) -> None:
    assert _one(f'{{"{field}": {value}, "x": "ignored"}}', TYPES) == f"wrong_type: {detail}"


def test_wrong_fields_are_named_in_schema_order_each_value_cut_to_100_characters() -> None:
    line = '{"b": 1, "d": "x", "s": {"a": "' + "é" * 150 + '"}, "i": 1.5, "zzz": "ignored", "t": "z"}'
    assert _one(line, TYPES) == (
        'wrong_type: s: {"a":"' + "é" * 94 + " is not string; i: 1.5 is not int64; d: x is not double; b: 1 is not bool; "
        "t: z is not timestamp[us, tz=UTC]"
    )


def test_wrong_type_comes_before_missing_field_and_keys() -> None:
    assert _one('{"event_id": "", "amount": "x"}', keys=EVENT_KEYS) == "wrong_type: amount: x is not double"
    assert _one('{"event_id": 7, "user_id": false, "amount": 1}', keys=EVENT_KEYS) == {
        "event_id": "7",
        "user_id": "false",
        "amount": 1.0,
    }


# -- 5, 6. missing_field, null_key, empty_key --------------------------------------------

KEYED = pa.schema(
    [
        pa.field("z", pa.string(), nullable=False),
        pa.field("a", pa.int64(), nullable=False),
        pa.field("k", pa.string()),
        pa.field("n", pa.int64()),
        pa.field("c", pa.string()),
    ]
)
KEYS = {"n": "op_n", "k": "op_k", "missing": "op_m"}  # a key the schema does not name is not checked here


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"z": "", "a": 0, "k": "x", "n": 0}', None),  # empty is fine for a required field; 0 for a number key
        ('{"a": 1, "k": "x", "n": 1}', "missing_field: required field z is missing or null"),
        ('{"z": null, "a": null}', "missing_field: required field z is missing or null"),  # the first in schema order
        ('{"z": "z", "k": "x", "n": 1}', "missing_field: required field a is missing or null"),
        ('{"z": "z", "a": 1, "n": 1}', "null_key: key k of operator op_k is missing or null"),
        ('{"z": "z", "a": 1, "k": "", "n": null}', "empty_key: key k of operator op_k is empty"),  # keys by name: k, then n
        ('{"z": "z", "a": 1, "k": "x"}', "null_key: key n of operator op_n is missing or null"),
        ('{"z": "z", "a": 1, "k": "x", "n": null}', "null_key: key n of operator op_n is missing or null"),
        ('{"z": "z", "a": 1, "k": 0, "n": 1}', None),  # a number read as the text "0": not empty
    ],
)
def test_required_fields_then_keys_in_name_order(line: str, problem: str | None) -> None:
    got = _one(line, KEYED, KEYS)
    if problem is None:
        assert isinstance(got, dict)
    else:
        assert got == problem


# -- the records ------------------------------------------------------------------------------


def test_records_carry_the_schema_with_every_field_nullable_and_their_line_numbers() -> None:
    assert record_schema(KEYED) == pa.schema([f.with_nullable(True) for f in KEYED])
    result = _parse(['{"z": "z", "a": 1, "k": "k", "n": 2, "c": null, "other": 3}', "[]"], KEYED, first_line=10)
    assert result.records.schema == record_schema(KEYED).append(pa.field(LINE, pa.int64(), nullable=False))
    assert result.records.to_pylist() == [{"z": "z", "a": 1, "k": "k", "n": 2, "c": None, LINE: 10}]
    empty = _parse(b"[]\n", KEYED)
    assert empty.records.schema == result.records.schema and empty.records.num_rows == 0
    assert _parse(b"", KEYED).records.schema == result.records.schema


def test_a_schema_naming_the_line_column_is_refused() -> None:
    with pytest.raises(PipelineDefinitionError, match="_line"):
        parse_lines(b"{}", pa.schema([pa.field(LINE, pa.int64())]), {})


def test_a_schema_without_fields_makes_each_object_an_empty_record() -> None:
    result = parse_lines(b'{"a": 1}\n[]\n{}\n', pa.schema([]), {})
    assert result.records.to_pylist() == [{LINE: 1}, {LINE: 3}] and result.dead_lines == (2,)


def test_records_keep_their_lines_order_whichever_way_they_were_read() -> None:
    lines = ['{"amount": %d}' % i if i % 3 else '  {"event_id": %d, "amount": %d}' % (i, i) for i in range(40)]
    result = _parse(lines)
    assert result.records[LINE].to_pylist() == list(range(1, 41))
    assert result.records["amount"].to_pylist() == [float(i) for i in range(40)]


# -- the block path and the line path agree; a reference of the rule agrees with both ------------

FUZZ_SCHEMA = pa.schema(
    [pa.field("k", pa.string()), pa.field("s", pa.string()), pa.field("i", pa.int64(), nullable=False), pa.field("d", pa.float64()),
     pa.field("b", pa.bool_())]
)  # fmt: skip
FUZZ_KEYS = {"k": "op_k"}
_INT = re.compile(r"-?(?:0|[1-9][0-9]*)\Z")


class _Raw(str):
    """A JSON number's text (the reference keeps it as written)."""


def _reference(raw: bytes) -> Any:
    """The rule for FUZZ_SCHEMA in plain Python: None (blank), a record dict, or the reason code."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "invalid_utf8"
    if not text.strip(" \t\r"):
        return None
    repeated: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        names = [k for k, _ in items]
        repeated.extend(k for k in set(names) if names.count(k) > 1)
        return dict(items)

    def constant(name: str) -> Any:
        raise ValueError(name)

    try:
        obj = json.loads(text, object_pairs_hook=pairs, parse_constant=constant, parse_int=_Raw, parse_float=_Raw)
    except ValueError:
        return "not_json"
    strings = [obj] if isinstance(obj, str) else []
    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            strings.extend(v)
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str) and not isinstance(v, _Raw):
            strings.append(v)
    if any(re.search("[\ud800-\udfff]", s) for s in strings):
        return "not_json"
    if not isinstance(obj, dict):
        return "not_an_object"
    if set(repeated) & set(FUZZ_SCHEMA.names):
        return "not_json"
    record: dict[str, Any] = {}
    wrong = False
    value: Any
    for name in FUZZ_SCHEMA.names:
        v = obj.get(name)
        if v is None:
            continue
        if name in ("k", "s"):
            ok = isinstance(v, str) or isinstance(v, bool)
            value = ("true" if v else "false") if isinstance(v, bool) else str(v)
        elif name == "i":
            ok = isinstance(v, _Raw) and bool(_INT.match(v)) and -(2**63) <= int(v) < 2**63
            value = int(v) if ok else None
        elif name == "d":
            ok = isinstance(v, _Raw) and math.isfinite(float(v))
            value = float(v) if ok else None
        else:
            ok = isinstance(v, bool)
            value = v
        wrong |= not ok
        record[name] = value
    if wrong:
        return "wrong_type"
    if record.get("i") is None:
        return "missing_field"
    if record.get("k") is None:
        return "null_key"
    if record["k"] == "":
        return "empty_key"
    return record


def _fuzz_line(rng: random.Random) -> bytes:
    fields: dict[str, str] = {}
    for name, values in (
        ("k", ['"k1"', '"k2"', '""', "null", "7", "true"]),
        ("s", ['"text"', "1.50", "-0", "false", '"NaN: Inf"', '"é\\u00e9\\ud83d\\ude00"', "[1]", '{"a": 1}', "null"]),
        ("i", ["1", "-42", "0", "9223372036854775807", "9223372036854775808", "1.0", "2e3", '"3"', "true", "null"]),
        ("d", ["1.5", "-0.0", "3", "1e-5", "2.5E+10", "1e400", '"x"', "false", "NaN", "-Infinity", "null"]),
        ("b", ["true", "false", "0", '"true"', "null"]),
        ("x", ["1", '"y"', "[1, 2]", '{"z": null}', "Infinity", "1e999", '"\\ud800"']),
    ):
        if rng.random() < 0.75:
            weights = [30 if j < 2 else 1 for j in range(len(values))]
            fields[name] = rng.choices(values, weights)[0]
    items = list(fields.items())
    if rng.random() < 0.03 and items:
        items.append(rng.choice(items))  # a name given twice
    rng.shuffle(items)
    space = rng.choice(["", " ", "  ", "\t"])
    text = "{" + ("," + space).join(f'"{k}":{space}{v}' for k, v in items) + "}"
    kind = rng.randrange(40)
    if kind == 0:
        return text.encode()[: rng.randrange(1, len(text) + 1)]  # cut short
    if kind == 1:
        return bytes(rng.choice([*range(0x20, 0x7F), 0x80, 0xC3, 0xFF, 0x09, 0x0D]) for _ in range(rng.randrange(1, 20)))
    if kind == 2:
        return (text + rng.choice([" ", "", "\t"]) + text).encode()  # two objects
    if kind == 3:
        return rng.choice([b"", b" ", b"\t", b"\r", b" \r\t", b"{", b"}", b"[]", b'"s"', b"42", b"null", b"{} null {}"])
    if kind == 4:
        return (rng.choice([" ", "\t", "\r"]) + text + rng.choice([" ", "\r", ""])).encode()  # padded
    if kind == 5:
        raw = bytearray(text.encode())
        raw[rng.randrange(len(raw))] = rng.choice([0xFF, 0x80, 0xC3])  # invalid UTF-8
        return bytes(raw)
    return text.encode()


def _as_reference(result: ParsedLines) -> dict[int, Any]:
    got: dict[int, Any] = {n: p.split(": ", 1)[0] for n, p in zip(result.dead_lines, result.dead_problems)}
    for row in result.records.to_pylist():
        line = row.pop(LINE)
        got[line] = {k: v for k, v in row.items() if v is not None}
    return got


def _everything(result: ParsedLines) -> tuple[list[dict[str, Any]], list[tuple[int, str, str]]]:
    return result.records.to_pylist(), list(zip(result.dead_lines, result.dead_raw, result.dead_problems))


@pytest.fixture(scope="module")
def fuzz_lines() -> list[bytes]:
    rng = random.Random(20261207)
    lines = [_fuzz_line(rng) for _ in range(1000)]
    lines[100:400] = [line for line in lines[100:400] if _reference(line) not in ("not_json", "invalid_utf8")]  # mostly objects
    return lines


@pytest.fixture(scope="module")
def line_by_line(fuzz_lines: list[bytes]) -> tuple[list[dict[str, Any]], list[tuple[int, str, str]]]:
    records: list[dict[str, Any]] = []
    dead: list[tuple[int, str, str]] = []
    for n, line in enumerate(fuzz_lines, start=1):
        one = parse_lines(line, FUZZ_SCHEMA, FUZZ_KEYS, first_line=n, file_start=False)
        assert one.lines == (1 if line else 0)
        got_records, got_dead = _everything(one)
        records += got_records
        dead += got_dead
    return records, dead


@pytest.mark.parametrize("piece_lines", [1 << 16, 7, 1])
def test_a_chunk_read_as_one_block_gives_what_its_lines_give_one_by_one(
    fuzz_lines: list[bytes], line_by_line: Any, piece_lines: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jsonl, "_PIECE_LINES", piece_lines)
    data = b"\n".join(fuzz_lines) + b"\n"
    whole = parse_lines(data, FUZZ_SCHEMA, FUZZ_KEYS, first_line=1, file_start=False)
    assert whole.lines == len(fuzz_lines)
    assert _everything(whole) == line_by_line
    # Every line that is not blank is one record or one dead letter, once.
    records, dead = whole.records[LINE].to_pylist(), list(whole.dead_lines)
    not_blank = {n for n, line in enumerate(fuzz_lines, start=1) if line.strip(b" \t\r")}
    assert len(records) == len(set(records)) and len(dead) == len(set(dead)) and not set(records) & set(dead)
    assert set(records) | set(dead) == not_blank and records == sorted(records) and dead == sorted(dead)
    # A plain-Python reference of the rule agrees.
    expected = {n: r for n, line in enumerate(fuzz_lines, start=1) if (r := _reference(line)) is not None}
    assert _as_reference(whole) == expected
    assert {"not_json", "not_an_object", "invalid_utf8", "wrong_type", "missing_field", "null_key", "empty_key"} <= set(
        v for v in expected.values() if isinstance(v, str)
    )
    assert sum(isinstance(v, dict) for v in expected.values()) > len(fuzz_lines) // 4


def test_a_file_cut_into_chunks_anywhere_between_lines_gives_the_same(fuzz_lines: list[bytes]) -> None:
    rng = random.Random(7)
    data = b"\n".join(fuzz_lines)
    whole = parse_lines(data, FUZZ_SCHEMA, FUZZ_KEYS)
    cuts = sorted(rng.sample(range(1, len(fuzz_lines)), 12))
    records: list[dict[str, Any]] = []
    dead: list[tuple[int, str, str]] = []
    first = 1
    for a, b in zip([0, *cuts], [*cuts, len(fuzz_lines)]):
        chunk = b"".join(line + b"\n" for line in fuzz_lines[a:b]) if b < len(fuzz_lines) else b"\n".join(fuzz_lines[a:b])
        part = parse_lines(chunk, FUZZ_SCHEMA, FUZZ_KEYS, first_line=first, file_start=a == 0)
        assert part.lines == b - a
        first += part.lines
        got_records, got_dead = _everything(part)
        records += got_records
        dead += got_dead
    assert (records, dead) == _everything(whole)


def test_a_few_bad_lines_among_many_good_ones() -> None:
    """The block path finds each bad line among good ones (where Arrow stops, the value it names, halves) and keeps the rest."""
    rng = random.Random(11)
    good = [
        '{"k": "k%d", "i": %d, "d": %s, "s": "t%d", "b": %s}' % (n, n, n / 4, n, "true" if n % 2 else "false")
        for n in range(3000)
    ]
    bad = {
        17: '{"k": "a", "i": 1.5}',
        18: '{"k": "a", "i": 2, "d": "x"}',
        500: '{"k": "a", "i": 2, "d": 1e400}',
        501: '{"k": "a", "i": 2, "s": 12.50}',  # a record, read the slow way
        1200: '{"k": "a", "i": 2, "x": NaN}',
        1201: '{"k": "a", "i": 2, "x": "NaN"}',  # a record
        2000: '{"k": "a", "i": 2} {"k": "b", "i": 3}',
        2999: '{"k": "", "i": 2}',
    }
    lines = list(good)
    for n, text in bad.items():
        lines[n] = text
    for n in rng.sample(range(2100, 2900), 40):
        lines[n] = '{"k": "a", "i": %d, "b": 1}' % n
    result = parse_lines("\n".join(lines).encode(), FUZZ_SCHEMA, FUZZ_KEYS)
    expected = {n + 1: _reference(text.encode()) for n, text in enumerate(lines)}
    assert _as_reference(result) == expected
    assert expected[502] == {"k": "a", "i": 2, "s": "12.50"} and expected[1202] == {"k": "a", "i": 2}
