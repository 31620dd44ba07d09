"""Step 3 (process + pre-commit) as a spark-submit of ``spark_jobs/process_epoch.py``.

:class:`ProcessEpochOperator` is a ``SparkSubmitOperator`` that, when it runs,
fills in what only the worker knows: the DAG run's pipeline parameters as
job arguments, the worker's Python for the driver and the executors
(``spark.pyspark.python``, ``PYSPARK_PYTHON``), the venv's ``bin`` first on
``PATH`` so ``spark-submit`` is the project's own, and the default Spark
connection (``spark_default`` = ``local[*]``) when none is defined.

The job reads the pending barrier from the warehouse, so a retry replays
exactly the same barrier; it takes the epoch lease itself. A job that failed
because its input blocks the pipeline (it recorded a
:class:`~barrierflow.core.errors.BlockedInputError`) fails the task without retry.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from airflow.exceptions import AirflowException
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from barrierflow.airflow.dags.environment import LOCAL_SPARK_CONNECTION, SPARK_CONN_ENV
from barrierflow.airflow.dags.params import resolve_pipeline_params
from barrierflow.checkpointing.checkpoint_log import iso_now
from barrierflow.checkpointing.coordinator import blocked_state
from barrierflow.core.errors import BlockedInputError
from barrierflow.execution.spark import application_conf
from barrierflow.plan.registry import get_pipeline

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = [
    "ProcessEpochOperator",
    "process_job_arguments",
    "submit_process_job",
    "ensure_spark_connection",
    "DEFAULT_SPARK_CONN_ID",
]

DEFAULT_SPARK_CONN_ID = "spark_default"
_log = logging.getLogger("barrierflow.airflow.dags")


def ensure_spark_connection(conn_id: str) -> None:
    """Let ``spark_default`` mean ``local[*]`` when nobody defined it (a defined one wins)."""
    if conn_id != DEFAULT_SPARK_CONN_ID or os.environ.get(SPARK_CONN_ENV):
        return
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        _log.info("no connection %s defined: using Spark local[*] (%s)", conn_id, LOCAL_SPARK_CONNECTION)
        os.environ[SPARK_CONN_ENV] = LOCAL_SPARK_CONNECTION


def process_job_arguments(pipeline: str, warehouse: str, params: Mapping[str, Any], lease_wait_s: float) -> list[str]:
    """``process_epoch.py`` arguments for one pipeline run."""
    args = [pipeline, "--warehouse", warehouse, "--lease-wait", f"{lease_wait_s:g}"]
    for name, value in params.items():
        if value is not None:
            args += ["--param", f"{name}={str(value).lower() if isinstance(value, bool) else value}"]
    return args


def _python_conf() -> dict[str, str]:
    return {
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.log.level": "WARN",
        **application_conf(),
    }


def _job_env(warehouse: str) -> dict[str, str]:
    """Added to the worker's environment, which spark-submit inherits (in client mode)."""
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if bin_dir not in path.split(os.pathsep):
        path = f"{bin_dir}{os.pathsep}{path}" if path else bin_dir
    return {
        "PATH": path,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "BARRIERFLOW_WAREHOUSE": warehouse,
    }


class ProcessEpochOperator(SparkSubmitOperator):
    """spark-submit ``process_epoch.py`` for the pipeline's planned epoch (step 3)."""

    # Set by SparkSubmitOperator.__init__; declared for the type checker.
    conf: dict[Any, Any] | None
    env_vars: dict[str, Any] | None

    def __init__(
        self,
        *,
        pipeline: str,
        warehouse: str,
        application: str,
        lease_wait_s: float,
        conn_id: str = DEFAULT_SPARK_CONN_ID,
        driver_memory: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            application=application,
            conn_id=conn_id,
            driver_memory=driver_memory,
            name=f"barrierflow-{pipeline}-process",
            **kwargs,
        )
        self.pipeline = pipeline
        self.warehouse = warehouse
        self.lease_wait_s = lease_wait_s

    def execute(self, context: "Context") -> None:
        params = resolve_pipeline_params(get_pipeline(self.pipeline), context["params"])
        self.application_args = process_job_arguments(self.pipeline, self.warehouse, params, self.lease_wait_s)
        self.conf = {**(self.conf or {}), **_python_conf()}
        self.env_vars = {**(self.env_vars or {}), **_job_env(self.warehouse)}
        ensure_spark_connection(self._conn_id)
        self._hook = None  # a hook built now sees the arguments above
        self.log.info("process: spark-submit %s %s", self.application, " ".join(self.application_args))
        started = iso_now()
        try:
            super().execute(context)
        except AirflowException:
            blocked = _blocked_since(self.warehouse, self.pipeline, started)
            if blocked is not None:
                from airflow.sdk.exceptions import AirflowFailException

                self.log.error("%s", blocked)
                raise AirflowFailException(str(blocked)) from None
            raise


def _blocked_since(warehouse: str, pipeline: str, started: str) -> BlockedInputError | None:
    """The error a process job recorded as blocking the pipeline since ``started`` (ISO time), if any."""
    doc = blocked_state(warehouse, pipeline)
    if doc is None or doc.get("step") != "process" or str(doc.get("since", "")) < started:
        return None
    return BlockedInputError(f"epoch {doc.get('epoch')} is blocked: {doc.get('message')}")


def submit_process_job(
    *,
    pipeline: str,
    warehouse: str,
    application: str,
    params: Mapping[str, Any],
    lease_wait_s: float,
    conn_id: str = DEFAULT_SPARK_CONN_ID,
    driver_memory: str | None = None,
) -> None:
    """The same spark-submit as :class:`ProcessEpochOperator`, from inside another task."""
    ensure_spark_connection(conn_id)
    hook = SparkSubmitHook(
        conf=_python_conf(),
        conn_id=conn_id,
        driver_memory=driver_memory,
        name=f"barrierflow-{pipeline}-process",
        application_args=process_job_arguments(pipeline, warehouse, params, lease_wait_s),
        env_vars=_job_env(warehouse),
    )
    started = iso_now()
    try:
        hook.submit(application)
    except AirflowException:
        blocked = _blocked_since(warehouse, pipeline, started)
        if blocked is not None:
            raise blocked from None
        raise
