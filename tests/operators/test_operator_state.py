"""Operator list state: redistribution (rule 5 of ``barrierflow.operators.operator_state``), its rows, its declaration, its kernel.

The first tests are tests/unit/test_operator_state_redistribution.py's (same
assertions; a subtask's run is now checked through ``OperatorProcess.run``).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

import barrierflow as bf
from barrierflow.api.keyed_state import ListState
from barrierflow.core.errors import CheckpointError, UserFunctionError
from barrierflow.core.settings import MAX_HELD_STATE_ELEMENTS
from barrierflow.operators.base import Exchange, check_held_state_size
from barrierflow.operators.operator_state import (
    OperatorContext,
    OperatorProcess,
    offsets_lists,
    offsets_rows,
    operator_state_spec,
    redistribute,
    restored_offsets,
    source_offsets_spec,
    state_rows,
    stored_lists,
)
from harness import live_state, node_specs, run_both, run_kernel, upstream

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
        {
            "subtask": s,
            "position": p,
            "value": v,
            "parallelism": len(lists),
            "_key_group": 0,
            "_updated_at_ms": 0,
            "_deleted": False,
            "_epoch": 1,
        }
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
    assert spec.arrow_schema().names == [
        "subtask",
        "position",
        "_key_group",
        "value",
        "parallelism",
        "_updated_at_ms",
        "_deleted",
        "_epoch",
    ]
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


class Collect(bf.ProcessFunction):
    pending = PENDING
    output_schema = pa.schema([("ids", pa.string()), ("subtask", pa.int32())])

    def process_element(self, record: dict[str, Any], ctx: OperatorContext, out: Any) -> None:
        state = ctx.get_list_state(self.pending)
        state.add(record["id"])
        if len(state.get()) == 3:
            out({"ids": ",".join(state.get()), "subtask": ctx.subtask_index})
            state.clear()


def test_a_subtask_handles_its_records_in_arrival_order_and_returns_its_changed_lists() -> None:
    # Subtask 1 of 2 gets the odd arrivals (a, b, c, d at 1, 3, 5, 7), subtask 0 the even ones; given out of order.
    records = pa.table({"id": ["c", "g", "a", "d", "e", "b", "h", "f"], "_seq": [5, 6, 1, 7, 0, 3, 4, 2]})
    node = OperatorProcess(operator_id="op", parent=upstream(), function=Collect())
    result = run_kernel(node, [records], state={"op__pending": _rows([["x"], ["y"]])}, epoch=4, parallelism=2)
    assert [r for r in result.output.to_pylist() if r["subtask"] == 1] == [{"ids": "y,a,b", "subtask": 1}]
    [spec] = node.state_specs()
    after = stored_lists(live_state(spec, _rows([["x"], ["y"]]), result.changes["op__pending"], epoch=4), 2)
    assert after[1] == ["c", "d"]


def test_a_widened_element_type_restores_as_any_state_column_does() -> None:
    from barrierflow.core.schema_evolution import compare_schemas

    stored = operator_state_spec("op", bf.ListStateDescriptor("n", pa.int32())).arrow_schema()
    declared = operator_state_spec("op", bf.ListStateDescriptor("n", pa.int64())).arrow_schema()
    fixed = [n for n in declared.names if n not in ("value", "parallelism")]
    assert compare_schemas(stored, declared, fixed).restorable


OFFSETS_AT = {
    "file": "b.jsonl",
    "line": None,
    "files": [["b.jsonl", 0, None, 12]],
    "consumed": 2,
    "recent": ["a.jsonl", "b.jsonl"],
}


def test_a_sources_offsets_are_one_split_snapshotted_by_subtask_zero_and_read_back_as_the_union() -> None:
    """Rule 8: union list state of string elements; the one split in subtask 0, every subtask seeing it after a rescale."""
    spec = source_offsets_spec("readings")
    assert (
        spec.table_name == "readings__offsets"
        and spec.arrow_schema() == operator_state_spec("readings", bf.ListStateDescriptor("offsets", pa.string())).arrow_schema()
    )
    lists = offsets_lists(OFFSETS_AT, 3)
    assert lists == [
        [
            '{"consumed": 2, "file": "b.jsonl", "files": [["b.jsonl", 0, null, 12]], "line": null, "recent": ["a.jsonl", "b.jsonl"]}'
        ],
        [],
        [],
    ]
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
    check_held_state_size("buffer", "pending", MAX_HELD_STATE_ELEMENTS)
    with pytest.raises(UserFunctionError, match=r"operator 'buffer': its state 'pending' would hold 1000001 elements.*key_by"):
        check_held_state_size("buffer", "pending", MAX_HELD_STATE_ELEMENTS + 1)


# -- contract: the kernel over epochs, rescales, placements -------------------------------------------------------


class Batcher(bf.ProcessFunction):
    """The README's: the ids of every three events a subtask gets, with the largest amount seen (union state)."""

    pending = bf.ListStateDescriptor("pending", pa.string())
    largest = bf.ListStateDescriptor("largest", pa.float64(), redistribution="union")
    output_schema = pa.schema([("batch", pa.string()), ("subtask", pa.int32()), ("largest", pa.float64())])

    def process_element(self, event: dict[str, Any], ctx: OperatorContext, out: Any) -> None:
        pending, largest = ctx.get_list_state(self.pending), ctx.get_union_list_state(self.largest)
        pending.add(event["event_id"])
        top = max([event["amount"], *largest.get()])
        largest.update([top])
        if len(pending.get()) == 3:
            out({"batch": ",".join(pending.get()), "subtask": ctx.subtask_index, "largest": top})
            pending.clear()


EVENTS = pa.schema([("event_id", pa.string()), ("amount", pa.float64()), ("_seq", pa.int64())])
EPOCHS: list[tuple[list[tuple[str, float]], int]] = [  # (events in arrival order, the epoch's parallelism)
    ([("e1", 5.0), ("e2", 1.0), ("e3", 7.0), ("e4", 2.0), ("e5", 3.0), ("e6", 9.0), ("e7", 4.0)], 2),
    ([("e8", 6.0), ("e9", 11.0), ("e10", 1.0), ("e11", 2.0), ("e12", 8.0)], 2),
    ([("e13", 3.0), ("e14", 2.0), ("e15", 20.0), ("e16", 1.0)], 3),
    ([("e17", 1.0), ("e18", 2.0), ("e19", 3.0), ("e20", 4.0), ("e21", 5.0), ("e22", 6.0), ("e23", 0.5)], 1),
]


def _rescale(lists: list[list[Any]], parallelism: int, union: bool) -> list[list[Any]]:
    """Written apart from the module: concatenate, then deal sizes N//P (+1 for the first N%P), or copy."""
    flat = sum(lists, [])
    if union:
        return [flat[:] for _ in range(parallelism)]
    sizes = [len(flat) // parallelism + (i < len(flat) % parallelism) for i in range(parallelism)]
    bounds = [sum(sizes[:i]) for i in range(parallelism + 1)]
    return [flat[bounds[i] : bounds[i + 1]] for i in range(parallelism)]


def test_records_go_round_robin_by_arrival_and_lists_are_redistributed_on_a_rescale() -> None:
    node = OperatorProcess(operator_id="batcher", parent=upstream(), function=Batcher())
    assert node.exchanges() == (Exchange.GLOBAL,)
    specs = node_specs(node, [EVENTS.empty_table()])
    state: dict[str, pa.Table] = {}
    pending: list[list[Any]] = [[] for _ in range(EPOCHS[0][1])]
    largest: list[list[Any]] = [[] for _ in range(EPOCHS[0][1])]
    for n, (events, parallelism) in enumerate(EPOCHS, start=1):
        # Reference (the integration test's): rescale, then record k to subtask k % P.
        if parallelism != len(pending):
            pending, largest = _rescale(pending, parallelism, False), _rescale(largest, parallelism, True)
        expected = []
        for k, (event_id, amount) in enumerate(events):
            s = k % parallelism
            pending[s].append(event_id)
            largest[s] = [max([amount, *largest[s]])]
            if len(pending[s]) == 3:
                expected.append({"batch": ",".join(pending[s]), "subtask": s, "largest": largest[s][0]})
                pending[s] = []
        table = pa.Table.from_pylist(
            [{"event_id": e, "amount": a, "_seq": 100 * k} for k, (e, a) in enumerate(events)], schema=EVENTS
        )
        run = run_both(
            node,
            [table.take(list(reversed(range(table.num_rows))))],
            singleton=True,
            state=state,
            epoch=n,
            parallelism=parallelism,
        )
        assert sorted(run.output.to_pylist(), key=repr) == sorted(expected, key=repr)
        state = {name: live_state(spec, state.get(name), run.changes[name], epoch=n) for name, spec in specs.items()}
        assert stored_lists(state["batcher__pending"], parallelism) == pending
        assert stored_lists(state["batcher__largest"], parallelism) == largest
        assert set(state["batcher__pending"].column("parallelism").to_pylist()) <= {parallelism}
        assert set(state["batcher__largest"].column("_key_group").to_pylist()) == {0}


def test_an_input_without_arrival_positions_is_refused_when_planned() -> None:
    node = OperatorProcess(operator_id="batcher", parent=upstream(), function=Batcher())
    assert node.output_schema([EVENTS]) == Batcher.output_schema
    with pytest.raises(bf.PipelineDefinitionError, match="its input carries no arrival position"):
        node.output_schema([EVENTS.remove(2)])


def test_a_function_error_or_a_bad_element_fails_the_epoch_naming_the_operator() -> None:
    class Failing(Batcher):
        def process_element(self, event: dict[str, Any], ctx: OperatorContext, out: Any) -> None:
            if event["event_id"] == "boom":
                raise ZeroDivisionError("x")
            ctx.get_list_state(self.pending).add(1.5)  # not a string

    node = OperatorProcess(operator_id="batcher", parent=upstream(), function=Failing())
    events = pa.Table.from_pylist(
        [{"event_id": "a", "amount": 1.0, "_seq": 0}, {"event_id": "boom", "amount": 1.0, "_seq": 1}], schema=EVENTS
    )
    with pytest.raises(UserFunctionError, match=r"process 'batcher': the function raised ZeroDivisionError: x \(subtask 1\)"):
        run_kernel(node, [events], parallelism=2)
    with pytest.raises(
        UserFunctionError, match=r"operator state 'pending' of 'batcher': an element does not fit its declared type string"
    ):
        run_kernel(node, [events.slice(0, 1)], parallelism=2)
