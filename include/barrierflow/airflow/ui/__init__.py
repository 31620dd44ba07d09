"""barrierflow's checkpoints page: epoch history, lineages, savepoints, an SVG chart.

:mod:`barrierflow.airflow.ui.history` gathers the data from the warehouse and needs no
web framework; :mod:`barrierflow.airflow.ui.render` and :mod:`barrierflow.airflow.ui.chart`
turn it into HTML and SVG; :mod:`barrierflow.airflow.ui.app` serves both as a FastAPI
app that :mod:`barrierflow.airflow.ui.plugin` hands to Airflow. FastAPI is imported
only when the app is asked for.
"""

from __future__ import annotations

from typing import Any

from barrierflow.airflow.ui.history import (
    STATE_SIZE_METHOD,
    EpochRow,
    LineageInfo,
    PipelineHistory,
    discover_pipelines,
    pipeline_history,
    resolve_warehouse,
    warehouse_history,
)
from barrierflow.airflow.ui.plugin import URL_PREFIX, VIEW_ROUTE, external_view_spec, fastapi_app_spec

__all__ = [
    "STATE_SIZE_METHOD",
    "EpochRow",
    "LineageInfo",
    "PipelineHistory",
    "discover_pipelines",
    "pipeline_history",
    "resolve_warehouse",
    "warehouse_history",
    "render_page",
    "render_epoch_chart",
    "create_app",
    "fastapi_app_spec",
    "external_view_spec",
    "URL_PREFIX",
    "VIEW_ROUTE",
]

_LAZY = {
    "render_page": ("barrierflow.airflow.ui.render", "render_page"),
    "render_epoch_chart": ("barrierflow.airflow.ui.chart", "render_epoch_chart"),
    "create_app": ("barrierflow.airflow.ui.app", "create_app"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
