"""The parts of barrierflow's Airflow plugin (``plugins/barrierflow_plugin.py`` registers them).

:func:`fastapi_app_spec` mounts the checkpoints app at ``/barrierflow`` in Airflow's API server; :func:`external_view_spec`
is the "Checkpoints" page under Browse; :func:`run_view_spec` is a "Checkpoint" tab on every DAG run's page, the way back
from a run to its epochs. Each ``href`` is relative, so the UI resolves it against its base URL (behind a path prefix too)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from barrierflow.airflow.ui.app import create_app

__all__ = ["PLUGIN_NAME", "URL_PREFIX", "VIEW_ROUTE", "RUN_VIEW_ROUTE", "fastapi_app_spec", "external_view_spec", "run_view_spec"]

PLUGIN_NAME = "barrierflow"
URL_PREFIX = "/barrierflow"
VIEW_ROUTE = "barrierflow-checkpoints"  # the UI shows the page at /plugin/<VIEW_ROUTE>
RUN_VIEW_ROUTE = "barrierflow-checkpoint"  # a run's tab: /dags/<dag>/runs/<run>/plugin/<RUN_VIEW_ROUTE>

# A small "barrier" glyph: two bars and a rule; a data URI needs no extra route.
_ICON_SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" fill="none" stroke="{c}" stroke-width="2" '
    'stroke-linecap="round"><path d="M4 20V8M10 20V4M16 20v-9"/><path d="M20 3v18" stroke-dasharray="3 2"/></svg>'
)


def _view(name: str, path: str, url_route: str, destination: str, **extra: str) -> dict[str, Any]:
    """An ``external_views`` entry under the app's prefix, with the glyph for light and dark mode."""
    icons = {
        key: "data:image/svg+xml;utf8," + quote(_ICON_SVG.format(c=c))
        for key, c in (("icon", "#4a5568"), ("icon_dark_mode", "#e2e8f0"))
    }
    href = URL_PREFIX.lstrip("/") + path
    return {"name": name, "href": href, "url_route": url_route, "destination": destination, **extra, **icons}


def fastapi_app_spec(**create_app_kwargs: Any) -> dict[str, Any]:
    """The ``fastapi_apps`` entry: ``{"app", "url_prefix", "name"}``."""
    return {"app": create_app(**create_app_kwargs), "url_prefix": URL_PREFIX, "name": "barrierflow checkpoints"}


def external_view_spec() -> dict[str, Any]:
    """The ``external_views`` entry: a "Checkpoints" page under Browse."""
    return _view("Checkpoints", "/", VIEW_ROUTE, "nav", category="browse")


def run_view_spec() -> dict[str, Any]:
    """The ``external_views`` entry of a DAG run's "Checkpoint" tab: the UI fills ``{DAG_ID}`` and ``{RUN_ID}`` (URL-encoded) for
    destination ``dag_run`` and shows it on every DAG's runs; the page says when a run is not a pipeline's."""
    return _view("Checkpoint", "/run?dag_id={DAG_ID}&run_id={RUN_ID}", RUN_VIEW_ROUTE, "dag_run")
