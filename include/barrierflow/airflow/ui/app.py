"""The checkpoints page as a FastAPI app, mounted into Airflow's API server by the plugin.

Routes (relative to the mount point, ``/barrierflow`` in Airflow):

* ``GET /``                      the HTML page (``?pipeline=NAME`` repeatable, ``?limit=N`` epoch rows);
* ``GET /api/pipelines``         the same data as JSON, every readable pipeline;
* ``GET /api/pipelines/{name}``  one pipeline as JSON;
* ``GET /run?dag_id=D&run_id=R``  the epochs one Airflow DAG run planned (the run page's
  "Checkpoint" tab); ``GET /api/run?...`` the same as JSON.

**Authentication.** Airflow mounts a plugin's FastAPI app with ``app.mount``;
the core API's authentication dependency does not reach mounted apps and no
middleware authenticates them, so this app checks itself: the caller must
present Airflow's own credentials (the ``_token`` session cookie the UI sets at
login, or an ``Authorization: Bearer`` JWT), resolved by Airflow's
``get_user``. A pipeline is shown only to users who may read its DAG's runs
(``is_authorized_dag(GET, RUN, barrierflow_<pipeline>)``). A browser without a
session is redirected to Airflow's login page; API calls get 401/403.
Airflow modules are imported only when a request is authenticated, so merely
loading the plugin (scheduler, DAG processor, workers) stays cheap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from barrierflow.airflow.ui.history import (
    STATE_SIZE_METHOD,
    PipelineHistory,
    dag_id_for,
    discover_pipelines,
    pipeline_history,
    resolve_warehouse,
)
from barrierflow.airflow.ui.render import DEFAULT_EPOCH_ROWS, render_page, render_run
from barrierflow.airflow.ui.run_view import RunView, find_pipeline, run_view

__all__ = [
    "Viewer",
    "NotAuthenticated",
    "Authenticator",
    "AirflowViewer",
    "airflow_authenticator",
    "create_app",
]


class Viewer(Protocol):
    """Who is looking, and which pipelines they may see."""

    @property
    def name(self) -> str: ...

    def can_read(self, pipeline: str) -> bool: ...


class NotAuthenticated(Exception):
    """No valid Airflow credentials (401) or not allowed (403)."""

    def __init__(self, status_code: int, detail: str, login_url: str | None = None) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail
        self.login_url = login_url


Authenticator = Callable[[Request], Awaitable[Viewer]]


@dataclass(frozen=True)
class AirflowViewer:
    """An Airflow user, authorised through Airflow's auth manager."""

    user: Any  # airflow BaseUser
    auth_manager: Any  # airflow BaseAuthManager

    @property
    def name(self) -> str:
        try:
            return str(self.user.get_name())
        except Exception:  # noqa: BLE001
            return "?"

    def can_read(self, pipeline: str) -> bool:
        from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

        return bool(
            self.auth_manager.is_authorized_dag(
                method="GET",
                access_entity=DagAccessEntity.RUN,
                details=DagDetails(id=dag_id_for(pipeline)),
                user=self.user,
            )
        )


def _login_url(request: Request) -> str | None:
    try:
        from airflow.api_fastapi.app import get_auth_manager

        next_url = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return str(get_auth_manager().get_url_login(next_url=next_url))
    except Exception:  # noqa: BLE001 - no login page known: plain 401
        return None


async def airflow_authenticator(request: Request) -> Viewer:
    """Resolve the caller with Airflow's own ``get_user`` (cookie or bearer JWT)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.security import HTTPBearer

    bearer = await HTTPBearer(auto_error=False)(request)
    try:
        user = await get_user(request=request, _oauth_token=None, bearer_credentials=bearer)
    except HTTPException as exc:
        raise NotAuthenticated(exc.status_code, str(exc.detail), _login_url(request)) from exc
    return AirflowViewer(user=user, auth_manager=get_auth_manager())


def _readable(viewer: Viewer, names: list[str]) -> list[str]:
    return [n for n in names if viewer.can_read(n)]


def create_app(
    *,
    warehouse: str | None = None,
    authenticator: Authenticator | None = None,
    savepoint_lister: Callable[[str, str], Any] | None = None,
) -> FastAPI:
    """The checkpoints app.

    ``warehouse`` defaults to ``$BARRIERFLOW_WAREHOUSE`` (else ``./warehouse``),
    read at each request. ``authenticator`` defaults to Airflow's
    (:func:`airflow_authenticator`); tests pass their own.
    """
    authenticator_: Authenticator = authenticator or airflow_authenticator

    async def authenticate(request: Request) -> Viewer:
        return await authenticator_(request)

    app = FastAPI(
        title="barrierflow checkpoints",
        description="Epoch history, lineages and savepoints of barrierflow pipelines.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    @app.exception_handler(NotAuthenticated)
    async def _not_authenticated(request: Request, exc: NotAuthenticated) -> Response:
        wants_html = "/api/" not in request.url.path
        if exc.status_code == 401 and wants_html and exc.login_url:
            return RedirectResponse(exc.login_url, status_code=303)
        if wants_html:
            return HTMLResponse(
                f"<!doctype html><title>barrierflow</title><p>{exc.status_code}: {exc.detail}</p>",
                status_code=exc.status_code,
            )
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    def _histories(names: list[str], state_size: bool) -> tuple[str, list[PipelineHistory]]:
        root = resolve_warehouse(warehouse)
        return root, [pipeline_history(root, n, state_size=state_size, savepoint_lister=savepoint_lister) for n in names]

    @app.get("/", response_class=HTMLResponse)
    async def page(
        request: Request,
        viewer: Viewer = Depends(authenticate),
        pipeline: list[str] | None = Query(default=None, description="only these pipelines"),
        limit: int = Query(default=DEFAULT_EPOCH_ROWS, ge=1, le=100_000, description="epoch rows per pipeline"),
        state_size: bool = Query(default=True, description="compute the live state size per epoch"),
        refresh: int | None = Query(default=None, ge=5, le=3600, description="reload the page every N seconds"),
    ) -> Response:
        if not request.url.path.endswith("/"):
            # Relative links (api/pipelines) need the trailing slash.
            return RedirectResponse(str(request.url.replace(path=request.url.path + "/")), status_code=307)
        root = resolve_warehouse(warehouse)
        names = await run_in_threadpool(discover_pipelines, root)
        if pipeline:
            names = [n for n in names if n in set(pipeline)]
        names = await run_in_threadpool(_readable, viewer, names)
        root, histories = await run_in_threadpool(_histories, names, state_size)
        html = render_page(
            histories,
            warehouse=root,
            generated_at_us=time.time_ns() // 1000,
            epoch_rows=limit,
            user=viewer.name,
            json_href="api/pipelines" + (f"?{request.url.query}" if request.url.query else ""),
            refresh_s=refresh,
        )
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    @app.get("/api/pipelines")
    async def pipelines_json(
        viewer: Viewer = Depends(authenticate),
        pipeline: list[str] | None = Query(default=None),
        state_size: bool = Query(default=True),
    ) -> JSONResponse:
        root = resolve_warehouse(warehouse)
        names = await run_in_threadpool(discover_pipelines, root)
        if pipeline:
            names = [n for n in names if n in set(pipeline)]
        names = await run_in_threadpool(_readable, viewer, names)
        root, histories = await run_in_threadpool(_histories, names, state_size)
        return JSONResponse(
            {
                "warehouse": root,
                "state_size_method": STATE_SIZE_METHOD,
                "pipelines": [h.to_json() for h in histories],
            },
            headers={"Cache-Control": "no-store"},
        )

    @app.get("/api/pipelines/{name}")
    async def pipeline_json(
        name: str,
        viewer: Viewer = Depends(authenticate),
        state_size: bool = Query(default=True),
    ) -> JSONResponse:
        root = resolve_warehouse(warehouse)
        names = await run_in_threadpool(discover_pipelines, root)
        if name not in names:
            raise HTTPException(status_code=404, detail=f"no pipeline {name!r} in warehouse {root}")
        if not await run_in_threadpool(viewer.can_read, name):
            raise HTTPException(status_code=403, detail=f"not allowed to read the runs of DAG {dag_id_for(name)}")
        root, histories = await run_in_threadpool(_histories, [name], state_size)
        return JSONResponse(histories[0].to_json(), headers={"Cache-Control": "no-store"})

    def _run_view(viewer: Viewer, dag_id: str, run_id: str) -> tuple[str, RunView]:
        root = resolve_warehouse(warehouse)
        found = find_pipeline(dag_id, discover_pipelines(root))
        if found and not viewer.can_read(found[0]):
            raise HTTPException(status_code=403, detail=f"not allowed to read the runs of DAG {dag_id_for(found[0])}")
        # The tab shows the run's epochs: no state sizes, backlog or savepoints to measure or list.
        history = pipeline_history(root, found[0], state_size=False, backlog=False, savepoints=False) if found else None
        return root, run_view(dag_id, run_id, found, history)

    @app.get("/run", response_class=HTMLResponse)
    async def run_page(
        viewer: Viewer = Depends(authenticate),
        dag_id: str = Query(description="the DAG of the run"),
        run_id: str = Query(description="the run"),
    ) -> Response:
        root, view = await run_in_threadpool(_run_view, viewer, dag_id, run_id)
        return HTMLResponse(render_run(view, warehouse=root), headers={"Cache-Control": "no-store"})

    @app.get("/api/run")
    async def run_json(
        viewer: Viewer = Depends(authenticate),
        dag_id: str = Query(description="the DAG of the run"),
        run_id: str = Query(description="the run"),
    ) -> JSONResponse:
        _, view = await run_in_threadpool(_run_view, viewer, dag_id, run_id)
        return JSONResponse(view.to_json(), headers={"Cache-Control": "no-store"})

    return app
