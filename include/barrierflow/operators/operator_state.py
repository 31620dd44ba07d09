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
   heap of each task: the driver reads a state whole, redistributes it and
   ships each subtask its lists with the function; the subtasks' new lists
   come back to the driver, which stages the changed rows. A state whose
   lists would hold more than ``MAX_DRIVER_STATE_ELEMENTS`` (1,000,000)
   elements in all fails the epoch, saying so (keyed state has no ceiling).

8. Source offsets. Every source operator owns the union list state
   ``offsets`` (``state/<source_id>/offsets``, ``<source_id>__offsets`` in
   queries; elements are strings), as a Flink source reader's splits and
   offsets are union list state, written by the code path of 4. A source
   here is one split (a file position, a table version), so its element is
   its end offsets as one JSON document (keys sorted). Within epoch n, once
   its operators ran (:func:`stage_source_offsets`):

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
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Sequence

import pyarrow as pa

from barrierflow.api.keyed_state import ListState
from barrierflow.api.state import EVEN_SPLIT, UNION, ListStateDescriptor, StateDescriptor
from barrierflow.core.errors import CheckpointError, PipelineDefinitionError, UserFunctionError
from barrierflow.operators.base import (
    Node,
    check_driver_state_size,
    position_columns,
    position_order,
    ship_user_code,
    user_columns,
)
from barrierflow.operators.process import _declared_states, _python_values, _state_column
from barrierflow.state.spec import KEY_GROUP, StateSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

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
    "stage_source_offsets",
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
# The subtask a record goes to (2.), in the frame handed to each subtask.
_SUBTASK = "_subtask"
# (8.) Every source's offsets: one JSON document per split.
OFFSETS = ListStateDescriptor("offsets", pa.string(), redistribution=UNION)


class OperatorContext:
    """What a :class:`ProcessFunction` sees: its subtask, the epoch's clocks and its list states (3.)."""

    def __init__(self, subtask_index: int, parallelism: int, epoch: int, processing_time_ms: int, states: Mapping[str, ListState]) -> None:
        self.subtask_index = subtask_index
        self.parallelism = parallelism
        self.epoch = epoch
        self.processing_time_ms = processing_time_ms
        self._states = states

    def get_list_state(self, descriptor: ListStateDescriptor) -> ListState:
        """This subtask's list of an even-split state (5b. on a rescale)."""
        return self._state(descriptor, EVEN_SPLIT, "get_union_list_state")

    def get_union_list_state(self, descriptor: ListStateDescriptor) -> ListState:
        """This subtask's list of a union state (5c. on a rescale)."""
        return self._state(descriptor, UNION, "get_list_state")

    def _state(self, descriptor: ListStateDescriptor, redistribution: str, other: str) -> ListState:
        state = self._states.get(getattr(descriptor, "name", None))  # type: ignore[arg-type]
        if state is None:
            name = getattr(descriptor, "name", descriptor)
            raise PipelineDefinitionError(
                f"operator state {name!r} is not declared by the process function: declare it as a class "
                f"attribute, e.g. {name} = bf.ListStateDescriptor({name!r}, pa.int64())"
            )
        declared = state.descriptor
        assert isinstance(declared, ListStateDescriptor)
        if declared.redistribution != redistribution:
            raise PipelineDefinitionError(
                f"operator state {declared.name!r} is declared redistribution={declared.redistribution!r}: "
                f"read it with ctx.{other}(...), or declare it redistribution={redistribution!r}"
            )
        return state


class ProcessFunction:
    """Subclass and implement :meth:`process_element`; emit rows of ``output_schema`` with ``out``.

    Its operator state is every :class:`ListStateDescriptor` among its class
    attributes (``pending = bf.ListStateDescriptor("pending", pa.string())``,
    ``redistribution="union"`` for union state), collected as a
    :class:`~barrierflow.operators.process.KeyedProcessFunction`'s are.
    """

    state_descriptors: ClassVar[tuple[StateDescriptor, ...]] = ()
    output_schema: pa.Schema = pa.schema([])

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.state_descriptors = _declared_states(cls)

    def process_element(self, record: dict[str, Any], ctx: OperatorContext, out: Callable[[dict[str, Any]], None]) -> None:
        raise NotImplementedError


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
    for subtask, value in zip(ordered.column(SUBTASK).to_pylist(), _python_values(ordered.column(VALUE))):
        lists[subtask].append(value)
    return lists


def state_rows(rows: pa.Table, lists: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """(4.) The changelog rows taking live ``rows`` to ``lists`` (one per subtask): changed positions, then tombstones."""
    parallelism = len(lists)
    before = {
        (s, p): (v, n)
        for s, p, v, n in zip(
            rows.column(SUBTASK).to_pylist(), rows.column(POSITION).to_pylist(),
            _python_values(rows.column(VALUE)), rows.column(PARALLELISM).to_pylist(),
        )
    }  # fmt: skip
    out = []
    for subtask, values in enumerate(lists):
        for position, value in enumerate(values):
            if before.pop((subtask, position), None) != (value, parallelism):
                out.append({SUBTASK: subtask, POSITION: position, VALUE: value, PARALLELISM: parallelism, "_deleted": False})
    out += [{SUBTASK: s, POSITION: p, VALUE: None, PARALLELISM: None, "_deleted": True} for s, p in sorted(before)]
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
    return _state_table(spec, state_rows(spec.arrow_schema().empty_table(), offsets_lists(offsets, parallelism)), epoch, updated_at_ms)


def stage_source_offsets(ctx: Any) -> None:
    """(8.) Stage every source's offsets state for epoch n; waits for epoch n-1 (its state) to complete."""
    parallelism = ctx.pipeline.parallelism  # 1.
    for node in ctx.pipeline.sources:
        source_id = node.operator_id
        spec = source_offsets_spec(source_id)
        stored = ctx.state.read_arrow(spec, [0])
        restored = restored_offsets(source_id, stored)  # 8a.
        start = ctx.barrier.start_offsets.get(source_id)
        if restored is not None and restored != start:
            raise CheckpointError(
                f"source {source_id}: its offsets state holds {json.dumps(restored, sort_keys=True)} but barrier "
                f"{ctx.epoch} starts at {json.dumps(start, sort_keys=True)}; the table was changed outside "
                "barrierflow: restore from a savepoint or a retained checkpoint"
            )
        _stage(ctx, spec, state_rows(stored, offsets_lists(ctx.barrier.end_offsets[source_id], parallelism)))  # 8b.


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

    def state_specs(self) -> list[StateSpec]:
        return [operator_state_spec(self.operator_id, d) for d in self.descriptors]

    def apply(self, ctx: Any, df: "DataFrame") -> "DataFrame":
        """Steps 2.-5.; returns the emitted rows."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema

        fn = self.function
        assert fn is not None
        ship_user_code(fn)
        if "_seq" not in df.columns:
            raise PipelineDefinitionError(
                f"process {self.operator_id!r}: its input carries no arrival position, so which subtask a record goes "
                "to is unknown; apply a ProcessFunction to a stream from a source, its stateless operators or unions"
            )
        parallelism = ctx.pipeline.parallelism  # 1.
        specs = {d.name: operator_state_spec(self.operator_id, d) for d in self.descriptors}
        stored = {name: ctx.state.read_arrow(spec, [0]) for name, spec in specs.items()}
        lists = {  # 5.
            d.name: redistribute(stored_lists(stored[d.name], parallelism), parallelism, d.redistribution)
            for d in self.descriptors
        }
        columns = user_columns(df)
        positions = position_columns(df.columns)
        # 2. Record k of the epoch, in arrival order, to subtask k % parallelism.
        # One window over the whole epoch, in one partition: said (partitionBy a constant) rather than
        # warned about, since a global arrival rank is what rule 2 needs.
        whole_epoch = Window.partitionBy(F.lit(0)).orderBy(*position_order(df.columns))
        rank = F.row_number().over(whole_epoch) - F.lit(1)
        numbered = df.select(*columns, *positions).withColumn(_SUBTASK, F.pmod(rank, F.lit(parallelism)).cast("int"))
        out_schema = pa.schema(
            [
                pa.field("_kind", pa.string()),
                pa.field(_SUBTASK, pa.int32()),
                *[pa.field(_state_column(d.name), pa.list_(d.element_type)) for d in self.descriptors],
                *[pa.field(f"_out_{f.name}", f.type) for f in fn.output_schema],
            ]
        )
        epoch, processing_time_ms = ctx.epoch, ctx.processing_time_ms

        def run(records: pa.Table) -> pa.Table:  # annotated: Spark infers the UDF's kind from the hints
            return _run_subtask(fn, lists, parallelism, epoch, processing_time_ms, out_schema, records)

        result = ctx.persist(numbered.groupBy(_SUBTASK).applyInArrow(run, from_arrow_schema(out_schema)))
        # 7. The subtasks' changed lists, on the driver; 4. the rows that take the table there. ``lists``
        # stays as shipped: Spark Connect pickles ``run`` again whenever the plan is sent, and a
        # changed closure would miss the cached result and compute the epoch again from other lists.
        after = {name: [list(values) for values in per_subtask] for name, per_subtask in lists.items()}
        changed = result.where(F.col("_kind") != F.lit("_out")).select("_kind", _SUBTASK, *[_state_column(n) for n in specs])
        for kind, subtask, *values in zip(*(c.to_pylist() for c in changed.toArrow().columns)):
            after[kind][subtask] = values[list(specs).index(kind)] or []
        for name, spec in specs.items():
            check_driver_state_size(self.operator_id, name, sum(len(values) for values in after[name]))
            # Staged every epoch, changed or not: a completed epoch's cut (what queries and
            # savepoints read) names the versions of the tables it committed.
            _stage(ctx, spec, state_rows(stored[name], after[name]))
        outputs = result.where(F.col("_kind") == F.lit("_out"))
        return ctx.cached_view(outputs.select(*[F.col(f"_out_{f.name}").alias(f.name) for f in fn.output_schema]))

    def describe(self) -> dict[str, Any]:
        assert self.function is not None
        return {
            **super().describe(),
            "function": type(self.function).__qualname__,
            "operator_states": {d.name: d.signature() for d in self.descriptors},
        }


def _stage(ctx: Any, spec: StateSpec, rows: list[dict[str, Any]]) -> None:
    ctx.state.stage_arrow(spec, _state_table(spec, rows, ctx.epoch, ctx.processing_time_ms))


def _state_table(spec: StateSpec, rows: list[dict[str, Any]], epoch: int, updated_at_ms: int) -> pa.Table:
    """(4.) Changelog ``rows`` as the table's rows written by ``epoch``."""
    written = {KEY_GROUP: 0, "_updated_at_ms": updated_at_ms, "_epoch": epoch}
    try:
        return pa.Table.from_pylist([{**row, **written} for row in rows], schema=spec.arrow_schema())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
        raise UserFunctionError(
            f"operator state {spec.name!r} of {spec.operator_id!r}: an element does not fit its declared type "
            f"{spec.value_fields[0].type}: {exc}"
        ) from None


def _run_subtask(
    fn: ProcessFunction,
    lists: Mapping[str, list[list[Any]]],
    parallelism: int,
    epoch: int,
    processing_time_ms: int,
    out_schema: pa.Schema,
    records: pa.Table,
) -> pa.Table:
    """One subtask's records (2.), in arrival order, with its lists (3.); on an executor."""
    if not records.num_rows:
        return out_schema.empty_table()
    subtask = records.column(_SUBTASK)[0].as_py()
    records = records.sort_by([(c, "ascending") for c in position_columns(records.column_names)])
    handles = {}
    for d in fn.state_descriptors:
        assert isinstance(d, ListStateDescriptor)
        handles[d.name] = ListState(d, list(lists[d.name][subtask]) or None)
    ctx = OperatorContext(subtask, parallelism, epoch, processing_time_ms, handles)
    names = [n for n in records.column_names if not n.startswith("_")]
    emitted: list[dict[str, Any]] = []
    for values in zip(*(_python_values(records.column(n)) for n in names)):
        fn.process_element(dict(zip(names, values)), ctx, emitted.append)
    rows = [{"_kind": "_out", _SUBTASK: subtask, **{f"_out_{k}": v for k, v in row.items()}} for row in emitted]
    rows += [
        {"_kind": name, _SUBTASK: subtask, _state_column(name): handle.get()}
        for name, handle in handles.items()
        if handle.dirty
    ]
    return pa.Table.from_pylist(rows, schema=out_schema)
