"""The stream API at definition time, without Spark: stateless operators, keyword aggregations, process-function state."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable

import pyarrow as pa
import pytest

import barrierflow as bf
from barrierflow.core.columns import KEY_GROUP
from barrierflow.core.keys import key_groups
from barrierflow.operators.aggregate import RunningAggregate
from barrierflow.operators.key_check import split_computed_keys
from barrierflow.operators.process import KeyedProcess
from harness import run_kernel

SCHEMA = pa.schema([("k", pa.string()), ("ts", pa.timestamp("us", tz="UTC")), ("v", pa.float64()), ("w", pa.float64())])
OUT = pa.schema([("k", pa.string()), ("x", pa.float64())])


def _ident(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch


def build(body: Callable[[bf.DataStream], None]) -> bf.Pipeline:
    @bf.pipeline("api_pipe")
    def definition(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
        body(p.source(bf.FileSource("events", "/nonexistent", schema=SCHEMA)))

    return definition.build({})


# -- stateless operators: ids ---------------------------------------------------------------------


def test_stateless_operators_get_deterministic_ids_of_their_kind() -> None:
    def body(s: bf.DataStream) -> None:
        (s.filter("v > 0").select("k", "v").map(x="v * 2").filter(lambda b: pa.array([True] * b.num_rows))
          .flat_map(part="split(k, '-')").map(_ident, schema=OUT).sink_to(bf.DeltaSink.append("out")))  # fmt: skip

    first, second = build(body), build(body)
    ids = ["events", "filter-1", "select-1", "map-1", "filter-2", "flat_map-1", "map-2", "sink_out"]
    assert first.operator_ids() == second.operator_ids() == ids
    assert [type(n).__name__ for n in first.nodes[1:-1]] == [
        "Filter", "Select", "MapColumns", "Filter", "FlatMapColumn", "MapFunction"
    ]  # fmt: skip


def test_inserting_a_stateless_operator_leaves_stateful_identities_alone() -> None:
    def plain(s: bf.DataStream) -> None:
        s.deduplicate("dedup", key="k").key_by("k").aggregate("totals", n=bf.Count()).sink_to(bf.DeltaSink.append("out"))

    def filtered(s: bf.DataStream) -> None:
        s.filter("v > 0").deduplicate("dedup", key="k").map(w="v + 1").key_by("k").aggregate("totals", n=bf.Count()).sink_to(
            bf.DeltaSink.append("out")
        )

    specs = [{(s.operator_id, s.name): s.arrow_schema() for s in build(b).state_specs()} for b in (plain, filtered)]
    assert specs[0] == specs[1] and set(specs[0]) == {("events", "offsets"), ("dedup", "seen"), ("totals", "accumulators")}


def test_a_stateless_operator_may_be_given_an_id_and_ids_stay_unique() -> None:
    pipe = build(lambda s: s.filter("v > 0", operator_id="positive").sink_to(bf.DeltaSink.append("out")))
    assert pipe.operator_ids() == ["events", "positive", "sink_out"]
    with pytest.raises(bf.PipelineDefinitionError, match="duplicate operator id 'positive'"):
        build(lambda s: s.filter("v > 0", operator_id="positive").filter("v < 9", operator_id="positive"))
    with pytest.raises(bf.PipelineDefinitionError, match="lower_snake_case"):
        build(lambda s: s.filter("v > 0", operator_id="filter-1"))  # the generated form is not a user id


# -- stateless operators: what is refused when declaring --------------------------------------------


@pytest.mark.parametrize(
    "body, match",
    [
        (lambda s: s.filter(42), "42 is neither a column expression"),
        (lambda s: s.filter("  "), "is not a column expression"),
        (lambda s: s.select(), "select needs at least one column"),
        (lambda s: s.map(), "map needs a function and schema="),
        (lambda s: s.map(_ident), "needs schema=, a pyarrow.Schema"),
        (lambda s: s.map(_ident, schema={"x": "double"}), "schema must be a pyarrow.Schema"),
        (lambda s: s.map(_ident, schema=pa.schema([])), "schema declares no column"),
        (lambda s: s.map(_ident, schema=pa.schema([("_seq", pa.int64())])), "columns starting with _ are the engine's"),
        (lambda s: s.map(_ident, schema=pa.schema([("a", pa.int64()), ("a", pa.string())])), r"schema names \['a'\] more"),
        (lambda s: s.map(_ident, schema=OUT, x="v"), "a function or columns, not both"),
        (lambda s: s.map(_seq="v"), "columns starting with _ are the engine's"),
        (lambda s: s.map(x="v", schema=OUT), "schema= is for a Python function"),
        (lambda s: s.map("not callable", schema=OUT), "is not callable"),
        (lambda s: s.flat_map(_ident), "flat_map with a Python function needs schema="),
        (lambda s: s.flat_map(a="x", b="y"), "exactly one column as a keyword"),
        (lambda s: s.flat_map(_ident, schema=OUT, a="x"), r"flat_map: give a function or columns, not both \(columns \['a'\]\)"),
    ],
)
def test_stateless_operators_refuse_what_cannot_work(body: Callable[[bf.DataStream], Any], match: str) -> None:
    with pytest.raises(bf.PipelineDefinitionError, match=match):
        build(body)


# -- graph helpers ------------------------------------------------------------------------------------


def test_keys_checked_at_the_source_pass_through_operators_that_do_not_compute_them() -> None:
    def body(s: bf.DataStream) -> None:
        s.filter("v > 0").select("*").map(x="v").key_by("k").aggregate("by_k", n=bf.Count())
        s.map(k="upper(k)").key_by("k").aggregate("by_upper", n=bf.Count())  # k computed: not the source's
        s.select("k", "v").flat_map(part="split(k, '-')").key_by("part", "k").aggregate("by_part", n=bf.Count())
        s.map(_ident, schema=OUT).key_by("x").aggregate("by_x", n=bf.Count())

    pipe = build(body)
    assert pipe.source_keys(pipe.sources[0]) == {"k": "by_k"}


def test_keys_no_source_checked_are_checked_before_their_keyed_operator() -> None:
    def body(s: bf.DataStream) -> None:
        s.filter("v > 0").select("*").map(x="v").key_by("k").aggregate("by_k", n=bf.Count())  # checked at the source
        s.map(k="upper(k)").filter("v > 0").key_by("k").aggregate("by_upper", n=bf.Count())
        s.select("k", "v").flat_map(part="split(k, '-')").key_by("part", "k").aggregate("by_part", n=bf.Count())
        s.map(_ident, schema=OUT).key_by("x").aggregate("by_x", n=bf.Count())
        totals = s.key_by("k").aggregate("totals", n=bf.Count())
        totals.key_by("k").aggregate("again", m=bf.Count())  # a keyed operator's own key column: checked before it
        totals.key_by("n").aggregate("by_n", m=bf.Count())  # any other column of its output: not
        s.map(_ident, schema=OUT).union(s.select("k", "x")).deduplicate("dedup", key="k")  # computed on one path

    pipe = build(body)
    computed = {n.operator_id: pipe.computed_keys(n) for n in pipe.nodes if pipe.computed_keys(n)}
    assert computed == {
        "by_upper": [(0, "k", "map-2")],
        "by_part": [(0, "part", "flat_map-1")],
        "by_x": [(0, "x", "map-3")],
        "by_n": [(0, "n", "totals")],
        "dedup": [(0, "k", "map-4")],
    }


def test_computed_key_problems_name_the_key_the_operator_and_what_computed_it() -> None:
    # A row per problem: topic null; topic empty; n null (an integer key: never "empty"); and a good row (n = 0).
    rows = pa.table({"topic": [None, "", "a", "b"], "n": pa.array([1, 2, None, 0], pa.int64())})
    good, dead = split_computed_keys(rows, "totals", [("topic", "map-1"), ("n", "select-2")], [], {})
    problems = [f"{r['reason']}: {r['detail']}" for r in dead.to_pylist()]
    assert problems == [
        "null_key: key topic of operator totals is missing or null (computed by map-1)",
        "empty_key: key topic of operator totals is empty (computed by map-1)",
        "null_key: key n of operator totals is missing or null (computed by select-2)",
    ]
    assert good.to_pylist() == [{"topic": "b", "n": 0}]


# -- keyword aggregations -------------------------------------------------------------------------


def _aggregate(pipe: bf.Pipeline) -> RunningAggregate:
    return next(n for n in pipe.nodes if isinstance(n, RunningAggregate))


def test_aggregations_are_named_by_keyword_after_positional_ones() -> None:
    pipe = build(
        lambda s: s.key_by("k").aggregate("totals", bf.Count(), total_v=bf.Sum("v"), total_w=bf.Sum("w"), mean_v=bf.Avg("v"))
    )
    node = _aggregate(pipe)
    assert [(a.name, a.column) for a in node.aggregations] == [
        ("count", None),
        ("total_v", "v"),
        ("total_w", "w"),
        ("mean_v", "v"),
    ]
    # Avg("v") shares Sum("v")'s accumulator; the count comes first in every state row.
    assert [f.name for f in node.state_specs()[0].value_fields] == ["count", "sum_v", "sum_w"]


def test_positional_names_keep_the_columns_and_state_of_existing_pipelines() -> None:
    positional = _aggregate(build(lambda s: s.key_by("k").aggregate("t", bf.Count(), bf.Sum("v", "sum"), bf.Max("v", "max"))))
    keyword = _aggregate(build(lambda s: s.key_by("k").aggregate("t", count=bf.Count(), sum=bf.Sum("v"), max=bf.Max("v"))))
    assert positional.aggregations == keyword.aggregations
    assert positional.state_specs()[0].arrow_schema() == keyword.state_specs()[0].arrow_schema()


@pytest.mark.parametrize(
    "aggregations, named, match",
    [
        ((bf.Sum("v"), bf.Sum("w")), {}, r"output column\(s\) \['sum'\] named more than once; name each aggregation by keyword"),
        ((bf.Sum("v", "x"),), {"x": bf.Count()}, r"\['x'\] named more than once"),
        ((), {"k": bf.Count()}, r"\['k'\] are not allowed"),
        ((), {"_n": bf.Count()}, r"\['_n'\] are not allowed: a name must not be empty, start with _"),
        ((), {}, "no aggregation given"),
        (("v",), {}, "'v' is not an aggregation"),
        ((), {"p": bf.Percentile("v", q=0.5)}, "running aggregates support Count, Sum, Min, Max, Avg; got Percentile"),
    ],
)
def test_aggregate_refuses_ambiguous_or_unknown_outputs(aggregations: tuple[Any, ...], named: dict[str, Any], match: str) -> None:
    with pytest.raises(bf.PipelineDefinitionError, match=match):
        build(lambda s: s.key_by("k").aggregate("totals", *aggregations, **named))


def test_window_aggregations_are_named_by_keyword_too() -> None:
    assigner = bf.TumblingEventTimeWindows.of(timedelta(minutes=1), "ts")

    def body(s: bf.DataStream) -> None:
        s.with_watermark("ts", timedelta(seconds=5)).key_by("k").window(
            "minute", assigner, n=bf.Count(), p90=bf.Percentile("v", q=0.9), late_output="late"
        ).sink_to(bf.DeltaSink.append("out"))

    window = build(body).nodes[2]
    assert [a.name for a in window.aggregations] == ["n", "p90"] and window.side_outputs() == ["late"]
    with pytest.raises(bf.PipelineDefinitionError, match=r"\['window_end'\] are not allowed"):
        build(lambda s: s.with_watermark("ts", timedelta(0)).key_by("k").window("w", assigner, window_end=bf.Count()))


def test_the_heap_merge_keeps_two_sums_apart() -> None:
    """Two named sums of two columns: one accumulator each, merged and emitted under their own names."""
    node = _aggregate(build(lambda s: s.key_by("k").aggregate("t", a=bf.Sum("v"), b=bf.Sum("w"), m=bf.Avg("w"), lo=bf.Min("v"))))
    # x: two records (v 1 + 2 = 3, w 4 + 6 = 10, least v 1); y: one record whose w (1e25) no exact method sums.
    records = pa.table({
        "k": ["x", "y", "x"], "ts": pa.array([None] * 3, SCHEMA.field("ts").type),
        "v": [1.0, 1.0, 2.0], "w": [4.0, 1e25, 6.0],
    })  # fmt: skip
    (spec,) = node.state_specs([records.schema])
    prior = pa.table({
        "k": ["x"], KEY_GROUP: key_groups(pa.table({"k": ["x"]}), 8), "count": pa.array([1], pa.int64()), "sum_v": [0.5],
        "sum_w": [2.0], "min_v": [0.25], "_updated_at_ms": pa.array([0], pa.int64()), "_deleted": [False],
        "_epoch": pa.array([1], pa.int64()),
    }).cast(spec.arrow_schema())  # fmt: skip
    run = run_kernel(node, [records], state={spec.table_name: prior}, epoch=2, processing_time_ms=7)
    rows = {r["k"]: r for r in run.changes[spec.table_name].to_pylist()}
    assert (rows["x"]["count"], rows["x"]["sum_v"], rows["x"]["sum_w"], rows["x"]["min_v"]) == (3, 3.5, 12.0, 0.25)
    assert (rows["y"]["count"], rows["y"]["sum_w"]) == (1, 1e25)  # summed by the fallback, in the same epoch
    out = {r["k"]: r for r in run.output.to_pylist()}
    assert out["x"] == {"k": "x", "a": 3.5, "b": 12.0, "m": 4.0, "lo": 0.25}


# -- process functions: state from class attributes ------------------------------------------------


class Totals(bf.KeyedProcessFunction):
    total = bf.ValueStateDescriptor("total", pa.int64())
    seen = bf.ListStateDescriptor("seen_pages", pa.string())
    output_schema = OUT


def test_state_is_collected_from_class_attributes() -> None:
    assert Totals.state_descriptors == (Totals.total, Totals.seen)
    node = build(lambda s: s.key_by("k").process("totals", Totals())).nodes[-1]
    assert isinstance(node, KeyedProcess)
    assert [(s.operator_id, s.name) for s in node.state_specs()] == [("totals", "total"), ("totals", "seen_pages")]


def test_the_tuple_is_still_read_and_may_repeat_the_attributes() -> None:
    extra = bf.MapStateDescriptor("extra", pa.string(), pa.int64())

    class Both(bf.KeyedProcessFunction):
        total = bf.ValueStateDescriptor("total", pa.int64())
        state_descriptors = (extra, total)

    class Inherited(Both):
        more = bf.ValueStateDescriptor("more", pa.string())

    assert [d.name for d in Both.state_descriptors] == ["extra", "total"]
    assert [d.name for d in Inherited.state_descriptors] == ["total", "more", "extra"]


def test_one_state_name_declared_twice_differently_is_refused() -> None:
    with pytest.raises(
        bf.PipelineDefinitionError,
        match=r"state 'total' is declared twice, differently \(attribute a: value<int64>, attribute b: value<double>\)",
    ):

        class Twice(bf.KeyedProcessFunction):
            a = bf.ValueStateDescriptor("total", pa.int64())
            b = bf.ValueStateDescriptor("total", pa.float64())

    with pytest.raises(
        bf.PipelineDefinitionError, match=r"state_descriptors\[0\]: list<list<item: string>>, attribute total: value<int64>"
    ):

        class Mismatched(bf.KeyedProcessFunction):
            total = bf.ValueStateDescriptor("total", pa.int64())
            state_descriptors = (bf.ListStateDescriptor("total", pa.string()),)

    with pytest.raises(bf.PipelineDefinitionError, match="give StateDescriptor objects"):

        class NotDescriptors(bf.KeyedProcessFunction):
            state_descriptors = ("total",)  # type: ignore[assignment]


def test_state_not_declared_says_how_to_declare_it() -> None:
    ctx = bf.KeyedContext(("k",), 1, 0, {})
    with pytest.raises(
        bf.PipelineDefinitionError, match=r"declare it as a class attribute, e.g. gone = ValueStateDescriptor\('gone', ...\)"
    ):
        ctx.get_state(bf.ValueStateDescriptor("gone", pa.int64()))


def test_sinks_drop_the_sub_positions_flat_maps_add() -> None:
    """They order records within an epoch; kept, adding a flat_map upstream would change the sink table's schema."""
    from barrierflow.connectors import SinkNode

    rows = pa.table({"w": ["a"], "_seq": [7], "_seq_1": [0], "_seq_2": [1]})
    node = SinkNode(operator_id="sink_out", parent=None, sink=bf.DeltaSink.append("out"))
    staged = [t.column_names for t in run_kernel(node, [rows]).emitted.values()]
    assert staged == [["w", "_seq"]]
    assert node.side_output_schemas([rows.schema])["out"].names == ["w", "_seq"]  # what the planner registers
