"""``barrierflow_<pipeline>_reprocess``: restore, then replay every data interval since, as one manual run.

``plan >> reprocess`` call :mod:`barrierflow.operations.reprocess`: ``plan`` reports
the restore point and the epochs the replay will produce (one per data
interval of the pipeline DAG's schedule holding input) without changing
anything; ``reprocess`` holds the pipeline (the epoch DAG's runs plan
nothing meanwhile), restores with the sinks rewound (by default), replays
the intervals in order up to the last one that has ended, and releases the
hold. ``process`` work runs as the epoch DAG's does: on the warm engine, or
as one spark-submit per epoch.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Mapping

from barrierflow.airflow.dags.docs import reprocess_doc
from barrierflow.airflow.dags.lifecycle import run_epoch_steps
from barrierflow.airflow.dags.operations import fail_without_retry, operation_dag, xcom_json
from barrierflow.airflow.dags.params import operational_params
from barrierflow.airflow.dags.restore_dag import restore_point, restore_point_params
from barrierflow.airflow.dags.settings import CONNECT_MODE, DagSettings, reprocess_dag_id
from barrierflow.airflow.dags.spark_connect import engine_spark_factory
from barrierflow.airflow.dags.spark_submit import submit_process_job
from barrierflow.checkpointing.intervals import airflow_owner
from barrierflow.core.errors import ParameterError, SavepointError
from barrierflow.operations.reprocess import plan_reprocess
from barrierflow.operations.reprocess import reprocess as reprocess_pipeline
from barrierflow.plan.pipeline import PipelineDefinition
from barrierflow.plan.registry import get_pipeline

if TYPE_CHECKING:
    from airflow.sdk import DAG

    from barrierflow.checkpointing.coordinator import CheckpointCoordinator
    from barrierflow.checkpointing.intervals import ArrivalBound
    from barrierflow.operations.reprocess import ReprocessPlan

__all__ = ["build_reprocess_dag"]

_log = logging.getLogger("barrierflow.airflow.dags")


def _log_plan(plan: ReprocessPlan) -> None:
    for line in plan.describe():
        _log.info("%s", line)


def build_reprocess_dag(
    pipeline: str | PipelineDefinition,
    settings: DagSettings | None = None,
    environ: Mapping[str, str] | None = None,
) -> "DAG":
    from airflow.sdk import get_current_context, task

    definition = pipeline if isinstance(pipeline, PipelineDefinition) else get_pipeline(pipeline)
    settings = settings or DagSettings.from_env(environ)
    warehouse = settings.warehouse
    name = definition.name
    refused = (SavepointError, ParameterError)

    def point(params: Mapping[str, Any]) -> dict[str, Any]:
        savepoint, epoch = restore_point(params.get("savepoint"), params.get("epoch"))
        return {"savepoint": savepoint, "epoch": epoch}

    with operation_dag(
        dag_id=reprocess_dag_id(name),
        description=f"reprocess barrierflow pipeline {name}: restore, then replay every data interval since",
        settings=settings,
        params=restore_point_params(rewind_default=True),
        doc_md=reprocess_doc(definition, settings),
        tag="reprocess",
    ) as dag:

        @task(task_id="plan")
        def plan() -> dict[str, Any]:
            """The restore point and the epochs the replay will produce (nothing changes)."""

            params = get_current_context()["params"]
            with fail_without_retry(f"reprocessing of {name} refused", *refused):
                result = plan_reprocess(
                    definition,
                    warehouse,
                    schedule=settings.schedule,
                    params=operational_params(definition, warehouse, environ),
                    **point(params),
                )
            for line in result.describe():
                _log.info("%s", line)
            return xcom_json({"restore_epoch": result.restore_epoch, "epochs": [e.describe() for e in result.epochs]})

        @task(task_id="reprocess")
        def reprocess() -> dict[str, Any]:
            """Hold the pipeline, restore, replay its intervals in order, release the hold."""

            context = get_current_context()
            params = context["params"]
            replay = None
            if settings.process_mode != CONNECT_MODE:

                def replay(coordinator: "CheckpointCoordinator", bound: "ArrivalBound") -> list[int]:
                    """One spark-submit per epoch, as the epoch DAG's catch_up."""

                    def submit() -> None:
                        submit_process_job(
                            pipeline=name,
                            warehouse=warehouse,
                            application=settings.process_application,
                            params=coordinator.params,
                            lease_wait_s=settings.lease_wait_s,
                            conn_id=settings.conn_id,
                            driver_memory=settings.driver_memory,
                        )

                    epochs = []
                    while (done := run_epoch_steps(coordinator, bound, settings.lease_wait_s, submit)) is not None:
                        epochs.append(int(done.epoch or 0))
                    return epochs

            with fail_without_retry(f"reprocessing of {name} refused", *refused):
                result = reprocess_pipeline(
                    definition,
                    warehouse,
                    schedule=settings.schedule,
                    owner=airflow_owner(dag.dag_id, context["run_id"]),
                    rewind_sinks=bool(params.get("rewind_sinks")),
                    allow_non_restored_state=bool(params.get("allow_non_restored_state")),
                    parallelism=params.get("parallelism"),
                    params=operational_params(definition, warehouse, environ),
                    spark_factory=engine_spark_factory(settings.conn_id, name) if settings.process_mode == CONNECT_MODE else None,
                    replay=replay,
                    on_plan=_log_plan,
                    lease_wait_s=settings.lease_wait_s,
                    **point(params),
                )
            for line in result.describe():
                _log.info("%s", line)
            return xcom_json(result.to_json())

        plan() >> reprocess()
    return dag
