"""barrierflow on Airflow 3: the DAGs that run pipelines epoch by epoch, and their settings.

Modules (importing this package does not import Airflow, so
:mod:`barrierflow.airflow.dags.environment` can configure Airflow first):

- :mod:`~barrierflow.airflow.dags.environment` -- the Airflow environment (``make run``, tests)
- :mod:`~barrierflow.airflow.dags.settings` -- deployment settings from environment variables
- :mod:`~barrierflow.airflow.dags.params` -- pipeline params as typed DAG params
- :mod:`~barrierflow.airflow.dags.assets` -- sinks as Airflow assets
- :mod:`~barrierflow.airflow.dags.lifecycle` -- the epoch steps as retryable, stateless tasks
- :mod:`~barrierflow.airflow.dags.spark_submit` -- step 3 as a SparkSubmitOperator
- :mod:`~barrierflow.airflow.dags.pipeline_dag`, :mod:`~barrierflow.airflow.dags.savepoint_dag`,
  :mod:`~barrierflow.airflow.dags.restore_dag`, :mod:`~barrierflow.airflow.dags.reprocess_dag`,
  :mod:`~barrierflow.airflow.dags.maintenance_dag` -- the DAGs
- :mod:`~barrierflow.airflow.dags.factory` -- every DAG by id, for the files in ``dags/``
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "all_dags",
    "pipeline_dags",
    "savepoint_dags",
    "restore_dags",
    "reprocess_dags",
    "maintenance_dags",
    "build_pipeline_dag",
    "build_savepoint_dag",
    "build_restore_dag",
    "build_reprocess_dag",
    "build_maintenance_dag",
    "DagSettings",
    "configure_airflow",
    "migrate_metadata_db",
]

_HOMES = {
    "all_dags": "factory",
    "pipeline_dags": "factory",
    "savepoint_dags": "factory",
    "restore_dags": "factory",
    "reprocess_dags": "factory",
    "maintenance_dags": "factory",
    "build_pipeline_dag": "pipeline_dag",
    "build_savepoint_dag": "savepoint_dag",
    "build_restore_dag": "restore_dag",
    "build_reprocess_dag": "reprocess_dag",
    "build_maintenance_dag": "maintenance_dag",
    "DagSettings": "settings",
    "configure_airflow": "environment",
    "migrate_metadata_db": "environment",
}


def __getattr__(name: str) -> Any:
    # Lazy: importing barrierflow.airflow.dags must not import Airflow before it is configured.
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
