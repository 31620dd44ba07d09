"""``barrierflow``: run pipelines epoch by epoch, inspect checkpoints, query state."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any, Sequence

from barrierflow.airflow.dags.environment import repo_root
from barrierflow.airflow.ui.chart import format_bytes, format_ms
from barrierflow.api.params import parse_assignments
from barrierflow.checkpointing.checkpoint_log import CheckpointLog, current_lineage_seq, iso_us
from barrierflow.checkpointing.coordinator import (
    CheckpointCoordinator,
    EpochResult,
    backlog_report,
    blocked_state,
    recorded_params,
)
from barrierflow.core.errors import BarrierflowError, ConfigurationError, ParameterError
from barrierflow.demo.datagen import SensorStreamSpec, sensor_files
from barrierflow.demo.order_stream import OrderStreamSpec, order_files
from barrierflow.execution.engine import EngineConfig, default_warm_up_epochs, serve
from barrierflow.execution.spark import MASTER_ENV, REMOTE_ENV, remove_socket_file
from barrierflow.operations.maintenance import run_maintenance
from barrierflow.operations.query import format_rows, run_query
from barrierflow.operations.reprocess import plan_reprocess, reprocess
from barrierflow.operations.restore import restore
from barrierflow.operations.savepoint import create_savepoint, dispose_savepoint, list_savepoints
from barrierflow.plan.pipeline import STATE_BACKENDS
from barrierflow.plan.registry import get_pipeline, pipeline_names
from barrierflow.storage import objects
from barrierflow.storage.layout import PipelineLayout
from barrierflow.tools.devserver.environment import STACK_FILE

__all__ = ["main", "build_parser"]

WAREHOUSE_ENV = "BARRIERFLOW_WAREHOUSE"


def _warehouse(args: argparse.Namespace) -> str:
    return args.warehouse or os.environ.get(WAREHOUSE_ENV) or "./warehouse"


def _pipeline_name(ref: str) -> str:
    """``ref``, or the name of the pipeline ``package.module:attribute`` defines (a plain name is not loaded: its code may be gone)."""
    return get_pipeline(ref).name if ":" in ref else ref


def _params(args: argparse.Namespace, definition: Any) -> dict[str, Any]:
    """Given parameters over those the pipeline's last epoch ran with."""
    return {**recorded_params(definition.name, _warehouse(args)), **parse_assignments(args.param)}


def _pipeline_command(sub: Any, name: str, help: str, json: str = "", **kw: Any) -> argparse.ArgumentParser:
    """A command about one pipeline: its name, --warehouse, and --json when ``json`` says what it prints."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help, **kw)
    p.add_argument("pipeline", help="pipeline name (e.g. sensor_stats) or package.module:attribute")
    p.add_argument("--warehouse", help=f"warehouse directory or URI (default: ${WAREHOUSE_ENV} or ./warehouse)")
    if json:
        p.add_argument("--json", action="store_true", help=json)
    return p


def _add_param(p: argparse.ArgumentParser, help: str = "pipeline parameter (repeatable; default: the last epoch's)") -> None:
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help=help)


def _add_engine(p: argparse.ArgumentParser) -> None:
    engine = p.add_mutually_exclusive_group()
    engine.add_argument(
        "--remote", metavar="sc://HOST:PORT", help="a warm Spark Connect engine (default: $BARRIERFLOW_SPARK_REMOTE)"
    )
    engine.add_argument("--master", help="start Spark in this process (default: $BARRIERFLOW_SPARK_MASTER or local[*])")


def _add_restore_point(p: argparse.ArgumentParser, release_hold: bool = False) -> None:
    """Where a new lineage starts (--savepoint or --epoch) and how."""
    point = p.add_mutually_exclusive_group(required=True)
    point.add_argument("--savepoint", metavar="NAME|PATH", help="a savepoint name, or the path of a savepoint directory")
    point.add_argument("--epoch", type=int, metavar="N", help="a retained completed epoch of the current lineage")
    if release_hold:
        point.add_argument("--release-hold", action="store_true", help="release a dead reprocessing command's hold, and exit")
    p.add_argument("--allow-non-restored-state", action="store_true", help="restore even if state is dropped or starts empty")
    p.add_argument("--parallelism", type=int, metavar="N", help="parallelism of the new lineage's epochs")


# ``generate --pipeline``: the spec of a product pipeline's input and its files.
_GENERATORS: dict[str, tuple[Any, Any]] = {
    "sensor_stats": (SensorStreamSpec, sensor_files),
    "orders_payments": (OrderStreamSpec, order_files),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="barrierflow", description="Exactly-once, checkpointed, stateful stream processing in epochs (see README.md)."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = _pipeline_command(sub, "run", "recover, then run epochs (safe to re-run after any crash)")
    _add_param(run, "pipeline parameter (repeatable)")
    group = run.add_mutually_exclusive_group(required=True)
    group.add_argument("--epochs", type=int, metavar="N", help="run at most N epochs")
    group.add_argument("--until-caught-up", action="store_true", help="run epochs until no source has new input")
    _add_engine(run)
    run.add_argument(
        "--max-concurrent-checkpoints", type=int, choices=(1, 2), default=2,
        help="2 (default): the next epoch reads while the current one commits; 1: one at a time (same output)",
    )  # fmt: skip
    run.add_argument("--state-backend", choices=STATE_BACKENDS, help="override the pipeline's state backend (see README)")

    _pipeline_command(sub, "status", "last completed epoch, pending work, lineage, table versions", json="print JSON")
    _pipeline_command(sub, "checkpoints", "the checkpoint log: one line per epoch", json="print a JSON array")

    query = _pipeline_command(
        sub, "query", "SQL over sinks, dead_letter and state tables as of a completed epoch",
        description="Tables: sinks, dead_letter, checkpoints, <operator_id>__<state> and its __changelog (see README).",
    )  # fmt: skip
    query.add_argument("sql", help="the SQL statement")
    query.add_argument("--as-of-epoch", type=int, metavar="N", help="read every table as of completed epoch N")
    query.add_argument("--format", choices=("table", "json", "csv"), default="table")

    savepoint = sub.add_parser("savepoint", help="create, list, restore or dispose of savepoints (see README)")
    sp_sub = savepoint.add_subparsers(dest="action", required=True, metavar="ACTION")
    sp_create = _pipeline_command(sp_sub, "create", "take a savepoint at the last completed epoch")
    sp_create.add_argument("--name", help="savepoint name (default: sp-<UTC time>-<random>)")
    sp_create.add_argument("--description", default="", help="free text kept with the savepoint")
    sp_create.add_argument("--stop", action="store_true", help="stop with savepoint: no epoch runs until a restore")
    _add_param(sp_create)
    _pipeline_command(sp_sub, "list", "list the pipeline's savepoints", json="print a JSON array")
    sp_restore = _pipeline_command(sp_sub, "restore", "start a new lineage from a savepoint or a retained completed epoch")
    _add_restore_point(sp_restore)
    sp_restore.add_argument("--rewind-sinks", action="store_true", help="remove sink rows written after the restore point")
    _add_param(sp_restore)
    _pipeline_command(sp_sub, "dispose", "delete a savepoint").add_argument("name", help="the savepoint's name")

    rp = _pipeline_command(
        sub, "reprocess", "restore, then replay every data interval after the restore point in order",
        description="Holds the pipeline, restores, then replays one epoch per --schedule interval holding input (see README).",
    )  # fmt: skip
    _add_restore_point(rp, release_hold=True)
    rp.add_argument(
        "--schedule",
        default=os.environ.get("BARRIERFLOW_SCHEDULE", "* * * * *"),
        help="cron of the data intervals (default $BARRIERFLOW_SCHEDULE or every minute, as the DAGs)",
    )
    rp.add_argument("--plan-only", action="store_true", help="print the epochs a replay would produce; change nothing")
    rp.add_argument("--keep-sinks", action="store_true", help="do not rewind the sinks (they are rewound by default)")
    _add_engine(rp)
    _add_param(rp)

    maintenance = _pipeline_command(sub, "maintenance", "compact state, expire old checkpoints, vacuum (never savepoints)")
    maintenance.add_argument("--retained-checkpoints", type=int, default=10, metavar="N", help="checkpoints to keep (default 10)")
    maintenance.add_argument(
        "--vacuum-retention-hours", type=int, default=168, metavar="H", help="vacuum retention (default 168)"
    )
    _add_param(maintenance)

    sub.add_parser("pipelines", help="list the registered pipelines and their parameters")

    engine = sub.add_parser("engine", help="run the warm Spark engine (a Spark Connect server) in the foreground")
    engine.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    engine.add_argument("--port", type=int, default=15002, help="Spark Connect port (default 15002)")
    engine.add_argument("--master", default="local[*]", help="Spark master of the engine (default local[*])")
    engine.add_argument("--driver-memory", default="2g", help="the engine driver's memory (default 2g)")
    engine.add_argument(
        "--warm-up-epochs", type=int, metavar="N", help="throwaway epochs once it listens (default 4 on local[...], else 0)"
    )

    airflow = sub.add_parser("airflow", help="run the Airflow CLI against the running 'make run' stack")
    airflow.add_argument("--home", help="the stack's AIRFLOW_HOME (default: <repo>/.airflow)")
    airflow.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the airflow command")

    generate = sub.add_parser("generate", help="write sample input files of a product pipeline into a landing directory")
    generate.add_argument("landing_dir")
    generate.add_argument("--pipeline", choices=tuple(_GENERATORS), default="sensor_stats", help="whose input")
    generate.add_argument("--files", type=int, default=6, help="number of files (per source; default 6)")
    generate.add_argument("--records-per-file", type=int, default=200, help="lines (orders) per file (default 200)")
    generate.add_argument("--start-index", type=int, default=0, help="index of the first file (default 0)")
    generate.add_argument("--seed", type=int, default=0)
    return parser


def _select_engine(args: argparse.Namespace) -> None:
    """--master / --remote, for every session this process starts."""
    if args.master:
        os.environ[MASTER_ENV] = args.master
        os.environ.pop(REMOTE_ENV, None)
    if args.remote:
        os.environ[REMOTE_ENV] = args.remote


def _cmd_run(args: argparse.Namespace) -> int:
    if args.epochs is not None and args.epochs < 1:
        raise ParameterError("--epochs must be >= 1")
    _select_engine(args)
    definition = get_pipeline(args.pipeline)
    if args.state_backend is not None:
        definition = dataclasses.replace(definition, state_backend=args.state_backend)
    coordinator = CheckpointCoordinator(definition, parse_assignments(args.param), _warehouse(args))

    def report(result: EpochResult) -> None:
        r = result.record
        print(
            f"epoch {r.epoch} COMPLETED: rows_in={r.rows_in} rows_out={r.rows_out} dead_letters={r.dead_letters} "
            f"watermark={iso_us(r.watermark_us)} duration_ms={r.duration_ms} bytes_written={r.bytes_written}",
            flush=True,
        )

    results = coordinator.run(
        epochs=args.epochs, until_caught_up=args.until_caught_up, on_epoch=report,
        max_concurrent_checkpoints=args.max_concurrent_checkpoints,
    )  # fmt: skip
    if not results:
        print("no new input: nothing to do")
    return 0


def _cmd_reprocess(args: argparse.Namespace) -> int:
    definition = get_pipeline(args.pipeline)
    warehouse = _warehouse(args)
    params = _params(args, definition)
    if args.release_hold:
        coordinator = CheckpointCoordinator(definition, params, warehouse)
        hold = coordinator.held_by()
        if hold is None:
            print(f"{definition.name} is not held")
        else:
            coordinator.release_hold(str(hold.get("owner")))
            print(f"released the hold of {hold.get('owner')} ({hold.get('reason')}, since {hold.get('since')})")
        return 0
    point = dict(savepoint=args.savepoint, epoch=args.epoch)
    if args.plan_only:
        print("\n".join(plan_reprocess(definition, warehouse, schedule=args.schedule, params=params, **point).describe()))
        return 0
    _select_engine(args)
    result = reprocess(
        definition, warehouse, schedule=args.schedule,
        owner=f"barrierflow reprocess (pid {os.getpid()} on {socket.gethostname()})", rewind_sinks=not args.keep_sinks,
        allow_non_restored_state=args.allow_non_restored_state, parallelism=args.parallelism, params=params,
        on_plan=lambda plan: print("\n".join(plan.describe()), flush=True), **point,
    )  # fmt: skip
    print("\n".join(result.describe()))
    return 0


def _cmd_airflow(args: argparse.Namespace) -> int:
    home = Path(args.home) if args.home else repo_root() / ".airflow"
    stack = home / STACK_FILE
    try:
        doc = json.loads(stack.read_text())
    except FileNotFoundError:
        raise ConfigurationError(
            f"no running stack in {home} ({stack} is written by 'make run' while it runs); start it, or give --home"
        ) from None
    airflow = Path(sys.executable).with_name("airflow")
    argv = args.args[1:] if args.args[:1] == ["--"] else args.args
    sys.stdout.flush()
    os.execve(str(airflow), [str(airflow), *argv], {**os.environ, **doc["environment"]})


def _cmd_engine(args: argparse.Namespace) -> int:
    warm_up = default_warm_up_epochs(args.master) if args.warm_up_epochs is None else args.warm_up_epochs
    if warm_up < 0:
        raise ConfigurationError(f"--warm-up-epochs is {warm_up}: give 0 (no warm-up) or more")
    return serve(
        EngineConfig(host=args.host, port=args.port, master=args.master, driver_memory=args.driver_memory, warm_up_epochs=warm_up)
    )


def _ran(args: argparse.Namespace) -> PipelineLayout:
    """The layout of the pipeline ``args`` names, which must have run in the warehouse."""
    layout = PipelineLayout.of(_warehouse(args), _pipeline_name(args.pipeline))
    if not objects.exists(layout.pipeline_meta):
        raise BarrierflowError(f"pipeline {args.pipeline!r} has never run in warehouse {layout.warehouse}")
    return layout


def _cmd_status(args: argparse.Namespace) -> int:
    layout = _ran(args)
    meta = objects.read_json(layout.pipeline_meta) or {}
    lineage = current_lineage_seq(layout)[1]
    records = CheckpointLog(layout).lineage_records(lineage["lineage_id"])
    last = CheckpointLog.last_completed(records)
    pending = sorted(
        (epoch, r.status.value)
        for (_, epoch), r in CheckpointLog.current_status(records).items()
        if not last or epoch > last.epoch
    )
    doc: dict[str, Any] = {
        "pipeline": args.pipeline,
        "warehouse": layout.warehouse,
        "key_groups": meta.get("key_groups"),
        "lineage_id": lineage.get("lineage_id"),
        "last_completed_epoch": last.epoch if last else None,
        "watermark": iso_us(last.watermark_us) if last else None,
        "offsets": last.offsets_json() if last else {},
        "pending": [{"epoch": e, "status": s} for e, s in pending],
        "tables": last.versions() if last else {},
        "blocked": blocked_state(layout.warehouse, layout.pipeline),
        "backlog": backlog_report(layout.warehouse, layout.pipeline),
    }
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(f"pipeline:             {doc['pipeline']} (key groups: {doc['key_groups']})")
    print(f"lineage:              {doc['lineage_id']}")
    print(f"last completed epoch: {doc['last_completed_epoch']}")
    print(f"watermark:            {doc['watermark']}")
    print(f"pending:              {', '.join(f'{e} {s}' for e, s in pending) or 'none'}")
    if blocked := doc["blocked"]:
        print(f"blocked:              epoch {blocked.get('epoch')} ({blocked.get('step')}) since {blocked.get('since')}")
        print(f"  {blocked.get('message')}")
    backlog = doc["backlog"]
    if "error" in backlog:
        print(f"backlog:              not measured: {backlog['error']}")
    for source, b in backlog.get("sources", {}).items():
        lag = f", oldest waiting {format_ms(b['lag_ms'])}" if b["files"] else ""
        print(f"backlog {source + ':':13s} {b['files']} file(s), {format_bytes(b['bytes'])}{lag}")
    print("tables (Delta version at the last completed epoch):")
    for name, version in sorted(doc["tables"].items()):
        print(f"  {name:40s} v{version}")
    return 0


def _cutoff(ms: int | None) -> str:
    """An arrival cut-off for people: ISO UTC, or "-" when the epoch took everything that had arrived."""
    return iso_us(ms * 1000) if ms is not None else "-"


def _cmd_checkpoints(args: argparse.Namespace) -> int:
    latest = CheckpointLog.current_status(CheckpointLog(_ran(args)).records())
    rows = [
        {
            "epoch": r.epoch, "lineage_id": r.lineage_id, "status": r.status.value, "offsets": r.offsets_json(),
            "watermark": iso_us(r.watermark_us),
            **{k: getattr(r, k) for k in ("rows_in", "rows_out", "dead_letters", "duration_ms", "bytes_written")},
            "state_bytes_written": r.state_bytes_written, "recorded_at": iso_us(r.recorded_at_us),
            "arrival_cutoff": _cutoff(r.arrival_cutoff_ms), "table_versions": r.versions(),
            **{k: getattr(r, k) for k in ("backlog_files", "backlog_bytes", "input_lag_ms")},
        }
        for r in sorted(latest.values(), key=lambda r: r.recorded_at_us)
    ]  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(
        f"{'epoch':>5}  {'status':13} {'rows_in':>9} {'rows_out':>9} {'dead':>6} {'ms':>7} {'bytes':>10} "
        f"{'backlog':>7}  {'arrival cut-off':24}  watermark"
    )
    for row in rows:
        print(
            f"{row['epoch']:>5}  {row['status']:13} {row['rows_in'] or '':>9} {row['rows_out'] or '':>9} "
            f"{row['dead_letters'] if row['dead_letters'] is not None else '':>6} {row['duration_ms'] or '':>7} "
            f"{row['bytes_written'] or '':>10} {row['backlog_files'] if row['backlog_files'] is not None else '':>7}  "
            f"{row['arrival_cutoff']:24}  {row['watermark'] or ''}"
        )
    return 0


def _cmd_query(args: argparse.Namespace) -> int:
    print(format_rows(run_query(_warehouse(args), args.pipeline, args.sql, args.as_of_epoch), args.format))
    return 0


def _cmd_pipelines(args: argparse.Namespace) -> int:
    for name in pipeline_names():
        print(name)
        for p in get_pipeline(name).params:
            default = "required" if p.required else f"default {p.default!r}"
            print(f"  --param {p.name}=<{p.json_type}>  ({default}) {p.description}")
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    if args.files < 1 or args.records_per_file < 1 or args.start_index < 0:
        raise ParameterError("--files and --records-per-file must be >= 1, --start-index >= 0")
    landing = objects.normalize_uri(args.landing_dir)  # a local path, file:// or s3://; anything else is refused
    n_files = args.start_index + args.files
    spec, files_of = _GENERATORS[args.pipeline]
    files = files_of(spec(n_files, args.records_per_file, seed=args.seed), args.start_index, args.files)
    # Each file lands whole under its final name with put-if-absent, on either store: readers never see part of
    # a file, and a file that already landed is never changed.
    names = []
    for name, text in files:
        target = objects.join_uri(landing, name)
        if not objects.put_if_absent(target, text.encode("utf-8")):
            raise ConfigurationError(
                f"{target} already exists, and a landed file is never changed: "
                "generate into another directory, or after it with --start-index"
            )
        names.append(name)
    print(f"wrote {len(names)} file(s) to {args.landing_dir}: {names[0]} .. {names[-1]}")
    return 0


def _cmd_savepoint(args: argparse.Namespace) -> int:
    warehouse = _warehouse(args)
    if args.action == "list":
        savepoints = list_savepoints(_pipeline_name(args.pipeline), warehouse)
        if args.json:
            print(json.dumps([m.to_json() for m in savepoints], indent=2, default=str))
            return 0
        if not savepoints:
            print(f"no savepoints of {args.pipeline} in {warehouse}")
        for m in savepoints:
            print(
                f"{m.name}  epoch={m.epoch} arrival_cutoff={_cutoff(m.arrival_cutoff_ms)} lineage={m.lineage_id} "
                f"created={m.created_at} size={m.size_bytes}B{' stopped' if m.stopped else ''}  {m.description}"
            )
        return 0
    if args.action == "dispose":
        m = dispose_savepoint(_pipeline_name(args.pipeline), warehouse, args.name)
        print(f"disposed of savepoint {m.name} (epoch {m.epoch})")
        return 0
    definition = get_pipeline(args.pipeline)
    if args.action == "create":
        m = create_savepoint(
            definition, warehouse, name=args.name, description=args.description, stop=args.stop, params=_params(args, definition)
        )
        print(f"savepoint {m.name} of {m.pipeline} at epoch {m.epoch}: {m.uri} ({m.size_bytes} bytes)")
        if m.stopped:
            print(f"{m.pipeline} is stopped: no epoch runs until it is restored")
        return 0
    if args.parallelism is not None and args.parallelism < 1:
        raise ParameterError("--parallelism must be >= 1")
    result = restore(
        definition, warehouse, savepoint=args.savepoint, epoch=args.epoch, allow_non_restored_state=args.allow_non_restored_state,
        rewind_sinks=args.rewind_sinks, parallelism=args.parallelism, params=_params(args, definition),
    )  # fmt: skip
    print(
        f"restored {result.pipeline} from {result.restored_from} into lineage {result.lineage_id}: "
        f"the next epoch is {result.epoch + 1}"
    )
    for name, changes in sorted(result.evolved_states.items()):
        print(f"  state {name} restored into the code's schema: {'; '.join(changes)}")
    for label, names in (("dropped", result.dropped_states), ("started empty", result.empty_states)):
        if names:
            print(f"  state {label}: {', '.join(names)}")
    for sink, rows in sorted(result.rewound_sinks.items()):
        print(f"  sink {sink} rewound ({rows} rows)")
    return 0


def _cmd_maintenance(args: argparse.Namespace) -> int:
    definition = get_pipeline(args.pipeline)
    report = run_maintenance(
        definition, _warehouse(args), retained_checkpoints=args.retained_checkpoints,
        vacuum_retention_hours=args.vacuum_retention_hours, params=_params(args, definition),
    )  # fmt: skip
    print(json.dumps(report.to_json(), indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = globals()[f"_cmd_{args.command}"](args)  # each command's handler is _cmd_<command>
    except BarrierflowError as exc:
        print(f"barrierflow: error: {exc}", file=sys.stderr)
        code = 1
    sys.stdout.flush()
    remove_socket_file()
    # delta-rs' runtime threads can abort the interpreter at exit; leave at once.
    os._exit(code)
