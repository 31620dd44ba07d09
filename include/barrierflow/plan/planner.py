"""The planner: a pipeline's schemas, state tables and chains, from its graph and its sources' schemas.

Before any record is read, each operator is asked its output's schema, state
tables and side outputs given its inputs' schemas: a pipeline that cannot run
(a missing column, a key type without a key group) fails here, naming the
operator. The graph is then cut into **stages** where records must move
between tasks (README "Where the work runs, and the two state backends"):

1. Every source is in stage 0, whose tasks each read a split of the input.
2. An operator joins the latest stage among its inputs when each reaches it
   ``FORWARD``; an input reaching it by key group (``KEYED``), all in one
   task (``GLOBAL``) or to every task (``BROADCAST``) puts it in the stage
   after that input's.
3. An event-time operator runs in a stage after every watermark assigner's,
   so that W(n), which every assigner's records decide, is final when it runs.
4. An operator whose inputs all arrive ``GLOBAL`` runs in one task of its
   stage (a *singleton*: an upsert sink, a non-keyed process function).

The stages matter only when an epoch runs in parallel tasks (a size decision, never a semantic one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import pyarrow as pa

from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.core.keys import hashable_key_type
from barrierflow.operators.base import Exchange, Node
from barrierflow.operators.watermark import WatermarkAssigner
from barrierflow.plan.pipeline import Pipeline, SourceNode
from barrierflow.state.spec import StateSpec

__all__ = ["Edge", "PhysicalPlan", "physical_plan"]


@dataclass(frozen=True)
class Edge:
    """An input of ``consumer`` (its ``input``-th) fed by ``producer``'s output."""

    producer: int
    consumer: int
    input: int
    exchange: Exchange
    key: tuple[str, ...] = ()  # a KEYED edge's key columns on the producer's rows

    @property
    def name(self) -> str:
        return f"{self.producer}-{self.consumer}-{self.input}"


@dataclass(frozen=True)
class PhysicalPlan:
    """Everything about a pipeline that its graph and its sources' schemas decide."""

    schemas: tuple[pa.Schema, ...]  # each node's output
    inputs: tuple[tuple[int, ...], ...]  # each node's inputs, by position
    state_specs: Mapping[int, tuple[StateSpec, ...]]  # each node's state tables, typed
    side_outputs: Mapping[str, tuple[int, pa.Schema]]  # each side output's node and rows' schema
    edges: tuple[Edge, ...]
    stage_of: tuple[int, ...]
    singletons: frozenset[int]
    source_keys: Mapping[int, Mapping[str, str]]  # source node -> key column -> the operator keyed by it
    computed_keys: Mapping[int, tuple[tuple[int, str, str], ...]]  # node -> (input, column, computed by)

    @property
    def stages(self) -> list[tuple[int, ...]]:
        """The nodes of each stage, in pipeline order."""
        count = max(self.stage_of, default=-1) + 1
        return [tuple(i for i, s in enumerate(self.stage_of) if s == stage) for stage in range(count)]

    def crossing(self, stage: int) -> tuple[list[Edge], list[Edge]]:
        """The edges into ``stage`` from earlier stages, and out of it to later ones."""
        incoming = [e for e in self.edges if self.stage_of[e.consumer] == stage and self.stage_of[e.producer] < stage]
        outgoing = [e for e in self.edges if self.stage_of[e.producer] == stage and self.stage_of[e.consumer] > stage]
        return incoming, outgoing


def physical_plan(pipe: Pipeline, source_schemas: Mapping[int, pa.Schema]) -> PhysicalPlan:
    """Schemas, typed state, exchanges and stages of ``pipe`` (``source_schemas``: each source node's records, ``_seq`` included)."""
    nodes = pipe.nodes
    index = {id(n): i for i, n in enumerate(nodes)}
    inputs = tuple(tuple(index[id(i)] for i in node.inputs()) for node in nodes)
    schemas: list[pa.Schema] = []
    specs: dict[int, tuple[StateSpec, ...]] = {}
    side: dict[str, tuple[int, pa.Schema]] = {}
    edges: list[Edge] = []
    for position, node in enumerate(nodes):
        if position in source_schemas:
            schemas.append(source_schemas[position])
            specs[position] = tuple(node.state_specs([]))
            continue
        given = [schemas[i] for i in inputs[position]]
        for (upstream, key), schema in zip(node.keyed_inputs(), given):
            _check_key(node, key, schema)
        schemas.append(node.output_schema(given))
        specs[position] = tuple(node.state_specs(given))
        side.update((name, (position, schema)) for name, schema in node.side_output_schemas(given).items())
        edges += [
            Edge(inputs[position][i], position, i, x, key) for i, (x, key) in enumerate(zip(node.exchanges(), node.input_keys()))
        ]
    stage_of, singletons = _stages(nodes, inputs, edges)
    computed = {i: tuple(pipe.computed_keys(n)) for i, n in enumerate(nodes)}
    return PhysicalPlan(
        schemas=tuple(schemas), inputs=inputs, state_specs=specs, side_outputs=side, edges=tuple(edges),
        stage_of=tuple(stage_of), singletons=frozenset(singletons), computed_keys={i: c for i, c in computed.items() if c},
        source_keys={i: pipe.source_keys(n) for i, n in enumerate(nodes) if i in source_schemas and isinstance(n, SourceNode)},
    )  # fmt: skip


def _check_key(node: Node, key: tuple[str, ...], schema: pa.Schema) -> None:
    for column in key:
        if column not in schema.names:
            raise PipelineDefinitionError(
                f"{node.operator_id!r} is keyed by {column!r}, which its input does not have (columns: "
                f"{[n for n in schema.names if not n.startswith('_')]})"
            )
        if not hashable_key_type(schema.field(column).type):
            raise PipelineDefinitionError(
                f"{node.operator_id!r} is keyed by {column!r} of type {schema.field(column).type}; a key column is a "
                "boolean, integer, float, string, binary, date, timestamp or decimal of precision 18 at most"
            )


def _stages(nodes: list[Node], inputs: tuple[tuple[int, ...], ...], edges: list[Edge]) -> tuple[list[int], set[int]]:
    """Steps 1-4 of the module docstring: each node's stage, and the singletons."""
    stage_of: list[int] = []
    singletons: set[int] = set()
    assigners = [i for i, n in enumerate(nodes) if isinstance(n, WatermarkAssigner)]
    for position, node in enumerate(nodes):
        incoming = [e for e in edges if e.consumer == position]
        if not inputs[position]:
            stage_of.append(0)  # 1.
            continue
        stage = max(stage_of[e.producer] + (0 if e.exchange is Exchange.FORWARD else 1) for e in incoming)  # 2.
        if node.uses_watermark:  # 3.
            stage = max([stage, *(stage_of[a] + 1 for a in assigners if a < position)])
        stage_of.append(stage)
        if all(e.exchange is Exchange.GLOBAL for e in incoming):  # 4.
            singletons.add(position)
    return stage_of, singletons
