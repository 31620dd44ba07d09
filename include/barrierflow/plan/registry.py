"""Finding pipelines by name: the product's, the ones users register, or ``module:attribute``.

A registered pipeline gets its Airflow DAGs and is known to every command by
name (README "Declare a pipeline"). Registered are, in this order (a name
registered twice is an error):

1. the product's pipelines (``sensor_stats``, ``orders_payments``);
2. entry points in the group ``barrierflow.demo.pipelines`` (name: the pipeline's);
3. ``$BARRIERFLOW_PIPELINES``: comma-separated ``module:attribute`` targets,
   each a :class:`~barrierflow.plan.pipeline.PipelineDefinition` (its name is its own).

Any other ``module:attribute`` also loads a pipeline, for one command.
"""

from __future__ import annotations

import importlib
import os
from importlib.metadata import entry_points
from typing import Mapping

from barrierflow.core.errors import UnknownPipelineError
from barrierflow.plan.pipeline import PipelineDefinition

__all__ = ["ENTRY_POINT_GROUP", "PIPELINES_ENV", "get_pipeline", "pipeline_names", "registered_pipelines"]

ENTRY_POINT_GROUP = "barrierflow.demo.pipelines"
PIPELINES_ENV = "BARRIERFLOW_PIPELINES"

_PRODUCT = {
    "sensor_stats": "barrierflow.demo.pipelines.sensor_stats:sensor_stats",
    "orders_payments": "barrierflow.demo.pipelines.orders_payments:orders_payments",
}


def registered_pipelines(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Name -> ``module:attribute`` of every registered pipeline (steps 1-3 of the module docstring)."""
    env = os.environ if environ is None else environ
    out = dict(_PRODUCT)

    def register(name: str, target: str, where: str) -> None:
        if name in out and out[name] != target:
            raise UnknownPipelineError(f"pipeline {name!r} from {where} ({target}) is already registered as {out[name]}")
        out[name] = target

    for entry in entry_points(group=ENTRY_POINT_GROUP):  # 2.
        register(entry.name, entry.value, f"entry point {entry.name} of {ENTRY_POINT_GROUP}")
    for target in filter(None, (t.strip() for t in env.get(PIPELINES_ENV, "").split(","))):  # 3.
        if ":" not in target:
            raise UnknownPipelineError(f"${PIPELINES_ENV}: {target!r} is not module:attribute")
        register(_load(target, target).name, target, f"${PIPELINES_ENV}")
    return out


def pipeline_names(environ: Mapping[str, str] | None = None) -> list[str]:
    return sorted(registered_pipelines(environ))


def get_pipeline(name: str, environ: Mapping[str, str] | None = None) -> PipelineDefinition:
    """The definition registered as ``name``, or loaded from ``package.module:attr``."""
    registered = registered_pipelines(environ)
    target = registered.get(name, name if ":" in name else None)
    if target is None:
        raise UnknownPipelineError(
            f"unknown pipeline {name!r}; registered: {', '.join(sorted(registered))} "
            f"(register yours with ${PIPELINES_ENV}=module:attribute or an entry point in {ENTRY_POINT_GROUP!r}, "
            "or give package.module:attribute)"
        )
    return _load(name, target)


def _load(name: str, target: str) -> PipelineDefinition:
    module_name, _, attr = target.partition(":")
    try:
        definition = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UnknownPipelineError(f"cannot load pipeline {name!r} from {target}: {exc}") from exc
    if not isinstance(definition, PipelineDefinition):
        raise UnknownPipelineError(f"{target} is not a pipeline definition (use the @pipeline decorator)")
    return definition
