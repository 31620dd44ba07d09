"""``barrierflow_maintenance``: daily retention and vacuum, one ``maintain_<pipeline>`` task per pipeline.

Each calls :func:`barrierflow.operations.maintenance.run_maintenance`; a pipeline that never ran is skipped, saying so."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Sequence

from barrierflow.airflow.dags.operations import Environ, PipelineDag, barrierflow_dag, xcom_json
from barrierflow.airflow.dags.params import form_doc, form_field
from barrierflow.airflow.dags.settings import MAINTENANCE_DAG_ID, DagSettings
from barrierflow.operations.maintenance import run_maintenance
from barrierflow.plan.registry import pipeline_names
from barrierflow.storage import objects
from barrierflow.storage.layout import PipelineLayout

if TYPE_CHECKING:
    from airflow.sdk import DAG

__all__ = ["build_maintenance_dag"]

_log = logging.getLogger("barrierflow.airflow.dags")


def build_maintenance_dag(
    pipelines: Sequence[str] | None = None, settings: DagSettings | None = None, environ: Environ = None
) -> "DAG":
    from airflow.sdk import get_current_context, task
    from airflow.sdk.exceptions import AirflowSkipException

    names = list(pipelines) if pipelines is not None else pipeline_names()
    settings = settings or DagSettings.from_env(environ)
    warehouse, schedule = settings.warehouse, settings.maintenance_schedule
    form = form_field("retained_checkpoints", 10, "integer", "epochs kept restorable (older are retired)", minimum=1)
    form |= form_field("vacuum_retention_hours", 168, "integer", "Delta files unreferenced longer are vacuumed", minimum=0)
    description = "barrierflow checkpoint retention and Delta vacuum for every pipeline"
    listed = ", ".join(f"`{n}`" for n in names)
    doc_md = f"# barrierflow maintenance\n\nDaily retention of every pipeline ({listed}) in `{warehouse}`:\n\n{form_doc(form)}"
    with barrierflow_dag(settings, MAINTENANCE_DAG_ID, "maintenance", description, form, doc_md, schedule) as dag:
        for name in names:

            @task(task_id=f"maintain_{name}")
            def maintain(pipeline: str) -> dict[str, Any]:
                """Retention and vacuum of one pipeline."""
                params = get_current_context()["params"]
                if not objects.exists(PipelineLayout.of(warehouse, pipeline).pipeline_meta):
                    raise AirflowSkipException(f"pipeline {pipeline} has never run in warehouse {warehouse}: nothing to maintain")
                kept, hours = int(params["retained_checkpoints"]), int(params["vacuum_retention_hours"])
                op = PipelineDag.of(pipeline, settings, environ)
                doc = xcom_json(op.call(run_maintenance, retained_checkpoints=kept, vacuum_retention_hours=hours).to_json())
                _log.info("maintenance of %s: %s", pipeline, doc)
                return doc

            maintain(name)
    return dag
