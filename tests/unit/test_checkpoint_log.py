"""The checkpoint log's reader: incremental, and right after the table is rewritten."""

from __future__ import annotations

from pathlib import Path

from deltalake import DeltaTable

from barrierflow.checkpoint import CheckpointRecord, EpochStatus
from barrierflow.checkpoint_log import CheckpointLog
from barrierflow.layout import PipelineLayout


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
