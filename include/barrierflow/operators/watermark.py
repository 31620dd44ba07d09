"""Event-time watermarks: W(n) = max event time up to epoch n - out-of-orderness, the minimum over assigners.

1. An assigner observes the largest event time of its input records up to
   epoch n; its watermark is that minus its out-of-orderness.
2. A pipeline with one assigner keeps that maximum in the checkpoint record
   (as before). With several (e.g. one per source of a join), each keeps its
   own maximum in a one-row state table ``<assigner id>__max_event_time``,
   committed with the epoch, kept by savepoints like all state.
3. The pipeline's watermark W(n) is the minimum of its assigners'
   watermarks, as Flink's watermark of an operator with several inputs is
   the minimum of its inputs': none while some assigner has seen no record
   (its input's watermark is still -infinity), and never decreasing.
4. So that W(n) is each event-time operator's own (the minimum over its
   inputs), with several assigners every event-time operator (windows, joins,
   process functions with timers) must be downstream of all of them; the
   pipeline's declaration checks it (:meth:`~barrierflow.plan.pipeline.PipelineDefinition.build`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.operators.base import Node
from barrierflow.state.spec import KEY_GROUP, StateSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["WatermarkAssigner", "MAX_EVENT_TIME_STATE"]

MAX_EVENT_TIME_STATE = "max_event_time"


@dataclass
class WatermarkAssigner(Node):
    column: str = "ts"
    out_of_orderness_us: int = 0
    # (2.) Set when the pipeline has several assigners: the maximum is kept in state.
    tracked: bool = False

    def passes_through(self, column: str) -> bool:
        return True  # it observes event time, never changes a record

    def state_specs(self) -> list[StateSpec]:
        return [self._spec()] if self.tracked else []

    def _spec(self) -> StateSpec:
        return StateSpec(
            operator_id=self.operator_id,
            name=MAX_EVENT_TIME_STATE,
            key_fields=(pa.field("assigner", pa.string()),),
            value_fields=(pa.field("max_event_time_us", pa.int64()),),
        )

    def apply(self, ctx: Any, df: "DataFrame") -> "DataFrame":
        from pyspark.sql import functions as F

        df = ctx.persist(df)
        row = df.agg(F.max(F.unix_micros(F.col(self.column))).alias("m")).first()
        assert row is not None  # a global aggregate has exactly one row
        max_us = row["m"]  # (1.)
        if not self.tracked:
            ctx.observe_event_time(max_us, self.out_of_orderness_us)
            return df
        spec = self._spec()  # (2.)
        stored = ctx.state.read_arrow(spec, [0])
        previous = stored.column("max_event_time_us")[0].as_py() if stored.num_rows else None
        seen = max((v for v in (previous, max_us) if v is not None), default=None)
        if seen is not None and seen != previous:
            ctx.state.stage_arrow(spec, max_event_time_row(spec, self.operator_id, seen, ctx.processing_time_ms, ctx.epoch))
        ctx.observe_assigner(self.operator_id, seen, self.out_of_orderness_us)  # (3.)
        return df

    def chained_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema | None:
        (schema,) = inputs
        ok = self.column in schema.names and schema.field(self.column).type == pa.timestamp("us", tz="UTC")
        return schema if ok else None

    def apply_chained(self, task: Any, inputs: Sequence[pa.Table]) -> pa.Table:
        """:meth:`apply` in one task: the same maximum, state row and observation (reported to the epoch by the driver)."""
        (records,) = inputs
        max_us = pc.max(records[self.column].cast(pa.int64())).as_py()  # (1.)
        if not self.tracked:
            task.observe(None, max_us, self.out_of_orderness_us)
            return records
        spec = self._spec()  # (2.)
        stored = task.every_live_row(spec)
        previous = stored.column("max_event_time_us")[0].as_py() if stored.num_rows else None
        seen = max((v for v in (previous, max_us) if v is not None), default=None)
        if seen is not None and seen != previous:
            row = max_event_time_row(spec, self.operator_id, seen, task.processing_time_ms, task.epoch)
            task.stage(spec, row.drop_columns(["_updated_at_ms", "_epoch"]))
        task.observe(self.operator_id, seen, self.out_of_orderness_us)  # (3.)
        return records

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "column": self.column, "out_of_orderness_us": self.out_of_orderness_us}


def max_event_time_row(spec: StateSpec, assigner: str, max_us: int, processing_time_ms: int, epoch: int) -> pa.Table:
    """The assigner's state row (2.), in the state table's form."""
    return pa.Table.from_pylist(
        [{"assigner": assigner, KEY_GROUP: 0, "max_event_time_us": max_us, "_updated_at_ms": processing_time_ms,
          "_deleted": False, "_epoch": epoch}],
        schema=spec.arrow_schema(),
    )  # fmt: skip


def combined_watermark(watermarks: dict[str, int | None], assigners: set[str]) -> tuple[bool, int | None]:
    """(3.) Whether every assigner has reported, and then the minimum of their watermarks (None if one has none)."""
    if set(watermarks) != assigners:
        return False, None
    values = list(watermarks.values())
    return True, (None if any(v is None for v in values) else min(v for v in values if v is not None))
