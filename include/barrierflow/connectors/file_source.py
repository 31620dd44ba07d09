"""A landing-directory file source with per-file line positions as offsets (README "Run a pipeline from the command line").

Offsets are the position after the last record consumed (``{"file": name, "line": lines consumed in it, None when
all}``); a barrier also lists its epoch's exact file ranges, so replay never lists the directory again. Planning lists
and stats files, never reads them. Tasks on the executors each read a :class:`~barrierflow.connectors.source.Split`:

1. Each file is opened and checked against its barrier: gone is a :class:`BlockedInputError`; another size fails the
   epoch.
2. The task reads only the bytes of the lines it owns (:func:`owned_lines`).
3. JSON Lines are parsed against ``schema`` (:mod:`~barrierflow.connectors.jsonl`) or by the user's ``parser``
   (:func:`_parser_records`); Parquet rows are read as ``schema`` (:meth:`FileSource._parquet_rows`).
4. What is not a record becomes a dead letter with its file and line; records get ``_seq`` from (source index, file
   index, line).
"""

from __future__ import annotations

import datetime
import enum
import operator
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from barrierflow.connectors import jsonl
from barrierflow.connectors.schema_check import read_as, schema_mismatches
from barrierflow.connectors.source import Backlog, FileRange, Split, checked_rows, file_dead_letters, gathered, open_file, packed
from barrierflow.core.columns import SEQ, arrival_seq
from barrierflow.core.dead_letters import DeadLetterReason, problem, record_problems
from barrierflow.core.errors import BlockedInputError, PipelineDefinitionError, SourceError
from barrierflow.storage import objects
from barrierflow.storage.objects import join_uri, normalize_uri

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from barrierflow.connectors.source import RecordCounter

__all__ = ["FileSource", "LateFiles", "RecordError", "LineParser", "count_records", "count_records_on_executors"]

# Files counted per planning job: enough for both cores of a small cluster, few beyond the record budget.
_COUNT_BATCH_FILES = 8
# Bytes read at a time when scanning for newlines (a range's prefix, a line range's start, a count).
_BLOCK_BYTES = 8 * 1024 * 1024
# What a parser's value may not raise when pyarrow converts it: the value is not of its field's type.
_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError)
_COUNTED = pa.schema([("uri", pa.string()), ("records", pa.int64())])


class RecordError(ValueError):
    """Raised by a line parser: the line is a dead letter with this ``reason`` code and the message as its detail."""

    def __init__(self, detail: str, reason: DeadLetterReason = DeadLetterReason.INVALID_RECORD) -> None:
        super().__init__(detail)
        self.reason = reason


LineParser = Callable[[str], Mapping[str, Any]]


class LateFiles(str, enum.Enum):
    """What a file source does with a file landing at or before its position (later is exactly-once too: barriers list files)."""

    NEXT_EPOCH = "next_epoch"  # the default: read it whole in the next epoch, ahead of the files after the position
    DEAD_LETTER = "dead_letter"  # one dead letter for the whole file (reason late_file); it is never read
    REFUSE = "refuse"  # the pipeline is blocked (BlockedInputError) until the file is moved


@dataclass(frozen=True)
class FileSource:
    """Replayable source over files landing in a directory: JSON Lines parsed against ``schema`` or by ``parser`` (one
    line to a mapping of ``parser_schema``), or Parquet read as ``schema``."""

    source_id: str
    path: str
    format: str = "jsonl"
    schema: pa.Schema | None = None
    parser: LineParser | None = None
    parser_schema: pa.Schema | None = None
    max_files_per_epoch: int = 10
    max_records_per_epoch: int | None = None
    suffixes: tuple[str, ...] = field(default=())
    # A file landing with a name at or before the stream position: see LateFiles.
    late_files: LateFiles = LateFiles.NEXT_EPOCH
    # How many of the largest names read the offsets keep, to name late files.
    late_file_window: int = 100

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "late_files", LateFiles(self.late_files))
        except ValueError:
            raise PipelineDefinitionError(
                f"source {self.source_id}: late_files must be one of {', '.join(repr(p.value) for p in LateFiles)}, "
                f"got {self.late_files!r}"
            ) from None
        checks = [
            (self.late_file_window < 1, "late_file_window must be >= 1"),
            (self.format not in ("jsonl", "parquet"), "format must be 'jsonl' or 'parquet'"),
            (
                self.format == "jsonl" and (self.parser is None) == (self.schema is None),
                "give exactly one of schema= (native JSON parsing) or parser= with parser_schema= (Python validation)",
            ),
            (  # as Spark's streaming file source: files landing later must not change the records' schema
                self.format == "parquet" and (self.schema is None or self.parser is not None),
                "a Parquet source needs schema= (the columns and types of its records; "
                "a file that does not fit it is dead-lettered whole) and takes no parser=",
            ),
            (self.parser is not None and self.parser_schema is None, "parser= needs parser_schema="),
            (self.max_files_per_epoch < 1, "max_files_per_epoch must be >= 1"),
            (self.max_records_per_epoch is not None and self.max_records_per_epoch < 1, "max_records_per_epoch must be >= 1"),
        ]
        for failed, why in checks:
            if failed:
                raise PipelineDefinitionError(f"source {self.source_id}: {why}")

    def _listing(self) -> list[objects.StoredFile]:
        """Every complete input file in the landing directory (on an object store, a PUT is atomic: every object is)."""
        directory = normalize_uri(self.path)
        if objects.is_local(directory) and not objects.exists(directory):
            raise SourceError(
                f"source {self.source_id}: landing directory {directory} does not exist; "
                "create it or pass --param landing_dir=<existing directory>"
            )
        suffixes = self.suffixes or ((".jsonl", ".json") if self.format == "jsonl" else (".parquet",))
        return [f for f in objects.list_files(directory) if not f.path.startswith((".", "_")) and f.path.endswith(suffixes)]

    def _arrivals(self, arrival_cutoff_ms: int | None) -> dict[str, int]:
        """Name -> arrival (modification time, ns; S3 keeps whole seconds) of every complete file that arrived by the cut-off."""
        cutoff = None if arrival_cutoff_ms is None else arrival_cutoff_ms * 1_000_000
        return {f.path: f.modified_ns for f in self._listing() if cutoff is None or f.modified_ns <= cutoff}

    def _late_files(self, start: Mapping[str, Any] | None, arrivals: Mapping[str, int]) -> tuple[list[str], int]:
        """Files sorting at or before the position that were not read: (the ones named, how many in all).

        The offsets count the files read (``consumed``) and keep the ``late_file_window`` largest names read (``recent``):
        a late file within that window is named; one further behind is only counted.
        """
        if not start or start.get("file") is None:
            return [], 0
        behind = [name for name in arrivals if name <= start["file"]]
        unread = len(behind) - int(start.get("consumed", 0))
        if unread <= 0:
            return [], 0
        recent = set(start.get("recent") or [])
        # Every name read is in ``recent`` until the window fills; after that, those from its first on.
        floor = "" if len(recent) >= int(start.get("consumed", 0)) else min(recent, default=None)
        named = sorted(n for n in behind if floor is not None and n >= floor and n not in recent)
        return named, max(unread, len(named))

    def _refuse_late(self, named: list[str], count: int, pos_file: str) -> BlockedInputError:
        what = ", ".join(repr(n) for n in named[:5]) + (f" and {len(named) - 5} more" if len(named) > 5 else "")
        what = f"file(s) {what}" if named else ""
        if count > len(named):
            what += (" and " if what else "") + (
                f"{count - len(named)} file(s) too far behind to tell from files already read (only the last "
                f"{self.late_file_window} names read are kept)"
            )
        return BlockedInputError(
            f"source {self.source_id}: {what} landed in {self.path} sorting at or before the stream position "
            f"{pos_file!r}: files are read in name order. late_files={self.late_files.value!r} refuses them. "
            "Set late_files='next_epoch' (read them in the next epoch) or 'dead_letter' (one dead letter per file); "
            "or move each to a name after the position but before files still to land"
        )

    def earliest_arrival_ms(self, start: Mapping[str, Any] | None, arrival_cutoff_ms: int | None) -> int | None:
        """When the earliest file not yet (wholly) consumed arrived, in ms rounded up; None if none."""
        arrivals = self._arrivals(arrival_cutoff_ms)
        waiting = [arrivals[name] for name, _ in _unread(start, arrivals)]
        named, count = self._late_files(start, arrivals)
        if count:  # late files are input too (refused ones as well: planning then says why)
            behind = named if count == len(named) else [n for n in arrivals if start and n <= start["file"]]
            waiting += [arrivals[n] for n in behind]
        return -(-min(waiting) // 1_000_000) if waiting else None  # rounded up: a cut-off at this millisecond takes the file

    def plan(
        self, start: Mapping[str, Any] | None, arrival_cutoff_ms: int | None, counter: RecordCounter | None = None
    ) -> dict[str, Any]:
        """End offsets: the next files in name order, and files that landed behind the position.

        1. Late files (:meth:`_late_files`), by ``late_files``: refused (always, if too far behind to be named), taken
           whole ahead of the others, or listed under ``late``.
        2. The files after the position, up to ``max_files_per_epoch`` and ``max_records_per_epoch`` (ranges of lines;
           ``counter`` counts the records of the files this may take, a few at a time).
        3. The new position: the last range's end; ``consumed`` and ``recent`` take every file read or dead-lettered.
        """
        start = start or {}
        arrivals = self._arrivals(arrival_cutoff_ms)
        base = normalize_uri(self.path)
        # 1.
        named, count = self._late_files(start, arrivals)
        if count and (self.late_files is LateFiles.REFUSE or count > len(named)):
            raise self._refuse_late(named, count, str(start.get("file")))
        sizes = {name: objects.file_size(join_uri(base, name)) for name in named}
        taken = [[n, 0, None, sizes[n]] for n in named] if self.late_files is LateFiles.NEXT_EPOCH else []
        dead = [[n, sizes[n]] for n in named] if self.late_files is LateFiles.DEAD_LETTER else []
        # 2.
        ranges: list[list[Any]] = []
        budget = self.max_records_per_epoch
        candidates = _unread(start, arrivals)[: self.max_files_per_epoch]
        counts: dict[str, int] = {}
        for i, (name, from_line) in enumerate(candidates):
            uri = join_uri(base, name)
            if budget is None:
                ranges.append([name, from_line, None, objects.file_size(uri)])
                continue
            if uri not in counts:
                if counter is None:
                    raise SourceError(
                        f"source {self.source_id}: max_records_per_epoch needs the records of the files counted by executors: "
                        "plan epochs through the checkpoint coordinator (or pass plan() a counter)"
                    )
                counts.update(counter([join_uri(base, n) for n, _ in candidates[i : i + _COUNT_BATCH_FILES]], self.format))
            available = counts[uri] - from_line
            ranges.append([name, from_line, None if available <= budget else from_line + budget, objects.file_size(uri)])
            budget -= min(available, budget)
            if budget == 0:
                break
        # 3.
        new_names = named + [name for name, *_ in ranges if name != start.get("file")]
        end: dict[str, Any] = {
            "file": ranges[-1][0] if ranges else start.get("file"),
            "line": ranges[-1][2] if ranges else start.get("line"),
            "files": taken + ranges,
            "consumed": int(start.get("consumed", 0)) + len(new_names),
            "recent": sorted(set(start.get("recent") or []).union(new_names))[-self.late_file_window :],
        }
        if dead:
            end["late"] = dead
        return end

    def has_records(self, end: Mapping[str, Any]) -> bool:
        return bool(end.get("files") or end.get("late"))

    def backlog(self, end: Mapping[str, Any] | None) -> Backlog:
        """Files after the position (the one partly read included) and late files not yet taken."""
        listing = self._listing()
        named, _ = self._late_files(end, {f.path: f.modified_ns for f in listing})
        waiting = {name for name, _ in _unread(end, [f.path for f in listing])}.union(named)
        files = [f for f in listing if f.path in waiting]
        oldest = min((f.modified_ns for f in files), default=None)
        return Backlog(len(files), sum(f.size for f in files), -(-oldest // 1_000_000) if oldest is not None else None)

    def describe(self) -> dict[str, Any]:
        return {"type": "file", "id": self.source_id, "format": self.format, "path": self.path}

    def record_schema(self, end: Mapping[str, Any] | None = None) -> pa.Schema:
        """The declared schema (``parser_schema`` with a parser) nullable: a line or row missing a required field is a dead letter."""
        declared = self.parser_schema if self.parser is not None else self.schema
        assert declared is not None
        return jsonl.record_schema(declared)

    def splits(self, end: Mapping[str, Any], source_index: int, split_bytes: int | None) -> list[Split]:
        """The barrier's files (``[name, from_line, to_line, size]``, ``file_index`` their position) as splits, unopened.

        A whole JSON Lines file larger than ``split_bytes`` is cut into byte ranges of that size (a line range, a
        Parquet file stays whole); the pieces are :func:`~barrierflow.connectors.source.packed`. Late files
        (``end["late"]``, ``[name, size]``) go in the first split.
        """
        base = normalize_uri(self.path)
        parts: list[FileRange] = []
        for file_index, (name, from_line, to_line, size) in enumerate(end.get("files") or []):
            uri = join_uri(base, name)
            if split_bytes is not None and self.format == "jsonl" and from_line == 0 and to_line is None and size > split_bytes:
                parts += [
                    FileRange(name, uri, size, file_index, byte_start=at, byte_end=min(size, at + split_bytes))
                    for at in range(0, size, split_bytes)
                ]
            else:
                parts.append(FileRange(name, uri, size, file_index, from_line, to_line))
        late = tuple((str(name), int(size)) for name, size in end.get("late") or [])
        groups = packed(parts, split_bytes) or ([[]] if late else [])
        return [Split(source_index, tuple(group), late if i == 0 else ()) for i, group in enumerate(groups)]

    def read(self, split: Split, keys: Mapping[str, str]) -> tuple[pa.Table, pa.Table]:
        """A task's records of ``split`` (:meth:`record_schema`, then ``_seq``) and dead letters: steps 1-4 of the module docstring.

        ``keys`` not among the record's fields are not this source's to check. A late file is one ``late_file`` dead
        letter, without a line; it is never opened.
        """
        schema = self.record_schema()
        keys = {k: op for k, op in keys.items() if k in schema.names}
        parts = []
        for part in split.files:
            with open_file(self.source_id, part) as handle:  # 1.
                rows = self._parquet_rows if self.format == "parquet" else self._jsonl_rows
                parts.append(rows(handle, part, split.source_index, keys))
        detail = "landed after the stream had passed its name ({} bytes, never read)"
        late = [(name, None, None, problem(DeadLetterReason.LATE_FILE, detail.format(size))) for name, size in split.late]
        return gathered(schema, parts, file_dead_letters(self.source_id, late))

    def _jsonl_rows(
        self, handle: pa.NativeFile, part: FileRange, source_index: int, keys: Mapping[str, str]
    ) -> tuple[pa.Table, pa.Table]:
        """2.-4. for JSON Lines: the lines ``part`` owns, parsed against ``schema`` or by the line parser."""
        first_line, data = owned_lines(handle, part)  # 2.
        if self.parser is None:  # 3.
            assert self.schema is not None
            parsed = jsonl.parse_lines(data, self.schema, keys, first_line=first_line, file_start=first_line == 1)
            records, lines = parsed.records.drop_columns([jsonl.LINE]), parsed.records[jsonl.LINE].to_numpy()
            dead = list(zip(parsed.dead_lines, parsed.dead_raw, parsed.dead_problems))
        else:
            assert self.parser_schema is not None
            texts, numbers, errors = lines_of(data, first_line)
            columns, kept, errors = _parser_records(self.parser, self.parser_schema, keys, texts, errors)
            records, lines = pa.Table.from_arrays(columns, schema=self.record_schema()), numbers[kept]
            dead = [(int(numbers[i]), texts[i], errors[i] or "") for i in np.flatnonzero(~kept).tolist()]
        seq = arrival_seq(source_index, part.file_index, lines)  # 4.
        return records.append_column(SEQ, seq), file_dead_letters(self.source_id, [(part.name, *d) for d in dead])

    def _parquet_rows(
        self, handle: pa.NativeFile, part: FileRange, source_index: int, keys: Mapping[str, str]
    ) -> tuple[pa.Table, pa.Table]:
        """The rows of a Parquet file's range as ``schema``: 1. a file that is not readable Parquet, or whose columns do not
        read as the schema's (:func:`schema_mismatches`), is one dead letter without a line (the epoch goes on); 2. the
        range's rows (only the row groups holding them), widened; 3. rows missing a required field or a key are dead
        letters.
        """
        assert self.schema is not None
        no_records = self.record_schema().append(pa.field(SEQ, pa.int64())).empty_table()
        # 1.
        try:
            parquet = pq.ParquetFile(handle)
            found = parquet.schema_arrow
        except (OSError, pa.ArrowException) as exc:
            detail = f"not a readable Parquet file: cannot read the Parquet footer of {part.uri}: {exc}"
            return no_records, file_dead_letters(
                self.source_id, [(part.name, None, None, problem(DeadLetterReason.UNREADABLE_FILE, detail))]
            )
        mismatches = schema_mismatches(self.schema, found, absent_nullable_ok=True)
        if mismatches:
            text = ", ".join(f"{f.name} {f.type}{'' if f.nullable else ' not null'}" for f in found)
            detail = problem(DeadLetterReason.INCOMPATIBLE_SCHEMA, "; ".join(m.describe() for m in mismatches))
            return no_records, file_dead_letters(self.source_id, [(part.name, None, text, detail)])
        # 2.
        try:
            rows = read_as(parquet, self.record_schema(), part.from_line, part.to_line)
        except (OSError, pa.ArrowException) as exc:
            raise SourceError(f"source {self.source_id}: cannot read the rows of Parquet file {part.name}: {exc}") from exc
        return checked_rows(self.source_id, part, rows, self.schema, keys, source_index)  # 3.


def _unread(start: Mapping[str, Any] | None, names: Iterable[str]) -> list[tuple[str, int]]:
    """The files of ``names`` after the position ``start`` (the one partly read included), in name order, with the lines read."""
    position: Mapping[str, Any] = start or {}
    pos_file, pos_line = position.get("file"), position.get("line")
    after = [n for n in sorted(names) if pos_file is None or n > pos_file or (n == pos_file and pos_line is not None)]
    return [(n, (pos_line or 0) if n == pos_file else 0) for n in after]


def owned_lines(handle: pa.NativeFile, part: FileRange) -> tuple[int, bytes]:
    """(number of the first line, bytes of the lines ``part`` owns, split on ``\n``), reading only what that needs.

    A line range is found by scanning from the file's start; a byte range owns the lines starting in it, the last read
    to its end, the first numbered by counting the newlines of ``[0, byte_start)`` (files are cut only when larger than
    a split).
    """
    size = part.size
    if part.byte_end is None:
        start, _ = _through_lines(handle, 0, size, part.from_line, keep=False)
        if part.to_line is None:
            return part.from_line + 1, handle.read_at(size - start, start) if start < size else b""
        return part.from_line + 1, _through_lines(handle, start, size, part.to_line - part.from_line)[1]
    begin, end = part.byte_start, min(part.byte_end, size)
    first, line = 0, 1
    if begin > 0:
        newlines, last = 0, b""
        for block in _blocks(handle, 0, begin):
            newlines, last = newlines + block.count(b"\n"), block[-1:]
        if last == b"\n":
            first, line = begin, 1 + newlines
        else:  # the line holding byte_start - 1 belongs to the range before
            first, line = _through_lines(handle, begin, size, 1, keep=False)[0], 2 + newlines
    if first >= end:
        return line, b""
    data = handle.read_at(end - first, first)
    if not data.endswith(b"\n") and end < size:
        data += _through_lines(handle, end, size, 1)[1]  # the rest of the last line that starts in the range
    return line, data


def _blocks(handle: pa.NativeFile, start: int, stop: int) -> Iterator[bytes]:
    """Bytes ``[start, stop)`` of a file, _BLOCK_BYTES at a time (read as they are asked for)."""
    for pos in range(start, stop, _BLOCK_BYTES):
        yield handle.read_at(min(_BLOCK_BYTES, stop - pos), pos)


def _through_lines(handle: pa.NativeFile, start: int, size: int, count: int, keep: bool = True) -> tuple[int, bytes]:
    """From ``start`` to right after the ``count``-th newline (or the file's end): the offset there, and the bytes if ``keep``."""
    pos, kept = start, []
    for block in _blocks(handle, start, size if count > 0 else start):
        found = block.count(b"\n")
        if found >= count:
            block = block[: int(np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)[count - 1]) + 1]
        pos, count = pos + len(block), count - found
        kept += [block] if keep else []
        if count <= 0:
            break
    return pos, b"".join(kept)


def lines_of(data: bytes, first_line: int) -> tuple[list[str], np.ndarray, list[str | None]]:
    """The non-blank lines of ``data`` for a line parser: texts, numbers (from ``first_line``), decoding problems.

    Lines split on ``\n`` (a final one ends the last line), one trailing ``\r`` dropped; one not UTF-8 is an
    ``invalid_utf8`` problem (its text with U+FFFD); one of Unicode ``White_Space`` only is skipped.
    """
    pieces = pc.list_flatten(pc.split_pattern(pa.array([data], pa.large_binary()), b"\n"))
    if data.endswith(b"\n"):
        pieces = pieces.slice(0, len(pieces) - 1)  # a trailing newline ends a line, it does not start one
    pieces = pc.replace_substring_regex(pieces, pattern="\r$", replacement="")
    errors: list[str | None]
    try:
        text, errors = pieces.cast(pa.large_string()), [None] * len(pieces)
    except pa.ArrowInvalid:
        decoded = [jsonl.decoded(raw) for raw in pieces.to_pylist()]
        text, errors = pa.array([t for t, _ in decoded], pa.large_string()), [e for _, e in decoded]
    at = np.flatnonzero(np.asarray(pc.not_equal(pc.utf8_trim_whitespace(text), "").to_numpy(zero_copy_only=False), dtype=bool))
    return text.take(at).to_pylist(), at + first_line, [errors[i] for i in at.tolist()]


def _parser_records(
    parser: LineParser, declared: pa.Schema, keys: Mapping[str, str], texts: list[str], errors: list[str | None]
) -> tuple[list[pa.Array], np.ndarray, list[str | None]]:
    """Run the line parser over a task's lines; a line it refuses, or whose record does not fit, is a dead letter.

    Returns the records' columns, which lines are records, and each line's problem (None: a record; a line with one
    already is not parsed), the first of:

    1. the parser raised :class:`RecordError` (its reason, its message or "invalid record") or anything else
       (``parser_failed``: the exception);
    2. it returned something other than a mapping (``parser_failed``);
    3.-4. :func:`~barrierflow.core.dead_letters.record_problems`: a non-nullable field missing or null, a key null,
       missing or "";
    5. a value not of its field's type (``wrong_type``; never coerced: an int64 takes ints only, not 1.5 or True; a
       double ints and floats; a string str; a bool bool; a timestamp datetime; other types what pyarrow converts
       exactly), the first such field in schema order.
    """
    rows: dict[int, Mapping[str, Any]] = {}
    for i, text in enumerate(texts):
        if errors[i] is not None:
            continue
        try:  # 1.
            row = parser(text)
        except RecordError as exc:
            errors[i] = problem(exc.reason, str(exc) or "invalid record")
        except Exception as exc:  # a parser bug must not crash the epoch
            errors[i] = problem(DeadLetterReason.PARSER_FAILED, f"{type(exc).__name__}: {exc}")
        else:
            if type(row) is dict or isinstance(row, Mapping):
                rows[i] = row
            else:  # 2.
                errors[i] = problem(DeadLetterReason.PARSER_FAILED, f"the parser returned a {type(row).__name__}, not a mapping")
    values = {f.name: list(map(operator.methodcaller("get", f.name), rows.values())) for f in declared}
    checked = dict.fromkeys([f.name for f in declared if not f.nullable] + sorted(keys))
    seen = pa.table({name: _presence(values[name]) for name in checked})  # 3.-4.
    found: list[str | None] = record_problems(seen, declared, keys) if checked else [None] * len(rows)
    live = np.flatnonzero(_none(found)).tolist()
    columns = []
    for f in declared:  # 5.
        array, wrong = _converted(list(map(values[f.name].__getitem__, live)), f)
        for at, value in wrong.items():
            j = live[at]
            found[j] = found[j] or problem(DeadLetterReason.WRONG_TYPE, f"{f.name}: {str(value)[:100]} is not {f.type}")
        columns.append(array)
    ok, parsed, kept = _none(found), np.fromiter(rows, dtype=np.int64, count=len(rows)), np.zeros(len(texts), dtype=bool)
    for j in np.flatnonzero(~ok).tolist():
        errors[parsed[j]] = found[j]
    kept[parsed[ok]] = True
    return [c.filter(pa.array(ok[live])) for c in columns], kept, errors


def _none(values: list[Any]) -> np.ndarray:
    return np.fromiter(map(operator.is_, values, repeat(None)), dtype=bool, count=len(values))


def _presence(column: list[Any]) -> pa.Array:
    """What checks 3 and 4 see of each value: null, empty or other."""
    empty = [v == "" for v in column] if "" in column else [False] * len(column)
    return pa.array(np.where(empty, "", "x"), mask=_none(column))


def _converted(values: list[Any], f: pa.Field) -> tuple[pa.Array, dict[int, Any]]:
    """``values`` as an array of ``f``'s type; those that are not of it (by position) are null there."""
    accepted = next((kinds for test, kinds in _PYTHON_TYPES if test(f.type)), None)
    wrong: dict[int, Any] = {}
    if accepted is not None and not set(map(type, values)) <= {*accepted, type(None)}:
        wrong = {j: v for j, v in enumerate(values) if v is not None and not isinstance(v, accepted)}
        wrong.update({j: v for j, v in enumerate(values) if isinstance(v, bool) and bool not in accepted})
    try:
        return pa.array([None if j in wrong else v for j, v in enumerate(values)] if wrong else values, type=f.type), wrong
    except _CONVERSION_ERRORS:
        pass
    for j, value in enumerate(values):  # some value does not convert: that value's line is a dead letter
        try:
            pa.array([value], type=f.type)
        except _CONVERSION_ERRORS:
            wrong[j] = value
    return pa.array([None if j in wrong else v for j, v in enumerate(values)], type=f.type), wrong


_PYTHON_TYPES = [
    (pa.types.is_integer, (int,)),
    (pa.types.is_floating, (int, float)),
    (pa.types.is_string, (str,)),
    (pa.types.is_large_string, (str,)),
    (pa.types.is_boolean, (bool,)),
    (pa.types.is_timestamp, (datetime.datetime,)),
]  # which Python values a parser may return for a field of a type (a bool is no number); others: what pyarrow converts


def count_records_on_executors(spark: "SparkSession", uris: Sequence[str], fmt: str) -> dict[str, int]:
    """Records in each file (lines of JSON Lines, rows of Parquet), counted by executor tasks, one per file."""
    if not uris:
        return {}

    def counted(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            names = batch.column("uri").to_pylist()
            records = [count_records(uri, fmt) for uri in names]
            yield pa.RecordBatch.from_pydict({"uri": names, "records": records}, schema=_COUNTED)

    files = spark.createDataFrame([(uri,) for uri in uris], "uri string").repartition(len(uris))
    return {row["uri"]: int(row["records"]) for row in files.mapInArrow(counted, "uri string, records long").collect()}


def count_records(uri: str, fmt: str) -> int:
    """Records in one file, where it is read (an executor task)."""
    if fmt == "parquet":
        try:
            with objects.open_input(uri) as fh:
                return int(pq.ParquetFile(fh).metadata.num_rows)
        except (OSError, pa.ArrowInvalid):
            return 0  # not Parquet: taken whole, and dead-lettered whole when read
    return _count_lines(uri)


def _count_lines(path: str) -> int:
    count, last = 0, b"\n"
    with objects.open_input(path) as fh:
        while block := fh.read(_BLOCK_BYTES):
            count, last = count + block.count(b"\n"), block[-1:]
    return count + (last != b"\n")
