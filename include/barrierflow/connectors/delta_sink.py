"""Exactly-once Delta sinks: a two-phase-commit sink per table.

``begin_transaction`` names the attempt's staging directory inside the table;
``pre_commit`` writes the epoch's rows there (invisible to readers) and
returns the :class:`~barrierflow.checkpointing.checkpoint.TableCommit` that goes into the
manifest; ``commit`` publishes it with one Delta commit carrying the app
transaction (idempotent); ``abort`` deletes the staged files.

Modes: ``append`` adds the epoch's rows; ``upsert`` keeps one current row per
key by rewriting only the files that hold changed keys. Every row carries the
``_epoch`` that wrote it. Of the rows an epoch gives an upsert sink for one
key, the last wins, as Flink's upsert sinks keep a key's last change: the
last in arrival order (``_seq``, then a flat_map's sub-positions) where the
stream carries it, else the last the upstream operator emitted (a keyed
process function emits a key's rows in the order of its calls; rows of one
key come from one task). A running aggregate's output already holds one row
per key and is taken as it is. A null key is a key like any other: one row.

An epoch whose output widens a column's type (int to long, float to double;
:func:`~barrierflow.core.schema_evolution.check_sink_schema`) widens the table,
in either mode, with no Delta table feature (every Delta reader reads it):

  1. before the vote, ``pre_commit`` finds the widening on the table as it is
     (never on this process's memory of it: a restore may have narrowed it);
  2. the table's stored rows (every live file) are read with the wider type
     and staged with the epoch's own rows, in the attempt's staging
     directory like any staged file (invisible; deleted with the attempt);
  3. the TableCommit in the manifest names the table's new schema, the live
     files it replaces (removes) and the rewritten files (adds): what the
     commit is made of is fixed by the vote;
  4. the commit (:func:`~barrierflow.storage.delta.commit_epoch_table`) is
     one Delta commit: metaData with the widened schema, the removes, the
     adds, and the epoch's app transaction and fencing token. Rolled forward
     after a crash, it commits the manifest's files, or nothing if the
     table's app transaction already holds the epoch: the rows are never
     rewritten twice.

An output column narrower than the table's (code rolled back after a
widening) is staged as the table's type, which holds each value exactly;
nothing is rewritten.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import pyarrow as pa

from barrierflow.checkpointing.checkpoint import Fence, TableCommit, TableKind
from barrierflow.connectors.dead_letters import DEAD_LETTER_SCHEMA
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.core.schema_evolution import check_sink_schema, fitted_output_schema, widened_columns, widened_table_schema
from barrierflow.execution.table_files import PATH_COLUMN, read_parquet_files
from barrierflow.operators.base import Node, position_columns, position_order
from barrierflow.storage.delta import add_actions, commit_epoch_table, counted_rows, open_table
from barrierflow.storage.objects import join_uri, remove_tree

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

__all__ = [
    "DeltaSink", "SinkNode", "DEAD_LETTER_SCHEMA", "EPOCH_FIELD", "WHOLE_REWRITE_MAX_ROWS", "check_append_schema", "UpsertRewrite",
    "upsert_rewrite",
]  # fmt: skip

_log = logging.getLogger(__name__)

# An upsert sink table up to this many rows is rewritten whole each epoch: a
# job to find the files holding changed keys (and the wait for the epoch's
# rows it implies) costs more than rewriting them all.
WHOLE_REWRITE_MAX_ROWS = 100_000


# (table uri, output schema) pairs already checked by this process, and found
# to widen nothing, with the staged files' schema: an append sink's table is
# opened once per schema, not every epoch. (Only a restore changes a table's
# schema behind an epoch, and it narrows upsert sinks only, whose table every
# epoch opens anyway.)
_checked: dict[tuple[str, str], pa.Schema] = {}


@dataclass(frozen=True)
class _Widening:
    """An epoch's widening of its sink table (steps 1-3 of the module docstring)."""

    table_schema: pa.Schema  # the table's schema after the commit
    file_schema: pa.Schema  # the staged files': the table's, nullable where the epoch's rows may be null
    files: tuple[str, ...]  # every live file, relative to the table: rewritten, then removed
    base_version: int


def _check_schema(sink: str, uri: str, output: pa.Schema, table: DeltaTable | None) -> tuple[pa.Schema, _Widening | None]:
    """Before the vote: the output must fit the table's schema (:func:`check_sink_schema`); accepted changes are logged.

    Returns the staged files' schema (the output's, with the table's type
    where the output's is narrower) and the widening the epoch commits when
    the output widens a column (step 1).
    """
    key = (uri, output.to_string())
    if key in _checked and table is None:
        return _checked[key], None
    table = table if table is not None else open_table(uri)
    if table is None:
        _checked[key] = output
        return output, None
    stored = pa.schema(table.schema().to_arrow())
    if not widened_columns(stored, output):
        if key not in _checked:
            for change in check_sink_schema(sink, stored, output):
                _log.warning("sink %s: %s", sink, change)
        _checked[key] = fitted_output_schema(stored, output)
        return _checked[key], None
    # The table's schema changes with this epoch: what was checked against it before no longer holds.
    for stale in [k for k in _checked if k[0] == uri]:
        del _checked[stale]
    actions = add_actions(table)
    for change in check_sink_schema(sink, stored, output, counted_rows(actions.column("num_records").to_pylist())):
        _log.warning("sink %s: %s", sink, change)
    table_schema = widened_table_schema(stored, output)
    nullable = {f.name for f in output if f.nullable} | {n for n in table_schema.names if n not in output.names}
    file_schema = pa.schema([f.with_nullable(f.nullable or f.name in nullable) for f in table_schema])
    files = tuple(sorted(actions.column("path").to_pylist()))
    return output, _Widening(table_schema, file_schema, files, table.version())


def check_append_schema(sink: str, uri: str, output: pa.Schema) -> pa.Schema | None:
    """An append's staged files' schema (``output`` with ``_epoch``), as :meth:`DeltaSink.pre_commit` checks it; None if it widens the table."""
    schema, widening = _check_schema(sink, uri, output, None)
    return schema if widening is None else None


@dataclass(frozen=True)
class UpsertRewrite:
    """An upsert epoch rewriting its whole (small) table, as :meth:`DeltaSink.pre_commit` stages it without a widening."""

    schema: pa.Schema  # the staged files': the output's with ``_epoch``, then the table's columns it leaves out (nullable)
    rewrite: tuple[str, ...]  # URIs of every live file: their rows of keys the epoch does not write are kept
    removes: tuple[str, ...]  # the same files, relative to the table
    base_version: int | None


def upsert_rewrite(sink: str, uri: str, output: pa.Schema) -> UpsertRewrite | None:
    """The whole-table rewrite of an upsert whose rows have ``output``'s schema (``_epoch`` last); None where it widens the table or is too large to rewrite whole."""
    table = open_table(uri)
    schema, widening = _check_schema(sink, uri, output, table)
    if widening is not None:
        return None
    if table is None:
        return UpsertRewrite(schema, (), (), None)
    left_out = [f.with_nullable(True) for f in pa.schema(table.schema().to_arrow()) if f.name not in schema.names]
    actions = add_actions(table)
    rows = counted_rows(actions.column("num_records").to_pylist())
    if rows is None or rows > WHOLE_REWRITE_MAX_ROWS:
        return None
    paths = sorted(actions.column("path").to_pylist())
    return UpsertRewrite(pa.schema([*schema, *left_out]), tuple(join_uri(uri, p) for p in paths), tuple(paths), table.version())


@dataclass(frozen=True)
class DeltaSink:
    name: str
    mode: str = "append"
    key: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in ("append", "upsert"):
            raise PipelineDefinitionError(f"sink {self.name}: mode must be 'append' or 'upsert'")
        if self.mode == "upsert" and not self.key:
            raise PipelineDefinitionError(f"sink {self.name}: an upsert sink needs key=")

    @classmethod
    def append(cls, name: str) -> "DeltaSink":
        return cls(name, "append")

    @classmethod
    def upsert(cls, name: str, key: str | tuple[str, ...]) -> "DeltaSink":
        return cls(name, "upsert", (key,) if isinstance(key, str) else tuple(key))

    def check_key(self, columns: list[str]) -> None:
        missing = [k for k in self.key if k not in columns]
        if missing:
            raise PipelineDefinitionError(f"upsert sink {self.name}: key column(s) {missing} not in its input {columns}")

    # -- two-phase commit ------------------------------------------------

    def begin_transaction(self, ctx: Any) -> str:
        """The table-relative staging directory of this attempt."""
        return ctx.staging_prefix

    def pre_commit(self, ctx: Any, df: "DataFrame | pa.Table") -> None:
        """Stage the epoch's rows; the resulting TableCommit joins the manifest.

        Executors write a frame's rows (see :meth:`EpochContext.stage`).
        Starts once the previous epoch completed (an upsert rewrites its files).
        """
        ctx.restore_point()
        self.begin_transaction(ctx)
        uri = ctx.layout.sink_table(self.name)
        if self.mode == "append":
            # ``_epoch`` is added by the writer (see ``stage_frame``'s constants).
            schema = df.schema if isinstance(df, pa.Table) else ctx.arrow_schema(df)
            if "_epoch" in schema.names:  # replaced, as ``_with_epoch`` does
                schema = schema.remove(schema.get_field_index("_epoch"))
            schema = schema.append(EPOCH_FIELD)
            schema, widening = _check_schema(self.name, uri, schema, None)
            if widening is None:
                ctx.stage(name=self.name, uri=uri, kind=TableKind.SINK, data=df, schema=schema, constants={"_epoch": ctx.epoch})
                return
            # Step 2: the stored rows keep their own ``_epoch``, so the epoch's rows get theirs as a column.
            rows = _rewritten(ctx, uri, widening, ctx.frame(_with_epoch(ctx, df)).select(*schema.names))
            ctx.stage(
                name=self.name,
                uri=uri,
                kind=TableKind.SINK,
                data=rows,
                schema=widening.file_schema,
                removes=widening.files,
                base_version=widening.base_version,
                table_schema=widening.table_schema,
            )
            return
        data = _with_epoch(ctx, df)
        schema = data.schema if isinstance(data, pa.Table) else ctx.arrow_schema(data)
        self.check_key(schema.names)
        table = open_table(uri)
        schema, widening = _check_schema(self.name, uri, schema, table)
        removes: list[str] = []
        base_version = None
        if widening is not None:
            # Step 2: every file is rewritten, not only those holding changed keys.
            data = _rewritten(ctx, uri, widening, ctx.frame(data).select(*schema.names), self.key)
            removes, base_version = list(widening.files), widening.base_version
        elif table is not None:
            base_version = table.version()
            frame, schema = _with_left_out_columns(ctx.frame(data), schema, pa.schema(table.schema().to_arrow()))
            data, removes = self._rewrite(ctx, table, uri, frame, schema)
        ctx.stage(
            name=self.name,
            uri=uri,
            kind=TableKind.SINK,
            data=data,
            schema=schema if widening is None else widening.file_schema,
            sort_by=self.key,
            removes=tuple(removes),
            base_version=base_version,
            primary_key=self.key,
            table_schema=None if widening is None else widening.table_schema,
        )

    def _rewrite(
        self, ctx: Any, table: Any, uri: str, data: "DataFrame", schema: pa.Schema
    ) -> tuple["DataFrame", list[str]]:
        """The rows to write (kept rows of the rewritten files, then ``data``) and the files rewritten.

        A table of at most :data:`WHOLE_REWRITE_MAX_ROWS` rows is rewritten
        whole, with no job of its own. A larger one rewrites only the files
        that hold a changed key: one small job finds them (a distinct list of
        paths comes back). Either way the rewrite stays a lazy frame, written
        by the executors, and the table's rows come out the same.
        """
        actions = add_actions(table)
        paths = actions.column("path").to_pylist()
        if not paths:
            return data, []
        by_uri = {join_uri(uri, p): p for p in paths}
        changed = data.select(*self.key).distinct()
        rows = counted_rows(actions.column("num_records").to_pylist())
        if rows is not None and rows <= WHOLE_REWRITE_MAX_ROWS:
            hit = list(by_uri)
        else:
            stored = read_parquet_files(ctx.spark, list(by_uri), schema, with_path=True)
            hit = [r[0] for r in _same_keys(stored, changed, self.key, "left_semi").select(PATH_COLUMN).distinct().collect()]
            if not hit:
                return data, []
        kept = _same_keys(read_parquet_files(ctx.spark, hit, schema), changed, self.key, "left_anti")
        return kept.select(*schema.names).unionByName(data.select(*schema.names)), [by_uri[p] for p in sorted(hit)]

    @staticmethod
    def commit(
        commit: TableCommit, app: str, epoch: int, attempt_id: str, fence: Fence | None = None
    ) -> int:
        """Publish the staged files (idempotent); returns the table version."""
        return commit_epoch_table(commit, app, epoch, attempt_id, fence)

    @staticmethod
    def abort(uri: str, staging_prefix: str) -> None:
        """Delete an attempt's staged files in table ``uri`` (only ever for uncommitted attempts)."""
        remove_tree(join_uri(uri, staging_prefix))


EPOCH_FIELD = pa.field("_epoch", pa.int64(), nullable=False)


def _rewritten(ctx: Any, uri: str, widening: _Widening, epoch_rows: "DataFrame", key: tuple[str, ...] = ()) -> "DataFrame":
    """Step 2: the table's stored rows read with the wider types (an upsert's without the keys ``epoch_rows`` write), then ``epoch_rows``.

    Both in the files' schema: a column the stored rows lack (added now) or
    the epoch's rows lack (left out) reads null.
    """
    stored = read_parquet_files(ctx.spark, [join_uri(uri, p) for p in widening.files], widening.file_schema)
    if key:
        stored = _same_keys(stored, epoch_rows.select(*key).distinct(), key, "left_anti")
    names = widening.file_schema.names
    return stored.select(*names).unionByName(epoch_rows, allowMissingColumns=True).select(*names)


def _with_left_out_columns(rows: "DataFrame", schema: pa.Schema, table: pa.Schema) -> tuple["DataFrame", pa.Schema]:
    """An upsert's rows with the (nullable) table columns its output leaves out, as nulls.

    The rewritten files keep the rows they carry over: read with the output's
    schema alone, a left-out column would become null in those rows too,
    not only in the epoch's.
    """
    left_out = [f.with_nullable(True) for f in table if f.name not in schema.names]
    if not left_out:
        return rows, schema
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_type

    nulls = [F.lit(None).cast(from_arrow_type(f.type)).alias(f.name) for f in left_out]
    return rows.select("*", *nulls), pa.schema([*schema, *left_out])


def _same_keys(rows: "DataFrame", keys: "DataFrame", key: tuple[str, ...], how: str) -> "DataFrame":
    """``rows`` joined ``how`` (semi or anti) with ``keys`` on ``key``, a null key equal to a null key.

    A null is a key like any other (one current row), or rows with a null
    key would never be replaced and pile up, one per epoch.
    """
    from functools import reduce

    condition = reduce(lambda a, b: a & b, [rows[k].eqNullSafe(keys[k]) for k in key])
    return rows.join(keys, on=condition, how=how)


def _last_per_key(sink: DeltaSink, rows: "DataFrame") -> "DataFrame":
    """An upsert's rows, one per key: the last (see the module docstring)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    sink.check_key(rows.columns)
    if "_seq" in rows.columns:
        order = [c.desc() for c in position_order(rows.columns)]  # the reverse of the dedup's first
    else:
        # Taken before the shuffle below: within a task, rows keep the order the operator emitted them in.
        rows = rows.withColumn("__bf_row", F.monotonically_increasing_id())
        order = [F.col("__bf_row").desc()]
    last = F.row_number().over(Window.partitionBy(*sink.key).orderBy(*order))
    return rows.withColumn("__bf_last", last).where(F.col("__bf_last") == 1).drop("__bf_last", "__bf_row")


def _with_epoch(ctx: Any, rows: "DataFrame | pa.Table") -> "DataFrame | pa.Table":
    """The epoch's rows with the ``_epoch`` column (never null)."""
    from pyspark.sql import functions as F

    if isinstance(rows, pa.Table):
        if "_epoch" in rows.column_names:  # replaced, as ``withColumn`` does
            rows = rows.drop_columns(["_epoch"])
        return rows.append_column(EPOCH_FIELD, pa.repeat(pa.scalar(ctx.epoch, pa.int64()), rows.num_rows))
    return rows.withColumn("_epoch", F.lit(ctx.epoch).cast("long"))


def _staged_columns(schema: pa.Schema) -> pa.Schema:
    """What :meth:`SinkNode.apply` stages of rows of ``schema``: no flat_map sub-positions, no ``_epoch`` (the writer's)."""
    dropped = {*position_columns(schema.names)[1:], "_epoch"}
    return pa.schema([f for f in schema if f.name not in dropped])


@dataclass
class SinkNode(Node):
    sink: DeltaSink

    accepts_arrow = True

    def apply(self, ctx: Any, df: "DataFrame | pa.Table") -> "DataFrame | pa.Table":
        if self.sink.mode == "upsert":
            unique = self.parent.unique_by() if self.parent is not None else None
            if not unique or not set(unique) <= set(self.sink.key):
                df = _last_per_key(self.sink, ctx.frame(df))
        # A flat_map's sub-positions (_seq_1, ...) order records inside an epoch only; kept,
        # they would change the table's schema whenever a flat_map is added upstream.
        subs = position_columns(df.column_names if isinstance(df, pa.Table) else df.columns)[1:]
        if subs:
            df = df.drop_columns(subs) if isinstance(df, pa.Table) else df.drop(*subs)
        self.sink.pre_commit(ctx, df)
        return df

    def chained_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema | None:
        """The rows as :meth:`apply` stages them; an upsert only of rows unique by its key (no choice of the last per key)."""
        if self.sink.mode != "append":
            unique = self.parent.unique_by() if self.parent is not None else None
            if not unique or not set(unique) <= set(self.sink.key):
                return None
        (schema,) = inputs
        return _staged_columns(schema)

    def chained_side_outputs(self, inputs: Sequence[pa.Schema]) -> dict[str, pa.Schema]:
        schema = self.chained_schema(inputs)
        return {} if schema is None else {self.sink.name: schema}

    def apply_chained(self, task: Any, inputs: Sequence[pa.Table]) -> pa.Table:
        (rows,) = inputs
        rows = rows.select(_staged_columns(rows.schema).names)
        task.emit(self.sink.name, rows)
        return rows

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "sink": self.sink.name, "mode": self.sink.mode, "key": list(self.sink.key)}
