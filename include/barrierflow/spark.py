"""The Spark session barrierflow runs epochs in (``local[*]`` by default)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Hashable, TypeVar

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["get_spark", "launched_by_spark_submit", "session_cached", "MASTER_ENV", "DRIVER_JAVA_OPTIONS"]

MASTER_ENV = "BARRIERFLOW_SPARK_MASTER"
# The throughput collector: on a few cores, G1's concurrent threads take CPU
# from the tasks (epochs measured ~15% faster on 2 cores). Applies when this
# process starts the JVM; $BARRIERFLOW_DRIVER_JAVA_OPTIONS replaces it.
DRIVER_JAVA_OPTIONS = "-XX:+UseParallelGC"
_session: "SparkSession | None" = None
_T = TypeVar("_T")
_cached: dict[Hashable, tuple[Any, Any]] = {}


def session_cached(key: Hashable, build: Callable[[], _T]) -> _T:
    """``build()`` once per Spark context, e.g. Column expressions.

    Every Column operation is a py4j round trip; an operator that builds the
    same expressions every epoch pays tens of milliseconds for nothing.
    """
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    hit = _cached.get(key)
    if hit is not None and hit[0] is context:
        return hit[1]  # type: ignore[no-any-return]
    value = build()
    _cached[key] = (context, value)
    return value


def launched_by_spark_submit() -> bool:
    """Whether this Python process is a driver started by ``spark-submit`` (its JVM is already up)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def get_spark(master: str | None = None) -> "SparkSession":
    """One session per process; ``master`` or ``$BARRIERFLOW_SPARK_MASTER`` picks the cluster.

    Without either, Spark runs ``local[*]``, except under ``spark-submit``,
    where the submitted ``--master`` holds.
    """
    global _session
    if _session is not None:
        return _session
    from pyspark.sql import SparkSession

    # Python workers must run the interpreter that has barrierflow's packages.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    chosen = master or os.environ.get(MASTER_ENV)
    if chosen is None and not launched_by_spark_submit():
        chosen = "local[*]"
    builder = SparkSession.builder.appName("barrierflow")
    if chosen is not None:
        # Under spark-submit without an explicit choice, --master (the Airflow Spark connection) holds.
        builder = builder.master(chosen)
    builder = (
        builder.config("spark.sql.session.timeZone", "UTC")  # all event time is UTC
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")  # never INT96
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.adaptive.enabled", os.environ.get("BARRIERFLOW_SPARK_AQE", "false"))
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", os.environ.get("BARRIERFLOW_DRIVER_MEMORY", "2g"))
        .config("spark.sql.sources.ignoreMissingFiles", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.extraJavaOptions", os.environ.get("BARRIERFLOW_DRIVER_JAVA_OPTIONS", DRIVER_JAVA_OPTIONS))
    )
    _session = builder.getOrCreate()
    _session.sparkContext.setLogLevel("ERROR")
    return _session
