"""What every replayable source provides to the checkpoint coordinator, and what file-reading tasks share.

A source plans an epoch by turning its start offsets into end offsets (the barrier) without reading records, and later
reads exactly the records between two offsets, as often as needed, with the same result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import fs as pafs

from barrierflow.core.columns import SEQ, arrival_seq
from barrierflow.core.dead_letters import DEAD_LETTER_COLUMNS, dead_letter_rows, record_problems, row_json
from barrierflow.core.errors import BlockedInputError, SourceError, StorageError
from barrierflow.storage.objects import arrow_filesystem

__all__ = [
    "Backlog", "RecordCounter", "Source", "Split", "FileRange", "checked_rows", "describe_offsets", "file_dead_letters",
    "gathered", "open_file", "packed", "planned_bytes",
]  # fmt: skip


@dataclass(frozen=True)
class FileRange:
    """A part of one input file a task reads: lines (rows) ``from_line + 1`` to ``to_line`` (None: the end), numbered from 1.

    Or, cut from a whole file (``byte_end`` not None), the lines that start in ``[byte_start, byte_end)``.
    ``file_index`` is the file's position among the source's files of the epoch (its records' ``_seq``).
    """

    name: str
    uri: str
    size: int  # bytes its barrier recorded: a landed file never changes
    file_index: int
    from_line: int = 0
    to_line: int | None = None
    byte_start: int = 0
    byte_end: int | None = None

    @property
    def bytes(self) -> int:
        """What a task reads for it, about: the byte range, else the whole file (a line range reads up to it)."""
        return (self.byte_end if self.byte_end is not None else self.size) - self.byte_start


@dataclass(frozen=True)
class Split:
    """What one task reads of one source's epoch."""

    source_index: int
    files: tuple[FileRange, ...] = ()
    late: tuple[tuple[str, int], ...] = ()  # files dead-lettered whole (name, size), never read
    parts: tuple[Any, ...] = ()  # what the tasks need besides the files (a Delta source: the schema planned, partitions)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)


@dataclass(frozen=True)
class Backlog:
    """Input arrived that no barrier has taken yet: files (a partly read one whole; a Delta table's data files), bytes.

    ``oldest_arrival_ms``: when the earliest arrived (modification or commit time; None: no backlog), the input lag's start.
    """

    files: int = 0
    bytes: int = 0
    oldest_arrival_ms: int | None = None

    def lag_ms(self, now_ms: int) -> int:
        """How long the oldest waiting input has waited at ``now_ms`` (0 without backlog)."""
        return max(0, now_ms - self.oldest_arrival_ms) if self.oldest_arrival_ms is not None else 0

    def __add__(self, other: "Backlog") -> "Backlog":
        times = [t for t in (self.oldest_arrival_ms, other.oldest_arrival_ms) if t is not None]
        return Backlog(self.files + other.files, self.bytes + other.bytes, min(times) if times else None)

    def to_json(self) -> dict[str, Any]:
        return {"files": self.files, "bytes": self.bytes, "oldest_arrival_ms": self.oldest_arrival_ms}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Backlog":
        return cls(int(doc.get("files", 0)), int(doc.get("bytes", 0)), doc.get("oldest_arrival_ms"))


def open_file(
    source_id: str,
    part: FileRange,
    what: str = "file",
    keep: str = "landing files must be kept until their epoch is completed",
    never_changes: str = "a landed file must never change (land new data as a new file, named after the last)",
) -> pa.NativeFile:
    """``part``'s file opened for range reads (pyarrow's file system: local and ``s3://`` alike), checked against its barrier.

    Gone is a :class:`BlockedInputError` (no retry brings it back; ``keep`` says what is expected); another size than
    recorded is a :class:`SourceError` (the epoch would read other lines than its barrier took).
    """
    filesystem, path = arrow_filesystem(part.uri)
    try:
        handle = filesystem.open_input_file(path)
    except OSError as exc:
        if not isinstance(exc, FileNotFoundError) and filesystem.get_file_info(path).type != pafs.FileType.NotFound:
            raise StorageError(f"source {source_id}: cannot read {what} {part.name} ({part.uri}): {exc}") from exc
        raise BlockedInputError(f"source {source_id}: {what} {part.name} recorded in the barrier is gone; {keep}") from None
    size = handle.size()
    if size != part.size:
        handle.close()
        raise SourceError(
            f"source {source_id}: {what} {part.name} has {size} bytes, {part.size} when its epoch was planned: {never_changes}"
        )
    return handle


def packed(parts: Sequence[FileRange], split_bytes: int | None) -> list[list[FileRange]]:
    """``parts`` in order, in groups of at most ``split_bytes`` unless one part is larger (None: one group; no parts, none)."""
    if split_bytes is None:
        return [list(parts)] if parts else []
    groups: list[list[FileRange]] = []
    held = 0
    for part in parts:
        if not groups or held + part.bytes > split_bytes:
            groups.append([])
            held = 0
        groups[-1].append(part)
        held += part.bytes
    return groups


def file_dead_letters(source_id: str, rows: Sequence[tuple[str, int | None, str | None, str]]) -> pa.Table:
    """Dead letters of a source's files: (file name, line or None for a whole file, raw text, problem string) each."""
    names, lines, raws, problems = (list(column) for column in zip(*rows)) if rows else ([], [], [], [])
    return dead_letter_rows(source_id, names, lines, raws, problems)


def gathered(schema: pa.Schema, parts: Sequence[tuple[pa.Table, pa.Table]], *dead: pa.Table) -> tuple[pa.Table, pa.Table]:
    """A task's records (``schema``, then ``_seq``) and dead letters: its files' ``parts`` in order, and ``dead``."""
    records = [r for r, _ in parts] or [schema.append(pa.field(SEQ, pa.int64())).empty_table()]
    dead_letters = [*(d for _, d in parts), *dead] or [pa.schema(DEAD_LETTER_COLUMNS).empty_table()]
    return pa.concat_tables(records), pa.concat_tables(dead_letters)


def checked_rows(
    source_id: str, part: FileRange, rows: pa.Table, declared: pa.Schema, keys: Mapping[str, str], source_index: int
) -> tuple[pa.Table, pa.Table]:
    """Typed rows of one file's range (a Parquet or Delta data file): records (with ``_seq``) and dead letters.

    A row failing :func:`~barrierflow.core.dead_letters.record_problems` (required fields, keys) is a dead letter, its
    ``line`` its number in the file (from 1), its ``raw`` the row as JSON.
    """
    lines = np.arange(part.from_line + 1, part.from_line + 1 + rows.num_rows, dtype=np.int64)
    seq = arrival_seq(source_index, part.file_index, lines)
    problems = record_problems(rows, declared, keys) if keys or not all(f.nullable for f in declared) else []
    bad = [i for i, text in enumerate(problems) if text is not None]
    if not bad:
        return rows.append_column(SEQ, seq), file_dead_letters(source_id, [])
    raws = row_json(rows.take(bad))
    dead = file_dead_letters(source_id, [(part.name, int(lines[i]), raw, problems[i] or "") for i, raw in zip(bad, raws)])
    keep = pc.is_null(pa.array(problems, pa.string()))
    return rows.filter(keep).append_column(SEQ, seq.filter(keep)), dead


# (file URIs, format) -> records in each file, counted by executor tasks: planning never reads input.
RecordCounter = Callable[[Sequence[str], str], Mapping[str, int]]


class Source(Protocol):
    @property
    def source_id(self) -> str: ...

    def plan(
        self, start: Mapping[str, Any] | None, arrival_cutoff_ms: int | None, counter: RecordCounter | None = None
    ) -> dict[str, Any]:
        """End offsets for the next epoch (``start``'s content when idle); ``counter`` counts input files' records."""

    def earliest_arrival_ms(self, start: Mapping[str, Any] | None, arrival_cutoff_ms: int | None) -> int | None:
        """When the earliest input after ``start`` that arrived by the cut-off arrived (None: none); epochs are cut by it."""

    def has_records(self, end: Mapping[str, Any]) -> bool:
        """Whether the planned range holds any input."""

    def backlog(self, end: Mapping[str, Any] | None) -> Backlog:
        """Input that arrived (whatever the cut-off) and that no barrier up to ``end`` took."""

    def record_schema(self, end: Mapping[str, Any] | None = None) -> pa.Schema:
        """The user columns of its records (without ``_seq``) in an epoch planned to ``end``, known before any is read."""

    def splits(self, end: Mapping[str, Any], source_index: int, split_bytes: int | None) -> list[Split]:
        """The planned range as splits for tasks: about ``split_bytes`` each (None: one split)."""

    def read(self, split: Split, keys: Mapping[str, str]) -> tuple[pa.Table, pa.Table]:
        """A task's records of ``split`` (the record schema, then ``_seq``) and its dead letters (without ``_epoch``).

        ``keys``: the columns keyed operators take from the records -> the first such operator; a record whose key is
        null or "" is a dead letter.
        """

    def describe(self) -> dict[str, Any]:
        """Stable description for savepoints and docs."""


def planned_bytes(offsets: Mapping[str, Any]) -> int:
    """Bytes of the files (``[name, from_line, to_line, size]``) an epoch's end offsets plan to read; other sources count nothing."""
    entries = [entry for end in offsets.values() if isinstance(end, Mapping) for entry in end.get("files") or []]
    return sum(e[3] for e in entries if isinstance(e, (list, tuple)) and len(e) >= 4 and isinstance(e[3], int))


def describe_offsets(offsets: Mapping[str, Any]) -> str:
    """A short human description of end offsets per source."""
    parts = []
    for source, end in sorted(offsets.items()):
        if isinstance(end, Mapping) and "files" in end:
            files = [f[0] if isinstance(f, (list, tuple)) else str(f) for f in end.get("files") or []]
            if files:
                span = files[0] if len(files) == 1 else f"{files[0]} .. {files[-1]}"
                parts.append(f"{source}: {len(files)} file(s) {span}")
            else:
                parts.append(f"{source}: position {end.get('file')!r}")
        elif isinstance(end, Mapping) and "version" in end:
            parts.append(f"{source}: versions {end.get('from_version')} -> {end['version']}")
        else:
            parts.append(f"{source}: {json.dumps(end, sort_keys=True, default=str)[:200]}")
    return "; ".join(parts) or "no sources"
