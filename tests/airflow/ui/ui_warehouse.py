"""A small warehouse for the checkpoints-page tests, built without Spark.

Writes what the coordinator would: ``_pipeline.json``, lineage documents,
checkpoint-log rows, and real Delta state/sink tables whose versions the
COMPLETED rows record.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from barrierflow.checkpointing.checkpoint import CheckpointRecord, EpochStatus
from barrierflow.checkpointing.checkpoint_log import CheckpointLog
from barrierflow.storage import objects
from barrierflow.storage.layout import PipelineLayout

__all__ = ["build_demo_warehouse", "live_bytes", "S", "MS"]

S = 1_000_000  # microseconds per second
MS = 1_000
T0 = 1_700_000_000 * S  # event time base
WALL = 1_800_000_000 * S  # wall clock base


def live_bytes(uri: str, version: int) -> int:
    """Independent check: the on-disk sizes of the table's files at ``version``."""
    table = DeltaTable(uri, version=version)
    return sum(os.path.getsize(u.removeprefix("file://")) for u in table.file_uris())


def _write(uri: str, rows: list[dict[str, Any]], mode: str) -> int:
    write_deltalake(uri, pa.Table.from_pylist(rows), mode=mode)
    return DeltaTable(uri).version()


def _record(pipeline: str, lineage: str, epoch: int, status: EpochStatus, at_us: int, **kw: Any) -> CheckpointRecord:
    return CheckpointRecord(
        pipeline=pipeline,
        lineage_id=lineage,
        epoch=epoch,
        status=status,
        attempt_id=f"a{epoch}",
        recorded_at_us=at_us,
        **kw,
    )


def build_demo_warehouse(root: Path, pipeline: str = "demo") -> dict[str, Any]:
    """Lineage L1 with epochs 1, 2 COMPLETED and 3 only PLANNED; lineage L2 (a restore) with epoch 3 COMPLETED.

    Returns the expected facts (table uris, versions per epoch).
    """
    layout = PipelineLayout.of(str(root), pipeline)
    objects.write_json_if_absent(
        layout.pipeline_meta, {"name": pipeline, "key_groups": 16, "created_at": "2024-01-01T00:00:00+00:00"}
    )
    objects.write_json_if_absent(
        objects.join_uri(layout.lineages, "0000000000.json"),
        {"lineage_id": "L1", "start_epoch": 0, "started_at": "2024-01-01T00:00:00+00:00", "reason": "created"},
    )
    state = layout.state_table("counter", "totals")
    sink = layout.sink_table("out")
    log = CheckpointLog(layout)

    def state_rows(n: int) -> list[dict[str, Any]]:
        return [{"k": f"key-{i}", "_key_group": i % 16, "v": i * n, "_epoch": n} for i in range(50 * n)]

    v1 = _write(state, state_rows(1), "append")
    s1 = _write(sink, [{"k": "a", "_epoch": 1}], "append")
    v2 = _write(state, state_rows(2), "append")
    s2 = _write(sink, [{"k": "b", "_epoch": 2}], "append")
    v3 = _write(state, state_rows(3), "overwrite")  # a compaction-like rewrite: older files stop being live
    s3 = _write(sink, [{"k": "c", "_epoch": 3}], "append")

    def done(lineage: str, epoch: int, at: int, versions: dict[str, int], *, duration_ms: int, sbw: int) -> None:
        # Each epoch planned by a scheduled run of the pipeline's DAG, as the coordinator records it on every row.
        by = f"barrierflow_{pipeline}:scheduled__{lineage}-{epoch}"
        for offset, status in enumerate((EpochStatus.PLANNED, EpochStatus.PRE_COMMITTED)):
            log.append(_record(pipeline, lineage, epoch, status, at + offset * MS, planned_by=by))
        log.append(
            _record(
                pipeline,
                lineage,
                epoch,
                EpochStatus.COMPLETED,
                at + 5 * MS,
                watermark_us=T0 + epoch * 60 * S,
                max_event_time_us=T0 + epoch * 60 * S + 30 * S,
                rows_in=100 * epoch,
                rows_out=10 * epoch,
                dead_letters=epoch,
                bytes_written=1000 * epoch,
                state_bytes_written=sbw,
                duration_ms=duration_ms,
                table_versions=json.dumps(versions),
                planned_by=by,
            )
        )

    done("L1", 1, WALL, {"counter__totals": v1, "out": s1}, duration_ms=2500, sbw=700)
    done("L1", 2, WALL + 10 * S, {"counter__totals": v2, "out": s2}, duration_ms=4000, sbw=900)
    log.append(_record(pipeline, "L1", 3, EpochStatus.PLANNED, WALL + 20 * S))
    objects.write_json_if_absent(
        objects.join_uri(layout.lineages, "0000000001.json"),
        {
            "lineage_id": "L2",
            "start_epoch": 2,
            "started_at": "2024-01-02T00:00:00+00:00",
            "reason": "restore",
            "savepoint": "sp-1",
        },
    )
    done("L2", 3, WALL + 30 * S, {"counter__totals": v3, "out": s3}, duration_ms=3000, sbw=1200)
    return {
        "layout": layout,
        "state_uri": state,
        "versions": {("L1", 1): v1, ("L1", 2): v2, ("L2", 3): v3},
    }
