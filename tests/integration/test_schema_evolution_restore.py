"""State and sink schemas that change between a savepoint and the code restoring it, on real Spark and Delta.

``counts`` v1 keeps, per user, a struct ``{count: int32}`` and appends each
record's running count. A savepoint after two epochs restores into v2 (the README's example), whose
state widens ``count`` to int64 and adds ``total`` (default 0.0), and whose
output adds a ``total`` column: the restore says what changed, the state
converts, and two more epochs continue from the restored counts (a plain
Python reference says every row). A v3 whose state changes ``count`` to a
string is refused with the change named, unless non-restored state is
allowed (then it starts empty); a v4 whose output changes the sink column
``count`` to a double is refused before its epoch votes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pytest

import barrierflow as bf
from barrierflow.checkpoint import EpochStatus
from barrierflow.checkpoint_log import CheckpointLog
from barrierflow.coordinator import CheckpointCoordinator
from barrierflow.errors import IncompatibleSavepointError, SchemaEvolutionError
from barrierflow.layout import PipelineLayout
from barrierflow.query import run_query
from barrierflow.restore import restore
from barrierflow.savepoint import create_savepoint
from readme_example import readme_module

EVENTS = pa.schema([pa.field("user", pa.string(), nullable=False), pa.field("amount", pa.int64())])
Out = Callable[[dict[str, Any]], None]


class CountsV1(bf.KeyedProcessFunction):
    stats = bf.ValueStateDescriptor("stats", pa.struct([("count", pa.int32())]))
    output_schema = pa.schema([("user", pa.string()), ("count", pa.int64())])

    def process_element(self, record: dict[str, Any], ctx: bf.KeyedContext, out: Out) -> None:
        state = ctx.get_state(self.stats)
        count = (state.value() or {"count": 0})["count"] + 1
        state.update({"count": count})
        out({"user": record["user"], "count": count})


class CountsV3(bf.KeyedProcessFunction):
    stats = bf.ValueStateDescriptor("stats", pa.struct([("count", pa.string())]))
    output_schema = CountsV1.output_schema

    def process_element(self, record: dict[str, Any], ctx: bf.KeyedContext, out: Out) -> None:
        state = ctx.get_state(self.stats)
        count = int((state.value() or {"count": "0"})["count"]) + 1
        state.update({"count": str(count)})
        out({"user": record["user"], "count": count})


class CountsV4(CountsV1):
    output_schema = pa.schema([("user", pa.string()), ("count", pa.float64())])


def _definition(function: bf.KeyedProcessFunction) -> bf.PipelineDefinition:
    @bf.pipeline("counts", params=[bf.Param("landing_dir", str), bf.Param("parallelism", int, 2)])
    def counts(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
        events = p.source(bf.FileSource("events", params["landing_dir"], schema=EVENTS, max_files_per_epoch=1))
        events.key_by("user").process("count", function).sink_to(bf.DeltaSink.append("counts"))

    return counts


EPOCHS = [
    [("a", 1), ("b", 2), ("a", 3)],
    [("b", 4), ("c", 5)],
    [("a", 6), ("c", 7), ("a", 8)],
    [("b", 9)],
]


def _reference() -> list[tuple[Any, ...]]:
    """(epoch, user, count, total): v1 for epochs 1-2 (no total), v2 after the restore (totals from 0 at the restore)."""
    rows, count, total = [], {}, {}
    for epoch, records in enumerate(EPOCHS, 1):
        for user, amount in records:
            count[user] = count.get(user, 0) + 1
            if epoch > 2:
                total[user] = total.get(user, 0.0) + amount
            rows.append((epoch, user, count[user], total[user] if epoch > 2 else None))
    return rows


def test_a_savepoint_restores_into_evolved_state_and_refuses_what_cannot_convert(
    spark: Any, tmp_path: Path, warehouse: str
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    for i, records in enumerate(EPOCHS):
        lines = [json.dumps({"user": u, "amount": a}) for u, a in records]
        (landing / f"part-{i:03d}.jsonl").write_text("\n".join(lines) + "\n")
    params = {"landing_dir": str(landing)}

    def run(function: bf.KeyedProcessFunction, epochs: int | None = None) -> list[int]:
        coordinator = CheckpointCoordinator(_definition(function), params, warehouse, spark_factory=lambda: spark)
        return [r.epoch for r in coordinator.run(epochs=epochs, until_caught_up=epochs is None)]

    assert run(CountsV1(), 2) == [1, 2]
    create_savepoint(_definition(CountsV1()), warehouse, name="v1", params=params)

    # An incompatible state change is refused, naming it; allowed, that state starts empty.
    with pytest.raises(IncompatibleSavepointError, match=r"count/stats \(schema changed: value\.count incompatible: int32 -> string\)"):
        restore(_definition(CountsV3()), warehouse, savepoint="v1", params=params)
    # A sink column changing type is refused before the epoch votes: nothing is committed.
    with pytest.raises(SchemaEvolutionError, match=r"sink counts: .*count incompatible: int64 -> double"):
        run(CountsV4(), 1)
    layout = PipelineLayout.of(warehouse, "counts")
    assert max(r.epoch for r in CheckpointLog(layout).records() if r.status is EpochStatus.COMPLETED) == 2

    # v2 is the README's "Schema evolution on restore" example as written.
    counts_v2 = readme_module(tmp_path / "user_code", "### Schema evolution on restore", "readme_counts").Counts()
    result = restore(_definition(counts_v2), warehouse, savepoint="v1", rewind_sinks=True, params=params)
    assert result.evolved_states == {
        "count/stats": ("value.count widened: int32 -> int64", "value.total added (double, default 0.0)")
    }
    assert run(counts_v2) == [3, 4]
    got = run_query(warehouse, "counts", "select _epoch, user, count, total from counts").to_pylist()
    assert sorted(tuple(r.values()) for r in got) == sorted(_reference())
    stats = run_query(warehouse, "counts", "select user, value from count__stats").to_pylist()
    assert {r["user"]: r["value"] for r in stats} == {
        "a": {"count": 4, "total": 14.0}, "b": {"count": 3, "total": 9.0}, "c": {"count": 2, "total": 7.0}
    }  # fmt: skip

    allowed = restore(_definition(CountsV3()), warehouse, savepoint="v1", allow_non_restored_state=True, params=params)
    assert allowed.empty_states == ("count/stats",) and allowed.evolved_states == {}
