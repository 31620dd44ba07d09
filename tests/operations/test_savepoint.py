"""Savepoint metadata, state signatures, the restore compatibility check, and writing one (stub engine)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pytest

from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.core.errors import CheckpointError, IncompatibleSavepointError, SavepointError
from barrierflow.demo.pipelines.sensor_stats import sensor_stats
from barrierflow.operations.query import run_query
from barrierflow.operations.restore import check_compatibility, restore
from barrierflow.operations.savepoint import (
    SavepointMetadata,
    SinkSnapshot,
    StateSnapshot,
    create_savepoint,
    list_savepoints,
    load_savepoint,
    snapshot_chunks,
    state_signature,
)
from barrierflow.storage import objects
from stub_engine import LINES, stub_compute


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
    found = check_compatibility(pipe, pipe.key_groups, _saved(pipe), False)
    assert found.restored == sorted(_saved(pipe)) and found.dropped == [] and found.empty == [] and found.evolved == {}


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
    found = check_compatibility(pipe, pipe.key_groups, saved, True)
    assert "totals/accumulators" not in found.restored and found.empty == ["dedup/seen", "totals/accumulators"]


def test_key_groups_never_change_even_when_allowed(tmp_path: Any) -> None:
    pipe = _pipe(tmp_path)
    with pytest.raises(IncompatibleSavepointError, match="key groups"):
        check_compatibility(pipe, pipe.key_groups * 2, _saved(pipe), True)


def test_metadata_round_trips_and_checks_format_version() -> None:
    meta = SavepointMetadata(
        name="sp",
        pipeline="p",
        uri="/w/_savepoints/p/sp",
        epoch=3,
        lineage_id="abc",
        created_at="t",
        description="d",
        key_groups=128,
        offsets={"s": {"files": 2}},
        watermark_us=5,
        max_event_time_us=6,
        params={"x": 1},
        operators=("a",),
        states=(StateSnapshot("a", "s", (("k", "string"),), 2, ("state/a/s/f.parquet",)),),
        sinks=(SinkSnapshot("out", "upsert", 1, ("sinks/out/f.parquet",)),),
        size_bytes=10,
    )
    assert SavepointMetadata.from_json(meta.to_json()) == meta
    assert SavepointMetadata.from_json(meta.to_json(), uri="/elsewhere").uri == "/elsewhere"
    with pytest.raises(SavepointError, match="format version"):
        SavepointMetadata.from_json({**meta.to_json(), "format_version": 99})


def test_a_savepoint_exists_once_its_metadata_does_and_attempts_never_mix_files(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written without a rename (object stores have none): data under the attempt's directory, metadata last."""
    landing, warehouse = Path(tmp_path) / "landing", str(Path(tmp_path) / "wh")
    landing.mkdir()
    for f in range(3):
        (landing / f"part-{f}.txt").write_text("".join(f"file {f} line {n}\n" for n in range(4)))
    params = {"landing_dir": str(landing), "max_files_per_epoch": 1}
    CheckpointCoordinator(LINES, params, warehouse, spark_factory=lambda: None, compute=stub_compute).run(epochs=2)

    def crash(*args: Any, **kwargs: Any) -> bool:
        raise OSError("the machine died before the metadata was written")

    with monkeypatch.context() as patch:  # an attempt failing before step 4 removes its files: no savepoint
        patch.setattr(objects, "write_json_if_absent", crash)
        with pytest.raises(OSError):
            create_savepoint(LINES, warehouse, name="sp", params=params)
    assert list_savepoints("lines", warehouse) == []
    sp = create_savepoint(LINES, warehouse, name="sp", params=params)
    seen = next(s for s in sp.states if s.name == "dedup/seen")
    assert objects.list_dir(sp.uri) == ["_savepoint.json", seen.files[0].split("/")[0]]
    with pytest.raises(SavepointError, match="already exists"):
        create_savepoint(LINES, warehouse, name="sp", params=params)
    rows = pa.concat_tables(snapshot_chunks(load_savepoint("lines", warehouse, "sp"), seen.files))
    assert rows.num_rows == 8 and sp.size_bytes > 0
    CheckpointCoordinator(LINES, params, warehouse, spark_factory=lambda: None, compute=stub_compute).run(epochs=1)
    assert restore(LINES, warehouse, savepoint="sp", rewind_sinks=True, params=params).epoch == 2


def test_a_restore_takes_its_offsets_from_the_sources_offsets_state(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The savepoint's offsets state, not its metadata's copy; an older savepoint without it falls back to the copy."""
    landing, warehouse = tmp_path / "landing", str(tmp_path / "wh")
    landing.mkdir()
    for f in range(3):
        (landing / f"part-{f}.txt").write_text("".join(f"file {f} line {n}\n" for n in range(4)))
    params = {"landing_dir": str(landing), "max_files_per_epoch": 1}

    def run(epochs: int) -> CheckpointCoordinator:
        coordinator = CheckpointCoordinator(LINES, params, warehouse, spark_factory=lambda: None, compute=stub_compute)
        coordinator.run(epochs=epochs)
        return coordinator

    coordinator = run(2)
    barrier = coordinator._read_barrier(coordinator.current_lineage()["lineage_id"], 2)
    assert barrier is not None
    end = barrier.end_offsets["lines"]
    stored = run_query(warehouse, "lines", "select subtask, position, value from lines__offsets").to_pylist()
    assert [(r["subtask"], r["position"], json.loads(r["value"])) for r in stored] == [(0, 0, end)]
    sp = create_savepoint(LINES, warehouse, name="sp", params=params)
    run(1)

    def copy(name: str, change: Callable[[dict[str, Any]], None]) -> str:
        target = tmp_path / name
        shutil.copytree(sp.uri, target)
        doc = json.loads((target / "_savepoint.json").read_text())
        change(doc)
        (target / "_savepoint.json").write_text(json.dumps(doc))
        return str(target)

    def replayed() -> list[dict[str, Any]]:
        run(1)  # epoch 3 again: the file after the restore point's offsets, once
        return run_query(warehouse, "lines", "select count(*) as n, max(_epoch) as e from lines").to_pylist()

    # The metadata's copy of the offsets is gone: the restore reads them from the state.
    restore(LINES, warehouse, savepoint=copy("no-copy", lambda doc: doc.update(offsets={})), rewind_sinks=True, params=params)
    assert coordinator.current_lineage()["start_offsets"] == {"lines": end}
    assert replayed() == [{"n": 12, "e": 3}]

    # The copy and the state disagree: refused, naming the source and both.
    differs = copy("differs", lambda doc: doc["offsets"]["lines"].update(consumed=99))
    with pytest.raises(
        CheckpointError,
        match=r"source lines: the restore point's offsets state holds .*\"consumed\": 2.* but its recorded offsets are .*\"consumed\": 99",
    ):
        restore(LINES, warehouse, savepoint=differs, rewind_sinks=True, params=params)

    # A savepoint of an older release has no offsets state: its copy is restored (and said so), seeding the state.
    older = copy("older", lambda doc: doc.update(states=[s for s in doc["states"] if s["state"] != "offsets"]))
    with caplog.at_level(logging.WARNING, logger="barrierflow.operations.restore"):
        result = restore(LINES, warehouse, savepoint=older, rewind_sinks=True, params=params)
    assert "source lines has no offsets state (written by an older release): restoring its recorded offsets" in caplog.text
    assert result.restored_states == ("dedup/seen", "lines/offsets") and result.empty_states == ()
    assert [
        json.loads(v) for v in run_query(warehouse, "lines", "select value from lines__offsets").column("value").to_pylist()
    ] == [end]
    assert replayed() == [{"n": 12, "e": 3}]
