"""What a keyed state table is: its columns, its key group, its name.

Keys hash into a fixed number of key groups (the pipeline's max
parallelism); every state row carries its key group in :data:`KEY_GROUP`, so
an epoch reads only the key groups it touches and the parallelism may change
between epochs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = ["StateSpec", "KEY_GROUP", "DueRows"]

KEY_GROUP = "_key_group"


@dataclass(frozen=True)
class StateSpec:
    """A keyed state table: ``state/<operator_id>/<name>``.

    Rows: key columns, ``_key_group``, value columns, ``_updated_at_ms``,
    ``_deleted`` (tombstone) and ``_epoch`` (the epoch that wrote the row).
    The latest row per key (highest ``_epoch``) is the current value.
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
        return pa.schema(
            [
                *self.key_fields,
                pa.field(KEY_GROUP, pa.int32()),
                *self.value_fields,
                pa.field("_updated_at_ms", pa.int64()),
                pa.field("_deleted", pa.bool_()),
                pa.field("_epoch", pa.int64()),
            ]
        )

    def signature(self) -> dict[str, Any]:
        return {
            "keys": [f"{f.name}:{f.type}" for f in self.key_fields],
            "values": [f"{f.name}:{f.type}" for f in self.value_fields],
        }


@dataclass(frozen=True)
class DueRows:
    """The rows of a state read that event time (or processing time) reaches, whatever their key group.

    A window, timer or join buffer row is due when its ``column`` (a
    timestamp, or microseconds) is at or before ``through_us``: the watermark
    fires or purges it even if no record of its key arrived. A read given the
    key groups an epoch touches and the due rows skips every other file by its
    statistics, as a keyed read skips untouched key groups. ``column`` must be
    a key column, or a value that every version of a key carries unchanged,
    its tombstone included: all of them then lie on the same side of the
    bound, and the latest version is never read without the ones before it.
    """

    column: str
    through_us: int

