"""``make run``'s launcher: environment, login, REST client, input stream, process-tree shutdown (no Airflow started)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

import barrierflow.tools.devserver
from barrierflow.demo.datagen import SensorStreamSpec, generate_sensor_lines
from barrierflow.tools.devserver import processes, server
from barrierflow.tools.devserver.client import ApiClient, ApiConnectionError
from barrierflow.tools.devserver.environment import (
    DevServerConfig,
    devserver_environment,
    free_port,
    port_in_use,
    write_password_file,
)
from barrierflow.tools.devserver.server import InputGenerator

ROOT = Path(__file__).resolve().parents[2]
SRC = str(Path(processes.__file__).resolve().parents[2])  # the include/ directory this barrierflow comes from


def _config(tmp_path: Path, **kw: Any) -> DevServerConfig:
    return DevServerConfig(
        root=ROOT,
        home=tmp_path / "home",
        warehouse=tmp_path / "wh",
        landing=tmp_path / "landing",
        **kw,
    )


def test_environment_binds_loopback_and_wires_dags_plugins_warehouse_and_login(tmp_path: Path) -> None:
    config = _config(tmp_path, port=18123, password="s3cret", db_port=15433)
    env = devserver_environment(config, base={"PATH": "/usr/bin", "AIRFLOW__API__HOST": "0.0.0.0"})
    assert env["AIRFLOW__API__HOST"] == "127.0.0.1" and env["AIRFLOW__API__PORT"] == "18123"
    assert env["AIRFLOW__API__BASE_URL"] == "http://127.0.0.1:18123"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:18123/execution/"
    assert env["AIRFLOW_HOME"] == str(tmp_path / "home")
    # The embedded PostgreSQL on loopback; SQLite only when asked for.
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == "postgresql+psycopg2://airflow@127.0.0.1:15433/airflow"
    sqlite = devserver_environment(_config(tmp_path, metadata_db="sqlite"), base={})
    assert sqlite["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("sqlite:///")
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(config.root / "dags")
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == str(config.root / "plugins")
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    assert env["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] == "False"
    assert env["BARRIERFLOW_WAREHOUSE"] == str(tmp_path / "wh")
    assert env["BARRIERFLOW_SENSOR_STATS__LANDING_DIR"] == str(tmp_path / "landing")
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "admin:admin"
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] == str(config.password_file)
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)  # `airflow` is the venv's
    secret = env["AIRFLOW__API_AUTH__JWT_SECRET"]
    assert len(secret) >= 64 and devserver_environment(config, base={})["AIRFLOW__API_AUTH__JWT_SECRET"] == secret
    assert env["AIRFLOW__CORE__PARALLELISM"] == "8"
    assert devserver_environment(config, base={"AIRFLOW__CORE__PARALLELISM": "3"})["AIRFLOW__CORE__PARALLELISM"] == "3"


def test_password_file_sets_the_known_password_and_keeps_other_users(tmp_path: Path) -> None:
    path = tmp_path / "home" / "passwords.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"admin": "generated", "bob": "b"}))
    write_password_file(path, "admin", "admin")
    assert json.loads(path.read_text()) == {"admin": "admin", "bob": "b"}
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    write_password_file(tmp_path / "new" / "p.json", "admin", "x")
    assert json.loads((tmp_path / "new" / "p.json").read_text()) == {"admin": "x"}


def test_input_generator_continues_the_stream_atomically(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "readings-000004.jsonl").write_text("{}\n")
    (landing / ".readings-000009.jsonl.123.tmp").write_text("partial")
    gen = InputGenerator(landing, interval_s=0.05, records_per_file=20)
    assert gen.next_index() == 5
    path = gen.write_one()
    assert path.name == "readings-000005.jsonl"
    expected = generate_sensor_lines(SensorStreamSpec(n_files=6, records_per_file=20), 5)
    assert path.read_text() == "".join(line + "\n" for line in expected)
    gen.start()
    deadline = time.monotonic() + 10
    while gen.written < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    gen.stop()
    gen.join(5)
    assert not gen.is_alive() and gen.written >= 4
    visible = sorted(p.name for p in landing.iterdir() if not p.name.startswith("."))
    assert visible[:3] == ["readings-000004.jsonl", "readings-000005.jsonl", "readings-000006.jsonl"]
    assert [p.name for p in landing.iterdir() if p.name.startswith(".") and p.name != ".readings-000009.jsonl.123.tmp"] == []


def test_free_port_is_bindable_on_loopback() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    assert not port_in_use(port)


class _FakeAirflow(BaseHTTPRequestHandler):
    """Just enough of Airflow's REST API: health, login, one DAG; plus bodies that are not JSON, a redirect, a slow path."""

    paused = True
    logins = 0

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, doc: Any, content_type: str = "application/json") -> None:
        body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length)) if length else None

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/api/v2/monitor/health":
            return self._send(200, {"metadatabase": {"status": "healthy"}})
        if self.path == "/slow":
            time.sleep(2)
            return self._send(200, {})
        if self.headers.get("Authorization") != "Bearer T":
            return self._send(401, {"detail": "Not authenticated"})
        if self.path == "/api/v2/dags/d1":
            return self._send(200, {"dag_id": "d1", "is_paused": type(self).paused})
        if self.path == "/old/d1":
            self.send_response(307)
            self.send_header("Location", "/api/v2/dags/d1")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if self.path == "/text":
            return self._send(500, b"Internal Server Error", "text/plain")
        if self.path == "/empty":
            self.send_response(204)
            self.end_headers()
            return None
        return self._send(404, {"detail": "nope"})

    def do_POST(self) -> None:  # noqa: N802
        body = self._body()
        if self.path == "/auth/token" and body == {"username": "admin", "password": "pw"}:
            type(self).logins += 1
            return self._send(201, {"access_token": "T"})
        return self._send(401, {"detail": "Invalid credentials"})

    def do_PATCH(self) -> None:  # noqa: N802
        body = self._body()
        if self.path == "/api/v2/dags/d1" and self.headers.get("Authorization") == "Bearer T":
            type(self).paused = body["is_paused"]
            return self._send(200, {"dag_id": "d1", "is_paused": type(self).paused})
        return self._send(404, {})

    def do_PUT(self) -> None:  # noqa: N802
        body = self._body()
        if self.headers.get("Authorization") != "Bearer T":
            return self._send(401, {"detail": "Not authenticated"})
        return self._send(200, {"path": self.path, "body": body})


@pytest.fixture
def fake_airflow() -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 (threads: a slow request does not hold up the others)."""
    _FakeAirflow.paused, _FakeAirflow.logins = True, 0
    http = ThreadingHTTPServer(("127.0.0.1", 0), _FakeAirflow)
    http.daemon_threads = True
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{http.server_address[1]}"
    finally:
        http.shutdown()
        http.server_close()


def test_api_client_logs_in_and_unpauses(fake_airflow: str) -> None:
    client = ApiClient(fake_airflow, "admin", "pw")
    assert client.healthy()
    assert client.dag("d1") == {"dag_id": "d1", "is_paused": True} and client.dag("d2") is None
    stop = threading.Event()
    server._ensure_unpaused(client, "d1", stop, timeout_s=5)
    assert client.dag("d1") == {"dag_id": "d1", "is_paused": False}
    assert _FakeAirflow.logins == 1  # the token is fetched once, then reused
    with pytest.raises(RuntimeError, match="cannot log in"):
        ApiClient(fake_airflow, "admin", "wrong").token()
    assert not ApiClient(f"http://127.0.0.1:{free_port()}", "a", "b").healthy()


def test_api_client_answers_status_and_json_or_text(fake_airflow: str) -> None:
    client = ApiClient(fake_airflow, "admin", "pw")
    assert client.get("/api/v2/dags/d2") == (404, {"detail": "nope"})  # an error status still carries its document
    assert client.get("/text") == (500, "Internal Server Error")  # not JSON: the text
    assert client.get("/empty") == (204, None)
    assert client.get("/old/d1") == (200, {"dag_id": "d1", "is_paused": True})  # redirects are followed
    assert client.put("/api/v2/backfills/1/pause") == (200, {"path": "/api/v2/backfills/1/pause", "body": None})
    assert client.post("/auth/token", {"username": "x", "password": "y"}) == (401, {"detail": "Invalid credentials"})
    assert client.set_paused("d1", False) and not client.set_paused("d2", True)
    assert _FakeAirflow.logins == 1


def test_api_client_raises_an_oserror_when_nothing_answers(fake_airflow: str) -> None:
    # Callers (tests/stack.py's until, healthy) catch OSError for a request that got no answer, as with urllib.
    with pytest.raises(ApiConnectionError) as refused:
        ApiClient(f"http://127.0.0.1:{free_port()}", "a", "b").get("/api/v2/dags")
    assert isinstance(refused.value, OSError)
    slow = ApiClient(fake_airflow, "admin", "pw", timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(OSError, match="Timeout"):
        slow._request("GET", "/slow", auth=False)
    assert time.monotonic() - started < 1.5


# A process-group leader that ignores SIGINT and starts a plain child and a grandchild that
# moves into its own process group and ignores SIGINT and SIGTERM (like a task process).
_LEADER = """
import signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
subprocess.Popen([sys.executable, "-c", "import os, signal, time; os.setpgid(0, 0); "
                  "signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.signal(signal.SIGINT, signal.SIG_IGN); "
                  "time.sleep(600)"])
time.sleep(600)
"""

_DRIVER = """
import signal, subprocess, sys, time
sys.path.insert(0, {src!r})
from barrierflow.tools.devserver import processes
processes.become_subreaper()
baseline = processes.descendant_pids()
proc = subprocess.Popen([sys.executable, {leader!r}], start_new_session=True)
deadline = time.monotonic() + 30
while len(processes.descendant_pids() - baseline) < 3 and time.monotonic() < deadline:
    time.sleep(0.1)
time.sleep(0.5)
pids = sorted(processes.descendant_pids() - baseline)
killed = processes.stop_process_tree([proc], baseline=baseline, grace_s=1, term_s=1, first_signal=signal.SIGINT)
print("PIDS", *pids)
print("KILLED", *killed)
print("LEFT", *sorted(processes.descendant_pids() - baseline))
"""


def _run_driver(tmp_path: Path, driver: str, **files: str) -> dict[str, list[str]]:
    """Run ``driver`` (its own process: the stop signals this process's whole tree); its ``KEY values`` lines."""
    paths = {}
    for name, text in files.items():
        paths[name] = tmp_path / f"{name}.py"
        paths[name].write_text(text)
    script = tmp_path / "driver.py"
    script.write_text(driver.format(src=SRC, tmp=str(tmp_path), **{k: str(v) for k, v in paths.items()}))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return {ln.split()[0]: ln.split()[1:] for ln in out.stdout.splitlines() if ln.strip()}


def _gone(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split()[2] == "Z"


def test_stop_process_tree_leaves_no_orphan(tmp_path: Path) -> None:
    lines = {k: [int(x) for x in v] for k, v in _run_driver(tmp_path, _DRIVER, leader=_LEADER).items()}
    assert len(lines["PIDS"]) == 3, lines
    assert lines["LEFT"] == []
    assert len(lines["KILLED"]) >= 1  # the grandchild ignoring SIGTERM needed SIGKILL
    assert all(_gone(pid) for pid in lines["PIDS"])


# A stand-in for an Airflow component, a task or the metadata database: notes the SIGTERM it gets, then exits.
_COMPONENT = """
import os, signal, sys, time
name, log = sys.argv[1], sys.argv[2]
def on_term(signum, frame):
    with open(log, "a") as f:
        f.write(name + "\\n")
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
open(f"{log}.{name}", "w").close()
while True:
    time.sleep(0.05)
"""

_ORDER_DRIVER = """
import os, subprocess, sys, time
sys.path.insert(0, {src!r})
from pathlib import Path
from barrierflow.tools.devserver import processes
processes.become_subreaper()
baseline = processes.descendant_pids()
log = {tmp!r} + "/signals.log"
names = ("api-server", "scheduler", "dag-processor", "triggerer", "engine", "task", "database")
started = {{n: subprocess.Popen([sys.executable, {component!r}, n, log], start_new_session=True) for n in names}}
deadline = time.monotonic() + 60
while not all(Path(f"{{log}}.{{n}}").exists() for n in names) and time.monotonic() < deadline:
    time.sleep(0.05)
assert all(Path(f"{{log}}.{{n}}").exists() for n in names), "the stand-ins did not start"
airflow = processes.AirflowProcesses({{}}, Path({tmp!r}), 0)
for n in ("api-server", "scheduler", "dag-processor", "triggerer", "engine"):
    airflow.adopt(n, started[n])
airflow.spared.append(started["database"].pid)
killed = airflow.stop(baseline, grace_s=5)
print("ORDER", *Path(log).read_text().split())
print("KILLED", *killed)
print("DATABASE", "alive" if started["database"].poll() is None else "stopped")
started["database"].terminate()
started["database"].wait()
print("LEFT", *sorted(processes.descendant_pids() - baseline))
"""


def test_airflow_processes_stop_components_first_then_the_rest_then_the_api_server(tmp_path: Path) -> None:
    lines = _run_driver(tmp_path, _ORDER_DRIVER, component=_COMPONENT)
    order = lines["ORDER"]
    # The components (and the adopted engine) first, then the rest of the tree (a task), the API server last.
    assert sorted(order[:4]) == ["dag-processor", "engine", "scheduler", "triggerer"], order
    assert order[4:] == ["task", "api-server"], order
    assert lines["KILLED"] == [] and lines["LEFT"] == []
    assert lines["DATABASE"] == ["alive"]  # spared: stopped after everything else, by its owner


def test_package_reexports_and_runs_as_a_module() -> None:
    for name in barrierflow.tools.devserver.__all__:
        assert hasattr(barrierflow.tools.devserver, name), name
    # What other code imports from the package itself.
    from barrierflow.tools.devserver import (  # noqa: F401
        DEFAULT_PASSWORD,
        DEFAULT_USER,
        STACK_FILE,
        AirflowProcesses,
        ApiClient,
        DevServerConfig,
        InputGenerator,
        devserver_environment,
        first_interval_end,
        free_port,
        port_in_use,
        write_password_file,
    )

    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run([sys.executable, "-m", "barrierflow.tools.devserver", "--help"], capture_output=True, text=True,
                         env=env, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m barrierflow.tools.devserver")


def test_refuses_a_busy_port(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert server.run(_config(tmp_path, port=port)) == 2
    assert "already in use" in capsys.readouterr().out


def test_parser_defaults_live_under_the_repo() -> None:
    args = server.build_parser().parse_args([])
    config = server.config_from_args(args)
    assert (config.home, config.warehouse, config.landing) == (ROOT / ".airflow", ROOT / "warehouse", ROOT / "landing")
    assert (config.port, config.user, config.generate_every_s) == (8080, "admin", 5.0)


def test_the_warehouse_may_be_on_s3_and_the_landing_directory_must_be_local(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parse = server.build_parser().parse_args
    config = server.config_from_args(parse(["--warehouse", "s3://lake/wh/", "--landing", f"file://{tmp_path}/in"]))
    assert (config.warehouse, config.landing) == ("s3://lake/wh", tmp_path / "in")
    assert server.config_from_args(parse(["--warehouse", "wh"])).warehouse == Path.cwd() / "wh"
    for argv, says in (
        (["--landing", "s3://lake/in"], "is not a local directory"),  # never a local directory named "s3:"
        (["--warehouse", "gs://lake/wh"], "allowed are local paths, file:// URIs and s3://"),
    ):
        with pytest.raises(SystemExit) as exited:
            parse(argv)
        assert exited.value.code == 2 and says in capsys.readouterr().err
