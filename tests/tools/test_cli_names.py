"""barrierflow.tools.cli: inspecting commands take a pipeline by name or by ``package.module:attribute``."""

from __future__ import annotations

from barrierflow.tools.cli import _pipeline_name


def test_a_module_attribute_reference_names_the_pipeline_it_defines() -> None:
    assert _pipeline_name("barrierflow.demo.pipelines.sensor_stats:sensor_stats") == "sensor_stats"


def test_a_plain_name_is_taken_as_is_without_loading_code() -> None:
    assert _pipeline_name("retired_pipeline") == "retired_pipeline"
