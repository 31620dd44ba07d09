"""``barrierflow_<pipeline>``: one DAG run is one epoch, plus a bounded catch-up.

``barrier >> process >> commit >> catch_up`` drive the five steps of :mod:`barrierflow.checkpointing.coordinator`
through :mod:`~barrierflow.airflow.dags.lifecycle`; :func:`pipeline_doc` says what each task does and why. Building
the DAG reads environment variables and the pipeline's operator graph only (no Spark, no warehouse access).
"""

from __future__ import annotations

import inspect
import logging
import shlex
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from barrierflow.airflow.dags.lifecycle import StepReport, barrier_step, commit_step, notify_step, process_step, run_epochs
from barrierflow.airflow.dags.operations import Environ, PipelineDag, PipelineRef, barrierflow_dag, fail_without_retry
from barrierflow.airflow.dags.params import (
    CATCH_UP_PARAM,
    form_doc,
    introspection_params,
    pipeline_dag_params,
    resolve_pipeline_params,
    unset_required_params,
)
from barrierflow.airflow.dags.settings import (
    CONNECT_MODE,
    DagSettings,
    param_env_var,
    pipeline_dag_id,
    restore_dag_id,
    savepoint_dag_id,
)
from barrierflow.airflow.dags.spark_submit import ProcessEpochOperator, submit_process_job
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.checkpointing.intervals import ArrivalBound, airflow_owner, airflow_run_of
from barrierflow.core import errors
from barrierflow.plan.pipeline import PipelineDefinition
from barrierflow.storage.layout import PipelineLayout
from barrierflow.storage.objects import normalize_uri

if TYPE_CHECKING:
    from airflow.sdk import DAG, Asset, Context, Param

__all__ = ["build_pipeline_dag", "pipeline_doc"]

_log = logging.getLogger("barrierflow.airflow.dags")
_PREVIOUS_RUN_POLL_S = 2.0
_IN_ORDER = "epochs run in data-interval order"
# Errors in what the run was asked to do: retrying the same request cannot fix them.
_NOT_RETRYABLE = (
    errors.ParameterError,
    errors.PipelineDefinitionError,
    errors.ConfigurationError,
    errors.UnknownPipelineError,
    errors.BlockedInputError,
)


_LIFECYCLE = """\
Each DAG run is one **epoch**, a barrier-delimited slice of the stream, committed exactly once in two phases:

| task | lifecycle steps |
|---|---|
| `barrier` | 1. read the checkpoint log; roll forward an epoch whose manifest is durable; the last COMPLETED epoch is the restore point. 2. fix every source's end offsets (input that arrived by the run's `data_interval_end`) and record them *before* processing; a retry replays the recorded barrier. No new input, or a pipeline stopped with a savepoint: the rest of the run is skipped and says why |
| `process` | 3. on the Spark engine (see below): read exactly the barrier's records, stage outputs and state invisibly, write the manifest (the vote) |
| `commit` | 4. one Delta commit per table with the app transaction (pipeline, epoch), then COMPLETED in the checkpoint log; emits an asset event per sink. 5. clean losing attempts' staging, compact state. Skips `catch_up` when no further input arrived by the cut-off |
| `catch_up` | up to `catch_up_epochs - 1` more epochs (same arrival cut-off), each through steps 1-5 |

Steps 1-2 and 4-5 share a task because each task costs a scheduling round trip and a task process, more than those
steps themselves. Every step is idempotent and retried with exponential backoff, except on errors no retry can fix (bad
parameters, input that blocks the pipeline such as a refused late file): those fail the task at once and the
checkpoints page shows the pipeline as blocked. State passes between tasks through the warehouse (barrier and manifest
documents), never through XCom. Epochs never overlap: one active run, and an epoch lease that each step (and the Spark
job) holds while it works.
"""


@dataclass(frozen=True)
class SinkInfo:
    """One exactly-once output table of a pipeline."""

    name: str
    mode: str  # append | upsert | side output (late records of a window)
    uri: str
    key: tuple[str, ...] = ()


def asset_name(pipeline: str, sink: str) -> str:
    """``barrierflow.<pipeline>.<sink>``; the asset's URI is the sink's Delta table."""
    return f"barrierflow.{pipeline}.{sink}"


def pipeline_sinks(definition: PipelineDefinition, warehouse: str, environ: Mapping[str, str] | None = None) -> list[SinkInfo]:
    """Sinks and side outputs of the pipeline, in declaration order.

    Finding them builds the pipeline (declaring operators only: no Spark, no data read) with
    :func:`~barrierflow.airflow.dags.params.introspection_params`.
    """
    pipe = definition.build(introspection_params(definition, environ))
    # Names only (at DAG parse time): a warehouse the tasks will refuse still parses.
    layout = PipelineLayout(normalize_uri(warehouse), definition.name)
    sinks = [SinkInfo(n.sink.name, n.sink.mode, _file_uri(layout.sink_table(n.sink.name)), n.sink.key) for n in pipe.sinks]
    sinks += [SinkInfo(name, "side output", _file_uri(layout.sink_table(name))) for name in pipe.side_output_names()]
    return sinks


def sink_assets(sinks: list[SinkInfo], pipeline: str) -> list["Asset"]:
    """Each sink as an Airflow asset, so downstream DAGs can schedule on its output."""
    from airflow.sdk import Asset

    extra = {"pipeline": pipeline, "format": "delta"}
    return [
        Asset(name=asset_name(pipeline, s.name), uri=s.uri, group="barrierflow", extra={**extra, "sink": s.name, "mode": s.mode})
        for s in sinks
    ]


def _file_uri(location: str) -> str:
    return location if "://" in location else f"file://{location}"


def pipeline_doc(op: PipelineDag, sinks: list[SinkInfo], params: Mapping[str, "Param"]) -> str:
    """The epoch DAG's ``doc_md``: what the pipeline does, how a run works, its params, outputs and queries."""
    name, settings, unset = op.name, op.settings, unset_required_params(op.definition, op.environ)
    schedule = f"`{settings.schedule or 'manual runs only'}` (env `BARRIERFLOW_SCHEDULE`)"
    if unset and settings.schedule:
        env = ", ".join(f"`{param_env_var(name, n)}`" for n in unset)
        schedule = f"manual runs only until {env} is set (then `{settings.schedule}`, env `BARRIERFLOW_SCHEDULE`)"
    process = (
        f"on the warm Spark engine of connection `{settings.conn_id}` (Spark Connect)"
        if settings.process_mode == CONNECT_MODE
        else f"as a spark-submit on connection `{settings.conn_id}` (a new Spark application per epoch)"
    )
    outputs = "\n".join(
        f"| `{s.name}` | {s.mode}{' by ' + ', '.join(s.key) if s.key else ''} | `{asset_name(name, s.name)}` | `{s.uri}` |"
        for s in sinks
    )
    first = sinks[0].name if sinks else "dead_letter"
    warehouse = shlex.quote(settings.warehouse)
    return f"""\
# Pipeline `{name}`

{inspect.cleandoc(op.definition.description or "").strip()}

## How a run works
{_LIFECYCLE}
Schedule: {schedule}; warehouse `{settings.warehouse}` (env `BARRIERFLOW_WAREHOUSE`); `process` runs {process}.
A **backfill** over a range runs one epoch per data interval, in order; an interval already covered is a no-op that
says so in the `barrier` log.

## Parameters
{form_doc(params)}

## Outputs (Airflow assets, Delta tables)
| sink | mode | asset | table |
|---|---|---|---|
{outputs}

Also `dead_letter` (malformed input with the reason) and each keyed state table as `<operator_id>__<state>`.

## Query
Every table is a standard Delta table; `barrierflow query` reads all of them as of one completed epoch (a consistent
cut):

```bash
barrierflow status {name} --warehouse {warehouse}
barrierflow query {name} --warehouse {warehouse} "SELECT * FROM {first} LIMIT 20"
barrierflow query {name} --warehouse {warehouse} --as-of-epoch 3 "SELECT count(*) FROM {first}"
barrierflow query {name} --warehouse {warehouse} "SELECT reason, count(*) FROM dead_letter GROUP BY reason"
```

## Operations
Savepoint: DAG `{savepoint_dag_id(name)}` (optionally stop the pipeline); restore: DAG `{restore_dag_id(name)}`;
retention and vacuum: `barrierflow_maintenance`.
"""


def _arrival_bound(context: "Context", settings: DagSettings) -> ArrivalBound:
    """What this run's epochs may take: input that arrived by ``data_interval_end``, cut at the schedule's intervals."""
    end, owner = context.get("data_interval_end"), airflow_owner(context["ti"].dag_id, context["run_id"])
    return ArrivalBound(cutoff_ms=int(end.timestamp() * 1000) if end else None, schedule=settings.schedule, owner=owner)


def _run_active(ti: Any, owner: str) -> bool:
    """Whether the Airflow run an owner name names is queued or running, as Airflow's API says.

    Any other owner (a ``barrierflow`` command, a name from before owners were recorded) is not an Airflow run: False.
    """
    if (run := airflow_run_of(owner)) is None:
        return False
    try:
        state = ti.get_dagrun_state(*run)
    except Exception as exc:  # noqa: BLE001 - e.g. a run that was deleted: it is not active
        _log.info("run %s of %s: no state (%s); treated as ended", run[1], run[0], exc)
        return False
    return str(getattr(state, "value", state)) in ("queued", "running")


def _report(report: StepReport, context: "Context | None" = None) -> dict[str, Any]:
    """Log the report; with ``context``, also keep it as the task's ``report`` XCom (for the short-circuit tasks, whose
    return value is their condition)."""
    _log.info("%s %s: %s", report.pipeline, report.step, report.message)
    payload = report.to_json()
    if context is not None:
        context["ti"].xcom_push("report", payload)
    return payload


@contextmanager
def _epoch_task(op: PipelineDag) -> Iterator[tuple["Context", CheckpointCoordinator]]:
    """What every epoch task starts with: its context and a coordinator on the run's params.

    Errors a retry cannot fix (bad params, a bad setting, input that blocks the pipeline) fail the task at once,
    wherever in the task they are raised; the rest are retried.
    """
    from airflow.sdk import get_current_context

    context = get_current_context()
    with fail_without_retry(None, *_NOT_RETRYABLE):
        params = resolve_pipeline_params(op.definition, context["params"])
        yield context, CheckpointCoordinator(op.definition, params, op.warehouse, spark_factory=op.spark_factory())


def _wait_for_earlier_runs(context: "Context", wait_s: float) -> None:
    """Block (bounded) while a run of this DAG with an earlier logical date is queued or running.

    Airflow's own ``max_active_runs`` does not order a backfill's runs against scheduled ones, and ``depends_on_past``
    would wait forever behind a failed run; so each run asks Airflow for earlier runs that are queued or running (a
    run whose task awaits a retry is running) and waits for them.
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
            raise errors.EpochInProgressError(
                f"run {earlier.run_id} of {ti.dag_id} (an earlier data interval) is still running after "
                f"{wait_s:.0f}s; {_IN_ORDER}"
            )
        if announced != earlier.run_id:
            state = getattr(earlier.state, "value", earlier.state)
            _log.info("waiting for the earlier run %s of %s (%s) to finish: %s", earlier.run_id, ti.dag_id, state, _IN_ORDER)
            announced = earlier.run_id
        time.sleep(min(_PREVIOUS_RUN_POLL_S, max(0.1, deadline - time.monotonic())))


def _more_input(coordinator: CheckpointCoordinator, bound: ArrivalBound) -> bool:
    """Whether another epoch has input by the cut-off; the epoch is committed either way.

    A source that cannot plan (e.g. a file landed behind the stream position) is the next barrier's error to report,
    not this commit's.
    """
    try:
        return coordinator.has_new_input(bound)
    except errors.BarrierflowError as exc:
        _log.warning("catch_up is skipped: the next epoch cannot be planned: %s", exc)
        return False


def _set_asset_events(context: "Context", assets: list["Asset"], report: StepReport) -> None:
    """Attach the epoch to the asset events the task emits on success."""
    versions = report.details.get("table_versions") or {}
    epoch = {"pipeline": report.pipeline, "epoch": report.epoch, "lineage_id": report.lineage_id}
    for asset in assets:
        context["outlet_events"][asset].extra = {**epoch, "delta_version": versions.get(asset.extra.get("sink", ""))}


def build_pipeline_dag(pipeline: PipelineRef, settings: DagSettings | None = None, environ: Environ = None) -> "DAG":
    """The epoch DAG of one pipeline (``barrierflow_<pipeline>``)."""
    from airflow.sdk import CronDataIntervalTimetable, task
    from airflow.sdk.exceptions import AirflowSkipException

    op = PipelineDag.of(pipeline, settings, environ)
    definition, settings, name = op.definition, op.settings, op.name
    sinks = pipeline_sinks(definition, settings.warehouse, environ)
    assets = sink_assets(sinks, name)
    lease_wait = settings.lease_wait_s
    on_engine = settings.process_mode == CONNECT_MODE
    # A pipeline missing a required parameter would fail every scheduled run: manual runs only.
    unset = unset_required_params(definition, environ)
    schedule = CronDataIntervalTimetable(settings.schedule, timezone="UTC") if settings.schedule and not unset else None
    description = f"barrierflow pipeline {name}: " + (definition.description or name).strip().splitlines()[0]
    params = pipeline_dag_params(definition, environ)
    doc_md = pipeline_doc(op, sinks, params)
    with barrierflow_dag(settings, pipeline_dag_id(name), "pipeline", description, params, doc_md, schedule) as dag:

        @task.short_circuit(task_id="barrier")
        def barrier() -> dict[str, Any] | bool:
            """Steps 1-2: recover, then record the epoch's end offsets before processing (a retry replays them)."""
            with _epoch_task(op) as (context, coordinator):
                _wait_for_earlier_runs(context, lease_wait)
                report = barrier_step(
                    coordinator, _arrival_bound(context, settings), lease_wait, partial(_run_active, context["ti"])
                )
                payload = _report(report, context)
            return payload if report.proceed else False

        if on_engine:

            @task(task_id="process")
            def process_on_engine() -> dict[str, Any]:
                """Step 3 on the warm Spark engine (Spark Connect): stage outputs and state, write the manifest (the vote)."""
                with _epoch_task(op) as (_, coordinator):
                    return _report(process_step(coordinator, lease_wait))

            process: Any = process_on_engine()
        else:
            process = ProcessEpochOperator(
                task_id="process",
                pipeline=name,
                warehouse=settings.warehouse,
                application=settings.process_application,
                lease_wait_s=lease_wait,
                conn_id=settings.conn_id,
                driver_memory=settings.driver_memory,
                doc_md="Step 3: spark-submit `process_epoch.py`: stage outputs and state, write the manifest (the vote).",
            )

        @task.short_circuit(task_id="commit", outlets=assets)
        def commit() -> dict[str, Any] | bool:
            """Steps 4-5: one Delta commit per table (app transaction), COMPLETED, then notify.

            Returns False (``catch_up`` is skipped without starting) when no further input arrived by the run's
            cut-off.
            """
            with _epoch_task(op) as (context, coordinator):
                report = commit_step(coordinator, lease_wait)
                payload = _report(report, context)
                if not report.proceed:
                    raise AirflowSkipException(report.message)
                _set_asset_events(context, assets, report)
                _report(notify_step(coordinator, lease_wait))
                catch_up = int(context["params"].get(CATCH_UP_PARAM) or 1) > 1
                if catch_up and _more_input(coordinator, _arrival_bound(context, settings)):
                    return payload
            _log.info("no further input up to this run's arrival cut-off: catch_up is skipped")
            return False

        @task(task_id="catch_up", outlets=assets)
        def catch_up() -> dict[str, Any]:
            """Up to catch_up_epochs - 1 more epochs with the same arrival cut-off."""
            with _epoch_task(op) as (context, coordinator):
                extra = int(context["params"].get(CATCH_UP_PARAM) or 1) - 1
                if extra < 1:
                    raise AirflowSkipException(f"{CATCH_UP_PARAM}=1: this run completes one epoch only")

                def process_epoch() -> None:
                    if on_engine:
                        _report(process_step(coordinator, lease_wait))
                    else:
                        submit_process_job(settings, coordinator)

                bound, active = _arrival_bound(context, settings), partial(_run_active, context["ti"])
                done = run_epochs(coordinator, bound, lease_wait, process_epoch, extra, _report, active)
            if not done:
                raise AirflowSkipException("caught up: no further input up to this run's arrival cut-off")
            _set_asset_events(context, assets, done[-1])
            return {"epochs": [r.epoch for r in done]}

        barrier() >> process >> commit() >> catch_up()
    return dag
