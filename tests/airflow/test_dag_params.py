"""barrierflow.airflow.dags.params: pipeline params as typed DAG params, and back."""

from __future__ import annotations

from pathlib import Path

import pytest

from barrierflow.airflow.dags.params import (
    introspection_params,
    operational_params,
    pipeline_dag_params,
    resolve_pipeline_params,
)
from barrierflow.api.params import Param
from barrierflow.core.errors import ParameterError, PipelineDefinitionError
from barrierflow.plan.pipeline import pipeline
from barrierflow.plan.registry import get_pipeline

SENSOR = get_pipeline("sensor_stats")


def test_dag_params_carry_type_minimum_description_and_default() -> None:
    params = pipeline_dag_params(SENSOR, {})
    files = params["max_files_per_epoch"]
    assert files.value == 20 and files.schema == {"type": "integer", "minimum": 1, "title": "max_files_per_epoch"}
    assert "files per epoch" in files.description and "BARRIERFLOW_SENSOR_STATS__MAX_FILES_PER_EPOCH" in files.description
    landing = params["landing_dir"]
    assert landing.value is None and landing.schema["type"] == ["null", "string"]
    assert "required" in landing.description
    assert params["late_files"].schema["enum"] == ["next_epoch", "dead_letter", "refuse"]  # a drop-down in the form


def test_bad_environment_default_is_a_parameter_error() -> None:
    with pytest.raises(ParameterError, match="BARRIERFLOW_SENSOR_STATS__PARALLELISM"):
        pipeline_dag_params(SENSOR, {"BARRIERFLOW_SENSOR_STATS__PARALLELISM": "zero"})


def test_catch_up_epochs_is_reserved() -> None:
    @pipeline("clash", params=[Param("catch_up_epochs", int, 1)])
    def clash(p, params):  # pragma: no cover - never built
        raise AssertionError

    with pytest.raises(PipelineDefinitionError, match="catch_up_epochs"):
        pipeline_dag_params(clash, {})


def test_resolve_ignores_dag_only_params_and_names_the_variable_when_missing() -> None:
    resolved = resolve_pipeline_params(SENSOR, {"landing_dir": "/in", "parallelism": 4, "catch_up_epochs": 3})
    assert resolved == {
        "landing_dir": "/in",
        "max_files_per_epoch": 20,
        "parallelism": 4,
        "out_of_orderness_seconds": 30,
        "late_files": "next_epoch",
    }
    with pytest.raises(ParameterError, match=r"landing_dir.*BARRIERFLOW_SENSOR_STATS__LANDING_DIR"):
        resolve_pipeline_params(SENSOR, {"landing_dir": None})


def test_introspection_uses_a_placeholder_for_a_required_param() -> None:
    assert introspection_params(SENSOR, {})["landing_dir"] == "<landing_dir>"
    assert introspection_params(SENSOR, {"BARRIERFLOW_SENSOR_STATS__LANDING_DIR": "/in"})["landing_dir"] == "/in"


def test_operational_params_default_to_what_the_pipeline_last_ran_with(tmp_path: Path) -> None:
    import os

    from barrierflow.storage import objects
    from barrierflow.storage.layout import PipelineLayout

    layout = PipelineLayout.of(str(tmp_path), "sensor_stats")
    for epoch, landing in ((1, "/old"), (2, "/recorded")):
        objects.write_json_if_absent(layout.barrier("abc", epoch), {"params": {"landing_dir": landing, "parallelism": 3}})
        os.utime(objects.local_path(layout.barrier("abc", epoch)), (epoch, epoch))
    recorded = operational_params(SENSOR, str(tmp_path), {})
    assert recorded["landing_dir"] == "/recorded" and recorded["parallelism"] == 3
    env = {"BARRIERFLOW_SENSOR_STATS__LANDING_DIR": "/env"}
    assert operational_params(SENSOR, str(tmp_path), env)["landing_dir"] == "/env"
    with pytest.raises(ParameterError):
        operational_params(SENSOR, str(tmp_path / "empty"), {})
