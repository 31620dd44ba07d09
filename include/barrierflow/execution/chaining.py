"""Operator chaining: a file source, a keyed running aggregate and its append sink as two Python tasks per epoch.

Flink chains operators that need no shuffle between them into one task, so
records pass between them as function calls. Here an epoch normally runs as
several Spark jobs (parse and aggregate, merge with state, one write per
table), and for an epoch of a few hundred thousand records the jobs' fixed
costs and the hand-over of rows between the JVM and Python tasks are most of
its time. A pipeline of exactly this shape

    FileSource(format="jsonl", schema=...) -> key_by(...).aggregate(...) -> DeltaSink.append(...)

(``state_backend="delta"``) instead computes an epoch in two Python tasks on
the executors, with Arrow (:func:`run_chained`): one reads and aggregates
the epoch's input while epoch n-1 still commits, the other merges with the
state once it has. The driver commits as for any epoch: the manifest, the
tables staged and the crash guarantees are the same. Turn it off with
``BARRIERFLOW_OPERATOR_CHAINING=false`` (Flink's
``pipeline.operator-chaining.enabled``).

The task computes exactly what the Spark path computes, or declines and
writes nothing, and the epoch then runs on Spark as any other. It declines
whatever Spark's reader and the running aggregate treat specially: a line
that is not a plain record (bad JSON, blank, a dead letter, an escape or a
byte the two JSON parsers could read differently), a key whose sum needs the
decimal or sorted method, a value that is not finite or is -0.0. The driver
does not chain an epoch with more input than :data:`MAX_INPUT_BYTES`, state
larger than :data:`MAX_STATE_ROWS` or a sink table whose schema evolved.

The read task (:func:`read_task`, steps 1-4) and the merge task
(:func:`merge_task`, steps 5-6):

1. Read the epoch's files whole; decline unless each has the size its
   barrier recorded and its bytes are plain (:func:`_plain`).
2. Parse them with Arrow's JSON reader against the source's schema; decline
   on any error, a line count that differs from the records', a required
   field or key missing, an empty text key.
3. Aggregate per key natively in Arrow: the count, exact sums in
   micro-units, min and max; decline where Spark would flag a key.
4. Compute each key's key group as Spark does (``pmod(xxhash64(key), n)``).
5. Take the state's live rows: every one, when the merge before on this host
   left them (:func:`_live_name`: named by the state table's files, which
   never change); else look the keys up in the Python worker's cache of the
   state table's files (:mod:`barrierflow.state.worker_cache`). Merge with
   the running aggregate's own Arrow arithmetic.
6. Write the changed keys' state rows (every live row when the state table
   is due for compaction, as ``DeltaStateBackend.stage`` does), clustered by
   key-group range, and the sink rows; return their file descriptions only.
   Leave every live row after the epoch on the host for the next merge,
   when this epoch touched a quarter of them or more.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import time
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from barrierflow.checkpointing.checkpoint import StagedFile, TableKind
from barrierflow.connectors.delta_sink import EPOCH_FIELD, SinkNode
from barrierflow.connectors.file_source import FileSource
from barrierflow.connectors.source import planned_bytes
from barrierflow.core import faults
from barrierflow.core.errors import SourceError
from barrierflow.execution.spark import describe_jobs
from barrierflow.operators.aggregate import (
    LONG_BOUND,
    MICRO,
    MICRO_SUM_BOUND,
    MICRO_VALUE_BOUND,
    RunningAggregate,
    merged_in_task,
)
from barrierflow.state.spec import KEY_GROUP, StateSpec
from barrierflow.state.worker_cache import StateFile, StateLookup, every_live_row, live_rows_of, save_on_host, take_from_host
from barrierflow.storage.delta import borrow_snapshot, give_back
from barrierflow.storage.layout import COMPACTED_DIR
from barrierflow.storage.objects import arrow_filesystem, join_uri, normalize_uri
from barrierflow.storage.staging import DESCRIPTION_SCHEMA, write_partition

if TYPE_CHECKING:
    from barrierflow.execution.runtime import EpochContext
    from barrierflow.plan.pipeline import Pipeline, SourceNode

__all__ = [
    "CHAINING_ENV", "MAX_INPUT_BYTES", "MAX_STATE_ROWS", "Chain", "chain_of", "run_chained", "read_task", "merge_task", "spark_key_groups",
    "aggregates_in_a_task", "epoch_aggregates",
]  # fmt: skip

CHAINING_ENV = "BARRIERFLOW_OPERATOR_CHAINING"
# The task holds its epoch's input and parsed records in memory.
MAX_INPUT_BYTES = 256 * 1024 * 1024
# ... and reads every live state row through its worker's cache.
MAX_STATE_ROWS = 2_000_000
# Column types whose JSON forms both parsers read alike (step 2).
_SCALARS = (pa.string(), pa.int64(), pa.float64())
_SPARK_HASH_SEED = 42
# Lines longer than this are left to Spark: below every limit of Jackson's (nesting 1000, a number of 1000 digits).
_MAX_LINE_BYTES = 1000
_NEWLINE, _CARRIAGE_RETURN, _OPEN_BRACE, _BACKSLASH, _CAPITAL_I, _CAPITAL_N = (ord(c) for c in "\n\r{\\IN")
_log = logging.getLogger(__name__)
# The read task's result: the records read, or why it declined.
_READ_SCHEMA = pa.schema([("rows", pa.int64()), ("declined", pa.string())])
# The merge task's: one row per staged file (``table`` "state" or "sink"), or
# one row saying why it declined (its input changed since the read task).
_RESULT_SCHEMA = pa.schema([("table", pa.string()), *DESCRIPTION_SCHEMA, ("declined", pa.string())])


class _Declined(Exception):
    """The task leaves this epoch to Spark; the message says why (logged)."""


@dataclass(frozen=True)
class Chain:
    """The three nodes of a chainable pipeline."""

    source: "SourceNode"
    aggregate: RunningAggregate
    sink: SinkNode

    @property
    def file_source(self) -> FileSource:
        assert isinstance(self.source.source, FileSource)
        return self.source.source


@dataclass(frozen=True)
class _Read:
    """What the read task (steps 1-4) needs (pickled to the executor)."""

    files: tuple[tuple[str, int], ...]  # (URI, size its barrier recorded)
    schema: pa.Schema  # the source's, every field nullable: required ones are checked (step 2)
    required: tuple[str, ...]
    text_keys: tuple[str, ...]
    aggregate: RunningAggregate
    key_groups: int
    # Where the read task leaves the epoch's aggregates for the merge task on the same host.
    saved_as: str


@dataclass(frozen=True)
class _Merge:
    """What the merge task (steps 5-6) needs."""

    read: _Read
    state_schema: pa.Schema
    lookup: StateLookup
    parallelism: int
    state_uri: str
    sink_uri: str
    sink_schema: pa.Schema
    prefix: str
    stored_rows: int  # rows of ``lookup.files``
    compact: bool  # write every live row, in a compaction's directory (``DeltaStateBackend.stage``)
    processing_time_ms: int
    epoch: int


def chain_of(pipe: "Pipeline") -> Chain | None:
    """The chain, if ``pipe`` is exactly a JSON Lines file source, a running aggregate on its columns and an append sink."""
    from barrierflow.plan.pipeline import SourceNode

    if os.environ.get(CHAINING_ENV, "true").strip().lower() in ("0", "false", "no", "off"):
        return None
    if pipe.state_backend != "delta" or len(pipe.nodes) != 3:
        return None
    source, aggregate, sink = pipe.nodes
    if not (isinstance(source, SourceNode) and isinstance(aggregate, RunningAggregate) and isinstance(sink, SinkNode)):
        return None
    if aggregate.parent is not source or sink.parent is not aggregate or sink.sink.mode != "append":
        return None
    file_source = source.source
    if not isinstance(file_source, FileSource) or file_source.format != "jsonl" or file_source.schema is None:
        return None
    schema = file_source.schema
    if any(f.type not in _SCALARS for f in schema):
        return None
    key_ok = all(k in schema.names and schema.field(k).type in (pa.string(), pa.int64()) for k in aggregate.key)
    return Chain(source, aggregate, sink) if key_ok and aggregates_in_a_task(aggregate, schema) else None


def aggregates_in_a_task(aggregate: RunningAggregate, schema: pa.Schema) -> bool:
    """Whether :func:`epoch_aggregates` can fold records of ``schema`` into ``aggregate``: each value by exact sum or one aggregate, of a number column."""
    accumulators = [acc for acc in aggregate.state_accumulators() if acc.column is not None]
    if any(not acc.exact_sum and acc.kind is None for acc in accumulators):
        return False
    values = [acc.column for acc in accumulators]
    return all(c in schema.names and c not in aggregate.key and schema.field(c).type in (pa.int64(), pa.float64()) for c in values)


def epoch_aggregates(aggregate: RunningAggregate, records: pa.Table, key_groups: int) -> pa.Table:
    """Steps 3-4 on records already parsed (a chained region's running aggregate); raises ``ValueError`` where :func:`_aggregate` declines."""
    read = _Read(files=(), schema=records.schema, required=(), text_keys=(), aggregate=aggregate, key_groups=key_groups, saved_as="")
    try:
        return _aggregate(read, records)
    except _Declined as declined:
        raise ValueError(str(declined)) from None


def run_chained(ctx: "EpochContext", chain: Chain) -> int | None:
    """Compute the epoch as a chain and stage its tables; the records read, or None (declined: nothing staged).

    1. Read task (steps 1-4), before epoch n-1 completes: the epoch's
       aggregates, left on the executor's host.
    2. Wait for epoch n-1 (its state) and check that the state and sink
       tables can take a chained epoch.
    3. Merge task (steps 5-6): merge and write; it computes the aggregates
       again if it runs on another host than the read task.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    source, aggregate = chain.file_source, chain.aggregate
    assert source.schema is not None
    end = ctx.barrier.end_offsets[source.source_id]
    ranges = end.get("files") or []
    if not ranges or end.get("late") or any(f != 0 or t is not None for _, f, t, _ in ranges):
        _not_chained(ctx, "no input, late files or part of a file")
        return None
    if planned_bytes({source.source_id: end}) > MAX_INPUT_BYTES:
        _not_chained(ctx, f"more than {MAX_INPUT_BYTES} bytes of input")
        return None
    spec = aggregate.state_spec({k: source.schema.field(k).type for k in aggregate.key})
    if not ctx.state.may_chain(spec, MAX_STATE_ROWS):
        _not_chained(ctx, f"more than {MAX_STATE_ROWS} stored state rows")
        return None
    # Step 1.
    started = time.monotonic()
    read = _Read(
        files=tuple((join_uri(normalize_uri(source.path), name), size) for name, _, _, size in ranges),
        schema=pa.schema([f.with_nullable(True) for f in source.schema]),
        required=tuple(f.name for f in source.schema if not f.nullable),
        text_keys=tuple(k for k in aggregate.key if source.schema.field(k).type == pa.string()),
        aggregate=aggregate,
        key_groups=ctx.key_groups,
        saved_as=f"chained-{ctx.app_id}-{ctx.epoch}-{ctx.attempt_id}",
    )
    describe_jobs(ctx.spark, f"epoch {ctx.epoch}: chained read {source.source_id} -> {aggregate.operator_id}")
    # collect(), not first(): a task whose output is not read to the end loses its Python worker.
    [summary] = ctx.spark.range(1, numPartitions=1).mapInArrow(partial(read_task, read), from_arrow_schema(_READ_SCHEMA)).collect()
    if summary["declined"]:
        _not_chained(ctx, summary["declined"])
        return None
    faults.maybe_fail("process.after_read")
    read_ms = (time.monotonic() - started) * 1000
    # Step 2.
    chainable = ctx.state.chainable_files(spec, MAX_STATE_ROWS)
    sink_uri = ctx.layout.sink_table(chain.sink.sink.name)
    sink_schema = _sink_schema(sink_uri, aggregate, spec) if chainable is not None else None
    if chainable is None or sink_schema is None:
        _not_chained(ctx, "the state table is too large or has another schema, or the sink's schema evolved")
        return None
    files, stored, removes, base_version = chainable
    merge = _Merge(
        read=read,
        state_schema=spec.arrow_schema(),
        lookup=ctx.state.lookup_of(spec, files),
        parallelism=ctx.parallelism,
        state_uri=ctx.layout.state_table(spec.operator_id, spec.name),
        sink_uri=sink_uri,
        sink_schema=sink_schema,
        prefix=ctx.staging_prefix,
        stored_rows=stored,
        compact=bool(removes),
        processing_time_ms=ctx.processing_time_ms,
        epoch=ctx.epoch,
    )
    index = {id(node): i for i, node in enumerate(ctx.pipeline.nodes)}
    staged: dict[str, Future[list[StagedFile]]] = {"state": Future(), "sink": Future()}
    # Registered before the task writes: an error aborts both tables' staging directories.
    ctx.run_as(index[id(aggregate)])
    ctx.stage_files(
        name=spec.table_name, uri=merge.state_uri, kind=TableKind.STATE, files=staged["state"], schema=merge.state_schema,
        primary_key=tuple(spec.key_columns), removes=removes, base_version=base_version,
    )
    ctx.run_as(index[id(chain.sink)])
    ctx.stage_files(name=chain.sink.sink.name, uri=sink_uri, kind=TableKind.SINK, files=staged["sink"], schema=sink_schema)
    # Step 3.
    merging = time.monotonic()
    describe_jobs(ctx.spark, f"epoch {ctx.epoch}: chained {aggregate.operator_id} -> {chain.sink.sink.name}")
    try:
        rows = ctx.spark.range(1, numPartitions=1).mapInArrow(partial(merge_task, merge), from_arrow_schema(_RESULT_SCHEMA)).collect()
        if any(r["declined"] for r in rows):  # the input changed between the two tasks
            raise SourceError(f"epoch {ctx.epoch}: " + "; ".join(r["declined"] for r in rows if r["declined"]))
    except BaseException as exc:
        for future in staged.values():
            future.set_exception(exc)
        raise
    for table, future in staged.items():
        future.set_result([StagedFile(r["path"], r["size"], r["rows"], r["stats"]) for r in rows if r["table"] == table])
    ctx.rows_read = int(summary["rows"])
    _log.info("epoch %d: chained: read %.0f ms, merge and write %.0f ms", ctx.epoch, read_ms, (time.monotonic() - merging) * 1000)
    return ctx.rows_read


def _not_chained(ctx: "EpochContext", why: str) -> None:
    _log.info("epoch %d: not chained: %s", ctx.epoch, why)


def _sink_schema(uri: str, aggregate: RunningAggregate, spec: StateSpec) -> pa.Schema | None:
    """The sink files' schema: the aggregate's output and ``_epoch``, as the Spark path's first epoch records it.

    None (the epoch runs on Spark) if the table exists with other columns
    or types (a widened or evolved sink).
    """
    state = spec.arrow_schema()
    expected = pa.schema(
        [
            *[state.field(k) for k in aggregate.key],
            *[pa.field(agg.name, agg.running_result_arrow(state.empty_table()).type) for agg in aggregate.aggregations],
            EPOCH_FIELD,
        ]
    )
    table = borrow_snapshot(uri)
    if table is None:
        return expected
    try:
        stored = pa.schema(table.schema().to_arrow())
    finally:
        give_back(uri, table)
    return stored if [(f.name, f.type) for f in stored] == [(f.name, f.type) for f in expected] else None


def read_task(read: _Read, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Executor side (``mapInArrow`` over one row): steps 1-4, the aggregates saved on this host for :func:`merge_task`."""
    for _ in batches:
        pass
    try:
        records = _parse(read)
        epoch = _aggregate(read, records)
    except _Declined as declined:
        yield pa.RecordBatch.from_pylist([{"rows": 0, "declined": str(declined)}], schema=_READ_SCHEMA)
        return
    save_on_host(read.saved_as, epoch)
    yield pa.RecordBatch.from_pylist([{"rows": records.num_rows}], schema=_READ_SCHEMA)


def merge_task(merge: _Merge, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Executor side (``mapInArrow`` over one row): steps 5-6 (steps 1-4 again if the read task ran on another host)."""
    for _ in batches:
        pass
    aggregate = merge.read.aggregate
    epoch = take_from_host(merge.read.saved_as, _epoch_schema(merge.read))
    if epoch is None:
        try:
            epoch = _aggregate(merge.read, _parse(merge.read))
        except _Declined as declined:
            yield pa.RecordBatch.from_pylist([{"table": "", "declined": str(declined)}], schema=_RESULT_SCHEMA)
            return
    # Step 5. Every live row as of the snapshot, if a merge on this host left them (:func:`_live_name`).
    everything = take_from_host(_live_name(merge.state_uri, merge.lookup.files), merge.state_schema)
    if everything is None and (merge.compact or _keeps_live_rows(merge, epoch)):
        everything = every_live_row(merge.lookup, merge.read.key_groups)
    live = everything if everything is not None else live_rows_of(merge.lookup, epoch)
    state = merged_in_task(aggregate.key, aggregate.state_accumulators(), merge.state_schema, merge.processing_time_ms, merge.epoch, epoch, live)
    # Step 6.
    sink_rows = aggregate.outputs_arrow(state)
    after = None
    if everything is not None:
        # The stored rows of keys this epoch left alone keep their own epoch.
        kept = everything.join(state.select(list(aggregate.key)), keys=list(aggregate.key), join_type="left anti")
        after = pa.concat_tables([kept.select(merge.state_schema.names).cast(merge.state_schema), state])
    # A compaction writes every live row once, in a directory of its own.
    state, state_prefix = (after, f"{merge.prefix}/{COMPACTED_DIR}") if merge.compact and after is not None else (state, merge.prefix)
    state = state.sort_by(KEY_GROUP)
    ranges = (merge.parallelism, merge.read.key_groups)
    written: list[StateFile] = []
    for table, uri, prefix, schema, rows, constants, split in (
        ("state", merge.state_uri, state_prefix, merge.state_schema, state, {}, ranges),
        ("sink", merge.sink_uri, merge.prefix, merge.sink_schema, sink_rows, {"_epoch": merge.epoch}, None),
    ):
        for described in write_partition(uri, prefix, schema, split, constants, iter(rows.to_batches())):
            if table == "state":
                written += [StateFile(join_uri(uri, d["path"]), d["size"], None, None) for d in described.to_pylist()]
            yield described.append_column("table", pa.repeat(pa.scalar(table), described.num_rows)).append_column(
                "declined", pa.nulls(described.num_rows, pa.string())
            ).select(_RESULT_SCHEMA.names)
    if after is not None:
        files = written if merge.compact else [*merge.lookup.files, *written]
        save_on_host(_live_name(merge.state_uri, files), after)


def _keeps_live_rows(merge: _Merge, epoch: pa.Table) -> bool:
    """Whether to merge with every live row and leave them for the next epoch: when this one touches a quarter of them or more.

    Then the next merge on this host takes them instead of looking its keys
    up in the state files (a join with every live row costs about what a
    lookup of a quarter of them does). Not with a TTL: rows expire.
    """
    return merge.lookup.ttl_ms is None and epoch.num_rows * 4 >= merge.stored_rows


def _live_name(state_uri: str, files: "Iterable[StateFile]") -> str:
    """The host entry of a state table's live rows as of the snapshot of ``files`` (immutable: their URIs and sizes name it)."""
    listed = "\0".join(sorted(f"{f.uri}\0{f.size}" for f in files))
    return "chained-live-" + hashlib.sha256(f"{state_uri}\0{listed}".encode()).hexdigest()[:40]


def _epoch_schema(read: _Read) -> pa.Schema:
    """The columns :func:`_aggregate` returns (those of the Spark path's step 1)."""
    fields = [pa.field(k, read.schema.field(k).type) for k in read.aggregate.key]
    fields += [pa.field(KEY_GROUP, pa.int32()), pa.field("_n", pa.int64())]
    for acc in read.aggregate.state_accumulators():
        fields += acc.epoch_fields()
    return pa.schema(fields)


def _plain(name: str, data: bytes) -> int:
    r"""Its number of lines if Spark's JSON parser (Jackson) and Arrow's (RapidJSON) read ``data`` alike; else declines (step 1).

    Arrow's reader accepts some lines Spark's makes dead letters of, and
    reads some otherwise (cases checked against both, pyarrow 26 and Spark
    4.2). It is given only files where neither can happen:

    - valid UTF-8 (Arrow does not check it inside strings);
    - every line starts with ``{`` and is at most :data:`_MAX_LINE_BYTES`
      long: no blank line, no ``null`` line, no byte-order mark, no object
      spread over lines, and none of Jackson's limits on nesting, number,
      name and string lengths reached;
    - no control character but the lines' own ``\n`` and ``\r\n`` (Jackson
      refuses one inside a string, a tab included);
    - no ``\u`` escape (a lone surrogate is read differently), no ``-NaN``
      and no ``Inf`` that is not ``Infinity`` (Arrow reads them, Jackson
      does not).

    Several values on one line are caught after parsing: more records than
    lines (step 2).
    """
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            raise _Declined(f"{name}: not valid UTF-8") from None
    raw = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(raw == _NEWLINE)
    starts = np.concatenate(([0], ends + 1))
    if len(starts) > 1 and starts[-1] == len(raw):
        starts = starts[:-1]  # the last line's newline ends the file
    if np.any(raw[starts] != _OPEN_BRACE):
        raise _Declined(f"{name}: a line that does not start with '{{'")
    lengths = np.append(ends, len(raw))[: len(starts)] - starts
    if int(lengths.max()) > _MAX_LINE_BYTES:
        raise _Declined(f"{name}: a line longer than {_MAX_LINE_BYTES} bytes")
    # Byte searches only where the bytes they need occur (each is a pass over the file).
    carriage_returns = int(np.count_nonzero(raw == _CARRIAGE_RETURN))
    controls = int(np.count_nonzero(raw < 0x20))
    if controls != len(ends) + carriage_returns or (carriage_returns and carriage_returns != data.count(b"\r\n")):
        raise _Declined(f"{name}: a control character")
    if np.any(raw == _BACKSLASH) and b"\\u" in data:
        raise _Declined(f"{name}: a \\u escape")
    if (np.any(raw == _CAPITAL_I) and data.count(b"Inf") != data.count(b"Infinity")) or (np.any(raw == _CAPITAL_N) and b"-NaN" in data):
        raise _Declined(f"{name}: -NaN or Inf")
    return len(starts)


def _parse(task: _Read) -> pa.Table:
    """Steps 1-2: the epoch's records, every line of every file one record."""
    parts = []
    for uri, size in task.files:
        fs, path = arrow_filesystem(uri)
        with fs.open_input_stream(path) as stream:
            data = stream.readall()
        name = uri.rsplit("/", 1)[-1]
        if len(data) != size:
            raise _Declined(f"{name}: {len(data)} bytes, {size} when its epoch was planned")
        if not data:
            continue
        lines = _plain(name, data)
        try:
            parsed = pj.read_json(
                pa.BufferReader(data),
                read_options=pj.ReadOptions(use_threads=False),
                parse_options=pj.ParseOptions(explicit_schema=task.schema, unexpected_field_behavior="ignore"),
            )
        except pa.ArrowInvalid as exc:
            raise _Declined(f"{name}: {str(exc)[:200]}") from None
        if parsed.num_rows != lines:
            raise _Declined(f"{name}: {parsed.num_rows} records in {lines} lines")
        parts.append(parsed)  # an explicit schema: its columns, in its order, whatever the lines hold
    records = pa.concat_tables(parts) if parts else task.schema.empty_table()
    for name in (*task.required, *task.aggregate.key):
        if records[name].null_count:
            raise _Declined(f"{name} missing in a record")
    for name in task.text_keys:
        if pc.any(pc.equal(records[name], "")).as_py():
            raise _Declined(f"an empty {name}")
    return records


def _aggregate(task: _Read, records: pa.Table) -> pa.Table:
    """Steps 3-4: the epoch's aggregates per key, as the Spark path's step 1 (``RunningAggregate.apply``) has them."""
    key = list(task.aggregate.key)
    columns: dict[str, Any] = {k: records[k] for k in key}
    specs: list[tuple[Any, ...]] = [(key[0], "count", pc.CountOptions(mode="all"))]
    for acc in task.aggregate.state_accumulators():  # one per state column: a column's sum comes once
        if acc.column is None:
            continue
        values = pc.cast(records[acc.column], pa.float64()).combine_chunks()
        columns[acc.column] = values
        if acc.exact_sum:
            units = _micro_units(acc.column, values)
            columns[f"_u_{acc.column}"] = units
            columns[f"_a_{acc.column}"] = pc.abs(units)
            specs += [(f"_u_{acc.column}", "sum"), (f"_a_{acc.column}", "max")]
        elif acc.kind is not None:
            specs.append((acc.column, acc.kind))
    grouped = pa.table(columns).group_by(key, use_threads=False).aggregate(list({spec[:2]: spec for spec in specs}.values()))
    n = grouped[f"{key[0]}_count"]
    out: dict[str, Any] = {k: grouped[k] for k in key}
    out[KEY_GROUP] = pa.array(spark_key_groups(grouped.select(key), task.key_groups), pa.int32())
    out["_n"] = n
    for acc in task.aggregate.state_accumulators():
        if acc.column is None:
            continue
        if not acc.exact_sum:
            out[acc.epoch_fields()[0].name] = grouped[f"{acc.column}_{acc.kind}"]
            continue
        column = acc.column
        total = grouped[f"_u_{column}_sum"]
        bound = pc.multiply(pc.cast(grouped[f"_a_{column}_max"], pa.float64()), pc.cast(n, pa.float64()))
        # In integers: a long at or beyond 2**53 is a double at or beyond it (Spark compares the double).
        if pc.any(pc.greater_equal(bound, LONG_BOUND)).as_py() or pc.any(pc.greater_equal(pc.abs(total), int(MICRO_SUM_BOUND))).as_py():
            raise _Declined(f"a sum of {column} too large for micro-units")
        # Below 2**53 the integer is an exact double: one correctly rounded division, as Spark's.
        epoch_sum, flag = acc.epoch_fields()
        out[epoch_sum.name] = pc.divide(pc.cast(total, pa.float64(), safe=False), MICRO)
        out[flag.name] = pa.repeat(pa.scalar(False), grouped.num_rows)
    schema = _epoch_schema(task)
    return pa.table(out).select(schema.names).cast(schema)


def _micro_units(column: str, values: pa.Array) -> pa.Array:
    """Each value in millionths (null stays null); declines unless every value is finite, not -0.0 and exact in them."""
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    v = values.to_numpy(zero_copy_only=False)[valid]
    scaled = np.rint(v * MICRO)
    # -0.0 and 0.0 compare equal, so Spark's min/max of the two depend on arrival order.
    bad = ~np.isfinite(v) | (np.abs(v) >= MICRO_VALUE_BOUND) | (scaled / MICRO != v) | ((v == 0) & np.signbit(v))
    if bad.any():
        raise _Declined(f"{column}: a value that is not finite, is -0.0 or is not a whole number of millionths")
    units = np.zeros(len(values), dtype=np.int64)
    units[valid] = scaled.astype(np.int64)
    return pa.array(units, mask=~valid)


def spark_key_groups(keys: pa.Table, key_groups: int) -> np.ndarray:
    """``pmod(xxhash64(*keys), key_groups)`` as Spark computes it, for string and long key columns.

    Spark's ``xxhash64`` folds the columns left to right, each hashed with the
    previous one's hash as seed (42 first); a null leaves it unchanged; a
    string is hashed as its UTF-8 bytes, a long as its 8 little-endian bytes.
    """
    import xxhash

    hashes = np.full(keys.num_rows, _SPARK_HASH_SEED, dtype=np.uint64)
    for name in keys.column_names:
        column = keys[name]
        if column.type == pa.string():
            encode: Any = str.encode
        elif column.type == pa.int64():
            encode = partial(struct.pack, "<q")
        else:
            raise TypeError(f"key column {name}: {column.type} is not hashed here")
        values = column.to_pylist()
        hashes = np.fromiter(
            (h if v is None else xxhash.xxh64_intdigest(encode(v), h) for v, h in zip(values, hashes.tolist())),
            dtype=np.uint64,
            count=len(values),
        )
    return (hashes.view(np.int64) % key_groups).astype(np.int32)
