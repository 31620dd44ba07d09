"""The Spark session barrierflow runs epochs in (``local[*]`` by default)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["get_spark", "launched_by_spark_submit", "MASTER_ENV"]

MASTER_ENV = "BARRIERFLOW_SPARK_MASTER"
_session: "SparkSession | None" = None


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
    )
    _session = builder.getOrCreate()
    _session.sparkContext.setLogLevel("ERROR")
    return _session
