"""Event-time watermark: W(n) = max event time up to epoch n - out-of-orderness."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from barrierflow.operators.base import Node

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["WatermarkAssigner"]


@dataclass
class WatermarkAssigner(Node):
    column: str = "ts"
    out_of_orderness_us: int = 0

    def passes_through(self, column: str) -> bool:
        return True  # it observes event time, never changes a record

    def apply(self, ctx: Any, df: "DataFrame") -> "DataFrame":
        from pyspark.sql import functions as F

        df = ctx.persist(df)
        row = df.agg(F.max(F.unix_micros(F.col(self.column))).alias("m")).first()
        assert row is not None  # a global aggregate has exactly one row
        max_us = row["m"]
        ctx.observe_event_time(max_us, self.out_of_orderness_us)
        return df

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "column": self.column, "out_of_orderness_us": self.out_of_orderness_us}
