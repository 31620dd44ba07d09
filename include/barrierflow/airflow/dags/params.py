"""Pipeline parameters as typed Airflow DAG params (the trigger form's fields), and back.

Each :class:`barrierflow.api.params.Param` becomes an ``airflow.sdk.Param`` with its JSON-schema type, minimum,
choices (``enum``), description and default. The default comes from ``BARRIERFLOW_<PIPELINE>__<PARAM>`` when set (how
a required parameter such as ``landing_dir`` gets a value for scheduled runs), else from the pipeline. A required
parameter without either is nullable in the form and fails the run's first task with a message saying how to set it."""

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
    "unset_required_params", "CATCH_UP_PARAM", "pipeline_dag_params", "form_field", "form_doc", "resolve_pipeline_params",
    "introspection_params", "param_default", "operational_params",
]  # fmt: skip

CATCH_UP_PARAM = "catch_up_epochs"
# A run drains its cut-off's input in up to this many epochs: input above one epoch's size per interval builds no backlog.
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
    if any(p.name == CATCH_UP_PARAM for p in definition.params):
        raise PipelineDefinitionError(
            f"pipeline {definition.name} declares a parameter named {CATCH_UP_PARAM!r}, which its DAG reserves"
        )
    out: dict[str, Param] = {}
    for param in definition.params:
        default, env_var = param_default(definition, param, environ), param_env_var(definition.name, param.name)
        unset = param.required and default is None
        schema: dict[str, Any] = {} if param.minimum is None else {"minimum": param.minimum}
        if param.choices:
            schema["enum"] = [*param.choices, *([None] if unset else [])]
        note = f"required; default from ${env_var}" if param.required else f"default {param.default!r}; ${env_var} overrides it"
        kind = ["null", param.json_type] if unset else param.json_type
        out |= form_field(param.name, default, kind, f"{param.description or param.json_type} ({note})", **schema)
    catch_up = "epochs this run may complete (bounded catch-up): the first through the five steps, up to N-1 more in catch_up"
    return out | form_field(CATCH_UP_PARAM, DEFAULT_CATCH_UP_EPOCHS, "integer", catch_up, minimum=1)


def form_field(name: str, default: Any, type: Any, description: str, **schema: Any) -> dict[str, "Param"]:
    """One field of a trigger form, titled with its name: ``form_field(...) | form_field(...)`` is a DAG's params."""
    from airflow.sdk import Param

    return {name: Param(default, type=type, title=name, description=description, **schema)}


def form_doc(form: Mapping[str, "Param"]) -> str:
    """The trigger form as a markdown list, for a DAG's ``doc_md``."""
    return "\n".join(f"- `{name}` = `{param.value!r}`: {param.description}" for name, param in form.items())


def resolve_pipeline_params(definition: PipelineDefinition, dag_params: Mapping[str, Any]) -> dict[str, Any]:
    """The pipeline's parameters of a DAG run, validated; unset (None) values count as not given."""
    given = {p.name: dag_params[p.name] for p in definition.params if dag_params.get(p.name) is not None}
    missing = [p.name for p in definition.params if p.required and p.name not in given]
    if missing:
        env = ", ".join(f"${param_env_var(definition.name, name)}" for name in missing)
        raise ParameterError(
            f"pipeline {definition.name}: missing required parameter(s) {', '.join(missing)}; give them in the "
            f"trigger form (run config) or set {env} for every Airflow component"
        )
    return definition.resolve(given)


def introspection_params(definition: PipelineDefinition, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Parameters to *build* (not run) the pipeline with when parsing DAGs: defaults, env values, and a
    placeholder for a required parameter that has neither (building reads no data, so a placeholder is harmless)."""
    values = {p.name: param_default(definition, p, environ) for p in definition.params}
    return {p.name: placeholder(p) if values[p.name] is None and p.required else values[p.name] for p in definition.params}


def operational_params(
    definition: PipelineDefinition, warehouse: str, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The pipeline parameters of a savepoint, restore, reprocess or maintenance run (at task run time): the ones its newest
    barrier ran with (:func:`~barrierflow.checkpointing.coordinator.recorded_params`), overridden by any
    ``$BARRIERFLOW_<PIPELINE>__<PARAM>``, over the declared defaults."""
    env = os.environ if environ is None else environ
    declared = {p.name for p in definition.params}
    given = {k: v for k, v in recorded_params(definition.name, warehouse).items() if k in declared and v is not None}
    given |= {
        p.name: param_default(definition, p, env) for p in definition.params if param_env_var(definition.name, p.name) in env
    }
    return resolve_pipeline_params(definition, given)
