"""Common shape of every operator node and of the state it declares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from barrierflow.spark import session_cached

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["Node", "StateSpec", "KEY_GROUP", "user_columns", "key_group_column", "position_order"]

KEY_GROUP = "_key_group"


@dataclass
class Node:
    """One operator of the pipeline graph, identified by a stable operator id."""

    operator_id: str
    parent: "Node | None"

    # Whether the operator reads the ``_seq`` arrival position of its input
    # records; a source whose consumers all do without it may skip numbering lines.
    needs_arrival_order = True
    # Whether ``apply`` also takes a ``pyarrow.Table``: an operator whose
    # result is already on the driver returns it as Arrow, and only
    # consumers without this flag get it as a Spark frame.
    accepts_arrow = False

    def apply(self, ctx: Any, df: "DataFrame") -> "DataFrame | pa.Table":
        raise NotImplementedError

    def state_specs(self) -> list["StateSpec"]:
        return []

    def side_outputs(self) -> list[str]:
        return []

    def describe(self) -> dict[str, Any]:
        return {"operator_id": self.operator_id, "type": type(self).__name__}


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


def user_columns(df: "DataFrame") -> list[str]:
    """Columns that belong to the records (not the engine's ``_`` columns)."""
    return [c for c in df.columns if not c.startswith("_")]


def key_group_column(key: tuple[str, ...], key_groups: int) -> "Column":
    """Key group of a key: a fixed hash modulo the max parallelism (native Spark)."""
    from pyspark.sql import functions as F

    def build() -> "Column":
        return F.pmod(F.xxhash64(*[F.col(k) for k in key]), F.lit(key_groups)).cast("int")

    return session_cached(("key_group", tuple(key), key_groups), build)


def position_order() -> list["Column"]:
    from pyspark.sql import functions as F

    return [F.col("_seq")]
