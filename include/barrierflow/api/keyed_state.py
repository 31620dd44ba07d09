"""Per-key state handles, scoped by the runtime to the current key; a handle records whether it changed (only changed keys are written)."""

from __future__ import annotations

from typing import Any, Iterator

from barrierflow.api.state import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)

__all__ = ["State", "ValueState", "ListState", "MapState", "ReducingState", "AggregatingState", "HANDLES"]


class State:
    """Common part of every handle: the stored value and a dirty flag."""

    def __init__(self, descriptor: StateDescriptor, stored: Any) -> None:
        self.descriptor = descriptor
        self.load(stored)

    def load(self, stored: Any) -> None:
        """Scope the handle to another key, whose stored value is ``stored`` (the runtime keeps one handle per state)."""
        self._stored, self.dirty = stored, False

    def clear(self) -> None:
        self._stored = None
        self.dirty = True

    @property
    def stored(self) -> Any:
        """The value to persist (None means the entry is deleted)."""
        return self._stored


class ValueState(State):
    def value(self) -> Any:
        return self._stored

    def update(self, value: Any) -> None:
        self._stored = value
        self.dirty = True


class ListState(State):
    def get(self) -> list[Any]:
        return list(self._stored or [])

    def add(self, value: Any) -> None:
        self._stored = [*(self._stored or []), value]
        self.dirty = True

    def update(self, values: list[Any]) -> None:
        self._stored = list(values) or None
        self.dirty = True


class MapState(State):
    def load(self, stored: Any) -> None:
        super().load(dict(stored) if stored else None)  # Arrow maps arrive as lists of (key, value) pairs

    def get(self, key: Any) -> Any:
        return (self._stored or {}).get(key)

    def put(self, key: Any, value: Any) -> None:
        self._stored = {**(self._stored or {}), key: value}
        self.dirty = True

    def remove(self, key: Any) -> None:
        if self._stored and key in self._stored:
            self._stored = {k: v for k, v in self._stored.items() if k != key} or None
            self.dirty = True

    def contains(self, key: Any) -> bool:
        return key in (self._stored or {})

    def items(self) -> Iterator[tuple[Any, Any]]:
        return iter(dict(self._stored or {}).items())

    @property
    def stored(self) -> Any:
        return list(self._stored.items()) if self._stored else None


class ReducingState(State):
    descriptor: ReducingStateDescriptor

    def get(self) -> Any:
        return self._stored

    def add(self, value: Any) -> None:
        self._stored = value if self._stored is None else self.descriptor.reduce_function(self._stored, value)
        self.dirty = True


class AggregatingState(State):
    descriptor: AggregatingStateDescriptor

    def get(self) -> Any:
        fn = self.descriptor.aggregate_function
        return None if self._stored is None or fn is None else fn.get_result(self._stored)

    def add(self, value: Any) -> None:
        fn = self.descriptor.aggregate_function
        assert fn is not None, f"aggregating state {self.descriptor.name!r} declares no aggregate_function"
        self._stored = fn.add(value, fn.create_accumulator() if self._stored is None else self._stored)
        self.dirty = True


HANDLES: dict[type, type[State]] = {  # the handle class of each descriptor class
    ValueStateDescriptor: ValueState, ListStateDescriptor: ListState, MapStateDescriptor: MapState,
    ReducingStateDescriptor: ReducingState, AggregatingStateDescriptor: AggregatingState,
}  # fmt: skip
