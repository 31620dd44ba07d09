"""Union: one stream of the records of several streams of the same schema, as Flink's ``DataStream.union``.

1. Alignment. Epoch n's output is every input's records up to barrier n.
2. Schema. Every input has the same user columns (by name, in any order) of the same types; the output has the first input's
   order, a column nullable if it is on any input. Otherwise planning fails, naming the missing, extra and differently typed
   columns of the input that differs.
3. Order. A record keeps its arrival position (``_seq``, ``_seq_1``...; one an input lacks is 0) refined by its input's index, a
   new sub-position: unique, from the records alone, so results never depend on parallelism or interleaving (two sources order by
   source, one record reaching the union twice by input). When some input carries no position, the output carries none.
4. Watermark. The minimum of the inputs'; one without an assigner upstream has none, so every input or none must have one
   upstream.
5. Keys. Columns pass through unchanged: a key taken downstream is checked at every source upstream.
6. Exactly-once. No state: replaying the sources reproduces the epoch.
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

    def inputs(self) -> tuple[Node, ...]:
        assert self.parent is not None
        return (self.parent, *self.others)

    def passes_through(self, column: str) -> bool:
        return True  # (5.)

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
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
        kept = [f for f in inputs[0] if f.name not in positions and all(f.name in s.names for s in inputs)]  # every user column
        fields = [f.with_nullable(any(s.field(f.name).nullable for s in inputs)) for f in kept]
        fields.sort(key=lambda f: is_engine_column(f.name))  # the user columns, then the engine's the inputs share
        return pa.schema([*fields, *(pa.field(p, pa.int64()) for p in positions)])

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        schema = self.output_schema([table.schema for table in inputs])
        positions = union_positions([table.column_names for table in inputs])  # (3.)
        parts = []
        for index, table in enumerate(inputs):
            columns = {f.name: table.column(f.name) for f in schema if f.name not in positions}
            zero = pa.repeat(pa.scalar(0, pa.int64()), table.num_rows)  # a position the input lacks
            columns.update({c: table.column(c).cast(pa.int64()) if c in table.column_names else zero for c in positions[:-1]})
            if positions:
                columns[positions[-1]] = pa.repeat(pa.scalar(index, pa.int64()), table.num_rows)  # refined by the input's index
            parts.append(pa.table(columns).select(schema.names).cast(schema))
        return pa.concat_tables(parts)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "inputs": [n.operator_id for n in self.inputs()]}


def column_differences(first: Mapping[str, str], other: Mapping[str, str]) -> list[str]:
    """How the columns (name -> type) of ``other`` differ from ``first``'s, one phrase per kind; empty if they agree."""
    missing = [c for c in first if c not in other]
    extra = [c for c in other if c not in first]
    retyped = ", ".join(f"{c} is {other[c]}, not {first[c]}" for c in first if c in other and other[c] != first[c])
    return [p for p in (f"missing {missing}" if missing else "", f"extra {extra}" if extra else "", retyped) if p]


def union_positions(inputs: Sequence[Sequence[str]]) -> list[str]:
    """The output's position columns (3.): the inputs', most significant first, then the input's index; none if one lacks _seq."""
    if not inputs or any(SEQ not in columns for columns in inputs):
        return []
    carried = position_columns(list(dict.fromkeys(c for columns in inputs for c in columns)))
    return [*carried, f"_seq_{len(carried)}"]
