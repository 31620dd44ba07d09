"""Exactly-once Delta sinks: a two-phase-commit sink per table.

``begin_transaction`` names the attempt's staging directory inside the table;
``pre_commit`` writes the epoch's rows there (invisible to readers) and
returns the :class:`~barrierflow.checkpoint.TableCommit` that goes into the
manifest; ``commit`` publishes it with one Delta commit carrying the app
transaction (idempotent); ``abort`` deletes the staged files.

Modes: ``append`` adds the epoch's rows; ``upsert`` keeps one current row per
key by rewriting only the files that hold changed keys. Every row carries the
``_epoch`` that wrote it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from barrierflow.checkpoint import Fence, TableCommit, TableKind
from barrierflow.delta_commit import add_actions, commit_epoch_table, counted_rows, open_table
from barrierflow.errors import PipelineDefinitionError
from barrierflow.operators.base import Node, position_columns
from barrierflow.schema_evolution import check_sink_schema
from barrierflow.sources.dead_letters import DEAD_LETTER_SCHEMA
from barrierflow.storage import join_uri, remove_tree
from barrierflow.table_files import PATH_COLUMN, read_parquet_files

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

__all__ = ["DeltaSink", "SinkNode", "DEAD_LETTER_SCHEMA", "WHOLE_REWRITE_MAX_ROWS"]

_log = logging.getLogger(__name__)

# An upsert sink table up to this many rows is rewritten whole each epoch: a
# job to find the files holding changed keys (and the wait for the epoch's
# rows it implies) costs more than rewriting them all.
WHOLE_REWRITE_MAX_ROWS = 100_000


# (table uri, output schema) pairs already checked by this process: an append sink's
# table is opened once per schema, not every epoch.
_checked: set[tuple[str, str]] = set()


def _check_schema(sink: str, uri: str, output: pa.Schema, table: DeltaTable | None) -> None:
    """Before the vote: the output must fit the table's schema (:func:`check_sink_schema`); accepted changes are logged."""
    key = (uri, output.to_string())
    if key in _checked:
        return
    table = table if table is not None else open_table(uri)
    if table is not None:
        for change in check_sink_schema(sink, pa.schema(table.schema().to_arrow()), output):
            _log.warning("sink %s: %s", sink, change)
    _checked.add(key)


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
            schema = schema.append(_EPOCH_FIELD)
            _check_schema(self.name, uri, schema, None)
            ctx.stage(name=self.name, uri=uri, kind=TableKind.SINK, data=df, schema=schema, constants={"_epoch": ctx.epoch})
            return
        data = _with_epoch(ctx, df)
        schema = data.schema if isinstance(data, pa.Table) else ctx.arrow_schema(data)
        missing = [k for k in self.key if k not in schema.names]
        if missing:
            raise PipelineDefinitionError(f"upsert sink {self.name}: key column(s) {missing} not in its input")
        table = open_table(uri)
        _check_schema(self.name, uri, schema, table)
        removes: list[str] = []
        base_version = None
        if table is not None:
            base_version = table.version()
            data, removes = self._rewrite(ctx, table, uri, ctx.frame(data), schema)
        ctx.stage(
            name=self.name,
            uri=uri,
            kind=TableKind.SINK,
            data=data,
            schema=schema,
            sort_by=self.key,
            removes=tuple(removes),
            base_version=base_version,
            primary_key=self.key,
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
            hit = [r[0] for r in stored.join(changed, on=list(self.key), how="left_semi").select(PATH_COLUMN).distinct().collect()]
            if not hit:
                return data, []
        kept = read_parquet_files(ctx.spark, hit, schema).join(changed, on=list(self.key), how="left_anti")
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


_EPOCH_FIELD = pa.field("_epoch", pa.int64(), nullable=False)


def _with_epoch(ctx: Any, rows: "DataFrame | pa.Table") -> "DataFrame | pa.Table":
    """The epoch's rows with the ``_epoch`` column (never null)."""
    from pyspark.sql import functions as F

    if isinstance(rows, pa.Table):
        return rows.append_column(_EPOCH_FIELD, pa.repeat(pa.scalar(ctx.epoch, pa.int64()), rows.num_rows))
    return rows.withColumn("_epoch", F.lit(ctx.epoch).cast("long"))


@dataclass
class SinkNode(Node):
    sink: DeltaSink

    accepts_arrow = True

    def apply(self, ctx: Any, df: "DataFrame | pa.Table") -> "DataFrame | pa.Table":
        # A flat_map's sub-positions (_seq_1, ...) order records inside an epoch only; kept,
        # they would change the table's schema whenever a flat_map is added upstream.
        subs = position_columns(df.column_names if isinstance(df, pa.Table) else df.columns)[1:]
        if subs:
            df = df.drop_columns(subs) if isinstance(df, pa.Table) else df.drop(*subs)
        self.sink.pre_commit(ctx, df)
        return df

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "sink": self.sink.name, "mode": self.sink.mode, "key": list(self.sink.key)}
