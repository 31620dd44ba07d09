"""What one epoch's Delta commit of one table is made of: staged files, removes, the fencing token.

Written by the executors and the driver before the vote (:class:`StagedFile`), gathered per table into a :class:`TableCommit` that
the manifest holds, and committed by :func:`barrierflow.storage.delta.commit_epoch_table` with the epoch's app transaction and the
pipeline's :class:`Fence`.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

__all__ = ["TableKind", "Fence", "StagedFile", "TableCommit"]


class TableKind(str, enum.Enum):
    STATE = "state"
    SINK = "sink"
    DEAD_LETTER = "dead_letter"


@dataclass(frozen=True)
class Fence:
    """A pipeline-level fencing token: (lineage sequence, epoch), carried by every commit of an epoch.

    Recorded as the Delta app transaction ``barrierflow-fence:<pipeline>`` whose version is ``lineage_seq * 2**32 + epoch``:
    tokens order as (lineage, epoch) pairs. A table refuses a commit whose token is below its own: a restore raises every table's
    token (a new lineage sequence), so a zombie of an older lineage or epoch can never commit after it, whatever the timing.
    """

    pipeline: str
    lineage_seq: int
    epoch: int

    def __post_init__(self) -> None:
        if not (0 <= self.lineage_seq < 2**31 and 0 <= self.epoch < 2**32):
            raise ValueError(f"fencing token out of range: lineage sequence {self.lineage_seq}, epoch {self.epoch}")

    @property
    def app_id(self) -> str:
        """The Delta app-transaction id the token is recorded under."""
        return f"barrierflow-fence:{self.pipeline}"

    @property
    def version(self) -> int:
        """The token as the Delta app-transaction version."""
        return (self.lineage_seq << 32) | self.epoch

    @classmethod
    def from_version(cls, pipeline: str, version: int) -> "Fence":
        return cls(pipeline, version >> 32, version & 0xFFFFFFFF)

    def __str__(self) -> str:
        return f"(lineage {self.lineage_seq}, epoch {self.epoch})"


@dataclass(frozen=True)
class StagedFile:
    """A Parquet file written to staging, described from the writer's result."""

    path: str  # relative to the table root
    size: int
    rows: int
    stats: str  # Delta add-action stats JSON
    partition_values: Mapping[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class TableCommit:
    """What one table's Delta commit for an epoch adds and removes."""

    name: str
    uri: str
    kind: TableKind
    schema_json: str  # Delta schema JSON of the files
    partition_by: tuple[str, ...]
    adds: tuple[StagedFile, ...]
    removes: tuple[str, ...] = ()  # paths live at base_version, replaced by adds
    base_version: int | None = None  # table version the removes were computed at (upserts)
    data_change: bool = True
    primary_key: tuple[str, ...] = ()
    # A sink widening (schema_evolution step 2): the table's schema after this commit, committed as
    # its metaData; the adds rewrite every file live at base_version (the removes) with the wider types.
    table_schema_json: str | None = None

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.adds)

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.adds)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["kind"] = self.kind.value
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "TableCommit":
        """The commit :meth:`to_json` wrote (``primary_key`` and ``table_schema_json`` may be missing)."""
        known = {k: v for k, v in doc.items() if k in {f.name for f in fields(cls)}}
        return cls(**{
            **known, "kind": TableKind(doc["kind"]), "partition_by": tuple(doc["partition_by"]), "removes": tuple(doc["removes"]),
            "adds": tuple(StagedFile(**f) for f in doc["adds"]), "primary_key": tuple(doc.get("primary_key", ())),
        })  # fmt: skip
