"""Every barrierflow DAG, keyed by dag_id, for the thin files in ``dags/``.

One epoch DAG, one savepoint DAG, one restore DAG and one reprocess DAG per registered pipeline
(:func:`barrierflow.plan.registry.pipeline_names`), and the maintenance DAG.
Settings are read from the environment once per call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from barrierflow.airflow.dags.maintenance_dag import build_maintenance_dag
from barrierflow.airflow.dags.pipeline_dag import build_pipeline_dag
from barrierflow.airflow.dags.reprocess_dag import build_reprocess_dag
from barrierflow.airflow.dags.restore_dag import build_restore_dag
from barrierflow.airflow.dags.savepoint_dag import build_savepoint_dag
from barrierflow.airflow.dags.settings import DagSettings
from barrierflow.plan.registry import pipeline_names

if TYPE_CHECKING:
    from airflow.sdk import DAG

__all__ = ["pipeline_dags", "savepoint_dags", "restore_dags", "reprocess_dags", "maintenance_dags", "all_dags"]


def _by_id(dags: list["DAG"]) -> dict[str, "DAG"]:
    return {dag.dag_id: dag for dag in dags}


def pipeline_dags(settings: DagSettings | None = None, environ: Mapping[str, str] | None = None) -> dict[str, "DAG"]:
    settings = settings or DagSettings.from_env(environ)
    return _by_id([build_pipeline_dag(name, settings, environ) for name in pipeline_names()])


def savepoint_dags(settings: DagSettings | None = None, environ: Mapping[str, str] | None = None) -> dict[str, "DAG"]:
    settings = settings or DagSettings.from_env(environ)
    return _by_id([build_savepoint_dag(name, settings, environ) for name in pipeline_names()])


def restore_dags(settings: DagSettings | None = None, environ: Mapping[str, str] | None = None) -> dict[str, "DAG"]:
    settings = settings or DagSettings.from_env(environ)
    return _by_id([build_restore_dag(name, settings, environ) for name in pipeline_names()])


def reprocess_dags(settings: DagSettings | None = None, environ: Mapping[str, str] | None = None) -> dict[str, "DAG"]:
    settings = settings or DagSettings.from_env(environ)
    return _by_id([build_reprocess_dag(name, settings, environ) for name in pipeline_names()])


def maintenance_dags(settings: DagSettings | None = None, environ: Mapping[str, str] | None = None) -> dict[str, "DAG"]:
    return _by_id([build_maintenance_dag(None, settings, environ)])


def all_dags(settings: DagSettings | None = None, environ: Mapping[str, str] | None = None) -> dict[str, "DAG"]:
    settings = settings or DagSettings.from_env(environ)
    return {
        **pipeline_dags(settings, environ),
        **savepoint_dags(settings, environ),
        **restore_dags(settings, environ),
        **reprocess_dags(settings, environ),
        **maintenance_dags(settings, environ),
    }
