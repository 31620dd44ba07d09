"""``barrierflow_<pipeline>_savepoint``: a savepoint (optionally stop-with-savepoint) as a manual run.

One task calls :func:`barrierflow.savepoint.create_savepoint`, which takes the
pipeline's epoch lease (so it waits for a running epoch and never races one)
and snapshots the last completed epoch. The form's ``stop_pipeline`` stops the
pipeline: its epoch DAG then skips every run, saying why, until a restore.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Mapping

from barrierflow.dags.docs import savepoint_doc
from barrierflow.dags.params import operational_params
from barrierflow.dags.settings import DagSettings, savepoint_dag_id
from barrierflow.errors import ParameterError, SavepointError
from barrierflow.pipeline import PipelineDefinition
from barrierflow.registry import get_pipeline

if TYPE_CHECKING:
    from airflow.sdk import DAG

__all__ = ["build_savepoint_dag"]

_log = logging.getLogger("barrierflow.dags")


def build_savepoint_dag(
    pipeline: str | PipelineDefinition,
    settings: DagSettings | None = None,
    environ: Mapping[str, str] | None = None,
) -> "DAG":
    from airflow.sdk import DAG, Param, get_current_context, task
    from airflow.sdk.exceptions import AirflowFailException

    definition = pipeline if isinstance(pipeline, PipelineDefinition) else get_pipeline(pipeline)
    settings = settings or DagSettings.from_env(environ)
    warehouse = settings.warehouse

    with DAG(
        dag_id=savepoint_dag_id(definition.name),
        description=f"savepoint (or stop with savepoint) of barrierflow pipeline {definition.name}",
        schedule=None,
        start_date=settings.start_date,
        catchup=False,
        max_active_runs=1,
        default_args=settings.default_args(),
        params={
            "savepoint_name": Param(
                "",
                type=["null", "string"],
                title="savepoint_name",
                description="name of the savepoint (letters, digits, _ . -); empty: generated (sp-<time>-<id>)",
            ),
            "description": Param("", type=["null", "string"], title="description", description="kept in the savepoint's metadata"),
            "stop_pipeline": Param(
                False,
                type="boolean",
                title="stop_pipeline",
                description="stop with savepoint: no epoch runs after it until the pipeline is restored",
            ),
        },
        doc_md=savepoint_doc(definition, settings),
        tags=["barrierflow", "savepoint"],
    ) as dag:

        @task(task_id="savepoint")
        def savepoint() -> dict[str, Any]:
            """Snapshot the last completed epoch (waits for a running epoch through the lease)."""
            from barrierflow.savepoint import create_savepoint

            params = get_current_context()["params"]
            try:
                metadata = create_savepoint(
                    definition,
                    warehouse,
                    name=(params.get("savepoint_name") or "").strip() or None,
                    description=params.get("description") or "",
                    stop=bool(params.get("stop_pipeline")),
                    params=operational_params(definition, warehouse, environ),
                    lease_wait_s=settings.lease_wait_s,
                )
            except (SavepointError, ParameterError) as exc:
                # A bad name, an existing savepoint, no completed epoch: a retry cannot help.
                raise AirflowFailException(f"savepoint of {definition.name} failed: {exc}") from exc
            doc = _plain(metadata.to_json())
            _log.info(
                "savepoint %r of %s at epoch %s written to %s%s",
                doc["name"], definition.name, doc["epoch"], doc["uri"],
                "; the pipeline is STOPPED until it is restored" if doc.get("stopped") else "",
            )
            return doc

        savepoint()
    return dag


def _plain(doc: Any) -> Any:
    """JSON types only (tuples become lists), as the XCom shown in the UI."""
    return json.loads(json.dumps(doc, default=str))
