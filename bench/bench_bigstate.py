"""``bench_bigstate``: dedup by event id, then keyed running count/sum/min/max, for the big-state benchmark.

Input: Parquet files ``{event_id, sensor_id, ts, temperature}`` in
``landing_dir`` (written by ``bigstate_bench.py``). ``deduplicate`` keeps
every event id ever seen (no TTL, as Structured Streaming's
``dropDuplicates`` without a watermark); the running aggregate keeps one row
per key; every epoch's changed keys are appended to ``totals_updates`` (like
Structured Streaming's update mode). Loaded by the CLI as
``bench_bigstate:bench_bigstate`` with ``bench/`` on ``PYTHONPATH``.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from barrierflow import Count, Max, Min, Sum
from barrierflow.api.params import Param
from barrierflow.connectors import DeltaSink, FileSource
from barrierflow.plan.pipeline import PipelineBuilder, pipeline

__all__ = ["bench_bigstate", "PIPELINE_REF", "SINK", "EVENT_SCHEMA"]

PIPELINE_REF = "bench_bigstate:bench_bigstate"
SINK = "totals_updates"
# The generated files' columns; a Parquet source declares its records' schema.
EVENT_SCHEMA = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("sensor_id", pa.string(), nullable=False),
        pa.field("ts", pa.int64(), nullable=False),
        pa.field("temperature", pa.float64(), nullable=False),
    ]
)


@pipeline(
    "bench_bigstate",
    params=[
        Param("landing_dir", str, description="directory of *.parquet event files"),
        Param("max_files_per_epoch", int, 1, minimum=1),
        Param("parallelism", int, 2, minimum=1),
    ],
    description=__doc__ or "",
)
def bench_bigstate(p: PipelineBuilder, params: dict[str, Any]) -> None:
    events = p.source(
        FileSource(
            "events",
            params["landing_dir"],
            format="parquet",
            schema=EVENT_SCHEMA,
            max_files_per_epoch=params["max_files_per_epoch"],
        )
    )
    events.deduplicate("dedup", key="event_id").key_by("sensor_id").aggregate(
        "totals", Count(), Sum("temperature", "sum"), Min("temperature", "min"), Max("temperature", "max")
    ).sink_to(DeltaSink.append(SINK))
