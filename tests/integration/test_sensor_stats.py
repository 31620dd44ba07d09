"""sensor_stats on real Spark and real Delta tables equals the reference."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Callable

import pytest

from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.connectors import delta_sink
from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
from barrierflow.execution import runtime
from barrierflow.plan.registry import get_pipeline
from barrierflow.state import delta_backend as delta_state_backend
from barrierflow.state import worker_cache
from barrierflow.storage import objects
from sensor_check import (
    assert_matches_reference,
    assert_nothing_staged_visible,
    assert_one_commit_per_table_per_epoch,
    reference_for,
    table_snapshot,
)


@pytest.fixture
def make_stream(tmp_path: Path) -> Callable[..., Path]:
    def make(n_files: int = 6, records_per_file: int = 120, seed: int = 7, **kw: Any) -> Path:
        landing = tmp_path / f"landing-{seed}"
        write_sensor_files(landing, SensorStreamSpec(n_files=n_files, records_per_file=records_per_file, seed=seed, **kw))
        return landing

    return make


def _coordinator(spark: Any, landing: Path | str, warehouse: Path | str, **params: Any) -> CheckpointCoordinator:
    given = {"landing_dir": str(landing), "max_files_per_epoch": 2, **params}
    return CheckpointCoordinator(get_pipeline("sensor_stats"), given, str(warehouse), spark_factory=lambda: spark)


def test_epochs_match_reference(spark: Any, make_stream: Callable[..., Path], warehouse: str) -> None:
    landing = make_stream(n_files=6, records_per_file=150, seed=3, late_rate=0.05, duplicate_rate=0.1)
    results = _coordinator(spark, landing, warehouse).run(until_caught_up=True)
    assert [r.epoch for r in results] == [1, 2, 3]
    ref = reference_for(landing, 2)
    assert ref.late_readings and ref.alerts and ref.dead_letter and ref.sensor_minute  # the stream exercises every path
    assert_matches_reference(warehouse, ref)
    assert_one_commit_per_table_per_epoch(warehouse, 3)
    assert_nothing_staged_visible(warehouse)
    # Nothing new: running again is a no-op.
    assert _coordinator(spark, landing, warehouse).run(until_caught_up=True) == []


def test_parallelism_changes_between_epochs(
    spark: Any, make_stream: Callable[..., Path], tmp_path: Path, warehouse: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    landing = make_stream(n_files=8, records_per_file=150, seed=11)
    # The varied run's warehouse is local or on S3, the fixed run's local: bit-identical either way.
    fixed, varied = tmp_path / "fixed", warehouse
    _coordinator(spark, landing, fixed, parallelism=2).run(until_caught_up=True)
    # The varied run also takes the paths of big epochs, big state and big
    # sinks: a task per partition for every write, every state read matched
    # against the epoch's keys, and the upsert sink rewriting only the files
    # that hold a changed key (at this size an epoch's tables are otherwise
    # written by one task each, state is read whole, the sink rewritten whole).
    # Epoch 2 matches keys while scanning the files (the Python workers'
    # cache of state files off), epochs 3 and 4 look them up in that cache.
    monkeypatch.setattr(runtime, "SINGLE_TASK_ROWS", -1)
    monkeypatch.setattr(delta_state_backend, "worth_matching", lambda stored_rows, key_count, cached=False: True)
    monkeypatch.setattr(delta_sink, "WHOLE_REWRITE_MAX_ROWS", -1)
    # No executor copy of the running totals' state: they read their keys too.
    monkeypatch.setenv("BARRIERFLOW_CACHED_STATE_ROWS", "0")
    lookups: list[tuple[int, str]] = []
    backend = delta_state_backend.DeltaStateBackend

    def counted(real: Any) -> Any:
        def lookup(self: Any, spec: Any, *args: Any) -> Any:
            lookups.append((self._ctx.epoch, spec.operator_id))
            return real(self, spec, *args)

        return lookup

    monkeypatch.setattr(backend, "with_live_rows", counted(backend.with_live_rows))
    _coordinator(spark, landing, varied, parallelism=1).run(epochs=1)
    monkeypatch.setenv(worker_cache.CACHE_ENV, "0")
    _coordinator(spark, landing, varied, parallelism=7).run(epochs=1)
    monkeypatch.delenv(worker_cache.CACHE_ENV)
    assert lookups == []
    # Epoch 3's input (two files of ~15 KB) gets more shuffle partitions than its parallelism.
    with monkeypatch.context() as m, caplog.at_level(logging.INFO, logger="barrierflow.execution.runtime"):
        m.setattr(runtime, "INPUT_BYTES_PER_PARTITION", 5_000)
        _coordinator(spark, landing, varied, parallelism=3).run(epochs=1)
    assert re.search(r"epoch 3: \d+ shuffle partitions for its input \(parallelism 3\)", caplog.text), caplog.text
    _coordinator(spark, landing, varied, parallelism=2).run(epochs=1)
    # The dedup and the running totals (each joining its epoch with the rows found, in the same tasks), both epochs.
    assert sorted(set(lookups)) == [(3, "dedup"), (3, "totals"), (4, "dedup"), (4, "totals")]
    assert table_snapshot(varied) == table_snapshot(fixed)  # bit-identical, not just close
    assert_matches_reference(varied, reference_for(landing, 2))


def test_files_arriving_between_epochs(spark: Any, tmp_path: Path, store_root: str) -> None:
    """Files land in a directory or under an S3 prefix while the pipeline runs; names starting with . or _ are in progress."""
    generated, landing, warehouse = tmp_path / "generated", f"{store_root}/landing", f"{store_root}/warehouse"
    write_sensor_files(generated, SensorStreamSpec(n_files=5, records_per_file=80, seed=5))
    files = sorted(generated.iterdir())

    def land(name: str, data: bytes) -> None:
        assert objects.put_if_absent(objects.join_uri(landing, name), data)

    for path in files[:3]:
        land(path.name, path.read_bytes())
    land(".in-progress.jsonl", b'{"half written')
    land("_temporary.jsonl", b"ignored")
    coordinator = _coordinator(spark, landing, warehouse)
    assert [r.epoch for r in coordinator.run(until_caught_up=True)] == [1, 2]
    for path in files[3:]:
        land(path.name, path.read_bytes())
    assert [r.epoch for r in _coordinator(spark, landing, warehouse).run(until_caught_up=True)] == [3]
    # The reference sees the same epochs: files 0-1, 2, 3-4.
    from reference.sensor_stats_reference import run_reference

    ref = run_reference([files[0:2], files[2:3], files[3:5]], 30)
    assert_matches_reference(warehouse, ref)


def test_a_line_parser_reads_many_small_byte_ranges_exactly_once(spark: Any, store_root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python tasks read, number and parse their own byte ranges (from a directory or an S3 prefix): the records and dead letters of a line-by-line reading."""
    from barrierflow.connectors import FileSource, RecordError, file_source
    from barrierflow.demo.pipelines.sensor_stats import READING_SCHEMA, parse_reading

    good = '{"event_id": "e%d", "sensor_id": "s%d", "ts": "2026-01-01T00:00:%02dZ", "temperature": %d.5}'
    lines = [(good % (i, i % 3, i % 60, i)).encode() for i in range(400)]
    lines[7] = b"not json"
    lines[50] = b"   "  # blank: neither a record nor a dead letter
    lines[51] = lines[51] + b"\r"
    lines[120] = b'{"event_id": "x", "sensor_id": "\xff"}'  # invalid UTF-8
    lines[399] = b'{"event_id": ""}'
    landing = f"{store_root}/landing"
    assert objects.put_if_absent(objects.join_uri(landing, "a.jsonl"), b"\n".join(lines[:250]) + b"\n")
    assert objects.put_if_absent(objects.join_uri(landing, "b.jsonl"), b"\n".join(lines[250:]))  # no final newline
    monkeypatch.setattr(file_source, "_MIN_CHUNK_BYTES", 700)  # ~40 ranges at parallelism 40
    source = FileSource("readings", landing, parser=parse_reading, parser_schema=READING_SCHEMA)
    end = source.plan(None, None)
    assert len(source._tasks(landing, end["files"], file_source._parse_chunk_bytes(end["files"], 40))) > 20
    batch = source.read(spark, end, 40)
    want_records, want_dead = [], []
    for name, part in (("a.jsonl", lines[:250]), ("b.jsonl", lines[250:])):
        for number, raw in enumerate(part, start=1):
            try:
                text = raw.decode("utf-8").removesuffix("\r")
            except UnicodeDecodeError:
                want_dead.append((name, number))
                continue
            if not text.strip():
                continue
            try:
                want_records.append(parse_reading(text)["event_id"])
            except RecordError:
                want_dead.append((name, number))
    assert sorted(r["event_id"] for r in batch.records.collect()) == sorted(want_records)
    assert batch.dead_letters is not None
    assert sorted((r["source_file"], r["line"]) for r in batch.dead_letters.collect()) == sorted(want_dead)
