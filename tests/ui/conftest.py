"""Browser tests: the ``make run`` server (``python -m barrierflow.tools.devserver``) driven by headless Chromium.

The ``devserver`` fixture starts exactly what ``make run`` starts, on a free
port of 127.0.0.1, with a temporary AIRFLOW_HOME, warehouse and landing
directory, once per test module, and stops it (Ctrl-C, i.e. SIGINT, then
SIGKILL of whatever is left of its process tree) at the end. Screenshots and
the server's log go to ``test-artifacts/ui/<store>/``. The test runs once with
the warehouse in a local directory and once on ``s3://`` (the test S3 endpoint);
against an already running server, once (``external``).

Chromium runs headless from Debian's ``chromium`` and ``chromium-driver``
(``/usr/bin/chromium``, ``/usr/bin/chromedriver``; override with
``$BARRIERFLOW_CHROMIUM`` / ``$BARRIERFLOW_CHROMEDRIVER``), which ``make setup``
installs; the tests fail when either is missing. ``$BARRIERFLOW_UI_TEST_URL`` (with ``..._WAREHOUSE``) points
the tests at an already running dev server instead of starting one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from barrierflow.tools.devserver import DEFAULT_PASSWORD, DEFAULT_USER, ApiClient
from stack import ROOT, DevServer, running_stack

ARTIFACTS = ROOT / "test-artifacts" / "ui"
CHROMIUM = os.environ.get("BARRIERFLOW_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("BARRIERFLOW_CHROMEDRIVER", "/usr/bin/chromedriver")
EXTERNAL_URL = os.environ.get("BARRIERFLOW_UI_TEST_URL")


def _browser_missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return f"{path} is not installed (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed"
    return None


@pytest.fixture(scope="module")
def artifacts(stack_store: str) -> Path:
    """``test-artifacts/ui/<store>/``: each storage scheme's run keeps its own screenshots and log."""
    path = ARTIFACTS / stack_store
    path.mkdir(parents=True, exist_ok=True)
    return path


# Module scope: the server (which schedules an epoch every minute) stops as soon
# as the browser test is done instead of loading the machine for the rest of the run.
@pytest.fixture(scope="module")
def devserver(artifacts: Path, stack_store: str, stack_warehouse: str | None) -> Iterator[DevServer]:
    reason = _browser_missing()
    if reason:
        # Never a silent skip: `make setup` installs the browser, so its absence is a broken setup.
        pytest.fail(f"{reason} (run `make setup`, which installs Debian's chromium and chromium-driver)")
    if EXTERNAL_URL:
        warehouse = os.environ.get("BARRIERFLOW_UI_TEST_WAREHOUSE", str(ROOT / "warehouse"))
        yield DevServer(
            EXTERNAL_URL.rstrip("/"),
            DEFAULT_USER,
            DEFAULT_PASSWORD,
            warehouse,
            Path(),
            Path(),
            Path(),
            ApiClient(EXTERNAL_URL, DEFAULT_USER, DEFAULT_PASSWORD),
        )
        return

    # No generator (--interval 0): the test lands its input itself (write_input), so the work it
    # asks for (epochs to commit, intervals to replay) does not grow when a loaded machine is slow.
    # late_files=refuse by default here: a file the test lands behind the position blocks the pipeline,
    # so the page's blocked state is seen in the browser.
    # The test reloads the pages it watches itself: Airflow's UI polling every 3 s (its default) while runs
    # are pending cost chromium and the API server ~22 CPU-s per run of the test (measured), on two busy cores.
    env = {"BARRIERFLOW_SENSOR_STATS__LATE_FILES": "refuse", "AIRFLOW__API__AUTO_REFRESH_INTERVAL": "30"}
    # The engine's warm-up (make run's default) runs throwaway epochs on a local scratch warehouse
    # whatever the pipeline's store: the local variant runs it, the S3 one starts cold.
    args = ["--interval", "0", *(["--warm-up-epochs", "0"] if stack_store == "s3" else [])]
    with running_stack(artifacts / "devserver.log", args, env=env, warehouse=stack_warehouse) as server:
        yield server


@pytest.fixture(scope="module")
def write_input(devserver: DevServer) -> Callable[[int], None]:
    """Lands ``n`` more sensor_stats files now, numbered after those already there, as
    ``make run``'s generator does; nothing against an external server, whose generator runs."""
    from barrierflow.tools.devserver import InputGenerator

    def write(n: int) -> None:
        if EXTERNAL_URL:
            return
        generator = InputGenerator(devserver.landing, interval_s=0)
        for _ in range(n):
            generator.write_one()

    return write


@pytest.fixture(scope="module")
def browser(devserver: DevServer) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="barrierflow-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--window-size=1440,1000",
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
