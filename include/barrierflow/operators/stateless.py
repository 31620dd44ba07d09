"""Stateless record operators: filter, select, map and flat_map (README "Declare a pipeline"), one kernel each.

1. Expressions (Spark SQL strings) are evaluated by :mod:`barrierflow.operators.expressions`: checked when the pipeline is
   declared, typed when it is planned, computed on Arrow columns in the task.
2. A Python function is called once per Arrow record batch (up to :data:`BATCH_ROWS` records) of the records' user columns: a
   filter's returns one boolean per record, a map's one row per record, a flat_map's one list of rows per record, in the declared
   ``schema``; anything else fails the epoch with a ``UserFunctionError`` naming the operator.
3. Engine columns (``_seq``, provenance...) are never read by a function or expression; they come out unchanged, after the user
   columns, so operators downstream still order and deduplicate by arrival.
4. ``filter`` keeps the records whose condition is true; false and null drop them (SQL's ``WHERE``).
5. ``select`` projects each record onto its expressions (``"*"``: every user column, in order); a plain column keeps its name (as
   the input spells it), a computed one needs ``AS``. Output names are distinct and never start with ``_``.
6. ``map(name=expression, ...)`` adds or replaces columns, as Spark's ``withColumns`` (every expression reads the input record; a
   replaced column keeps its place, new ones follow); ``map(function, schema=...)`` replaces the user columns by the function's
   row.
7. ``flat_map(name=array expression)`` gives one record per element, as column ``name`` after the record's other user columns (a
   null or empty array: none); ``flat_map(function, schema=...)`` gives the function's rows. Each output keeps its record's
   position plus its index among that record's outputs (``_seq_1``; ``_seq_2`` after another flat_map), from the records alone,
   never their batching; an input without positions gives none.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.core.errors import PipelineDefinitionError, UserFunctionError
from barrierflow.operators.base import Node, Task, position_columns, user_columns
from barrierflow.operators.expressions import (
    Compiled,
    Expression,
    check_expression,
    compile_expression,
    declared_name,
    is_column,
    is_star,
    spark_type_name,
)

__all__ = [
    "Expression", "BatchFunction", "BATCH_ROWS", "Filter", "Select", "MapColumns", "MapFunction", "FlatMapColumn",
    "FlatMapFunction", "check_column_name", "check_expression", "check_function", "conform", "filter_batch",
    "flat_map_batch", "is_column", "map_batch",
]  # fmt: skip

# A user function over a record batch of the user columns.
BatchFunction = Callable[[pa.RecordBatch], Any]
# Records per call of a user function (2.): Spark's default Arrow batch, as when these ran in mapInArrow.
BATCH_ROWS = 10_000


def check_column_name(operator_id: str, name: str) -> None:
    if not name or name.startswith("_"):
        raise PipelineDefinitionError(
            f"{operator_id}: output column {name!r} is not allowed: columns starting with _ are the engine's"
        )


def check_function(kind: str, operator_id: str | None, function: Any, schema: Any, columns: Mapping[str, Any]) -> pa.Schema:
    """A Python function of ``map`` or ``flat_map`` and its declared output schema (the rows it returns)."""
    name = operator_id or kind
    if columns:
        raise PipelineDefinitionError(f"{name}: give a function or columns, not both (columns {sorted(columns)})")
    if not callable(function):
        raise PipelineDefinitionError(f"{name}: {function!r} is not callable")
    if schema is None:
        raise PipelineDefinitionError(f"{name} with a Python function needs schema=, a pyarrow.Schema of the rows it returns")
    if not isinstance(schema, pa.Schema):
        raise PipelineDefinitionError(f"{name}: schema must be a pyarrow.Schema of the rows it returns, not {schema!r}")
    if not len(schema):
        raise PipelineDefinitionError(f"{name}: schema declares no column")
    duplicates = sorted({n for n in schema.names if schema.names.count(n) > 1})
    if duplicates:
        raise PipelineDefinitionError(f"{name}: schema names {duplicates} more than once")
    for column in schema.names:
        check_column_name(name, column)
    return schema


def _engine_fields(schema: pa.Schema) -> list[pa.Field]:
    return [f for f in schema if f.name.startswith("_")]


def _user_fields(schema: pa.Schema) -> list[pa.Field]:
    return [f for f in schema if not f.name.startswith("_")]


def _table(columns: Mapping[str, pa.Array | pa.ChunkedArray], schema: pa.Schema) -> pa.Table:
    """``schema``'s columns, taken by name from ``columns``."""
    return pa.Table.from_arrays([columns[f.name].cast(f.type) for f in schema], schema=schema)


@dataclass
class Filter(Node):
    """Keep the records for which ``condition`` (an expression) or ``function`` (a batch predicate) is true (4.)."""

    condition: Expression | None = None
    function: BatchFunction | None = None

    def passes_through(self, column: str) -> bool:
        return True  # it drops records, never changes one

    def _condition(self, schema: pa.Schema) -> Compiled:
        assert self.condition is not None
        compiled = compile_expression(self.operator_id, self.condition, schema)
        if not (pa.types.is_boolean(compiled.type) or pa.types.is_null(compiled.type)):
            raise PipelineDefinitionError(
                f"{self.operator_id}: the filter condition {self.condition!r} is a {spark_type_name(compiled.type)}, "
                "not a boolean"
            )
        return compiled

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        (schema,) = inputs
        if self.function is None:
            self._condition(schema)
        return schema

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        (records,) = inputs
        if self.function is None:
            keep = self._condition(records.schema).evaluate(records)  # (1.)
            return records.filter(keep.cast(pa.bool_()))  # (4.) a null drops the record, as SQL's WHERE does
        users, label = user_columns(records.column_names), _label(self, self.function)
        kept = [filter_batch(b, function=self.function, users=users, label=label) for b in _batches(records)]  # (2.)
        return _from_batches(kept, records.schema)


@dataclass
class _Projection(Node):
    """An operator whose every output user column is an input column or an expression on the input record (5., 6.)."""

    def projection(self, schema: pa.Schema) -> list[tuple[str, Compiled | None]]:
        """Each output user column: its name, and its compiled expression (None: the input column of that name)."""
        raise NotImplementedError

    @staticmethod
    def _schema(schema: pa.Schema, projection: list[tuple[str, Compiled | None]]) -> pa.Schema:
        # A plain column keeps its input field (type and nullability); a computed one is nullable.
        fields = [
            pa.field(n, c.type) if c is not None and c.column is None else schema.field(c.column if c else n).with_name(n)
            for n, c in projection
        ]
        return pa.schema([*fields, *_engine_fields(schema)])

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        (schema,) = inputs
        return self._schema(schema, self.projection(schema))

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        (records,) = inputs
        projection = self.projection(records.schema)  # every expression reads the input record
        computed = {n: c.evaluate(records) for n, c in projection if c is not None}
        return _table({**dict(zip(records.column_names, records.columns)), **computed}, self._schema(records.schema, projection))


@dataclass
class Select(_Projection):
    """Project the records onto ``columns`` (expressions; ``"*"`` is every user column) (5.)."""

    columns: tuple[Expression, ...] = ()

    def __post_init__(self) -> None:
        """What declaring it can tell: each computed column is named, no name is the engine's or given twice."""
        names = []
        for text in self.columns:
            if not isinstance(text, str) or is_star(text):
                continue
            name, _ = declared_name(self.operator_id, text)
            if name is None:
                raise PipelineDefinitionError(
                    f'{self.operator_id}: select {text!r} needs a name for its output column: write "{text} AS name"'
                )
            names.append(name)
        _check_outputs(self.operator_id, names)

    def projection(self, schema: pa.Schema) -> list[tuple[str, Compiled | None]]:
        out: list[tuple[str, Compiled | None]] = []
        for text in self.columns:
            if is_star(text):  # the record's columns, not the engine's (those follow anyway)
                out += [(f.name, None) for f in _user_fields(schema)]
            else:
                compiled = compile_expression(self.operator_id, text, schema)
                assert compiled.name is not None  # checked when declared
                out.append((compiled.name, compiled))
        _check_outputs(self.operator_id, [name for name, _ in out])
        return out

    def passes_through(self, column: str) -> bool:
        star = any(isinstance(t, str) and is_star(t) for t in self.columns)
        named = [declared_name(self.operator_id, t) for t in self.columns if isinstance(t, str) and not is_star(t)]
        sources = [source for name, source in named if name == column]
        # The output column is the input's if it is that column under its own name (or comes from *).
        return all(source == column for source in sources) if sources else star


@dataclass
class MapColumns(_Projection):
    """Add or replace columns of each record (``withColumns``); the record keeps its other columns (6.)."""

    columns: Mapping[str, Expression] | None = None

    def passes_through(self, column: str) -> bool:
        return column.lower() not in {n.lower() for n in (self.columns or {})}

    def projection(self, schema: pa.Schema) -> list[tuple[str, Compiled | None]]:
        compiled = {name: compile_expression(self.operator_id, text, schema) for name, text in (self.columns or {}).items()}
        replaced = {name.lower(): name for name in compiled}
        out: list[tuple[str, Compiled | None]] = [
            (replaced[f.name.lower()], compiled[replaced[f.name.lower()]]) if f.name.lower() in replaced else (f.name, None)
            for f in _user_fields(schema)
        ]
        present = {name.lower() for name, _ in out}
        return out + [(name, c) for name, c in compiled.items() if name.lower() not in present]


@dataclass
class _FunctionOperator(Node):
    """A Python ``function`` over Arrow batches of the user columns, returning rows of ``schema`` (2.)."""

    function: BatchFunction | None = None
    schema: pa.Schema | None = None

    # Whether it adds a sub-position (several outputs per record); the name comes from its input.
    adds_position = False

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        (schema,) = inputs
        assert self.schema is not None
        return pa.schema([*self.schema, *_engine_fields(schema), *(_position_field(schema.names) if self.adds_position else [])])

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        (records,) = inputs
        assert self.function is not None and self.schema is not None
        users = user_columns(records.column_names)
        engine = [c for c in records.column_names if c not in users]
        through = (
            functools.partial(flat_map_batch, position=_next_position(records.column_names)) if self.adds_position else map_batch
        )
        label = _label(self, self.function)
        batches = [
            through(b, function=self.function, schema=self.schema, users=users, engine=engine, label=label)
            for b in _batches(records)
        ]
        return _from_batches(batches, self.output_schema([records.schema]))


@dataclass
class MapFunction(_FunctionOperator):
    """Each record becomes the row ``function`` returns for it (one per record), of ``schema`` (6.)."""


@dataclass
class FlatMapColumn(Node):
    """Each record becomes one record per element of the array ``expression``, as column ``name``; null or empty: none (7.)."""

    name: str = ""
    expression: Expression | None = None

    def passes_through(self, column: str) -> bool:
        return column.lower() != self.name.lower()

    def _array(self, schema: pa.Schema) -> tuple[Compiled, pa.Schema]:
        """The compiled array expression and the output schema."""
        assert self.expression is not None
        compiled = compile_expression(self.operator_id, self.expression, schema)
        t = compiled.type
        if not (pa.types.is_null(t) or pa.types.is_list(t) or pa.types.is_large_list(t)):
            raise PipelineDefinitionError(
                f"{self.operator_id}: flat_map's {self.name}={self.expression!r} is a {spark_type_name(t)}, not an array "
                "(e.g. split(text, ' '))"
            )
        kept = [f for f in _user_fields(schema) if f.name.lower() != self.name.lower()]
        element = pa.field(self.name, pa.null() if pa.types.is_null(t) else t.value_type)
        return compiled, pa.schema([*kept, element, *_engine_fields(schema), *_position_field(schema.names)])

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        return self._array(inputs[0])[1]

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        (records,) = inputs
        compiled, schema = self._array(records.schema)
        lists = compiled.evaluate(records)
        lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
        if pa.types.is_null(lists.type):  # no record has an array
            return schema.empty_table()
        parents = pc.list_parent_indices(lists)  # (7.) null and empty arrays have no element, hence no output
        kept = records.take(parents)
        columns = {**dict(zip(kept.column_names, kept.columns)), self.name: pc.list_flatten(lists)}
        position = _next_position(records.column_names)
        if position is not None:
            columns[position] = _sub_positions(parents)
        return _table(columns, schema)


@dataclass
class FlatMapFunction(_FunctionOperator):
    """Each record becomes the rows ``function`` returns for it: one list of rows per record, of ``schema`` (7.)."""

    adds_position = True


# -- a batch through a user function --------------------------------------------------------------


def filter_batch(batch: pa.RecordBatch, *, function: BatchFunction, users: list[str], label: str) -> pa.RecordBatch:
    """The records of ``batch`` for which ``function`` (given their user columns) returns true."""
    mask = _call(function, batch.select(users), label)
    if not isinstance(mask, (pa.Array, pa.ChunkedArray)):
        try:
            mask = pa.array(mask, pa.bool_())
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise UserFunctionError(f"{label} returned {type(mask).__name__}, not one boolean per record: {exc}") from None
    if not pa.types.is_boolean(mask.type) or len(mask) != batch.num_rows:
        raise UserFunctionError(
            f"{label} returned {len(mask)} values of type {mask.type} for {batch.num_rows} records; "
            "a filter function returns one boolean per record (null drops it)"
        )
    return batch.filter(mask)  # a null drops the record, as SQL's WHERE does


def map_batch(
    batch: pa.RecordBatch, *, function: BatchFunction, schema: pa.Schema, users: list[str], engine: list[str], label: str
) -> pa.RecordBatch:
    """``function``'s row for each record of ``batch``, then the record's engine columns."""
    rows = conform(_call(function, batch.select(users), label), schema, label, rows=batch.num_rows)
    return pa.RecordBatch.from_arrays([*rows, *batch.select(engine).columns], names=[*schema.names, *engine])


def flat_map_batch(
    batch: pa.RecordBatch,
    *,
    function: BatchFunction,
    schema: pa.Schema,
    users: list[str],
    engine: list[str],
    position: str | None,
    label: str,
) -> pa.RecordBatch:
    """``function``'s rows for each record of ``batch``, each with its record's engine columns and its index among them (``position``)."""
    lists = _row_lists(_call(function, batch.select(users), label), schema, label, batch.num_rows)
    parents = pc.list_parent_indices(lists)
    rows = conform(pa.Table.from_struct_array(pc.list_flatten(lists)), schema, label)
    arrays, names = [*rows, *batch.select(engine).take(parents).columns], [*schema.names, *engine]
    if position is not None:
        arrays.append(_sub_positions(parents))
        names.append(position)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _sub_positions(parents: pa.Array) -> pa.Array:
    """Each output's index among its record's outputs: parents ascend, so its distance from the first of them."""
    indices = np.asarray(parents.to_numpy(zero_copy_only=False), dtype=np.int64)
    return pa.array(np.arange(len(indices)) - np.searchsorted(indices, indices), pa.int64())


def _call(function: BatchFunction, batch: pa.RecordBatch, label: str) -> Any:
    try:
        return function(batch)
    except UserFunctionError:
        raise
    except Exception as exc:
        raise UserFunctionError(f"{label} raised {type(exc).__name__}: {exc}") from exc


def conform(result: Any, schema: pa.Schema, label: str, rows: int | None = None) -> list[pa.Array]:
    """The columns of a function's ``result`` as its declared ``schema`` says, or a :class:`UserFunctionError` saying why not.
    ``result`` is a ``pyarrow.RecordBatch``, ``pyarrow.Table`` or a mapping of column name to values; it must hold exactly the
    schema's columns (in any order), each convertible to its declared type without loss, no null in a non-nullable one, and
    ``rows`` rows if given."""
    if not isinstance(result, (pa.RecordBatch, pa.Table, Mapping)):
        raise UserFunctionError(
            f"{label} returned {type(result).__name__}; it must return a pyarrow.RecordBatch, a pyarrow.Table "
            "or a mapping of column name to values"
        )
    try:
        table = pa.table(dict(result) if isinstance(result, Mapping) else result)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise UserFunctionError(f"{label} returned a mapping that is not columns of equal length: {exc}") from None
    if rows is not None and table.num_rows != rows:
        raise UserFunctionError(
            f"{label} returned {table.num_rows} rows for {rows} records; map returns exactly one row per record "
            "(flat_map returns any number)"
        )
    names = table.column_names
    missing = [n for n in schema.names if n not in names]
    unexpected = [n for n in names if n not in schema.names]
    if missing or unexpected or len(set(names)) != len(names):
        raise UserFunctionError(
            f"{label} returned columns {names}, not those of its declared schema {schema.names} "
            f"(missing {missing}, unexpected {unexpected})"
        )
    arrays = []
    for field in schema:
        try:
            column = table.column(field.name).cast(field.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise UserFunctionError(
                f"{label}: column {field.name} is {table.column(field.name).type}, which does not convert to its declared "
                f"{field.type}: {exc}"
            ) from None
        if not field.nullable and column.null_count:
            raise UserFunctionError(
                f"{label}: column {field.name} is declared not nullable but holds {column.null_count} null(s)"
            )
        arrays.append(column.combine_chunks())
    return arrays


def _row_lists(result: Any, schema: pa.Schema, label: str, rows: int) -> pa.Array:
    """A flat_map function's result as one list of rows per record (``list<struct>``)."""
    if isinstance(result, pa.ChunkedArray):
        result = result.combine_chunks()
    if isinstance(result, (list, tuple)):
        # Every dict row names exactly the declared columns: Arrow would drop a misspelled key and read the column as null.
        declared = set(schema.names)
        for record, record_rows in enumerate(result):
            for row in record_rows if isinstance(record_rows, (list, tuple)) else ():
                if isinstance(row, Mapping) and row.keys() != declared:
                    raise UserFunctionError(
                        f"{label} returned a row with columns {sorted(row)} for record {record} of its batch, not those of "
                        f"its declared schema {schema.names} (missing {sorted(declared - set(row))}, unexpected "
                        f"{sorted(set(row) - declared)}); give every column, None for a null"
                    )
    if not isinstance(result, pa.Array):
        try:
            result = pa.array(result, pa.list_(pa.struct(list(schema))))
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise UserFunctionError(
                f"{label} returned {type(result).__name__} that is not one list of rows (dicts of {schema.names}) "
                f"per record: {exc}"
            ) from None
    t = result.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_struct(t.value_type):
        raise UserFunctionError(f"{label} returned an array of {result.type}; flat_map returns one list of rows per record")
    if len(result) != rows:
        raise UserFunctionError(
            f"{label} returned {len(result)} lists for {rows} records; flat_map returns one list of rows "
            "(possibly empty) per record"
        )
    return result


# -- helpers ----------------------------------------------------------------------------------------


def _batches(records: pa.Table) -> list[pa.RecordBatch]:
    """The record batches a user function is called with (2.): at most :data:`BATCH_ROWS` records each."""
    return [b for b in records.to_batches(max_chunksize=BATCH_ROWS) if b.num_rows]


def _from_batches(batches: Sequence[pa.RecordBatch], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_batches(batches).select(schema.names).cast(schema) if batches else schema.empty_table()


def _label(node: Node, function: Any) -> str:
    name = getattr(function, "__qualname__", None) or type(function).__qualname__
    return f"{type(node).__name__} {node.operator_id} ({name})"


def _next_position(columns: Sequence[str]) -> str | None:
    """The sub-position column a flat_map adds (None when its input carries no arrival position)."""
    return f"_seq_{len(position_columns(columns))}" if "_seq" in columns else None


def _position_field(columns: Sequence[str]) -> list[pa.Field]:
    position = _next_position(columns)
    return [] if position is None else [pa.field(position, pa.int64(), nullable=False)]


def _check_outputs(operator_id: str, names: list[str]) -> None:
    bad = sorted({n for n in names if n.startswith("_")})
    lowered = [n.lower() for n in names]
    duplicates = sorted({n for n in names if lowered.count(n.lower()) > 1})
    if bad or duplicates:
        raise PipelineDefinitionError(
            f"{operator_id}: output columns {names} are not allowed: {bad or duplicates} "
            f"{'start with _ (the engine columns, which every record keeps anyway)' if bad else 'appear more than once'}"
        )
