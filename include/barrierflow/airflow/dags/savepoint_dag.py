"""``barrierflow_<pipeline>_savepoint``: a savepoint (optionally stop-with-savepoint) as a manual run (see ``_DOC``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from barrierflow.airflow.dags.operations import Environ, PipelineDag, PipelineRef, barrierflow_dag, fail_without_retry, xcom_json
from barrierflow.airflow.dags.params import form_doc, form_field
from barrierflow.airflow.dags.settings import DagSettings, restore_dag_id, savepoint_dag_id
from barrierflow.core.errors import ParameterError, SavepointError
from barrierflow.operations.savepoint import create_savepoint

if TYPE_CHECKING:
    from airflow.sdk import DAG

__all__ = ["build_savepoint_dag"]

_log = logging.getLogger("barrierflow.airflow.dags")
_DOC = """\
# Savepoint of `{name}`

Trigger with the form to write a self-contained savepoint of the last completed epoch to `{warehouse}/_savepoints/{name}/<name>/`
(`barrierflow.operations.savepoint.create_savepoint`). The task takes the pipeline's epoch lease, so it waits for a running epoch
and never races one. Stopping the pipeline makes its epoch DAG skip every run, saying why, until a restore.

{form}

Restore it with `{restore_dag}`.
"""


def build_savepoint_dag(pipeline: PipelineRef, settings: DagSettings | None = None, environ: Environ = None) -> "DAG":
    from airflow.sdk import get_current_context, task

    op = PipelineDag.of(pipeline, settings, environ)
    form = (
        form_field("savepoint_name", "", ["null", "string"], "name (letters, digits, _ . -); empty: generated (sp-<time>-<id>)")
        | form_field("description", "", ["null", "string"], "free text kept in the savepoint's metadata")
        | form_field("stop_pipeline", False, "boolean", "**stop with savepoint**: no epoch runs after it until a restore")
    )
    description = f"savepoint (or stop with savepoint) of barrierflow pipeline {op.name}"
    doc_md = _DOC.format(name=op.name, warehouse=op.warehouse, form=form_doc(form), restore_dag=restore_dag_id(op.name))
    with barrierflow_dag(op.settings, savepoint_dag_id(op.name), "savepoint", description, form, doc_md) as dag:

        @task(task_id="savepoint")
        @fail_without_retry(f"savepoint of {op.name} failed", SavepointError, ParameterError)  # a bad or taken name, no epoch
        def savepoint() -> dict[str, Any]:
            """Snapshot the last completed epoch (waits for a running epoch through the lease)."""
            params = get_current_context()["params"]
            name = (params.get("savepoint_name") or "").strip() or None
            stop = bool(params.get("stop_pipeline"))
            doc = xcom_json(
                op.call(create_savepoint, name=name, description=params.get("description") or "", stop=stop).to_json()
            )
            stopped = "; the pipeline is STOPPED until it is restored" if doc.get("stopped") else ""
            _log.info("savepoint %r of %s at epoch %s written to %s%s", doc["name"], op.name, doc["epoch"], doc["uri"], stopped)
            return doc

        savepoint()
    return dag
