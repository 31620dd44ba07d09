"""Pipeline parameters as typed Airflow DAG params, and back.

Each :class:`barrierflow.api.params.Param` becomes an ``airflow.sdk.Param`` with
its JSON-schema type, minimum, choices (``enum``), description and default, so the trigger form
shows a typed field. The default comes from ``BARRIERFLOW_<PIPELINE>__<PARAM>``
when that variable is set (this is how a required parameter such as
``landing_dir`` gets a value for scheduled runs), else from the pipeline.
A required parameter without either is nullable in the form and fails the
run's first task with a message saying how to set it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping

from barrierflow.airflow.dags.settings import param_env_var
from barrierflow.api.params import Param as PipelineParam
from barrierflow.api.params import placeholder
from barrierflow.checkpointing.coordinator import recorded_params
from barrierflow.core.errors import ParameterError, PipelineDefinitionError
from barrierflow.plan.pipeline import PipelineDefinition

if TYPE_CHECKING:
    from airflow.sdk import Param

__all__ = [
    "unset_required_params",
    "CATCH_UP_PARAM",
    "pipeline_dag_params",
    "resolve_pipeline_params",
    "introspection_params",
    "param_default",
    "operational_params",
]

CATCH_UP_PARAM = "catch_up_epochs"
# A run drains what arrived by its cut-off, up to this many epochs: an input
# rate above one epoch's size per interval never builds a backlog.
DEFAULT_CATCH_UP_EPOCHS = 5


def param_default(definition: PipelineDefinition, param: PipelineParam, environ: Mapping[str, str] | None = None) -> Any:
    """The DAG-param default: ``$BARRIERFLOW_<PIPELINE>__<PARAM>``, the declared default, or None."""
    env = os.environ if environ is None else environ
    raw = env.get(param_env_var(definition.name, param.name))
    if raw is not None:
        try:
            return param.coerce(raw)
        except ParameterError as exc:
            raise ParameterError(f"{param_env_var(definition.name, param.name)}: {exc}") from None
    return None if param.required else param.default


def unset_required_params(definition: PipelineDefinition, environ: Mapping[str, str] | None = None) -> list[str]:
    """Required parameters with no default from the environment: such a DAG can only run manually."""
    return [p.name for p in definition.params if p.required and param_default(definition, p, environ) is None]


def pipeline_dag_params(definition: PipelineDefinition, environ: Mapping[str, str] | None = None) -> dict[str, "Param"]:
    """Typed DAG params: one per pipeline parameter, plus ``catch_up_epochs``."""
    from airflow.sdk import Param

    if any(p.name == CATCH_UP_PARAM for p in definition.params):
        raise PipelineDefinitionError(
            f"pipeline {definition.name} declares a parameter named {CATCH_UP_PARAM!r}, which its DAG reserves"
        )
    out: dict[str, Param] = {}
    for param in definition.params:
        default = param_default(definition, param, environ)
        schema: dict[str, Any] = {"type": param.json_type}
        if param.minimum is not None:
            schema["minimum"] = param.minimum
        if param.choices:
            schema["enum"] = [*param.choices, *([None] if param.required and default is None else [])]
        env_var = param_env_var(definition.name, param.name)
        description = param.description or param.json_type
        if param.required:
            description += f" (required; default from ${env_var})"
            if default is None:
                schema["type"] = ["null", param.json_type]
        else:
            description += f" (default {param.default!r}; ${env_var} overrides it)"
        out[param.name] = Param(default, description=description, title=param.name, **schema)
    out[CATCH_UP_PARAM] = Param(
        DEFAULT_CATCH_UP_EPOCHS,
        type="integer",
        minimum=1,
        title=CATCH_UP_PARAM,
        description=(
            "epochs this run may complete (bounded catch-up): the first through "
            "recover/barrier/process/commit/notify, up to N-1 more in the catch_up task"
        ),
    )
    return out


def resolve_pipeline_params(definition: PipelineDefinition, dag_params: Mapping[str, Any]) -> dict[str, Any]:
    """The pipeline's parameters of a DAG run, validated; unset (None) values count as not given."""
    given = {p.name: dag_params[p.name] for p in definition.params if dag_params.get(p.name) is not None}
    missing = [p.name for p in definition.params if p.required and p.name not in given]
    if missing:
        raise ParameterError(
            f"pipeline {definition.name}: missing required parameter(s) {', '.join(missing)}; give them in the "
            "trigger form (run config) or set "
            + ", ".join(f"${param_env_var(definition.name, name)}" for name in missing)
            + " for every Airflow component"
        )
    return definition.resolve(given)


def introspection_params(definition: PipelineDefinition, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Parameters to *build* (not run) the pipeline with when parsing DAGs: defaults, env
    values, and a placeholder for a required parameter that has neither. Building only
    declares operators and sinks; it reads no data, so a placeholder path is harmless."""
    out: dict[str, Any] = {}
    for param in definition.params:
        value = param_default(definition, param, environ)
        if value is None and param.required:
            value = placeholder(param)
        out[param.name] = value
    return out


def operational_params(
    definition: PipelineDefinition, warehouse: str, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The pipeline parameters of a savepoint, restore or maintenance run (at task run time).

    Those runs build the pipeline only to know its operators and tables: the
    parameters its newest barrier ran with
    (:func:`barrierflow.checkpointing.coordinator.recorded_params`), overridden by any
    ``$BARRIERFLOW_<PIPELINE>__<PARAM>``, over the declared defaults.
    """

    env = os.environ if environ is None else environ
    declared = {p.name for p in definition.params}
    given = {k: v for k, v in recorded_params(definition.name, warehouse).items() if k in declared and v is not None}
    for param in definition.params:
        if param_env_var(definition.name, param.name) in env:
            given[param.name] = param_default(definition, param, env)
    return resolve_pipeline_params(definition, given)
