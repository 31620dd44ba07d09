"""barrierflow.plan.pipeline and barrierflow.plan.registry: building pipelines without Spark."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pytest

from barrierflow.api.aggregations import Count, Sum
from barrierflow.api.windows import TumblingEventTimeWindows
from barrierflow.connectors import DeltaSink, FileSource
from barrierflow.core.errors import ParameterError, PipelineDefinitionError, UnknownPipelineError
from barrierflow.plan.pipeline import PipelineBuilder, PipelineDefinition, pipeline
from barrierflow.plan.registry import get_pipeline, pipeline_names

SCHEMA = pa.schema([pa.field("k", pa.string()), pa.field("ts", pa.timestamp("us", tz="UTC")), pa.field("v", pa.float64())])


@pytest.fixture
def build() -> Callable[[Callable[[PipelineBuilder], None]], Any]:
    """Build a one-off pipeline from a body that receives the builder."""

    def _build(body: Callable[[PipelineBuilder], None], name: str = "unit_pipe") -> Any:
        @pipeline(name)
        def definition(p: PipelineBuilder, params: dict[str, Any]) -> None:
            body(p)

        return definition.build({})

    return _build


def _source(source_id: str = "events") -> FileSource:
    return FileSource(source_id, "/nonexistent/landing", format="jsonl", schema=SCHEMA)


def test_minimal_pipeline_builds(build: Callable[..., Any]) -> None:
    def body(p: PipelineBuilder) -> None:
        p.source(_source()).key_by("k").aggregate("totals", Count()).sink_to(DeltaSink.append("out"))

    pipe = build(body)
    assert pipe.operator_ids() == ["events", "totals", "sink_out"]
    assert [s.sink.name for s in pipe.sinks] == ["out"]
    assert [s.operator_id for s in pipe.sources] == ["events"]
    assert pipe.parallelism == 2
    assert [n for n in pipe.nodes if any(i is pipe.nodes[0] for i in n.inputs())] == [pipe.nodes[1]]


def test_duplicate_operator_id(build: Callable[..., Any]) -> None:
    def body(p: PipelineBuilder) -> None:
        keyed = p.source(_source()).key_by("k")
        keyed.aggregate("totals", Count())
        keyed.aggregate("totals", Sum("v"))

    with pytest.raises(PipelineDefinitionError, match="duplicate operator id 'totals' in unit_pipe"):
        build(body)


def test_duplicate_sink_is_a_duplicate_operator(build: Callable[..., Any]) -> None:
    def body(p: PipelineBuilder) -> None:
        s = p.source(_source())
        s.sink_to(DeltaSink.append("out"))
        s.sink_to(DeltaSink.append("out"))

    with pytest.raises(PipelineDefinitionError, match="'sink_out'"):
        build(body)


@pytest.mark.parametrize("bad_id", ["Totals", "1st", "my-op", "", "_hidden", "with space"])
def test_bad_operator_id(build: Callable[..., Any], bad_id: str) -> None:
    def body(p: PipelineBuilder) -> None:
        p.source(_source()).key_by("k").aggregate(bad_id, Count())

    with pytest.raises(PipelineDefinitionError, match="must be lower_snake_case"):
        build(body)


def test_bad_source_id(build: Callable[..., Any]) -> None:
    with pytest.raises(PipelineDefinitionError, match="'Events'"):
        build(lambda p: p.source(_source("Events")))


def test_window_without_watermark(build: Callable[..., Any]) -> None:
    def body(p: PipelineBuilder) -> None:
        p.source(_source()).key_by("k").window("minutes", TumblingEventTimeWindows.of(timedelta(minutes=1)), Count())

    with pytest.raises(PipelineDefinitionError, match=r"window 'minutes' needs with_watermark\(\) upstream"):
        build(body)


def test_window_with_watermark_builds(build: Callable[..., Any]) -> None:
    def body(p: PipelineBuilder) -> None:
        p.source(_source()).with_watermark("ts", timedelta(seconds=5)).key_by("k").window(
            "minutes", TumblingEventTimeWindows.of(timedelta(minutes=1)), Count(), late_output="late"
        ).sink_to(DeltaSink.append("per_minute"))

    pipe = build(body)
    assert pipe.operator_ids() == ["events", "watermark_ts", "minutes", "sink_per_minute"]
    assert pipe.side_output_names() == ["late"]
    assert pipe.nodes[1].out_of_orderness_us == 5_000_000


def test_second_watermark_of_a_column_needs_its_own_id(build: Callable[..., Any]) -> None:
    """Several assigners are allowed (the watermark is the minimum of theirs); each is named for its state."""

    def body(p: PipelineBuilder) -> None:
        p.source(_source()).with_watermark("ts", timedelta(0)).with_watermark("ts", timedelta(1))

    with pytest.raises(PipelineDefinitionError, match="a watermark assigner of column 'ts' exists; give this one an operator_id"):
        build(body)


def test_key_by_needs_columns(build: Callable[..., Any]) -> None:
    with pytest.raises(PipelineDefinitionError, match="key_by needs at least one column"):
        build(lambda p: p.source(_source()).key_by())


def test_sink_named_dead_letter(build: Callable[..., Any]) -> None:
    with pytest.raises(PipelineDefinitionError, match="not 'dead_letter'.*dead_letter"):
        build(lambda p: p.source(_source()).sink_to(DeltaSink.append("dead_letter")))


def test_side_output_named_dead_letter(build: Callable[..., Any]) -> None:
    def body(p: PipelineBuilder) -> None:
        p.source(_source()).with_watermark("ts", timedelta(0)).key_by("k").window(
            "minutes", TumblingEventTimeWindows.of(timedelta(minutes=1)), Count(), late_output="dead_letter"
        )

    with pytest.raises(PipelineDefinitionError, match="dead_letter"):
        build(body)


def test_side_output_clashing_with_a_sink(build: Callable[..., Any]) -> None:
    def body(p: PipelineBuilder) -> None:
        p.source(_source()).with_watermark("ts", timedelta(0)).key_by("k").window(
            "minutes", TumblingEventTimeWindows.of(timedelta(minutes=1)), Count(), late_output="per_minute"
        ).sink_to(DeltaSink.append("per_minute"))

    with pytest.raises(PipelineDefinitionError, match=r"must be unique.*\['per_minute'\]"):
        build(body)


def test_pipeline_without_source(build: Callable[..., Any]) -> None:
    with pytest.raises(PipelineDefinitionError, match="declares no source"):
        build(lambda p: None)


@pytest.mark.parametrize(
    ("kwargs", "match"), [({"name": "Bad-Name"}, "lower_snake_case"), ({"name": "ok", "key_groups": 0}, "key_groups")]
)
def test_pipeline_decorator_validation(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(PipelineDefinitionError, match=match):
        pipeline(**kwargs)


def test_upsert_sink_needs_a_key() -> None:
    with pytest.raises(PipelineDefinitionError, match="needs key="):
        DeltaSink("totals", "upsert")
    with pytest.raises(PipelineDefinitionError, match="mode must be"):
        DeltaSink("totals", "overwrite")
    assert DeltaSink.upsert("totals", "k").key == ("k",)


# -- registry ---------------------------------------------------------------------


def test_unknown_pipeline_lists_registered_ones() -> None:
    with pytest.raises(UnknownPipelineError) as info:
        get_pipeline("no_such_pipeline")
    assert "'no_such_pipeline'" in str(info.value)
    for name in pipeline_names():
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("target", "match"),
    [
        ("no_such_module_xyz:thing", "cannot load pipeline"),
        ("barrierflow.demo.pipelines.sensor_stats:nope", "cannot load pipeline"),
        ("barrierflow.demo.pipelines.sensor_stats:parse_reading", "is not a pipeline definition"),
    ],
)
def test_module_attribute_targets_that_are_not_pipelines(target: str, match: str) -> None:
    with pytest.raises(UnknownPipelineError, match=match):
        get_pipeline(target)


def test_module_attribute_target_loads_a_definition() -> None:
    definition = get_pipeline("barrierflow.demo.pipelines.sensor_stats:sensor_stats")
    assert definition is get_pipeline("sensor_stats")


def test_the_registry_holds_the_products_pipelines_and_those_users_register(tmp_path: Path) -> None:
    from readme_example import TARGET, write_readme_module

    assert pipeline_names() == ["orders_payments", "sensor_stats"]  # the benchmark's pipeline lives in bench/
    for name in pipeline_names():
        assert isinstance(get_pipeline(name), PipelineDefinition) and get_pipeline(name).name == name
    # A user's module on the path, named in $BARRIERFLOW_PIPELINES: registered under its own name.
    write_readme_module(tmp_path)
    env = {"BARRIERFLOW_PIPELINES": f" {TARGET} ,"}
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        assert pipeline_names(env) == ["clicks", "orders_payments", "sensor_stats"]
        assert get_pipeline("clicks", env).name == "clicks"
        with pytest.raises(UnknownPipelineError, match="not module:attribute"):
            pipeline_names({"BARRIERFLOW_PIPELINES": "clicks"})
        with pytest.raises(UnknownPipelineError, match="BARRIERFLOW_PIPELINES=module:attribute"):
            get_pipeline("clicks")  # not registered here
        (tmp_path / "same_name.py").write_text("from barrierflow.demo.pipelines.sensor_stats import sensor_stats as again\n")
        with pytest.raises(UnknownPipelineError, match="'sensor_stats' .* is already registered"):
            pipeline_names({"BARRIERFLOW_PIPELINES": "same_name:again"})
    finally:
        sys.path.remove(str(tmp_path))


# -- sensor_stats -----------------------------------------------------------------


def test_sensor_stats_operators_and_state(tmp_path: Path) -> None:
    pipe = get_pipeline("sensor_stats").build({"landing_dir": str(tmp_path), "parallelism": "3"})
    assert pipe.name == "sensor_stats"
    assert pipe.operator_ids() == [
        "readings",
        "dedup",
        "watermark_ts",
        "totals",
        "sink_sensor_totals",
        "minute_windows",
        "sink_sensor_minute",
        "rising_alerts",
        "sink_alerts",
    ]
    assert pipe.parallelism == 3
    assert pipe.params == {
        "landing_dir": str(tmp_path),
        "max_files_per_epoch": 20,
        "parallelism": 3,
        "out_of_orderness_seconds": 30,
        "late_files": "next_epoch",
    }
    specs = {s.table_name: s for s in pipe.state_specs()}
    assert list(specs) == [
        "readings__offsets",
        "dedup__seen",
        "totals__accumulators",
        "minute_windows__pending_windows",
        "rising_alerts__last_two",
    ]
    assert specs["dedup__seen"].key_columns == ["event_id"]
    assert specs["totals__accumulators"].key_columns == ["sensor_id"]
    assert specs["totals__accumulators"].value_columns == ["count", "sum_temperature", "min_temperature", "max_temperature"]
    assert specs["minute_windows__pending_windows"].key_columns == ["sensor_id", "window_start"]
    assert specs["rising_alerts__last_two"].value_fields == (pa.field("value", pa.list_(pa.float64())),)
    sinks = {s.sink.name: s.sink for s in pipe.sinks}
    assert sinks["sensor_totals"].mode == "upsert" and sinks["sensor_totals"].key == ("sensor_id",)
    assert sinks["sensor_minute"].mode == "append"
    assert sinks["alerts"].mode == "append"
    assert pipe.side_output_names() == ["late_readings"]
    source = pipe.sources[0].source
    assert source.path == str(tmp_path)
    assert source.max_files_per_epoch == 20
    assert pipe.nodes[2].out_of_orderness_us == 30_000_000


def test_sensor_stats_params_flow_into_operators(tmp_path: Path) -> None:
    pipe = get_pipeline("sensor_stats").build(
        {"landing_dir": str(tmp_path), "max_files_per_epoch": "2", "out_of_orderness_seconds": "0"}
    )
    assert pipe.sources[0].source.max_files_per_epoch == 2
    assert pipe.nodes[2].out_of_orderness_us == 0


def test_sensor_stats_needs_landing_dir() -> None:
    with pytest.raises(ParameterError, match="missing required parameter 'landing_dir'"):
        get_pipeline("sensor_stats").build({})


def test_sensor_stats_rejects_bad_params(tmp_path: Path) -> None:
    with pytest.raises(ParameterError, match="'parallelism' must be >= 1"):
        get_pipeline("sensor_stats").build({"landing_dir": str(tmp_path), "parallelism": "0"})
    with pytest.raises(ParameterError, match="unknown parameter"):
        get_pipeline("sensor_stats").build({"landing_dir": str(tmp_path), "paralelism": "2"})
