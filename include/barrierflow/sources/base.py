"""What every replayable source provides to the checkpoint coordinator.

A source plans an epoch by turning its start offsets into end offsets (the
barrier) without reading records, and later reads exactly the records between
two offsets, as often as needed, with the same result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Protocol

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Source", "SourceBatch", "POSITION_COLUMNS", "DEAD_LETTER_COLUMNS"]

# Every record carries its arrival position: (source id, file, line). Sorting
# by these columns gives arrival order, which order-sensitive operators need.
POSITION_COLUMNS = ("_source", "_file", "_line")
DEAD_LETTER_COLUMNS = ("source", "source_file", "line", "raw", "reason")


@dataclass(frozen=True)
class SourceBatch:
    """One epoch's records of a source plus the input it could not parse."""

    records: "DataFrame"
    dead_letters: "DataFrame"
    # Frames both outputs derive from; the runtime caches them so input is parsed once.
    shared: tuple["DataFrame", ...] = ()


class Source(Protocol):
    source_id: str

    def plan(self, start: Mapping[str, Any] | None, arrival_cutoff_ms: int | None) -> dict[str, Any]:
        """End offsets for the next epoch (equal to ``start`` content when idle)."""

    def has_records(self, end: Mapping[str, Any]) -> bool:
        """Whether the planned range holds any input."""

    def read(self, spark: "SparkSession", end: Mapping[str, Any], parallelism: int) -> SourceBatch:
        """Exactly the records of the planned range, with position columns."""

    def describe(self) -> dict[str, Any]:
        """Stable description for savepoints and docs."""
