"""Union without Spark: the declaration checks, the graph it makes, schema differences and the positions it assigns."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable

import pyarrow as pa
import pytest

import barrierflow as bf
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.union import Union, column_differences, union_positions
from barrierflow.plan.pipeline import Pipeline, PipelineBuilder

SCHEMA = pa.schema([pa.field("k", pa.string()), pa.field("ts", pa.timestamp("us", tz="UTC")), pa.field("v", pa.float64())])


def _build(body: Callable[[PipelineBuilder], None]) -> Pipeline:
    @bf.pipeline("unit_union")
    def definition(p: PipelineBuilder, params: dict[str, Any]) -> None:
        body(p)

    return definition.build({})


def _source(p: PipelineBuilder, name: str) -> bf.DataStream:
    return p.source(bf.FileSource(name, f"/nonexistent/{name}", schema=SCHEMA))


def _node(pipe: Pipeline, operator_id: str) -> Any:
    return next(n for n in pipe.nodes if n.operator_id == operator_id)


def _children(pipe: Pipeline, node: Any) -> list[Any]:
    """The nodes consuming ``node``'s output, once each."""
    return [n for n in pipe.nodes if any(i is node for i in n.inputs())]


def test_a_union_of_two_sources_consumes_both_and_keys_are_checked_at_each() -> None:
    def body(p: PipelineBuilder) -> None:
        a, b, c = _source(p, "a"), _source(p, "b"), _source(p, "c")
        a.filter("v > 0").union(b, c).key_by("k").aggregate("totals", n=bf.Count()).sink_to(bf.DeltaSink.append("out"))

    pipe = _build(body)
    union = _node(pipe, "union-1")
    assert isinstance(union, Union)
    assert [n.operator_id for n in union.inputs()] == ["filter-1", "b", "c"]
    for source in pipe.sources:
        assert _children(pipe, source) == [_node(pipe, "filter-1") if source.operator_id == "a" else union]
        # The key reaches "totals" unchanged from every source: a null key is a dead letter at each.
        assert pipe.source_keys(source) == {"k": "totals"}
    assert union.describe()["inputs"] == ["filter-1", "b", "c"]


def test_a_key_computed_on_one_input_is_not_checked_at_its_source() -> None:
    def body(p: PipelineBuilder) -> None:
        a, b = _source(p, "a"), _source(p, "b")
        a.map(k="upper(k)").union(b).key_by("k").process("proc", bf.KeyedProcessFunction()).sink_to(bf.DeltaSink.append("out"))

    pipe = _build(body)
    a, b = pipe.sources
    assert pipe.source_keys(a) == {}
    assert pipe.source_keys(b) == {"k": "proc"}


def test_a_stream_unioned_with_a_branch_of_itself_is_read_twice() -> None:
    def body(p: PipelineBuilder) -> None:
        a = _source(p, "a")
        a.union(a.filter("v > 0"), operator_id="both").sink_to(bf.DeltaSink.append("out"))

    pipe = _build(body)
    (source,) = pipe.sources
    assert [n.operator_id for n in _children(pipe, source)] == ["filter-1", "both"]
    assert [n.operator_id for n in _node(pipe, "both").inputs()] == ["a", "filter-1"]


def test_the_watermark_is_upstream_of_every_input_or_of_none() -> None:
    def one_side(p: PipelineBuilder) -> None:
        a, b = _source(p, "a"), _source(p, "b")
        a.with_watermark("ts", timedelta(seconds=5)).union(b)

    with pytest.raises(PipelineDefinitionError, match=r"union 'union-1': input\(s\) \[2\] have no watermark upstream.*minimum"):
        _build(one_side)

    def after(p: PipelineBuilder) -> None:
        a, b = _source(p, "a"), _source(p, "b")
        (
            a.union(b)
            .with_watermark("ts", timedelta(seconds=5))
            .key_by("k")
            .window("w", bf.TumblingEventTimeWindows.of(timedelta(minutes=1)), n=bf.Count())
            .sink_to(bf.DeltaSink.append("out"))
        )

    assert [n.operator_id for n in _build(after).nodes][:3] == ["a", "b", "union-1"]

    def shared(p: PipelineBuilder) -> None:
        a = _source(p, "a").with_watermark("ts", timedelta(seconds=5))
        a.filter("v > 0").union(a.filter("v < 0")).sink_to(bf.DeltaSink.append("out"))

    _build(shared)  # both inputs have the one watermark: the minimum is it

    def each(p: PipelineBuilder) -> None:
        a = _source(p, "a").with_watermark("ts", timedelta(seconds=5))
        b = _source(p, "b").with_watermark("ts", timedelta(seconds=1), operator_id="watermark_b")
        a.union(b).key_by("k").window("w", bf.TumblingEventTimeWindows.of(timedelta(minutes=1)), n=bf.Count())

    _build(each)  # an assigner per input: the union's watermark is the minimum of theirs


@pytest.mark.parametrize(
    ("others", "match"),
    [
        ((), "union needs at least one other stream"),
        (("keyed",), "is not a stream of this pipeline.*union first, then key_by"),
        (("foreign",), "is not a stream of this pipeline"),
    ],
)
def test_what_a_union_refuses(others: tuple[str, ...], match: str) -> None:
    foreign = PipelineBuilder("other", 8).source(bf.FileSource("x", "/nonexistent/x", schema=SCHEMA))

    def body(p: PipelineBuilder) -> None:
        a, b = _source(p, "a"), _source(p, "b")
        given = {"keyed": b.key_by("k"), "foreign": foreign}
        a.union(*[given[o] for o in others])  # type: ignore[arg-type]

    with pytest.raises(PipelineDefinitionError, match=match):
        _build(body)


def test_a_given_union_id_must_be_unique() -> None:
    def body(p: PipelineBuilder) -> None:
        _source(p, "a").union(_source(p, "b"), operator_id="a")

    with pytest.raises(PipelineDefinitionError, match="duplicate operator id 'a'"):
        _build(body)


def test_column_differences_name_missing_extra_and_retyped_columns() -> None:
    first = {"k": "string", "ts": "timestamp", "v": "double"}
    assert column_differences(first, {"v": "double", "k": "string", "ts": "timestamp"}) == []  # order does not matter
    assert column_differences(first, {"k": "int", "ts": "timestamp", "w": "double"}) == [
        "missing ['v']",
        "extra ['w']",
        "k is int, not string",
    ]


@pytest.mark.parametrize(
    ("inputs", "positions"),
    [
        ([["k", "_seq"], ["_seq", "k"]], ["_seq", "_seq_1"]),
        # A flat_map's sub-position on one input: the other's is 0, then the input index.
        ([["k", "_seq", "_seq_1"], ["k", "_seq"]], ["_seq", "_seq_1", "_seq_2"]),
        ([["k", "_seq", "_seq_2", "_seq_1"], ["k", "_seq", "_seq_1"]], ["_seq", "_seq_1", "_seq_2", "_seq_3"]),
        # An unordered read left positions out: nobody downstream needs them.
        ([["k", "_seq"], ["k"]], []),
        ([["k"], ["k"]], []),
    ],
)
def test_union_positions_extend_every_input_s_with_the_input_index(inputs: list[list[str]], positions: list[str]) -> None:
    assert union_positions(inputs) == positions
