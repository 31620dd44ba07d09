"""``make run``: a local Airflow with barrierflow's DAGs and plugin, plus a live input stream.

From a fresh clone, ``python -m barrierflow.devserver``:

1. configures Airflow through environment variables
   (:func:`barrierflow.dags.environment.airflow_environment`): ``AIRFLOW_HOME``
   at ``<repo>/.airflow`` with its metadata database in an embedded
   PostgreSQL (:mod:`barrierflow.metadata_db`: ``initdb`` into
   ``.airflow/postgres`` once, then a server on a free loopback port, started
   first and stopped last; ``--metadata-db sqlite`` for SQLite), LocalExecutor, the
   project's ``dags/`` and ``plugins/``, no examples, DAGs unpaused at
   creation, ``BARRIERFLOW_WAREHOUSE=<repo>/warehouse`` and
   ``BARRIERFLOW_SENSOR_STATS__LANDING_DIR=<repo>/landing``;
2. fixes the login: the simple auth manager with user ``admin`` and a known
   password (``admin`` unless ``--password``/``$BARRIERFLOW_DEV_PASSWORD``),
   written to the auth manager's passwords file;
3. starts the warm Spark engine (:class:`barrierflow.engine.LocalEngine`, a
   Spark Connect server on 127.0.0.1, ``--engine-port``, 15002 by default) as
   the ``spark_connect_default`` connection, so epochs run on a Spark that
   stays up; once it listens it runs a few throwaway epochs
   (:mod:`barrierflow.warmup`) while Airflow starts, so the first scheduled
   epochs do not pay for a cold JVM; the sensor_stats input generator starts
   at the same time;
4. runs what ``airflow standalone`` runs (``db migrate``, API server, DAG
   processor, scheduler, triggerer) as child processes, with the API server
   bound to 127.0.0.1 and up before the scheduler starts. Not ``airflow
   standalone`` itself: in Airflow 3.3 it also starts the scheduler's and
   triggerer's log servers on every network interface (ports 8793/8794, no
   setting changes the address), which a development server must not do;
   here they are skipped (``--skip-serve-logs``) and the API server reads the
   task logs from ``AIRFLOW_HOME/logs`` directly;
5. starts the DAG processor once the first one-minute interval holding
   generated input has ended: with ``catchup=False`` a new DAG's first run is
   the interval that ended last before it was parsed, so that run commits
   input rather than reporting "no new input"; then makes sure
   ``barrierflow_sensor_stats`` is unpaused (a DAG paused by an earlier
   configuration stays paused otherwise);
6. writes a ``sensor_stats`` input file into the landing directory every few
   seconds (:mod:`barrierflow.datagen`: a ``.``-prefixed temporary name, then
   an atomic rename), continuing after the files already there;
7. prints the URL and the login, writes ``.airflow/barrierflow-stack.json``
   (the stack's Airflow settings, read by ``barrierflow airflow ...`` to run
   the Airflow CLI against it), and runs until Ctrl-C (or SIGTERM), then
   stops Airflow and every process it started: SIGTERM to each component
   (scheduler first, API server last), then SIGTERM and finally SIGKILL to
   whatever is left of the process tree. This process is made a *child
   subreaper* (Linux) so that task processes that moved into their own
   process groups, and the Spark JVMs they start, stay in its tree and are
   found and stopped too.

The browser tests start exactly this (``python -m barrierflow.devserver
--port N --home ... --warehouse ... --landing ...``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from barrierflow.dags.settings import PROCESS_MODE_ENV, SPARK_SUBMIT_MODE, DagSettings, param_env_var, pipeline_dag_id
from barrierflow.engine import DEFAULT_ENGINE_PORT, EngineConfig, LocalEngine
from barrierflow.errors import ConfigurationError, EngineUnavailableError
from barrierflow.metadata_db import EmbeddedPostgres
from barrierflow.warmup import DEFAULT_WARM_UP_EPOCHS

__all__ = [
    "DevServerConfig",
    "DEFAULT_DAG_ID",
    "DEFAULT_USER",
    "DEFAULT_PASSWORD",
    "devserver_environment",
    "write_password_file",
    "jwt_secret",
    "free_port",
    "ApiClient",
    "InputGenerator",
    "stop_process_tree",
    "AirflowProcesses",
    "descendant_pids",
    "become_subreaper",
    "main",
]

HOST = "127.0.0.1"  # never anything but loopback: this is a development server
DEFAULT_PORT = 8080
DEFAULT_USER = "admin"
DEFAULT_PASSWORD = "admin"
PASSWORD_ENV = "BARRIERFLOW_DEV_PASSWORD"
PIPELINE = "sensor_stats"  # the pipeline whose input the generator writes
DEFAULT_DAG_ID = pipeline_dag_id(PIPELINE)
LANDING_ENV = param_env_var(PIPELINE, "landing_dir")  # BARRIERFLOW_SENSOR_STATS__LANDING_DIR
SIMPLE_AUTH_MANAGER = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
PR_SET_CHILD_SUBREAPER = 36
STACK_FILE = "barrierflow-stack.json"
# Defaults that a caller's environment may override.
_TUNING = {
    "AIRFLOW__CORE__PARALLELISM": "8",
}


def _repo_root() -> Path:
    from barrierflow.dags.environment import repo_root

    return repo_root()


@dataclass(frozen=True)
class DevServerConfig:
    """Where everything lives and how the server is reached."""

    root: Path
    home: Path
    warehouse: Path | str  # a local directory, or s3://bucket/prefix
    landing: Path
    port: int = DEFAULT_PORT
    engine_port: int = DEFAULT_ENGINE_PORT
    user: str = DEFAULT_USER
    password: str = DEFAULT_PASSWORD
    generate_every_s: float = 5.0  # 0 disables the input generator
    warm_up_epochs: int = DEFAULT_WARM_UP_EPOCHS  # throwaway epochs on the new engine (barrierflow.warmup)
    metadata_db: str = "postgres"  # or "sqlite" (one writer at a time: not for the CLI beside the stack)
    db_port: int = 0  # the embedded PostgreSQL's loopback port (0: any free port)
    records_per_file: int = 200
    dag_id: str = DEFAULT_DAG_ID
    extra_env: Mapping[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def engine(self) -> EngineConfig:
        return EngineConfig(host=HOST, port=self.engine_port, warm_up_epochs=self.warm_up_epochs, warm_up_session=PIPELINE)

    @property
    def postgres(self) -> EmbeddedPostgres:
        return EmbeddedPostgres(self.home / "postgres", self.db_port)

    @property
    def stack_file(self) -> Path:
        """Where a running stack writes the environment of its Airflow (``barrierflow airflow`` reads it)."""
        return self.home / STACK_FILE

    @property
    def checkpoints_url(self) -> str:
        return f"{self.url}/barrierflow/"

    @property
    def password_file(self) -> Path:
        return self.home / "simple_auth_manager_passwords.json"


def devserver_environment(config: DevServerConfig, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every Airflow component for ``config`` (``base`` defaults to ``os.environ``)."""
    from barrierflow.dags.environment import airflow_environment

    env = dict(os.environ if base is None else base)
    env.update(
        airflow_environment(config.home, root=config.root, warehouse=config.warehouse, engine_address=config.engine.address)
    )
    env.update(
        {
            "AIRFLOW__API__HOST": HOST,
            "AIRFLOW__API__PORT": str(config.port),
            "AIRFLOW__API__BASE_URL": config.url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{config.url}/execution/",
            "AIRFLOW__CORE__AUTH_MANAGER": SIMPLE_AUTH_MANAGER,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{config.user}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(config.password_file),
            "AIRFLOW__API_AUTH__JWT_SECRET": jwt_secret(config.home),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            LANDING_ENV: str(config.landing),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if config.metadata_db == "postgres":
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = config.postgres.url
    # Sized for a laptop: LocalExecutor pre-forks one worker per parallelism slot (32 by default).
    for key, value in _TUNING.items():
        env[key] = (base if base is not None else os.environ).get(key, value)
    env.update(config.extra_env)
    return env


def write_stack_file(config: DevServerConfig, env: Mapping[str, str]) -> None:
    """Record the running stack's Airflow settings, so that the Airflow CLI can be pointed at it."""
    keep = {k: v for k, v in env.items() if k.startswith(("AIRFLOW", "BARRIERFLOW_")) or k == LANDING_ENV}
    doc = {"url": config.url, "pid": os.getpid(), "environment": keep}
    tmp = config.stack_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
    os.replace(tmp, config.stack_file)


def jwt_secret(home: Path) -> str:
    """A 64-byte JWT signing secret kept in ``home`` (created once; every component must share it).

    Airflow's generated default is 16 bytes, which PyJWT warns about on every
    token for HS512.
    """
    import secrets

    path = home / "jwt_secret"
    try:
        value = path.read_text().strip()
    except FileNotFoundError:
        value = ""
    if len(value) < 64:
        home.mkdir(parents=True, exist_ok=True)
        value = secrets.token_urlsafe(64)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(value + "\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    return value


def write_password_file(path: Path, user: str, password: str) -> None:
    """Set ``user``'s password in the simple auth manager's passwords file (JSON ``{user: password}``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        current = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        current = {}
    current[user] = password
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(current) + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


# -- the REST API (stdlib only: used before anything else is up) -----------------


class ApiClient:
    """A tiny client of Airflow's public REST API, authenticated with a JWT from ``/auth/token``."""

    def __init__(self, base_url: str, user: str, password: str, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.user = user
        self.password = password
        self.timeout_s = timeout_s
        self._token: str | None = None

    def _request(self, method: str, path: str, body: Any = None, auth: bool = True) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if auth:
            req.add_header("Authorization", f"Bearer {self.token()}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                return exc.code, json.loads(raw) if raw else None
            except ValueError:
                return exc.code, raw.decode(errors="replace")

    def healthy(self) -> bool:
        try:
            status, _ = self._request("GET", "/api/v2/monitor/health", auth=False)
        except (OSError, urllib.error.URLError):
            return False
        return status == 200

    def token(self) -> str:
        if self._token is None:
            status, doc = self._request(
                "POST", "/auth/token", {"username": self.user, "password": self.password}, auth=False
            )
            if status not in (200, 201) or not isinstance(doc, dict) or "access_token" not in doc:
                raise RuntimeError(f"cannot log in as {self.user!r}: HTTP {status} {doc!r}")
            self._token = str(doc["access_token"])
        return self._token

    def get(self, path: str) -> tuple[int, Any]:
        return self._request("GET", path)

    def patch(self, path: str, body: Any) -> tuple[int, Any]:
        return self._request("PATCH", path, body)

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        return self._request("POST", path, body)

    def put(self, path: str, body: Any = None) -> tuple[int, Any]:
        return self._request("PUT", path, body)

    def dag(self, dag_id: str) -> dict[str, Any] | None:
        status, doc = self.get(f"/api/v2/dags/{dag_id}")
        return doc if status == 200 and isinstance(doc, dict) else None

    def set_paused(self, dag_id: str, paused: bool) -> bool:
        status, _ = self.patch(f"/api/v2/dags/{dag_id}", {"is_paused": paused})
        return status == 200


def wait_until(
    predicate: Callable[[], bool],
    timeout_s: float,
    interval_s: float = 1.0,
    stop: threading.Event | None = None,
) -> bool:
    """Poll ``predicate`` until it holds (True), ``timeout_s`` passes or ``stop`` is set (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stop is not None and stop.is_set():
            return False
        if predicate():
            return True
        if stop is not None:
            stop.wait(interval_s)
        else:
            time.sleep(interval_s)
    return predicate()


# -- the input stream ----------------------------------------------------------------


class InputGenerator(threading.Thread):
    """Writes the next ``sensor_stats`` landing file every ``interval_s`` seconds.

    Files are published atomically by :func:`barrierflow.datagen.write_sensor_files`
    (``.``-prefixed temporary name, fsync, rename); numbering continues after
    the files already in the directory, so restarts extend the same stream.
    """

    def __init__(self, landing: Path, interval_s: float, records_per_file: int = 200, seed: int = 0) -> None:
        super().__init__(name="barrierflow-input", daemon=True)
        self.landing = landing
        self.interval_s = interval_s
        self.records_per_file = records_per_file
        self.seed = seed
        self.stop_event = threading.Event()
        self.written = 0
        self.first_written_at: float | None = None  # wall-clock time of this session's first file

    def next_index(self) -> int:
        from barrierflow.datagen import SensorStreamSpec, sensor_file_name

        spec = SensorStreamSpec(n_files=1, records_per_file=self.records_per_file, seed=self.seed)
        prefix = sensor_file_name(spec, 0).rsplit("-", 1)[0] + "-"
        indices = []
        for name in os.listdir(self.landing) if self.landing.is_dir() else []:
            if name.startswith(prefix) and name.endswith(".jsonl"):
                digits = name[len(prefix) : -len(".jsonl")]
                if digits.isdigit():
                    indices.append(int(digits))
        return max(indices) + 1 if indices else 0

    def write_one(self) -> Path:
        from barrierflow.datagen import SensorStreamSpec, write_sensor_files

        index = self.next_index()
        spec = SensorStreamSpec(n_files=index + 1, records_per_file=self.records_per_file, seed=self.seed)
        (path,) = write_sensor_files(self.landing, spec, start_index=index, count=1)
        self.written += 1
        if self.first_written_at is None:
            self.first_written_at = path.stat().st_mtime
        return path

    def run(self) -> None:
        self.landing.mkdir(parents=True, exist_ok=True)
        while not self.stop_event.is_set():
            try:
                path = self.write_one()
                _say(f"input: wrote {path.name}")
            except Exception as exc:  # noqa: BLE001 - keep the stream going
                _say(f"input: cannot write a file: {exc}")
            self.stop_event.wait(self.interval_s)

    def stop(self) -> None:
        self.stop_event.set()


# -- processes ----------------------------------------------------------------------------


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (Linux), so none escapes shutdown."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _descendants(pid: int) -> list[Any]:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _tree_pids(roots: Sequence[int]) -> set[int]:
    """``roots`` and all their descendants."""
    return {pid for root in roots for pid in (root, *(p.pid for p in _descendants(root)))}


def descendant_pids() -> set[int]:
    """Pids of every live descendant of this process (a baseline for :func:`stop_process_tree`)."""
    return {p.pid for p in _descendants(os.getpid())}


def stop_process_tree(
    procs: Sequence[subprocess.Popen[Any]],
    *,
    baseline: set[int] | frozenset[int] = frozenset(),
    grace_s: float = 25.0,
    term_s: float = 10.0,
    first_signal: int = signal.SIGTERM,
    spared: Sequence[int] = (),
) -> list[int]:
    """Stop ``procs`` and every process they started.

    ``first_signal`` (SIGTERM: every Airflow component shuts down gracefully on
    it) to each of ``procs``, up to ``grace_s`` for them to exit, then SIGTERM
    and, after ``term_s``, SIGKILL to every descendant of this process that is
    not in ``baseline`` (the descendants that existed before ``procs``
    started). With this process a subreaper (:func:`become_subreaper`),
    processes that left their process group or lost their parent are still
    its descendants. The processes ``spared`` and their descendants (the
    metadata database, stopped after everything else) are left alone.
    Returns the pids that needed SIGKILL.
    """
    import psutil

    me = os.getpid()

    def ours() -> dict[int, Any]:
        keep = set(baseline) | _tree_pids(spared)
        return {p.pid: p for p in _descendants(me) if p.pid not in keep}

    tracked = ours()
    for proc in procs:
        if proc.poll() is None:
            try:
                proc.send_signal(first_signal)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass

    def alive() -> list[Any]:
        tracked.update(ours())
        out = []
        for p in tracked.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                pass
        return out

    rest = alive()
    for p in rest:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, still = psutil.wait_procs(rest, timeout=term_s)
    killed = []
    for p in {q.pid: q for q in [*still, *alive()]}.values():
        try:
            p.kill()
            killed.append(p.pid)
        except psutil.Error:
            pass
    psutil.wait_procs(still, timeout=5)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
    for p in ours().values():  # reap re-parented zombies
        try:
            p.wait(timeout=0.1)
        except psutil.Error:
            pass
    return killed


class AirflowProcesses:
    """The Airflow components as child processes (each in its own session), output prefixed by name.

    Equivalent to ``airflow standalone`` (metadata DB migration, API server,
    DAG processor, scheduler, triggerer), with two differences that matter
    here: nothing listens beyond 127.0.0.1 (standalone's scheduler and
    triggerer also start the log server on every interface, port 8793/8794;
    here ``--skip-serve-logs``: the API server reads the local task logs
    directly), and the API server is up before the scheduler starts tasks
    (their first call is to its execution API).
    """

    COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("dag-processor", ("dag-processor",)),
        ("scheduler", ("scheduler", "--skip-serve-logs")),
        ("triggerer", ("triggerer", "--skip-serve-logs")),
    )

    def __init__(self, env: Mapping[str, str], cwd: Path, port: int) -> None:
        self.env = dict(env)
        self.cwd = cwd
        self.port = port
        airflow = Path(sys.executable).with_name("airflow")
        self.airflow = str(airflow) if airflow.exists() else "airflow"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._threads: list[threading.Thread] = []
        self.spared: list[int] = []  # process trees outliving the stop (the metadata database)

    def _spawn(self, name: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
        # Own session: a terminal's Ctrl-C reaches only this launcher, which stops the components in order.
        proc = subprocess.Popen(
            [self.airflow, *args], env=self.env, cwd=str(self.cwd),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        thread = threading.Thread(target=_pump, args=(name, proc), name=f"out-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)
        return proc

    def adopt(self, name: str, proc: subprocess.Popen[bytes] | None) -> None:
        """Watch and stop ``proc`` (started elsewhere, e.g. the Spark engine) like a component."""
        if proc is None:
            return
        self.procs[name] = proc
        if proc.stdout is not None:
            thread = threading.Thread(target=_pump, args=(name, proc), name=f"out-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def migrate(self, timeout_s: float = 600.0) -> int:
        """``airflow db migrate`` (creates the SQLite database the first time); its exit code."""
        proc = self._spawn("db", ("db", "migrate"))
        self.procs["db"] = proc
        try:
            return proc.wait(timeout=timeout_s)
        finally:
            del self.procs["db"]

    def start_api_server(self) -> None:
        self.procs["api-server"] = self._spawn("api-server", ("api-server", "--host", HOST, "--port", str(self.port)))

    def start_components(self, *names: str) -> None:
        """Start the named components (all when none is named)."""
        for name, args in self.COMPONENTS:
            if not names or name in names:
                self.procs[name] = self._spawn(name, args)

    def exited(self) -> tuple[str, int] | None:
        """The first component that exited, with its exit code."""
        for name, proc in self.procs.items():
            code = proc.poll()
            if code is not None:
                return name, code
        return None

    def stop(self, baseline: set[int] | frozenset[int], grace_s: float = 5.0) -> list[int]:
        """Stop in an order that lets running tasks report their end to the API server.

        1. SIGTERM to the scheduler, DAG processor and triggerer, up to
           ``grace_s`` for them to exit;
        2. SIGTERM to every other process except the API server (executor
           workers, task supervisors, spark-submit and its JVM): a task
           supervisor forwards it to its task, which reports the interruption
           through the still running API server (an epoch cut short is
           recovered exactly once by the next run); SIGKILL after 10 s;
        3. the API server, then whatever is left (:func:`stop_process_tree`).
        """
        api = self.procs.get("api-server")
        workers = [p for n, p in self.procs.items() if n != "api-server"]
        for proc in workers:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for proc in workers:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        spare = _tree_pids([api.pid] if api is not None else []) | _tree_pids(self.spared)
        rest = [p for p in _descendants(os.getpid()) if p.pid not in baseline and p.pid not in spare]
        killed = _terminate(rest, term_s=10.0)
        for proc in workers:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        killed += stop_process_tree(
            [api] if api is not None else [], baseline=baseline, grace_s=grace_s, term_s=5.0, spared=self.spared
        )
        for thread in self._threads:
            thread.join(timeout=2)
        return killed


def _terminate(procs: Sequence[Any], term_s: float) -> list[int]:
    """SIGTERM ``procs`` (psutil processes), SIGKILL those alive after ``term_s``; the pids killed."""
    import psutil

    live = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                p.terminate()
                live.append(p)
        except psutil.Error:
            pass
    _, still = psutil.wait_procs(live, timeout=term_s)
    killed = []
    for p in still:
        try:
            p.kill()
            killed.append(p.pid)
        except psutil.Error:
            pass
    psutil.wait_procs(still, timeout=5)
    return killed


def _pump(name: str, proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.decode("utf-8", errors="replace").rstrip()
        if line:
            print(f"{name:13} | {line}", flush=True)


def _reap_orphans(keep: set[int]) -> None:
    """Wait for exited orphans re-parented to this subreaper (never for ``keep``: Popen's children)."""
    import psutil

    try:
        children = psutil.Process().children()
    except psutil.Error:
        return
    for child in children:
        try:
            if child.pid not in keep and child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError, OSError):
            pass


def _say(message: str) -> None:
    print(f"barrierflow | {message}", flush=True)


def _banner(config: DevServerConfig) -> str:
    lines = [
        "",
        "=" * 66,
        f"  Airflow UI:        {config.url}/",
        f"  login:             {config.user} / {config.password}",
        f"  checkpoints page:  {config.checkpoints_url}   (Browse > Checkpoints)",
        f"  DAG:               {config.url}/dags/{config.dag_id}",
        f"  Spark engine:      {config.engine.address}   (Spark Connect; connection spark_connect_default)",
        f"  warehouse:         {config.warehouse}",
        f"  landing dir:       {config.landing}"
        + (f"   (a new file every {config.generate_every_s:g} s)" if config.generate_every_s > 0 else ""),
        f"  AIRFLOW_HOME:      {config.home}",
        "  stop with Ctrl-C",
        "=" * 66,
        "",
    ]
    return "\n".join(lines)


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop(signal.Signals(signum).name)


def run(config: DevServerConfig, *, ready_timeout_s: float = 300.0) -> int:
    """Start everything, wait for Ctrl-C / SIGTERM, stop everything. Returns the exit code."""
    if config.metadata_db == "postgres" and not config.db_port:
        config = dataclasses.replace(config, db_port=free_port())
    for port, what in ((config.port, "--port"), (config.engine_port, "--engine-port"), (config.db_port, "--db-port")):
        if port_in_use(port):
            _say(f"error: port {port} on {HOST} is already in use (another barrierflow?); use {what}")
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
            _say(f"starting the metadata database (PostgreSQL) on {HOST}:{database.port}, data in {database.data_dir}")
            with (config.home / "postgres.log").open("ab") as db_log:
                database.start(log=db_log)
            airflow.spared.append(database.proc.pid)  # type: ignore[union-attr]
        write_stack_file(config, env)
        if config.generate_every_s > 0:
            # Input from the start: the schedule's first interval then holds some (step 5).
            generator = InputGenerator(config.landing, config.generate_every_s, config.records_per_file)
            generator.start()
        _say(f"starting the Spark engine (Spark Connect) on {config.engine.address}")
        engine.start(wait_s=None)
        airflow.adopt("engine", engine.proc)
        _say(f"preparing the metadata database in {config.home}")
        migrated = airflow.migrate()
        if migrated != 0:
            _say(f"error: airflow db migrate exited with code {migrated}")
            return 1
        _say(f"starting the Airflow API server on {config.url}")
        airflow.start_api_server()
        client = ApiClient(config.url, config.user, config.password)
        if not wait_until(lambda: airflow.exited() is not None or client.healthy(), ready_timeout_s, 1.0):
            _say(f"error: the Airflow API server did not answer on {config.url} within {ready_timeout_s:.0f} s")
            return 1
        if (gone := airflow.exited()) is not None:
            _say(f"error: Airflow {gone[0]} exited with code {gone[1]}")
            return 1
        engine.wait_ready(ready_timeout_s)
        threading.Thread(
            target=_report_warm_up, args=(engine, ready_timeout_s, stopping), name="warm-up", daemon=True
        ).start()
        _say("starting the scheduler and triggerer")
        airflow.start_components("scheduler", "triggerer")
        _say(_banner(config))
        if generator is not None:
            # Step 5: the first interval the DAG processor sees must hold input.
            wait_until(lambda: generator.first_written_at is not None, 60.0, 0.2, stopping)
            ready_at = first_interval_end(generator.first_written_at or time.time())
            if ready_at > time.time():
                _say(f"starting the DAG processor at {time.strftime('%H:%M:%S', time.localtime(ready_at))}, "
                     "when the first minute of input has ended")
                time.sleep(max(0.0, ready_at - time.time()))
        _say("starting the DAG processor")
        airflow.start_components("dag-processor")
        threading.Thread(
            target=_ensure_unpaused, args=(client, config.dag_id, stopping), name="unpause", daemon=True
        ).start()
        while (gone := airflow.exited()) is None:
            time.sleep(0.5)
            _reap_orphans(keep={p.pid for p in airflow.procs.values()})
        _say(f"{gone[0]} exited with code {gone[1]}: stopping everything")
        code = gone[1] or 1
    except (EngineUnavailableError, ConfigurationError) as exc:
        _say(f"error: {exc}")
        code = 1
    except (_Stop, KeyboardInterrupt) as exc:
        _say(f"stopping ({exc or 'SIGINT'})...")
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
            _say(f"killed {len(killed)} process(es) that ignored SIGTERM: {killed}")
        for s, handler in previous.items():
            signal.signal(s, handler)
        _say(f"stopped in {time.monotonic() - started:.1f} s")
    return code


def _report_warm_up(engine: LocalEngine, wait_s: float, stop: threading.Event) -> None:
    """Say how the engine's warm-up went (it runs beside Airflow's start, never delaying it)."""
    warm, said = engine.wait_warm(wait_s, stop=stop.is_set)
    if not stop.is_set():
        _say(said if warm else f"note: the engine's warm-up failed, its first epochs run cold: {said}")


def first_interval_end(first_input_at: float, interval_s: float = 60.0) -> float:
    """When the first schedule interval (aligned to ``interval_s``) holding ``first_input_at`` ends."""
    return (int(first_input_at // interval_s) + 1) * interval_s


def _ensure_unpaused(client: ApiClient, dag_id: str, stop: threading.Event, timeout_s: float = 600.0) -> None:
    """Unpause ``dag_id`` once the DAG processor has registered it (no-op when already unpaused)."""
    try:
        found: dict[str, Any] = {}

        def registered() -> bool:
            doc = client.dag(dag_id)
            if doc is not None:
                found.update(doc)
            return doc is not None

        if not wait_until(registered, timeout_s, 2.0, stop):
            if not stop.is_set():
                _say(f"note: DAG {dag_id} did not appear within {timeout_s:.0f} s (see the DAG import errors in the UI)")
            return
        if found.get("is_paused"):
            if client.set_paused(dag_id, False):
                _say(f"unpaused {dag_id}")
            else:
                _say(f"note: could not unpause {dag_id}")
    except Exception as exc:  # noqa: BLE001 - a helper thread must never take the server down
        if not stop.is_set():
            _say(f"note: cannot check whether {dag_id} is paused: {exc}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m barrierflow.devserver",
        description="A local Airflow (127.0.0.1) with barrierflow's DAGs and plugin and a live sensor_stats input stream.",
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"API server port (default {DEFAULT_PORT}; 0 = any free port)")
    p.add_argument("--home", type=Path, help="AIRFLOW_HOME (default <repo>/.airflow)")
    p.add_argument("--warehouse", type=Path, help="barrierflow warehouse (default <repo>/warehouse)")
    p.add_argument("--landing", type=Path, help="sensor_stats landing directory (default <repo>/landing)")
    p.add_argument(
        "--engine-port", type=int, default=DEFAULT_ENGINE_PORT,
        help=f"the Spark engine's Spark Connect port (default {DEFAULT_ENGINE_PORT}; 0 = any free port)",
    )
    p.add_argument("--interval", type=float, default=5.0, help="seconds between generated input files (0: no generator)")
    p.add_argument("--records-per-file", type=int, default=200)
    p.add_argument(
        "--warm-up-epochs", type=int,
        help=f"throwaway epochs the new engine runs while Airflow starts (default {DEFAULT_WARM_UP_EPOCHS}, "
        f"or 0 when ${PROCESS_MODE_ENV}={SPARK_SUBMIT_MODE}: then no epoch runs on the engine)",
    )
    p.add_argument("--user", default=DEFAULT_USER, help=f"login name (default {DEFAULT_USER})")
    p.add_argument(
        "--password",
        default=os.environ.get(PASSWORD_ENV, DEFAULT_PASSWORD),
        help=f"login password (default ${PASSWORD_ENV} or {DEFAULT_PASSWORD!r})",
    )
    p.add_argument("--ready-timeout", type=float, default=300.0, help="seconds to wait for the API server")
    p.add_argument(
        "--metadata-db", choices=("postgres", "sqlite"), default="postgres",
        help="Airflow's metadata database: an embedded PostgreSQL (default; Debian's package) or SQLite "
        "(no PostgreSQL needed, but one writer at a time: the Airflow CLI beside the stack can meet 'database is locked')",
    )
    p.add_argument("--db-port", type=int, default=0, help="the embedded PostgreSQL's port on 127.0.0.1 (default: any free port)")
    return p


def _default_warm_up() -> int:
    """Warm the engine only when the DAG's ``process`` runs on it."""
    return 0 if DagSettings.from_env(os.environ).process_mode == SPARK_SUBMIT_MODE else DEFAULT_WARM_UP_EPOCHS


def config_from_args(args: argparse.Namespace) -> DevServerConfig:
    root = _repo_root()
    port = args.port if args.port else free_port()
    return DevServerConfig(
        root=root,
        home=(args.home or root / ".airflow").resolve(),
        warehouse=(args.warehouse or root / "warehouse").resolve(),
        landing=(args.landing or root / "landing").resolve(),
        port=port,
        engine_port=args.engine_port if args.engine_port else free_port(),
        user=args.user,
        password=args.password,
        generate_every_s=max(0.0, args.interval),
        records_per_file=args.records_per_file,
        warm_up_epochs=max(0, args.warm_up_epochs) if args.warm_up_epochs is not None else _default_warm_up(),
        metadata_db=args.metadata_db,
        db_port=args.db_port or free_port(),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.records_per_file < 1:
        build_parser().error("--records-per-file must be >= 1")
    return run(config_from_args(args), ready_timeout_s=args.ready_timeout)

