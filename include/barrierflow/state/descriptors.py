"""Keyed state descriptors, named as in Flink.

A descriptor names a piece of per-key state and fixes its stored type; the
engine creates one Delta state table per descriptor
(``state/<operator_id>/<name>``) with readable, typed columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Protocol

import pyarrow as pa

__all__ = [
    "StateDescriptor",
    "ValueStateDescriptor",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "ReducingStateDescriptor",
    "AggregatingStateDescriptor",
    "AggregateFunction",
    "StateTtlConfig",
]


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

    @property
    def kind(self) -> str:
        raise NotImplementedError

    @property
    def value_type(self) -> pa.DataType:
        raise NotImplementedError

    @property
    def ttl(self) -> StateTtlConfig | None:
        # Every concrete descriptor has a ``ttl_config`` field (None: no TTL).
        return getattr(self, "ttl_config", None)

    def signature(self) -> str:
        """Kind and stored type: what a savepoint checks for compatibility."""
        return f"{self.kind}<{self.value_type}>"


@dataclass(frozen=True)
class ValueStateDescriptor(StateDescriptor):
    type: pa.DataType = pa.float64()
    ttl_config: StateTtlConfig | None = None

    @property
    def kind(self) -> str:
        return "value"

    @property
    def value_type(self) -> pa.DataType:
        return self.type


@dataclass(frozen=True)
class ListStateDescriptor(StateDescriptor):
    element_type: pa.DataType = pa.float64()
    ttl_config: StateTtlConfig | None = None

    @property
    def kind(self) -> str:
        return "list"

    @property
    def value_type(self) -> pa.DataType:
        return pa.list_(self.element_type)


@dataclass(frozen=True)
class MapStateDescriptor(StateDescriptor):
    key_type: pa.DataType = pa.string()
    map_value_type: pa.DataType = pa.float64()
    ttl_config: StateTtlConfig | None = None

    @property
    def kind(self) -> str:
        return "map"

    @property
    def value_type(self) -> pa.DataType:
        return pa.map_(self.key_type, self.map_value_type)


@dataclass(frozen=True)
class ReducingStateDescriptor(StateDescriptor):
    reduce_function: Callable[[Any, Any], Any] = lambda a, b: a  # noqa: E731
    type: pa.DataType = pa.float64()
    ttl_config: StateTtlConfig | None = None

    @property
    def kind(self) -> str:
        return "reducing"

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

    @property
    def kind(self) -> str:
        return "aggregating"

    @property
    def value_type(self) -> pa.DataType:
        return self.accumulator_type
