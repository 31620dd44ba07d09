"""Event-time windows in a chained front on real Spark and Delta: the tables Spark's epochs write, bit for bit.

One pipeline over JSON Lines records with a schema (so that its windows run
in the chained region, :mod:`barrierflow.execution.chained_region`): sessions with and
without allowed lateness, sliding and tumbling windows (a two-column key, every
aggregation the chained form computes), a long value column summed as
doubles, and a percentile (which the chained form declines: that window
runs on Spark in the same epochs). Run with chaining on and off, both runs
must write identical sink tables (rows and schemas), late side outputs and
state tables (every row, tombstones included). The records cover what the
module docstring of :mod:`barrierflow.operators.window` distinguishes: late
records, updates within the allowed lateness, sessions bridged across epochs
(a retraction), purges, and values whose float sums, minimum and maximum
depend on arrival order (``1e16`` and ``1.0``, ``NaN``, ``-0.0`` and ``0.0``).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import barrierflow as bf
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.execution import runtime
from barrierflow.execution.chaining import CHAINING_ENV
from barrierflow.storage.layout import COMPACTED_DIR, PipelineLayout

pytestmark = pytest.mark.usefixtures("pruned_state_reads")

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z
EVENTS = pa.schema([("k", pa.string()), ("g", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")), ("v", pa.float64())])
NAN = float("nan")

# (key, group, seconds after T0, value) per epoch, in arrival order; the watermark has no out-of-orderness.
EPOCHS: list[list[tuple[str, int, float, float]]] = [
    [
        ("a", 1, 13, 0.1), ("a", 1, 14, 0.2), ("a", 2, 20, 0.3), ("b", 1, 6, 2.0), ("d", 1, 10, 1.0), ("e", 1, 21, 1.5),
        ("n", 1, 1.5, NAN), ("n", 1, 2, -0.0), ("n", 2, 2.25, 0.0), ("n", 1, 3, 1.0),
        ("z", 1, 3, 1e16), ("z", 1, 3.5, 1.0), ("z", 1, 4, -1e16), ("z", 1, 4.5, 1.0),
        ("a", 1, 26.000001, 0.5),
    ],
    [("a", 1, 17, 0.6), ("b", 1, 3, 9.0), ("n", 1, 24, 0.0), ("n", 1, 24.5, -0.0), ("a", 1, 27, 1.0), ("z", 2, 25, 3.0)],
    [("a", 1, 15, 7.0), ("a", 2, 5, 3.0), ("a", 1, 12, 0.25), ("z", 2, 26, 1e16), ("z", 2, 22, 2.0), ("c", 1, 50, 1.0)],
    [("c", 1, 52, 2.0), ("a", 1, 49, 0.5), ("e", 2, 90, 1.0)],
]
WINDOWS = ("sessions", "strict", "sliding", "tumbling", "long_sums")  # those with a chained form
SINKS = ("sessions_log", "sessions_latest", "strict_log", "sliding_log", "tumbling_log", "long_log", "percentile_log")
LATE = ("late_sessions", "late_strict", "late_sliding", "late_tumbling", "late_long", "late_percentile")
ALL_AGGREGATIONS = {"n": bf.Count(), "total": bf.Sum("v"), "low": bf.Min("v"), "high": bf.Max("v"), "mean": bf.Avg("v")}


@bf.pipeline("chained_windows", params=[bf.Param("landing_dir", str), bf.Param("parallelism", int, 2)])
def chained_windows(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
    events = p.source(bf.FileSource("events", params["landing_dir"], schema=EVENTS, max_files_per_epoch=1))
    timed = events.with_watermark("ts", timedelta(0))
    by_key = timed.key_by("k")
    lateness = timedelta(seconds=10)
    gap = bf.EventTimeSessionWindows.with_gap(timedelta(seconds=4))
    sessions = by_key.window("sessions", gap, **ALL_AGGREGATIONS, late_output="late_sessions", allowed_lateness=lateness)
    sessions.sink_to(bf.DeltaSink.append("sessions_log"))
    sessions.sink_to(bf.DeltaSink.upsert("sessions_latest", key=("k", "window_start")))  # on Spark: an output of the region
    strict = by_key.window("strict", gap, n=bf.Count(), total=bf.Sum("v"), late_output="late_strict")
    strict.sink_to(bf.DeltaSink.append("strict_log"))
    by_key.window(
        "sliding",
        bf.SlidingEventTimeWindows.of(timedelta(seconds=10), timedelta(seconds=5)),
        **ALL_AGGREGATIONS,
        late_output="late_sliding",
        allowed_lateness=lateness,
    ).sink_to(bf.DeltaSink.append("sliding_log"))
    by_group = timed.key_by("k", "g")
    by_group.window(
        "tumbling", bf.TumblingEventTimeWindows.of(timedelta(seconds=10)), **ALL_AGGREGATIONS, late_output="late_tumbling"
    ).sink_to(bf.DeltaSink.append("tumbling_log"))
    by_key.window("long_sums", gap, total=bf.Sum("g"), late_output="late_long").sink_to(bf.DeltaSink.append("long_log"))
    by_key.window("percentile", gap, p50=bf.Percentile("v", q=0.5), late_output="late_percentile").sink_to(
        bf.DeltaSink.append("percentile_log")
    )


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(T0 + seconds, timezone.utc).isoformat().replace("+00:00", "Z")


def _write(landing: Path) -> None:
    landing.mkdir()
    for i, records in enumerate(EPOCHS, 1):
        # NaN as a string: Spark's JSON reader takes the string "NaN" as a double, the bare token as no JSON.
        lines = [json.dumps({"k": k, "g": g, "ts": _iso(t), "v": "NaN" if v != v else v}) for k, g, t, v in records]
        (landing / f"{i}.jsonl").write_text("".join(line + "\n" for line in lines))


def _tables(warehouse: str, landing: Path) -> dict[str, tuple[str, list[str]]]:
    """Every sink and state table: its schema and its rows (all of them, tombstones included; not the processing time)."""
    from deltalake import DeltaTable

    layout = PipelineLayout.of(warehouse, "chained_windows")
    uris = {name: layout.sink_table(name) for name in (*SINKS, *LATE)}
    for spec in chained_windows.build({"landing_dir": str(landing)}).state_specs():
        if spec.name != "offsets":
            uris[spec.table_name] = layout.state_table(spec.operator_id, spec.name)
    tables = {}
    for name, uri in uris.items():
        table = DeltaTable(uri)
        rows = table.to_pyarrow_table()
        if "_updated_at_ms" in rows.column_names:
            rows = rows.drop_columns(["_updated_at_ms"])
        tables[name] = (str(table.schema().to_arrow()), sorted(map(repr, rows.to_pylist())))
    return tables


def _compacted(warehouse: str, landing: Path) -> set[str]:
    """The window state tables whose files a compaction wrote (the chained task writes every live row then)."""
    from deltalake import DeltaTable

    layout = PipelineLayout.of(warehouse, "chained_windows")
    specs = [s for s in chained_windows.build({"landing_dir": str(landing)}).state_specs() if s.operator_id in WINDOWS]
    files = {s.table_name: DeltaTable(layout.state_table(s.operator_id, s.name)).file_uris() for s in specs}
    return {name for name, uris in files.items() if any(f"/{COMPACTED_DIR}/" in uri for uri in uris)}


def _run(spark: Any, landing: Path, warehouse: str) -> None:
    coordinator = CheckpointCoordinator(chained_windows, {"landing_dir": str(landing)}, warehouse, spark_factory=lambda: spark)
    coordinator.run(until_caught_up=True)


def test_chained_windows_write_the_tables_spark_writes(
    spark: Any, tmp_path: Path, warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    _write(landing)
    fronts: list[tuple[int, tuple[str, ...], bool]] = []

    def counted(ctx: Any, region: Any) -> Any:
        result = run_region(ctx, region)
        fronts.append((ctx.epoch, tuple(n.operator_id for n in region.nodes), result is not None))
        return result

    run_region = runtime.run_region
    monkeypatch.setattr(runtime, "run_region", counted)
    monkeypatch.setenv(CHAINING_ENV, "true")  # whatever the environment says: this test turns it on, then off
    _run(spark, landing, warehouse)
    assert [(epoch, chained) for epoch, _, chained in fronts] == [(1, True), (2, True), (3, True), (4, True)]
    for _, nodes, _ in fronts:
        assert set(WINDOWS) <= set(nodes) and "percentile" not in nodes, nodes
    monkeypatch.setenv(CHAINING_ENV, "false")
    spark_only = f"{warehouse}-spark"
    _run(spark, landing, spark_only)
    assert len(fronts) == 4, "chaining off: no front chained"
    ours, theirs = _tables(warehouse, landing), _tables(spark_only, landing)
    # Both runs compacted the same window tables (in a chained epoch: the task wrote every live row).
    assert _compacted(warehouse, landing) == _compacted(spark_only, landing) != set()
    assert set(ours) == set(theirs)
    for name in ours:
        assert ours[name][0] == theirs[name][0], f"{name}: schema differs between a chained front and Spark"
        assert ours[name][1] == theirs[name][1], f"{name}: rows differ between a chained front and Spark"
    # The data covers what the chained form distinguishes.
    sessions = bf.run_query(warehouse, "chained_windows", "select * from sessions_log").to_pylist()
    assert any(r["retracted"] for r in sessions) and any(r["is_update"] and not r["retracted"] for r in sessions)
    assert all(ours[name][1] for name in LATE[:4])
    z = bf.run_query(warehouse, "chained_windows", "select total from tumbling_log where k = 'z' and g = 1").to_pylist()
    assert z == [{"total": 1.0}]  # (((0.0 + 1e16) + 1.0) + -1e16) + 1.0: arrival order


def test_what_the_chained_form_declines() -> None:
    """Configurations it leaves to Spark (no chained form), and late records it would drop without a side output (the epoch)."""
    from barrierflow.execution.chained_region import RegionDeclined, RegionTask
    from barrierflow.operators.aggregate import named_aggregations
    from barrierflow.operators.window import window_node

    schema = pa.schema([*EVENTS, pa.field("_seq", pa.int64())])
    gap = bf.EventTimeSessionWindows.with_gap(timedelta(seconds=4))

    def window(assigner: Any = gap, key: tuple[str, ...] = ("k",), late_output: str | None = "late", **aggregations: Any) -> Any:
        named = named_aggregations("w", (), aggregations or {"n": bf.Count()})
        return window_node("w", None, key, assigner, named, late_output, timedelta(0))

    assert window().chained_schema([schema]) is not None
    assert window(p50=bf.Percentile("v", q=0.5)).chained_schema([schema]) is None
    assert window(bf.TumblingEventTimeWindows.of(timedelta(seconds=1), time_column="g")).chained_schema([schema]) is None
    assert window(key=("v",)).chained_schema([schema]) is None  # a double key: no Spark key group here
    assert window(total=bf.Sum("k")).chained_schema([schema]) is None  # a string summed: Spark's cast
    assert window().chained_schema([pa.schema(list(EVENTS))]) is None  # no arrival positions
    # Epoch 2, W(1) = 10 s: a record of [0 s, 4 s) is late. With a side output it goes there; without, the epoch runs on Spark.
    times = pa.array([(T0 + 2) * 1_000_000, (T0 + 12) * 1_000_000], pa.timestamp("us", tz="UTC"))
    records = pa.table({"k": ["a", "a"], "g": [1, 1], "ts": times, "v": [1.0, 2.0], "_seq": [0, 1]}, schema=schema)
    task = RegionTask(2, 0, 128, {}, (T0 + 10) * 1_000_000, (T0 + 10) * 1_000_000, frozenset())
    with pytest.raises(RegionDeclined, match="late record"):
        window(late_output=None).apply_chained(task, [records])
    assert not task.staged and not task.emitted
