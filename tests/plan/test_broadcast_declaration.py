"""Broadcast state without Spark: the declaration's checks and the broadcast side's state changes."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

import barrierflow as bf
from barrierflow.core.errors import PipelineDefinitionError, UserFunctionError
from barrierflow.operators.broadcast import _changes, _spec
from barrierflow.operators.process import KeyedContext

EVENTS = pa.schema([pa.field("k", pa.string()), pa.field("v", pa.float64())])
RULES = bf.MapStateDescriptor("rules", pa.string(), pa.float64())


class Flag(bf.KeyedBroadcastProcessFunction):
    seen = bf.ValueStateDescriptor("seen", pa.int64())
    output_schema = pa.schema([("k", pa.string())])


class Plain(bf.KeyedProcessFunction):
    output_schema = pa.schema([("k", pa.string())])


def _build(function: Any, *descriptors: Any) -> None:
    @bf.pipeline("flags", params=[bf.Param("landing_dir", str)])
    def flags(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
        events = p.source(bf.FileSource("events", params["landing_dir"], schema=EVENTS))
        rules = p.source(bf.FileSource("rules", params["landing_dir"], schema=EVENTS))
        events.key_by("k").connect(rules.broadcast(*descriptors)).process("flag", function).sink_to(bf.DeltaSink.append("out"))

    flags.build({"landing_dir": "/unused"})


def test_a_broadcast_needs_map_states_with_names_of_their_own_and_a_broadcast_function() -> None:
    _build(Flag(), RULES)
    with pytest.raises(PipelineDefinitionError, match="is broadcast with MapStateDescriptors"):
        _build(Flag(), bf.ValueStateDescriptor("rules", pa.float64()))
    with pytest.raises(PipelineDefinitionError, match="is broadcast with MapStateDescriptors"):
        _build(Flag())
    with pytest.raises(PipelineDefinitionError, match=r"state name\(s\) \['seen'\] are used twice"):
        _build(Flag(), bf.MapStateDescriptor("seen", pa.string(), pa.float64()))
    with pytest.raises(PipelineDefinitionError, match="a KeyedBroadcastProcessFunction .* is required, got a Plain"):
        _build(Plain(), RULES)


def test_the_keyed_side_reads_only_broadcast_states_it_was_given() -> None:
    ctx = KeyedContext(("a",), 1, 0, {}, broadcast={})
    with pytest.raises(PipelineDefinitionError, match=r"broadcast state 'rules' is not one .* \(broadcast here: none\)"):
        ctx.get_broadcast_state(RULES)


def test_the_broadcast_side_stages_puts_changes_and_removals_and_refuses_a_null_key() -> None:
    staged: list[pa.Table] = []
    spec = _spec("flag", RULES)
    staged.append(_changes(spec, {"a": 1.0, "b": 2.0, "c": 3.0}, {"a": 1.0, "b": 9.0, "d": 4.0}, processing_time_ms=5, epoch=3))
    rows = sorted(staged[0].select(["map_key", "map_value", "_deleted", "_epoch"]).to_pylist(), key=lambda r: r["map_key"])
    assert rows == [
        {"map_key": "b", "map_value": 9.0, "_deleted": False, "_epoch": 3},
        {"map_key": "c", "map_value": None, "_deleted": True, "_epoch": 3},
        {"map_key": "d", "map_value": 4.0, "_deleted": False, "_epoch": 3},
    ]
    staged.append(_changes(spec, {"a": 1.0}, {"a": 1.0}, processing_time_ms=5, epoch=3))
    assert staged[1].num_rows == 0  # nothing changed: staged empty, so the epoch's cut still names the table
    with pytest.raises(UserFunctionError, match="put a null key"):
        _changes(spec, {}, {None: 1.0}, processing_time_ms=5, epoch=3)
    with pytest.raises(UserFunctionError, match=r"does not fit its declared types \(string -> double\)"):
        _changes(spec, {}, {"a": "not a number"}, processing_time_ms=5, epoch=3)
