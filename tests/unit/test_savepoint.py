"""Savepoint metadata, state signatures and the restore compatibility check."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from barrierflow.errors import IncompatibleSavepointError, SavepointError
from barrierflow.pipelines.sensor_stats import sensor_stats
from barrierflow.restore import check_compatibility
from barrierflow.savepoint import SavepointMetadata, SinkSnapshot, StateSnapshot, state_signature


def _pipe(tmp_path: Any) -> Any:
    return sensor_stats.build({"landing_dir": str(tmp_path)})


def _saved(pipe: Any) -> dict[str, Any]:
    return {f"{s.operator_id}/{s.name}": state_signature(s.arrow_schema()) for s in pipe.state_specs()}


def test_signature_treats_large_and_small_strings_alike() -> None:
    small = pa.schema([("k", pa.string()), ("v", pa.list_(pa.float64()))])
    large = pa.schema([("k", pa.large_string()), ("v", pa.large_list(pa.float64()))])
    assert state_signature(small) == state_signature(large)
    assert state_signature(small) != state_signature(pa.schema([("k", pa.string()), ("v", pa.list_(pa.int64()))]))


def test_matching_restore_point_restores_everything(tmp_path: Any) -> None:
    pipe = _pipe(tmp_path)
    restored, dropped, empty = check_compatibility(pipe, pipe.key_groups, _saved(pipe), False)
    assert restored == sorted(_saved(pipe)) and dropped == [] and empty == []


def test_removed_added_and_changed_state_is_listed(tmp_path: Any) -> None:
    pipe = _pipe(tmp_path)
    saved = _saved(pipe)
    saved["gone/state"] = (("k", "string"),)
    del saved["dedup/seen"]
    saved["totals/accumulators"] = (("sensor_id", "int64"),)
    with pytest.raises(IncompatibleSavepointError) as info:
        check_compatibility(pipe, pipe.key_groups, saved, False)
    assert info.value.dropped == ["gone/state", "totals/accumulators (schema changed)"]
    assert info.value.missing == ["dedup/seen", "totals/accumulators (schema changed)"]
    restored, dropped, empty = check_compatibility(pipe, pipe.key_groups, saved, True)
    assert "totals/accumulators" not in restored and empty == ["dedup/seen", "totals/accumulators"]


def test_key_groups_never_change_even_when_allowed(tmp_path: Any) -> None:
    pipe = _pipe(tmp_path)
    with pytest.raises(IncompatibleSavepointError, match="key groups"):
        check_compatibility(pipe, pipe.key_groups * 2, _saved(pipe), True)


def test_metadata_round_trips_and_checks_format_version() -> None:
    meta = SavepointMetadata(
        name="sp", pipeline="p", uri="/w/_savepoints/p/sp", epoch=3, lineage_id="abc", created_at="t",
        description="d", key_groups=128, offsets={"s": {"files": 2}}, watermark_us=5, max_event_time_us=6,
        params={"x": 1}, operators=("a",), states=(StateSnapshot("a", "s", (("k", "string"),), 2, ("state/a/s/f.parquet",)),),
        sinks=(SinkSnapshot("out", "upsert", 1, ("sinks/out/f.parquet",)),), size_bytes=10,
    )
    assert SavepointMetadata.from_json(meta.to_json()) == meta
    assert SavepointMetadata.from_json(meta.to_json(), uri="/elsewhere").uri == "/elsewhere"
    with pytest.raises(SavepointError, match="format version"):
        SavepointMetadata.from_json({**meta.to_json(), "format_version": 99})
