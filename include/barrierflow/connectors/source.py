"""What every replayable source provides to the checkpoint coordinator.

A source plans an epoch by turning its start offsets into end offsets (the
barrier) without reading records, and later reads exactly the records between
two offsets, as often as needed, with the same result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

if TYPE_CHECKING:
    import concurrent.futures

    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Backlog", "RecordCounter", "Source", "SourceBatch", "SEQ", "arrival_seq", "seq_parts", "file_position", "describe_offsets", "planned_bytes"]

# Every record carries its arrival position packed in one long, ``_seq``:
# (source index, file index within the epoch, line). Sorting by it gives
# arrival order, which order-sensitive operators need; one long is far cheaper
# to shuffle and sort than file names.
SEQ = "_seq"
_FILE_BITS, _LINE_BITS = 20, 36


def arrival_seq(source_index: int, file_index: Any, line: Any) -> Any:
    """The ``_seq`` column: source (7 bits), file (20 bits), line (36 bits)."""
    from pyspark.sql import functions as F

    return (
        F.shiftleft(F.lit(source_index).cast("long"), _FILE_BITS + _LINE_BITS)
        + F.shiftleft(file_index.cast("long"), _LINE_BITS)
        + line.cast("long")
    )


def seq_parts(seq: Any) -> tuple[Any, Any, Any]:
    """The inverse of :func:`arrival_seq`: columns of the source index, the file's position (:func:`file_position`) and the line."""
    from pyspark.sql import functions as F

    return F.shiftright(seq, _FILE_BITS + _LINE_BITS), F.shiftright(seq, _LINE_BITS), seq.bitwiseAND((1 << _LINE_BITS) - 1)


def file_position(source_index: int, file_index: int) -> int:
    """A file's position among all sources' files of an epoch, as :func:`seq_parts` decodes it."""
    return source_index << _FILE_BITS | file_index


@dataclass(frozen=True)
class SourceBatch:
    """One epoch's records of a source plus the input it could not parse."""

    records: "DataFrame"
    # None for an unordered read: its bad lines force an ordered read.
    dead_letters: "DataFrame | None"
    # Frames both outputs derive from; the runtime caches them so input is parsed once.
    shared: tuple["DataFrame", ...] = ()
    # An unordered read (no ``_seq``, nothing cached) counts its input while
    # the operators run: a ``pyspark.sql.Observation`` with metrics ``good``
    # (the records) and ``bad`` (lines that would be dead letters). Any bad
    # line means the epoch is recomputed with an ordered read, which numbers
    # lines for the dead-letter table.
    observation: Any = None
    # An unordered read is good only if its input is plain (bytes the reader
    # reads as the ordered read would; see ``FileSource._read_jsonl_unordered``).
    # A check job started with the batch answers that while the operators
    # run: True, or False when the epoch must be recomputed with an ordered
    # read, as for a bad line. ``result()`` re-raises the job's error (e.g. an
    # input file vanished). None: nothing to wait for.
    plain_input: "concurrent.futures.Future[bool] | None" = None
    # The files ``_seq``'s file index counts, in order: names for dead letters
    # found downstream (a key computed after the source; see ``operators.key_check``).
    files: tuple[str, ...] = ()


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

    def read(
        self, spark: "SparkSession", end: Mapping[str, Any], parallelism: int, source_index: int = 0, ordered: bool = True,
        keys: Mapping[str, str] | None = None,
    ) -> SourceBatch:
        """Exactly the records of the planned range, with the ``_seq`` column.

        ``keys`` maps the columns that keyed operators (deduplicate,
        ``key_by``) take from this source's records to the first such
        operator: a record whose key is null (or an empty string) is a dead
        letter, not a record, wherever the source can tell (JSON Lines).

        With ``ordered=False`` (no consumer needs arrival order) a source may
        leave out ``_seq`` and return a batch with an ``observation`` (and
        possibly a ``plain_input`` check to wait for).
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
