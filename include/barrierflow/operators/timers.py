"""Timers of keyed process functions: Flink's ``TimerService``, checkpointed as keyed state.

A process function that implements ``on_timer`` registers timers for the
current key (``ctx.timer_service().register_event_time_timer(ts)``). Within
an epoch, as in Flink where the barrier's watermark follows the records
before it:

1. each key's records are processed in arrival order; the watermark a
   function sees meanwhile is W(n-1), the one at the start of the epoch;
2. then the epoch's watermark W(n) arrives: every event-time timer with a
   timestamp at or below W(n) fires, in timestamp order, including timers
   that earlier firings of this epoch registered;
3. then every processing-time timer at or below the epoch's processing time
   P(n) (the barrier's, so a retry fires the same timers) fires, in
   timestamp order; an event-time timer such a firing registers at or
   below W(n) fires right after it, before later processing-time timers;
4. the timers left (registered, not fired, not deleted) are the key's timer
   state: rows of the state table ``state/<operator_id>/timers`` (key
   columns, ``timer_domain``, ``timer_timestamp``), staged with the
   epoch's other state, so timers are checkpointed, restored by savepoints,
   redistributed by key group on rescale and exactly-once like any state.

A key with a timer due this epoch runs even if none of its records arrived
(its stored timers are read from the timer table of the task's key groups).
A timer is unique per key, domain and timestamp (registering it twice
keeps one). Without a watermark (no ``assign_timestamps_and_watermarks``
upstream) event-time timers never fire.

The user-facing :class:`TimeDomain` and :class:`TimerService` are
:mod:`barrierflow.api.timers`'; this module holds what the operator keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.api.timers import TimeDomain, TimerService, from_micros, to_micros
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.state.spec import StateSpec

__all__ = [
    "TimeDomain", "TimerService", "TIMER_STATE", "TIMER_DOMAIN", "TIMER_TIMESTAMP", "timer_spec", "due_timer_mask",
    "EpochClocks", "to_micros", "from_micros",
]  # fmt: skip

# (4.) The timer state table's name and its two key columns besides the user's key.
TIMER_STATE = "timers"
TIMER_DOMAIN = "timer_domain"
TIMER_TIMESTAMP = "timer_timestamp"


def timer_spec(operator_id: str, key_fields: tuple[pa.Field, ...]) -> StateSpec:
    """(4.) The timer state table of a process operator keyed by ``key_fields``."""
    clash = [f.name for f in key_fields if f.name in (TIMER_DOMAIN, TIMER_TIMESTAMP)]
    if clash:
        raise PipelineDefinitionError(
            f"process {operator_id}: key column(s) {clash} clash with the timer table's own columns "
            f"{TIMER_DOMAIN!r} and {TIMER_TIMESTAMP!r}: rename the key"
        )
    return StateSpec(
        operator_id=operator_id,
        name=TIMER_STATE,
        key_fields=(*key_fields, pa.field(TIMER_DOMAIN, pa.string()), pa.field(TIMER_TIMESTAMP, pa.timestamp("us", tz="UTC"))),
        value_fields=(),
    )


def due_timer_mask(timers: pa.Table, watermark_us: int | None, processing_time_ms: int) -> pa.ChunkedArray:
    """Which timer rows fire this epoch: event time at or below W(n) (2.), processing time at or below P(n) (3.)."""
    stamps = pc.cast(timers.column(TIMER_TIMESTAMP), pa.int64())
    domains = timers.column(TIMER_DOMAIN)
    due = pc.and_(pc.equal(domains, TimeDomain.PROCESSING_TIME.value), pc.less_equal(stamps, processing_time_ms * 1000))
    if watermark_us is not None:
        due = pc.or_(due, pc.and_(pc.equal(domains, TimeDomain.EVENT_TIME.value), pc.less_equal(stamps, watermark_us)))
    return pc.fill_null(due, False)


@dataclass(frozen=True)
class EpochClocks:
    """The epoch's number and clocks, as its keys see them: P(n), W(n-1) and W(n)."""

    epoch: int
    processing_time_ms: int
    watermark_prev_us: int | None = None
    watermark_us: int | None = None

    def limit_us(self, domain: TimeDomain) -> int | None:
        """The latest timestamp of ``domain`` that fires this epoch: W(n) or P(n) (None: none fires)."""
        return self.watermark_us if domain is TimeDomain.EVENT_TIME else self.processing_time_ms * 1000

    def next_due(self, timers: set[tuple[TimeDomain, int]]) -> tuple[TimeDomain, int] | None:
        """The next timer to fire (steps 2 and 3): the earliest due event-time timer, else the earliest due processing-time one.

        Asked again after every firing, so timers the firing registered or
        deleted take part.
        """
        for domain in (TimeDomain.EVENT_TIME, TimeDomain.PROCESSING_TIME):
            limit = self.limit_us(domain)
            due = [ts for d, ts in timers if d is domain and limit is not None and ts <= limit]
            if due:
                return domain, min(due)
        return None
