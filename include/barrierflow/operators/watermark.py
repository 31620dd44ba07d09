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

from dataclasses import dataclass, field
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.core.columns import KEY_GROUP, user_columns
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.base import Node, Task
from barrierflow.state.spec import StateSpec

__all__ = ["WatermarkAssigner", "WatermarkClock", "MAX_EVENT_TIME_STATE", "max_event_time_spec", "max_event_time_row"]

MAX_EVENT_TIME_STATE = "max_event_time"


@dataclass
class WatermarkAssigner(Node):
    column: str = "ts"
    out_of_orderness_us: int = 0
    # (2.) Set when the pipeline has several assigners: the maximum is kept in state.
    tracked: bool = False

    def passes_through(self, column: str) -> bool:
        return True  # it observes event time, never changes a record

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        (schema,) = inputs
        if self.column not in schema.names or not pa.types.is_timestamp(schema.field(self.column).type):
            found = schema.field(self.column).type if self.column in schema.names else "no such column"
            raise PipelineDefinitionError(
                f"watermark {self.operator_id!r}: its event-time column {self.column!r} must be a timestamp "
                f"(found: {found}; columns: {user_columns(schema.names)})"
            )
        return schema

    def state_specs(self, inputs: Sequence[pa.Schema] | None = None) -> list[StateSpec]:
        return [max_event_time_spec(self.operator_id)] if self.tracked else []

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        (records,) = inputs
        column = records[self.column]
        micros = column.cast(pa.timestamp("us", tz=column.type.tz)).cast(pa.int64())
        task.observe_event_time(self.operator_id, pc.max(micros).as_py(), self.out_of_orderness_us)  # (1.)
        return records

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "column": self.column, "out_of_orderness_us": self.out_of_orderness_us}


def max_event_time_spec(assigner_id: str) -> StateSpec:
    """(2.) The one-row state table of a tracked assigner's largest event time."""
    return StateSpec(
        operator_id=assigner_id,
        name=MAX_EVENT_TIME_STATE,
        key_fields=(pa.field("assigner", pa.string()),),
        value_fields=(pa.field("max_event_time_us", pa.int64()),),
    )


def max_event_time_row(spec: StateSpec, assigner: str, max_us: int, processing_time_ms: int, epoch: int) -> pa.Table:
    """The assigner's state row (2.), in the state table's form."""
    return pa.Table.from_pylist(
        [{"assigner": assigner, KEY_GROUP: 0, "max_event_time_us": max_us, "_updated_at_ms": processing_time_ms,
          "_deleted": False, "_epoch": epoch}],
        schema=spec.arrow_schema(),
    )  # fmt: skip


@dataclass
class WatermarkClock:
    """W(n) as an epoch's assigners observe it (steps 1-3): in one task, or on the driver over every task's observations.

    ``maxima`` are the assigners' largest event times before the epoch: the
    checkpoint record's for a pipeline's only assigner (``tracked`` False),
    each one's state row when there are several. :meth:`observe` folds in an
    observation; :attr:`watermark_us` is W(n-1) until every assigner has
    observed, then W(n), never below W(n-1).
    """

    watermark_prev_us: int | None  # W(n-1)
    maxima: dict[str, int | None]  # assigner id -> its largest event time so far
    bounds: dict[str, int]  # assigner id -> its out-of-orderness
    tracked: bool  # several assigners, each keeping its maximum in state (2.)
    observations: list[tuple[str | None, int | None, int]] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set)

    def copy(self) -> "WatermarkClock":
        """This clock for a task: what was observed so far, without the observations to report."""
        return WatermarkClock(self.watermark_prev_us, dict(self.maxima), dict(self.bounds), self.tracked, [], set(self._seen))

    def observe(self, assigner_id: str, max_us: int | None, out_of_orderness_us: int) -> None:
        self.observations.append((assigner_id, max_us, out_of_orderness_us))
        self._seen.add(assigner_id)
        self.bounds[assigner_id] = out_of_orderness_us
        previous = self.maxima.get(assigner_id)
        if max_us is not None:
            self.maxima[assigner_id] = max(max_us, previous) if previous is not None else max_us

    def merge(self, observations: Sequence[tuple[str | None, int | None, int]]) -> None:
        """Observations of other tasks of the epoch."""
        for assigner_id, max_us, bound in observations:
            assert assigner_id is not None
            self.observe(assigner_id, max_us, bound)

    @property
    def complete(self) -> bool:
        """Whether every assigner has observed (an event-time operator may run)."""
        return self._seen >= set(self.bounds)

    @property
    def watermark_us(self) -> int | None:
        """(3.) The minimum over the assigners of their maximum minus their bound; W(n-1) until every one observed."""
        if not self.complete:
            return self.watermark_prev_us
        marks = [None if self.maxima.get(a) is None else self.maxima[a] - b for a, b in self.bounds.items()]  # type: ignore[operator]
        if not marks or any(m is None for m in marks):
            return self.watermark_prev_us
        return min(m for m in marks if m is not None)

    @property
    def max_event_time_us(self) -> int | None:
        """The largest event time of any assigner so far (the checkpoint record's)."""
        values = [v for v in self.maxima.values() if v is not None]
        return max(values) if values else None
