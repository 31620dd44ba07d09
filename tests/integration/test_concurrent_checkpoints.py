"""Two concurrent checkpoints: epoch n+1 reads while epoch n commits, with the output of one at a time.

The coordinator injects barrier n+1 once epoch n starts its state-dependent
work; epoch n+1 touches state and votes only after epoch n completed. These
tests check, on real Spark and S3, that the overlap happens and that it
changes nothing in the tables. That a failure on either side of the overlap
leaves nothing committed that a re-run would not produce exactly once is
protocol logic, checked at each such point in milliseconds by
``tests/unit/test_protocol.py`` (a stub engine, the real coordinator).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from barrierflow.checkpointing.checkpoint import EpochStatus
from barrierflow.checkpointing.checkpoint_log import CheckpointLog
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.core.errors import CheckpointError
from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
from barrierflow.plan.registry import get_pipeline
from barrierflow.storage.layout import PipelineLayout
from sensor_check import (
    assert_matches_reference,
    assert_nothing_staged_visible,
    assert_one_commit_per_table_per_epoch,
    reference_for,
    table_snapshot,
)


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("concurrent") / "landing"
    spec = SensorStreamSpec(n_files=6, records_per_file=120, seed=17, late_rate=0.05, duplicate_rate=0.1)
    write_sensor_files(path, spec)
    return path


@pytest.fixture
def coordinator(spark: Any, landing: Path) -> Callable[[str], CheckpointCoordinator]:
    def make(warehouse: str) -> CheckpointCoordinator:
        given = {"landing_dir": str(landing), "max_files_per_epoch": 2}
        return CheckpointCoordinator(get_pipeline("sensor_stats"), given, str(warehouse), spark_factory=lambda: spark)

    return make


def _layout(warehouse: str) -> PipelineLayout:
    return PipelineLayout.of(warehouse, "sensor_stats")


def _records(warehouse: str) -> list[Any]:
    return CheckpointLog(_layout(warehouse)).records()


def _recorded_at(warehouse: str, epoch: int, status: EpochStatus) -> int:
    """When ``epoch`` reached ``status``: PLANNED right after its barrier was written, PRE_COMMITTED after its manifest."""
    return next(r.recorded_at_us for r in _records(warehouse) if r.epoch == epoch and r.status is status)


def test_concurrent_checkpoints_overlap_and_change_nothing(
    coordinator: Callable[[str], CheckpointCoordinator], landing: Path, warehouse: str
) -> None:
    concurrent, one_at_a_time = f"{warehouse}/concurrent", f"{warehouse}/one"
    assert [r.epoch for r in coordinator(concurrent).run(until_caught_up=True)] == [1, 2, 3]
    assert [r.epoch for r in coordinator(one_at_a_time).run(until_caught_up=True, max_concurrent_checkpoints=1)] == [1, 2, 3]
    for epoch in (2, 3):
        # Barrier n+1 is written before epoch n votes (epoch n+1 reads while epoch n
        # stages, votes and commits), and only then when one checkpoint runs at a time.
        planned, voted = EpochStatus.PLANNED, EpochStatus.PRE_COMMITTED
        assert _recorded_at(concurrent, epoch, planned) < _recorded_at(concurrent, epoch - 1, voted)
        assert _recorded_at(one_at_a_time, epoch, planned) > _recorded_at(one_at_a_time, epoch - 1, EpochStatus.COMPLETED)
        # Epoch n+1's vote waits for epoch n to complete.
        assert _recorded_at(concurrent, epoch, voted) > _recorded_at(concurrent, epoch - 1, EpochStatus.COMPLETED)
    assert table_snapshot(concurrent) == table_snapshot(one_at_a_time)
    assert_matches_reference(concurrent, reference_for(landing, 2))
    assert_one_commit_per_table_per_epoch(concurrent, 3)
    assert_nothing_staged_visible(concurrent)


def test_epochs_limit_injects_no_barrier_beyond_it(coordinator: Callable[[str], CheckpointCoordinator], warehouse: str) -> None:
    assert [r.epoch for r in coordinator(warehouse).run(epochs=2)] == [1, 2]
    assert {r.epoch for r in _records(warehouse)} == {1, 2}  # no barrier 3 left pending


def test_only_one_or_two_concurrent_checkpoints(coordinator: Callable[[str], CheckpointCoordinator], tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="allowed are 1 and 2"):
        coordinator(str(tmp_path / "wh")).run(epochs=1, max_concurrent_checkpoints=3)
