"""Spark Structured Streaming baseline for the join part of ``orders_payments`` (``orders_payments_ratio``).

Only output 1 of barrierflow's ``orders_payments`` pipeline
(``include/barrierflow/demo/pipelines/orders_payments.py``), ``paid_orders``, in
the shape Structured Streaming offers, over the same ``orders/`` and
``payments/`` directories (``thresholds/`` is not read: nothing in the join
uses it). One query in one SparkSession (the RocksDB session with changelog
checkpointing of ``bench/sss_baseline.py``, ``spark.sql.shuffle.partitions`` =
core count), started in a fresh process by ``orders_payments_bench.py``:

1. each side is ``readStream.schema(S).json(dir)`` with S the pipeline's
   ``ORDER_SCHEMA`` / ``PAYMENT_SCHEMA`` (plus ``_corrupt_record``),
   ``maxFilesPerTrigger`` = 2 (barrierflow's ``max_files_per_epoch`` in the
   benchmark), files ``*.jsonl``;
2. malformed lines are dropped, approximating barrierflow's dead-letter rules
   for what the generator writes: a corrupt record, a null or empty key
   column (the pipeline's keys: ``order_id``, ``customer_id``, ``country``,
   plus ``payment_id`` for payments), a null ``ts`` or ``amount`` (Spark's JSON
   reader makes an unparseable time stamp or a string amount null). The
   dropped lines are not written anywhere (no dead-letter output);
3. ``dropDuplicates(order_id)`` / ``dropDuplicates(payment_id)`` *before*
   the watermark: unbounded dedup state, exactly barrierflow's (no TTL; the
   first record of an id wins). ``dropDuplicatesWithinWatermark`` would bound
   the state, but it forgets an id once the watermark passes its first
   time stamp + 60 s, and it filters late rows itself, so it would be a second
   late-data rule barrierflow does not have; the generator replays a previous
   file's lines (5 minutes of event time back), exactly the case where the two
   differ. Duplicates here are byte-identical lines, so which copy wins does
   not matter;
4. ``withWatermark("ts", "60 seconds")`` on each side (the pipeline's
   ``out_of_orderness_seconds``; Spark's global watermark is the minimum of
   the two, as barrierflow's);
5. the inner stream-stream interval join ``payments.order_id =
   orders.order_id AND payments.ts BETWEEN orders.ts AND orders.ts + interval
   15 minutes``, append mode, written to Parquet (``order_id``,
   ``customer_id``, ``country``, ``ordered_at``, ``order_amount``,
   ``payment_id``, ``paid_at``, ``paid_amount``: barrierflow's columns);
6. ``trigger(availableNow=True)``.

Known differences from barrierflow's join (measured by
``orders_payments_bench.py``):

* **Late rows.** barrierflow's epoch n treats a record with ``ts < W(n-1)``
  (the watermark at the start of the epoch) as late: a late payment goes to
  ``late_payments``, a late order is dropped. Spark's join is the second
  stateful operator of each input's chain (after the dedup), and drops a row
  only when ``ts <= `` the watermark of the batch *before* (W(n-2) in the same
  terms); it also evicts state only with W(n-1) after the batch. So Spark
  joins some rows barrierflow calls late; there is no side output for the rows
  Spark drops.
* **No dead letters, no other outputs**: only the pairs are produced.

Timing excludes SparkSession (JVM) start-up. ``processing_s`` is the sum of
the query's per-batch ``triggerExecution`` durations (no-data batches
included), computed as the union of the progress intervals like
``sss_sensor_stats.py``; ``events`` is the number of non-blank lines of
``orders/``, ``payments/`` *and* ``thresholds/`` (barrierflow's ``rows_in``
for the same files), although this query reads only the first two.

CLI: ``python bench/sss_orders_payments.py LANDING_DIR [--work-dir W] [--files-per-batch 2]
[--shuffle-partitions N] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from barrierflow.demo.pipelines.orders_payments import ORDER_SCHEMA, PAYMENT_SCHEMA
from sss_baseline import SSS_JAVA_OPTIONS, WARMUP_BATCHES, _fresh_dir, _spark_session
from sss_sensor_stats import _progress_intervals, union_seconds

__all__ = ["run_sss_orders_payments", "describe", "count_events", "spark_ddl", "SOURCES"]

SOURCES = ("orders", "payments", "thresholds")
OUT_OF_ORDERNESS = "60 seconds"
KEYS = {"orders": ("order_id", "customer_id", "country"), "payments": ("payment_id", "order_id", "customer_id", "country")}
_SPARK_TYPES = {pa.string(): "string", pa.float64(): "double"}


def spark_ddl(schema: pa.Schema) -> str:
    """A pyarrow schema of the pipeline as a Spark DDL string (strings, doubles, timestamps)."""
    columns = []
    for f in schema:
        kind = "timestamp" if pa.types.is_timestamp(f.type) else _SPARK_TYPES[f.type]
        columns.append(f"`{f.name}` {kind}")
    return ", ".join(columns)


def count_events(landing: Path) -> int:
    """Non-blank lines of every source's ``*.jsonl`` files (barrierflow's ``rows_in``)."""
    total = 0
    for source in SOURCES:
        for path in sorted((landing / source).glob("*.jsonl")):
            total += sum(1 for line in path.read_bytes().split(b"\n") if line.strip())
    return total


def _side(spark: SparkSession, landing: str, source: str, schema: pa.Schema, files_per_batch: int) -> DataFrame:
    """One source: parsed, malformed lines dropped, deduplicated by its id, then watermarked."""
    raw = (
        spark.readStream.schema(spark_ddl(schema) + ", _corrupt_record string")
        .option("maxFilesPerTrigger", files_per_batch)
        .option("pathGlobFilter", "*.jsonl")
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", "_corrupt_record")
        .json(f"{landing}/{source}")
    )
    good = F.col("_corrupt_record").isNull() & F.col("ts").isNotNull() & F.col("amount").isNotNull()
    for key in KEYS[source]:
        good = good & F.col(key).isNotNull() & (F.length(key) > 0)
    valid = raw.where(good).drop("_corrupt_record")
    return valid.dropDuplicates([KEYS[source][0]]).withWatermark("ts", OUT_OF_ORDERNESS)


def _join(orders: DataFrame, payments: DataFrame) -> DataFrame:
    o, p = orders.alias("o"), payments.alias("p")
    condition = (F.col("p.order_id") == F.col("o.order_id")) & F.col("p.ts").between(
        F.col("o.ts"), F.col("o.ts") + F.expr("interval 15 minutes")
    )
    return o.join(p, condition, "inner").select(
        F.col("o.order_id").alias("order_id"),
        F.col("o.customer_id").alias("customer_id"),
        F.col("o.country").alias("country"),
        F.col("o.ts").alias("ordered_at"),
        F.col("o.amount").alias("order_amount"),
        F.col("p.payment_id").alias("payment_id"),
        F.col("p.ts").alias("paid_at"),
        F.col("p.amount").alias("paid_amount"),
    )


def _batches(query: StreamingQuery) -> list[dict[str, Any]]:
    """Per progress report: batch id, seconds, input rows per source, watermark, state rows, output rows."""
    out = []
    for p in query.recentProgress:
        duration = (p.durationMs or {}).get("triggerExecution")
        if duration is None:
            continue
        out.append(
            {
                "batch_id": p.batchId,
                "s": duration / 1000,
                "rows": p.numInputRows,
                "source_rows": [s.numInputRows for s in p.sources],
                "watermark": (p.eventTime or {}).get("watermark"),
                "state_rows": sum(op.numRowsTotal for op in p.stateOperators),
                # The file sink reports -1.
                "output_rows": p.sink.numOutputRows if p.sink is not None and p.sink.numOutputRows >= 0 else None,
            }
        )
    return out


def run_sss_orders_payments(
    landing_dir: str | Path,
    work_dir: str | Path,
    files_per_batch: int = 2,
    shuffle_partitions: int | None = None,
    java_options: str = SSS_JAVA_OPTIONS,
) -> dict[str, Any]:
    """Run the join query once over ``landing_dir`` with a fresh checkpoint/output under ``work_dir``; its figures."""
    landing = Path(landing_dir).resolve()
    work = Path(work_dir).resolve()
    partitions = shuffle_partitions or os.cpu_count() or 1
    spark = _spark_session(java_options)
    for key, value in {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    }.items():
        spark.conf.set(key, value)
    orders = _side(spark, str(landing), "orders", ORDER_SCHEMA, files_per_batch)
    payments = _side(spark, str(landing), "payments", PAYMENT_SCHEMA, files_per_batch)
    output = _fresh_dir(work / "output" / "paid_orders")
    started = time.perf_counter()
    query = (
        _join(orders, payments)
        .writeStream.format("parquet")
        .outputMode("append")
        .trigger(availableNow=True)
        .option("path", str(output))
        .option("checkpointLocation", str(_fresh_dir(work / "checkpoint" / "paid_orders")))
        .queryName("paid_orders")
        .start()
    )
    query.awaitTermination()
    wall_s = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"streaming query paid_orders failed: {query.exception()}")
    intervals = _progress_intervals(query)
    processing_s = union_seconds([(e["start"], e["end"]) for e in intervals])
    batches = _batches(query)
    data_s = [b["s"] for b in batches if b["rows"] > 0]
    steady = data_s[WARMUP_BATCHES:] or data_s
    events = count_events(landing)
    pairs = spark.read.parquet(str(output)).count()
    return {
        "events": events,
        "input_rows": sum(b["rows"] for b in batches),
        "files_per_batch": files_per_batch,
        "shuffle_partitions": partitions,
        "java_options": java_options,
        "batches": len(data_s),
        "no_data_batches": len(batches) - len(data_s),
        "batch": batches,
        "wall_s": wall_s,
        "events_per_s": events / wall_s,
        "processing_s": processing_s,
        "batch_events_per_s": events / processing_s if processing_s else 0.0,
        "steady_batch_s": statistics.median(steady) if steady else 0.0,
        "pairs": pairs,
        "output": str(output),
        "work_dir": str(work),
    }


def describe(result: dict[str, Any]) -> str:
    """Human-readable lines: the totals, then one per batch."""
    lines = [
        f"SSS orders_payments join (1 query, {result['files_per_batch']} files/batch per source, "
        f"shuffle.partitions={result['shuffle_partitions']}, JVM options {result['java_options'] or '(defaults)'}): "
        f"{result['events']:,} events (non-blank lines of orders+payments+thresholds; {result['input_rows']:,} rows read "
        f"from orders+payments) in {result['batches']} batches (+{result['no_data_batches']} no-data); processing time "
        f"(sum of batches) {result['processing_s']:.1f}s -> {result['batch_events_per_s']:,.0f} ev/s; wall "
        f"{result['wall_s']:.1f}s -> {result['events_per_s']:,.0f} ev/s; steady batch {result['steady_batch_s']:.2f}s; "
        f"{result['pairs']:,} pairs"
    ]
    for b in result["batch"]:
        out = "" if b["output_rows"] is None else f"out {b['output_rows']}, "
        lines.append(
            f"  batch {b['batch_id']}: {b['s']:.2f}s, rows in {'+'.join(str(n) for n in b['source_rows'])}, "
            f"{out}state rows {b['state_rows']:,}, watermark {b['watermark']}"
        )
    return "\n".join(lines)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("landing_dir", help="directory with orders/ and payments/ of *.jsonl files")
    parser.add_argument("--work-dir", help="checkpoint/output root (default: a temporary directory)")
    parser.add_argument("--files-per-batch", type=int, default=2, help="maxFilesPerTrigger per source (default 2)")
    parser.add_argument("--shuffle-partitions", type=int, help="default: the core count")
    parser.add_argument("--json", action="store_true", help="print the result dict as JSON on the last line")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-sss-orders-") as scratch:
        result = run_sss_orders_payments(args.landing_dir, args.work_dir or scratch, args.files_per_batch, args.shuffle_partitions)
    print(describe(result), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
