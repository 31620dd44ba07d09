"""Engine features on real Spark and Delta: state types, TTL, Delta source,
record-bounded epochs, compaction, timestamp encoding."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from barrierflow import KeyedContext, KeyedProcessFunction
from barrierflow.api.params import Param
from barrierflow.api.state import (
    AggregatingStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.connectors import DeltaSink, DeltaSource, FileSource
from barrierflow.core.errors import SourceError
from barrierflow.operations.query import run_query
from barrierflow.plan.pipeline import PipelineBuilder, pipeline
from barrierflow.storage import objects

EVENTS = pa.schema([pa.field("user", pa.string(), nullable=False), pa.field("page", pa.string()), pa.field("ms", pa.int64())])


class MeanAgg:
    def create_accumulator(self) -> list[float]:
        return [0.0, 0.0]

    def add(self, value: float, acc: list[float]) -> list[float]:
        return [acc[0] + value, acc[1] + 1]

    def get_result(self, acc: list[float]) -> float:
        return acc[0] / acc[1]


class PageStats(KeyedProcessFunction):
    pages = MapStateDescriptor("pages", pa.string(), pa.int64())
    longest = ReducingStateDescriptor("longest", max, pa.int64())
    mean = AggregatingStateDescriptor("mean_ms", MeanAgg(), pa.list_(pa.float64()))
    last_page = ValueStateDescriptor("last_page", pa.string(), StateTtlConfig(timedelta(days=1)))
    state_descriptors = (pages, longest, mean, last_page)
    output_schema = pa.schema(
        [
            ("user", pa.string()),
            ("page", pa.string()),
            ("visits", pa.int64()),
            ("previous", pa.string()),
            ("longest", pa.int64()),
            ("mean_ms", pa.float64()),
        ]
    )

    def process_element(self, record: dict[str, Any], ctx: KeyedContext, out: Callable[[dict[str, Any]], None]) -> None:
        pages, longest = ctx.get_state(self.pages), ctx.get_state(self.longest)
        mean, last = ctx.get_state(self.mean), ctx.get_state(self.last_page)
        visits = (pages.get(record["page"]) or 0) + 1
        pages.put(record["page"], visits)
        longest.add(record["ms"])
        mean.add(float(record["ms"]))
        out(
            {
                "user": record["user"],
                "page": record["page"],
                "visits": visits,
                "previous": last.value(),
                "longest": longest.get(),
                "mean_ms": mean.get(),
            }
        )
        last.update(record["page"])


@pipeline("page_stats", params=[Param("landing_dir", str), Param("max_records", int, 3), Param("parallelism", int, 2)])
def page_stats(p: PipelineBuilder, params: dict[str, Any]) -> None:
    events = p.source(
        FileSource(
            "clicks", params["landing_dir"], schema=EVENTS, max_files_per_epoch=10, max_records_per_epoch=params["max_records"]
        )
    )
    events.key_by("user").process("per_user", PageStats()).sink_to(DeltaSink.append("visits"))


def _lines(*rows: dict[str, Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_process_function_state_types_across_record_bounded_epochs(spark: Any, tmp_path: Path, warehouse: str) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.jsonl").write_text(
        _lines(
            {"user": "u1", "page": "home", "ms": 10},
            {"user": "u2", "page": "home", "ms": 5},
            {"user": "u1", "page": "cart", "ms": 30},
        )
        + "not json\n"
        + _lines({"user": "u1", "page": "home", "ms": 20})
    )
    (landing / "b.jsonl").write_text(_lines({"user": "u2", "page": "home", "ms": 7}, {"page": "no user"}))
    coordinator = CheckpointCoordinator(page_stats, {"landing_dir": str(landing)}, warehouse, spark_factory=lambda: spark)
    results = coordinator.run(until_caught_up=True)
    # 7 lines / 3 records per epoch: the first epoch stops inside a.jsonl, the next resumes there.
    assert [r.epoch for r in results] == [1, 2, 3]
    offsets = [json.loads(r.record.offsets)["clicks"] for r in results]
    assert [(o["file"], o["line"]) for o in offsets] == [("a.jsonl", 3), ("b.jsonl", 1), ("b.jsonl", None)]
    rows = run_query(
        warehouse,
        "page_stats",
        "select user, page, visits, previous, longest, mean_ms, _epoch from visits order by _epoch, user, visits",
    ).to_pylist()
    u1 = [r for r in rows if r["user"] == "u1"]
    assert [(r["page"], r["visits"], r["previous"], r["longest"]) for r in u1] == [
        ("home", 1, None, 10),
        ("cart", 1, "home", 30),
        ("home", 2, "cart", 30),
    ]
    assert u1[-1]["mean_ms"] == pytest.approx(20.0)
    u2 = [r for r in rows if r["user"] == "u2"]
    assert [(r["visits"], r["previous"], r["_epoch"]) for r in u2] == [(1, None, 1), (2, "home", 2)]
    dead = run_query(warehouse, "page_stats", "select source_file, line, raw from dead_letter order by source_file").to_pylist()
    assert [(d["source_file"], d["line"]) for d in dead] == [("a.jsonl", 4), ("b.jsonl", 2)]
    state = run_query(warehouse, "page_stats", "select user, value from per_user__longest order by user").to_pylist()
    assert state == [{"user": "u1", "value": 30}, {"user": "u2", "value": 7}]


def test_delta_table_source_reads_each_version_once(spark: Any, warehouse: str) -> None:
    """Appends are read once each, rows with a bad key are dead letters, an added column is read, a retyped one refused."""
    source_uri = f"{warehouse.rsplit('/', 1)[0]}/events_table"  # beside the warehouse, on the same store
    write_deltalake(source_uri, pa.table({"user": ["a", "b"], "page": ["x", "y"], "ms": [1, 2]}))

    @pipeline("from_delta", params=[Param("parallelism", int, 2)])
    def from_delta(p: PipelineBuilder, params: dict[str, Any]) -> None:
        from barrierflow import Count, Sum

        p.source(DeltaSource("events", source_uri, max_versions_per_epoch=1)).key_by("user").aggregate(
            "per_user", Count(), Sum("ms", "total_ms")
        ).sink_to(DeltaSink.upsert("user_totals", key="user"))

    run = lambda: CheckpointCoordinator(from_delta, {}, warehouse, spark_factory=lambda: spark).run(until_caught_up=True)  # noqa: E731
    assert len(run()) == 1
    write_deltalake(source_uri, pa.table({"user": ["a"], "page": ["z"], "ms": [5]}), mode="append")
    write_deltalake(source_uri, pa.table({"user": ["c"], "page": ["z"], "ms": [9]}), mode="append")
    waiting = DeltaSource("events", source_uri).backlog({"version": 0})  # the two appends, since the first one's commit
    first_commit = next(h["timestamp"] for h in DeltaTable(source_uri).history() if h["version"] == 1)
    assert (waiting.files, waiting.oldest_arrival_ms) == (2, first_commit) and waiting.bytes > 0
    assert len(run()) == 2  # one version per epoch
    assert DeltaSource("events", source_uri).backlog({"version": 2}).files == 0
    rows = run_query(warehouse, "from_delta", "select user, count, total_ms from user_totals order by user").to_pylist()
    assert rows == [
        {"user": "a", "count": 2, "total_ms": 6.0},
        {"user": "b", "count": 1, "total_ms": 2.0},
        {"user": "c", "count": 1, "total_ms": 9.0},
    ]
    # A null and an empty key are dead letters; a column added by a schema merge is read.
    added = pa.table({"user": [None, "", "a"], "page": ["z"] * 3, "ms": [1, 2, 3], "referrer": ["r"] * 3})
    write_deltalake(source_uri, added, mode="append", schema_mode="merge")
    assert len(run()) == 1
    dead = run_query(warehouse, "from_delta", "select line, reason, detail from dead_letter order by line").to_pylist()
    assert [(d["line"], d["reason"]) for d in dead] == [(1, "null_key"), (2, "empty_key")]
    assert dead[0]["detail"] == "key user of operator per_user is missing or null"
    totals = run_query(warehouse, "from_delta", "select count, total_ms from user_totals where user = 'a'").to_pylist()
    assert totals == [{"count": 3, "total_ms": 9.0}]
    # A retyped column: an error naming it, and nothing of that version committed.
    write_deltalake(
        source_uri, pa.table({"user": ["a"], "page": ["z"], "ms": ["soon"]}), mode="overwrite", schema_mode="overwrite"
    )
    with pytest.raises(SourceError, match=r"version 4 of .* column ms is string, not int64"):
        run()


def test_parquet_landing_files_split_by_records_keep_arrival_order(spark: Any, warehouse: str) -> None:
    """Parquet landing files beside the warehouse (on S3: read by Python tasks), cut into epochs of 3 records."""
    import io

    landing = f"{warehouse.rsplit('/', 1)[0]}/landing"
    files = {
        "a.parquet": [("u1", "home", 10), ("u2", "home", 5), ("u1", "cart", 30), ("u1", "home", 20)],
        "b.parquet": [("u2", "cart", 7), ("u1", "cart", 1)],
    }
    for name, rows in files.items():
        buffer = io.BytesIO()
        table = pa.table({k: list(v) for k, v in zip(("user", "page", "ms"), zip(*rows))}, schema=EVENTS)
        pq.write_table(table, buffer, row_group_size=2)  # epoch 1 ends inside a.parquet's second row group
        assert objects.put_if_absent(objects.join_uri(landing, name), buffer.getvalue())
    # Not Parquet: one dead letter for the whole file, in the epoch that takes it (3).
    assert objects.put_if_absent(objects.join_uri(landing, "c.parquet"), b'{"user": "u3"}\n')

    @pipeline("parquet_clicks", params=[Param("landing_dir", str)])
    def parquet_clicks(p: PipelineBuilder, params: dict[str, Any]) -> None:
        source = FileSource(
            "clicks", params["landing_dir"], format="parquet", schema=EVENTS, max_files_per_epoch=10, max_records_per_epoch=3
        )
        p.source(source).key_by("user").process("per_user", PageStats()).sink_to(DeltaSink.append("visits"))

    results = CheckpointCoordinator(parquet_clicks, {"landing_dir": landing}, warehouse, spark_factory=lambda: spark).run(
        until_caught_up=True
    )
    assert [r.epoch for r in results] == [1, 2, 3]
    # A plain-Python reference of PageStats over the rows in arrival order.
    expected, visits, last, longest = [], {}, {}, {}
    for epoch, (user, page, ms) in [(1 if i < 3 else 2, row) for i, row in enumerate(files["a.parquet"] + files["b.parquet"])]:
        visits[user, page] = visits.get((user, page), 0) + 1
        longest[user] = max(longest.get(user, ms), ms)
        expected.append((user, page, visits[user, page], last.get(user), longest[user], epoch))
        last[user] = page
    rows = run_query(warehouse, "parquet_clicks", "select user, page, visits, previous, longest, _epoch from visits").to_pylist()
    assert sorted(tuple(r.values()) for r in rows) == sorted(expected)
    dead = run_query(warehouse, "parquet_clicks", "select source_file, line, reason, _epoch from dead_letter").to_pylist()
    assert dead == [{"source_file": "c.parquet", "line": None, "reason": "unreadable_file", "_epoch": 3}]


@pytest.mark.parametrize("placement", ["one_task", "parallel_tasks"])
def test_timestamps_are_microsecond_utc_and_compaction_keeps_content(
    spark: Any, tmp_path: Path, warehouse: str, monkeypatch: pytest.MonkeyPatch, placement: str
) -> None:
    from barrierflow.core import settings
    from barrierflow.core.arrow import latest_rows
    from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
    from barrierflow.plan.registry import get_pipeline
    from barrierflow.storage.layout import COMPACTED_DIR, PipelineLayout

    # In parallel tasks, each key-group range task writes its share of the compacted table.
    if placement == "parallel_tasks":
        monkeypatch.setenv(settings.SINGLE_TASK_INPUT_BYTES.env, "0")
    landing = tmp_path / "landing"
    write_sensor_files(landing, SensorStreamSpec(n_files=4, records_per_file=60, seed=41))
    coordinator = CheckpointCoordinator(
        get_pipeline("sensor_stats"),
        {"landing_dir": str(landing), "max_files_per_epoch": 1},
        str(warehouse),
        spark_factory=lambda: spark,
    )
    coordinator.run(until_caught_up=True)
    layout = PipelineLayout.of(str(warehouse), "sensor_stats")
    minute = DeltaTable(layout.sink_table("sensor_minute"))
    for uri in minute.file_uris():
        filesystem, path = objects.arrow_filesystem(uri)
        parquet = pq.ParquetFile(filesystem.open_input_file(path))
        assert parquet.schema_arrow.field("window_start").type == pa.timestamp("us", tz="UTC")  # never INT96, never ns
        assert parquet.metadata.schema.column(1).physical_type == "INT64"

    # Generations of 60 keys: by epoch 4 the changelog outgrew twice the largest, so that
    # epoch compacted the table in its tasks, in its own commit (size-tiered policy).
    uri = layout.state_table("dedup", "seen")
    table = DeltaTable(uri)
    compacting = next(h for h in table.history() if h.get("barrierflow.epoch") == 4)["version"]
    spec = next(s for s in coordinator.pipeline.state_specs() if s.table_name == "dedup__seen")
    compacted = DeltaTable(uri, version=compacting)
    assert compacted.file_uris() and all(f"/{COMPACTED_DIR}/" in f for f in compacted.file_uris()), "not compacted"
    before = latest_rows(DeltaTable(uri, version=compacting - 1).to_pyarrow_table(), spec.key_columns)
    after = compacted.to_pyarrow_table()
    key = lambda t: dict(zip(t["event_id"].to_pylist(), t["first_epoch"].to_pylist()))  # noqa: E731
    assert after.num_rows == len(key(after))  # one live row per key
    assert key(before).items() <= key(after).items()  # every earlier key kept, unchanged
    assert set(key(after).values()) - set(key(before).values()) <= {4}  # the rest are epoch 4's
    # Queries of the latest cut see the same state whatever compaction did.
    n = run_query(str(warehouse), "sensor_stats", "select count(*) as n from dedup__seen").to_pylist()[0]["n"]
    assert n == len(latest_rows(DeltaTable(uri).to_pyarrow_table(), spec.key_columns))


def test_the_session_handed_out_is_pysparks_active_one_after_an_engine_went_away(
    spark_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PySpark's ``functions`` ask the active session once per process; one whose engine is gone must not be it."""
    import pyspark.errors.utils
    import pyspark.sql.functions as F
    from pyspark.sql.connect.client.retries import DefaultPolicy
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    from barrierflow.execution.spark import get_spark
    from barrierflow.tools.devserver import free_port

    gone = RemoteSession.builder.remote(f"sc://127.0.0.1:{free_port()}").create()  # no round trip: its engine never ran
    gone.client.set_retry_policies([DefaultPolicy(max_retries=1, initial_backoff=50)])  # fail fast, not in 10 minutes
    monkeypatch.setattr(RemoteSession, "_default_session", gone)
    monkeypatch.setattr(RemoteSession._active_session, "session", gone)
    monkeypatch.setattr(pyspark.errors.utils, "_enable_debugging_cache", None)
    try:
        spark = get_spark(remote=spark_engine.address)
        assert spark.range(3).select(F.xxhash64("id")).count() == 3
    finally:
        gone.client.close()
