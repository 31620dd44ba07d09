"""Window join of two streams on event time, as Flink's ``DataStream.join(...).where(...).equal_to(...).window(...)``.

``a.join(b).where("k").equal_to("k").window(bf.TumblingEventTimeWindows.of(size), operator_id="j")``
pairs every record of ``a`` with every record of ``b`` of the same key in
the same window, once the window is complete. Windows are those of
:mod:`barrierflow.operators.window`'s tumbling and sliding assigners
(``[k·slide, k·slide + size)``, aligned to the Unix epoch); each side's
event time is the column of the watermark assigner upstream of it (the
window assigner's ``time_column`` is not used). Within epoch n, with W(n-1)
the watermark at its start and W(n) the one at its end:

1. Alignment: both inputs' records up to barrier n are joined in epoch n.
2. Window assignment and lateness, as a window operator without allowed
   lateness (:mod:`barrierflow.operators.window` steps 1-2): a record
   belongs to every window holding its event time; a window is late when
   its end is at or before W(n-1) (it fired already). A record whose
   windows are all late (or whose key or event time is null: JSON Lines
   sources make it a dead letter before) goes to its side's late output, or
   is dropped and counted in the log; the others join in their windows that
   are not late.
3. Buffering: each side's records wait, per key and window, in the state
   tables ``<operator_id>__left`` / ``__right`` (key columns,
   ``window_start``, ``record_epoch``, ``record_index``, ``event_time_us``,
   the record as JSON).
4. Firing: every window whose end is at or before W(n) fires, in this
   epoch, with one row per pair of a left and a right record of its key
   and window (none if one side has no record, as Flink's inner join); its
   records then leave state. Which pairs a window emits never depends on
   the order of records, on how they were cut into epochs, or on parallelism.
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
from typing import TYPE_CHECKING, Any, Sequence

import pyarrow as pa

from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.join_buffer import SIDES, TwoSidedJoin, check_key_types, fresh_records, joined_rows, record_schemas
from barrierflow.operators.window import SlidingEventTimeWindows, TumblingEventTimeWindows
from barrierflow.state.spec import KEY_GROUP, DueRows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["WindowJoin", "aligned_window_starts"]

_WINDOW_START = pa.field("window_start", pa.timestamp("us", tz="UTC"))


def aligned_window_starts(assigner: Any, ts_us: int, watermark_prev_us: int | None) -> list[int]:
    """(2.) The starts of the windows of a record at ``ts_us`` that are not late, earliest first (the rule the Spark code follows)."""
    windows = [(s, e) for s, e in assigner.windows(ts_us) if watermark_prev_us is None or e > watermark_prev_us]
    return sorted(s for s, _ in windows)


@dataclass
class WindowJoin(TwoSidedJoin):
    """Joins ``parent`` keyed by ``key`` (left) with ``other`` keyed by ``other_key`` (right) per window of ``assigner``."""

    assigner: TumblingEventTimeWindows | SlidingEventTimeWindows = TumblingEventTimeWindows(timedelta(minutes=1))

    own_fields = (_WINDOW_START,)

    def __post_init__(self) -> None:
        if not isinstance(self.assigner, (TumblingEventTimeWindows, SlidingEventTimeWindows)):
            raise PipelineDefinitionError(
                f"window join {self.operator_id!r}: {self.assigner!r} is not a window assigner a join can use; give "
                "bf.TumblingEventTimeWindows.of(size) or bf.SlidingEventTimeWindows.of(size, slide)"
            )

    def apply_inputs(self, ctx: Any, frames: Sequence["DataFrame"]) -> "DataFrame":
        from pyspark.sql import functions as F

        what = f"window join {self.operator_id!r}"
        keys = (self.key, self.other_key)
        key_types = check_key_types(ctx, what, frames, keys, self.time_columns)
        specs = [self._spec(side, key_types) for side in SIDES]
        wp, wn = ctx.watermark_prev_us, ctx.watermark_us
        size, slide = self.assigner.size_us, self.assigner.slide_us
        ts = F.col("_ts")
        last_start = ts - F.pmod(ts, F.lit(slide))
        # (2.) late: the latest window (hence every window) of the record ended by W(n-1)
        late = ts.isNull() if wp is None else (ts.isNull() | (last_start + F.lit(size) <= F.lit(wp)))
        count = -(-size // slide)  # windows per record at most
        floor = ts - F.lit(size)  # a window holds ts while start > ts - size
        if wp is not None:  # and is not late itself
            floor = F.greatest(floor, F.lit(wp - size))
        starts = F.filter(F.sequence(last_start - F.lit((count - 1) * slide), last_start, F.lit(slide)), lambda s: s > floor)
        candidates = []
        for index, (df, spec) in enumerate(zip(frames, specs)):
            fresh = fresh_records(
                ctx, what, df, self.key, keys[index], self.time_columns[index], late, self.late_outputs[index], SIDES[index]
            )
            columns = [*self.key, "window_start", "event_time_us", "record", KEY_GROUP, "record_epoch", "record_index"]
            fresh = fresh.withColumn("_start_us", F.explode(starts)).withColumn(
                "window_start", F.timestamp_micros(F.col("_start_us"))
            ).select(*columns, "_new")
            window_end = F.unix_micros(F.col("window_start")) + F.lit(size)
            fires = F.lit(False) if wn is None else window_end <= F.lit(wn)  # (4.)
            # Stored records matter only in windows that fire (end <= W(n)): the others stay as they are.
            due = DueRows("window_start", wn - size) if wn is not None else None
            stored = ctx.state.read(spec, due=due).where(fires).select(*columns, F.lit(False).alias("_new"))
            candidates.append(ctx.persist(fresh.unionByName(stored).withColumn("_fires", fires)))

        # (4.) pairs of every firing window
        left, right = (c.where("_fires").alias(side) for c, side in zip(candidates, SIDES))
        condition = [F.col(f"left.{k}") == F.col(f"right.{k}") for k in (*self.key, "window_start")]
        own = (
            F.col("left.window_start").alias("window_start"),
            F.timestamp_micros(F.unix_micros(F.col("left.window_start")) + F.lit(size)).alias("window_end"),
        )
        out = joined_rows(left.join(right, on=condition, how="inner"), self.key, own, record_schemas(frames), self.other_key)

        # (3.)-(4.) new records of windows not firing are stored; stored records of firing windows leave
        for candidate, spec in zip(candidates, specs):
            changes = candidate.where(F.col("_new") != F.col("_fires")).withColumn("_deleted", F.col("_fires"))
            ctx.state.stage(spec, changes)
        return out

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
