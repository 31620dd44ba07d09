r"""One JSON Lines file parsed in this Python process exactly as ``FileSource``'s Spark path parses it, or declined.

``FileSource._read_jsonl`` (with ``schema=``) splits a file into lines
(``FileSource._lines``), parses each with ``from_json`` (PERMISSIVE, Spark's
default JSON options, Jackson) and names what is not a record with
``_json_line_problem``. :func:`parse_jsonl_lines` gives the same records and
dead letters for a small file without a Spark job, or raises
:class:`LocalParseDeclined` when it cannot be sure of some line's outcome
(the epoch then runs on Spark). Every rule below was checked against Spark
4.2's output (``tests/integration/test_local_jsonl.py`` keeps checking it).
They are those of a file Spark reads itself (a local file up to 256 MiB,
read whole): files on an object store, or larger, are split into lines by
Python tasks (``file_source._raw_task``), whose blank-line and invalid
UTF-8 rules differ; they are not for this parser.

1. Lines: the file is split on ``\n``; a final ``\n`` ends the last line and
   starts none. Lines are numbered from 1, blank ones counted; one trailing
   ``\r`` is removed. A line made only of Unicode ``White_Space`` (Java's
   ``(?U)\s``: also ``\x0b``, ``\x0c``, ``\x85``, NBSP, ``\u3000``...; not
   ``\x1c``-``\x1f``) is blank: neither a record nor a dead letter.
2. Invalid UTF-8: if the file's bytes are not valid UTF-8, its lines are
   decoded with U+FFFD replacements (Python's equal the JVM's but for
   encoded surrogates, ``ED A0``-``ED BF``: declined), and every line
   holding a U+FFFD (even a validly encoded one) is an ``invalid_utf8``
   dead letter, whatever else it holds.
3. The first character after Java's ``\s`` (space, ``\t``, ``\x0b``,
   ``\x0c``, ``\r``) decides a line that is not an object: ``[`` is "a JSON
   array" and ``"`` "a JSON string", whatever follows.
4. Other lines not starting with ``{``: a number followed by the end, a
   space, ``\t`` or ``\r`` is "a JSON number, boolean or null", followed by
   anything else it is ``not_json`` (Jackson wants white space after a
   number at the root); ``true``, ``false`` or ``null`` followed by the
   end, white space, ``,``, ``]`` or ``}`` is a scalar too, and followed by
   a letter, digit, ``_`` or ``$`` it is ``not_json``; a line Python's JSON
   parser refuses is ``not_json``.
5. A ``{`` line (after spaces, tabs, carriage returns): its first JSON value
   is parsed; what follows it is ignored, as Jackson does. A line Python's
   (strict) parser refuses is ``not_json``. A control character inside a
   string is refused by ``from_json`` but accepted by ``json_object_keys``:
   such a line, if it parses with control characters allowed, is
   ``wrong_type`` "does not match the schema ..." (``not_json`` when it
   also holds a ``NaN``/``Infinity`` token).
6. Field values (a field absent or ``null`` is null; names match exactly):

   - string: a string; a number, boolean, object or array is its JSON text as
     Jackson writes it (compact, integers as plain digits, ``-0`` as ``0``,
     ``NaN``/``Infinity`` quoted, control characters escaped, ``\u`` with
     upper-case hex);
   - int64: an integer token in range; anything else is wrong;
   - double: a number token (integers rounded to nearest); the strings
     ``NaN``, ``Infinity``, ``+Infinity``, ``-Infinity``, ``+INF``, ``-INF``
     (not ``INF``); the tokens ``NaN``, ``Infinity``, ``-Infinity``;
     anything else is wrong;
   - bool: ``true`` or ``false``; anything else is wrong;
   - timestamp (us, UTC): a string ``YYYY-MM-DDTHH:MM:SS[.f{1,9}]`` with
     ``Z`` or ``±HH:MM`` (the fraction truncated to microseconds; year 0000
     proleptic); one of that form with a field out of range (month 13,
     Feb 30, hour 24, second 60, an offset beyond ±18:00...) is wrong, as
     is a string without an ASCII digit (``"yesterday at noon"``, ``""``);
     an integer token is seconds since the epoch; anything else is wrong.

7. A line with wrong fields is ``wrong_type``: ``"<field>: <text> is not
   <type>"`` for each, in schema order, joined by ``"; "``, where the text is
   the value's string, or its JSON text as in 6, cut to 100 characters. If
   the object holds a ``NaN``/``Infinity`` token the line is ``not_json``
   instead (``json_object_keys`` refuses those tokens).
8. Then the record checks (``record_checks``): required fields in schema
   order (``missing_field``), then keys sorted by name, null (``null_key``)
   then, for a string key, empty (``empty_key``). A line passing them is a
   record. A dead letter keeps its line (after rule 1's ``\r``) as ``_raw``.

Declines (:class:`LocalParseDeclined`) whatever these rules do not settle:

- a field type other than string, int64, double, bool or timestamp[us,
  tz=UTC], or a field named as one of the Spark path's own columns;
- a duplicate name in any object (Spark keeps the last value, or calls the
  line wrong);
- what Jackson may read where Python's parser does not: a line starting
  with ``'``, ``+``, ``I``, ``N``, ``-I`` or ``-N``, or refused at one of
  those or at a ``\'`` escape (single quotes, ``+INF``, ``-INF``...); a
  literal followed by another character than in rule 4;
  ``\x0b``/``\x0c`` before a line's first character;
- a surrogate ``\u`` escape (a lone one becomes ``?`` in the JVM); a line
  longer than :data:`_MAX_LINE_CHARS` characters, a run of
  :data:`_MAX_NUMBER_DIGITS` digits, more than :data:`_MAX_NESTING`
  brackets (Jackson's limits: 1,000 digits, nesting, name lengths);
- a timestamp string with a digit but not of rule 6's form (e.g. without
  an offset: Spark reads it in the session time zone); an integer
  timestamp beyond ±10^11 s;
- a finite decimal number whose text Spark would show (in a string field
  of a record, or in a wrong-type detail): the JVM prints doubles its own
  way, which also changed between JDKs; an integer too large for a double.

Good lines take a column-wise path: each line is parsed by Python's C JSON
scanner, then each field is converted for all lines at once (Arrow, numpy;
timestamps read from the string buffer); only values of an unexpected type
are looked at one by one.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.connectors.dead_letters import DeadLetterReason, key_problems, problem

__all__ = ["LocalParseDeclined", "parse_jsonl_lines"]


class LocalParseDeclined(Exception):
    """The lines cannot be parsed here exactly as Spark's path would; the message says why (the epoch then runs on Spark)."""


_TIMESTAMP = pa.timestamp("us", tz="UTC")
_SUPPORTED = (pa.string(), pa.int64(), pa.float64(), pa.bool_(), _TIMESTAMP)

# Jackson refuses names over 50,000 characters and numbers over 1,000 digits
# (both verified); the bounds here stay well inside, and Python's recursion
# limit (about 1,000 levels) must not decide a line either.
_MAX_LINE_CHARS = 32_768
_MAX_NUMBER_DIGITS = 500
_MAX_NESTING = 500
_LONG_DIGITS = re.compile(r"[0-9]{%d}" % _MAX_NUMBER_DIGITS)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB]")
_ENCODED_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")
_ASCII_DIGIT = re.compile(r"[0-9]")

# Java's (?U)\s, the Unicode White_Space property: what the blank-line regex matches.
_BLANK_CHARS = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(chr(c) for c in range(0x2000, 0x200B)) + "\u2028\u2029\u202f\u205f\u3000"
_BLANK_SET = frozenset(_BLANK_CHARS)
# Java's default \s: what ``_json_line_problem`` skips to find a line's first character.
_JAVA_SPACE = " \t\n\x0b\x0c\r"
# What Jackson skips between tokens (``\n`` never occurs inside a line).
_JSON_SPACE = " \t\r"
# A literal (true, false, null) followed by one of these is one token too many for Jackson.
_IDENTIFIER_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_$")

_NOT_JSON = problem(DeadLetterReason.NOT_JSON, "not valid JSON")
_ARRAY = problem(DeadLetterReason.NOT_AN_OBJECT, "a JSON array, not an object")
_STRING = problem(DeadLetterReason.NOT_AN_OBJECT, "a JSON string, not an object")
_SCALAR = problem(DeadLetterReason.NOT_AN_OBJECT, "a JSON number, boolean or null, not an object")
# The text ``FileSource._lines`` gives every line of an invalid file that holds U+FFFD.
_INVALID_UTF8 = problem(DeadLetterReason.INVALID_UTF8, "not valid UTF-8 (shown with U+FFFD replacements)")

# Strings Spark's double conversion takes (Jackson's non-numeric numbers are on by default).
_DOUBLE_WORDS = {"NaN": math.nan, "Infinity": math.inf, "+Infinity": math.inf, "+INF": math.inf, "-Infinity": -math.inf, "-INF": -math.inf}
# An integer timestamp is seconds; within this bound the microseconds are far from overflowing.
_MAX_EPOCH_SECONDS = 10**11

_TIMESTAMP_FORM = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?(?:Z|[+-][0-9]{2}:[0-9]{2})$"
_DAYS_IN_MONTH = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)

_NONE = type(None)
# Columns of FileSource._read_jsonl's parsed lines besides the fields (and the records' _seq).
_PATH_COLUMNS = frozenset(["_fidx", "_line", "_raw", "_error", "_value", "_seq"])


class _Duplicate(Exception):
    """A JSON object names a field twice (Spark keeps the last, or calls the line wrong: never guessed)."""


class _Wrong:
    """A value that does not convert to its field's type; ``text`` is how the detail shows it (None: cannot be known here)."""

    __slots__ = ("text",)

    def __init__(self, text: str | None) -> None:
        self.text = text


_UNPRINTABLE = object()  # a string field's value whose JSON text this module cannot print as the JVM does


def parse_jsonl_lines(data: bytes, schema: pa.Schema, keys: Mapping[str, str]) -> tuple[pa.Table, pa.Table]:
    """One whole file's bytes parsed as FileSource._read_jsonl(schema=...) parses them.

    ``keys``: column -> operator id, the keys checked at the source (as ``FileSource.read``'s ``keys`` after its filtering to schema fields).
    Returns (records, dead):
    - records: ``_line`` (int64, from 1) then the schema's fields with the schema's types, one row per line that is a record, in line order;
    - dead: ``_line`` (int64), ``_raw`` (string, the line as the Spark path keeps it), ``_error`` (string, the exact problem string), one row per dead line, in line order.
    Raises LocalParseDeclined when any line's outcome cannot be guaranteed to equal Spark's.
    """
    _check_schema(schema, keys)
    decoder = _Decoder()
    scan = decoder.scan
    dead: list[tuple[int, str, str]] = []
    objects: list[dict[str, Any]] = []
    object_lines: list[int] = []
    object_raws: list[str] = []
    with_constants: list[int] = []  # indexes into objects of those holding NaN or Infinity tokens
    for number, line, error in _numbered_lines(data):
        if error is not None:
            dead.append((number, line, error))
            continue
        first = line[0]
        if first in _BLANK_SET and not line.strip(_BLANK_CHARS):
            continue  # rule 1
        start = 0 if first == "{" else _first_position(line)
        if line[start] in '["':
            dead.append((number, line, _ARRAY if line[start] == "[" else _STRING))  # rule 3
            continue
        if "\x0b" in line[:start] or "\x0c" in line[:start]:
            # Java's \s skips them to find the first character; Jackson does not.
            raise LocalParseDeclined(f"line {number}: \\x0b or \\x0c before its first character")
        if len(line) >= _MAX_NUMBER_DIGITS or "\\u" in line:
            _check_limits(number, line)
        if line[start] != "{":
            dead.append((number, line, _not_an_object(line, start, decoder)))
            continue
        constants = decoder.constants
        try:
            value, _ = scan(line, start)
        except json.JSONDecodeError as exc:
            dead.append((number, line, _refused_object(line, start, exc, decoder, schema)))
            continue
        except StopIteration as stop:  # a value expected at ``stop.value`` (raw_decode's "Expecting value")
            expected = json.JSONDecodeError("Expecting value", line, stop.value)
            dead.append((number, line, _refused_object(line, start, expected, decoder, schema)))
            continue
        except (_Duplicate, RecursionError) as exc:
            raise _declined(number, exc) from None
        if decoder.constants != constants:
            with_constants.append(len(objects))
        objects.append(value)
        object_lines.append(number)
        object_raws.append(line)
    records, more_dead = _objects(objects, object_lines, object_raws, with_constants, schema, keys)
    dead.extend(more_dead)
    dead.sort(key=lambda row: row[0])
    dead_table = pa.table(
        {
            "_line": pa.array([row[0] for row in dead], pa.int64()),
            "_raw": pa.array([row[1] for row in dead], pa.string()),
            "_error": pa.array([row[2] for row in dead], pa.string()),
        }
    )
    return records, dead_table


def _declined(number: int, reason: Any) -> LocalParseDeclined:
    text = {_Duplicate: "a name given twice in one object", RecursionError: "nested too deeply"}.get(type(reason), str(reason))
    return LocalParseDeclined(f"line {number}: {text}")


def _check_schema(schema: pa.Schema, keys: Mapping[str, str]) -> None:
    if not len(schema):
        raise LocalParseDeclined("a schema without fields")
    if len(set(schema.names)) != len(schema.names):
        raise LocalParseDeclined("a schema naming a field twice")
    for f in schema:
        if f.type not in _SUPPORTED:
            raise LocalParseDeclined(f"field {f.name}: type {f.type} is not parsed here")
        if f.name in _PATH_COLUMNS:
            raise LocalParseDeclined(f"field {f.name}: a name the Spark path uses for its own columns")
    for name in keys:
        if name not in schema.names:
            raise LocalParseDeclined(f"key {name} is not a field of the schema")


class _Decoder:
    """Python's C JSON scanner, refusing duplicate names and counting NaN/Infinity tokens."""

    def __init__(self) -> None:
        self.constants = 0

        def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
            obj = dict(items)
            if len(obj) != len(items):
                raise _Duplicate()
            return obj

        def constant(name: str) -> float:
            self.constants += 1
            return float(name)

        self.scan = _scanner(json.JSONDecoder(object_pairs_hook=pairs, parse_constant=constant))
        # As json_object_keys: control characters allowed inside strings.
        self.scan_lax = _scanner(json.JSONDecoder(object_pairs_hook=pairs, parse_constant=constant, strict=False))

    def strict(self, line: str, start: int) -> tuple[Any, int]:
        return _scanned(self.scan, line, start)

    def lax(self, line: str, start: int) -> tuple[Any, int]:
        return _scanned(self.scan_lax, line, start)


def _scanner(decoder: json.JSONDecoder) -> Callable[[str, int], tuple[Any, int]]:
    """The decoder's C scanner, (value, end) of the value at an index: ``raw_decode`` only wraps it."""
    scan: Callable[[str, int], tuple[Any, int]] = decoder.scan_once  # type: ignore[attr-defined]
    return scan


def _scanned(scan: Callable[[str, int], tuple[Any, int]], line: str, start: int) -> tuple[Any, int]:
    try:
        return scan(line, start)
    except StopIteration as stop:  # a value expected at ``stop.value``, as raw_decode reports it
        raise json.JSONDecodeError("Expecting value", line, stop.value) from None


def _numbered_lines(data: bytes) -> Iterator[tuple[int, str, str | None]]:
    """(line number, line without its trailing ``\\r``, its invalid_utf8 problem or None), every line (rule 1, 2)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        yield from _invalid_file_lines(data)
        return
    if text.endswith("\n"):
        text = text[:-1]
    # Every "\r\n" ends a line, and only the last line can end with "\r" otherwise.
    lines = text.replace("\r\n", "\n").split("\n")
    if lines[-1].endswith("\r"):
        lines[-1] = lines[-1][:-1]
    for number, line in enumerate(lines, 1):
        if line:
            yield number, line, None


def _invalid_file_lines(data: bytes) -> Iterator[tuple[int, str, str | None]]:
    body = data[:-1] if data.endswith(b"\n") else data
    for number, raw in enumerate(body.split(b"\n"), 1):
        line = raw.decode("utf-8", errors="replace")
        error = None
        if "\ufffd" in line:
            if _ENCODED_SURROGATE.search(raw):
                raise LocalParseDeclined(f"line {number}: an encoded surrogate (the JVM replaces it differently)")
            error = _INVALID_UTF8
        if line.endswith("\r"):
            line = line[:-1]
        if line:
            yield number, line, error


def _check_limits(number: int, line: str) -> None:
    """Declines a line that Jackson's limits or the JVM's strings could treat otherwise than Python."""
    if len(line) > _MAX_LINE_CHARS:
        raise LocalParseDeclined(f"line {number}: {len(line)} characters")
    if len(line) >= _MAX_NUMBER_DIGITS and _LONG_DIGITS.search(line):
        raise LocalParseDeclined(f"line {number}: a run of {_MAX_NUMBER_DIGITS} digits or more")
    if len(line) > _MAX_NESTING and line.count("{") + line.count("[") > _MAX_NESTING:
        raise LocalParseDeclined(f"line {number}: more than {_MAX_NESTING} brackets")
    if "\\u" in line and _SURROGATE_ESCAPE.search(line):
        raise LocalParseDeclined(f"line {number}: a surrogate \\u escape (a lone one becomes '?' in the JVM)")


def _first_position(line: str) -> int:
    """Where Java's ``^\\s*(\\S)`` finds the first character of a line that is not blank."""
    for i, ch in enumerate(line):
        if ch not in _JAVA_SPACE:
            return i
    raise AssertionError("a line of Java's \\s only is blank")


def _not_an_object(line: str, start: int, decoder: _Decoder) -> str:
    """Rule 4: the problem of a line whose first character is not ``{``, ``[`` or ``"``."""
    if line.startswith(("'", "+", "I", "N", "-I", "-N"), start):
        # Single quotes and NaN-like tokens: Jackson may read them where Python does not.
        raise LocalParseDeclined(f"a line starting {line[start : start + 2]!r}")
    try:
        value, end = decoder.strict(line, start)
    except json.JSONDecodeError:
        return _NOT_JSON
    after = line[end : end + 1]
    if type(value) in (int, float):
        return _SCALAR if not after or after in _JSON_SPACE else _NOT_JSON
    if not after or after in " \t\r,]}":
        return _SCALAR
    if after in _IDENTIFIER_CHARS:
        return _NOT_JSON
    raise LocalParseDeclined(f"a line {line[:20]!r}")


def _refused_object(line: str, start: int, exc: json.JSONDecodeError, decoder: _Decoder, schema: pa.Schema) -> str:
    """Rule 5: the problem of a ``{`` line the strict parser refuses."""
    if exc.msg.startswith("Invalid control character"):
        constants = decoder.constants
        try:
            decoder.lax(line, start)
        except json.JSONDecodeError as again:
            return _refused_at(line, again)
        except _Duplicate:
            raise LocalParseDeclined("a name given twice in one object") from None
        if decoder.constants != constants:
            return _NOT_JSON
        return problem(DeadLetterReason.WRONG_TYPE, f"does not match the schema {_schema_text(schema)}")
    return _refused_at(line, exc)


def _refused_at(line: str, exc: json.JSONDecodeError) -> str:
    at = exc.pos
    if line.startswith(("'", "+", "I", "N", "-I", "-N", "\\'"), at):
        raise LocalParseDeclined(f"JSON that Jackson may read: {line[at : at + 10]!r}")
    return _NOT_JSON


def _schema_text(schema: pa.Schema) -> str:
    # As file_source._schema_text (the differential test compares the whole problem string).
    return ", ".join(f"{f.name} {f.type}{'' if f.nullable else ' not null'}" for f in schema)


def _objects(
    objects: list[dict[str, Any]],
    lines: list[int],
    raws: list[str],
    with_constants: list[int],
    schema: pa.Schema,
    keys: Mapping[str, str],
) -> tuple[pa.Table, list[tuple[int, str, str]]]:
    """Rules 6-8 for the parsed objects: the records, and the other objects' dead letters."""
    n = len(objects)
    columns: list[pa.Array] = []
    wrong: dict[int, list[tuple[str, _Wrong]]] = {}
    unprintable: set[int] = set()
    for f in schema:
        column = [obj.get(f.name) for obj in objects]
        array, odd = _convert(column, f.type)
        columns.append(array)
        for row, outcome in odd.items():
            if outcome is _UNPRINTABLE:
                unprintable.add(row)
            else:
                wrong.setdefault(row, []).append((f.name, outcome))
    problems: list[str] = [""]
    codes = np.zeros(n, dtype=np.int64)  # 0: a record; else problems[code]
    constants = set(with_constants)
    for row in sorted(wrong):
        found = wrong[row]
        if row in constants:
            text = _NOT_JSON
        elif any(w.text is None for _, w in found):
            raise LocalParseDeclined(f"line {lines[row]}: a wrong value whose text the JVM prints its own way")
        else:
            text = "wrong_type: " + "; ".join(f"{name}: {(w.text or '')[:100]} is not {schema.field(name).type}" for name, w in found)
        problems.append(text)
        codes[row] = len(problems) - 1
    for mask, text in _checks(columns, schema, keys):
        chosen = (codes == 0) & mask
        if chosen.any():
            problems.append(text)
            codes[chosen] = len(problems) - 1
    records = codes == 0
    for row in unprintable:
        if records[row]:
            raise LocalParseDeclined(f"line {lines[row]}: a decimal number in a string field (the JVM prints it its own way)")
    keep = pa.array(records, pa.bool_())
    table = pa.Table.from_arrays(
        [pa.array(lines, pa.int64()), *columns], schema=pa.schema([pa.field("_line", pa.int64()), *schema])
    ).filter(keep)
    dead = [(lines[row], raws[row], problems[codes[row]]) for row in np.flatnonzero(~records).tolist()]
    return table, dead


def _checks(columns: list[pa.Array], schema: pa.Schema, keys: Mapping[str, str]) -> list[tuple[np.ndarray, str]]:
    """``record_checks``' masks in their order: required fields, then keys by name (null, then empty for text)."""
    by_name = dict(zip(schema.names, columns))

    def is_null(name: str) -> np.ndarray:
        return np.asarray(by_name[name].is_null().to_numpy(zero_copy_only=False), dtype=bool)

    checks = [
        (is_null(f.name), problem(DeadLetterReason.MISSING_FIELD, f"required field {f.name} is missing or null"))
        for f in schema
        if not f.nullable
    ]
    for name, operator_id in sorted(keys.items()):
        is_string = pa.types.is_string(schema.field(name).type)
        for check, text in key_problems(name, operator_id, is_string):
            if check == "null":
                checks.append((is_null(name), text))
            else:
                empty = pc.fill_null(pc.equal(by_name[name], ""), False)
                checks.append((np.asarray(empty.to_numpy(zero_copy_only=False), dtype=bool), text))
    return checks


def _convert(column: list[Any], arrow_type: pa.DataType) -> tuple[pa.Array, dict[int, Any]]:
    """A field's values for every object (rule 6); rows whose value is wrong (a :class:`_Wrong`) or unprintable."""
    kinds = set(map(type, column))
    if pa.types.is_string(arrow_type):
        if kinds <= {str, _NONE}:
            return pa.array(column, pa.string()), {}
        return _per_value(column, arrow_type, _string_value)
    if pa.types.is_int64(arrow_type):
        if kinds <= {int, _NONE}:
            try:
                return pa.array(column, pa.int64()), {}
            except (OverflowError, pa.ArrowInvalid):
                pass
        return _per_value(column, arrow_type, _long_value)
    if pa.types.is_floating(arrow_type):
        if kinds <= {float, _NONE}:
            return pa.array(column, pa.float64()), {}
        return _per_value(column, arrow_type, _double_value)
    if pa.types.is_boolean(arrow_type):
        if kinds <= {bool, _NONE}:
            return pa.array(column, pa.bool_()), {}
        return _per_value(column, arrow_type, _bool_value)
    return _timestamps(column)


def _per_value(column: list[Any], arrow_type: pa.DataType, convert: Callable[[Any], Any]) -> tuple[pa.Array, dict[int, Any]]:
    values: list[Any] = []
    odd: dict[int, Any] = {}
    for row, value in enumerate(column):
        converted = convert(value) if value is not None else None
        if converted is _UNPRINTABLE:
            # Spark has some non-empty text there: the null and empty checks must pass as they do there.
            odd[row], converted = converted, "\x00unprintable"
        elif isinstance(converted, _Wrong):
            odd[row], converted = converted, None  # from_json leaves a wrong field null
        values.append(converted)
    return pa.array(values, arrow_type), odd


def _string_value(value: Any) -> Any:
    if type(value) is str:
        return value
    text = _json_text(value)
    return _UNPRINTABLE if text is None else text


def _long_value(value: Any) -> Any:
    if type(value) is int and -(2**63) <= value < 2**63:
        return value
    return _Wrong(_shown(value))


def _double_value(value: Any) -> Any:
    kind = type(value)
    if kind is float:
        return value
    if kind is int:
        try:
            return float(value)  # correctly rounded, as the JVM's long and BigInteger conversions
        except OverflowError:
            raise LocalParseDeclined("an integer too large for a double") from None
    if kind is str and value in _DOUBLE_WORDS:
        return _DOUBLE_WORDS[value]
    return _Wrong(_shown(value))


def _bool_value(value: Any) -> Any:
    return value if type(value) is bool else _Wrong(_shown(value))


def _shown(value: Any) -> str | None:
    """How a wrong value reads in its detail: a string as is, anything else as Jackson writes it."""
    return value if type(value) is str else _json_text(value)


def _json_text(value: Any) -> str | None:
    """``value`` as Jackson's generator writes it (Spark's string view of a JSON value); None if not known."""
    kind = type(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return str(value)
    if kind is float:
        # Non-finite values are written quoted; finite ones by Double.toString, not reproduced here.
        if math.isnan(value):
            return '"NaN"'
        if math.isinf(value):
            return '"Infinity"' if value > 0 else '"-Infinity"'
        return None
    if kind is str:
        return _quoted(value)
    if kind is list:
        items = [_json_text(item) for item in value]
        return None if None in items else "[" + ",".join(items) + "]"  # type: ignore[arg-type]
    if kind is dict:
        members = []
        for name, item in value.items():
            text = _json_text(item)
            if text is None:
                return None
            members.append(_quoted(name) + ":" + text)
        return "{" + ",".join(members) + "}"
    return None


_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')


def _quoted(text: str) -> str:
    def escape(match: re.Match[str]) -> str:
        ch = match.group()
        return _SHORT_ESCAPES.get(ch) or f"\\u{ord(ch):04X}"

    return '"' + _NEEDS_ESCAPE.sub(escape, text) + '"'


def _timestamps(column: list[Any]) -> tuple[pa.Array, dict[int, Any]]:
    """Rule 6's timestamps: strings of the strict form vectorised, anything else one by one."""
    odd: dict[int, Any] = {}
    texts: list[str | None] = []
    seconds: dict[int, int] = {}
    for row, value in enumerate(column):
        if type(value) is str or value is None:
            texts.append(value)
            continue
        texts.append(None)
        if type(value) is int:
            if abs(value) > _MAX_EPOCH_SECONDS:
                raise LocalParseDeclined("an integer timestamp beyond the range checked against Spark")
            seconds[row] = value
        else:
            odd[row] = _Wrong(_shown(value))
    strings = pa.array(texts, pa.string())
    micros, valid, matched = _parse_timestamps(strings)
    for row, value in seconds.items():
        micros[row], valid[row] = value * 1_000_000, True
    present = np.asarray(strings.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    for row in np.flatnonzero(present & ~valid).tolist():
        text = texts[row]
        assert text is not None
        if matched[row] or not _ASCII_DIGIT.search(text):
            odd[row] = _Wrong(text)  # the strict form with a field out of range, or no digit at all
        else:
            raise LocalParseDeclined(f"a timestamp {text[:40]!r} of a form not checked against Spark")
    return pa.array(micros, pa.int64(), mask=~valid).cast(_TIMESTAMP), odd


def _parse_timestamps(strings: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Microseconds of each ``YYYY-MM-DDTHH:MM:SS[.f]Z|±HH:MM`` string; whether it is valid; whether it has that form.

    Strings of that form are ASCII with their digits at fixed places (the
    fraction's and the offset's counted from either end): they are read
    straight from the Arrow buffer.
    """
    n = len(strings)
    matched = np.asarray(
        pc.fill_null(pc.match_substring_regex(strings, _TIMESTAMP_FORM), False).to_numpy(zero_copy_only=False), dtype=bool
    )
    if not matched.any():
        return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool), matched
    offsets = np.frombuffer(strings.buffers()[1], dtype=np.int32)[strings.offset : strings.offset + n + 1].astype(np.int64)
    text = np.frombuffer(strings.buffers()[2], dtype=np.uint8)
    begin = np.where(matched, offsets[:-1], 0)
    end = np.where(matched, offsets[1:], 20)  # unmatched rows read harmless bytes: a matched string has more than 20

    def digits(at: np.ndarray, count: int) -> np.ndarray:
        value = np.zeros(n, dtype=np.int64)
        for i in range(count):
            value = value * 10 + (text[at + i].astype(np.int64) - 48)
        return value

    year, month, day = digits(begin, 4), digits(begin + 5, 2), digits(begin + 8, 2)
    hour, minute, second = digits(begin + 11, 2), digits(begin + 14, 2), digits(begin + 17, 2)
    utc = text[end - 1] == ord("Z")
    zone_start = np.where(utc, end - 1, end - 6)
    fraction_digits = np.maximum(zone_start - (begin + 20), 0)  # after "YYYY-MM-DDTHH:MM:SS."; 0 without a fraction
    fraction = np.zeros(n, dtype=np.int64)
    for i in range(6):  # microseconds: digits past the sixth are dropped, as Spark does
        digit = text[np.minimum(begin + 20 + i, end - 1)].astype(np.int64) - 48
        fraction = fraction * 10 + np.where(i < fraction_digits, digit, 0)
    zone_hours = np.where(utc, 0, digits(end - 5, 2))
    zone_minutes = np.where(utc, 0, digits(end - 2, 2))
    sign = np.where(text[zone_start] == ord("-"), -1, 1)
    leap = ((year % 4 == 0) & (year % 100 != 0)) | (year % 400 == 0)
    month_days = _DAYS_IN_MONTH[np.clip(month, 1, 12) - 1] + ((month == 2) & leap)
    valid = (
        matched
        & (month >= 1) & (month <= 12) & (day >= 1) & (day <= month_days)
        & (hour <= 23) & (minute <= 59) & (second <= 59)
        & (zone_minutes <= 59) & (zone_hours * 60 + zone_minutes <= 18 * 60)
    )  # fmt: skip
    offset_seconds = sign * (zone_hours * 3_600 + zone_minutes * 60)
    days = _days_from_civil(year, np.clip(month, 1, 12), day)
    micros = ((days * 86_400 + hour * 3_600 + minute * 60 + second - offset_seconds) * 1_000_000 + fraction) * valid
    return micros, valid, matched


def _days_from_civil(year: np.ndarray, month: np.ndarray, day: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 of proleptic Gregorian dates (as java.time; year 0 included)."""
    y = year - (month <= 2)
    era = np.floor_divide(y, 400)
    year_of_era = y - era * 400
    day_of_year = (153 * ((month + 9) % 12) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146_097 + day_of_era - 719_468
