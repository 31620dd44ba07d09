"""Keyed state: descriptors, handles and the Delta state backend."""

from barrierflow.state.descriptors import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from barrierflow.state.keyed import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
)
from barrierflow.state.spec import KEY_GROUP, DueRows, StateSpec

__all__ = [
    "KEY_GROUP",
    "DueRows",
    "StateSpec",
    "AggregateFunction",
    "AggregatingState",
    "AggregatingStateDescriptor",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "ReducingState",
    "ReducingStateDescriptor",
    "StateDescriptor",
    "StateTtlConfig",
    "ValueState",
    "ValueStateDescriptor",
]
