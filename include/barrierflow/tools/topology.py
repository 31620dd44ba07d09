"""The multi-service deployment (README, "Deploy as separate services"): every service's command and settings.

``docker-compose.yaml`` runs each of ``SERVICES`` (in start order) in its own container as ``python -m
barrierflow.tools.topology serve <service>``; ``... up`` and the test start the very same commands as
child processes. Both use host networking, so every address is ``127.0.0.1``: ports, the state
directory and the bucket come from ``BARRIERFLOW_TOPOLOGY_*`` (:meth:`TopologyConfig.from_env`), the
warehouse is ``s3://<bucket>/warehouse``, and ``sensor_stats`` lands in ``<home>/landing`` (a shared volume).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from barrierflow.airflow.dags.environment import repo_root
from barrierflow.core.errors import ConfigurationError
from barrierflow.execution.process_group import stop_group
from barrierflow.execution.spark import MASTER_ENV
from barrierflow.tools.devserver.client import ApiClient
from barrierflow.tools.devserver.environment import (
    DEFAULT_PASSWORD,
    DEFAULT_USER,
    HOST,
    DevServerConfig,
    devserver_environment,
    port_in_use,
    write_password_file,
)
from barrierflow.tools.devserver.processes import AirflowProcesses

__all__ = ["SERVICES", "TopologyConfig", "service_command", "service_environment", "serve", "running_topology", "main"]

SERVICES = (
    "postgres", "s3", "spark-master", "spark-worker-1", "spark-worker-2", "engine",
    "airflow-init", "api-server", "scheduler", "dag-processor", "triggerer",
)  # fmt: skip
_PORTS = ("postgres_port", "s3_port", "master_port", "master_ui_port", "engine_port", "api_port")
_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "barrierflow", "AWS_SECRET_ACCESS_KEY": "barrierflow", "AWS_REGION": "us-east-1"}


def _variable(field: str) -> str:
    return f"BARRIERFLOW_TOPOLOGY_{field.upper()}"


@dataclass(frozen=True)
class TopologyConfig:
    """Where the services keep their state and which loopback ports they take."""

    home: Path
    postgres_port: int = 5432
    s3_port: int = 9000
    master_port: int = 7077
    master_ui_port: int = 8081
    worker_ui_ports: tuple[int, int] = (8082, 8083)
    engine_port: int = 15002
    api_port: int = 8080
    bucket: str = "barrierflow"
    worker_memory: str = "1536m"  # an executor takes Spark's default 1g of it

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TopologyConfig:
        """``BARRIERFLOW_TOPOLOGY_HOME`` (default ``./topology``) and ``BARRIERFLOW_TOPOLOGY_<FIELD>`` for the rest."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name in _PORTS:
            if raw := env.get(_variable(name)):
                try:
                    values[name] = int(raw)
                except ValueError:
                    raise ConfigurationError(f"{_variable(name)} must be a port number, not {raw!r}") from None
        if raw := env.get(_variable("worker_ui_ports")):
            values["worker_ui_ports"] = tuple(int(p) for p in raw.split(","))
        if bucket := env.get(_variable("bucket")):
            values["bucket"] = bucket
        return cls(home=Path(env.get(_variable("home")) or "topology").resolve(), **values)

    def to_env(self) -> dict[str, str]:
        """The variables :meth:`from_env` reads back into this config."""
        env = {_variable(name): str(getattr(self, name)) for name in ("home", *_PORTS, "bucket")}
        return {**env, _variable("worker_ui_ports"): ",".join(map(str, self.worker_ui_ports))}

    @property
    def s3_endpoint(self) -> str:
        return f"http://{HOST}:{self.s3_port}"

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.master_port}"

    @property
    def warehouse(self) -> str:
        return f"s3://{self.bucket}/warehouse"

    @property
    def landing(self) -> Path:
        return self.home / "landing"

    @property
    def api_url(self) -> str:
        return f"http://{HOST}:{self.api_port}"

    def aws_environment(self) -> dict[str, str]:
        """What every process that touches the warehouse needs: the endpoint and its credentials."""
        return {**_CREDENTIALS, "AWS_ENDPOINT_URL": self.s3_endpoint, "AWS_ALLOW_HTTP": "true"}

    def devserver(self) -> DevServerConfig:
        return DevServerConfig(
            root=repo_root(), home=self.home / "airflow", warehouse=self.warehouse,
            landing=self.landing, port=self.api_port, engine_port=self.engine_port, warm_up_epochs=0,
            metadata_db="postgres", db_port=self.postgres_port, generate_every_s=0,
        )  # fmt: skip


def service_environment(service: str, config: TopologyConfig, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment ``service`` runs with (Airflow's settings for the Airflow services, AWS for all)."""
    env = {**(os.environ if base is None else base), **config.to_env(), **config.aws_environment()}
    env.update(PYSPARK_PYTHON=sys.executable, PYTHONUNBUFFERED="1")
    if service in ("airflow-init", "api-server", "scheduler", "dag-processor", "triggerer"):
        env = devserver_environment(config.devserver(), env)
        env[MASTER_ENV] = config.master_url  # for a Spark a task starts itself; spark-submit takes the Airflow connection's
    return env


def service_command(service: str, config: TopologyConfig) -> list[str]:
    """The command line of ``service`` (what its container runs, after :func:`serve`'s preparation)."""
    import pyspark

    spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
    airflow = str(Path(sys.executable).with_name("airflow"))
    if service == "s3":
        return [sys.executable, "-m", "barrierflow.tools.local_s3", "--host", HOST, "--port", str(config.s3_port)]
    if service == "spark-master":
        return [spark_class, "org.apache.spark.deploy.master.Master", "--host", HOST,
                "--port", str(config.master_port), "--webui-port", str(config.master_ui_port)]  # fmt: skip
    if service.startswith("spark-worker-"):
        index = int(service.rsplit("-", 1)[1]) - 1
        return [spark_class, "org.apache.spark.deploy.worker.Worker", config.master_url, "--host", HOST,
                "--cores", "1", "--memory", config.worker_memory, "--webui-port", str(config.worker_ui_ports[index]),
                "--work-dir", str(config.home / service)]  # fmt: skip
    if service == "engine":
        return [sys.executable, "-m", "barrierflow", "engine", "--host", HOST, "--port", str(config.engine_port),
                "--master", config.master_url, "--driver-memory", "1g", "--warm-up-epochs", "0"]  # fmt: skip
    if service == "api-server":
        return [airflow, "api-server", "--host", HOST, "--port", str(config.api_port)]
    components = dict(AirflowProcesses.COMPONENTS)  # the same arguments as make run's
    if service in components:
        return [airflow, *components[service]]
    if service in ("postgres", "airflow-init"):
        return [sys.executable, "-m", "barrierflow.tools.topology", "serve", service]
    raise ConfigurationError(f"unknown service {service!r}: allowed are {', '.join(SERVICES)}")


def serve(service: str, config: TopologyConfig) -> int:
    """Run ``service`` in the foreground (a container's command); its exit code."""
    env = service_environment(service, config)
    config.home.mkdir(parents=True, exist_ok=True)
    if service == "postgres":
        return _serve_postgres(config)
    if service == "airflow-init":
        return _init(config, env)
    if service == "api-server":
        devserver = config.devserver()
        write_password_file(devserver.password_file, devserver.user, devserver.password)
    command = service_command(service, config)
    os.execvpe(command[0], command, env)  # the service is this process: signals reach it directly


def _serve_postgres(config: TopologyConfig) -> int:
    database = config.devserver().postgres
    stop: list[int] = []
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda signum, frame: stop.append(signum))
    with (config.home / "postgres.log").open("ab") as log:
        database.start(log=log)
        print(f"topology: PostgreSQL on {HOST}:{config.postgres_port}", flush=True)
        while not stop and database.proc is not None and database.proc.poll() is None:
            time.sleep(0.5)
        database.stop()
    return 0 if stop else 1


def _init(config: TopologyConfig, env: Mapping[str, str]) -> int:
    """Migrate Airflow's metadata database and create the warehouse bucket (both idempotent)."""
    import boto3
    from botocore.exceptions import ClientError

    config.landing.mkdir(parents=True, exist_ok=True)
    airflow = str(Path(sys.executable).with_name("airflow"))
    if (migrated := subprocess.run([airflow, "db", "migrate"], env=dict(env)).returncode) != 0:
        return migrated
    client = boto3.session.Session().client(
        "s3", endpoint_url=config.s3_endpoint, region_name=_CREDENTIALS["AWS_REGION"],
        aws_access_key_id=_CREDENTIALS["AWS_ACCESS_KEY_ID"], aws_secret_access_key=_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )  # fmt: skip
    try:
        client.create_bucket(Bucket=config.bucket)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise
    print(f"topology: metadata database migrated, bucket s3://{config.bucket} ready", flush=True)
    return 0


def _ready(service: str, config: TopologyConfig, proc: subprocess.Popen[bytes]) -> bool:
    if service == "airflow-init":  # one-shot
        return proc.poll() == 0
    ports = {
        "postgres": config.postgres_port, "s3": config.s3_port, "spark-master": config.master_port,
        "spark-worker-1": config.worker_ui_ports[0], "spark-worker-2": config.worker_ui_ports[1],
        "engine": config.engine_port,
    }  # fmt: skip
    if service in ports:
        return port_in_use(ports[service])
    if service == "api-server":
        return ApiClient(config.api_url, DEFAULT_USER, DEFAULT_PASSWORD).healthy()
    return True  # scheduler, dag-processor, triggerer: started is all one can wait for


@contextmanager
def running_topology(
    config: TopologyConfig, log_dir: Path, ready_timeout_s: float = 600.0, base_env: Mapping[str, str] | None = None
) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """Every service as a child process (the compose file's commands), each up before the next starts; every
    environment starts from ``base_env`` (default ``os.environ``), as a container's would."""
    log_dir.mkdir(parents=True, exist_ok=True)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    env = {**(os.environ if base_env is None else base_env), **config.to_env()}
    try:
        for service in SERVICES:
            with (log_dir / f"{service}.log").open("ab") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "barrierflow.tools.topology", "serve", service], env=env,
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                )  # fmt: skip
            procs[service] = proc
            deadline = time.monotonic() + ready_timeout_s
            while not _ready(service, config, proc):
                if proc.poll() is not None:
                    raise ConfigurationError(f"{service} exited with code {proc.returncode}; see {log_dir / service}.log")
                if time.monotonic() > deadline:
                    raise ConfigurationError(f"{service} was not ready within {ready_timeout_s:.0f} s; see its log")
                time.sleep(0.5)
        yield procs
    finally:
        for proc in reversed(list(procs.values())):
            stop_group(proc, signal.SIGTERM, grace_s=20.0)
            with contextlib.suppress(ProcessLookupError):  # what it left in its process group (tasks, executors)
                os.killpg(proc.pid, signal.SIGKILL)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m barrierflow.tools.topology", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("serve", help="run one service in the foreground (a container's command)")
    one.add_argument("service", choices=SERVICES)
    sub.add_parser("up", help="start every service as a child process, in order, until Ctrl-C")
    args = parser.parse_args(argv)
    config = TopologyConfig.from_env()
    if args.command == "serve":
        return serve(args.service, config)
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    with contextlib.suppress(KeyboardInterrupt), running_topology(config, config.home / "logs"):
        up = f"topology up: Airflow on {config.api_url} (admin/admin), warehouse {config.warehouse}; Ctrl-C stops it"
        print(up, flush=True)
        while not stop:
            time.sleep(0.5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
