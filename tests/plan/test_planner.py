"""barrierflow.plan.planner: schemas, typed state, exchanges and stages of typical pipelines, and errors at planning.

Each pipeline is declared with the public API and planned from its sources'
record schemas (``_seq`` appended, as the runner does); the expected
stages, edges, schemas and state tables are written out by hand from the
planner's rules (its module docstring, steps 1-4).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Sequence

import pyarrow as pa
import pytest

import barrierflow as bf
from barrierflow.core.columns import SEQ
from barrierflow.operators.base import Exchange, Node
from barrierflow.operators.watermark import WatermarkAssigner
from barrierflow.plan.pipeline import Pipeline, SourceNode
from barrierflow.plan.planner import Edge, PhysicalPlan, physical_plan

UTC_US = pa.timestamp("us", tz="UTC")
EVENTS = pa.schema([("id", pa.string()), ("user", pa.string()), ("amount", pa.int64()), ("ts", UTC_US)])
RULES = pa.schema([("rule", pa.string()), ("limit", pa.int64())])
DICT = bf.MapStateDescriptor("limits", pa.string(), pa.int64())
K, F, G, B = Exchange.KEYED, Exchange.FORWARD, Exchange.GLOBAL, Exchange.BROADCAST


def _source(name: str, schema: pa.Schema = EVENTS) -> bf.FileSource:
    return bf.FileSource(name, f"/nonexistent/{name}", schema=schema)


def _plan(body: Callable[[bf.PipelineBuilder], None]) -> tuple[Pipeline, PhysicalPlan]:
    @bf.pipeline("planned")
    def definition(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
        body(p)

    pipe = definition.build({})
    return pipe, _physical(pipe)


def _physical(pipe: Pipeline) -> PhysicalPlan:
    sources = {
        i: n.source.record_schema().append(pa.field(SEQ, pa.int64()))
        for i, n in enumerate(pipe.nodes)
        if isinstance(n, SourceNode)
    }  # type: ignore[union-attr]
    return physical_plan(pipe, sources)


def _ids(pipe: Pipeline, plan: PhysicalPlan) -> list[list[str]]:
    return [[pipe.nodes[i].operator_id for i in stage] for stage in plan.stages]


def _schema(*fields: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema([pa.field(n, t) for n, t in fields])


def test_source_dedup_aggregate_upsert_sink() -> None:
    def body(p: bf.PipelineBuilder) -> None:
        fresh = p.source(_source("events")).deduplicate("dedup", key="id")
        fresh.key_by("user").aggregate("totals", n=bf.Count(), total=bf.Sum("amount")).sink_to(
            bf.DeltaSink.upsert("per_user", key="user")
        )

    pipe, plan = _plan(body)
    assert [n.operator_id for n in pipe.nodes] == ["events", "dedup", "totals", "sink_per_user"]
    assert plan.inputs == ((), (0,), (1,), (2,))
    # Each keyed operator after a key-group exchange; the upsert sink gets every row in one task.
    assert plan.edges == (Edge(0, 1, 0, K, ("id",)), Edge(1, 2, 0, K, ("user",)), Edge(2, 3, 0, G))
    assert _ids(pipe, plan) == [["events"], ["dedup"], ["totals"], ["sink_per_user"]]
    assert plan.singletons == {3}
    with_seq = EVENTS.append(pa.field(SEQ, pa.int64()))
    assert plan.schemas[0] == plan.schemas[1] == with_seq
    assert plan.schemas[2] == _schema(("user", pa.string()), ("n", pa.int64()), ("total", pa.float64()))
    assert plan.schemas[3] == pa.schema([])
    assert plan.side_outputs == {"per_user": (3, plan.schemas[2])}  # the sink's rows: the aggregate's output
    # State tables, keys typed by the inputs: the source's offsets, the seen ids, the accumulators.
    assert [(s.table_name, [str(f.type) for f in s.key_fields]) for i in range(4) for s in plan.state_specs[i]] == [
        ("events__offsets", ["int32", "int64"]), ("dedup__seen", ["string"]), ("totals__accumulators", ["string"]),
    ]  # fmt: skip
    assert [f.name for f in plan.state_specs[2][0].value_fields] == ["count", "sum_amount"]
    # Keys taken unchanged from the source are checked there, by the first operator keyed by them.
    assert plan.source_keys == {0: {"id": "dedup", "user": "totals"}}
    assert plan.computed_keys == {}
    assert plan.crossing(1) == ([Edge(0, 1, 0, K, ("id",))], [Edge(1, 2, 0, K, ("user",))])


def test_a_window_runs_after_the_watermark_its_stage_the_keyed_exchanges() -> None:
    def body(p: bf.PipelineBuilder) -> None:
        (p.source(_source("events")).with_watermark("ts", timedelta(seconds=5))
          .key_by("user").window("per_minute", bf.TumblingEventTimeWindows.of(timedelta(minutes=1)), n=bf.Count(), late_output="late")
          .sink_to(bf.DeltaSink.append("minutes")))  # fmt: skip

    pipe, plan = _plan(body)
    assert [n.operator_id for n in pipe.nodes] == ["events", "watermark_ts", "per_minute", "sink_minutes"]
    assert plan.edges == (Edge(0, 1, 0, F), Edge(1, 2, 0, K, ("user",)), Edge(2, 3, 0, F))
    assert _ids(pipe, plan) == [["events", "watermark_ts"], ["per_minute", "sink_minutes"]]
    assert plan.singletons == frozenset()
    assert plan.schemas[1] == plan.schemas[0]  # an assigner only observes
    assert plan.schemas[2] == _schema(("user", pa.string()), ("window_start", UTC_US), ("window_end", UTC_US), ("n", pa.int64()))
    assert set(plan.side_outputs) == {"late", "minutes"} and plan.side_outputs["late"][0] == 2
    assert plan.state_specs[1] == ()  # one assigner: its maximum is the checkpoint's, no state


def test_an_event_time_operator_runs_in_a_stage_after_every_assigner() -> None:
    """Step 3: even one reached ``FORWARD`` from an assigner starts a new stage, where W(n) is final."""

    @dataclass
    class EventTimeMap(Node):
        uses_watermark = True

        def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
            return inputs[0]

    source = SourceNode(operator_id="events", parent=None, source=_source("events"))
    assigner = WatermarkAssigner(operator_id="watermark_ts", parent=source, column="ts")
    timed = EventTimeMap(operator_id="timed", parent=assigner)
    after = EventTimeMap(operator_id="after", parent=timed)
    plan = _physical(Pipeline("planned", 8, [source, assigner, timed, after], {}, 1))
    assert plan.edges == (Edge(0, 1, 0, F), Edge(1, 2, 0, F), Edge(2, 3, 0, F))
    assert plan.stage_of == (0, 0, 1, 1)


def test_a_union_of_two_sources_runs_with_them() -> None:
    def body(p: bf.PipelineBuilder) -> None:
        web, shop = p.source(_source("web")), p.source(_source("shop"))
        web.union(shop).key_by("user").aggregate("totals", n=bf.Count()).sink_to(bf.DeltaSink.append("out"))

    pipe, plan = _plan(body)
    assert [n.operator_id for n in pipe.nodes] == ["web", "shop", "union-1", "totals", "sink_out"]
    assert plan.inputs[2] == (0, 1)
    assert plan.edges[:2] == (Edge(0, 2, 0, F), Edge(1, 2, 1, F))
    assert _ids(pipe, plan) == [["web", "shop", "union-1"], ["totals", "sink_out"]]
    # The union's records: the columns, the arrival position and the input's index in the union as a sub-position.
    assert plan.schemas[2] == EVENTS.append(pa.field(SEQ, pa.int64())).append(pa.field("_seq_1", pa.int64()))
    assert plan.source_keys == {0: {"user": "totals"}, 1: {"user": "totals"}}  # checked at both sources


def test_a_broadcast_process_gets_the_keyed_side_by_key_group_and_the_broadcast_side_everywhere() -> None:
    class Limits(bf.KeyedBroadcastProcessFunction):
        output_schema = pa.schema([("user", pa.string()), ("over", pa.bool_())])
        spent = bf.ValueStateDescriptor("spent", pa.int64())

        def process_element(self, record: dict[str, Any], ctx: Any, out: Any) -> None: ...

        def process_broadcast_element(self, record: dict[str, Any], ctx: Any, out: Any) -> None: ...

    def body(p: bf.PipelineBuilder) -> None:
        rules = p.source(_source("rules", RULES))
        events = p.source(_source("events"))
        events.key_by("user").connect(rules.broadcast(DICT)).process("limits", Limits()).sink_to(bf.DeltaSink.append("alerts"))

    pipe, plan = _plan(body)
    assert [n.operator_id for n in pipe.nodes] == ["rules", "events", "limits", "sink_alerts"]
    assert plan.inputs[2] == (1, 0)  # the keyed side first
    assert plan.edges[:2] == (Edge(1, 2, 0, K, ("user",)), Edge(0, 2, 1, B))
    assert _ids(pipe, plan) == [["rules", "events"], ["limits", "sink_alerts"]]
    assert plan.schemas[2] == Limits.output_schema
    specs = {s.name: s for s in plan.state_specs[2]}
    assert set(specs) == {"spent", "limits"}
    assert [f.type for f in specs["spent"].key_fields] == [pa.string()]  # keyed by the user, typed
    assert [(f.name, f.type) for f in specs["limits"].key_fields] == [("map_key", pa.string())]  # the broadcast map
    assert pipe.nodes[2].broadcast_state_names == ("limits",)  # read whole by every task


def test_an_operator_state_process_is_a_singleton_of_its_stage() -> None:
    class Buffer(bf.ProcessFunction):
        output_schema = pa.schema([("id", pa.string())])
        pending = bf.ListStateDescriptor("pending", pa.string())

        def process_element(self, record: dict[str, Any], ctx: Any, out: Any) -> None: ...

    def body(p: bf.PipelineBuilder) -> None:
        p.source(_source("events")).filter("amount > 0").process("buffer", Buffer()).sink_to(bf.DeltaSink.append("out"))

    pipe, plan = _plan(body)
    assert [n.operator_id for n in pipe.nodes] == ["events", "filter-1", "buffer", "sink_out"]
    assert plan.edges == (Edge(0, 1, 0, F), Edge(1, 2, 0, G), Edge(2, 3, 0, F))
    assert _ids(pipe, plan) == [["events", "filter-1"], ["buffer", "sink_out"]]
    assert plan.singletons == {2}  # every record in one task: one arrival order, one round-robin over its subtasks
    (spec,) = plan.state_specs[2]
    assert (spec.table_name, [f.name for f in spec.value_fields]) == ("buffer__pending", ["value", "parallelism"])


@pytest.mark.parametrize(
    "body, match",
    [
        (
            lambda p: p.source(_source("events")).key_by("customer").aggregate("totals", n=bf.Count()),
            r"'totals' is keyed by 'customer', which its input does not have \(columns: \['id', 'user', 'amount', 'ts'\]\)",
        ),
        (
            lambda p: p.source(_source("events")).deduplicate("dedup", key="missing"),
            r"'dedup' is keyed by 'missing', which its input does not have",
        ),
        (
            lambda p: p.source(_source("events")).map(tags="split(user, '-')").key_by("tags").aggregate("by_tags", n=bf.Count()),
            r"'by_tags' is keyed by 'tags' of type list<.*>; a key column is a boolean, integer, float, string",
        ),
        (
            lambda p: p.source(_source("events")).key_by("user").aggregate("totals", total=bf.Sum("id")),
            r"totals: Sum\('id'\) needs a numeric column \(found: string\)",
        ),
        (
            lambda p: p.source(_source("events")).union(p.source(_source("other", RULES))).deduplicate("d", key="rule"),
            r"union 'union-1': input 2 does not have input 1's columns",
        ),
        (
            lambda p: p.source(_source("events")).with_watermark("user", timedelta(0)),
            r"watermark 'watermark_user': its event-time column 'user' must be a timestamp \(found: string",
        ),
    ],
    ids=[
        "key column missing",
        "dedup key missing",
        "key of a list type",
        "sum of a string",
        "union of other columns",
        "watermark of a string",
    ],
)
def test_a_pipeline_that_cannot_run_fails_at_planning_naming_the_operator(
    body: Callable[[bf.PipelineBuilder], Any], match: str
) -> None:
    @bf.pipeline("broken")
    def definition(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
        body(p)

    with pytest.raises(bf.PipelineDefinitionError, match=match):
        _physical(definition.build({}))
