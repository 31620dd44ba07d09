"""Interval and window joins of two watermarked sources on real Spark and Delta, against plain-Python references.

One pipeline joins the same two sources twice: an interval join (left
records ``ts`` with right records ``at`` of their key, ``ts - 2 s <= at <
ts + 3 s``, upper bound exclusive) and a sliding-window join (10 s windows
every 5 s). Each source has its own watermark assigner, so the joins'
watermark is the minimum of the two. Three epochs (one file per source each,
some records late) run through a savepoint, an injected failure between two
table commits, a parallelism change and a restore with rewound sinks: every
joined row, every late row and the records left in state must be the
references', and a null event time is a dead letter. The README's join
examples run as written.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import barrierflow as bf
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.operations.query import run_query
from barrierflow.operations.restore import restore
from barrierflow.operations.savepoint import create_savepoint
from epoch_runs import epoch_runner, fail_after_first_commit
from readme_example import readme_module

# Every state read of these operators takes its pruned path: the rows it leaves out must never matter.
pytestmark = pytest.mark.usefixtures("parallel_epochs")

T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
US = pa.timestamp("us", tz="UTC")
LEFT = pa.schema([pa.field("k", pa.string()), pa.field("ts", US), pa.field("v", pa.int64())])
RIGHT = pa.schema([pa.field("k", pa.string()), pa.field("at", US), pa.field("v", pa.int64())])
LOWER, UPPER = -2, 3  # seconds; the upper bound is exclusive
OOO = {"left": 2, "right": 3}  # out-of-orderness of each side's assigner, seconds
SIZE, SLIDE = 10, 5  # the window join's sliding windows, seconds
Side = list[tuple[str, int, int]]  # (key, seconds after T0, value)


@bf.pipeline("joined", params=[bf.Param("left_dir", str), bf.Param("right_dir", str), bf.Param("parallelism", int, 2)])
def joined(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
    left = p.source(bf.FileSource("left", params["left_dir"], schema=LEFT, max_files_per_epoch=1)).with_watermark(
        "ts", timedelta(seconds=OOO["left"])
    )
    right = p.source(bf.FileSource("right", params["right_dir"], schema=RIGHT, max_files_per_epoch=1)).with_watermark(
        "at", timedelta(seconds=OOO["right"])
    )
    (left.key_by("k")
         .interval_join(right.key_by("k"))
         .between(timedelta(seconds=LOWER), timedelta(seconds=UPPER), operator_id="j", upper_inclusive=False,
                  left_late_output="late_left", right_late_output="late_right")
         .sink_to(bf.DeltaSink.append("pairs")))  # fmt: skip
    (left.join(right).where("k").equal_to("k")
         .window(bf.SlidingEventTimeWindows.of(timedelta(seconds=SIZE), timedelta(seconds=SLIDE)), operator_id="wj")
         .sink_to(bf.DeltaSink.append("window_pairs")))  # fmt: skip


def _epochs(seed: int = 12, n: int = 3) -> list[tuple[Side, Side]]:
    rng = random.Random(seed)
    values = iter(range(1, 10_000))

    def side(clock: int) -> Side:
        return [(rng.choice("pqr"), clock + rng.randrange(-7, 8), next(values)) for _ in range(rng.randrange(6, 10))]

    return [(side(10 * i), side(10 * i)) for i in range(n)]


def reference(
    epochs: list[tuple[Side, Side]], lower: int, upper: int, upper_inclusive: bool, ooo: tuple[int, int]
) -> tuple[list[tuple[Any, ...]], dict[str, list[tuple[Any, ...]]], dict[str, set[tuple[str, int]]]]:
    """Flink's interval join, epoch by epoch, in plain Python (integer seconds).

    Returns pairs (key, left ts, left v, right ts, right v, epoch), late rows per side
    (key, ts, v, epoch) and the records left in state per side (key, ts).
    """
    high = upper if upper_inclusive else upper - 1e-6
    state: dict[str, list[tuple[str, int, int]]] = {"left": [], "right": []}
    late: dict[str, list[tuple[Any, ...]]] = {"left": [], "right": []}
    pairs: list[tuple[Any, ...]] = []
    seen: dict[str, int | None] = {"left": None, "right": None}
    previous: float | None = None
    for n, records in enumerate(epochs, start=1):
        fresh: dict[str, list[tuple[str, int, int]]] = {}
        for index, side in enumerate(("left", "right")):
            for _, ts, _ in records[index]:  # the assigner sees every record, late or not
                seen[side] = ts if seen[side] is None else max(seen[side], ts)  # type: ignore[type-var]
            fresh[side] = [r for r in records[index] if previous is None or r[1] >= previous]
            late[side] += [(k, ts, v, n) for k, ts, v in records[index] if previous is not None and ts < previous]
        for lk, lts, lv in state["left"] + fresh["left"]:
            for rk, rts, rv in state["right"] + fresh["right"]:
                new = (lk, lts, lv) in fresh["left"] or (rk, rts, rv) in fresh["right"]
                if lk == rk and new and lower <= rts - lts <= high:
                    pairs.append((lk, lts, lv, rts, rv, n))
        marks = [seen[s] - o for s, o in zip(("left", "right"), ooo) if seen[s] is not None]  # type: ignore[operator]
        watermark = min(marks) if len(marks) == 2 else None
        cleanup = {"left": lambda ts: ts + high if high > 0 else ts, "right": lambda ts: ts - lower if lower < 0 else ts}
        for side in ("left", "right"):
            kept = state[side] + fresh[side]
            state[side] = [r for r in kept if watermark is None or cleanup[side](r[1]) > watermark]
        previous = watermark
    return pairs, late, {s: {(k, ts) for k, ts, _ in rows} for s, rows in state.items()}


def window_reference(
    epochs: list[tuple[Side, Side]], size: int, slide: int, ooo: tuple[int, int]
) -> tuple[list[tuple[Any, ...]], dict[str, set[tuple[str, int, int]]]]:
    """Flink's window join (sliding windows ``[k·slide, k·slide + size)``), epoch by epoch, in plain Python.

    Returns pairs (key, window start, window end, left ts, left v, right ts, right v, epoch) and
    the records left in state per side (key, window start, ts).
    """
    buffers: dict[str, list[tuple[str, int, int, int]]] = {"left": [], "right": []}
    seen: dict[str, int | None] = {"left": None, "right": None}
    previous: int | None = None
    pairs: list[tuple[Any, ...]] = []
    for n, records in enumerate(epochs, start=1):
        for index, side in enumerate(("left", "right")):
            for key, ts, v in records[index]:
                seen[side] = ts if seen[side] is None else max(seen[side], ts)  # type: ignore[type-var]
                starts = range(ts - ts % slide - size, ts + 1, slide)
                windows = [s for s in starts if s <= ts < s + size and (previous is None or s + size > previous)]
                buffers[side] += [(key, s, ts, v) for s in windows]  # no window left: a late record
        marks = [seen[s] - o for s, o in zip(("left", "right"), ooo) if seen[s] is not None]  # type: ignore[operator]
        watermark = min(marks) if len(marks) == 2 else None
        if watermark is not None:
            for lk, ls, lts, lv in buffers["left"]:
                for rk, rs, rts, rv in buffers["right"]:
                    if lk == rk and ls == rs and ls + size <= watermark:
                        pairs.append((lk, ls, ls + size, lts, lv, rts, rv, n))
            for side in ("left", "right"):
                buffers[side] = [r for r in buffers[side] if r[1] + size > watermark]
        previous = watermark
    return pairs, {s: {(k, start, ts) for k, start, ts, _ in rows} for s, rows in buffers.items()}


def _write(landing: Path, epochs: list[tuple[Side, Side]]) -> None:
    for index, (side, column) in enumerate((("left", "ts"), ("right", "at"))):
        (landing / side).mkdir(parents=True)
        for i, records in enumerate(epochs):
            lines = [json.dumps({"k": k, column: (T0 + timedelta(seconds=s)).isoformat(), "v": v}) for k, s, v in records[index]]
            if side == "left" and i == 1:
                lines.insert(3, json.dumps({"k": "p", column: None, "v": 0}))  # a null event time: a dead letter
            (landing / side / f"part-{i:03d}.jsonl").write_text("\n".join(lines) + "\n")


def _seconds(value: datetime) -> int:
    return int((value - T0).total_seconds())


def _results(warehouse: str) -> tuple[list[tuple[Any, ...]], dict[str, list[tuple[Any, ...]]]]:
    rows = run_query(warehouse, "joined", "select k, ts, left_v, at, right_v, _epoch from pairs").to_pylist()
    pairs = sorted((r["k"], _seconds(r["ts"]), r["left_v"], _seconds(r["at"]), r["right_v"], r["_epoch"]) for r in rows)
    late = {}
    for side, column in (("left", "ts"), ("right", "at")):
        found = run_query(warehouse, "joined", f"select k, {column}, v, _epoch from late_{side}").to_pylist()
        late[side] = sorted((r["k"], _seconds(r[column]), r["v"], r["_epoch"]) for r in found)
    return pairs, late


def _window_results(warehouse: str) -> list[tuple[Any, ...]]:
    sql = "select k, window_start, window_end, ts, left_v, at, right_v, _epoch from window_pairs"
    return sorted(
        (r["k"], _seconds(r["window_start"]), _seconds(r["window_end"]), _seconds(r["ts"]), r["left_v"], _seconds(r["at"]),
         r["right_v"], r["_epoch"])
        for r in run_query(warehouse, "joined", sql).to_pylist()
    )  # fmt: skip


def test_interval_and_window_joins_are_exactly_once_through_a_failure_a_rescale_and_a_restore(
    spark: Any, tmp_path: Path, warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    epochs = _epochs()
    landing = tmp_path / "landing"
    _write(landing, epochs)
    dirs = {"left_dir": str(landing / "left"), "right_dir": str(landing / "right")}

    run = epoch_runner(joined, dirs, warehouse, spark)

    assert run(2, 1) == [1]
    create_savepoint(joined, warehouse, name="after-1", params=dirs)
    fail_after_first_commit(run, 2, monkeypatch, tmp_path)
    assert run(3)[-1] == 3

    pairs, late, kept = reference(epochs, LOWER, UPPER, False, (OOO["left"], OOO["right"]))
    assert (
        len(pairs) > 10 and late["left"] and late["right"] and any(n == 3 for *_, n in pairs)
    )  # the data exercises joins and lateness
    assert _results(warehouse) == (sorted(pairs), {s: sorted(rows) for s, rows in late.items()})
    for side in ("left", "right"):
        stored = run_query(warehouse, "joined", f"select k, event_time_us from j__{side}").to_pylist()
        assert {(r["k"], (r["event_time_us"] - int(T0.timestamp() * 1e6)) // 1_000_000) for r in stored} == kept[side]
    dead = run_query(warehouse, "joined", "select source_file, line, reason from dead_letter").to_pylist()
    assert [(Path(r["source_file"]).name, r["line"], r["reason"]) for r in dead] == [("part-001.jsonl", 4, "null_key")]
    window_pairs, window_kept = window_reference(epochs, SIZE, SLIDE, (OOO["left"], OOO["right"]))
    assert len({(k, s) for k, s, *_ in window_pairs}) > 5 and any(window_kept.values())
    assert _window_results(warehouse) == sorted(window_pairs)
    for side in ("left", "right"):
        stored = run_query(warehouse, "joined", f"select k, window_start, event_time_us from wj__{side}").to_pylist()
        t0_us = int(T0.timestamp() * 1e6)
        assert {(r["k"], _seconds(r["window_start"]), (r["event_time_us"] - t0_us) // 1_000_000) for r in stored} == window_kept[
            side
        ]

    restore(joined, warehouse, savepoint="after-1", rewind_sinks=True, parallelism=1, params=dirs)
    assert run(1) == [2, 3]
    assert _results(warehouse) == (sorted(pairs), {s: sorted(rows) for s, rows in late.items()})
    assert _window_results(warehouse) == sorted(window_pairs)


def test_the_readme_interval_join_matches_a_plain_python_reference(spark: Any, tmp_path: Path, warehouse: str) -> None:
    """The README's "Interval join" block as written: a click joins the impressions of its ad up to 10 minutes before it."""
    module = readme_module(tmp_path / "user_code", "### Interval join", "readme_ad_clicks")
    rng = random.Random(6)
    pages = iter(range(10_000))  # unique, so that a record is known by its fields
    landing = {side: tmp_path / side for side in ("impressions", "clicks")}
    for directory in landing.values():
        directory.mkdir()
    epochs: list[tuple[Side, Side]] = []
    for epoch in (1, 2):
        clock = 20 * (epoch - 1)  # minutes
        sides = tuple([(rng.choice("ab"), clock + rng.randrange(0, 20), next(pages)) for _ in range(8)] for _ in "ic")
        epochs.append((sides[0], sides[1]))
        for (side, column), records in zip((("impressions", "shown_at"), ("clicks", "clicked_at")), sides):
            lines = [
                json.dumps({"ad_id": k, column: (T0 + timedelta(minutes=m)).isoformat(), "page": f"p{v}"}) for k, m, v in records
            ]
            (landing[side] / f"part-{epoch}.jsonl").write_text("\n".join(lines) + "\n")
        given = {"impressions_dir": str(landing["impressions"]), "clicks_dir": str(landing["clicks"])}
        coordinator = CheckpointCoordinator(module.ad_clicks, given, warehouse, spark_factory=lambda: spark)
        assert [r.epoch for r in coordinator.run(until_caught_up=True)] == [epoch]
    # In minutes: a click at c joins an impression at i when i <= c <= i + 10, out-of-orderness 1 minute on each side.
    pairs, late, _ = reference(epochs, 0, 10, True, (1, 1))
    rows = run_query(
        warehouse, "ad_clicks", "select ad_id, shown_at, left_page, clicked_at, right_page, _epoch from clicked"
    ).to_pylist()
    minutes = lambda t: int((t - T0).total_seconds() // 60)  # noqa: E731
    found = sorted(
        (r["ad_id"], minutes(r["shown_at"]), r["left_page"], minutes(r["clicked_at"]), r["right_page"], r["_epoch"]) for r in rows
    )
    assert found == sorted((k, i, f"p{iv}", c, f"p{cv}", n) for k, i, iv, c, cv, n in pairs)
    assert pairs and any(n == 2 for *_, n in pairs)


def test_the_readme_window_join_matches_a_plain_python_reference(spark: Any, tmp_path: Path, warehouse: str) -> None:
    """The README's "Window join" block as written: temperature and humidity of a sensor paired per 5-minute window."""
    module = readme_module(tmp_path / "user_code", "### Window join", "readme_climate")
    rng = random.Random(3)
    values = iter(range(10_000))
    landing = {side: tmp_path / side for side in ("temperatures", "humidity")}
    for directory in landing.values():
        directory.mkdir()
    epochs: list[tuple[Side, Side]] = []
    for epoch in (1, 2):
        clock = 600 * (epoch - 1)  # seconds
        sides = tuple([(rng.choice("ab"), clock + rng.randrange(0, 600), next(values)) for _ in range(8)] for _ in "th")
        epochs.append((sides[0], sides[1]))
        for (side, column, value), records in zip(
            (("temperatures", "ts", "celsius"), ("humidity", "measured_at", "percent")), sides
        ):
            lines = [
                json.dumps({"sensor_id": k, column: (T0 + timedelta(seconds=s)).isoformat(), value: float(v)})
                for k, s, v in records
            ]
            (landing[side] / f"part-{epoch}.jsonl").write_text("\n".join(lines) + "\n")
        given = {"temperature_dir": str(landing["temperatures"]), "humidity_dir": str(landing["humidity"])}
        coordinator = CheckpointCoordinator(module.climate, given, warehouse, spark_factory=lambda: spark)
        assert [r.epoch for r in coordinator.run(until_caught_up=True)] == [epoch]
    pairs, _ = window_reference(epochs, 300, 300, (30, 30))
    sql = "select sensor_id, window_start, window_end, ts, celsius, measured_at, percent, _epoch from climate"
    rows = run_query(warehouse, "climate", sql).to_pylist()
    found = sorted(
        (r["sensor_id"], _seconds(r["window_start"]), _seconds(r["window_end"]), _seconds(r["ts"]), int(r["celsius"]),
         _seconds(r["measured_at"]), int(r["percent"]), r["_epoch"])
        for r in rows
    )  # fmt: skip
    assert found == sorted(pairs)
    assert pairs and {n for *_, n in pairs} == {1, 2}
