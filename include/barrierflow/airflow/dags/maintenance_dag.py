"""``barrierflow_maintenance``: daily checkpoint retention and vacuum, one task per pipeline.

Each ``maintain_<pipeline>`` task calls
:func:`barrierflow.operations.maintenance.run_maintenance`; a pipeline that never ran in
the warehouse is skipped, saying so.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from barrierflow.airflow.dags.docs import maintenance_doc
from barrierflow.airflow.dags.operations import operation_dag, xcom_json
from barrierflow.airflow.dags.params import operational_params
from barrierflow.airflow.dags.settings import MAINTENANCE_DAG_ID, DagSettings
from barrierflow.operations.maintenance import run_maintenance
from barrierflow.plan.registry import get_pipeline, pipeline_names
from barrierflow.storage import objects
from barrierflow.storage.layout import PipelineLayout

if TYPE_CHECKING:
    from airflow.sdk import DAG

__all__ = ["build_maintenance_dag", "maintenance_task_id"]

_log = logging.getLogger("barrierflow.airflow.dags")


def maintenance_task_id(pipeline: str) -> str:
    return f"maintain_{pipeline}"


def build_maintenance_dag(
    pipelines: Sequence[str] | None = None,
    settings: DagSettings | None = None,
    environ: Mapping[str, str] | None = None,
) -> "DAG":
    from airflow.sdk import Param, get_current_context, task
    from airflow.sdk.exceptions import AirflowSkipException

    names = list(pipelines) if pipelines is not None else pipeline_names()
    settings = settings or DagSettings.from_env(environ)
    warehouse = settings.warehouse

    with operation_dag(
        dag_id=MAINTENANCE_DAG_ID,
        description="barrierflow checkpoint retention and Delta vacuum for every pipeline",
        schedule=settings.maintenance_schedule,
        settings=settings,
        params={
            "retained_checkpoints": Param(
                10,
                type="integer",
                minimum=1,
                title="retained_checkpoints",
                description="completed epochs kept restorable (older checkpoints are retired)",
            ),
            "vacuum_retention_hours": Param(
                168,
                type="integer",
                minimum=0,
                title="vacuum_retention_hours",
                description="Delta files unreferenced for longer than this are vacuumed",
            ),
        },
        doc_md=maintenance_doc(names, settings),
        tag="maintenance",
    ) as dag:
        for name in names:

            @task(task_id=maintenance_task_id(name))
            def maintain(pipeline: str) -> dict[str, Any]:
                """Retention and vacuum of one pipeline."""

                params = get_current_context()["params"]
                if not objects.exists(PipelineLayout.of(warehouse, pipeline).pipeline_meta):
                    raise AirflowSkipException(f"pipeline {pipeline} has never run in warehouse {warehouse}: nothing to maintain")
                definition = get_pipeline(pipeline)
                report = run_maintenance(
                    definition,
                    warehouse,
                    retained_checkpoints=int(params["retained_checkpoints"]),
                    vacuum_retention_hours=int(params["vacuum_retention_hours"]),
                    params=operational_params(definition, warehouse, environ),
                    lease_wait_s=settings.lease_wait_s,
                )
                doc = xcom_json(report.to_json())
                _log.info("maintenance of %s: %s", pipeline, doc)
                return doc

            maintain(name)
    return dag
