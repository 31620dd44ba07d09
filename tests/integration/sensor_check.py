"""Compare the engine's tables with the plain-Python reference of sensor_stats."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from barrierflow.checkpointing.checkpoint_log import CheckpointLog
from barrierflow.operations.query import run_query
from barrierflow.storage.layout import PipelineLayout
from reference.sensor_stats_reference import ReferenceResult, run_reference, split_epochs

__all__ = [
    "reference_for", "assert_matches_reference", "assert_one_commit_per_table_per_epoch", "assert_nothing_staged_visible",
    "table_snapshot", "last_barrier_params",
]  # fmt: skip


def reference_for(landing: Path, max_files: int, ooo: int = 30) -> ReferenceResult:
    return run_reference(split_epochs(landing, max_files), ooo)


def _rows(warehouse: Path | str, sql: str) -> list[dict[str, Any]]:
    return run_query(str(warehouse), "sensor_stats", sql).to_pylist()


def table_snapshot(warehouse: Path | str) -> dict[str, list[dict[str, Any]]]:
    """Every output table, sorted, for exact comparisons between runs."""
    return {
        "totals": _rows(warehouse, "select sensor_id, count, sum, min, max from sensor_totals order by sensor_id"),
        "minute": _rows(warehouse, "select * from sensor_minute order by sensor_id, window_start"),
        "late": _rows(warehouse, "select * from late_readings order by event_id"),
        "alerts": _rows(warehouse, "select * from alerts order by event_id"),
        "dead": _rows(
            warehouse, "select source_file, line, raw, reason, detail, _epoch from dead_letter order by source_file, line"
        ),
    }


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def assert_matches_reference(warehouse: Path | str, ref: ReferenceResult, late_files: dict[str, int] | None = None) -> None:
    """The tables equal the reference's; ``late_files`` (name -> epoch) were dead-lettered whole as late."""
    snap = table_snapshot(warehouse)
    totals = {r["sensor_id"]: r for r in snap["totals"]}
    assert set(totals) == set(ref.sensor_totals)
    for sensor, expected in ref.sensor_totals.items():
        got = totals[sensor]
        assert got["count"] == expected["count"], sensor
        assert _close(got["sum"], expected["sum"]), sensor
        assert got["min"] == expected["min"] and got["max"] == expected["max"], sensor

    minute = {(r["sensor_id"], r["window_start"]): r for r in snap["minute"]}
    assert len(minute) == len(snap["minute"]), "a window fired twice"
    assert len(minute) == len(ref.sensor_minute)
    for expected in ref.sensor_minute:
        got = minute[(expected["sensor_id"], expected["window_start"])]
        assert got["window_end"] == expected["window_end"]
        assert got["count"] == expected["count"]
        assert _close(got["avg"], expected["avg"])
        assert got["p75"] == expected["p75"] and got["p99"] == expected["p99"]
        assert got["_epoch"] == expected["epoch"]

    late = [(r["event_id"], r["sensor_id"], r["ts"], r["temperature"], r["_epoch"]) for r in snap["late"]]
    assert sorted(late) == sorted(
        (r["event_id"], r["sensor_id"], r["ts"], r["temperature"], r["epoch"]) for r in ref.late_readings
    )
    alerts = [(r["event_id"], r["sensor_id"], r["ts"], r["temperature"], r["_epoch"]) for r in snap["alerts"]]
    assert sorted(alerts) == sorted((r["event_id"], r["sensor_id"], r["ts"], r["temperature"], r["epoch"]) for r in ref.alerts)
    dead = [(r["source_file"], r["line"], r["raw"], r["reason"], r["_epoch"]) for r in snap["dead"]]
    assert sorted(dead, key=repr) == sorted(
        [(r["source_file"], r["line"], r["raw"], REASON_CODES[r["reason"]], r["epoch"]) for r in ref.dead_letter]
        + [(name, None, None, "late_file", epoch) for name, epoch in (late_files or {}).items()],
        key=repr,
    )
    details = _rows(warehouse, "select count(*) as n from dead_letter where detail is null or detail = ''")
    assert details[0]["n"] == 0


# The reference's fine-grained reasons, as the dead-letter table's reason codes.
REASON_CODES = {
    "invalid_utf8": "invalid_utf8",
    "invalid_json": "not_json",
    "not_an_object": "not_an_object",
    **{f"missing_{key}": "null_key" for key in ("event_id", "sensor_id")},
    **{f"empty_{key}": "empty_key" for key in ("event_id", "sensor_id")},
    **{f"invalid_{key}": "wrong_type" for key in ("event_id", "sensor_id")},
    "missing_ts": "missing_field",
    "missing_temperature": "missing_field",
    **dict.fromkeys(
        (
            "invalid_ts_type",
            "unparseable_ts",
            "naive_ts",
            "ts_out_of_range",
            "invalid_temperature_type",
            "temperature_out_of_range",
            "non_finite_temperature",
        ),
        "wrong_type",
    ),  # fmt: skip
}


def _completed(warehouse: Path | str, pipeline: str = "sensor_stats") -> list[Any]:
    layout = PipelineLayout.of(str(warehouse), pipeline)
    return [r for r in CheckpointLog(layout).records() if r.status.value == "COMPLETED"]


def last_barrier_params(warehouse: Path | str) -> dict[str, Any]:
    """The parameters sensor_stats' last completed epoch of its current lineage ran with (its barrier's)."""
    from barrierflow.checkpointing.coordinator import CheckpointCoordinator
    from barrierflow.plan.registry import get_pipeline
    from barrierflow.storage import objects

    coordinator = CheckpointCoordinator(get_pipeline("sensor_stats"), {"landing_dir": "unused"}, str(warehouse))
    lineage = coordinator.current_lineage()["lineage_id"]
    record = coordinator.log.last_completed(coordinator.log.lineage_records(lineage))
    assert record is not None, f"no completed epoch in lineage {lineage}"
    barrier = objects.read_json(coordinator.layout.barrier(lineage, record.epoch))
    assert barrier is not None
    return dict(barrier["params"])


def assert_one_commit_per_table_per_epoch(warehouse: Path | str, epochs: int, pipeline: str = "sensor_stats") -> None:
    completed = _completed(warehouse, pipeline)
    assert sorted(r.epoch for r in completed) == list(range(1, epochs + 1)), "each epoch completed exactly once"
    layout = PipelineLayout.of(str(warehouse), pipeline)
    from barrierflow.operations.query import table_uri

    for name in completed[-1].versions():
        history = DeltaTable(table_uri(layout, name)).history()
        epochs_committed = [h["barrierflow.epoch"] for h in history if "barrierflow.epoch" in h]
        assert sorted(epochs_committed) == list(range(1, epochs + 1)), (name, sorted(epochs_committed))


def assert_nothing_staged_visible(warehouse: Path | str, pipeline: str = "sensor_stats") -> None:
    """Every live file of every table belongs to the winning manifest of its epoch."""
    from barrierflow.checkpointing.checkpoint import Manifest
    from barrierflow.storage import objects

    layout = PipelineLayout.of(str(warehouse), pipeline)
    completed = _completed(warehouse, pipeline)
    winners: dict[str, set[str]] = {}
    for record in completed:
        manifest = Manifest.from_json(objects.read_json(layout.manifest(record.lineage_id, record.epoch)))
        for table in manifest.tables:
            winners.setdefault(table.name, set()).update(f.path for f in table.adds)
    import pyarrow as pa

    from barrierflow.operations.query import table_uri

    for name in completed[-1].versions():
        table = DeltaTable(table_uri(layout, name))
        live = set(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())
        foreign = {p for p in live if p not in winners.get(name, set()) and not p.startswith("_compacted/")}
        assert not foreign, (name, sorted(foreign)[:3])
