"""Connected keyed streams and keyed co-process functions, as Flink's ``KeyedCoProcessFunction``.

``a.key_by("k").connect(b.key_by("k")).process("op", fn)``: a :class:`~barrierflow.operators.process.KeyedProcess`
with two keyed inputs, ``fn.process_element1`` for ``a``'s records and ``process_element2`` for ``b``'s, sharing keyed
state and timers. Within epoch n:

1. Alignment: both inputs' records up to barrier n are processed.
2. Keys: both sides have as many key columns, of the same types pairwise (checked when planned); the first side's
   names key the shared state and timer tables.
3. Order: per key, both sides' records by arrival position, side 1 first at a tie, as a union orders them; a record is
   a dict of its side's columns.
4. Then the key's due timers fire (timers 2.-4.).
5. Watermark: the minimum of the inputs', as for a union (4.).
6. State and timers are keyed state tables, as for any keyed process function.
7. Each side's key is checked at its sources; an input without arrival positions fails when planned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pyarrow as pa

from barrierflow.api.functions import KeyedCoProcessFunction
from barrierflow.core.columns import SEQ
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.operators.base import Node
from barrierflow.operators.process import KeyedProcess

# Importable from here as before (plan/pipeline.py).
__all__ = ["KeyedCoProcessFunction", "KeyedCoProcess"]


@dataclass
class KeyedCoProcess(KeyedProcess):
    """A keyed process operator over ``parent`` keyed by ``key`` and ``other`` keyed by ``other_key``."""

    other: Node | None = None
    other_key: tuple[str, ...] = ()

    function_type = KeyedCoProcessFunction
    other_use = "a KeyedProcessFunction runs on one keyed stream: a.key_by(k).process(...)"
    element_methods = ("process_element1", "process_element2")
    what = "co-process"

    def inputs(self) -> tuple[Node, ...]:
        assert self.parent is not None and self.other is not None
        return (self.parent, self.other)

    def keyed_inputs(self) -> list[tuple[Node, tuple[str, ...]]]:
        return list(zip(self.inputs(), self.side_keys()))  # (2.) a task gets both sides' records of its key groups

    def side_keys(self) -> tuple[tuple[str, ...], ...]:
        return (self.key, self.other_key)

    def output_schema(self, inputs: Sequence[pa.Schema]) -> pa.Schema:
        first, second = inputs
        differ = [
            f"{one} is {first.field(one).type} but {two} is {second.field(two).type}"
            for one, two in zip(self.key, self.other_key)
            if first.field(one).type != second.field(two).type
        ]
        if differ or len(self.key) != len(self.other_key):  # (2.)
            raise PipelineDefinitionError(
                f"co-process {self.operator_id!r}: the key columns of the two inputs differ in type "
                f"({'; '.join(differ) or f'{list(self.key)} and {list(self.other_key)}'}); "
                "connected keyed streams need keys of the same types, in the same order"
            )
        if any(SEQ not in schema.names for schema in inputs):  # (7.)
            raise PipelineDefinitionError(
                f"co-process {self.operator_id!r}: an input carries no arrival position (_seq), so the order of its records "
                "would depend on parallelism; connect streams of sources, stateless operators or unions"
            )
        return super().output_schema(inputs)
