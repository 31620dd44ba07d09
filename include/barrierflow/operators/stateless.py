"""Stateless record operators: filter, select, map and flat_map.

Given column expressions they compile to native Spark (``where``,
``select``, ``withColumns``, ``posexplode``): SQL expression strings
(``"amount > 0"``, which need no Spark session to declare, so they work in
DAG files and on every engine) or ``pyspark.sql.Column`` objects (built
where PySpark can build one: a Spark Connect process, or beside a running
classic session). Given a Python function they run it on the executors over
Arrow record batches (``mapInArrow``): one call per batch, never one per
record, never on the driver.

A function sees only the record's user columns; the engine's columns (those
starting with ``_``: the arrival position ``_seq``, provenance) ride along
beside it and come out unchanged, so operators downstream still order and
deduplicate by arrival. ``map`` keeps each record's position (it must return
exactly one row per record); ``flat_map`` gives each output its input's
position plus its index among that input's outputs (``_seq_1``, ``_seq_2``
for a flat_map after a flat_map: :func:`~barrierflow.operators.base.position_columns`),
which depends on the records alone, never on how Spark split them into batches.

Stateless operators keep no state, so they need no operator id (Flink's
``uid`` is optional for them): the builder names them ``<kind>-<n>``, a form
no user-given id can take, so adding one never changes a stateful
operator's identity (its state tables are named by its own id).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence, TypeGuard, Union

import pyarrow as pa
import pyarrow.compute as pc

from barrierflow.core.errors import PipelineDefinitionError, UserFunctionError
from barrierflow.operators.base import Node, position_columns, ship_user_code, user_columns

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructField

__all__ = [
    "Expression",
    "BatchFunction",
    "Filter",
    "Select",
    "MapColumns",
    "MapFunction",
    "FlatMapColumn",
    "FlatMapFunction",
    "conform",
    "filter_batch",
    "flat_map_batch",
    "is_column",
    "map_batch",
]

# A plain column, or a column renamed (``"left_ts as ordered_at"``): a projection a chained task makes without Spark.
_AS = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_]*)(?:\s+[Aa][Ss]\s+([A-Za-z][A-Za-z0-9_]*))?\s*$")
# Words Spark's parser (ANSI mode, its default) does not take as a bare column name: left to Spark.
_RESERVED = frozenset(
    "all and any as authorization both case cast check collate column constraint create cross current_date "
    "current_time current_timestamp current_user distinct else end escape except false fetch filter for foreign "
    "from full grant group having in inner intersect into is join lateral leading left natural not null offset on "
    "only or order outer overlaps primary references right select session_user some table then time to trailing "
    "true union unique unknown user using when where with".split()
)
# A SQL expression string or a pyspark Column.
Expression = Union[str, "Column"]
# A user function over a record batch of the user columns.
BatchFunction = Callable[[pa.RecordBatch], Any]


def is_column(value: Any) -> TypeGuard["Column"]:
    """Whether ``value`` is a ``pyspark.sql.Column`` (classic or Connect), without importing PySpark."""
    kind = type(value)
    return kind.__name__ == "Column" and kind.__module__.startswith("pyspark.sql")


def check_expression(operator_id: str, value: Any) -> None:
    if not ((isinstance(value, str) and value.strip()) or is_column(value)):
        raise PipelineDefinitionError(
            f"{operator_id}: {value!r} is not a column expression; give a SQL expression string "
            "(e.g. \"amount > 0\") or a pyspark.sql.Column"
        )


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


def _compile(operator_id: str, value: Expression) -> "Column":
    """The expression as a Column of this process's kind of session."""
    from pyspark.sql import functions as F
    from pyspark.sql.utils import is_remote

    if isinstance(value, str):
        return F.expr(value)
    if ("connect" in type(value).__module__) != is_remote():
        raise PipelineDefinitionError(
            f"{operator_id}: a pyspark Column built for a {'Spark Connect' if not is_remote() else 'classic'} session "
            "cannot run on this one; give the expression as a SQL string (e.g. \"amount > 0\"), which runs on either"
        )
    return value


@dataclass
class _Stateless(Node):
    """What every stateless operator shares: arrival order is its consumers' concern."""

    forwards_arrival_order = True

    def passes_through(self, column: str) -> bool:
        return False


@dataclass
class Filter(_Stateless):
    """Keep the records for which ``condition`` (an expression) or ``function`` (a batch predicate) is true."""

    condition: Expression | None = None
    function: BatchFunction | None = None

    def passes_through(self, column: str) -> bool:
        return True  # it drops records, never changes one

    def apply(self, ctx: Any, df: "DataFrame") -> "DataFrame":
        if self.function is None:
            assert self.condition is not None
            return df.where(_compile(self.operator_id, self.condition))
        keep = partial(filter_batch, function=self.function, users=user_columns(df), label=_label(self, self.function))
        return _map_batches(self, df, keep, df.schema)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **_what(self.condition, self.function)}


@dataclass
class Select(_Stateless):
    """Project the records onto ``columns`` (expressions; ``"*"`` is every user column)."""

    columns: tuple[Expression, ...] = ()

    def passes_through(self, column: str) -> bool:
        names = [c for c in self.columns if isinstance(c, str)]  # a Column's == is an expression, not a bool
        return "*" in names or column in names

    def apply(self, ctx: Any, df: "DataFrame") -> "DataFrame":
        from pyspark.sql import functions as F

        users = user_columns(df)
        engine = [c for c in df.columns if c not in users]
        selected: list["Column"] = []
        for value in self.columns:
            if isinstance(value, str) and value == "*":  # the record's columns, not the engine's (those follow anyway)
                selected += [F.col(c) for c in users]
            else:
                selected.append(_compile(self.operator_id, value))
        out = df.select(*selected, *engine)
        _check_outputs(self.operator_id, out.columns[: len(out.columns) - len(engine)], engine)
        return out

    def _projection(self, names: list[str]) -> list[tuple[str, str]] | None:
        """``(input column, output name)`` per output column when every expression is ``*``, a column or ``column as name``.

        Names as the input spells them: Spark's resolution ignores case, a
        projection here does not, so any other spelling is left to Spark.
        """
        users = [n for n in names if not n.startswith("_")]
        out: list[tuple[str, str]] = []
        for value in self.columns:
            if not isinstance(value, str):
                return None
            if value == "*":
                out += [(n, n) for n in users]
                continue
            match = _AS.match(value)
            if match is None or match.group(1) not in users or {g.lower() for g in match.groups() if g} & _RESERVED:
                return None
            out.append((match.group(1), match.group(2) or match.group(1)))
        outputs = [o for _, o in out]
        if len(set(outputs)) != len(outputs) or any(o.startswith("_") for o in outputs):
            return None  # Spark's select refuses it: the error is raised there
        return out

    def chained_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema | None:
        (schema,) = inputs
        projection = self._projection(schema.names)
        if projection is None:
            return None
        engine = [f for f in schema if f.name.startswith("_")]
        return pa.schema([*(schema.field(i).with_name(o) for i, o in projection), *engine])

    def apply_chained(self, task: Any, inputs: Sequence[pa.Table]) -> pa.Table:
        (records,) = inputs
        projection = self._projection(records.column_names)
        assert projection is not None
        engine = [n for n in records.column_names if n.startswith("_")]
        return pa.table([*(records[i] for i, _ in projection), *(records[n] for n in engine)], names=[*(o for _, o in projection), *engine])

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "columns": [str(c) for c in self.columns]}


@dataclass
class MapColumns(_Stateless):
    """Add or replace columns of each record (``withColumns``); the record keeps its other columns."""

    columns: Mapping[str, Expression] | None = None

    def passes_through(self, column: str) -> bool:
        return column not in (self.columns or {})

    def apply(self, ctx: Any, df: "DataFrame") -> "DataFrame":
        assert self.columns is not None
        return df.withColumns({name: _compile(self.operator_id, value) for name, value in self.columns.items()})

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "columns": {n: str(c) for n, c in (self.columns or {}).items()}}


@dataclass
class _FunctionOperator(_Stateless):
    """A Python ``function`` over Arrow batches on the executors, returning rows of ``schema``."""

    function: BatchFunction | None = None
    schema: pa.Schema | None = None

    # Whether it adds a sub-position (several outputs per record); the name comes from its input.
    adds_position = False

    def _transform(self, users: list[str], engine: list[str], position: str | None) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
        """The batch function the executors run, its arguments bound (plain values: it is pickled)."""
        raise NotImplementedError

    def apply(self, ctx: Any, df: "DataFrame") -> "DataFrame":
        assert self.schema is not None
        users = user_columns(df)
        engine = [c for c in df.columns if c not in users]
        position = _next_position(df.columns) if self.adds_position else None
        extra = [_long_field(position)] if position is not None else []
        schema = _spark_schema(self.operator_id, df, self.schema, engine, extra)
        return _map_batches(self, df, self._transform(users, engine, position), schema)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **_what(None, self.function), "schema": str(self.schema)}


@dataclass
class MapFunction(_FunctionOperator):
    """Each record becomes the row ``function`` returns for it (one per record), of ``schema``."""

    def _transform(self, users: list[str], engine: list[str], position: str | None) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
        assert self.function is not None and self.schema is not None
        label = _label(self, self.function)
        return partial(map_batch, function=self.function, schema=self.schema, users=users, engine=engine, label=label)


@dataclass
class FlatMapColumn(_Stateless):
    """Each record becomes one record per element of the array ``expression``, as column ``name``; null or empty: none."""

    name: str = ""
    expression: Expression | None = None

    def passes_through(self, column: str) -> bool:
        return column != self.name

    def apply(self, ctx: Any, df: "DataFrame") -> "DataFrame":
        from pyspark.sql import functions as F

        assert self.expression is not None
        array = _compile(self.operator_id, self.expression)
        kept = [F.col(c) for c in df.columns if c != self.name]
        position = _next_position(df.columns)
        if position is None:  # no consumer needs arrival order: the source left it out
            return df.select(*kept, F.explode(array).alias(self.name))
        out = df.select(*kept, F.posexplode(array).alias(position, self.name))
        return out.withColumn(position, F.col(position).cast("long"))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "column": self.name, "expression": str(self.expression)}


@dataclass
class FlatMapFunction(_FunctionOperator):
    """Each record becomes the rows ``function`` returns for it: one list of rows per record, of ``schema``."""

    adds_position = True

    def _transform(self, users: list[str], engine: list[str], position: str | None) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
        assert self.function is not None and self.schema is not None
        label = _label(self, self.function)
        return partial(
            flat_map_batch, function=self.function, schema=self.schema, users=users, engine=engine, position=position, label=label
        )


# -- on the executors --------------------------------------------------------------------------


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
    import numpy as np

    lists = _row_lists(_call(function, batch.select(users), label), schema, label, batch.num_rows)
    parents = pc.list_parent_indices(lists)
    rows = conform(pa.Table.from_struct_array(pc.list_flatten(lists)), schema, label)
    arrays = [*rows, *batch.select(engine).take(parents).columns]
    names = [*schema.names, *engine]
    if position is not None:
        # Parents ascend, so a row's index among its record's outputs is its distance from the first of them.
        indices = np.asarray(parents, dtype=np.int64)
        arrays.append(pa.array(np.arange(len(indices)) - np.searchsorted(indices, indices), pa.int64()))
        names.append(position)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _call(function: BatchFunction, batch: pa.RecordBatch, label: str) -> Any:
    try:
        return function(batch)
    except UserFunctionError:
        raise
    except Exception as exc:
        raise UserFunctionError(f"{label} raised {type(exc).__name__}: {exc}") from exc


def conform(result: Any, schema: pa.Schema, label: str, rows: int | None = None) -> list[pa.Array]:
    """The columns of a function's ``result`` as its declared ``schema`` says, or a :class:`UserFunctionError` saying why not.

    ``result`` is a ``pyarrow.RecordBatch``, ``pyarrow.Table`` or a mapping of
    column name to values; it must hold exactly the schema's columns (in any
    order), each convertible to its declared type without loss, no null in a
    non-nullable one, and ``rows`` rows if given.
    """
    if isinstance(result, pa.RecordBatch):
        table = pa.Table.from_batches([result])
    elif isinstance(result, pa.Table):
        table = result
    elif isinstance(result, Mapping):
        try:
            table = pa.table(dict(result))
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise UserFunctionError(f"{label} returned a mapping that is not columns of equal length: {exc}") from None
    else:
        raise UserFunctionError(
            f"{label} returned {type(result).__name__}; it must return a pyarrow.RecordBatch, a pyarrow.Table "
            "or a mapping of column name to values"
        )
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
        column = table.column(field.name)
        try:
            column = column.cast(field.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise UserFunctionError(
                f"{label}: column {field.name} is {column.type}, which does not convert to its declared {field.type}: {exc}"
            ) from None
        if not field.nullable and column.null_count:
            raise UserFunctionError(f"{label}: column {field.name} is declared not nullable but holds {column.null_count} null(s)")
        arrays.append(column.combine_chunks())
    return arrays


def _check_row_columns(lists: list[Any] | tuple[Any, ...], schema: pa.Schema, label: str) -> None:
    """Every dict row names exactly the declared columns: Arrow would drop a misspelled key and read the column as null."""
    declared = set(schema.names)
    for record, rows in enumerate(lists):
        for row in rows if isinstance(rows, (list, tuple)) else ():
            if isinstance(row, Mapping) and row.keys() != declared:
                unexpected, missing = sorted(set(row) - declared), sorted(declared - set(row))
                raise UserFunctionError(
                    f"{label} returned a row with columns {sorted(row)} for record {record} of its batch, not those of "
                    f"its declared schema {schema.names} (missing {missing}, unexpected {unexpected}); give every "
                    "column, None for a null"
                )


def _row_lists(result: Any, schema: pa.Schema, label: str, rows: int) -> pa.Array:
    """A flat_map function's result as one list of rows per record (``list<struct>``)."""
    if isinstance(result, pa.ChunkedArray):
        result = result.combine_chunks()
    if not isinstance(result, pa.Array):
        if isinstance(result, (list, tuple)):
            _check_row_columns(result, schema, label)
        try:
            result = pa.array(result, pa.list_(pa.struct(list(schema))))
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise UserFunctionError(
                f"{label} returned {type(result).__name__} that is not one list of rows (dicts of {schema.names}) "
                f"per record: {exc}"
            ) from None
    if not (pa.types.is_list(result.type) or pa.types.is_large_list(result.type)) or not pa.types.is_struct(
        result.type.value_type
    ):
        raise UserFunctionError(f"{label} returned an array of {result.type}; flat_map returns one list of rows per record")
    if len(result) != rows:
        raise UserFunctionError(
            f"{label} returned {len(result)} lists for {rows} records; flat_map returns one list of rows "
            "(possibly empty) per record"
        )
    return result


# -- on the driver --------------------------------------------------------------------------------


def _label(node: Node, function: Any) -> str:
    name = getattr(function, "__qualname__", None) or type(function).__qualname__
    return f"{type(node).__name__} {node.operator_id} ({name})"


def _what(condition: Expression | None, function: Any) -> dict[str, str]:
    if function is not None:
        return {"function": f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', type(function).__qualname__)}"}
    return {"condition": str(condition)}


def _next_position(columns: list[str]) -> str | None:
    """The sub-position column a flat_map adds (None when its input carries no arrival position)."""
    if "_seq" not in columns:
        return None
    return f"_seq_{len(position_columns(columns))}"


def _check_outputs(operator_id: str, names: list[str], engine: list[str]) -> None:
    bad = sorted({n for n in names if n.startswith("_")})
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if bad or duplicates:
        raise PipelineDefinitionError(
            f"{operator_id}: output columns {names} are not allowed: {bad or duplicates} "
            f"{'start with _ (the engine columns, which every record keeps anyway)' if bad else 'appear more than once'}"
        )


def _long_field(name: str) -> "StructField":
    from pyspark.sql.types import LongType, StructField

    return StructField(name, LongType(), False)


def _spark_schema(
    operator_id: str, df: "DataFrame", schema: pa.Schema, engine: list[str], extra: list["StructField"] | None = None
) -> Any:
    """The output's Spark schema: the declared columns, then the input's engine columns (and ``extra``)."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import StructType

    try:
        declared = from_arrow_schema(schema)
    except (TypeError, ValueError) as exc:
        raise PipelineDefinitionError(f"{operator_id}: schema {schema} has a type Spark cannot hold: {exc}") from None
    by_name = {f.name: f for f in df.schema.fields}
    return StructType([*declared.fields, *(by_name[c] for c in engine), *(extra or [])])


def _map_batches(
    node: Node, df: "DataFrame", transform: Callable[[pa.RecordBatch], pa.RecordBatch], schema: Any
) -> "DataFrame":
    """``transform`` each Arrow batch of ``df`` on the executors."""
    function = getattr(node, "function", None)
    ship_user_code(function)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield transform(batch)

    return df.mapInArrow(run, schema)
