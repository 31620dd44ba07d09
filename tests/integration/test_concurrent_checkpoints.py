"""Two concurrent checkpoints: epoch n+1 reads while epoch n commits, with the output of one at a time.

The coordinator injects barrier n+1 once epoch n starts its state-dependent
work; epoch n+1 touches state and votes only after epoch n completed. These
tests check that the overlap happens, that it changes nothing in the tables,
and that a failure on either side leaves nothing committed that a re-run
would not produce exactly once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from barrierflow import faults, storage
from barrierflow.checkpoint import EpochStatus
from barrierflow.checkpoint_log import CheckpointLog
from barrierflow.coordinator import CheckpointCoordinator
from barrierflow.datagen import SensorStreamSpec, write_sensor_files
from barrierflow.errors import CheckpointError, InjectedFault
from barrierflow.layout import PipelineLayout
from barrierflow.registry import get_pipeline
from sensor_check import (
    assert_matches_reference,
    assert_nothing_staged_visible,
    assert_one_commit_per_table_per_epoch,
    reference_for,
    table_snapshot,
)

pytestmark = pytest.mark.stores("s3")


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


@pytest.fixture
def inject_fault(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Arm ``BARRIERFLOW_FAULT`` in raise mode for this test, counting crossings from zero."""

    def arm(spec: str) -> None:
        faults._crossings.clear()
        monkeypatch.setenv(faults.ENV_VAR, spec)

    yield arm  # type: ignore[misc]
    faults._crossings.clear()


def _layout(warehouse: str) -> PipelineLayout:
    return PipelineLayout.of(warehouse, "sensor_stats")


def _records(warehouse: str) -> list[Any]:
    return CheckpointLog(_layout(warehouse)).records()


def _lineage(warehouse: str) -> str:
    return str(_records(warehouse)[0].lineage_id)


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


@pytest.mark.parametrize(
    ("fault", "completed"),
    [
        # Epoch 1 fails between its Delta commits and its completed record; epoch 2 has read its input.
        ("commit.before_completed:1:raise", 0),
        # Epoch 1's post-commit work fails after it completed; epoch 2 must not vote on an unfinished epoch 1.
        ("notify.start:1:raise", 1),
        # Epoch 2 fails while reading, beside epoch 1's commit: epoch 1 still completes.
        ("process.after_read:2:raise", 1),
        # Barrier 2 cannot be injected while epoch 1 runs: epoch 1 still completes.
        ("barrier.after_write:2:raise", 1),
    ],
    ids=["epoch-1-commit", "epoch-1-notify", "epoch-2-read", "barrier-2"],
)
def test_a_failure_on_either_side_leaves_a_state_a_rerun_finishes_exactly_once(
    coordinator: Callable[[str], CheckpointCoordinator],
    inject_fault: Callable[[str], None],
    monkeypatch: pytest.MonkeyPatch,
    landing: Path,
    warehouse: str,
    fault: str,
    completed: int,
) -> None:
    inject_fault(fault)
    with pytest.raises(InjectedFault):
        coordinator(warehouse).run(until_caught_up=True)
    records = _records(warehouse)
    assert {r.epoch for r in records if r.status is EpochStatus.COMPLETED} == set(range(1, completed + 1))
    # Epoch 2's barrier was injected before the failure; it never voted.
    assert any(r.epoch == 2 and r.status is EpochStatus.PLANNED for r in records)
    assert storage.read_json(_layout(warehouse).manifest(_lineage(warehouse), 2)) is None
    # (An attempt stopped before its vote may record ABORTED.)
    assert not any(r.epoch == 2 and r.status in (EpochStatus.PRE_COMMITTED, EpochStatus.COMPLETED) for r in records)

    monkeypatch.delenv(faults.ENV_VAR)
    resumed = coordinator(warehouse).run(until_caught_up=True)
    assert [r.epoch for r in resumed] == [2, 3]  # epoch 1, if not completed, is rolled forward by recovery
    assert_matches_reference(warehouse, reference_for(landing, 2))
    assert_one_commit_per_table_per_epoch(warehouse, 3)
    assert_nothing_staged_visible(warehouse)
