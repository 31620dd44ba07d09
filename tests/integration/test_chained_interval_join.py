"""The interval join's chained form on real Spark and Delta: its epochs write exactly the tables Spark's epochs write.

Two JSON Lines sources keyed by two columns (a string and a long) are
interval-joined (``l.ts - 3 s <= r.at <= l.ts + 2 s``, both bounds
inclusive, so both sides' cleanup times are shifted) over three epochs, once
with chaining on and once off. The records carry what the buffers' JSON must
write exactly as Spark's ``to_json`` (quotes, backslashes, control and
non-ASCII characters, microseconds, doubles, nulls), identical records (ties
of ``record_index``), records of one key and time differing only in a
string (``record_index`` by bytes), and late records on both sides (the
left's dropped, the right's to a late output). With chaining on, the join
must run in the chained task every epoch, and both runs must give identical
joined rows, late rows and buffers (``record`` and ``record_index``
included), tombstones written when the watermark passes a record's cleanup time.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
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
LEFT = pa.schema(
    [pa.field("k", pa.string()), pa.field("n", pa.int64()), pa.field("ts", US, nullable=False), pa.field("v", pa.float64()),
     pa.field("s", pa.string()), pa.field("flag", pa.bool_())]
)  # fmt: skip
RIGHT = pa.schema(
    [pa.field("key", pa.string()), pa.field("num", pa.int64()), pa.field("at", US, nullable=False), pa.field("v", pa.float64()),
     pa.field("s", pa.string())]
)  # fmt: skip
KEYS = [("a", 1), ("a", 2), ("b", 1), ('q"\\', 7)]
STRINGS = ["plain", 'quote " and \\ back', "tab\tnew\nline", "\x01\x1f ctl", "é ü \u2028", "\ufb01", "😀", "", None]


@bf.pipeline("chained_join", params=[bf.Param("left_dir", str), bf.Param("right_dir", str)])
def chained_join(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
    left = p.source(bf.FileSource("left", params["left_dir"], schema=LEFT, max_files_per_epoch=1)).with_watermark(
        "ts", timedelta(seconds=2)
    )
    right = p.source(bf.FileSource("right", params["right_dir"], schema=RIGHT, max_files_per_epoch=1)).with_watermark(
        "at", timedelta(seconds=1)
    )
    (left.key_by("k", "n")
         .interval_join(right.key_by("key", "num"))
         .between(timedelta(seconds=-3), timedelta(seconds=2), operator_id="j", right_late_output="late_right")
         .sink_to(bf.DeltaSink.append("pairs")))  # fmt: skip


def _write(landing: Path, seed: int = 4, epochs: int = 3) -> None:
    rng = random.Random(seed)

    def at(seconds: float) -> str:
        return (T0 + timedelta(seconds=seconds, microseconds=rng.choice([0, 1, 123456, 999999]))).isoformat()

    for side, (key, number, time) in (("left", ("k", "n", "ts")), ("right", ("key", "num", "at"))):
        (landing / side).mkdir(parents=True)
        for i in range(epochs):
            clock = 10 * i
            records = []
            for _ in range(9):
                k, n = rng.choice(KEYS)
                value = rng.choice([12.5, 0.1, 1234567.25, -0.0, 0.001, None])
                record = {key: k, number: n, time: at(clock + rng.randrange(-4, 5)), "v": value, "s": rng.choice(STRINGS)}
                if side == "left":
                    record["flag"] = rng.choice([True, False, None])
                records.append(record)
            records.append(dict(records[0]))  # an identical record: a tie of record_index
            ahead = at(clock + 4)  # kept in state past the epoch
            for s in ("\ufb01", "😀"):  # same key and time, ordered by the record's bytes (not UTF-16)
                records.append({**records[1], time: ahead, "s": s})
            if i:
                records.append({**records[2], time: at(clock - 30)})  # late: dropped (left), to late_right (right)
            lines = [json.dumps(r, ensure_ascii=False) for r in records]
            (landing / side / f"part-{i:03d}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _run(spark: Any, landing: Path, warehouse: str) -> None:
    params = {"left_dir": str(landing / "left"), "right_dir": str(landing / "right")}
    CheckpointCoordinator(chained_join, params, warehouse, spark_factory=lambda: spark).run(until_caught_up=True)


def _tables(warehouse: str, landing: Path) -> dict[str, list[str]]:
    """The outputs' rows, each state table's live rows and the buffers' changes (but processing times), canonical and sorted."""
    from deltalake import DeltaTable

    tables = {}
    for name in ("pairs", "late_right"):
        tables[name] = sorted(map(repr, run_query(warehouse, "chained_join", f"select * from {name}").to_pylist()))
    layout = PipelineLayout.of(warehouse, "chained_join")
    for spec in chained_join.build({"left_dir": str(landing / "left"), "right_dir": str(landing / "right")}).state_specs():
        if spec.name == "offsets":
            continue  # each run's own barriers
        rows = pa.table(DeltaTable(layout.state_table(spec.operator_id, spec.name)).to_pyarrow_table())
        rows = rows.drop_columns(["_updated_at_ms"])
        if spec.operator_id == "j":  # the buffers' rows of every epoch, tombstones included
            assert pc.any(rows["_deleted"]).as_py(), f"{spec.table_name}: the watermark passed no record"
            tables[f"{spec.table_name} changes"] = sorted(map(repr, rows.to_pylist()))
        tables[spec.table_name] = sorted(map(repr, latest_rows(rows, spec.key_columns).to_pylist()))
    return tables


def test_the_chained_interval_join_writes_the_tables_spark_writes(
    spark: Any, tmp_path: Path, warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    _write(landing)
    regions: list[tuple[int, bool, bool]] = []

    def counted(ctx: Any, region: Any) -> Any:
        result = run_region(ctx, region)
        regions.append((ctx.epoch, "j" in {n.operator_id for n in region.nodes}, result is not None))
        return result

    run_region = runtime.run_region
    monkeypatch.setattr(runtime, "run_region", counted)
    _run(spark, landing, warehouse)
    assert regions == [(1, True, True), (2, True, True), (3, True, True)], "the join ran chained every epoch"
    monkeypatch.setenv(CHAINING_ENV, "false")
    spark_only = f"{warehouse}-spark"
    _run(spark, landing, spark_only)
    assert len(regions) == 3, "chaining off: nothing chained"
    ours, theirs = _tables(warehouse, landing), _tables(spark_only, landing)
    assert len(ours["pairs"]) > 20 and ours["late_right"] and ours["j__left"] and ours["j__right"]
    assert set(ours) == set(theirs)
    for name in ours:
        assert ours[name] == theirs[name], f"{name} differs between a chained join and Spark's"
