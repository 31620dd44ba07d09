"""Savepoints, restores and maintenance on real Spark and Delta, against the reference."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import pytest

from barrierflow import Count, Max, Min, Sum
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.connectors import DeltaSink, FileSource
from barrierflow.core.errors import IncompatibleSavepointError, SavepointError
from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
from barrierflow.demo.pipelines.sensor_stats import READING_SCHEMA, parse_reading, sensor_stats
from barrierflow.operations.maintenance import run_maintenance
from barrierflow.operations.query import run_query
from barrierflow.operations.restore import restore
from barrierflow.operations.savepoint import create_savepoint, dispose_savepoint, list_savepoints
from barrierflow.plan.pipeline import PipelineBuilder, PipelineDefinition
from barrierflow.plan.registry import get_pipeline
from barrierflow.storage import objects
from reference.sensor_stats_reference import run_reference, split_epochs
from sensor_check import assert_matches_reference, last_barrier_params, reference_for, table_snapshot

MAX_FILES = 2


@pytest.fixture
def landing(tmp_path: Path) -> Path:
    path = tmp_path / "landing"
    write_sensor_files(path, SensorStreamSpec(n_files=8, records_per_file=100, seed=21, late_rate=0.05, duplicate_rate=0.1))
    return path


@pytest.fixture
def run_epochs(spark: Any, landing: Path) -> Callable[..., list[int]]:
    def run(warehouse: Path, epochs: int | None = None, definition: PipelineDefinition | None = None, **params: Any) -> list[int]:
        given = {"landing_dir": str(landing), "max_files_per_epoch": MAX_FILES, **params}
        coordinator = CheckpointCoordinator(
            definition or get_pipeline("sensor_stats"), given, str(warehouse), spark_factory=lambda: spark
        )
        results = coordinator.run(epochs=epochs, until_caught_up=epochs is None)
        return [r.epoch for r in results]

    return run


def _params(landing: Path) -> dict[str, Any]:
    return {"landing_dir": str(landing), "max_files_per_epoch": MAX_FILES}


def test_savepoint_then_restore_with_rewind_equals_reference(
    run_epochs: Callable[..., list[int]], landing: Path, warehouse: str
) -> None:
    assert run_epochs(warehouse, epochs=2) == [1, 2]
    # The source's offsets are its operator state: after epoch 2, barrier 2's end offsets.
    coordinator = CheckpointCoordinator(sensor_stats, _params(landing), str(warehouse))
    barrier = objects.read_json(coordinator.layout.barrier(coordinator.current_lineage()["lineage_id"], 2))
    assert barrier is not None
    offsets = run_query(str(warehouse), "sensor_stats", "select value from readings__offsets").column("value").to_pylist()
    assert [json.loads(v) for v in offsets] == [barrier["end_offsets"]["readings"]]
    sp = create_savepoint(sensor_stats, str(warehouse), name="before-3", description="after epoch 2", params=_params(landing))
    assert (sp.epoch, sp.name, sp.stopped) == (2, "before-3", False)
    states = {s.name: s.rows for s in sp.states}
    assert set(states) == {
        "readings/offsets",
        "dedup/seen",
        "totals/accumulators",
        "minute_windows/pending_windows",
        "rising_alerts/last_two",
    }
    assert states["readings/offsets"] == 1 and states["dedup/seen"] > 0 and states["totals/accumulators"] > 0
    assert [m.name for m in list_savepoints("sensor_stats", str(warehouse))] == ["before-3"]
    assert run_epochs(warehouse, epochs=2) == [3, 4]
    # The restore takes its offsets from that state: the metadata's copy of them is deleted first.
    metadata = objects.join_uri(sp.uri, "_savepoint.json")
    doc = objects.read_json(metadata)
    assert doc is not None and doc["offsets"] == barrier["end_offsets"]
    objects.remove_document(metadata)
    assert objects.write_json_if_absent(metadata, {**doc, "offsets": {}})
    result = restore(sensor_stats, str(warehouse), savepoint="before-3", rewind_sinks=True, params=_params(landing))
    assert result.epoch == 2 and result.rewound_sinks["sensor_minute"] > 0
    assert coordinator.current_lineage()["start_offsets"] == barrier["end_offsets"]
    # The replay of epochs 3.. equals a history that never ran past epoch 2.
    assert run_epochs(warehouse) == [3, 4]
    assert_matches_reference(warehouse, reference_for(landing, MAX_FILES))
    # The savepoint is untouched by the restore and can be disposed of afterwards.
    dispose_savepoint("sensor_stats", str(warehouse), "before-3")
    assert list_savepoints("sensor_stats", str(warehouse)) == []


def test_restore_without_rewind_keeps_later_rows(run_epochs: Callable[..., list[int]], landing: Path, warehouse: str) -> None:
    run_epochs(warehouse, epochs=3)
    create_savepoint(sensor_stats, str(warehouse), name="sp", params=_params(landing))
    run_epochs(warehouse, epochs=1)
    before = table_snapshot(warehouse)["minute"]
    restore(sensor_stats, str(warehouse), savepoint="sp", params=_params(landing))
    assert table_snapshot(warehouse)["minute"] == before  # sinks untouched without rewind_sinks
    run_epochs(warehouse, epochs=1)
    epoch4 = [r for r in table_snapshot(warehouse)["minute"] if r["_epoch"] == 4]
    assert len(epoch4) == 2 * len([r for r in before if r["_epoch"] == 4])  # replayed: at-least-once by request


def test_restore_with_changed_parallelism_gives_identical_results(
    run_epochs: Callable[..., list[int]], landing: Path, warehouse: str
) -> None:
    run_epochs(warehouse, epochs=2, parallelism=2)
    create_savepoint(sensor_stats, str(warehouse), name="p2", params=_params(landing))
    run_epochs(warehouse, parallelism=2)
    straight = table_snapshot(warehouse)
    result = restore(sensor_stats, str(warehouse), savepoint="p2", rewind_sinks=True, parallelism=5, params=_params(landing))
    assert result.params == {"parallelism": 5}
    assert run_epochs(warehouse) == [3, 4]
    assert last_barrier_params(warehouse)["parallelism"] == 5
    assert table_snapshot(warehouse) == straight  # bit-identical replay at another parallelism


def _without_alerts() -> PipelineDefinition:
    """sensor_stats as it would be after someone deleted the rising_alerts operator."""

    def build(p: PipelineBuilder, params: dict[str, Any]) -> None:
        readings = p.source(
            FileSource(
                "readings",
                params["landing_dir"],
                format="jsonl",
                parser=parse_reading,
                parser_schema=READING_SCHEMA,
                max_files_per_epoch=params["max_files_per_epoch"],
                suffixes=(".jsonl",),
            )
        )
        valid = readings.deduplicate("dedup", key="event_id").with_watermark(
            "ts", timedelta(seconds=params["out_of_orderness_seconds"])
        )
        valid.key_by("sensor_id").aggregate(
            "totals", Count(), Sum("temperature", "sum"), Min("temperature", "min"), Max("temperature", "max")
        ).sink_to(DeltaSink.upsert("sensor_totals", key="sensor_id"))

    return dataclasses.replace(sensor_stats, build_fn=build)


def test_restore_refuses_removed_operator_unless_allowed(
    run_epochs: Callable[..., list[int]], landing: Path, warehouse: str
) -> None:
    run_epochs(warehouse, epochs=2)
    create_savepoint(sensor_stats, str(warehouse), name="full", params=_params(landing))
    smaller = _without_alerts()
    with pytest.raises(IncompatibleSavepointError) as info:
        restore(smaller, str(warehouse), savepoint="full", params=_params(landing))
    assert "rising_alerts/last_two" in info.value.dropped
    assert "minute_windows/pending_windows" in info.value.dropped
    assert "allow_non_restored_state" in str(info.value)
    result = restore(
        smaller, str(warehouse), savepoint="full", allow_non_restored_state=True, rewind_sinks=True, params=_params(landing)
    )
    assert "rising_alerts/last_two" in result.dropped_states and "totals/accumulators" in result.restored_states
    assert run_epochs(warehouse, definition=smaller) == [3, 4]
    totals = run_query(str(warehouse), "sensor_stats", "select sensor_id, count from sensor_totals").to_pylist()
    expected = reference_for(landing, MAX_FILES).sensor_totals
    assert {r["sensor_id"]: r["count"] for r in totals} == {k: v["count"] for k, v in expected.items()}


def test_savepoint_copied_to_another_warehouse(run_epochs: Callable[..., list[int]], landing: Path, store_root: str) -> None:
    source, target = f"{store_root}/source", f"{store_root}/target"
    run_epochs(source, epochs=2)
    sp = create_savepoint(sensor_stats, source, name="portable", params=_params(landing))
    copied = f"{store_root}/copied-savepoint"
    for stored in objects.walk(sp.uri):  # as `cp -r` or `aws s3 cp --recursive` would
        data = objects.read_bytes(objects.join_uri(sp.uri, stored.path))
        assert data is not None and objects.put_if_absent(objects.join_uri(copied, stored.path), data)
    objects.remove_tree(source)  # nothing of the source warehouse is needed any more
    restore(sensor_stats, target, savepoint=copied, params=_params(landing))
    assert run_epochs(target) == [3, 4]
    ref = run_reference(split_epochs(landing, MAX_FILES), 30)
    snap = table_snapshot(target)
    assert {r["sensor_id"]: r["count"] for r in snap["totals"]} == {k: v["count"] for k, v in ref.sensor_totals.items()}
    assert sorted((r["sensor_id"], r["window_start"]) for r in snap["minute"]) == sorted(
        (r["sensor_id"], r["window_start"]) for r in ref.sensor_minute if r["epoch"] > 2
    )


def test_restore_retained_epoch_and_maintenance(run_epochs: Callable[..., list[int]], landing: Path, warehouse: str) -> None:
    run_epochs(warehouse)
    report = run_maintenance(
        sensor_stats, str(warehouse), retained_checkpoints=2, vacuum_retention_hours=0, params=_params(landing)
    )
    assert report.retained_epochs == (3, 4)
    assert len(report.expired_epochs) == 2
    with pytest.raises(SavepointError, match="retained: 3-4"):
        restore(sensor_stats, str(warehouse), epoch=1, params=_params(landing))
    # Vacuum kept every file the retained checkpoints read: querying as of epoch 3 still works.
    as_of_3 = run_query(str(warehouse), "sensor_stats", "select count(*) as n from sensor_minute", as_of_epoch=3).to_pylist()
    restore(sensor_stats, str(warehouse), epoch=3, rewind_sinks=True, params=_params(landing))
    assert run_query(str(warehouse), "sensor_stats", "select count(*) as n from sensor_minute").to_pylist() == as_of_3
    assert run_epochs(warehouse) == [4]
    assert_matches_reference(warehouse, reference_for(landing, MAX_FILES))


def test_restore_killed_half_way_is_finished_by_the_next_run(
    run_epochs: Callable[..., list[int]], landing: Path, warehouse: str
) -> None:
    import subprocess

    from cli_runner import barrierflow_cmd, cli_env

    run_epochs(warehouse, epochs=2)
    create_savepoint(sensor_stats, str(warehouse), name="sp", params=_params(landing))
    run_epochs(warehouse, epochs=1)
    restore_cmd = barrierflow_cmd(
        "savepoint", "restore", "sensor_stats", "--warehouse", warehouse, "--savepoint", "sp", "--rewind-sinks"
    )
    # Killed after the intent; then a second restore finishes the first (its recover sees the
    # intent) and is itself killed just before switching lineages.
    for point in ("restore.after_intent", "restore.before_lineage"):
        killed = subprocess.run(restore_cmd, env=cli_env(f"{point}:1:kill"), capture_output=True, text=True, timeout=300)
        assert killed.returncode == -9, killed.stderr[-2000:]
    # The next run finishes the restore from its intent before anything reads state.
    assert run_epochs(warehouse) == [3, 4]
    assert_matches_reference(warehouse, reference_for(landing, MAX_FILES))
