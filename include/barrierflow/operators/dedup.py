"""Deduplication: keep the first record of each key, across all epochs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from barrierflow.operators.base import Node, key_group_column, position_order
from barrierflow.state.delta_state_backend import joinable
from barrierflow.state.spec import KEY_GROUP, StateSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["Deduplicate"]


@dataclass
class Deduplicate(Node):
    key: tuple[str, ...] = ()
    ttl: timedelta | None = None

    def _spec(self, df_types: dict[str, pa.DataType] | None = None) -> StateSpec:
        types = df_types or {}
        return StateSpec(
            operator_id=self.operator_id,
            name="seen",
            key_fields=tuple(pa.field(k, types.get(k, pa.string())) for k in self.key),
            value_fields=(pa.field("first_epoch", pa.int64()),),
            ttl_ms=int(self.ttl.total_seconds() * 1000) if self.ttl else None,
        )

    def state_specs(self) -> list[StateSpec]:
        return [self._spec()]

    def passes_through(self, column: str) -> bool:
        return True  # it drops records, never changes one

    def apply(self, ctx: Any, df: "DataFrame") -> "DataFrame":
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        spec = self._spec(ctx.arrow_types(df, self.key))
        keyed = df.withColumn(KEY_GROUP, key_group_column(self.key, ctx.key_groups))
        # First occurrence within the epoch, by arrival position.
        first = Window.partitionBy(*self.key).orderBy(*position_order(df.columns))
        firsts = keyed.withColumn("_rn", F.row_number().over(first)).where("_rn = 1").drop("_rn")
        # One small job over the epoch's records, no shuffle: the key groups
        # touched (the state read's pruning) and at most how many keys.
        touched = keyed.agg(F.count(F.lit(1)).alias("records"), F.collect_set(KEY_GROUP).alias("groups")).first()
        assert touched is not None  # a global aggregate has exactly one row
        seen = ctx.state.read(spec, sorted(touched["groups"]), keys=firsts, key_count=touched["records"]).select(*self.key)
        fresh = firsts.join(joinable(seen, touched["records"]), on=list(self.key), how="left_anti")
        fresh = ctx.persist(fresh)
        ctx.state.stage(
            spec, fresh.select(*self.key, KEY_GROUP, F.lit(False).alias("_deleted")), constants={"first_epoch": ctx.epoch}
        )
        return ctx.cached_view(fresh.drop(KEY_GROUP))
