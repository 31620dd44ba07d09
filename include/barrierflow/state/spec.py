"""What a keyed state table is (its columns, key group, name), and what a task reads of it in an epoch.

Keys hash into a fixed number of key groups (the pipeline's max parallelism); every state row carries its key group in
:data:`KEY_GROUP`, so the parallelism may change between epochs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from barrierflow.core.columns import DELETED, EPOCH, KEY_GROUP, UPDATED_AT
from barrierflow.state.files import StateFile

__all__ = ["StateSpec", "KEY_GROUP", "KeyGroups", "StateTablePlan"]


@dataclass(frozen=True)
class StateSpec:
    """A keyed state table: ``state/<operator_id>/<name>``.

    Rows: key columns, ``_key_group``, value columns, ``_updated_at_ms``, ``_deleted`` (tombstone) and ``_epoch`` (the epoch that
    wrote the row). The latest row per key (highest ``_epoch``) is the current value.
    """

    operator_id: str
    name: str
    key_fields: tuple[pa.Field, ...]
    value_fields: tuple[pa.Field, ...]
    ttl_ms: int | None = None

    @property
    def key_columns(self) -> list[str]:
        return [f.name for f in self.key_fields]

    @property
    def value_columns(self) -> list[str]:
        return [f.name for f in self.value_fields]

    @property
    def table_name(self) -> str:
        return f"{self.operator_id}__{self.name}"

    def arrow_schema(self) -> pa.Schema:
        engine = [pa.field(UPDATED_AT, pa.int64()), pa.field(DELETED, pa.bool_()), pa.field(EPOCH, pa.int64())]
        return pa.schema([*self.key_fields, pa.field(KEY_GROUP, pa.int32()), *self.value_fields, *engine])

    def signature(self) -> dict[str, Any]:
        return {
            "keys": [f"{f.name}:{f.type}" for f in self.key_fields],
            "values": [f"{f.name}:{f.type}" for f in self.value_fields],
        }


@dataclass(frozen=True)
class KeyGroups:
    """The key groups a task holds: ``[low, high]``, of ``total``."""

    low: int
    high: int
    total: int

    @classmethod
    def all(cls, total: int) -> "KeyGroups":
        return cls(0, total - 1, total)

    def __iter__(self) -> Any:
        return iter(range(self.low, self.high + 1))


@dataclass(frozen=True)
class StateTablePlan:
    """What a task needs to read and stage one state table this epoch (picklable; made by the driver)."""

    spec: StateSpec
    uri: str
    files: tuple[StateFile, ...]  # the snapshot's data files as of epoch n-1
    compact: bool  # write every live row after the epoch, replacing the snapshot's files
    backend: str = "delta"
    whole: bool = False  # not keyed by the task's key groups (broadcast state): every task reads it whole, the first stages it
