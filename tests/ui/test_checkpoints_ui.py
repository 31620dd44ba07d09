"""End to end in a browser: log in, watch sensor_stats commit epochs, take a savepoint through the
trigger form, find it (and the epoch chart) on the checkpoints page, reprocess from it through the
reprocess DAG's form (restore, then replay every interval since, the schedule held), and query the
state from a shell.

One test function on purpose: the steps build on each other and share one
server, and a single test keeps pytest-xdist from starting a second server.
Each step saves a screenshot in ``test-artifacts/ui/<store>/``. It runs on a local
warehouse, ``make run``'s; the compose topology's test reads the same page's data from an
API server whose warehouse is on S3.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, TypeVar
from urllib.parse import quote

import pytest

from barrierflow.airflow.ui.history import pipeline_history
from barrierflow.storage import objects
from barrierflow.storage.layout import PipelineLayout

pytestmark = [pytest.mark.browser, pytest.mark.stack_store("local"), pytest.mark.timeout(1200)]

PIPELINE = "sensor_stats"
DAG_ID = "barrierflow_sensor_stats"
SAVEPOINT_DAG_ID = "barrierflow_sensor_stats_savepoint"
REPROCESS_DAG_ID = "barrierflow_sensor_stats_reprocess"
T = TypeVar("T")


class Step:
    """Screenshots named after the step, and a log of how long each step took."""

    def __init__(self, driver: Any, artifacts: Path) -> None:
        self.driver = driver
        self.artifacts = artifacts
        self.n = 0
        self.started = time.monotonic()
        for old in artifacts.glob("*.png"):
            old.unlink()

    def shot(self, name: str) -> Path:
        self.n += 1
        path = self.artifacts / f"{self.n:02d}-{name}.png"
        self.driver.save_screenshot(str(path))
        print(f"[{time.monotonic() - self.started:6.1f} s] {path.name}")
        return path


def wait_for(
    driver: Any,
    condition: Callable[[], T | None | bool],
    timeout_s: float,
    what: str,
    *,
    refresh_every_s: float | None = None,
    poll_s: float = 1.0,
) -> T:
    """Poll ``condition`` (exceptions count as "not yet") until it is truthy; reload the page now and then."""
    deadline = time.monotonic() + timeout_s
    last_refresh = time.monotonic()
    last_error: BaseException | None = None
    while True:
        try:
            value = condition()
            if value:
                return value  # type: ignore[return-value]
        except Exception as exc:  # noqa: BLE001 - stale elements, not-yet-rendered pages
            last_error = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what} (last error: {last_error!r})")
        if refresh_every_s is not None and time.monotonic() - last_refresh > refresh_every_s:
            driver.refresh()
            last_refresh = time.monotonic()
        time.sleep(poll_s)


def _completed_epochs(warehouse: str) -> list[int]:
    if objects.read_json(PipelineLayout.of(warehouse, PIPELINE).pipeline_meta) is None:
        return []
    history = pipeline_history(str(warehouse), PIPELINE, state_size=False)
    return [e.epoch for e in history.epochs if e.completed]


def test_checkpoints_page_end_to_end(devserver: Any, browser: Any, artifacts: Path, write_input: Callable[[int], None]) -> None:
    from selenium.webdriver.common.by import By

    d, url = browser, devserver.url
    step = Step(d, artifacts)

    def css(selector: str) -> list[Any]:
        return d.find_elements(By.CSS_SELECTOR, selector)

    # 1. Input lands (the next one-minute run commits it); log in with the fixed dev login.
    write_input(2)
    d.get(f"{url}/")
    wait_for(d, lambda: css("input[name=username]"), 120, "the login form")
    step.shot("login")
    css("input[name=username]")[0].send_keys(devserver.user)
    css("input[name=password]")[0].send_keys(devserver.password)
    css("button[type=submit]")[0].click()
    wait_for(d, lambda: "/auth/login" not in d.current_url and css("button[aria-label=Browse]"), 120, "the home page")
    step.shot("home")

    # 2. The pipeline's DAG is listed (the DAG processor may still be parsing).
    d.get(f"{url}/dags?search={quote(DAG_ID)}")
    wait_for(d, lambda: css(f"a[href$='/dags/{DAG_ID}']"), 300, f"{DAG_ID} in the DAG list", refresh_every_s=10)
    step.shot("dags")

    # 3. Epochs commit: scheduled runs succeed in the UI and the checkpoint log records COMPLETED epochs.
    d.get(f"{url}/dags/{DAG_ID}/runs")

    def committed() -> bool:
        states = [e.text.strip().lower() for e in css("[data-testid=table-cell-state]")]
        return "success" in states and len(_completed_epochs(devserver.warehouse)) >= 1

    wait_for(d, committed, 480, "a successful epoch run and a COMPLETED epoch", refresh_every_s=15, poll_s=3)
    step.shot("epoch-runs")
    epochs_before = _completed_epochs(devserver.warehouse)

    # 3b. The run that planned an epoch shows it on its own page: the "Checkpoint" tab of the DAG run.
    first = next(e for e in pipeline_history(devserver.warehouse, PIPELINE, state_size=False).epochs if e.completed)
    planned_dag, _, planned_run = first.planned_by.partition(":")
    assert planned_dag == DAG_ID, first.planned_by
    d.get(f"{url}/dags/{DAG_ID}/runs/{quote(planned_run, safe='')}")
    tab = wait_for(
        d,
        lambda: [e for e in d.find_elements(By.XPATH, "//*[normalize-space(text())='Checkpoint']") if e.is_displayed()],
        60,
        "the run page's Checkpoint tab",
    )
    tab[0].click()
    frame = wait_for(
        d, lambda: [f for f in css("iframe") if "/barrierflow/run" in (f.get_attribute("src") or "")], 60, "the tab's frame"
    )
    d.switch_to.frame(frame[0])
    try:
        wait_for(
            d,
            lambda: css(f"a.bf-run-epoch[data-epoch='{first.epoch}'][data-status=COMPLETED]"),
            60,
            f"epoch {first.epoch} on its run's tab",
        )
    finally:
        d.switch_to.default_content()
    step.shot("run-checkpoint-tab")

    # 4. A savepoint through the DAG's trigger form (the savepoint_name field of the params form).
    name = f"ui-{time.strftime('%Y%m%d-%H%M%S')}"
    d.get(f"{url}/dags/{SAVEPOINT_DAG_ID}")
    trigger = wait_for(d, lambda: css("[data-testid=trigger-dag-button]"), 120, "the Trigger button")
    trigger[0].click()
    field = wait_for(d, lambda: [e for e in css("#element_savepoint_name") if e.is_displayed()], 60, "the savepoint_name field")
    field[0].send_keys(name)
    description = css("#element_description")
    if description:
        description[0].send_keys("taken by the browser test")
    step.shot("savepoint-trigger-form")
    wait_for(d, lambda: [e for e in css("[data-testid=trigger-dag-submit]") if e.is_enabled()], 30, "the submit button")[
        0
    ].click()

    # The run this form created, found through the REST API by its conf.
    def our_run() -> str | None:
        status, doc = devserver.api.get(f"/api/v2/dags/{SAVEPOINT_DAG_ID}/dagRuns?limit=50&order_by=-run_after")
        for run in (doc or {}).get("dag_runs", []) if status == 200 else []:
            if (run.get("conf") or {}).get("savepoint_name") == name:
                return str(run["dag_run_id"])
        return None

    run_id = wait_for(d, our_run, 60, f"the savepoint run for {name!r}")
    step.shot("savepoint-triggered")

    # 5. Watch that run succeed on the runs page.
    d.get(f"{url}/dags/{SAVEPOINT_DAG_ID}/runs")

    def run_state() -> str | None:
        for row in css("table tbody tr"):
            ids = row.find_elements(By.CSS_SELECTOR, "[data-testid=table-cell-dag_run_id]")
            if ids and ids[0].text.strip() == run_id:
                state = row.find_elements(By.CSS_SELECTOR, "[data-testid=table-cell-state]")[0].text.strip().lower()
                if state == "failed":
                    raise AssertionError(f"savepoint run {run_id} failed; see {devserver.log}")
                return state if state == "success" else None
        return None

    try:
        wait_for(d, run_state, 420, f"savepoint run {run_id} to succeed", refresh_every_s=10, poll_s=2)
    except AssertionError:
        step.shot("savepoint-run-FAILED")
        raise
    step.shot("savepoint-run-success")

    # 6. The checkpoints page in Airflow's navigation (Browse > Checkpoints), shown in the UI's frame.
    d.get(f"{url}/")
    wait_for(d, lambda: css("button[aria-label=Browse]"), 60, "the navigation")[0].click()
    item = wait_for(
        d,
        lambda: [e for e in d.find_elements(By.XPATH, "//*[normalize-space(text())='Checkpoints']") if e.is_displayed()],
        30,
        "the Checkpoints menu item",
    )
    step.shot("browse-menu")
    item[0].click()
    wait_for(d, lambda: "/plugin/barrierflow-checkpoints" in d.current_url, 30, "the plugin route")
    frame = wait_for(
        d, lambda: [f for f in css("iframe") if "/barrierflow/" in (f.get_attribute("src") or "")], 60, "the page frame"
    )
    d.switch_to.frame(frame[0])
    try:
        wait_for(d, lambda: css(f"tr.bf-savepoint[data-name='{name}']"), 60, "the savepoint inside the frame")
    finally:
        d.switch_to.default_content()
    step.shot("checkpoints-in-airflow")

    # 7. The page itself: the new savepoint, the epochs, and the SVG chart.
    d.get(f"{url}/barrierflow/")
    section = wait_for(d, lambda: css(f"section#pipeline-{PIPELINE}"), 60, "the sensor_stats section")[0]
    savepoint_row = section.find_elements(By.CSS_SELECTOR, f"tr.bf-savepoint[data-name='{name}']")
    assert savepoint_row, f"savepoint {name!r} not on the checkpoints page"
    assert "taken by the browser test" in savepoint_row[0].text
    chart = section.find_elements(By.CSS_SELECTOR, f"svg#epoch-chart-{PIPELINE}")
    assert chart, "no epoch chart"
    bars = chart[0].find_elements(By.CSS_SELECTOR, "rect.bf-bar")
    assert len(bars) >= len(epochs_before) >= 1
    completed_rows = section.find_elements(By.CSS_SELECTOR, "tr.bf-epoch[data-status=COMPLETED]")
    assert {int(r.get_attribute("data-epoch")) for r in completed_rows} >= set(epochs_before)
    assert section.find_elements(By.CSS_SELECTOR, "tr.bf-lineage")
    d.execute_script("document.getElementById(arguments[0]).scrollIntoView()", f"epoch-chart-{PIPELINE}")
    step.shot("checkpoints-chart")
    d.set_window_size(1440, 2400)
    d.get(f"{url}/barrierflow/")
    wait_for(d, lambda: css(f"svg#epoch-chart-{PIPELINE}"), 60, "the chart")
    step.shot("checkpoints-page")
    d.set_window_size(1440, 1000)

    # The JSON endpoint answers the signed-in browser with the same data.
    d.get(f"{url}/barrierflow/api/pipelines/{PIPELINE}")
    body = d.find_element(By.TAG_NAME, "body").text
    assert f'"name":"{name}"' in body.replace(" ", "") and '"status":"COMPLETED"' in body.replace(" ", "")

    # 8. Reprocess from the savepoint through the reprocess DAG's trigger form (as the README's
    #    first session does): restore with the sinks rewound, then replay each interval since.
    #    First input lands after the savepoint and the schedule commits it: there is something to replay.
    from barrierflow.operations.savepoint import load_savepoint

    saved_at = load_savepoint(PIPELINE, devserver.warehouse, name).epoch
    write_input(1)
    wait_for(d, lambda: max(_completed_epochs(devserver.warehouse)) > saved_at, 300, "an epoch after the savepoint", poll_s=3)
    d.get(f"{url}/dags/{REPROCESS_DAG_ID}")
    wait_for(d, lambda: css("[data-testid=trigger-dag-button]"), 120, "the reprocess Trigger button")[0].click()
    field = wait_for(d, lambda: [e for e in css("#element_savepoint") if e.is_displayed()], 60, "the savepoint field")
    field[0].send_keys(name)
    step.shot("reprocess-trigger-form")
    wait_for(d, lambda: [e for e in css("[data-testid=trigger-dag-submit]") if e.is_enabled()], 30, "the submit button")[
        0
    ].click()

    def reprocess_run() -> dict[str, Any] | None:
        status, doc = devserver.api.get(f"/api/v2/dags/{REPROCESS_DAG_ID}/dagRuns?limit=50&order_by=-run_after")
        for run in (doc or {}).get("dag_runs", []) if status == 200 else []:
            if (run.get("conf") or {}).get("savepoint") == name:
                if run["state"] == "failed":
                    raise AssertionError(f"reprocess run {run['dag_run_id']} failed; see {devserver.log}")
                return run if run["state"] == "success" else None
        return None

    run = wait_for(d, reprocess_run, 480, f"the reprocessing from {name!r} to succeed", poll_s=3)
    d.get(f"{url}/dags/{REPROCESS_DAG_ID}/runs")
    wait_for(
        d,
        lambda: "success" in [e.text.strip().lower() for e in css("[data-testid=table-cell-state]")],
        60,
        "the reprocess run in the UI",
        refresh_every_s=10,
    )
    step.shot("reprocess-run-success")
    status, result = devserver.api.get(
        f"/api/v2/dags/{REPROCESS_DAG_ID}/dagRuns/{quote(run['dag_run_id'])}/taskInstances/reprocess/xcomEntries/return_value"
    )
    assert status == 200, result
    replayed = json.loads(result["value"]) if isinstance(result.get("value"), str) else result["value"]
    history = pipeline_history(devserver.warehouse, PIPELINE, state_size=False)
    assert len(history.lineages) >= 2, "a restore starts a new lineage"
    new_lineage = history.lineages[-1].lineage_id
    assert replayed["restored"]["lineage_id"] == new_lineage
    # Every interval since the savepoint was replayed as its own epoch, in order, each with its interval's cut-off.
    cutoffs = [e["arrival_cutoff_ms"] for e in replayed["replayed"]]
    assert cutoffs and cutoffs == sorted(cutoffs) and len(set(cutoffs)) == len(cutoffs), replayed
    assert all(c % 60_000 == 0 for c in cutoffs), cutoffs  # one-minute interval ends

    # The page shows the restore as what it is (a restore point, the old lineage's undone epochs
    # rewound), Flink-like summary counts, the backlog and input lag; at 1400 px nothing overflows.
    d.set_window_size(1400, 2400)
    d.get(f"{url}/barrierflow/")
    section = wait_for(d, lambda: css(f"section#pipeline-{PIPELINE}"), 60, "the sensor_stats section")[0]
    assert section.find_elements(By.CSS_SELECTOR, f"tr.bf-epoch[data-lineage='{new_lineage}'] .status-RESTORED")
    assert section.find_elements(By.CSS_SELECTOR, "tr.bf-rewound"), "the epochs the restore undid are not marked rewound"
    summary = {
        cell.find_element(By.TAG_NAME, "dt").text: cell.find_element(By.TAG_NAME, "dd").text
        for cell in section.find_elements(By.CSS_SELECTOR, "dl.bf-summary > div")
    }
    assert int(summary["Restores"]) >= 1 and summary["State"] == "running", summary
    assert summary["Backlog"] and summary["Input lag"], summary  # measured now
    assert section.find_elements(By.CSS_SELECTOR, "table.bf-stats"), "no min/avg/max over recent epochs"
    assert d.execute_script("return document.documentElement.scrollWidth <= window.innerWidth"), "the page overflows 1400 px"
    step.shot("checkpoints-after-restore")
    d.set_window_size(1440, 1000)

    # A file lands behind the stream position: with late_files=refuse (this stack's default) the next
    # scheduled run fails at once, and the page says the pipeline is blocked and why.
    if not os.environ.get("BARRIERFLOW_UI_TEST_URL"):  # a server of the test's own: its landing directory is here
        first = min(devserver.landing.glob("*.jsonl"))
        (devserver.landing / ".0-late.tmp").write_bytes(first.read_bytes())
        (devserver.landing / ".0-late.tmp").rename(devserver.landing / "0-late.jsonl")  # sorts before every file read

        def blocked() -> list[Any]:
            d.get(f"{url}/barrierflow/")
            return [p for p in css(f"section#pipeline-{PIPELINE} p.blocked") if "0-late.jsonl" in p.text]

        wait_for(d, blocked, 240, "the page to show the pipeline blocked by 0-late.jsonl", poll_s=5)
        cells = [c.text.split("\n") for c in css(f"section#pipeline-{PIPELINE} dl.bf-summary > div")]
        assert ["State", "blocked"] in cells, cells
        step.shot("checkpoints-blocked")

    # 9. Query the restored state from a shell, as the README shows.
    import subprocess
    import sys

    query = subprocess.run(
        [
            sys.executable,
            "-m",
            "barrierflow",
            "query",
            PIPELINE,
            "--warehouse",
            devserver.warehouse,
            "--format",
            "json",
            "SELECT sensor_id, count FROM sensor_totals ORDER BY sensor_id",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert query.returncode == 0, query.stderr
    assert json.loads(query.stdout) and all(r["count"] > 0 for r in json.loads(query.stdout))

    # Without the session cookie the page is not served: the browser is sent to the login page.
    d.delete_all_cookies()
    d.get(f"{url}/barrierflow/")
    wait_for(d, lambda: "/auth/login" in d.current_url, 30, "the redirect to the login page")
    step.shot("checkpoints-logged-out")
