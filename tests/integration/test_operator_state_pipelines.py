"""Operator (non-keyed) list state on real Spark and Delta, against a plain-Python reference.

The README's "Operator state" function (a batch of every three events a
subtask gets, with the largest amount seen, kept in an even-split and a
union list state) runs at parallelism 2 through a savepoint after epoch 1
and an injected failure between two table commits of epoch 2, then
rescales to 3 (epoch 3 runs at 2 or 3: at its barrier's parallelism, which
the failed run may have planned already; epoch 4 at 3); a restore of the
savepoint at parallelism 1 replays epochs 2-4. Every emitted row and both state tables must be the reference's:
records dealt round-robin in arrival order, lists redistributed as the
module's rule 5 says.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import barrierflow as bf
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.operations.query import run_query
from barrierflow.operations.restore import restore
from barrierflow.operations.savepoint import create_savepoint
from barrierflow.storage import objects
from epoch_runs import epoch_runner, fail_after_first_commit
from readme_example import readme_module

# Per epoch (one file each): events (event_id, amount), in arrival order.
EPOCHS: list[list[tuple[str, float]]] = [
    [("e1", 5.0), ("e2", 1.0), ("e3", 7.0), ("e4", 2.0), ("e5", 3.0), ("e6", 9.0), ("e7", 4.0)],
    [("e8", 6.0), ("e9", 11.0), ("e10", 1.0), ("e11", 2.0), ("e12", 8.0)],
    [("e13", 3.0), ("e14", 2.0), ("e15", 20.0), ("e16", 1.0)],
    [("e17", 1.0), ("e18", 2.0), ("e19", 3.0), ("e20", 4.0), ("e21", 5.0), ("e22", 6.0), ("e23", 0.5)],
]

Lists = list[list[Any]]


def _rescale(lists: Lists, parallelism: int, union: bool) -> Lists:
    """Written apart from the module: concatenate, then deal sizes N//P (+1 for the first N%P), or copy."""
    flat = sum(lists, [])
    if union:
        return [flat[:] for _ in range(parallelism)]
    sizes = [len(flat) // parallelism + (i < len(flat) % parallelism) for i in range(parallelism)]
    bounds = [sum(sizes[:i]) for i in range(parallelism + 1)]
    return [flat[bounds[i] : bounds[i + 1]] for i in range(parallelism)]


def _reference(parallelisms: list[int]) -> tuple[list[tuple[Any, ...]], Lists, Lists]:
    """Rows (batch, subtask, largest, epoch) and the pending and largest lists after the last epoch."""
    pending: Lists = [[] for _ in range(parallelisms[0])]
    largest: Lists = [[] for _ in range(parallelisms[0])]
    rows = []
    for epoch, (events, parallelism) in enumerate(zip(EPOCHS, parallelisms), 1):
        if parallelism != len(pending):
            pending, largest = _rescale(pending, parallelism, False), _rescale(largest, parallelism, True)
        for k, (event_id, amount) in enumerate(events):
            s = k % parallelism
            pending[s].append(event_id)
            largest[s] = [max([amount, *largest[s]])]
            if len(pending[s]) == 3:
                rows.append((",".join(pending[s]), s, largest[s][0], epoch))
                pending[s] = []
    return rows, pending, largest


def _table(lists: Lists) -> list[tuple[Any, ...]]:
    return [(s, p, v, len(lists)) for s, values in enumerate(lists) for p, v in enumerate(values)]


def test_operator_list_state_is_exactly_once_through_a_failure_a_rescale_and_a_restore(
    spark: Any, tmp_path: Path, warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    readme = readme_module(tmp_path / "user_code", "### Operator state", "readme_batches")

    # The README's pipeline, with a parallelism to change and one file per epoch.
    @bf.pipeline("batches", params=[bf.Param("landing_dir", str), bf.Param("parallelism", int, 2)])
    def batches(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
        events = p.source(bf.FileSource("events", params["landing_dir"], schema=readme.EVENTS, max_files_per_epoch=1))
        events.process("batcher", readme.Batcher()).sink_to(bf.DeltaSink.append("batches"))

    landing = tmp_path / "landing"
    landing.mkdir()
    for i, events in enumerate(EPOCHS):
        (landing / f"part-{i:03d}.jsonl").write_text("".join(json.dumps({"event_id": e, "amount": a}) + "\n" for e, a in events))
    params = {"landing_dir": str(landing)}
    run = epoch_runner(batches, params, warehouse, spark)

    def query(sql: str) -> list[tuple[Any, ...]]:
        return sorted(tuple(r.values()) for r in run_query(warehouse, "batches", sql).to_pylist())

    def parallelisms() -> dict[int, int]:
        """The parallelism each epoch of the current lineage ran at: its barrier's (a retry or roll-forward keeps it)."""
        coordinator = CheckpointCoordinator(batches, params, warehouse)
        lineage = coordinator.current_lineage()["lineage_id"]
        barriers = {epoch: objects.read_json(coordinator.layout.barrier(lineage, epoch)) for epoch in range(1, len(EPOCHS) + 1)}
        return {epoch: barrier["params"]["parallelism"] for epoch, barrier in barriers.items() if barrier}

    def check(expected: list[int]) -> None:
        assert parallelisms() == {e: p for e, p in enumerate(expected, 1) if e in parallelisms()}
        rows, pending, largest = _reference(expected)
        assert query("select batch, subtask, largest, _epoch from batches") == sorted(rows)
        assert query("select subtask, position, value, parallelism from batcher__pending") == _table(pending)
        assert query("select subtask, position, value, parallelism from batcher__largest") == _table(largest)

    assert run(2, 1) == [1]
    create_savepoint(batches, warehouse, name="after-1", params=params)
    fail_after_first_commit(run, 2, monkeypatch, tmp_path)  # epoch 2, rolled forward at parallelism 2
    assert run(3)[-1] == 4
    ran = [parallelisms()[epoch] for epoch in range(1, len(EPOCHS) + 1)]
    assert ran[:2] == [2, 2] and ran[3] == 3
    check(ran)

    restore(batches, warehouse, savepoint="after-1", rewind_sinks=True, parallelism=1, params=params)
    assert run(1) == [2, 3, 4]
    check([2, 1, 1, 1])
