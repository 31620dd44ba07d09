"""Common shape of every operator node; the state it declares is a :class:`~barrierflow.state.spec.StateSpec`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from barrierflow.spark import session_cached
from barrierflow.state.spec import StateSpec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["Node", "user_columns", "key_group_column", "position_order"]


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
