"""Union: one stream of the records of several streams of the same schema, as Flink's ``DataStream.union``.

``a.union(b, c)`` has no state; what it must get right is which records an
epoch holds, their order, and the watermark:

1. Alignment. Epoch n's output is the union of every input's records up to
   barrier n: the runtime applies the operator once each input's epoch-n
   output is computed (a barrier records every source's offsets, so two
   sources are cut at one consistent point).
2. Schema. Every input has the same user columns, by name in any order,
   with the same types (nullability may differ); the output has the first
   input's column order. Otherwise the epoch fails before its vote with a
   :class:`~barrierflow.core.errors.PipelineDefinitionError` naming the missing,
   extra and differently typed columns of the input that differs.
3. Order. A record keeps its arrival position (``_seq``: source index, file,
   line; a flat_map's sub-positions ``_seq_1``...; one an input lacks is 0),
   refined by a new sub-position, the input's index in the union. Positions
   stay unique and come from the records alone, so downstream results never
   depend on parallelism or on how the inputs interleave: records of two
   sources order by source, in declaration order (its index is ``_seq``'s
   top bits), whatever the union's input order; one record
   reaching the union twice (a stream unioned with a branch of itself)
   orders by input. When no consumer needs arrival order some inputs may
   carry no position (unordered reads); the output then carries none.
4. Watermark. A multi-input operator's watermark is the minimum of its
   inputs'; an input without an assigner upstream has none (-infinity), so
   the declaration requires that every input or none has an assigner
   upstream. The pipeline's watermark is the minimum over its assigners
   (:mod:`barrierflow.operators.watermark`), which event-time operators
   downstream of all of them see. An assigner after the union watermarks
   the union's records, as in Flink.
5. Keys. Every column passes through unchanged from each input, so a key
   taken by a keyed operator downstream is checked (null or empty: a dead
   letter) at every source upstream of the union.
6. Exactly-once. No state: replaying the sources from the last completed
   barrier reproduces the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import pyarrow as pa

from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.base import Node, position_columns, user_columns

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["Union", "column_differences", "union_frames", "union_positions"]


@dataclass
class Union(Node):
    """The records of ``parent`` and every node of ``others``, in that input order."""

    others: tuple[Node, ...] = ()

    forwards_arrival_order = True

    def inputs(self) -> tuple[Node, ...]:
        assert self.parent is not None
        return (self.parent, *self.others)

    def passes_through(self, column: str) -> bool:
        return True  # (5.)

    def apply_inputs(self, ctx: Any, frames: Sequence["DataFrame"]) -> "DataFrame":
        from pyspark.sql import functions as F

        # (2.) Types as Spark names them; nullability is not part of the schema check.
        typed = [{f.name: f.dataType.simpleString() for f in df.schema.fields if not f.name.startswith("_")} for df in frames]
        for number, other in enumerate(typed[1:], start=2):
            problems = column_differences(typed[0], other)
            if problems:
                raise PipelineDefinitionError(
                    f"union {self.operator_id!r}: input {number} does not have input 1's columns ({'; '.join(problems)}); "
                    "every input of a union must have the same columns (by name, in any order) with the same types"
                )
        names = user_columns(frames[0])
        positions = union_positions([df.columns for df in frames])
        shared = [c for c in frames[0].columns if c.startswith("_") and c not in positions and all(c in df.columns for df in frames)]
        return union_frames(frames, lambda index, df: [F.col(c) for c in (*names, *shared)])

    def chained_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema | None:
        """The output's schema as :meth:`apply_inputs` gives it; None when the inputs differ (Spark raises the error)."""
        typed = [{f.name: f.type for f in schema if not f.name.startswith("_")} for schema in inputs]
        if any(other != typed[0] for other in typed[1:]):
            return None
        first = inputs[0]
        positions = union_positions([schema.names for schema in inputs])
        shared = [f for f in first if f.name.startswith("_") and f.name not in positions and all(f.name in s.names for s in inputs)]
        users = [f for f in first if not f.name.startswith("_")]
        return pa.schema([*users, *shared, *(pa.field(p, pa.int64()) for p in positions)])

    def apply_chained(self, task: Any, inputs: Sequence[pa.Table]) -> pa.Table:
        schema = self.chained_schema([t.schema for t in inputs])
        assert schema is not None
        positions = union_positions([t.column_names for t in inputs])  # (3.)
        parts = []
        for index, table in enumerate(inputs):
            columns = {f.name: table[f.name] for f in schema if f.name not in positions}
            if positions:
                *carried, own = positions
                columns.update({c: table[c] if c in table.column_names else pa.repeat(pa.scalar(0, pa.int64()), table.num_rows) for c in carried})
                columns[own] = pa.repeat(pa.scalar(index, pa.int64()), table.num_rows)
            parts.append(pa.table(columns).select(schema.names).cast(schema))
        return pa.concat_tables(parts)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "inputs": [n.operator_id for n in self.inputs()]}


def union_frames(frames: Sequence["DataFrame"], select: Callable[[int, "DataFrame"], list["Column"]]) -> "DataFrame":
    """The rows of every frame, each projected on ``select(input index, frame)``, with positions as in (3.).

    Every projection must give the same columns in the same order (the
    parts are unioned by position); the position columns follow them.
    """
    from pyspark.sql import functions as F

    positions = union_positions([df.columns for df in frames])  # (3.)
    out: "DataFrame | None" = None
    for index, df in enumerate(frames):
        columns = select(index, df)
        if positions:
            *carried, own = positions
            columns += [(F.col(c) if c in df.columns else F.lit(0)).cast("long").alias(c) for c in carried]
            columns.append(F.lit(index).cast("long").alias(own))
        part = df.select(*columns)
        out = part if out is None else out.union(part)
    assert out is not None
    return out


def column_differences(first: Mapping[str, str], other: Mapping[str, str]) -> list[str]:
    """How the columns (name -> type) of ``other`` differ from ``first``'s, one phrase per kind; empty if they agree."""
    missing = [c for c in first if c not in other]
    extra = [c for c in other if c not in first]
    retyped = [f"{c} is {other[c]}, not {first[c]}" for c in first if c in other and other[c] != first[c]]
    problems = []
    if missing:
        problems.append(f"missing {missing}")
    if extra:
        problems.append(f"extra {extra}")
    if retyped:
        problems.append(", ".join(retyped))
    return problems


def union_positions(inputs: Sequence[Sequence[str]]) -> list[str]:
    """The output's position columns (3.): each input's ones, most significant first, then one for the input index.

    Empty when some input carries no ``_seq`` (no consumer needs arrival order).
    """
    if not inputs or any("_seq" not in columns for columns in inputs):
        return []
    carried = position_columns(list(dict.fromkeys(c for columns in inputs for c in columns)))
    return [*carried, f"_seq_{len(carried)}"]
