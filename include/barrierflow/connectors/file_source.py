"""A landing-directory file source with per-file line positions as offsets.

Files are taken in lexicographic name order; names starting with ``.`` or
``_`` are still being written and are ignored. Offsets are the position after
the last record consumed: ``{"file": name, "line": lines consumed in it or
None when the whole file is consumed}``. A barrier also lists the exact file
ranges of its epoch, so replay never depends on listing the directory again.

Planning (:meth:`FileSource.plan`) lists and stats files, never reads them.
Reading happens in Python tasks on the executors, each given a
:class:`~barrierflow.connectors.source.Split` of the barrier's files
(:meth:`FileSource.splits`, from the offsets alone) and reading it with
Arrow through pyarrow's file systems, local and ``s3://`` alike
(:meth:`FileSource.read`):

1. Each file is opened and checked against its barrier: gone is a
   :class:`BlockedInputError`, a size other than the recorded one fails
   the epoch (a landed file never changes).
2. The task reads only the bytes of the lines it owns: a line range (lines
   ``from_line + 1`` to ``to_line``, as ``max_records_per_epoch`` cuts them),
   the lines starting in a byte range (a large whole file cut by
   ``split_bytes``), or the whole file.
3. JSON Lines with ``schema=`` are parsed by
   :func:`barrierflow.connectors.jsonl.parse_lines`; with ``parser=`` each
   non-blank line goes through the user's parser and what it returns is
   checked and converted column by column (:func:`_parser_records`);
   Parquet rows are read as ``schema`` (:meth:`FileSource._parquet_rows`).
4. What is not a record becomes a dead letter with its file and line;
   records get ``_seq`` from (source index, file index, line).
"""

from __future__ import annotations

import datetime
import enum
import functools
import operator
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from barrierflow.connectors import jsonl
from barrierflow.connectors.schema_check import read_as, schema_mismatches
from barrierflow.connectors.source import (
    Backlog,
    FileRange,
    RecordCounter,
    Split,
    checked_rows,
    no_dead_letters,
    open_file,
    packed,
    whole_file_dead_letters,
)
from barrierflow.core.columns import SEQ, arrival_seq
from barrierflow.core.dead_letters import DeadLetterReason, dead_letter_rows, key_problem, problem
from barrierflow.core.errors import BlockedInputError, PipelineDefinitionError, SourceError
from barrierflow.storage import objects
from barrierflow.storage.objects import join_uri, normalize_uri

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["FileSource", "LateFiles", "RecordError", "LineParser", "count_records", "count_records_on_executors"]

# Files counted per planning job: enough for both cores of a small cluster, few beyond the record budget.
_COUNT_BATCH_FILES = 8
# Bytes read at a time when scanning for newlines (a range's prefix, a line range's start).
_BLOCK_BYTES = 8 * 1024 * 1024


class RecordError(ValueError):
    """Raised by a line parser: the line is a dead letter with this ``reason`` code and the message as its detail."""

    def __init__(self, detail: str, reason: DeadLetterReason = DeadLetterReason.INVALID_RECORD) -> None:
        super().__init__(detail)
        self.reason = reason


LineParser = Callable[[str], Mapping[str, Any]]


class LateFiles(str, enum.Enum):
    """What a file source does with a file landing with a name at or before its position (already passed).

    Barriers record their epochs' file lists, so taking such a file later is
    as exactly-once as taking it in order; only the arrival order differs.
    """

    NEXT_EPOCH = "next_epoch"  # the default: read it whole in the next epoch, ahead of the files after the position
    DEAD_LETTER = "dead_letter"  # one dead letter for the whole file (reason late_file); it is never read
    REFUSE = "refuse"  # the pipeline is blocked (BlockedInputError) until the file is moved


@dataclass(frozen=True)
class FileSource:
    """Replayable source over files landing in a directory.

    Exactly one of ``schema`` (JSON parsed against this schema by
    :func:`barrierflow.connectors.jsonl.parse_lines`) or ``parser`` (a Python
    function validating one line; ``parser_schema`` is the schema of what it
    returns) is used for JSON Lines. Parquet files are read as ``schema``: a
    file whose columns do not fit it is a dead letter as a whole (see
    :meth:`_parquet_rows`).

    ``max_records_per_epoch`` cuts epochs inside files, as ranges of lines
    (rows). Planning then needs the records of the files it may take: the
    checkpoint coordinator counts them with executor tasks (a small Spark job,
    :func:`count_records_on_executors`), so the planner never reads input.
    In the Airflow DAG's spark-submit mode the barrier task then starts a Spark
    application for that job (``$BARRIERFLOW_SPARK_MASTER``, or ``local[*]``).
    """

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
        if self.late_file_window < 1:
            raise PipelineDefinitionError(f"source {self.source_id}: late_file_window must be >= 1")
        if self.format not in ("jsonl", "parquet"):
            raise PipelineDefinitionError(f"source {self.source_id}: format must be 'jsonl' or 'parquet'")
        if self.format == "jsonl" and (self.parser is None) == (self.schema is None):
            raise PipelineDefinitionError(
                f"source {self.source_id}: give exactly one of schema= (native JSON parsing) "
                "or parser= with parser_schema= (Python validation)"
            )
        if self.format == "parquet" and (self.schema is None or self.parser is not None):
            # As Spark's streaming file source: files landing later must not change the records' schema.
            raise PipelineDefinitionError(
                f"source {self.source_id}: a Parquet source needs schema= (the columns and types of its records; "
                "a file that does not fit it is dead-lettered whole) and takes no parser="
            )
        if self.parser is not None and self.parser_schema is None:
            raise PipelineDefinitionError(f"source {self.source_id}: parser= needs parser_schema=")
        if self.max_files_per_epoch < 1:
            raise PipelineDefinitionError(f"source {self.source_id}: max_files_per_epoch must be >= 1")
        if self.max_records_per_epoch is not None and self.max_records_per_epoch < 1:
            raise PipelineDefinitionError(f"source {self.source_id}: max_records_per_epoch must be >= 1")

    # -- planning ---------------------------------------------------------

    @property
    def _suffixes(self) -> tuple[str, ...]:
        return self.suffixes or ((".jsonl", ".json") if self.format == "jsonl" else (".parquet",))

    def _listing(self) -> list[objects.StoredFile]:
        """Every complete input file in the landing directory (see :meth:`_arrivals`)."""
        directory = normalize_uri(self.path)
        if objects.is_local(directory) and not objects.exists(directory):
            raise SourceError(
                f"source {self.source_id}: landing directory {directory} does not exist; "
                "create it or pass --param landing_dir=<existing directory>"
            )
        return [
            found
            for found in objects.list_files(directory)
            if not found.path.startswith((".", "_")) and found.path.endswith(self._suffixes)
        ]

    def _arrivals(self, arrival_cutoff_ms: int | None) -> dict[str, int]:
        """Name -> arrival (modification time, ns) of every complete file that arrived by the cut-off.

        Names starting with '.' or '_' are files still being written (or
        not data); an object store's PUT is atomic, so there every listed
        object is complete. S3 keeps modification times in whole seconds.
        """
        arrived = {}
        for found in self._listing():
            if arrival_cutoff_ms is not None and found.modified_ns > arrival_cutoff_ms * 1_000_000:
                continue
            arrived[found.path] = found.modified_ns
        return arrived

    def _late_files(self, start: Mapping[str, Any] | None, arrivals: Mapping[str, int]) -> tuple[list[str], int]:
        """Files that landed behind the stream position since it passed them: (the ones named, how many in all).

        Files are read in name order, so a file sorting at or before the
        position that was not read landed late. The offsets count the files
        read (``consumed``) and keep the :attr:`late_file_window` largest
        names read (``recent``): a file unread but within that window is
        named; one further behind is only counted.
        """
        if not start or start.get("file") is None:
            return [], 0
        pos_file, consumed = start["file"], int(start.get("consumed", 0))
        behind = [name for name in arrivals if name <= pos_file]
        unread = len(behind) - consumed
        if unread <= 0:
            return [], 0
        recent = start.get("recent") or []
        # Every name read is in ``recent`` until the window fills; after that, those from its first on.
        floor = "" if len(recent) >= consumed else (recent[0] if recent else None)
        known = set(recent)
        named = sorted(n for n in behind if floor is not None and n >= floor and n not in known)
        return named, max(unread, len(named))

    def _refuse_late(self, named: list[str], count: int, pos_file: str) -> BlockedInputError:
        shown = ", ".join(repr(n) for n in named[:5]) + (f" and {len(named) - 5} more" if len(named) > 5 else "")
        unnamed = count - len(named)
        what = f"file(s) {shown}" if named else ""
        if unnamed > 0:
            what += (" and " if what else "") + (
                f"{unnamed} file(s) too far behind to tell from files already read (only the last "
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
        pos_file = start["file"] if start else None
        pos_line = start["line"] if start else None
        arrivals = self._arrivals(arrival_cutoff_ms)
        waiting = [
            mtime_ns
            for name, mtime_ns in arrivals.items()
            if pos_file is None or name > pos_file or (name == pos_file and pos_line is not None)
        ]
        named, count = self._late_files(start, arrivals)
        # Late files are input too (refused ones as well: planning then says why).
        if count:
            late = [arrivals[n] for n in named] if count == len(named) else [t for n, t in arrivals.items() if n <= str(pos_file)]
            waiting += late
        # Rounded up: a cut-off at this millisecond still takes the file.
        return -(-min(waiting) // 1_000_000) if waiting else None

    def plan(
        self, start: Mapping[str, Any] | None, arrival_cutoff_ms: int | None, counter: RecordCounter | None = None
    ) -> dict[str, Any]:
        """End offsets: the next files in name order, files that landed behind the position by ``late_files``.

        1. Late files (see :meth:`_late_files`): refused with a
           :class:`BlockedInputError`, or taken whole in this epoch (ahead of
           the others), or listed under ``late`` as whole-file dead letters.
           A file too far behind to be named is always refused.
        2. The files after the position, up to ``max_files_per_epoch`` and
           ``max_records_per_epoch``, as ranges of lines (rows); ``counter``
           counts the records of the files this may take, a few at a time.
        3. The new position: the last range's end; ``consumed`` and
           ``recent`` take every file read or dead-lettered.
        """
        pos_file = start["file"] if start else None
        pos_line = start["line"] if start else None
        consumed = int(start.get("consumed", 0)) if start else 0
        recent = list(start.get("recent") or []) if start else []
        arrivals = self._arrivals(arrival_cutoff_ms)
        eligible = sorted(arrivals)
        base = normalize_uri(self.path)
        # 1. Late files.
        named, count = self._late_files(start, arrivals)
        if count and (self.late_files is LateFiles.REFUSE or count > len(named)):
            raise self._refuse_late(named, count, str(pos_file))
        sizes = {name: objects.file_size(join_uri(base, name)) for name in named}
        taken = [[n, 0, None, sizes[n]] for n in named] if self.late_files is LateFiles.NEXT_EPOCH else []
        dead = [[n, sizes[n]] for n in named] if self.late_files is LateFiles.DEAD_LETTER else []
        # 2. The files after the position.
        remaining: list[tuple[str, int]] = []
        for name in eligible:
            if pos_file is None or name > pos_file:
                remaining.append((name, 0))
            elif name == pos_file and pos_line is not None:
                remaining.append((name, pos_line))
        ranges: list[list[Any]] = []
        budget = self.max_records_per_epoch
        candidates = remaining[: self.max_files_per_epoch]
        counts: dict[str, int] = {}
        for i, (name, from_line) in enumerate(candidates):
            full = join_uri(base, name)
            if budget is None:
                ranges.append([name, from_line, None, objects.file_size(full)])
                continue
            if full not in counts:
                counts.update(self._counted([join_uri(base, n) for n, _ in candidates[i : i + _COUNT_BATCH_FILES]], counter))
            available = counts[full] - from_line
            if available <= budget:
                ranges.append([name, from_line, None, objects.file_size(full)])
                budget -= available
            else:
                ranges.append([name, from_line, from_line + budget, objects.file_size(full)])
                budget = 0
            if budget == 0:
                break
        # 3. The new position.
        new_names = named + [name for name, *_ in ranges if name != pos_file]
        if ranges:
            pos_file, _, pos_line, _ = ranges[-1]
        end: dict[str, Any] = {
            "file": pos_file,
            "line": pos_line,
            "files": taken + ranges,
            "consumed": consumed + len(new_names),
            "recent": sorted(set(recent).union(new_names))[-self.late_file_window :],
        }
        if dead:
            end["late"] = dead
        return end

    def has_records(self, end: Mapping[str, Any]) -> bool:
        return bool(end.get("files") or end.get("late"))

    def backlog(self, end: Mapping[str, Any] | None) -> Backlog:
        """Files after the position (the one partly read included) and late files not yet taken."""
        listing = self._listing()
        pos_file = end["file"] if end else None
        pos_line = end["line"] if end else None
        named, _ = self._late_files(end, {f.path: f.modified_ns for f in listing})
        waiting = [
            f
            for f in listing
            if pos_file is None or f.path > pos_file or (f.path == pos_file and pos_line is not None) or f.path in named
        ]
        oldest = min((f.modified_ns for f in waiting), default=None)
        return Backlog(len(waiting), sum(f.size for f in waiting), -(-oldest // 1_000_000) if oldest is not None else None)

    def _counted(self, uris: list[str], counter: RecordCounter | None) -> Mapping[str, int]:
        if counter is None:
            raise SourceError(
                f"source {self.source_id}: max_records_per_epoch needs the records of the files counted by executors: "
                "plan epochs through the checkpoint coordinator (or pass plan() a counter)"
            )
        counts = counter(uris, self.format)
        if set(counts) != set(uris):
            raise SourceError(f"source {self.source_id}: records counted for {sorted(counts)}, asked for {sorted(uris)}")
        return counts

    def describe(self) -> dict[str, Any]:
        return {"type": "file", "id": self.source_id, "format": self.format, "path": self.path}

    # -- reading ----------------------------------------------------------

    def record_schema(self, end: Mapping[str, Any] | None = None) -> pa.Schema:
        """The records' columns, every field nullable (as the Spark reads of old gave them).

        JSON Lines with ``schema``: :func:`jsonl.record_schema`; with a
        ``parser``: ``parser_schema``'s fields; Parquet: ``schema``'s fields
        (Spark's file sources read every column as nullable). A non-nullable
        field is still enforced: a line or row without it is a
        ``missing_field`` dead letter, never a record.
        """
        if self.format == "jsonl" and self.schema is not None:
            return jsonl.record_schema(self.schema)
        declared = self.parser_schema if self.parser is not None else self.schema
        assert declared is not None
        return pa.schema([f.with_nullable(True) for f in declared])

    def splits(self, end: Mapping[str, Any], source_index: int, split_bytes: int | None) -> list[Split]:
        """The barrier's files as tasks' splits, from the offsets alone (no input file is opened).

        ``end["files"]`` are ``[name, from_line, to_line, size]`` in reading
        order; a file's ``file_index`` is its position there. With
        ``split_bytes`` None, one split holds every file. Otherwise a whole
        JSON Lines file larger than ``split_bytes`` is cut into byte ranges of
        ``split_bytes`` (the last one shorter), each owning the lines that
        start in it; a line range, and a Parquet file, stays whole. The pieces
        are then packed in reading order into splits of about ``split_bytes``
        (:func:`~barrierflow.connectors.source.packed`). Files set aside as
        late (``end["late"]``, ``[name, size]``) go in the first split.
        """
        base = normalize_uri(self.path)
        parts: list[FileRange] = []
        for file_index, (name, from_line, to_line, size) in enumerate(end.get("files") or []):
            uri = join_uri(base, name)
            if split_bytes is not None and self.format == "jsonl" and from_line == 0 and to_line is None and size > split_bytes:
                for start in range(0, size, split_bytes):
                    parts.append(
                        FileRange(name, uri, size, file_index, byte_start=start, byte_end=min(size, start + split_bytes))
                    )
            else:
                parts.append(FileRange(name, uri, size, file_index, from_line, to_line))
        late = tuple((str(name), int(size)) for name, size in end.get("late") or [])
        groups = packed(parts, split_bytes)
        if late and not groups:
            groups = [[]]
        return [Split(source_index, tuple(group), late if i == 0 else ()) for i, group in enumerate(groups)]

    def read(self, split: Split, keys: Mapping[str, str]) -> tuple[pa.Table, pa.Table]:
        """A task's records of ``split`` (:meth:`record_schema`, then ``_seq``) and its dead letters.

        Steps 1-4 of the module docstring, file by file in the split's
        order; ``keys`` not among the record's fields are not this source's
        to check. A late file (``late_files='dead_letter'``) is one
        ``late_file`` dead letter, without a line; it is never opened.
        """
        schema = self.record_schema()
        keys = {k: op for k, op in keys.items() if k in schema.names}
        records: list[pa.Table] = []
        dead: list[pa.Table] = []
        for part in split.files:
            # 1. Opened and checked against the barrier.
            with open_file(self.source_id, part) as handle:
                if self.format == "parquet":
                    got, lost = self._parquet_rows(handle, part, split.source_index, keys)
                else:
                    # 2. The bytes of the lines this task owns.
                    first_line, data = owned_lines(handle, part)
                    # 3.-4.
                    if self.parser is None:
                        got, lost = self._json_records(data, first_line, part, split.source_index, keys)
                    else:
                        got, lost = self._parsed_records(data, first_line, part, split.source_index, keys)
            records.append(got)
            dead.append(lost)
        if split.late:
            dead.append(
                whole_file_dead_letters(
                    self.source_id,
                    [
                        (
                            name,
                            None,
                            problem(
                                DeadLetterReason.LATE_FILE,
                                f"landed after the stream had passed its name ({size} bytes, never read)",
                            ),
                        )
                        for name, size in split.late
                    ],
                )
            )
        out = schema.append(pa.field(SEQ, pa.int64()))
        return (
            pa.concat_tables(records) if records else out.empty_table(),
            pa.concat_tables(dead) if dead else no_dead_letters(),
        )

    def _json_records(
        self, data: bytes, first_line: int, part: FileRange, source_index: int, keys: Mapping[str, str]
    ) -> tuple[pa.Table, pa.Table]:
        """3. JSON Lines against ``schema``: :func:`jsonl.parse_lines`' records and dead lines."""
        assert self.schema is not None
        schema = self.record_schema()
        parsed = jsonl.parse_lines(data, self.schema, keys, first_line=first_line, file_start=first_line == 1)
        rows = parsed.records
        lines = np.asarray(rows["_line"].to_numpy(), dtype=np.int64)
        records = rows.select(schema.names).cast(schema).append_column(SEQ, arrival_seq(source_index, part.file_index, lines))
        dead_lines = _plain_list(parsed.dead_lines)
        dead = dead_letter_rows(
            self.source_id,
            [part.name] * len(dead_lines),
            dead_lines,
            _plain_list(parsed.dead_raw),
            _plain_list(parsed.dead_problems),
        )
        return records, dead

    def _parsed_records(
        self, data: bytes, first_line: int, part: FileRange, source_index: int, keys: Mapping[str, str]
    ) -> tuple[pa.Table, pa.Table]:
        """3. JSON Lines through the line parser (:func:`_parser_records`)."""
        assert self.parser is not None and self.parser_schema is not None
        schema = self.record_schema()
        texts, numbers, errors = lines_of(data, first_line)
        columns, kept, errors = _parser_records(self.parser, self.parser_schema, keys, texts, errors)
        lines = numbers[kept]
        records = pa.Table.from_arrays(
            [*columns, arrival_seq(source_index, part.file_index, lines)], schema=schema.append(pa.field(SEQ, pa.int64()))
        )
        dead_at = np.flatnonzero(~kept).tolist()
        dead = dead_letter_rows(
            self.source_id,
            [part.name] * len(dead_at),
            numbers[dead_at].tolist(),
            list(map(texts.__getitem__, dead_at)),
            [errors[i] or "" for i in dead_at],
        )
        return records, dead

    def _parquet_rows(
        self, handle: pa.NativeFile, part: FileRange, source_index: int, keys: Mapping[str, str]
    ) -> tuple[pa.Table, pa.Table]:
        """The rows of a Parquet file's range as ``schema``; a file that cannot be read so is one dead letter.

        1. The footer: a file that is not readable Parquet, or whose
           columns do not read as the schema's (:func:`schema_mismatches`:
           a narrower type of the same kind is widened, an extra column is
           ignored, an absent nullable one reads as null), becomes one dead
           letter for the whole file, without a line; the epoch goes on.
        2. The range's rows (only the row groups holding them), widened.
        3. Rows missing a required field or a key are dead letters
           (:func:`~barrierflow.core.dead_letters.record_problems`), their
           ``line`` the row's number in its file from 1, ``raw`` the row as JSON.
        """
        assert self.schema is not None
        # 1.
        try:
            parquet = pq.ParquetFile(handle)
            found = parquet.schema_arrow
        except (OSError, pa.ArrowException) as exc:
            detail = f"not a readable Parquet file: cannot read the Parquet footer of {part.uri}: {exc}"
            return self._no_records(), whole_file_dead_letters(
                self.source_id, [(part.name, None, problem(DeadLetterReason.UNREADABLE_FILE, detail))]
            )
        mismatches = schema_mismatches(self.schema, found, absent_nullable_ok=True)
        if mismatches:
            detail = "; ".join(m.describe() for m in mismatches)
            return self._no_records(), whole_file_dead_letters(
                self.source_id, [(part.name, _schema_text(found), problem(DeadLetterReason.INCOMPATIBLE_SCHEMA, detail))]
            )
        # 2.
        try:
            rows = read_as(parquet, self.record_schema(), part.from_line, part.to_line)
        except (OSError, pa.ArrowException) as exc:
            raise SourceError(f"source {self.source_id}: cannot read the rows of Parquet file {part.name}: {exc}") from exc
        lines = np.arange(part.from_line + 1, part.from_line + 1 + rows.num_rows, dtype=np.int64)
        # 3.
        return checked_rows(self.source_id, part, rows, self.schema, keys, lines, source_index)

    def _no_records(self) -> pa.Table:
        return self.record_schema().append(pa.field(SEQ, pa.int64())).empty_table()


def _schema_text(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {f.type}{'' if f.nullable else ' not null'}" for f in schema)


def _plain_list(values: Any) -> list[Any]:
    """Python values of a list, tuple, numpy or Arrow array."""
    if hasattr(values, "to_pylist"):
        return list(values.to_pylist())
    if isinstance(values, np.ndarray):
        return list(values.tolist())
    return list(values)


# -- a task's lines --------------------------------------------------------------


def owned_lines(handle: pa.NativeFile, part: FileRange) -> tuple[int, bytes]:
    """(number of the first line, bytes of the lines ``part`` owns), reading only what that needs.

    - whole file: every byte;
    - line range ``[from_line, to_line)`` (offsets as a barrier records
      them; lines split on ``\n``, a final ``\n`` ending the last line): the
      bytes from the start of line ``from_line + 1`` to the end of line
      ``to_line``, found by scanning from the file's start;
    - byte range: the lines that start in ``[byte_start, byte_end)``, the
      last one read to its end even past ``byte_end``. The first one's
      number is one plus the newlines before it: counted by reading the
      prefix ``[0, byte_start)``, so a range costs O(its offset) reads on top
      of its own bytes (a file is cut only when larger than a split).
    """
    size = part.size
    if part.byte_end is None:
        if part.from_line == 0 and part.to_line is None:
            return 1, handle.read_at(size, 0) if size else b""
        start = _after_newlines(handle, 0, size, part.from_line)
        if part.to_line is None:
            return part.from_line + 1, handle.read_at(size - start, start) if start < size else b""
        return part.from_line + 1, _lines_from(handle, start, size, part.to_line - part.from_line)
    begin, end = part.byte_start, min(part.byte_end, size)
    if begin == 0:
        first, line = 0, 1
    else:
        newlines, last = _newlines_before(handle, begin)
        if last == b"\n":
            first, line = begin, 1 + newlines
        else:  # the line holding byte_start - 1 belongs to the range before
            first, line = _after_newlines(handle, begin, size, 1), 2 + newlines
    if first >= end:
        return line, b""
    data = handle.read_at(end - first, first)
    if not data.endswith(b"\n") and end < size:
        data += _lines_from(handle, end, size, 1)  # the rest of the last line that starts in the range
    return line, data


def _newlines_before(handle: pa.NativeFile, offset: int) -> tuple[int, bytes]:
    """Newlines in ``[0, offset)`` and the byte at ``offset - 1``, reading the prefix block by block."""
    count, pos, last = 0, 0, b""
    while pos < offset:
        block = handle.read_at(min(_BLOCK_BYTES, offset - pos), pos)
        if not block:
            break
        count += block.count(b"\n")
        last = block[-1:]
        pos += len(block)
    return count, last


def _after_newlines(handle: pa.NativeFile, start: int, size: int, count: int) -> int:
    """The offset right after the ``count``-th newline from ``start`` (``size`` when there are fewer)."""
    pos = start
    while count > 0 and pos < size:
        block = handle.read_at(min(_BLOCK_BYTES, size - pos), pos)
        if not block:
            break
        found = block.count(b"\n")
        if found >= count:
            return pos + int(np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)[count - 1]) + 1
        count -= found
        pos += len(block)
    return pos if count == 0 else size


def _lines_from(handle: pa.NativeFile, start: int, size: int, count: int) -> bytes:
    """The bytes from ``start`` to right after the ``count``-th newline (or the end of the file)."""
    blocks, pos = [], start
    while count > 0 and pos < size:
        block = handle.read_at(min(_BLOCK_BYTES, size - pos), pos)
        if not block:
            break
        found = block.count(b"\n")
        if found >= count:
            blocks.append(block[: int(np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)[count - 1]) + 1])
            break
        blocks.append(block)
        count -= found
        pos += len(block)
    return b"".join(blocks)


def lines_of(data: bytes, first_line: int) -> tuple[list[str], np.ndarray, list[str | None]]:
    """The non-blank lines of ``data`` for a line parser: texts, numbers, decoding problems.

    Lines are split on ``\n`` (a final one ends the last line) and numbered
    from ``first_line``; one trailing ``\r`` is dropped. A line that is not
    valid UTF-8 is an ``invalid_utf8`` problem, its text decoded with U+FFFD
    replacements (only then are lines decoded one by one). A line of white
    space only (Unicode ``White_Space``) is blank: skipped, neither a record
    nor a dead letter.
    """
    if not data:
        return [], np.zeros(0, dtype=np.int64), []
    pieces = pc.list_flatten(pc.split_pattern(pa.array([data], pa.large_binary()), b"\n"))
    if data.endswith(b"\n"):
        pieces = pieces.slice(0, len(pieces) - 1)  # a trailing newline ends a line, it does not start one
    pieces = pc.replace_substring_regex(pieces, pattern="\r$", replacement="")
    numbers = np.arange(first_line, first_line + len(pieces), dtype=np.int64)
    errors: list[str | None]
    try:
        text = pieces.cast(pa.large_string())
        errors = [None] * len(text)
    except pa.ArrowInvalid:
        decoded = [_decode(raw) for raw in pieces.to_pylist()]
        text = pa.array([t for t, _ in decoded], pa.large_string())
        errors = [e for _, e in decoded]
    keep = np.asarray(pc.not_equal(pc.utf8_trim_whitespace(text), "").to_numpy(zero_copy_only=False), dtype=bool)
    if keep.all():
        return text.to_pylist(), numbers, errors
    at = np.flatnonzero(keep)
    return text.filter(pa.array(keep)).to_pylist(), numbers[at], list(map(errors.__getitem__, at.tolist()))


def _decode(raw: bytes) -> tuple[str, str | None]:
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        detail = f"not valid UTF-8: {exc.reason} at byte {exc.start}"
        return raw.decode("utf-8", errors="replace"), problem(DeadLetterReason.INVALID_UTF8, detail)


# -- a line parser's records ------------------------------------------------------


def _parser_records(
    parser: LineParser, declared: pa.Schema, keys: Mapping[str, str], texts: list[str], errors: list[str | None]
) -> tuple[list[pa.Array], np.ndarray, list[str | None]]:
    """Run the line parser over a task's lines; a line it refuses, or whose record does not fit, is a dead letter.

    Returns the records' columns (``declared``'s fields), which lines are
    records, and each line's problem (None for a record). A line already
    with a problem (invalid UTF-8) is not given to the parser. In order, the
    first problem found is the line's:

    1. the parser raised :class:`RecordError` (its reason, its message or
       "invalid record") or anything else (``parser_failed``, the
       exception's type and message);
    2. it returned something other than a mapping (``parser_failed``);
    3. a non-nullable field missing or null (``missing_field``), in schema order;
    4. a key (``keys``, by name) null or missing (``null_key``) or equal to ""
       (``empty_key``);
    5. a value not of its field's type (``wrong_type``; never coerced: an
       int64 field takes ints only, not 1.5 or True; a double ints and
       floats; a string str; a bool bool; a timestamp datetime; other types
       whatever pyarrow converts exactly), the first such field in schema order.

    The parser is called once per line; everything else works on whole
    columns (types looked at per value only in a column holding an
    unexpected one).
    """
    n = len(texts)
    returned: list[Any] = [None] * n
    # 1.
    for i, text in enumerate(texts):
        if errors[i] is not None:
            continue
        try:
            returned[i] = parser(text)
        except RecordError as exc:
            errors[i] = problem(exc.reason, str(exc) or "invalid record")
        except Exception as exc:  # a parser bug must not crash the epoch
            errors[i] = problem(DeadLetterReason.PARSER_FAILED, f"{type(exc).__name__}: {exc}")
    parsed = np.flatnonzero(np.fromiter(map(operator.is_, errors, repeat(None)), dtype=bool, count=n))
    rows = list(map(returned.__getitem__, parsed.tolist()))
    m = len(rows)
    found: list[str | None] = [None] * m
    ok = np.ones(m, dtype=bool)
    # 2.
    if not set(map(type, rows)) <= {dict}:
        for j, row in enumerate(rows):
            if not isinstance(row, Mapping):
                found[j] = problem(DeadLetterReason.PARSER_FAILED, f"the parser returned a {type(row).__name__}, not a mapping")
                ok[j] = False
        rows = [row if isinstance(row, Mapping) else {} for row in rows]
        values = {f.name: [row.get(f.name) for row in rows] for f in declared}
    else:
        values = {f.name: list(map(dict.get, rows, repeat(f.name))) for f in declared}

    def flag(mask: np.ndarray, text: str) -> None:
        for j in np.flatnonzero(mask & ok).tolist():
            found[j] = text
        ok[mask] = False

    def is_null(column: list[Any]) -> np.ndarray:
        return np.fromiter(map(operator.is_, column, repeat(None)), dtype=bool, count=m)

    # 3.
    for f in declared:
        if not f.nullable:
            flag(is_null(values[f.name]), problem(DeadLetterReason.MISSING_FIELD, f"required field {f.name} is missing or null"))
    # 4.
    for name, operator_id in sorted(keys.items()):
        column = values[name]
        flag(is_null(column), key_problem(DeadLetterReason.NULL_KEY, name, operator_id))
        if "" in column:
            flag(np.array([v == "" for v in column], dtype=bool), key_problem(DeadLetterReason.EMPTY_KEY, name, operator_id))
    # 5.
    live = np.flatnonzero(ok)
    columns = []
    for f in declared:
        array, wrong = _converted(list(map(values[f.name].__getitem__, live.tolist())), f)
        for j, value in wrong.items():
            if ok[live[j]]:
                found[live[j]] = problem(DeadLetterReason.WRONG_TYPE, f"{f.name}: {str(value)[:100]} is not {f.type}")
                ok[live[j]] = False
        columns.append(array)
    survivors = pa.array(ok[live])
    columns = [c.filter(survivors) for c in columns]
    kept = np.zeros(n, dtype=bool)
    kept[parsed[ok]] = True
    for j in np.flatnonzero(~ok).tolist():
        errors[parsed[j]] = found[j]
    return columns, kept, errors


def _converted(values: list[Any], f: pa.Field) -> tuple[pa.Array, dict[int, Any]]:
    """``values`` as an array of ``f``'s type; those that are not of it (by position) are null there."""
    wrong: dict[int, Any] = {}
    accepts, usual = _python_values_of(f.type)
    if accepts is not None and not set(map(type, values)) <= usual:
        for j, value in enumerate(values):
            if value is not None and not accepts(value):
                wrong[j] = value
        if wrong:
            values = [None if j in wrong else v for j, v in enumerate(values)]
    try:
        return pa.array(values, type=f.type), wrong
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        pass
    # Some value does not convert: that value's line is a dead letter.
    values = list(values)
    for j, value in enumerate(values):
        if value is None:
            continue
        try:
            pa.array([value], type=f.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
            wrong[j] = value
            values[j] = None
    return pa.array(values, type=f.type), wrong


_NONE = type(None)


def _python_values_of(arrow_type: pa.DataType) -> tuple[Callable[[Any], bool] | None, set[type]]:
    """Which Python values a parser may return for a field of this type (None: whatever pyarrow takes), and the usual exact types."""
    if pa.types.is_integer(arrow_type):
        return (lambda v: isinstance(v, int) and not isinstance(v, bool)), {int, _NONE}
    if pa.types.is_floating(arrow_type):
        return (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)), {int, float, _NONE}
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return (lambda v: isinstance(v, str)), {str, _NONE}
    if pa.types.is_boolean(arrow_type):
        return (lambda v: isinstance(v, bool)), {bool, _NONE}
    if pa.types.is_timestamp(arrow_type):
        return (lambda v: isinstance(v, datetime.datetime)), {datetime.datetime, _NONE}
    return None, set()


# -- counting (planning with max_records_per_epoch) --------------------------------


def count_records_on_executors(spark: "SparkSession", uris: Sequence[str], fmt: str) -> dict[str, int]:
    """Records in each file (lines of JSON Lines, rows of Parquet), counted by executor tasks, one per file."""
    if not uris:
        return {}
    files = spark.createDataFrame([(uri,) for uri in uris], "uri string").repartition(len(uris))
    rows = files.mapInArrow(functools.partial(_count_batches, fmt), "uri string, records long").collect()
    return {row["uri"]: int(row["records"]) for row in rows}


def _count_batches(fmt: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        uris = batch.column("uri").to_pylist()
        yield pa.RecordBatch.from_pydict(
            {"uri": uris, "records": [count_records(uri, fmt) for uri in uris]},
            schema=pa.schema([("uri", pa.string()), ("records", pa.int64())]),
        )


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
    count = 0
    last = b"\n"
    with objects.open_input(path) as fh:
        while block := fh.read(8 * 1024 * 1024):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (0 if last == b"\n" else 1)
