"""The Spark runner of an epoch: plans its tasks, runs them as Spark jobs, and hands their staged files to the epoch.

Spark places the tasks on executors, retries a lost one, and runs each in a Python worker
(:func:`~barrierflow.execution.task.run_task`). The driver (:func:`run_epoch`, for the checkpoint coordinator) reads no record:

1. Plan: the pipeline's schemas, state tables and stages (:func:`~barrierflow.plan.planner.physical_plan`); each source's splits.
2. Placement, a size decision (never a semantic one; README "Where the work runs"): a small epoch runs its whole pipeline in one
   task; a larger one runs stage by stage, exchanging rows through files (:mod:`barrierflow.execution.exchange`), its first now
   if it reads nothing epoch n-1 commits (sources, stateless operators: as Flink's sources read on past a barrier).
3. Wait for the restore point (epoch n-1 completed): the state it reads. Once 4. is done, barrier n+1 may follow.
4. Register every table the epoch stages, in pipeline order, before any task writes (an error then aborts their staging
   directories): each state table as of epoch n-1, each sink and side output after its schema checks
   (:func:`~barrierflow.connectors.delta_sink.plan_sink_table`), then the dead letters; every table's log read side by side.
5. Run the tasks: one Spark job per stage; each stage's watermark observations advance the epoch's clock for the next stage.
6. Complete the registrations with the tasks' files; stage on the driver the few rows it holds (each source's offsets, the largest
   event time of each tracked watermark assigner).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, Mapping, Protocol

import pyarrow as pa

from barrierflow.connectors.delta_sink import SinkNode, abort, plan_sink_table
from barrierflow.connectors.source import Split, planned_bytes
from barrierflow.core import errors, faults, settings
from barrierflow.core.columns import SEQ
from barrierflow.core.dead_letters import DEAD_LETTER_SCHEMA
from barrierflow.core.errors import BarrierflowError
from barrierflow.execution.exchange import key_group_ranges
from barrierflow.execution.spark import describe_jobs, spark_context
from barrierflow.execution.task import DEAD_LETTER, OutputTable, TaskInput, TaskPlan, TaskResult, task_function
from barrierflow.operators.base import Node, ship_user_code
from barrierflow.operators.operator_state import source_offsets_table
from barrierflow.operators.watermark import WatermarkAssigner, WatermarkClock, max_event_time_row, max_event_time_spec
from barrierflow.plan.pipeline import Pipeline, SourceNode
from barrierflow.plan.planner import PhysicalPlan, physical_plan
from barrierflow.state.snapshots import EpochStateTables, read_small_table
from barrierflow.state.spec import KeyGroups, StateSpec, StateTablePlan
from barrierflow.storage.commits import StagedFile, TableKind
from barrierflow.storage.layout import PipelineLayout
from barrierflow.storage.objects import join_uri, remove_tree
from barrierflow.storage.staging import write_parquet

__all__ = ["Epoch", "run_epoch", "epoch_parallelism", "task_error"]

_log = logging.getLogger(__name__)


class Offsets(Protocol):
    """What the runner reads of the epoch's barrier: each source's start and end offsets."""

    @property
    def start_offsets(self) -> Mapping[str, Any]: ...

    @property
    def end_offsets(self) -> Mapping[str, Any]: ...


class Epoch(Protocol):
    """What the runner needs of the driver's epoch (:class:`barrierflow.checkpointing.epoch.EpochContext`)."""

    spark: Any
    layout: PipelineLayout
    pipeline: Pipeline

    @property
    def barrier(self) -> Offsets: ...

    epoch: int
    processing_time_ms: int
    staging_prefix: str
    max_event_time_us: int | None
    watermark_us: int | None
    state_tables: EpochStateTables | None

    def restore_point(self) -> Any: ...

    def started_on_state(self) -> None: ...

    def stage_files(
        self, *, name: str, uri: str, kind: TableKind, schema: pa.Schema, primary_key: tuple[str, ...] = (),
        base_version: int | None = None, removes: tuple[str, ...] = (), table_schema: pa.Schema | None = None,
    ) -> "Future[tuple[list[StagedFile], tuple[str, ...]]]": ...  # fmt: skip

    def on_release(self, callback: Any) -> None: ...


def epoch_parallelism(parallelism: int, input_bytes: int) -> int:
    """The key-group range tasks of a parallel epoch: the pipeline's parallelism, more for big input."""
    return max(parallelism, -(-input_bytes // settings.INPUT_BYTES_PER_PARTITION))


def run_epoch(epoch: Epoch) -> int:
    """Steps 1-6 of the module docstring; returns the records and dead letters read."""
    pipe, barrier = epoch.pipeline, epoch.barrier
    started = time.monotonic()
    # 1. The splits first: a source refuses an epoch it cannot read (a Delta table's retyped column) before its schema is asked.
    sources = {i: n.source for i, n in enumerate(pipe.nodes) if isinstance(n, SourceNode) and n.source is not None}
    ends = {i: barrier.end_offsets.get(s.source_id) or {} for i, s in sources.items()}
    input_bytes = sum(planned_bytes({"_": end}) if end else 0 for end in ends.values())
    parallelism = epoch_parallelism(pipe.parallelism, input_bytes)
    split_bytes = max(settings.MIN_SPLIT_BYTES, min(settings.SPLIT_BYTES, -(-input_bytes // parallelism)))

    def split(size: int | None) -> dict[int, list[Split]]:
        """Each source's part of the barrier as splits of about ``size`` bytes (None: one)."""
        return {p: s.splits(ends[p], k, size) for k, (p, s) in enumerate(sources.items())}

    single = input_bytes <= settings.SINGLE_TASK_INPUT_BYTES.value()  # 2.
    splits = split(None if single else split_bytes)
    plan = physical_plan(pipe, {i: s.record_schema(ends[i]).append(pa.field(SEQ, pa.int64())) for i, s in sources.items()})
    exchange_dir = join_uri(epoch.layout.dead_letter, epoch.staging_prefix, "_exchange")
    epoch.on_release(partial(remove_tree, exchange_dir))
    base = dict(
        epoch=epoch.epoch, processing_time_ms=epoch.processing_time_ms, key_groups=pipe.key_groups,
        parallelism=pipe.parallelism, ranges=parallelism, inputs=plan.inputs, schemas=plan.schemas, prefix=epoch.staging_prefix,
        exchange_dir=exchange_dir, source_keys=plan.source_keys, computed_keys=plan.computed_keys,
        source_ids=tuple(n.operator_id for n in pipe.sources), singletons=plan.singletons,
        source_files={k: _file_names(splits[p]) for k, p in enumerate(sources)},
    )  # fmt: skip
    _ship_user_code(pipe)
    registry = _Registry(epoch)
    early = not single and _reads_nothing_committed(pipe, plan)
    results: list[TaskResult] = []
    try:
        if early:  # 2. (its dead letters are staged before their table is registered: discarded below if the epoch stops)
            results = _run_tasks(epoch, plan, registry, WatermarkClock(None, {}, {}, False), splits, parallelism, base, [], 0, 1)
        prior = epoch.restore_point()  # 3.
        assert epoch.state_tables is not None  # made by the restore point
        registry.register(plan, epoch.state_tables)  # 4.
        row_counts = (epoch.state_tables.stored_rows(p.uri) or 0 for p in registry.states.values())  # summed only for one task
        if single and sum(row_counts) > settings.SINGLE_TASK_STATE_ROWS.value():
            single = False
            splits = split(split_bytes)
        clock = _watermark_clock(pipe, prior, epoch.layout)
        registry.stored_maxima = dict(clock.maxima)  # as stored: step 6 writes an assigner's row only if it grew
        epoch.started_on_state()  # 3., once 4. registered every table; 5.
        results = _run_tasks(epoch, plan, registry, clock, splits, None if single else parallelism, base, results, int(early))
        faults.maybe_fail("process.after_read")
        registry.complete(results)  # 6.
        epoch.watermark_us = clock.watermark_us
        epoch.max_event_time_us = clock.max_event_time_us
        registry.stage_driver_rows(clock)
    except BaseException as exc:
        registry.fail(exc)
        if early:
            abort(epoch.layout.dead_letter, epoch.staging_prefix)
        raise
    counts: Counter[str] = sum((Counter(r.counts) for r in results), Counter())
    for what, n in sorted(counts.items()):  # a kernel's count: a message with {n} in it
        _log.warning("epoch %d: %s", epoch.epoch, what.format(n=n))
    rows_in = sum(r.rows_in for r in results)
    _log.info(
        "epoch %d: %s in %.0f ms (%d records read)", epoch.epoch, "one task" if single else f"{len(plan.stages)} stages",
        (time.monotonic() - started) * 1000, rows_in,
    )  # fmt: skip
    return rows_in


# The last line of a task's traceback that names an exception, as Spark passes it on: "module.Class: message".
_RAISED = re.compile(r"^(?:[\w.]+\.)?(\w+): (.+)$", re.M)


def task_error(exc: BaseException) -> BarrierflowError | None:
    """The barrierflow error a task raised (Spark wraps it in its own): the epoch fails as it would on the driver."""
    for name, message in reversed(_RAISED.findall(str(exc))):
        cls = getattr(errors, name, None)
        if isinstance(cls, type) and issubclass(cls, BarrierflowError) and cls is not errors.IncompatibleSavepointError:
            return cls(message.strip())
    return None


def _run_tasks(
    epoch: Epoch, plan: PhysicalPlan, registry: "_Registry", clock: WatermarkClock, splits: Mapping[int, list[Split]],
    parallelism: int | None, base: dict[str, Any], done: list[TaskResult], first: int = 0, stop: int | None = None,
) -> list[TaskResult]:  # fmt: skip
    """Step 5: stages ``first`` to ``stop`` (``done``: the results of those before), each a job (``parallelism`` None: every node
    in one task), its tasks reading what earlier stages wrote; each stage's watermark observations advance the clock."""
    pipe = epoch.pipeline
    every = KeyGroups.all(pipe.key_groups)
    ranges = key_group_ranges(parallelism or 1, pipe.key_groups)
    results = list(done)
    for stage, members in list(enumerate(plan.stages if parallelism else [tuple(range(len(pipe.nodes)))]))[first:stop]:
        incoming, outgoing = plan.crossing(stage) if parallelism else ([], [])
        names = ", ".join(pipe.nodes[i].operator_id for i in members)
        description = f"epoch {epoch.epoch}: " + (f"stage {stage} ({names})" if parallelism else "every operator in one task")
        if not parallelism:
            inputs = [TaskInput(0, every, {p: tuple(s) for p, s in splits.items()})]
        elif stage == 0:
            parts = [(p, split) for p in members if p in splits for split in splits[p]]
            inputs = [TaskInput(i, every, {p: (split,)}) for i, (p, split) in enumerate(parts)] or [TaskInput(0, every)]
        else:
            inputs = [
                TaskInput(t, groups, exchanged={e.name: tuple(f for r in results for f in r.exchange.get(e.name, {}).get(t, [])) for e in incoming})
                for t, groups in enumerate(ranges[:1] if set(members) <= plan.singletons else ranges)  # singletons: task 0
            ]  # fmt: skip
        held = set(members)
        task_plan = TaskPlan(
            nodes=tuple(_detached(n) if i in held else None for i, n in enumerate(pipe.nodes)), members=members, watermark=clock,
            states={k: v for k, v in registry.states.items() if registry.owner[k] in held},
            tables={k: v for k, v in registry.tables.items() if registry.owner.get(k, -1) in held or k == DEAD_LETTER},
            outgoing=tuple(outgoing), incoming=tuple(incoming), receivers=len(ranges), **base,
        )  # fmt: skip
        stage_results = _run_job(epoch.spark, description, task_plan, inputs)
        for result in stage_results:
            clock.merge(result.observations)
        results += stage_results
    return results


def _reads_nothing_committed(pipe: Pipeline, plan: PhysicalPlan) -> bool:
    """Whether the first of several stages reads nothing epoch n-1 commits: sources (their offsets are staged on the driver, after
    the restore point) and operators without state, side outputs or event time."""
    owners = {owner for owner, _ in plan.side_outputs.values()}
    nodes = [(i, pipe.nodes[i]) for i in plan.stages[0]]
    clean = [isinstance(n, SourceNode) or not (plan.state_specs[i] or i in owners or n.uses_watermark) for i, n in nodes]
    return len(plan.stages) > 1 and all(clean) and not any(isinstance(n, WatermarkAssigner) for _, n in nodes)


def _run_job(spark: Any, description: str, plan: TaskPlan, inputs: list[TaskInput]) -> list[TaskResult]:
    """One Spark job running a task per input; their results, in task order. On a classic session the tasks are an RDD's
    partitions (a two-task DataFrame job cost the driver JVM 46-80 ms of CPU, an RDD's 20-33); Spark Connect has no RDDs."""
    describe_jobs(spark, description)
    started, count, sc = time.monotonic(), len(inputs), spark_context(spark)
    run = task_function(plan, inputs, arrow=sc is None)
    try:  # collect(), not first(): a task whose output is not read to the end loses its Python worker
        if sc is not None:
            results = sc.parallelize(range(count), count).mapPartitions(run).collect()
        else:
            results = [r["result"] for r in spark.range(count, numPartitions=count).mapInArrow(run, "result string").collect()]
    except Exception as exc:
        raise task_error(exc) or exc from exc
    _log.info("%s: %d task(s) in %.0f ms", description, count, (time.monotonic() - started) * 1000)
    return [TaskResult.from_json(result) for result in results]


class _Registry:
    """Step 4: every table the epoch stages, registered with it in pipeline order, and what the tasks need of each."""

    def __init__(self, epoch: Epoch) -> None:
        self.epoch = epoch
        self.states: dict[str, StateTablePlan] = {}
        self.tables = {DEAD_LETTER: OutputTable(DEAD_LETTER, epoch.layout.dead_letter, DEAD_LETTER_SCHEMA)}  # by any stage
        self.owner: dict[str, int] = {}  # table -> the node writing it
        self.futures: dict[str, Future[tuple[list[StagedFile], tuple[str, ...]]]] = {}
        self.driver_rows: list[tuple[StateSpec, str, Node]] = []  # tables the driver writes (offsets, watermark maxima)
        self.stored_maxima: dict[str, int | None] = {}  # each assigner's largest event time as epoch n-1 stored it

    def register(self, plan: PhysicalPlan, state_tables: EpochStateTables) -> None:
        """Every table of the epoch, in pipeline order, what each holds read first and side by side (delta-rs reads a Delta log
        without the GIL); a registration failing (a sink's schema refused) fails the others."""
        epoch, pipe, layout = self.epoch, self.epoch.pipeline, self.epoch.layout
        on_driver = [isinstance(n, (SourceNode, WatermarkAssigner)) for n in pipe.nodes]  # their rows are staged here (6.)
        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="barrierflow-register") as pool:
            # Broadcast state is read whole by every task, other state per key group.
            planned = {s.table_name: pool.submit(state_tables.plan, s, layout.state_table(s.operator_id, s.name),
                                                 whole=s.name in getattr(pipe.nodes[p], "broadcast_state_names", ()))
                       for p in range(len(pipe.nodes)) if not on_driver[p] for s in plan.state_specs[p]}  # fmt: skip
            sinks = {name: pool.submit(plan_sink_table, name, layout.sink_table(name), rows, _sink_key(pipe.nodes[owner]))
                     for name, (owner, rows) in plan.side_outputs.items()}  # fmt: skip
        for position, node in enumerate(pipe.nodes):
            for spec in plan.state_specs[position]:
                uri = layout.state_table(spec.operator_id, spec.name)
                removes: tuple[str, ...] = ()
                version: int | None = None
                if on_driver[position]:
                    self.driver_rows.append((spec, uri, node))
                else:
                    state, removes, version = planned[spec.table_name].result()
                    self.states[spec.table_name], self.owner[spec.table_name] = state, position
                self.futures[spec.table_name] = epoch.stage_files(
                    name=spec.table_name, uri=uri, kind=TableKind.STATE, schema=spec.arrow_schema(),
                    primary_key=tuple(spec.key_columns), base_version=version, removes=removes,
                )  # fmt: skip
            for name, (owner, rows) in plan.side_outputs.items():
                if owner != position:
                    continue
                key, uri, sink = _sink_key(node), layout.sink_table(name), sinks[name].result()
                self.tables[name] = OutputTable(name, uri, sink.schema, sink.stored, sink.rewrite_all)
                self.owner[name] = position
                self.futures[name] = epoch.stage_files(
                    name=name, uri=uri, kind=TableKind.SINK, schema=sink.schema, primary_key=key,
                    base_version=sink.base_version if (key or sink.rewrite_all) else None, table_schema=sink.table_schema,
                )  # fmt: skip
        self.futures[DEAD_LETTER] = epoch.stage_files(
            name=DEAD_LETTER, uri=layout.dead_letter, kind=TableKind.DEAD_LETTER, schema=DEAD_LETTER_SCHEMA
        )

    def complete(self, results: list[TaskResult]) -> None:
        for name, future in self.futures.items():
            if name in self.states or name in self.tables:
                files = [StagedFile(**f) for r in results for f in r.files.get(name, [])]
                removes = tuple(p for r in results for p in r.removes.get(name, []))
                future.set_result((files, removes))

    def fail(self, exc: BaseException) -> None:
        for future in self.futures.values():
            if not future.done():
                future.set_exception(exc)

    def stage_driver_rows(self, clock: WatermarkClock) -> None:
        """Step 6: each source's offsets and each tracked assigner's largest event time, written here."""
        epoch, barrier = self.epoch, self.epoch.barrier
        def stage(spec: StateSpec, uri: str, node: Node) -> None:  # an error fails every registration left (run_epoch)
            if isinstance(node, WatermarkAssigner):
                # A row only when the assigner's largest event time grew this epoch.
                seen = clock.maxima.get(node.operator_id)
                rows = spec.arrow_schema().empty_table()
                if seen is not None and seen != self.stored_maxima.get(node.operator_id):
                    rows = max_event_time_row(spec, node.operator_id, seen, epoch.processing_time_ms, epoch.epoch)
            else:
                offsets = (barrier.start_offsets.get(node.operator_id), barrier.end_offsets[node.operator_id])
                rows = source_offsets_table(read_small_table(uri, spec), node.operator_id, *offsets,
                                            epoch.pipeline.parallelism, epoch.epoch, epoch.processing_time_ms)  # fmt: skip
            self.futures[spec.table_name].set_result((write_parquet(uri, epoch.staging_prefix, rows), ()))
        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="barrierflow-driver-rows") as pool:  # tables apart
            list(pool.map(lambda row: stage(*row), self.driver_rows))


def _watermark_clock(pipe: Pipeline, prior: Any, layout: PipelineLayout) -> WatermarkClock:
    """The epoch's clock from the restore point: W(n-1) and each assigner's largest event time so far."""
    assigners = [n for n in pipe.nodes if isinstance(n, WatermarkAssigner)]
    maxima: dict[str, int | None] = {}
    for a in assigners:
        if a.tracked:
            spec = max_event_time_spec(a.operator_id)
            rows = read_small_table(layout.state_table(a.operator_id, spec.name), spec)
            maxima[a.operator_id] = rows.column("max_event_time_us")[0].as_py() if rows.num_rows else None
        else:
            maxima[a.operator_id] = prior.max_event_time_us if prior is not None else None
    bounds = {a.operator_id: a.out_of_orderness_us for a in assigners}
    return WatermarkClock(prior.watermark_us if prior is not None else None, maxima, bounds, any(a.tracked for a in assigners))


def _sink_key(node: Node) -> tuple[str, ...]:
    return node.sink.key if isinstance(node, SinkNode) and node.sink is not None else ()


def _file_names(splits: list[Split]) -> tuple[str, ...]:
    """The epoch's file names of one source, by file index."""
    names = {f.file_index: f.name for split in splits for f in split.files}
    return tuple(names[i] for i in sorted(names))


def _ship_user_code(pipe: Pipeline) -> None:
    """Have the tasks get the user's functions and classes by value: their modules need not be on the executors' path."""
    for node in pipe.nodes:
        values = [getattr(node, f.name) for f in dataclasses.fields(node)]
        source = getattr(node, "source", None)
        if source is not None and dataclasses.is_dataclass(source):
            values += [getattr(source, f.name) for f in dataclasses.fields(source)]
        for value in values:
            if callable(value) or hasattr(value, "__dict__"):
                ship_user_code(value)


def _detached(node: Node) -> Node:
    """A copy of ``node`` without its links to other nodes (a task gets its inputs' rows, not the graph)."""
    links: dict[str, Any] = {}
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if isinstance(value, Node):
            links[f.name] = None
        elif isinstance(value, tuple) and value and all(isinstance(v, Node) for v in value):
            links[f.name] = ()
    return dataclasses.replace(node, **links)
