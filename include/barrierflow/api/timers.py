"""The timer service a keyed process function uses: Flink's ``TimerService`` and ``TimeDomain`` (README "Timers").

``ctx.timer_service()`` gives the current key's timers and the epoch's clocks; which timers fire, and when, is
:mod:`barrierflow.operators.timers`'. Timers are kept in microseconds.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from barrierflow.core.errors import PipelineDefinitionError, UserFunctionError

__all__ = ["TimeDomain", "TimerService", "to_micros", "from_micros"]

_UTC_EPOCH, _MICROSECOND = datetime(1970, 1, 1, tzinfo=timezone.utc), timedelta(microseconds=1)


class TimeDomain(enum.Enum):
    """Which clock a timer follows (Flink's ``TimeDomain``)."""

    EVENT_TIME = "event_time"
    PROCESSING_TIME = "processing_time"


def to_micros(timestamp: datetime | int, what: str) -> int:
    """A timer timestamp as microseconds since the epoch: a zone-aware datetime, or an int of milliseconds (Flink's unit)."""
    if isinstance(timestamp, datetime):
        if timestamp.tzinfo is None:
            raise UserFunctionError(
                f"{what}: timestamp {timestamp.isoformat()} has no time zone; give a zone-aware datetime "
                "(record timestamps are UTC) or int milliseconds since the epoch"
            )
        return (timestamp - _UTC_EPOCH) // _MICROSECOND
    if isinstance(timestamp, int) and not isinstance(timestamp, bool):
        return timestamp * 1000
    raise UserFunctionError(
        f"{what}: timestamp {timestamp!r} is a {type(timestamp).__name__}; give a zone-aware datetime or int milliseconds since the epoch"
    )


def from_micros(us: int) -> datetime:
    """Microseconds since the epoch as a UTC datetime."""
    return _UTC_EPOCH + timedelta(microseconds=us)


@dataclass
class TimerService:
    """The current key's timers and clocks; a timer is unique per domain and timestamp (registered twice, kept once).

    ``watermark_us`` is the watermark the function sees now: W(n-1) while records are processed, W(n) while timers fire.
    """

    watermark_us: int | None
    processing_time_ms: int
    event_timers: set[int] = field(default_factory=set)
    processing_timers: set[int] = field(default_factory=set)
    enabled: bool = True

    def current_watermark(self) -> datetime | None:
        return None if self.watermark_us is None else from_micros(self.watermark_us)

    def current_processing_time(self) -> datetime:
        return from_micros(self.processing_time_ms * 1000)

    def register_event_time_timer(self, timestamp: datetime | int) -> None:
        self._of(TimeDomain.EVENT_TIME, "register").add(to_micros(timestamp, "register_event_time_timer"))

    def register_processing_time_timer(self, timestamp: datetime | int) -> None:
        self._of(TimeDomain.PROCESSING_TIME, "register").add(to_micros(timestamp, "register_processing_time_timer"))

    def delete_event_time_timer(self, timestamp: datetime | int) -> None:
        self._of(TimeDomain.EVENT_TIME, "delete").discard(to_micros(timestamp, "delete_event_time_timer"))

    def delete_processing_time_timer(self, timestamp: datetime | int) -> None:
        self._of(TimeDomain.PROCESSING_TIME, "delete").discard(to_micros(timestamp, "delete_processing_time_timer"))

    def _of(self, domain: TimeDomain, verb: str) -> set[int]:
        if not self.enabled:
            raise PipelineDefinitionError(
                f"{verb}_{domain.value}_timer: this process function does not implement on_timer, so its "
                "timers could never fire; implement on_timer(self, timestamp, ctx, out) to use timers"
            )
        return self.event_timers if domain is TimeDomain.EVENT_TIME else self.processing_timers
