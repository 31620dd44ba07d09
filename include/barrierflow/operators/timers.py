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

A timer is unique per key, domain and timestamp (registering it twice
keeps one). Without a watermark (no ``assign_timestamps_and_watermarks``
upstream) event-time timers never fire.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.core.errors import PipelineDefinitionError, UserFunctionError
from barrierflow.state.spec import StateSpec

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = ["TimeDomain", "TimerService", "TIMER_STATE", "TIMER_DOMAIN", "TIMER_TIMESTAMP", "timer_spec", "due_timers", "EpochClocks"]

# The timer state table's name and its two key columns besides the user's key.
TIMER_STATE = "timers"
TIMER_DOMAIN = "timer_domain"
TIMER_TIMESTAMP = "timer_timestamp"

_UTC_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class TimeDomain(enum.Enum):
    """Which clock a timer follows (Flink's ``TimeDomain``)."""

    EVENT_TIME = "event_time"
    PROCESSING_TIME = "processing_time"


def timer_spec(operator_id: str, key_fields: tuple[pa.Field, ...]) -> StateSpec:
    """The timer state table of a process operator keyed by ``key_fields``."""
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


def due_timers(watermark_us: int | None, processing_time_ms: int) -> "Column":
    """Spark condition on timer rows: the timer fires this epoch (event time at or below W(n), processing time at or below P(n))."""
    from pyspark.sql import functions as F

    processing = (F.col(TIMER_DOMAIN) == F.lit(TimeDomain.PROCESSING_TIME.value)) & (
        F.unix_micros(F.col(TIMER_TIMESTAMP)) <= F.lit(processing_time_ms * 1000)
    )
    if watermark_us is None:
        return processing
    event = (F.col(TIMER_DOMAIN) == F.lit(TimeDomain.EVENT_TIME.value)) & (
        F.unix_micros(F.col(TIMER_TIMESTAMP)) <= F.lit(watermark_us)
    )
    return event | processing


def due_timer_mask(timers: pa.Table, watermark_us: int | None, processing_time_ms: int) -> pa.ChunkedArray:
    """:func:`due_timers` on an Arrow table of timer rows (a chained task's): which rows fire this epoch."""
    stamps = pc.cast(timers.column(TIMER_TIMESTAMP), pa.int64())
    domains = timers.column(TIMER_DOMAIN)
    due = pc.and_(pc.equal(domains, TimeDomain.PROCESSING_TIME.value), pc.less_equal(stamps, processing_time_ms * 1000))
    if watermark_us is not None:
        due = pc.or_(due, pc.and_(pc.equal(domains, TimeDomain.EVENT_TIME.value), pc.less_equal(stamps, watermark_us)))
    return pc.fill_null(due, False)


def to_micros(timestamp: datetime | int, what: str) -> int:
    """A timer timestamp as microseconds since the epoch: a zone-aware datetime, or an int of milliseconds (Flink's unit)."""
    if isinstance(timestamp, bool):
        raise UserFunctionError(f"{what}: timestamp {timestamp!r} is a bool; give a zone-aware datetime or int milliseconds since the epoch")
    if isinstance(timestamp, int):
        return timestamp * 1000
    if isinstance(timestamp, datetime):
        if timestamp.tzinfo is None:
            raise UserFunctionError(
                f"{what}: timestamp {timestamp.isoformat()} has no time zone; give a zone-aware datetime "
                "(record timestamps are UTC) or int milliseconds since the epoch"
            )
        return (timestamp - _UTC_EPOCH) // timedelta(microseconds=1)
    raise UserFunctionError(
        f"{what}: timestamp {timestamp!r} is a {type(timestamp).__name__}; give a zone-aware datetime or int milliseconds since the epoch"
    )


def from_micros(us: int) -> datetime:
    return _UTC_EPOCH + timedelta(microseconds=us)


@dataclass
class TimerService:
    """The current key's timers and clocks, as a process function sees them.

    ``watermark_us`` is the watermark the function sees now: W(n-1) while
    records are processed, W(n) while timers fire (see the module's steps).
    """

    watermark_us: int | None
    processing_time_ms: int
    timers: set[tuple[TimeDomain, int]] = field(default_factory=set)
    enabled: bool = True

    def current_watermark(self) -> datetime | None:
        return None if self.watermark_us is None else from_micros(self.watermark_us)

    def current_processing_time(self) -> datetime:
        return from_micros(self.processing_time_ms * 1000)

    def register_event_time_timer(self, timestamp: datetime | int) -> None:
        self._change(TimeDomain.EVENT_TIME, timestamp, add=True)

    def register_processing_time_timer(self, timestamp: datetime | int) -> None:
        self._change(TimeDomain.PROCESSING_TIME, timestamp, add=True)

    def delete_event_time_timer(self, timestamp: datetime | int) -> None:
        self._change(TimeDomain.EVENT_TIME, timestamp, add=False)

    def delete_processing_time_timer(self, timestamp: datetime | int) -> None:
        self._change(TimeDomain.PROCESSING_TIME, timestamp, add=False)

    def _change(self, domain: TimeDomain, timestamp: datetime | int, *, add: bool) -> None:
        verb = "register" if add else "delete"
        if not self.enabled:
            raise PipelineDefinitionError(
                f"{verb}_{domain.value}_timer: this process function does not implement on_timer, so its "
                "timers could never fire; implement on_timer(self, timestamp, ctx, out) to use timers"
            )
        timer = (domain, to_micros(timestamp, f"{verb}_{domain.value}_timer"))
        if add:
            self.timers.add(timer)
        else:
            self.timers.discard(timer)


@dataclass(frozen=True)
class EpochClocks:
    """The epoch's number and clocks, as its key groups see them: P(n), W(n-1) and W(n)."""

    epoch: int
    processing_time_ms: int
    watermark_prev_us: int | None = None
    watermark_us: int | None = None

    def limit_us(self, domain: TimeDomain) -> int | None:
        """The latest timestamp of ``domain`` that fires this epoch: W(n) or P(n) (None: none fires)."""
        return self.watermark_us if domain is TimeDomain.EVENT_TIME else self.processing_time_ms * 1000

    def any_due(self, timers: set[tuple[TimeDomain, int]]) -> bool:
        """Whether any of a key's stored timers fires this epoch."""
        return any((limit := self.limit_us(d)) is not None and ts <= limit for d, ts in timers)

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
