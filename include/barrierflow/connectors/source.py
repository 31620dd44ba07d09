"""What every replayable source provides to the checkpoint coordinator.

A source plans an epoch by turning its start offsets into end offsets (the
barrier) without reading records, and later reads exactly the records between
two offsets, as often as needed, with the same result.
"""

from __future__ import annotations

import json
import operator
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np
import pyarrow as pa
from pyarrow import fs as pafs

from barrierflow.core.columns import SEQ, arrival_seq
from barrierflow.core.dead_letters import DEAD_LETTER_COLUMNS, dead_letter_rows, record_problems, row_json
from barrierflow.core.errors import BlockedInputError, SourceError, StorageError
from barrierflow.storage.objects import arrow_filesystem

__all__ = [
    "Backlog", "RecordCounter", "Source", "Split", "FileRange", "checked_rows", "describe_offsets", "no_dead_letters",
    "open_file", "packed", "planned_bytes", "whole_file_dead_letters",
]  # fmt: skip


@dataclass(frozen=True)
class FileRange:
    """A part of one input file a task reads: lines (rows) ``[from_line, to_line)``, or those starting in a byte range.

    ``file_index`` is the file's position among the source's files of the
    epoch (its records' ``_seq``); lines are numbered from 1 in the file.
    ``from_line``/``to_line`` are line offsets as a barrier records them:
    the lines (rows) numbered ``from_line + 1`` to ``to_line`` (to the end
    when None). A byte range (``byte_end`` not None) is only ever cut from a
    whole file: it owns the lines that start in ``[byte_start, byte_end)``.
    """

    name: str
    uri: str
    size: int  # bytes its barrier recorded: a landed file never changes
    file_index: int
    from_line: int = 0
    to_line: int | None = None
    byte_start: int = 0  # a split of a whole file: the lines that start in [byte_start, byte_end)
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
    # What a source's tasks need besides the files, its own (a Delta source: the
    # schema planned with and the data files' partition values).
    parts: tuple[Any, ...] = ()

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)


@dataclass(frozen=True)
class Backlog:
    """Input that has arrived but no barrier has taken yet: how much, and since when.

    ``files`` are landing files (a Delta source: data files its table added);
    a file partly read counts whole. ``oldest_arrival_ms`` is when the
    earliest of them arrived (its modification or commit time), None when
    there is no backlog; the input lag is the time since then.
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

    A file that is gone is a :class:`BlockedInputError` naming it (no retry
    brings it back; ``keep`` says what is expected); one whose size is not
    the recorded one fails with a :class:`SourceError` naming it: its epoch
    would read other lines than its barrier took.
    """
    filesystem, path = arrow_filesystem(part.uri)
    try:
        handle = filesystem.open_input_file(path)
    except FileNotFoundError:
        handle = None
    except OSError as exc:
        if filesystem.get_file_info(path).type != pafs.FileType.NotFound:
            raise StorageError(f"source {source_id}: cannot read {what} {part.name} ({part.uri}): {exc}") from exc
        handle = None
    if handle is None:
        raise BlockedInputError(f"source {source_id}: {what} {part.name} recorded in the barrier is gone; {keep}")
    size = handle.size()
    if size != part.size:
        handle.close()
        raise SourceError(
            f"source {source_id}: {what} {part.name} has {size} bytes, {part.size} when its epoch was planned: {never_changes}"
        )
    return handle


def packed(parts: Sequence[FileRange], split_bytes: int | None) -> list[list[FileRange]]:
    """``parts`` in their order, packed into groups of about ``split_bytes`` (None: one group; none without parts).

    A part goes in the current group unless that would take the group past
    ``split_bytes`` (a part larger than that gets a group of its own).
    """
    if not parts:
        return []
    if split_bytes is None:
        return [list(parts)]
    groups: list[list[FileRange]] = []
    current: list[FileRange] = []
    held = 0
    for part in parts:
        if current and held + part.bytes > split_bytes:
            groups.append(current)
            current, held = [], 0
        current.append(part)
        held += part.bytes
    groups.append(current)
    return groups


def no_dead_letters() -> pa.Table:
    return pa.schema(DEAD_LETTER_COLUMNS).empty_table()


def whole_file_dead_letters(source_id: str, files: Sequence[tuple[str, str | None, str]]) -> pa.Table:
    """One dead letter per file refused whole, ``(name, raw, problem string)``, without a line."""
    return dead_letter_rows(source_id, [f[0] for f in files], [None] * len(files), [f[1] for f in files], [f[2] for f in files])


def checked_rows(
    source_id: str,
    part: FileRange,
    rows: pa.Table,
    declared: pa.Schema,
    keys: Mapping[str, str],
    lines: np.ndarray,
    source_index: int,
) -> tuple[pa.Table, pa.Table]:
    """Typed rows of one file (a Parquet or Delta data file): records (with ``_seq``) and dead letters.

    A row is a dead letter when it fails the checks every source applies
    (:func:`~barrierflow.core.dead_letters.record_problems` against
    ``declared``: required fields, keys); its ``line`` is its entry of
    ``lines`` (the row's number in its file, from 1), its ``raw`` the row as
    JSON. Without checks to make, no row is looked at.
    """
    seq = arrival_seq(source_index, part.file_index, lines)
    if not keys and all(f.nullable for f in declared):
        return rows.append_column(SEQ, seq), no_dead_letters()
    problems = record_problems(rows, declared, keys)
    good = np.fromiter(map(operator.is_, problems, repeat(None)), dtype=bool, count=len(problems))
    if good.all():
        return rows.append_column(SEQ, seq), no_dead_letters()
    keep = pa.array(good)
    bad = np.flatnonzero(~good).tolist()
    dead = dead_letter_rows(
        source_id,
        [part.name] * len(bad),
        lines[bad].tolist(),
        row_json(rows.filter(pa.array(~good))),
        [problems[i] or "" for i in bad],
    )
    return rows.filter(keep).append_column(SEQ, seq.filter(keep)), dead


# (file URIs, format) -> records in each file. The checkpoint coordinator counts them
# with executor tasks: planning itself lists and stats input files, never reads them.
RecordCounter = Callable[[Sequence[str], str], Mapping[str, int]]


class Source(Protocol):
    @property
    def source_id(self) -> str: ...

    def plan(
        self, start: Mapping[str, Any] | None, arrival_cutoff_ms: int | None, counter: RecordCounter | None = None
    ) -> dict[str, Any]:
        """End offsets for the next epoch (equal to ``start`` content when idle).

        ``counter`` counts the records of input files, for a source that
        limits an epoch's records and cannot tell them from metadata.
        """

    def earliest_arrival_ms(self, start: Mapping[str, Any] | None, arrival_cutoff_ms: int | None) -> int | None:
        """When the earliest input after ``start`` that arrived by the cut-off arrived; None if none.

        The checkpoint coordinator cuts epochs at the data interval holding it
        (:mod:`barrierflow.checkpointing.intervals`).
        """

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

        ``keys`` maps the columns that keyed operators (deduplicate,
        ``key_by``) take from this source's records to the first such
        operator: a record whose key is null (or an empty string) is a dead
        letter, not a record.
        """

    def describe(self) -> dict[str, Any]:
        """Stable description for savepoints and docs."""


def planned_bytes(offsets: Mapping[str, Any]) -> int:
    """Bytes of the files an epoch's end offsets plan to read (whole files for line ranges).

    File ranges are ``[name, from_line, to_line, size]``; other sources
    (a Delta table's versions) count nothing.
    """
    total = 0
    for end in offsets.values():
        if isinstance(end, Mapping):
            for entry in end.get("files") or []:
                if isinstance(entry, (list, tuple)) and len(entry) >= 4 and isinstance(entry[3], int):
                    total += entry[3]
    return total


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
