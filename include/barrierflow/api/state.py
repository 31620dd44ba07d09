"""State descriptors, named as in Flink: each names a piece of per-key state (or operator state) and fixes its stored type.

The engine keeps one Delta state table per descriptor (``state/<operator_id>/<name>``) with readable, typed columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, ClassVar, Protocol

import pyarrow as pa

from barrierflow.core.errors import PipelineDefinitionError

__all__ = [
    "StateDescriptor", "ValueStateDescriptor", "ListStateDescriptor", "MapStateDescriptor", "ReducingStateDescriptor",
    "AggregatingStateDescriptor", "AggregateFunction", "StateTtlConfig", "EVEN_SPLIT", "UNION", "REDISTRIBUTIONS",
]  # fmt: skip

# How an operator list state is redistributed when the parallelism changes: Flink's getListState and getUnionListState.
EVEN_SPLIT = "even_split"
UNION = "union"
REDISTRIBUTIONS = (EVEN_SPLIT, UNION)


@dataclass(frozen=True)
class StateTtlConfig:
    """Entries not written for ``ttl`` (epoch processing time) expire."""

    ttl: timedelta

    @property
    def ttl_ms(self) -> int:
        return int(self.ttl.total_seconds() * 1000)


@dataclass(frozen=True)
class StateDescriptor:
    name: str
    _kind: ClassVar[str]

    @property
    def kind(self) -> str:
        return self._kind

    @property
    def value_type(self) -> pa.DataType:
        raise NotImplementedError

    @property
    def ttl(self) -> StateTtlConfig | None:
        return getattr(self, "ttl_config", None)  # every concrete descriptor has a ``ttl_config`` field (None: no TTL)

    def signature(self) -> str:
        """Kind and stored type: what a savepoint checks for compatibility."""
        return f"{self.kind}<{self.value_type}>"


@dataclass(frozen=True)
class ValueStateDescriptor(StateDescriptor):
    type: pa.DataType = pa.float64()
    ttl_config: StateTtlConfig | None = None
    _kind: ClassVar[str] = "value"

    @property
    def value_type(self) -> pa.DataType:
        return self.type


@dataclass(frozen=True)
class ListStateDescriptor(StateDescriptor):
    """A list per key; or, in a non-keyed ``ProcessFunction``, a list per parallel subtask (operator state).

    ``redistribution`` (operator state only) is what a subtask gets when the parallelism changes (README "Operator state"):
    ``"even_split"`` (Flink's ``getListState``) or ``"union"`` (Flink's ``getUnionListState``).
    """

    element_type: pa.DataType = pa.float64()
    ttl_config: StateTtlConfig | None = None
    redistribution: str = field(default=EVEN_SPLIT, kw_only=True)

    def __post_init__(self) -> None:
        if self.redistribution not in REDISTRIBUTIONS:
            raise PipelineDefinitionError(
                f"list state {self.name!r}: redistribution={self.redistribution!r} is not one of {list(REDISTRIBUTIONS)} "
                "(even_split: each subtask gets a slice of all subtasks' lists; union: each gets all of them)"
            )

    @property
    def kind(self) -> str:
        return "list" if self.redistribution == EVEN_SPLIT else "union_list"

    @property
    def value_type(self) -> pa.DataType:
        return pa.list_(self.element_type)


@dataclass(frozen=True)
class MapStateDescriptor(StateDescriptor):
    key_type: pa.DataType = pa.string()
    map_value_type: pa.DataType = pa.float64()
    ttl_config: StateTtlConfig | None = None
    _kind: ClassVar[str] = "map"

    @property
    def value_type(self) -> pa.DataType:
        return pa.map_(self.key_type, self.map_value_type)


@dataclass(frozen=True)
class ReducingStateDescriptor(StateDescriptor):
    reduce_function: Callable[[Any, Any], Any] = lambda a, b: a  # noqa: E731
    type: pa.DataType = pa.float64()
    ttl_config: StateTtlConfig | None = None
    _kind: ClassVar[str] = "reducing"

    @property
    def value_type(self) -> pa.DataType:
        return self.type


class AggregateFunction(Protocol):
    """Flink's AggregateFunction: accumulator in, result out."""

    def create_accumulator(self) -> Any: ...

    def add(self, value: Any, accumulator: Any) -> Any: ...

    def get_result(self, accumulator: Any) -> Any: ...


@dataclass(frozen=True)
class AggregatingStateDescriptor(StateDescriptor):
    aggregate_function: AggregateFunction | None = None
    accumulator_type: pa.DataType = pa.float64()
    ttl_config: StateTtlConfig | None = None
    _kind: ClassVar[str] = "aggregating"

    @property
    def value_type(self) -> pa.DataType:
        return self.accumulator_type
