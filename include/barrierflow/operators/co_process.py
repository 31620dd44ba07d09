"""Connected keyed streams and keyed co-process functions, as Flink's ``KeyedCoProcessFunction``.

``a.key_by("k").connect(b.key_by("k")).process("op", fn)`` runs
``fn.process_element1`` for each record of ``a`` and ``fn.process_element2``
for each record of ``b``, with keyed state and timers shared by both sides.
It is a :class:`~barrierflow.operators.process.KeyedProcess` whose records
come from two inputs: the same key-group batches, state tables, timer table
and per-key loop (``_run_key_group``). Within epoch n:

1. Alignment: both inputs' records up to barrier n are processed in epoch n
   (the runtime runs the operator once both inputs' epoch-n output is there).
2. Keys: both sides have as many key columns, of the same types pairwise
   (checked when the epoch runs, naming the columns); the second side's key
   columns take the first side's names, which key the state tables and the
   timer table. A key's state and timers are the same whichever side's
   record uses them.
3. Order: per key, the records of both sides run by arrival position
   (``_seq``: source in declaration order, file, line; then a flat_map's
   sub-positions), side 1 before side 2 at a tie (one source record reaching
   both sides), as :mod:`barrierflow.operators.union` (3.) orders a union of
   the two. So results never depend on parallelism or on how the two inputs
   interleave. Each record is a dict of its own side's columns, seen with
   the watermark W(n-1).
4. Then the key's due timers fire, ``on_timer`` as in
   :mod:`barrierflow.operators.timers` (2.-4.): event time up to W(n), then
   processing time up to P(n); the timers left are the key's timer state.
5. Watermark: the minimum of the inputs' watermarks, as for a union
   (:mod:`barrierflow.operators.union` (4.)): both inputs or neither have a
   watermark assigner upstream; with several assigners a function with
   timers must be downstream of all of them.
6. Exactly-once: state and timers are the operator's Delta state tables,
   staged with the epoch, kept by savepoints and redistributed by key group
   on rescale, as for every keyed process function.
7. Bad input: each side's key is checked at its sources (a null or empty key
   in JSON Lines is a dead letter there); an input without arrival positions
   fails the epoch with an error saying so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

import pyarrow as pa

from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.base import Node, user_columns
from barrierflow.operators.process import Element, KeyedContext, KeyedFunction, KeyedProcess
from barrierflow.operators.union import union_frames, union_positions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["KeyedCoProcessFunction", "KeyedCoProcess", "RECORD_COLUMNS"]

# Each side's record, as a struct column of the combined frame (null on the other side's rows).
RECORD_COLUMNS = ("_record1", "_record2")


class KeyedCoProcessFunction(KeyedFunction):
    """Subclass and implement :meth:`process_element1` and :meth:`process_element2`; emit rows with ``out``.

    State descriptors, ``output_schema`` and ``on_timer`` are as for a
    :class:`~barrierflow.operators.process.KeyedProcessFunction`; ``ctx`` is
    the same :class:`~barrierflow.operators.process.KeyedContext`.
    """

    def process_element1(self, record: dict[str, Any], ctx: KeyedContext, out: Callable[[dict[str, Any]], None]) -> None:
        raise NotImplementedError

    def process_element2(self, record: dict[str, Any], ctx: KeyedContext, out: Callable[[dict[str, Any]], None]) -> None:
        raise NotImplementedError

    def element_calls(self, records: pa.Table) -> list[tuple[Element, dict[str, Any]]]:
        # (3.) the rows come sorted by key and position; a row's side is the record it holds.
        first, second = (records.column(c).to_pylist() for c in RECORD_COLUMNS)
        return [
            (self.process_element1, one) if one is not None else (self.process_element2, two)
            for one, two in zip(first, second)
        ]


@dataclass
class KeyedCoProcess(KeyedProcess):
    """A keyed process operator over ``parent`` keyed by ``key`` and ``other`` keyed by ``other_key``."""

    other: Node | None = None
    other_key: tuple[str, ...] = ()

    function_type: ClassVar[type[KeyedFunction]] = KeyedCoProcessFunction
    other_use: ClassVar[str] = "a KeyedProcessFunction runs on one keyed stream: a.key_by(k).process(...)"

    def inputs(self) -> tuple[Node, ...]:
        assert self.parent is not None and self.other is not None
        return (self.parent, self.other)

    def keyed_inputs(self) -> list[tuple[Node, tuple[str, ...]]]:
        assert self.parent is not None and self.other is not None
        return [(self.parent, self.key), (self.other, self.other_key)]

    def apply_inputs(self, ctx: Any, frames: Sequence["DataFrame"]) -> "DataFrame":
        from pyspark.sql import functions as F
        from pyspark.sql.types import StructType

        keys = (self.key, self.other_key)
        # (2.)
        types = [ctx.arrow_types(df, key) for df, key in zip(frames, keys)]
        differ = [
            f"{one} is {types[0][one]} but {two} is {types[1][two]}"
            for one, two in zip(self.key, self.other_key)
            if types[0][one] != types[1][two]
        ]
        if differ:
            raise PipelineDefinitionError(
                f"co-process {self.operator_id!r}: the key columns of the two inputs differ in type ({'; '.join(differ)}); "
                "connected keyed streams need keys of the same types, in the same order"
            )
        # (7.)
        if not union_positions([df.columns for df in frames]):
            raise PipelineDefinitionError(
                f"co-process {self.operator_id!r}: an input carries no arrival position (_seq), so the order of its records "
                "would depend on parallelism; connect streams of sources, stateless operators or unions"
            )
        structs = [StructType([f for f in df.schema.fields if not f.name.startswith("_")]) for df in frames]

        def select(index: int, df: "DataFrame") -> list[Any]:
            columns = [F.col(theirs).alias(ours) for ours, theirs in zip(self.key, keys[index])]
            for side, name in enumerate(RECORD_COLUMNS):
                if side == index:
                    columns.append(F.struct(*[F.col(c) for c in user_columns(df)]).alias(name))
                else:
                    columns.append(F.lit(None).cast(structs[side]).alias(name))
            return columns

        # (3.) one frame of both sides' records, positions refined by side; then the KeyedProcess machinery (4.-6.).
        return self.apply(ctx, union_frames(frames, select))

    # -- the chained form (barrierflow.execution.chained_region): apply_inputs' one frame of both sides, then KeyedProcess's

    def _combined_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema | None:
        """The schema of :meth:`apply_inputs`' frame of both sides' records; None where Spark's path raises an error instead."""
        first, second = inputs
        named = all(k in first.names for k in self.key) and all(k in second.names for k in self.other_key)
        if len(self.key) != len(self.other_key) or not named:
            return None
        if any(first.field(one).type != second.field(two).type for one, two in zip(self.key, self.other_key)):
            return None  # (2.)
        positions = union_positions([schema.names for schema in inputs])
        if not positions:
            return None  # (7.)
        return pa.schema(
            [
                *(pa.field(k, first.field(k).type) for k in self.key),
                *(pa.field(name, _record_type(schema)) for name, schema in zip(RECORD_COLUMNS, inputs)),
                *(pa.field(p, pa.int64()) for p in positions),
            ]
        )

    def chained_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema | None:
        combined = self._combined_schema(inputs)
        assert self.function is not None
        return None if combined is None else self._chained_output(combined, self.function)

    def apply_chained(self, task: Any, inputs: Sequence[pa.Table]) -> pa.Table:
        """:meth:`apply_inputs` in a chained task: both sides' records in one table, as its frame (2., 3.); then (4.-6.)."""
        schema = self._combined_schema([table.schema for table in inputs])
        assert schema is not None and self.function is not None
        keys = (self.key, self.other_key)
        *carried, _ = union_positions([table.column_names for table in inputs])  # (3.) the last: the side
        parts = []
        for index, table in enumerate(inputs):
            n = table.num_rows
            columns: list[Any] = [table.column(theirs) for theirs in keys[index]]  # (2.) named as the first side's
            for side, name in enumerate(RECORD_COLUMNS):
                struct = schema.field(name).type
                users = [f.name for f in struct]
                columns.append(table.select(users).to_struct_array().cast(struct) if side == index else pa.nulls(n, struct))
            zeros = pa.repeat(pa.scalar(0, pa.int64()), n)
            columns += [table.column(c).cast(pa.int64()) if c in table.column_names else zeros for c in carried]
            columns.append(pa.repeat(pa.scalar(index, pa.int64()), n))
            parts.append(pa.table(columns, schema=schema))
        return self.process_chained(task, pa.concat_tables(parts), self.function)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "inputs": [n.operator_id for n in self.inputs()], "other_key": list(self.other_key)}


def _record_type(schema: pa.Schema) -> pa.StructType:
    """A side's record column: a struct of its user columns, as ``F.struct`` of them."""
    return pa.struct([pa.field(f.name, f.type) for f in schema if not f.name.startswith("_")])
