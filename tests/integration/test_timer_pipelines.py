"""Timers of a keyed process function on real Spark and Delta, against a plain-Python reference.

One pipeline (per user: "idle" when no newer record for 30 s of event time,
"seen" from a processing-time timer at each record's time, and a far-future
processing-time timer that never fires) runs four epochs through a
savepoint, an injected failure between two table commits, a parallelism
change and a restore with rewound sinks; every output row must come in the
epoch the reference says, and the stored timers must be the reference's.
The README's own timer example runs against its own reference.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

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
GAP = timedelta(seconds=30)
LATENESS = timedelta(seconds=5)
NEVER = datetime(2100, 1, 1, tzinfo=timezone.utc)
NEVER_MS = int(NEVER.timestamp()) * 1000
US = pa.timestamp("us", tz="UTC")
EVENTS = pa.schema([pa.field("user", pa.string(), nullable=False), pa.field("ts", US, nullable=False)])
Out = Callable[[dict[str, Any]], None]


class IdleUsers(bf.KeyedProcessFunction):
    last = bf.ValueStateDescriptor("last", US)
    output_schema = pa.schema([("user", pa.string()), ("what", pa.string()), ("at", US)])

    def process_element(self, record: dict[str, Any], ctx: bf.KeyedContext, out: Out) -> None:
        last, timers = ctx.get_state(self.last), ctx.timer_service()
        if last.value() is None or record["ts"] > last.value():
            if last.value() is not None:
                timers.delete_event_time_timer(last.value() + GAP)
            last.update(record["ts"])
            timers.register_event_time_timer(record["ts"] + GAP)
        timers.register_processing_time_timer(record["ts"])  # in the past: fires this epoch
        timers.register_processing_time_timer(NEVER_MS)  # never fires (int: milliseconds, as Flink's)

    def on_timer(self, timestamp: datetime, ctx: bf.KeyedContext, out: Out) -> None:
        if ctx.time_domain is bf.TimeDomain.PROCESSING_TIME:
            out({"user": ctx.key[0], "what": "seen", "at": timestamp})
        else:
            out({"user": ctx.key[0], "what": "idle", "at": timestamp})
            ctx.get_state(self.last).clear()


@bf.pipeline("idle_users", params=[bf.Param("landing_dir", str), bf.Param("parallelism", int, 2)])
def idle_users(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
    events = p.source(bf.FileSource("events", params["landing_dir"], schema=EVENTS, max_files_per_epoch=1))
    events.with_watermark("ts", LATENESS).key_by("user").process("idle", IdleUsers()).sink_to(bf.DeltaSink.append("alerts"))


def _epochs(seed: int = 3, n: int = 4) -> list[list[tuple[str, float]]]:
    """Per epoch (one file each): (user, seconds after T0) in arrival order, some out of order, some users absent later."""
    rng = random.Random(seed)
    epochs, clock = [], 0.0
    for i in range(n):
        users = "abcdefgh" if i < 2 else "abc"  # d-h go quiet: their idle timers fire with no record of theirs
        epochs.append([(rng.choice(users), clock + rng.randrange(-8000, 20000) / 1000) for _ in range(12)])
        clock += 25
    return epochs


def _reference(epochs: list[list[tuple[str, float]]]) -> tuple[list[tuple[str, str, float, int]], set[tuple[str, str, float]]]:
    """Plain Python from the documented semantics: rows (user, what, seconds, epoch) and the timers left (user, domain, seconds)."""
    last: dict[str, float] = {}
    event: set[tuple[str, float]] = set()
    processing: set[tuple[str, float]] = set()
    rows, seen_max = [], float("-inf")
    for n, records in enumerate(epochs, start=1):
        for user, ts in records:
            if user not in last or ts > last[user]:
                if user in last:
                    event.discard((user, last[user] + GAP.total_seconds()))
                last[user] = ts
                event.add((user, ts + GAP.total_seconds()))
            processing.add((user, ts))
            processing.add((user, (NEVER - T0).total_seconds()))
            seen_max = max(seen_max, ts)
        watermark = seen_max - LATENESS.total_seconds()
        for user, ts in sorted(event):
            if ts <= watermark:
                event.discard((user, ts))
                rows.append((user, "idle", ts, n))
                last.pop(user, None)
        for user, ts in sorted(processing):
            if ts < (NEVER - T0).total_seconds():
                processing.discard((user, ts))
                rows.append((user, "seen", ts, n))
    left = {(u, "event_time", ts) for u, ts in event} | {(u, "processing_time", ts) for u, ts in processing}
    return rows, left


def _write(landing: Path, epochs: list[list[tuple[str, float]]]) -> None:
    landing.mkdir(parents=True)
    for i, records in enumerate(epochs):
        lines = [json.dumps({"user": u, "ts": (T0 + timedelta(seconds=s)).isoformat()}) for u, s in records]
        (landing / f"part-{i:03d}.jsonl").write_text("\n".join(lines) + "\n")


def _seconds(value: datetime) -> float:
    return round((value - T0).total_seconds(), 3)  # the data is in whole milliseconds


def _alerts(warehouse: str) -> list[tuple[str, str, float, int]]:
    rows = run_query(warehouse, "idle_users", "select user, what, at, _epoch from alerts").to_pylist()
    return sorted((r["user"], r["what"], _seconds(r["at"]), r["_epoch"]) for r in rows)


def _expected(rows: list[tuple[str, str, float, int]]) -> list[tuple[str, str, float, int]]:
    return sorted((u, w, round(s, 3), n) for u, w, s, n in rows)


def test_timers_fire_exactly_once_through_a_failure_a_rescale_and_a_restore(
    spark: Any, tmp_path: Path, warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    epochs = _epochs()
    landing = tmp_path / "landing"
    _write(landing, epochs)

    run = epoch_runner(idle_users, {"landing_dir": str(landing)}, warehouse, spark)

    assert run(2, 2) == [1, 2]
    create_savepoint(idle_users, warehouse, name="after-2", params={"landing_dir": str(landing)})
    # Epoch 3 fails after its first table commit (a roll-forward), then the rest runs at another parallelism.
    fail_after_first_commit(run, 2, monkeypatch, tmp_path)
    assert run(3)[-1] == 4

    rows, left = _reference(epochs)
    assert _alerts(warehouse) == _expected(rows)
    assert {w for _, w, _, n in rows if n == 4} == {"idle", "seen"}  # timers fire for quiet keys too
    stored = run_query(warehouse, "idle_users", "select user, timer_domain, timer_timestamp from idle__timers").to_pylist()
    assert {(r["user"], r["timer_domain"], _seconds(r["timer_timestamp"])) for r in stored} == {
        (u, d, round(s, 3)) for u, d, s in left
    }

    # Restored from the savepoint at parallelism 1, the replay of epochs 3-4 fires the same timers.
    restore(idle_users, warehouse, savepoint="after-2", rewind_sinks=True, parallelism=1, params={"landing_dir": str(landing)})
    assert run(1) == [3, 4]
    assert _alerts(warehouse) == _expected(rows)


def test_the_readme_sessions_pipeline_matches_a_plain_python_reference(spark: Any, tmp_path: Path, warehouse: str) -> None:
    """The README's "Timers" block as written: a session per user, emitted when the watermark passes its last event + 30 min."""
    module = readme_module(tmp_path / "user_code", "### Timers", "readme_sessions")
    rng = random.Random(8)
    epochs, clock = [], 0
    for i in range(4):
        users = "abcde" if i < 2 else "ab"
        epochs.append([(rng.choice(users), clock + rng.randrange(-5, 40)) for _ in range(15)])  # minutes after T0
        clock += 35
    # Reference: per user the first and last event of the open session; it closes when W(n) >= last + 30.
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    expected, seen_max = [], -(10**9)
    for n, records in enumerate(epochs, start=1):
        for user, minute in records:
            last[user] = max(last.get(user, minute), minute)
            first[user] = min(first.get(user, minute), minute)
            seen_max = max(seen_max, minute)
        for user in sorted(last):
            if last[user] + 30 <= seen_max - 1:
                expected.append((user, first.pop(user), last.pop(user), n))

    # The README's source reads what has landed: one file lands before each run, one epoch each.
    landing = tmp_path / "landing"
    landing.mkdir()
    for i, records in enumerate(epochs):
        lines = [json.dumps({"user_id": u, "ts": (T0 + timedelta(minutes=m)).isoformat()}) for u, m in records]
        (landing / f"part-{i:03d}.jsonl").write_text("\n".join(lines) + "\n")
        coordinator = CheckpointCoordinator(
            module.sessions, {"landing_dir": str(landing)}, warehouse, spark_factory=lambda: spark
        )
        assert [r.epoch for r in coordinator.run(until_caught_up=True)] == [i + 1]
    rows = run_query(warehouse, "sessions", "select user_id, first, last, _epoch from sessions").to_pylist()
    minutes = lambda t: int((t - T0).total_seconds() // 60)  # noqa: E731
    assert sorted((r["user_id"], minutes(r["first"]), minutes(r["last"]), r["_epoch"]) for r in rows) == sorted(expected)
    assert 3 in {n for *_, n in expected} and any(u in "cde" for u, *_ in expected)  # quiet users' sessions close too
