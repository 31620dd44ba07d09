"""Epochs cut at data intervals, barrier ownership and holds (no Spark: planning touches only storage).

A run of an interval takes the input of the earliest interval that holds any,
up to its own cut-off; runs own the barriers they plan; a reprocessing holds
the schedule. The pipeline is ``sensor_stats`` over files whose arrival
times are pinned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from barrierflow.airflow.dags.lifecycle import barrier_step
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.checkpointing.intervals import (
    ArrivalBound,
    airflow_owner,
    airflow_run_of,
    interval_end_ms,
    previous_interval_end_ms,
)
from barrierflow.core.errors import ConfigurationError, EpochInProgressError
from barrierflow.plan.registry import get_pipeline

MINUTE = 60_000
T0 = 1_700_000_040_000  # a whole minute (22:14:00 UTC)
EVERY_MINUTE = "* * * * *"


def test_an_arrival_belongs_to_the_interval_ending_at_or_after_it() -> None:
    assert interval_end_ms(EVERY_MINUTE, T0) == T0  # at a fire time: the interval ending there, as data_interval_end
    assert interval_end_ms(EVERY_MINUTE, T0 + 1) == T0 + MINUTE
    assert interval_end_ms(EVERY_MINUTE, T0 + MINUTE - 1) == T0 + MINUTE
    assert interval_end_ms("@hourly", T0) == 1_700_002_800_000
    assert previous_interval_end_ms(EVERY_MINUTE, T0) == T0
    assert previous_interval_end_ms(EVERY_MINUTE, T0 + MINUTE - 1) == T0
    with pytest.raises(ConfigurationError, match="'every minute' is not a cron expression"):
        interval_end_ms("every minute", T0)


def test_an_epoch_is_cut_at_its_interval_and_never_after_the_runs_cut_off() -> None:
    bound = ArrivalBound(cutoff_ms=T0 + 3 * MINUTE, schedule=EVERY_MINUTE)
    assert bound.epoch_cutoff_ms(T0 + 10) == T0 + MINUTE
    assert bound.epoch_cutoff_ms(T0 + 3 * MINUTE) == T0 + 3 * MINUTE
    assert ArrivalBound(cutoff_ms=T0 + 30_000, schedule=EVERY_MINUTE).epoch_cutoff_ms(T0 + 10) == T0 + 30_000
    assert ArrivalBound(cutoff_ms=T0).epoch_cutoff_ms(T0 - 5 * MINUTE) == T0  # no schedule: no cutting


def test_airflow_owners_name_their_dag_and_run() -> None:
    owner = airflow_owner("barrierflow_sensor_stats", "scheduled__2026-11-24T12:10:00+00:00")
    assert airflow_run_of(owner) == ("barrierflow_sensor_stats", "scheduled__2026-11-24T12:10:00+00:00")
    assert airflow_run_of("barrierflow run") is None
    assert airflow_run_of("barrierflow reprocess (pid 7 on h:1)") is None


def test_the_earliest_waiting_arrival_follows_the_stream_position(make_source: Any, write_file: Any) -> None:
    write_file("a.jsonl", ["1"], mtime_ms=T0 + 5)
    write_file("b.jsonl", ["1"], mtime_ms=T0 + MINUTE + 5)
    write_file(".c.jsonl", ["1"], mtime_ms=T0 - MINUTE)  # still being written: not input
    source = make_source()
    assert source.earliest_arrival_ms(None, None) == T0 + 5
    assert source.earliest_arrival_ms({"file": "a.jsonl", "line": None, "consumed": 1}, None) == T0 + MINUTE + 5
    assert source.earliest_arrival_ms({"file": "a.jsonl", "line": 0, "consumed": 1}, None) == T0 + 5  # a.jsonl partly consumed
    assert source.earliest_arrival_ms({"file": "a.jsonl", "line": None, "consumed": 1}, T0 + MINUTE) is None  # b arrived later


def _coordinator(landing: Path, warehouse: Path, **params: Any) -> CheckpointCoordinator:
    return CheckpointCoordinator(get_pipeline("sensor_stats"), {"landing_dir": str(landing), **params}, str(warehouse))


def _files(end: dict[str, Any]) -> list[str]:
    return [f[0] for f in end["readings"]["files"]]


def test_waiting_input_of_several_intervals_becomes_one_epoch_per_interval(
    tmp_path: Path, write_file: Callable[..., Path], landing: Path
) -> None:
    # Three files in the first minute, none in the second, two in the third and one after the run's cut-off.
    for name, at in [
        ("r1", 1),
        ("r2", 20_000),
        ("r3", MINUTE),
        ("r4", 2 * MINUTE + 1),
        ("r5", 3 * MINUTE),
        ("r6", 3 * MINUTE + 1),
    ]:
        write_file(f"{name}.jsonl", ["{}"], mtime_ms=T0 + at)
    coordinator = _coordinator(landing, tmp_path / "wh", max_files_per_epoch=2)
    bound = ArrivalBound(cutoff_ms=T0 + 3 * MINUTE, schedule=EVERY_MINUTE)
    epochs = [(cutoff, _files(end)) for cutoff, end in coordinator.preview_epochs({}, bound)]
    assert epochs == [
        (T0 + MINUTE, ["r1.jsonl", "r2.jsonl"]),  # max_files_per_epoch splits an interval...
        (T0 + MINUTE, ["r3.jsonl"]),  # ...into epochs with the same cut-off
        (T0 + 3 * MINUTE, ["r4.jsonl", "r5.jsonl"]),  # the empty interval makes no epoch
    ]
    # Without a schedule the run's cut-off alone bounds the epochs, as the CLI's.
    flat = [_files(end) for _, end in coordinator.preview_epochs({}, ArrivalBound(cutoff_ms=T0 + 3 * MINUTE))]
    assert flat == [["r1.jsonl", "r2.jsonl"], ["r3.jsonl", "r4.jsonl"], ["r5.jsonl"]]


def _barrier(coordinator: CheckpointCoordinator, owner: str, active: set[str] = frozenset()) -> Any:  # type: ignore[assignment]
    bound = ArrivalBound(cutoff_ms=T0 + 2 * MINUTE, schedule=EVERY_MINUTE, owner=owner)
    return barrier_step(coordinator, bound, lease_wait_s=5, owner_active=lambda o: o in active)


def test_a_barrier_belongs_to_the_run_that_planned_it(tmp_path: Path, write_file: Any, landing: Path) -> None:
    write_file("r1.jsonl", ["{}"], mtime_ms=T0 + 1)
    write_file("r2.jsonl", ["{}"], mtime_ms=T0 + MINUTE + 1)
    coordinator = _coordinator(landing, tmp_path / "wh")
    a, b = airflow_owner("d", "run-a"), airflow_owner("d", "run-b")
    planned = _barrier(coordinator, a)
    assert planned.proceed and "planned a new barrier" in planned.message
    assert "epoch's arrival cut-off 2023-11-14T22:15:00+00:00" in planned.message  # the first interval only
    barrier = coordinator.recover().pending_barrier
    assert barrier is not None and barrier.planned_by == a and barrier.arrival_cutoff_ms == T0 + MINUTE
    # Its own retry replays it.
    assert "replaying the barrier this run recorded" in _barrier(coordinator, a).message
    # Another run leaves it alone while its owner is active...
    left = _barrier(coordinator, b, active={a})
    assert not left.proceed and f"planned by run {a}" in left.message and "still running" in left.message
    assert coordinator.recover().pending_barrier == barrier
    # ...and finishes it as recorded, saying so, once its owner has ended.
    taken = _barrier(coordinator, b)
    assert taken.proceed and f"finishing the barrier that run {a} recorded" in taken.message
    assert taken.details["arrival_cutoff"] == "2023-11-14T22:15:00+00:00" and taken.details["planned_by"] == a


def test_a_hold_stops_other_runs_until_it_is_released_or_its_run_ends(tmp_path: Path, write_file: Any, landing: Path) -> None:
    write_file("r1.jsonl", ["{}"], mtime_ms=T0 + 1)
    coordinator = _coordinator(landing, tmp_path / "wh")
    holder = airflow_owner("d_reprocess", "manual-1")
    assert coordinator.hold(holder, "reprocessing")["owner"] == holder
    assert coordinator.hold(airflow_owner("d", "x"), "another")["owner"] == holder  # one hold at a time
    held = _barrier(coordinator, airflow_owner("d", "run-a"), active={holder})
    assert not held.proceed and f"held by {holder}" in held.message
    assert coordinator.recover().pending_barrier is None  # nothing planned
    with pytest.raises(EpochInProgressError, match="held by"):
        coordinator.run(epochs=1)  # barrierflow run refuses too
    # The holder's run ended without releasing it (a killed worker): the hold is stale.
    freed = _barrier(coordinator, airflow_owner("d", "run-a"))
    assert freed.proceed and coordinator.held_by() is None
    # A command's hold is never judged stale by a DAG run: only that command releases it.
    command = "barrierflow reprocess (pid 1 on h)"
    coordinator.hold(command, "reprocessing")
    assert not _barrier(coordinator, airflow_owner("d", "run-b")).proceed
    assert coordinator.release_hold(command) and coordinator.held_by() is None
