"""``doc_md`` of the barrierflow DAGs: what the pipeline does, its params, outputs and queries."""

from __future__ import annotations

import inspect
import shlex
from typing import Mapping

from barrierflow.airflow.dags.assets import SinkInfo, asset_name
from barrierflow.airflow.dags.params import CATCH_UP_PARAM, param_default, unset_required_params
from barrierflow.airflow.dags.settings import (
    CONNECT_MODE,
    DagSettings,
    param_env_var,
    pipeline_dag_id,
    restore_dag_id,
    savepoint_dag_id,
)
from barrierflow.plan.pipeline import PipelineDefinition

__all__ = ["pipeline_doc", "savepoint_doc", "restore_doc", "reprocess_doc", "maintenance_doc"]

_LIFECYCLE = """\
Each DAG run is one **epoch**, a barrier-delimited slice of the stream,
committed exactly once in two phases:

| task | lifecycle steps |
|---|---|
| `barrier` | 1. read the checkpoint log; roll forward an epoch whose manifest is durable; the last COMPLETED epoch is the restore point. 2. fix every source's end offsets (input that arrived by the run's `data_interval_end`) and record them *before* processing; a retry replays the recorded barrier. No new input, or a pipeline stopped with a savepoint: the rest of the run is skipped and says why |
| `process` | 3. on the Spark engine (see below): read exactly the barrier's records, stage outputs and state invisibly, write the manifest (the vote) |
| `commit` | 4. one Delta commit per table with the app transaction (pipeline, epoch), then COMPLETED in the checkpoint log; emits an asset event per sink. 5. clean losing attempts' staging, compact state. Skips `catch_up` when no further input arrived by the cut-off |
| `catch_up` | up to `catch_up_epochs - 1` more epochs (same arrival cut-off), each through steps 1-5 |

Steps 1-2 and 4-5 share a task because each task costs a scheduling round
trip and a task process, more than those steps themselves.
Every step is idempotent and retried with exponential backoff, except on
errors no retry can fix (bad parameters, input that blocks the pipeline such
as a refused late file): those fail the task at once and the checkpoints page
shows the pipeline as blocked. State passes
between tasks through the warehouse (barrier and manifest documents), never
through XCom. Epochs never overlap: one active run, and an epoch lease that
each step (and the Spark job) holds while it works.
"""


def _cleaned(text: str) -> str:
    return inspect.cleandoc(text or "").strip()


def _schedule_text(definition: PipelineDefinition, settings: DagSettings, environ: Mapping[str, str] | None) -> str:
    unset = unset_required_params(definition, environ)
    if unset and settings.schedule:
        env = ", ".join(f"`{param_env_var(definition.name, n)}`" for n in unset)
        return f"manual runs only until {env} is set (then `{settings.schedule}`, env `BARRIERFLOW_SCHEDULE`)"
    return f"`{settings.schedule or 'manual runs only'}` (env `BARRIERFLOW_SCHEDULE`)"


def _process_text(settings: DagSettings) -> str:
    if settings.process_mode == CONNECT_MODE:
        return f"on the warm Spark engine of connection `{settings.conn_id}` (Spark Connect)"
    return f"as a spark-submit on connection `{settings.conn_id}` (a new Spark application per epoch)"


def pipeline_doc(
    definition: PipelineDefinition, settings: DagSettings, sinks: list[SinkInfo], environ: Mapping[str, str] | None = None
) -> str:
    name = definition.name
    rows = []
    for p in definition.params:
        default = param_default(definition, p, environ)
        shown = "*required*" if default is None and p.required else f"`{default!r}`"
        rows.append(f"| `{p.name}` | {p.json_type} | {shown} | {p.description} (env `{param_env_var(name, p.name)}`) |")
    rows.append(f"| `{CATCH_UP_PARAM}` | integer | `1` | epochs this run may complete (bounded catch-up) |")
    outputs = "\n".join(
        f"| `{s.name}` | {s.mode}{' by ' + ', '.join(s.key) if s.key else ''} | `{asset_name(name, s.name)}` | `{s.uri}` |"
        for s in sinks
    )
    first = sinks[0].name if sinks else "dead_letter"
    warehouse = shlex.quote(settings.warehouse)
    return f"""\
# Pipeline `{name}`

{_cleaned(definition.description)}

## How a run works
{_LIFECYCLE}
Schedule: {_schedule_text(definition, settings, environ)}; warehouse `{settings.warehouse}`
(env `BARRIERFLOW_WAREHOUSE`); `process` runs {_process_text(settings)}.
A **backfill** over a range runs one epoch per data interval, in order; an
interval already covered is a no-op that says so in the `barrier` log.

## Parameters
| name | type | default | description |
|---|---|---|---|
{chr(10).join(rows)}

## Outputs (Airflow assets, Delta tables)
| sink | mode | asset | table |
|---|---|---|---|
{outputs}

Also `dead_letter` (malformed input with the reason) and each keyed state table
as `<operator_id>__<state>`.

## Query
Every table is a standard Delta table; `barrierflow query` reads all of them
as of one completed epoch (a consistent cut):

```bash
barrierflow status {name} --warehouse {warehouse}
barrierflow query {name} --warehouse {warehouse} "SELECT * FROM {first} LIMIT 20"
barrierflow query {name} --warehouse {warehouse} --as-of-epoch 3 "SELECT count(*) FROM {first}"
barrierflow query {name} --warehouse {warehouse} "SELECT reason, count(*) FROM dead_letter GROUP BY reason"
```

## Operations
Savepoint: DAG `{savepoint_dag_id(name)}` (optionally stop the pipeline);
restore: DAG `{restore_dag_id(name)}`; retention and vacuum: `barrierflow_maintenance`.
"""


def savepoint_doc(definition: PipelineDefinition, settings: DagSettings) -> str:
    return f"""\
# Savepoint of `{definition.name}`

Trigger with the form to write a self-contained savepoint of the last
completed epoch to `{settings.warehouse}/_savepoints/{definition.name}/<name>/`.
The task takes the pipeline's epoch lease, so it waits for a running epoch and
never races one.

- `savepoint_name`: name (letters, digits, `_ . -`); empty for a generated one
- `description`: free text kept in the savepoint's metadata
- `stop_pipeline`: **stop with savepoint**: no epoch runs until a restore

Restore it with `{restore_dag_id(definition.name)}`.
"""


def restore_doc(definition: PipelineDefinition, settings: DagSettings) -> str:
    return f"""\
# Restore `{definition.name}`

Restart the pipeline from a savepoint (by name) **or** a retained completed
epoch: exactly one of `savepoint` and `epoch`. The restore starts a new lineage
whose first completed epoch is the restore point.

- `allow_non_restored_state`: drop state the code no longer declares instead of failing
- `rewind_sinks`: rewind sink tables to the restore point
- `parallelism`: Spark parallelism from now on (empty: unchanged)

An incompatible restore point fails the task at once (no retries) and the log
lists the state that would be dropped or is missing.
"""


def reprocess_doc(definition: PipelineDefinition, settings: DagSettings) -> str:
    schedule = f"`{settings.schedule}`" if settings.schedule else "none (manual runs): epochs are not cut by interval"
    return f"""\
# Reprocess `{definition.name}`

Restore a savepoint (by name) **or** a retained completed epoch, then replay
the input that arrived after it, **one epoch per data interval** of the
pipeline's schedule ({schedule}) that holds input, in order, up to the last
interval that has ended. The sinks end up as if the history had run once with
the current code.

- `plan` reports the restore point and the epochs the replay will produce; nothing changes.
- `reprocess` **holds** `{pipeline_dag_id(definition.name)}` (its runs plan nothing
  meanwhile and say so), restores, replays, and releases the hold (also when it fails;
  the schedule then continues the replay interval by interval).

Form: exactly one of `savepoint` and `epoch`; `rewind_sinks` (default on) removes
the output written after the restore point; `allow_non_restored_state`; `parallelism`.
"""


def maintenance_doc(names: list[str], settings: DagSettings) -> str:
    return f"""\
# barrierflow maintenance

Daily retention for every pipeline ({", ".join(f"`{n}`" for n in names)}):
keep the last `retained_checkpoints` completed epochs restorable and vacuum
Delta files unreferenced for longer than `vacuum_retention_hours`.
Warehouse `{settings.warehouse}`.
"""
