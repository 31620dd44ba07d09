"""Deduplication: keep the first record of each key, across all epochs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.operators.base import Node, key_group_column, position_columns, position_order
from barrierflow.state.delta_backend import joinable
from barrierflow.state.spec import KEY_GROUP, StateSpec
from barrierflow.state.worker_cache import without_live_keys

# Key types whose Spark key group the chained form computes (``chaining.spark_key_groups``).
_CHAINED_KEY_TYPES = (pa.string(), pa.int64())

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["Deduplicate"]

# Epochs of up to this many input rows cache their first record per key
# before waiting for the last epoch's state (see :meth:`Deduplicate.apply`).
EARLY_FIRSTS_ROWS = 1_000_000


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
        # One small job: the key groups touched (the state read's pruning) and
        # at most how many keys. A small epoch takes it over its first record
        # per key, cached: computed here, while the last epoch may still be
        # committing, so that only the state lookup and the write wait for it.
        # A big one (a bulk load) takes it over the records, without a
        # shuffle or a cache, which would take the memory its own shuffles need.
        early = ctx.rows_read is not None and ctx.rows_read <= EARLY_FIRSTS_ROWS
        if early:
            firsts = ctx.persist(firsts)
        summarized = firsts if early else keyed
        touched = summarized.agg(F.count(F.lit(1)).alias("records"), F.collect_set(KEY_GROUP).alias("groups")).first()
        assert touched is not None  # a global aggregate has exactly one row
        groups, keys = sorted(touched["groups"]), touched["records"]
        files = ctx.state.lookup_files(spec, groups, keys)
        if files is None:
            seen = ctx.state.read(spec, groups, keys=firsts, key_count=keys).select(*self.key)
            fresh = firsts.join(joinable(seen, keys), on=list(self.key), how="left_anti")
        else:
            # The tasks that look the keys up keep the records of keys not seen: no join after.
            fresh = ctx.state.with_live_rows(spec, files, firsts, partial(without_live_keys, spec.key_fields), firsts.schema)
        fresh = ctx.persist(fresh)
        ctx.state.stage(
            spec,
            fresh.select(*self.key, KEY_GROUP, F.lit(False).alias("_deleted")),
            constants={"first_epoch": ctx.epoch},
            ranged=files is not None,
        )
        return ctx.cached_view(fresh.drop(KEY_GROUP))

    def chained_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema | None:
        (schema,) = inputs
        keys_ok = all(k in schema.names and schema.field(k).type in _CHAINED_KEY_TYPES for k in self.key)
        return schema if keys_ok else None

    def chained_state_specs(self, inputs: Sequence[pa.Schema]) -> list[StateSpec]:
        (schema,) = inputs
        return [self._spec({k: schema.field(k).type for k in self.key})]

    def apply_chained(self, task: Any, inputs: Sequence[pa.Table]) -> pa.Table:
        """:meth:`apply` in one task: the first record per key by arrival, unless a stored key has it already."""
        (records,) = inputs
        [spec] = self.chained_state_specs([records.schema])
        key = list(self.key)
        # First occurrence within the epoch, by arrival position.
        ordered = records.sort_by([(c, "ascending") for c in position_columns(records.column_names)])
        ordered = ordered.append_column("_row", pa.array(range(ordered.num_rows), pa.int64()))
        first_rows = ordered.select([*key, "_row"]).group_by(key, use_threads=False).aggregate([("_row", "min")])
        first = first_rows["_row_min"]
        firsts = ordered.take(pc.take(first, pc.sort_indices(first))).drop_columns(["_row"])
        firsts = firsts.append_column(KEY_GROUP, task.key_groups_of(firsts.select(key)))
        fresh = without_live_keys(spec.key_fields, firsts, task.live_rows(spec, firsts.select([*key, KEY_GROUP])))
        n = fresh.num_rows
        task.stage(
            spec,
            fresh.select([*key, KEY_GROUP])
            .append_column("first_epoch", pa.repeat(pa.scalar(task.epoch, pa.int64()), n))
            .append_column("_deleted", pa.repeat(pa.scalar(False), n)),
        )
        return fresh.drop_columns([KEY_GROUP])
