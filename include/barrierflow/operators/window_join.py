"""Window join of two streams on event time, as Flink's ``DataStream.join(...).where(...).equal_to(...).window(...)``.

``a.join(b).where("k").equal_to("k").window(bf.TumblingEventTimeWindows.of(size), operator_id="j")``
pairs every record of ``a`` with every record of ``b`` of the same key in
the same window, once the window is complete. Windows are those of
:mod:`barrierflow.api.windows`' tumbling and sliding assigners
(``[k·slide, k·slide + size)``, aligned to the Unix epoch); each side's
event time is the column of the watermark assigner upstream of it (the
window assigner's ``time_column`` is not used). Within epoch n, with W(n-1)
the watermark at its start and W(n) the one at its end:

1. Alignment: both inputs' records up to barrier n are joined in epoch n.
   Both inputs are keyed (each by its own key columns, as many, of the same
   types): the kernel sees every record of its keys from both sides.
2. Window assignment and lateness, as a window operator without allowed
   lateness (:mod:`barrierflow.operators.window` steps 1-2): a record
   belongs to every window holding its event time; a window is late when
   its end is at or before W(n-1) (it fired already). A record whose
   windows are all late (or whose key or event time is null: JSON Lines
   sources make it a dead letter before) goes to its side's late output, or
   is dropped and counted (``late records dropped by <operator_id>``); the
   others join in their windows that are not late. Window bounds are
   computed exactly, whatever the timestamps (a window that would begin
   before the earliest microsecond a timestamp holds is left out).
3. Buffering: each side's records wait, per key and window, in the state
   tables ``<operator_id>__left`` / ``__right`` (key columns,
   ``window_start``, ``record_epoch``, ``record_index``, ``event_time_us``,
   the record as JSON: :mod:`barrierflow.operators.join_buffer`).
4. Firing: every window whose end is at or before W(n) fires, in this
   epoch, with one row per pair of a left and a right record of its key
   and window (none if one side has no record, as Flink's inner join),
   whether its records arrived in this epoch or before; its buffered
   records then leave state (its records of this epoch are never stored).
   Keys are equal as Spark compares them (-0.0 and 0.0 are one key, so are
   NaNs). Which pairs a window emits never depends on the order of records,
   on how they were cut into epochs, or on parallelism.
5. Watermark: the minimum of the inputs' (both inputs need an assigner
   upstream; with several the pipeline's watermark is the minimum of theirs).
6. Output: the key columns (the first stream's names), ``window_start``,
   ``window_end``, then the left record's other columns and the right's, a
   name on both sides becoming ``left_<name>`` / ``right_<name>``
   (:func:`~barrierflow.operators.join_buffer.output_columns`).
7. Exactly-once: the buffers are keyed state, staged with the epoch, kept
   by savepoints and redistributed by key group on rescale.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.api.windows import SlidingEventTimeWindows, TumblingEventTimeWindows, WindowAssigner
from barrierflow.core.columns import user_columns
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
    greater_than,
    joined_values,
    key_ids,
    output_columns,
    send_late,
    side_records,
)

__all__ = ["WindowJoin", "aligned_window_starts"]

_TIMESTAMP = pa.timestamp("us", tz="UTC")
_WINDOW_START = pa.field("window_start", _TIMESTAMP)
_WINDOW_END = pa.field("window_end", _TIMESTAMP)
# Event times and window sizes within which the window arithmetic never leaves a long (years -73,000 to 73,000).
_SAFE = 2**61


def aligned_window_starts(assigner: WindowAssigner, ts_us: int, watermark_prev_us: int | None) -> list[int]:
    """(2.) The starts of the windows of a record at ``ts_us`` that are not late, earliest first."""
    windows = [(s, e) for s, e in assigner.windows(ts_us) if watermark_prev_us is None or e > watermark_prev_us]
    return sorted(s for s, _ in windows)


@dataclass
class WindowJoin(TwoSidedJoin):
    """Joins ``parent`` keyed by ``key`` (left) with ``other`` keyed by ``other_key`` (right) per window of ``assigner``."""

    assigner: TumblingEventTimeWindows | SlidingEventTimeWindows = TumblingEventTimeWindows(timedelta(minutes=1))

    own_fields: ClassVar[tuple[pa.Field, ...]] = (_WINDOW_START,)
    own_output_fields: ClassVar[tuple[pa.Field, ...]] = (_WINDOW_START, _WINDOW_END)
    kind: ClassVar[str] = "window join"

    def __post_init__(self) -> None:
        if not isinstance(self.assigner, (TumblingEventTimeWindows, SlidingEventTimeWindows)):
            raise PipelineDefinitionError(
                f"window join {self.operator_id!r}: {self.assigner!r} is not a window assigner a join can use; give "
                "bf.TumblingEventTimeWindows.of(size) or bf.SlidingEventTimeWindows.of(size, slide)"
            )

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        schemas = [t.schema for t in inputs]
        schema = self.output_schema(schemas)
        specs = self.state_specs(schemas)
        keys = (self.key, self.other_key)
        size = self.assigner.size_us
        wp, wn = task.watermark_prev_us, task.watermark_us
        # 2. Each record's windows that are not late; a record without one is late.
        sides: list[SideRecords] = []
        exploded: list[tuple[pa.Table, np.ndarray]] = []  # each side's records per window, and their rows in the input
        for index, records in enumerate(inputs):
            ts, valid = event_time_us(records[self.time_columns[index]])
            rows, starts = self._windows(ts, valid, wp)
            windowed = np.zeros(records.num_rows, dtype=bool)
            windowed[rows] = True
            side = side_records(task, records, self.key, keys[index], ts, ~windowed)
            sides.append(side)
            position = np.full(records.num_rows, -1, dtype=np.int64)
            position[side.rows] = np.arange(len(side.rows), dtype=np.int64)
            kept = position[rows] >= 0  # not late for a null key
            at = position[rows[kept]]
            per_window = side.fresh.take(pa.array(at, pa.int64()))
            per_window = per_window.append_column("window_start", pa.array(starts[kept], pa.int64()).cast(_TIMESTAMP))
            exploded.append((per_window, side.rows[at]))
        send_late(task, self, sides, self.late_schemas(schemas))
        # 3./4. A buffered window fires only once W(n) passes its end: none unless the watermark advanced
        # (every window kept ends after W(n-1)); its rows are read whatever their key.
        advanced = wn is not None and (wp is None or wn > wp)
        fire_through = None if wn is None else wn - size  # a window fires when its start is at or before this
        candidates, fires = [], []
        for (per_window, _), spec in zip(exploded, specs):
            columns = buffer_columns(spec)
            stored = buffered_rows(task, spec, advanced)
            if stored.num_rows and fire_through is not None:
                stored = stored.filter(pa.array(self._fires(stored, fire_through)))
            candidate = pa.concat_tables([per_window.select(columns.names).cast(columns), stored])
            candidates.append(candidate)
            fire = np.ones(candidate.num_rows, dtype=bool)
            fire[: per_window.num_rows] = (
                self._fires(per_window, fire_through) if fire_through is not None else np.zeros(per_window.num_rows, dtype=bool)
            )
            fires.append(fire)
        left_rows, right_rows = self._pairs(candidates, fires)
        out = self._output(schema, inputs, exploded, candidates, left_rows, right_rows)  # 6.
        # 3./4. New records of windows not firing are stored; stored records of firing windows leave.
        for (per_window, _), candidate, fire, spec in zip(exploded, candidates, fires, specs):
            is_new = np.arange(candidate.num_rows) < per_window.num_rows
            changed = is_new != fire
            changes = candidate.filter(pa.array(changed)).append_column("_deleted", pa.array(fire[changed], pa.bool_()))
            task.state(spec).stage(changes)
        return out

    def _windows(self, ts: np.ndarray, valid: np.ndarray, watermark_prev_us: int | None) -> tuple[np.ndarray, np.ndarray]:
        """(2.) Each record's windows that are not late, as (row, window start) pairs by row, then start."""
        size, slide = self.assigner.size_us, self.assigner.slide_us
        safe = valid & (ts >= -_SAFE) & (ts <= _SAFE) if size <= _SAFE and slide <= _SAFE else np.zeros(len(ts), dtype=bool)
        rows: list[np.ndarray] = []
        starts: list[np.ndarray] = []
        at = np.flatnonzero(safe).astype(np.int64)
        t = ts[at]
        last = t - np.mod(t, slide)  # the latest window's start (a floor modulo, as Spark's pmod)
        for j in range(-(-size // slide)):
            start = last - j * slide
            holds = start > t - size  # a window holds t while its start is after t - size
            if watermark_prev_us is not None:
                holds &= greater_than(start, watermark_prev_us - size)  # and is not late: its end after W(n-1)
            rows.append(at[holds])
            starts.append(start[holds])
        for i in np.flatnonzero(valid & ~safe):  # event times near a long's ends: exact, in Python integers
            exact = [
                s for s in aligned_window_starts(self.assigner, int(ts[i]), watermark_prev_us) if INT64_MIN <= s <= INT64_MAX
            ]
            rows.append(np.full(len(exact), i, dtype=np.int64))
            starts.append(np.array(exact, dtype=np.int64))
        row = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        start = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
        order = np.lexsort((start, row))
        return row[order], start[order]

    @staticmethod
    def _fires(rows: pa.Table, fire_through: int) -> np.ndarray:
        """(4.) Rows whose window ends at or before W(n) (its start at or before W(n) - size)."""
        starts = rows["window_start"].cast(pa.int64())
        valid = np.asarray(pc.is_valid(starts).to_numpy(zero_copy_only=False), dtype=bool)
        values = np.asarray(pc.fill_null(starts, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
        return valid & at_most(values, fire_through)

    def _pairs(self, candidates: Sequence[pa.Table], fires: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(4.) Rows of the left and right candidates in the same firing window of the same key, by left row then right row."""
        lid, rid = key_ids([c.select(list(self.key)) for c in candidates], self.key)
        tables = []
        for c, ids, fire, name in zip(candidates, (lid, rid), fires, ("_l", "_r")):
            at = np.flatnonzero(fire).astype(np.int64)
            starts = c["window_start"].cast(pa.int64()).take(pa.array(at))
            tables.append(pa.table({"_id": ids[at], "_start": starts, name: at}))
        joined = tables[0].join(tables[1], keys=["_id", "_start"], join_type="inner", use_threads=False)
        lefts = np.asarray(joined["_l"].to_numpy(), dtype=np.int64)
        rights = np.asarray(joined["_r"].to_numpy(), dtype=np.int64)
        order = np.lexsort((rights, lefts))
        return lefts[order], rights[order]

    def _output(
        self, schema: pa.Schema, inputs: Sequence[pa.Table], exploded: Sequence[tuple[pa.Table, np.ndarray]],
        candidates: Sequence[pa.Table], left_rows: np.ndarray, right_rows: np.ndarray,
    ) -> pa.Table:  # fmt: skip
        """(6.) The key columns of the left record, the window, then both records' other columns."""
        values = [
            joined_values(records, input_rows, candidate, per_window.num_rows, rows)
            for records, (per_window, input_rows), candidate, rows in zip(inputs, exploded, candidates, (left_rows, right_rows))
        ]
        users = [user_columns(t.column_names) for t in inputs]
        columns = output_columns(self.key, users[0], users[1], self.other_key, reserved=["window_start", "window_end"])
        lefts = pa.array(left_rows, pa.int64())
        starts = candidates[0]["window_start"].cast(pa.int64()).take(lefts)
        arrays = [candidates[0][k].take(lefts) for k in self.key]
        arrays += [starts.cast(_TIMESTAMP), pc.add(starts, self.assigner.size_us).cast(_TIMESTAMP)]
        arrays += [values[SIDES.index(side)][column] for side, column, _ in columns[len(self.key) :]]
        return pa.Table.from_arrays([a.cast(f.type) for a, f in zip(arrays, schema)], schema=schema)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "inputs": [n.operator_id for n in self.inputs()],
            "key": list(self.key),
            "other_key": list(self.other_key),
            "assigner": self.assigner.kind,
            "size_us": self.assigner.size_us,
            "slide_us": self.assigner.slide_us,
            "time_columns": list(self.time_columns),
            "late_outputs": list(self.late_outputs),
        }
