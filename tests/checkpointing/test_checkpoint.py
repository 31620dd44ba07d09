"""barrierflow.checkpointing.checkpoint: JSON round trips of the protocol's value objects."""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest

from barrierflow.checkpointing.checkpoint import Barrier, CheckpointRecord, EpochStatus, Manifest, app_id
from barrierflow.storage.commits import StagedFile, TableCommit, TableKind


def _through_json(doc: Any) -> Any:
    return json.loads(json.dumps(doc))


@pytest.fixture
def make_staged() -> Callable[..., StagedFile]:
    def _make(path: str = "_staging/e1/part-0.parquet", rows: int = 10, size: int = 1000, **kw: Any) -> StagedFile:
        return StagedFile(path=path, size=size, rows=rows, stats=json.dumps({"numRecords": rows}), **kw)

    return _make


@pytest.fixture
def make_commit(make_staged: Callable[..., StagedFile]) -> Callable[..., TableCommit]:
    def _make(name: str = "sensor_totals", kind: TableKind = TableKind.SINK, **kw: Any) -> TableCommit:
        fields: dict[str, Any] = {
            "name": name,
            "uri": f"/w/pipe/{name}",
            "kind": kind,
            "schema_json": '{"type":"struct","fields":[]}',
            "partition_by": ("day",),
            "adds": (
                make_staged(rows=3, size=300, partition_values={"day": "2024-01-01"}),
                make_staged(path="_staging/e1/part-1.parquet", rows=4, size=400, partition_values={"day": None}),
            ),
            "removes": ("part-old.parquet",),
            "base_version": 7,
            "data_change": True,
            "primary_key": ("sensor_id",),
        }
        fields.update(kw)
        return TableCommit(**fields)

    return _make


def test_barrier_round_trip() -> None:
    barrier = Barrier(
        pipeline="sensor_stats",
        lineage_id="lin-1",
        epoch=3,
        start_offsets={"readings": {"file": "a.jsonl", "line": 10, "files": []}},
        end_offsets={"readings": {"file": "b.jsonl", "line": None, "files": [["b.jsonl", 0, None, 123]]}},
        processing_time_ms=1_700_000_000_000,
        planned_at="2024-01-01T00:00:00Z",
        attempt_id="att-1",
        params={"landing_dir": "/in", "parallelism": 2},
    )
    assert Barrier.from_json(_through_json(barrier.to_json())) == barrier


def test_barrier_default_params_round_trip() -> None:
    barrier = Barrier("p", "l", 0, {}, {}, 0, "now", "a")
    assert Barrier.from_json(_through_json(barrier.to_json())) == barrier
    assert barrier.to_json()["params"] == {}


@pytest.mark.parametrize("kind", list(TableKind))
def test_table_commit_round_trip(make_commit: Callable[..., TableCommit], kind: TableKind) -> None:
    commit = make_commit(kind=kind)
    doc = commit.to_json()
    assert doc["kind"] == kind.value  # stored as its plain string
    restored = TableCommit.from_json(_through_json(doc))
    assert restored == commit
    assert isinstance(restored.kind, TableKind)
    assert isinstance(restored.adds[0], StagedFile)


def test_table_commit_round_trip_first_epoch_without_table(make_commit: Callable[..., TableCommit]) -> None:
    commit = make_commit(partition_by=(), adds=(), removes=(), base_version=None, data_change=False, primary_key=())
    assert TableCommit.from_json(_through_json(commit.to_json())) == commit


def test_table_commit_without_primary_key_field_reads_as_empty(make_commit: Callable[..., TableCommit]) -> None:
    doc = _through_json(make_commit().to_json())
    del doc["primary_key"]  # documents written before the field existed
    assert TableCommit.from_json(doc).primary_key == ()


def test_table_commit_rows_and_bytes(make_commit: Callable[..., TableCommit]) -> None:
    commit = make_commit()
    assert commit.rows == 7
    assert commit.bytes == 700


def test_manifest_round_trip(make_commit: Callable[..., TableCommit]) -> None:
    manifest = Manifest(
        pipeline="sensor_stats",
        lineage_id="lin-1",
        epoch=5,
        attempt_id="att-2",
        tables=(
            make_commit(),
            make_commit(name="dedup__seen", kind=TableKind.STATE, partition_by=(), primary_key=("event_id",)),
            make_commit(name="dead_letter", kind=TableKind.DEAD_LETTER, base_version=None),
        ),
        max_event_time_us=1_700_000_000_000_000,
        watermark_us=1_699_999_970_000_000,
        rows_in=100,
        rows_out=42,
        dead_letters=3,
        process_ms=1234,
    )
    restored = Manifest.from_json(_through_json(manifest.to_json()))
    assert restored == manifest
    assert all(isinstance(t, TableCommit) for t in restored.tables)


def test_manifest_round_trip_without_watermark() -> None:
    manifest = Manifest("p", "l", 0, "a", (), None, None, 0, 0, 0, 0)
    assert Manifest.from_json(_through_json(manifest.to_json())) == manifest


def test_manifest_bytes(make_commit: Callable[..., TableCommit]) -> None:
    manifest = Manifest(
        "p",
        "l",
        1,
        "a",
        (make_commit(), make_commit(name="op__s", kind=TableKind.STATE)),
        None,
        None,
        0,
        0,
        0,
        0,
    )
    assert manifest.bytes_written == 1400
    assert manifest.state_bytes_written == 700


def test_checkpoint_record_json_fields() -> None:
    record = CheckpointRecord(
        pipeline="p",
        lineage_id="l",
        epoch=2,
        status=EpochStatus.COMPLETED,
        attempt_id="a",
        recorded_at_us=1,
        offsets=json.dumps({"readings": {"file": "x", "line": None}}),
        table_versions=json.dumps({"sensor_totals": 4, "dedup__seen": 2}),
    )
    assert record.offsets_json() == {"readings": {"file": "x", "line": None}}
    assert record.versions() == {"sensor_totals": 4, "dedup__seen": 2}
    assert CheckpointRecord("p", "l", 0, EpochStatus.PLANNED, "a", 0).versions() == {}


def test_epoch_status_values_are_their_names() -> None:
    assert [s.value for s in EpochStatus] == ["PLANNED", "PRE_COMMITTED", "COMPLETED", "ABORTED"]
    assert EpochStatus("COMPLETED") is EpochStatus.COMPLETED


def test_app_id() -> None:
    assert app_id("sensor_stats", "lin-9") == "barrierflow:sensor_stats:lin-9"


def test_table_commit_of_a_sink_widening_round_trips_and_older_documents_have_none(
    make_commit: Callable[..., TableCommit],
) -> None:
    commit = make_commit(
        table_schema_json='{"type":"struct","fields":[{"name":"x","type":"long","nullable":true,"metadata":{}}]}'
    )
    assert TableCommit.from_json(_through_json(commit.to_json())) == commit
    doc = _through_json(make_commit().to_json())
    del doc["table_schema_json"]  # documents written before the field existed
    assert TableCommit.from_json(doc).table_schema_json is None
