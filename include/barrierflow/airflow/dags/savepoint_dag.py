"""``barrierflow_<pipeline>_savepoint``: a savepoint (optionally stop-with-savepoint) as a manual run.

One task calls :func:`barrierflow.operations.savepoint.create_savepoint`, which takes the
pipeline's epoch lease (so it waits for a running epoch and never races one)
and snapshots the last completed epoch. The form's ``stop_pipeline`` stops the
pipeline: its epoch DAG then skips every run, saying why, until a restore.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Mapping

from barrierflow.airflow.dags.docs import savepoint_doc
from barrierflow.airflow.dags.operations import fail_without_retry, operation_dag, xcom_json
from barrierflow.airflow.dags.params import operational_params
from barrierflow.airflow.dags.settings import DagSettings, savepoint_dag_id
from barrierflow.core.errors import ParameterError, SavepointError
from barrierflow.operations.savepoint import create_savepoint
from barrierflow.plan.pipeline import PipelineDefinition
from barrierflow.plan.registry import get_pipeline

if TYPE_CHECKING:
    from airflow.sdk import DAG

__all__ = ["build_savepoint_dag"]

_log = logging.getLogger("barrierflow.airflow.dags")


def build_savepoint_dag(
    pipeline: str | PipelineDefinition,
    settings: DagSettings | None = None,
    environ: Mapping[str, str] | None = None,
) -> "DAG":
    from airflow.sdk import Param, get_current_context, task

    definition = pipeline if isinstance(pipeline, PipelineDefinition) else get_pipeline(pipeline)
    settings = settings or DagSettings.from_env(environ)
    warehouse = settings.warehouse

    with operation_dag(
        dag_id=savepoint_dag_id(definition.name),
        description=f"savepoint (or stop with savepoint) of barrierflow pipeline {definition.name}",
        settings=settings,
        params={
            "savepoint_name": Param(
                "",
                type=["null", "string"],
                title="savepoint_name",
                description="name of the savepoint (letters, digits, _ . -); empty: generated (sp-<time>-<id>)",
            ),
            "description": Param(
                "", type=["null", "string"], title="description", description="kept in the savepoint's metadata"
            ),
            "stop_pipeline": Param(
                False,
                type="boolean",
                title="stop_pipeline",
                description="stop with savepoint: no epoch runs after it until the pipeline is restored",
            ),
        },
        doc_md=savepoint_doc(definition, settings),
        tag="savepoint",
    ) as dag:

        @task(task_id="savepoint")
        def savepoint() -> dict[str, Any]:
            """Snapshot the last completed epoch (waits for a running epoch through the lease)."""

            params = get_current_context()["params"]
            # A bad name, an existing savepoint, no completed epoch: a retry cannot help.
            with fail_without_retry(f"savepoint of {definition.name} failed", SavepointError, ParameterError):
                metadata = create_savepoint(
                    definition,
                    warehouse,
                    name=(params.get("savepoint_name") or "").strip() or None,
                    description=params.get("description") or "",
                    stop=bool(params.get("stop_pipeline")),
                    params=operational_params(definition, warehouse, environ),
                    lease_wait_s=settings.lease_wait_s,
                )
            doc = xcom_json(metadata.to_json())
            _log.info(
                "savepoint %r of %s at epoch %s written to %s%s",
                doc["name"],
                definition.name,
                doc["epoch"],
                doc["uri"],
                "; the pipeline is STOPPED until it is restored" if doc.get("stopped") else "",
            )
            return doc

        savepoint()
    return dag
