"""Maintenance bounds storage: only referenced data files stay, and the checkpoint log is compacted (stub engine)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.operations.maintenance import run_maintenance
from maintenance_check import assert_only_referenced_files, data_files
from stub_engine import LINES, stub_compute

FILES, LINES_PER_FILE = 12, 3


def _write(landing: Path, first: int, count: int) -> None:
    for f in range(first, first + count):
        (landing / f"part-{f:02d}.txt").write_text("".join(f"file {f} line {n}\n" for n in range(LINES_PER_FILE)))


@pytest.fixture
def landing(tmp_path: Path) -> Path:
    path = tmp_path / "landing"
    path.mkdir()
    _write(path, 0, FILES)
    return path


def _coordinator(warehouse: Path, landing: Path) -> CheckpointCoordinator:
    return CheckpointCoordinator(
        LINES,
        {"landing_dir": str(landing), "max_files_per_epoch": 1},
        str(warehouse),
        spark_factory=lambda: None,
        compute=stub_compute,
    )


def _aged(path: Path, hours: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"PAR1 stray")
    old = time.time() - hours * 3600
    os.utime(path, (old, old))
    return path


def test_maintenance_keeps_exactly_the_referenced_files_and_compacts_the_log(tmp_path: Path, landing: Path) -> None:
    warehouse = tmp_path / "wh"
    coordinator = _coordinator(warehouse, landing)
    coordinator.run(until_caught_up=True)
    layout = coordinator.layout
    lineage = coordinator.current_lineage()["lineage_id"]
    records = coordinator.log.records()
    sink = layout.sink_table("lines")
    # A stray file of a completed epoch (a lost attempt's, say), and staged files of an epoch still in flight.
    stray = _aged(Path(sink) / "_staging" / lineage / f"{3:010d}" / "lost-attempt" / "part-0.parquet", hours=2)
    pending = _aged(Path(sink) / "_staging" / lineage / f"{FILES + 1:010d}" / "running" / "part-0.parquet", hours=2)
    log_files = len(DeltaTable(layout.checkpoint_log).file_uris())
    assert log_files >= FILES  # one file per append

    report = run_maintenance(LINES, str(warehouse), retained_checkpoints=2, vacuum_retention_hours=0, params=coordinator.params)

    assert report.retained_epochs == (FILES - 1, FILES)
    assert "_checkpoints" in report.compacted_tables and "dedup__seen" in report.compacted_tables
    assert_only_referenced_files(coordinator, report.retained_epochs, ignore={str(pending.relative_to(sink))})
    assert not stray.exists() and pending.exists()
    # The log: its rows as they were, in one file.
    assert len(DeltaTable(layout.checkpoint_log).file_uris()) == 1
    assert [r for r in coordinator.log.records() if r in records] == records

    # Epochs go on from the maintained tables, exactly once.
    _write(landing, FILES, 2)
    _coordinator(warehouse, landing).run(until_caught_up=True)
    rows = DeltaTable(sink).to_pyarrow_table().to_pylist()
    assert sorted(r["_epoch"] for r in rows) == sorted(e for e in range(1, FILES + 3) for _ in range(LINES_PER_FILE))
    # Once no retained checkpoint reads the state from before the compaction, its staged files go.
    # Maintenance reads no input: it needs none of the source's parameters.
    again = run_maintenance(LINES, str(warehouse), retained_checkpoints=1, vacuum_retention_hours=0)
    assert again.vacuumed_files["dedup__seen"] >= FILES
    assert_only_referenced_files(coordinator, again.retained_epochs, ignore={str(pending.relative_to(sink))})


def test_unreferenced_files_younger_than_the_retention_are_kept(tmp_path: Path, landing: Path) -> None:
    warehouse = tmp_path / "wh"
    coordinator = _coordinator(warehouse, landing)
    coordinator.run(until_caught_up=True)
    state = coordinator.layout.state_table("dedup", "seen")
    staged = data_files(state)
    run_maintenance(LINES, str(warehouse), retained_checkpoints=1, vacuum_retention_hours=0, params=coordinator.params)
    _write(landing, FILES, 1)
    _coordinator(warehouse, landing).run(until_caught_up=True)  # the retained checkpoint now reads the compacted state
    young = run_maintenance(LINES, str(warehouse), retained_checkpoints=1, vacuum_retention_hours=1, params=coordinator.params)
    assert young.vacuumed_files["dedup__seen"] == 0 and staged <= data_files(state)  # written just now: kept


def test_epochs_keep_the_checkpoint_log_to_a_bounded_number_of_files(
    tmp_path: Path, landing: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from barrierflow.checkpointing import coordinator as coordinator_module

    monkeypatch.setattr(coordinator_module, "LOG_COMPACTION_FILES", 8)
    coordinator = _coordinator(tmp_path / "wh", landing)
    coordinator.run(until_caught_up=True)
    live = DeltaTable(coordinator.layout.checkpoint_log).file_uris()
    assert 1 <= len(live) < 8 + 4  # at most one epoch's appends past the threshold (FILES epochs: ~3 x FILES files)
    assert sorted(r.epoch for r in coordinator.log.records() if r.status.value == "COMPLETED") == list(range(1, FILES + 1))
