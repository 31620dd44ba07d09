"""Sliding and session windows with allowed lateness on real Spark and Delta, against a plain-Python reference.

One pipeline, three epochs (one file each), three window operators over the
same records: sliding windows (10 s every 5 s) and sessions (gap 4 s), both
with 10 s allowed lateness and a late side output, and sessions without
lateness or side output. The data covers: a fired window updated by a record
within the allowed lateness (twice), a record joining only those of its
sliding windows that are not late, records beyond the lateness going to the
side output (or dropped and counted), two fired sessions bridged by a later
record (the later one retracted), fired windows purged later without firing
again, and values whose float sum depends on their order (arrival order, not
event time). The reference below implements the module docstring of
:mod:`barrierflow.operators.window` independently: sessions merge one record
at a time, as Flink's merging window set does, rather than as islands.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from functools import reduce
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import barrierflow as bf
from barrierflow.checkpointing.coordinator import CheckpointCoordinator

# Every state read of these operators takes its pruned path: the rows it leaves out must never matter.
pytestmark = pytest.mark.usefixtures("parallel_epochs")

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z, a multiple of every window size below (seconds)
SIZE, SLIDE, GAP, LATENESS = 10, 5, 4, 10  # seconds; the watermark has no out-of-orderness
EVENTS = pa.schema([("k", pa.string()), ("t", pa.int64()), ("v", pa.float64())])

# (key, t seconds after T0, value) per epoch, in arrival order. W(1) = 26, W(2) = 27, W(3) = 50.
EPOCHS: list[list[tuple[str, int, float]]] = [
    [("a", 13, 0.1), ("a", 14, 0.2), ("a", 20, 0.3), ("b", 6, 2.0), ("d", 10, 1.0), ("e", 21, 1.5), ("a", 26, 0.5)],
    [("a", 17, 0.6), ("b", 3, 9.0), ("a", 27, 1.0)],
    [("a", 15, 7.0), ("a", 5, 3.0), ("a", 12, 0.25), ("c", 50, 1.0)],
]


@bf.pipeline("windows", params=[bf.Param("landing_dir", str), bf.Param("parallelism", int, 2)])
def windows(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
    events = p.source(bf.FileSource("events", params["landing_dir"], schema=EVENTS, max_files_per_epoch=1))
    by_key = events.map(ts=f"timestamp_seconds(t + {T0})").with_watermark("ts", timedelta(0)).key_by("k")
    lateness = timedelta(seconds=LATENESS)
    by_key.window(
        "sliding",
        bf.SlidingEventTimeWindows.of(timedelta(seconds=SIZE), timedelta(seconds=SLIDE)),
        n=bf.Count(),
        total=bf.Sum("v"),
        late_output="late_sliding",
        allowed_lateness=lateness,
    ).sink_to(bf.DeltaSink.append("sliding_log"))
    sessions = by_key.window(
        "sessions",
        bf.EventTimeSessionWindows.with_gap(timedelta(seconds=GAP)),
        n=bf.Count(),
        total=bf.Sum("v"),
        late_output="late_sessions",
        allowed_lateness=lateness,
    )
    sessions.sink_to(bf.DeltaSink.append("sessions_log"))
    sessions.sink_to(bf.DeltaSink.upsert("sessions_latest", key=("k", "window_start")))
    by_key.window("strict", bf.EventTimeSessionWindows.with_gap(timedelta(seconds=GAP)), n=bf.Count(), total=bf.Sum("v")).sink_to(
        bf.DeltaSink.append("strict_log")
    )


# -- the reference ---------------------------------------------------------------------------------------


def _sum(values: list[float]) -> float:
    """A window's sum: its values folded from 0.0 in arrival order."""
    return reduce(lambda acc, x: acc + x, values, 0.0)


def _epochs_with_watermarks() -> Iterator[tuple[int, list[tuple[str, int, float]], int | None, int]]:
    """(epoch, records, W(n-1), W(n)): the watermark is the highest event time seen so far."""
    high: int | None = None
    for epoch, records in enumerate(EPOCHS, 1):
        wm_prev, high = high, max([t for _, t, _ in records] + ([high] if high is not None else []))
        yield epoch, records, wm_prev, high


def sliding_reference(lateness: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], set[tuple[str, int]]]:
    """Emitted rows (epoch, k, start, end, n, total, is_update), late records (epoch, k, t, v), windows left in state."""
    state: dict[tuple[str, int], dict[str, Any]] = {}
    rows: list[tuple[Any, ...]] = []
    late: list[tuple[Any, ...]] = []
    for epoch, records, wm_prev, wm in _epochs_with_watermarks():
        touched = set()
        for k, t, v in records:
            starts = [s for s in range(t - SIZE - SLIDE, t + 1) if s % SLIDE == 0 and s <= t < s + SIZE]
            live = [s for s in starts if wm_prev is None or s + SIZE + lateness > wm_prev]
            if not live:
                late.append((epoch, k, t, v))
                continue
            for s in live:
                state.setdefault((k, s), {"values": [], "fired": False})["values"].append(v)
                touched.add((k, s))
        for (k, s), w in sorted(state.items()):
            end = s + SIZE
            if end <= wm and ((k, s) in touched or not w["fired"]):
                rows.append((epoch, k, s, end, len(w["values"]), _sum(w["values"]), w["fired"]))
                w["fired"] = True
            if end + lateness <= wm:
                del state[(k, s)]
    return rows, late, set(state)


def session_reference(lateness: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], set[tuple[str, int]]]:
    """Emitted rows (epoch, k, start, end, n, total, is_update, retracted), late records, sessions left in state.

    Each record merges into every session it overlaps, one record at a time;
    a session remembers the stored sessions it took in this epoch.
    """
    sessions: dict[str, list[dict[str, Any]]] = {}
    rows: list[tuple[Any, ...]] = []
    late: list[tuple[Any, ...]] = []
    for epoch, records, wm_prev, wm in _epochs_with_watermarks():
        for stored in (s for ss in sessions.values() for s in ss):
            stored["taken"], stored["touched"] = [(stored["start"], stored["end"], stored["fired"])], False
        for position, (k, t, v) in enumerate(records):
            if wm_prev is not None and t + GAP + lateness <= wm_prev:
                late.append((epoch, k, t, v))
                continue
            new = {"start": t, "end": t + GAP, "values": [(epoch, position, v)], "taken": [], "touched": True, "fired": False}
            keep = []
            for s in sessions.get(k, []):
                if s["start"] <= new["end"] and new["start"] <= s["end"]:  # Flink's TimeWindow.intersects
                    new["start"], new["end"] = min(new["start"], s["start"]), max(new["end"], s["end"])
                    new["values"] += s["values"]
                    new["taken"] += s["taken"]
                else:
                    keep.append(s)
            sessions[k] = [*keep, new]
        for k in sorted(sessions):
            for s in sorted(sessions[k], key=lambda s: s["start"]):
                fired = any(f for start, _, f in s["taken"] if start == s["start"])
                for start, end, f in sorted(s["taken"]):
                    if f and start != s["start"]:
                        rows.append((epoch, k, start, end, None, None, True, True))
                if s["end"] <= wm and (s["touched"] or not fired):
                    values = [v for *_, v in sorted(s["values"])]
                    rows.append((epoch, k, s["start"], s["end"], len(values), _sum(values), fired, False))
                    fired = True
                s["fired"] = fired
            sessions[k] = [s for s in sessions[k] if s["end"] + lateness > wm]
    return rows, late, {(k, s["start"]) for k, ss in sessions.items() for s in ss}


# -- the test -----------------------------------------------------------------------------------------------


def _seconds(value: datetime) -> int:
    return int(value.timestamp()) - T0


def _query(warehouse: str, sql: str) -> list[dict[str, Any]]:
    return bf.run_query(warehouse, "windows", sql).to_pylist()


def test_sliding_and_session_windows_with_lateness_match_the_reference(
    spark: Any, tmp_path: Path, warehouse: str, caplog: pytest.LogCaptureFixture
) -> None:
    sliding, sliding_late, sliding_left = sliding_reference(LATENESS)
    sessions, sessions_late, sessions_left = session_reference(LATENESS)
    strict, strict_late, _ = session_reference(0)
    # The data covers the cases of the module docstring.
    assert ("a", 10, 20) in {r[1:4] for r in sliding if r[6] and r[0] == 3}  # updated within lateness, twice
    assert (3, "a", 12, 0.25) not in sliding_late and (3, "a", 5, 3.0) in sliding_late  # one window late, or all
    assert (2, "a", 20, 24, None, None, True, True) in sessions  # fired session bridged into an earlier one: retracted
    assert (2, "a", 13, 24, 4, _sum([0.1, 0.2, 0.3, 0.6]), True, False) in sessions  # arrival order, not event time
    assert _sum([0.1, 0.2, 0.3, 0.6]) != _sum([0.1, 0.2, 0.6, 0.3])
    assert (3, "a", 12, 0.25) in sessions_late and len(strict_late) == 5

    landing = tmp_path / "landing"
    landing.mkdir()
    for i, records in enumerate(EPOCHS, 1):
        (landing / f"{i}.jsonl").write_text("".join(json.dumps({"k": k, "t": t, "v": v}) + "\n" for k, t, v in records))
    with caplog.at_level(logging.WARNING, logger="barrierflow.operators.window"):
        results = CheckpointCoordinator(windows, {"landing_dir": str(landing)}, warehouse, spark_factory=lambda: spark).run(
            until_caught_up=True
        )
    assert [r.epoch for r in results] == [1, 2, 3]
    assert [r.record.watermark_us for r in results] == [(T0 + w) * 1_000_000 for w in (26, 27, 50)]

    got = _query(warehouse, "select _epoch, k, window_start, window_end, n, total, is_update from sliding_log")
    assert sorted(
        (r["_epoch"], r["k"], _seconds(r["window_start"]), _seconds(r["window_end"]), r["n"], r["total"], r["is_update"])
        for r in got
    ) == sorted(sliding)
    got = _query(warehouse, "select _epoch, k, window_start, window_end, n, total, is_update, retracted from sessions_log")
    rows = [
        (
            r["_epoch"],
            r["k"],
            _seconds(r["window_start"]),
            _seconds(r["window_end"]),
            r["n"],
            r["total"],
            r["is_update"],
            r["retracted"],
        )
        for r in got
    ]
    assert sorted(rows, key=repr) == sorted(sessions, key=repr)
    got = _query(warehouse, "select _epoch, k, window_start, window_end, n, total from strict_log")
    assert sorted(
        (r["_epoch"], r["k"], _seconds(r["window_start"]), _seconds(r["window_end"]), r["n"], r["total"]) for r in got
    ) == sorted(r[:6] for r in strict)
    # Without lateness the output has exactly the columns tumbling windows always had (plus the sink's _epoch).
    assert bf.run_query(warehouse, "windows", "select * from strict_log limit 0").column_names == [
        "k", "window_start", "window_end", "n", "total", "_epoch"
    ]  # fmt: skip

    # The upsert sink keeps each window's latest row; a retracted session stays marked.
    latest: dict[tuple[str, int], tuple[Any, ...]] = {}
    for row in sessions:
        latest[(row[1], row[2])] = row[3:]
    got = _query(warehouse, "select k, window_start, window_end, n, total, is_update, retracted from sessions_latest")
    assert {
        (r["k"], _seconds(r["window_start"])): (_seconds(r["window_end"]), r["n"], r["total"], r["is_update"], r["retracted"])
        for r in got
    } == latest

    for table, expected in (("late_sliding", sliding_late), ("late_sessions", sessions_late)):
        got = _query(warehouse, f"select _epoch, k, t, v from {table}")
        assert sorted((r["_epoch"], r["k"], r["t"], r["v"]) for r in got) == sorted(expected)
    dropped = [r.getMessage() for r in caplog.records if "window strict dropped" in r.getMessage()]
    assert dropped == [
        "epoch 2: window strict dropped 2 late record(s) (no late_output declared)",
        "epoch 3: window strict dropped 3 late record(s) (no late_output declared)",
    ]

    # State holds exactly the windows not yet purged.
    state = _query(warehouse, "select k, window_start from sliding__pending_windows")
    assert {(r["k"], _seconds(r["window_start"])) for r in state} == sliding_left
    state = _query(warehouse, "select k, window_start from sessions__sessions")
    assert {(r["k"], _seconds(r["window_start"])) for r in state} == sessions_left
