"""barrierflow.execution.runner: how many key-group range tasks an epoch gets from its planned input (connectors.source.planned_bytes),
and which first stage runs before the restore point (on a stub engine: the tasks run in this process)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pyarrow as pa
import pytest

import barrierflow as bf
from barrierflow.connectors.source import planned_bytes
from barrierflow.core.columns import SEQ
from barrierflow.core.errors import CheckpointError
from barrierflow.core.settings import INPUT_BYTES_PER_PARTITION, SINGLE_TASK_INPUT_BYTES
from barrierflow.execution import runner
from barrierflow.execution.runner import _reads_nothing_committed, epoch_parallelism
from barrierflow.execution.task import TaskInput, TaskPlan, TaskResult, run_task
from barrierflow.plan.pipeline import Pipeline, SourceNode
from barrierflow.plan.planner import PhysicalPlan, physical_plan
from barrierflow.storage import objects
from barrierflow.storage.layout import PipelineLayout
from barrierflow.storage.objects import join_uri

MIB = 1024 * 1024
EVENTS = pa.schema([("user", pa.string()), ("amount", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])


def test_planned_bytes_sums_the_file_ranges_of_every_file_source() -> None:
    offsets = {
        "readings": {"file": "b.jsonl", "line": 9, "files": [["a.jsonl", 0, None, 300], ["b.jsonl", 0, 9, 200]]},
        "other": {"file": None, "line": 0, "files": []},
        "table": {"from_version": 1, "version": 3},  # a Delta source: nothing to count
    }
    assert planned_bytes(offsets) == 500
    assert planned_bytes({}) == 0


def test_epoch_parallelism_grows_with_input_and_never_drops_below_the_pipelines() -> None:
    assert INPUT_BYTES_PER_PARTITION == 32 * MIB
    assert epoch_parallelism(2, 0) == 2
    assert epoch_parallelism(2, 64 * MIB) == 2
    assert epoch_parallelism(2, 64 * MIB + 1) == 3
    assert epoch_parallelism(2, 281 * MIB) == 9  # the 16M-key bulk load of the big-state benchmark
    assert epoch_parallelism(12, 281 * MIB) == 12


def _planned(body: Callable[[bf.PipelineBuilder], None]) -> tuple[Pipeline, PhysicalPlan]:
    @bf.pipeline("runner_test", key_groups=16)
    def definition(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
        body(p)

    pipe = definition.build({})
    sources = {
        i: n.source.record_schema().append(pa.field(SEQ, pa.int64()))
        for i, n in enumerate(pipe.nodes)
        if isinstance(n, SourceNode)
    }  # type: ignore[union-attr]
    return pipe, physical_plan(pipe, sources)


def _events(p: bf.PipelineBuilder, landing: str = "/nonexistent") -> bf.DataStream:
    return p.source(bf.FileSource("events", landing, schema=EVENTS))


def test_only_a_first_stage_of_sources_and_stateless_operators_runs_before_the_restore_point() -> None:
    totals = lambda s: s.key_by("user").aggregate("totals", bf.Count()).sink_to(bf.DeltaSink.append("out"))  # noqa: E731
    cases = {
        "source, filter, exchange": (lambda p: totals(_events(p).filter("amount > 0")), True),
        "one stage": (lambda p: _events(p).sink_to(bf.DeltaSink.append("out")), False),
        "a sink before the exchange": (lambda p: _raw_and_totals(_events(p), totals), False),
        "an assigner before the exchange": (lambda p: totals(_events(p).with_watermark("ts", timedelta(seconds=1))), False),
    }
    for what, (body, early) in cases.items():
        assert _reads_nothing_committed(*_planned(body)) is early, what


def _raw_and_totals(events: bf.DataStream, totals: Callable[[bf.DataStream], None]) -> None:
    events.sink_to(bf.DeltaSink.append("raw"))
    totals(events)


class _StubEpoch:
    """Epoch 2 of a pipeline on ``tmp_path``, driven as the coordinator does, whose restore point (epoch 1) failed."""

    def __init__(self, pipe: Pipeline, layout: PipelineLayout, calls: list[str]) -> None:
        (node,) = pipe.sources
        assert node.source is not None
        self.spark, self.layout, self.pipeline, self.epoch, self.processing_time_ms = None, layout, pipe, 2, 5_000
        self.barrier = SimpleNamespace(start_offsets={}, end_offsets={node.operator_id: node.source.plan(None, None)})
        self.staging_prefix = layout.staging_prefix("lineage", 2, "attempt")
        self.max_event_time_us = self.watermark_us = self.state_tables = None
        self.calls = calls

    def restore_point(self) -> Any:
        self.calls.append("restore point")
        staged = join_uri(self.layout.dead_letter, self.staging_prefix)
        assert [f.path for f in objects.walk(staged) if f.path.endswith(".parquet")], "stage 0 staged its dead letters by now"
        raise CheckpointError("epoch 2 stopped before its vote: epoch 1 failed")

    def started_on_state(self) -> None:
        raise AssertionError("started on state though epoch 1 failed")

    def stage_files(self, **table: Any) -> Any:
        raise AssertionError(f"registered {table['name']} though epoch 1 failed")

    def on_release(self, callback: Any) -> None:
        pass


def test_the_first_stage_runs_before_the_restore_point_and_its_dead_letters_go_when_the_epoch_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    lines = [json.dumps({"user": f"u{i % 7}", "amount": i, "ts": None}) for i in range(400)] + ["not json"]
    (landing / "001.jsonl").write_text("\n".join(lines) + "\n")
    monkeypatch.setenv(SINGLE_TASK_INPUT_BYTES.env, "0")  # the parallel placement, whatever the size
    pipe, _ = _planned(
        lambda p: _events(p, str(landing)).key_by("user").aggregate("totals", bf.Count()).sink_to(bf.DeltaSink.append("out"))
    )
    calls: list[str] = []

    def in_process(spark: Any, description: str, plan: TaskPlan, inputs: list[TaskInput]) -> list[TaskResult]:
        calls.append(description)  # no Spark: the stage's tasks run here, one after the other
        return [run_task(plan, task) for task in inputs]

    monkeypatch.setattr(runner, "_run_job", in_process)
    layout = PipelineLayout.of(str(tmp_path / "warehouse"), "runner_test")
    epoch = _StubEpoch(pipe, layout, calls)
    with pytest.raises(CheckpointError, match="epoch 1 failed"):
        runner.run_epoch(epoch)
    assert calls == ["epoch 2: stage 0 (events)", "restore point"]
    assert not [f.path for f in objects.walk(join_uri(layout.dead_letter, epoch.staging_prefix))]
