"""The checkpoints page as a FastAPI app, mounted into Airflow's API server by the plugin.

Routes (relative to the mount point, ``/barrierflow`` in Airflow):

* ``GET /``                      the HTML page (``?pipeline=NAME`` repeatable, ``?limit=N`` epoch rows);
* ``GET /api/pipelines``         the same data as JSON, every readable pipeline;
* ``GET /api/pipelines/{name}``  one pipeline as JSON;
* ``GET /run?dag_id=D&run_id=R``  the epochs one Airflow DAG run planned (the run page's "Checkpoint" tab);
  ``GET /api/run?...`` the same as JSON.

**Authentication.** No authentication of Airflow's reaches a plugin's app mounted with ``app.mount``, so this app
checks itself: the caller presents Airflow's own credentials (the UI's ``_token`` cookie, or a ``Bearer`` JWT),
resolved by Airflow's ``get_user``; a pipeline is shown only to users who may read its DAG's runs
(``is_authorized_dag``). A browser without a session is redirected to Airflow's login page; API calls get 401/403.
Airflow is imported only when a request is authenticated, so loading the plugin stays cheap."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.security import HTTPBearer
from starlette.concurrency import run_in_threadpool

from barrierflow.airflow.dags.settings import pipeline_dag_id
from barrierflow.airflow.ui.history import (
    STATE_SIZE_METHOD,
    PipelineHistory,
    RunView,
    discover_pipelines,
    find_pipeline,
    pipeline_history,
    resolve_warehouse,
    run_view,
)
from barrierflow.airflow.ui.render import DEFAULT_EPOCH_ROWS, render_page, render_run

__all__ = ["Viewer", "NotAuthenticated", "Authenticator", "AirflowViewer", "airflow_authenticator", "create_app"]

_NO_STORE = {"Cache-Control": "no-store"}


class Viewer(Protocol):
    """Who is looking, and which pipelines they may see."""

    @property
    def name(self) -> str: ...

    def can_read(self, pipeline: str) -> bool: ...


class NotAuthenticated(HTTPException):
    """No valid Airflow credentials (401) or not allowed (403); a browser is sent to ``login_url`` when there is one."""

    def __init__(self, status_code: int, detail: str, login_url: str | None = None) -> None:
        super().__init__(status_code, detail)
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

        dag = DagDetails(id=pipeline_dag_id(pipeline))
        return bool(
            self.auth_manager.is_authorized_dag(method="GET", access_entity=DagAccessEntity.RUN, details=dag, user=self.user)
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

    bearer = await HTTPBearer(auto_error=False)(request)
    try:
        user = await get_user(request=request, _oauth_token=None, bearer_credentials=bearer)
    except HTTPException as exc:
        raise NotAuthenticated(exc.status_code, str(exc.detail), _login_url(request)) from exc
    return AirflowViewer(user=user, auth_manager=get_auth_manager())


def _forbidden(pipeline: str) -> HTTPException:
    return HTTPException(status_code=403, detail=f"not allowed to read the runs of DAG {pipeline_dag_id(pipeline)}")


def create_app(
    *,
    warehouse: str | None = None,
    authenticator: Authenticator | None = None,
    savepoint_lister: Callable[[str, str], Any] | None = None,
) -> FastAPI:
    """The checkpoints app; ``warehouse`` defaults to ``$BARRIERFLOW_WAREHOUSE`` (else ``./warehouse``)
    read at each request, ``authenticator`` to Airflow's (:func:`airflow_authenticator`)."""
    authenticate = authenticator or airflow_authenticator
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)  # no OpenAPI pages: every route needs a login

    @app.exception_handler(NotAuthenticated)
    async def _not_authenticated(request: Request, exc: NotAuthenticated) -> Response:
        if "/api/" in request.url.path:
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)
        if exc.status_code == 401 and exc.login_url:
            return RedirectResponse(exc.login_url, status_code=303)
        body = f"<!doctype html><title>barrierflow</title><p>{exc.status_code}: {exc.detail}</p>"
        return HTMLResponse(body, status_code=exc.status_code)

    def histories(viewer: Viewer, only: list[str] | None, state_size: bool) -> tuple[str, list[PipelineHistory]]:
        """The warehouse and the history of each pipeline in it the viewer may read (of ``only``, when given)."""
        root = resolve_warehouse(warehouse)
        names = [n for n in discover_pipelines(root) if (not only or n in only) and viewer.can_read(n)]
        return root, [pipeline_history(root, n, state_size=state_size, savepoint_lister=savepoint_lister) for n in names]

    @app.get("/", response_class=HTMLResponse)
    async def page(
        request: Request,
        viewer: Viewer = Depends(authenticate),
        pipeline: list[str] | None = Query(default=None),  # only these pipelines
        limit: int = Query(default=DEFAULT_EPOCH_ROWS, ge=1, le=100_000),  # epoch rows per pipeline
        state_size: bool = True,  # compute the live state size per epoch
        refresh: int | None = Query(default=None, ge=5, le=3600),  # reload the page every N seconds
    ) -> Response:
        if not request.url.path.endswith("/"):
            # Relative links (api/pipelines) need the trailing slash.
            return RedirectResponse(str(request.url.replace(path=request.url.path + "/")), status_code=307)
        root, found = await run_in_threadpool(histories, viewer, pipeline, state_size)
        html = render_page(
            found,
            warehouse=root,
            generated_at_us=time.time_ns() // 1000,
            epoch_rows=limit,
            user=viewer.name,
            json_href="api/pipelines" + (f"?{request.url.query}" if request.url.query else ""),
            refresh_s=refresh,
        )
        return HTMLResponse(html, headers=_NO_STORE)

    @app.get("/api/pipelines")
    async def pipelines_json(
        viewer: Viewer = Depends(authenticate), pipeline: list[str] | None = Query(default=None), state_size: bool = True
    ) -> JSONResponse:
        root, found = await run_in_threadpool(histories, viewer, pipeline, state_size)
        doc = {"warehouse": root, "state_size_method": STATE_SIZE_METHOD, "pipelines": [h.to_json() for h in found]}
        return JSONResponse(doc, headers=_NO_STORE)

    @app.get("/api/pipelines/{name}")
    async def pipeline_json(name: str, viewer: Viewer = Depends(authenticate), state_size: bool = True) -> JSONResponse:
        root = resolve_warehouse(warehouse)
        if name not in await run_in_threadpool(discover_pipelines, root):
            raise HTTPException(status_code=404, detail=f"no pipeline {name!r} in warehouse {root}")
        if not await run_in_threadpool(viewer.can_read, name):
            raise _forbidden(name)
        history = await run_in_threadpool(pipeline_history, root, name, state_size=state_size, savepoint_lister=savepoint_lister)
        return JSONResponse(history.to_json(), headers=_NO_STORE)

    def _run_view(viewer: Viewer, dag_id: str, run_id: str) -> tuple[str, RunView]:
        root = resolve_warehouse(warehouse)
        found = find_pipeline(dag_id, discover_pipelines(root))
        if found and not viewer.can_read(found[0]):
            raise _forbidden(found[0])
        # The tab shows the run's epochs: no state sizes, backlog or savepoints to measure or list.
        history = pipeline_history(root, found[0], state_size=False, backlog=False, savepoints=False) if found else None
        return root, run_view(dag_id, run_id, found, history)

    @app.get("/run", response_class=HTMLResponse)
    async def run_page(dag_id: str, run_id: str, viewer: Viewer = Depends(authenticate)) -> Response:
        root, view = await run_in_threadpool(_run_view, viewer, dag_id, run_id)
        return HTMLResponse(render_run(view, warehouse=root), headers=_NO_STORE)

    @app.get("/api/run")
    async def run_json(dag_id: str, run_id: str, viewer: Viewer = Depends(authenticate)) -> JSONResponse:
        _, view = await run_in_threadpool(_run_view, viewer, dag_id, run_id)
        return JSONResponse(view.to_json(), headers=_NO_STORE)

    return app
