"""``bench_running_agg``: keyed running count/sum/min/max, for the benchmark.

The same shape as ``sensor_totals`` in ``sensor_stats`` without dedup or
windows; JSON is parsed natively by Spark against a schema, and every epoch's
changed keys are appended to ``totals_updates`` (like Structured Streaming's
update mode).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from barrierflow import Count, Max, Min, Sum
from barrierflow.api.params import Param
from barrierflow.connectors import DeltaSink, FileSource
from barrierflow.plan.pipeline import PipelineBuilder, pipeline

__all__ = ["bench_running_agg"]

EVENT_SCHEMA = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("sensor_id", pa.string(), nullable=False),
        pa.field("ts", pa.int64()),
        pa.field("temperature", pa.float64(), nullable=False),
    ]
)


@pipeline(
    "bench_running_agg",
    params=[
        Param("landing_dir", str, description="directory of *.jsonl event files"),
        Param("max_files_per_epoch", int, 1, minimum=1),
        Param("parallelism", int, 2, minimum=1),
    ],
    description=__doc__ or "",
)
def bench_running_agg(p: PipelineBuilder, params: dict[str, Any]) -> None:
    events = p.source(
        FileSource(
            "events",
            params["landing_dir"],
            format="jsonl",
            schema=EVENT_SCHEMA,
            max_files_per_epoch=params["max_files_per_epoch"],
        )
    )
    events.key_by("sensor_id").aggregate(
        "totals", Count(), Sum("temperature", "sum"), Min("temperature", "min"), Max("temperature", "max")
    ).sink_to(DeltaSink.append("totals_updates"))
