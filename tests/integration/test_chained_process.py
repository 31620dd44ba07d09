"""Keyed co-process and broadcast process functions in a chained front: the tables Spark's epochs write.

One pipeline runs with chaining on and off over the same input: a keyed
co-process function with scalar state and timers of both domains (event-time
timers of quiet keys fire with no record of theirs, timers are replaced and
deleted, processing-time ones fire the epoch they are registered), and a
keyed broadcast process function with keyed state reading broadcast limits
that change every epoch (its broadcast side emits too). With chaining on every
epoch runs both operators in the chained task; both runs must give identical
outputs and state tables (timers and broadcast state included).
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
from barrierflow.execution import runtime
from barrierflow.execution.chaining import CHAINING_ENV
from barrierflow.operations.query import run_query
from barrierflow.state.worker_cache import latest_rows
from barrierflow.storage.layout import PipelineLayout

pytestmark = pytest.mark.slow

T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
US = pa.timestamp("us", tz="UTC")
EVENTS = pa.schema([pa.field("user", pa.string()), pa.field("ts", US, nullable=False), pa.field("v", pa.int64())])
COMMANDS = pa.schema([pa.field("uid", pa.string()), pa.field("ts", US, nullable=False), pa.field("action", pa.string())])
LIMITS = pa.schema([pa.field("user", pa.string(), nullable=False), pa.field("limit", pa.int64())])
LIMIT = bf.MapStateDescriptor("limits", pa.string(), pa.int64())
Out = Callable[[dict[str, Any]], None]
EPOCHS = 4


class Tracker(bf.KeyedCoProcessFunction):
    total = bf.ValueStateDescriptor("total", pa.int64())
    last = bf.ValueStateDescriptor("last", US)
    blocked = bf.ValueStateDescriptor("blocked", pa.bool_())
    output_schema = pa.schema([("user", pa.string()), ("what", pa.string()), ("at", US), ("total", pa.int64()), ("blocked", pa.bool_())])

    def process_element1(self, record: dict[str, Any], ctx: bf.KeyedContext, out: Out) -> None:
        total, last, timers = ctx.get_state(self.total), ctx.get_state(self.last), ctx.timer_service()
        total.update((total.value() or 0) + record["v"])
        if last.value() is None or record["ts"] > last.value():
            if last.value() is not None:
                timers.delete_event_time_timer(last.value() + timedelta(seconds=30))
            last.update(record["ts"])
            timers.register_event_time_timer(record["ts"] + timedelta(seconds=30))
        out({"user": ctx.key[0], "what": "event", "at": record["ts"], "total": total.value(), "blocked": ctx.get_state(self.blocked).value()})

    def process_element2(self, record: dict[str, Any], ctx: bf.KeyedContext, out: Out) -> None:
        blocked = ctx.get_state(self.blocked)
        if record["action"] == "block":
            blocked.update(True)
        else:
            blocked.clear()
        ctx.timer_service().register_processing_time_timer(0)  # in the past: fires at the end of this epoch
        ctx.timer_service().register_event_time_timer(record["ts"] + timedelta(seconds=10))

    def on_timer(self, timestamp: datetime, ctx: bf.KeyedContext, out: Out) -> None:
        what = "idle" if ctx.get_state(self.last).value() is not None and timestamp == ctx.get_state(self.last).value() + timedelta(seconds=30) else str(ctx.time_domain)
        if what == "idle":
            ctx.get_state(self.last).clear()
        out({"user": ctx.key[0], "what": what, "at": timestamp, "total": ctx.get_state(self.total).value(), "blocked": ctx.get_state(self.blocked).value()})


class OverLimit(bf.KeyedBroadcastProcessFunction):
    over = bf.ValueStateDescriptor("over", pa.int64())
    output_schema = pa.schema([("user", pa.string()), ("v", pa.int64()), ("limit", pa.int64()), ("over", pa.int64())])

    def process_broadcast_element(self, record: dict[str, Any], ctx: Any, out: Out) -> None:
        limits = ctx.get_broadcast_state(LIMIT)
        if record["limit"] is None:
            limits.remove(record["user"])
        else:
            limits.put(record["user"], record["limit"])
            out({"user": record["user"], "v": None, "limit": record["limit"], "over": None})

    def process_element(self, record: dict[str, Any], ctx: bf.KeyedContext, out: Out) -> None:
        limit = ctx.get_broadcast_state(LIMIT).get(ctx.key[0])
        if limit is not None and record["v"] > limit:
            over = ctx.get_state(self.over)
            over.update((over.value() or 0) + 1)
            out({"user": ctx.key[0], "v": record["v"], "limit": limit, "over": over.value()})


@bf.pipeline("chained_process", params=[bf.Param("landing_dir", str), bf.Param("parallelism", int, 2)])
def chained_process(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
    def source(name: str, schema: pa.Schema) -> Any:
        return p.source(bf.FileSource(name, f"{params['landing_dir']}/{name}", schema=schema, max_files_per_epoch=1))

    events = source("events", EVENTS).with_watermark("ts", timedelta(seconds=5), operator_id="events_watermark")
    commands = source("commands", COMMANDS).with_watermark("ts", timedelta(seconds=5), operator_id="commands_watermark")
    limits = source("limits", LIMITS)
    events.key_by("user").connect(commands.key_by("uid")).process("tracker", Tracker()).sink_to(bf.DeltaSink.append("tracked"))
    events.key_by("user").connect(limits.broadcast(LIMIT)).process("over_limit", OverLimit()).sink_to(bf.DeltaSink.append("over"))


def _write(landing: Path, seed: int = 4) -> None:
    rng = random.Random(seed)
    for name in ("events", "commands", "limits"):
        (landing / name).mkdir(parents=True)
    clock = 0.0
    for i in range(EPOCHS):
        users = "abcdefgh" if i < 2 else "abc"  # d-h go quiet: their timers fire with no record of theirs
        at = lambda: (T0 + timedelta(seconds=clock + rng.randrange(-8000, 20000) / 1000)).isoformat()  # noqa: E731
        events = [{"user": rng.choice(users), "ts": at(), "v": rng.randrange(100)} for _ in range(40)]
        commands = [{"uid": rng.choice(users), "ts": at(), "action": rng.choice(["block", "open"])} for _ in range(6)]
        limits = [{"user": u, "limit": rng.choice([None, 30, 60, 90])} for u in rng.sample("abcdefgh", 4)]
        for name, rows in (("events", events), ("commands", commands), ("limits", limits)):
            (landing / name / f"part-{i:03d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        clock += 25


def _run(spark: Any, landing: Path, warehouse: str) -> None:
    params = {"landing_dir": str(landing), "parallelism": 2}
    CheckpointCoordinator(chained_process, params, warehouse, spark_factory=lambda: spark).run(until_caught_up=True)


def _tables(warehouse: str, landing: Path) -> dict[str, list[str]]:
    """The sinks' rows and each state table's live rows (but their processing time), canonical and sorted."""
    from deltalake import DeltaTable

    tables = {}
    for sink in ("tracked", "over"):
        rows = run_query(warehouse, "chained_process", f"select * from {sink}").to_pylist()
        tables[sink] = sorted(map(repr, rows))
    layout = PipelineLayout.of(warehouse, "chained_process")
    for spec in chained_process.build({"landing_dir": str(landing)}).state_specs():
        if spec.name == "offsets":
            continue  # each run's own barriers
        rows = pa.table(DeltaTable(layout.state_table(spec.operator_id, spec.name)).to_pyarrow_table())
        live = latest_rows(rows, spec.key_columns).drop_columns(["_updated_at_ms"])
        tables[spec.table_name] = sorted(map(repr, live.to_pylist()))
    return tables


def test_chained_co_process_and_broadcast_process_write_the_tables_spark_writes(
    spark: Any, tmp_path: Path, warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    _write(landing)
    fronts: list[tuple[int, bool, tuple[str, ...]]] = []

    def counted(ctx: Any, region: Any) -> Any:
        result = run_region(ctx, region)
        fronts.append((ctx.epoch, result is not None, tuple(n.operator_id for n in region.nodes)))
        return result

    run_region = runtime.run_region
    monkeypatch.setattr(runtime, "run_region", counted)
    _run(spark, landing, warehouse)
    assert [(epoch, chained) for epoch, chained, _ in fronts] == [(n, True) for n in range(1, EPOCHS + 1)]
    assert all({"tracker", "over_limit", "sink_tracked", "sink_over"} <= set(nodes) for *_, nodes in fronts)
    monkeypatch.setenv(CHAINING_ENV, "false")
    spark_only = f"{warehouse}-spark"
    _run(spark, landing, spark_only)
    assert len(fronts) == EPOCHS, "chaining off: no front chained"
    ours, theirs = _tables(warehouse, landing), _tables(spark_only, landing)
    assert set(ours) == set(theirs) and {"tracker__timers", "over_limit__over", "over_limit__limits"} <= set(ours)
    for name in ours:
        assert ours[name] == theirs[name], f"table {name} differs between a chained front and Spark"
    # The timers did fire, of both domains, for quiet keys too; broadcast rows were emitted.
    tracked = run_query(warehouse, "chained_process", "select user, what, _epoch from tracked").to_pylist()
    assert {r["what"] for r in tracked} >= {"event", "idle", "TimeDomain.PROCESSING_TIME", "TimeDomain.EVENT_TIME"}
    assert any(r["user"] in "defgh" and r["_epoch"] == EPOCHS and r["what"] == "idle" for r in tracked)
    over = run_query(warehouse, "chained_process", "select v, over from over").to_pylist()
    assert any(r["v"] is None and r["over"] is None for r in over) and any(r["over"] for r in over)
