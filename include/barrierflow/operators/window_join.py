"""Window join of two streams on event time, as Flink's ``DataStream.join(...).where(...).equal_to(...).window(...)``.

``a.join(b).where("k").equal_to("k").window(bf.TumblingEventTimeWindows.of(size), operator_id="j")`` pairs every record of ``a``
with every record of ``b`` of the same key in the same tumbling or sliding window (README "Window join"). Each side's event time
is its watermark assigner's column (the window assigner's ``time_column`` is not used). Buffers, late records and joined rows are
:mod:`barrierflow.operators.join_buffer`'s. Within epoch n, with W(n-1) the watermark at its start and W(n) the one at its end:

1. Alignment: both inputs' records up to barrier n are joined in epoch n.
2. Window assignment and lateness, as a window without allowed lateness (:mod:`barrierflow.operators.window` steps 1-2): a record
   belongs to every window holding its event time; a window is late when its end is at or before W(n-1) (it fired already). A
   record whose windows are all late is late; the others join in their windows that are not late. Window bounds are exact,
   whatever the timestamps (a window that would begin before the earliest microsecond a timestamp holds is left out).
3. Buffering: each side's records wait, per key and window, in the buffers (keyed by ``window_start`` too).
4. Firing: every window whose end is at or before W(n) fires, in this epoch, with one row per pair of a left and a right record of
   its key and window (none if one side has none, as Flink's inner join), whether its records arrived in this epoch or before; its
   buffered records then leave state (its records of this epoch are never stored). Keys are equal as Spark compares them (-0.0 and
   0.0 are one key, so are NaNs). Which pairs a window emits never depends on the order of records, on how they were cut into
   epochs, or on parallelism.
5. Watermark: the minimum of the inputs' (both need an assigner upstream).
6. Output: the key columns, ``window_start``, ``window_end``, then the left record's other columns and the right's.
7. Exactly-once: the buffers are keyed state (see join_buffer).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import ClassVar, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.api.windows import SlidingEventTimeWindows, TumblingEventTimeWindows
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.base import Task, key_ids
from barrierflow.operators.join_buffer import (
    TwoSidedJoin,
    aligned_windows,
    due_rows,
    event_time_us,
    matches,
    side_candidates,
    side_records,
    stage_buffer,
)

__all__ = ["WindowJoin"]

_TIMESTAMP = pa.timestamp("us", tz="UTC")
_WINDOW_START = pa.field("window_start", _TIMESTAMP)


@dataclass
class WindowJoin(TwoSidedJoin):
    """Joins ``parent`` keyed by ``key`` (left) with ``other`` keyed by ``other_key`` (right) per window of ``assigner``."""

    assigner: TumblingEventTimeWindows | SlidingEventTimeWindows = TumblingEventTimeWindows(timedelta(minutes=1))

    own_fields: ClassVar[tuple[pa.Field, ...]] = (_WINDOW_START,)
    own_output_fields: ClassVar[tuple[pa.Field, ...]] = (_WINDOW_START, pa.field("window_end", _TIMESTAMP))
    kind: ClassVar[str] = "window join"

    def __post_init__(self) -> None:
        if not isinstance(self.assigner, (TumblingEventTimeWindows, SlidingEventTimeWindows)):
            raise PipelineDefinitionError(
                f"window join {self.operator_id!r}: {self.assigner!r} is not a window assigner a join can use; give "
                "bf.TumblingEventTimeWindows.of(size) or bf.SlidingEventTimeWindows.of(size, slide)"
            )

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        schemas = [t.schema for t in inputs]
        schema, specs = self.output_schema(schemas), self.state_specs(schemas)
        size = self.assigner.size_us
        wp, wn = task.watermark_prev_us, task.watermark_us
        # 2. Each record's windows that are not late (ending after W(n-1)); a record without one is late.
        sides, fresh = [], []  # fresh: each side's records per window, and their rows in the input
        for records, key, time in zip(inputs, (self.key, self.other_key), self.time_columns):
            ts, valid = event_time_us(records[time])
            rows, starts = aligned_windows(self.assigner, ts, valid, None if wp is None else wp - size)
            windowed = np.zeros(records.num_rows, dtype=bool)
            windowed[rows] = True
            side = side_records(task, records, self.key, key, ts, ~windowed)
            sides.append(side)
            position = np.full(records.num_rows, -1, dtype=np.int64)
            position[side.rows] = np.arange(len(side.rows))
            kept = position[rows] >= 0  # not late for a null key
            at = position[rows[kept]]
            per_window = side.fresh.take(pa.array(at, pa.int64()))
            per_window = per_window.append_column("window_start", pa.array(starts[kept], pa.int64()).cast(_TIMESTAMP))
            fresh.append((per_window, side.rows[at]))
        self.send_late(task, sides, schemas)
        # 3./4. A buffered window fires only once W(n) passes its end: none unless the watermark advanced (every window kept ends
        # after W(n-1)); its rows are read whatever their key.
        advanced = wn is not None and (wp is None or wn > wp)
        fire_through = None if wn is None else wn - size  # a window fires when its start is at or before this
        candidates = [
            side_candidates(task, spec, per_window, advanced, lambda rows: due_rows(rows["window_start"], fire_through))
            for (per_window, _), spec in zip(fresh, specs)
        ]
        fires = [due_rows(c["window_start"], fire_through) for c in candidates]  # (4.)
        pairs = self._pairs(candidates, fires)
        lefts = pa.array(pairs[0], pa.int64())
        starts = candidates[0]["window_start"].cast(pa.int64()).take(lefts)
        own = [starts.cast(_TIMESTAMP), pc.add(starts, size).cast(_TIMESTAMP)]
        out = self.joined(schema, inputs, [(rows, w.num_rows) for w, rows in fresh], candidates, pairs, own)  # 6.
        # 3./4. New records of windows not firing are stored; stored records of firing windows leave.
        for (per_window, _), candidate, fire, spec in zip(fresh, candidates, fires, specs):
            stage_buffer(task, spec, candidate, per_window.num_rows, fire)
        return out

    def _pairs(self, candidates: Sequence[pa.Table], fires: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(4.) Rows of the left and right candidates in the same firing window of the same key, by left row then right row."""
        _, ids = key_ids(candidates, self.key)
        tables = []
        for c, side_ids, fire, name in zip(candidates, ids, fires, ("_l", "_r")):
            at = np.flatnonzero(fire)
            starts = c["window_start"].cast(pa.int64()).take(pa.array(at))
            tables.append(pa.table({"_id": side_ids[at], "_start": starts, name: at}))
        return matches(*tables)
