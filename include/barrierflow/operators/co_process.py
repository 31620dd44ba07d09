"""Connected keyed streams and keyed co-process functions, as Flink's ``KeyedCoProcessFunction``.

``a.key_by("k").connect(b.key_by("k")).process("op", fn)`` runs
``fn.process_element1`` for each record of ``a`` and ``fn.process_element2``
for each record of ``b``, with keyed state and timers shared by both sides.
It is a :class:`~barrierflow.operators.process.KeyedProcess` whose records
come from two inputs, both keyed: a task gets every record of its key
groups from both, and runs the same state tables, timer table and per-key
loop. Within epoch n:

1. Alignment: both inputs' records up to barrier n are processed in epoch n
   (the runtime runs the operator once both inputs' epoch-n output is there).
2. Keys: both sides have as many key columns, of the same types pairwise
   (checked when the pipeline is planned, naming the columns); the second
   side's key columns take the first side's names, which key the state
   tables and the timer table. A key's state and timers are the same
   whichever side's record uses them.
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
   fails when the pipeline is planned, with an error saying so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import pyarrow as pa

from barrierflow.api.functions import KeyedCoProcessFunction, KeyedFunction
from barrierflow.core.columns import SEQ
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.base import Exchange, Node, Task
from barrierflow.operators.process import Element, KeyedProcess

# Importable from here as before (barrierflow/__init__.py, plan/pipeline.py).
__all__ = ["KeyedCoProcessFunction", "KeyedCoProcess"]


@dataclass
class KeyedCoProcess(KeyedProcess):
    """A keyed process operator over ``parent`` keyed by ``key`` and ``other`` keyed by ``other_key``."""

    other: Node | None = None
    other_key: tuple[str, ...] = ()

    function_type: ClassVar[type[KeyedFunction]] = KeyedCoProcessFunction
    other_use: ClassVar[str] = "a KeyedProcessFunction runs on one keyed stream: a.key_by(k).process(...)"
    what: ClassVar[str] = "co-process"

    def inputs(self) -> tuple[Node, ...]:
        assert self.parent is not None and self.other is not None
        return (self.parent, self.other)

    def keyed_inputs(self) -> list[tuple[Node, tuple[str, ...]]]:
        assert self.parent is not None and self.other is not None
        return [(self.parent, self.key), (self.other, self.other_key)]

    def exchanges(self) -> tuple[Exchange, ...]:
        return (Exchange.KEYED, Exchange.KEYED)  # (2.) a task gets both sides' records of its key groups

    def input_keys(self) -> tuple[tuple[str, ...], ...]:
        return (self.key, self.other_key)

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        first, second = inputs
        # (2.)
        differ = [
            f"{one} is {first.field(one).type} but {two} is {second.field(two).type}"
            for one, two in zip(self.key, self.other_key)
            if first.field(one).type != second.field(two).type
        ]
        if differ or len(self.key) != len(self.other_key):
            raise PipelineDefinitionError(
                f"co-process {self.operator_id!r}: the key columns of the two inputs differ in type "
                f"({'; '.join(differ) or f'{list(self.key)} and {list(self.other_key)}'}); "
                "connected keyed streams need keys of the same types, in the same order"
            )
        # (7.)
        if any(SEQ not in schema.names for schema in inputs):
            raise PipelineDefinitionError(
                f"co-process {self.operator_id!r}: an input carries no arrival position (_seq), so the order of its records "
                "would depend on parallelism; connect streams of sources, stateless operators or unions"
            )
        return super().output_schema(inputs)

    def side_keys(self) -> tuple[tuple[str, ...], ...]:
        return (self.key, self.other_key)  # (2.)

    def elements(self, fn: KeyedFunction) -> list[Element]:
        assert isinstance(fn, KeyedCoProcessFunction)
        return [fn.process_element1, fn.process_element2]

    def run(self, task: Task, inputs: Sequence[pa.Table]) -> pa.Table:
        first, second = inputs
        return self.run_keyed(task, [first, second], {})  # (3.)-(4.), (6.)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "inputs": [n.operator_id for n in self.inputs()], "other_key": list(self.other_key)}
