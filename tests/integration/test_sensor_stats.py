"""sensor_stats on real Spark and real Delta tables equals the reference."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Callable

import pytest

from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.core import settings
from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
from barrierflow.plan.registry import get_pipeline
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
    spark: Any,
    make_stream: Callable[..., Path],
    tmp_path: Path,
    warehouse: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    landing = make_stream(n_files=8, records_per_file=150, seed=11)
    # The varied run's warehouse is local or on S3, the fixed run's local: bit-identical either way.
    fixed, varied = tmp_path / "fixed", warehouse
    _coordinator(spark, landing, fixed, parallelism=2).run(until_caught_up=True)
    # The varied run also takes the paths of big epochs, big state and big
    # sinks: every epoch in parallel tasks (a task per input split, then a
    # task per key-group range), the upsert sink rewriting only the files
    # that hold a changed key, and one epoch without the Python workers'
    # cache of state files (at this size an epoch otherwise runs in one
    # task and the sink is rewritten whole).
    monkeypatch.setenv(settings.SINGLE_TASK_INPUT_BYTES.env, "0")
    monkeypatch.setattr(settings, "UPSERT_WHOLE_REWRITE_ROWS", -1)
    monkeypatch.setattr("barrierflow.connectors.delta_sink.UPSERT_WHOLE_REWRITE_ROWS", -1)
    with caplog.at_level(logging.INFO, logger="barrierflow.execution.runner"):
        _coordinator(spark, landing, varied, parallelism=1).run(epochs=1)
        monkeypatch.setenv(settings.WORKER_STATE_CACHE_MB.env, "0")
        _coordinator(spark, landing, varied, parallelism=7).run(epochs=1)
        monkeypatch.delenv(settings.WORKER_STATE_CACHE_MB.env)
        # Epoch 3's input (two files of ~15 KB) gets more key-group ranges than its parallelism.
        monkeypatch.setattr("barrierflow.core.settings.INPUT_BYTES_PER_PARTITION", 5_000)
        _coordinator(spark, landing, varied, parallelism=3).run(epochs=1)
        _coordinator(spark, landing, varied, parallelism=2).run(epochs=1)
    assert len(re.findall(r"epoch \d: \d+ stages in", caplog.text)) == 4, caplog.text
    assert re.search(r"epoch 3: stage 1 \([^)]*\): [4-9] task\(s\)", caplog.text), caplog.text
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


def test_a_line_parser_reads_many_small_byte_ranges_exactly_once(store_root: str) -> None:
    """Python tasks read, number and parse their own byte ranges (from a directory or an S3 prefix): the records and dead letters of a line-by-line reading."""
    from barrierflow.connectors import FileSource, RecordError
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
    source = FileSource("readings", landing, parser=parse_reading, parser_schema=READING_SCHEMA)
    end = source.plan(None, None)
    splits = source.splits(end, 0, 700)  # ~40 byte ranges
    assert len(splits) > 20
    read = [source.read(split, {}) for split in splits]
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
    assert sorted(e for records, _ in read for e in records["event_id"].to_pylist()) == sorted(want_records)
    assert sorted(
        (f, n) for _, dead in read for f, n in zip(dead["source_file"].to_pylist(), dead["line"].to_pylist())
    ) == sorted(want_dead)
