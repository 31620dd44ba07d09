"""What the operator tests share: running a pipeline's epochs at a parallelism, and a run that fails between two commits."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import pytest

from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.core.errors import InjectedFault
from barrierflow.plan.pipeline import PipelineDefinition

__all__ = ["epoch_runner", "fail_after_first_commit"]

Runner = Callable[..., list[int]]


def epoch_runner(definition: PipelineDefinition, params: Mapping[str, Any], warehouse: str, spark: Any) -> Runner:
    """``run(parallelism, count=None)``: the epochs run at ``parallelism``, ``count`` of them or until caught up."""

    def run(parallelism: int, count: int | None = None) -> list[int]:
        given = {**params, "parallelism": parallelism}
        coordinator = CheckpointCoordinator(definition, given, warehouse, spark_factory=lambda: spark)
        return [r.epoch for r in coordinator.run(epochs=count, until_caught_up=count is None)]

    return run


def fail_after_first_commit(run: Runner, parallelism: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A run that fails right after the first Delta table commit of its epoch (the next run rolls that epoch forward)."""
    monkeypatch.setenv("BARRIERFLOW_FAULT", "commit.after_delta_commit:1:raise")
    monkeypatch.setenv("BARRIERFLOW_FAULT_STATE", str(tmp_path / "faults"))
    with pytest.raises(InjectedFault):
        run(parallelism)
    monkeypatch.delenv("BARRIERFLOW_FAULT")
