"""Spark Structured Streaming baseline for the ``sensor_stats`` benchmark (``sensor_stats_ratio``).

The same semantics as barrierflow's ``sensor_stats`` pipeline
(``include/barrierflow/demo/pipelines/sensor_stats.py``) over the same landing
directory of JSON Lines files, in the shape Structured Streaming offers: one
SparkSession, one streaming query per output, every query built on the same
file-source definition (``format("text")`` with ``wholetext``,
``maxFilesPerTrigger`` = 2 by default, ``trigger(availableNow=True)``),
RocksDB state store with changelog checkpointing (the session of
``bench/sss_baseline.py``), ``spark.sql.shuffle.partitions`` = core count:

* ``dead_letters``: lines failing native validation, appended to Parquet;
* ``sensor_totals``: ``dropDuplicates(event_id)`` then count/sum/min/max of
  ``temperature`` per ``sensor_id`` (update mode); each batch's updated rows
  are appended to Parquet through ``foreachBatch`` with their ``batch_id``;
* ``sensor_minute``: ``dropDuplicates(event_id)``, ``withWatermark(ts, 30 s)``,
  one-minute tumbling windows per sensor with count, ``avg`` and the exact
  nearest-rank p75/p99 (``array_sort(collect_list)`` + ``element_at`` at
  position ceil(q x n), computed in integers as barrierflow does), append mode
  to Parquet;
* ``late_readings``: ``dropDuplicates(event_id)``, ``withWatermark(ts, 30 s)``,
  ``applyInPandasWithState`` per sensor emitting the readings whose window had
  ended by the batch's watermark (``GroupState.getCurrentWatermarkMs``: a
  query sees the watermark row by row nowhere else); append mode to Parquet;
* ``alerts``: ``dropDuplicates(event_id)`` then ``applyInPandasWithState``
  per sensor keeping the last two temperatures (alert on a reading strictly
  above the previous one, itself above the one before); append mode to Parquet.

Validation is native: each file is read whole and split on ``\\n`` (lines
numbered 1-based, blank lines counted, a trailing ``\\r`` dropped, blank lines
``(?U)^\\s*$`` skipped, invalid UTF-8 judged on the file's bytes then on the
line's U+FFFD, all as barrierflow's ordered read does); ``from_json`` takes the
four fields as VARIANT (a ``string`` field would take the number 12345 as
"12345"), ``schema_of_variant`` checks their JSON types, ``ts`` is a JSON
integer of epoch milliseconds or an ISO-8601 string with an offset (regex,
then ``try_cast``), within datetime's years 1-9999, and ``temperature`` a
finite JSON number, not a boolean.

Every semantic difference from the barrierflow pipeline known to us (the
differences in outputs are measured by ``bench/sensor_stats_bench.py``):

1. **Which duplicate survives.** barrierflow keeps the first record of an
   ``event_id`` in arrival order (file name, then line). Streaming
   ``dropDuplicates`` keeps the first row its task sees: across batches that is
   the earlier batch, as in barrierflow, and within one file the earlier line,
   but the files of one batch come in Spark's scan order, which sorts files by
   size (largest first), not by name. So with two files per batch, when the
   second file repeats an id first seen in the first file of the same batch,
   Spark may keep the later record (the generator gives such a duplicate a
   different sensor, time and temperature). Totals, windows, late readings and
   alerts of the records involved then differ (on a 4 x 20,000-line stream: 663
   such ids, per-sensor counts off by a few, 703 of ~19,200 alerts). With one
   file per batch this cannot happen, and the outputs then agree as described
   in 3 and 7.
2. **Deduplication state is unbounded, as in barrierflow.** The dedup key is
   ``event_id`` alone (not the event-time column), so Spark never evicts it.
   ``dropDuplicatesWithinWatermark`` would bound the state but forget an id
   30 s of event time after it was seen; the generator replays ids from up to
   three files back (hours of event time), which would then pass. There is one
   dedup state per query that needs deduplicated records (four copies): one
   query per output.
3. **Late readings and windows.** barrierflow's epoch n sends a reading to
   ``late_readings``, and not to its window, when the window ended by W(n-1),
   the watermark at the start of the epoch (max event time of the epochs before
   n - 30 s). ``late_readings`` here applies the same rule with the batch's
   watermark (Spark's watermark for batch n is W(n-1) in that sense, to the
   millisecond; window ends are whole milliseconds, so the comparison is the
   same): the late readings agree exactly. But Spark's window aggregation,
   the second stateful operator of its query, drops a row only when its window
   ended by the watermark of the batch before, W(n-2), and otherwise counts it:
   measured on a 4 x 20,000-line stream at one file per batch, of 888
   barrierflow-late readings Spark's windows counted 832 (32 windows exist only
   in Spark) and dropped 56, exactly those with window end <= W(n-2). So a
   reading can be both in ``late_readings`` and in a window, and such windows
   differ in count, avg and percentiles. Spark has no side output for the rows
   an aggregation drops.
4. **When windows fire.** barrierflow fires a window at the end of the epoch
   whose watermark W(n) passes its end; Spark emits it in the batch after the
   one whose data advanced the watermark (the last ones in the no-data batch
   that availableNow runs at the end). The set of fired windows at the end is
   the same; the batch that emits each one differs.
5. **Watermark input.** Both take the max event time of the deduplicated
   records (``withWatermark`` comes after ``dropDuplicates``); where 1 applies,
   the record that sets a batch's maximum can differ.
6. **Order inside a key.** barrierflow's keyed process function sees a
   sensor's records in arrival order. ``applyInPandasWithState`` gets a
   group's rows in no defined order; the function sorts them by (file name,
   line), so the order is the same.
7. **Numbers.** barrierflow adds each epoch's exactly rounded sum to the stored
   double and folds a window's ``avg`` in arrival order; Spark sums doubles in
   partition order, so sums and averages may differ in the last bits (checked
   to 1e-12 relative). JSON ``-0.0`` reads as 0.0 here (the VARIANT keeps it as
   a decimal), as -0.0 in barrierflow.
8. **Validation edge cases the generator never writes** (its 22 malformed
   kinds and valid records are classified identically, line for line):
   ``from_json`` ignores text after the first JSON value (``{..} xyz`` is a
   record here, a dead letter in barrierflow); ISO timestamps must match
   ``YYYY-MM-DD[T ]hh:mm:ss[.f+](Z|+hh[[:]mm])``, whereas Python's
   ``datetime.fromisoformat`` also takes ``hh:mm`` without seconds, basic
   format (``20231114T221320Z``), week dates, a comma as decimal mark and
   offsets with seconds. Duplicate keys (the last wins) and ``NaN``/``Infinity``
   tokens behave as in Python's ``json``. Dead-letter ``reason`` texts differ
   from barrierflow's.
9. **Running totals are a changelog.** barrierflow's ``sensor_totals`` is an
   upsert table (one current row per sensor); here each batch appends its
   updated rows, and the current value is the row with the highest ``batch_id``.
10. **Input order and batching.** Spark's file source takes files by
    modification time, barrierflow by name; the generator writes them in name
    order, so both take the same files per batch/epoch. Both ignore names
    starting with ``_`` or ``.``. barrierflow reads files above 256 MB in
    byte-range chunks; here every file is one JVM string (under 2 GB).
11. **Output order and layout.** Row order within an output is not defined on
    either side; barrierflow's sinks are Delta tables with an ``_epoch``
    column, these are Parquet directories.
12. **Atomicity.** The file sinks and checkpoints make each query's output
    exactly-once, but the five queries are independent (each has its own
    checkpoint and progresses on its own), whereas one barrierflow epoch
    commits all outputs and the state together.

Timing excludes SparkSession (JVM) start-up, as ``bench/sss_baseline.py``
does. The queries run concurrently (``--sequential`` runs one after the
other; measured slower), so per-batch ``triggerExecution`` durations overlap:
``processing_s`` is the time during which at least one batch of any query was
in progress (the union of the intervals ``timestamp .. timestamp +
triggerExecution`` of every progress report, no-data batches included since
they fire windows), which for one query is the sum of its batches, and is the
basis of barrierflow's processing time too (its concurrent epochs overlap).
``batch_sum_s`` (the plain sum) and the queries' wall time are reported too.
``batch_events_per_s`` = events / ``processing_s``, where ``events`` counts
non-blank lines (records plus dead letters), as barrierflow's ``rows_in``.
``steady_batch_s`` is the median, after the first two, of a batch's span
across the queries (first start to last end; in sequential mode the sum).

CLI: ``python bench/sss_sensor_stats.py LANDING_DIR [--work-dir W] [--files-per-batch 2]
[--shuffle-partitions N] [--java-options OPTS] [--sequential] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterator

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from sss_baseline import SSS_JAVA_OPTIONS, WARMUP_BATCHES, _fresh_dir, _spark_session

__all__ = ["OUTPUTS", "run_sss_sensor_stats", "describe"]

OUTPUTS = ("dead_letters", "sensor_totals", "sensor_minute", "late_readings", "alerts")
WINDOW_US = 60 * 1_000_000
OUT_OF_ORDERNESS = "30 seconds"
PERCENTILES = (("p75", 0.75), ("p99", 0.99))
# datetime's range (what barrierflow's parser accepts), in UTC.
MIN_TS_MS = -62_135_596_800_000  # 0001-01-01T00:00:00Z
MAX_TS_US = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999Z
MAX_TS_MS = MAX_TS_US // 1000
ISO_TS = r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}(:?\d{2})?)$"
BLANK = r"(?U)^\s*$"


# -- the source and its native validation ------------------------------------------


def _lines(spark: SparkSession, landing_dir: str, files_per_batch: int) -> DataFrame:
    """Every non-blank line: file base name, 1-based line number, text, UTF-8 validity.

    Each file is read whole (``wholetext``) and split on ``\\n`` natively, as
    barrierflow's ordered read does, which numbers lines exactly (blank lines
    counted). Splitting decodes the text (invalid bytes become U+FFFD), so
    validity is judged on the file's bytes first, as barrierflow does.
    """
    files = (
        spark.readStream.format("text")
        .option("wholetext", True)
        .option("maxFilesPerTrigger", files_per_batch)
        .option("pathGlobFilter", "*.jsonl")
        .load(landing_dir)
    )
    # One trailing newline ends the last line; it does not start another.
    split = F.split(F.regexp_replace(F.col("value"), "\\n\\z", ""), "\n", -1)
    exploded = files.select(
        F.col("_metadata.file_name").alias("source_file"),
        F.is_valid_utf8(F.col("value")).alias("_file_ok"),
        F.posexplode(split).alias("_pos", "_raw"),
    )
    lines = exploded.select(
        "source_file",
        (F.col("_pos") + 1).cast("long").alias("line"),
        F.regexp_replace(F.col("_raw"), "\r\\z", "").alias("raw"),
        (F.col("_file_ok") | ~F.col("_raw").contains("\ufffd")).alias("_utf8"),
    )
    return lines.where(~F.regexp_like(F.col("raw"), F.lit(BLANK)))


def _is_type(type_name: Column, *names: str) -> Column:
    return F.coalesce(type_name.isin(*names), F.lit(False))


# The four fields as VARIANT: their JSON types stay visible (a StringType field
# would take 12345 as "12345"); other fields are skipped unparsed.
FIELDS_SCHEMA = "event_id variant, sensor_id variant, ts variant, temperature variant"
# Python's json rejects single quotes and accepts NaN/Infinity tokens.
JSON_OPTIONS = {"mode": "PERMISSIVE", "allowSingleQuotes": "false", "allowNonNumericNumbers": "true"}


def _validated(lines: DataFrame) -> DataFrame:
    """Lines with the parsed fields and ``reason`` (null for a good record).

    In stages, so that Spark keeps each costly expression (the time stamp
    parse above all) in one place instead of inlining it into every use.
    """
    parsed = lines.select(
        "source_file",
        "line",
        "raw",
        "_utf8",
        F.when(F.col("_utf8"), F.from_json(F.col("raw"), FIELDS_SCHEMA, JSON_OPTIONS)).alias("_j"),
    )

    def field(name: str) -> Column:
        return F.col(f"_j.{name}")

    # Text that is not JSON, or JSON that is not an object, has no fields: such
    # a line fails the event_id check.
    typed = parsed.select(
        "source_file",
        "line",
        "raw",
        "_utf8",
        F.schema_of_variant(field("event_id")).alias("_event_id_t"),
        F.try_variant_get(field("event_id"), "$", "string").alias("event_id"),
        F.schema_of_variant(field("sensor_id")).alias("_sensor_id_t"),
        F.try_variant_get(field("sensor_id"), "$", "string").alias("sensor_id"),
        F.schema_of_variant(field("ts")).alias("_ts_t"),
        F.try_variant_get(field("ts"), "$", "string").alias("_ts_s"),
        F.try_variant_get(field("ts"), "$", "bigint").alias("_ts_l"),
        F.schema_of_variant(field("temperature")).alias("_temp_t"),
        F.try_variant_get(field("temperature"), "$", "double").alias("temperature"),
    )
    ts_t, ts_ms = F.col("_ts_t"), F.col("_ts_l")
    from_millis = F.when(_is_type(ts_t, "BIGINT") & ts_ms.between(MIN_TS_MS, MAX_TS_MS), F.timestamp_millis(ts_ms))
    iso = _is_type(ts_t, "STRING") & F.coalesce(F.regexp_like(F.col("_ts_s"), F.lit(ISO_TS)), F.lit(False))
    from_iso = F.when(iso, F.col("_ts_s").try_cast("timestamp"))
    timed = typed.select("*", F.coalesce(from_millis, from_iso).alias("ts"))
    ts = F.when(F.unix_micros(F.col("ts")).between(MIN_TS_MS * 1000, MAX_TS_US), F.col("ts"))
    ranged = timed.select(*[c for c in timed.columns if c != "ts"], ts.alias("ts"))
    temp_t = F.col("_temp_t")
    numeric = _is_type(temp_t, "BIGINT", "DOUBLE") | F.coalesce(temp_t.startswith("DECIMAL"), F.lit(False))
    temp = F.col("temperature")
    finite = temp.isNotNull() & ~F.isnan(temp) & (F.abs(temp) < F.lit(float("inf")))

    def non_empty_string(name: str) -> Column:
        return _is_type(F.col(f"_{name}_t"), "STRING") & (F.length(F.col(name)) > 0)

    reason = (
        F.when(~F.col("_utf8"), F.lit("not valid UTF-8 (shown with U+FFFD replacements)"))
        .when(~non_empty_string("event_id"), F.lit("not a JSON object with event_id a non-empty string"))
        .when(~non_empty_string("sensor_id"), F.lit("sensor_id must be a non-empty string"))
        .when(ts_t.isNull(), F.lit("ts is missing"))
        .when(F.col("ts").isNull(), F.lit("ts must be an ISO-8601 string with a UTC offset or integer epoch milliseconds in range"))
        .when(~numeric, F.lit("temperature must be a JSON number"))
        .when(~finite, F.lit("temperature must be finite"))
    )
    return ranged.select("source_file", "line", "raw", "event_id", "sensor_id", "ts", "temperature", reason.alias("reason"))


# -- the outputs -----------------------------------------------------------------------


def _nearest_rank(values: Column, count: Column, q: float) -> Column:
    """Nearest-rank percentile: sorted ascending, 1-based position ceil(q x n), in integers."""
    frac = Fraction(q).limit_denominator(1_000_000)
    pos = F.floor((F.lit(frac.numerator) * count + F.lit(frac.denominator - 1)) / F.lit(frac.denominator))
    return F.element_at(F.array_sort(values), pos.cast("int"))


def _rising_alerts(key: tuple[Any, ...], frames: Iterator[Any], state: GroupState) -> Iterator[Any]:
    """RisingTemperatureAlert over one sensor's rows of the batch, in arrival order."""
    import numpy as np
    import pandas as pd

    chunks = [pdf for pdf in frames if len(pdf)]
    if not chunks:
        return
    pdf = pd.concat(chunks, ignore_index=True) if len(chunks) > 1 else chunks[0]
    pdf = pdf.sort_values(["source_file", "line"], kind="stable")
    temps = pdf["temperature"].to_numpy(dtype="float64")
    n, older, newer = state.get if state.exists else (0, float("nan"), float("nan"))
    previous = [older, newer][2 - n :] if n else []
    seq = np.concatenate([np.asarray(previous, dtype="float64"), temps])
    k = len(previous)
    positions = np.arange(k, len(seq))
    one_back = np.where(positions >= 1, seq[np.maximum(positions - 1, 0)], np.nan)
    two_back = np.where(positions >= 2, seq[np.maximum(positions - 2, 0)], np.nan)
    rising = (positions >= 2) & (temps > one_back) & (one_back > two_back)
    tail = seq[-2:]
    state.update((len(tail), float(tail[0]) if len(tail) == 2 else float("nan"), float(tail[-1])))
    if rising.any():
        yield pdf.loc[rising, ["sensor_id", "event_id", "ts_us", "temperature"]]


def _late_readings(key: tuple[Any, ...], frames: Iterator[Any], state: GroupState) -> Iterator[Any]:
    """The rows whose one-minute window ended at or before the batch's watermark."""
    watermark_us = state.getCurrentWatermarkMs() * 1000
    for pdf in frames:
        if not len(pdf):
            continue
        ts_us = pdf["ts_us"]
        window_end = ts_us - ts_us % WINDOW_US + WINDOW_US  # floor modulo, as barrierflow's pmod
        late = window_end <= watermark_us
        if late.any():
            yield pdf.loc[late, ["event_id", "sensor_id", "ts_us", "temperature"]]


def _queries(records: DataFrame, dead: DataFrame, work: Path) -> dict[str, Any]:
    """Start functions of the five queries (each returns a started StreamingQuery)."""
    out, ckpt = work / "output", work / "checkpoint"

    def deduplicated() -> DataFrame:
        return records.dropDuplicates(["event_id"])

    def file_sink(df: DataFrame, name: str) -> StreamingQuery:
        return (
            df.writeStream.format("parquet")
            .outputMode("append")
            .trigger(availableNow=True)
            .option("path", str(_fresh_dir(out / name)))
            .option("checkpointLocation", str(_fresh_dir(ckpt / name)))
            .queryName(name)
            .start()
        )

    def dead_letters() -> StreamingQuery:
        return file_sink(dead, "dead_letters")

    def sensor_totals() -> StreamingQuery:
        totals = deduplicated().groupBy("sensor_id").agg(
            F.count(F.lit(1)).alias("count"),
            F.sum("temperature").alias("sum"),
            F.min("temperature").alias("min"),
            F.max("temperature").alias("max"),
        )
        path = str(_fresh_dir(out / "sensor_totals"))

        def write_batch(batch: DataFrame, batch_id: int) -> None:
            batch.withColumn("batch_id", F.lit(batch_id)).write.mode("append").parquet(path)

        return (
            totals.writeStream.outputMode("update")
            .trigger(availableNow=True)
            .option("checkpointLocation", str(_fresh_dir(ckpt / "sensor_totals")))
            .queryName("sensor_totals")
            .foreachBatch(write_batch)
            .start()
        )

    def sensor_minute() -> StreamingQuery:
        windows = (
            deduplicated()
            .withWatermark("ts", OUT_OF_ORDERNESS)
            .groupBy("sensor_id", F.window("ts", "1 minute"))
            .agg(
                F.count(F.lit(1)).alias("count"),
                F.avg("temperature").alias("avg"),
                F.collect_list("temperature").alias("_values"),
            )
        )
        result = windows.select(
            "sensor_id",
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "count",
            "avg",
            *[_nearest_rank(F.col("_values"), F.col("count"), q).alias(name) for name, q in PERCENTILES],
        )
        return file_sink(result, "sensor_minute")

    def late_readings() -> StreamingQuery:
        late = (
            deduplicated()
            .withWatermark("ts", OUT_OF_ORDERNESS)
            .select("event_id", "sensor_id", "ts", F.unix_micros("ts").alias("ts_us"), "temperature")
            .groupBy("sensor_id")
            .applyInPandasWithState(
                _late_readings,
                outputStructType="event_id string, sensor_id string, ts_us long, temperature double",
                stateStructType="unused int",
                outputMode="append",
                timeoutConf=GroupStateTimeout.NoTimeout,
            )
            .select("event_id", "sensor_id", F.timestamp_micros("ts_us").alias("ts"), "temperature")
        )
        return file_sink(late, "late_readings")

    def alerts() -> StreamingQuery:
        rising = (
            deduplicated()
            .select("sensor_id", "event_id", F.unix_micros("ts").alias("ts_us"), "temperature", "source_file", "line")
            .groupBy("sensor_id")
            .applyInPandasWithState(
                _rising_alerts,
                outputStructType="sensor_id string, event_id string, ts_us long, temperature double",
                stateStructType="n int, older double, newer double",
                outputMode="append",
                timeoutConf=GroupStateTimeout.NoTimeout,
            )
            .select("sensor_id", "event_id", F.timestamp_micros("ts_us").alias("ts"), "temperature")
        )
        return file_sink(rising, "alerts")

    return {
        "dead_letters": dead_letters,
        "sensor_totals": sensor_totals,
        "sensor_minute": sensor_minute,
        "late_readings": late_readings,
        "alerts": alerts,
    }


# -- timing and results ------------------------------------------------------------------


def _progress_intervals(query: StreamingQuery) -> list[dict[str, Any]]:
    """One entry per progress report: batch id, start/end seconds, input rows, duration."""
    entries = []
    for p in query.recentProgress:
        duration = (p.durationMs or {}).get("triggerExecution")
        if duration is None:
            continue
        start = datetime.fromisoformat(p.timestamp.replace("Z", "+00:00")).timestamp()
        entries.append(
            {"batch_id": p.batchId, "start": start, "end": start + duration / 1000, "rows": p.numInputRows, "s": duration / 1000}
        )
    return sorted(entries, key=lambda e: e["start"])


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Time covered by at least one interval."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _count_rows(spark: SparkSession, work: Path) -> dict[str, int]:
    """Rows in each output (sensor_totals: keys of the latest rows, plus its changelog rows)."""
    out = work / "output"
    counts = {}
    for name in OUTPUTS:
        df = spark.read.parquet(str(out / name))
        if name == "sensor_totals":
            counts["sensor_totals_changelog"] = df.count()
            counts[name] = df.select("sensor_id").distinct().count()
        else:
            counts[name] = df.count()
    return counts


def _events(spark: SparkSession, landing_dir: str) -> tuple[int, int]:
    """(non-blank lines, all lines) of the landing files: barrierflow's ``rows_in`` and Spark's input rows."""
    files = spark.read.option("wholetext", True).option("pathGlobFilter", "*.jsonl").text(landing_dir)
    lines = files.select(F.explode(F.split(F.regexp_replace(F.col("value"), "\\n\\z", ""), "\n", -1)).alias("raw"))
    row = lines.select(
        F.count_if(~F.regexp_like(F.regexp_replace("raw", "\r\\z", ""), F.lit(BLANK))).alias("events"),
        F.count(F.lit(1)).alias("lines"),
    ).first()
    return int(row["events"]), int(row["lines"])


def run_sss_sensor_stats(
    landing_dir: str | Path,
    work_dir: str | Path,
    files_per_batch: int = 2,
    shuffle_partitions: int | None = None,
    java_options: str = SSS_JAVA_OPTIONS,
    sequential: bool = False,
) -> dict[str, Any]:
    """Run the five queries once over ``landing_dir`` with fresh checkpoints/outputs under ``work_dir``.

    Concurrently by default (all started, then awaited); ``sequential`` runs
    one query after the other instead. Returns the figures (see the module
    docstring) and the rows of each output.
    """
    landing = str(Path(landing_dir).resolve())
    work = Path(work_dir).resolve()
    partitions = shuffle_partitions or os.cpu_count() or 1
    # Python workers (applyInPandasWithState) run this interpreter, as barrierflow's do.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = _spark_session(java_options)
    for key, value in {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    }.items():
        spark.conf.set(key, value)
    validated = _validated(_lines(spark, landing, files_per_batch))
    records = validated.where(F.col("reason").isNull()).select(
        "event_id", "sensor_id", "ts", "temperature", "source_file", "line"
    )
    dead = validated.where(F.col("reason").isNotNull()).select("source_file", "line", "raw", "reason")
    starters = _queries(records, dead, work)
    started = time.perf_counter()
    queries: dict[str, StreamingQuery] = {}
    if sequential:
        for name in OUTPUTS:
            queries[name] = starters[name]()
            queries[name].awaitTermination()
    else:
        for name in OUTPUTS:
            queries[name] = starters[name]()
        for query in queries.values():
            query.awaitTermination()
    wall_s = time.perf_counter() - started
    for name, query in queries.items():
        if query.exception() is not None:
            raise RuntimeError(f"streaming query {name} failed: {query.exception()}")
    progress = {name: _progress_intervals(query) for name, query in queries.items()}
    everything = [e for entries in progress.values() for e in entries]
    processing_s = union_seconds([(e["start"], e["end"]) for e in everything])
    batch_sum_s = sum(e["s"] for e in everything)
    # A "round": batch b of every query; its span from the first start to the
    # last end (concurrent), or the sum of its batches (sequential).
    rounds: dict[int, tuple[float, float]] = {}
    sums: dict[int, float] = defaultdict(float)
    for e in everything:
        if e["rows"] > 0:
            lo, hi = rounds.get(e["batch_id"], (e["start"], e["end"]))
            rounds[e["batch_id"]] = (min(lo, e["start"]), max(hi, e["end"]))
            sums[e["batch_id"]] += e["s"]
    round_s = [sums[b] if sequential else hi - lo for b, (lo, hi) in sorted(rounds.items())]
    steady = round_s[WARMUP_BATCHES:] or round_s
    events, lines = _events(spark, landing)
    rows = _count_rows(spark, work)
    return {
        "events": events,
        "input_lines": lines,
        "files_per_batch": files_per_batch,
        "shuffle_partitions": partitions,
        "java_options": java_options,
        "mode": "sequential" if sequential else "concurrent",
        "batches": len(rounds),
        "batches_per_query": {name: sum(1 for e in entries if e["rows"] > 0) for name, entries in progress.items()},
        "no_data_batches_per_query": {name: sum(1 for e in entries if e["rows"] == 0) for name, entries in progress.items()},
        "query_batch_sum_s": {name: sum(e["s"] for e in entries) for name, entries in progress.items()},
        "wall_s": wall_s,
        "events_per_s": events / wall_s,
        "processing_s": processing_s,
        "batch_sum_s": batch_sum_s,
        "batch_events_per_s": events / processing_s if processing_s else 0.0,
        "round_s": round_s,
        "steady_batch_s": statistics.median(steady) if steady else 0.0,
        "rows": rows,
        "work_dir": str(work),
    }


def describe(result: dict[str, Any]) -> str:
    """One human-readable line of figures."""
    rows = ", ".join(f"{name} {result['rows'][name]:,}" for name in OUTPUTS)
    return (
        f"SSS sensor_stats ({result['mode']} queries, {result['files_per_batch']} files/batch, "
        f"shuffle.partitions={result['shuffle_partitions']}, JVM options {result['java_options'] or '(defaults)'}): "
        f"{result['events']:,} events in {result['batches']} batches; processing time (a batch in progress) "
        f"{result['processing_s']:.1f}s -> {result['batch_events_per_s']:,.0f} ev/s; sum of batches "
        f"{result['batch_sum_s']:.1f}s; wall {result['wall_s']:.1f}s -> {result['events_per_s']:,.0f} ev/s; "
        f"steady batch {result['steady_batch_s']:.2f}s; rows: {rows}"
    )


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("landing_dir", help="directory of sensor_stats *.jsonl files")
    parser.add_argument("--work-dir", help="checkpoint/output root (default: a temporary directory)")
    parser.add_argument("--files-per-batch", type=int, default=2, help="maxFilesPerTrigger (default 2)")
    parser.add_argument("--shuffle-partitions", type=int, help="default: the core count")
    parser.add_argument("--java-options", default=SSS_JAVA_OPTIONS, help=f"driver JVM options (default {SSS_JAVA_OPTIONS!r})")
    parser.add_argument("--sequential", action="store_true", help="run the queries one after the other")
    parser.add_argument("--json", action="store_true", help="print the result dict as JSON on the last line")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-sss-sensor-") as scratch:
        result = run_sss_sensor_stats(
            args.landing_dir,
            args.work_dir or scratch,
            args.files_per_batch,
            args.shuffle_partitions,
            args.java_options,
            args.sequential,
        )
    print(describe(result), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
