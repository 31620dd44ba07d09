"""Operator list state without Spark: redistribution (rule 5 of ``barrierflow.operators.operator_state``), its rows, its declaration."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

import barrierflow as bf
from barrierflow.api.keyed_state import ListState
from barrierflow.core.errors import CheckpointError, UserFunctionError
from barrierflow.operators.base import MAX_DRIVER_STATE_ELEMENTS, check_driver_state_size
from barrierflow.operators.operator_state import (
    OperatorContext,
    offsets_lists,
    offsets_rows,
    operator_state_spec,
    redistribute,
    restored_offsets,
    source_offsets_spec,
    state_rows,
    stored_lists,
)

PENDING = bf.ListStateDescriptor("pending", pa.string())
SEEN = bf.ListStateDescriptor("seen", pa.int64(), redistribution="union")


def test_one_subtask_split_evenly_into_three_gives_the_first_ones_the_extra_elements() -> None:
    assert redistribute([[1, 2, 3, 4, 5, 6, 7]], 3, "even_split") == [[1, 2, 3], [4, 5], [6, 7]]


def test_three_subtasks_into_two_concatenate_in_subtask_order_then_split_contiguously() -> None:
    assert redistribute([[1, 2], [], [3, 4, 5]], 2, "even_split") == [[1, 2, 3], [4, 5]]
    assert redistribute([["a"], ["b", "c"], ["d", "e", "f", "g"]], 2, "even_split") == [["a", "b", "c", "d"], ["e", "f", "g"]]


def test_fewer_elements_than_subtasks_leave_the_last_subtasks_empty() -> None:
    assert redistribute([[1], [2]], 4, "even_split") == [[1], [2], [], []]
    assert redistribute([[], []], 3, "even_split") == [[], [], []]


def test_union_gives_every_new_subtask_the_whole_concatenation() -> None:
    assert redistribute([[1, 2], [3]], 3, "union") == [[1, 2, 3], [1, 2, 3], [1, 2, 3]]
    assert redistribute([[1], [], [2, 3]], 2, "union") == [[1, 2, 3], [1, 2, 3]]
    assert redistribute([[1, 2, 3, 4]], 1, "union") == [[1, 2, 3, 4]]


def test_an_unchanged_parallelism_moves_nothing_even_for_union_state() -> None:
    assert redistribute([[1, 2, 3], [4]], 2, "even_split") == [[1, 2, 3], [4]]
    assert redistribute([[1, 2, 3], [4]], 2, "union") == [[1, 2, 3], [4]]


def _rows(lists: list[list[Any]]) -> pa.Table:
    spec = operator_state_spec("op", PENDING)
    rows = [
        {"subtask": s, "position": p, "value": v, "parallelism": len(lists), "_key_group": 0, "_updated_at_ms": 0, "_deleted": False, "_epoch": 1}
        for s, values in enumerate(lists)
        for p, v in enumerate(values)
    ]
    return pa.Table.from_pylist(rows, schema=spec.arrow_schema())


def test_the_table_is_read_back_as_the_lists_it_was_written_for() -> None:
    assert stored_lists(_rows([["a", "b"], [], ["c"]]), 5) == [["a", "b"], [], ["c"]]
    assert stored_lists(_rows([]), 2) == [[], []]  # nothing stored: the current parallelism's empty lists


def test_an_epoch_writes_the_changed_positions_and_tombstones_those_past_a_lists_end() -> None:
    before = _rows([["a", "b", "c"], ["d"]])
    assert state_rows(before, [["a", "x"], ["d", "e"]]) == [
        {"subtask": 0, "position": 1, "value": "x", "parallelism": 2, "_deleted": False},
        {"subtask": 1, "position": 1, "value": "e", "parallelism": 2, "_deleted": False},
        {"subtask": 0, "position": 2, "value": None, "parallelism": None, "_deleted": True},
    ]


def test_a_rescale_rewrites_every_row_for_the_new_parallelism() -> None:
    before = _rows([["a", "b"], ["c"]])
    after = redistribute(stored_lists(before, 3), 3, "even_split")
    assert after == [["a"], ["b"], ["c"]]
    assert state_rows(before, after) == [
        {"subtask": 0, "position": 0, "value": "a", "parallelism": 3, "_deleted": False},
        {"subtask": 1, "position": 0, "value": "b", "parallelism": 3, "_deleted": False},
        {"subtask": 2, "position": 0, "value": "c", "parallelism": 3, "_deleted": False},
        {"subtask": 0, "position": 1, "value": None, "parallelism": None, "_deleted": True},
    ]


def test_the_state_table_has_subtask_and_position_as_its_key() -> None:
    spec = operator_state_spec("batches", SEEN)
    assert spec.table_name == "batches__seen"
    assert spec.arrow_schema().names == ["subtask", "position", "_key_group", "value", "parallelism", "_updated_at_ms", "_deleted", "_epoch"]
    assert spec.arrow_schema().field("value").type == pa.int64()


def test_each_accessor_gives_only_states_of_its_redistribution() -> None:
    ctx = OperatorContext(1, 3, 7, 0, {"pending": ListState(PENDING, None), "seen": ListState(SEEN, [4])})
    assert ctx.get_list_state(PENDING).get() == []
    assert ctx.get_union_list_state(SEEN).get() == [4]
    with pytest.raises(bf.PipelineDefinitionError, match="get_union_list_state"):
        ctx.get_list_state(SEEN)
    with pytest.raises(bf.PipelineDefinitionError, match="get_list_state"):
        ctx.get_union_list_state(PENDING)
    with pytest.raises(bf.PipelineDefinitionError, match="not declared"):
        ctx.get_list_state(bf.ListStateDescriptor("other", pa.int64()))


class _Buffer(bf.ProcessFunction):
    pending = PENDING
    seen = SEEN
    output_schema = pa.schema([("id", pa.string())])


def _build(fn: Any, keyed: bool = False) -> None:
    @bf.pipeline("opstate")
    def p(b: bf.PipelineBuilder, params: dict[str, Any]) -> None:
        s = b.source(bf.FileSource("events", "/tmp/none", schema=pa.schema([("id", pa.string())])))
        (s.key_by("id") if keyed else s).process("buffer", fn)

    p.build({})


def test_a_process_function_declares_list_states_only_and_runs_on_a_stream_that_is_not_keyed() -> None:
    assert [d.name for d in _Buffer.state_descriptors] == ["pending", "seen"]
    _build(_Buffer())

    class Valued(bf.ProcessFunction):
        total = bf.ValueStateDescriptor("total", pa.int64())

    with pytest.raises(bf.PipelineDefinitionError, match="not list states"):
        _build(Valued())
    with pytest.raises(bf.PipelineDefinitionError, match="KeyedProcessFunction runs on a keyed stream"):
        _build(object())
    with pytest.raises(bf.PipelineDefinitionError, match="KeyedProcessFunction"):
        _build(_Buffer(), keyed=True)


def test_redistribution_is_for_operator_state_only() -> None:
    with pytest.raises(bf.PipelineDefinitionError, match="not one of"):
        bf.ListStateDescriptor("x", pa.int64(), redistribution="round_robin")

    class KeyedUnion(bf.KeyedProcessFunction):
        seen = SEEN

    with pytest.raises(bf.PipelineDefinitionError, match="only operator state has"):
        _build(KeyedUnion(), keyed=True)


def test_a_subtask_handles_its_records_in_arrival_order_and_returns_its_changed_lists() -> None:
    from barrierflow.operators.operator_state import _run_subtask

    class Collect(bf.ProcessFunction):
        pending = PENDING
        output_schema = pa.schema([("ids", pa.string()), ("subtask", pa.int32())])

        def process_element(self, record: dict[str, Any], ctx: OperatorContext, out: Any) -> None:
            state = ctx.get_list_state(self.pending)
            state.add(record["id"])
            if len(state.get()) == 3:
                out({"ids": ",".join(state.get()), "subtask": ctx.subtask_index})
                state.clear()

    schema = pa.schema(
        [("_kind", pa.string()), ("_subtask", pa.int32()), ("state_pending", pa.list_(pa.string())),
         ("_out_ids", pa.string()), ("_out_subtask", pa.int32())]
    )  # fmt: skip
    records = pa.table({"id": ["c", "a", "d", "b"], "_seq": [5, 1, 7, 3], "_subtask": pa.array([1] * 4, pa.int32())})
    result = _run_subtask(Collect(), {"pending": [["x"], ["y"]]}, 2, 4, 0, schema, records)
    assert result.to_pylist() == [
        {"_kind": "_out", "_subtask": 1, "state_pending": None, "_out_ids": "y,a,b", "_out_subtask": 1},
        {"_kind": "pending", "_subtask": 1, "state_pending": ["c", "d"], "_out_ids": None, "_out_subtask": None},
    ]


def test_a_widened_element_type_restores_as_any_state_column_does() -> None:
    from barrierflow.core.schema_evolution import compare_schemas

    stored = operator_state_spec("op", bf.ListStateDescriptor("n", pa.int32())).arrow_schema()
    declared = operator_state_spec("op", bf.ListStateDescriptor("n", pa.int64())).arrow_schema()
    fixed = [n for n in declared.names if n not in ("value", "parallelism")]
    assert compare_schemas(stored, declared, fixed).restorable


OFFSETS_AT = {"file": "b.jsonl", "line": None, "files": [["b.jsonl", 0, None, 12]], "consumed": 2, "recent": ["a.jsonl", "b.jsonl"]}


def test_a_sources_offsets_are_one_split_snapshotted_by_subtask_zero_and_read_back_as_the_union() -> None:
    """Rule 8: union list state of string elements; the one split in subtask 0, every subtask seeing it after a rescale."""
    spec = source_offsets_spec("readings")
    assert spec.table_name == "readings__offsets" and spec.arrow_schema() == operator_state_spec("readings", bf.ListStateDescriptor("offsets", pa.string())).arrow_schema()
    lists = offsets_lists(OFFSETS_AT, 3)
    assert lists == [['{"consumed": 2, "file": "b.jsonl", "files": [["b.jsonl", 0, null, 12]], "line": null, "recent": ["a.jsonl", "b.jsonl"]}'], [], []]
    table = offsets_rows("readings", OFFSETS_AT, 3, epoch=4, updated_at_ms=9)
    assert table.select(["subtask", "position", "parallelism", "_key_group", "_deleted", "_epoch"]).to_pylist() == [
        {"subtask": 0, "position": 0, "parallelism": 3, "_key_group": 0, "_deleted": False, "_epoch": 4}
    ]
    assert redistribute(stored_lists(table, 2), 2, "union") == [lists[0], lists[0]]  # a rescale: every subtask sees it
    assert restored_offsets("readings", table) == OFFSETS_AT
    assert restored_offsets("readings", spec.arrow_schema().empty_table()) is None  # a source that never ran
    # The next epoch's snapshot at another parallelism rewrites the row for it; the same offsets change nothing else.
    assert state_rows(table, offsets_lists(OFFSETS_AT, 2)) == [
        {"subtask": 0, "position": 0, "value": lists[0][0], "parallelism": 2, "_deleted": False}
    ]
    assert state_rows(table, offsets_lists(OFFSETS_AT, 3)) == []


def test_offsets_state_with_two_different_offsets_for_one_source_is_refused() -> None:
    one = offsets_rows("readings", OFFSETS_AT, 2, epoch=4, updated_at_ms=9)
    other = offsets_rows("readings", {**OFFSETS_AT, "consumed": 3}, 2, epoch=4, updated_at_ms=9)
    both = pa.concat_tables([one, other.set_column(0, "subtask", pa.array([1], pa.int32()))])
    with pytest.raises(CheckpointError, match="source readings: its offsets state holds 2 different offsets"):
        restored_offsets("readings", both)


def test_a_driver_resident_state_past_its_ceiling_fails_naming_it() -> None:
    check_driver_state_size("buffer", "pending", MAX_DRIVER_STATE_ELEMENTS)
    with pytest.raises(UserFunctionError, match=r"operator 'buffer': its state 'pending' would hold 1000001 elements.*key_by"):
        check_driver_state_size("buffer", "pending", MAX_DRIVER_STATE_ELEMENTS + 1)
