"""The union kernel: every input's records, in the first input's columns, positions refined by the input's index."""

from __future__ import annotations

import pyarrow as pa
import pytest

from barrierflow.core.arrow import in_arrival_order
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.union import Union
from harness import run_both, upstream

A = pa.schema([("k", pa.string()), ("v", pa.int64(), False), ("_seq", pa.int64())])
B = pa.schema([("v", pa.int64()), ("k", pa.string()), ("_seq", pa.int64()), ("_seq_1", pa.int64())])


def _union(inputs: int = 2) -> Union:
    return Union(operator_id="u", parent=upstream("a"), others=tuple(upstream(f"o{i}") for i in range(inputs - 1)))


def test_the_output_has_the_first_input_s_columns_and_a_sub_position_for_the_input() -> None:
    schema = _union().output_schema([A, B])
    assert schema.names == ["k", "v", "_seq", "_seq_1", "_seq_2"]
    assert schema.field("v").nullable  # nullable on one input: nullable
    assert all(schema.field(c).type == pa.int64() for c in ("_seq", "_seq_1", "_seq_2"))


def test_records_keep_their_positions_refined_by_the_input_and_order_by_source_then_input() -> None:
    a = pa.Table.from_pylist([{"k": "x", "v": 1, "_seq": 20}, {"k": "y", "v": 2, "_seq": 10}], schema=A)
    b = pa.Table.from_pylist([{"v": 3, "k": "z", "_seq": 10, "_seq_1": 1}, {"v": 4, "k": "x", "_seq": 5, "_seq_1": 0}], schema=B)
    run = run_both(_union(), [a, b])
    assert run.output.schema == _union().output_schema([A, B])
    assert in_arrival_order(run.output).to_pylist() == [
        {"k": "x", "v": 4, "_seq": 5, "_seq_1": 0, "_seq_2": 1},
        {"k": "y", "v": 2, "_seq": 10, "_seq_1": 0, "_seq_2": 0},  # a's own record: sub-position 0, input 0
        {"k": "z", "v": 3, "_seq": 10, "_seq_1": 1, "_seq_2": 1},
        {"k": "x", "v": 1, "_seq": 20, "_seq_1": 0, "_seq_2": 0},
    ]


def test_a_stream_unioned_with_itself_orders_its_copies_by_input() -> None:
    a = pa.Table.from_pylist([{"k": "x", "v": 1, "_seq": 7}], schema=A)
    run = run_both(_union(3), [a, a, a])
    assert run.output.to_pylist() == [{"k": "x", "v": 1, "_seq": 7, "_seq_1": i} for i in range(3)]


def test_without_positions_on_some_input_the_output_carries_none() -> None:
    a = pa.Table.from_pylist([{"k": "x", "v": 1, "_seq": 7}], schema=A)
    unordered = pa.Table.from_pylist([{"k": "y", "v": 2}], schema=pa.schema([("k", pa.string()), ("v", pa.int64())]))
    run = run_both(_union(), [a, unordered])
    assert run.output.schema.names == ["k", "v"]
    assert sorted(run.output.column("k").to_pylist()) == ["x", "y"]


@pytest.mark.parametrize(
    ("other", "problems"),
    [
        (pa.schema([("k", pa.string()), ("_seq", pa.int64())]), r"missing \['v'\]"),
        (pa.schema([("k", pa.string()), ("v", pa.int64()), ("w", pa.int64()), ("_seq", pa.int64())]), r"extra \['w'\]"),
        (pa.schema([("k", pa.int32()), ("v", pa.int64()), ("_seq", pa.int64())]), "k is int32, not string"),
    ],
)
def test_inputs_with_other_columns_are_refused_when_planned_naming_them(other: pa.Schema, problems: str) -> None:
    with pytest.raises(
        PipelineDefinitionError, match=rf"union 'u': input 3 does not have input 1's columns \({problems}\); every input"
    ):
        _union(3).output_schema([A, A, other])
