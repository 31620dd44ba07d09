"""``barrierflow_<pipeline>_restore``: restore from a savepoint or a retained epoch, as a manual run.

One task calls :func:`barrierflow.operations.restore.restore`. An incompatible restore
point (state that would be dropped or is missing) fails the task at once,
without retries, with the lists in the log; so does invalid input.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Mapping

from barrierflow.airflow.dags.docs import restore_doc
from barrierflow.airflow.dags.operations import fail_without_retry, operation_dag, xcom_json
from barrierflow.airflow.dags.params import operational_params
from barrierflow.airflow.dags.settings import DagSettings, restore_dag_id
from barrierflow.core.errors import ParameterError, SavepointError
from barrierflow.operations.restore import restore as restore_pipeline
from barrierflow.plan.pipeline import PipelineDefinition
from barrierflow.plan.registry import get_pipeline

if TYPE_CHECKING:
    from airflow.sdk import DAG

__all__ = ["build_restore_dag", "restore_point", "restore_point_params"]

_log = logging.getLogger("barrierflow.airflow.dags")


def restore_point(savepoint: Any, epoch: Any) -> tuple[str | None, int | None]:
    """Exactly one of a savepoint name or an epoch from the form; ParameterError otherwise."""
    name = str(savepoint).strip() if savepoint is not None else ""
    if (name == "") == (epoch is None):
        raise ParameterError(
            "give exactly one of 'savepoint' (a savepoint name or path) and 'epoch' (a retained completed epoch)"
        )
    if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1):
        raise ParameterError(f"'epoch' must be a positive integer, got {epoch!r}")
    return (name or None), epoch


def restore_point_params(rewind_default: bool) -> dict[str, Any]:
    """The form of a restore point (savepoint or epoch) and how to restore it: the restore and reprocess DAGs."""
    from airflow.sdk import Param

    return {
        "savepoint": Param(
            "",
            type=["null", "string"],
            title="savepoint",
            description="savepoint name (or directory path); leave empty to restore an epoch",
        ),
        "epoch": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            title="epoch",
            description="a retained completed epoch; leave empty to restore a savepoint",
        ),
        "allow_non_restored_state": Param(
            False,
            type="boolean",
            title="allow_non_restored_state",
            description="drop state in the restore point that the code no longer declares instead of failing",
        ),
        "rewind_sinks": Param(
            rewind_default, type="boolean", title="rewind_sinks", description="rewind the sink tables to the restore point"
        ),
        "parallelism": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            title="parallelism",
            description="Spark parallelism from the restore on (empty: unchanged)",
        ),
    }


def build_restore_dag(
    pipeline: str | PipelineDefinition,
    settings: DagSettings | None = None,
    environ: Mapping[str, str] | None = None,
) -> "DAG":
    from airflow.sdk import get_current_context, task

    definition = pipeline if isinstance(pipeline, PipelineDefinition) else get_pipeline(pipeline)
    settings = settings or DagSettings.from_env(environ)
    warehouse = settings.warehouse

    with operation_dag(
        dag_id=restore_dag_id(definition.name),
        description=f"restore barrierflow pipeline {definition.name} from a savepoint or a retained epoch",
        settings=settings,
        params=restore_point_params(rewind_default=False),
        doc_md=restore_doc(definition, settings),
        tag="restore",
    ) as dag:

        @task(task_id="restore")
        def restore() -> dict[str, Any]:
            """Start a new lineage from the restore point."""

            params = get_current_context()["params"]
            # IncompatibleSavepointError (a SavepointError) lists what would be dropped or is
            # missing; like a wrong name or bad input, a retry cannot fix it.
            with fail_without_retry(f"restore of {definition.name} refused", SavepointError, ParameterError):
                savepoint, epoch = restore_point(params.get("savepoint"), params.get("epoch"))
                result = restore_pipeline(
                    definition,
                    warehouse,
                    savepoint=savepoint,
                    epoch=epoch,
                    allow_non_restored_state=bool(params.get("allow_non_restored_state")),
                    rewind_sinks=bool(params.get("rewind_sinks")),
                    parallelism=params.get("parallelism"),
                    params=operational_params(definition, warehouse, environ),
                    lease_wait_s=settings.lease_wait_s,
                )
            doc = xcom_json(result.to_json())
            _log.info("restored %s: %s", definition.name, doc)
            return doc

        restore()
    return dag
