r"""What makes a JSON Lines line a record or a dead letter: barrierflow's one rule, implemented once.

:func:`parse_lines` reads chunks of whole lines for a ``FileSource`` with a ``schema``. Lines end at LF (L1): one CR
ending a line (before its LF or the end of the data) is part of the terminator, the last line may lack its LF, a UTF-8
byte-order mark at the file's first byte is ignored (elsewhere it is text: ``not_json``); lines are numbered from
``first_line``, blank ones counted. An empty line, or one of white space (``str.isspace``), is skipped (L2). Every other
line is a record or a dead letter (``core/dead_letters``: a reason and a detail), by the first check it fails:

  1. ``invalid_utf8``: not UTF-8 by Python's strict decoder (overlong forms and encoded surrogates too). Detail ``not
     valid UTF-8: <reason> at byte <n>``; the raw text keeps U+FFFD replacements.
  2. ``not_json``: not exactly one JSON value by RFC 8259 (no ``NaN``/``Infinity``, comments, trailing commas, single
     quotes, raw control characters in strings or lone surrogate ``\u`` escapes; only white space after it; an object
     spread over lines is ``not_json`` on each); or an object names a field the schema reads twice (at the top level, in
     a struct or a list of structs; other names may repeat); or arrays and objects nest deeper than 500 levels. Detail
     ``not valid JSON: <what and where>``.
  3. ``not_an_object``: ``a JSON array, not an object``, ``a JSON string, not an object``, ``a JSON number, boolean or
     null, not an object``.
  4. ``wrong_type``: a schema field's non-null value that Arrow's JSON reader (the only converter) does not convert to
     its type; never coerced to null. Detail ``<field>: <value> is not <type>`` per such field in schema order, joined
     by ``"; "`` (a string's text unquoted, else compact JSON with numbers as written, cut to 100 characters; the type
     as Arrow prints it). Strings take strings, and numbers and booleans as their text as written (``1.50``, ``true``);
     integers integer literals in range (not ``1.0`` or ``1e2``); floats any number in range (not ``1e400`` for a
     double); bools ``true``/``false``; timestamps strings Arrow's ISO-8601 parser accepts (``Z``, ``+02:00``,
     ``+0200``, a space for ``T``, a date alone...; UTC without an offset; no more fraction digits than the unit holds);
     dates ``YYYY-MM-DD`` (an existing day); other types what Arrow's reader accepts (the string rule applying inside).
     Fields the schema does not name are ignored, whatever their values.
  5. ``missing_field``: ``required field <f> is missing or null``, the first non-nullable one in schema order.
  6. ``null_key`` / ``empty_key``: per key column (one a keyed operator takes straight from the records), in name order:
     null or absent, then for a string key empty (``core/dead_letters.key_problem``).

A record holds the schema's fields (all nullable) and ``_line``; records keep their lines' order.

How (Python runs per line only for lines that are not plain records): Arrow's JSON reader reads the ``{...}`` lines in
pieces, other lines blanked (and those where it could take a ``NaN``/``Inf`` token for a field the schema does not
name); a read counts if it gives one row per line. A refused piece is read on after the line where Arrow stopped, or
without the lines likely holding the value it could not convert, or in halves. Lines taken out go the slow way: Python's
strict parser (rules 2, 3), then Arrow on each field alone on a line (what it refused once, it refuses everywhere), then
on each clean object.
"""

from __future__ import annotations

import collections
import itertools
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

__all__ = ["LINE", "MAX_DEPTH", "ParsedLines", "decoded", "parse_lines", "record_schema"]

LINE = "_line"  # the records' line-number column
MAX_DEPTH = 500  # arrays and objects nested deeper: not_json (rule 2)

_BOM = b"\xef\xbb\xbf"
_LF, _CR, _OPEN, _CLOSE = 10, 13, ord("{"), ord("}")
_NONFINITE = re.compile(rb"-?(?:NaN|Inf)")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"')  # a JSON string (left out when counting nesting)
# What Arrow's refusals say: the row where it stopped; the value it could not convert.
_ERROR_ROW = re.compile(r" in row (\d+)\Z")
_ERROR_KIND = re.compile(r"\AJSON parse error: Column\(/([^/]*)\) changed from \w+ to (\w+) in row \d+\Z", re.S)
_ERROR_VALUE = re.compile(r"\AFailed to convert JSON to (.+?), couldn't parse:(.*)\Z", re.S)
_ERROR_DECIMAL = re.compile(r"\AFailed to convert JSON to (decimal[^:]*): (.*) requires (?:scale|precision) \d+\Z", re.S)
_MAX_TAKEN = 64  # lines holding a refused value's text taken the slow way at once (more: the block is halved)
_DENSE_FAILURES = 16  # more refusals in a piece, one per fewer lines than this: the rest of it goes the slow way
_PIECE_LINES = 1 << 16  # lines Arrow reads in one call at most
_PIECE_BYTES = 4 << 20  # bytes Arrow reads in one call at most (unless one line is longer)
_SHOWN = 100  # characters of a wrong value shown in its detail
_EMPTY_SCHEMA_COLUMN = "\x00barrierflow_rows"  # counts rows when the schema has no field
_KINDS = {str: "string", bool: "boolean", list: "array", type(None): "null"}  # JSON kinds as Arrow names them

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
    """Every non-blank line of ``data`` (whole lines, the first numbered ``first_line``) as a record or a dead letter.

    ``file_start``: ``data`` begins at the file's first byte; ``keys``: column -> the keyed operator taking it as it is.
    """
    return _Parser(schema, keys).parse(bytes(data), first_line, file_start)


def decoded(raw: bytes) -> tuple[str, str | None]:
    """A line's text (U+FFFD for invalid bytes) and, when it is not UTF-8, its ``invalid_utf8`` problem (rule 1)."""
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        detail = f"not valid UTF-8: {exc.reason} at byte {exc.start}"
        return raw.decode("utf-8", errors="replace"), problem(DeadLetterReason.INVALID_UTF8, detail)


@dataclass(slots=True)
class _Number:
    """A JSON number as written (Python's parser hands over its text: values are converted by Arrow alone)."""

    text: str


class _Object(dict[str, Any]):
    """A JSON object; ``repeated``: the names it gives more than once."""

    repeated: frozenset[str] = frozenset()


def _pairs(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object(pairs)
    if len(obj) != len(pairs):
        obj.repeated = frozenset(name for name, count in collections.Counter(name for name, _ in pairs).items() if count > 1)
    return obj


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


_DECODER = json.JSONDecoder(
    object_pairs_hook=_pairs, parse_float=_Number, parse_int=_Number, parse_constant=_constant, strict=True
)

_Key = tuple[str, str, str]  # what Arrow refuses wherever it stands: ("kind", field, JSON kind), ("value", type, text)


@dataclass(frozen=True)
class _Failure:
    """Arrow refused a block: the row where it stopped and what it refused, if it said."""

    row: int | None = None
    key: _Key | None = None

    @classmethod
    def of(cls, message: str) -> _Failure:
        row, kind = _ERROR_ROW.search(message), _ERROR_KIND.search(message)
        value = _ERROR_VALUE.search(message) or _ERROR_DECIMAL.search(message)
        if row:
            return cls(int(row.group(1)), ("kind", kind.group(1), kind.group(2)) if kind else None)
        return cls(key=("value", value.group(1), value.group(2)) if value else None)


class _Lines:
    """Lines of one buffer: line i is ``data[starts[i]:ends[i]]``, its terminator left out."""

    def __init__(self, data: bytes, starts: np.ndarray, ends: np.ndarray) -> None:
        self.data, self.starts, self.ends = data, starts, ends

    @classmethod
    def of(cls, texts: list[str]) -> _Lines:
        encoded = [t.encode("utf-8") for t in texts]
        sizes = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        ends = np.cumsum(sizes + 1) - 1
        return cls(b"\n".join(encoded), ends - sizes, ends)

    def raw(self, i: int) -> bytes:
        return self.data[self.starts[i] : self.ends[i]]


class _Parser:
    def __init__(self, schema: pa.Schema, keys: Mapping[str, str]) -> None:
        if LINE in schema.names:
            raise PipelineDefinitionError(f"a JSON Lines schema cannot name a field {LINE!r} (the records' line number)")
        self.schema, self.keys = schema, keys
        self.records_schema = record_schema(schema)
        self.out_schema = self.records_schema.append(pa.field(LINE, pa.int64(), nullable=False))
        # Arrow counts no rows without a column: a schema without fields reads one of its own.
        fields = list(self.records_schema) or [pa.field(_EMPTY_SCHEMA_COLUMN, pa.string())]
        self.reading_schema = pa.schema([f.with_type(_reading_type(f.type)) for f in fields])
        self.casts = [f.name for f in self.records_schema if f.type != _reading_type(f.type)]
        self.names = [(f, json.dumps(f.name, ensure_ascii=False), str(f.type)) for f in self.records_schema]
        self.refused: set[_Key] = set()
        self.pieces: list[pa.Table] = []  # records, _line included
        self.dead: list[tuple[int, str]] = []  # (line index, problem)

    def parse(self, data: bytes, first_line: int, file_start: bool) -> ParsedLines:
        base = len(_BOM) if file_start and data.startswith(_BOM) else 0  # L1
        arr = np.frombuffer(data, dtype=np.uint8)
        # L1: line i is data[starts[i]:ends[i]], without its terminator.
        step = 1 << 20  # numpy over a cache-sized stretch at a time
        breaks = np.concatenate(
            [np.zeros(0, np.int64), *(np.flatnonzero(arr[at : at + step] == _LF) + at for at in range(0, len(arr), step))]
        )
        starts = np.concatenate([[base], breaks + 1])
        ends = np.concatenate([breaks, [len(data)]])
        if starts[-1] >= len(data):  # a final LF ends the last line, it starts none
            starts, ends = starts[:-1], ends[:-1]
        ends -= (arr[ends - 1] == _CR) & (ends > starts)  # L1: one CR belongs to the terminator
        self.lines, self.first_line, n = _Lines(data, starts, ends), first_line, len(starts)
        empty = ends == starts  # L2 (the other blank lines are found the slow way)
        form = ~empty & (arr[starts] == _OPEN) & (arr[ends - 1] == _CLOSE)  # "{...}": read by Arrow a piece at a time
        for i in np.flatnonzero(form & (ends - starts > 2 * MAX_DEPTH)).tolist():  # 2: nesting, bounded by the brackets
            form[i] = data.count(b"{", starts[i], ends[i]) + data.count(b"[", starts[i], ends[i]) <= MAX_DEPTH
        if b"NaN" in data or b"Inf" in data:  # 2: Arrow takes these tokens for a field the schema does not name
            tokens = [m.start() for m in _NONFINITE.finditer(data)]
            at = [t for t in tokens if data[max(0, t - 64) : t].rstrip(b" \t\r")[-1:] in b":[,"]  # where a value starts
            form[np.searchsorted(starts, np.array(at, dtype=np.int64), side="right") - 1] = False
        invalid = self._invalid_utf8(n) if n and not data.isascii() else np.zeros(n, dtype=bool)
        self.dead += [(i, decoded(self.lines.raw(i))[1] or "") for i in np.flatnonzero(invalid).tolist()]  # 1
        others = np.flatnonzero(~form & ~empty)  # blanked while Arrow reads the "{...}" lines around them
        slow: list[int] = np.flatnonzero(~form & ~empty & ~invalid).tolist()
        for piece in _pieces(np.flatnonzero(form & ~invalid), starts):
            between = others[np.searchsorted(others, piece[0]) : np.searchsorted(others, piece[-1])]
            self._convert(self.lines, piece, reject=slow.append, accept=self._accept_lines, blanked=between.tolist())
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

    def _convert(
        self,
        lines: _Lines,
        idx: np.ndarray,
        *,
        reject: Callable[[int], None],
        accept: Callable[[np.ndarray, pa.Table], None] | None = None,
        held: Mapping[_Key, list[int]] | None = None,
        blanked: Iterable[int] = (),
    ) -> None:
        """Read lines ``idx`` of ``lines`` (``blanked`` ones blanked) with Arrow: rows to ``accept``, lines it refuses to ``reject``.

        ``held`` None: the data's own lines (see the module's "How"); else lines written here, and the positions (in
        ``idx``) of the lines holding each key. A refused line is blanked in a copy of the bytes.
        """
        if not len(idx):
            return
        main = held is None
        base = int(lines.starts[idx[0]])
        work = bytearray(lines.data[base : int(lines.ends[idx[-1]])])
        buffer = pa.py_buffer(work)  # Arrow reads a blank line as nothing

        def blank(i: int) -> None:
            work[lines.starts[i] - base : lines.ends[i] - base] = b" " * int(lines.ends[i] - lines.starts[i])

        for i in blanked:
            blank(i)
        alive = np.ones(len(idx), dtype=bool)

        def drop(ks: Iterable[int]) -> None:
            for k in ks:
                if alive[k]:
                    alive[k] = False
                    blank(idx[k])
                    reject(int(idx[k]))

        failures = passed = 0  # refusals, and the lines read up to where they stopped
        todo = [(0, len(idx), 0)]  # [p, q) to read; [origin, p) read up to Arrow's stops already, to be read after
        while todo:
            p, q, origin = todo.pop()
            live = np.flatnonzero(alive[p:q]) + p
            outcome: Any = None
            if len(live):
                p, q = int(live[0]), int(live[-1]) + 1
                start = int(lines.starts[idx[p]])
                piece = buffer.slice(start - base, int(lines.ends[idx[q - 1]]) - start)
                outcome = self._read(piece, len(live))
            taken: list[int] = []
            if isinstance(outcome, _Failure):
                if outcome.key is not None:
                    self.refused.add(outcome.key)
                if len(live) > 1:
                    if main:
                        taken = self._holding(piece, idx, live, outcome)
                    elif held is not None and outcome.key is not None:
                        taken = [k for k in held.get(outcome.key, []) if p <= k < q]
                    drop(taken)
                    failures += 1
                    if outcome.row is not None and outcome.row < len(live):
                        k = int(live[outcome.row])  # where Arrow stopped: that line (if each line before gave one row)
                        drop([k])
                        passed += outcome.row + 1
                        if main and failures > _DENSE_FAILURES and passed < _DENSE_FAILURES * failures:
                            drop(range(k + 1, q))  # refusals close together: Python is cheaper
                        todo.append((k + 1, q, origin))  # read on from there; what is before, once that is read
                        continue
            if origin < p:
                todo.append((origin, p, origin))
            if isinstance(outcome, pa.Table):
                table, bad = self._finish(outcome)  # 4
                drop(live[bad].tolist())
                if accept is not None and not bad.all():
                    accept(idx[live[~bad]], table)
            elif outcome is not None and len(live) == 1:
                drop([p])
            elif outcome is not None:
                rest = live[alive[live]]  # no row to go on from: the rest again, or in halves
                if taken or len(rest) < 2:
                    todo.append((p, q, p))
                else:
                    mid = int(rest[len(rest) // 2])
                    todo += [(mid, q, mid), (p, mid, p)]

    def _holding(self, piece: pa.Buffer, idx: np.ndarray, live: np.ndarray, failure: _Failure) -> list[int]:
        """Positions (of ``live``, the data's lines in ``piece``) likely holding the value Arrow could not convert ([]: unknown).

        Top-level timestamps and integers of its type read again as strings or doubles (which never fails): those not
        shaped as ISO 8601, with a fraction or out of range. Else the lines holding its text as a token.
        """
        if failure.row is not None or failure.key is None or failure.key[0] != "value":
            return []
        _, type_, text = failure.key
        fields = {f.name: f.type for f in self.records_schema if str(f.type) == type_ and _reading_type(f.type, True) != f.type}
        if fields:
            schema = pa.schema(
                [f.with_type(_reading_type(fields[f.name], True)) if f.name in fields else f for f in self.reading_schema]
            )
            table = self._read(piece, len(live), schema)
            if isinstance(table, pa.Table):
                likely = np.logical_or.reduce([_unlikely_values(table[name], t) for name, t in fields.items()])
                if likely.any():
                    return live[likely].tolist()
        if not text:
            return []
        token = re.compile(rb'(?<=[": ,\[\t\r])' + re.escape(text.encode("utf-8")) + rb'(?=[",}\] \t\r])')
        data, starts = self.lines.data, self.lines.starts[idx[live[0] : live[-1] + 1]]
        found: list[int] = []
        for m in token.finditer(data, int(starts[0]), int(self.lines.ends[idx[live[-1]]])):
            k = int(live[0]) + int(np.searchsorted(starts, m.start(), side="right")) - 1
            if not found or found[-1] != k:
                found.append(k)
                if len(found) > _MAX_TAKEN:
                    return []
        return found

    def _read(self, buffer: pa.Buffer, rows: int, schema: pa.Schema | None = None) -> pa.Table | _Failure:
        """The reading schema's (or ``schema``'s) table of ``rows`` rows (fields it does not name ignored), or a _Failure."""
        options = pj.ParseOptions(explicit_schema=schema or self.reading_schema, unexpected_field_behavior="ignore")
        block = max(1 << 20, buffer.size + 1)  # one block: a refusal's row counts from the buffer's start
        try:  # 4: Arrow converts
            table = pj.read_json(
                pa.BufferReader(buffer), read_options=pj.ReadOptions(use_threads=False, block_size=block), parse_options=options
            )
        except pa.ArrowInvalid as exc:
            return _Failure.of(str(exc))
        return table if table.num_rows == rows else _Failure()  # 2: two values on a line

    def _finish(self, table: pa.Table) -> tuple[pa.Table, np.ndarray]:
        """Rows read by Arrow as records, and which were taken out: a NaN or infinite float, a date that does not cast (rule 4)."""
        bad = np.zeros(table.num_rows, dtype=bool)
        for name in self.records_schema.names:
            bad |= _nonfinite_rows(table[name].combine_chunks())
        for name in self.casts:
            bad |= _failing_casts(table[name].combine_chunks(), self.records_schema.field(name).type)
        if bad.any():
            table = table.filter(pa.array(~bad))
        if not len(self.records_schema):
            return table.drop_columns([_EMPTY_SCHEMA_COLUMN]), bad
        return (table.cast(self.records_schema) if self.casts else table), bad

    def _accept_lines(self, idx: np.ndarray, table: pa.Table) -> None:
        numbers = pa.chunked_array([pa.array(idx + self.first_line, pa.int64())])
        self.pieces.append(pa.Table.from_arrays([*table.columns, numbers], schema=self.out_schema))

    def _slow(self, idx: list[int]) -> None:
        texts = [(i, text) for i in idx if (text := self.lines.raw(i).decode("utf-8")).strip()]  # L2
        found = [(i, _json_object(text, self.records_schema)) for i, text in texts]  # 2, 3
        self.dead += [(i, why) for i, why in found if isinstance(why, str)]
        objects = [(i, obj) for i, obj in found if isinstance(obj, dict)]  # (line index, object)
        # 4: each present field of each object alone on a line, numbers and booleans of string fields as their text.
        present = [
            [(f, name, _as_text(obj[f.name], f.type), shown) for f, name, shown in self.names if obj.get(f.name) is not None]
            for _, obj in objects
        ]
        pairs = [(k, f, name, v, _keys(f.name, shown, v)) for k, fields in enumerate(present) for f, name, v, shown in fields]
        unusual = [j for j, (_, f, _, v, _) in enumerate(pairs) if _unusual(f.type, v)]
        usual = sorted(set(range(len(pairs))) - set(unusual))
        wrong: set[int] = set()
        for group in [usual, *([j] for j in unusual)]:  # likely refused: one by one (a refused block tells nothing of the rest)
            unknown = [j for j in group if self.refused.isdisjoint(pairs[j][4])]
            wrong.update(set(group) - set(unknown))
            held: dict[_Key, list[int]] = {}
            for k, j in enumerate(unknown):
                for key in pairs[j][4]:
                    held.setdefault(key, []).append(k)
            alone = _Lines.of(["{" + pairs[j][2] + ":" + _json_text(pairs[j][3]) + "}" for j in unknown])
            self._convert(alone, np.arange(len(unknown)), reject=lambda k: wrong.add(unknown[k]), held=held)
        by_object: dict[int, list[pa.Field]] = {}
        for j in sorted(wrong):
            by_object.setdefault(pairs[j][0], []).append(pairs[j][1])
        for k, fields in by_object.items():
            self._wrong(objects[k][0], objects[k][1], fields)
        # The objects without a wrong field: the schema's fields of each on a line; their rows are records.
        clean = [k for k in range(len(objects)) if k not in by_object]
        rows = _Lines.of(["{" + ",".join(name + ":" + _json_text(v) for _, name, v, _ in present[k]) + "}" for k in clean])
        at, refused = np.array([objects[k][0] for k in clean], dtype=np.int64), list[int]()
        self._convert(
            rows, np.arange(len(clean)), reject=refused.append, held={}, accept=lambda js, t: self._accept_lines(at[js], t)
        )
        for j in refused:  # each value converts alone, not all together: never seen; never a record either
            self._wrong(objects[clean[j]][0], objects[clean[j]][1], [f for f, _, _, _ in present[clean[j]]])

    def _wrong(self, i: int, obj: dict[str, Any], fields: list[pa.Field]) -> None:
        shown = [(f, v if isinstance(v := obj[f.name], str) else _json_text(v)) for f in fields]
        self.dead.append(
            (i, problem(DeadLetterReason.WRONG_TYPE, "; ".join(f"{f.name}: {v[:_SHOWN]} is not {f.type}" for f, v in shown)))
        )

    def _result(self, n: int) -> ParsedLines:
        records = pa.concat_tables(self.pieces) if self.pieces else self.out_schema.empty_table()
        if (np.diff(records[LINE].to_numpy()) < 0).any():
            records = records.sort_by(LINE)  # the records keep their lines' order
        found = record_problems(records, self.schema, self.keys)  # 5, 6
        bad = [row for row, text in enumerate(found) if text is not None] if found.count(None) < len(found) else []
        if bad:
            numbers = records[LINE].to_numpy()
            self.dead += [(int(numbers[row]) - self.first_line, found[row] or "") for row in bad]
            records = records.filter(pc.is_null(pa.array(found, pa.string())))
        dead = sorted(self.dead)
        raws = tuple(decoded(self.lines.raw(i))[0] for i, _ in dead)
        return ParsedLines(records, tuple(i + self.first_line for i, _ in dead), raws, tuple(text for _, text in dead), n)


def _keys(name: str, shown: str, value: Any) -> list[_Key]:
    """What a value of field ``name`` (of type ``shown``) would be refused as: its kind for the field, its text for the type."""
    kind = "number" if isinstance(value, _Number) else _KINDS.get(type(value), "object")
    text = value.text if kind == "number" else value if kind == "string" else None
    return [("kind", name, kind)] + ([("value", shown, text)] if text is not None else [])


def _pieces(lines: np.ndarray, starts: np.ndarray) -> Iterable[np.ndarray]:
    """``lines`` in pieces of at most _PIECE_LINES lines spanning about _PIECE_BYTES bytes (or one line)."""
    begins = starts[lines]
    at = 0
    while at < len(lines):
        stop = min(
            len(lines), at + _PIECE_LINES, max(at + 1, int(np.searchsorted(begins, begins[at] + _PIECE_BYTES, side="right")) - 1)
        )
        yield lines[at:stop]
        at = stop


def _reading_type(t: pa.DataType, loose: bool = False) -> pa.DataType:
    """The type Arrow's JSON reader reads a field as: dates as strings (cast afterwards: YYYY-MM-DD only); ``loose``, also
    timestamps as strings and integers as doubles, which never fails (see :meth:`_Parser._holding`)."""
    if pa.types.is_date(t) or (loose and pa.types.is_timestamp(t)):
        return pa.string()
    if loose and pa.types.is_integer(t):
        return pa.float64()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_reading_type(f.type, loose)) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        list_type = pa.list_ if pa.types.is_list(t) else pa.large_list
        return list_type(t.value_field.with_type(_reading_type(t.value_type, loose)))
    return t


def _timestamp_shape(unit: str) -> str:
    """ISO 8601 as timestamps usually come (Arrow takes more, and refuses some of these: only a guess of what it refuses)."""
    digits = {"s": "", "ms": "1,3", "us": "1,6", "ns": "1,9"}[unit]
    fraction = rf"(?:\.\d{{{digits}}})?" if digits else ""
    return rf"^\d{{4}}-\d{{2}}-\d{{2}}(?:[T ]\d{{2}}(?::?\d{{2}}(?::?\d{{2}}{fraction})?)?)?(?:Z|[+-]\d{{2}}(?::?\d{{2}})?)?$"


def _unusual(t: pa.DataType, value: Any) -> bool:
    """``value`` is likely refused for type ``t`` (a guess, to read it alone: Arrow decides)."""
    if isinstance(value, _Number):
        text = value.text
        if pa.types.is_integer(t):
            info = np.iinfo(t.to_pandas_dtype())
            return "." in text or "e" in text or "E" in text or not info.min <= int(text) <= info.max
        return pa.types.is_floating(t) and ("e" in text or "E" in text or len(text) > 300)
    return isinstance(value, str) and pa.types.is_timestamp(t) and not re.match(_timestamp_shape(t.unit), value)


def _unlikely_values(column: pa.ChunkedArray, t: pa.DataType) -> np.ndarray:
    """Rows of a loosely read ``column`` (a timestamp or integer, see _reading_type) whose value likely does not convert to ``t``."""
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


def _nonfinite_rows(array: pa.Array) -> np.ndarray:
    """Rows of ``array`` holding a NaN or infinite float, in any struct field or list item."""
    rows = np.zeros(len(array), dtype=bool)
    if pa.types.is_floating(array.type):
        rows |= np.asarray(pc.fill_null(pc.invert(pc.is_finite(array)), False).to_numpy(zero_copy_only=False), dtype=bool)
    elif pa.types.is_struct(array.type):
        for child in array.flatten():  # with the struct's nulls
            rows |= _nonfinite_rows(child)
    elif _is_list(array.type):
        parents = np.asarray(pc.list_parent_indices(array).to_numpy(zero_copy_only=False))
        rows[parents[_nonfinite_rows(array.flatten())]] = True
    return rows


def _failing_casts(array: pa.Array, target: pa.DataType) -> np.ndarray:
    """Rows of ``array`` that do not cast to ``target``, found by halving."""
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
                todo += [((a + b) // 2, b), (a, (a + b) // 2)]
    return rows


def _as_text(value: Any, t: pa.DataType) -> Any:
    """``value`` with the numbers and booleans standing where ``t`` wants a string made strings of their text (rule 4)."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return value.text if isinstance(value, _Number) else _json_text(value) if isinstance(value, bool) else value
    if pa.types.is_struct(t) and isinstance(value, dict):
        types = {f.name: f.type for f in t}
        return {k: _as_text(v, types[k]) if k in types else v for k, v in value.items()}
    if _is_list(t) and isinstance(value, list):
        return [_as_text(v, t.value_type) for v in value]
    return value


def _json_object(text: str, schema: pa.Schema) -> dict[str, Any] | str:
    """Rules 2 and 3 by Python's strict parser: the line's object, or its problem."""
    if text.count("{") + text.count("[") > MAX_DEPTH:  # 2: how deep arrays and objects nest (strings left out)
        steps = (1 if ch in "[{" else -1 for ch in _STRING_RE.sub("", text) if ch in "[]{}")
        if max(itertools.accumulate(steps), default=0) > MAX_DEPTH:
            return _not_json(f"nested more than {MAX_DEPTH} levels deep")
    try:
        value = _DECODER.decode(text)
    except json.JSONDecodeError as exc:  # with the character (from 1) where the parser stopped
        if exc.doc.startswith("\ufeff", exc.pos):
            what = "a byte-order mark (only the file's first bytes may hold one)"
        else:
            what = "text after the JSON value" if exc.msg == "Extra data" else exc.msg.removesuffix(" at")
        return _not_json(f"{what} at character {exc.pos + 1}")
    except ValueError as exc:  # a NaN or Infinity token
        return _not_json(str(exc))
    except RecursionError:
        return _not_json("nested too deeply")
    if _SURROGATE_ESCAPE.search(text):  # 2: only a \u escape can make a lone surrogate (the line is UTF-8)
        try:
            _json_text(value).encode("utf-8")
        except UnicodeEncodeError:
            return _not_json("a lone surrogate \\u escape")
    if not isinstance(value, dict):  # 3
        return _ARRAY if isinstance(value, list) else _STRING if isinstance(value, str) else _SCALAR
    repeated = _repeated_name(value, schema)  # 2
    return value if repeated is None else _not_json(f"the object names {repeated} twice")


def _json_text(value: Any) -> str:
    """A parsed value as compact JSON, numbers as written."""
    if isinstance(value, _Number):
        return value.text
    if isinstance(value, list):
        return "[" + ",".join(_json_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _json_text(v) for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)  # a string, a boolean or null


def _not_json(why: str) -> str:
    return problem(DeadLetterReason.NOT_JSON, f"not valid JSON: {why}")


def _repeated_name(value: Any, fields: Iterable[pa.Field], path: str = "") -> str | None:
    """The first name the schema reads that an object of ``value`` gives twice (``a.b`` inside struct ``a``)."""
    if isinstance(value, list):
        return next((found for item in value if (found := _repeated_name(item, fields, path)) is not None), None)
    if not isinstance(value, _Object):
        return None
    for f in fields:
        if f.name in value.repeated:
            return path + f.name
        t = f.type
        while _is_list(t):
            t = t.value_type
        if pa.types.is_struct(t) and value.get(f.name) is not None:
            found = _repeated_name(value[f.name], list(t), f"{path}{f.name}.")
            if found is not None:
                return found
    return None
