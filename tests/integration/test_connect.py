"""Connected keyed streams and a keyed co-process function on real Spark and Delta, against a plain-Python reference.

Events (side 1) and block/unblock commands (side 2) from two sources share
each user's state; a command also registers a processing-time timer that
fires at the end of its epoch. Four epochs run through a savepoint, an
injected failure between two table commits, a parallelism change and a
restore with rewound sinks; every output row and the state left must match
the reference, and a null key at the second source is a dead letter. The
README's co-process example runs as written.
"""

from __future__ import annotations

import json
import random
from datetime import datetime
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

EVENTS = pa.schema([pa.field("user", pa.string()), pa.field("v", pa.int64(), nullable=False)])
COMMANDS = pa.schema([pa.field("uid", pa.string()), pa.field("action", pa.string(), nullable=False)])
Out = Callable[[dict[str, Any]], None]
Epoch = tuple[list[tuple[str, int]], list[tuple[str, str]]]


class Guard(bf.KeyedCoProcessFunction):
    blocked = bf.ValueStateDescriptor("blocked", pa.bool_())
    passed = bf.ValueStateDescriptor("passed", pa.int64())
    output_schema = pa.schema([("user", pa.string()), ("what", pa.string()), ("v", pa.int64()), ("n", pa.int64())])

    def process_element1(self, record: dict[str, Any], ctx: bf.KeyedContext, out: Out) -> None:
        if not ctx.get_state(self.blocked).value():
            passed = ctx.get_state(self.passed)
            passed.update((passed.value() or 0) + 1)
            out({"user": ctx.key[0], "what": "event", "v": record["v"], "n": passed.value()})

    def process_element2(self, record: dict[str, Any], ctx: bf.KeyedContext, out: Out) -> None:
        blocked = ctx.get_state(self.blocked)
        if record["action"] == "block":
            blocked.update(True)
        else:
            blocked.clear()
        ctx.timer_service().register_processing_time_timer(0)  # in the past: fires at the end of this epoch

    def on_timer(self, timestamp: datetime, ctx: bf.KeyedContext, out: Out) -> None:
        out({"user": ctx.key[0], "what": "blocked" if ctx.get_state(self.blocked).value() else "open", "v": None,
             "n": ctx.get_state(self.passed).value()})  # fmt: skip


@bf.pipeline("guarded", params=[bf.Param("events_dir", str), bf.Param("commands_dir", str), bf.Param("parallelism", int, 2)])
def guarded(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
    events = p.source(bf.FileSource("events", params["events_dir"], schema=EVENTS, max_files_per_epoch=1))
    commands = p.source(bf.FileSource("commands", params["commands_dir"], schema=COMMANDS, max_files_per_epoch=1))
    (
        events.key_by("user")
        .connect(commands.filter("action is not null").key_by("uid"))
        .process("guard", Guard())
        .sink_to(bf.DeltaSink.append("guarded"))
    )


def _epochs(seed: int = 9, n: int = 4) -> list[Epoch]:
    rng = random.Random(seed)
    values = iter(range(1, 10_000))
    return [
        (
            [(rng.choice("pqrs"), next(values)) for _ in range(rng.randrange(6, 12))],
            [(rng.choice("pqrs"), rng.choice(["block", "unblock"])) for _ in range(rng.randrange(1, 4))],
        )
        for _ in range(n)
    ]


def _reference(epochs: list[Epoch]) -> tuple[list[tuple[Any, ...]], dict[str, int]]:
    """Rows (user, what, v, n, epoch) and the passed counts left: per epoch every event (the source declared
    first), then every command, each in line order; then one timer per user who got a command."""
    blocked: set[str] = set()
    passed: dict[str, int] = {}
    rows: list[tuple[Any, ...]] = []
    for epoch, (events, commands) in enumerate(epochs, start=1):
        for user, v in events:
            if user not in blocked:
                passed[user] = passed.get(user, 0) + 1
                rows.append((user, "event", v, passed[user], epoch))
        for user, action in commands:
            (blocked.add if action == "block" else blocked.discard)(user)
        for user in sorted({u for u, _ in commands}):
            rows.append((user, "blocked" if user in blocked else "open", None, passed.get(user), epoch))
    return rows, passed


def _write(landing: Path, epochs: list[Epoch]) -> None:
    for side in ("events", "commands"):
        (landing / side).mkdir(parents=True)
    for i, (events, commands) in enumerate(epochs):
        (landing / "events" / f"part-{i:03d}.jsonl").write_text(
            "".join(json.dumps({"user": u, "v": v}) + "\n" for u, v in events)
        )
        lines = [json.dumps({"uid": u, "action": a}) for u, a in commands]
        if i == 2:
            lines.insert(1, json.dumps({"uid": None, "action": "block"}))  # a null key at the second source
        (landing / "commands" / f"part-{i:03d}.jsonl").write_text("\n".join(lines) + "\n")


def _sorted(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted(rows, key=repr)


def _rows(warehouse: str) -> list[tuple[Any, ...]]:
    rows = run_query(warehouse, "guarded", "select user, what, v, n, _epoch from guarded").to_pylist()
    return _sorted([(r["user"], r["what"], r["v"], r["n"], r["_epoch"]) for r in rows])


def test_a_co_process_function_is_exactly_once_through_a_failure_a_rescale_and_a_restore(
    spark: Any, tmp_path: Path, warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    epochs = _epochs()
    landing = tmp_path / "landing"
    _write(landing, epochs)
    dirs = {"events_dir": str(landing / "events"), "commands_dir": str(landing / "commands")}

    run = epoch_runner(guarded, dirs, warehouse, spark)

    assert run(2, 2) == [1, 2]
    create_savepoint(guarded, warehouse, name="after-2", params=dirs)
    fail_after_first_commit(run, 2, monkeypatch, tmp_path)
    assert run(3)[-1] == 4

    rows, passed = _reference(epochs)
    assert _rows(warehouse) == _sorted(rows)
    assert {r[1] for r in rows} == {"event", "blocked", "open"}
    # One state table per descriptor, keyed by the first side's key name, shared by both sides.
    stored = run_query(warehouse, "guarded", "select user, value from guard__passed").to_pylist()
    assert {r["user"]: r["value"] for r in stored} == passed
    dead = run_query(warehouse, "guarded", "select source_file, line, reason from dead_letter").to_pylist()
    assert [(Path(r["source_file"]).name, r["line"], r["reason"]) for r in dead] == [("part-002.jsonl", 2, "null_key")]

    restore(guarded, warehouse, savepoint="after-2", rewind_sinks=True, parallelism=1, params=dirs)
    assert run(1) == [3, 4]
    assert _rows(warehouse) == _sorted(rows)


def test_the_readme_co_process_pipeline_matches_a_plain_python_reference(spark: Any, tmp_path: Path, warehouse: str) -> None:
    """The README's "Connected streams" block as written: prices per product, orders priced at the latest price."""
    module = readme_module(tmp_path / "user_code", "### Connected streams", "readme_pricing")
    rng = random.Random(4)
    landing = {side: tmp_path / side for side in ("orders", "prices")}
    for directory in landing.values():
        directory.mkdir()
    price: dict[str, float] = {}
    expected = []
    for epoch in (1, 2):
        orders = [(f"o{epoch}-{i}", rng.choice("xyz"), rng.randrange(1, 5)) for i in range(10)]
        prices = [(rng.choice("xyz"), float(rng.randrange(1, 50))) for _ in range(3)]
        (landing["orders"] / f"part-{epoch}.jsonl").write_text(
            "".join(json.dumps({"order_id": o, "product": p, "quantity": q}) + "\n" for o, p, q in orders)
        )
        (landing["prices"] / f"part-{epoch}.jsonl").write_text(
            "".join(json.dumps({"product": p, "price": v}) + "\n" for p, v in prices)
        )
        # The reference: orders (declared first) before the epoch's price changes.
        for order_id, product, quantity in orders:
            expected.append((order_id, product, quantity * price[product] if product in price else None, epoch))
        price.update(prices)
        given = {"orders_dir": str(landing["orders"]), "prices_dir": str(landing["prices"])}
        coordinator = CheckpointCoordinator(module.pricing, given, warehouse, spark_factory=lambda: spark)
        assert [r.epoch for r in coordinator.run(until_caught_up=True)] == [epoch]
    rows = run_query(warehouse, "pricing", "select order_id, product, total, _epoch from priced").to_pylist()
    assert _sorted([(r["order_id"], r["product"], r["total"], r["_epoch"]) for r in rows]) == _sorted(expected)
    assert any(total is None for *_, total, _ in expected) and any(total is not None for *_, total, _ in expected)
