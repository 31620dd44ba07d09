"""Operator (non-keyed) list state, as Flink's ``CheckpointedFunction`` with ``getListState`` / ``getUnionListState``.

``stream.process("batches", fn)`` on a stream that is not keyed runs a :class:`ProcessFunction`, whose list states belong to a
subtask, not a key:

1. Subtasks: ``parallelism``, the pipeline's parameter as the barrier fixed it.
2. Records, numbered in arrival order, go round-robin: record k to subtask ``k % parallelism`` (Flink's ``rebalance``), in arrival
   order; a retry reproduces it. The input must carry arrival positions.
3. A subtask starts with its lists as epoch n-1 committed them (after 5.); what they hold at the epoch's end is its snapshot
   (``get_list_state``: an ``even_split`` state, ``get_union_list_state``: a ``union`` one).
4. Table ``<operator_id>__<name>``: one row per element (``subtask``, ``position`` in its list, ``value``, ``parallelism`` the
   lists belong to; key group 0). An epoch writes the changed positions and tombstones those past a list's end.
5. Redistribution, in the first epoch whose parallelism P differs from the stored rows' (a changed parameter, a restore with
   ``parallelism=``), every subtask's lists then written with P:
   a. the old lists are concatenated in subtask order;
   b. even split: new subtask i gets the next ``N // P + (1 if i < N % P else 0)`` of the N elements (Flink's round-robin
      repartitioner);
   c. union: every new subtask gets the whole concatenation;
   d. an unchanged P moves nothing (no retry is a restore).
6. Results depend on the parallelism (2., 5.), as in Flink.
7. The state is held whole, as on a Flink task's heap: the input arrives in one task (a global exchange), which reads each state
   whole; more than ``MAX_HELD_STATE_ELEMENTS`` elements fail the epoch.
8. Source offsets: a source owns the union list state ``offsets``, as a Flink source reader's splits; its one split's element is
   its end offsets as JSON (keys sorted). In epoch n, on the driver:
   a. every subtask sees the stored lists' union: barrier n's start offsets, or none (a first epoch, an older release's table),
      else a :class:`CheckpointError`;
   b. split k's subtask ``k % parallelism`` snapshots it with barrier n's end offsets, every epoch; a restore takes them from
      there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import pyarrow as pa

from barrierflow.api.functions import OperatorContext, ProcessFunction
from barrierflow.api.keyed_state import ListState
from barrierflow.api.state import UNION, ListStateDescriptor
from barrierflow.core.arrow import in_arrival_order
from barrierflow.core.columns import DELETED, EPOCH, SEQ, UPDATED_AT
from barrierflow.core.errors import CheckpointError, PipelineDefinitionError
from barrierflow.operators.base import Exchange, Node, Task, calling_user_code, check_held_state_size, held_state_table
from barrierflow.operators.process import python_rows, python_values, rows_table
from barrierflow.state.spec import StateSpec

# The function and context are importable from here as before (plan/pipeline.py).
__all__ = [
    "ProcessFunction", "OperatorContext", "OperatorProcess", "operator_state_spec", "redistribute", "stored_lists", "state_rows",
    "OFFSETS", "source_offsets_spec", "offsets_lists", "restored_offsets", "offsets_rows", "source_offsets_table",
]  # fmt: skip

SUBTASK, POSITION, VALUE, PARALLELISM = "subtask", "position", "value", "parallelism"  # (4.) the table's columns
OFFSETS = ListStateDescriptor("offsets", pa.string(), redistribution=UNION)  # (8.) a source's: one JSON document per split


def operator_state_spec(operator_id: str, descriptor: ListStateDescriptor) -> StateSpec:
    """(4.) The table of an operator list state."""
    key = (pa.field(SUBTASK, pa.int32()), pa.field(POSITION, pa.int64()))
    value = (pa.field(VALUE, descriptor.element_type), pa.field(PARALLELISM, pa.int32()))
    return StateSpec(operator_id, descriptor.name, key, value)


def redistribute(lists: Sequence[Sequence[Any]], parallelism: int, redistribution: str) -> list[list[Any]]:
    """(5.) The lists of ``parallelism`` subtasks made from ``lists``, one per old subtask in subtask order."""
    if parallelism < 1:
        raise ValueError(f"parallelism must be at least 1, not {parallelism}")
    if len(lists) == parallelism:  # 5d.
        return [list(values) for values in lists]
    everything = [value for values in lists for value in values]  # 5a.
    if redistribution == UNION:  # 5c.
        return [list(everything) for _ in range(parallelism)]
    base, extra = divmod(len(everything), parallelism)  # 5b.: subtask i starts after i slices, the first `extra` one longer
    starts = [i * base + min(i, extra) for i in range(parallelism + 1)]
    return [everything[starts[i] : starts[i + 1]] for i in range(parallelism)]


def stored_lists(rows: pa.Table, parallelism: int) -> list[list[Any]]:
    """The lists live rows (4.) hold, one per subtask they were written for (``parallelism`` empty ones if none)."""
    if not rows.num_rows:
        return [[] for _ in range(parallelism)]
    written_for = set(rows.column(PARALLELISM).to_pylist())
    if len(written_for) != 1 or None in written_for:
        raise CheckpointError(
            f"operator state rows belong to several parallelisms {sorted(written_for, key=str)}; every epoch writes "
            "them for one (4.): the table was changed outside barrierflow, restore it from a savepoint"
        )
    lists: list[list[Any]] = [[] for _ in range(written_for.pop())]
    ordered = rows.sort_by([(SUBTASK, "ascending"), (POSITION, "ascending")])
    for subtask, value in zip(ordered.column(SUBTASK).to_pylist(), python_values(ordered.column(VALUE))):
        lists[subtask].append(value)
    return lists


def state_rows(rows: pa.Table, lists: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """(4.) The changelog rows taking live ``rows`` to ``lists`` (one per subtask): changed positions, then tombstones."""
    columns = [rows.column(SUBTASK).to_pylist(), rows.column(POSITION).to_pylist(), python_values(rows.column(VALUE))]
    before = {(s, p): (v, n) for s, p, v, n in zip(*columns, rows.column(PARALLELISM).to_pylist())}
    out = [  # each position popped: those left are past a list's new end
        {SUBTASK: subtask, POSITION: position, VALUE: value, PARALLELISM: len(lists), DELETED: False}
        for subtask, values in enumerate(lists)
        for position, value in enumerate(values)
        if before.pop((subtask, position), None) != (value, len(lists))
    ]
    return out + [{SUBTASK: s, POSITION: p, VALUE: None, PARALLELISM: None, DELETED: True} for s, p in sorted(before)]


def source_offsets_spec(source_id: str) -> StateSpec:
    """(8.) The table of a source's offsets state."""
    return operator_state_spec(source_id, OFFSETS)


def offsets_lists(offsets: Any, parallelism: int) -> list[list[str]]:
    """(8b.) The lists of ``parallelism`` subtasks snapshotting end ``offsets``: the one split, 0, in subtask 0 % parallelism."""
    return [[json.dumps(offsets, sort_keys=True)] if subtask == 0 else [] for subtask in range(parallelism)]


def restored_offsets(source_id: str, rows: pa.Table) -> Any | None:
    """(8a.) The offsets live ``rows`` hold, as every subtask sees them (union); None when they hold none."""
    elements = sorted({element for values in stored_lists(rows, 1) for element in values})
    if len(elements) > 1:
        raise CheckpointError(
            f"source {source_id}: its offsets state holds {len(elements)} different offsets, and a source has one "
            f"split: {elements}; the table was changed outside barrierflow, restore it from a savepoint"
        )
    return json.loads(elements[0]) if elements else None


def offsets_rows(source_id: str, offsets: Any, parallelism: int, epoch: int, updated_at_ms: int) -> pa.Table:
    """(8b.) The whole table of a source's offsets state holding ``offsets`` (a restore seeding it)."""
    spec = source_offsets_spec(source_id)
    rows = state_rows(spec.arrow_schema().empty_table(), offsets_lists(offsets, parallelism))
    return held_state_table(spec, rows, epoch, updated_at_ms)


def source_offsets_table(
    stored: pa.Table, source_id: str, start: Any, end: Any, parallelism: int, epoch: int, processing_time_ms: int
) -> pa.Table:
    """(8.) A source's offsets rows for epoch n: ``stored`` must hold barrier n's ``start`` (8a.); ``end`` replaces it (8b.)."""
    restored = restored_offsets(source_id, stored)  # 8a.
    if restored is not None and restored != start:
        raise CheckpointError(
            f"source {source_id}: its offsets state holds {json.dumps(restored, sort_keys=True)} but barrier "
            f"{epoch} starts at {json.dumps(start, sort_keys=True)}; the table was changed outside "
            "barrierflow: restore from a savepoint or a retained checkpoint"
        )
    rows = state_rows(stored, offsets_lists(end, parallelism))  # 8b.
    return held_state_table(source_offsets_spec(source_id), rows, epoch, processing_time_ms)


@dataclass
class OperatorProcess(Node):
    """A non-keyed process operator: ``function`` over ``parent``'s records, as ``parallelism`` subtasks."""

    function: ProcessFunction | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.function, ProcessFunction):
            got = "none" if self.function is None else f"a {type(self.function).__qualname__}"
            raise PipelineDefinitionError(
                f"process {self.operator_id}: a bf.ProcessFunction (an instance of a subclass) is required on a stream "
                f"that is not keyed, got {got}; a KeyedProcessFunction runs on a keyed stream: key_by(k).process(...)"
            )
        wrong = [d.name for d in self.function.state_descriptors if not isinstance(d, ListStateDescriptor)]
        if wrong:
            raise PipelineDefinitionError(
                f"process {self.operator_id}: state(s) {wrong} are not list states; a non-keyed ProcessFunction's "
                "operator state is bf.ListStateDescriptor(name, element_type[, redistribution='union']); "
                "key the stream for value, map, reducing or aggregating state"
            )
        with_ttl = [d.name for d in self.function.state_descriptors if d.ttl is not None]
        if with_ttl:
            raise PipelineDefinitionError(
                f"process {self.operator_id}: operator state(s) {with_ttl} declare a TTL; operator state has none "
                "(clear or update the list instead)"
            )

    @property
    def descriptors(self) -> list[ListStateDescriptor]:
        assert self.function is not None
        return [d for d in self.function.state_descriptors if isinstance(d, ListStateDescriptor)]

    def exchanges(self) -> tuple[Exchange, ...]:
        return (Exchange.GLOBAL,)  # (2.) the whole epoch in one task: one arrival order, one round-robin

    def state_specs(self, inputs: Sequence[pa.Schema] | None = None) -> list[StateSpec]:
        return [operator_state_spec(self.operator_id, d) for d in self.descriptors]

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        (schema,) = inputs
        if SEQ not in schema.names:  # (2.)
            raise PipelineDefinitionError(
                f"process {self.operator_id!r}: its input carries no arrival position, so which subtask a record goes "
                "to is unknown; apply a ProcessFunction to a stream from a source, its stateless operators or unions"
            )
        assert self.function is not None
        return self.function.output_schema

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        """Steps 1.-5. and 7.; returns the rows every subtask emitted, by subtask."""
        (records,) = inputs
        fn = self.function
        assert fn is not None
        label = f"process {self.operator_id!r}"
        parallelism = task.parallelism  # 1. the pipeline's, as the barrier fixed it
        specs = {d.name: operator_state_spec(self.operator_id, d) for d in self.descriptors}
        stored = {name: task.state(spec).every_live_row() for name, spec in specs.items()}  # 7. read whole
        old = {d.name: stored_lists(stored[d.name], parallelism) for d in self.descriptors}
        lists = {d.name: redistribute(old[d.name], parallelism, d.redistribution) for d in self.descriptors}  # 5.
        # 2. Record k of the epoch, in arrival order, to subtask k % parallelism; each subtask's in arrival order.
        rows = python_rows(in_arrival_order(records))
        emitted: list[dict[str, Any]] = []
        subtask = 0
        with calling_user_code(label, lambda: f" (subtask {subtask})"):
            for subtask in range(parallelism):
                if not (mine := rows[subtask::parallelism]):
                    continue
                handles = {d.name: ListState(d, list(lists[d.name][subtask]) or None) for d in self.descriptors}  # 3.
                ctx = OperatorContext(subtask, parallelism, task.epoch, task.processing_time_ms, handles)
                for record in mine:
                    fn.process_element(record, ctx, emitted.append)
                for name, handle in handles.items():
                    if handle.dirty:
                        lists[name][subtask] = handle.get()
        # 4. The rows taking each table to the lists, staged every epoch, even empty: an epoch's cut names only what it committed.
        for name, spec in specs.items():
            check_held_state_size(self.operator_id, name, sum(len(values) for values in lists[name]))  # 7.
            changes = held_state_table(spec, state_rows(stored[name], lists[name]), task.epoch, task.processing_time_ms)
            task.state(spec).stage(changes.drop_columns([UPDATED_AT, EPOCH]))
        return rows_table(label, emitted, fn.output_schema)
