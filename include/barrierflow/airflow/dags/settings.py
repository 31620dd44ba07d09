"""Deployment settings of the barrierflow DAGs, read from the environment once per DAG file parse.

Every value has a working default; :class:`DagSettings` lists the environment variables that override them, which every Airflow
component (DAG processor, scheduler, workers) should see alike. Pipeline parameters get their DAG-param defaults from
``BARRIERFLOW_<PIPELINE>__<PARAM>`` (:func:`param_env_var`). S3 access: README "Configuration", :func:`use_aws_connection`."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import Any, Mapping

from barrierflow.airflow.dags.environment import repo_root
from barrierflow.core.errors import ConfigurationError
from barrierflow.core.settings import DEFAULT_LEASE_WAIT_S, LEASE_WAIT_ENV

__all__ = [
    "DagSettings", "WAREHOUSE_ENV", "PROCESS_MODE_ENV", "pipeline_dag_id", "savepoint_dag_id", "restore_dag_id",
    "reprocess_dag_id", "MAINTENANCE_DAG_ID", "param_env_var", "CONNECT_MODE", "SPARK_SUBMIT_MODE", "DEFAULT_CONN_IDS",
    "aws_environment", "use_aws_connection",
]  # fmt: skip

WAREHOUSE_ENV = "BARRIERFLOW_WAREHOUSE"
PROCESS_MODE_ENV = "BARRIERFLOW_PROCESS_MODE"
RETRIES_ENV = "BARRIERFLOW_TASK_RETRIES"
CONNECT_MODE = "connect"
SPARK_SUBMIT_MODE = "spark-submit"
# The connection each mode uses unless BARRIERFLOW_SPARK_CONN_ID names another.
DEFAULT_CONN_IDS = {CONNECT_MODE: "spark_connect_default", SPARK_SUBMIT_MODE: "spark_default"}
MAINTENANCE_DAG_ID = "barrierflow_maintenance"
AWS_CONN_ID_ENV = "BARRIERFLOW_AWS_CONN_ID"
DEFAULT_AWS_CONN_ID = "aws_default"
_log = logging.getLogger("barrierflow.airflow.dags")


def pipeline_dag_id(pipeline: str) -> str:
    return f"barrierflow_{pipeline}"


def savepoint_dag_id(pipeline: str) -> str:
    return f"barrierflow_{pipeline}_savepoint"


def restore_dag_id(pipeline: str) -> str:
    return f"barrierflow_{pipeline}_restore"


def reprocess_dag_id(pipeline: str) -> str:
    return f"barrierflow_{pipeline}_reprocess"


def param_env_var(pipeline: str, param: str) -> str:
    """``BARRIERFLOW_<PIPELINE>__<PARAM>``: the default of a pipeline parameter in its DAG."""
    return f"BARRIERFLOW_{pipeline.upper()}__{param.upper()}"


@dataclass(frozen=True)
class DagSettings:
    """Where and how the DAGs run; :meth:`from_env` reads each field from the ``BARRIERFLOW_*`` variable its comment names. The
    README's "Configuration" describes them and points here for the complete list."""

    warehouse: str  # WAREHOUSE: a directory (made absolute) or s3://bucket/prefix; default ./warehouse
    schedule: str | None = "* * * * *"  # SCHEDULE: cron or preset of the pipeline DAGs; none: manual runs only
    maintenance_schedule: str | None = "@daily"  # MAINTENANCE_SCHEDULE: cron or preset of barrierflow_maintenance
    process_mode: str = CONNECT_MODE  # PROCESS_MODE: connect (the warm engine) or spark-submit (an application per epoch)
    spark_conn_id: str | None = None  # SPARK_CONN_ID: process's connection; None: the mode's (DEFAULT_CONN_IDS)
    aws_conn_id: str = DEFAULT_AWS_CONN_ID  # AWS_CONN_ID: the connection (type aws) of every task, for s3://
    driver_memory: str = "2g"  # DRIVER_MEMORY: spark-submit --driver-memory
    retries: int = 3  # TASK_RETRIES: retries of every task
    retry_delay: timedelta = timedelta(seconds=30)  # RETRY_DELAY_SECONDS: the first retry delay (doubles each retry)
    max_retry_delay: timedelta = timedelta(minutes=10)  # MAX_RETRY_DELAY_SECONDS: cap of the retry delay
    lease_wait_s: float = DEFAULT_LEASE_WAIT_S  # LEASE_WAIT_SECONDS: how long a step waits for the epoch lease (600)
    spark_jobs_dir: str = str(repo_root() / "spark_jobs")  # SPARK_JOBS_DIR: the directory holding process_epoch.py
    # A fixed start date: with catchup=False only the latest interval is scheduled.
    start_date: datetime = datetime(2024, 1, 1, tzinfo=timezone.utc)

    def __post_init__(self) -> None:
        if not os.path.isabs(self.warehouse) and "://" not in self.warehouse:
            raise ConfigurationError(f"the DAGs' warehouse must be absolute, got {self.warehouse!r}")
        if self.process_mode not in DEFAULT_CONN_IDS:
            raise ConfigurationError(
                f"{PROCESS_MODE_ENV} is {self.process_mode!r}: allowed are {', '.join(sorted(DEFAULT_CONN_IDS))}"
            )
        if self.retries < 0:
            raise ConfigurationError(f"{RETRIES_ENV} must be >= 0, got {self.retries}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "DagSettings":
        env = os.environ if environ is None else environ
        warehouse = env.get(WAREHOUSE_ENV) or "./warehouse"
        if "://" not in warehouse or warehouse.startswith("file://"):
            warehouse = os.path.abspath(os.path.expanduser(warehouse.removeprefix("file://")))
        return cls(
            warehouse=warehouse,
            schedule=_schedule(env.get("BARRIERFLOW_SCHEDULE", cls.schedule)),
            maintenance_schedule=_schedule(env.get("BARRIERFLOW_MAINTENANCE_SCHEDULE", cls.maintenance_schedule)),
            process_mode=(env.get(PROCESS_MODE_ENV) or CONNECT_MODE).strip().lower(),
            spark_conn_id=env.get("BARRIERFLOW_SPARK_CONN_ID") or None,
            aws_conn_id=env.get(AWS_CONN_ID_ENV) or DEFAULT_AWS_CONN_ID,
            driver_memory=env.get("BARRIERFLOW_DRIVER_MEMORY") or cls.driver_memory,
            retries=_number(env, RETRIES_ENV, cls.retries, int),
            retry_delay=timedelta(seconds=_number(env, "BARRIERFLOW_RETRY_DELAY_SECONDS", 30.0, float)),
            max_retry_delay=timedelta(seconds=_number(env, "BARRIERFLOW_MAX_RETRY_DELAY_SECONDS", 600.0, float)),
            lease_wait_s=_number(env, LEASE_WAIT_ENV, DEFAULT_LEASE_WAIT_S, float),
            spark_jobs_dir=env.get("BARRIERFLOW_SPARK_JOBS_DIR") or cls.spark_jobs_dir,
        )

    @property
    def conn_id(self) -> str:
        """The Airflow connection of the ``process`` step."""
        return self.spark_conn_id or DEFAULT_CONN_IDS[self.process_mode]

    @property
    def process_application(self) -> str:
        """The spark-submit application of step 3."""
        return os.path.join(self.spark_jobs_dir, "process_epoch.py")

    def default_args(self) -> dict[str, Any]:
        """Retries with exponential backoff on every task; each applies the AWS connection first."""
        return {
            "owner": "barrierflow",
            "pre_execute": partial(use_aws_connection, self.aws_conn_id),
            "retries": self.retries,
            "retry_delay": self.retry_delay,
            "retry_exponential_backoff": 2.0,
            "max_retry_delay": self.max_retry_delay,
        }


def _schedule(value: str | None) -> str | None:
    value = (value or "").strip()
    return None if value.lower() in ("", "none", "manual", "null") else value


def _number(env: Mapping[str, str], name: str, default: Any, kind: type) -> Any:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a number, got {raw!r}") from None


def aws_environment(login: str | None, password: str | None, extra: Mapping[str, Any]) -> dict[str, str]:
    """The AWS variables a connection's fields stand for (only those it sets)."""
    fields = {"AWS_ACCESS_KEY_ID": login, "AWS_SECRET_ACCESS_KEY": password, "AWS_SESSION_TOKEN": extra.get("aws_session_token")}
    env = {name: str(value) for name, value in (fields | {"AWS_REGION": extra.get("region_name")}).items() if value}
    endpoint = extra.get("endpoint_url") or (extra.get("service_config") or {}).get("s3", {}).get("endpoint_url")
    if endpoint:
        endpoint = str(endpoint)
        if not endpoint.startswith(("http://", "https://")):
            raise ConfigurationError(f"endpoint_url {endpoint!r} of the AWS connection must start with http:// or https://")
        env["AWS_ENDPOINT_URL"] = endpoint
        env["AWS_ALLOW_HTTP"] = "true" if endpoint.startswith("http://") else "false"
    return env


def use_aws_connection(conn_id: str, context: Any = None) -> dict[str, str]:
    """Set the AWS variables of connection ``conn_id`` in this process (``os.environ``); returns them. Every task's
    ``pre_execute`` (``context`` is the task's, unused), so the driver side, the Delta commits and a spark-submit child all see
    them; an engine's or cluster's executors keep their deployment's environment. Without the default connection the environment
    is used as it is; a missing named connection fails the task."""
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = Connection.get(conn_id)
    except AirflowNotFoundException:
        if conn_id != DEFAULT_AWS_CONN_ID:
            raise ConfigurationError(
                f"no Airflow connection {conn_id!r} (named by {AWS_CONN_ID_ENV}): define it with type aws "
                "(login: access key id, password: secret key, extra: region_name, endpoint_url), or unset "
                f"{AWS_CONN_ID_ENV} to use {DEFAULT_AWS_CONN_ID} or the process's AWS environment"
            ) from None
        return {}
    env = aws_environment(conn.login, conn.password, conn.extra_dejson)
    os.environ.update(env)
    _log.info("S3 access from Airflow connection %s: %s", conn_id, ", ".join(sorted(env)) or "no fields set")
    return env
