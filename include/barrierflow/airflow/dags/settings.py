"""Deployment settings of the barrierflow DAGs, read from the environment once per DAG file parse.

Every value has a default that runs out of the box (Spark ``local[*]``, a
``./warehouse`` next to where Airflow runs); each is overridable by an
environment variable, which every Airflow component (DAG processor,
scheduler, workers) should see alike:

=====================================  ==========================================  ===================
variable                               meaning                                     default
=====================================  ==========================================  ===================
``BARRIERFLOW_WAREHOUSE``              warehouse: a directory (made absolute) or   ``./warehouse``
                                       ``s3://bucket/prefix``
``BARRIERFLOW_SCHEDULE``               cron or preset of the pipeline DAGs,        ``* * * * *``
                                       ``none`` for manual runs only
``BARRIERFLOW_MAINTENANCE_SCHEDULE``   cron or preset of ``barrierflow_maintenance``  ``@daily``
``BARRIERFLOW_PROCESS_MODE``           how ``process`` runs: ``connect`` (on the   ``connect``
                                       warm engine) or ``spark-submit`` (a new
                                       Spark application per epoch)
``BARRIERFLOW_SPARK_CONN_ID``          Airflow connection of ``process``           ``spark_connect_default``
                                       (``spark_connect`` type in connect mode,    (``spark_default`` in
                                       ``spark`` type in spark-submit mode)        spark-submit mode)
``BARRIERFLOW_AWS_CONN_ID``            Airflow connection (type ``aws``) whose     ``aws_default``
                                       credentials, region and endpoint every      (none defined: the
                                       task uses for ``s3://`` (aws_connection.py)  AWS environment)
``BARRIERFLOW_DRIVER_MEMORY``          spark-submit ``--driver-memory``            ``2g``
``BARRIERFLOW_TASK_RETRIES``           retries of every task                       ``3``
``BARRIERFLOW_RETRY_DELAY_SECONDS``    first retry delay (doubles each retry)      ``30``
``BARRIERFLOW_MAX_RETRY_DELAY_SECONDS``  cap of the retry delay                    ``600``
``BARRIERFLOW_LEASE_WAIT_SECONDS``     how long a step waits for the epoch lease   ``600``
``BARRIERFLOW_SPARK_JOBS_DIR``         directory holding ``process_epoch.py``      ``<repo>/spark_jobs``
=====================================  ==========================================  ===================

Pipeline parameters get their DAG-param defaults from
``BARRIERFLOW_<PIPELINE>__<PARAM>`` (see :func:`param_env_var`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Mapping

from barrierflow.airflow.dags.aws_connection import AWS_CONN_ID_ENV, DEFAULT_AWS_CONN_ID, aws_pre_execute
from barrierflow.core.errors import ConfigurationError
from barrierflow.core.settings import DEFAULT_LEASE_WAIT_S, LEASE_WAIT_ENV

__all__ = [
    "DagSettings",
    "START_DATE",
    "WAREHOUSE_ENV",
    "SCHEDULE_ENV",
    "pipeline_dag_id",
    "savepoint_dag_id",
    "restore_dag_id",
    "reprocess_dag_id",
    "MAINTENANCE_DAG_ID",
    "param_env_var",
    "CONNECT_MODE",
    "SPARK_SUBMIT_MODE",
    "DEFAULT_CONN_IDS",
]

WAREHOUSE_ENV = "BARRIERFLOW_WAREHOUSE"
SCHEDULE_ENV = "BARRIERFLOW_SCHEDULE"
MAINTENANCE_SCHEDULE_ENV = "BARRIERFLOW_MAINTENANCE_SCHEDULE"
SPARK_CONN_ID_ENV = "BARRIERFLOW_SPARK_CONN_ID"
PROCESS_MODE_ENV = "BARRIERFLOW_PROCESS_MODE"
CONNECT_MODE = "connect"
SPARK_SUBMIT_MODE = "spark-submit"
# The connection each mode uses unless BARRIERFLOW_SPARK_CONN_ID names another.
DEFAULT_CONN_IDS = {CONNECT_MODE: "spark_connect_default", SPARK_SUBMIT_MODE: "spark_default"}
DRIVER_MEMORY_ENV = "BARRIERFLOW_DRIVER_MEMORY"
RETRIES_ENV = "BARRIERFLOW_TASK_RETRIES"
RETRY_DELAY_ENV = "BARRIERFLOW_RETRY_DELAY_SECONDS"
MAX_RETRY_DELAY_ENV = "BARRIERFLOW_MAX_RETRY_DELAY_SECONDS"
SPARK_JOBS_DIR_ENV = "BARRIERFLOW_SPARK_JOBS_DIR"

# A fixed start date: with catchup=False only the latest interval is scheduled.
START_DATE = datetime(2024, 1, 1, tzinfo=timezone.utc)
MAINTENANCE_DAG_ID = "barrierflow_maintenance"
_MANUAL = ("", "none", "manual", "null")


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


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[4]


@dataclass(frozen=True)
class DagSettings:
    """Where and how the DAGs run; :meth:`from_env` reads the variables of the module docstring."""

    warehouse: str
    schedule: str | None = "* * * * *"
    maintenance_schedule: str | None = "@daily"
    process_mode: str = CONNECT_MODE
    spark_conn_id: str | None = None  # None: the mode's default connection
    aws_conn_id: str = DEFAULT_AWS_CONN_ID
    driver_memory: str = "2g"
    retries: int = 3
    retry_delay: timedelta = timedelta(seconds=30)
    max_retry_delay: timedelta = timedelta(minutes=10)
    lease_wait_s: float = DEFAULT_LEASE_WAIT_S
    spark_jobs_dir: str = str(_repo_root() / "spark_jobs")
    start_date: datetime = START_DATE

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
        mode = (env.get(PROCESS_MODE_ENV) or CONNECT_MODE).strip().lower()
        return cls(
            warehouse=warehouse,
            schedule=_schedule(env.get(SCHEDULE_ENV, "* * * * *")),
            maintenance_schedule=_schedule(env.get(MAINTENANCE_SCHEDULE_ENV, "@daily")),
            process_mode=mode,
            spark_conn_id=env.get(SPARK_CONN_ID_ENV) or None,
            aws_conn_id=env.get(AWS_CONN_ID_ENV) or DEFAULT_AWS_CONN_ID,
            driver_memory=env.get(DRIVER_MEMORY_ENV) or "2g",
            retries=_number(env, RETRIES_ENV, 3, int),
            retry_delay=timedelta(seconds=_number(env, RETRY_DELAY_ENV, 30.0, float)),
            max_retry_delay=timedelta(seconds=_number(env, MAX_RETRY_DELAY_ENV, 600.0, float)),
            lease_wait_s=_number(env, LEASE_WAIT_ENV, DEFAULT_LEASE_WAIT_S, float),
            spark_jobs_dir=env.get(SPARK_JOBS_DIR_ENV) or str(_repo_root() / "spark_jobs"),
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
            "pre_execute": aws_pre_execute(self.aws_conn_id),
            "retries": self.retries,
            "retry_delay": self.retry_delay,
            "retry_exponential_backoff": 2.0,
            "max_retry_delay": self.max_retry_delay,
        }


def _schedule(value: str) -> str | None:
    value = value.strip()
    return None if value.lower() in _MANUAL else value


def _number(env: Mapping[str, str], name: str, default: Any, kind: type) -> Any:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a number, got {raw!r}") from None
