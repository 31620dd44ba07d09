"""Interval join of two keyed streams on event time, as Flink's ``IntervalJoin``.

``a.key_by("k").interval_join(b.key_by("k")).between(lower, upper, operator_id="j")``
joins a record ``l`` of ``a`` with a record ``r`` of ``b`` of the same key when
``l.ts + lower <= r.ts <= l.ts + upper`` (each bound inclusive unless
declared exclusive; an exclusive bound moves by one microsecond, the
timestamps' unit, as Flink's moves by one millisecond). Each side's event
time is the column of the watermark assigner upstream of it. Within epoch n,
with W(n-1) the watermark at its start and W(n) the one at its end:

1. Alignment: both inputs' records up to barrier n are joined in epoch n.
   Both inputs are keyed (each by its own key columns, as many, of the same
   types): the kernel sees every record of its keys from both sides.
2. Late records: a record whose event time is before W(n-1) can no longer
   join, as Flink drops an element older than the watermark: it goes to the
   side's late output if declared, else it is dropped and counted
   (``late records dropped by <operator_id>``). So does a record with a null
   key or event time that reaches the join (JSON Lines sources make it a
   dead letter before).
3. Join: every other record of the epoch is paired with the other side's
   records of this epoch and with those kept in state; each pair is emitted
   once, in the epoch in which the later of its two records arrives. Which
   pairs join never depends on the order of records within an epoch, nor on
   parallelism: records of one epoch all see the watermark W(n-1). Keys are
   equal as Spark compares them (-0.0 and 0.0 are one key, so are NaNs);
   the interval is compared exactly, whatever the timestamps.
4. State cleanup: a left record can join no record arriving later once
   W >= l.ts + upper (if upper > 0, else l.ts), a right record once
   W >= r.ts - lower (if lower < 0, else r.ts), Flink's cleanup times. At
   the end of the epoch, records whose cleanup time is at or below W(n) are
   deleted from state (or never stored), whether or not their key had
   records this epoch; the others are kept in ``<operator_id>__left`` and
   ``<operator_id>__right`` (:mod:`barrierflow.operators.join_buffer`): key
   columns, ``record_epoch`` and ``record_index`` (the record's rank among
   its key's records of that epoch, ordered by content), ``event_time_us``
   and the record as JSON. Staged with the epoch, kept by savepoints and
   redistributed by key group on rescale like all keyed state.
5. Watermark: the join's watermark is the minimum of its inputs': both
   inputs need a watermark assigner upstream, and with several assigners
   the pipeline's watermark is the minimum of theirs
   (:mod:`barrierflow.operators.watermark`).
6. Output: the first side's key columns, then the left record's other
   columns, then the right record's other columns (its key columns, equal
   to the left's, are left out); a column name on both sides becomes
   ``left_<name>`` and ``right_<name>``. Output rows carry no arrival
   position.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.core.columns import KEY_GROUP, user_columns
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.base import Task
from barrierflow.operators.join_buffer import (
    INT64_MAX,
    INT64_MIN,
    SIDES,
    SideRecords,
    TwoSidedJoin,
    at_most,
    buffer_columns,
    buffered_rows,
    event_time_us,
    joined_values,
    key_ids,
    output_columns,
    send_late,
    side_records,
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
        if side == "left":
            return self.high if self.high > 0 else 0
        return -self.low if self.low < 0 else 0

    def cleanup_us(self, side: str, ts_us: int) -> int:
        """(4.) The watermark at which a record of ``side`` at ``ts_us`` leaves state."""
        return ts_us + self.cleanup_shift(side)

    def pairs(self, left_us: np.ndarray, right_us: np.ndarray) -> np.ndarray:
        """(3.) :meth:`joins` of each pair of event times (int64), exact (no long overflows)."""
        with np.errstate(over="ignore"):
            gap = right_us - left_us  # wraps where the true gap is beyond a long
        overflow = ((right_us ^ left_us) & (right_us ^ gap)) < 0
        if self.low > INT64_MAX or self.high < INT64_MIN:
            joined = np.zeros(len(gap), dtype=bool)
        else:  # bounds beyond a long clamped: exact for every gap a long holds
            joined = (gap >= np.int64(max(self.low, INT64_MIN))) & (gap <= np.int64(min(self.high, INT64_MAX)))
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
        schema = self.output_schema(schemas)
        specs = self.state_specs(schemas)
        keys = (self.key, self.other_key)
        wp, wn = task.watermark_prev_us, task.watermark_us
        # 2. Late records: before W(n-1), or with a null key or event time.
        sides: list[SideRecords] = []
        for index, records in enumerate(inputs):
            ts, valid = event_time_us(records[self.time_columns[index]])
            late = ~valid if wp is None else ~valid | (ts < wp)
            sides.append(side_records(task, records, self.key, keys[index], ts, late))
        send_late(task, self, sides, self.late_schemas(schemas))
        # 3./4. Buffered records: those of the epoch's keys pair, those W(n) reaches leave state, whatever their key.
        # None is due unless the watermark advanced: every record kept has its cleanup time after W(n-1).
        advanced = wn is not None and (wp is None or wn > wp)
        touched = np.union1d(*(np.asarray(s.fresh[KEY_GROUP].to_numpy(), dtype=np.int64) for s in sides))
        candidates = []
        for index, (side, spec) in enumerate(zip(sides, specs)):
            stored = buffered_rows(task, spec, advanced or len(touched) > 0)
            if stored.num_rows:
                relevant = np.isin(np.asarray(stored[KEY_GROUP].to_numpy(), dtype=np.int64), touched)
                if advanced and wn is not None:
                    relevant |= self._due(index, stored, wn)
                stored = stored.filter(pa.array(relevant))
            columns = buffer_columns(spec)
            candidates.append(pa.concat_tables([side.fresh.select(columns.names).cast(columns), stored]))
        left_rows, right_rows = self._pairs(candidates, [s.fresh.num_rows for s in sides])
        out = self._output(schema, inputs, sides, candidates, left_rows, right_rows)  # 6.
        # 4. State after the epoch: new records still joinable at W(n) added, stored ones no longer joinable deleted.
        for index, (side, candidate, spec) in enumerate(zip(sides, candidates, specs)):
            is_new = np.arange(candidate.num_rows) < side.fresh.num_rows
            due = self._due(index, candidate, wn) if wn is not None else np.zeros(candidate.num_rows, dtype=bool)
            changed = (is_new & ~due) | (~is_new & due)
            changes = candidate.filter(pa.array(changed)).append_column("_deleted", pa.array(~is_new[changed], pa.bool_()))
            task.state(spec).stage(changes)
        return out

    def _due(self, index: int, rows: pa.Table, watermark_us: int) -> np.ndarray:
        """(4.) Rows whose cleanup time is at or below ``watermark_us`` (a stored row without an event time never is)."""
        ts = rows["event_time_us"]
        values = np.asarray(pc.fill_null(ts, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
        valid = np.asarray(pc.is_valid(ts).to_numpy(zero_copy_only=False), dtype=bool)
        return valid & at_most(values, watermark_us - self.bounds.cleanup_shift(SIDES[index]))

    def _pairs(self, candidates: Sequence[pa.Table], news: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(3.) The rows of the left and right candidates that pair, by left row then right row.

        Each side's candidates are its ``news`` records of the epoch, then its
        stored ones: a pair has the same key, ``low <= r.ts - l.ts <= high``,
        and at least one record of this epoch (stored pairs joined before).
        """
        left, right = candidates
        lid, rid = key_ids([left.select(list(self.key)), right.select(list(self.key))], self.key)

        def same_key(lefts: tuple[int, int], rights: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
            ls = pa.table({"_id": lid[lefts[0] : lefts[1]], "_l": np.arange(*lefts, dtype=np.int64)})
            rs = pa.table({"_id": rid[rights[0] : rights[1]], "_r": np.arange(*rights, dtype=np.int64)})
            joined = ls.join(rs, keys="_id", join_type="inner", use_threads=False)
            return np.asarray(joined["_l"].to_numpy(), dtype=np.int64), np.asarray(joined["_r"].to_numpy(), dtype=np.int64)

        # New left x every right, stored left x new right: never two stored records.
        halves = [same_key((0, news[0]), (0, right.num_rows)), same_key((news[0], left.num_rows), (0, news[1]))]
        lefts = np.concatenate([h[0] for h in halves])
        rights = np.concatenate([h[1] for h in halves])
        times = [c["event_time_us"] for c in candidates]
        valid = np.asarray(pc.is_valid(times[0].take(pa.array(lefts))).to_numpy(zero_copy_only=False), dtype=bool) & np.asarray(
            pc.is_valid(times[1].take(pa.array(rights))).to_numpy(zero_copy_only=False), dtype=bool
        )  # a stored record without an event time pairs with nothing
        lefts, rights = lefts[valid], rights[valid]
        lts = np.asarray(pc.fill_null(times[0].take(pa.array(lefts)), 0).to_numpy(zero_copy_only=False), dtype=np.int64)
        rts = np.asarray(pc.fill_null(times[1].take(pa.array(rights)), 0).to_numpy(zero_copy_only=False), dtype=np.int64)
        joined = self.bounds.pairs(lts, rts)
        lefts, rights = lefts[joined], rights[joined]
        order = np.lexsort((rights, lefts))
        return lefts[order], rights[order]

    def _output(
        self, schema: pa.Schema, inputs: Sequence[pa.Table], sides: Sequence[SideRecords], candidates: Sequence[pa.Table],
        left_rows: np.ndarray, right_rows: np.ndarray,
    ) -> pa.Table:  # fmt: skip
        """(6.) The key columns of the left record, then both records' other columns."""
        values = [
            joined_values(records, side.rows, candidate, side.fresh.num_rows, rows)
            for records, side, candidate, rows in zip(inputs, sides, candidates, (left_rows, right_rows))
        ]
        users = [user_columns(t.column_names) for t in inputs]
        columns = output_columns(self.key, users[0], users[1], self.other_key)
        arrays = [candidates[0][k].take(pa.array(left_rows, pa.int64())) for k in self.key]
        arrays += [values[SIDES.index(side)][column] for side, column, _ in columns[len(self.key) :]]
        return pa.Table.from_arrays([a.cast(f.type) for a, f in zip(arrays, schema)], schema=schema)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "inputs": [n.operator_id for n in self.inputs()],
            "key": list(self.key),
            "other_key": list(self.other_key),
            "lower_us": self.bounds.lower_us,
            "upper_us": self.bounds.upper_us,
            "lower_inclusive": self.bounds.lower_inclusive,
            "upper_inclusive": self.bounds.upper_inclusive,
            "time_columns": list(self.time_columns),
            "late_outputs": list(self.late_outputs),
        }
