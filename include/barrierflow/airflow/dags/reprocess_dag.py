"""``barrierflow_<pipeline>_reprocess``: restore, then replay every data interval since, as one manual run (``_DOC``).

``process`` work runs as the epoch DAG's does: on the warm engine, or as one spark-submit per epoch."""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any

from barrierflow.airflow.dags.lifecycle import run_epochs
from barrierflow.airflow.dags.operations import Environ, PipelineDag, PipelineRef, barrierflow_dag, fail_without_retry, xcom_json
from barrierflow.airflow.dags.params import form_doc
from barrierflow.airflow.dags.restore_dag import restore_form, restore_options, restore_point
from barrierflow.airflow.dags.settings import CONNECT_MODE, DagSettings, pipeline_dag_id, reprocess_dag_id
from barrierflow.airflow.dags.spark_submit import submit_process_job
from barrierflow.checkpointing.intervals import airflow_owner
from barrierflow.core.errors import ParameterError, SavepointError
from barrierflow.operations.reprocess import plan_reprocess
from barrierflow.operations.reprocess import reprocess as reprocess_pipeline

if TYPE_CHECKING:
    from airflow.sdk import DAG

    from barrierflow.checkpointing.coordinator import CheckpointCoordinator
    from barrierflow.checkpointing.intervals import ArrivalBound

__all__ = ["build_reprocess_dag"]

_log = logging.getLogger("barrierflow.airflow.dags")
_DOC = """\
# Reprocess `{name}`

Restore a savepoint (by name) **or** a retained completed epoch, then replay the input that arrived after it, **one
epoch per data interval** of the schedule ({schedule}) that holds input, in order, up to the last ended interval
(`barrierflow.operations.reprocess`): the sinks end up as if the history had run once with the current code.

- `plan` reports the restore point and the epochs the replay will produce; nothing changes.
- `reprocess` **holds** `{pipeline_dag}` (its runs plan nothing meanwhile and say so), restores (sinks rewound by
  default), replays, and releases the hold (also on failure: the schedule then goes on replaying interval by interval).

{form}
"""


def _log_lines(result: Any) -> None:
    for line in result.describe():
        _log.info("%s", line)


def build_reprocess_dag(pipeline: PipelineRef, settings: DagSettings | None = None, environ: Environ = None) -> "DAG":
    from airflow.sdk import get_current_context, task

    op = PipelineDag.of(pipeline, settings, environ)
    settings, name = op.settings, op.name
    on_engine = settings.process_mode == CONNECT_MODE
    refused = fail_without_retry(f"reprocessing of {name} refused", SavepointError, ParameterError)
    form = restore_form(rewind_default=True)
    description = f"reprocess barrierflow pipeline {name}: restore, then replay every data interval since"
    schedule = f"`{settings.schedule}`" if settings.schedule else "none (manual runs): epochs are not cut by interval"
    doc_md = _DOC.format(name=name, schedule=schedule, pipeline_dag=pipeline_dag_id(name), form=form_doc(form))
    with barrierflow_dag(settings, reprocess_dag_id(name), "reprocess", description, form, doc_md) as dag:

        @task(task_id="plan")
        @refused
        def plan() -> dict[str, Any]:
            """The restore point and the epochs the replay will produce (nothing changes)."""
            params = get_current_context()["params"]
            savepoint, epoch = restore_point(params.get("savepoint"), params.get("epoch"))
            result = plan_reprocess(
                op.definition, op.warehouse, schedule=settings.schedule, params=op.params(), savepoint=savepoint, epoch=epoch
            )
            _log_lines(result)
            return xcom_json({"restore_epoch": result.restore_epoch, "epochs": [e.describe() for e in result.epochs]})

        def replay(coordinator: "CheckpointCoordinator", bound: "ArrivalBound") -> list[int]:
            """One spark-submit per epoch, as the epoch DAG's catch_up."""
            process = partial(submit_process_job, settings, coordinator)
            return [int(r.epoch or 0) for r in run_epochs(coordinator, bound, settings.lease_wait_s, process)]

        @task(task_id="reprocess")
        @refused
        def reprocess() -> dict[str, Any]:
            """Hold the pipeline, restore, replay its intervals in order, release the hold."""
            context = get_current_context()
            result = op.call(
                reprocess_pipeline,
                schedule=settings.schedule,
                owner=airflow_owner(dag.dag_id, context["run_id"]),
                spark_factory=op.spark_factory(),
                replay=None if on_engine else replay,
                on_plan=_log_lines,
                **restore_options(context["params"]),
            )
            _log_lines(result)
            return xcom_json(result.to_json())

        plan() >> reprocess()
    return dag
