"""Run barrierflow DAGs for real with ``dag.test()`` and read back what happened.

``dag.test()`` (Airflow 3.3, ``airflow/sdk/definitions/dag.py``) runs each
task in this process through the Task SDK's in-process supervisor and loops
``DagRun.update_state()`` until the run finishes. A task that fails with
retries left goes UP_FOR_RETRY; the loop sleeps until its retry delay (with
the exponential backoff) has passed, then runs it again as a new try. So real
Airflow retries happen here, with the task's own retry policy; the settings
below only shorten the delays to a second or two.

In-process also means a fault must not SIGKILL a Python task (it would kill
pytest): Python tasks fail with ``:raise``; ``:kill`` is used inside the
spark-submit job, a separate process, exactly as a lost driver would be.
And the runs of one DAG object share it: a param given in one run's conf can
still be set in the next run of the same object, so tests give every param
that matters in each conf (a deployed task runs in a fresh process).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

from barrierflow.airflow.dags.settings import DagSettings
from barrierflow.checkpointing.checkpoint import EpochStatus
from barrierflow.checkpointing.coordinator import CheckpointCoordinator

__all__ = [
    "RunOutcome",
    "dag_settings",
    "run_dag",
    "asset_events",
    "xcom",
    "fault_plan",
    "set_mtime",
    "minute",
    "task_logs",
    "running_dag_run",
    "completed_epochs",
]


def dag_settings(warehouse: Path | str, **overrides: Any) -> DagSettings:
    """Settings for tests: fast retries (1-2 s), a short lease wait, a small driver."""
    values: dict[str, Any] = dict(
        warehouse=str(warehouse),
        retries=2,
        retry_delay=timedelta(seconds=1),
        max_retry_delay=timedelta(seconds=2),
        lease_wait_s=60.0,
        driver_memory="1g",
    )
    values.update(overrides)
    return DagSettings(**values)


def completed_epochs(coordinator: CheckpointCoordinator) -> list[int]:
    """Completed epochs of the current lineage."""
    lineage_id = coordinator.current_lineage()["lineage_id"]
    return sorted({r.epoch for r in coordinator.log.lineage_records(lineage_id) if r.status is EpochStatus.COMPLETED})


@dataclass(frozen=True)
class RunOutcome:
    dag_id: str
    run_id: str
    state: str
    tasks: dict[str, tuple[str | None, int]] = field(default_factory=dict)  # task_id -> (state, try_number)

    def state_of(self, task_id: str) -> str | None:
        return self.tasks[task_id][0]

    def tries(self, task_id: str) -> int:
        return self.tasks[task_id][1]


def minute(year: int, month: int, day: int, hour: int, minute_: int, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute_, second, tzinfo=timezone.utc)


def run_dag(dag: Any, logical_date: datetime, conf: dict[str, Any] | None = None) -> RunOutcome:
    """One DAG run through ``dag.test()``; the data interval is the schedule's interval
    ending at ``logical_date`` (aligned down)."""
    dr = dag.test(logical_date=logical_date, run_conf=conf)
    tasks = {ti.task_id: (_text(ti.state), ti.try_number) for ti in dr.get_task_instances()}
    return RunOutcome(dag.dag_id, dr.run_id, str(_text(dr.state)), tasks)


def _text(state: Any) -> str | None:
    return None if state is None else str(getattr(state, "value", state))


def asset_events(run: RunOutcome) -> list[tuple[str, str, dict[str, Any]]]:
    """(task_id, asset name, extra) of every asset event the run emitted."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(AssetEvent.source_task_id, AssetModel.name, AssetEvent.extra)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetEvent.source_dag_id == run.dag_id, AssetEvent.source_run_id == run.run_id)
            .order_by(AssetEvent.id)
        ).all()
    return [(task, name, dict(extra or {})) for task, name, extra in rows]


def xcom(run: RunOutcome, task_id: str, key: str = "return_value") -> Any:
    """An XCom of a task of the run, its return value by default (None when it pushed none)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(XComModel.get_many(run_id=run.run_id, dag_ids=run.dag_id, task_ids=task_id, key=key)).first()
        return XComModel.deserialize_value(row) if row is not None else None


@contextmanager
def fault_plan(spec: str, state_dir: Path) -> Iterator[None]:
    """``BARRIERFLOW_FAULT`` with a crossing counter shared by every process (tasks and Spark jobs)."""
    saved = {k: os.environ.get(k) for k in ("BARRIERFLOW_FAULT", "BARRIERFLOW_FAULT_STATE")}
    os.environ["BARRIERFLOW_FAULT"] = spec
    os.environ["BARRIERFLOW_FAULT_STATE"] = str(state_dir)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def set_mtime(path: Path, when: datetime) -> None:
    """Pretend ``path`` landed at ``when`` (the file source bounds epochs by arrival time)."""
    ns = int(when.timestamp() * 1_000_000_000)
    os.utime(path, ns=(ns, ns))


def task_logs(caplog: Any, capfd: Any) -> str:
    """What the tasks logged since the last call (and clear it).

    Run in-process, a task's standard-library log records (``barrierflow.airflow.dags``)
    reach pytest's log capture, while Airflow's own task messages (a failure's
    traceback) are printed: both together are the task log.
    """
    text = caplog.text + capfd.readouterr().out
    caplog.clear()
    return text


@contextmanager
def running_dag_run(dag: Any, logical_date: datetime, state: str = "running") -> Iterator[str]:
    """A run of ``dag`` left ``state`` (running or queued) at ``logical_date``, as a backfill's are; failed on exit.

    Created like ``dag.test()`` creates its runs, from the DAG's serialized form.
    """
    from airflow.models.dagrun import DagRun, get_or_create_dagrun
    from airflow.serialization.serialized_objects import DagSerialization
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunTriggeredByType

    scheduler_dag = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    run_id = f"earlier__{logical_date.isoformat()}"
    with create_session() as session:
        get_or_create_dagrun(
            dag=scheduler_dag,
            run_id=run_id,
            logical_date=logical_date,
            data_interval=(logical_date - timedelta(minutes=1), logical_date),
            run_after=logical_date,
            conf=None,
            triggered_by=DagRunTriggeredByType.TEST,
            triggering_user_name="test",
            start_date=logical_date,
            session=session,
        )
        run = session.query(DagRun).filter(DagRun.dag_id == dag.dag_id, DagRun.run_id == run_id).one()
        run.state = DagRunState(state)
    try:
        yield run_id
    finally:
        with create_session() as session:
            run = session.query(DagRun).filter(DagRun.dag_id == dag.dag_id, DagRun.run_id == run_id).one()
            run.state = DagRunState.FAILED
