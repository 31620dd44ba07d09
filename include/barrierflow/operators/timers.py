"""Timers of keyed process functions: Flink's ``TimerService``, checkpointed as keyed state (README "Timers").

A process function implementing ``on_timer`` registers timers for the current key. In an epoch, as in Flink where the
barrier's watermark follows the records before it, each key:

1. has its records processed in arrival order, seeing W(n-1);
2. then fires its event-time timers at or below W(n), in timestamp order, those earlier firings registered included;
3. then its processing-time timers at or below the barrier's time P(n), in timestamp order, each followed by the
   event-time timers it registered at or below W(n);
4. keeps the timers left as its rows of ``<operator_id>__timers`` (key columns, ``timer_domain``,
   ``timer_timestamp``), keyed state like any.

A key with a due timer runs without records. A timer is unique per key, domain and timestamp. Without a watermark,
event-time timers never fire.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.api.timers import TimeDomain, TimerService
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.state.spec import StateSpec

__all__ = ["TIMER_STATE", "TIMER_DOMAIN", "TIMER_TIMESTAMP", "timer_spec", "due_timer_mask", "pop_due"]

TIMER_STATE, TIMER_DOMAIN, TIMER_TIMESTAMP = "timers", "timer_domain", "timer_timestamp"  # (4.) its name, its key columns
_EVENT, _PROCESSING = TimeDomain.EVENT_TIME, TimeDomain.PROCESSING_TIME


def timer_spec(operator_id: str, key_fields: tuple[pa.Field, ...]) -> StateSpec:
    """(4.) The timer state table of a process operator keyed by ``key_fields``."""
    clash = [f.name for f in key_fields if f.name in (TIMER_DOMAIN, TIMER_TIMESTAMP)]
    if clash:
        raise PipelineDefinitionError(
            f"process {operator_id}: key column(s) {clash} clash with the timer table's own columns "
            f"{TIMER_DOMAIN!r} and {TIMER_TIMESTAMP!r}: rename the key"
        )
    timer = (pa.field(TIMER_DOMAIN, pa.string()), pa.field(TIMER_TIMESTAMP, pa.timestamp("us", tz="UTC")))
    return StateSpec(operator_id, TIMER_STATE, (*key_fields, *timer), ())


def due_timer_mask(timers: pa.Table, watermark_us: int | None, processing_time_ms: int) -> pa.ChunkedArray:
    """Which timer rows fire this epoch: event time at or below W(n) (2.), processing time at or below P(n) (3.)."""
    stamps = pc.cast(timers.column(TIMER_TIMESTAMP), pa.int64())
    domains = timers.column(TIMER_DOMAIN)
    due = pc.and_(pc.equal(domains, TimeDomain.PROCESSING_TIME.value), pc.less_equal(stamps, processing_time_ms * 1000))
    if watermark_us is not None:
        due = pc.or_(due, pc.and_(pc.equal(domains, TimeDomain.EVENT_TIME.value), pc.less_equal(stamps, watermark_us)))
    return pc.fill_null(due, False)


def pop_due(service: TimerService) -> tuple[TimeDomain, int] | None:
    """Take the key's next due timer (2., 3.), per firing: earliest event time <= its watermark (W(n)), else processing <= P(n)"""
    now_us = service.processing_time_ms * 1000
    clocks = ((_EVENT, service.event_timers, service.watermark_us), (_PROCESSING, service.processing_timers, now_us))
    for domain, stamps, limit in clocks:
        if stamps and limit is not None and (first := min(stamps)) <= limit:
            stamps.discard(first)
            return domain, first
    return None
