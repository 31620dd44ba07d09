"""Spark Structured Streaming baseline of the big-state benchmark.

The same semantics as the ``bench_bigstate`` pipeline: the Parquet files of
``bigstate_bench.py`` are read one file per micro-batch
(``maxFilesPerTrigger=1``), deduplicated by ``event_id`` with
``dropDuplicates`` (no watermark: every event id is kept in state forever,
as barrierflow's ``deduplicate`` without a TTL; ``dropDuplicatesWithinWatermark``
would need a watermark and forget ids older than it), then
``count/sum/min/max(temperature)`` per ``sensor_id`` in update mode, and each
micro-batch's updated rows go to Parquet through ``foreachBatch`` (one
sub-directory per batch, ``batch_id=N``). State lives in the RocksDB state
store with changelog checkpointing on. ``trigger(availableNow=True)`` stops
the query once the directory is drained.

Batch time is each batch's ``triggerExecution`` from ``query.recentProgress``
(SparkSession start-up excluded). The result is checked without re-reading
the output: every batch's aggregate state operator must report as many
updated rows as the generator changed keys, and the final state row counts
(distinct keys, distinct event ids) must match the generator's.

CLI: ``python bench/sss_bigstate.py INPUT_DIR --work-dir W [--shuffle-partitions N]
[--driver-memory 1g] [--master M] [--java-options OPTS] [--json]``; run it in a fresh process
per measurement (``bigstate_bench.py`` does).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sss_baseline import SSS_JAVA_OPTIONS, _spark_session

__all__ = ["run_sss_bigstate", "EVENT_SCHEMA", "steady_median"]

EVENT_SCHEMA = "event_id STRING, sensor_id STRING, ts LONG, temperature DOUBLE"


def steady_median(durations: list[float]) -> float:
    """Median of the steady batches after the first steady one (batch 0 is the bulk load)."""
    steady = durations[2:] or durations[1:] or durations
    return statistics.median(steady) if steady else 0.0


def _state_figures(progress: Any) -> dict[str, dict[str, int]]:
    """Per state operator (by name) of one progress: total and updated rows, memory used."""
    figures = {}
    for op in progress.stateOperators:
        figures[op.operatorName] = {
            "rows_total": int(op.numRowsTotal),
            "rows_updated": int(op.numRowsUpdated),
            "memory_used_bytes": int(op.memoryUsedBytes),
        }
    return figures


def run_sss_bigstate(
    input_dir: str | Path,
    work_dir: str | Path,
    shuffle_partitions: int,
    driver_memory: str = "1g",
    java_options: str = SSS_JAVA_OPTIONS,
    master: str = "local[*]",
) -> dict[str, Any]:
    """Run the query once over ``input_dir`` with a fresh checkpoint/output under ``work_dir``.

    Returns per-batch seconds (``batch_s``), ``bulk_batch_s`` (batch 0),
    ``steady_batch_s`` (:func:`steady_median`), ``wall_s`` (query start to
    availableNow completion), ``events``, ``batches`` and per batch the
    state operators' figures (``state``), plus the settings used.
    """
    work = Path(work_dir)
    checkpoint, output = work / "checkpoint", work / "output"
    shutil.rmtree(checkpoint, ignore_errors=True)
    shutil.rmtree(output, ignore_errors=True)
    spark = _spark_session(java_options, driver_memory, master)
    spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        batch.write.mode("overwrite").parquet(str(output / f"batch_id={batch_id}"))

    totals = (
        spark.readStream.schema(EVENT_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(input_dir))
        .dropDuplicates(["event_id"])
        .groupBy("sensor_id")
        .agg(
            F.count("temperature").alias("count"),
            F.sum("temperature").alias("sum"),
            F.min("temperature").alias("min"),
            F.max("temperature").alias("max"),
        )
    )
    started = time.perf_counter()
    query = (
        totals.writeStream.outputMode("update")
        .trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(write_batch)
        .start()
    )
    query.awaitTermination()
    wall_s = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"streaming query failed: {query.exception()}")
    progress = sorted((p for p in query.recentProgress if p.numInputRows > 0), key=lambda p: p.batchId)
    durations = [p.durationMs["triggerExecution"] / 1000 for p in progress]
    result = {
        "shuffle_partitions": shuffle_partitions,
        "driver_memory": driver_memory,
        "master": master,
        "java_options": java_options,
        "events": sum(int(p.numInputRows) for p in progress),
        "rows_in": [int(p.numInputRows) for p in progress],
        "batch_ids": [int(p.batchId) for p in progress],
        "batches": len(progress),
        "batch_s": durations,
        "bulk_batch_s": durations[0] if durations else 0.0,
        "steady_batch_s": steady_median(durations),
        "wall_s": wall_s,
        "state": [_state_figures(p) for p in progress],
        "output": str(output),
    }
    spark.stop()
    return result


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input_dir", help="directory of events-NNNNNN.parquet files")
    parser.add_argument("--work-dir", required=True, help="checkpoint/output root (emptied)")
    parser.add_argument("--shuffle-partitions", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--master", default="local[*]", help="Spark master (local-cluster[N,cores,MB]: executors in their own JVMs)")
    parser.add_argument("--java-options", default=SSS_JAVA_OPTIONS, help="driver JVM options (default: SSS_JAVA_OPTIONS)")
    parser.add_argument("--json", action="store_true", help="print the result dict as JSON on the last line")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    result = run_sss_bigstate(args.input_dir, args.work_dir, args.shuffle_partitions, args.driver_memory, args.java_options, args.master)
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
