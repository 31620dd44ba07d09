"""The checkpoint protocol with a stub engine: milliseconds per case, every guarantee checked.

The coordinator, barriers, the vote, the Delta commits, the checkpoint log,
recovery and fencing are the real ones; only step 3's computation is the
stub of ``stub_engine`` (no Spark). Faults are raised, not SIGKILLed, so a
case is a function call; ``tests/integration/test_crash_resume.py`` keeps a
few real ``kill -9`` cases. Crash points inside an epoch's commits are
computed from the number of tables an epoch commits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable, write_deltalake

from barrierflow.checkpointing.checkpoint import EpochStatus, Manifest
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.checkpointing.epoch import completed_future, process_epoch
from barrierflow.core import faults
from barrierflow.core.errors import BlockedInputError, CheckpointError, FencedError, InjectedFault
from barrierflow.operations.restore import restore
from barrierflow.operators.operator_state import offsets_rows
from barrierflow.storage import objects
from barrierflow.storage.commits import Fence
from barrierflow.storage.delta import commit_epoch_table
from stub_engine import LINES, epoch_tables, stub_compute

FILES, LINES_PER_FILE = 4, 5
TABLES = epoch_tables(LINES, {"landing_dir": "/unused"})  # lines, dead_letter, dedup__seen


@pytest.fixture
def landing(tmp_path: Path) -> Path:
    path = tmp_path / "landing"
    path.mkdir()
    for f in range(FILES):
        (path / f"part-{f:02d}.txt").write_text("".join(f"file {f} line {n}\n" for n in range(LINES_PER_FILE)))
    return path


def _coordinator(warehouse: Path, landing: Path, **params: Any) -> CheckpointCoordinator:
    return CheckpointCoordinator(
        LINES,
        {"landing_dir": str(landing), "max_files_per_epoch": 1, **params},
        str(warehouse),
        spark_factory=lambda: None,
        compute=stub_compute,
    )


@pytest.fixture
def fault(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Arm ``point:crossing`` in raise mode (crossings counted from zero)."""

    def arm(spec: str | None) -> None:
        faults._crossings.clear()
        if spec is None:
            monkeypatch.delenv(faults.ENV_VAR, raising=False)
        else:
            monkeypatch.setenv(faults.ENV_VAR, f"{spec}:raise")

    yield arm
    faults._crossings.clear()


def assert_exactly_once(warehouse: Path, landing: Path, epochs: int) -> None:
    """Every input line once in the sink, with its epoch; one commit per table per epoch; nothing staged visible."""
    coordinator = _coordinator(warehouse, landing)
    layout = coordinator.layout
    rows = DeltaTable(layout.sink_table("lines")).to_pyarrow_table().to_pylist()
    expected = {f"part-{f:02d}.txt:{n + 1}": f + 1 for f in range(FILES) for n in range(LINES_PER_FILE)}
    assert sorted((r["line_id"], r["_epoch"]) for r in rows) == sorted(expected.items())
    seen = DeltaTable(layout.state_table("dedup", "seen")).to_pyarrow_table()
    assert sorted(seen["line_id"].to_pylist()) == sorted(expected)
    lineage = coordinator.current_lineage()["lineage_id"]
    records = coordinator.log.lineage_records(lineage)
    assert sorted(r.epoch for r in records if r.status is EpochStatus.COMPLETED) == list(range(1, epochs + 1))
    winners: dict[str, set[str]] = {}
    for epoch in range(1, epochs + 1):
        manifest = Manifest.from_json(objects.read_json(layout.manifest(lineage, epoch)))
        for table in manifest.tables:
            winners.setdefault(table.uri, set()).update(f.path for f in table.adds)
    for uri in winners:
        table = DeltaTable(uri)
        epochs_committed = [h["barrierflow.epoch"] for h in table.history() if "barrierflow.epoch" in h]
        assert sorted(epochs_committed) == sorted(set(epochs_committed)), (uri, epochs_committed)  # once each
        live = set(table.get_add_actions(flatten=True).column("path").to_pylist())
        assert live <= winners[uri] | {p for p in live if p.startswith("_compacted/")}, uri


# Each point once, at a crossing inside epoch 2 (epoch 1 has completed by then):
# the commit points between two tables of epoch 2's commits.
CRASHES = [
    ("recover.start", 2),
    ("barrier.before_write", 2),
    ("barrier.after_write", 2),
    ("process.after_read", 2),
    ("process.after_stage", 2),
    ("process.before_manifest", 2),
    ("process.after_manifest", 2),
    ("commit.before_delta_commit", TABLES + 2),
    ("commit.after_delta_commit", TABLES + 1),
    ("commit.before_completed", 2),
    ("commit.after_completed", 2),
    ("notify.start", 2),
]


@pytest.mark.parametrize(("point", "crossing"), CRASHES, ids=[f"{p}:{n}" for p, n in CRASHES])
def test_a_crash_at_any_point_then_a_new_run_is_exactly_once(
    point: str, crossing: int, tmp_path: Path, landing: Path, fault: Any
) -> None:
    warehouse = tmp_path / "wh"
    fault(f"{point}:{crossing}")
    with pytest.raises(InjectedFault):
        _coordinator(warehouse, landing).run(until_caught_up=True)
    fault(None)
    _coordinator(warehouse, landing).run(until_caught_up=True)
    assert_exactly_once(warehouse, landing, FILES)


# Two concurrent checkpoints (the default): a failure on either side of the overlap,
# (fault, epochs completed before the re-run). Barrier 2 is always injected before it.
EITHER_SIDE = [
    ("commit.before_completed:1", 0),  # epoch 1 fails between its Delta commits and its completed record
    ("notify.start:1", 1),  # epoch 1's post-commit work fails: epoch 2 must not vote on an unfinished epoch 1
    ("process.after_read:2", 1),  # epoch 2 fails while reading, beside epoch 1's commit
    ("barrier.after_write:2", 1),  # barrier 2 cannot be injected while epoch 1 runs
]


@pytest.mark.parametrize(("point", "completed"), EITHER_SIDE, ids=[p for p, _ in EITHER_SIDE])
def test_a_failure_on_either_side_of_two_concurrent_checkpoints_is_finished_exactly_once_by_a_rerun(
    point: str, completed: int, tmp_path: Path, landing: Path, fault: Any
) -> None:
    warehouse = tmp_path / "wh"
    fault(point)
    with pytest.raises(InjectedFault):
        _coordinator(warehouse, landing).run(until_caught_up=True)
    fault(None)
    coordinator = _coordinator(warehouse, landing)
    records = coordinator.log.records()
    assert {r.epoch for r in records if r.status is EpochStatus.COMPLETED} == set(range(1, completed + 1))
    # Epoch 2's barrier was injected before the failure; it never voted (a stopped attempt may record ABORTED).
    assert any(r.epoch == 2 and r.status is EpochStatus.PLANNED for r in records)
    assert objects.read_json(coordinator.layout.manifest(coordinator.current_lineage()["lineage_id"], 2)) is None
    assert not any(r.epoch == 2 and r.status in (EpochStatus.PRE_COMMITTED, EpochStatus.COMPLETED) for r in records)
    # Epoch 1, if not completed, is rolled forward by recovery; epoch 2 is recomputed from its barrier.
    assert [r.epoch for r in coordinator.run(until_caught_up=True)] == list(range(2, FILES + 1))
    assert_exactly_once(warehouse, landing, FILES)


def test_a_voted_epoch_is_rolled_forward_never_recomputed(tmp_path: Path, landing: Path, fault: Any) -> None:
    warehouse = tmp_path / "wh"
    fault("commit.before_completed:1")
    with pytest.raises(InjectedFault):
        _coordinator(warehouse, landing).run(epochs=1)
    fault(None)
    coordinator = _coordinator(warehouse, landing)
    vote = objects.read_json(coordinator.layout.manifest(coordinator.current_lineage()["lineage_id"], 1))
    recovery = coordinator.recover()
    assert recovery.rolled_forward == (1,) and recovery.last_completed_epoch == 1
    assert recovery.last_completed is not None and recovery.last_completed.attempt_id == vote["attempt_id"]


def test_the_first_durable_vote_wins(tmp_path: Path, landing: Path) -> None:
    warehouse = tmp_path / "wh"
    coordinator = _coordinator(warehouse, landing)
    recovery = coordinator.recover()
    barrier = coordinator.trigger_checkpoint(recovery)
    assert barrier is not None
    pipe = coordinator.pipeline
    first = process_epoch(None, coordinator.layout, pipe, barrier, completed_future(None), compute=stub_compute)
    second = process_epoch(None, coordinator.layout, pipe, barrier, completed_future(None), compute=stub_compute)
    assert second == first  # the late attempt returns the winner's vote...
    for table in (t for t in first.tables if t.adds):  # ...and its own staged files are gone
        epoch_dir = Path(objects.local_path(table.uri)) / "_staging" / barrier.lineage_id / f"{barrier.epoch:010d}"
        assert sorted(p.name for p in epoch_dir.iterdir()) == [first.attempt_id], table.name
    coordinator.run(until_caught_up=True)
    assert_exactly_once(warehouse, landing, FILES)


def test_a_zombie_of_an_old_lineage_cannot_commit(tmp_path: Path, landing: Path) -> None:
    warehouse = tmp_path / "wh"
    coordinator = _coordinator(warehouse, landing)
    coordinator.run(epochs=2)
    # A zombie voted epoch 3 in the first lineage, then the pipeline was restored to epoch 2.
    zombie = coordinator.trigger_checkpoint(coordinator.recover())
    assert zombie is not None and zombie.epoch == 3
    vote = process_epoch(
        None,
        coordinator.layout,
        coordinator.pipeline,
        zombie,
        completed_future(coordinator.recover().last_completed),
        compute=stub_compute,
    )
    objects.remove_document(coordinator.layout.manifest(zombie.lineage_id, 3))  # not rolled forward by the restore
    restored = restore(LINES, str(warehouse), epoch=2, rewind_sinks=True, params=coordinator.params)
    with pytest.raises(FencedError, match=f"restored into lineage {restored.lineage_id}"):
        coordinator.commit(zombie, vote)
    # The new lineage replays epochs 3 and 4 exactly once.
    _coordinator(warehouse, landing).run(until_caught_up=True)
    layout = coordinator.layout
    rows = DeltaTable(layout.sink_table("lines")).to_pyarrow_table().to_pylist()
    assert sorted(r["_epoch"] for r in rows) == sorted(e for e in range(1, FILES + 1) for _ in range(LINES_PER_FILE))
    assert json.loads(json.dumps(restored.to_json()))["epoch"] == 2


def test_a_zombie_whose_lineage_check_passed_before_a_restore_is_refused_by_every_table(
    tmp_path: Path, landing: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    warehouse = tmp_path / "wh"
    coordinator = _coordinator(warehouse, landing)
    coordinator.run(epochs=2)
    zombie = coordinator.trigger_checkpoint(coordinator.recover())
    assert zombie is not None
    vote = process_epoch(
        None,
        coordinator.layout,
        coordinator.pipeline,
        zombie,
        completed_future(coordinator.recover().last_completed),
        compute=stub_compute,
    )
    objects.remove_document(coordinator.layout.manifest(zombie.lineage_id, 3))
    before = coordinator.current_lineage_seq()
    restore(LINES, str(warehouse), epoch=2, rewind_sinks=True, params=coordinator.params)
    # The zombie read the lineage just before the restore switched it (the check passes), then commits.
    monkeypatch.setattr(coordinator, "current_lineage_seq", lambda: before)
    fence = Fence(LINES.name, before[0], zombie.epoch)
    for table in vote.tables:
        with pytest.raises(FencedError, match=r"holds fencing token \(lineage 1, epoch 2\)"):
            commit_epoch_table(table, coordinator.app_id(zombie.lineage_id), zombie.epoch, vote.attempt_id, fence)
    with pytest.raises(FencedError):
        coordinator.commit(zombie, vote)
    monkeypatch.undo()
    _coordinator(warehouse, landing).run(until_caught_up=True)
    rows = DeltaTable(coordinator.layout.sink_table("lines")).to_pyarrow_table().to_pylist()
    assert sorted(r["_epoch"] for r in rows) == sorted(e for e in range(1, FILES + 1) for _ in range(LINES_PER_FILE))


def test_a_late_file_blocks_the_pipeline_visibly_until_an_epoch_completes(tmp_path: Path, landing: Path) -> None:
    from barrierflow.airflow.ui.history import pipeline_history
    from barrierflow.airflow.ui.render import render_pipeline

    warehouse = tmp_path / "wh"
    refusing = _coordinator(warehouse, landing, late_files="refuse")
    assert len(refusing.run(epochs=2)) == 2  # part-00, part-01
    (landing / "part-00a.txt").write_text("late\n")  # sorts behind the position, part-01.txt
    with pytest.raises(BlockedInputError, match="'part-00a.txt' landed .* position 'part-01.txt'"):
        refusing.run(epochs=1)
    blocked = refusing.blocked()
    assert blocked is not None and (blocked["step"], blocked["epoch"]) == ("barrier", 3) and "part-00a.txt" in blocked["message"]
    history = pipeline_history(str(warehouse), "lines", state_size=False, savepoint_lister=lambda *_: [])
    assert history.blocked == blocked and history.to_json()["blocked"] == blocked
    page = render_pipeline(history)
    assert 'class="blocked"' in page and "part-00a.txt" in page and "<dd>blocked</dd>" in page.replace("\n", "")
    # The same pipeline told to read late files next epoch: it goes on, and is no longer blocked.
    taking = _coordinator(warehouse, landing, late_files="next_epoch")
    [result] = taking.run(epochs=1)
    assert result.epoch == 3 and taking.blocked() is None
    rows = DeltaTable(taking.layout.sink_table("lines")).to_pyarrow_table().to_pylist()
    assert [(r["line_id"], r["_epoch"]) for r in rows if r["line_id"].startswith("part-00a")] == [("part-00a.txt:1", 3)]


def test_each_epoch_records_the_backlog_it_left_and_the_coordinator_measures_it_now(tmp_path: Path, landing: Path) -> None:
    from barrierflow.connectors.source import Backlog

    coordinator = _coordinator(tmp_path / "wh", landing)
    size = (landing / "part-00.txt").stat().st_size  # every file has the same size
    assert (coordinator.backlog()["lines"].files, coordinator.backlog()["lines"].bytes) == (FILES, FILES * size)  # never run
    coordinator.run(epochs=1)
    [planned, pre, done] = coordinator.log.records()
    for record in (planned, pre, done):  # one file per epoch: three left waiting, the oldest since it landed
        assert (record.backlog_files, record.backlog_bytes) == (FILES - 1, (FILES - 1) * size)
        assert record.input_lag_ms is not None and record.input_lag_ms >= 0
        assert json.loads(record.backlog)["lines"]["files"] == FILES - 1
    # Where the time went, as Flink splits a checkpoint's: planning, processing, waiting, staging, committing.
    assert set(planned.phases()) == {"barrier"} and set(done.phases()) == {"barrier", "process", "wait", "stage", "commit"}
    assert all(ms is not None and ms >= 0 for ms in done.phases().values())
    now = coordinator.backlog()["lines"]
    assert (now.files, now.bytes) == (FILES - 1, (FILES - 1) * size) and now.oldest_arrival_ms is not None
    coordinator.run(until_caught_up=True)
    assert coordinator.backlog() == {"lines": Backlog()}
    assert coordinator.log.records()[-1].backlog_files == 0


def test_each_epoch_stages_its_barriers_end_offsets_and_refuses_offsets_state_that_is_not_its_start(
    tmp_path: Path, landing: Path
) -> None:
    """Rule 8 of operator_state: state n-1 and barrier n agree unless the table was changed outside barrierflow."""
    warehouse = tmp_path / "wh"
    coordinator = _coordinator(warehouse, landing)
    coordinator.run(epochs=1)
    lineage = coordinator.current_lineage()["lineage_id"]
    barrier = coordinator._read_barrier(lineage, 1)
    assert barrier is not None
    uri = coordinator.layout.state_table("lines", "offsets")
    assert [json.loads(v) for v in DeltaTable(uri).to_pyarrow_table()["value"].to_pylist()] == [barrier.end_offsets["lines"]]
    forged = offsets_rows("lines", {"file": "part-09.txt", "line": None}, 1, epoch=1, updated_at_ms=0)
    write_deltalake(uri, forged.select(DeltaTable(uri).schema().to_arrow().names), mode="overwrite")
    with pytest.raises(
        CheckpointError, match=r"source lines: its offsets state holds .*part-09.txt.* but barrier 2 starts at .*part-00.txt"
    ):
        _coordinator(warehouse, landing).run(epochs=1)
