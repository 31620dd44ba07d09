"""A Spark-free stand-in for step 3, so the checkpoint protocol is tested in milliseconds.

The pipeline ``lines`` reads text files, deduplicates by line id and
appends every new line to the sink ``lines``. :func:`stub_compute` does
what the runtime's Spark computation does for it, in plain Python: read the
barrier's line ranges, wait for the restore point, stage the dedup state,
the source's offsets state, the sink rows and the (empty) dead letters
through the epoch context, and cross the same fault points. Everything
around it (barriers, the vote, the Delta commits, the checkpoint log,
recovery, fencing) is the real protocol.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa

from barrierflow.api.params import Param
from barrierflow.checkpointing.epoch import EpochContext
from barrierflow.connectors.delta_sink import DeltaSink
from barrierflow.connectors.file_source import FileSource
from barrierflow.core import faults
from barrierflow.core.columns import KEY_GROUP
from barrierflow.core.dead_letters import DEAD_LETTER_SCHEMA
from barrierflow.operators.operator_state import source_offsets_spec, source_offsets_table
from barrierflow.plan.pipeline import PipelineBuilder, PipelineDefinition
from barrierflow.state.snapshots import read_small_table
from barrierflow.storage.commits import TableKind

__all__ = ["LINES", "stub_compute", "epoch_tables", "LINE_SCHEMA"]

LINE_SCHEMA = pa.schema([pa.field("line_id", pa.string()), pa.field("text", pa.string())])


def _build(p: PipelineBuilder, params: dict[str, Any]) -> None:
    source = FileSource(
        "lines",
        params["landing_dir"],
        parser=lambda line: {"line_id": "", "text": line},
        parser_schema=LINE_SCHEMA,
        max_files_per_epoch=params["max_files_per_epoch"],
        suffixes=(".txt",),
        late_files=params["late_files"],
    )
    p.source(source).deduplicate("dedup", key="line_id").sink_to(DeltaSink.append("lines"))


LINES = PipelineDefinition(
    name="lines",
    build_fn=_build,
    params=(Param("landing_dir", str), Param("max_files_per_epoch", int, 1), Param("late_files", str, "next_epoch")),
    key_groups=8,
    parallelism_param=None,
)


def epoch_tables(definition: PipelineDefinition, params: dict[str, Any]) -> int:
    """Tables an epoch commits: each sink and side output, the dead letters, each state table."""
    pipe = definition.build(params)
    return len(pipe.sinks) + len(pipe.side_output_names()) + 1 + len(pipe.state_specs())


def stub_compute(ctx: EpochContext) -> int:
    """The epoch of ``lines``: every line of the barrier's ranges, once per line id."""
    source = ctx.pipeline.sources[0].source
    assert source is not None
    ranges = ctx.barrier.end_offsets[source.source_id]["files"]
    ids, texts = [], []
    for name, from_line, to_line, _ in ranges:
        lines = (Path(source.path) / name).read_text().splitlines()
        for number in range(from_line, len(lines) if to_line is None else to_line):
            ids.append(f"{name}:{number + 1}")
            texts.append(lines[number])
    faults.maybe_fail("process.after_read")
    ctx.started_on_state()  # as the runner: restored, then on state
    spec = next(s for s in ctx.pipeline.state_specs() if s.table_name == "dedup__seen")
    n = len(ids)
    # Line ids are unique in this input, so every line is new: the dedup state gains each id once.
    layout = ctx.layout
    ctx.stage(
        name=spec.table_name,
        uri=layout.state_table(spec.operator_id, spec.name),
        kind=TableKind.STATE,
        primary_key=tuple(spec.key_columns),
        data=pa.table(
            {
                "line_id": pa.array(ids, pa.string()),
                KEY_GROUP: pa.array([zlib.crc32(i.encode()) % ctx.key_groups for i in ids], pa.int32()),
                "first_epoch": pa.array([ctx.epoch] * n, pa.int64()),
                "_updated_at_ms": pa.array([ctx.processing_time_ms] * n, pa.int64()),
                "_deleted": pa.array([False] * n),
                "_epoch": pa.array([ctx.epoch] * n, pa.int64()),
            }
        )
        .select(spec.arrow_schema().names)
        .cast(spec.arrow_schema()),
    )
    sink = pa.table(
        {"line_id": ids, "text": texts, "_epoch": [ctx.epoch] * n},
        schema=LINE_SCHEMA.append(pa.field("_epoch", pa.int64(), nullable=False)),
    )
    ctx.stage(name="lines", uri=layout.sink_table("lines"), kind=TableKind.SINK, data=sink)
    ctx.stage(name="dead_letter", uri=layout.dead_letter, kind=TableKind.DEAD_LETTER, data=DEAD_LETTER_SCHEMA.empty_table())
    offsets = source_offsets_spec(source.source_id)
    uri = layout.state_table(source.source_id, offsets.name)
    rows = source_offsets_table(
        read_small_table(uri, offsets), source.source_id, ctx.barrier.start_offsets.get(source.source_id),
        ctx.barrier.end_offsets[source.source_id], ctx.pipeline.parallelism, ctx.epoch, ctx.processing_time_ms,
    )  # fmt: skip
    ctx.stage(name=offsets.table_name, uri=uri, kind=TableKind.STATE, primary_key=tuple(offsets.key_columns), data=rows)
    return n
