"""One task of an epoch: reads its input, runs its operators' kernels in pipeline order, stages what they wrote.

A Spark task runs the whole pipeline of a small epoch or one stage of a large one, given a :class:`TaskPlan` (the same for every
task of a stage) and a :class:`TaskInput` (its own part). A task (:func:`run_task`):

1. Reads its source splits (records with ``_seq``, dead letters), or its inputs' exchange files from an earlier stage.
2. Runs its nodes in pipeline order, each kernel given its inputs' rows; keys computed on the way are checked before a keyed
   operator (:mod:`barrierflow.operators.key_check`). W(n) is final when an event-time operator runs (the planner's step 3).
3. Writes its outputs that a later stage consumes as exchange files, one per edge and receiving task.
4. Stages every table it wrote (state changes or its share of a compaction, sink rows, side outputs, dead letters).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from barrierflow.connectors.source import Split
from barrierflow.core.arrow import conform, rows_with_keys, rows_without_keys
from barrierflow.core.columns import EPOCH
from barrierflow.core.errors import CheckpointError
from barrierflow.execution.exchange import partition, read_exchange, write_exchange
from barrierflow.operators.base import Node
from barrierflow.operators.key_check import split_computed_keys
from barrierflow.operators.watermark import WatermarkClock
from barrierflow.plan.planner import Edge
from barrierflow.state.spec import KeyGroups, StateSpec, StateTablePlan
from barrierflow.state.table import TaskStateTable
from barrierflow.storage.objects import arrow_filesystem
from barrierflow.storage.staging import write_partition

__all__ = ["TaskPlan", "TaskInput", "TaskResult", "OutputTable", "run_task", "TaskRuntime"]

DEAD_LETTER = "dead_letter"


@dataclass(frozen=True)
class OutputTable:
    """A table tasks append to or rewrite this epoch: a sink, a side output, the dead letters.

    ``stored``: the table's live files an upsert or a widening may rewrite; ``rewrite_all``: every one is (a widening, an upsert
    of a small table), else an upsert rewrites those holding a key it writes.
    """

    name: str
    uri: str
    schema: pa.Schema  # the staged files' schema, ``_epoch`` included
    stored: tuple[str, ...] = ()
    rewrite_all: bool = False


@dataclass(frozen=True)
class TaskPlan:
    """What every task of one stage needs (pickled once per job)."""

    epoch: int
    processing_time_ms: int
    key_groups: int
    parallelism: int  # the pipeline's, as the barrier fixed it
    ranges: int  # key-group range tasks of the epoch: state files are clustered by this many ranges
    nodes: tuple[Node | None, ...]  # the pipeline's nodes without their graph links; None where the stage has no use of it
    inputs: tuple[tuple[int, ...], ...]  # each node's inputs, by position
    schemas: tuple[pa.Schema, ...]  # each node's output
    members: tuple[int, ...]  # the nodes this stage runs, in pipeline order
    watermark: WatermarkClock
    states: Mapping[str, StateTablePlan]  # by table name
    tables: Mapping[str, OutputTable]  # by table name
    prefix: str  # the attempt's staging directory, relative to each table
    exchange_dir: str  # where exchange files go (inside the dead-letter table's staging directory)
    outgoing: tuple[Edge, ...] = ()  # edges from this stage's nodes to a later stage's
    incoming: tuple[Edge, ...] = ()  # edges into this stage's nodes from an earlier stage's
    source_keys: Mapping[int, Mapping[str, str]] = field(default_factory=dict)  # node -> key column -> operator
    computed_keys: Mapping[int, tuple[tuple[int, str, str], ...]] = field(default_factory=dict)  # node -> (input, column, by)
    source_ids: tuple[str, ...] = ()
    source_files: Mapping[int, tuple[str, ...]] = field(default_factory=dict)  # source index -> the epoch's file names
    receivers: int = 1  # tasks of the next stage (for the outgoing edges' partitioning)
    singletons: frozenset[int] = frozenset()  # nodes only the stage's first task runs (their inputs all arrive there)


@dataclass(frozen=True)
class TaskInput:
    """One task's own part of a stage: its key groups, its source splits, the exchange files it reads."""

    index: int
    groups: KeyGroups
    splits: Mapping[int, tuple[Split, ...]] = field(default_factory=dict)  # source node -> splits
    exchanged: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # edge name -> files for this task


@dataclass(frozen=True)
class TaskResult:
    """What a task reports to the driver."""

    files: Mapping[str, list[dict[str, Any]]]  # table -> staged file descriptions
    removes: Mapping[str, list[str]]  # table -> stored files (relative paths) its staged files replace
    exchange: Mapping[str, Mapping[int, list[str]]]  # edge name -> receiving task -> files
    rows_in: int  # records and dead letters read from sources
    observations: list[tuple[str | None, int | None, int]]  # the watermark assigners' (id, max event time, bound)
    counts: Mapping[str, int]

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> "TaskResult":
        doc = json.loads(text)
        doc["exchange"] = {edge: {int(k): v for k, v in parts.items()} for edge, parts in doc["exchange"].items()}
        doc["observations"] = [tuple(o) for o in doc["observations"]]
        return cls(**doc)


class TaskRuntime:
    """:class:`~barrierflow.operators.base.Task` of one task: its clocks, state tables and the rows it emits."""

    def __init__(self, plan: TaskPlan, task: TaskInput) -> None:
        self.plan = plan
        self.task = task
        self.epoch = plan.epoch
        self.processing_time_ms = plan.processing_time_ms
        self.key_groups = plan.key_groups
        self.parallelism = plan.parallelism
        self.first_task = task.index == 0
        self.clock = plan.watermark.copy()
        self._states: dict[str, TaskStateTable] = {}
        self._emitted: dict[str, list[pa.Table]] = {}
        self._upserts: dict[str, tuple[pa.Table, tuple[str, ...]]] = {}
        self.counts: dict[str, int] = {}

    @property
    def watermark_prev_us(self) -> int | None:
        return self.clock.watermark_prev_us

    @property
    def watermark_us(self) -> int | None:
        return self.clock.watermark_us

    def state(self, spec: StateSpec) -> TaskStateTable:
        name = spec.table_name
        if name not in self._states:
            if name not in self.plan.states:
                raise CheckpointError(f"state table {name} is not one this epoch planned ({sorted(self.plan.states)})")
            self._states[name] = TaskStateTable(self.plan.states[name], self.task.groups, self.epoch, self.processing_time_ms)
        return self._states[name]

    def _check_planned(self, table: str) -> None:
        if table not in self.plan.tables:
            raise CheckpointError(f"table {table} is not one this epoch planned ({sorted(self.plan.tables)})")

    def emit(self, table: str, rows: pa.Table) -> None:
        self._check_planned(table)
        if rows.num_rows:
            self._emitted.setdefault(table, []).append(rows)

    def upsert(self, table: str, rows: pa.Table, key: Sequence[str]) -> None:
        self._check_planned(table)
        if table in self._upserts:
            raise CheckpointError(f"upsert sink {table} written twice in one task of epoch {self.epoch}")
        self._upserts[table] = (rows, tuple(key))

    def observe_event_time(self, assigner_id: str, max_us: int | None, out_of_orderness_us: int) -> None:
        self.clock.observe(assigner_id, max_us, out_of_orderness_us)

    def count(self, what: str, n: int) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def stage_all(self) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[str]]]:
        """Step 4: every table's staged files, and the stored files rewritten."""
        files: dict[str, list[dict[str, Any]]] = {}
        removes: dict[str, list[str]] = {}
        for name, plan_state in self.plan.states.items():
            if plan_state.whole and self.task.index != 0:
                continue  # read whole by every task; staged by the first
            # A table due for compaction is compacted by every task holding key groups, whatever it changed.
            if name in self._states or plan_state.compact:
                files[name] = self.state(plan_state.spec).finish(self.plan.prefix, self.plan.ranges)
        for name, table in self.plan.tables.items():
            rewritten: Sequence[str] | None = None
            if name in self._upserts:
                new, key = self._upserts[name]
                rewritten = table.stored if table.rewrite_all else _files_with_keys(table.stored, new, key)
                kept = rows_without_keys(_read_stored(rewritten, table.schema), new, key)
                rows = pa.concat_tables([kept, conform(new, table.schema)]).sort_by([(k, "ascending") for k in key])
            else:
                parts = [_with_epoch(p, self.epoch, table.schema) for p in self._emitted.get(name, [])]
                if table.rewrite_all and self.task.index == 0:
                    # A widened append sink: its stored rows, read with the wider types, are staged again.
                    rewritten = table.stored
                    parts.insert(0, _read_stored(rewritten, table.schema))
                if not parts:
                    continue
                rows = pa.concat_tables(parts)
            if rewritten is not None:
                removes[name] = [u[len(table.uri.rstrip("/")) + 1 :] for u in rewritten]
            files[name] = write_partition(table.uri, self.plan.prefix, table.schema, None, rows)
        return files, removes


def _with_epoch(rows: pa.Table, epoch: int, schema: pa.Schema) -> pa.Table:
    rows = rows.drop_columns([c for c in rows.column_names if c == EPOCH])
    rows = rows.append_column(EPOCH, pa.repeat(pa.scalar(epoch, pa.int64()), rows.num_rows))
    return conform(rows, schema)


def _read(uri: str, columns: list[str] | None = None) -> pa.Table:
    fs, path = arrow_filesystem(uri)
    return pq.read_table(path, filesystem=fs, columns=columns)


def _read_stored(uris: Sequence[str], schema: pa.Schema) -> pa.Table:
    """The rows of a table's stored files, in the staged files' schema (a column a file lacks reads null)."""
    return pa.concat_tables([conform(_read(uri), schema) for uri in uris]) if uris else schema.empty_table()


def _files_with_keys(uris: Sequence[str], rows: pa.Table, key: Sequence[str]) -> list[str]:
    """Those of ``uris`` holding a row of one of ``rows``' keys (read by their key columns only)."""
    return [uri for uri in uris if rows_with_keys(_read(uri, list(key)), rows, key).num_rows]


def run_task(plan: TaskPlan, task: TaskInput) -> TaskResult:
    """Steps 1-4 for one task (see the module docstring)."""
    runtime = TaskRuntime(plan, task)
    outputs: dict[int, pa.Table] = {}
    rows_in = 0
    incoming = {(e.consumer, e.input): e for e in plan.incoming}
    for position in plan.members:
        node = plan.nodes[position]
        assert node is not None  # a member of the stage
        if position in plan.singletons and task.index != 0:
            outputs[position] = plan.schemas[position].empty_table()
            continue
        source = getattr(node, "source", None)
        if source is not None:  # Step 1: the source's splits.
            parts = []
            for split in task.splits.get(position, ()):
                records, dead = source.read(split, plan.source_keys.get(position, {}))
                parts.append(records)
                runtime.emit(DEAD_LETTER, dead)
                rows_in += records.num_rows + dead.num_rows
            out = pa.concat_tables(parts) if parts else plan.schemas[position].empty_table()
        else:
            inputs = [
                read_exchange(task.exchanged.get(edge.name, ()), plan.schemas[upstream], edge)
                if (edge := incoming.get((position, i))) is not None
                else outputs[upstream]
                for i, upstream in enumerate(plan.inputs[position])
            ]
            # Step 2: keys computed on the way are checked before the keyed operator.
            for i, column, computed_by in plan.computed_keys.get(position, ()):
                inputs[i], dead = split_computed_keys(
                    inputs[i], node.operator_id, [(column, computed_by)], plan.source_ids, plan.source_files
                )
                runtime.emit(DEAD_LETTER, dead)
            out = node.run(runtime, inputs)
        schema = plan.schemas[position]
        outputs[position] = out.select(schema.names).cast(schema) if out.schema != schema else out
    exchange = {  # Step 3.
        edge.name: {
            receiver: [write_exchange(plan.exchange_dir, edge, task.index, receiver, part)]
            for receiver, part in partition(outputs[edge.producer], edge, plan.key_groups, plan.receivers).items()
            if part.num_rows
        }
        for edge in plan.outgoing
    }
    files, removes = runtime.stage_all()  # Step 4.
    return TaskResult(files, removes, exchange, rows_in, runtime.clock.observations, runtime.counts)


def task_function(plan: TaskPlan, inputs: Sequence[TaskInput], arrow: bool = False) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """A stage's tasks as a Spark partition function: task indices in, one JSON result per task out (``arrow``: both as batches
    of ``mapInArrow``, for Spark Connect, which has no RDDs)."""

    def run(parts: Iterable[Any]) -> Iterator[Any]:
        for index in (i for batch in parts for i in batch[0].to_pylist()) if arrow else parts:
            result = run_task(plan, inputs[index]).to_json()
            yield pa.record_batch([[result]], ["result"]) if arrow else result

    return run
