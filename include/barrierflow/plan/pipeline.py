"""The pipeline API: sources -> keyed operators -> sinks, with stable operator ids (README: "Declare a pipeline").

A build function gets a :class:`PipelineBuilder` and the resolved parameters;
every method adds one operator (:mod:`barrierflow.operators`). An operator with
several inputs runs in epoch n once every input's epoch-n output is computed;
its watermark is the minimum of its inputs'.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Callable, Mapping, Sequence

import pyarrow as pa

from barrierflow.api.aggregations import Aggregation, named_aggregations
from barrierflow.api.params import Param, resolve_params
from barrierflow.api.state import MapStateDescriptor
from barrierflow.connectors.delta_sink import DeltaSink, SinkNode
from barrierflow.connectors.source import Source
from barrierflow.core.errors import PipelineDefinitionError
from barrierflow.core.settings import DEFAULT_KEY_GROUPS
from barrierflow.operators import stateless
from barrierflow.operators.aggregate import RunningAggregate
from barrierflow.operators.base import Node
from barrierflow.operators.broadcast import KeyedBroadcastProcess, KeyedBroadcastProcessFunction
from barrierflow.operators.co_process import KeyedCoProcess, KeyedCoProcessFunction
from barrierflow.operators.dedup import Deduplicate
from barrierflow.operators.interval_join import IntervalBounds, IntervalJoin
from barrierflow.operators.operator_state import OperatorProcess, ProcessFunction, source_offsets_spec
from barrierflow.operators.process import KeyedProcess, KeyedProcessFunction
from barrierflow.operators.stateless import BatchFunction, Expression
from barrierflow.operators.union import Union
from barrierflow.operators.watermark import WatermarkAssigner
from barrierflow.operators.window import WindowAssigner, window_node
from barrierflow.operators.window_join import WindowJoin
from barrierflow.state.spec import StateSpec

__all__ = [
    "PipelineDefinition", "PipelineBuilder", "DataStream", "KeyedStream", "ConnectedKeyedStreams", "IntervalJoinedStreams",
    "JoinedStreams", "Pipeline", "pipeline", "DEFAULT_KEY_GROUPS",
]  # fmt: skip

# Where operators merge keyed state with an epoch's changes (see ``pipeline()``).
STATE_BACKENDS = ("delta", "heap")
_ID = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass
class SourceNode(Node):
    """A source in the graph: its records are read by the tasks, its offsets are operator state."""

    source: Source | None = None

    def state_specs(self, inputs: Sequence[pa.Schema] | None = None) -> list[StateSpec]:
        """Its offsets, union list state (``operator_state`` 8.): saved, restored and checked as any state."""
        return [source_offsets_spec(self.operator_id)]


@dataclass
class Pipeline:
    """A built pipeline: its nodes in creation (hence topological) order."""

    name: str
    key_groups: int
    nodes: list[Node]
    params: dict[str, Any]
    parallelism: int
    state_backend: str = "delta"

    @property
    def sources(self) -> list[SourceNode]:
        return [n for n in self.nodes if isinstance(n, SourceNode)]

    @property
    def sinks(self) -> list[SinkNode]:
        return [n for n in self.nodes if isinstance(n, SinkNode)]

    def state_specs(self) -> list[StateSpec]:
        return [spec for n in self.nodes for spec in n.state_specs()]

    def source_keys(self, source: SourceNode) -> dict[str, str]:
        """Key column -> the first keyed operator taking it unchanged (``Node.passes_through``) from ``source``'s records."""
        keys: dict[str, str] = {}
        for node in self.nodes:
            for upstream, key in node.keyed_inputs():
                for column in key:
                    if _reaches_unchanged(upstream, column, source):
                        keys.setdefault(column, node.operator_id)
        return keys

    def computed_keys(self, node: Node) -> list[tuple[int, str, str]]:
        """The key columns ``node`` takes from an input that no source checked: ``(input index, column, computed by)``.

        Checked means: on every path unchanged from a source (:meth:`source_keys`)
        or from an earlier keyed operator's key columns. Any other (a map,
        select or flat_map computes it) is checked before ``node``
        (:mod:`barrierflow.operators.key_check`).
        """
        inputs, taken, found = node.inputs(), set(), []
        for upstream, key in node.keyed_inputs():
            # A stream connected to itself is two inputs: each keyed input is the next unused one.
            index = next(i for i, n in enumerate(inputs) if n is upstream and i not in taken)
            taken.add(index)
            for column in key:
                computing = _computed_by(upstream, column)
                if computing is not None:
                    found.append((index, column, computing.operator_id))
        return found

    def side_output_names(self) -> list[str]:
        return [name for n in self.nodes for name in n.side_outputs()]

    def operator_ids(self) -> list[str]:
        return [n.operator_id for n in self.nodes]


def _reaches_unchanged(node: Node, column: str, source: Node) -> bool:
    """Whether ``column`` of ``source``'s records is ``node``'s output column, unchanged on some path (``Node.passes_through``)."""
    upstream = [node]
    while upstream:
        current = upstream.pop()
        if current is source:
            return True
        if current.passes_through(column):
            upstream.extend(current.inputs())
    return False


def _computed_by(node: Node, column: str) -> Node | None:
    """The first operator on a path to ``node`` that computes ``column`` (not a source, an unchanged pass or a keyed output), else None."""
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, SourceNode) or column in current.key_output():
            continue
        if not current.passes_through(column) or not current.inputs():
            return current
        pending.extend(reversed(current.inputs()))
    return None


def _check_watermarks(what: str, inputs: tuple[Node, ...], advice: str) -> None:
    """A multi-input operator's watermark is the minimum of its inputs'; one without an assigner upstream has none (-infinity)."""
    watermarked = [any(isinstance(n, WatermarkAssigner) for n in _upstream(i)) for i in inputs]
    if any(watermarked) and not all(watermarked):
        missing = [n + 1 for n, has in enumerate(watermarked) if not has]
        raise PipelineDefinitionError(
            f"{what}: input(s) {missing} have no watermark upstream while others do; the watermark of an operator "
            f"with several inputs is the minimum of its inputs', and an input without one has none: {advice}"
        )


def _check_assigners(nodes: list[Node]) -> None:
    """With several watermark assigners, each keeps its maximum in state, and every event-time operator is downstream of all.

    (The pipeline's watermark, the minimum over its assigners, is then each operator's own.)
    """
    assigners = [n for n in nodes if isinstance(n, WatermarkAssigner)]
    if len(assigners) < 2:
        return
    for assigner in assigners:
        assigner.tracked = True
    for node in nodes:
        if node.uses_watermark:
            upstream = _upstream(node)
            missing = [a.operator_id for a in assigners if not any(a is n for n in upstream)]
            if missing:
                raise PipelineDefinitionError(
                    f"{node.operator_id!r} uses event time but watermark assigner(s) {missing} are not upstream of it; "
                    "a pipeline's watermark is the minimum of its assigners', so with several assigners every "
                    "event-time operator (window, join, process function with timers) must be downstream of all of them"
                )


def _event_time_columns(what: str, *inputs: Node) -> tuple[str, str]:
    """The event-time column of each input's records: that of the watermark assigner upstream of it."""
    found = []
    for number, node in enumerate(inputs, 1):
        columns = sorted({n.column for n in _upstream(node) if isinstance(n, WatermarkAssigner)})
        if len(columns) != 1:
            raise PipelineDefinitionError(
                f"{what}: input {number} has {'no watermark assigner' if not columns else f'assigners of columns {columns}'} "
                "upstream; each input of an event-time join needs exactly one event-time column: "
                "with_watermark(column, out_of_orderness) on it (e.g. after its source)"
            )
        found.append(columns[0])
    return found[0], found[1]


def _check_of_pipeline(builder: PipelineBuilder, what: str, other: Any, kind: type[Any], advice: str) -> None:
    """Refuse ``other`` unless it is a ``kind`` stream of ``builder``'s pipeline."""
    if not isinstance(other, kind) or other.builder is not builder:
        keyed = "keyed " if kind is KeyedStream else ""
        raise PipelineDefinitionError(f"{what}: {other!r} is not a {keyed}stream of this pipeline; give {advice}")


def _upstream(node: Node) -> list[Node]:
    """``node`` and every node it depends on."""
    seen: list[Node] = []
    pending = [node]
    while pending:
        current = pending.pop()
        if not any(current is n for n in seen):
            seen.append(current)
            pending.extend(current.inputs())
    return seen


class PipelineBuilder:
    """Collects the nodes of a pipeline while its build function runs."""

    def __init__(self, name: str, key_groups: int) -> None:
        self.name = name
        self.key_groups = key_groups
        self.nodes: list[Node] = []

    def _add(self, node: Node, generated: bool = False) -> "DataStream":
        """``node`` added to the pipeline; its output as a stream."""
        if not generated and not _ID.match(node.operator_id):
            raise PipelineDefinitionError(f"operator id {node.operator_id!r} must be lower_snake_case (letters, digits, _)")
        if any(n.operator_id == node.operator_id for n in self.nodes):
            raise PipelineDefinitionError(f"duplicate operator id {node.operator_id!r} in {self.name}")
        self.nodes.append(node)
        return DataStream(self, node)

    def source(self, source: Source) -> "DataStream":
        return self._add(SourceNode(operator_id=source.source_id, parent=None, source=source))

    def stateless_id(self, kind: str, operator_id: str | None) -> tuple[str, bool]:
        """The id of a stateless operator: the one given, else ``<kind>-<n>`` (a ``-``, which no given id may hold)."""
        if operator_id is not None:
            return operator_id, False
        return f"{kind}-{sum(1 for n in self.nodes if n.operator_id.startswith(f'{kind}-')) + 1}", True


@dataclass(frozen=True)
class DataStream:
    builder: PipelineBuilder
    node: Node

    def _stateless(self, kind: str, operator_id: str | None, make: Callable[..., Node], **fields: Any) -> "DataStream":
        """A ``make`` node (a stateless operator) of ``fields`` after this stream."""
        node_id, generated = self.builder.stateless_id(kind, operator_id)
        return self.builder._add(make(operator_id=node_id, parent=self.node, **fields), generated)

    def filter(self, condition: "Expression | BatchFunction", *, operator_id: str | None = None) -> "DataStream":
        """Keep the records for which ``condition`` holds; null drops (README "Declare a pipeline").

        ``condition``: a SQL expression, or a function of a ``pyarrow.RecordBatch`` returning one boolean per record.
        """
        if isinstance(condition, str) or stateless.is_column(condition):
            stateless.check_expression(operator_id or "filter", condition)
            return self._stateless("filter", operator_id, stateless.Filter, condition=condition)
        if not callable(condition):
            raise PipelineDefinitionError(
                f"{operator_id or 'filter'}: {condition!r} is neither a column expression (a SQL string or a pyspark "
                "Column) nor a function of a pyarrow.RecordBatch"
            )
        return self._stateless("filter", operator_id, stateless.Filter, function=condition)

    def select(self, *columns: "Expression", operator_id: str | None = None) -> "DataStream":
        """Project each record onto ``columns``: names or SQL expressions (``"amount * 100 AS cents"``).

        ``"*"`` stands for every user column; the engine's (``_``...) are kept whatever is selected.
        """
        if not columns:
            raise PipelineDefinitionError("select needs at least one column")
        for column in columns:
            stateless.check_expression(operator_id or "select", column)
        return self._stateless("select", operator_id, stateless.Select, columns=tuple(columns))

    def map(
        self, function: "BatchFunction | None" = None, *, schema: pa.Schema | None = None, operator_id: str | None = None,
        **columns: "Expression",
    ) -> "DataStream":  # fmt: skip
        """Transform each record (README "Declare a pipeline").

        - ``map(cents="amount * 100")``: add or replace those columns (Spark's ``withColumns``).
        - ``map(function, schema=...)``: one row of ``schema`` per record of the
          ``pyarrow.RecordBatch`` given (a ``RecordBatch``, ``Table`` or mapping
          of column to values), replacing the user columns.
        """
        if function is not None:
            declared = stateless.check_function("map", operator_id, function, schema, columns)
            return self._stateless("map", operator_id, stateless.MapFunction, function=function, schema=declared)
        if not columns:
            raise PipelineDefinitionError("map needs a function and schema=, or columns as keywords (map(cents='amount * 100'))")
        if schema is not None:
            raise PipelineDefinitionError("map: schema= is for a Python function; column expressions have their own types")
        for name, value in columns.items():
            stateless.check_column_name(operator_id or "map", name)
            stateless.check_expression(operator_id or "map", value)
        return self._stateless("map", operator_id, stateless.MapColumns, columns=dict(columns))

    def flat_map(
        self, function: "BatchFunction | None" = None, *, schema: pa.Schema | None = None, operator_id: str | None = None,
        **column: "Expression",
    ) -> "DataStream":  # fmt: skip
        """Turn each record into zero or more records (README "Declare a pipeline").

        - ``flat_map(word="split(text, ' ')")``: one record per element of the
          array (Spark's ``explode``); a null or empty array gives none.
        - ``flat_map(function, schema=...)``: one list of rows of ``schema`` per
          record (a list of lists of dicts, a ``pyarrow.ListArray`` of structs),
          replacing the user columns.

        Outputs keep their record's arrival position, refined by their index among its outputs.
        """
        if function is not None:
            declared = stateless.check_function("flat_map", operator_id, function, schema, column)
            return self._stateless("flat_map", operator_id, stateless.FlatMapFunction, function=function, schema=declared)
        if len(column) != 1 or schema is not None:
            raise PipelineDefinitionError(
                "flat_map needs a function and schema=, or exactly one column as a keyword (flat_map(word=\"split(text, ' ')\"))"
            )
        ((name, value),) = column.items()
        stateless.check_column_name(operator_id or "flat_map", name)
        stateless.check_expression(operator_id or "flat_map", value)
        return self._stateless("flat_map", operator_id, stateless.FlatMapColumn, name=name, expression=value)

    def broadcast(self, *descriptors: MapStateDescriptor) -> "BroadcastStream":
        """This (low-volume) stream, to fill the broadcast map states ``descriptors`` (README "Broadcast state")."""
        return BroadcastStream(self, tuple(descriptors))

    def union(self, *others: "DataStream", operator_id: str | None = None) -> "DataStream":
        """The records of this stream and of ``others``, of the same columns and types (README "Union").

        Every input or none has a watermark assigner upstream.
        """
        if not others:
            raise PipelineDefinitionError("union needs at least one other stream: a.union(b) or a.union(b, c)")
        for other in others:
            advice = "streams made by the same PipelineBuilder (a KeyedStream is not a stream to union: union first, then key_by)"
            _check_of_pipeline(self.builder, "union", other, DataStream, advice)
        node_id, generated = self.builder.stateless_id("union", operator_id)
        inputs = (self.node, *(o.node for o in others))
        _check_watermarks(f"union {node_id!r}", inputs, "assign the watermark after the union, or one upstream of every input")
        return self.builder._add(Union(operator_id=node_id, parent=self.node, others=inputs[1:]), generated)

    def process(self, operator_id: str, function: ProcessFunction) -> "DataStream":
        """Run a non-keyed process function with operator list state, as ``parallelism`` subtasks (README "Operator state")."""
        return self.builder._add(OperatorProcess(operator_id=operator_id, parent=self.node, function=function))

    def deduplicate(self, operator_id: str, key: str | tuple[str, ...], ttl: timedelta | None = None) -> "DataStream":
        """Drop records whose key was seen before (in this or an earlier epoch)."""
        keys = (key,) if isinstance(key, str) else tuple(key)
        return self.builder._add(Deduplicate(operator_id=operator_id, parent=self.node, key=keys, ttl=ttl))

    def with_watermark(self, column: str, out_of_orderness: timedelta, *, operator_id: str | None = None) -> "DataStream":
        """W = max(column) seen up to epoch n minus ``out_of_orderness`` (:mod:`barrierflow.operators.watermark`).

        With several assigners (README "Interval join"), each keeps its maximum
        in state under its operator id (``watermark_<column>`` by default).
        """
        node_id = operator_id or f"watermark_{column}"
        if any(isinstance(n, WatermarkAssigner) and n.column == column for n in self.builder.nodes) and operator_id is None:
            raise PipelineDefinitionError(
                f"with_watermark({column!r}): a watermark assigner of column {column!r} exists; give this one an "
                "operator_id (its state, the largest event time seen, is named by it)"
            )
        micros = int(out_of_orderness.total_seconds() * 1_000_000)
        return self.builder._add(
            WatermarkAssigner(operator_id=node_id, parent=self.node, column=column, out_of_orderness_us=micros)
        )

    def join(self, other: "DataStream") -> "JoinedStreams":
        """This stream (left) and ``other`` (right), to join per event-time window: ``.where(k).equal_to(k).window(assigner, operator_id=...)``."""
        advice = "another stream of the same PipelineBuilder (not keyed: the join's keys are given by where() and equal_to())"
        _check_of_pipeline(self.builder, "join", other, DataStream, advice)
        return JoinedStreams(self, other)

    def key_by(self, *columns: str) -> "KeyedStream":
        if not columns:
            raise PipelineDefinitionError("key_by needs at least one column")
        return KeyedStream(self.builder, self.node, tuple(columns))

    def sink_to(self, sink: DeltaSink) -> None:
        self.builder._add(SinkNode(operator_id=f"sink_{sink.name}", parent=self.node, sink=sink))


@dataclass(frozen=True)
class KeyedStream:
    builder: PipelineBuilder
    node: Node
    key: tuple[str, ...]

    def aggregate(self, operator_id: str, *aggregations: Aggregation, **named: Aggregation) -> DataStream:
        """Running aggregates per key over all records so far (emits changed keys).

        Outputs are named by keyword (``total=Sum("amount")``); positional aggregations keep their own names.
        """
        chosen = named_aggregations(operator_id, aggregations, named, reserved=self.key)
        return self.builder._add(RunningAggregate(operator_id=operator_id, parent=self.node, key=self.key, aggregations=chosen))

    def window(
        self, operator_id: str, assigner: WindowAssigner, *aggregations: Aggregation, late_output: str | None = None,
        allowed_lateness: timedelta = timedelta(0), **named: Aggregation,
    ) -> DataStream:  # fmt: skip
        """Event-time windows that fire once the watermark passes their end (README "Windows").

        Aggregations are named as in :meth:`aggregate`. Records later than
        ``allowed_lateness`` go to ``late_output`` (or are dropped and counted).
        """
        if not any(isinstance(n, WatermarkAssigner) for n in self.builder.nodes):
            raise PipelineDefinitionError(f"window {operator_id!r} needs with_watermark() upstream")
        # Checked before the node is built, so that the reserved output columns below are known.
        lateness = _window_lateness(operator_id, allowed_lateness)
        reserved = (*self.key, "window_start", "window_end")
        if lateness:
            reserved += ("is_update", "retracted")
        chosen = named_aggregations(operator_id, aggregations, named, reserved=reserved)
        return self.builder._add(window_node(operator_id, self.node, self.key, assigner, chosen, late_output, allowed_lateness))

    def process(self, operator_id: str, function: KeyedProcessFunction) -> DataStream:
        """Run a keyed process function with per-key state over whole key groups."""
        return self.builder._add(KeyedProcess(operator_id=operator_id, parent=self.node, key=self.key, function=function))

    def interval_join(self, other: "KeyedStream") -> "IntervalJoinedStreams":
        """This keyed stream (left) and ``other`` (right), to join on event time within an interval: ``.between(lower, upper, ...)``."""
        self._check_other("interval_join", other)
        return IntervalJoinedStreams(self, other)

    def _check_other(self, what: str, other: "KeyedStream") -> None:
        advice = f"another stream of the same PipelineBuilder, keyed: a.key_by(k).{what}(b.key_by(k))"
        _check_of_pipeline(self.builder, what, other, KeyedStream, advice)
        if len(other.key) != len(self.key):
            raise PipelineDefinitionError(
                f"{what}: the streams are keyed by {list(self.key)} and {list(other.key)}; two keyed streams "
                "combined need as many key columns, of the same types, in the same order"
            )

    def connect(self, other: "KeyedStream | BroadcastStream") -> "ConnectedKeyedStreams | BroadcastConnectedStream":
        """This keyed stream and ``other``: a keyed stream for a :class:`KeyedCoProcessFunction`, or a broadcast one.

        README "Connected streams" (state is keyed by this stream's names) and "Broadcast state".
        """
        if isinstance(other, BroadcastStream):
            if other.stream.builder is not self.builder:
                raise PipelineDefinitionError("connect: the broadcast stream is not one of this pipeline")
            return BroadcastConnectedStream(self, other)
        self._check_other("connect", other)
        return ConnectedKeyedStreams(self, other)


@dataclass(frozen=True)
class JoinedStreams:
    """Two streams to join per window (:mod:`barrierflow.operators.window_join`): ``where``, ``equal_to``, then ``window``."""

    first: DataStream
    second: DataStream
    key: tuple[str, ...] = ()
    other_key: tuple[str, ...] = ()

    def where(self, *columns: str) -> "JoinedStreams":
        """The left stream's key columns."""
        return replace(self, key=self.first.key_by(*columns).key)

    def equal_to(self, *columns: str) -> "JoinedStreams":
        """The right stream's key columns, as many as the left's, of the same types."""
        return replace(self, other_key=self.second.key_by(*columns).key)

    def window(
        self, assigner: WindowAssigner, *, operator_id: str, left_late_output: str | None = None,
        right_late_output: str | None = None,
    ) -> DataStream:  # fmt: skip
        """Pairs of a left and a right record of a key in each window of ``assigner`` (tumbling or sliding), once W passes its end.

        Output columns: README "Window join".
        """
        if not self.key or not self.other_key:
            raise PipelineDefinitionError(
                f"window join {operator_id!r}: give both keys first: a.join(b).where(k).equal_to(k).window(...)"
            )
        first, second = self.first.key_by(*self.key), self.second.key_by(*self.other_key)
        first._check_other("join", second)
        times = _event_time_columns(f"window join {operator_id!r}", first.node, second.node)
        node = WindowJoin(
            operator_id=operator_id, parent=first.node, key=first.key, other=second.node, other_key=second.key,
            assigner=assigner,  # type: ignore[arg-type]  # checked by the node: tumbling or sliding
            time_columns=times, late_outputs=(left_late_output, right_late_output),
        )  # fmt: skip
        return first.builder._add(node)


@dataclass(frozen=True)
class IntervalJoinedStreams:
    """Two keyed streams to join on event time: give the interval with :meth:`between`."""

    first: KeyedStream
    second: KeyedStream

    def between(
        self, lower: timedelta, upper: timedelta, *, operator_id: str, lower_inclusive: bool = True, upper_inclusive: bool = True,
        left_late_output: str | None = None, right_late_output: str | None = None,
    ) -> DataStream:  # fmt: skip
        """Pairs ``(l, r)`` of a key with ``l.ts + lower <= r.ts <= l.ts + upper`` (README "Interval join").

        Each side's event time is the column of the watermark assigner upstream of it.
        """
        bounds = IntervalBounds.of(lower, upper, lower_inclusive, upper_inclusive)
        times = _event_time_columns(f"interval join {operator_id!r}", self.first.node, self.second.node)
        node = IntervalJoin(
            operator_id=operator_id, parent=self.first.node, key=self.first.key, other=self.second.node,
            other_key=self.second.key, bounds=bounds, time_columns=times, late_outputs=(left_late_output, right_late_output),
        )  # fmt: skip
        return self.first.builder._add(node)


@dataclass(frozen=True)
class ConnectedKeyedStreams:
    """Two keyed streams whose records one co-process function handles, with shared keyed state and timers."""

    first: KeyedStream
    second: KeyedStream

    def process(self, operator_id: str, function: KeyedCoProcessFunction) -> DataStream:
        """Run ``function``: ``process_element1`` for the first stream's records, ``process_element2`` for the second's."""
        inputs = (self.first.node, self.second.node)
        _check_watermarks(
            f"co-process {operator_id!r}", inputs, "assign one upstream of each input (with_watermark on each source), or none"
        )
        node = KeyedCoProcess(
            operator_id=operator_id, parent=self.first.node, key=self.first.key, function=function,
            other=self.second.node, other_key=self.second.key,
        )  # fmt: skip
        return self.first.builder._add(node)


@dataclass(frozen=True)
class BroadcastStream:
    """A stream broadcast with the map states it fills: connect a keyed stream to it."""

    stream: DataStream
    descriptors: tuple[MapStateDescriptor, ...]


@dataclass(frozen=True)
class BroadcastConnectedStream:
    """A keyed stream connected to a broadcast stream, for a :class:`KeyedBroadcastProcessFunction`."""

    keyed: KeyedStream
    broadcast: BroadcastStream

    def process(self, operator_id: str, function: KeyedBroadcastProcessFunction) -> DataStream:
        """Run ``function``: ``process_broadcast_element`` for the broadcast records, then ``process_element`` per key."""
        node = KeyedBroadcastProcess(
            operator_id=operator_id, parent=self.keyed.node, key=self.keyed.key, function=function,
            broadcast=self.broadcast.stream.node, descriptors=self.broadcast.descriptors,
        )  # fmt: skip
        return self.keyed.builder._add(node)


def _window_lateness(operator_id: str, allowed_lateness: Any) -> bool:
    """Whether ``allowed_lateness`` is positive; refuses one that is not a timedelta or is negative."""
    is_delta = isinstance(allowed_lateness, timedelta)
    if not is_delta or allowed_lateness < timedelta(0):
        must = "zero or positive" if is_delta else "a datetime.timedelta (zero or positive)"
        raise PipelineDefinitionError(f"window {operator_id!r}: allowed_lateness must be {must}, got {allowed_lateness!r}")
    return allowed_lateness > timedelta(0)


@dataclass(frozen=True)
class PipelineDefinition:
    """A registered pipeline: name, parameters and the function that builds it."""

    name: str
    build_fn: Callable[[PipelineBuilder, dict[str, Any]], None]
    params: tuple[Param, ...] = ()
    description: str = ""
    key_groups: int = DEFAULT_KEY_GROUPS
    parallelism_param: str | None = "parallelism"
    extra: Mapping[str, Any] = field(default_factory=dict)
    state_backend: str = "delta"

    def resolve(self, given: Mapping[str, Any]) -> dict[str, Any]:
        return resolve_params(self.params, given)

    def build(self, given: Mapping[str, Any]) -> Pipeline:
        params = self.resolve(given)
        builder = PipelineBuilder(self.name, self.key_groups)
        self.build_fn(builder, params)
        if not any(isinstance(n, SourceNode) for n in builder.nodes):
            raise PipelineDefinitionError(f"pipeline {self.name} declares no source")
        _check_assigners(builder.nodes)
        parallelism = int(params.get(self.parallelism_param, 2)) if self.parallelism_param else 2
        pipe = Pipeline(self.name, self.key_groups, builder.nodes, params, parallelism, self.state_backend)
        sink_names = [s.sink.name for s in pipe.sinks] + pipe.side_output_names()
        dupes = {n for n in sink_names if sink_names.count(n) > 1}
        if dupes or "dead_letter" in sink_names:
            raise PipelineDefinitionError(
                f"sink names must be unique and not 'dead_letter': {sorted(dupes | ({'dead_letter'} & set(sink_names)))}"
            )
        return pipe


def pipeline(
    name: str, params: list[Param] | tuple[Param, ...] = (), description: str = "", key_groups: int = DEFAULT_KEY_GROUPS,
    state_backend: str = "delta",
) -> Callable[[Callable[[PipelineBuilder, dict[str, Any]], None]], PipelineDefinition]:  # fmt: skip
    """Decorator turning a build function into a :class:`PipelineDefinition`.

    ``state_backend``: ``"delta"`` (default) or ``"heap"``, as Flink's RocksDB
    or heap (README "Where the work runs, and the two state backends").
    """
    if not _ID.match(name):
        raise PipelineDefinitionError(f"pipeline name {name!r} must be lower_snake_case")
    if not 1 <= key_groups <= 32768:
        raise PipelineDefinitionError("key_groups (max parallelism) must be between 1 and 32768")
    if state_backend not in STATE_BACKENDS:
        raise PipelineDefinitionError(f"state_backend {state_backend!r} is not one of {list(STATE_BACKENDS)}")

    def wrap(fn: Callable[[PipelineBuilder, dict[str, Any]], None]) -> PipelineDefinition:
        return PipelineDefinition(
            name, fn, tuple(params), description or fn.__doc__ or "", key_groups, state_backend=state_backend
        )

    return wrap
