"""One Airflow DAG run's part in a pipeline: what the run page's "Checkpoint" tab shows.

A pipeline DAG run plans the epoch of its data interval (or several, when it
catches up), and a reprocess run replays epochs: each barrier records the run
that planned it (``planned_by`` = ``<dag_id>:<run_id>``). From a DAG id and a
run id this module finds the pipeline and the epochs that run planned, with
the failed attempts of those epochs, and the pipeline's state now (blocked
or stopped), which a run's failure may be the cause or a symptom of. The
checkpoints page links each epoch to its run; this is the way back, from the
run to its epochs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping

from barrierflow.airflow.dags.settings import pipeline_dag_id, reprocess_dag_id, restore_dag_id, savepoint_dag_id
from barrierflow.airflow.ui.history import EpochRow, Failure, PipelineHistory
from barrierflow.checkpointing.intervals import airflow_owner

__all__ = ["DagRole", "RunView", "find_pipeline", "run_view"]


class DagRole:
    """What a barrierflow DAG does for its pipeline (the DAG ids of ``barrierflow.airflow.dags.settings``)."""

    PIPELINE = "pipeline"
    SAVEPOINT = "savepoint"
    RESTORE = "restore"
    REPROCESS = "reprocess"


def _dag_ids(pipeline: str) -> dict[str, str]:

    return {
        pipeline_dag_id(pipeline): DagRole.PIPELINE,
        savepoint_dag_id(pipeline): DagRole.SAVEPOINT,
        restore_dag_id(pipeline): DagRole.RESTORE,
        reprocess_dag_id(pipeline): DagRole.REPROCESS,
    }


def find_pipeline(dag_id: str, pipelines: Iterable[str]) -> tuple[str, str] | None:
    """(pipeline, role) of the barrierflow DAG ``dag_id`` among ``pipelines``; None for any other DAG."""
    for name in pipelines:
        role = _dag_ids(name).get(dag_id)
        if role:
            return name, role
    return None


@dataclass(frozen=True)
class RunView:
    """The epochs one DAG run planned, at their furthest status."""

    dag_id: str
    run_id: str
    pipeline: str | None  # None: not a DAG of a pipeline in this warehouse
    role: str | None
    epochs: tuple[EpochRow, ...] = ()  # by lineage order of recording, then epoch
    failures: tuple[Failure, ...] = ()  # failed attempts of those epochs, newest first
    blocked: Mapping[str, Any] | None = None  # the pipeline's blocked state now (coordinator.blocked_state)
    stopped: Mapping[str, Any] | None = None  # the stop marker now, while stopped with a savepoint
    current_lineage_id: str | None = None
    error: str | None = None  # the pipeline's history could not be read

    def to_json(self) -> dict[str, Any]:
        return {
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "pipeline": self.pipeline,
            "role": self.role,
            "epochs": [e.to_json() for e in self.epochs],
            "failures": [asdict(f) for f in self.failures],
            "blocked": dict(self.blocked) if self.blocked is not None else None,
            "stopped": dict(self.stopped) if self.stopped is not None else None,
            "current_lineage_id": self.current_lineage_id,
            "error": self.error,
        }


def run_view(dag_id: str, run_id: str, found: tuple[str, str] | None, history: PipelineHistory | None) -> RunView:
    """What run ``run_id`` of ``dag_id`` did to its pipeline (``found`` by :func:`find_pipeline`)."""
    if found is None or history is None:
        return RunView(dag_id, run_id, None, None)
    pipeline, role = found
    owner = airflow_owner(dag_id, run_id)
    epochs = tuple(sorted((e for e in history.epochs if e.planned_by == owner), key=lambda e: e.recorded_at_us))
    planned = {(e.lineage_id, e.epoch) for e in epochs}
    failures = tuple(f for f in history.failures if (f.lineage_id, f.epoch) in planned)
    return RunView(
        dag_id, run_id, pipeline, role, epochs, failures, history.blocked, history.stopped,
        history.current_lineage_id, history.error,
    )  # fmt: skip
