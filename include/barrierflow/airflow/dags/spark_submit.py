"""Step 3 (process + pre-commit) as a spark-submit of ``spark_jobs/process_epoch.py``.

:class:`ProcessEpochOperator` fills in, when it runs, what only the worker knows: the run's pipeline parameters, the
venv's Python, and ``spark_default`` = ``local[*]`` when undefined. The job replays the pending barrier and takes the
epoch lease itself; one whose input blocks the pipeline (a recorded ``BlockedInputError``) fails the task at once."""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from airflow.exceptions import AirflowException
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from barrierflow.airflow.dags.environment import LOCAL_SPARK_CONNECTION, SPARK_CONN_ENV, python_env
from barrierflow.airflow.dags.operations import fail_without_retry
from barrierflow.airflow.dags.params import resolve_pipeline_params
from barrierflow.airflow.dags.settings import DEFAULT_CONN_IDS, SPARK_SUBMIT_MODE, DagSettings
from barrierflow.checkpointing.checkpoint_log import iso_now
from barrierflow.checkpointing.coordinator import blocked_state
from barrierflow.core.errors import BlockedInputError
from barrierflow.execution.spark import application_conf
from barrierflow.plan.registry import get_pipeline

if TYPE_CHECKING:
    from airflow.sdk import Context

    from barrierflow.checkpointing.coordinator import CheckpointCoordinator

__all__ = ["ProcessEpochOperator", "process_job_arguments", "submit_process_job", "ensure_spark_connection"]

_log = logging.getLogger("barrierflow.airflow.dags")


def ensure_spark_connection(conn_id: str) -> None:
    """Let ``spark_default`` mean ``local[*]`` when nobody defined it (a defined one wins)."""
    if conn_id != DEFAULT_CONN_IDS[SPARK_SUBMIT_MODE] or os.environ.get(SPARK_CONN_ENV):
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
    python = {"spark.pyspark.python": sys.executable, "spark.pyspark.driver.python": sys.executable}
    return python | {"spark.log.level": "WARN", **application_conf()}


def _job_env(warehouse: str) -> dict[str, str]:
    """Added to the worker's environment, which spark-submit inherits (in client mode)."""
    return {**python_env(), "BARRIERFLOW_WAREHOUSE": warehouse}


@contextmanager
def _blocked_input(warehouse: str, pipeline: str) -> Iterator[None]:
    """Turn a failed job that recorded a :class:`BlockedInputError` (since it started) into that error."""
    started = iso_now()
    try:
        yield
    except AirflowException:
        doc = blocked_state(warehouse, pipeline)
        if doc is None or doc.get("step") != "process" or str(doc.get("since", "")) < started:
            raise
        raise BlockedInputError(f"epoch {doc.get('epoch')} is blocked: {doc.get('message')}") from None


class ProcessEpochOperator(SparkSubmitOperator):
    """spark-submit ``process_epoch.py`` for the pipeline's planned epoch (step 3)."""

    # Set by SparkSubmitOperator.__init__; declared for the type checker.
    conf: dict[Any, Any] | None
    env_vars: dict[str, Any] | None

    def __init__(self, *, pipeline: str, warehouse: str, lease_wait_s: float, **kwargs: Any) -> None:
        super().__init__(name=f"barrierflow-{pipeline}-process", **kwargs)
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
        with fail_without_retry(None, BlockedInputError), _blocked_input(self.warehouse, self.pipeline):
            super().execute(context)


def submit_process_job(settings: DagSettings, coordinator: "CheckpointCoordinator") -> None:
    """The same spark-submit as :class:`ProcessEpochOperator`, of the coordinator's planned epoch from inside another task."""
    pipeline = coordinator.definition.name
    ensure_spark_connection(settings.conn_id)
    hook = SparkSubmitHook(
        conf=_python_conf(),
        conn_id=settings.conn_id,
        driver_memory=settings.driver_memory,
        name=f"barrierflow-{pipeline}-process",
        application_args=process_job_arguments(pipeline, settings.warehouse, coordinator.params, settings.lease_wait_s),
        env_vars=_job_env(settings.warehouse),
    )
    with _blocked_input(settings.warehouse, pipeline):
        hook.submit(settings.process_application)
