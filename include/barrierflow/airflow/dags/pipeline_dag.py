"""``barrierflow_<pipeline>``: one DAG run is one epoch, plus a bounded catch-up.

``barrier >> process >> commit >> catch_up`` drive the five steps of :mod:`barrierflow.checkpointing.coordinator`
through :mod:`~barrierflow.airflow.dags.lifecycle`; :func:`pipeline_doc` says what each task does and why. Building
the DAG reads environment variables and the pipeline's operator graph only (no Spark, no warehouse access)."""

from __future__ import annotations

import inspect
import logging
import shlex
import time
from contextlib import contextmanager
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
from barrierflow.airflow.dags.settings import CONNECT_MODE, param_env_var, pipeline_dag_id, restore_dag_id, savepoint_dag_id
from barrierflow.airflow.dags.spark_submit import ProcessEpochOperator, submit_process_job
from barrierflow.checkpointing.coordinator import CheckpointCoordinator
from barrierflow.checkpointing.intervals import ArrivalBound, airflow_owner, airflow_run_of
from barrierflow.core import errors
from barrierflow.plan.pipeline import PipelineDefinition
from barrierflow.storage.layout import PipelineLayout
from barrierflow.storage.objects import normalize_uri

if TYPE_CHECKING:
    from airflow.sdk import DAG, Asset, Context, Param

    from barrierflow.airflow.dags.settings import DagSettings

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

Steps 1-2 and 4-5 share a task because a task costs a scheduling round trip and a process, more than those steps.
Every step is idempotent and retried with exponential backoff, except on errors no retry can fix (bad parameters, input
that blocks the pipeline such as a refused late file): those fail the task at once, and the checkpoints page shows the
pipeline as blocked. Tasks pass state through the warehouse, never XCom. Epochs never overlap: one active run, and an
epoch lease that each step (and the Spark job) holds while it works.
"""


def sink_assets(definition: PipelineDefinition, warehouse: str, environ: Environ = None) -> list["Asset"]:
    """Each sink and side output as the asset ``barrierflow.<pipeline>.<sink>`` (URI: its Delta table), for downstream
    DAGs to schedule on; the pipeline is built with :func:`~.params.introspection_params` (declaring only, no Spark)."""
    from airflow.sdk import Asset

    pipe = definition.build(introspection_params(definition, environ))
    # Names only (at DAG parse time): a warehouse the tasks will refuse still parses.
    layout, name = PipelineLayout(normalize_uri(warehouse), definition.name), definition.name
    sinks = [(n.sink.name, n.sink.mode, ", ".join(n.sink.key)) for n in pipe.sinks]
    sinks += [(side, "side output", "") for side in pipe.side_output_names()]  # late records of a window
    return [
        Asset(
            name=f"barrierflow.{name}.{sink}",
            uri=table if "://" in (table := layout.sink_table(sink)) else f"file://{table}",
            group="barrierflow",
            extra={"pipeline": name, "format": "delta", "sink": sink, "mode": mode, **({"key": key} if key else {})},
        )
        for sink, mode, key in sinks
    ]


def pipeline_doc(op: PipelineDag, assets: list["Asset"], params: Mapping[str, "Param"]) -> str:
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
    by = {a.name: f" by {a.extra['key']}" if "key" in a.extra else "" for a in assets}
    outputs = "\n".join(f"| `{a.extra['sink']}` | {a.extra['mode']}{by[a.name]} | `{a.name}` | `{a.uri}` |" for a in assets)
    first = assets[0].extra["sink"] if assets else "dead_letter"
    warehouse = shlex.quote(settings.warehouse)
    return f"""\
# Pipeline `{name}`

{inspect.cleandoc(op.definition.description or "").strip()}

## How a run works
{_LIFECYCLE}
Schedule: {schedule}; warehouse `{settings.warehouse}` (env `BARRIERFLOW_WAREHOUSE`); `process` runs {process}. A **backfill**
over a range runs one epoch per data interval, in order; an interval already covered is a no-op that says so in the `barrier` log.

## Parameters
{form_doc(params)}

## Outputs (Airflow assets, Delta tables)
| sink | mode | asset | table |
|---|---|---|---|
{outputs}

Also `dead_letter` (malformed input with the reason) and each keyed state table as `<operator_id>__<state>`.

## Query
Every table is a standard Delta table; `barrierflow query` reads all of them as of one completed epoch (a consistent
cut; `--as-of-epoch N` for an earlier one):

```bash
barrierflow status {name} --warehouse {warehouse}
barrierflow query {name} --warehouse {warehouse} "SELECT * FROM {first} LIMIT 20"
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
    """Whether the Airflow run that ``owner`` names is queued or running; False for any other owner (a command)."""
    if (run := airflow_run_of(owner)) is None:
        return False
    try:
        state = ti.get_dagrun_state(*run)
    except Exception as exc:  # noqa: BLE001 - e.g. a run that was deleted: it is not active
        _log.info("run %s of %s: no state (%s); treated as ended", run[1], run[0], exc)
        return False
    return str(getattr(state, "value", state)) in ("queued", "running")


def _report(report: StepReport, context: "Context | None" = None) -> dict[str, Any]:
    """Log the report; with ``context``, also its ``report`` XCom (a short-circuit task's return value is its condition)."""
    _log.info("%s %s: %s", report.pipeline, report.step, report.message)
    payload = report.to_json()
    if context is not None:
        context["ti"].xcom_push("report", payload)
    return payload


@contextmanager
def _epoch_task(op: PipelineDag) -> Iterator[tuple["Context", CheckpointCoordinator]]:
    """The task's context and a coordinator on the run's params; errors a retry cannot fix (:data:`_NOT_RETRYABLE`)
    fail the task at once wherever in the task they are raised."""
    from airflow.sdk import get_current_context

    context = get_current_context()
    with fail_without_retry(None, *_NOT_RETRYABLE):
        params = resolve_pipeline_params(op.definition, context["params"])
        yield context, CheckpointCoordinator(op.definition, params, op.warehouse, spark_factory=op.spark_factory())


def _wait_for_earlier_runs(context: "Context", wait_s: float) -> None:
    """Block (bounded) while a run of this DAG with an earlier logical date is queued or running (a run awaiting a retry is
    running). Airflow's ``max_active_runs`` does not order a backfill's runs against scheduled ones, and ``depends_on_past`` would
    wait forever behind a failed run."""
    from airflow.sdk import DagRunState

    ti = context["ti"]
    deadline = time.monotonic() + wait_s
    announced: str | None = None
    while True:
        # Queued first: a run going from queued to running between the two calls is then seen running (the other order misses it).
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
    """Whether another epoch has input by the cut-off. A source that cannot plan (e.g. a file landed behind the stream
    position) is the next barrier's error to report, not this committed epoch's."""
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
    assets = sink_assets(definition, settings.warehouse, environ)
    lease_wait, on_engine = settings.lease_wait_s, settings.process_mode == CONNECT_MODE
    # A pipeline missing a required parameter would fail every scheduled run: manual runs only.
    unset = unset_required_params(definition, environ)
    schedule = CronDataIntervalTimetable(settings.schedule, timezone="UTC") if settings.schedule and not unset else None
    description = f"barrierflow pipeline {name}: " + (definition.description or name).strip().splitlines()[0]
    params = pipeline_dag_params(definition, environ)
    doc_md = pipeline_doc(op, assets, params)
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
            """Steps 4-5: one Delta commit per table (app transaction), COMPLETED, then notify; False (``catch_up`` is
            skipped) when no further input arrived by the run's cut-off."""
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
