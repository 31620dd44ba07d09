"""Finding pipelines by name: the built-in ones, or ``module:attribute``."""

from __future__ import annotations

import importlib

from barrierflow.errors import UnknownPipelineError
from barrierflow.pipeline import PipelineDefinition

__all__ = ["get_pipeline", "pipeline_names"]

_BUILTIN = {
    "sensor_stats": "barrierflow.pipelines.sensor_stats:sensor_stats",
    "bench_running_agg": "barrierflow.pipelines.bench_running_agg:bench_running_agg",
}


def pipeline_names() -> list[str]:
    return sorted(_BUILTIN)


def get_pipeline(name: str) -> PipelineDefinition:
    """The definition registered as ``name``, or loaded from ``package.module:attr``."""
    target = _BUILTIN.get(name, name if ":" in name else None)
    if target is None:
        raise UnknownPipelineError(
            f"unknown pipeline {name!r}; registered: {', '.join(pipeline_names())} "
            "(or give package.module:attribute)"
        )
    module_name, _, attr = target.partition(":")
    try:
        definition = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UnknownPipelineError(f"cannot load pipeline {name!r} from {target}: {exc}") from exc
    if not isinstance(definition, PipelineDefinition):
        raise UnknownPipelineError(f"{target} is not a pipeline definition (use the @pipeline decorator)")
    return definition
