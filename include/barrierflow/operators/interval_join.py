"""Interval join of two keyed streams on event time, as Flink's ``IntervalJoin`` (README "Interval join").

``a.key_by("k").interval_join(b.key_by("k")).between(lower, upper, operator_id="j")`` joins a record ``l`` of ``a`` with a record
``r`` of ``b`` of the same key when ``l.ts + lower <= r.ts <= l.ts + upper`` (an exclusive bound moves by one microsecond, the
timestamps' unit, as Flink's by one millisecond). Each side's event time is its watermark assigner's column. Buffers, late records
and joined rows are :mod:`barrierflow.operators.join_buffer`'s. Within epoch n, with W(n-1) the watermark at its start and W(n)
the one at its end:

1. Alignment: both inputs' records up to barrier n are joined in epoch n.
2. Late records: a record whose event time is before W(n-1) can no longer join, as Flink drops an element older than the
   watermark: it is late.
3. Join: every other record of the epoch is paired with the other side's records of this epoch and with those kept in state; each
   pair is emitted once, in the epoch in which the later of its two records arrives. Which pairs join never depends on the order
   of records within an epoch, nor on parallelism: records of one epoch all see W(n-1). Keys are equal as Spark compares them
   (-0.0 and 0.0 are one key, so are NaNs); the interval is compared exactly, whatever the timestamps.
4. State cleanup: a left record can join no record arriving later once W >= l.ts + upper (if upper > 0, else l.ts), a right record
   once W >= r.ts - lower (if lower < 0, else r.ts), Flink's cleanup times. At the end of the epoch, records whose cleanup time is
   at or below W(n) leave state (or are never stored), whether or not their key had records this epoch; the others wait in the
   buffers.
5. Watermark: the minimum of the inputs' (both need an assigner upstream; :mod:`barrierflow.operators.watermark`).
6. Output: the key columns, then the left record's other columns and the right's; no arrival position.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import ClassVar, Sequence

import numpy as np
import pyarrow as pa

from barrierflow.core.columns import KEY_GROUP
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.base import Task, key_ids
from barrierflow.operators.join_buffer import (
    SIDES,
    TwoSidedJoin,
    at_most,
    due_rows,
    event_time_us,
    greater_than,
    ints,
    matches,
    side_candidates,
    side_records,
    stage_buffer,
)

__all__ = ["IntervalBounds", "IntervalJoin"]

_ONE_US = timedelta(microseconds=1)


@dataclass(frozen=True)
class IntervalBounds:
    """``l.ts + lower <= r.ts <= l.ts + upper`` in microseconds, each bound inclusive unless stated."""

    lower_us: int
    upper_us: int
    lower_inclusive: bool = True
    upper_inclusive: bool = True

    @classmethod
    def of(
        cls, lower: timedelta, upper: timedelta, lower_inclusive: bool = True, upper_inclusive: bool = True
    ) -> "IntervalBounds":
        for name, value in (("lower", lower), ("upper", upper)):
            if not isinstance(value, timedelta):
                raise PipelineDefinitionError(f"interval join: {name} bound must be a datetime.timedelta, got {value!r}")
        bounds = cls(lower // _ONE_US, upper // _ONE_US, lower_inclusive, upper_inclusive)
        if bounds.low > bounds.high:
            raise PipelineDefinitionError(
                f"interval join: lower bound {lower} must not be after upper bound {upper} (with exclusive bounds, "
                "strictly before); the interval of right timestamps a left record joins would be empty"
            )
        return bounds

    @property
    def low(self) -> int:
        """The smallest ``r.ts - l.ts`` that joins (an exclusive bound moves by one microsecond)."""
        return self.lower_us if self.lower_inclusive else self.lower_us + 1

    @property
    def high(self) -> int:
        return self.upper_us if self.upper_inclusive else self.upper_us - 1

    def joins(self, left_us: int, right_us: int) -> bool:
        """(3.) Whether records at these event times pair."""
        return self.low <= right_us - left_us <= self.high

    def cleanup_shift(self, side: str) -> int:
        """(4.) How far after its event time a record of ``side`` leaves state."""
        return max(self.high, 0) if side == "left" else max(-self.low, 0)

    def pairs(self, left_us: np.ndarray, right_us: np.ndarray) -> np.ndarray:
        """(3.) :meth:`joins` of each pair of event times (int64), exact (no long overflows)."""
        with np.errstate(over="ignore"):
            gap = right_us - left_us  # wraps where the true gap is beyond a long
        overflow = ((right_us ^ left_us) & (right_us ^ gap)) < 0
        joined = greater_than(gap, self.low - 1) & at_most(gap, self.high)  # exact for every gap a long holds
        for i in np.flatnonzero(overflow):  # event times more than 292,000 years apart
            joined[i] = self.joins(int(left_us[i]), int(right_us[i]))
        return joined


@dataclass
class IntervalJoin(TwoSidedJoin):
    """Joins ``parent`` keyed by ``key`` (left) with ``other`` keyed by ``other_key`` (right) within ``bounds``."""

    bounds: IntervalBounds = IntervalBounds(0, 0)

    kind: ClassVar[str] = "interval join"

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        schemas = [t.schema for t in inputs]
        schema, specs = self.output_schema(schemas), self.state_specs(schemas)
        wp, wn = task.watermark_prev_us, task.watermark_us
        # 2. Late records: before W(n-1), or with a null key or event time.
        sides = []
        for records, key, time in zip(inputs, (self.key, self.other_key), self.time_columns):
            ts, valid = event_time_us(records[time])
            sides.append(side_records(task, records, self.key, key, ts, ~valid if wp is None else ~valid | (ts < wp)))
        self.send_late(task, sides, schemas)
        # 3./4. Buffered records: those of the epoch's keys pair, those W(n) reaches leave state, whatever their key. None is due
        # unless the watermark advanced: every record kept has its cleanup time after W(n-1).
        advanced = wn is not None and (wp is None or wn > wp)
        touched = np.union1d(*(ints(s.fresh[KEY_GROUP]) for s in sides))
        candidates = [
            side_candidates(
                task, spec, side.fresh, advanced or len(touched) > 0,
                lambda rows: np.isin(ints(rows[KEY_GROUP]), touched) | self._due(index, rows, wn if advanced else None),
            )
            for index, (side, spec) in enumerate(zip(sides, specs))
        ]  # fmt: skip
        pairs = self._pairs(candidates, [s.fresh.num_rows for s in sides])
        out = self.joined(schema, inputs, [(s.rows, s.fresh.num_rows) for s in sides], candidates, pairs)  # 6.
        # 4. State after the epoch: new records still joinable at W(n) added, stored ones no longer joinable deleted.
        for index, (side, candidate, spec) in enumerate(zip(sides, candidates, specs)):
            stage_buffer(task, spec, candidate, side.fresh.num_rows, self._due(index, candidate, wn))
        return out

    def _due(self, index: int, rows: pa.Table, watermark_us: int | None) -> np.ndarray:
        """(4.) Rows whose cleanup time is at or below ``watermark_us`` (a stored row without an event time never is)."""
        shift = self.bounds.cleanup_shift(SIDES[index])
        return due_rows(rows["event_time_us"], None if watermark_us is None else watermark_us - shift)

    def _pairs(self, candidates: Sequence[pa.Table], news: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(3.) The rows of the left and right candidates that pair, by left row then right row. Each side's candidates are its
        ``news`` records of the epoch, then its stored ones: a pair has the same key, ``low <= r.ts - l.ts <= high``, and at least
        one record of this epoch (stored pairs joined before)."""
        _, (left, right) = key_ids(candidates, self.key)

        def same_key(lefts: slice, rights: slice) -> tuple[np.ndarray, np.ndarray]:
            ls = pa.table({"_id": left[lefts], "_l": np.arange(len(left))[lefts]})
            return matches(ls, pa.table({"_id": right[rights], "_r": np.arange(len(right))[rights]}))

        # New left x every right, stored left x new right (never two stored records); sorted as the halves are.
        halves = [same_key(slice(0, news[0]), slice(None)), same_key(slice(news[0], None), slice(0, news[1]))]
        lefts, rights = (np.concatenate(rows) for rows in zip(*halves))
        (lts, lvalid), (rts, rvalid) = (event_time_us(c["event_time_us"]) for c in candidates)
        # A stored record without an event time pairs with nothing.
        joined = lvalid[lefts] & rvalid[rights] & self.bounds.pairs(lts[lefts], rts[rights])
        return lefts[joined], rights[joined]
