"""Browser tests: the ``make run`` server (``python -m barrierflow.devserver``) driven by headless Chromium.

The ``devserver`` fixture starts exactly what ``make run`` starts, on a free
port of 127.0.0.1, with a temporary AIRFLOW_HOME, warehouse and landing
directory, once per test module, and stops it (Ctrl-C, i.e. SIGINT, then
SIGKILL of whatever is left of its process tree) at the end. Screenshots and
the server's log go to ``test-artifacts/ui/``.

Chromium runs headless from Debian's ``chromium`` and ``chromium-driver``
(``/usr/bin/chromium``, ``/usr/bin/chromedriver``; override with
``$BARRIERFLOW_CHROMIUM`` / ``$BARRIERFLOW_CHROMEDRIVER``), which ``make setup``
installs; the tests fail when either is missing. ``$BARRIERFLOW_UI_TEST_URL`` (with ``..._WAREHOUSE``) points
the tests at an already running dev server instead of starting one.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from barrierflow.devserver import DEFAULT_PASSWORD, DEFAULT_USER, ApiClient, free_port

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "ui"
CHROMIUM = os.environ.get("BARRIERFLOW_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("BARRIERFLOW_CHROMEDRIVER", "/usr/bin/chromedriver")
SERVER_START_TIMEOUT_S = 420.0
SERVER_STOP_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class DevServer:
    url: str
    user: str
    password: str
    warehouse: Path
    landing: Path
    home: Path
    log: Path
    api: ApiClient


def _browser_missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return f"{path} is not installed (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed"
    return None


def _descendants(pid: int) -> list[Any]:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C for the dev server (it stops Airflow itself), then kill whatever is left of its tree."""
    import psutil

    tree = _descendants(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=SERVER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
    def alive(p: Any) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    leftovers = [p for p in tree if alive(p)]
    if proc.poll() is None:
        leftovers.append(psutil.Process(proc.pid))
    for p in leftovers:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(leftovers, timeout=10)
    if proc.poll() is None:
        proc.wait(timeout=10)
    assert not leftovers, f"the dev server left processes behind: {[p.pid for p in leftovers]}"


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


# Module scope: the server (which schedules an epoch every minute) stops as soon
# as the browser test is done instead of loading the machine for the rest of the run.
@pytest.fixture(scope="module")
def devserver(artifacts: Path) -> Iterator[DevServer]:
    reason = _browser_missing()
    if reason:
        # Never a silent skip: `make setup` installs the browser, so its absence is a broken setup.
        pytest.fail(f"{reason} (run `make setup`, which installs Debian's chromium and chromium-driver)")
    external = os.environ.get("BARRIERFLOW_UI_TEST_URL")
    if external:
        warehouse = Path(os.environ.get("BARRIERFLOW_UI_TEST_WAREHOUSE", ROOT / "warehouse"))
        yield DevServer(
            external.rstrip("/"), DEFAULT_USER, DEFAULT_PASSWORD, warehouse, Path(), Path(), Path(),
            ApiClient(external, DEFAULT_USER, DEFAULT_PASSWORD),
        )
        return

    base = Path(tempfile.mkdtemp(prefix="barrierflow-ui-"))
    port = free_port()
    home, warehouse, landing = base / "airflow", base / "warehouse", base / "landing"
    log = artifacts / "devserver.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    command = [
        sys.executable, "-m", "barrierflow.devserver",
        "--port", str(port), "--home", str(home), "--warehouse", str(warehouse), "--landing", str(landing),
        "--engine-port", "0", "--interval", "4", "--ready-timeout", str(SERVER_START_TIMEOUT_S),
    ]
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT),
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    api = ApiClient(url, DEFAULT_USER, DEFAULT_PASSWORD)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while not api.healthy():
            if proc.poll() is not None:
                pytest.fail(f"the dev server exited with {proc.returncode}; see {log}")
            if time.monotonic() > deadline:
                pytest.fail(f"the dev server did not answer within {SERVER_START_TIMEOUT_S:.0f} s; see {log}")
            time.sleep(2)
        print(f"\ndev server up on {url} after {time.monotonic() - started:.0f} s (log: {log})")
        yield DevServer(url, DEFAULT_USER, DEFAULT_PASSWORD, warehouse, landing, home, log, api)
    finally:
        _stop(proc)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def browser(devserver: DevServer) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="barrierflow-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1440,1000",
    ):
        options.add_argument(arg)
    # Service(executable_path=...) so selenium-manager never tries to download a driver.
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
