"""``barrierflow_<pipeline>``: one DAG run is one epoch, plus a bounded catch-up.

``barrier >> process >> commit >> catch_up`` drive the five steps of
:mod:`barrierflow.checkpointing.coordinator` (see :mod:`barrierflow.airflow.dags.lifecycle`):
``barrier`` recovers (step 1) and plans or replays the barrier (step 2);
``process`` is step 3, on the warm Spark engine through Spark Connect (the
``spark_connect_default`` connection) or, with ``BARRIERFLOW_PROCESS_MODE=spark-submit``,
as a spark-submit of ``spark_jobs/process_epoch.py`` (a new Spark application
per epoch, for clusters that only take batch submissions); ``commit`` commits
(step 4) and notifies (step 5). Steps 1-2 and 4-5 are small documents and
Delta commits, so each pair is one task: every task costs a scheduling round
trip and a task process, which dominate an epoch on a warm engine.
``catch_up`` runs up to ``catch_up_epochs - 1`` more epochs with the run's
arrival cut-off, so a run drains what arrived in its interval even when that
is more than one epoch's ``max_files_per_epoch``; ``commit`` skips it (without
starting it) when no further input arrived by that cut-off.
``barrier`` short-circuits the rest of the run when there is nothing to do
(no new input by the run's ``data_interval_end``, or a pipeline stopped with a
savepoint), so no asset event is emitted; ``commit`` carries an asset per sink.

Ordering: ``max_active_runs=1`` serialises scheduled and manual runs. An
Airflow 3 backfill counts its own ``max_active_runs`` (10 unless given), so
``barrier`` also waits, bounded, while an earlier run of this DAG is still
running: epochs follow data intervals even in a parallel backfill.

Building the DAG does no work: it reads environment variables and builds the
pipeline's operator graph (no Spark, no warehouse access).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from barrierflow.airflow.dags.assets import pipeline_sinks, sink_assets
from barrierflow.airflow.dags.docs import pipeline_doc
from barrierflow.airflow.dags.lifecycle import (
    StepReport,
    barrier_step,
    commit_step,
    notify_step,
    process_step,
    run_epoch_steps,
)
from barrierflow.airflow.dags.operations import fail_without_retry
from barrierflow.airflow.dags.params import CATCH_UP_PARAM, pipeline_dag_params, resolve_pipeline_params, unset_required_params
from barrierflow.airflow.dags.settings import CONNECT_MODE, SPARK_SUBMIT_MODE, DagSettings, pipeline_dag_id
from barrierflow.airflow.dags.spark_connect import engine_spark_factory
from barrierflow.airflow.dags.spark_submit import ProcessEpochOperator, submit_process_job
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.checkpointing.intervals import ArrivalBound, airflow_owner, airflow_run_of
from barrierflow.core.errors import (
    BarrierflowError,
    BlockedInputError,
    ConfigurationError,
    EpochInProgressError,
    ParameterError,
    PipelineDefinitionError,
    UnknownPipelineError,
)
from barrierflow.plan.pipeline import PipelineDefinition
from barrierflow.plan.registry import get_pipeline

if TYPE_CHECKING:
    from airflow.sdk import DAG, Asset, Context

__all__ = ["build_pipeline_dag", "arrival_cutoff_ms", "arrival_bound", "owner_active", "TASK_IDS", "REPORT_KEY"]

TASK_IDS = ("barrier", "process", "commit", "catch_up")
_log = logging.getLogger("barrierflow.airflow.dags")
_PREVIOUS_RUN_POLL_S = 2.0
_PROCESS_DOCS = {
    CONNECT_MODE: "Step 3 on the warm Spark engine (Spark Connect): stage outputs and state, write the manifest (the vote).",
    SPARK_SUBMIT_MODE: "Step 3: spark-submit `process_epoch.py`: stage outputs and state, write the manifest (the vote).",
}


def arrival_cutoff_ms(context: "Context") -> int | None:
    """The run's barrier bound: input that arrived by ``data_interval_end`` (None: all input so far)."""
    end = context.get("data_interval_end")
    return int(end.timestamp() * 1000) if end is not None else None


def arrival_bound(context: "Context", settings: DagSettings) -> ArrivalBound:
    """What this run's epochs may take: input by its interval's end, cut at the schedule's intervals."""
    owner = airflow_owner(context["ti"].dag_id, context["run_id"])
    return ArrivalBound(cutoff_ms=arrival_cutoff_ms(context), schedule=settings.schedule, owner=owner)


def owner_active(context: "Context") -> Callable[[str], bool]:
    """Whether the Airflow run an owner name names is queued or running, as Airflow's API says.

    Any other owner (a ``barrierflow`` command, a name from before owners
    were recorded) is not an Airflow run: False.
    """
    ti = context["ti"]

    def active(owner: str) -> bool:
        run = airflow_run_of(owner)
        if run is None:
            return False
        try:
            state = ti.get_dagrun_state(*run)
        except Exception as exc:  # noqa: BLE001 - e.g. a run that was deleted: it is not active
            _log.info("run %s of %s: no state (%s); treated as ended", run[1], run[0], exc)
            return False
        return str(getattr(state, "value", state)) in ("queued", "running")

    return active


# Errors in what the run was asked to do: retrying the same request cannot fix them.
_NOT_RETRYABLE = (ParameterError, PipelineDefinitionError, ConfigurationError, UnknownPipelineError, BlockedInputError)


REPORT_KEY = "report"


def _report(report: StepReport) -> dict[str, Any]:
    _log.info("%s %s: %s", report.pipeline, report.step, report.message)
    return report.to_json()


def _push_report(context: "Context", report: StepReport) -> dict[str, Any]:
    """Log the report and keep it as the task's ``report`` XCom: a short-circuit
    task's return value is its condition, so the report needs its own key."""
    payload = _report(report)
    context["ti"].xcom_push(REPORT_KEY, payload)
    return payload


@contextmanager
def _epoch_task(definition: PipelineDefinition, settings: DagSettings) -> Iterator[tuple["Context", CheckpointCoordinator]]:
    """What every epoch task starts with: its context and a coordinator on the run's params.

    Errors a retry cannot fix (bad params, a bad setting, input that blocks
    the pipeline) fail the task at once, wherever in the task they are
    raised; the rest are retried.
    """
    from airflow.sdk import get_current_context

    context = get_current_context()
    with fail_without_retry(None, *_NOT_RETRYABLE):
        params = resolve_pipeline_params(definition, context["params"])
        spark_factory = engine_spark_factory(settings.conn_id, definition.name) if settings.process_mode == CONNECT_MODE else None
        yield context, CheckpointCoordinator(definition, params, settings.warehouse, spark_factory=spark_factory)


def _wait_for_earlier_runs(context: "Context", wait_s: float) -> None:
    """Block (bounded) while a run of this DAG with an earlier logical date is queued or running.

    Airflow's own ``max_active_runs`` does not order a backfill's runs
    against scheduled ones, and ``depends_on_past`` would wait forever behind
    a failed run; so each run asks Airflow for earlier runs that are queued
    or running (a run whose task awaits a retry is running) and waits for them.
    """
    from airflow.sdk import DagRunState

    ti = context["ti"]
    deadline = time.monotonic() + wait_s
    announced: str | None = None
    while True:
        # Queued first: a run moving from queued to running between the two questions is then
        # seen as running (asked in the other order, it would be missed by both).
        earlier = ti.get_previous_dagrun(state=DagRunState.QUEUED) or ti.get_previous_dagrun(state=DagRunState.RUNNING)
        if earlier is None:
            return
        if time.monotonic() >= deadline:
            raise EpochInProgressError(
                f"run {earlier.run_id} of {ti.dag_id} (an earlier data interval) is still running after "
                f"{wait_s:.0f}s; epochs run in data-interval order"
            )
        if announced != earlier.run_id:
            _log.info(
                "waiting for the earlier run %s of %s (%s) to finish: epochs run in data-interval order",
                earlier.run_id,
                ti.dag_id,
                getattr(earlier.state, "value", earlier.state),
            )
            announced = earlier.run_id
        time.sleep(min(_PREVIOUS_RUN_POLL_S, max(0.1, deadline - time.monotonic())))


def _more_input(coordinator: CheckpointCoordinator, bound: ArrivalBound) -> bool:
    """Whether another epoch has input by the cut-off; the epoch is committed either way.

    A source that cannot plan (e.g. a file landed behind the stream
    position) is the next barrier's error to report, not this commit's.
    """
    try:
        return coordinator.has_new_input(bound)
    except BarrierflowError as exc:
        _log.warning("catch_up is skipped: the next epoch cannot be planned: %s", exc)
        return False


def _set_asset_events(context: "Context", assets: list["Asset"], report: StepReport) -> None:
    """Attach the epoch to the asset events the task emits on success."""
    events = context["outlet_events"]
    for asset in assets:
        events[asset].extra = {
            "pipeline": report.pipeline,
            "epoch": report.epoch,
            "lineage_id": report.lineage_id,
            "delta_version": (report.details.get("table_versions") or {}).get(asset.extra.get("sink", "")),
        }


def build_pipeline_dag(
    pipeline: str | PipelineDefinition,
    settings: DagSettings | None = None,
    environ: Mapping[str, str] | None = None,
) -> "DAG":
    """The epoch DAG of one pipeline (``barrierflow_<pipeline>``)."""
    from airflow.sdk import DAG, CronDataIntervalTimetable, task
    from airflow.sdk.exceptions import AirflowSkipException

    definition = pipeline if isinstance(pipeline, PipelineDefinition) else get_pipeline(pipeline)
    name = definition.name
    settings = settings or DagSettings.from_env(environ)
    sinks = pipeline_sinks(definition, settings.warehouse, environ)
    assets = sink_assets(sinks, name)
    lease_wait = settings.lease_wait_s
    warehouse = settings.warehouse
    # A pipeline missing a required parameter would fail every scheduled run: manual runs only.
    unset = unset_required_params(definition, environ)
    schedule = CronDataIntervalTimetable(settings.schedule, timezone="UTC") if settings.schedule and not unset else None
    summary = (definition.description or name).strip().splitlines()[0]

    with DAG(
        dag_id=pipeline_dag_id(name),
        description=f"barrierflow pipeline {name}: {summary}"[:200],
        schedule=schedule,
        start_date=settings.start_date,
        catchup=False,
        max_active_runs=1,
        default_args=settings.default_args(),
        params=pipeline_dag_params(definition, environ),
        doc_md=pipeline_doc(definition, settings, sinks, environ),
        tags=["barrierflow", "pipeline"],
    ) as dag:

        @task.short_circuit(task_id="barrier")
        def barrier() -> dict[str, Any] | bool:
            """Steps 1-2: recover, then record the epoch's end offsets before processing (a retry replays them)."""
            with _epoch_task(definition, settings) as (context, coordinator):
                _wait_for_earlier_runs(context, lease_wait)
                report = barrier_step(coordinator, arrival_bound(context, settings), lease_wait, owner_active(context))
                payload = _push_report(context, report)
            return payload if report.proceed else False

        if settings.process_mode == CONNECT_MODE:

            @task(task_id="process", doc_md=_PROCESS_DOCS[CONNECT_MODE])
            def process_on_engine() -> dict[str, Any]:
                """Step 3 on the warm engine: stage outputs and state, write the manifest (the vote)."""
                with _epoch_task(definition, settings) as (_, coordinator):
                    return _report(process_step(coordinator, lease_wait))

            process: Any = process_on_engine()
        else:
            process = ProcessEpochOperator(
                task_id="process",
                pipeline=name,
                warehouse=warehouse,
                application=settings.process_application,
                lease_wait_s=lease_wait,
                conn_id=settings.conn_id,
                driver_memory=settings.driver_memory,
                doc_md=_PROCESS_DOCS[SPARK_SUBMIT_MODE],
            )

        @task.short_circuit(task_id="commit", outlets=assets)
        def commit() -> dict[str, Any] | bool:
            """Steps 4-5: one Delta commit per table (app transaction), COMPLETED, then notify.

            Returns False (``catch_up`` is skipped without starting) when no
            further input arrived by the run's cut-off.
            """
            with _epoch_task(definition, settings) as (context, coordinator):
                report = commit_step(coordinator, lease_wait)
                payload = _push_report(context, report)
                if not report.proceed:
                    raise AirflowSkipException(report.message)
                _set_asset_events(context, assets, report)
                _report(notify_step(coordinator, lease_wait))
                if int(context["params"].get(CATCH_UP_PARAM) or 1) > 1 and _more_input(
                    coordinator, arrival_bound(context, settings)
                ):
                    return payload
            _log.info("no further input up to this run's arrival cut-off: catch_up is skipped")
            return False

        @task(task_id="catch_up", outlets=assets)
        def catch_up() -> dict[str, Any]:
            """Up to catch_up_epochs - 1 more epochs with the same arrival cut-off."""
            with _epoch_task(definition, settings) as (context, coordinator):
                extra = int(context["params"].get(CATCH_UP_PARAM) or 1) - 1
                if extra < 1:
                    raise AirflowSkipException(f"{CATCH_UP_PARAM}=1: this run completes one epoch only")
                bound = arrival_bound(context, settings)

                def process_epoch() -> None:
                    if settings.process_mode == CONNECT_MODE:
                        _report(process_step(coordinator, lease_wait))
                    else:
                        submit_process_job(
                            pipeline=name,
                            warehouse=warehouse,
                            application=settings.process_application,
                            params=coordinator.params,
                            lease_wait_s=lease_wait,
                            conn_id=settings.conn_id,
                            driver_memory=settings.driver_memory,
                        )

                done: list[StepReport] = []
                for _ in range(extra):
                    committed = run_epoch_steps(
                        coordinator,
                        bound,
                        lease_wait,
                        process_epoch,
                        on_report=_report,
                        owner_active=owner_active(context),
                    )
                    if committed is None:
                        break
                    done.append(committed)
            if not done:
                raise AirflowSkipException("caught up: no further input up to this run's arrival cut-off")
            _set_asset_events(context, assets, done[-1])
            return {"epochs": [r.epoch for r in done]}

        barrier() >> process >> commit() >> catch_up()
    return dag
