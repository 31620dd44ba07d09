"""The warm engine: a long-lived Spark application that epochs run on, through Spark Connect.

Starting a Spark application costs more than a small epoch once warm, so the Airflow tasks connect to one Spark Connect server
that stays up between epochs, each pipeline in its own session (:func:`barrierflow.execution.spark.get_spark`). ``barrierflow
engine`` runs PySpark's own server in the foreground (what ``docker-compose.yaml`` runs); ``make run`` and the tests start the
same command through :class:`LocalEngine`. Its Python workers run this interpreter.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Mapping

from barrierflow.core.errors import EngineUnavailableError
from barrierflow.core.settings import DEFAULT_WARM_UP_EPOCHS
from barrierflow.execution.process_group import kill_group, stop_group
from barrierflow.execution.shipping import package_archive, ships_package
from barrierflow.execution.spark import application_conf, worker_conf

__all__ = [
    "CONNECT_SERVER_CLASS", "DEFAULT_ENGINE_PORT", "EngineConfig", "LocalEngine", "serve", "default_warm_up_epochs",
    "wait_until_listening",
]  # fmt: skip

CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_ENGINE_PORT = 15002  # Spark Connect's own default


@dataclass(frozen=True)
class EngineConfig:
    """How the engine is started; :meth:`command` and :meth:`environment` are all a launcher needs."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_ENGINE_PORT
    master: str = "local[*]"
    driver_memory: str = "2g"
    # Throwaway epochs run once the engine listens (barrierflow.tools.warmup) in session ``warm_up_session``; 0: none.
    warm_up_epochs: int = 0
    warm_up_session: str = "sensor_stats"

    @property
    def address(self) -> str:
        return f"sc://{self.host}:{self.port}"

    @property
    def client_address(self) -> str:
        """Where a client on this machine connects (a wildcard bind is reached on loopback)."""
        return f"sc://{_client_host(self.host)}:{self.port}"

    def warm_up_command(self) -> list[str]:
        epochs = ["--epochs", str(self.warm_up_epochs), "--session", self.warm_up_session]
        return [sys.executable, "-m", "barrierflow.tools.warmup", self.client_address, *epochs]

    def conf(self) -> dict[str, str]:
        conf = {
            "spark.app.name": "barrierflow-engine",
            "spark.connect.grpc.binding.address": self.host,
            "spark.connect.grpc.binding.port": str(self.port),
            # A pipeline's session outlives idle hours (a paused DAG); after this it closes and the next is used.
            "spark.connect.session.manager.defaultSessionTimeout": "24h",
            "spark.ui.enabled": "false",
            "spark.log.level": "WARN",
            "spark.ui.showConsoleProgress": "false",
            "spark.python.worker.reuse": "true",
            "spark.pyspark.python": sys.executable,
            **application_conf(),
            **worker_conf(self.master),
        }
        if self.host in ("127.0.0.1", "localhost"):  # a loopback engine keeps its driver's ports on loopback too
            conf["spark.driver.host"] = conf["spark.driver.bindAddress"] = "127.0.0.1"
        return conf

    def command(self) -> list[str]:
        spark_submit = Path(sys.executable).with_name("spark-submit")
        cmd = [str(spark_submit) if spark_submit.exists() else "spark-submit", "--class", CONNECT_SERVER_CLASS]
        cmd += ["--master", self.master, "--driver-memory", self.driver_memory]
        if ships_package(self.master):
            cmd += ["--py-files", package_archive()]  # executors import the shipped package
        for key, value in sorted(self.conf().items()):
            cmd += ["--conf", f"{key}={value}"]
        return [*cmd, "spark-internal"]

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Python workers (and the driver's Python side) run this interpreter."""
        env = dict(os.environ if base is None else base)
        bin_dir = str(Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join([bin_dir, *[p for p in env.get("PATH", "").split(os.pathsep) if p and p != bin_dir]])
        env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
        # The engine is a server, not a client of another one.
        for key in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "BARRIERFLOW_SPARK_REMOTE"):
            env.pop(key, None)
        return env


def wait_until_listening(host: str, port: int, timeout_s: float, proc: subprocess.Popen[Any] | None = None) -> None:
    """Block until ``host:port`` accepts connections; raise if ``proc`` exits first or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise EngineUnavailableError(
                f"the Spark engine exited with code {proc.returncode} before it listened on {host}:{port}"
            )
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            pass
        if time.monotonic() >= deadline:
            raise EngineUnavailableError(f"the Spark engine did not listen on {host}:{port} within {timeout_s:.0f} s")
        time.sleep(0.25)


class LocalEngine:
    """The engine as a child process of this one (its own process group, stopped with it)."""

    def __init__(self, config: EngineConfig, log: IO[bytes] | int | None = None, env: Mapping[str, str] | None = None) -> None:
        self.config = config
        self._log = log
        self._env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.warm_up_proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return self.config.address

    def start(self, wait_s: float | None = 120.0) -> "LocalEngine":
        """Launch the server; wait up to ``wait_s`` for it to listen (None: return at once, see :meth:`wait_ready`)."""
        self.proc = self._spawn(self.config.command(), self._log)  # no log: this process's own output
        if wait_s is not None:
            self.wait_ready(wait_s)
        return self

    def wait_ready(self, wait_s: float) -> None:
        """Block until the server listens, then start its warm-up (if any); stop it and raise if it exits or ``wait_s`` passes."""
        try:
            wait_until_listening(_client_host(self.config.host), self.config.port, wait_s, self.proc)
        except BaseException:
            self.stop()
            raise
        if self.config.warm_up_epochs > 0 and self.warm_up_proc is None:
            self.warm_up_proc = self._spawn(self.config.warm_up_command(), subprocess.PIPE)

    def _spawn(self, command: list[str], stdout: IO[bytes] | int | None) -> "subprocess.Popen[bytes]":
        """``command`` in a session of its own (one process group, stopped as one), its stderr with its stdout."""
        env = self.config.environment(self._env)
        return subprocess.Popen(
            command, env=env, stdout=stdout, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )

    def wait_warm(self, wait_s: float, stop: Callable[[], bool] = lambda: False) -> tuple[bool, str]:
        """Wait up to ``wait_s`` for the warm-up (best effort: the engine serves anyway); whether it succeeded, what it printed last."""
        proc = self.warm_up_proc
        if proc is None:
            return True, "no warm-up"
        deadline = time.monotonic() + wait_s
        while proc.poll() is None and time.monotonic() < deadline and not stop():
            time.sleep(0.25)
        if proc.poll() is None:
            kill_group(proc)
            return False, f"warm-up still running after {wait_s:.0f} s: stopped"
        assert proc.stdout is not None
        lines = proc.stdout.read().decode("utf-8", "replace").strip().splitlines()
        return proc.returncode == 0, (lines[-1] if lines else f"warm-up exited with code {proc.returncode}")

    def kill(self) -> None:
        """SIGKILL the whole engine (the JVM and its Python workers): a crash, for tests."""
        if self.proc is not None:
            kill_group(self.proc)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM (Spark shuts down its workers), SIGKILL after ``grace_s``."""
        if self.warm_up_proc is not None:
            kill_group(self.warm_up_proc)
        if self.proc is not None:
            stop_group(self.proc, signal.SIGTERM, grace_s)

    def __enter__(self) -> "LocalEngine":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def default_warm_up_epochs(master: str) -> int:
    """The warm-up reads files on this machine: only a local master's engine is warmed by default."""
    return DEFAULT_WARM_UP_EPOCHS if master.startswith("local") else 0


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def serve(config: EngineConfig) -> int:
    """Run the engine in the foreground until SIGTERM / Ctrl-C (``barrierflow engine``); its exit code."""
    stop: list[int] = []
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda signum, frame: stop.append(signum))
    engine = LocalEngine(config)
    try:
        engine.start(wait_s=300.0)
        print(f"barrierflow engine: Spark Connect at {config.address} (master {config.master}); Ctrl-C stops it", flush=True)
        if config.warm_up_epochs > 0:
            print(f"barrierflow engine: warming up ({config.warm_up_epochs} throwaway epochs)", flush=True)
            ok, said = engine.wait_warm(600.0, stop=lambda: bool(stop))
            print(said if ok else f"barrierflow engine: warm-up failed (serving anyway): {said}", flush=True)
        while not stop and engine.proc is not None and engine.proc.poll() is None:
            time.sleep(0.5)
    except EngineUnavailableError as exc:
        print(f"barrierflow engine: error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        engine.stop()
    return 0 if stop else 1
