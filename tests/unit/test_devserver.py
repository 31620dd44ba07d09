"""``make run``'s launcher: environment, login, input stream, process-tree shutdown (no Airflow started)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from barrierflow import devserver
from barrierflow.datagen import SensorStreamSpec, generate_sensor_lines
from barrierflow.devserver import (
    ApiClient,
    DevServerConfig,
    InputGenerator,
    devserver_environment,
    free_port,
    write_password_file,
)


def _config(tmp_path: Path, **kw: Any) -> DevServerConfig:
    return DevServerConfig(
        root=Path(__file__).resolve().parents[2], home=tmp_path / "home", warehouse=tmp_path / "wh",
        landing=tmp_path / "landing", **kw,
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
    assert not devserver.port_in_use(port)


class _FakeAirflow(BaseHTTPRequestHandler):
    paused = True

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, doc: Any) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/api/v2/monitor/health":
            return self._send(200, {"metadatabase": {"status": "healthy"}})
        if self.headers.get("Authorization") != "Bearer T":
            return self._send(401, {"detail": "Not authenticated"})
        if self.path == "/api/v2/dags/d1":
            return self._send(200, {"dag_id": "d1", "is_paused": type(self).paused})
        return self._send(404, {"detail": "nope"})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/auth/token" and body == {"username": "admin", "password": "pw"}:
            return self._send(201, {"access_token": "T"})
        return self._send(401, {"detail": "Invalid credentials"})

    def do_PATCH(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/api/v2/dags/d1" and self.headers.get("Authorization") == "Bearer T":
            type(self).paused = body["is_paused"]
            return self._send(200, {"dag_id": "d1", "is_paused": type(self).paused})
        return self._send(404, {})


@pytest.fixture
def fake_airflow() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _FakeAirflow)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_api_client_logs_in_and_unpauses(fake_airflow: str) -> None:
    _FakeAirflow.paused = True
    client = ApiClient(fake_airflow, "admin", "pw")
    assert client.healthy()
    assert client.dag("d1") == {"dag_id": "d1", "is_paused": True} and client.dag("d2") is None
    stop = threading.Event()
    devserver._ensure_unpaused(client, "d1", stop, timeout_s=5)
    assert client.dag("d1") == {"dag_id": "d1", "is_paused": False}
    with pytest.raises(RuntimeError, match="cannot log in"):
        ApiClient(fake_airflow, "admin", "wrong").token()
    assert not ApiClient(f"http://127.0.0.1:{free_port()}", "a", "b").healthy()


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
from barrierflow import devserver
devserver.become_subreaper()
baseline = devserver.descendant_pids()
proc = subprocess.Popen([sys.executable, {leader!r}], start_new_session=True)
deadline = time.monotonic() + 30
while len(devserver.descendant_pids() - baseline) < 3 and time.monotonic() < deadline:
    time.sleep(0.1)
time.sleep(0.5)
pids = sorted(devserver.descendant_pids() - baseline)
killed = devserver.stop_process_tree([proc], baseline=baseline, grace_s=1, term_s=1, first_signal=signal.SIGINT)
print("PIDS", *pids)
print("KILLED", *killed)
print("LEFT", *sorted(devserver.descendant_pids() - baseline))
"""


def test_stop_process_tree_leaves_no_orphan(tmp_path: Path) -> None:
    src = str(Path(devserver.__file__).resolve().parents[2])
    leader = tmp_path / "leader.py"
    leader.write_text(_LEADER)
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER.format(src=src, leader=str(leader)))
    out = subprocess.run([sys.executable, str(driver)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = {ln.split()[0]: [int(x) for x in ln.split()[1:]] for ln in out.stdout.splitlines() if ln.strip()}
    assert len(lines["PIDS"]) == 3, out.stdout
    assert lines["LEFT"] == []
    assert len(lines["KILLED"]) >= 1  # the grandchild ignoring SIGTERM needed SIGKILL
    for pid in lines["PIDS"]:
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().split()[2] == "Z"


def test_refuses_a_busy_port(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert devserver.run(_config(tmp_path, port=port)) == 2
    assert "already in use" in capsys.readouterr().out


def test_parser_defaults_live_under_the_repo() -> None:
    args = devserver.build_parser().parse_args([])
    config = devserver.config_from_args(args)
    root = Path(__file__).resolve().parents[2]
    assert (config.home, config.warehouse, config.landing) == (root / ".airflow", root / "warehouse", root / "landing")
    assert (config.port, config.user, config.generate_every_s) == (8080, "admin", 5.0)
