"""State and sink schemas that change between a savepoint and the code restoring it, on real Spark and Delta.

``counts`` v1 keeps, per user, a struct ``{count: int32}`` and writes each
record's running count (an int32 column) to an append sink ``counts`` and an
upsert sink ``latest``. A savepoint after two epochs restores into v2 (the
README's example), whose state widens ``count`` to int64 and adds ``total``
(default 0.0), and whose output widens the sinks' ``count`` to int64 and adds
a ``total`` column: the restore says what changed, the state converts, and
two more epochs continue from the restored counts (a plain Python reference
says every row). The first of them widens both sink tables, each in the one
commit of its epoch that also adds the epoch's rows; a crash right before
the ``counts`` commit is rolled forward without rewriting twice. A v3 whose
state changes ``count`` to a string is refused with the change named, unless
non-restored state is allowed (then it starts empty); a v4 whose output
narrows the sink column ``count`` to int16 is refused before its epoch votes.
The last epoch's output leaves the nullable ``total`` out: its rows read null,
and the rows the upsert sink carries over keep theirs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import deltalake
import pyarrow as pa
import pytest

import barrierflow as bf
from barrierflow.checkpointing.checkpoint import EpochStatus, Manifest
from barrierflow.checkpointing.checkpoint_log import CheckpointLog
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.core.errors import IncompatibleSavepointError, InjectedFault, SchemaEvolutionError
from barrierflow.operations.query import run_query
from barrierflow.operations.restore import restore
from barrierflow.operations.savepoint import create_savepoint
from barrierflow.storage import objects
from barrierflow.storage.delta import live_paths
from barrierflow.storage.layout import PipelineLayout
from readme_example import readme_module

EVENTS = pa.schema([pa.field("user", pa.string(), nullable=False), pa.field("amount", pa.int64())])
Out = Callable[[dict[str, Any]], None]


class CountsV1(bf.KeyedProcessFunction):
    stats = bf.ValueStateDescriptor("stats", pa.struct([("count", pa.int32())]))
    output_schema = pa.schema([("user", pa.string()), ("count", pa.int32())])

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
    output_schema = pa.schema([("user", pa.string()), ("count", pa.string())])


def _definition(function: bf.KeyedProcessFunction) -> bf.PipelineDefinition:
    @bf.pipeline("counts", params=[bf.Param("landing_dir", str), bf.Param("parallelism", int, 2)])
    def counts(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
        events = p.source(bf.FileSource("events", params["landing_dir"], schema=EVENTS, max_files_per_epoch=1))
        counted = events.key_by("user").process("count", function)
        counted.sink_to(bf.DeltaSink.append("counts"))
        counted.sink_to(bf.DeltaSink.upsert("latest", "user"))

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
    spark: Any, tmp_path: Path, warehouse: str, monkeypatch: pytest.MonkeyPatch
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
    with pytest.raises(
        IncompatibleSavepointError, match=r"count/stats \(schema changed: value\.count incompatible: int32 -> string\)"
    ):
        restore(_definition(CountsV3()), warehouse, savepoint="v1", params=params)
    # A sink column changing type (other than widening or narrowing) is refused before the epoch votes: nothing is committed.
    with pytest.raises(SchemaEvolutionError, match=r"sink (counts|latest): .*count incompatible: int32 -> string"):
        run(CountsV4(), 1)
    layout = PipelineLayout.of(warehouse, "counts")
    records = [r for r in CheckpointLog(layout).records() if r.status is EpochStatus.COMPLETED]
    assert max(r.epoch for r in records) == 2
    counts_uri = layout.sink_table("counts")
    assert deltalake.DeltaTable(counts_uri).version() == max(r.versions()["counts"] for r in records)

    # v2 is the README's "Schema evolution on restore" example as written.
    counts_v2 = readme_module(tmp_path / "user_code", "### Schema evolution on restore", "readme_counts").Counts()
    result = restore(_definition(counts_v2), warehouse, savepoint="v1", rewind_sinks=True, params=params)
    assert result.evolved_states == {
        "count/stats": ("value.count widened: int32 -> int64", "value.total added (double, default 0.0)")
    }
    stored_files = live_paths(deltalake.DeltaTable(counts_uri))  # after the rewind: epochs 1-2's rows, int32

    # Crash once epoch 3 voted, before its tables commit (they commit side by side: no order to crash between).
    monkeypatch.setenv("BARRIERFLOW_FAULT", "process.after_manifest:1:raise")
    monkeypatch.setenv("BARRIERFLOW_FAULT_STATE", str(tmp_path / "faults"))
    with pytest.raises(InjectedFault):
        run(counts_v2, 1)
    monkeypatch.delenv("BARRIERFLOW_FAULT")
    # Epoch 3 voted the widening (its rewrite staged, in its manifest) but did not commit it.
    voted = Manifest.from_json(objects.read_json(layout.manifest(result.lineage_id, 3)))
    widening = next(t for t in voted.tables if t.name == "counts")
    assert widening.table_schema_json is not None and '"long"' in widening.table_schema_json
    assert set(widening.removes) == stored_files == live_paths(deltalake.DeltaTable(counts_uri))
    assert all(objects.exists(f"{counts_uri}/{f.path}") for f in widening.adds)

    class CountsWithoutTotal(type(counts_v2)):  # type: ignore[misc]
        """v2 whose output leaves the nullable sink column ``total`` out and, as v1's did, writes ``count`` as int32 (its state unchanged)."""

        output_schema = pa.schema([("user", pa.string()), ("count", pa.int32())])

        def process_element(self, record: dict[str, Any], ctx: bf.KeyedContext, out: Out) -> None:
            super().process_element(record, ctx, lambda row: out({k: v for k, v in row.items() if k != "total"}))

    # Epoch 3 is rolled forward first; epoch 4's rows read null for the column its output leaves out,
    # and its int32 counts are written as the widened table's int64 (code rolled back, no rewrite).
    assert run(CountsWithoutTotal()) == [4]
    expected = [(e, u, c, None if e == 4 else t) for e, u, c, t in _reference()]
    got = run_query(warehouse, "counts", "select _epoch, user, count, total from counts").to_pylist()
    assert sorted(tuple(r.values()) for r in got) == sorted(expected)
    # A plain Delta table: any reader reads the stored rows as longs, with no table feature.
    table = deltalake.DeltaTable(counts_uri)
    assert table.to_pyarrow_table().schema.field("count").type == pa.int64()
    assert "typeWidening" not in (table.protocol().writer_features or [])
    # One commit of epoch 3: the widened schema, every stored file removed, rewritten and the epoch's rows added.
    (entry,) = [h for h in table.history() if h.get("barrierflow.epoch") == 3]
    log_entry = objects.read_bytes(objects.join_uri(counts_uri, "_delta_log", f"{entry['version']:020d}.json"))
    assert log_entry is not None
    actions = [json.loads(line) for line in log_entry.decode().splitlines()]
    kinds = [next(iter(a)) for a in actions]
    assert kinds.count("metaData") == 1 and '"long"' in next(a["metaData"]["schemaString"] for a in actions if "metaData" in a)
    assert {a["remove"]["path"] for a in actions if "remove" in a} == stored_files
    assert {a["add"]["path"] for a in actions if "add" in a} == {f.path for f in widening.adds}
    assert {a["txn"]["version"] for a in actions if "txn" in a} >= {3}
    # The upsert sink, seeded from the savepoint with int32 counts, widened the same way. It keeps
    # each key's last row: epoch 3 gave it two rows for "a", of which the second (count 4) wins; the
    # rows epoch 4 carried over into its rewritten files keep their totals.
    latest = deltalake.DeltaTable(layout.sink_table("latest")).to_pyarrow_table()
    assert latest.schema.field("count").type == pa.int64()
    last = {row[1]: row for row in expected}
    assert sorted(zip(*(latest[c].to_pylist() for c in ("_epoch", "user", "count", "total")))) == sorted(last.values())
    stats = run_query(warehouse, "counts", "select user, value from count__stats").to_pylist()
    assert {r["user"]: r["value"] for r in stats} == {
        "a": {"count": 4, "total": 14.0}, "b": {"count": 3, "total": 9.0}, "c": {"count": 2, "total": 7.0}
    }  # fmt: skip

    allowed = restore(_definition(CountsV3()), warehouse, savepoint="v1", allow_non_restored_state=True, params=params)
    assert allowed.empty_states == ("count/stats",) and allowed.evolved_states == {}
