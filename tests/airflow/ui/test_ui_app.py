"""The checkpoints FastAPI app and the plugin's parts, with a stand-in for Airflow's auth."""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
from fastapi import FastAPI, Request

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from barrierflow.airflow.ui.app import NotAuthenticated, create_app
from barrierflow.airflow.ui.plugin import (
    RUN_VIEW_ROUTE,
    URL_PREFIX,
    VIEW_ROUTE,
    external_view_spec,
    fastapi_app_spec,
    run_view_spec,
)
from ui_warehouse import build_demo_warehouse


@dataclass(frozen=True)
class Viewer:
    name: str
    readable: frozenset[str]

    def can_read(self, pipeline: str) -> bool:
        return pipeline in self.readable


async def _auth(request: Request) -> Viewer:
    """Token 'ok' reads everything, 'demo-only' reads demo, none -> 401 with a login page, 'bad' -> 403."""
    token = request.cookies.get("_token") or request.headers.get("Authorization", "").removeprefix("Bearer ")
    if not token:
        raise NotAuthenticated(401, "Not authenticated", login_url="/auth/login?next=" + request.url.path)
    if token == "bad":
        raise NotAuthenticated(403, "Invalid JWT token")
    return Viewer("ada", frozenset({"demo", "other"} if token == "ok" else {"demo"}))


def _lister(pipeline: str, warehouse: str) -> list[dict[str, Any]]:
    return [
        {
            "name": f"{pipeline}-sp",
            "pipeline": pipeline,
            "epoch": 1,
            "lineage_id": "L1",
            "created_at": "2024-01-01T00:00:00Z",
            "description": "",
            "uri": "/x",
            "size_bytes": 1,
            "stopped": False,
        }
    ]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("wh")
    build_demo_warehouse(root, "demo")
    build_demo_warehouse(root, "other")
    # Mounted under the plugin's prefix, as Airflow's API server does (app.mount).
    parent = FastAPI()
    parent.mount(URL_PREFIX, create_app(warehouse=str(root), authenticator=_auth, savepoint_lister=_lister))
    with TestClient(parent, base_url=f"http://testserver{URL_PREFIX}") as c:
        yield c


def test_page_needs_a_login_and_redirects_browsers_to_it(client: TestClient) -> None:
    r = client.get("/", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/auth/login")
    r = client.get("/", cookies={"_token": "bad"}, follow_redirects=False)
    assert r.status_code == 403


def test_api_answers_401_and_403_without_redirects(client: TestClient) -> None:
    assert client.get("/api/pipelines", follow_redirects=False).status_code == 401
    assert client.get("/api/pipelines/demo", follow_redirects=False).status_code == 401
    r = client.get("/api/pipelines", headers={"Authorization": "Bearer bad"})
    assert r.status_code == 403 and r.json() == {"detail": "Invalid JWT token"}


def test_page_renders_every_readable_pipeline(client: TestClient) -> None:
    r = client.get("/", cookies={"_token": "ok"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["cache-control"] == "no-store"
    assert 'id="pipeline-demo"' in r.text and 'id="pipeline-other"' in r.text
    assert 'id="epoch-chart-demo"' in r.text and "demo-sp" in r.text and "signed in as <strong>ada" in r.text
    only = client.get("/", params={"pipeline": "other", "limit": 1}, cookies={"_token": "ok"})
    assert 'id="pipeline-demo"' not in only.text and only.text.count('class="bf-epoch"') == 1


def test_pipelines_a_user_may_not_read_are_hidden(client: TestClient) -> None:
    r = client.get("/", cookies={"_token": "demo-only"})
    assert 'id="pipeline-demo"' in r.text and 'id="pipeline-other"' not in r.text
    doc = client.get("/api/pipelines", cookies={"_token": "demo-only"}).json()
    assert [p["pipeline"] for p in doc["pipelines"]] == ["demo"]
    assert client.get("/api/pipelines/other", cookies={"_token": "demo-only"}).status_code == 403


def test_json_endpoints_carry_the_page_data(client: TestClient) -> None:
    doc = client.get("/api/pipelines", headers={"Authorization": "Bearer ok"}).json()
    assert doc["warehouse"] and "live bytes" in doc["state_size_method"]
    demo = next(p for p in doc["pipelines"] if p["pipeline"] == "demo")
    assert [(e["lineage_id"], e["epoch"], e["status"]) for e in demo["epochs"]][-1] == ("L2", 3, "COMPLETED")
    assert demo["savepoints"][0]["name"] == "demo-sp" and len(demo["lineages"]) == 2
    one = client.get("/api/pipelines/demo", params={"state_size": "false"}, headers={"Authorization": "Bearer ok"})
    assert one.status_code == 200 and all(e["state_bytes"] is None for e in one.json()["epochs"])
    missing = client.get("/api/pipelines/nope", headers={"Authorization": "Bearer ok"})
    assert missing.status_code == 404
    assert client.get("/", params={"limit": 0}, cookies={"_token": "ok"}).status_code == 422


def test_a_runs_tab_shows_the_epochs_that_run_planned_and_links_them_to_the_checkpoints_page(
    client: TestClient, tmp_path: Path
) -> None:
    r = client.get("/run", params={"dag_id": "barrierflow_demo", "run_id": "scheduled__L1-2"}, cookies={"_token": "ok"})
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    assert 'class="bf-run-epoch" data-epoch="2" data-status="COMPLETED"' in r.text
    # The link back goes to the epoch's row on the checkpoints page, whose id the page gives it.
    assert 'href="./?pipeline=demo#epoch-demo-L1-2"' in r.text
    assert 'id="epoch-demo-L1-2"' in client.get("/", params={"pipeline": "demo"}, cookies={"_token": "ok"}).text
    assert "demo · epoch run" in r.text and r.text.count('<div class="bf-epoch') == 1

    doc = client.get("/api/run", params={"dag_id": "barrierflow_demo", "run_id": "scheduled__L2-3"},
                     headers={"Authorization": "Bearer ok"}).json()  # fmt: skip
    assert (doc["pipeline"], doc["role"], doc["current_lineage_id"]) == ("demo", "pipeline", "L2")
    assert [(e["lineage_id"], e["epoch"], e["status"]) for e in doc["epochs"]] == [("L2", 3, "COMPLETED")]

    # A run that planned nothing, another barrierflow DAG, and a DAG that is not barrierflow's.
    idle = client.get("/run", params={"dag_id": "barrierflow_demo", "run_id": "manual__x"}, cookies={"_token": "ok"})
    assert "This run planned no epoch (no new input" in idle.text
    saving = client.get("/run", params={"dag_id": "barrierflow_demo_savepoint", "run_id": "m"}, cookies={"_token": "ok"})
    assert "demo · savepoint run" in saving.text and "savepoints copy the last completed epoch" in saving.text
    other = client.get("/run", params={"dag_id": "etl_daily", "run_id": "m"}, cookies={"_token": "ok"})
    assert other.status_code == 200 and "is not a run of a barrierflow" in other.text and "<tr" not in other.text
    # Values are escaped, and the runs of a pipeline the user may not read are refused.
    odd = client.get("/run", params={"dag_id": "<b>x</b>", "run_id": "<i>"}, cookies={"_token": "ok"})
    assert "<b>x</b>" not in odd.text and "&lt;b&gt;x&lt;/b&gt;" in odd.text
    assert (
        client.get("/run", params={"dag_id": "barrierflow_other", "run_id": "m"}, cookies={"_token": "demo-only"}).status_code
        == 403
    )
    assert client.get("/api/run", params={"dag_id": "barrierflow_demo", "run_id": "m"}).status_code == 401
    assert client.get("/run", params={"dag_id": "barrierflow_demo"}, cookies={"_token": "ok"}).status_code == 422


def test_a_runs_tab_shows_failed_attempts_of_its_epochs_and_the_blocked_state(tmp_path: Path) -> None:
    from barrierflow.checkpointing.checkpoint import CheckpointRecord, EpochStatus
    from barrierflow.checkpointing.checkpoint_log import CheckpointLog
    from barrierflow.storage import objects

    facts = build_demo_warehouse(tmp_path, "demo")
    layout = facts["layout"]
    by = "barrierflow_demo:scheduled__L2-4"
    log = CheckpointLog(layout)
    for status, at, message in (
        (EpochStatus.PLANNED, 1, ""),
        (EpochStatus.ABORTED, 2, "process failed: BlockedInputError: a.jsonl is gone"),
    ):
        log.append(CheckpointRecord(pipeline="demo", lineage_id="L2", epoch=4, status=status, attempt_id="a4",
                                    recorded_at_us=1_900_000_000_000_000 + at, planned_by=by, message=message))  # fmt: skip
    objects.write_json_if_absent(layout.blocked, {"step": "process", "lineage_id": "L2", "epoch": 4,
                                                  "message": "a.jsonl is gone", "since": "2030-01-01T00:00:00Z"})  # fmt: skip
    with TestClient(create_app(warehouse=str(tmp_path), authenticator=_auth, savepoint_lister=_lister)) as c:
        page = c.get("/run", params={"dag_id": "barrierflow_demo", "run_id": "scheduled__L2-4"}, cookies={"_token": "ok"}).text
    assert 'data-epoch="4" data-status="ABORTED"' in page  # its newest status: the failed attempt
    assert "The pipeline is blocked</b> at epoch 4 (process)" in page and "a.jsonl is gone" in page
    assert "Attempt of epoch 4 failed" in page and "BlockedInputError" in page


def test_the_warehouse_comes_from_the_environment_at_request_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_app(authenticator=_auth, savepoint_lister=_lister)
    with TestClient(app) as c:
        monkeypatch.setenv("BARRIERFLOW_WAREHOUSE", str(tmp_path))
        assert "No pipeline in this warehouse yet" in c.get("/", cookies={"_token": "ok"}).text
        build_demo_warehouse(tmp_path, "other")
        assert 'id="pipeline-other"' in c.get("/", cookies={"_token": "ok"}).text


def test_plugin_parts() -> None:
    spec = fastapi_app_spec()
    assert spec["url_prefix"] == URL_PREFIX == "/barrierflow" and spec["name"]
    assert not any(URL_PREFIX.startswith(p) for p in ("/api/v2", "/ui", "/execution", "/auth", "/pluginsv2"))
    view = external_view_spec()
    assert view["href"] == "barrierflow/" and not view["href"].startswith("/")
    assert view["url_route"] == VIEW_ROUTE and view["destination"] == "nav" and view["category"] == "browse"
    assert view["icon"].startswith("data:image/svg+xml")
    tab = run_view_spec()
    assert tab["destination"] == "dag_run" and tab["url_route"] == RUN_VIEW_ROUTE
    # The UI fills {DAG_ID} and {RUN_ID} (URL-encoded) and resolves the relative href against its base URL.
    assert tab["href"] == "barrierflow/run?dag_id={DAG_ID}&run_id={RUN_ID}"
    plugin_file = Path(__file__).resolve().parents[3] / "plugins" / "barrierflow_plugin.py"
    assert len(plugin_file.read_text().splitlines()) <= 15  # the plugin file stays thin


def test_loading_the_ui_package_does_not_import_airflow_or_fastapi_for_history() -> None:
    import subprocess

    code = (
        "import sys, barrierflow.airflow.ui.history, barrierflow.airflow.ui.render, barrierflow.airflow.ui;"
        "print('fastapi' in sys.modules, 'airflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_airflow_get_user_signature_is_what_the_app_calls(tmp_path: Path) -> None:
    """barrierflow.airflow.ui.app calls Airflow's get_user(request=, _oauth_token=, bearer_credentials=)."""
    pytest.importorskip("airflow")
    import os
    import subprocess

    # In a subprocess: importing airflow configures it (AIRFLOW_HOME) as a side effect.
    code = (
        "import inspect; from airflow.api_fastapi.core_api.security import get_user;"
        "print('PARAMS', ' '.join(sorted(inspect.signature(get_user).parameters)),"
        " inspect.iscoroutinefunction(get_user))"
    )
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("PARAMS "))
    assert line.split()[1:] == ["_oauth_token", "bearer_credentials", "request", "True"]
