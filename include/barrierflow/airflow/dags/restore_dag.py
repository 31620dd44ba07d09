"""``barrierflow_<pipeline>_restore``: restore from a savepoint or a retained epoch, as a manual run (see ``_DOC``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Mapping

from barrierflow.airflow.dags.operations import Environ, PipelineDag, PipelineRef, barrierflow_dag, fail_without_retry, xcom_json
from barrierflow.airflow.dags.params import form_doc, form_field
from barrierflow.airflow.dags.settings import DagSettings, restore_dag_id
from barrierflow.core.errors import ParameterError, SavepointError
from barrierflow.operations.restore import restore as restore_pipeline

if TYPE_CHECKING:
    from airflow.sdk import DAG, Param

__all__ = ["build_restore_dag", "restore_point", "restore_form", "restore_options"]

_log = logging.getLogger("barrierflow.airflow.dags")
_DOC = """\
# Restore `{name}`

Restart the pipeline from a savepoint (by name) **or** a retained completed epoch: exactly one of `savepoint` and `epoch`
(`barrierflow.operations.restore.restore`). The restore starts a new lineage whose first completed epoch is the restore point.

{form}

An incompatible restore point fails the task at once (no retries) and the log lists the state that would be dropped or
is missing; so does invalid input.
"""


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


def restore_form(rewind_default: bool) -> dict[str, "Param"]:
    """The form of a restore point (savepoint or epoch) and how to restore it: the restore and reprocess DAGs."""
    optional_int = ["null", "integer"]
    return (
        form_field("savepoint", "", ["null", "string"], "savepoint name (or directory path); leave empty to restore an epoch")
        | form_field("epoch", None, optional_int, "a retained completed epoch; leave empty to restore a savepoint", minimum=1)
        | form_field("allow_non_restored_state", False, "boolean", "drop state the code no longer declares instead of failing")
        | form_field("rewind_sinks", rewind_default, "boolean", "rewind the sink tables to the restore point")
        | form_field("parallelism", None, optional_int, "Spark parallelism from the restore on (empty: unchanged)", minimum=1)
    )


def restore_options(params: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of a restore (or reprocessing) that :func:`restore_form` asks for."""
    savepoint, epoch = restore_point(params.get("savepoint"), params.get("epoch"))
    return {
        "savepoint": savepoint,
        "epoch": epoch,
        "allow_non_restored_state": bool(params.get("allow_non_restored_state")),
        "rewind_sinks": bool(params.get("rewind_sinks")),
        "parallelism": params.get("parallelism"),
    }


def build_restore_dag(pipeline: PipelineRef, settings: DagSettings | None = None, environ: Environ = None) -> "DAG":
    from airflow.sdk import get_current_context, task

    op = PipelineDag.of(pipeline, settings, environ)
    form = restore_form(rewind_default=False)
    description = f"restore barrierflow pipeline {op.name} from a savepoint or a retained epoch"
    doc_md = _DOC.format(name=op.name, form=form_doc(form))
    with barrierflow_dag(op.settings, restore_dag_id(op.name), "restore", description, form, doc_md) as dag:

        @task(task_id="restore")
        # IncompatibleSavepointError lists what would be dropped or is missing: like bad input, a retry cannot fix it.
        @fail_without_retry(f"restore of {op.name} refused", SavepointError, ParameterError)
        def restore() -> dict[str, Any]:
            """Start a new lineage from the restore point."""
            doc = xcom_json(op.call(restore_pipeline, **restore_options(get_current_context()["params"])).to_json())
            _log.info("restored %s: %s", op.name, doc)
            return doc

        restore()
    return dag
