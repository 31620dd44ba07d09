"""Spark Structured Streaming baseline for the running-aggregate benchmark.

The query reads the generated JSON Lines files one file per micro-batch,
keeps ``count/sum/min/max(temperature)`` per ``sensor_id`` in the RocksDB
state store (changelog checkpointing on), and persists each micro-batch's
updated rows to Parquet through ``foreachBatch``; it runs with
``trigger(availableNow=True)`` so it stops once the directory is drained.

Timing excludes SparkSession (JVM) startup. Two figures are reported:

* ``events_per_s``: events / wall time of the query, ``start()`` to the
  availableNow completion (includes query start-up and gaps between batches);
* ``batch_events_per_s``: events / sum of per-batch ``triggerExecution``
  durations from ``query.recentProgress`` (the same basis as the engine's
  processing time: batches never overlap, so their sum is the time during
  which a batch was in progress).

CLI: ``python bench/sss_baseline.py INPUT_DIR [--work-dir W] [--shuffle-partitions N]
[--java-options OPTS] [--json]``. Without ``--shuffle-partitions`` every setting
runs, each in a fresh Python/JVM process, and the fastest is reported: shuffle
partitions at the core count and at 8, each with the JVM's defaults, with
:data:`SSS_JAVA_OPTIONS` and with the driver options barrierflow's own
sessions use (``barrierflow.execution.spark.driver_java_options()``), so the baseline
gets every JVM setting the engine gets and the one that suits it best.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.window import Window

from barrierflow.execution.spark import driver_java_options

# barrierflow's own driver options (its class archive included).
BARRIERFLOW_JAVA_OPTIONS = driver_java_options()
# The baselines' own: the throughput collector and the class archive, with both compilers.
# barrierflow's client compiler alone made Structured Streaming slower (sss_sensor_stats
# 7,276 against 9,910 ev/s on 2 cores, 2026-11-29): its plans stay the same from batch to
# batch, so what C2 compiles once keeps paying.
SSS_JAVA_OPTIONS = driver_java_options("-XX:+UseParallelGC")

__all__ = ["EVENT_SCHEMA", "compare_settings", "describe", "fastest", "run_sss", "run_sss_isolated", "shuffle_settings"]

EVENT_SCHEMA = "event_id STRING, sensor_id STRING, ts LONG, temperature DOUBLE"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
DRIVER_MEMORY = "4g"
WARMUP_BATCHES = 2
MAX_PROGRESS_UPDATES = 100_000
STDERR_TAIL_LINES = 40


def shuffle_settings() -> list[int]:
    """The shuffle-partition counts to try: the core count and 8 (deduplicated)."""
    return sorted({os.cpu_count() or 1, 8})


def java_settings() -> list[str]:
    """Driver JVM options to try: the JVM's defaults, the baselines' own and barrierflow's."""
    return list(dict.fromkeys(["", SSS_JAVA_OPTIONS, BARRIERFLOW_JAVA_OPTIONS]))


def _spark_session(java_options: str = "", driver_memory: str = DRIVER_MEMORY, master: str = "local[*]") -> SparkSession:
    """Get or create the session (``local[*]`` unless ``master`` says) with the RocksDB state store configured."""
    spark = (
        SparkSession.builder.master(master)
        .appName("barrierflow-bench-sss")
        .config("spark.driver.extraJavaOptions", java_options)
        .config("spark.driver.memory", driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.streaming.numRecentProgressUpdates", str(MAX_PROGRESS_UPDATES))
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _fresh_dir(path: Path) -> Path:
    """Delete ``path`` if it exists and return it (Spark creates it on demand)."""
    shutil.rmtree(path, ignore_errors=True)
    return path


def _start_query(spark: SparkSession, input_dir: str, checkpoint: Path, output: Path) -> StreamingQuery:
    """Start the availableNow running-aggregate query writing updated rows to Parquet."""

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        batch.withColumn("batch_id", F.lit(batch_id)).write.mode("append").parquet(str(output))

    aggregates = (
        spark.readStream.schema(EVENT_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(input_dir)
        .groupBy("sensor_id")
        .agg(
            F.count("temperature").alias("count"),
            F.sum("temperature").alias("sum"),
            F.min("temperature").alias("min"),
            F.max("temperature").alias("max"),
        )
    )
    return (
        aggregates.writeStream.outputMode("update")
        .trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(write_batch)
        .start()
    )


def _batch_durations(query: StreamingQuery) -> tuple[list[float], int]:
    """Per-batch ``triggerExecution`` seconds (batches with input) and total input rows."""
    progress = [p for p in query.recentProgress if p.numInputRows > 0]
    progress.sort(key=lambda p: p.batchId)
    return [p.durationMs["triggerExecution"] / 1000 for p in progress], sum(p.numInputRows for p in progress)


def steady_state(durations: list[float]) -> float:
    """Median duration after the warm-up batches (of all batches if there are too few)."""
    steady = durations[WARMUP_BATCHES:] or durations
    return statistics.median(steady) if steady else 0.0


def _verify(spark: SparkSession, input_dir: str, output: Path) -> dict[str, int]:
    """Compare the latest row per key in the Parquet output with the input."""
    latest = Window.partitionBy("sensor_id").orderBy(F.col("batch_id").desc())
    result = (
        spark.read.parquet(str(output))
        .withColumn("rank", F.row_number().over(latest))
        .where("rank = 1")
        .agg(F.count("*").alias("keys"), F.sum("count").alias("events"))
        .first()
    )
    distinct_keys = spark.read.schema(EVENT_SCHEMA).json(input_dir).select("sensor_id").distinct().count()
    return {"result_keys": result["keys"], "result_events": int(result["events"] or 0), "distinct_keys": distinct_keys}


def run_sss(input_dir: str | Path, work_dir: str | Path, shuffle_partitions: int, java_options: str = "") -> dict[str, Any]:
    """Run the baseline once over ``input_dir`` with fresh checkpoint/output dirs under ``work_dir``.

    Returns ``events_per_s``, ``wall_s``, ``steady_batch_s`` and ``batches`` plus
    ``batch_s`` (per-batch seconds), ``batch_sum_s``, ``batch_events_per_s``,
    ``events``, ``shuffle_partitions``, ``java_options`` and the verification counts
    ``result_keys``/``result_events``/``distinct_keys``/``verified``.
    """
    work = Path(work_dir)
    checkpoint = _fresh_dir(work / "checkpoint")
    output = _fresh_dir(work / "output")
    spark = _spark_session(java_options)
    spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
    started = time.perf_counter()
    query = _start_query(spark, str(input_dir), checkpoint, output)
    query.awaitTermination()
    wall_s = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"streaming query failed: {query.exception()}")
    durations, events = _batch_durations(query)
    checks = _verify(spark, str(input_dir), output)
    batch_sum_s = sum(durations)
    return {
        "shuffle_partitions": shuffle_partitions,
        "java_options": java_options,
        "events": events,
        "wall_s": wall_s,
        "events_per_s": events / wall_s,
        "batches": len(durations),
        "batch_s": durations,
        "batch_sum_s": batch_sum_s,
        "batch_events_per_s": events / batch_sum_s if batch_sum_s else 0.0,
        "steady_batch_s": steady_state(durations),
        **checks,
        "verified": checks["result_keys"] == checks["distinct_keys"] and checks["result_events"] == events,
    }


def run_sss_isolated(
    input_dir: str | Path, work_dir: str | Path, shuffle_partitions: int, java_options: str = ""
) -> dict[str, Any]:
    """:func:`run_sss` in a fresh Python/JVM process, so no run inherits another's warm JVM."""
    command = [
        sys.executable, str(Path(__file__).resolve()), str(input_dir),
        "--work-dir", str(work_dir), "--shuffle-partitions", str(shuffle_partitions),
        f"--java-options={java_options}", "--json",
    ]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        tail = "\n".join(completed.stderr.splitlines()[-STDERR_TAIL_LINES:])
        raise RuntimeError(
            f"SSS baseline (shuffle partitions {shuffle_partitions}, JVM options {java_options!r}) "
            f"exited {completed.returncode}:\n{tail}"
        )
    return json.loads(completed.stdout.strip().splitlines()[-1])


def settings() -> list[tuple[str, int, str]]:
    """Every setting tried: (sub-directory name, shuffle partitions, driver JVM options)."""
    return [(f"shuffle-{n}-jvm-{i}", n, options) for n in shuffle_settings() for i, options in enumerate(java_settings())]


def compare_settings(input_dir: str | Path, work_dir: str | Path) -> list[dict[str, Any]]:
    """Run every setting in isolation, each in its own sub-directory of ``work_dir``."""
    return [run_sss_isolated(input_dir, Path(work_dir) / name, n, options) for name, n, options in settings()]


def fastest(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The result with the highest throughput on the per-batch basis."""
    return max(results, key=lambda r: r["batch_events_per_s"])


def describe(result: dict[str, Any]) -> str:
    """One human-readable line of figures for a run."""
    check = "OK" if result["verified"] else "MISMATCH"
    return (
        f"SSS shuffle.partitions={result['shuffle_partitions']} JVM options {result['java_options'] or '(defaults)'}: "
        f"{result['events']:,} events in "
        f"{result['batches']} batches; query wall {result['wall_s']:.1f}s -> {result['events_per_s']:,.0f} ev/s; "
        f"sum of batches {result['batch_sum_s']:.1f}s -> {result['batch_events_per_s']:,.0f} ev/s; "
        f"steady batch {result['steady_batch_s']:.2f}s; "
        f"result keys {result['result_keys']:,} vs distinct input keys {result['distinct_keys']:,} [{check}]"
    )


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input_dir", help="directory of events-NNNNNN.jsonl files")
    parser.add_argument("--work-dir", help="checkpoint/output root (default: a temporary directory)")
    parser.add_argument("--shuffle-partitions", type=int, help="run only this setting, in this process")
    parser.add_argument("--java-options", default="", help="driver JVM options of that run (default: none)")
    parser.add_argument("--json", action="store_true", help="print the result dict as JSON on the last line")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-sss-") as scratch:
        work_dir = args.work_dir or scratch
        if args.shuffle_partitions is not None:
            results = [run_sss(args.input_dir, work_dir, args.shuffle_partitions, args.java_options)]
        else:
            results = compare_settings(args.input_dir, work_dir)
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results))
        return
    for result in results:
        print(describe(result))
    best = fastest(results)
    print(f"fastest: shuffle.partitions={best['shuffle_partitions']} JVM options {best['java_options'] or '(defaults)'}", end=" ")
    print(f"({best['batch_events_per_s']:,.0f} ev/s per-batch basis)")


if __name__ == "__main__":
    main()
