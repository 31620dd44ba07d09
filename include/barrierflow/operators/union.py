"""Union: one stream of the records of several streams of the same schema, as Flink's ``DataStream.union``.

``a.union(b, c)`` has no state; what it must get right is which records an
epoch holds, their order, and the watermark:

1. Alignment. Epoch n's output is the union of every input's records up to
   barrier n: the runtime applies the operator once each input's epoch-n
   output is computed (a barrier records every source's offsets, so two
   sources are cut at one consistent point).
2. Schema. Every input has the same user columns, by name in any order,
   with the same types (nullability may differ); the output has the first
   input's column order (a column is nullable if it is on any input).
   Otherwise the pipeline fails when it is planned, before any epoch runs,
   with a :class:`~barrierflow.core.errors.PipelineDefinitionError` naming
   the missing, extra and differently typed columns of the input that differs.
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
from typing import Any, Mapping, Sequence

import pyarrow as pa

from barrierflow.core.columns import SEQ, is_engine_column, position_columns
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.base import Node, Task

__all__ = ["Union", "column_differences", "union_positions"]


@dataclass
class Union(Node):
    """The records of ``parent`` and every node of ``others``, in that input order."""

    others: tuple[Node, ...] = ()

    # It passes arrival order on without using it: its inputs need positions when its consumers do (3.).
    forwards_arrival_order = True

    def inputs(self) -> tuple[Node, ...]:
        assert self.parent is not None
        return (self.parent, *self.others)

    def passes_through(self, column: str) -> bool:
        return True  # (5.)

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        first = inputs[0]
        # (2.) Types as Arrow names them; nullability is not part of the check.
        typed = [{f.name: str(f.type) for f in schema if not is_engine_column(f.name)} for schema in inputs]
        for number, other in enumerate(typed[1:], start=2):
            problems = column_differences(typed[0], other)
            if problems:
                raise PipelineDefinitionError(
                    f"union {self.operator_id!r}: input {number} does not have input 1's columns ({'; '.join(problems)}); "
                    "every input of a union must have the same columns (by name, in any order) with the same types"
                )
        positions = union_positions([schema.names for schema in inputs])  # (3.)
        users = [f.with_nullable(any(s.field(f.name).nullable for s in inputs)) for f in first if not is_engine_column(f.name)]
        shared = [
            f.with_nullable(any(s.field(f.name).nullable for s in inputs))
            for f in first
            if is_engine_column(f.name) and f.name not in positions and all(f.name in s.names for s in inputs)
        ]
        return pa.schema([*users, *shared, *(pa.field(p, pa.int64()) for p in positions)])

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        schema = self.output_schema([table.schema for table in inputs])
        positions = union_positions([table.column_names for table in inputs])  # (3.)
        parts = []
        for index, table in enumerate(inputs):
            n = table.num_rows
            columns = {f.name: table.column(f.name) for f in schema if f.name not in positions}
            if positions:
                *carried, own = positions
                for c in carried:  # a position the input lacks is 0
                    columns[c] = (
                        table.column(c).cast(pa.int64()) if c in table.column_names else pa.repeat(pa.scalar(0, pa.int64()), n)
                    )
                columns[own] = pa.repeat(pa.scalar(index, pa.int64()), n)  # refined by the input's index
            parts.append(pa.table(columns).select(schema.names).cast(schema))
        return pa.concat_tables(parts)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "inputs": [n.operator_id for n in self.inputs()]}


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
    if not inputs or any(SEQ not in columns for columns in inputs):
        return []
    carried = position_columns(list(dict.fromkeys(c for columns in inputs for c in columns)))
    return [*carried, f"_seq_{len(carried)}"]
