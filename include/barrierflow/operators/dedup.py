"""Deduplication: keep the first record of each key, across all epochs.

1. Within the epoch, the first record of each key by arrival position
   (``_seq``, then a flat_map's sub-positions) is kept; its later ones drop.
2. A key the state table ``<operator_id>__seen`` holds (seen in an earlier
   epoch, and not expired by ``ttl``) drops too.
3. The keys kept are staged into the state with the epoch that first saw
   them (``first_epoch``); the kept records go on, in arrival order.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.core.arrow import in_arrival_order, null_safe_keys, row_numbers, rows_without_keys
from barrierflow.core.columns import DELETED, KEY_GROUP
from barrierflow.operators.base import Node, Task, with_key_group
from barrierflow.state.spec import StateSpec

__all__ = ["Deduplicate"]


@dataclass
class Deduplicate(Node):
    key: tuple[str, ...] = ()
    ttl: timedelta | None = None

    def _spec(self, types: dict[str, pa.DataType] | None = None) -> StateSpec:
        types = types or {}
        return StateSpec(
            operator_id=self.operator_id,
            name="seen",
            key_fields=tuple(pa.field(k, types.get(k, pa.string())) for k in self.key),
            value_fields=(pa.field("first_epoch", pa.int64()),),
            ttl_ms=int(self.ttl.total_seconds() * 1000) if self.ttl else None,
        )

    def state_specs(self, inputs: Sequence[pa.Schema] | None = None) -> list[StateSpec]:
        if not inputs:
            return [self._spec()]
        (schema,) = inputs
        return [self._spec({k: schema.field(k).type for k in self.key})]

    def passes_through(self, column: str) -> bool:
        return True  # it drops records, never changes one

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        (schema,) = inputs
        return schema

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        (records,) = inputs
        key = list(self.key)
        [spec] = self.state_specs([records.schema])
        # 1. The first record of each key, by arrival position.
        ordered = in_arrival_order(with_key_group(records, key, task.key_groups))
        numbered = null_safe_keys(ordered, key).append_column("_row", row_numbers(ordered.num_rows))
        firsts = numbered.group_by([c for c in numbered.column_names if c != "_row"], use_threads=False).aggregate(
            [("_row", "min")]
        )
        first = firsts["_row_min"]
        firsts_rows = ordered.take(pc.take(first, pc.sort_indices(first)))
        # 2. Unless the state holds the key already.
        seen = task.state(spec).live_rows(firsts_rows.select([*key, KEY_GROUP]))
        fresh = rows_without_keys(firsts_rows, seen, key)
        # 3.
        n = fresh.num_rows
        task.state(spec).stage(
            fresh.select([*key, KEY_GROUP])
            .append_column("first_epoch", pa.repeat(pa.scalar(task.epoch, pa.int64()), n))
            .append_column(DELETED, pa.repeat(pa.scalar(False), n))
        )
        return fresh.drop_columns([KEY_GROUP])

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "key": list(self.key)}
