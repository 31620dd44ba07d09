"""Event-time watermarks: W(n) = max event time up to epoch n - out-of-orderness, the minimum over assigners.

1. An assigner's watermark is the largest event time of its records up to epoch n minus its out-of-orderness.
2. One assigner keeps that maximum in the checkpoint record; several (one per source of a join...) each keep theirs in a one-row
   state table ``<assigner id>__max_event_time``.
3. W(n) is the minimum of the assigners' watermarks, as Flink's for an operator with several inputs: none while one has seen no
   record, and never decreasing.
4. So every event-time operator (windows, joins, timers) must be downstream of all assigners (checked at declaration).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.core.columns import DELETED
from barrierflow.operators.base import Node, Task, check_event_time, held_state_table
from barrierflow.state.spec import StateSpec

__all__ = ["WatermarkAssigner", "WatermarkClock", "max_event_time_spec", "max_event_time_row"]


@dataclass
class WatermarkAssigner(Node):
    column: str = "ts"
    out_of_orderness_us: int = 0
    tracked: bool = False  # (2.) the pipeline has several assigners: the maximum is kept in state

    def passes_through(self, column: str) -> bool:
        return True  # it observes event time, never changes a record

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        (schema,) = inputs
        check_event_time(f"watermark {self.operator_id!r}", schema, self.column)
        return schema

    def state_specs(self, inputs: Sequence[pa.Schema] | None = None) -> list[StateSpec]:
        return [max_event_time_spec(self.operator_id)] if self.tracked else []

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        (records,) = inputs
        column = records[self.column]
        micros = column.cast(pa.timestamp("us", tz=column.type.tz)).cast(pa.int64())
        task.observe_event_time(self.operator_id, pc.max(micros).as_py(), self.out_of_orderness_us)  # (1.)
        return records


def max_event_time_spec(assigner_id: str) -> StateSpec:
    """(2.) The one-row state table of a tracked assigner's largest event time."""
    key, value = (pa.field("assigner", pa.string()),), (pa.field("max_event_time_us", pa.int64()),)
    return StateSpec(assigner_id, "max_event_time", key, value)


def max_event_time_row(spec: StateSpec, assigner: str, max_us: int, processing_time_ms: int, epoch: int) -> pa.Table:
    """The assigner's state row (2.), in the state table's form."""
    row = {"assigner": assigner, "max_event_time_us": max_us, DELETED: False}
    return held_state_table(spec, [row], epoch, processing_time_ms)


@dataclass
class WatermarkClock:
    """W(n) as an epoch's assigners observe it (1.-3.), in a task or on the driver; ``maxima`` start as stored (2.)."""

    watermark_prev_us: int | None  # W(n-1): the watermark until every assigner has observed
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
        if max_us is not None:
            self.maxima[assigner_id] = max(v for v in (max_us, self.maxima.get(assigner_id)) if v is not None)

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
        maxima = {a: self.maxima.get(a) for a in self.bounds}
        if not self.complete or not maxima or None in maxima.values():
            return self.watermark_prev_us
        return min(m - self.bounds[a] for a, m in maxima.items() if m is not None)

    @property
    def max_event_time_us(self) -> int | None:
        """The largest event time of any assigner so far (the checkpoint record's)."""
        return max((v for v in self.maxima.values() if v is not None), default=None)
