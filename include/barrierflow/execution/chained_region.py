"""Chained region: a small epoch's sources and the operators right after them, in one Python task.

Flink chains operators that need no shuffle between them into one task. On
Spark, reading a source is a job that parses and counts its lines, a
deduplication a lookup job and a write, a watermark assigner an aggregate
and a state write: for an epoch of a few thousand records, their fixed costs
are most of its time. :mod:`barrierflow.execution.chaining` runs one pipeline shape
(a source, a running aggregate, a sink) as Python tasks; this module chains
the *front* of any pipeline:

- the **region** (:func:`chained_region`) is every JSON Lines
  :class:`~barrierflow.connectors.FileSource` with a ``schema`` whose epoch
  reads whole files, and every operator downstream whose inputs all lie in
  the region and which has a chained form for them (``Node.chained_schema``
  is not None; ``chained_state_specs`` and ``apply_chained``);
- its **outputs** are the region's nodes with a consumer outside it: the
  rest of the pipeline runs on Spark as before, on frames read from the
  Parquet files the task wrote.

An epoch (:func:`run_region`):

1. Wait for the restore point (the region reads state as of epoch n-1).
   Take each state table's files (``DeltaStateBackend.chainable_files``);
   decline if one is too large for a task or cannot be served by the
   Python workers' cache. Register every state table's staging, so that an
   error aborts its staging directory.
2. One task (:func:`region_task`) reads the epoch's files whole, parses them
   as Spark's path would (:mod:`barrierflow.connectors.local_jsonl`, which
   declines a line it cannot parse exactly as Spark does), runs the region's
   operators in pipeline order on Arrow tables, then writes each state
   table's changes (every live row in a compaction's directory when the table
   is due, as ``DeltaStateBackend.stage`` does), each output and the dead
   letters. Outputs and dead letters go to the attempt's exchange directory,
   inside the dead-letter table's staging directory: an aborted attempt
   deletes them with it, the maintenance sweep deletes what a crash left,
   and the epoch deletes them once its tables are staged.
3. Declined: every registration is withdrawn (nothing was written) and the
   epoch runs wholly on Spark. Else the staged state files complete their
   registrations, the watermark assigners report to the epoch, and the
   outputs and dead letters become Spark frames.

The results are those of the Spark path: the same records, dead letters,
state rows and watermarks (the tests run pipelines both ways).
``BARRIERFLOW_OPERATOR_CHAINING=false`` turns it off, as it does
:mod:`barrierflow.execution.chaining`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from barrierflow.checkpointing.checkpoint import StagedFile, TableKind
from barrierflow.connectors.dead_letters import DEAD_LETTER_SCHEMA
from barrierflow.connectors.file_source import FileSource
from barrierflow.connectors.local_jsonl import LocalParseDeclined, parse_jsonl_lines
from barrierflow.connectors.source import SEQ, planned_bytes
from barrierflow.core import faults
from barrierflow.execution.chaining import CHAINING_ENV, spark_key_groups
from barrierflow.execution.spark import describe_jobs
from barrierflow.state.spec import KEY_GROUP, StateSpec
from barrierflow.state.worker_cache import StateLookup, every_live_row, live_rows_of
from barrierflow.storage import objects
from barrierflow.storage.layout import COMPACTED_DIR
from barrierflow.storage.objects import arrow_filesystem, join_uri, normalize_uri
from barrierflow.storage.staging import write_partition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from barrierflow.execution.runtime import EpochContext
    from barrierflow.operators.base import Node

__all__ = ["ChainedRegion", "RegionTask", "RegionDeclined", "chained_region", "run_region", "region_task", "MAX_REGION_INPUT_BYTES", "MAX_REGION_STATE_ROWS"]

# The task holds the epoch's input, its parsed records and the region's state in memory.
MAX_REGION_INPUT_BYTES = 64 * 1024 * 1024
MAX_REGION_STATE_ROWS = 2_000_000
# The exchange directory's name inside the attempt's staging directory of the dead-letter table.
_EXCHANGE_DIR = "_exchange"
_RESULT_SCHEMA = pa.schema([("result", pa.string())])
_DEAD_SCHEMA = pa.schema([f for f in DEAD_LETTER_SCHEMA if f.name != "_epoch"])
_log = logging.getLogger(__name__)


class RegionDeclined(Exception):
    """The task leaves this epoch to Spark; the message says why (logged)."""


@dataclass(frozen=True)
class ChainedRegion:
    """The chained front of a pipeline for one epoch: its nodes in pipeline order and their output schemas."""

    nodes: tuple["Node", ...]
    schemas: tuple[pa.Schema, ...]  # each node's output, ``_seq`` included
    outputs: tuple[int, ...]  # positions in ``nodes`` of those with a consumer outside the region


@dataclass(frozen=True)
class _Source:
    source_id: str
    source_index: int
    files: tuple[tuple[str, str, int], ...]  # (name, URI, size its barrier recorded)
    schema: pa.Schema
    keys: Mapping[str, str]


@dataclass(frozen=True)
class _State:
    spec: StateSpec
    uri: str
    lookup: StateLookup
    compact: bool  # the table is due: write every live row after the epoch, in a compaction's directory


@dataclass(frozen=True)
class _Sink:
    uri: str
    schema: pa.Schema  # the staged files' (``_epoch`` last, then an upsert's left-out columns), as ``DeltaSink.pre_commit`` checks it
    key: tuple[str, ...] = ()  # an upsert's: it rewrites ``rewrite`` but the rows of the keys it writes
    rewrite: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Plan:
    """What the task needs (pickled to the executor); nodes are copies without their graph links."""

    nodes: tuple["Node | _Source", ...]
    inputs: tuple[tuple[int, ...], ...]
    schemas: tuple[pa.Schema, ...]
    outputs: tuple[int, ...]
    states: Mapping[str, _State]  # by table name
    exchange: str
    prefix: str
    epoch: int
    processing_time_ms: int
    key_groups: int
    parallelism: int
    watermark_prev_us: int | None
    max_event_time_us: int | None
    assigner_ids: frozenset[str]
    sinks: Mapping[str, _Sink]  # append sinks and side outputs the region writes, by name


@dataclass
class RegionTask:
    """What an operator's ``apply_chained`` sees: the epoch's clocks, its state tables, its watermark and its emitted rows.

    The watermark follows ``EpochContext``'s rules: :meth:`observe` is
    ``observe_event_time`` (one assigner) or ``observe_assigner`` (several),
    and :attr:`watermark_us` is W(n) once every assigner has observed (the
    region runs in pipeline order, so before any event-time operator).
    """

    epoch: int
    processing_time_ms: int
    key_groups: int
    states: Mapping[str, _State]
    watermark_prev_us: int | None  # W(n-1)
    max_event_time_us: int | None  # as of epoch n-1, then as observed
    assigner_ids: frozenset[str]
    watermark_us: int | None = None  # W(n) as observed so far (W(n-1) at first)
    # (assigner id or None, max event time, out-of-orderness) per observation, for the driver to report.
    observations: list[tuple[str | None, int | None, int]] = field(default_factory=list)
    staged: dict[str, pa.Table] = field(default_factory=dict)
    emitted: dict[str, list[pa.Table]] = field(default_factory=dict)
    _assigner_watermarks: dict[str, int | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.watermark_us = self.watermark_prev_us

    def key_groups_of(self, keys: pa.Table) -> pa.Array:
        """Each row's key group, as Spark computes it (``pmod(xxhash64(key), key_groups)``)."""
        return pa.array(spark_key_groups(keys, self.key_groups), pa.int32())

    def live_rows(self, spec: StateSpec, keyed: pa.Table) -> pa.Table:
        """The live rows of ``spec`` for the keys of ``keyed`` (key columns and :data:`KEY_GROUP`), as of epoch n-1."""
        return live_rows_of(self.states[spec.table_name].lookup, keyed)

    def every_live_row(self, spec: StateSpec) -> pa.Table:
        """Every live row of ``spec`` as of epoch n-1 (tombstones and expired rows dropped)."""
        return every_live_row(self.states[spec.table_name].lookup, self.key_groups)

    def stage(self, spec: StateSpec, changes: pa.Table) -> None:
        """Stage ``spec``'s changed keys: its columns but ``_updated_at_ms`` and ``_epoch``, as ``DeltaStateBackend.stage`` takes them."""
        if spec.table_name in self.staged:
            raise RegionDeclined(f"state table {spec.table_name} staged twice")
        schema = spec.arrow_schema()
        rows = changes.append_column("_updated_at_ms", pa.repeat(pa.scalar(self.processing_time_ms, pa.int64()), changes.num_rows))
        rows = rows.append_column("_epoch", pa.repeat(pa.scalar(self.epoch, pa.int64()), changes.num_rows))
        self.staged[spec.table_name] = rows.select(schema.names).cast(schema)

    def emit(self, name: str, rows: pa.Table) -> None:
        """Rows of the append sink or side output ``name`` (declared by the node's ``chained_side_outputs``); ``_epoch`` is added."""
        self.emitted.setdefault(name, []).append(rows)

    def observe(self, assigner_id: str | None, max_us: int | None, out_of_orderness_us: int) -> None:
        """An assigner's maximum event time (``assigner_id`` None: the pipeline's only assigner, untracked)."""
        from barrierflow.operators.watermark import combined_watermark

        self.observations.append((assigner_id, max_us, out_of_orderness_us))
        if max_us is not None:
            self.max_event_time_us = max(max_us, self.max_event_time_us or max_us)
        if assigner_id is None:
            if self.max_event_time_us is not None:
                self.watermark_us = self.max_event_time_us - out_of_orderness_us
            return
        self._assigner_watermarks[assigner_id] = None if max_us is None else max_us - out_of_orderness_us
        complete, watermark = combined_watermark(self._assigner_watermarks, set(self.assigner_ids))
        if complete:
            self.watermark_us = watermark


def chained_region(ctx: "EpochContext") -> ChainedRegion | None:
    """The chained front of ``ctx``'s pipeline for its epoch, or None (the epoch runs on Spark)."""
    from barrierflow.operators.watermark import WatermarkAssigner
    from barrierflow.plan.pipeline import SourceNode

    pipe, barrier = ctx.pipeline, ctx.barrier
    if os.environ.get(CHAINING_ENV, "true").strip().lower() in ("0", "false", "no", "off") or pipe.state_backend != "delta":
        return None
    if planned_bytes(barrier.end_offsets) > MAX_REGION_INPUT_BYTES:
        return None
    nodes: list["Node"] = []
    schemas: dict[int, pa.Schema] = {}
    assigners = [n for n in pipe.nodes if isinstance(n, WatermarkAssigner)]
    for node in pipe.nodes:
        schema = None
        if isinstance(node, SourceNode):
            schema = _chained_source_schema(node, barrier.end_offsets.get(node.operator_id) or {})
        elif node.inputs() and all(id(i) in schemas for i in node.inputs()) and not pipe.computed_keys(node):
            # An event-time operator sees W(n) in the task only if every assigner runs there first.
            if not node.uses_watermark or all(id(a) in schemas for a in assigners):
                schema = node.chained_schema([schemas[id(i)] for i in node.inputs()])
        if schema is not None:
            nodes.append(node)
            schemas[id(node)] = schema
    if not any(not isinstance(n, SourceNode) for n in nodes):
        return None  # sources alone: Spark's reader is as quick
    inside = {id(n) for n in nodes}
    outputs = tuple(i for i, n in enumerate(nodes) if any(id(c) not in inside for c in pipe.children(n)))
    return ChainedRegion(tuple(nodes), tuple(schemas[id(n)] for n in nodes), outputs)


def _chained_source_schema(node: Any, end: Mapping[str, Any]) -> pa.Schema | None:
    """A source's records' schema (``_seq`` last) if its epoch can be read in the task: JSON Lines, a schema, whole files."""
    source = node.source
    if not isinstance(source, FileSource) or source.format != "jsonl" or source.schema is None or source.parser is not None:
        return None
    ranges = end.get("files") or []
    if end.get("late") or any(f != 0 or t is not None for _, f, t, _ in ranges):
        return None
    if not objects.is_local(normalize_uri(source.path)):
        # Object-store files are split into lines by Python tasks on Spark's path, whose rules for blank
        # lines and invalid UTF-8 differ from Spark's own reader's, which the task's parser reproduces.
        return None
    return _records_schema(source.schema)


def _records_schema(schema: pa.Schema) -> pa.Schema:
    """A source's records as Spark's path types them: every column nullable (``from_json``'s), ``_seq`` last."""
    return pa.schema([*(f.with_nullable(True) for f in schema), pa.field(SEQ, pa.int64())])


def run_region(ctx: "EpochContext", region: ChainedRegion) -> tuple[dict[int, "DataFrame"], int, "DataFrame | None"] | None:
    """Steps 1-3: the region's outputs as frames by node id, the records read and the dead letters; or None (declined).

    The dead letters are None when the region is the whole pipeline: the task staged them.
    """
    from barrierflow.connectors.delta_sink import EPOCH_FIELD, SinkNode, check_append_schema, upsert_rewrite
    from barrierflow.plan.pipeline import SourceNode

    pipe = ctx.pipeline
    index = {id(node): i for i, node in enumerate(pipe.nodes)}
    position = {id(node): i for i, node in enumerate(region.nodes)}
    # Step 1.
    record = ctx.restore_point()
    plan_nodes: list[Any] = []
    states: dict[str, _State] = {}
    sinks: dict[str, _Sink] = {}
    registrations: list[tuple[int, dict[str, Any]]] = []
    for node, schema in zip(region.nodes, region.schemas):
        if isinstance(node, SourceNode):
            source = node.source
            assert isinstance(source, FileSource) and source.schema is not None
            end = ctx.barrier.end_offsets[source.source_id]
            base = normalize_uri(source.path)
            keys = {k: op for k, op in pipe.source_keys(node).items() if k in source.schema.names}
            inputs = tuple((name, join_uri(base, name), size) for name, _, _, size in end.get("files") or [])
            plan_nodes.append(_Source(source.source_id, pipe.sources.index(node), inputs, source.schema, keys))
            continue
        plan_nodes.append(_detached(node))
        input_schemas = [region.schemas[position[id(i)]] for i in node.inputs()]
        for spec in node.chained_state_specs(input_schemas):
            chainable = ctx.state.chainable_files(spec, MAX_REGION_STATE_ROWS)
            if chainable is None:
                _not_chained(ctx, f"state table {spec.table_name} too large for one task, or not served by the workers' cache")
                return None
            files, _, removes, base_version = chainable
            uri = ctx.layout.state_table(spec.operator_id, spec.name)
            states[spec.table_name] = _State(spec, uri, ctx.state.lookup_of(spec, files), bool(removes))
            registrations.append((index[id(node)], {
                "name": spec.table_name, "uri": uri, "kind": TableKind.STATE, "schema": spec.arrow_schema(),
                "primary_key": tuple(spec.key_columns), "removes": removes, "base_version": base_version,
            }))  # fmt: skip
        for name, rows_schema in node.chained_side_outputs(input_schemas).items():
            uri = ctx.layout.sink_table(name)
            registration: dict[str, Any] = {"name": name, "uri": uri, "kind": TableKind.SINK}
            if isinstance(node, SinkNode) and node.sink.mode == "upsert":
                rewrite = upsert_rewrite(name, uri, rows_schema.append(EPOCH_FIELD))
                if rewrite is None:
                    _not_chained(ctx, f"upsert sink {name} widens its table, or is too large to rewrite whole")
                    return None
                sinks[name] = _Sink(uri, rewrite.schema, node.sink.key, rewrite.rewrite)
                registration.update(schema=rewrite.schema, primary_key=node.sink.key, removes=rewrite.removes, base_version=rewrite.base_version)
            else:
                file_schema = check_append_schema(name, uri, rows_schema.append(EPOCH_FIELD))
                if file_schema is None:
                    _not_chained(ctx, f"sink {name} widens its table")
                    return None
                sinks[name] = _Sink(uri, file_schema)
                registration.update(schema=file_schema)
            registrations.append((index[id(node)], registration))
    # The whole pipeline: the task writes the dead letters too, at the place Spark's path stages them (after every node).
    whole = len(region.nodes) == len(pipe.nodes)
    if whole:
        registrations.append((len(pipe.nodes), {"name": "dead_letter", "uri": ctx.layout.dead_letter, "kind": TableKind.DEAD_LETTER, "schema": DEAD_LETTER_SCHEMA}))
        sinks["dead_letter"] = _Sink(ctx.layout.dead_letter, DEAD_LETTER_SCHEMA)
    # Registered before the task writes: an error aborts their staging directories.
    staged: dict[str, Future[list[StagedFile]]] = {}
    for node_index, registration in registrations:
        staged[registration["name"]] = Future()
        ctx.run_as(node_index)
        ctx.stage_files(files=staged[registration["name"]], **registration)
    ctx.run_as(len(pipe.nodes))  # what this thread stages next comes after every node, as on Spark's path
    exchange = join_uri(ctx.layout.dead_letter, ctx.staging_prefix, _EXCHANGE_DIR)
    plan = _Plan(
        nodes=tuple(plan_nodes),
        inputs=tuple(tuple(position[id(i)] for i in node.inputs()) for node in region.nodes),
        schemas=region.schemas,
        outputs=region.outputs,
        states=states,
        exchange=exchange,
        prefix=ctx.staging_prefix,
        epoch=ctx.epoch,
        processing_time_ms=ctx.processing_time_ms,
        key_groups=ctx.key_groups,
        parallelism=ctx.parallelism,
        watermark_prev_us=record.watermark_us if record else None,
        max_event_time_us=record.max_event_time_us if record else None,
        assigner_ids=frozenset(pipe.watermark_assigner_ids()),
        sinks=sinks,
    )
    # Step 2.
    started = time.monotonic()
    names = ", ".join(n.operator_id for n in region.nodes)
    describe_jobs(ctx.spark, f"epoch {ctx.epoch}: chained {names}")
    try:
        # collect(), not first(): a task whose output is not read to the end loses its Python worker.
        [row] = ctx.spark.range(1, numPartitions=1).mapInArrow(partial(region_task, plan), "result string").collect()
        result = json.loads(row["result"])
    except BaseException as exc:
        for future in staged.values():
            future.set_exception(exc)
        raise
    # Step 3.
    if result.get("declined"):
        for future in staged.values():
            future.set_result([])
        ctx.discard_staged()  # registrations withdrawn: the Spark path stages these tables
        objects.remove_tree(exchange)
        _not_chained(ctx, result["declined"])
        return None
    for name, future in staged.items():
        future.set_result([StagedFile(**f) for f in result["files"].get(name, [])])
    faults.maybe_fail("process.after_read")
    ctx.on_release(partial(objects.remove_tree, exchange))
    for assigner_id, max_us, bound in result["observations"]:
        if assigner_id is None:
            ctx.observe_event_time(max_us, bound)
        else:
            ctx.observe_assigner(assigner_id, max_us, bound)
    for node in region.nodes:
        if isinstance(node, SourceNode):
            ranges = ctx.barrier.end_offsets[node.operator_id].get("files") or []
            ctx.source_files[pipe.sources.index(node)] = tuple(name for name, *_ in ranges)
    from barrierflow.execution.table_files import read_parquet_files

    frames = {
        id(region.nodes[i]): read_parquet_files(ctx.spark, result["outputs"][str(i)], region.schemas[i]) for i in region.outputs
    }
    dead = None if whole else read_parquet_files(ctx.spark, result["dead"], _DEAD_SCHEMA)
    _log.info("epoch %d: chained %s in %.0f ms", ctx.epoch, names, (time.monotonic() - started) * 1000)
    return frames, int(result["rows_in"]), dead


def _detached(node: "Node") -> "Node":
    """A copy of ``node`` without its links to other nodes (the task gets its inputs' rows, not the graph)."""
    from barrierflow.operators.base import Node

    links: dict[str, Any] = {}
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if isinstance(value, Node):
            links[f.name] = None
        elif isinstance(value, tuple) and value and all(isinstance(v, Node) for v in value):
            links[f.name] = ()
    return dataclasses.replace(node, **links)


def _not_chained(ctx: "EpochContext", why: str) -> None:
    _log.info("epoch %d: front not chained: %s", ctx.epoch, why)


def region_task(plan: _Plan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Executor side (``mapInArrow`` over one row): step 2; one row, the result as JSON."""
    for _ in batches:
        pass
    task = RegionTask(
        plan.epoch, plan.processing_time_ms, plan.key_groups, plan.states, plan.watermark_prev_us, plan.max_event_time_us,
        plan.assigner_ids,
    )  # fmt: skip
    try:
        outputs, dead, rows_in = _compute(plan, task)
        if "dead_letter" in plan.sinks:
            task.emit("dead_letter", dead)
        # A decline while writing (an upsert's stored rows) leaves files the driver's abort deletes.
        result = {
            "rows_in": rows_in,
            "observations": task.observations,
            "files": {**_write_state(plan, task), **_write_sinks(plan, task)},
            "outputs": {str(i): [_write_exchange(plan, f"{i}", outputs[i])] for i in plan.outputs},
            "dead": [] if "dead_letter" in plan.sinks else [_write_exchange(plan, "dead_letters", dead)],
        }
    except (RegionDeclined, LocalParseDeclined) as declined:
        yield pa.RecordBatch.from_pylist([{"result": json.dumps({"declined": str(declined)})}], schema=_RESULT_SCHEMA)
        return
    yield pa.RecordBatch.from_pylist([{"result": json.dumps(result)}], schema=_RESULT_SCHEMA)


def _compute(plan: _Plan, task: RegionTask) -> tuple[list[pa.Table], pa.Table, int]:
    """The region's nodes in order: each node's output, the dead letters and the records read (good and bad lines)."""
    outputs: list[pa.Table] = []
    dead_parts: list[pa.Table] = []
    rows_in = 0
    for node, inputs, schema in zip(plan.nodes, plan.inputs, plan.schemas):
        if isinstance(node, _Source):
            records, dead = _read_source(node)
            rows_in += records.num_rows + dead.num_rows
            dead_parts.append(dead)
            out = records
        else:
            out = node.apply_chained(task, [outputs[i] for i in inputs])
        outputs.append(out.select(schema.names).cast(schema))
    dead_all = pa.concat_tables(dead_parts) if dead_parts else _DEAD_SCHEMA.empty_table()
    return outputs, dead_all, rows_in


def _read_source(source: _Source) -> tuple[pa.Table, pa.Table]:
    """A source's epoch: its records with ``_seq``, and its dead letters (as ``FileSource._read_jsonl`` has them)."""
    from barrierflow.connectors.source import file_position

    records: list[pa.Table] = []
    dead: list[pa.Table] = []
    line_bits = 36
    for fidx, (name, uri, size) in enumerate(source.files):
        fs, path = arrow_filesystem(uri)
        with fs.open_input_stream(path) as stream:
            data = stream.readall()
        if len(data) != size:
            raise RegionDeclined(f"{name}: {len(data)} bytes, {size} when its epoch was planned")
        good, bad = parse_jsonl_lines(data, source.schema, source.keys)
        base = file_position(source.source_index, fidx) << line_bits
        seq = pc.add(good["_line"], pa.scalar(base, pa.int64()))
        records.append(good.drop_columns(["_line"]).append_column(SEQ, seq))
        reason_detail = [str(e).split(": ", 1) for e in bad["_error"].to_pylist()]
        dead.append(
            pa.table(
                {
                    "source": pa.repeat(pa.scalar(source.source_id), bad.num_rows),
                    "source_file": pa.repeat(pa.scalar(name), bad.num_rows),
                    "line": bad["_line"],
                    "raw": bad["_raw"],
                    "reason": pa.array([r[0] for r in reason_detail], pa.string()),
                    "detail": pa.array([r[1] if len(r) > 1 else "" for r in reason_detail], pa.string()),
                }
            )
        )
    schema = _records_schema(source.schema)
    return (
        pa.concat_tables([r.cast(schema) for r in records]) if records else schema.empty_table(),
        pa.concat_tables([d.cast(_DEAD_SCHEMA) for d in dead]) if dead else _DEAD_SCHEMA.empty_table(),
    )


def _write_state(plan: _Plan, task: RegionTask) -> dict[str, list[dict[str, Any]]]:
    """Each staged table's files (a table the epoch did not change but is due for compaction is compacted all the same)."""
    written: dict[str, list[dict[str, Any]]] = {}
    for name, state in plan.states.items():
        schema = state.spec.arrow_schema()
        changes = task.staged.get(name, schema.empty_table())
        rows, prefix = changes, plan.prefix
        if state.compact:
            # Every live row once: the stored rows of keys the epoch left alone, then its changes that are not deletions.
            stored = every_live_row(state.lookup, plan.key_groups).select(schema.names).cast(schema)
            keys = state.spec.key_columns
            numbered = stored.select(keys).append_column("_row", pa.array(range(stored.num_rows), pa.int64()))
            kept = numbered.join(changes.select(keys), keys=keys, join_type="left anti")
            rows = pa.concat_tables([stored.take(kept["_row"]), changes.filter(pc.invert(changes["_deleted"]))])
            prefix = f"{plan.prefix}/{COMPACTED_DIR}"
        elif not changes.num_rows:
            continue
        rows = rows.sort_by(KEY_GROUP)
        files: list[dict[str, Any]] = []
        for described in write_partition(state.uri, prefix, schema, (plan.parallelism, plan.key_groups), {}, iter(rows.to_batches())):
            files += described.to_pylist()
        written[name] = files
    return written


def _write_sinks(plan: _Plan, task: RegionTask) -> dict[str, list[dict[str, Any]]]:
    """Each append sink's and side output's files: the rows emitted, ``_epoch`` added (none: no file, as on Spark)."""
    written: dict[str, list[dict[str, Any]]] = {}
    for name, sink in plan.sinks.items():
        parts = [_conformed(t.append_column("_epoch", pa.repeat(pa.scalar(plan.epoch, pa.int64()), t.num_rows)), sink.schema)
                 for t in task.emitted.get(name, [])]  # fmt: skip
        rows = pa.concat_tables(parts) if parts else sink.schema.empty_table()
        if sink.key:
            rows = _upserted(sink, rows)
        files: list[dict[str, Any]] = []
        for described in write_partition(sink.uri, plan.prefix, sink.schema, None, {}, iter(rows.to_batches())):
            files += described.to_pylist()
        written[name] = files
    return written


def _conformed(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` with ``schema``'s columns, in its order and types; a column they lack reads null (as Spark's reader reads it)."""
    columns = [rows[f.name] if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type) for f in schema]
    return pa.table(columns, names=schema.names).cast(schema)


def _upserted(sink: _Sink, rows: pa.Table) -> pa.Table:
    """The whole table after an upsert epoch: stored rows of keys it does not write, then its rows, sorted by the key (``DeltaSink._rewrite``)."""
    key = list(sink.key)
    stored_parts = []
    for uri in sink.rewrite:
        fs, path = arrow_filesystem(uri)
        stored_parts.append(_conformed(pq.read_table(path, filesystem=fs), sink.schema))
    stored = pa.concat_tables(stored_parts) if stored_parts else sink.schema.empty_table()
    if any(rows[k].null_count or stored[k].null_count for k in key):
        raise RegionDeclined(f"a null key in upsert sink {sink.uri}")  # Spark matches null keys to each other; Arrow's join does not
    numbered = stored.select(key).append_column("_row", pa.array(range(stored.num_rows), pa.int64()))
    kept = numbered.join(rows.select(key), keys=key, join_type="left anti")
    return pa.concat_tables([stored.take(kept["_row"]), rows]).sort_by([(k, "ascending") for k in key])


def _write_exchange(plan: _Plan, name: str, rows: pa.Table) -> str:
    """One Parquet file of the exchange directory holding ``rows``; its URI."""
    uri = join_uri(plan.exchange, f"{name}.parquet")
    fs, path = arrow_filesystem(uri)
    if objects.is_local(uri):  # an object store has no directories
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    pq.write_table(rows, path, filesystem=fs)
    return uri
