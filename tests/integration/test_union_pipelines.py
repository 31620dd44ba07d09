"""Union of two file sources on real Spark and Delta, against a plain-Python reference.

Two sources (one file each per epoch) are unioned and keyed into a process
function that numbers each key's records in the order it sees them, so the
output shows the order rule (per epoch, source 1's records before source 2's,
each in line order). Four epochs run through a savepoint, an injected
failure between two table commits, a parallelism change and a restore with
rewound sinks; every output row must match the reference, and a null key at
the second source must be a dead letter. A union of differing schemas fails
naming the columns. The README's union example runs as written.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pytest

import barrierflow as bf
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operations.query import run_query
from barrierflow.operations.restore import restore
from barrierflow.operations.savepoint import create_savepoint
from epoch_runs import epoch_runner, fail_after_first_commit
from readme_example import readme_module

RECORDS = pa.schema([pa.field("k", pa.string()), pa.field("v", pa.int64(), nullable=False)])
Out = Callable[[dict[str, Any]], None]


class Numbered(bf.KeyedProcessFunction):
    seen = bf.ValueStateDescriptor("seen", pa.int64())
    output_schema = pa.schema([("k", pa.string()), ("n", pa.int64()), ("v", pa.int64())])

    def process_element(self, record: dict[str, Any], ctx: bf.KeyedContext, out: Out) -> None:
        seen = ctx.get_state(self.seen)
        seen.update((seen.value() or 0) + 1)
        out({"k": record["k"], "n": seen.value(), "v": record["v"]})


@bf.pipeline("unioned", params=[bf.Param("a_dir", str), bf.Param("b_dir", str), bf.Param("parallelism", int, 2)])
def unioned(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
    a = p.source(bf.FileSource("a", params["a_dir"], schema=RECORDS, max_files_per_epoch=1))
    b = p.source(bf.FileSource("b", params["b_dir"], schema=RECORDS, max_files_per_epoch=1))
    a.filter("v >= 0").union(b).key_by("k").process("numbered", Numbered()).sink_to(bf.DeltaSink.append("numbered"))


def _epochs(seed: int = 5, n: int = 4) -> list[tuple[list[tuple[str, int]], list[tuple[str, int]]]]:
    """Per epoch, source a's and source b's records (key, value) in line order; values are unique."""
    rng = random.Random(seed)
    values = iter(range(1, 10_000))

    def records() -> list[tuple[str, int]]:
        return [(rng.choice("pqrst"), next(values)) for _ in range(rng.randrange(6, 12))]

    return [(records(), records()) for _ in range(n)]


def _reference(epochs: list[tuple[list[tuple[str, int]], list[tuple[str, int]]]]) -> list[tuple[str, int, int, int]]:
    """(key, n-th record of the key, value, epoch): per epoch source a's records, then source b's, each in line order."""
    counts: dict[str, int] = {}
    rows = []
    for epoch, (a, b) in enumerate(epochs, start=1):
        for key, value in a + b:
            counts[key] = counts.get(key, 0) + 1
            rows.append((key, counts[key], value, epoch))
    return sorted(rows)


def _write(landing: Path, epochs: list[tuple[list[tuple[str, int]], list[tuple[str, int]]]]) -> None:
    for side in "ab":
        (landing / side).mkdir(parents=True)
    for i, (a, b) in enumerate(epochs):
        for side, records in (("a", a), ("b", b)):
            lines = [json.dumps({"k": k, "v": v}) for k, v in records]
            if side == "b" and i == 1:
                lines.insert(2, json.dumps({"k": None, "v": 0}))  # a null key at the second source
            (landing / side / f"part-{i:03d}.jsonl").write_text("\n".join(lines) + "\n")


def _rows(warehouse: str) -> list[tuple[str, int, int, int]]:
    rows = run_query(warehouse, "unioned", "select k, n, v, _epoch from numbered").to_pylist()
    return sorted((r["k"], r["n"], r["v"], r["_epoch"]) for r in rows)


def test_a_union_of_two_sources_is_exactly_once_through_a_failure_a_rescale_and_a_restore(
    spark: Any, tmp_path: Path, warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    epochs = _epochs()
    landing = tmp_path / "landing"
    _write(landing, epochs)
    dirs = {"a_dir": str(landing / "a"), "b_dir": str(landing / "b")}

    run = epoch_runner(unioned, dirs, warehouse, spark)

    assert run(2, 2) == [1, 2]
    create_savepoint(unioned, warehouse, name="after-2", params=dirs)
    fail_after_first_commit(run, 2, monkeypatch, tmp_path)
    assert run(3)[-1] == 4

    expected = _reference(epochs)
    assert _rows(warehouse) == expected
    dead = run_query(warehouse, "unioned", "select source_file, line, reason from dead_letter").to_pylist()
    assert [(Path(r["source_file"]).name, r["line"], r["reason"]) for r in dead] == [("part-001.jsonl", 3, "null_key")]

    restore(unioned, warehouse, savepoint="after-2", rewind_sinks=True, parallelism=1, params=dirs)
    assert run(1) == [3, 4]
    assert _rows(warehouse) == expected

    # Inputs of differing schemas: the epoch fails before its vote, naming the columns.
    other = pa.schema([pa.field("k", pa.string()), pa.field("v", pa.string()), pa.field("w", pa.int64())])

    @bf.pipeline("mismatched", params=[bf.Param("a_dir", str), bf.Param("b_dir", str)])
    def mismatched(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
        a = p.source(bf.FileSource("a", params["a_dir"], schema=RECORDS))
        b = p.source(bf.FileSource("b", params["b_dir"], schema=other))
        a.union(b, operator_id="both").sink_to(bf.DeltaSink.append("out"))

    coordinator = CheckpointCoordinator(mismatched, dirs, warehouse, spark_factory=lambda: spark)
    with pytest.raises(PipelineDefinitionError, match=r"union 'both': input 2 .*extra \['w'\]; v is string, not int64"):
        coordinator.run(epochs=1)


def test_the_readme_union_pipeline_matches_a_plain_python_reference(spark: Any, tmp_path: Path, warehouse: str) -> None:
    """The README's "Union" block as written: web and store orders, deduplicated by order id, web first within an epoch."""
    module = readme_module(tmp_path / "user_code", "### Union", "readme_orders")
    rng = random.Random(11)
    landing = {side: tmp_path / side for side in ("web", "store")}
    for directory in landing.values():
        directory.mkdir()
    seen: dict[str, tuple[str, float]] = {}
    expected = []
    for epoch in (1, 2):
        batches = {side: [(f"o{rng.randrange(30)}", float(rng.randrange(1, 100))) for _ in range(10)] for side in landing}
        for side, records in batches.items():
            lines = [json.dumps({"order_id": o, "amount": a}) for o, a in records]
            (landing[side] / f"part-{epoch}.jsonl").write_text("\n".join(lines) + "\n")
        for side in ("web", "store"):  # the reference: web's records before store's, each in line order
            for order_id, amount in batches[side]:
                if order_id not in seen:
                    seen[order_id] = (side, amount)
                    expected.append((order_id, side, amount, epoch))
        given = {"web_dir": str(landing["web"]), "store_dir": str(landing["store"])}
        coordinator = CheckpointCoordinator(module.orders, given, warehouse, spark_factory=lambda: spark)
        assert [r.epoch for r in coordinator.run(until_caught_up=True)] == [epoch]
    rows = run_query(warehouse, "orders", "select order_id, channel, amount, _epoch from orders").to_pylist()
    assert sorted((r["order_id"], r["channel"], r["amount"], r["_epoch"]) for r in rows) == sorted(expected)
    assert {side for _, side, _, _ in expected} == {"web", "store"}
