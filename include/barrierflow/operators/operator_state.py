"""Operator (non-keyed) list state, as Flink's ``CheckpointedFunction`` with ``getListState`` / ``getUnionListState``.

``stream.process("batches", fn)`` on a stream that is not keyed runs a
:class:`ProcessFunction`: ``process_element(record, ctx, out)``, whose list
states (the :class:`~barrierflow.api.state.ListStateDescriptor`
class attributes) belong to a parallel subtask, not to a key. Within epoch n:

1. Subtasks. The operator runs as ``parallelism`` subtasks: the pipeline's
   ``parallelism`` parameter, as the epoch's barrier fixed it (not the
   epoch's shuffle partitions, which grow with its input).
   ``ctx.subtask_index`` and ``ctx.parallelism`` say which and how many.
2. Records to subtasks. The epoch's records are numbered 0, 1, 2, ... in
   arrival order (``_seq``, then a flat_map's or union's sub-positions);
   record k goes to subtask ``k % parallelism`` (round-robin, as Flink's
   ``rebalance``), and each subtask calls ``process_element`` on its records
   in arrival order. The assignment depends only on the barrier, so a retry
   of the epoch reproduces it exactly; it costs one sort of the epoch's
   records in one task. The input must carry its arrival position (a stream
   from a source, through stateless operators and unions).
3. State. A subtask starts with its lists as epoch n-1 committed them
   (redistributed by 5. if the parallelism changed); whatever they hold at
   the end of the epoch is its snapshot. ``ctx.get_list_state(D)`` gives a
   state declared ``redistribution="even_split"`` (the default),
   ``ctx.get_union_list_state(D)`` one declared ``redistribution="union"``;
   both are :class:`~barrierflow.api.keyed_state.ListState` handles (``get``,
   ``add``, ``update``, ``clear``). Operator state has no TTL.
4. Table. Each list state is the Delta table ``state/<operator_id>/<name>``
   (``<operator_id>__<name>`` in queries), one row per element: ``subtask``
   (int32), ``position`` (int64, from 0 within the subtask's list),
   ``value`` (the element type), ``parallelism`` (int32: how many subtasks
   the lists belong to), and the state tables' ``_key_group`` (always 0: no
   key), ``_updated_at_ms``, ``_deleted``, ``_epoch``. As every state table
   it is a changelog whose latest row per (``subtask``, ``position``) is
   current: an epoch writes the positions that changed and tombstones those
   past a list's new end, staged and committed with the epoch by the same
   two-phase commit, kept by savepoints, restored, and checked by schema
   evolution (``value``'s type may evolve as any state column's).
5. Redistribution, at the start of the first epoch whose parallelism P
   differs from the stored rows' (a changed ``parallelism`` parameter, or
   the first epoch after a restore with ``parallelism=``):

   a. all the old subtasks' lists are concatenated in subtask order, each
      in position order;
   b. even split: with N elements, new subtask i gets the contiguous slice
      of ``N // P + (1 if i < N % P else 0)`` elements that follows
      subtask i-1's (Flink's round-robin repartitioner: the first
      ``N % P`` subtasks get one more);
   c. union: every new subtask gets the whole concatenation;
   d. with an unchanged parallelism nothing moves. Flink also unions union
      state on a restore at the same parallelism; here a retry or the next
      epoch is no restore the function can see, so a result never depends
      on whether an epoch was retried.

   Every subtask's redistributed lists are written in that epoch (all rows
   carry the new ``parallelism``), whether or not the subtask gets records.
6. Results depend on the parallelism, as in Flink: which records share a
   subtask's list (2.) and how lists are redistributed (5.). With the same
   parallelism and input they are the same, retries included.
7. Operator state is small (buffers, offsets), as Flink keeps it on the
   heap of each task: the operator's input arrives whole in one task (a
   global exchange), which reads each state whole (its rows are all in key
   group 0), redistributes it (5.), runs every subtask's records (2.) and
   stages the changed rows. A state whose lists would hold more than
   ``MAX_HELD_STATE_ELEMENTS`` (1,000,000) elements in all fails the epoch,
   saying so (keyed state has no ceiling).

8. Source offsets. Every source operator owns the union list state
   ``offsets`` (``state/<source_id>/offsets``, ``<source_id>__offsets`` in
   queries; elements are strings), as a Flink source reader's splits and
   offsets are union list state, written by the code path of 4. A source
   here is one split (a file position, a table version), so its element is
   its end offsets as one JSON document (keys sorted). Within epoch n, once
   its operators ran (:func:`source_offsets_table`, on the driver):

   a. every subtask sees the union of the stored lists (5c., whatever the
      parallelism was), which must be barrier n's start offsets of the
      source (or empty: the first epoch, or a table an older release never
      wrote); anything else is a :class:`CheckpointError`;
   b. split k belongs to subtask ``k % parallelism``, which snapshots it
      with barrier n's end offsets: the rows are staged every epoch, input
      or not, and committed with the epoch's other tables, so the table's
      version in epoch n's cut holds the offsets after epoch n.

   Barrier n still fixes the cut before epoch n runs (with two concurrent
   checkpoints barrier n+1 is planned before epoch n commits); a restore
   takes its start offsets from this state as of the restore point (see
   :mod:`barrierflow.operations.restore`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.api.functions import OperatorContext, ProcessFunction
from barrierflow.api.keyed_state import ListState
from barrierflow.api.state import UNION, ListStateDescriptor
from barrierflow.core.arrow import in_arrival_order
from barrierflow.core.columns import DELETED, EPOCH, KEY_GROUP, SEQ, UPDATED_AT, user_columns
from barrierflow.core.errors import CheckpointError, PipelineDefinitionError, UserFunctionError
from barrierflow.operators.base import Exchange, Node, Task, check_held_state_size
from barrierflow.operators.process import python_values, rows_table
from barrierflow.state.spec import StateSpec

# The function and context are importable from here as before (barrierflow/__init__.py, plan/pipeline.py).
__all__ = [
    "ProcessFunction",
    "OperatorContext",
    "OperatorProcess",
    "operator_state_spec",
    "redistribute",
    "stored_lists",
    "state_rows",
    "OFFSETS",
    "source_offsets_spec",
    "offsets_lists",
    "restored_offsets",
    "offsets_rows",
    "source_offsets_table",
    "SUBTASK",
    "POSITION",
    "VALUE",
    "PARALLELISM",
]

# (4.) The columns of an operator list state table.
SUBTASK = "subtask"
POSITION = "position"
VALUE = "value"
PARALLELISM = "parallelism"
# (8.) Every source's offsets: one JSON document per split.
OFFSETS = ListStateDescriptor("offsets", pa.string(), redistribution=UNION)


def operator_state_spec(operator_id: str, descriptor: ListStateDescriptor) -> StateSpec:
    """(4.) The table of an operator list state."""
    return StateSpec(
        operator_id=operator_id,
        name=descriptor.name,
        key_fields=(pa.field(SUBTASK, pa.int32()), pa.field(POSITION, pa.int64())),
        value_fields=(pa.field(VALUE, descriptor.element_type), pa.field(PARALLELISM, pa.int32())),
    )


def redistribute(lists: Sequence[Sequence[Any]], parallelism: int, redistribution: str) -> list[list[Any]]:
    """(5.) The lists of ``parallelism`` subtasks made from ``lists``, one per old subtask in subtask order."""
    if parallelism < 1:
        raise ValueError(f"parallelism must be at least 1, not {parallelism}")
    if len(lists) == parallelism:  # 5d.
        return [list(values) for values in lists]
    everything = [value for values in lists for value in values]  # 5a.
    if redistribution == UNION:  # 5c.
        return [list(everything) for _ in range(parallelism)]
    base, extra = divmod(len(everything), parallelism)  # 5b.
    out, start = [], 0
    for index in range(parallelism):
        size = base + (1 if index < extra else 0)
        out.append(everything[start : start + size])
        start += size
    return out


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
    parallelism = len(lists)
    before = {
        (s, p): (v, n)
        for s, p, v, n in zip(
            rows.column(SUBTASK).to_pylist(), rows.column(POSITION).to_pylist(),
            python_values(rows.column(VALUE)), rows.column(PARALLELISM).to_pylist(),
        )
    }  # fmt: skip
    out = []
    for subtask, values in enumerate(lists):
        for position, value in enumerate(values):
            if before.pop((subtask, position), None) != (value, parallelism):
                out.append({SUBTASK: subtask, POSITION: position, VALUE: value, PARALLELISM: parallelism, DELETED: False})
    out += [{SUBTASK: s, POSITION: p, VALUE: None, PARALLELISM: None, DELETED: True} for s, p in sorted(before)]
    return out


def source_offsets_spec(source_id: str) -> StateSpec:
    """(8.) The table of a source's offsets state."""
    return operator_state_spec(source_id, OFFSETS)


def offsets_lists(offsets: Any, parallelism: int) -> list[list[str]]:
    """(8b.) The lists of ``parallelism`` subtasks snapshotting end offsets ``offsets``: split k in subtask k % parallelism."""
    splits = [json.dumps(offsets, sort_keys=True)]  # a source here is one split
    lists: list[list[str]] = [[] for _ in range(parallelism)]
    for index, element in enumerate(splits):
        lists[index % parallelism].append(element)
    return lists


def restored_offsets(source_id: str, rows: pa.Table) -> Any | None:
    """(8a.) The offsets live ``rows`` hold, as every subtask sees them (union); None when they hold none."""
    union = redistribute(stored_lists(rows, 1), 1, UNION)[0]
    elements = sorted(set(union))
    if len(elements) > 1:
        raise CheckpointError(
            f"source {source_id}: its offsets state holds {len(elements)} different offsets, and a source has one "
            f"split: {elements}; the table was changed outside barrierflow, restore it from a savepoint"
        )
    return json.loads(elements[0]) if elements else None


def offsets_rows(source_id: str, offsets: Any, parallelism: int, epoch: int, updated_at_ms: int) -> pa.Table:
    """(8b.) The whole table of a source's offsets state holding ``offsets`` (a restore seeding it, see :mod:`barrierflow.operations.restore`)."""
    spec = source_offsets_spec(source_id)
    return _state_table(
        spec, state_rows(spec.arrow_schema().empty_table(), offsets_lists(offsets, parallelism)), epoch, updated_at_ms
    )


def source_offsets_table(
    stored: pa.Table, source_id: str, start: Any, end: Any, parallelism: int, epoch: int, processing_time_ms: int
) -> pa.Table:
    """(8.) A source's offsets state rows for epoch n: its stored rows must hold barrier n's ``start`` offsets (8a.); ``end`` replaces them (8b.)."""
    spec = source_offsets_spec(source_id)
    restored = restored_offsets(source_id, stored)  # 8a.
    if restored is not None and restored != start:
        raise CheckpointError(
            f"source {source_id}: its offsets state holds {json.dumps(restored, sort_keys=True)} but barrier "
            f"{epoch} starts at {json.dumps(start, sort_keys=True)}; the table was changed outside "
            "barrierflow: restore from a savepoint or a retained checkpoint"
        )
    return _state_table(spec, state_rows(stored, offsets_lists(end, parallelism)), epoch, processing_time_ms)  # 8b.


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

    def input_keys(self) -> tuple[tuple[str, ...], ...]:
        return ((),)

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
        stored = {}
        for name, spec in specs.items():  # 7. read whole: every row is in key group 0
            rows = task.state(spec).every_live_row()
            stored[name] = rows.filter(pc.equal(rows.column(KEY_GROUP), 0))
        lists = {  # 5.
            d.name: redistribute(stored_lists(stored[d.name], parallelism), parallelism, d.redistribution)
            for d in self.descriptors
        }
        # 2. Record k of the epoch, in arrival order, to subtask k % parallelism; each subtask's in arrival order.
        ordered = in_arrival_order(records)
        names = user_columns(ordered.column_names)
        values = [python_values(ordered.column(n)) for n in names]
        rows_py = [dict(zip(names, row)) for row in zip(*values)] if names else [{} for _ in range(ordered.num_rows)]
        emitted: list[dict[str, Any]] = []
        subtask = 0
        try:
            for subtask in range(parallelism):
                mine = rows_py[subtask::parallelism]
                if not mine:
                    continue
                # 3. The subtask's lists, as handles.
                handles = {d.name: ListState(d, list(lists[d.name][subtask]) or None) for d in self.descriptors}
                ctx = OperatorContext(subtask, parallelism, task.epoch, task.processing_time_ms, handles)
                for record in mine:
                    fn.process_element(record, ctx, emitted.append)
                for name, handle in handles.items():
                    if handle.dirty:
                        lists[name][subtask] = handle.get()
        except (PipelineDefinitionError, UserFunctionError) as exc:
            raise type(exc)(f"{label} (subtask {subtask}): {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - the user's function failed: the epoch fails, naming it
            raise UserFunctionError(f"{label}: the function raised {type(exc).__name__}: {exc} (subtask {subtask})") from exc
        # 4. The rows taking each table to the subtasks' lists, staged every epoch (changed or not: a completed
        # epoch's cut, what queries and savepoints read, names the versions of the tables it committed).
        for name, spec in specs.items():
            check_held_state_size(self.operator_id, name, sum(len(values) for values in lists[name]))  # 7.
            changes = _state_table(spec, state_rows(stored[name], lists[name]), task.epoch, task.processing_time_ms)
            task.state(spec).stage(changes.drop_columns([UPDATED_AT, EPOCH]))
        return rows_table(label, emitted, fn.output_schema)

    def describe(self) -> dict[str, Any]:
        assert self.function is not None
        return {
            **super().describe(),
            "function": type(self.function).__qualname__,
            "operator_states": {d.name: d.signature() for d in self.descriptors},
        }


def _state_table(spec: StateSpec, rows: list[dict[str, Any]], epoch: int, updated_at_ms: int) -> pa.Table:
    """(4.) Changelog ``rows`` as the table's rows written by ``epoch``."""
    written = {KEY_GROUP: 0, UPDATED_AT: updated_at_ms, EPOCH: epoch}
    try:
        return pa.Table.from_pylist([{**row, **written} for row in rows], schema=spec.arrow_schema())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        raise UserFunctionError(
            f"operator state {spec.name!r} of {spec.operator_id!r}: an element does not fit its declared type "
            f"{spec.value_fields[0].type}: {exc}"
        ) from None
