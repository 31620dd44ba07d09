r"""What makes a JSON Lines line a record or a dead letter: barrierflow's one rule, implemented once.

A ``FileSource`` with a ``schema`` reads each JSON Lines file through
:func:`parse_lines`, a chunk of whole lines at a time. Every line that is
not blank is exactly one record or one dead letter (``core/dead_letters``:
a reason code and a detail); the records keep their lines' order.

Lines
  L1. Lines end at LF (``\n``). One CR (``\r``) ending a line, before its LF
      or at the end of the data, belongs to the terminator (CRLF files); the
      last line may lack its LF. A UTF-8 byte-order mark at the file's very
      first byte is ignored (anywhere else it is text: the line is
      ``not_json``). Lines are numbered from ``first_line``, blank ones
      counted.
  L2. A blank line (empty, or only white space: spaces, tabs, CRs and any
      other Unicode white space, as Python's ``str.isspace``) is skipped:
      neither a record nor a dead letter (it keeps its number).

Every other line is one record or one dead letter; the first failing check
decides:

  1. ``invalid_utf8``: its bytes are not UTF-8 (Python's strict decoder:
     overlong forms and encoded surrogates are invalid too). Detail
     ``not valid UTF-8: <reason> at byte <n>``; the raw text keeps U+FFFD
     replacements.
  2. ``not_json``: the line is not exactly one JSON value (RFC 8259: no
     ``NaN``/``Infinity``, no comments, no trailing commas, no single
     quotes, no raw control characters inside strings, no lone surrogate
     ``\u`` escapes, nothing but white space after the value), or an object
     names a field the schema reads twice (at the top level, or inside a
     struct field, or a list of structs; names the schema does not read may
     repeat), or it nests arrays and objects more than 500 levels deep (RFC
     8259 lets a parser set a limit). A line holding ``{`` alone (an object
     spread over several lines) is ``not_json``, and so is each other line
     of it. Detail ``not valid JSON: <what and where>``.
  3. ``not_an_object``: a JSON value that is not an object: ``a JSON array,
     not an object``, ``a JSON string, not an object``, ``a JSON number,
     boolean or null, not an object``.
  4. ``wrong_type``: a field of the schema present with a non-null value that
     does not convert to the field's type; never coerced to null. Detail
     ``<field>: <value> is not <type>`` for each such field in schema order,
     joined by ``"; "``; the value is a JSON string's text unquoted, else
     the value's compact JSON text (numbers as written), cut to 100
     characters; the type as Arrow prints it. Conversions (Arrow's JSON
     reader is the only converter of values):

     - string: a JSON string, or a JSON number or boolean as its JSON text
       exactly as written (``1.50``, ``true``); not an array or object;
     - integer types: an integer literal in the type's range (no fraction,
       no exponent: ``1.0`` and ``1e2`` are wrong);
     - float types: any JSON number within the type's range (``1e400`` is
       wrong for a double, as is a number beyond float32 for a float);
     - bool: ``true`` or ``false``;
     - timestamp: a string Arrow's ISO-8601 parser accepts (``Z``, ``+02:00``,
       ``+0200``, a space for the ``T``, a date alone...); without an offset
       it is UTC; more fraction digits than the unit holds is wrong;
     - date: a string ``YYYY-MM-DD`` (an existing day);
     - decimal, list, struct and the other types: what Arrow's JSON reader
       accepts for them (the string rule above applies inside them too).

     Fields the schema does not name are ignored, whatever their values.
  5. ``missing_field``: a non-nullable field of the schema absent or null:
     ``required field <f> is missing or null`` (the first in schema order).
  6. ``null_key`` / ``empty_key``: for each key column (a column a keyed
     operator takes straight from the source's records), in name order: null
     or absent, then, for a string key, empty (``core/dead_letters.key_problem``).

Otherwise the line is a record: the schema's fields (every one nullable) and
``_line``, its line number.

How (speed: Python runs per line only for the lines that are not plain records).
Lines are found with numpy over the bytes. The lines that start with ``{``
and end with ``}`` are read by Arrow's JSON reader in pieces of up to 65,536
lines (the other lines blanked: Arrow skips blank lines). A piece's read
counts only if it gives one row per such line (Arrow reads two objects on a
line as two rows; an object spread over lines always has a line that is not
``{...}``); then its i-th row is its i-th line. Rows holding a NaN or
infinite float, or a date that does not cast, are taken out. Arrow also
takes ``NaN``/``Inf`` tokens and repeated names where the schema reads
nothing: pieces are first read with unknown fields refused (every token then
lands in a checked column); once a piece shows an unknown field, the lines
where such a token may stand (found with numpy) are taken out. When Arrow
refuses a piece: the line where it stopped is taken out and the reading goes
on after it (the lines before it are read once the rest is); for a value it
could not convert, the lines likely holding such values (read again loosely:
timestamps as strings, integers as doubles) or its text are taken out; else
the piece is halved. Many refusals close together send the rest of the piece
out. The lines taken out go the slow way, all at once: Python's strict
parser settles rules 2 and 3; each field of each object is written alone on
a line (numbers and booleans of string fields as strings of their text,
numbers as written) and read by Arrow, which names the wrong fields (what it
refused once, a kind of JSON value for a field or a text for a type, is
refused wherever it stands without another read); each object without a
wrong field is written again with the schema's fields only, and read by
Arrow as a record. Checks 5 and 6 run on the records' columns
(``core/dead_letters.record_problems``).
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from barrierflow.core.dead_letters import DeadLetterReason, problem, record_problems
from barrierflow.core.errors import PipelineDefinitionError

__all__ = ["LINE", "MAX_DEPTH", "ParsedLines", "parse_lines", "record_schema"]

LINE = "_line"  # the records' line-number column
MAX_DEPTH = 500  # arrays and objects nested deeper: not_json (rule 2)

_BOM = b"\xef\xbb\xbf"
_LF, _CR, _OPEN, _CLOSE = 10, 13, ord("{"), ord("}")
_BLANK = " \t\r"
_BLANK_BYTES = np.frombuffer(b" \t\r", dtype=np.uint8)
_SEPARATOR_BYTES = np.frombuffer(b":[,", dtype=np.uint8)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"')  # a JSON string (left out when counting nesting)
# What Arrow's refusals say: the row where it stopped; the value it could not convert.
_ERROR_ROW = re.compile(r" in row (\d+)\Z")
_ERROR_KIND = re.compile(r"\AJSON parse error: Column\(/([^/]*)\) changed from \w+ to (\w+) in row \d+\Z", re.S)
_ERROR_VALUE = re.compile(
    r"\AFailed to convert JSON to (.+?), couldn't parse:(.*)\Z|\AFailed to convert JSON to (decimal[^:]*): (.*) requires (?:scale|precision) \d+\Z",
    re.S,
)
_MAX_TAKEN = 64  # lines holding a refused value's text taken the slow way at once (more: the block is halved)
_DENSE_FAILURES = 16  # more refusals in a piece, one per fewer lines than this: the rest of it goes the slow way
_PIECE_LINES = 1 << 16  # lines Arrow reads in one call at most
_PIECE_BYTES = 4 << 20  # bytes Arrow reads in one call at most (unless one line is longer)
_SHOWN = 100  # characters of a wrong value shown in its detail
_EMPTY_SCHEMA_COLUMN = "\x00barrierflow_rows"  # counts rows when the schema has no field

_ARRAY = problem(DeadLetterReason.NOT_AN_OBJECT, "a JSON array, not an object")
_STRING = problem(DeadLetterReason.NOT_AN_OBJECT, "a JSON string, not an object")
_SCALAR = problem(DeadLetterReason.NOT_AN_OBJECT, "a JSON number, boolean or null, not an object")


@dataclass(frozen=True)
class ParsedLines:
    """The records and dead letters of a chunk of whole lines (see the module's rule)."""

    records: pa.Table  # the record schema's columns, then _line (int64), in line order
    dead_lines: tuple[int, ...]  # line numbers of dead letters, ascending
    dead_raw: tuple[str, ...]  # each dead line's text (invalid UTF-8 shown with U+FFFD)
    dead_problems: tuple[str, ...]  # each one's "<reason>: <detail>"
    lines: int  # lines in the data, blank ones counted


def record_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every field nullable: what records carry (a missing required field is a dead letter, check 5)."""
    return pa.schema([f.with_nullable(True) for f in schema], metadata=schema.metadata)


def parse_lines(
    data: bytes, schema: pa.Schema, keys: Mapping[str, str], *, first_line: int = 1, file_start: bool = True
) -> ParsedLines:
    """Every non-blank line of ``data`` as a record or a dead letter, by the module's rule.

    ``data`` is a whole number of lines (the last may lack its LF), its first
    line numbered ``first_line``; ``file_start``: it begins at the file's first
    byte (a byte-order mark there is skipped). ``keys``: column -> operator id
    of the keyed operators taking that column straight from the records.
    """
    return _Parser(schema, keys).parse(bytes(data), first_line, file_start)


class _Number:
    """A JSON number as written (Python's parser hands over its text: values are converted by Arrow alone)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class _Object(dict[str, Any]):
    """A JSON object; ``repeated``: the names it gives more than once."""

    repeated: frozenset[str] = frozenset()


class _Refused(ValueError):
    """A token strict JSON does not have (NaN, Infinity)."""


def _pairs(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        repeated: set[str] = set()
        for name, _ in pairs:
            (repeated if name in seen else seen).add(name)
        obj.repeated = frozenset(repeated)
    return obj


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON value")


_DECODER = json.JSONDecoder(
    object_pairs_hook=_pairs, parse_float=_Number, parse_int=_Number, parse_constant=_constant, strict=True
)


@dataclass(frozen=True)
class _Failure:
    """Arrow refused a block: the row where it stopped, or the type and text of a value it could not convert, if it said."""

    row: int | None = None
    type: str | None = None  # with value: Arrow could not convert that text to that type
    value: str | None = None
    field: str | None = None  # with kind: a top-level field held a JSON value of a kind its type never takes
    kind: str | None = None

    @classmethod
    def of(cls, message: str) -> _Failure:
        row = _ERROR_ROW.search(message)
        if row:
            kind = _ERROR_KIND.search(message)
            return cls(row=int(row.group(1)), field=kind.group(1) if kind else None, kind=kind.group(2) if kind else None)
        value = _ERROR_VALUE.search(message)
        if value:
            type_, text = (value.group(1), value.group(2)) if value.group(1) is not None else (value.group(3), value.group(4))
            return cls(type=type_, value=text)
        return cls()


# The positions in [p, q) of lines holding what Arrow refused (a _Failure's value or kind): refused too, at once.
_Holding = Callable[[np.ndarray, int, int, _Failure], list[int]]


_UNEXPECTED = object()  # Arrow met a field the schema does not name (blocks read with unknown fields refused)


class _Lines:
    """Lines of one buffer: line i is ``buffer[starts[i]:ends[i]]``, its terminator left out."""

    def __init__(self, data: bytes, starts: np.ndarray, ends: np.ndarray) -> None:
        self.data, self.buffer, self.starts, self.ends = data, pa.py_buffer(data), starts, ends

    @classmethod
    def of(cls, texts: list[str]) -> _Lines:
        encoded = [t.encode("utf-8") for t in texts]
        sizes = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        ends = np.cumsum(sizes + 1) - 1
        return cls(b"\n".join(encoded), ends - sizes, ends)

    def raw(self, i: int) -> bytes:
        return self.data[self.starts[i] : self.ends[i]]


class _Work:
    """The bytes of some lines, copied the first time a line is blanked (Arrow reads a blank line as nothing)."""

    def __init__(self, lines: _Lines, start: int, end: int) -> None:
        self.lines, self.start, self.end = lines, start, end
        self.copy: bytearray | None = None
        self.buffer = lines.buffer

    def blank(self, start: int, end: int) -> None:
        if self.copy is None:
            self.copy = bytearray(self.lines.data[self.start : self.end])
            self.buffer = pa.py_buffer(self.copy)  # blanked later: only lines whose rows are not taken
        self.copy[start - self.start : end - self.start] = b" " * (end - start)

    def slice(self, start: int, end: int) -> pa.Buffer:
        at = start - self.start if self.copy is not None else start
        return self.buffer.slice(at, end - start)


class _Parser:
    def __init__(self, schema: pa.Schema, keys: Mapping[str, str]) -> None:
        if LINE in schema.names:
            raise PipelineDefinitionError(f"a JSON Lines schema cannot name a field {LINE!r} (the records' line number)")
        self.schema = schema
        self.keys = keys
        self.records_schema = record_schema(schema)
        self.out_schema = self.records_schema.append(pa.field(LINE, pa.int64(), nullable=False))
        # Arrow counts no rows without a column: a schema without fields reads one of its own.
        fields = list(self.records_schema) or [pa.field(_EMPTY_SCHEMA_COLUMN, pa.string())]
        self.reading_schema = pa.schema([f.with_type(_reading_type(f.type)) for f in fields])
        self.casts = [f.name for f in self.records_schema if f.type != _reading_type(f.type)]
        self.float_fields = [f.name for f in self.records_schema if _holds_floats(f.type)]
        self.names = [(f, json.dumps(f.name, ensure_ascii=False)) for f in self.records_schema]
        self.lenient = False  # True once a piece showed a field the schema does not name
        # What Arrow refused, by the field and kind of a JSON value, or by the type and text of a value: refused wherever it stands.
        self.refused_kinds: set[tuple[str, str]] = set()
        self.refused_values: set[tuple[str, str]] = set()
        self.pieces: list[pa.Table] = []  # records, _line included
        self.dead: list[tuple[int, str, str]] = []  # (line index, raw, problem)

    # -- the whole chunk ----------------------------------------------------------

    def parse(self, data: bytes, first_line: int, file_start: bool) -> ParsedLines:
        base = len(_BOM) if file_start and data.startswith(_BOM) else 0  # L1
        arr = np.frombuffer(data, dtype=np.uint8)
        # L1: line i is data[starts[i]:ends[i]], without its terminator.
        breaks = _positions(arr, _LF)
        starts = np.empty(len(breaks) + 1, dtype=np.int64)
        starts[0] = base
        starts[1:] = breaks + 1
        ends = np.empty(len(breaks) + 1, dtype=np.int64)
        ends[:-1] = breaks
        ends[-1] = len(data)
        if starts[-1] >= len(data):  # a final LF ends the last line, it starts none
            starts, ends = starts[:-1], ends[:-1]
        n = len(starts)
        ends -= (arr[ends - 1] == _CR) & (ends > starts)  # L1: one CR belongs to the terminator
        self.lines = _Lines(data, starts, ends)
        self.first_line = first_line
        self.suspect: np.ndarray | None = None
        lengths = ends - starts
        empty = lengths == 0  # L2 (the other blank lines are found the slow way)
        form = ~empty & (arr[starts] == _OPEN) & (arr[ends - 1] == _CLOSE)  # "{...}": read by Arrow a block at a time
        for i in np.flatnonzero(form & (lengths > 2 * MAX_DEPTH)).tolist():  # 2: nesting, bounded by the brackets
            s, e = int(starts[i]), int(ends[i])
            if data.count(b"{", s, e) + data.count(b"[", s, e) > MAX_DEPTH:
                form[i] = False
        invalid = self._invalid_utf8(n) if n and not data.isascii() else np.zeros(n, dtype=bool)
        for i in np.flatnonzero(invalid).tolist():
            self._dead(i, self.lines.raw(i), _utf8_problem(self.lines.raw(i)))  # 1
        form &= ~invalid
        others = np.flatnonzero(~form & ~empty)  # blanked while Arrow reads the "{...}" lines around them
        slow: list[int] = np.flatnonzero(~form & ~empty & ~invalid).tolist()
        for piece in _pieces(np.flatnonzero(form), starts, ends):
            between = others[np.searchsorted(others, piece[0]) : np.searchsorted(others, piece[-1])]
            self._convert(
                self.lines,
                piece,
                main=True,
                accept=self._accept_lines,
                reject=slow.append,
                holding=self._holding_text,
                blanked=between,
            )
        self._slow(sorted(slow))
        return self._result(n)

    def _invalid_utf8(self, n: int) -> np.ndarray:
        """Rule 1 for every line: Python's strict decoder, restarted after each bad line."""
        data, starts = self.lines.data, self.lines.starts
        invalid = np.zeros(n, dtype=bool)
        view = memoryview(data)
        at = int(starts[0])
        while at < len(data):
            try:
                str(view[at:], "utf-8")
                break
            except UnicodeDecodeError as exc:
                i = int(np.searchsorted(starts, at + exc.start, side="right")) - 1
                invalid[i] = True
                at = int(starts[i + 1]) if i + 1 < n else len(data)
        return invalid

    def _suspects(self) -> np.ndarray:
        """Lines where Arrow might have read a NaN/Inf token of a field the schema does not name (rule 2).

        Arrow's parser takes ``NaN``, ``Inf`` and ``Infinity`` (after an
        optional ``-``) where a value starts: after ``:``, ``[`` or ``,`` and
        white space. Found with numpy over the bytes; a string holding such
        text only sends its line the slow way.
        """
        if self.suspect is not None:
            return self.suspect
        data, starts = self.lines.data, self.lines.starts
        self.suspect = np.zeros(len(starts), dtype=bool)
        if data.find(b"N") < 0 and data.find(b"I") < 0:
            return self.suspect
        arr = np.frombuffer(data, dtype=np.uint8)
        at = _positions(arr[:-2], ord("N"), ord("I"))
        second, third = arr[at + 1], arr[at + 2]
        at = at[((second == ord("a")) & (third == ord("N"))) | ((second == ord("n")) & (third == ord("f")))]
        before = at - 1
        before -= (before >= 0) & (arr[np.maximum(before, 0)] == ord("-"))
        for _ in range(8):  # white space between the separator and the token
            blank = (before >= 0) & np.isin(arr[np.maximum(before, 0)], _BLANK_BYTES)
            if not blank.any():
                break
            before -= blank
        shown = arr[np.maximum(before, 0)]
        hit = (before >= 0) & (np.isin(shown, _SEPARATOR_BYTES) | np.isin(shown, _BLANK_BYTES))  # long white space: a hit
        lines = np.searchsorted(starts, at[hit], side="right") - 1
        self.suspect[lines[lines >= 0]] = True
        return self.suspect

    # -- Arrow's reader: the only converter of values ------------------------------

    def _convert(
        self,
        lines: _Lines,
        idx: np.ndarray,
        *,
        main: bool,
        accept: Callable[[np.ndarray, pa.Table], None],
        reject: Callable[[int], None],
        holding: _Holding,
        blanked: np.ndarray | None = None,
    ) -> None:
        """Read lines ``idx`` of ``lines`` (and the ``blanked`` lines between them blanked) with Arrow: rows to ``accept``, lines it refuses to ``reject``.

        ``main``: the data's own lines (fields the schema does not name refused
        until one is seen, then NaN/Inf suspects rejected); else lines written
        here. A refused line is blanked in a copy of the bytes (Arrow skips
        blank lines). Where Arrow stopped (its row) the reading goes on after
        that line, and the lines before are read once the rest is; lines
        ``holding`` a value it could not convert are refused, and the rest
        read again in halves; any other refusal halves the block.
        """
        if not len(idx):
            return
        base = int(lines.starts[idx[0]])
        work = _Work(lines, base, int(lines.ends[idx[-1]]))
        for i in blanked.tolist() if blanked is not None else ():
            work.blank(int(lines.starts[i]), int(lines.ends[i]))
        alive = np.ones(len(idx), dtype=bool)

        def drop(k: int) -> None:
            if not alive[k]:
                return  # refused already
            alive[k] = False
            work.blank(int(lines.starts[idx[k]]), int(lines.ends[idx[k]]))
            reject(int(idx[k]))

        failures = passed = 0  # refusals, and the lines read up to where they stopped
        todo = [(0, len(idx), 0)]  # [p, q) to read; [origin, p) read up to Arrow's stops already, to be read after
        while todo:
            p, q, origin = todo.pop()
            live = np.flatnonzero(alive[p:q]) + p
            if not len(live):
                if origin < p:
                    todo.append((origin, p, origin))
                continue
            if main and self.lenient:  # 2: where Arrow might have read NaN or Inf, Python decides
                hit = self._suspects()[idx[live]]
                if hit.any():
                    for k in live[hit].tolist():
                        drop(k)
                    todo.append((p, q, origin))
                    continue
            p, q = int(live[0]), int(live[-1]) + 1
            outcome = self._read(
                work.slice(int(lines.starts[idx[p]]), int(lines.ends[idx[q - 1]])),
                len(live),
                refuse_unexpected=main and not self.lenient,
            )
            if outcome is _UNEXPECTED:
                self.lenient = True
                todo.append((p, q, origin))
                continue
            if isinstance(outcome, pa.Table):
                table, bad = self._finish(outcome)  # 4
                if bad is not None:
                    for k in live[bad].tolist():
                        drop(k)
                    live = live[~bad]
                if len(live):
                    accept(idx[live], table)
                if origin < p:
                    todo.append((origin, p, origin))
                continue
            assert isinstance(outcome, _Failure)
            if outcome.kind is not None:
                self.refused_kinds.add((outcome.field or "", outcome.kind))
            elif outcome.value is not None:
                self.refused_values.add((outcome.type or "", outcome.value))
            if len(live) == 1:
                drop(p)
                if origin < p:
                    todo.append((origin, p, origin))
                continue
            relaxed = main and outcome.row is None and outcome.value is not None
            taken = (self._unconvertible(work, lines, idx, live, outcome) if relaxed else []) or holding(idx, p, q, outcome)
            for k in taken:
                drop(k)
            failures += 1
            if outcome.row is not None and outcome.row < len(live):
                k = int(live[outcome.row])  # where Arrow stopped: that line (if each line before gave one row)
                if alive[k]:
                    drop(k)
                passed += outcome.row + 1
                if main and failures > _DENSE_FAILURES and passed < _DENSE_FAILURES * failures:
                    for j in (np.flatnonzero(alive[k + 1 : q]) + k + 1).tolist():  # refusals close together: Python is cheaper
                        drop(j)
                todo.append((k + 1, q, origin))  # read on from there; what is before, once that is read
                continue
            if origin < p:
                todo.append((origin, p, origin))
            rest = live[alive[live]]  # no row to go on from: the rest again, or in halves
            if relaxed and taken:
                todo.append((p, q, p))
            elif len(rest) > 1:
                mid = int(rest[len(rest) // 2])
                todo.extend([(mid, q, mid), (p, mid, p)])
            elif len(rest):
                todo.append((p, q, p))

    def _unconvertible(self, work: _Work, lines: _Lines, idx: np.ndarray, live: np.ndarray, failure: _Failure) -> list[int]:
        """Positions (of ``live``) of the lines that likely hold a value Arrow cannot convert to the failure's type.

        Fields of that type (timestamps, integers) are read again as strings or
        doubles, which never fails to convert; a timestamp not shaped as ISO
        8601 and an integer with a fraction or out of range are likely refused: their lines go the slow way, where Arrow
        decides. None found: [] (the caller looks for the text, or halves).
        """
        fields = {f.name: f.type for f in self.records_schema if str(f.type) == failure.type and _loose_type(f.type) is not None}
        if not fields:
            return []
        schema = pa.schema([f.with_type(_loose_type(fields[f.name])) if f.name in fields else f for f in self.reading_schema])
        start, end = int(lines.starts[idx[live[0]]]), int(lines.ends[idx[live[-1]]])
        table = self._read(work.slice(start, end), len(live), refuse_unexpected=False, schema=schema)
        if not isinstance(table, pa.Table):
            return []
        likely = np.zeros(len(live), dtype=bool)
        for name, t in fields.items():
            likely |= _unlikely_values(table[name], t)
        return live[likely].tolist()

    def _read(self, buffer: pa.Buffer, rows: int, *, refuse_unexpected: bool, schema: pa.Schema | None = None) -> Any:
        """The reading schema's (or ``schema``'s) table of ``rows`` rows, or a _Failure (or _UNEXPECTED)."""
        reading = self.reading_schema if schema is None else schema
        options = pj.ParseOptions(explicit_schema=reading, unexpected_field_behavior="error" if refuse_unexpected else "ignore")
        block = max(1 << 20, buffer.size + 1)  # one block: a refusal's row counts from the buffer's start
        try:  # 4: Arrow converts
            table = pj.read_json(
                pa.BufferReader(buffer), read_options=pj.ReadOptions(use_threads=False, block_size=block), parse_options=options
            )
        except pa.ArrowInvalid as exc:
            message = str(exc)
            if refuse_unexpected and message.endswith("unexpected field"):
                return _UNEXPECTED
            return _Failure.of(message)
        if table.num_rows != rows:
            return _Failure()  # 2: two values on a line
        return table

    def _finish(self, table: pa.Table) -> tuple[pa.Table, np.ndarray | None]:
        """Rows read by Arrow as records: those with a NaN or infinite float or a date that does not cast taken out (rule 4)."""
        bad: np.ndarray | None = None
        for name in self.float_fields:
            rows = _nonfinite_rows(table[name])
            if rows is not None:
                bad = rows if bad is None else bad | rows
        for name in self.casts:
            rows = _failing_casts(table[name], self.records_schema.field(name).type)
            if rows is not None:
                bad = rows if bad is None else bad | rows
        if bad is not None:
            table = table.filter(pa.array(~bad))
        if not len(self.records_schema):
            return table.drop_columns([_EMPTY_SCHEMA_COLUMN]), bad
        return (table.cast(self.records_schema) if self.casts else table), bad

    def _holding_text(self, idx: np.ndarray, p: int, q: int, failure: _Failure) -> list[int]:
        """Positions in [p, q) of the data's lines holding the refused value's text as a token (at most _MAX_TAKEN)."""
        if failure.row is not None or not failure.value:
            return []
        needle = failure.value.encode("utf-8")
        data, starts = self.lines.data, self.lines.starts
        block = idx[p:q]
        begin, end = int(starts[block[0]]), int(self.lines.ends[block[-1]])
        found: list[int] = []
        at = data.find(needle, begin, end)
        while at >= 0:
            before, after = data[at - 1 : at], data[at + len(needle) : at + len(needle) + 1]
            if before in (b'"', b":", b" ", b",", b"[", b"\t", b"\r") and after in (b'"', b",", b"}", b"]", b" ", b"\t", b"\r"):
                k = p + int(np.searchsorted(starts[block], at, side="right")) - 1
                if not found or found[-1] != k:
                    found.append(k)
                    if len(found) > _MAX_TAKEN:
                        return []
            at = data.find(needle, at + 1, end)
        return found

    def _accept_lines(self, idx: np.ndarray, table: pa.Table) -> None:
        numbers = pa.chunked_array([pa.array(idx + self.first_line, pa.int64())])
        self.pieces.append(pa.Table.from_arrays([*table.columns, numbers], schema=self.out_schema))

    # -- the slow way: lines one by one, then Arrow on what they hold ---------------

    def _slow(self, idx: list[int]) -> None:
        objects: list[tuple[int, str, dict[str, Any]]] = []  # (line index, text, object)
        for i in idx:
            text = self.lines.raw(i).decode("utf-8")
            if not text.strip():
                continue  # L2
            stripped = text.strip(_BLANK)
            found = _json_object(text, stripped, self.records_schema)  # 2, 3
            if isinstance(found, str):
                self._dead(i, text, found)
            else:
                objects.append((i, text, found))
        if not objects:
            return
        # 4: each present field of each object alone on a line, numbers and booleans of string fields as their text.
        present = [
            [(f, name, _as_text(obj[f.name], f.type)) for f, name in self.names if obj.get(f.name) is not None]
            for _, _, obj in objects
        ]
        pairs: list[tuple[int, pa.Field, Any]] = []
        wrong: set[int] = set()
        usual: list[int] = []  # read together
        unusual: list[int] = []  # likely refused: read one by one (a refused block tells nothing of its other lines)
        for k, fields in enumerate(present):
            for f, _, v in fields:
                (unusual if _unusual(f.type, v) else usual).append(len(pairs))
                pairs.append((k, f, v))
        for group in [usual, *([j] for j in unusual)]:
            unknown = []
            for j in group:
                if _refused(pairs[j][1], pairs[j][2], self.refused_kinds, self.refused_values):
                    wrong.add(j)
                else:
                    unknown.append(j)
            if not unknown:
                continue
            alone = _Lines.of(
                ["{" + json.dumps(pairs[j][1].name, ensure_ascii=False) + ":" + _json_text(pairs[j][2]) + "}" for j in unknown]
            )
            values = _Values([pairs[j] for j in unknown])
            self._convert(
                alone, np.arange(len(unknown)), main=False, accept=_ignore, reject=_adding(wrong, unknown), holding=values.holding
            )
        by_object: dict[int, list[pa.Field]] = {}
        for j in sorted(wrong):
            by_object.setdefault(pairs[j][0], []).append(pairs[j][1])
        for k, fields in by_object.items():
            self._wrong(objects[k], fields)
        # The objects without a wrong field: the schema's fields of each on a line; their rows are records.
        clean = [k for k in range(len(objects)) if k not in by_object]
        written = _Lines.of(["{" + ",".join(name + ":" + _json_text(v) for _, name, v in present[k]) + "}" for k in clean])
        positions = np.array([objects[k][0] for k in clean], dtype=np.int64)
        refused: list[int] = []
        self._convert(
            written,
            np.arange(len(clean)),
            main=False,
            accept=lambda js, t: self._accept_lines(positions[js], t),
            reject=refused.append,
            holding=_nothing,
        )
        for j in refused:  # each value converts alone, not all together: never seen; never a record either
            self._wrong(objects[clean[j]], [f for f, _, _ in present[clean[j]]])

    def _wrong(self, found: tuple[int, str, dict[str, Any]], fields: list[pa.Field]) -> None:
        i, text, obj = found
        shown = [(f, obj[f.name] if isinstance(obj[f.name], str) else _json_text(obj[f.name])) for f in fields]
        self._dead(
            i, text, problem(DeadLetterReason.WRONG_TYPE, "; ".join(f"{f.name}: {v[:_SHOWN]} is not {f.type}" for f, v in shown))
        )

    # -- the result ---------------------------------------------------------------

    def _dead(self, i: int, raw: bytes | str, text: str) -> None:
        shown = raw if isinstance(raw, str) else raw.decode("utf-8", errors="replace")
        self.dead.append((i, shown, text))

    def _result(self, n: int) -> ParsedLines:
        records = pa.concat_tables(self.pieces) if self.pieces else self.out_schema.empty_table()
        numbers = records[LINE].to_numpy()
        if len(numbers) > 1 and not (numbers[1:] > numbers[:-1]).all():
            records = records.take(pa.array(np.argsort(numbers, kind="stable")))  # the records keep their lines' order
        found = record_problems(records, self.schema, self.keys)  # 5, 6
        if any(found):
            bad = [row for row, text in enumerate(found) if text is not None]
            for row in bad:
                i = int(records[LINE][row].as_py()) - self.first_line
                self._dead(i, self.lines.raw(i), found[row] or "")
            keep = np.ones(records.num_rows, dtype=bool)
            keep[bad] = False
            records = records.filter(pa.array(keep))
        self.dead.sort(key=lambda row: row[0])
        return ParsedLines(
            records=records,
            dead_lines=tuple(i + self.first_line for i, _, _ in self.dead),
            dead_raw=tuple(raw for _, raw, _ in self.dead),
            dead_problems=tuple(text for _, _, text in self.dead),
            lines=n,
        )


def _ignore(idx: np.ndarray, table: pa.Table) -> None:
    pass


def _adding(found: set[int], names: list[int]) -> Callable[[int], None]:
    """A reject callback adding ``names[j]`` to ``found``."""
    return lambda j: found.add(names[j])


def _nothing(idx: np.ndarray, p: int, q: int, failure: _Failure) -> list[int]:
    return []


_KINDS = {_Number: "number", str: "string", bool: "boolean", list: "array", type(None): "null"}  # as Arrow names them


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), "object")


def _refused(f: pa.Field, value: Any, kinds: set[tuple[str, str]], values: set[tuple[str, str]]) -> bool:
    """Arrow refused a value of this kind for this field, or this text for this type, already (so it refuses this one)."""
    kind = _kind(value)
    if (f.name, kind) in kinds:
        return True
    text = value.text if kind == "number" else value if kind == "string" else None
    return text is not None and (str(f.type), text) in values


class _Values:
    """Which lines of fields alone hold a value Arrow could not convert: those with a field of its type and its text.

    Arrow's conversion of a text to a type does not depend on the line: each such field is wrong.
    """

    def __init__(self, pairs: list[tuple[int, pa.Field, Any]]) -> None:
        self.lines: dict[tuple[str, str, str], list[int]] = {}
        types: dict[pa.DataType, str] = {}
        for j, (_, f, v) in enumerate(pairs):
            kind = _kind(v)
            self.lines.setdefault(("kind", f.name, kind), []).append(j)
            text = v.text if kind == "number" else v if kind == "string" else None
            if text is not None:
                shown = types.get(f.type) or types.setdefault(f.type, str(f.type))
                self.lines.setdefault(("value", shown, text), []).append(j)

    def holding(self, idx: np.ndarray, p: int, q: int, failure: _Failure) -> list[int]:
        if failure.kind is not None:
            js = self.lines.get(("kind", failure.field or "", failure.kind), [])
        elif failure.value is not None:
            js = self.lines.get(("value", failure.type or "", failure.value), [])
        else:
            return []
        return js[bisect.bisect_left(js, p) : bisect.bisect_left(js, q)]  # idx is the identity here


# -- lines and blocks -------------------------------------------------------------


def _positions(arr: np.ndarray, byte: int, other: int | None = None) -> np.ndarray:
    """Where ``arr`` holds ``byte`` (or ``other``), a cache-sized stretch at a time."""
    step = 1 << 20
    found = [np.zeros(0, dtype=np.int64)]
    for at in range(0, len(arr), step):
        part = arr[at : at + step]
        hit = part == byte
        if other is not None:
            hit |= part == other
        found.append(np.flatnonzero(hit) + at)
    return np.concatenate(found)


def _pieces(lines: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Iterable[np.ndarray]:
    """``lines`` in pieces of at most _PIECE_LINES lines spanning about _PIECE_BYTES bytes (or one line)."""
    begins = starts[lines]
    at = 0
    while at < len(lines):
        stop = min(
            len(lines), at + _PIECE_LINES, max(at + 1, int(np.searchsorted(begins, begins[at] + _PIECE_BYTES, side="right")) - 1)
        )
        yield lines[at:stop]
        at = stop


# -- types ------------------------------------------------------------------------


def _reading_type(t: pa.DataType) -> pa.DataType:
    """The type Arrow's JSON reader reads a field as: dates as strings (cast afterwards: YYYY-MM-DD only)."""
    if pa.types.is_date(t):
        return pa.string()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_reading_type(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_reading_type(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_reading_type(t.value_type)))
    return t


def _timestamp_shape(unit: str) -> str:
    """ISO 8601 as timestamps usually come (Arrow takes more, and refuses some of these: only a guess of what it refuses)."""
    digits = {"s": "", "ms": "1,3", "us": "1,6", "ns": "1,9"}[unit]
    fraction = rf"(?:\.\d{{{digits}}})?" if digits else ""
    return rf"^\d{{4}}-\d{{2}}-\d{{2}}(?:[T ]\d{{2}}(?::?\d{{2}}(?::?\d{{2}}{fraction})?)?)?(?:Z|[+-]\d{{2}}(?::?\d{{2}})?)?$"


_TIMESTAMP_SHAPES = {unit: re.compile(_timestamp_shape(unit)) for unit in ("s", "ms", "us", "ns")}
_DATE_SHAPE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _unusual(t: pa.DataType, value: Any) -> bool:
    """``value`` is likely refused for type ``t`` (a guess, to read it alone: Arrow decides)."""
    if isinstance(value, _Number):
        if pa.types.is_integer(t):
            text = value.text
            if "." in text or "e" in text or "E" in text:
                return True
            info = np.iinfo(t.to_pandas_dtype())
            return not info.min <= int(text) <= info.max
        return pa.types.is_floating(t) and ("e" in value.text or "E" in value.text or len(value.text) > 300)
    if isinstance(value, str):
        if pa.types.is_timestamp(t):
            return not _TIMESTAMP_SHAPES[t.unit].match(value)
        if pa.types.is_date(t):
            return not _DATE_SHAPE.match(value)
    return False


def _loose_type(t: pa.DataType) -> pa.DataType | None:
    """A type Arrow's reader reads any value of ``t``'s JSON kind as, without a conversion that can fail (None: no such)."""
    if pa.types.is_timestamp(t):
        return pa.string()
    if pa.types.is_integer(t):
        return pa.float64()
    return None


def _unlikely_values(column: pa.ChunkedArray, t: pa.DataType) -> np.ndarray:
    """Rows of a loosely read ``column`` (see _loose_type) whose value likely does not convert to ``t``."""
    array = column.combine_chunks()
    valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if pa.types.is_timestamp(t):
        usual = pc.fill_null(pc.match_substring_regex(array, _timestamp_shape(t.unit)), True)
        return valid & ~np.asarray(usual.to_numpy(zero_copy_only=False), dtype=bool)
    values = np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.float64)
    info = np.iinfo(t.to_pandas_dtype())
    with np.errstate(invalid="ignore"):
        return valid & ~((np.floor(values) == values) & (values >= float(info.min)) & (values <= float(info.max)))


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def _holds_floats(t: pa.DataType) -> bool:
    if pa.types.is_floating(t):
        return True
    if pa.types.is_struct(t):
        return any(_holds_floats(f.type) for f in t)
    return _is_list(t) and _holds_floats(t.value_type)


def _nonfinite_rows(column: pa.ChunkedArray | pa.Array) -> np.ndarray | None:
    """Rows of ``column`` holding a NaN or infinite float (None: no such row)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    t = array.type
    rows: np.ndarray | None = None
    if pa.types.is_floating(t):
        bad = pc.fill_null(pc.invert(pc.is_finite(array)), False)
        if pc.any(bad).as_py():
            rows = np.asarray(bad.to_numpy(zero_copy_only=False), dtype=bool)
    elif pa.types.is_struct(t):
        for k in range(t.num_fields):
            child = _nonfinite_rows(array.field(k))
            if child is not None:
                rows = child if rows is None else rows | child
        if rows is not None:
            rows &= np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    elif _is_list(t):
        child = _nonfinite_rows(array.flatten())
        if child is not None:
            rows = np.zeros(len(array), dtype=bool)
            rows[np.asarray(pc.list_parent_indices(array).to_numpy(zero_copy_only=False))[child]] = True
    return rows if rows is not None and rows.any() else None


def _failing_casts(column: pa.ChunkedArray | pa.Array, target: pa.DataType) -> np.ndarray | None:
    """Rows of ``column`` that do not cast to ``target`` (None: every row casts); found by halving."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    try:
        array.cast(target)
        return None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    rows = np.zeros(len(array), dtype=bool)
    todo = [(0, len(array))]
    while todo:
        a, b = todo.pop()
        try:
            array.slice(a, b - a).cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            if b - a == 1:
                rows[a] = True
            else:
                todo.extend([((a + b) // 2, b), (a, (a + b) // 2)])
    return rows


def _as_text(value: Any, t: pa.DataType) -> Any:
    """``value`` with the numbers and booleans standing where ``t`` wants a string made strings of their text (rule 4)."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        if isinstance(value, _Number):
            return value.text
        if isinstance(value, bool):
            return "true" if value else "false"
        return value
    if pa.types.is_struct(t) and isinstance(value, dict):
        types = {f.name: f.type for f in t}
        return {k: _as_text(v, types[k]) if k in types else v for k, v in value.items()}
    if _is_list(t) and isinstance(value, list):
        return [_as_text(v, t.value_type) for v in value]
    return value


# -- JSON text ----------------------------------------------------------------------


def _json_object(text: str, stripped: str, schema: pa.Schema) -> dict[str, Any] | str:
    """Rules 2 and 3 by Python's strict parser: the line's object, or its problem."""
    deep = stripped.count("{") + stripped.count("[") > MAX_DEPTH
    if deep and _depth(stripped) > MAX_DEPTH:  # 2
        return _not_json(f"nested more than {MAX_DEPTH} levels deep")
    try:
        value = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        return _not_json(_decode_error(exc))
    except _Refused as exc:
        return _not_json(str(exc))
    except RecursionError:
        return _not_json("nested too deeply")
    if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(value):  # 2
        return _not_json("a lone surrogate \\u escape")
    if not isinstance(value, dict):  # 3
        return _ARRAY if isinstance(value, list) else _STRING if isinstance(value, str) else _SCALAR
    repeated = _repeated_name(value, schema)  # 2
    if repeated is not None:
        return _not_json(f"the object names {repeated} twice")
    return value


def _json_text(value: Any) -> str:
    """A parsed value as compact JSON, numbers as written."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, _Number):
        return value.text
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ",".join(_json_text(v) for v in value) + "]"
    return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _json_text(v) for k, v in value.items()) + "}"


def _not_json(why: str) -> str:
    return problem(DeadLetterReason.NOT_JSON, f"not valid JSON: {why}")


def _decode_error(exc: json.JSONDecodeError) -> str:
    """Python's parser's complaint, with the character (from 1) where it stopped."""
    if exc.doc.startswith("\ufeff", exc.pos):
        what = "a byte-order mark (only the file's first bytes may hold one)"
    elif exc.msg == "Extra data":
        what = "text after the JSON value"
    else:
        what = exc.msg.removesuffix(" at")
    return f"{what} at character {exc.pos + 1}"


def _utf8_problem(raw: bytes) -> str:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return problem(DeadLetterReason.INVALID_UTF8, f"not valid UTF-8: {exc.reason} at byte {exc.start}")
    raise AssertionError("a valid UTF-8 line")


def _depth(text: str) -> int:
    """How deep arrays and objects nest in ``text`` (strings left out)."""
    depth = deepest = 0
    for ch in _STRING_RE.sub("", text):
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _has_lone_surrogate(value: Any) -> bool:
    """A string (or a name) of ``value`` holds a lone surrogate (only a ``\\u`` escape can make one: the line is UTF-8)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    return False


def _repeated_name(value: Any, fields: Iterable[pa.Field], path: str = "") -> str | None:
    """The first name the schema reads that an object of ``value`` gives twice (``a.b`` inside struct ``a``)."""
    if isinstance(value, list):
        for item in value:
            found = _repeated_name(item, fields, path)
            if found is not None:
                return found
        return None
    if not isinstance(value, _Object):
        return None
    for f in fields:
        if f.name in value.repeated:
            return path + f.name
        child = value.get(f.name)
        if child is None:
            continue
        t = f.type
        while _is_list(t):
            t = t.value_type
        if pa.types.is_struct(t):
            found = _repeated_name(child, list(t), f"{path}{f.name}.")
            if found is not None:
                return found
    return None
