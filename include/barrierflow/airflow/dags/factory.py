"""Every barrierflow DAG by dag_id, for the thin files in ``dags/``: the epoch, savepoint, restore and reprocess DAGs of
each registered pipeline, and the maintenance DAG; settings are read from the environment once per call."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Callable

from barrierflow.airflow.dags.maintenance_dag import build_maintenance_dag
from barrierflow.airflow.dags.operations import Environ
from barrierflow.airflow.dags.pipeline_dag import build_pipeline_dag
from barrierflow.airflow.dags.reprocess_dag import build_reprocess_dag
from barrierflow.airflow.dags.restore_dag import build_restore_dag
from barrierflow.airflow.dags.savepoint_dag import build_savepoint_dag
from barrierflow.airflow.dags.settings import MAINTENANCE_DAG_ID, DagSettings
from barrierflow.plan.registry import pipeline_names

if TYPE_CHECKING:
    from airflow.sdk import DAG

__all__ = ["pipeline_dags", "savepoint_dags", "restore_dags", "reprocess_dags", "maintenance_dags"]


def _per_pipeline(build: Callable[..., "DAG"], settings: DagSettings | None = None, environ: Environ = None) -> dict[str, "DAG"]:
    settings = settings or DagSettings.from_env(environ)
    return {dag.dag_id: dag for dag in (build(name, settings, environ) for name in pipeline_names())}


pipeline_dags = partial(_per_pipeline, build_pipeline_dag)
savepoint_dags = partial(_per_pipeline, build_savepoint_dag)
restore_dags = partial(_per_pipeline, build_restore_dag)
reprocess_dags = partial(_per_pipeline, build_reprocess_dag)


def maintenance_dags(settings: DagSettings | None = None, environ: Environ = None) -> dict[str, "DAG"]:
    return {MAINTENANCE_DAG_ID: build_maintenance_dag(None, settings, environ)}
