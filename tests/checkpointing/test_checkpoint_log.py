"""The checkpoint log's reader: incremental, right after the table is rewritten, and shared until the log is created anew."""

from __future__ import annotations

from pathlib import Path

from deltalake import DeltaTable

from barrierflow.checkpointing.checkpoint import CheckpointRecord, EpochStatus
from barrierflow.checkpointing.checkpoint_log import CheckpointLog
from barrierflow.storage.layout import PipelineLayout


def _record(epoch: int, status: EpochStatus, at_us: int) -> CheckpointRecord:
    return CheckpointRecord(
        pipeline="p", lineage_id="l1", epoch=epoch, status=status, attempt_id=f"a{epoch}", recorded_at_us=at_us
    )


def test_records_seen_incrementally_equal_a_fresh_read(tmp_path: Path) -> None:
    layout = PipelineLayout.of(str(tmp_path), "p")
    log = CheckpointLog(layout)
    assert log.records() == []
    written = []
    for epoch in range(1, 6):
        for offset, status in enumerate((EpochStatus.PLANNED, EpochStatus.COMPLETED)):
            written.append(_record(epoch, status, epoch * 10 + offset))
            log.append(written[-1])
        # The same reader, after each epoch, sees exactly what a new reader sees.
        assert log.records() == CheckpointLog(layout).records() == written
    # A repeated transition (a second attempt recording it) is read once.
    log.append(_record(5, EpochStatus.COMPLETED, 99))
    assert log.records() == written
    assert CheckpointLog.last_completed(log.records()) == written[-1]


def test_records_survive_a_rewrite_of_the_log_files(tmp_path: Path) -> None:
    layout = PipelineLayout.of(str(tmp_path), "p")
    log = CheckpointLog(layout)
    written = [_record(epoch, EpochStatus.COMPLETED, epoch) for epoch in range(1, 9)]
    for record in written:
        log.append(record)
    assert log.records() == written
    # Compaction replaces every file the reader has cached, and vacuum deletes them.
    assert not log.compact(min_files=9) and log.compact(min_files=8)
    table = DeltaTable(layout.checkpoint_log)
    table.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)
    assert len(DeltaTable(layout.checkpoint_log).file_uris()) == 1
    assert log.records() == written
    log.append(_record(9, EpochStatus.COMPLETED, 9))
    assert [r.epoch for r in log.records()] == list(range(1, 10))


def test_the_shared_reader_is_kept_until_the_log_is_created_anew(store_root: str) -> None:
    from barrierflow.storage import objects

    layout = PipelineLayout.of(f"{store_root}/wh", "p")
    first, second, other = (_record(e, EpochStatus.COMPLETED, e) for e in (1, 2, 3))
    writer = CheckpointLog(layout)
    writer.append(first)
    reader = CheckpointLog.shared(layout)
    assert reader.records() == [first]
    writer.append(second)
    assert CheckpointLog.shared(layout) is reader and reader.records() == [first, second]
    # Deleted and written again from scratch: another table at the same place, read by a new reader.
    objects.remove_tree(layout.checkpoint_log)
    CheckpointLog(layout).append(other)
    again = CheckpointLog.shared(layout)
    assert again is not reader and again.records() == [other]
