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

from barrierflow.ui.app import NotAuthenticated, create_app
from barrierflow.ui.plugin import URL_PREFIX, VIEW_ROUTE, external_view_spec, fastapi_app_spec
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
    return [{"name": f"{pipeline}-sp", "pipeline": pipeline, "epoch": 1, "lineage_id": "L1",
             "created_at": "2024-01-01T00:00:00Z", "description": "", "uri": "/x", "size_bytes": 1, "stopped": False}]


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
    plugin_file = Path(__file__).resolve().parents[2] / "plugins" / "barrierflow_plugin.py"
    assert len(plugin_file.read_text().splitlines()) <= 15  # the plugin file stays thin


def test_loading_the_ui_package_does_not_import_airflow_or_fastapi_for_history() -> None:
    import subprocess

    code = (
        "import sys, barrierflow.ui.history, barrierflow.ui.render, barrierflow.ui;"
        "print('fastapi' in sys.modules, 'airflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_airflow_get_user_signature_is_what_the_app_calls(tmp_path: Path) -> None:
    """barrierflow.ui.app calls Airflow's get_user(request=, _oauth_token=, bearer_credentials=)."""
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
