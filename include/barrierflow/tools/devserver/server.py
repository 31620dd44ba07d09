"""``make run``'s order of things: :func:`run` carries out steps 1 to 7 of :mod:`barrierflow.tools.devserver`;
:class:`InputGenerator` is the input stream of step 6."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from barrierflow.airflow.dags.environment import repo_root
from barrierflow.airflow.dags.settings import PROCESS_MODE_ENV, SPARK_SUBMIT_MODE, DagSettings
from barrierflow.core.errors import ConfigurationError, EngineUnavailableError
from barrierflow.core.settings import DEFAULT_WARM_UP_EPOCHS
from barrierflow.demo.datagen import SensorStreamSpec, write_sensor_files
from barrierflow.execution.engine import DEFAULT_ENGINE_PORT, LocalEngine
from barrierflow.storage.objects import is_local, normalize_uri
from barrierflow.tools.devserver.client import ApiClient
from barrierflow.tools.devserver.environment import (
    DAG_ID,
    DEFAULT_PASSWORD,
    DEFAULT_PORT,
    DEFAULT_USER,
    HOST,
    PASSWORD_ENV,
    DevServerConfig,
    devserver_environment,
    free_port,
    port_in_use,
    write_password_file,
    write_stack_file,
)
from barrierflow.tools.devserver.processes import AirflowProcesses, become_subreaper, descendant_pids, say

__all__ = ["run", "main", "build_parser", "config_from_args", "first_interval_end", "InputGenerator"]


class InputGenerator(threading.Thread):
    """Writes the next ``sensor_stats`` landing file every ``interval_s`` seconds, atomically
    (:func:`barrierflow.demo.datagen.write_sensor_files`), numbered after the files already there."""

    def __init__(self, landing: Path, interval_s: float, records_per_file: int = 200) -> None:
        super().__init__(name="barrierflow-input", daemon=True)
        self.landing = landing
        self.interval_s = interval_s
        self.records_per_file = records_per_file
        self.stop_event = threading.Event()
        self.written = 0
        self.first_written_at: float | None = None  # wall-clock time of this session's first file

    def _spec(self, n_files: int) -> SensorStreamSpec:
        return SensorStreamSpec(n_files=n_files, records_per_file=self.records_per_file)

    def next_index(self) -> int:
        """The index after the highest of the stream's files already landed (0 when none has)."""
        name = re.compile(rf"{re.escape(self._spec(0).file_prefix)}-(\d+)\.jsonl")
        landed = os.listdir(self.landing) if self.landing.is_dir() else []
        return max((int(m[1]) for n in landed if (m := name.fullmatch(n))), default=-1) + 1

    def write_one(self) -> Path:
        index = self.next_index()
        (path,) = write_sensor_files(self.landing, self._spec(index + 1), start_index=index, count=1)
        self.written += 1
        if self.first_written_at is None:
            self.first_written_at = path.stat().st_mtime
        return path

    def run(self) -> None:
        self.landing.mkdir(parents=True, exist_ok=True)
        while not self.stop_event.is_set():
            try:
                say(f"input: wrote {self.write_one().name}")
            except Exception as exc:  # noqa: BLE001 - keep the stream going
                say(f"input: cannot write a file: {exc}")
            self.stop_event.wait(self.interval_s)

    def stop(self) -> None:
        self.stop_event.set()


def _wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float, stop: threading.Event) -> bool:
    """Poll ``predicate`` until it holds (True), ``timeout_s`` passes or ``stop`` is set (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stop.is_set():
        if predicate():
            return True
        stop.wait(interval_s)
    return not stop.is_set() and predicate()


def _banner(config: DevServerConfig) -> str:
    every = f"   (a new file every {config.generate_every_s:g} s)" if config.generate_every_s > 0 else ""
    lines = [
        f"Airflow UI:        {config.url}/",
        f"login:             {config.user} / {config.password}",
        f"checkpoints page:  {config.url}/barrierflow/   (Browse > Checkpoints)",
        f"DAG:               {config.url}/dags/{DAG_ID}",
        f"Spark engine:      {config.engine.address}   (Spark Connect; connection spark_connect_default)",
        f"warehouse:         {config.warehouse}",
        f"landing dir:       {config.landing}{every}",
        f"AIRFLOW_HOME:      {config.home}",
        "stop with Ctrl-C",
    ]
    rule = "=" * 66
    return "\n".join(["", rule, *(f"  {line}" for line in lines), rule, ""])


def _raise_stop(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)  # SIGTERM and SIGHUP too


def run(config: DevServerConfig, *, ready_timeout_s: float = 300.0) -> int:
    """Start everything, wait for Ctrl-C / SIGTERM, stop everything. Returns the exit code."""
    if config.metadata_db == "postgres" and not config.db_port:
        config = dataclasses.replace(config, db_port=free_port())
    for port, what in ((config.port, "--port"), (config.engine_port, "--engine-port"), (config.db_port, "--db-port")):
        if port_in_use(port):
            say(f"error: port {port} on {HOST} is already in use (another barrierflow?); use {what}")
            return 2
    for directory in (config.home, config.warehouse, config.landing):
        if isinstance(directory, Path):
            directory.mkdir(parents=True, exist_ok=True)
    write_password_file(config.password_file, config.user, config.password)
    env = devserver_environment(config)
    become_subreaper()
    baseline = descendant_pids()

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for s in previous:
        signal.signal(s, _raise_stop)

    generator: InputGenerator | None = None
    stopping = threading.Event()
    airflow = AirflowProcesses(env, config.root, config.port)
    engine = LocalEngine(config.engine, log=subprocess.PIPE, env=env)
    database = config.postgres if config.metadata_db == "postgres" else None
    code = 0
    try:
        if database is not None:
            say(f"starting the metadata database (PostgreSQL) on {HOST}:{database.port}, data in {database.data_dir}")
            with (config.home / "postgres.log").open("ab") as db_log:
                database.start(log=db_log)
            airflow.spared.append(database.proc.pid)  # type: ignore[union-attr]
        write_stack_file(config, env)
        if config.generate_every_s > 0:
            # Input from the start: the schedule's first interval then holds some (step 5).
            generator = InputGenerator(config.landing, config.generate_every_s, config.records_per_file)
            generator.start()
        say(f"starting the Spark engine (Spark Connect) on {config.engine.address}")
        engine.start(wait_s=None)
        airflow.adopt("engine", engine.proc)
        say(f"preparing the metadata database in {config.home}")
        if (migrated := airflow.migrate()) != 0:
            say(f"error: airflow db migrate exited with code {migrated}")
            return 1
        say(f"starting the Airflow API server on {config.url}")
        airflow.start_api_server()
        client = ApiClient(config.url, config.user, config.password)
        if not _wait_until(lambda: airflow.exited() is not None or client.healthy(), ready_timeout_s, 1.0, stopping):
            say(f"error: the Airflow API server did not answer on {config.url} within {ready_timeout_s:.0f} s")
            return 1
        if (gone := airflow.exited()) is not None:
            say(f"error: Airflow {gone[0]} exited with code {gone[1]}")
            return 1
        engine.wait_ready(ready_timeout_s)
        threading.Thread(target=_report_warm_up, args=(engine, ready_timeout_s, stopping), name="warm-up", daemon=True).start()
        say("starting the scheduler and triggerer")
        airflow.start_components("scheduler", "triggerer")
        say(_banner(config))
        if generator is not None:
            # Step 5: the first interval the DAG processor sees must hold input.
            _wait_until(lambda: generator.first_written_at is not None, 60.0, 0.2, stopping)
            ready_at = first_interval_end(generator.first_written_at or time.time())
            if ready_at > time.time():
                say(
                    f"starting the DAG processor at {time.strftime('%H:%M:%S', time.localtime(ready_at))}, "
                    "when the first minute of input has ended"
                )
                time.sleep(max(0.0, ready_at - time.time()))
        say("starting the DAG processor")
        airflow.start_components("dag-processor")
        threading.Thread(target=_ensure_unpaused, args=(client, DAG_ID, stopping), name="unpause", daemon=True).start()
        while (gone := airflow.exited()) is None:
            time.sleep(0.5)
            airflow.reap_orphans()
        say(f"{gone[0]} exited with code {gone[1]}: stopping everything")
        code = gone[1] or 1
    except (EngineUnavailableError, ConfigurationError) as exc:
        say(f"error: {exc}")
        code = 1
    except KeyboardInterrupt as exc:
        say(f"stopping ({exc or 'SIGINT'})...")
    finally:
        for s in previous:  # a second Ctrl-C must not interrupt the shutdown
            signal.signal(s, signal.SIG_IGN)
        stopping.set()
        if generator is not None:
            generator.stop()
        started = time.monotonic()
        killed = airflow.stop(baseline)
        engine.stop()
        if database is not None:
            database.stop()
        config.stack_file.unlink(missing_ok=True)
        if killed:
            say(f"killed {len(killed)} process(es) that ignored SIGTERM: {killed}")
        for s, handler in previous.items():
            signal.signal(s, handler)
        say(f"stopped in {time.monotonic() - started:.1f} s")
    return code


def _report_warm_up(engine: LocalEngine, wait_s: float, stop: threading.Event) -> None:
    """Say how the engine's warm-up went (it runs beside Airflow's start, never delaying it)."""
    warm, said = engine.wait_warm(wait_s, stop=stop.is_set)
    if not stop.is_set():
        say(said if warm else f"note: the engine's warm-up failed, its first epochs run cold: {said}")


def first_interval_end(first_input_at: float) -> float:
    """When the one-minute schedule interval holding ``first_input_at`` ends."""
    return (first_input_at // 60 + 1) * 60


def _ensure_unpaused(client: ApiClient, dag_id: str, stop: threading.Event, timeout_s: float = 600.0) -> None:
    """Unpause ``dag_id`` once the DAG processor has registered it (no-op when already unpaused)."""
    try:
        if not _wait_until(lambda: client.dag(dag_id) is not None, timeout_s, 2.0, stop):
            if not stop.is_set():
                say(f"note: DAG {dag_id} did not appear within {timeout_s:.0f} s (see the DAG import errors in the UI)")
            return
        if (client.dag(dag_id) or {}).get("is_paused"):
            say(f"unpaused {dag_id}" if client.set_paused(dag_id, False) else f"note: could not unpause {dag_id}")
    except Exception as exc:  # noqa: BLE001 - a helper thread must never take the server down
        if not stop.is_set():
            say(f"note: cannot check whether {dag_id} is paused: {exc}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m barrierflow.tools.devserver",
        description="A local Airflow (127.0.0.1) with barrierflow's DAGs and plugin and a live sensor_stats input stream.",
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"API server port (default {DEFAULT_PORT}; 0 = any free port)")
    p.add_argument("--home", type=Path, help="AIRFLOW_HOME (default <repo>/.airflow)")
    p.add_argument(
        "--warehouse", type=_location_arg, help="a local path, file:// or s3://<bucket>/<prefix> (default <repo>/warehouse)"
    )
    p.add_argument("--landing", type=_local_dir_arg, help="the generator's local landing directory (default <repo>/landing)")
    port = DEFAULT_ENGINE_PORT
    p.add_argument("--engine-port", type=int, default=port, help=f"the engine's Spark Connect port (default {port}; 0 = any)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between generated input files (0: no generator)")
    p.add_argument("--records-per-file", type=int, default=200)
    p.add_argument(
        "--warm-up-epochs",
        type=int,
        help=f"throwaway epochs on the new engine (default {DEFAULT_WARM_UP_EPOCHS}; 0 if ${PROCESS_MODE_ENV}={SPARK_SUBMIT_MODE})",
    )
    p.add_argument("--user", default=DEFAULT_USER, help=f"login name (default {DEFAULT_USER})")
    password = os.environ.get(PASSWORD_ENV, DEFAULT_PASSWORD)
    p.add_argument("--password", default=password, help=f"login password (default ${PASSWORD_ENV} or {DEFAULT_PASSWORD})")
    p.add_argument("--ready-timeout", type=float, default=300.0, help="seconds to wait for the API server")
    p.add_argument(
        "--metadata-db",
        choices=("postgres", "sqlite"),
        default="postgres",
        help="an embedded PostgreSQL (default) or SQLite (one writer at a time: 'database is locked' for a CLI beside it)",
    )
    p.add_argument("--db-port", type=int, default=0, help="the embedded PostgreSQL's port (default: any free port)")
    return p


def _location_arg(value: str) -> Path | str:
    """A local location as an absolute path, an ``s3://`` one as its URI (never a local directory named ``s3:``)."""
    try:
        uri = normalize_uri(value)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return Path(uri) if is_local(uri) else uri


def _local_dir_arg(value: str) -> Path:
    """A local directory (plain path or ``file://``); an object-store URI is refused, not taken for a path."""
    location = _location_arg(value)
    if not isinstance(location, Path):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a local directory: the dev server's input generator writes local files "
            "(a pipeline reads an s3:// landing directory through its landing_dir parameter)"
        )
    return location


def config_from_args(args: argparse.Namespace) -> DevServerConfig:
    root = repo_root()
    if args.warm_up_epochs is not None:
        warm_up = max(0, args.warm_up_epochs)
    else:  # warm the engine only when the DAG's ``process`` runs on it
        warm_up = 0 if DagSettings.from_env(os.environ).process_mode == SPARK_SUBMIT_MODE else DEFAULT_WARM_UP_EPOCHS
    return DevServerConfig(
        root=root,
        home=(args.home or root / ".airflow").resolve(),
        warehouse=args.warehouse or root / "warehouse",
        landing=args.landing or root / "landing",
        port=args.port or free_port(),
        engine_port=args.engine_port or free_port(),
        user=args.user,
        password=args.password,
        generate_every_s=max(0.0, args.interval),
        records_per_file=args.records_per_file,
        warm_up_epochs=warm_up,
        metadata_db=args.metadata_db,
        db_port=args.db_port,  # 0: run() picks a free one
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.records_per_file < 1:
        build_parser().error("--records-per-file must be >= 1")
    return run(config_from_args(args), ready_timeout_s=args.ready_timeout)
