"""Deduplication: keep the first record of each key, across all epochs.

1. Within the epoch, each key's first record by arrival position is kept.
2. A key the state table ``<operator_id>__seen`` holds (seen in an earlier epoch, not expired by ``ttl``) drops too.
3. The keys kept are staged with the epoch that first saw them (``first_epoch``); the kept records go on, in arrival order.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Sequence

import numpy as np
import pyarrow as pa

from barrierflow.core.arrow import in_arrival_order, null_safe_keys, row_numbers, rows_without_keys
from barrierflow.core.columns import DELETED, KEY_GROUP
from barrierflow.operators.base import Node, Task, key_fields, with_key_group
from barrierflow.state.spec import StateSpec

__all__ = ["Deduplicate"]


@dataclass
class Deduplicate(Node):
    key: tuple[str, ...] = ()
    ttl: timedelta | None = None

    def state_specs(self, inputs: Sequence[pa.Schema] | None = None) -> list[StateSpec]:
        ttl_ms = int(self.ttl.total_seconds() * 1000) if self.ttl else None
        key = key_fields(self.key, inputs[0] if inputs else None)
        return [StateSpec(self.operator_id, "seen", key, (pa.field("first_epoch", pa.int64()),), ttl_ms)]

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
        first = numbered.group_by(numbered.column_names[:-1], use_threads=False).aggregate([("_row", "min")])["_row_min"]
        firsts_rows = ordered.take(np.sort(first.to_numpy()))
        seen = task.state(spec).live_rows(firsts_rows.select([*key, KEY_GROUP]))
        fresh = rows_without_keys(firsts_rows, seen, key)  # 2. unless the state holds the key already
        staged = fresh.select([*key, KEY_GROUP]).append_column("first_epoch", pa.repeat(pa.scalar(task.epoch), fresh.num_rows))
        task.state(spec).stage(staged.append_column(DELETED, pa.repeat(pa.scalar(False), fresh.num_rows)))  # 3.
        return fresh.drop_columns([KEY_GROUP])
