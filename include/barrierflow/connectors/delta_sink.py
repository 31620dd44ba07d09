"""Exactly-once Delta sinks: a two-phase-commit sink per table.

As Flink's ``TwoPhaseCommitSinkFunction``, per epoch: ``begin_transaction`` makes the attempt's staging directory in the table
(:func:`plan_sink_table`, on the driver, with the schema checks); at ``pre_commit`` tasks write the epoch's rows there unseen
(:meth:`SinkNode.run`) and the files join the manifest, the epoch's vote; ``commit`` is one idempotent Delta commit of them with
the epoch's app transaction (``storage.delta.commit_epoch_table``); ``abort`` deletes the staging directory (:func:`abort`).

``append`` adds the epoch's rows; ``upsert`` keeps one current row per key by rewriting the files holding changed keys (every file
of a table up to ``UPSERT_WHOLE_REWRITE_ROWS`` rows). Every row carries the ``_epoch`` that wrote it. Of an epoch's rows for one
key the last wins, as in Flink's upsert sinks: the last in arrival order (``_seq``, then a flat_map's sub-positions) where the
stream carries it, else the last the upstream operator emitted (a keyed process function emits a key's rows in the order of its
calls); a running aggregate's one row per key is taken as it is. A null key is a key like any other.

An output widening a column (int to long, float to double; :func:`~barrierflow.core.schema_evolution.check_sink_schema`)
widens the table, in either mode, with no Delta table feature (every reader reads it):

  1. before the vote, :func:`plan_sink_table` finds the widening on the table as it is (a restore may have narrowed it since);
  2. the stored rows (every live file) are read with the wider type and staged with the epoch's own rows;
  3. the TableCommit in the manifest names the new schema, the live files it replaces (removes) and the rewritten files (adds);
  4. one Delta commit: metaData with the widened schema, the removes, the adds, the epoch's app transaction and fencing token.

An output column narrower than the table's (code rolled back after a widening) is staged as the table's type (lossless).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.core.arrow import null_safe_keys, row_numbers
from barrierflow.core.columns import EPOCH, position_columns
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.core.schema_evolution import check_sink_schema, fitted_output_schema, widened_columns, widened_table_schema
from barrierflow.core.settings import UPSERT_WHOLE_REWRITE_ROWS
from barrierflow.operators.base import Exchange, Node, Task
from barrierflow.storage.delta import add_actions, counted_rows, open_table
from barrierflow.storage.objects import join_uri, remove_tree

__all__ = ["DeltaSink", "SinkNode", "SinkPlan", "EPOCH_FIELD", "plan_sink_table", "abort"]

_log = logging.getLogger(__name__)

EPOCH_FIELD = pa.field(EPOCH, pa.int64(), nullable=False)


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

    def check_key(self, columns: Sequence[str]) -> None:
        missing = [k for k in self.key if k not in columns]
        if missing:
            raise PipelineDefinitionError(
                f"upsert sink {self.name}: key column(s) {missing} not in its input {[c for c in columns if not c.startswith('_')]}"
            )


def staged_rows_schema(schema: pa.Schema) -> pa.Schema:
    """What a sink stages of rows of ``schema``: no flat_map sub-positions (they order records inside an epoch only), no ``_epoch``."""
    dropped = {*position_columns(schema.names)[1:], EPOCH}
    return pa.schema([f for f in schema if f.name not in dropped])


@dataclass
class SinkNode(Node):
    sink: DeltaSink

    def exchanges(self) -> tuple[Exchange, ...]:
        # An upsert rewrites its table once per epoch, from every row the epoch gives it.
        return (Exchange.GLOBAL if self.sink.mode == "upsert" else Exchange.FORWARD,)

    def input_keys(self) -> tuple[tuple[str, ...], ...]:
        return ((),)

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        (schema,) = inputs
        if self.sink.mode == "upsert":
            self.sink.check_key(schema.names)
        return pa.schema([])

    def side_output_schemas(self, inputs: Sequence[pa.Schema]) -> dict[str, pa.Schema]:
        (schema,) = inputs
        return {self.sink.name: staged_rows_schema(schema)}

    def side_outputs(self) -> list[str]:
        return []  # its table is the sink itself, named by the sink

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        (rows,) = inputs
        if self.sink.mode == "upsert":
            unique = self.parent.unique_by() if self.parent is not None else None
            if not unique or not set(unique) <= set(self.sink.key):
                rows = last_per_key(rows, self.sink.key)
        rows = rows.select(staged_rows_schema(rows.schema).names)
        if self.sink.mode == "append":
            task.emit(self.sink.name, rows)
        else:
            epochs = pa.repeat(pa.scalar(task.epoch, pa.int64()), rows.num_rows)
            task.upsert(self.sink.name, rows.append_column(EPOCH_FIELD, epochs), self.sink.key)
        return pa.table({})

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "sink": self.sink.name, "mode": self.sink.mode, "key": list(self.sink.key)}


def last_per_key(rows: pa.Table, key: Sequence[str]) -> pa.Table:
    """One row per key, kept in their order: the last in arrival order where rows carry it, else the last as given."""
    positions = position_columns(rows.column_names)
    numbered = null_safe_keys(rows, key)
    names = numbered.column_names
    columns = [*numbered.columns, *(rows[c] for c in positions), row_numbers(rows.num_rows)]
    numbered = pa.table(columns, names=[*names, *positions, "_row"])
    ordered = numbered.sort_by([(c, "ascending") for c in names] + [(c, "descending") for c in positions or ["_row"]])
    n = ordered.num_rows
    first = np.arange(n) == 0
    for name in names:  # a row starts a new key when any key column differs from the row before
        col = ordered[name].combine_chunks()
        first[1:] |= pc.fill_null(pc.not_equal(col.slice(1), col.slice(0, max(n - 1, 0))), True).to_numpy(zero_copy_only=False)
    chosen = ordered["_row"].filter(pa.array(first))
    return rows.take(pc.take(chosen, pc.sort_indices(chosen)))


@dataclass(frozen=True)
class SinkPlan:
    """A sink table's part of an epoch, fixed on the driver before any task writes (step 1 of the module docstring)."""

    schema: pa.Schema  # the staged files', ``_epoch`` included
    stored: tuple[str, ...]  # URIs of the table's live files that the epoch may rewrite (an upsert's, a widening's)
    rewrite_all: bool  # every stored file is rewritten (a widening, or an upsert of a small table)
    base_version: int | None  # the version ``stored`` was read at
    table_schema: pa.Schema | None  # a widening's new table schema


def plan_sink_table(sink: str, uri: str, rows: pa.Schema, key: tuple[str, ...] = ()) -> SinkPlan:
    """Check the epoch's ``rows`` (without ``_epoch``) against table ``uri`` as it is, and plan its files (``key``: an upsert's).

    Accepted schema changes are logged; any other fails the epoch before its vote (``SchemaEvolutionError``).
    """
    output = rows.append(EPOCH_FIELD)
    table = open_table(uri)
    if table is None:
        return SinkPlan(output, (), False, None, None)
    stored = pa.schema(table.schema().to_arrow())
    actions = add_actions(table)
    paths = sorted(actions.column("path").to_pylist())
    count = counted_rows(actions.column("num_records").to_pylist())
    for change in check_sink_schema(sink, stored, output, count):
        _log.warning("sink %s: %s", sink, change)
    live = tuple(join_uri(uri, p) for p in paths)
    if widened_columns(stored, output):
        table_schema = widened_table_schema(stored, output)
        nullable = {f.name for f in output if f.nullable} | {n for n in table_schema.names if n not in output.names}
        schema = pa.schema([f.with_nullable(f.nullable or f.name in nullable) for f in table_schema])
        return SinkPlan(schema, live, True, table.version(), table_schema)
    schema = fitted_output_schema(stored, output)
    if not key:
        return SinkPlan(schema, (), False, table.version(), None)
    # An upsert keeps the rows it does not replace, with every column the table has.
    left_out = [f.with_nullable(True) for f in stored if f.name not in schema.names]
    whole = count is not None and count <= UPSERT_WHOLE_REWRITE_ROWS
    return SinkPlan(pa.schema([*schema, *left_out]), live, whole, table.version(), None)


def abort(uri: str, staging_prefix: str) -> None:
    """Delete an attempt's staged files in table ``uri`` (only ever for uncommitted attempts)."""
    remove_tree(join_uri(uri, staging_prefix))
