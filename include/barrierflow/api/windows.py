"""Event-time window assigners: which windows a record belongs to (README "Windows"); times in microseconds (UTC).

- :class:`TumblingEventTimeWindows` ``.of(size)``: the window ``[k * size, (k + 1) * size)`` holding the record.
- :class:`SlidingEventTimeWindows` ``.of(size, slide)``: every window ``[k * slide, k * slide + size)`` holding it (aligned to the
  Unix epoch, as Flink's with offset 0). A slide above the size is refused: records between two windows would belong to none.
- :class:`EventTimeSessionWindows` ``.with_gap(gap)``: per key, records at most ``gap`` apart form one session
  ``[first ts, last ts + gap)``.

Each reads the event time from ``time_column`` (``"ts"`` unless given); :mod:`barrierflow.operators.window` fires them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

from barrierflow.core.errors import PipelineDefinitionError

__all__ = ["WindowAssigner", "TumblingEventTimeWindows", "SlidingEventTimeWindows", "EventTimeSessionWindows", "micros"]

_ONE_US = timedelta(microseconds=1)


def micros(what: str, value: Any, *, positive: bool) -> int:
    """``value`` (a timedelta) in whole microseconds; refuses what no window can use."""
    if not isinstance(value, timedelta):
        raise PipelineDefinitionError(f"{what} must be a datetime.timedelta, got {value!r}")
    us = value // _ONE_US  # exact integer arithmetic (no float seconds)
    if positive and us <= 0:
        raise PipelineDefinitionError(f"{what} must be a positive timedelta, got {value!r}")
    if not positive and us < 0:
        raise PipelineDefinitionError(f"{what} must be zero or a positive timedelta, got {value!r}")
    return us


class WindowAssigner:
    """Which event-time windows a record belongs to; a subclass is a dataclass of timedeltas and ``time_column``."""

    time_column: str
    kind: ClassVar[str]

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if f.name != "time_column":
                micros(f"{self.kind} window {f.name}", getattr(self, f.name), positive=True)
        if not isinstance(self.time_column, str) or not self.time_column:
            raise PipelineDefinitionError(f"{self.kind} window: time_column must be a column name, got {self.time_column!r}")

    def windows(self, ts_us: int) -> list[tuple[int, int]]:
        """The ``(start_us, end_us)`` windows of a record at ``ts_us`` (before any merge), latest start first."""
        raise NotImplementedError


class _FixedWindows(WindowAssigner):  # windows of ``size`` every ``slide_us`` (tumbling: the size)
    size: timedelta

    @property
    def size_us(self) -> int:
        return self.size // _ONE_US

    @property
    def slide_us(self) -> int:
        return self.size_us

    def windows(self, ts_us: int) -> list[tuple[int, int]]:
        last = ts_us - ts_us % self.slide_us  # Python's % is a floor modulo, as Spark's pmod
        starts = [last - k * self.slide_us for k in range(-(-self.size_us // self.slide_us))]  # ceil, in integers
        return [(s, s + self.size_us) for s in starts if s + self.size_us > ts_us]


@dataclass(frozen=True)
class TumblingEventTimeWindows(_FixedWindows):
    size: timedelta
    time_column: str = "ts"
    kind: ClassVar[str] = "tumbling"

    @classmethod
    def of(cls, size: timedelta, time_column: str = "ts") -> "TumblingEventTimeWindows":
        return cls(size, time_column)


@dataclass(frozen=True)
class SlidingEventTimeWindows(_FixedWindows):
    size: timedelta
    slide: timedelta
    time_column: str = "ts"
    kind: ClassVar[str] = "sliding"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.slide > self.size:
            raise PipelineDefinitionError(
                f"sliding window slide {self.slide} is larger than its size {self.size}: records between two windows "
                "would belong to none; give a slide at most the size (equal: tumbling windows)"
            )

    @classmethod
    def of(cls, size: timedelta, slide: timedelta, time_column: str = "ts") -> "SlidingEventTimeWindows":
        return cls(size, slide, time_column)

    @property
    def slide_us(self) -> int:
        return self.slide // _ONE_US


@dataclass(frozen=True)
class EventTimeSessionWindows(WindowAssigner):
    gap: timedelta
    time_column: str = "ts"
    kind: ClassVar[str] = "session"

    @classmethod
    def with_gap(cls, gap: timedelta, time_column: str = "ts") -> "EventTimeSessionWindows":
        return cls(gap, time_column)

    @property
    def gap_us(self) -> int:
        return self.gap // _ONE_US

    def windows(self, ts_us: int) -> list[tuple[int, int]]:
        return [(ts_us, ts_us + self.gap_us)]
